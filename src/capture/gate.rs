//! The recording gate: the one switch that says whether the hook records, and the protocol by
//! which producers read it and a stopper closes it.
//!
//! The session opens the gate once everything is ready ([`open_gate`]); the collector closes
//! it when the session stops ([`close_recording`]); a forked child closes it for good
//! ([`close_in_forked_child`]). Every hook call reads it first ([`recording`], Relaxed), and
//! a push reads it again inside the ring's stop protocol ([`GateProtocol`]), so that a stopper
//! that closed it and then reads a producer idle knows that producer's events are published.

use super::sync::{close_then_fence, mark_then_read, outside_loom, AtomicBool, AtomicU64};

outside_loom! {
    mod process;
    pub(crate) use process::*;
    pub(crate) use super::sync::enable_asymmetric_fences as enable_asymmetric_barrier;
}

/// How a producer announces itself before reading the gate, and how a stopper closes the gate
/// before reading producers. Both sides must be sequentially consistent.
pub(crate) trait GateProtocol {
    /// Producer: marks `busy`, then reads `gate`.
    fn enter(busy: &AtomicU64, gate: &AtomicBool) -> bool;
}

/// The protocol the hook uses: the store-buffering handshake of the sync shim
/// ([`mark_then_read`], [`close_then_fence`]), whose fences are asymmetric where the kernel
/// offers a process-wide barrier.
#[derive(Debug)]
pub(crate) struct Sound;

impl GateProtocol for Sound {
    #[inline(always)]
    fn enter(busy: &AtomicU64, gate: &AtomicBool) -> bool {
        mark_then_read(busy, gate)
    }
}

/// Closes `gate`; afterwards a [`Ring::is_busy`](super::ring::Ring::is_busy) that reads `false`
/// on a ring guarantees its producer no longer writes under the open gate.
pub(crate) fn close_gate(gate: &AtomicBool) {
    close_then_fence(gate);
}

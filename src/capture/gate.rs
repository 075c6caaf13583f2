//! The recording gate: the one switch that says whether the hook records, and the protocol by
//! which producers read it and a stopper closes it.
//!
//! The session opens the gate once everything is ready ([`open_gate`]); the collector closes
//! it when the session stops ([`close_recording`]); a forked child closes it for good
//! ([`close_in_forked_child`]). Every hook call reads it first ([`recording`], Relaxed), and
//! a push reads it again inside the ring's stop protocol ([`GateProtocol`]), so that a stopper
//! that closed it and then reads a producer idle knows that producer's events are published.

#[cfg(not(highwater_loom))]
pub(crate) use super::sync::enable_asymmetric_fences as enable_asymmetric_barrier;
use super::sync::{close_then_fence, mark_then_read, AtomicBool, AtomicU64};

/// The process's gate, for the hook and the session (under loom, the models make their own).
#[cfg(not(highwater_loom))]
mod process {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::close_gate;

    /// Open while a session records. Read on every hook call (Relaxed first, then through
    /// [`GateProtocol`] inside a push); written only here.
    pub(crate) static RECORDING: AtomicBool = AtomicBool::new(false);

    /// Counts the times the gate opened (from 1): a thread whose innermost span was opened before
    /// the current opening announces it once, so a span opened before `Session::start` still
    /// names what runs inside it.
    pub(crate) static GATE_EPOCH: AtomicU32 = AtomicU32::new(0);

    /// The current opening of the gate (`0`: never opened): hooks that keep state across calls
    /// (an op's guard) tell by it whether a later session has started since.
    pub(crate) fn epoch() -> u32 {
        GATE_EPOCH.load(Ordering::SeqCst)
    }

    /// Whether a session is recording right now (a cheap first check for callers).
    #[inline(always)]
    pub(crate) fn recording() -> bool {
        RECORDING.load(Ordering::Relaxed)
    }

    /// Opens the recording gate (the session, once everything is ready).
    pub(crate) fn open_gate() {
        GATE_EPOCH.fetch_add(1, Ordering::SeqCst);
        RECORDING.store(true, Ordering::SeqCst);
    }

    /// Closes the recording gate when the session stops; see [`close_gate`].
    pub(crate) fn close_recording() {
        close_gate(&RECORDING);
    }

    /// Closes the recording gate in a forked child, which never records (its collector did not
    /// survive the fork). A plain store: this runs in an `atfork` child handler.
    pub(crate) fn close_in_forked_child() {
        RECORDING.store(false, Ordering::SeqCst);
    }
}

#[cfg(not(highwater_loom))]
pub(crate) use process::*;

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

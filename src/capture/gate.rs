//! The recording gate: the one switch that says whether the hook records, and the protocol by
//! which producers read it and a stopper closes it.
//!
//! The session opens the gate once everything is ready ([`open_gate`]); the collector closes
//! it when the session stops ([`close_recording`]); a forked child closes it for good
//! ([`close_in_forked_child`]). Every hook call reads it first ([`recording`], Relaxed), and
//! a push reads it again inside the ring's stop protocol ([`GateProtocol`]), so that a stopper
//! that closed it and then reads a producer idle knows that producer's events are published.

use super::sync::{AtomicBool, AtomicU64, Ordering};

/// Open while a session records. Read on every hook call (Relaxed first, then through
/// [`GateProtocol`] inside a push); written only here.
#[cfg(not(highwater_loom))]
pub(crate) static RECORDING: AtomicBool = AtomicBool::new(false);

/// Counts the times the gate opened (from 1): a thread whose innermost span was opened before
/// the current opening announces it once, so a span opened before `Session::start` still
/// names what runs inside it.
#[cfg(not(highwater_loom))]
pub(crate) static GATE_EPOCH: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The current opening of the gate (`0`: never opened): hooks that keep state across calls
/// (an op's guard) tell by it whether a later session has started since.
#[cfg(not(highwater_loom))]
pub(crate) fn epoch() -> u32 {
    GATE_EPOCH.load(Ordering::SeqCst)
}

/// Whether a session is recording right now (a cheap first check for callers).
#[cfg(not(highwater_loom))]
#[inline(always)]
pub(crate) fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Opens the recording gate (the session, once everything is ready).
#[cfg(not(highwater_loom))]
pub(crate) fn open_gate() {
    GATE_EPOCH.fetch_add(1, Ordering::SeqCst);
    RECORDING.store(true, Ordering::SeqCst);
}

/// Closes the recording gate when the session stops; see [`close_gate`].
#[cfg(not(highwater_loom))]
pub(crate) fn close_recording() {
    close_gate(&RECORDING);
}

/// Closes the recording gate in a forked child, which never records (its collector did not
/// survive the fork). A plain store: this runs in an `atfork` child handler.
#[cfg(not(highwater_loom))]
pub(crate) fn close_in_forked_child() {
    RECORDING.store(false, Ordering::SeqCst);
}

/// How a producer announces itself before reading the gate, and how a stopper closes the gate
/// before reading producers. Both sides must be sequentially consistent.
pub(crate) trait GateProtocol {
    /// Producer: marks `busy`, then reads `gate`.
    fn enter(busy: &AtomicU64, gate: &AtomicBool) -> bool;
}

/// The protocol the hook uses.
///
/// Where the kernel offers `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` ([`ASYMMETRIC`]),
/// the producer's side is a plain store and a compiler fence, and the stopper's membarrier
/// supplies the fence on every running thread: the asymmetric form of the same
/// store-buffering argument, which moves the whole cost to the rare stop. Otherwise an SC swap
/// and an SC load (one locked instruction on x86-64, cheaper than `mfence`). Loom treats SC
/// accesses as acquire/release (it would report false races) but models SC fences exactly, so
/// under loom the order is built from relaxed accesses around `fence(SeqCst)`.
#[derive(Debug)]
pub(crate) struct Sound;

impl GateProtocol for Sound {
    #[inline(always)]
    fn enter(busy: &AtomicU64, gate: &AtomicBool) -> bool {
        #[cfg(not(highwater_loom))]
        {
            if ASYMMETRIC.load(Ordering::Relaxed) {
                // The stopper's membarrier acts as a full fence on this thread, so program
                // order (kept by the compiler fence) is all this side needs.
                busy.store(1, Ordering::Relaxed);
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
                gate.load(Ordering::Relaxed)
            } else {
                busy.swap(1, Ordering::SeqCst);
                gate.load(Ordering::SeqCst)
            }
        }
        #[cfg(highwater_loom)]
        {
            busy.store(1, Ordering::Relaxed);
            super::sync::fence(Ordering::SeqCst);
            gate.load(Ordering::Relaxed)
        }
    }
}

/// Whether producers use the asymmetric protocol (see [`Sound`]). Set once, before any
/// session opens its gate, and never cleared.
#[cfg(not(highwater_loom))]
pub(crate) static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Registers this process for expedited private membarriers; on success producers switch to
/// the asymmetric protocol. Called before a session opens its gate.
#[cfg(not(highwater_loom))]
pub(crate) fn enable_asymmetric_barrier() {
    #[cfg(target_os = "linux")]
    {
        const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
        // SAFETY: membarrier takes a command and flags; registering has no memory effects.
        let registered = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
            )
        } == 0;
        if registered {
            ASYMMETRIC.store(true, Ordering::SeqCst);
        }
    }
}

/// A full memory barrier on every running thread of this process.
#[cfg(all(not(highwater_loom), target_os = "linux"))]
fn membarrier() -> bool {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    // SAFETY: membarrier takes a command and flags; the process registered for this command
    // before `ASYMMETRIC` was set.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0 }
}

/// Closes `gate`; afterwards a [`Ring::is_busy`] that reads `false` on a ring guarantees its
/// producer no longer writes under the open gate.
pub(crate) fn close_gate(gate: &AtomicBool) {
    #[cfg(not(highwater_loom))]
    {
        gate.store(false, Ordering::SeqCst);
        #[cfg(target_os = "linux")]
        if ASYMMETRIC.load(Ordering::SeqCst) && !membarrier() {
            // Registered but refused now: nothing else gives the producers' side its fence,
            // so wait out any producer that could still see the gate open. Never expected.
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    #[cfg(highwater_loom)]
    {
        gate.store(false, Ordering::Relaxed);
        super::sync::fence(Ordering::SeqCst);
    }
}

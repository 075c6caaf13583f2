//! The process's gate, for the hook and the session (the loom models make their own).

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

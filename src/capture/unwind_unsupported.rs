//! The call-frame unwind where framehop has no unwinder for the CPU (anything but x86-64 and
//! AArch64): stacks are walked by frame pointers only (where [`super::stack`] can read them at
//! all). The same functions as `unwind.rs`, doing nothing.

use super::frames::{Registers, StackBounds, Walked};
use crate::model::Unwinder;

/// See `unwind.rs`: nothing to prepare.
pub(crate) fn prepare() {}

/// See `unwind.rs`: frame pointers are the only method there is.
pub(crate) fn choose(_forced: Option<Unwinder>) {}

/// See `unwind.rs`: nothing to judge.
pub(crate) fn frame_pointers_unjudged() -> bool {
    false
}

/// See `unwind.rs`.
pub(crate) fn judge_frame_pointers(_trusted: bool) {}

/// See `unwind.rs`: nothing to refresh.
pub(crate) fn refresh() {}

/// Frame pointers are the only method there is.
pub(crate) fn frame_pointers_trusted() -> Option<bool> {
    None
}

/// See `unwind.rs`: no state to clear.
pub(crate) fn forget_other_threads_after_fork() {}

/// Never unwinds.
pub(crate) fn unwind(
    _registers: &Registers,
    _bounds: &StackBounds,
    _hint: usize,
    _walked: &mut Walked,
) -> bool {
    false
}

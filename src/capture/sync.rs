//! The one place that chooses std or loom primitives, so the ring and the registry can be
//! model-checked unchanged under `RUSTFLAGS="--cfg highwater_loom"`.

#[cfg(not(highwater_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

#[cfg(highwater_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Interior-mutable storage for one ring slot, with loom's access tracking under loom.
#[cfg(not(highwater_loom))]
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct SlotCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(highwater_loom))]
impl<T> SlotCell<T> {
    /// Runs `f` with a raw pointer to the value for writing.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a raw pointer to the value for reading.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(highwater_loom)]
pub(crate) use loom::cell::UnsafeCell as SlotCell;

//! What a stack walk starts from and gives back, shared by the frame-pointer walk
//! ([`super::stack`]) and the call-frame unwind ([`super::unwind`]): the registers, the
//! thread's stack bounds and the walked return addresses.

use crate::model::{StackWalk, Unwinder};

/// Deepest stack recorded, in program counters.
pub(crate) const MAX_FRAMES: usize = 64;

/// The calling thread's stack mapping as last found: `[low, high)`; `(0, 0)` when unknown.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StackBounds {
    pub(crate) low: usize,
    pub(crate) high: usize,
}

impl StackBounds {
    /// Not looked up yet.
    pub(crate) const UNKNOWN: StackBounds = StackBounds { low: 0, high: 0 };

    pub(crate) fn holds(&self, sp: usize) -> bool {
        self.low <= sp && sp < self.high
    }

    /// The end of the mapping (the stack's top: callers sit below it).
    pub(crate) fn high(&self) -> usize {
        self.high
    }
}

/// A walked stack: return addresses, innermost first.
#[derive(Debug)]
pub(crate) struct Walked {
    pub(crate) pcs: [u64; MAX_FRAMES],
    pub(crate) len: usize,
    /// The walk stopped at the depth limit, or at a frame it could not follow (for frame
    /// pointers, one inside the stack that failed a check).
    pub(crate) truncated: bool,
    /// Which method walked it.
    pub(crate) unwinder: Unwinder,
}

impl Walked {
    /// How it was walked, as the analysis interns it.
    pub(crate) fn walk(&self) -> StackWalk {
        StackWalk {
            truncated: self.truncated,
            unwinder: self.unwinder,
        }
    }

    /// No frame.
    pub(crate) const EMPTY: Walked = Walked {
        pcs: [0; MAX_FRAMES],
        len: 0,
        truncated: false,
        unwinder: Unwinder::FramePointers,
    };
}

/// The registers a walk starts from, all taken at one instruction of the walking function.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Registers {
    /// That instruction's address.
    pub(crate) pc: usize,
    pub(crate) sp: usize,
    pub(crate) fp: usize,
    /// The link register (AArch64), which a function's first instructions keep the return
    /// address in.
    #[cfg(target_arch = "aarch64")]
    pub(crate) lr: usize,
}

impl Registers {
    /// The registers framehop unwinds from.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn unwind_regs(&self) -> framehop::UnwindRegsNative {
        framehop::UnwindRegsNative::new(self.pc as u64, self.sp as u64, self.fp as u64)
    }

    /// The registers framehop unwinds from.
    #[cfg(target_arch = "aarch64")]
    pub(crate) fn unwind_regs(&self) -> framehop::UnwindRegsNative {
        framehop::UnwindRegsNative::new(self.lr as u64, self.sp as u64, self.fp as u64)
    }
}

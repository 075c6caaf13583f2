//! The expedited private membarrier: a full memory barrier on every running thread of the
//! process, issued by one of them. It lets the hot path's side of a handshake get by with a
//! compiler fence while the rare side (a session stopping) pays for both.

#![allow(clippy::disallowed_methods)]

/// Registers the process for [`barrier`]; false when the kernel has no membarrier or refuses.
pub(crate) fn register() -> bool {
    #[cfg(target_os = "linux")]
    {
        const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
        // SAFETY: membarrier takes a command and flags; registering has no memory effects.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                0,
            ) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// A full barrier on every running thread of the process; false if the kernel refused (then
/// none was issued). Only after a successful [`register`].
pub(crate) fn barrier() -> bool {
    #[cfg(target_os = "linux")]
    {
        const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        // SAFETY: membarrier takes a command and flags; the caller registered first.
        unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

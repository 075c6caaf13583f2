//! Futexes: sleeping on a 32-bit word until it changes, and waking its sleepers. The waits the
//! hot path allows are these, always with a bound.

#![allow(clippy::disallowed_methods)]

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` holds `expected`, at most `timeout` (`None`: until woken). Returns
/// early on a wake, a signal, a changed word or spuriously: callers re-check what they wait
/// for.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    #[cfg(target_os = "linux")]
    {
        let limit = timeout.map(|timeout| libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        });
        let limit_ptr = limit
            .as_ref()
            .map_or(std::ptr::null(), |limit| limit as *const libc::timespec);
        // SAFETY: FUTEX_WAIT reads the aligned 32-bit word (an AtomicU32 the caller keeps
        // alive for the call) and the optional relative timeout; it writes nothing. Every
        // failure (EAGAIN: the word changed; EINTR; ETIMEDOUT) is a return to the caller.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                limit_ptr,
            )
        };
    }
    #[cfg(not(target_os = "linux"))]
    {
        if word.load(std::sync::atomic::Ordering::Acquire) == expected {
            std::thread::sleep(timeout.unwrap_or(Duration::from_millis(1)));
        }
    }
}

/// Wakes every thread sleeping on `word`. Change the word first.
pub(crate) fn wake_all(word: &AtomicU32) {
    #[cfg(target_os = "linux")]
    // SAFETY: FUTEX_WAKE only uses the word's address to find its sleepers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
    #[cfg(not(target_os = "linux"))]
    let _ = word;
}

//! The calling thread's CPU time, for benches on a shared machine: it counts only the time the
//! thread ran, not the time it waited for a core.

use std::time::Duration;

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; the clock id is a constant Linux defines.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "the thread CPU clock is readable");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

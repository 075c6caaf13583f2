//! CPU time, for benches on a shared machine: it counts only the time spent running, not the
//! time spent waiting for a core.

use std::time::Duration;

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    clock_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time every thread of the process has used.
#[allow(dead_code)] // not every bench that includes this file needs it
pub fn process_cpu_time() -> Duration {
    clock_time(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock_time(clock: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; the clock id is a constant Linux defines.
    let status = unsafe { libc::clock_gettime(clock, &mut now) };
    assert_eq!(status, 0, "the CPU clock is readable");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

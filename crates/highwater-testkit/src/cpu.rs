//! CPU time, for benches and examples on a shared machine: it counts only the time spent
//! running, not the time spent waiting for a core.

use std::time::Duration;

/// CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    clock_time(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time every thread of the process has used, the collector's included.
pub fn process_cpu_time() -> Duration {
    clock_time(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time the running session's collector thread has used so far, from Linux's per-thread
/// scheduler figures (`/proc/self/task/*/schedstat`, nanoseconds on a CPU); `None` elsewhere
/// or when no collector runs.
pub fn collector_thread_cpu() -> Option<Duration> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        // Thread names are cut to 15 bytes: "highwater-collector" reads "highwater-colle".
        if comm.trim_end() == "highwater-colle" {
            let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let ns = schedstat.split_whitespace().next()?.parse().ok()?;
            return Some(Duration::from_nanos(ns));
        }
    }
    None
}

// Test support reads the CPU clocks the library has no use for.
#[allow(clippy::disallowed_methods)]
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

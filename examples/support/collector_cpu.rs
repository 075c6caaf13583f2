//! The running session's collector thread's CPU time, for examples that report what recording
//! cost them.

use std::time::Duration;

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

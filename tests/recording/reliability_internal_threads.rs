//! highwater's own threads (the collector, the signal watcher) never record: not even what the
//! Rust runtime allocates when they start, before their own code runs.
//!
//! Regression: the collector marked itself internal as the first thing its closure did, but
//! std allocates on a new thread before the closure runs. When the thread first ran after the
//! session had opened the gate (usual on a busy machine), those allocations were recorded: the
//! collector claimed a ring and appeared in the profile as a recording thread. On one CPU the
//! new thread runs after the starting one nearly every time.

use highwater::Session;

/// Twenty sessions on one CPU, signal handling on, only the test thread allocating. Proves: the
/// profile's only recording thread is the test's own — neither the collector nor the signal
/// watcher (which cannot be told apart by name here: a thread that has not run yet still has
/// its parent's name) recorded anything.
#[test]
fn highwater_threads_never_record_even_while_starting() {
    highwater_testkit::child::isolated(
        "highwater_threads_never_record_even_while_starting",
        || {
            // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; 0 = this process.
            unsafe {
                let mut one_cpu: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut one_cpu);
                let pinned =
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one_cpu);
                assert_eq!(pinned, 0, "sched_setaffinity failed");
            }
            let me = highwater_testkit::counting::gettid();
            for round in 0..20 {
                let session = Session::builder()
                    .write_profile(false)
                    .write_on_signal(true)
                    .start()
                    .unwrap();
                let kept: Vec<Vec<u8>> = (0..100).map(|i| vec![0u8; 64 + i]).collect();
                std::hint::black_box(&kept);
                let profile = session.finish().unwrap();
                let recording: Vec<u64> =
                    profile.capture.threads.iter().map(|t| t.os_tid).collect();
                assert_eq!(
                    recording,
                    vec![me],
                    "round {round}: only the test thread should record"
                );
            }
        },
    );
}

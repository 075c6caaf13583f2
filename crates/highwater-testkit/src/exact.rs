//! The exactness check every workload test must pass: a workload recorded inside a counting
//! window ([`crate::counting`]), then the profile's figures against the window's counts.

use std::sync::atomic::Ordering;

use highwater::{Profile, Session};

use crate::counting as common;
use crate::workloads;

/// Runs `work` inside a default session (lossless capture unless `HIGHWATER_*` says otherwise),
/// with the counting window open around it; returns the profile and what `work` returned.
pub fn record<R>(work: impl FnOnce() -> R) -> (Profile, R) {
    common::wait_for_other_threads_to_sleep();
    let session = Session::builder().write_profile(false).start().unwrap();
    common::open_window();
    let result = work();
    common::close_window();
    let profile = session.finish().unwrap();
    (profile, result)
}

/// Runs `work` on a thread of its own that starts and ends inside the recording, so its
/// operations can be checked one for one; returns the thread's OS id with `work`'s result.
pub fn on_worker<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> (u64, R) {
    std::thread::spawn(move || (workloads::gettid(), work()))
        .join()
        .expect("the workload thread panicked")
}

/// Sums a window counter over every counted thread.
fn window_sum(field: impl Fn(&common::Row) -> i64) -> i64 {
    common::rows().iter().map(field).sum()
}

/// The checks every workload must pass, against counts the inner allocator kept on the same run
/// (see [`crate::counting`]):
///
/// - nothing was dropped (the default capture is lossless);
/// - per worker thread and kind, recorded + dropped = performed, exact;
/// - the profile's counts of allocations, frees, reallocs and unknown frees are the window's;
/// - the profile's peak and final live bytes are the window's, to the byte.
///
/// Prints a `FIGURES` line (shown by [`crate::child::isolated`]) before asserting, so a failure still
/// says by how much the figures were off.
pub fn check_exact(name: &str, profile: &Profile, workers: &[u64]) {
    let summary = &profile.summary;
    let expected_peak = common::window_live_peak();
    let expected_live = window_sum(|r| r.window_live.load(Ordering::SeqCst));
    let count = |field: fn(&common::Row) -> &std::sync::atomic::AtomicU64| {
        window_sum(|r| field(r).load(Ordering::SeqCst) as i64) as u64
    };
    let dropped: u64 = profile.capture.dropped_by_kind.values().sum();
    let off = |reported: u64, expected: i64| {
        100.0 * (reported as f64 - expected as f64) / (expected.max(1) as f64)
    };
    println!(
        "FIGURES {name}: {} events, {} dropped ({:?}), peak {} B against {} B counted \
         ({:+.3}%), final live {} B against {} B",
        summary.event_count,
        dropped,
        profile.capture.dropped_by_kind,
        summary.peak_bytes,
        expected_peak,
        off(summary.peak_bytes, expected_peak),
        summary.final_live_bytes,
        expected_live,
    );
    assert_eq!(
        (
            summary.dropped_events,
            dropped,
            profile.capture.unattributed_dropped
        ),
        (0, 0, 0),
        "{name}: lossless capture must drop nothing; dropped by kind {:?} of {} events recorded \
         (the peak came out {:+.3}% off the true {expected_peak} B)",
        profile.capture.dropped_by_kind,
        summary.event_count,
        off(summary.peak_bytes, expected_peak),
    );
    let lost = common::check_workers(profile, workers, Some([0; 3]), None);
    assert_eq!(lost, 0, "{name}: the workers' events were dropped");
    assert_eq!(
        summary.alloc_count,
        count(|r| &r.window_allocs),
        "{name}: allocations"
    );
    assert_eq!(
        summary.free_count,
        count(|r| &r.window_known_frees),
        "{name}: frees of blocks seen allocated"
    );
    assert_eq!(
        summary.realloc_count,
        count(|r| &r.window_reallocs),
        "{name}: reallocs"
    );
    assert_eq!(
        summary.unknown_frees,
        count(|r| &r.window_unknown_frees),
        "{name}: frees of blocks allocated before the session"
    );
    assert_eq!(
        summary.reorder_repairs, 0,
        "{name}: events needed ordering repairs"
    );
    assert_eq!(
        profile.capture.late_events, 0,
        "{name}: events were merged after newer ones"
    );
    assert_eq!(
        summary.peak_bytes as i64, expected_peak,
        "{name}: peak live bytes differ from the independent count"
    );
    assert_eq!(
        summary.final_live_bytes as i64, expected_live,
        "{name}: final live bytes differ from the independent count"
    );
}

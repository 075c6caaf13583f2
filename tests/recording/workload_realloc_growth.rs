//! `Vec`s and `String`s grown one element at a time, so most events are `realloc`s, some kept
//! to the end. With default settings nothing is dropped, recorded + dropped = performed, and
//! the realloc count, the peak and the final live bytes equal the counts the inner allocator
//! kept (see `highwater_testkit::exact`).

use highwater_testkit::child::isolated;
use highwater_testkit::exact::{check_exact, on_worker, record};
use highwater_testkit::workloads;

#[test]
fn growing_buffers_are_recorded_exactly() {
    isolated("growing_buffers_are_recorded_exactly", || {
        let (profile, (worker, grown)) = record(|| on_worker(|| workloads::grow_buffers(20)));
        assert_eq!(grown.buffers, 20 * 128);
        assert!(grown.kept_bytes > 0, "{grown:?}");
        assert!(
            profile.summary.realloc_count > profile.summary.alloc_count,
            "growth one element at a time is mostly reallocs: {:?}",
            profile.summary
        );
        check_exact("realloc", &profile, &[worker]);
    });
}

//! `Vec`s and `String`s grown one element at a time, so most events are `realloc`s, some kept
//! to the end. With default settings nothing is dropped, recorded + dropped = performed, and
//! the realloc count, the peak and the final live bytes equal the counts the inner allocator
//! kept (see `workload_support`).

mod common;
mod workload_support;

use common::isolated;
use workload_support::{check_exact, on_worker, record, workloads};

#[global_allocator]
static GLOBAL: common::TestAlloc = common::test_alloc();

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

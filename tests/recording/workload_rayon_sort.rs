//! rayon on two threads: strings made and sorted in parallel, folded into per-task `HashMap`s
//! and reduced, then freed by the thread that asked for them, not the threads that made them.
//! With default settings nothing is dropped, recorded + dropped = performed per thread, and the
//! peak and final live bytes equal the counts the inner allocator kept (see
//! `highwater_testkit::exact`; the peak is while the sort's buffer and every string are live).

use highwater_testkit::child::isolated;
use highwater_testkit::exact::{check_exact, record};
use highwater_testkit::workloads;

const CONFIG: workloads::SortConfig = workloads::SortConfig {
    threads: 2,
    strings: 200_000,
};

#[test]
fn rayon_work_stealing_is_recorded_exactly() {
    isolated("rayon_work_stealing_is_recorded_exactly", || {
        let (profile, sorted) = record(|| workloads::sort_and_count(CONFIG));
        assert_eq!(sorted.strings, CONFIG.strings);
        assert_eq!(sorted.worker_tids.len(), CONFIG.threads);
        // 26³ three-letter prefixes, nearly all of them met among 200,000 random strings.
        assert!(sorted.prefixes > 17_000, "{sorted:?}");
        check_exact("rayon", &profile, &sorted.worker_tids);
    });
}

//! Four threads build `HashMap<String, Vec<u64>>`s and pass them over channels to the next
//! thread, which frees them. With default settings nothing is dropped, recorded + dropped =
//! performed per thread, and the peak and final live bytes equal the counts the inner allocator
//! kept (see `highwater_testkit::exact`; the workload is built so its peak does not depend on how the
//! threads interleave).

use highwater_testkit::child::isolated;
use highwater_testkit::exact::{check_exact, record};
use highwater_testkit::workloads;

const CONFIG: workloads::MapsConfig = workloads::MapsConfig {
    threads: 4,
    rounds: 6,
    maps_per_round: 8,
    entries: 2_000,
};

#[test]
fn four_threads_passing_maps_are_recorded_exactly() {
    isolated("four_threads_passing_maps_are_recorded_exactly", || {
        let (profile, maps) = record(|| workloads::pass_maps(CONFIG));
        assert_eq!(
            maps.maps,
            CONFIG.threads * CONFIG.rounds * CONFIG.maps_per_round
        );
        assert_eq!(maps.entries, maps.maps * CONFIG.entries);
        check_exact("maps", &profile, &maps.worker_tids);
    });
}

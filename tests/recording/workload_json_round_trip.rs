//! A large `serde_json::Value` round trip: a deterministic multi-megabyte document is parsed,
//! walked, written out and parsed again. With default settings nothing is dropped,
//! recorded + dropped = performed per thread, and the peak and final live bytes equal the
//! counts the inner allocator kept (see `highwater_testkit::exact`).

use highwater_testkit::child::isolated;
use highwater_testkit::exact::{check_exact, on_worker, record};
use highwater_testkit::workloads;

/// Size of the generated document: a few MB, so a debug build stays quick.
const DOCUMENT_BYTES: usize = 4 << 20;

#[test]
fn json_value_round_trip_is_recorded_exactly() {
    isolated("json_value_round_trip_is_recorded_exactly", || {
        let (profile, (worker, trip)) = record(|| {
            on_worker(|| {
                let document = workloads::json_document(DOCUMENT_BYTES);
                workloads::json_round_trip(&document).expect("the round trip")
            })
        });
        assert!(trip.nodes > 100_000, "too few values: {trip:?}");
        assert!(trip.written_bytes >= DOCUMENT_BYTES, "{trip:?}");
        check_exact("json", &profile, &[worker]);
    });
}

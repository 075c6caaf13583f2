//! A parser building many small trees, all alive at once: `syn` parses this crate's own
//! `src/**/*.rs` several times over and keeps every tree until the last is built. With default
//! settings nothing is dropped, recorded + dropped = performed per thread, and the peak and
//! final live bytes equal the counts the inner allocator kept (see `highwater_testkit::exact`).

use std::path::PathBuf;

use highwater_testkit::child::isolated;
use highwater_testkit::exact::{check_exact, on_worker, record};
use highwater_testkit::workloads;

/// Parses of the whole source set kept alive together.
const COPIES: usize = 2;

#[test]
fn syn_trees_of_this_crate_are_recorded_exactly() {
    isolated("syn_trees_of_this_crate_are_recorded_exactly", || {
        let (profile, (worker, trees)) = record(|| {
            on_worker(|| {
                let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
                let sources = workloads::rust_sources(&[root]).expect("read src/");
                assert!(sources.len() > 20, "only {} sources found", sources.len());
                workloads::parse_trees(&sources, COPIES).expect("src/ parses")
            })
        });
        assert!(trees.items > 100 * COPIES, "too few items: {trees:?}");
        check_exact("syn", &profile, &[worker]);
    });
}

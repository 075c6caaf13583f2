//! A measurement gives the same figures with a session recording as without one, and the
//! session still records everything the measured closure did.

use std::hint::black_box;

use highwater::{Category, Measurement, Session};

use highwater_testkit::child::isolated;

/// One session runs at a time in a process: the tests that start one take turns.
static ONE_SESSION: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Named spans and ops (a session interns their names, allocating while paused) and a mix of
/// allocations, reallocs and frees.
fn work() -> Vec<Vec<u8>> {
    let mut kept = Vec::new();
    for i in 0..500usize {
        let _step = highwater::profile!("step");
        let _fwd = highwater::profile!("forward", Category::Activation);
        let op = highwater::ops::op("matmul");
        let mut v = black_box(vec![0u8; 64 + i % 300]);
        v.reserve(i % 100);
        drop(op);
        if i % 50 == 0 {
            kept.push(v);
        }
    }
    kept
}

/// `m` without its sampled stacks' program counters: the frames of highwater's own hook take
/// another path while a session records. The sites' estimates, samples and stack depths stay.
fn figures(m: &Measurement) -> Measurement {
    let mut m = m.clone();
    for site in &mut m.sites {
        site.stack.iter_mut().for_each(|pc| *pc = 0);
    }
    m
}

#[test]
fn the_figures_are_the_same_with_and_without_a_session() {
    isolated(
        "the_figures_are_the_same_with_and_without_a_session",
        || {
            let _turn = ONE_SESSION
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let (kept, without) = highwater::measure(work);
            drop(kept);
            let session = Session::builder().write_profile(false).start().unwrap();
            let (kept, during) = highwater::measure(work);
            drop(kept);
            let profile = session.finish().unwrap();
            let (kept, after) = highwater::measure(work);
            drop(kept);
            assert_eq!(figures(&during), figures(&without));
            assert_eq!(after, without);
            assert!(!without.sites.is_empty(), "about 190 KB allocated: sampled");
            assert!(without.allocations >= 500 && without.leaked_blocks >= 10);
            // The session saw the measured closure's allocations too.
            assert!(
                profile.summary.alloc_count >= without.allocations,
                "profile {} allocations, measured {}",
                profile.summary.alloc_count,
                without.allocations
            );
        },
    );
}

/// A session started and finished inside the closure: its own allocations (the collector's
/// setup, the profile it builds) are highwater's, not the closure's.
#[test]
fn a_session_started_and_finished_inside_adds_nothing_to_the_figures() {
    isolated(
        "a_session_started_and_finished_inside_adds_nothing_to_the_figures",
        || {
            let _turn = ONE_SESSION
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let (kept, plain) = highwater::measure(work);
            drop(kept);
            let ((), with_session) = highwater::measure(|| {
                let session = Session::builder().write_profile(false).start().unwrap();
                drop(work());
                let profile = session.finish().unwrap();
                assert!(profile.summary.alloc_count >= 500);
                // The profile itself was built for the closure, though, and is freed here.
                drop(profile);
            });
            assert_eq!(with_session.allocations, plain.allocations);
            assert_eq!(with_session.allocated_bytes, plain.allocated_bytes);
            assert_eq!(with_session.peak_bytes, plain.peak_bytes);
        },
    );
}

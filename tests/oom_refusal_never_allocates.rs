//! Issue 17, item 2, the hot-path rule: recording a refused allocation and waiting for its
//! checkpoint makes no allocation through the global allocator on the refused thread (the
//! detector around highwater's `Alloc` would see the nested call), and the wait ends.

use std::alloc::{Layout, System};
use std::sync::atomic::Ordering;
use std::time::Duration;

use highwater::{Alloc, Profile, Session, Step};

use highwater_testkit::reentry::{Detector, CALLS, NESTED};

#[global_allocator]
static ALLOC: Detector = Detector(Alloc::new(System));

/// More than any address space: the system allocator returns null for it.
const IMPOSSIBLE: usize = 1 << 62;

#[test]
fn a_refused_allocation_and_its_checkpoint_wait_never_allocate_on_the_refused_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    // The refused thread waits for its checkpoint however busy the machine is: the count
    // below says the first refusal was on disk before `alloc` returned.
    let session = Session::builder()
        .output(&path)
        .oom_wait(Duration::from_secs(600))
        .start()
        .unwrap();
    let before = (CALLS.load(Ordering::SeqCst), NESTED.load(Ordering::SeqCst));
    let kept = vec![7u8; 1 << 16];
    let refusals = {
        let _step = highwater::profile!("train_step", Step::Forward);
        let layout = Layout::from_size_align(IMPOSSIBLE, 64).unwrap();
        let mut refusals = 0u64;
        for _ in 0..3 {
            // `black_box` on the layout and the result: an optimised build may otherwise assume
            // the allocation succeeds, or drop it as unused.
            // SAFETY: a non-zero size; the null result is only compared.
            let block =
                std::hint::black_box(unsafe { std::alloc::alloc(std::hint::black_box(layout)) });
            assert!(block.is_null());
            // SAFETY: as above.
            let zeroed = std::hint::black_box(unsafe {
                std::alloc::alloc_zeroed(std::hint::black_box(layout))
            });
            assert!(zeroed.is_null());
            refusals += 2;
        }
        refusals
    };
    let nested = NESTED.load(Ordering::SeqCst) - before.1;
    assert!(CALLS.load(Ordering::SeqCst) > before.0);
    let checkpoint = Profile::load(&path).unwrap();
    drop(kept);
    let profile = session.finish().unwrap();
    assert_eq!(
        nested, 0,
        "the refusal path allocated through the global allocator"
    );
    assert!(checkpoint.meta.partial);
    // The first refusal waits for a checkpoint that holds it; the others, within the same
    // second, are recorded without a wait of their own (a retry loop must not stall on one
    // checkpoint per attempt).
    assert!(
        (1..=refusals).contains(&checkpoint.summary.oom_count),
        "the first refusal waited for its checkpoint: {} of {refusals} in it",
        checkpoint.summary.oom_count
    );
    assert_eq!(profile.summary.oom_count, refusals);
    assert!(profile
        .oom_events
        .iter()
        .all(|oom| oom.requested_bytes == IMPOSSIBLE as u64));
}

//! Issue 17, item 2: when the inner allocator returns null, the refusal is an OOM event with
//! what was live at that moment, and a checkpoint holding it is on disk before `alloc` returns
//! null (after which Rust would abort). Checkpoints are otherwise off here: a refusal writes one
//! anyway. The live bytes are checked against the counting allocator's own figure.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;

use highwater::profile::model::OomSource;
use highwater::{Alloc, Category, Profile, Session, Step};

/// Requests at least this big are refused, as an exhausted system would.
const REFUSED_FROM: usize = 1 << 40;

/// The system allocator, except that it refuses huge requests.
struct Refusing;

// SAFETY: forwards to `System` under the caller's contract, or returns null, which every
// `GlobalAlloc` method may do for an allocation.
unsafe impl GlobalAlloc for Refusing {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= REFUSED_FROM {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract; refused blocks are never freed.
        unsafe { System.dealloc(block, layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= REFUSED_FROM {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract.
        unsafe { System.realloc(block, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Alloc<highwater_testkit::counting::Counting<Refusing>> =
    Alloc::new(highwater_testkit::counting::Counting(Refusing));

#[test]
fn a_null_from_the_inner_allocator_is_checkpointed_with_what_was_live() {
    highwater_testkit::child::isolated(
        "a_null_from_the_inner_allocator_is_checkpointed_with_what_was_live",
        || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("run.json");
            // The checkpoint is read as soon as `alloc` returns: the refused thread must wait
            // for it however busy the machine is (the default 5 s was once not enough).
            let session = Session::builder()
                .output(&path)
                .oom_wait(highwater_testkit::child::WATCHDOG)
                .start()
                .unwrap();
            highwater_testkit::counting::open_window();
            let weights = {
                let _init = highwater::profile!("init", Category::Parameter);
                black_box(vec![1u8; 3 << 20])
            };
            let (refused, live_then) = {
                let _step = highwater::profile!("train_step", Step::Forward);
                // Interning the op's name allocates, paused: not the program's memory.
                let _op = highwater_testkit::counting::uncounted(|| highwater::ops::op("matmul"));
                let activations = black_box(vec![2u8; 1 << 20]);
                let live_then = highwater_testkit::counting::window_live();
                let layout = Layout::from_size_align(REFUSED_FROM + 7, 8).unwrap();
                // SAFETY: a non-zero size; a null result is handled below. `black_box`: an
                // optimised build may otherwise assume the allocation succeeds, or drop it.
                let refused = black_box(unsafe { std::alloc::alloc(black_box(layout)) });
                drop(activations);
                (refused, live_then)
            };
            assert!(refused.is_null());
            // Read while the session still records: this is the checkpoint the refusal wrote.
            let checkpoint =
                highwater_testkit::counting::uncounted(|| Profile::load(&path)).unwrap();
            highwater_testkit::counting::close_window();
            assert!(checkpoint.meta.partial, "{:?}", checkpoint.meta);
            assert_eq!(checkpoint.summary.oom_count, 1);
            let oom = &checkpoint.oom_events[0];
            assert_eq!(
                (oom.source, oom.device.as_str(), oom.requested_bytes),
                (OomSource::Heap, "cpu", REFUSED_FROM as u64 + 7)
            );
            assert_eq!(
                (oom.span_path.as_str(), oom.op.as_deref()),
                ("train_step", Some("matmul"))
            );
            assert_eq!(oom.live_bytes as i64, live_then, "{oom:#?}");
            assert_eq!(
                oom.live_by_category.get(&Category::Parameter),
                Some(&(3 << 20))
            );
            let top = &oom.live[0];
            assert_eq!(
                (top.span_path.as_str(), top.category, top.bytes),
                ("init", Category::Parameter, 3 << 20)
            );
            drop(weights);
            let profile = session.finish().unwrap();
            assert!(!profile.meta.partial);
            assert_eq!(profile.oom_events, checkpoint.oom_events);
            let written = Profile::load(&path).unwrap();
            assert!(
                !written.meta.partial,
                "the final profile replaced the checkpoint"
            );
        },
    );
}

#[test]
fn a_refused_realloc_keeps_the_old_block_and_is_recorded() {
    highwater_testkit::child::isolated(
        "a_refused_realloc_keeps_the_old_block_and_is_recorded",
        || {
            let session = Session::builder().write_profile(false).start().unwrap();
            let mut kept = black_box(vec![0u8; 4096]);
            // A refused growth: `try_reserve` reports it instead of aborting.
            assert!(kept.try_reserve(REFUSED_FROM).is_err());
            let profile = session.finish().unwrap();
            assert_eq!(profile.summary.oom_count, 1);
            let oom = &profile.oom_events[0];
            assert!(oom.requested_bytes >= REFUSED_FROM as u64, "{oom:#?}");
            assert_eq!(oom.live_bytes, 4096, "the old block is still live");
            assert_eq!(profile.summary.final_live_bytes, 4096);
            drop(kept);
        },
    );
}

/// Hardening, row 10: a program that recovers from refusals (here a hundred `try_reserve`s in a
/// row) is not stalled on a checkpoint for each. The first refusal waits for one that holds it;
/// the next ones within a second are only recorded, so the checkpoint on disk holds fewer than
/// all of them, and the final profile holds every one.
#[test]
fn refusals_a_program_recovers_from_do_not_each_wait_for_a_checkpoint() {
    highwater_testkit::child::isolated(
        "refusals_a_program_recovers_from_do_not_each_wait_for_a_checkpoint",
        || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("run.json");
            let session = Session::builder().output(&path).start().unwrap();
            let mut kept = black_box(vec![0u8; 4096]);
            const REFUSALS: u64 = 100;
            for _ in 0..REFUSALS {
                assert!(kept.try_reserve(REFUSED_FROM).is_err());
            }
            let checkpoint = Profile::load(&path).unwrap();
            let profile = session.finish().unwrap();
            assert!(checkpoint.meta.partial);
            assert!(
                (1..REFUSALS / 2).contains(&checkpoint.summary.oom_count),
                "the first refusal waited for a checkpoint and most of the others did not: {} of \
                 {REFUSALS} in it",
                checkpoint.summary.oom_count
            );
            assert_eq!(
                profile.summary.oom_count, REFUSALS,
                "every refusal is in the profile"
            );
            drop(kept);
        },
    );
}

/// The run a user loses today: an allocation fails, Rust aborts the process, and the profile
/// the session would have written at exit never is. The checkpoint the refusal wrote is left.
#[test]
fn a_process_that_aborts_on_a_failed_allocation_leaves_a_checkpoint_that_says_so() {
    const NAME: &str =
        "a_process_that_aborts_on_a_failed_allocation_leaves_a_checkpoint_that_says_so";
    if highwater_testkit::child::is_child(NAME) {
        let path = std::env::var_os("HW_OOM_OUT").unwrap();
        let _session = Session::builder()
            .output(path)
            .oom_wait(highwater_testkit::child::WATCHDOG)
            .start()
            .unwrap();
        let _weights = black_box(vec![1u8; 2 << 20]);
        let _step = highwater::profile!("train_step", Step::Forward);
        // `handle_alloc_error` aborts the process after the allocator returns null.
        let doomed: Vec<u8> = Vec::with_capacity(REFUSED_FROM + 1);
        black_box(doomed);
        unreachable!("the allocation failed, so the process aborted");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    let output = highwater_testkit::child::run_child(
        NAME,
        &[("HW_OOM_OUT", path.to_str().unwrap())],
        highwater_testkit::child::WATCHDOG,
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(output.status.signal(), Some(libc::SIGABRT), "{output:?}");
    let left = Profile::load(&path).unwrap();
    assert!(left.meta.partial);
    assert_eq!(left.summary.oom_count, 1);
    let oom = &left.oom_events[0];
    assert_eq!(oom.requested_bytes, REFUSED_FROM as u64 + 1);
    assert_eq!(oom.span_path, "train_step");
    assert!(oom.live_bytes >= 2 << 20, "{oom:#?}");
    assert!(left.warnings.iter().any(|w| w.code() == "out_of_memory"));
}

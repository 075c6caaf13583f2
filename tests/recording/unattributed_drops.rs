//! Events lost with no ring to charge them to are counted once per record: a realloc is two
//! raw events (its old and its new block), and its loss must count one realloc, not two events,
//! in `CaptureStats::unattributed_dropped`, in `dropped_by_kind` and in the summary.
//!
//! Every ring slot of the registry is claimed by a thread that then waits, so one more thread
//! finds the table full and every call it makes is dropped unattributed. Counts come from the
//! counting harness of `highwater_testkit::counting`, outside highwater.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::{Arc, Barrier};

use highwater::Session;
use highwater_testkit::child::isolated;
use highwater_testkit::counting::{gettid, performed, ALLOC, FREE, REALLOC};

/// Ring slots in the registry (`capture::registry::MAX_THREADS`).
const RING_SLOTS: usize = 1024;
/// Reallocs the ringless thread makes.
const REALLOCS: usize = 300;

#[test]
fn a_lost_realloc_counts_once() {
    isolated("a_lost_realloc_counts_once", || {
        let session = Session::builder()
            .ring_events(1024)
            .write_profile(false)
            .start()
            .unwrap();
        // This thread (it allocated above) and the holders claim every slot; holders keep
        // theirs until the ringless thread is done.
        let release = Arc::new(Barrier::new(RING_SLOTS));
        let claimed = Arc::new(Barrier::new(RING_SLOTS));
        let holders: Vec<_> = (1..RING_SLOTS)
            .map(|_| {
                let (release, claimed) = (Arc::clone(&release), Arc::clone(&claimed));
                std::thread::spawn(move || {
                    drop(std::hint::black_box(vec![0u8; 8]));
                    claimed.wait();
                    release.wait();
                })
            })
            .collect();
        claimed.wait();
        let ringless = std::thread::spawn(|| {
            let mut layout = Layout::from_size_align(16, 8).unwrap();
            // SAFETY: non-zero sizes; every block is the one the previous call returned, with
            // the layout it was made with, and is freed once at the end.
            unsafe {
                let mut block = crate::GLOBAL.alloc(layout);
                assert!(!block.is_null());
                for round in 0..REALLOCS {
                    let size = 16 + (round % 200) * 8;
                    block = crate::GLOBAL.realloc(block, layout, size);
                    assert!(!block.is_null());
                    layout = Layout::from_size_align(size, 8).unwrap();
                }
                crate::GLOBAL.dealloc(block, layout);
            }
            gettid()
        })
        .join()
        .unwrap();
        release.wait();
        for holder in holders {
            holder.join().unwrap();
        }
        let profile = session.finish().unwrap();

        let done = performed(&[ringless]);
        assert!(done[REALLOC] >= REALLOCS as u64, "{done:?}");
        assert!(
            profile.capture.threads.iter().all(|t| t.os_tid != ringless),
            "the ringless thread got a ring: {:?}",
            profile.capture.threads.len()
        );
        let by_kind = |name: &str| profile.capture.dropped_by_kind[name];
        let attributed = |field: fn(&highwater::profile::ThreadCapture) -> u64| {
            profile.capture.threads.iter().map(field).sum::<u64>()
        };
        let loose = [
            by_kind("alloc") - attributed(|t| t.dropped_allocs),
            by_kind("free") - attributed(|t| t.dropped_frees),
            by_kind("realloc") - attributed(|t| t.dropped_reallocs),
        ];
        // The ringless thread's calls are all lost, each once; other threads may lose a few
        // (thread start and exit), never fewer.
        for kind in [ALLOC, FREE, REALLOC] {
            assert!(loose[kind] >= done[kind], "{loose:?} against {done:?}");
        }
        assert_eq!(
            profile.capture.unattributed_dropped,
            loose.iter().sum::<u64>() + (by_kind("other") - attributed(|t| t.dropped_other)),
            "unattributed_dropped counts records: {:?}",
            profile.capture
        );
        assert_eq!(
            profile.summary.dropped_events,
            profile.capture.dropped_by_kind.values().sum::<u64>(),
            "the summary counts each lost record once: {:?}",
            profile.capture.dropped_by_kind
        );
    });
}

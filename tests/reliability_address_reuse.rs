//! Cross-thread address reuse: thread A frees p, thread B is handed p at once. The merged order
//! must put A's free before B's allocation, or the profile would show p live twice (a repair),
//! a free of an address it never saw, or live bytes that drift.
//!
//! The inner allocator serves the buffers from one shared last-in-first-out pool, so a freed
//! buffer is usually the next one any thread gets, and counts how often the thread that gets a
//! block is not the one that freed it. Threads pass buffers around a ring through channels.
//! The test runs in a child process under a watchdog (`highwater_testkit::child::isolated`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use highwater::{Alloc, Session, Step};
use highwater_testkit::child::isolated;
use highwater_testkit::counting::{gettid, Counting, Watched};

/// Bytes of the buffers passed around (what the program asks for).
const BUFFER: usize = 1000;
/// Blocks the shared pool can hold.
const POOL_SLOTS: usize = 4096;

/// A shared stack of free blocks of one layout; everything else goes to the system allocator.
struct SharedPool {
    lock: AtomicBool,
    blocks: UnsafeCell<[usize; POOL_SLOTS]>,
    len: UnsafeCell<usize>,
}

// SAFETY: `blocks` and `len` are only touched while `lock` is held.
unsafe impl Sync for SharedPool {}

/// Blocks handed to a thread other than the one that freed them.
static HANDOFFS: AtomicU64 = AtomicU64::new(0);

/// Set once the workers may stop after their `ROUNDS`: at once without snapshots, after
/// `SNAPSHOTS` of them with, so that the snapshots overlap the workload however slow it runs.
static MAY_STOP: AtomicBool = AtomicBool::new(false);

impl SharedPool {
    /// The layout `Counting` asks for when the program asks for a `BUFFER`-byte buffer.
    fn pooled(layout: Layout) -> bool {
        layout.size() == BUFFER + 16 && layout.align() <= 16
    }

    fn with_lock<R>(&self, f: impl FnOnce(&mut [usize; POOL_SLOTS], &mut usize) -> R) -> R {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held, so nobody else touches the stack.
        let result = unsafe { f(&mut *self.blocks.get(), &mut *self.len.get()) };
        self.lock.store(false, Ordering::Release);
        result
    }
}

// SAFETY: pooled blocks are system blocks of the pooled layout, kept on the stack while free
// and handed out again for the same layout; others are forwarded to System unchanged.
unsafe impl GlobalAlloc for SharedPool {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if Self::pooled(layout) {
            let block = self.with_lock(|blocks, len| {
                (*len > 0).then(|| {
                    *len -= 1;
                    blocks[*len]
                })
            });
            if let Some(block) = block {
                let block = block as *mut u8;
                // SAFETY: a free pooled block; bytes 8..16 hold the tid of the thread that
                // freed it (see `dealloc`).
                let freed_by = unsafe { block.add(8).cast::<u64>().read() };
                if freed_by != gettid() {
                    HANDOFFS.fetch_add(1, Ordering::Relaxed);
                }
                return block;
            }
        }
        // SAFETY: caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if Self::pooled(layout) {
            // SAFETY: the block is ours again and at least 16 bytes long.
            unsafe { block.add(8).cast::<u64>().write(gettid()) };
            let kept = self.with_lock(|blocks, len| {
                if *len < POOL_SLOTS {
                    blocks[*len] = block as usize;
                    *len += 1;
                    true
                } else {
                    false
                }
            });
            if kept {
                return;
            }
        }
        // SAFETY: caller's contract.
        unsafe { System.dealloc(block, layout) }
    }
}

#[global_allocator]
static GLOBAL: Watched<Alloc<Counting<SharedPool>>> = Watched(Alloc::new(Counting(SharedPool {
    lock: AtomicBool::new(false),
    blocks: UnsafeCell::new([0; POOL_SLOTS]),
    len: UnsafeCell::new(0),
})));

/// Threads in the ring.
const THREADS: usize = 4;
/// Buffers each thread passes on.
const ROUNDS: usize = 40_000;
/// Snapshots the test thread takes while the workers run.
const SNAPSHOTS: usize = 20;

/// Four threads in a ring each allocate a buffer, pass it to the next thread, and free the one
/// they received, 40,000 times; the shared pool hands freed buffers straight to other threads.
/// Proves, with nothing dropped, against counts the inner allocator kept for every operation
/// made while the window was open (inside the session): the profile counts exactly the
/// allocations, frees of blocks it saw allocated, reallocs and frees of blocks allocated before
/// the session, its final live bytes equal the exact net bytes, and it needed no ordering
/// repair — so no address was ever live twice and no live count went below its true value.
#[test]
fn cross_thread_address_reuse_never_makes_an_address_live_twice() {
    isolated(
        "cross_thread_address_reuse_never_makes_an_address_live_twice",
        || pass_buffers_around(false),
    );
}

/// The same, while the test thread takes a snapshot every millisecond. Regression: a snapshot
/// merged everything drained so far, so an allocation drained from one ring could be merged
/// before the free it depended on, which its ring published just after being drained; the free
/// then arrived as a straggler. Proves the same exact figures as above, and zero repairs.
#[test]
fn snapshots_during_cross_thread_reuse_need_no_repair() {
    isolated("snapshots_during_cross_thread_reuse_need_no_repair", || {
        pass_buffers_around(true)
    });
}

/// The workload and its checks; with `snapshots`, the test thread takes snapshots meanwhile.
fn pass_buffers_around(snapshots: bool) {
    {
        {
            highwater_testkit::counting::wait_for_other_threads_to_sleep();
            // Call-site sampling off: a snapshot that symbolises sites (the first one in a
            // process loads the line tables) would leave too few snapshots in the workload.
            let session = Session::builder()
                .write_profile(false)
                .sample_bytes(0)
                .start()
                .unwrap();
            highwater_testkit::counting::open_window();
            let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
                .map(|_| std::sync::mpsc::sync_channel::<Vec<u8>>(64))
                .unzip();
            MAY_STOP.store(!snapshots, Ordering::SeqCst);
            let mut senders: Vec<_> = senders.into_iter().map(Some).collect();
            senders.rotate_left(1);
            let workers: Vec<_> = receivers
                .into_iter()
                .zip(senders.iter_mut().map(|s| s.take().unwrap()))
                .enumerate()
                .map(|(worker, (receive, send))| {
                    std::thread::spawn(move || {
                        let _span = highwater::profile!("pass", Step::Forward);
                        let buffer = |round: usize| {
                            let mut buffer = Vec::with_capacity(BUFFER);
                            buffer.push((worker + round) as u8);
                            buffer
                        };
                        send.send(buffer(0)).unwrap();
                        let mut round = 1;
                        while round < ROUNDS || !MAY_STOP.load(Ordering::SeqCst) {
                            // Receive first, allocate second, free last: the block this
                            // thread gets is the one some thread freed most recently, often
                            // while this one waited. A neighbour that stopped first has
                            // dropped its sender: this one stops too.
                            let Ok(received) = receive.recv() else {
                                break;
                            };
                            send.send(buffer(round)).unwrap();
                            black_box(&received);
                            drop(received);
                            round += 1;
                        }
                        drop(send);
                        // Drain what is still in flight.
                        for received in receive {
                            black_box(received);
                        }
                    })
                })
                .collect();
            if snapshots {
                let mut taken = 0;
                while workers.iter().any(|w| !w.is_finished()) {
                    let snapshot =
                        highwater_testkit::counting::uncounted(|| session.snapshot().unwrap());
                    assert_eq!(
                        snapshot.summary.reorder_repairs, 0,
                        "snapshot {taken} needed ordering repairs"
                    );
                    assert_eq!(
                        snapshot.capture.late_events, 0,
                        "snapshot {taken} merged events after newer ones"
                    );
                    assert_eq!(
                        snapshot.meta.threads as usize,
                        snapshot.capture.threads.len(),
                        "snapshot {taken} counts its threads two ways"
                    );
                    taken += 1;
                    if taken == SNAPSHOTS {
                        MAY_STOP.store(true, Ordering::SeqCst);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                assert!(taken >= SNAPSHOTS, "only {taken} snapshots were taken");
            }
            for worker in workers {
                worker.join().unwrap();
            }
            highwater_testkit::counting::close_window();
            let profile = session.finish().unwrap();

            let handoffs = HANDOFFS.load(Ordering::SeqCst);
            assert!(
                handoffs > 10_000,
                "the pool should hand many freed buffers to other threads: {handoffs}"
            );
            let summary = &profile.summary;
            assert_eq!(
                summary.dropped_events, 0,
                "the exact comparison needs every event"
            );
            let recorded: Vec<u64> = profile.capture.threads.iter().map(|t| t.os_tid).collect();
            let rows = || {
                recorded
                    .iter()
                    .flat_map(|&tid| highwater_testkit::counting::rows_of(tid))
            };
            let sum = |field: fn(&highwater_testkit::counting::Row) -> u64| {
                rows().map(field).sum::<u64>()
            };
            let allocs = sum(|r| r.window_allocs.load(Ordering::SeqCst));
            let known = sum(|r| r.window_known_frees.load(Ordering::SeqCst));
            let unknown = sum(|r| r.window_unknown_frees.load(Ordering::SeqCst));
            let reallocs = sum(|r| r.window_reallocs.load(Ordering::SeqCst));
            let live: i64 = rows().map(|r| r.window_live.load(Ordering::SeqCst)).sum();
            assert!(allocs >= (THREADS * ROUNDS) as u64);
            assert_eq!(
                summary.reorder_repairs, 0,
                "an allocation landed on a live address or a free arrived after its address \
                 was reused ({handoffs} handoffs)"
            );
            assert_eq!(
                profile.capture.late_events, 0,
                "events were merged after newer ones ({handoffs} handoffs)"
            );
            assert_eq!(summary.alloc_count, allocs, "allocations");
            assert_eq!(summary.free_count, known, "frees of blocks seen allocated");
            assert_eq!(summary.realloc_count, reallocs, "reallocs");
            assert_eq!(
                summary.unknown_frees, unknown,
                "frees of blocks allocated before the session"
            );
            assert_eq!(
                summary.final_live_bytes as i64, live,
                "final live bytes: the profile's count drifted from the true one"
            );
            println!(
                "{handoffs} cross-thread handoffs, {allocs} allocations, {} events",
                summary.event_count
            );
        }
    }
}

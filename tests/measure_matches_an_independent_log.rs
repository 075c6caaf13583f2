//! `highwater::measure` agrees, figure for figure and span for span, with a brute-force replay
//! of every allocator call the closure made, logged by a wrapper *around* highwater's `Alloc`.
//!
//! The workload is random (seeded): new blocks, frees, growing and shrinking reallocs, frees and
//! reallocs of blocks made before the measurement, inside nested spans. The replay keeps a map
//! of the blocks born inside and snapshots the per-span live bytes at every new peak, the
//! obvious O(n) way; highwater keeps the same figures in O(1) per event.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use highwater::Alloc;

/// Most calls one run may log.
const CAPACITY: usize = 1 << 18;
/// Words per logged call: kind, address, size, new address, new size, span.
const WORDS: usize = 6;

static LOG: [AtomicU64; CAPACITY * WORDS] = [const { AtomicU64::new(0) }; CAPACITY * WORDS];
static LOGGED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static LOGGING: Cell<bool> = const { Cell::new(false) };
    /// The workload's own idea of its innermost span (an index into `SPANS`, 0 for none).
    static SPAN: Cell<u64> = const { Cell::new(0) };
}

const ALLOC_CALL: u64 = 1;
const FREE_CALL: u64 = 2;
const REALLOC_CALL: u64 = 3;

fn log(words: [u64; 5]) {
    if !LOGGING.with(Cell::get) {
        return;
    }
    let at = LOGGED.fetch_add(1, Ordering::Relaxed);
    assert!(at < CAPACITY, "log full");
    let span = SPAN.with(Cell::get);
    for (i, word) in words.into_iter().chain([span]).enumerate() {
        LOG[at * WORDS + i].store(word, Ordering::Relaxed);
    }
}

struct Logger(Alloc<System>);

// SAFETY: forwards every call unchanged; logging only writes static atomics.
unsafe impl GlobalAlloc for Logger {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        let block = unsafe { self.0.alloc(layout) };
        log([ALLOC_CALL, block as u64, layout.size() as u64, 0, 0]);
        block
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        let block = unsafe { self.0.alloc_zeroed(layout) };
        log([ALLOC_CALL, block as u64, layout.size() as u64, 0, 0]);
        block
    }
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        log([FREE_CALL, block as u64, layout.size() as u64, 0, 0]);
        // SAFETY: caller's contract.
        unsafe { self.0.dealloc(block, layout) }
    }
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: caller's contract.
        let moved = unsafe { self.0.realloc(block, layout, new_size) };
        log([
            REALLOC_CALL,
            block as u64,
            layout.size() as u64,
            moved as u64,
            new_size as u64,
        ]);
        moved
    }
}

#[global_allocator]
static ALLOC: Logger = Logger(Alloc::new(System));

/// Added to the outer span's index for an `inner` span inside it.
const INNER: u64 = 100;

/// Span names the workload opens, index 1.. (0: none); an `inner` span may open inside one.
const SPANS: [&str; 4] = ["", "forward", "backward", "optimizer"];

/// What the replay computes, in `Measurement`'s terms.
#[derive(Debug, Default, PartialEq)]
struct Replayed {
    peak: u64,
    allocated: u64,
    allocations: u64,
    leaked: u64,
    leaked_blocks: u64,
    reallocations: u64,
    frees: u64,
    untracked_frees: u64,
    net: i64,
    /// Per path: (allocated, live at the peak, leaked).
    spans: HashMap<String, (u64, u64, u64)>,
}

fn replay(paths: &HashMap<u64, String>) -> Replayed {
    let mut out = Replayed::default();
    let mut born: HashMap<u64, (u64, String)> = HashMap::new();
    let mut live_by_path: HashMap<String, u64> = HashMap::new();
    let mut live = 0u64;
    let mut at_peak: HashMap<String, u64> = HashMap::new();
    let mut allocated_by_path: HashMap<String, u64> = HashMap::new();
    let entries = LOGGED.load(Ordering::SeqCst);
    for at in 0..entries {
        let word = |i: usize| LOG[at * WORDS + i].load(Ordering::Relaxed);
        let (kind, addr, size, new_addr, new_size) = (word(0), word(1), word(2), word(3), word(4));
        let path = paths[&word(5)].clone();
        let mut end = |addr: u64, size: u64, out: &mut Replayed| -> bool {
            match born.remove(&addr) {
                Some((_, path)) => {
                    *live_by_path.get_mut(&path).unwrap() -= size;
                    live -= size;
                    true
                }
                None => {
                    out.untracked_frees += 1;
                    false
                }
            }
        };
        let grown = match kind {
            ALLOC_CALL => {
                out.allocations += 1;
                out.allocated += size;
                out.net += size as i64;
                *allocated_by_path.entry(path.clone()).or_default() += size;
                Some((addr, size))
            }
            FREE_CALL => {
                out.net -= size as i64;
                if end(addr, size, &mut out) {
                    out.frees += 1;
                }
                None
            }
            _ => {
                out.reallocations += 1;
                out.net += new_size as i64 - size as i64;
                let growth = if end(addr, size, &mut out) {
                    new_size.saturating_sub(size)
                } else {
                    new_size
                };
                out.allocated += growth;
                *allocated_by_path.entry(path.clone()).or_default() += growth;
                Some((new_addr, new_size))
            }
        };
        if let Some((addr, size)) = grown {
            born.insert(addr, (size, path.clone()));
            *live_by_path.entry(path).or_default() += size;
            live += size;
            if live > out.peak {
                out.peak = live;
                at_peak = live_by_path.clone();
            }
        }
    }
    out.leaked = live;
    out.leaked_blocks = born.len() as u64;
    for (path, allocated) in allocated_by_path {
        let peak = at_peak.get(&path).copied().unwrap_or(0);
        let leaked = live_by_path.get(&path).copied().unwrap_or(0);
        if (allocated, peak, leaked) != (0, 0, 0) {
            out.spans.insert(path, (allocated, peak, leaked));
        }
    }
    out
}

/// Random work in random spans over `older` (blocks made before the measurement).
fn work(seed: u64, mut older: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut state = seed;
    let mut next = move |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let mut pool: Vec<Vec<u8>> = Vec::new();
    for _ in 0..20_000 {
        let outer = next(4) as usize;
        let _outer = (outer > 0).then(|| {
            SPAN.with(|s| s.set(outer as u64));
            highwater::profile!(SPANS[outer])
        });
        let inner = next(3) == 0;
        let _inner = inner.then(|| {
            SPAN.with(|s| s.set(outer as u64 + INNER));
            highwater::profile!("inner")
        });
        match next(8) {
            0..=2 => pool.push(black_box(vec![1u8; 1 + next(5000) as usize])),
            3 | 4 if !pool.is_empty() => drop(pool.swap_remove(next(pool.len() as u64) as usize)),
            5 if !pool.is_empty() => {
                let at = next(pool.len() as u64) as usize;
                let extra = next(3000) as usize;
                pool[at].reserve_exact(extra);
            }
            6 if !pool.is_empty() => {
                let at = next(pool.len() as u64) as usize;
                pool[at].truncate(1);
                pool[at].shrink_to_fit();
            }
            7 if !older.is_empty() => {
                let at = next(older.len() as u64) as usize;
                if next(2) == 0 {
                    drop(older.swap_remove(at));
                } else {
                    older[at].reserve_exact(64);
                }
            }
            _ => {}
        }
        drop(_inner);
        SPAN.with(|s| s.set(outer as u64));
        drop(_outer);
        SPAN.with(|s| s.set(0));
    }
    // Keep some, free the rest.
    pool.truncate(pool.len() / 2);
    pool
}

#[test]
fn every_figure_matches_a_replay_of_the_logged_calls() {
    let mut paths: HashMap<u64, String> = HashMap::from([(0, String::new())]);
    paths.insert(INNER, "inner".into());
    for (i, name) in SPANS.iter().enumerate().skip(1) {
        paths.insert(i as u64, name.to_string());
        paths.insert(i as u64 + INNER, format!("{name}/inner"));
    }
    for seed in [0x9E37_79B9_7F4A_7C15u64, 7, 0xDEAD_BEEF] {
        let older: Vec<Vec<u8>> = (0..200).map(|i| vec![0u8; 10 + i * 3]).collect();
        LOGGED.store(0, Ordering::SeqCst);
        let (kept, m) = highwater::measure(|| {
            LOGGING.with(|l| l.set(true));
            let kept = work(seed, older);
            LOGGING.with(|l| l.set(false));
            kept
        });
        let expected = replay(&paths);
        assert!(
            expected.allocations > 5_000 && expected.reallocations > 1_000,
            "{expected:?}"
        );
        assert!(
            expected.untracked_frees > 50,
            "older blocks were freed: {expected:?}"
        );
        let got = Replayed {
            peak: m.peak_bytes,
            allocated: m.allocated_bytes,
            allocations: m.allocations,
            leaked: m.leaked_bytes,
            leaked_blocks: m.leaked_blocks,
            reallocations: m.reallocations,
            frees: m.frees,
            untracked_frees: m.untracked_frees,
            net: m.net_bytes,
            spans: m
                .spans
                .iter()
                .map(|row| {
                    (
                        row.path.clone(),
                        (
                            row.allocated_bytes,
                            row.live_at_peak_bytes,
                            row.leaked_bytes,
                        ),
                    )
                })
                .collect(),
        };
        assert_eq!(got, expected, "seed {seed:#x}");
        assert!(m.is_complete());
        drop(kept);
    }
}

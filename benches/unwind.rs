//! The cost of one stack walk by each method: a sampled allocation's stack walked by frame
//! pointers, and the same stack unwound by `.eh_frame` (issue 35).
//!
//! A session with every allocation sampled (`R = 1`) records 64-byte alloc + free pairs made
//! `DEPTH` frames below the benchmark's own, with `HIGHWATER_UNWINDER` set to `frame-pointers`
//! or `eh-frame`; a session with sampling off records the same pairs without a walk. A walk
//! costs the difference, per pair. The three take turns in batches small enough for a ring to
//! hold (no waiting for the collector), and each batch's session is checked to have walked every
//! stack the way it was asked to. Each figure is the median over the batches of one run; the
//! fastest batch is printed beside it.
//!
//! ```text
//! cargo bench --bench unwind
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::{Duration, Instant};

use highwater::Session;

#[global_allocator]
static GLOBAL: highwater::Alloc = highwater::Alloc::system();

const PAIR: Layout = match Layout::from_size_align(64, 8) {
    Ok(layout) => layout,
    Err(_) => panic!("64-byte layout"),
};

/// Frames between the benchmark's loop and its allocations.
const DEPTH: u32 = 24;
/// Pairs per batch: with a stack of about 40 frames, 21 events each, 2,000 fit a 64 Ki ring.
const PAIRS: u32 = 2_000;
/// Batches of each method.
const ROUNDS: usize = 200;

/// `pairs` alloc + free pairs, `depth` frames down; their time.
#[inline(never)]
fn pairs_at(depth: u32, pairs: u32) -> Duration {
    if depth > 0 {
        let time = pairs_at(depth - 1, pairs);
        black_box(depth);
        return time;
    }
    let began = Instant::now();
    for _ in 0..pairs {
        // SAFETY: PAIR has a non-zero size; each block is freed with its layout.
        unsafe {
            let block = GLOBAL.alloc(PAIR);
            black_box(block);
            GLOBAL.dealloc(block, PAIR);
        }
    }
    began.elapsed()
}

/// One batch recorded with `unwinder` (`None`: sampling off): its time and the stack depth
/// walked.
fn batch(unwinder: Option<&str>) -> (Duration, u32) {
    match unwinder {
        Some(name) => std::env::set_var("HIGHWATER_UNWINDER", name),
        None => std::env::remove_var("HIGHWATER_UNWINDER"),
    }
    let session = Session::builder()
        .write_profile(false)
        .sample_bytes(if unwinder.is_some() { 1 } else { 0 })
        .start()
        .expect("a session");
    let time = pairs_at(DEPTH, PAIRS);
    let profile = session.finish().expect("a profile");
    assert_eq!(profile.summary.dropped_events, 0);
    if let Some(name) = unwinder {
        let sampling = &profile.sampling;
        assert_eq!(
            sampling.samples_by_unwinder.get(name),
            Some(&sampling.samples),
            "{name}: {sampling:?}"
        );
        assert!(sampling.samples >= u64::from(PAIRS));
    }
    (time, profile.sampling.max_depth)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that names another benchmark skips this one.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    if !filters.is_empty() && !filters.iter().any(|f| "unwind".contains(f.as_str())) {
        return;
    }
    let methods = [None, Some("frame-pointers"), Some("eh-frame")];
    let mut per_pair: [Vec<f64>; 3] = Default::default();
    let mut depth = 0;
    // One warm-up round: unwind caches, tables, rings.
    for method in methods {
        batch(method);
    }
    for _ in 0..ROUNDS {
        for (index, method) in methods.into_iter().enumerate() {
            let (time, walked) = batch(method);
            depth = depth.max(walked);
            per_pair[index].push(time.as_nanos() as f64 / f64::from(PAIRS));
        }
    }
    let fastest: Vec<f64> = per_pair
        .iter()
        .map(|times| times.iter().copied().fold(f64::INFINITY, f64::min))
        .collect();
    let fastest = |index: usize| fastest[index];
    let [off, pointers, tables] = per_pair.map(median);
    println!(
        "unwind: {ROUNDS} interleaved batches of {PAIRS} alloc + free pairs of 64 B, stacks of \
         {depth} frames"
    );
    println!(
        "  sampling off           {off:8.1} ns a pair (fastest batch {:.1})",
        fastest(0)
    );
    println!(
        "  frame pointers, R = 1  {pointers:8.1} ns a pair (fastest batch {:.1}): a walk {:.1} ns",
        fastest(1),
        pointers - off
    );
    println!(
        "  eh-frame, R = 1        {tables:8.1} ns a pair (fastest batch {:.1}): an unwind {:.1} ns",
        fastest(2),
        tables - off
    );
    println!(
        "  an eh-frame unwind costs {:.1}x a frame-pointer walk",
        (tables - off) / (pointers - off)
    );
}

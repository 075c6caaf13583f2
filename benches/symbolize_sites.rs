//! What symbolising call sites costs when a session finishes: time and memory for a run with
//! more than 10,000 distinct call sites (every allocation sampled, each from its own stack).
//!
//! A binary tree of calls 14 levels deep, one of two functions at each level, allocates 64
//! bytes at each of its 16,384 leaves: 16,384 distinct stacks. The figures are
//! `profile.sampling.symbolize_ns`, the wall time of `Session::finish`, and the most heap the
//! process held above what it held just before `finish` (the collector's assembly of the
//! profile, symbolisation and its caches included), counted by the allocator inside highwater.
//! A first session with a single site runs before it and is reported on its own: it pays for
//! loading the binary's line tables, which the resolver keeps for the rest of the process.
//!
//! Bench builds carry no debug info (`[profile.bench]`); run it with line tables, as a user's
//! release build with `debug = "line-tables-only"` would have them:
//!
//! ```text
//! CARGO_PROFILE_BENCH_DEBUG=line-tables-only cargo bench --bench symbolize_sites
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

/// Counts live heap bytes and their high-water mark.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator unchanged; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed) + layout.size() as i64;
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout, forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: highwater::Alloc<Counting> = highwater::Alloc::new(Counting);

const DEPTH: u32 = 14;

#[inline(never)]
fn left(depth: u32, path: u32, out: &mut Vec<Vec<u8>>) {
    descend(depth, path, out);
    black_box(depth);
}

#[inline(never)]
fn right(depth: u32, path: u32, out: &mut Vec<Vec<u8>>) {
    descend(depth, path, out);
    black_box(path);
}

#[inline(never)]
fn descend(depth: u32, path: u32, out: &mut Vec<Vec<u8>>) {
    if depth == DEPTH {
        out.push(black_box(vec![0u8; 64]));
    } else if path >> depth & 1 == 0 {
        left(depth + 1, path, out);
    } else {
        right(depth + 1, path, out);
    }
}

/// Finishes `session`; returns the profile, the wall time of `finish` and the most heap held
/// above the level just before it.
fn finish(session: highwater::Session) -> (highwater::Profile, f64, f64) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let started = Instant::now();
    let profile = session.finish().expect("finish the session");
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let extra = (PEAK.load(Ordering::Relaxed) - before) as f64 / (1 << 20) as f64;
    (profile, ms, extra)
}

fn start() -> highwater::Session {
    highwater::Session::builder()
        .write_profile(false)
        .sample_bytes(1)
        .start()
        .expect("start a session")
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let session = start();
    let one = black_box(vec![0u8; 64]);
    let (profile, ms, extra) = finish(session);
    drop(one);
    println!(
        "symbolize_sites: first session, {} site(s): symbolised in {:.1} ms; finish {ms:.1} ms; \
         heap above the pre-finish level at most {extra:.1} MiB",
        profile.sampling.distinct_sites,
        profile.sampling.symbolize_ns as f64 / 1e6,
    );

    let leaves = 1u32 << DEPTH;
    let mut kept = Vec::with_capacity(leaves as usize);
    let session = start();
    for path in 0..leaves {
        descend(0, path, &mut kept);
    }
    let (profile, ms, extra) = finish(session);
    drop(kept);
    let sampling = &profile.sampling;
    println!(
        "symbolize_sites: {} distinct sites ({} listed), {} samples; symbolised in {:.1} ms; \
         finish {ms:.1} ms; heap above the pre-finish level at most {extra:.1} MiB",
        sampling.distinct_sites,
        profile.sites.len(),
        sampling.samples,
        sampling.symbolize_ns as f64 / 1e6,
    );
    assert!(sampling.distinct_sites >= 10_000, "{sampling:?}");
    // Optimised code inlines: an inlined frame carries its short name only.
    let named = |frame: &highwater::profile::Frame, name: &str| {
        frame
            .function
            .as_deref()
            .is_some_and(|f| f == name || f.ends_with(&format!("::{name}")))
    };
    let first = &profile.sites[0].frames;
    assert!(
        first
            .iter()
            .any(|frame| named(frame, "left") || named(frame, "right")),
        "{first:#?}"
    );
    assert!(
        !first.iter().any(|frame| named(frame, "alloc_zeroed")),
        "the allocator's frames are trimmed: {first:#?}"
    );
}

//! Counting allocations independently of highwater, for the tests that check its counts.
//!
//! The global allocator of those tests is [`TestAlloc`]: a [`Watched`] wrapper *around*
//! highwater's `Alloc`, which wraps a [`Counting`] allocator *inside* it:
//!
//! ```text
//! Watched ── started/completed ──► highwater::Alloc ── record ──► Counting ── performed ──► inner
//! ```
//!
//! - [`Counting`] counts every operation the hook forwards ("performed"), per OS thread, and
//!   keeps a header on each block saying in which counting *window* it was born, so a test can
//!   compute exactly which frees the profile can match to a recorded allocation.
//! - [`Watched`] counts operations *started* (before highwater sees them) and *completed* (after
//!   highwater returned), for threads that keep allocating while a session ends.
//!
//! Counts live in a fixed table of rows, one per thread, claimed on the thread's first operation
//! through a `const` thread-local with no destructor: no allocation, no lock, valid during
//! thread exit. Each test binary has one table: the process's.

// Counting asks the operating system for thread ids and names directly.
#![allow(clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

use highwater::{Alloc, Profile};

/// Most threads one test process may count.
pub const ROWS: usize = 4096;

/// Operation kinds, the index of per-kind counters.
pub const ALLOC: usize = 0;
/// A free.
pub const FREE: usize = 1;
/// A realloc.
pub const REALLOC: usize = 2;
/// Names of the kinds, as in `CaptureStats::dropped_by_kind`.
pub const KIND_NAMES: [&str; 3] = ["alloc", "free", "realloc"];

/// One thread's counters.
#[derive(Debug)]
pub struct Row {
    /// The thread's OS id (`gettid`), set when the row is claimed.
    pub tid: AtomicU64,
    /// Operations the hook forwarded to [`Counting`], by kind, over the thread's whole life.
    pub performed: [AtomicU64; 3],
    /// Operations that entered [`Watched`], by kind.
    pub started: [AtomicU64; 3],
    /// Operations that returned from highwater to [`Watched`], by kind.
    pub completed: [AtomicU64; 3],
    /// Inside an open window: allocations.
    pub window_allocs: AtomicU64,
    /// Inside an open window: frees of blocks born in the same window.
    pub window_known_frees: AtomicU64,
    /// Inside an open window: frees (and realloc sources) of blocks born outside it.
    pub window_unknown_frees: AtomicU64,
    /// Inside an open window: reallocs.
    pub window_reallocs: AtomicU64,
    /// Inside an open window: bytes made live minus bytes of window-born blocks ended, i.e. what
    /// the profile's live bytes should move by.
    pub window_live: AtomicI64,
    /// Bytes this thread allocated minus bytes it freed, over its whole life.
    pub held: AtomicI64,
    /// Highest value `held` reached.
    pub held_peak: AtomicI64,
    /// Whether the thread is highwater's own (named `highwater-…` when it first allocated):
    /// nothing it does is in a window, as highwater records nothing of it.
    pub internal: AtomicBool,
}

impl Row {
    #[allow(clippy::declare_interior_mutable_const)]
    const NEW: Row = Row {
        tid: AtomicU64::new(0),
        performed: [const { AtomicU64::new(0) }; 3],
        started: [const { AtomicU64::new(0) }; 3],
        completed: [const { AtomicU64::new(0) }; 3],
        window_allocs: AtomicU64::new(0),
        window_known_frees: AtomicU64::new(0),
        window_unknown_frees: AtomicU64::new(0),
        window_reallocs: AtomicU64::new(0),
        window_live: AtomicI64::new(0),
        held: AtomicI64::new(0),
        held_peak: AtomicI64::new(0),
        internal: AtomicBool::new(false),
    };

    /// Moves the thread's and the process's window live bytes by `delta`.
    fn window_moves(&self, delta: i64) {
        self.window_live.fetch_add(delta, Ordering::Relaxed);
        let now = WINDOW_LIVE.fetch_add(delta, Ordering::SeqCst) + delta;
        WINDOW_LIVE_PEAK.fetch_max(now, Ordering::SeqCst);
    }

    fn hold(&self, delta: i64) {
        let now = self.held.fetch_add(delta, Ordering::Relaxed) + delta;
        self.held_peak.fetch_max(now, Ordering::Relaxed);
        let heap = HEAP.fetch_add(delta, Ordering::Relaxed) + delta;
        HEAP_PEAK.fetch_max(heap, Ordering::Relaxed);
    }
}

static TABLE: [Row; ROWS] = [const { Row::NEW }; ROWS];
/// Bytes live on the heap of the whole process (through [`Counting`]), and their highest value
/// since [`reset_heap_peak`].
static HEAP: AtomicI64 = AtomicI64::new(0);
static HEAP_PEAK: AtomicI64 = AtomicI64::new(0);

/// Bytes of blocks born in the open window and not yet ended, over all threads (what a
/// profile's live bytes should be), and their highest value since the window opened (what its
/// peak should be).
static WINDOW_LIVE: AtomicI64 = AtomicI64::new(0);
static WINDOW_LIVE_PEAK: AtomicI64 = AtomicI64::new(0);

/// The highest sum of live bytes of window-born blocks since [`open_window`]: the peak a
/// profile recording exactly that window must report.
pub fn window_live_peak() -> i64 {
    WINDOW_LIVE_PEAK.load(Ordering::SeqCst)
}

/// Bytes of window-born blocks live now: what a profile recording exactly the open window
/// must report as live.
pub fn window_live() -> i64 {
    WINDOW_LIVE.load(Ordering::SeqCst)
}

/// Bytes the process holds on the heap now.
pub fn heap_bytes() -> i64 {
    HEAP.load(Ordering::SeqCst)
}

/// The highest [`heap_bytes`] since the last [`reset_heap_peak`].
pub fn heap_peak() -> i64 {
    HEAP_PEAK.load(Ordering::SeqCst)
}

/// Starts a new heap peak from the current value.
pub fn reset_heap_peak() {
    HEAP_PEAK.store(HEAP.load(Ordering::SeqCst), Ordering::SeqCst);
}

/// Index of the next row to be claimed: rows at or after it belong to threads that had not
/// allocated yet.
pub fn next_row() -> usize {
    NEXT_ROW.load(Ordering::SeqCst)
}
static NEXT_ROW: AtomicUsize = AtomicUsize::new(0);
/// Set if a thread found the table full (its operations were not counted).
static OVERFLOW: AtomicBool = AtomicBool::new(false);
/// The open counting window's number, `0` when closed.
static WINDOW: AtomicU64 = AtomicU64::new(0);
static WINDOWS_OPENED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's row; `usize::MAX` until its first operation.
    static ROW: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Set by [`uncounted`]: this thread's operations are outside every window.
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread's operations outside the counting window, for highwater calls that
/// allocate without recording (`Session::snapshot` runs paused). Blocks it allocates count as
/// born outside the window.
pub fn uncounted<R>(f: impl FnOnce() -> R) -> R {
    UNCOUNTED.with(|flag| flag.set(true));
    let result = f();
    UNCOUNTED.with(|flag| flag.set(false));
    result
}

/// The open window, or `0` when closed, or this thread is [`uncounted`] or highwater's own.
fn window() -> u64 {
    if UNCOUNTED.try_with(Cell::get).unwrap_or(false)
        || row().is_some_and(|row| row.internal.load(Ordering::Relaxed))
    {
        return 0;
    }
    WINDOW.load(Ordering::SeqCst)
}

/// The calling thread's OS id.
pub fn gettid() -> u64 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u64 }
}

/// The calling thread's row, claimed on first use; `None` if the table is full.
fn row() -> Option<&'static Row> {
    let index = ROW.try_with(Cell::get).ok()?;
    if index != usize::MAX {
        return TABLE.get(index);
    }
    let index = NEXT_ROW.fetch_add(1, Ordering::Relaxed);
    let Some(row) = TABLE.get(index) else {
        OVERFLOW.store(true, Ordering::Relaxed);
        return None;
    };
    row.tid.store(gettid(), Ordering::SeqCst);
    row.internal
        .store(thread_name_starts_with(b"highwater-"), Ordering::SeqCst);
    let _ = ROW.try_with(|cell| cell.set(index));
    Some(row)
}

/// Whether the calling thread's name starts with `prefix` (read without allocating).
fn thread_name_starts_with(prefix: &[u8]) -> bool {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer.
    let read = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    read == 0 && name.starts_with(prefix)
}

/// Every claimed row. Panics if some thread could not get one.
pub fn rows() -> &'static [Row] {
    assert!(
        !OVERFLOW.load(Ordering::SeqCst),
        "more than {ROWS} threads: some operations were not counted"
    );
    &TABLE[..NEXT_ROW.load(Ordering::SeqCst).min(ROWS)]
}

/// The rows of the thread with OS id `tid` (a reused tid has several).
pub fn rows_of(tid: u64) -> impl Iterator<Item = &'static Row> {
    rows()
        .iter()
        .filter(move |row| row.tid.load(Ordering::SeqCst) == tid)
}

/// Waits (at most 2 s) until every other thread of this process sleeps, seen on two polls in a
/// row; call it before starting a session whose counts are compared with a window's.
///
/// libtest's main thread spawns the test's thread and then frees what it built the spawn from;
/// under load it does so after the test thread has started recording, and those frees of
/// blocks older than the session count as unknown frees that no window saw.
pub fn wait_for_other_threads_to_sleep() {
    let me = gettid().to_string();
    let all_asleep = || {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return true;
        };
        tasks.flatten().all(|task| {
            let name = task.file_name();
            if name.to_string_lossy() == me {
                return true;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised command name.
            stat.rsplit_once(") ")
                .is_none_or(|(_, rest)| rest.starts_with('S') || rest.starts_with('Z'))
        })
    };
    // Ends as soon as they sleep; the bound only matters if one never does.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut quiet_polls = 0;
    while quiet_polls < 2 && std::time::Instant::now() < deadline {
        quiet_polls = if all_asleep() { quiet_polls + 1 } else { 0 };
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Opens a counting window: from now on [`Counting`] marks new blocks as born in it and counts
/// window operations. Open it only while a session records.
pub fn open_window() {
    let number = WINDOWS_OPENED.fetch_add(1, Ordering::SeqCst) + 1;
    WINDOW_LIVE.store(0, Ordering::SeqCst);
    WINDOW_LIVE_PEAK.store(0, Ordering::SeqCst);
    WINDOW.store(number, Ordering::SeqCst);
}

/// Closes the counting window.
pub fn close_window() {
    WINDOW.store(0, Ordering::SeqCst);
}

/// The header [`Counting`] puts before each block: big enough for a `u64` and the alignment.
fn header(align: usize) -> usize {
    align.max(16)
}

/// An allocator that counts what highwater forwards to it and marks each block with the window
/// it was born in (see the module docs).
#[derive(Debug)]
pub struct Counting<A>(pub A);

impl<A> Counting<A> {
    fn outer(layout: Layout) -> Option<Layout> {
        let size = layout.size().checked_add(header(layout.align()))?;
        Layout::from_size_align(size, layout.align()).ok()
    }
}

/// Counts an allocation of `size` bytes; returns the window to stamp on the block.
fn note_alloc(size: usize, kind: usize) -> u64 {
    let window = window();
    if let Some(row) = row() {
        row.performed[kind].fetch_add(1, Ordering::Relaxed);
        row.hold(size as i64);
        if window != 0 && kind == ALLOC {
            row.window_allocs.fetch_add(1, Ordering::Relaxed);
            row.window_moves(size as i64);
        }
    }
    window
}

/// Counts the end of a block of `size` bytes born in window `born` (by a free, or as the source
/// of a realloc).
fn note_end(size: usize, born: u64, kind: usize) {
    let window = window();
    if let Some(row) = row() {
        if kind == FREE {
            row.performed[FREE].fetch_add(1, Ordering::Relaxed);
        }
        row.hold(-(size as i64));
        if window != 0 {
            if born == window {
                if kind == FREE {
                    row.window_known_frees.fetch_add(1, Ordering::Relaxed);
                }
                row.window_moves(-(size as i64));
            } else {
                row.window_unknown_frees.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

// SAFETY: every block is the inner allocator's block with a header in front, allocated and freed
// with the same enlarged layout; the pointer returned is `header` bytes in, which keeps the
// alignment because the header is a multiple of it.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(outer) = Self::outer(layout) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `outer` has a non-zero size.
        let base = unsafe { self.0.alloc(outer) };
        if base.is_null() {
            return base;
        }
        let window = note_alloc(layout.size(), ALLOC);
        // SAFETY: the block has at least 16 aligned bytes of header.
        unsafe {
            base.cast::<u64>().write(window);
            base.add(header(layout.align()))
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        let block = unsafe { self.alloc(layout) };
        if !block.is_null() {
            // SAFETY: `block` has `layout.size()` writable bytes.
            unsafe { block.write_bytes(0, layout.size()) };
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        let head = header(layout.align());
        // SAFETY: `block` came from `alloc` above, `head` bytes into the inner block.
        let base = unsafe { block.sub(head) };
        // SAFETY: the header was written by `alloc` or `realloc`.
        let born = unsafe { base.cast::<u64>().read() };
        note_end(layout.size(), born, FREE);
        if let Some(outer) = Self::outer(layout) {
            // SAFETY: `base` was allocated by the inner allocator with `outer`.
            unsafe { self.0.dealloc(base, outer) }
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let head = header(layout.align());
        let (Some(outer), Some(new_total)) = (Self::outer(layout), new_size.checked_add(head))
        else {
            return std::ptr::null_mut();
        };
        // SAFETY: `block` came from `alloc` above.
        let base = unsafe { block.sub(head) };
        // SAFETY: the header was written by `alloc` or `realloc`.
        let born = unsafe { base.cast::<u64>().read() };
        // SAFETY: `base` was allocated with `outer`; `new_total` is non-zero.
        let moved = unsafe { self.0.realloc(base, outer, new_total) };
        if moved.is_null() {
            return moved;
        }
        let window = window();
        if let Some(row) = row() {
            row.performed[REALLOC].fetch_add(1, Ordering::Relaxed);
            if window != 0 {
                row.window_reallocs.fetch_add(1, Ordering::Relaxed);
            }
        }
        note_end(layout.size(), born, REALLOC);
        if let Some(row) = row() {
            row.hold(new_size as i64);
            if window != 0 {
                row.window_moves(new_size as i64);
            }
        }
        // SAFETY: the new block has the same header room.
        unsafe {
            moved.cast::<u64>().write(window);
            moved.add(head)
        }
    }
}

/// An allocator wrapper that counts operations started and completed (see the module docs).
#[derive(Debug)]
pub struct Watched<A>(pub A);

impl<A> Watched<A> {
    fn around<R>(&self, kind: usize, call: impl FnOnce(&A) -> R) -> R {
        let row = row();
        if let Some(row) = row {
            row.started[kind].fetch_add(1, Ordering::SeqCst);
        }
        let result = call(&self.0);
        if let Some(row) = row {
            row.completed[kind].fetch_add(1, Ordering::SeqCst);
        }
        result
    }
}

// SAFETY: forwards every call unchanged.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Watched<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        self.around(ALLOC, |inner| unsafe { inner.alloc(layout) })
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: caller's contract.
        self.around(ALLOC, |inner| unsafe { inner.alloc_zeroed(layout) })
    }
    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: caller's contract.
        self.around(FREE, |inner| unsafe { inner.dealloc(block, layout) })
    }
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: caller's contract.
        self.around(REALLOC, |inner| unsafe {
            inner.realloc(block, layout, new_size)
        })
    }
}

/// The usual global allocator of these tests.
pub type TestAlloc = Watched<Alloc<Counting<System>>>;

/// A [`TestAlloc`] over the system allocator.
pub const fn test_alloc() -> TestAlloc {
    Watched(Alloc::new(Counting(System)))
}

/// Per-kind totals (`[alloc, free, realloc]`).
pub type Kinds = [u64; 3];

/// What the profile says threads `tids` recorded and dropped, by kind.
pub fn recorded_and_dropped(profile: &Profile, tid: u64) -> (Kinds, Kinds, u64, u64) {
    let mut recorded = [0; 3];
    let mut dropped = [0; 3];
    let (mut spans, mut spans_dropped) = (0, 0);
    for thread in profile.capture.threads.iter().filter(|t| t.os_tid == tid) {
        recorded[ALLOC] += thread.allocs;
        recorded[FREE] += thread.frees;
        recorded[REALLOC] += thread.reallocs;
        dropped[ALLOC] += thread.dropped_allocs;
        dropped[FREE] += thread.dropped_frees;
        dropped[REALLOC] += thread.dropped_reallocs;
        spans += thread.span_events;
        spans_dropped += thread.dropped_other;
    }
    (recorded, dropped, spans, spans_dropped)
}

/// Events the profile lost with no thread to charge them to, by kind, and for spans.
pub fn unattributed(profile: &Profile) -> (Kinds, u64) {
    let by_kind = |name: &str| {
        profile
            .capture
            .dropped_by_kind
            .get(name)
            .copied()
            .unwrap_or(0)
    };
    let threads = &profile.capture.threads;
    let sum = |field: fn(&highwater::profile::ThreadCapture) -> u64| {
        threads.iter().map(field).sum::<u64>()
    };
    let kinds = [
        by_kind("alloc") - sum(|t| t.dropped_allocs),
        by_kind("free") - sum(|t| t.dropped_frees),
        by_kind("realloc") - sum(|t| t.dropped_reallocs),
    ];
    (kinds, by_kind("other") - sum(|t| t.dropped_other))
}

/// Operations performed (counted by [`Counting`]) by the threads with these OS ids, by kind.
pub fn performed(tids: &[u64]) -> Kinds {
    let mut total = [0; 3];
    for &tid in tids {
        for row in rows_of(tid) {
            for (kind, sum) in total.iter_mut().enumerate() {
                *sum += row.performed[kind].load(Ordering::SeqCst);
            }
        }
    }
    total
}

/// Checks recorded + dropped = performed for worker threads that lived entirely inside the
/// session (spawned after it started, joined before it finished), and that every event lost
/// without a thread (`unattributed`) was one of theirs.
///
/// - Summed over the workers, per kind: recorded + dropped + unattributed = performed, exact.
/// - Per worker, per kind: recorded + dropped + `after_retire[kind]` = performed, exact, where
///   `after_retire` is what the test knows each worker did after handing its ring back;
///   `None` when that is not known per thread (then only recorded + dropped ≤ performed).
/// - Spans, when `spans` gives each worker's span entries + exits: the same two equalities.
///
/// Returns the total dropped (attributed and not), so a test can require drops.
pub fn check_workers(
    profile: &Profile,
    workers: &[u64],
    after_retire: Option<Kinds>,
    spans: Option<&[(u64, u64)]>,
) -> u64 {
    let (loose, loose_spans) = unattributed(profile);
    let mut sum = [0u64; 3];
    let mut span_sum = 0;
    let mut dropped_total = loose.iter().sum::<u64>() + loose_spans;
    // Past `MAX_THREAD_ROWS` threads, the profile sums the rest in its last row: those workers
    // are checked together against it.
    let own_rows: std::collections::HashSet<u64> = profile
        .capture
        .threads
        .iter()
        .filter(|row| row.threads == 1)
        .map(|row| row.os_tid)
        .collect();
    let (workers, summed): (Vec<u64>, Vec<u64>) =
        workers.iter().partition(|tid| own_rows.contains(tid));
    if !summed.is_empty() {
        let rest = profile
            .capture
            .threads
            .iter()
            .find(|row| row.threads > 1)
            .expect("workers without a row of their own, but no summed row");
        // Workers whose events were all lost without a ring have no row at all.
        assert!(
            rest.threads as usize <= summed.len(),
            "threads in the summed row"
        );
        let recorded = [rest.allocs, rest.frees, rest.reallocs];
        let dropped = [
            rest.dropped_allocs,
            rest.dropped_frees,
            rest.dropped_reallocs,
        ];
        let done = performed(&summed);
        for kind in 0..3 {
            let seen = recorded[kind] + dropped[kind];
            sum[kind] += seen;
            dropped_total += dropped[kind];
            if let Some(after) = after_retire {
                assert_eq!(
                    seen + after[kind] * summed.len() as u64,
                    done[kind],
                    "{} events of the {} workers in the summed row",
                    KIND_NAMES[kind],
                    summed.len()
                );
            }
        }
        span_sum += rest.span_events + rest.dropped_other;
        dropped_total += rest.dropped_other;
    }
    for &tid in &workers {
        let (recorded, dropped, span_events, span_dropped) = recorded_and_dropped(profile, tid);
        let done = performed(&[tid]);
        assert!(
            done[ALLOC] > 0,
            "worker {tid} performed no allocation: the test did not run"
        );
        for kind in 0..3 {
            let seen = recorded[kind] + dropped[kind];
            sum[kind] += seen;
            dropped_total += dropped[kind];
            match after_retire {
                Some(after) => assert_eq!(
                    seen + after[kind],
                    done[kind],
                    "{} events of worker {tid}: recorded {} + dropped {} + {} after its ring \
                     was handed back != performed {}",
                    KIND_NAMES[kind],
                    recorded[kind],
                    dropped[kind],
                    after[kind],
                    done[kind]
                ),
                None => assert!(
                    seen <= done[kind],
                    "{} events of worker {tid}: recorded {} + dropped {} > performed {}",
                    KIND_NAMES[kind],
                    recorded[kind],
                    dropped[kind],
                    done[kind]
                ),
            }
        }
        span_sum += span_events + span_dropped;
        if let Some(spans) = spans {
            let expected = spans
                .iter()
                .filter(|(t, _)| *t == tid)
                .map(|(_, n)| n)
                .sum::<u64>();
            if after_retire.is_some() {
                assert_eq!(
                    span_events + span_dropped,
                    expected,
                    "span events of worker {tid}: recorded {span_events} + dropped \
                     {span_dropped} != performed {expected}"
                );
            }
        }
    }
    let total = performed(&[workers, summed].concat());
    for kind in 0..3 {
        assert_eq!(
            sum[kind] + loose[kind],
            total[kind],
            "{} events over all workers: recorded + dropped {} + unattributed {} != performed {}",
            KIND_NAMES[kind],
            sum[kind],
            loose[kind],
            total[kind]
        );
    }
    if let Some(spans) = spans {
        let expected: u64 = spans.iter().map(|(_, n)| n).sum();
        assert_eq!(
            span_sum + loose_spans,
            expected,
            "span events over all workers: recorded + dropped {span_sum} + unattributed \
             {loose_spans} != performed {expected}"
        );
    }
    dropped_total
}

//! Process and thread lifecycle around capture: ring storage, thread exit and `fork`.
//!
//! Ring storage comes from `mmap` (never the global allocator) and is kept for reuse. A thread
//! learns nothing about its own exit from a destructor-free thread-local, so a pthread key with
//! a destructor hands its ring back; the key is created when a session starts, off the hot
//! path. A forked child stops recording: its collector thread did not survive the fork.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::raw::RawEvent;
use super::sync::SlotCell;

/// Default events per ring: 64 Ki events, 2 MiB per recording thread (touched as it fills, and
/// all of it once the ring has wrapped). Lossless capture waits for the collector when a ring is
/// full, so a bigger ring buys fewer waits, not fewer losses; see `BENCHMARKS.md`.
pub(crate) const DEFAULT_RING_EVENTS: usize = 1 << 16;

static RING_EVENTS: AtomicUsize = AtomicUsize::new(DEFAULT_RING_EVENTS);

/// Sets the capacity of rings claimed from now on (a power of two).
pub(crate) fn set_ring_capacity(events: usize) {
    RING_EVENTS.store(events, Ordering::Relaxed);
}

/// Capacity for a newly stored ring.
pub(crate) fn ring_capacity() -> u64 {
    RING_EVENTS.load(Ordering::Relaxed) as u64
}

/// Maps zeroed storage for `capacity` slots outside the global allocator; `None` if the system
/// refuses. Kept while the ring keeps its size (rings are reused by later threads and
/// sessions); freed with [`free_ring_storage`] when a ring changes size.
pub(crate) fn alloc_ring_storage(capacity: u64) -> Option<*mut SlotCell<RawEvent>> {
    let bytes = usize::try_from(capacity)
        .ok()?
        .checked_mul(std::mem::size_of::<SlotCell<RawEvent>>())?;
    #[cfg(unix)]
    {
        // SAFETY: an anonymous private mapping with no address hint has no preconditions; the
        // result is checked against MAP_FAILED before use.
        let pointer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if pointer == libc::MAP_FAILED {
            return None;
        }
        // Zeroed pages are valid `RawEvent`s (plain integers) inside transparent cells.
        Some(pointer.cast())
    }
    #[cfg(not(unix))]
    {
        use std::alloc::{GlobalAlloc, Layout, System};
        let layout = Layout::from_size_align(bytes, 64).ok()?;
        // SAFETY: `layout` has a non-zero size (capacity ≥ 1); System is not the global
        // allocator's hook, so this does not re-enter capture.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        (!pointer.is_null()).then(|| pointer.cast())
    }
}

/// Frees storage from [`alloc_ring_storage`].
///
/// # Safety
///
/// `slots` came from `alloc_ring_storage(capacity)` and nothing reads or writes it any more.
pub(crate) unsafe fn free_ring_storage(slots: *mut SlotCell<RawEvent>, capacity: u64) {
    let bytes = capacity as usize * std::mem::size_of::<SlotCell<RawEvent>>();
    #[cfg(unix)]
    {
        // SAFETY: `slots` is the start of a mapping of `bytes` bytes (the caller's contract),
        // which nobody uses any more. A failure leaves the mapping in place: harmless.
        unsafe { libc::munmap(slots.cast(), bytes) };
    }
    #[cfg(not(unix))]
    {
        use std::alloc::{GlobalAlloc, Layout, System};
        if let Ok(layout) = Layout::from_size_align(bytes, 64) {
            // SAFETY: allocated by `alloc_ring_storage` from System with this layout.
            unsafe { System.dealloc(slots.cast(), layout) };
        }
    }
}

/// The pthread key whose destructor hands a thread's ring back; `u64::MAX` until created.
static EXIT_KEY: AtomicU64 = AtomicU64::new(u64::MAX);
/// pid of the process whose session owns the rings; a forked child differs.
static OWNER_PID: AtomicU64 = AtomicU64::new(0);
/// Set in a forked child: it never records.
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Prepares thread-exit and fork handling. Idempotent; called when a session starts.
pub(crate) fn install() {
    #[cfg(unix)]
    {
        // SAFETY: getpid has no preconditions.
        OWNER_PID.store(unsafe { libc::getpid() } as u64, Ordering::Relaxed);
        // A forked child that starts its own session owns the rings from now on.
        FORKED_CHILD.store(false, Ordering::Relaxed);
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let mut key: libc::pthread_key_t = 0;
            // SAFETY: `key` is writable; `on_thread_exit` has the destructor signature.
            if unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) } == 0 {
                EXIT_KEY.store(u64::from(key), Ordering::Release);
            }
            // SAFETY: `in_forked_child` only stores to atomics, which is async-signal-safe.
            unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        });
    }
}

/// Whether this process is the one that started the session (not a forked child).
pub(crate) fn is_owner_process() -> bool {
    #[cfg(unix)]
    {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u64;
        !FORKED_CHILD.load(Ordering::Relaxed) && OWNER_PID.load(Ordering::Relaxed) == pid
    }
    #[cfg(not(unix))]
    true
}

/// The calling thread's OS id (`gettid` on Linux), for naming threads in a profile.
pub(crate) fn os_thread_id() -> u64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions and cannot fail.
        unsafe { libc::gettid() as u64 }
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// Arranges for ring `index` to be handed back when the calling thread exits.
pub(crate) fn watch_thread_exit(index: usize) {
    #[cfg(unix)]
    {
        let key = EXIT_KEY.load(Ordering::Acquire);
        if key != u64::MAX {
            // The value is the ring index + 1 (the destructor runs only for non-null values).
            // SAFETY: `key` came from pthread_key_create; the value is never dereferenced.
            unsafe {
                libc::pthread_setspecific(key as libc::pthread_key_t, (index + 1) as *const _)
            };
        }
    }
    #[cfg(not(unix))]
    let _ = index;
}

#[cfg(unix)]
extern "C" fn on_thread_exit(value: *mut libc::c_void) {
    let index = (value as usize).wrapping_sub(1);
    super::hook::retire_current_thread(index);
}

#[cfg(unix)]
extern "C" fn in_forked_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
    super::hook::RECORDING.store(false, Ordering::SeqCst);
    // Only the forking thread survives, and it is not inside a push: no ring is busy, whatever
    // the parent's threads were doing (atomic stores only, async-signal-safe).
    for slot in super::registry::REGISTRY.slots() {
        slot.ring.clear_busy_after_fork();
    }
    // No collector runs here: nobody may wait for one.
    super::hook::collector_stopped();
}

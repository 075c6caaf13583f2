//! The operating system under capture: ring storage, thread exit, `fork` and the owner
//! process.
//!
//! Plain OS wrappers that know nothing of the hook: what to do when a thread exits or the
//! process forks is the callbacks [`install`] is given. Ring storage comes from `mmap` (never
//! the global allocator). A thread learns nothing about its own exit from a destructor-free
//! thread-local, so a pthread key with a destructor reports it; the key is created when a
//! session starts, off the hot path. The owner process is the one source of truth for "is this
//! the process that started the session, not a forked child", for capture and the signal
//! handler alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use super::raw::RawEvent;
use super::sync::SlotCell;
#[cfg(unix)]
use crate::sys::{self, process::ThreadExitKey};

/// Maps zeroed storage for `capacity` slots outside the global allocator; `None` if the system
/// refuses. Kept while the ring keeps its size (rings are reused by later threads and
/// sessions); freed with [`free_ring_storage`] when a ring changes size.
pub(crate) fn alloc_ring_storage(capacity: u64) -> Option<*mut SlotCell<RawEvent>> {
    let bytes = usize::try_from(capacity)
        .ok()?
        .checked_mul(std::mem::size_of::<SlotCell<RawEvent>>())?;
    #[cfg(unix)]
    {
        // Zeroed pages are valid `RawEvent`s (plain integers) inside transparent cells.
        sys::memory::map_zeroed(bytes).map(|start| start.as_ptr().cast())
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
        if let Some(start) = std::ptr::NonNull::new(slots.cast()) {
            // SAFETY: `slots` is the start of a mapping of `bytes` bytes (the caller's
            // contract), which nobody uses any more.
            unsafe { sys::memory::unmap(start, bytes) };
        }
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

/// What the process's thread-exit and fork handlers call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Callbacks {
    /// Called on an exiting thread with the value it gave [`watch_thread_exit`].
    pub(crate) thread_exit: fn(usize),
    /// Called in a forked child, in its `atfork` handler (so it must be async-signal-safe).
    pub(crate) forked_child: fn(),
}

/// The callbacks of the first [`install`]; the handlers run only once they are set.
static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();
/// The pthread key whose destructor reports a thread's exit; `u64::MAX` until created.
static EXIT_KEY: AtomicU64 = AtomicU64::new(u64::MAX);
/// pid of the process whose session owns the rings; a forked child differs.
static OWNER_PID: AtomicU64 = AtomicU64::new(0);
/// Set in a forked child: it never records.
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

/// Makes the calling process the owner process, and installs the thread-exit and fork
/// handlers that call `callbacks` (the first time; later calls keep the first callbacks).
/// Called when a session starts.
pub(crate) fn install(callbacks: Callbacks) {
    #[cfg(unix)]
    {
        OWNER_PID.store(u64::from(sys::process::pid()), Ordering::SeqCst);
        // A forked child that starts its own session owns the rings from now on.
        FORKED_CHILD.store(false, Ordering::SeqCst);
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let _ = CALLBACKS.set(callbacks);
            if let Some(key) = ThreadExitKey::create(on_thread_exit) {
                EXIT_KEY.store(key.to_bits(), Ordering::Release);
            }
            // `in_forked_child` stores to an atomic and runs the fork callback, which
            // `Callbacks` requires to be async-signal-safe.
            sys::process::on_fork(None, None, Some(in_forked_child));
        });
    }
}

/// Whether this process is the one that started the session (not a forked child).
/// Async-signal-safe (`getpid` and atomic loads), so the signal handler asks it too.
pub(crate) fn is_owner_process() -> bool {
    #[cfg(unix)]
    {
        let pid = u64::from(sys::process::pid());
        !FORKED_CHILD.load(Ordering::SeqCst) && OWNER_PID.load(Ordering::SeqCst) == pid
    }
    #[cfg(not(unix))]
    true
}

/// The calling thread's OS id (`gettid` on Linux), for naming threads in a profile.
pub(crate) fn os_thread_id() -> u64 {
    #[cfg(unix)]
    return sys::process::thread_id();
    #[cfg(not(unix))]
    0
}

/// Arranges for the thread-exit callback to be called with `index` when the calling thread
/// exits.
pub(crate) fn watch_thread_exit(index: usize) {
    #[cfg(unix)]
    {
        let key = EXIT_KEY.load(Ordering::Acquire);
        if key != u64::MAX {
            // The value is `index + 1` (the destructor runs only for non-null values).
            ThreadExitKey::from_bits(key).set(index + 1);
        }
    }
    #[cfg(not(unix))]
    let _ = index;
}

#[cfg(unix)]
extern "C" fn on_thread_exit(value: *mut libc::c_void) {
    let index = (value as usize).wrapping_sub(1);
    if let Some(callbacks) = CALLBACKS.get() {
        (callbacks.thread_exit)(index);
    }
}

#[cfg(unix)]
extern "C" fn in_forked_child() {
    FORKED_CHILD.store(true, Ordering::SeqCst);
    if let Some(callbacks) = CALLBACKS.get() {
        (callbacks.forked_child)();
    }
}

//! Unwinding by call-frame information: a sampled allocation's stack in a build without frame
//! pointers.
//!
//! # Why
//!
//! Every Rust binary on Linux carries `.eh_frame`, the call-frame information that panics unwind
//! by: for each instruction, where the caller's stack pointer (the canonical frame address) and
//! the return address are. A frame-pointer walk ([`super::stack`]) needs none of it but only
//! works where every frame keeps a frame pointer, which an ordinary release build does not. When
//! that walk cannot be trusted, a sampled stack is unwound here, by
//! [`framehop`](https://docs.rs/framehop) (the unwinder samply uses): it only recovers the three
//! registers a return address needs, caches the rule for each address, and with
//! `MustNotAllocateDuringUnwind` its unwind allocates nothing.
//!
//! # What runs where
//!
//! - **Preparing** (outside the hook; it allocates): [`prepare`] lists the loaded modules
//!   ([`super::modules`]) and builds framehop's unwinder over their `.eh_frame_hdr` and `.eh_frame`: a
//!   [`Tables`] published through an atomic pointer. A session prepares when it starts and
//!   `measure` when it begins; the collector calls [`refresh`] between drains, which rebuilds
//!   only when the dynamic linker has loaded or unloaded a module since (`dlopen`, `dlclose`).
//!   The first preparation also decides whether frame pointers can be trusted (see
//!   [`super::stack`]) and maps the pool of unwind caches.
//! - **Unwinding** (in the hook): [`unwind`] takes one cache from the pool (a compare-exchange
//!   on its flag; when every cache is taken, as by a signal handler that samples while its
//!   thread unwinds and every other cache is in use, there is no unwind and the frame-pointer
//!   walk stands), announces itself as a reader of the current tables, and steps from frame to
//!   frame reading only the thread's own stack, as the frame-pointer walk does. No lock, no
//!   allocation, no system call.
//!
//! # Retiring tables
//!
//! New tables replace the current ones by a pointer swap; the old ones are freed only once no
//! unwind can still read them. A reader adds itself to one of two counters, chosen by the
//! parity of `EPOCH`, and checks that the epoch did not move meanwhile (else it tries the other
//! counter, at most a few times, then gives up); the writer swaps the pointer, advances the
//! epoch, and frees the old tables on a later call, once the counter of the old parity reads
//! zero. Every step is `SeqCst`: a reader that saw the old epoch after adding itself is seen by
//! the writer's later read of that counter; one that saw the new epoch loads the pointer after
//! the swap. One writer at a time (a try-lock flag: a second caller goes without), and a forked
//! child clears the flag and the counters (only the forking thread survives, not inside an
//! unwind).

use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use framehop::{
    CacheNative, ExplicitModuleSectionInfo, MustNotAllocateDuringUnwind, Unwinder, UnwinderNative,
};

use super::frames::{Registers, StackBounds, Walked, MAX_FRAMES};
use crate::model::Unwinder as Method;
use crate::sys::modules::{self, LoadCounts, Section};

type NativeUnwinder = UnwinderNative<Section, MustNotAllocateDuringUnwind>;
type NativeCache = CacheNative<MustNotAllocateDuringUnwind>;

/// Unwind tables over the modules loaded when they were built.
struct Tables {
    unwinder: NativeUnwinder,
    /// The dynamic linker's load and unload counts they were built at.
    counts: LoadCounts,
}

/// The current tables (null until the first [`prepare`]).
static TABLES: AtomicPtr<Tables> = AtomicPtr::new(ptr::null_mut());
/// Unwinds reading the tables, by the parity of the epoch they started in.
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
/// Advanced each time the tables are replaced.
static EPOCH: AtomicUsize = AtomicUsize::new(0);
/// Tables replaced but perhaps still read, and the parity of their readers (writer only).
static RETIRED: AtomicPtr<Tables> = AtomicPtr::new(ptr::null_mut());
static RETIRED_PARITY: AtomicUsize = AtomicUsize::new(0);
/// Held by the one thread building tables (a try-lock: a second one goes without).
static WRITING: AtomicBool = AtomicBool::new(false);

/// One unwind cache and whether an unwind is using it.
struct CacheSlot {
    busy: AtomicBool,
    cache: UnsafeCell<NativeCache>,
}

// SAFETY: `cache` is only touched by the unwind that set `busy` (a compare-exchange from
// false), until it clears it: one thread at a time.
unsafe impl Sync for CacheSlot {}

/// The pool of unwind caches, made by the first [`prepare`] and kept for the process.
static POOL: OnceLock<Box<[CacheSlot]>> = OnceLock::new();

/// Whether the frame-pointer walk can be trusted: [`UNKNOWN`] until [`judge_frame_pointers`].
static FRAME_POINTERS: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const TRUSTED: u8 = 1;
const UNTRUSTED: u8 = 2;

/// The method the session chose ([`choose`]): [`BOTH`], or one method only.
static CHOSEN: AtomicU8 = AtomicU8::new(BOTH);
const BOTH: u8 = 0;
const FRAME_POINTERS_ONLY: u8 = 1;
const EH_FRAME_ONLY: u8 = 2;

/// Picks one method for every stack (`HIGHWATER_UNWINDER`: for comparing the two, and for a
/// build whose frame pointers give wrong stacks), or `None`: frame pointers where they can be
/// trusted, call-frame information elsewhere.
pub(crate) fn choose(forced: Option<Method>) {
    let chosen = match forced {
        None => BOTH,
        Some(Method::FramePointers) => FRAME_POINTERS_ONLY,
        Some(Method::EhFrame) => EH_FRAME_ONLY,
    };
    CHOSEN.store(chosen, Ordering::Relaxed);
}

/// Whether the frame pointers still wait for [`judge_frame_pointers`].
pub(crate) fn frame_pointers_unjudged() -> bool {
    FRAME_POINTERS.load(Ordering::Relaxed) == UNKNOWN
}

/// Records whether this build's frame-pointer walk can be trusted (see
/// `stack::frame_pointers_agree_with_unwind_tables`).
pub(crate) fn judge_frame_pointers(trusted: bool) {
    FRAME_POINTERS.store(if trusted { TRUSTED } else { UNTRUSTED }, Ordering::Relaxed);
}

/// Builds (or brings up to date) the unwind tables and the cache pool. Outside the hook only:
/// it allocates and reads the dynamic linker's module list. Cheap when nothing was loaded or
/// unloaded since the last call.
pub(crate) fn prepare() {
    POOL.get_or_init(|| {
        let caches = std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .clamp(4, 32)
            * 2;
        (0..caches)
            .map(|_| CacheSlot {
                busy: AtomicBool::new(false),
                cache: UnsafeCell::new(NativeCache::new_in()),
            })
            .collect()
    });
    refresh();
    // Another thread building the first tables: wait for them (a few milliseconds), so that
    // whoever prepared can unwind. Bounded, should that thread never finish (it cannot be
    // stopped half-way by anything but a fork, which clears the flag in the child).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while TABLES.load(Ordering::SeqCst).is_null() && std::time::Instant::now() < deadline {
        std::thread::yield_now();
        refresh();
    }
}

/// Rebuilds the tables if a module was loaded or unloaded since they were built, and frees
/// replaced tables nobody reads any more. Outside the hook only; does nothing before the first
/// [`prepare`].
pub(crate) fn refresh() {
    if POOL.get().is_none()
        || WRITING
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    free_retired();
    let current = TABLES.load(Ordering::SeqCst);
    // SAFETY: only this writer frees tables, and `current` is not retired.
    let stale = current.is_null() || unsafe { (*current).counts } != modules::load_counts();
    if stale && RETIRED.load(Ordering::Relaxed).is_null() {
        let fresh = Box::into_raw(Box::new(build()));
        let old = TABLES.swap(fresh, Ordering::SeqCst);
        let parity = EPOCH.fetch_add(1, Ordering::SeqCst) & 1;
        if !old.is_null() {
            RETIRED_PARITY.store(parity, Ordering::Relaxed);
            RETIRED.store(old, Ordering::Relaxed);
            free_retired();
        }
    }
    WRITING.store(false, Ordering::Release);
}

/// Frees the retired tables once no unwind that may read them is left (writer only).
fn free_retired() {
    let retired = RETIRED.load(Ordering::Relaxed);
    if retired.is_null()
        || READERS[RETIRED_PARITY.load(Ordering::Relaxed)].load(Ordering::SeqCst) != 0
    {
        return;
    }
    RETIRED.store(ptr::null_mut(), Ordering::Relaxed);
    // SAFETY: made by `Box::into_raw` in `refresh`, swapped out of `TABLES` before the epoch
    // advanced, and no reader of its parity is left: no unwind holds it (module docs).
    drop(unsafe { Box::from_raw(retired) });
}

/// framehop's unwinder over every loaded module with call-frame information.
fn build() -> Tables {
    let (loaded, counts) = modules::loaded_modules();
    let mut unwinder = NativeUnwinder::new();
    for module in loaded {
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: Some(module.text_svma.clone()),
            eh_frame_svma: Some(module.eh_frame.0.clone()),
            eh_frame: Some(module.eh_frame.1),
            eh_frame_hdr_svma: Some(module.eh_frame_hdr.0.clone()),
            eh_frame_hdr: Some(module.eh_frame_hdr.1),
            ..ExplicitModuleSectionInfo::default()
        };
        unwinder.add_module(framehop::Module::new(
            module.name,
            module.avma,
            module.bias,
            info,
        ));
    }
    Tables { unwinder, counts }
}

/// Whether a frame-pointer walk can be trusted in this build: `None` where it is the only
/// method (before the first [`prepare`], or chosen by [`UNWINDER_VARIABLE`]); `Some(false)`
/// also where call-frame information is chosen for every stack.
#[inline]
pub(crate) fn frame_pointers_trusted() -> Option<bool> {
    match (
        CHOSEN.load(Ordering::Relaxed),
        FRAME_POINTERS.load(Ordering::Relaxed),
    ) {
        (FRAME_POINTERS_ONLY, _) | (_, UNKNOWN) => None,
        (EH_FRAME_ONLY, _) | (_, UNTRUSTED) => Some(false),
        _ => Some(true),
    }
}

/// A forked child: only the forking thread survives, and it is not inside an unwind or
/// building tables, so no cache is in use, no reader is left and nobody writes. Async-signal-
/// safe (atomic stores only).
pub(crate) fn forget_other_threads_after_fork() {
    if let Some(pool) = POOL.get() {
        for slot in pool.iter() {
            slot.busy.store(false, Ordering::Relaxed);
        }
    }
    for readers in &READERS {
        readers.store(0, Ordering::Relaxed);
    }
    WRITING.store(false, Ordering::Relaxed);
}

/// A cache taken from the pool, handed back when dropped.
struct Taken<'a>(&'a CacheSlot);

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// Takes a free cache from the pool, starting the search at `hint`; `None` if every one is in
/// use.
fn take_cache(hint: usize) -> Option<Taken<'static>> {
    let pool = POOL.get()?;
    (0..pool.len())
        .map(|i| &pool[(hint + i) % pool.len()])
        .find(|slot| {
            slot.busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })
        .map(Taken)
}

/// A reader of the current tables, counted until dropped.
struct Reading {
    parity: usize,
    tables: &'static Tables,
}

impl Reading {
    /// Starts reading the current tables; `None` when there are none, or when they were
    /// replaced three times while this tried.
    fn start() -> Option<Reading> {
        for _ in 0..3 {
            let epoch = EPOCH.load(Ordering::SeqCst);
            let parity = epoch & 1;
            READERS[parity].fetch_add(1, Ordering::SeqCst);
            if EPOCH.load(Ordering::SeqCst) == epoch {
                let tables = TABLES.load(Ordering::SeqCst);
                if tables.is_null() {
                    READERS[parity].fetch_sub(1, Ordering::SeqCst);
                    return None;
                }
                // SAFETY: published by `refresh` and freed only once the readers of this
                // parity are gone (module docs), which this one is not until dropped.
                let tables = unsafe { &*tables };
                return Some(Reading { parity, tables });
            }
            READERS[parity].fetch_sub(1, Ordering::SeqCst);
        }
        None
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        READERS[self.parity].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Unwinds the stack by call-frame information from `registers` (taken in the function that
/// calls this, whose own frame is not recorded), reading only `[sp, bounds.high)`. Writes
/// return addresses, innermost first, into `walked` and returns `true`; returns `false`, with
/// `walked` untouched, when there are no tables yet or no free cache. Never allocates, locks
/// or panics; `hint` spreads threads over the pool.
#[inline(never)]
pub(crate) fn unwind(
    registers: &Registers,
    bounds: &StackBounds,
    hint: usize,
    walked: &mut Walked,
) -> bool {
    let Some(taken) = take_cache(hint) else {
        return false;
    };
    let Some(reading) = Reading::start() else {
        return false;
    };
    // SAFETY: this unwind set the slot's `busy` flag and holds it until `taken` drops.
    let cache = unsafe { &mut *taken.0.cache.get() };
    let (low, high) = (registers.sp as u64, bounds.high() as u64);
    let mut read_stack = |address: u64| -> Result<u64, ()> {
        let word = std::mem::size_of::<u64>() as u64;
        if address < low || address.checked_add(word).is_none_or(|end| end > high) {
            return Err(());
        }
        if !address.is_multiple_of(word) {
            return Err(());
        }
        // SAFETY: `[address, address + 8)` lies in `[sp, high)` of this thread's stack mapping
        // (found for the current `sp`), mapped and readable while the thread runs; aligned.
        Ok(unsafe { ptr::read_volatile(address as usize as *const u64) })
    };
    let mut frames = reading.tables.unwinder.iter_frames(
        registers.pc as u64,
        registers.unwind_regs(),
        cache,
        &mut read_stack,
    );
    walked.len = 0;
    walked.truncated = false;
    walked.unwinder = crate::model::Unwinder::EhFrame;
    // The first frame is the instruction the registers were taken at: not a return address.
    let mut first = true;
    loop {
        match frames.next() {
            Ok(Some(frame)) => {
                if std::mem::take(&mut first) {
                    continue;
                }
                if walked.len == MAX_FRAMES {
                    walked.truncated = true;
                    break;
                }
                walked.pcs[walked.len] = frame.address();
                walked.len += 1;
            }
            Ok(None) => break,
            Err(_) => {
                walked.truncated = true;
                break;
            }
        }
    }
    drop(reading);
    drop(taken);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_rebuilt_only_when_a_module_is_loaded() {
        prepare();
        let before = TABLES.load(Ordering::SeqCst);
        assert!(!before.is_null());
        refresh();
        assert_eq!(TABLES.load(Ordering::SeqCst), before, "nothing was loaded");
    }

    #[test]
    fn a_cache_in_use_is_not_handed_out_twice() {
        prepare();
        let first = take_cache(3).expect("a free cache");
        let second = take_cache(3).expect("another free cache");
        assert!(!std::ptr::eq(first.0, second.0));
        let at = |taken: &Taken| POOL.get().unwrap().iter().position(|s| ptr::eq(s, taken.0));
        let held = at(&first).unwrap();
        assert!(POOL.get().unwrap()[held].busy.load(Ordering::Relaxed));
        drop(first);
        assert!(!POOL.get().unwrap()[held].busy.load(Ordering::Relaxed));
    }
}

//! The one place that chooses std or loom primitives, so the ring, the registry and the waiting
//! protocols can be model-checked unchanged under `RUSTFLAGS="--cfg highwater_loom"`: the
//! atomics, a ring slot's cell, and [`WaitWord`], a futex (loom: a mutex and a condition
//! variable). It also says what else exists under loom: other files mark items with
//! [`outside_loom`], [`only_in_loom`] and [`const_outside_loom`] instead of naming the cfg.

use std::time::Duration;

/// Items of the library proper: left out of the loom models, which build only the ring, the
/// registry, the gate and the refusal tickets on these primitives. Every other file says what
/// exists under loom through this macro and [`only_in_loom`], so the cfg is named here alone.
macro_rules! outside_loom {
    ($($item:item)*) => { $( #[cfg(not(highwater_loom))] $item )* };
}

/// Items of the loom models only: their stand-ins for what [`outside_loom`] leaves out.
macro_rules! only_in_loom {
    ($($item:item)*) => { $( #[cfg(highwater_loom)] $item )* };
}

/// A constructor that is `const` outside loom (the process's statics are built with it) and a
/// plain function under loom, whose atomics cannot be built in a constant.
macro_rules! const_outside_loom {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $body:block) => {
        #[cfg(not(highwater_loom))]
        $(#[$meta])* $vis const fn $name($($arg: $ty),*) -> $ret $body
        #[cfg(highwater_loom)]
        $(#[$meta])* $vis fn $name($($arg: $ty),*) -> $ret $body
    };
}

pub(crate) use {const_outside_loom, only_in_loom, outside_loom};

/// `N` counters at zero, in a constant outside loom.
#[cfg(not(highwater_loom))]
pub(crate) const fn zeroed_counters<const N: usize>() -> [AtomicU64; N] {
    [const { AtomicU64::new(0) }; N]
}

/// `N` counters at zero.
#[cfg(highwater_loom)]
pub(crate) fn zeroed_counters<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

#[cfg(not(highwater_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

#[cfg(highwater_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Interior-mutable storage for one ring slot, with loom's access tracking under loom.
#[cfg(not(highwater_loom))]
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct SlotCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(highwater_loom))]
impl<T> SlotCell<T> {
    /// Runs `f` with a raw pointer to the value for writing.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a raw pointer to the value for reading.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(highwater_loom)]
pub(crate) use loom::cell::UnsafeCell as SlotCell;

/// The store-buffering handshake between a producer and a stopper: the producer marks itself
/// busy and then reads the gate; the stopper closes the gate and then reads whether producers
/// are busy. Both sides must be sequentially consistent, so that a stopper that reads a
/// producer idle knows the producer will see the gate closed.
///
/// Where the kernel offers `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (see
/// [`enable_asymmetric_fences`]), the producer's side is a plain store and a compiler fence,
/// and the stopper's membarrier supplies the fence on every running thread: the asymmetric form
/// of the same argument, which moves the whole cost to the rare stop. Otherwise an SC swap and
/// an SC load (one locked instruction on x86-64, cheaper than `mfence`). Loom treats SC
/// accesses as acquire/release (it would report false races) but models SC fences exactly, so
/// under loom the order is built from relaxed accesses around `fence(SeqCst)`.
#[inline(always)]
pub(crate) fn mark_then_read(busy: &AtomicU64, gate: &AtomicBool) -> bool {
    #[cfg(not(highwater_loom))]
    {
        if ASYMMETRIC.load(Ordering::Relaxed) {
            // The stopper's membarrier acts as a full fence on this thread, so program order
            // (kept by the compiler fence) is all this side needs.
            busy.store(1, Ordering::Relaxed);
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
            gate.load(Ordering::Relaxed)
        } else {
            busy.swap(1, Ordering::SeqCst);
            gate.load(Ordering::SeqCst)
        }
    }
    #[cfg(highwater_loom)]
    {
        busy.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        gate.load(Ordering::Relaxed)
    }
}

/// The stopper reads a producer's mark after [`close_then_fence`]: whether it is busy.
#[inline]
pub(crate) fn read_mark(busy: &AtomicU64) -> bool {
    #[cfg(not(highwater_loom))]
    return busy.load(Ordering::SeqCst) != 0;
    #[cfg(highwater_loom)]
    return busy.load(Ordering::Acquire) != 0;
}

/// Reads a waiting thread spins through before it sleeps: under loom one, since every spin is
/// an interleaving the model explores.
#[cfg(not(highwater_loom))]
pub(crate) const SPIN_READS: u32 = 128;
#[cfg(highwater_loom)]
pub(crate) const SPIN_READS: u32 = 1;

/// The stopper's side of [`mark_then_read`]: closes `gate`, then fences every producer.
pub(crate) fn close_then_fence(gate: &AtomicBool) {
    #[cfg(not(highwater_loom))]
    {
        gate.store(false, Ordering::SeqCst);
        if ASYMMETRIC.load(Ordering::SeqCst) && !crate::sys::membarrier::barrier() {
            // Registered but refused now: nothing else gives the producers' side its fence,
            // so wait out any producer that could still see the gate open. Never expected.
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    #[cfg(highwater_loom)]
    {
        gate.store(false, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }
}

/// Whether producers use the asymmetric fences (see [`mark_then_read`]). Set once, before any
/// session opens its gate, and never cleared.
#[cfg(not(highwater_loom))]
static ASYMMETRIC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Registers this process for expedited private membarriers; on success producers switch to
/// the asymmetric fences. Called before a session opens its gate.
#[cfg(not(highwater_loom))]
pub(crate) fn enable_asymmetric_fences() {
    if crate::sys::membarrier::register() {
        ASYMMETRIC.store(true, Ordering::SeqCst);
    }
}

/// A word a thread can sleep on until another says so, without a lock or an allocation.
///
/// A thread sleeps on a 32-bit word while it holds the value it expects; a waker changes the word,
/// then wakes the sleepers. Because the check and the sleep are one step (the kernel's, for a
/// futex), a wake that comes between a sleeper's last look and its sleep is never missed: the
/// sleep sees the changed value and returns at once.
///
/// On Linux this is a raw `futex(2)` on the word: no lock, no allocation, callable inside the
/// allocator and inside a signal handler. Elsewhere a timed wait is a short sleep (the callers
/// re-check their condition after every wait). Under loom the futex is modelled by a loom mutex
/// and condition variable with the same check-then-sleep step, and a timed wait is modelled as
/// an untimed one: loom has no clock, and a protocol that is deadlock-free without its timeouts
/// is deadlock-free with them. So a model proves that the timeout is a safety net, never what
/// makes progress.
#[derive(Debug)]
pub(crate) struct WaitWord {
    word: AtomicU32,
    /// Loom's stand-in for the kernel's futex queue.
    #[cfg(highwater_loom)]
    queue: loom::sync::Mutex<()>,
    #[cfg(highwater_loom)]
    sleepers: loom::sync::Condvar,
}

impl WaitWord {
    /// A word holding `value`.
    #[cfg(not(highwater_loom))]
    pub(crate) const fn new(value: u32) -> WaitWord {
        WaitWord {
            word: AtomicU32::new(value),
        }
    }

    /// A word holding `value`.
    #[cfg(highwater_loom)]
    pub(crate) fn new(value: u32) -> WaitWord {
        WaitWord {
            word: AtomicU32::new(value),
            queue: loom::sync::Mutex::new(()),
            sleepers: loom::sync::Condvar::new(),
        }
    }

    /// The word itself, for the protocol's loads and stores.
    pub(crate) fn word(&self) -> &AtomicU32 {
        &self.word
    }

    /// Sleeps while the word holds `expected`, at most about `timeout` (`None`: until woken).
    /// Returns early on a wake, a signal or spuriously; callers re-check what they wait for.
    pub(crate) fn wait(&self, expected: u32, timeout: Option<Duration>) {
        #[cfg(not(highwater_loom))]
        crate::sys::futex::wait(&self.word, expected, timeout);
        #[cfg(highwater_loom)]
        {
            let _ = timeout;
            let queue = self.queue.lock().unwrap();
            if self.word.load(Ordering::SeqCst) == expected {
                drop(self.sleepers.wait(queue).unwrap());
            }
        }
    }

    /// Wakes every thread sleeping on the word. Change the word first.
    pub(crate) fn wake_all(&self) {
        #[cfg(not(highwater_loom))]
        crate::sys::futex::wake_all(&self.word);
        #[cfg(highwater_loom)]
        {
            let _queue = self.queue.lock().unwrap();
            self.sleepers.notify_all();
        }
    }
}

#[cfg(all(test, not(highwater_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use std::time::Instant;

    #[test]
    fn a_changed_word_does_not_sleep() {
        let word = WaitWord::new(1);
        let start = Instant::now();
        // A sleep would last the whole bound: far longer than any delay a busy machine adds.
        word.wait(0, Some(Duration::from_secs(600)));
        assert!(start.elapsed() < Duration::from_secs(300));
    }

    #[test]
    fn a_wake_ends_an_untimed_sleep() {
        let word = Arc::new(WaitWord::new(1));
        let sleeper = {
            let word = word.clone();
            std::thread::spawn(move || {
                while word.word().load(Ordering::Acquire) == 1 {
                    word.wait(1, None);
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        word.word().store(0, Ordering::Release);
        word.wake_all();
        sleeper.join().unwrap();
    }

    #[test]
    fn a_timed_sleep_ends_by_itself() {
        let word = WaitWord::new(1);
        let start = Instant::now();
        word.wait(1, Some(Duration::from_millis(10)));
        assert!(start.elapsed() >= Duration::from_millis(5));
    }
}

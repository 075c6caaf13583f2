//! Sleeping until another thread says so, without a lock or an allocation: a [`WaitWord`].
//!
//! A thread sleeps on a 32-bit word while it holds the value it expects; a waker changes the word,
//! then wakes the sleepers. Because the check and the sleep are one step (the kernel's, for a
//! futex), a wake that comes between a sleeper's last look and its sleep is never missed: the
//! sleep sees the changed value and returns at once.
//!
//! On Linux this is a raw `futex(2)` on the word: no lock, no allocation, callable inside the
//! allocator and inside a signal handler. Elsewhere a timed wait is a short sleep (the callers
//! re-check their condition after every wait). Under loom the futex is modelled by a loom mutex
//! and condition variable with the same check-then-sleep step, and a timed wait is modelled as
//! an untimed one: loom has no clock, and a protocol that is deadlock-free without its timeouts
//! is deadlock-free with them. So a model proves that the timeout is a safety net, never what
//! makes progress.

use std::time::Duration;

use super::sync::{AtomicU32, Ordering};

/// A word threads can sleep on. See the module docs.
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
        #[cfg(all(not(highwater_loom), target_os = "linux"))]
        {
            let limit = timeout.map(|timeout| libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
            });
            let limit_ptr = limit
                .as_ref()
                .map_or(std::ptr::null(), |limit| limit as *const libc::timespec);
            // SAFETY: FUTEX_WAIT reads the aligned 32-bit word at `self.word` (an AtomicU32 that
            // lives as long as `self`) and the optional relative timeout; it writes nothing.
            // Every failure (EAGAIN: the word changed; EINTR; ETIMEDOUT) is a return to the
            // caller, who re-checks.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.word.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    expected,
                    limit_ptr,
                )
            };
        }
        #[cfg(all(not(highwater_loom), not(target_os = "linux")))]
        {
            if self.word.load(Ordering::Acquire) == expected {
                std::thread::sleep(timeout.unwrap_or(Duration::from_millis(1)));
            }
        }
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
        #[cfg(all(not(highwater_loom), target_os = "linux"))]
        {
            // SAFETY: FUTEX_WAKE only reads the word's address to find its sleepers.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.word.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    i32::MAX,
                )
            };
        }
        #[cfg(highwater_loom)]
        {
            let _queue = self.queue.lock().unwrap();
            self.sleepers.notify_all();
        }
    }
}

/// The collector's doorbell: a producer whose ring fills rings it so the collector drains now
/// instead of sleeping out its interval; the session rings it after sending a request.
#[cfg(not(highwater_loom))]
static COLLECTOR_BELL: WaitWord = WaitWord::new(0);

/// The bell's current value; pass it to [`collector_sleep`] so a ring after this read is not
/// slept through.
#[cfg(not(highwater_loom))]
pub(crate) fn collector_bell() -> u32 {
    COLLECTOR_BELL.word().load(Ordering::Acquire)
}

/// Rings the collector's bell. Callable from the allocator hook and from signal handlers.
#[cfg(not(highwater_loom))]
pub(crate) fn ring_collector() {
    COLLECTOR_BELL.word().fetch_add(1, Ordering::Release);
    COLLECTOR_BELL.wake_all();
}

/// Sleeps the collector for at most `interval`, unless the bell rang since it read `seen`.
#[cfg(not(highwater_loom))]
pub(crate) fn collector_sleep(seen: u32, interval: Duration) {
    COLLECTOR_BELL.wait(seen, Some(interval));
}

#[cfg(all(test, not(highwater_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
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

//! [`ForkSafeMutex`]: a mutex that a forked child can still take, for the session's locks.
//!
//! The session's `pthread_atfork` handlers lock the session's mutexes before `fork` and unlock
//! them after it, in the parent and in the child, so a child never inherits one held by a thread
//! that did not survive the fork. That is only enough if unlocking in the child leaves the mutex
//! free. `parking_lot`'s mutex does not promise that: it keeps its waiters in a process-wide table
//! in the process's own memory, which the child inherits with the parent's waiting threads still
//! queued in it. Unlocking there wakes one of them and, when its fairness timer has run out (every
//! 0–1 ms), hands it the lock — to a thread that does not exist in the child, so the mutex stays
//! locked for good and the child's next `Session::start` waits forever.
//!
//! The standard library's mutex keeps its waiters in the kernel (a futex on Linux, a pthread
//! mutex elsewhere), and the kernel gives a child none of its parent's waiters: the unlock in the
//! child frees the lock. So the session's locks are this thin wrapper over it, with the two things
//! the session needs from `parking_lot`'s: no poisoning, and a lock attempt with a time limit.

use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

/// How often [`ForkSafeMutex::try_lock_for`] tries again.
const RETRY: Duration = Duration::from_millis(1);

/// A mutex whose unlock in a forked child (by the copy of the thread that locked it) leaves it
/// free. See the module docs.
#[derive(Debug)]
pub(crate) struct ForkSafeMutex<T>(Mutex<T>);

/// What [`ForkSafeMutex::lock`] returns: the lock is held until it is dropped.
pub(crate) type ForkSafeGuard<'a, T> = MutexGuard<'a, T>;

impl<T> ForkSafeMutex<T> {
    /// A mutex holding `value`.
    pub(crate) const fn new(value: T) -> ForkSafeMutex<T> {
        ForkSafeMutex(Mutex::new(value))
    }

    /// Locks, waiting as long as it takes. A panic while the lock was held does not poison it:
    /// what it guards is never left half-changed by one (it is replaced or taken whole).
    pub(crate) fn lock(&self) -> ForkSafeGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks if that can be done within `limit`, trying every millisecond; `None` if not. Only
    /// the `exit` handler waits this way.
    pub(crate) fn try_lock_for(&self, limit: Duration) -> Option<ForkSafeGuard<'_, T>> {
        let started = Instant::now();
        loop {
            match self.0.try_lock() {
                Ok(guard) => return Some(guard),
                Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) if started.elapsed() < limit => {
                    std::thread::sleep(RETRY);
                }
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_after_the_limit_and_taken_once_free() {
        static LOCK: ForkSafeMutex<u32> = ForkSafeMutex::new(0);
        let held = LOCK.lock();
        let started = Instant::now();
        assert!(LOCK.try_lock_for(Duration::from_millis(20)).is_none());
        assert!(started.elapsed() >= Duration::from_millis(20));
        let waiter = std::thread::spawn(|| {
            *LOCK.try_lock_for(Duration::from_secs(60)).expect("freed") += 1;
        });
        std::thread::sleep(Duration::from_millis(10));
        drop(held);
        waiter.join().unwrap();
        assert_eq!(*LOCK.lock(), 1);
    }

    #[test]
    fn a_panic_while_held_does_not_poison_it() {
        let lock = ForkSafeMutex::new(5);
        let _ = std::panic::catch_unwind(|| {
            let _guard = lock.lock();
            panic!("while held");
        });
        assert_eq!(*lock.lock(), 5);
        assert_eq!(
            lock.try_lock_for(Duration::ZERO).map(|guard| *guard),
            Some(5)
        );
    }
}

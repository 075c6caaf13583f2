//! Who and where this is (process, thread, host), and the hooks the process calls back at
//! `fork`, at `exit` and when a thread exits. Each hook is a plain `extern "C"` function: the
//! callers decide what they do, and must keep them async-signal-safe where the hook runs in a
//! forked child.

#![allow(clippy::disallowed_methods)]

/// This process's id.
pub(crate) fn pid() -> u32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The calling thread's OS id (`gettid`); 0 where there is none.
pub(crate) fn thread_id() -> u64 {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions and cannot fail.
    return unsafe { libc::gettid() as u64 };
    #[cfg(not(target_os = "linux"))]
    0
}

/// This host's name (`gethostname`), or an empty string if it cannot be read.
pub(crate) fn host_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: `buffer` is writable for its whole length, which is what we pass.
    let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
    if !ok {
        return String::new();
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8_lossy(&buffer[..end]).into_owned()
}

/// A `fork` hook: runs in the thread that forks (before, and after in the parent) or in the
/// child's only thread.
pub(crate) type ForkHook = unsafe extern "C" fn();

/// Registers hooks `fork` calls: `before` in the forking thread, `parent` in it after, and
/// `child` in the child. They run for every later fork, for the life of the process.
pub(crate) fn on_fork(before: Option<ForkHook>, parent: Option<ForkHook>, child: Option<ForkHook>) {
    // SAFETY: the hooks are `extern "C"` functions with the signature pthread_atfork wants,
    // alive for the whole process (they are `fn` items).
    unsafe { libc::pthread_atfork(before, parent, child) };
}

/// Registers `hook` to run when the process calls `exit` (or returns from `main`); hooks run
/// in the reverse order of their registration.
pub(crate) fn on_exit(hook: extern "C" fn()) {
    // SAFETY: `hook` is an `extern "C" fn()`, alive for the whole process.
    unsafe { libc::atexit(hook) };
}

/// A key whose per-thread value is handed to a destructor when the thread exits: how a thread
/// learns of its own exit without a thread-local destructor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadExitKey(libc::pthread_key_t);

impl ThreadExitKey {
    /// A key whose non-zero values are handed to `on_exit` when their thread exits; `None` when
    /// the process has no keys left.
    pub(crate) fn create(on_exit: extern "C" fn(*mut libc::c_void)) -> Option<ThreadExitKey> {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `key` is writable; `on_exit` has the destructor signature.
        (unsafe { libc::pthread_key_create(&mut key, Some(on_exit)) } == 0)
            .then_some(ThreadExitKey(key))
    }

    /// The key as a number, to keep in an atomic.
    pub(crate) fn to_bits(self) -> u64 {
        u64::from(self.0)
    }

    /// The key [`ThreadExitKey::to_bits`] gave.
    pub(crate) fn from_bits(bits: u64) -> ThreadExitKey {
        ThreadExitKey(bits as libc::pthread_key_t)
    }

    /// Sets the calling thread's value (never dereferenced; zero means no call at exit).
    pub(crate) fn set(self, value: usize) {
        // SAFETY: the key came from pthread_key_create; the value is only handed back.
        unsafe { libc::pthread_setspecific(self.0, value as *const libc::c_void) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_this_process_and_this_thread() {
        assert_eq!(pid(), std::process::id());
        let here = thread_id();
        let there = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(here, there);
        assert!(!host_name().is_empty());
    }
}

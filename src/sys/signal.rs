//! Signal dispositions, the self-pipe a handler wakes a thread through, and the calls a handler
//! may make. Every function here that a handler calls is async-signal-safe.

#![allow(clippy::disallowed_methods)]

use std::io;

/// A signal number.
pub(crate) type Signal = libc::c_int;

/// `SIGINT` (Ctrl+C).
pub(crate) const SIGINT: Signal = libc::SIGINT;
/// `SIGTERM` (what schedulers send).
pub(crate) const SIGTERM: Signal = libc::SIGTERM;

/// What the kernel tells a `SA_SIGINFO` handler about the signal.
pub(crate) type Info = libc::siginfo_t;
/// The interrupted context a `SA_SIGINFO` handler is given.
pub(crate) type Context = libc::c_void;

/// A handler that takes the `siginfo` form (`SA_SIGINFO`).
pub(crate) type InfoHandler = extern "C" fn(Signal, *mut Info, *mut Context);

/// What the process does with a signal: its `sigaction`.
#[derive(Clone, Copy)]
pub(crate) struct Disposition(libc::sigaction);

impl std::fmt::Debug for Disposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disposition")
            .field("handler", &self.0.sa_sigaction)
            .field("flags", &self.0.sa_flags)
            .finish()
    }
}

impl Disposition {
    /// The default action, no flags: what a disposition is before anything is installed.
    pub(crate) const DEFAULT: Disposition = Disposition(
        // SAFETY: `sigaction` is plain data; all zeroes is SIG_DFL with no flags and no mask.
        unsafe { std::mem::zeroed() },
    );

    /// What the process does with `signal` now.
    pub(crate) fn of(signal: Signal) -> io::Result<Disposition> {
        let mut current = Disposition::DEFAULT;
        // SAFETY: `current.0` is writable; a null new action only queries.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &mut current.0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(current)
    }

    /// Whether the signal is ignored.
    pub(crate) fn ignores(&self) -> bool {
        self.0.sa_sigaction == libc::SIG_IGN
    }

    /// Whether a handler of the program's is installed (not the default, not ignored).
    pub(crate) fn has_handler(&self) -> bool {
        self.0.sa_sigaction != libc::SIG_DFL && self.0.sa_sigaction != libc::SIG_IGN
    }

    /// Whether `handler` is the one installed.
    pub(crate) fn runs(&self, handler: InfoHandler) -> bool {
        self.0.sa_sigaction == handler as libc::sighandler_t
    }

    /// Makes this the disposition of `signal`. Async-signal-safe.
    pub(crate) fn set_for(&self, signal: Signal) -> io::Result<()> {
        // SAFETY: `self.0` is a complete `sigaction` read from the kernel or built by
        // `install`; a null old action is allowed.
        if unsafe { libc::sigaction(signal, &self.0, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Calls the program's handler this disposition holds, as the kernel would have called it.
    ///
    /// # Safety
    ///
    /// Only from a signal handler running for `signal`, with the `info` and `context` the
    /// kernel gave it, and only when [`Disposition::has_handler`].
    pub(crate) unsafe fn call(&self, signal: Signal, info: *mut Info, context: *mut Context) {
        // SAFETY: the caller's contract: a handler the program installed with these flags.
        unsafe {
            if self.0.sa_flags & libc::SA_SIGINFO != 0 {
                let handler: InfoHandler = std::mem::transmute(self.0.sa_sigaction);
                handler(signal, info, context);
            } else {
                let handler: extern "C" fn(Signal) = std::mem::transmute(self.0.sa_sigaction);
                handler(signal);
            }
        }
    }
}

/// Installs `handler` for `signal`, restarting interrupted calls, masking nothing more.
pub(crate) fn install(signal: Signal, handler: InfoHandler) -> io::Result<()> {
    let mut action = Disposition::DEFAULT;
    action.0.sa_sigaction = handler as libc::sighandler_t;
    action.0.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
    // SAFETY: `sa_mask` is writable.
    unsafe { libc::sigemptyset(&mut action.0.sa_mask) };
    action.set_for(signal)
}

/// Sends `signal` to the calling thread. Async-signal-safe.
pub(crate) fn raise(signal: Signal) {
    // SAFETY: raise with a valid signal number has no preconditions.
    unsafe { libc::raise(signal) };
}

/// Sends `signal` to this process.
pub(crate) fn send_to_self(signal: Signal) {
    // SAFETY: kill with our own pid and a valid signal number has no preconditions.
    unsafe { libc::kill(libc::getpid(), signal) };
}

/// The calling thread's `errno`, which a handler must leave as it found it.
pub(crate) fn errno() -> i32 {
    // SAFETY: `__errno_location` returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno` (see [`errno`]).
pub(crate) fn set_errno(value: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = value };
}

/// A pipe a signal handler writes a byte to, to wake a thread that reads it: the write end
/// never blocks (a full pipe already holds a wake-up). Both ends close on `exec`.
#[derive(Debug)]
pub(crate) struct WakePipe {
    /// The end the waiting thread reads.
    pub(crate) read_end: i32,
    /// The end the handler writes.
    pub(crate) write_end: i32,
}

impl WakePipe {
    /// A new pipe.
    pub(crate) fn new() -> io::Result<WakePipe> {
        let mut fds = [-1; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fds[1]` is an open descriptor owned here.
        unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
        Ok(WakePipe {
            read_end: fds[0],
            write_end: fds[1],
        })
    }

    /// Closes both ends (a pipe no thread will use).
    pub(crate) fn close(self) {
        // SAFETY: both descriptors are open and owned by `self`, which is consumed.
        unsafe {
            libc::close(self.read_end);
            libc::close(self.write_end);
        }
    }
}

/// Writes `byte` to a pipe's write end; whether it went in. Async-signal-safe.
pub(crate) fn write_byte(write_end: i32, byte: u8) -> bool {
    // SAFETY: write is async-signal-safe; the buffer is one valid byte.
    unsafe { libc::write(write_end, (&byte as *const u8).cast(), 1) == 1 }
}

/// Reads one byte from a pipe's read end, waiting for it; `None` at end of file or on an
/// error other than an interruption (which is retried).
pub(crate) fn read_byte(read_end: i32) -> Option<u8> {
    loop {
        let mut byte = 0u8;
        // SAFETY: `byte` is a writable one-byte buffer; the caller keeps `read_end` open.
        let read = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
        if read == 1 {
            return Some(byte);
        }
        if read < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

//! Writing the profile when the process is interrupted: opt in with
//! [`SessionBuilder::write_on_signal`](crate::SessionBuilder::write_on_signal) or
//! `HIGHWATER_SIGNALS=1`.
//!
//! # Why a watcher thread
//!
//! Ctrl+C (SIGINT) or a scheduler's SIGTERM ends a training run without running `atexit`
//! handlers, so without help the profile of an interrupted run is never written. A signal
//! handler cannot write it: it runs on an arbitrary thread, possibly inside `malloc` or while
//! holding a lock, so it may not allocate, lock or do anything that is not async-signal-safe.
//!
//! So the handler only notes which signal came and writes one byte to a pipe. A watcher thread
//! (marked internal: it records nothing) sleeps on the other end of the pipe and calls the
//! functions [`arm`] was given (this module knows nothing of sessions). What it does depends on
//! what the signal would have done without highwater:
//!
//! - **It would have ended the process** (default disposition): the watcher calls
//!   [`Handlers::finish`] — the session finishes as [`Session::finish`](crate::Session::finish)
//!   would, stopping the collector and writing the profile — then puts back the default
//!   disposition and raises the signal again. The process then ends the way it would have
//!   without highwater (its exit status says "killed by SIGINT").
//! - **The program handles it** (a handler was installed before the session started): the
//!   handler calls the program's handler at once, in signal context with the original
//!   arguments, as the kernel would have, and the session keeps recording. The watcher calls
//!   [`Handlers::checkpoint`], which writes the profile so far to the output, so a program
//!   whose handler later ends the process abruptly still leaves a profile; the program's own
//!   `finish`, drop or `exit` writes the whole run over it. (The program handler's own
//!   `sa_mask` and `SA_NODEFER` / `SA_RESETHAND` flags are not reproduced: it runs under
//!   highwater's mask.)
//!
//! # Escape hatches
//!
//! - A second SIGINT or SIGTERM while the first is being handled skips the profile: the handler
//!   puts back the previous disposition and re-raises at once. Pressing Ctrl+C twice always
//!   ends the process, whatever the writer is doing. (With a program handler, every signal goes
//!   to it; a second one during a checkpoint only skips the second checkpoint.)
//! - A signal that was ignored when the session started (`nohup`, a shell's background job)
//!   stays ignored: highwater installs no handler for it.
//! - In a forked child the handler steps aside the same way: the watcher thread did not survive
//!   the fork and the session is the parent's. A child that starts its own session with signals
//!   on gets its own pipe and watcher.
//!
//! The handlers are installed when a session starts and removed when it finishes — unless the
//! program has installed its own handler since, which stays. The pipe and the watcher thread
//! are created once per process and kept for its life.

use std::cell::UnsafeCell;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use parking_lot::Mutex;

use crate::capture::{self, lifecycle};

/// The signals handled, in the order of [`PREVIOUS`]'s entries.
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// The signal being handled (`0`: none). Set by the handler, cleared by the watcher once it
/// re-raised the signal and the process survived (the program had its own handler).
static PENDING: AtomicI32 = AtomicI32::new(0);
/// The pipe's write end, for the handler (`-1` until created).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// Whether highwater's handler is installed for each of [`SIGNALS`]. Written under [`STATE`].
static INSTALLED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

/// Serialises [`arm`] and [`disarm`]; holds the process whose pipe and watcher exist (`0`:
/// none yet; a forked child sees its parent's and makes its own).
static STATE: Mutex<libc::pid_t> = Mutex::new(0);
/// What the watcher calls when a signal comes: the functions [`arm`] was given.
static ON_SIGNAL: Mutex<Option<Handlers>> = Mutex::new(None);

/// Set in the pipe's byte when the program has its own handler: checkpoint, do not end.
const CHAINED: u8 = 0x80;

/// What the watcher thread calls for a signal (neither may call [`arm`]; both may call
/// [`disarm`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Handlers {
    /// The signal would have ended the process: finish and write the profile. The watcher then
    /// steps aside and re-raises the signal.
    pub(crate) finish: fn(),
    /// The program handles the signal and goes on: write what there is so far.
    pub(crate) checkpoint: fn(),
}

/// The dispositions [`SIGNALS`] had before highwater's handler, to put back.
struct Previous(UnsafeCell<[libc::sigaction; 2]>);

// SAFETY: entry `i` is written only by `arm`, under `STATE`, while highwater's handler is not
// installed for signal `i`; it is read by `disarm` (under `STATE`) and by the handler, which runs
// only while the handler is installed, i.e. after the write completed (the `sigaction` call that
// installs the handler orders it).
unsafe impl Sync for Previous {}

static PREVIOUS: Previous = Previous(UnsafeCell::new(
    // SAFETY: `sigaction` is plain data; all zeroes is SIG_DFL with no flags.
    unsafe { std::mem::zeroed() },
));

/// Installs the SIGINT and SIGTERM handlers (and, the first time, the pipe and the watcher
/// thread). When one of the signals comes, the watcher thread calls one of `handlers` (see
/// [`Handlers`]). Idempotent; the latest `handlers` are the ones called.
pub(crate) fn arm(handlers: Handlers) -> io::Result<()> {
    let mut watcher_pid = STATE.lock();
    *ON_SIGNAL.lock() = Some(handlers);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if *watcher_pid != pid {
        start_watcher()?;
        *watcher_pid = pid;
    }
    for (index, signal) in SIGNALS.into_iter().enumerate() {
        if INSTALLED[index].load(Ordering::SeqCst) {
            continue;
        }
        // SAFETY: all-zero is a valid `sigaction`; querying with a null new action changes
        // nothing.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `previous` is writable.
        if unsafe { libc::sigaction(signal, std::ptr::null(), &mut previous) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if previous.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: our handler is not installed for `signal` (INSTALLED is false), so nothing
        // reads this entry now; `STATE` keeps other writers out.
        unsafe { (*PREVIOUS.0.get())[index] = previous };
        // SAFETY: all-zero is a valid `sigaction`.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = our_handler();
        action.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
        // SAFETY: `action.sa_mask` is writable; `action` is fully initialised and its handler
        // is async-signal-safe (see `on_signal`).
        let installed = unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if installed != 0 {
            return Err(io::Error::last_os_error());
        }
        INSTALLED[index].store(true, Ordering::SeqCst);
    }
    Ok(())
}

/// Puts back the dispositions the signals had before [`arm`], where highwater's handler is
/// still the one installed (a handler the program installed since is left alone). Idempotent.
pub(crate) fn disarm() {
    let _state = STATE.lock();
    for (index, signal) in SIGNALS.into_iter().enumerate() {
        if INSTALLED[index].swap(false, Ordering::SeqCst) {
            // SAFETY: all-zero is a valid `sigaction`; a null new action only queries.
            let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: `current` is writable.
            unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) };
            if current.sa_sigaction != our_handler() {
                continue;
            }
            // SAFETY: the entry was written by `arm` before the handler was installed, and
            // `STATE` keeps `arm` from rewriting it now.
            unsafe { libc::sigaction(signal, &(*PREVIOUS.0.get())[index], std::ptr::null_mut()) };
        }
    }
}

/// highwater's handler as a `sigaction` value.
fn our_handler() -> libc::sighandler_t {
    on_signal as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
        as libc::sighandler_t
}

/// Creates the pipe and the watcher thread.
fn start_watcher() -> io::Result<()> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_end, write_end] = fds;
    // The handler must never block: a full pipe already holds a wake-up.
    // SAFETY: `write_end` is an open descriptor we own.
    unsafe { libc::fcntl(write_end, libc::F_SETFL, libc::O_NONBLOCK) };
    // Wait until the thread is marked internal, so nothing it allocates while starting is
    // recorded (the gate may be open by the time it runs).
    let (ready, internal) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name("highwater-signals".into())
        .stack_size(256 << 10)
        .spawn(move || {
            capture::mark_internal_thread();
            let _ = ready.send(());
            watch(read_end)
        })
        .and_then(|_| {
            internal
                .recv()
                .map_err(|_| io::Error::other("the signal watcher thread ended as it started"))
        });
    if let Err(error) = spawned {
        // SAFETY: both descriptors are open and owned here.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        return Err(error);
    }
    PIPE_WRITE.store(write_end, Ordering::SeqCst);
    Ok(())
}

/// The watcher: waits for a signal's byte, finishes the session, steps aside and re-raises.
fn watch(read_end: libc::c_int) {
    loop {
        let mut byte = 0u8;
        // SAFETY: `byte` is a writable one-byte buffer; `read_end` stays open for the process.
        let read = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
        if read < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if read <= 0 {
            return;
        }
        let signal = PENDING.load(Ordering::SeqCst);
        if signal == 0 {
            continue;
        }
        // Copied out first: a handler may take `STATE` (through `disarm`).
        let handlers = *ON_SIGNAL.lock();
        if byte & CHAINED != 0 {
            // The program handles the signal and goes on: so does recording.
            if let Some(handlers) = handlers {
                (handlers.checkpoint)();
            }
            PENDING.store(0, Ordering::SeqCst);
            continue;
        }
        if let Some(handlers) = handlers {
            (handlers.finish)();
        }
        disarm();
        // SAFETY: kill with our own pid and a valid signal number has no preconditions. With
        // the previous disposition back, the process now ends (or runs its own handler) as it
        // would have without highwater.
        unsafe { libc::kill(libc::getpid(), signal) };
        PENDING.store(0, Ordering::SeqCst);
    }
}

/// The handler: async-signal-safe only (atomics, `getpid`, `write`, `sigaction`, `raise`, and
/// the program's own handler, which was written to run here).
extern "C" fn on_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: `__errno_location` returns this thread's errno, always valid.
    let errno = unsafe { *libc::__errno_location() };
    let index = SIGNALS.iter().position(|&s| s == signal).unwrap_or(0);
    // SAFETY: the entry was written before this handler was installed (see `Previous`).
    let previous = unsafe { &(*PREVIOUS.0.get())[index] };
    let programs_own =
        previous.sa_sigaction != libc::SIG_DFL && previous.sa_sigaction != libc::SIG_IGN;
    // The session's owner process, as capture knows it (a forked child is not); asking it is
    // async-signal-safe.
    let owner = lifecycle::is_owner_process();
    let first = owner
        && PENDING
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    let woke = first && {
        let byte = signal as u8 | if programs_own { CHAINED } else { 0 };
        let pipe = PIPE_WRITE.load(Ordering::SeqCst);
        // SAFETY: write is async-signal-safe; the buffer is one valid byte.
        let written = unsafe { libc::write(pipe, (&byte as *const u8).cast(), 1) };
        written == 1
    };
    if first && !woke {
        PENDING.store(0, Ordering::SeqCst);
    }
    if programs_own {
        // SAFETY: the program installed this handler for `signal` with these flags; it is
        // called with the arguments the kernel gave us, as the kernel would have called it.
        unsafe {
            if previous.sa_flags & libc::SA_SIGINFO != 0 {
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(previous.sa_sigaction);
                handler(signal, info, context);
            } else {
                let handler: extern "C" fn(libc::c_int) =
                    std::mem::transmute(previous.sa_sigaction);
                handler(signal);
            }
        }
    } else if !woke {
        // Step aside: a forked child, a second signal, or no watcher to wake.
        // SAFETY: sigaction and raise are async-signal-safe; the entry was written before this
        // handler was installed (see `Previous`). The signal is blocked while its handler runs,
        // so the re-raised one is delivered, with the old disposition, when we return.
        unsafe {
            libc::sigaction(signal, previous, std::ptr::null_mut());
            libc::raise(signal);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

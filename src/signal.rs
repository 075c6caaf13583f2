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
use crate::sys::signal::{Context, Disposition, Info, Signal, WakePipe, SIGINT, SIGTERM};
use crate::sys::{self, process};

/// The signals handled, in the order of [`PREVIOUS`]'s entries.
const SIGNALS: [Signal; 2] = [SIGINT, SIGTERM];

/// The signal being handled (`0`: none). Set by the handler, cleared by the watcher once it
/// re-raised the signal and the process survived (the program had its own handler).
static PENDING: AtomicI32 = AtomicI32::new(0);
/// The pipe's write end, for the handler (`-1` until created).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// Whether highwater's handler is installed for each of [`SIGNALS`]. Written under [`STATE`].
static INSTALLED: [AtomicBool; 2] = [const { AtomicBool::new(false) }; 2];

/// Serialises [`arm`] and [`disarm`]; holds the process whose pipe and watcher exist (`0`:
/// none yet; a forked child sees its parent's and makes its own).
static STATE: Mutex<u32> = Mutex::new(0);
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
struct Previous(UnsafeCell<[Disposition; 2]>);

// SAFETY: entry `i` is written only by `arm`, under `STATE`, while highwater's handler is not
// installed for signal `i`; it is read by `disarm` (under `STATE`) and by the handler, which runs
// only while the handler is installed, i.e. after the write completed (the `sigaction` call that
// installs the handler orders it).
unsafe impl Sync for Previous {}

static PREVIOUS: Previous = Previous(UnsafeCell::new([Disposition::DEFAULT; 2]));

/// Installs the SIGINT and SIGTERM handlers (and, the first time, the pipe and the watcher
/// thread). When one of the signals comes, the watcher thread calls one of `handlers` (see
/// [`Handlers`]). Idempotent; the latest `handlers` are the ones called.
pub(crate) fn arm(handlers: Handlers) -> io::Result<()> {
    let mut watcher_pid = STATE.lock();
    *ON_SIGNAL.lock() = Some(handlers);
    let pid = process::pid();
    if *watcher_pid != pid {
        start_watcher()?;
        *watcher_pid = pid;
    }
    for (index, signal) in SIGNALS.into_iter().enumerate() {
        if INSTALLED[index].load(Ordering::SeqCst) {
            continue;
        }
        let previous = Disposition::of(signal)?;
        if previous.ignores() {
            continue;
        }
        // SAFETY: our handler is not installed for `signal` (INSTALLED is false), so nothing
        // reads this entry now; `STATE` keeps other writers out.
        unsafe { (*PREVIOUS.0.get())[index] = previous };
        // The handler is async-signal-safe (see `on_signal`).
        sys::signal::install(signal, on_signal)?;
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
            if !Disposition::of(signal).is_ok_and(|current| current.runs(on_signal)) {
                continue;
            }
            // SAFETY: the entry was written by `arm` before the handler was installed, and
            // `STATE` keeps `arm` from rewriting it now.
            let previous = unsafe { &(*PREVIOUS.0.get())[index] };
            let _ = previous.set_for(signal);
        }
    }
}

/// Creates the pipe and the watcher thread.
fn start_watcher() -> io::Result<()> {
    let pipe = WakePipe::new()?;
    let read_end = pipe.read_end;
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
        pipe.close();
        return Err(error);
    }
    PIPE_WRITE.store(pipe.write_end, Ordering::SeqCst);
    Ok(())
}

/// The watcher: waits for a signal's byte, finishes the session, steps aside and re-raises.
fn watch(read_end: i32) {
    // The read end stays open for the life of the process.
    while let Some(byte) = sys::signal::read_byte(read_end) {
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
        // With the previous disposition back, the process now ends (or runs its own handler)
        // as it would have without highwater.
        sys::signal::send_to_self(signal);
        PENDING.store(0, Ordering::SeqCst);
    }
}

/// The handler: async-signal-safe only (atomics, `getpid`, `write`, `sigaction`, `raise`, and
/// the program's own handler, which was written to run here).
extern "C" fn on_signal(signal: Signal, info: *mut Info, context: *mut Context) {
    let errno = sys::signal::errno();
    let index = SIGNALS.iter().position(|&s| s == signal).unwrap_or(0);
    // SAFETY: the entry was written before this handler was installed (see `Previous`).
    let previous = unsafe { &(*PREVIOUS.0.get())[index] };
    let programs_own = previous.has_handler();
    // The session's owner process, as capture knows it (a forked child is not); asking it is
    // async-signal-safe.
    let owner = lifecycle::is_owner_process();
    let first = owner
        && PENDING
            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
    let woke = first && {
        let byte = signal as u8 | if programs_own { CHAINED } else { 0 };
        sys::signal::write_byte(PIPE_WRITE.load(Ordering::SeqCst), byte)
    };
    if first && !woke {
        PENDING.store(0, Ordering::SeqCst);
    }
    if programs_own {
        // SAFETY: this is the handler running for `signal`, with the kernel's arguments, and
        // the program installed a handler of its own.
        unsafe { previous.call(signal, info, context) };
    } else if !woke {
        // Step aside: a forked child, a second signal, or no watcher to wake.
        // The signal is blocked while its handler runs, so the re-raised one is delivered,
        // with the old disposition, when we return.
        let _ = previous.set_for(signal);
        sys::signal::raise(signal);
    }
    sys::signal::set_errno(errno);
}

//! [`Session`]: starts recording, and writes the profile when it ends.
//!
//! One session records at a time. It opens the capture gate, runs the collector thread, and on
//! [`Session::finish`] — or when dropped, or when the process calls `exit` — closes the gate,
//! merges what is left and writes the profile atomically.
//!
//! # Whose session
//!
//! Each started session has a generation number, and a [`Session`] value only ever acts on the
//! session of its own generation, in the process that started it: a value whose session already
//! ended (at `exit`, on a signal) or that a forked child inherited is inert, its methods return
//! [`Error::Ended`] or [`Error::ForkedChild`] at once and dropping it does nothing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::analysis::TimelineConfig;
use crate::capture::gate::enable_asymmetric_barrier;
use crate::capture::{self, clock, lifecycle, names, wake};
use crate::checkpoint::CheckpointConfig;
use crate::collector::{self, CollectorConfig, Control};
use crate::config::{check_max_threads, check_ring_events, EnvConfig, Requested, Settings};
use crate::error::Error;
use crate::export::html;
use crate::fork_lock::{ForkSafeGuard, ForkSafeMutex};
use crate::model::OomSource;
use crate::outputs::{self, Outputs};
use crate::profile::{CaptureMode, Profile, RunMeta, Warning};
use crate::rank::{self, NameContext};
use crate::sys;

pub use crate::config::DEFAULT_OUTPUT;
pub use builder::SessionBuilder;

mod builder;

/// The running session's parts, reachable from the `exit` handler and the signal watcher.
/// This and [`FINISHING`] are [`ForkSafeMutex`]es: a forked child must be able to take them.
static ACTIVE: ForkSafeMutex<Option<Running>> = ForkSafeMutex::new(None);

/// Held for a whole finish (and for a checkpoint written on a signal), so a finish under way on
/// one thread completes before another caller (the exit handler, the signal watcher) goes on.
/// Always taken before [`ACTIVE`].
static FINISHING: ForkSafeMutex<()> = ForkSafeMutex::new(());

thread_local! {
    /// The session locks [`before_fork`] took on this thread, until the fork handlers that run
    /// after the fork (on this same thread, in the parent and in the child) release them.
    static HELD_OVER_FORK: std::cell::RefCell<Option<HeldOverFork>> =
        const { std::cell::RefCell::new(None) };
}

/// [`FINISHING`], [`ACTIVE`] and the names table, held across a `fork` (taken in this order).
struct HeldOverFork {
    _finishing: ForkSafeGuard<'static, ()>,
    _active: ForkSafeGuard<'static, Option<Running>>,
    _names: names::HeldOverFork,
}

/// The generation of the session recording now (`0`: none). Sessions count from 1.
static CURRENT: AtomicU64 = AtomicU64::new(0);
/// The last generation handed out.
static LAST_GENERATION: AtomicU64 = AtomicU64::new(0);

/// How long the `exit` handler waits for a finish already under way on another thread.
const EXIT_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Running {
    generation: u64,
    collector: JoinHandle<()>,
    control: Sender<Control>,
    output: PathBuf,
    write: bool,
    html: bool,
    meta: RunMeta,
    /// Op names folded by the intern table before this session started.
    folded_names_before: u64,
    /// [`names::folded_devices`] when the session started.
    folded_devices_before: u64,
    /// [`names::folded_shapes`] when the session started.
    folded_shapes_before: u64,
    /// The outputs this process holds (profile, allocation log) until they are written.
    claims: Vec<rank::Claim>,
}

/// A recording session. Dropping it finishes it (and writes the profile).
///
/// See [`SessionBuilder`] for settings and an example.
#[derive(Debug)]
#[must_use = "dropping the session ends recording at once"]
pub struct Session {
    /// The session this value owns (`0` when `HIGHWATER=off` disabled recording).
    generation: u64,
    /// False once finished, and when `HIGHWATER=off` disabled recording.
    recording: bool,
    /// Where the profile is written, when it is.
    output: Option<PathBuf>,
}

impl Session {
    /// Settings for a new session.
    pub fn builder() -> SessionBuilder {
        SessionBuilder::default()
    }

    /// Starts a session with default settings.
    ///
    /// # Errors
    ///
    /// As [`SessionBuilder::start`].
    pub fn start() -> Result<Session, Error> {
        SessionBuilder::default().start()
    }

    fn inert() -> Session {
        Session {
            generation: 0,
            recording: false,
            output: None,
        }
    }

    /// Where the profile (and its checkpoints) is written: the output asked for with its
    /// placeholders filled in and the rank in its name, or the name beside it this process
    /// took when another live process held that one. `None` when nothing is written
    /// ([`SessionBuilder::write_profile`] off, `HIGHWATER=off`). The HTML report goes beside
    /// it.
    pub fn output(&self) -> Option<&Path> {
        self.output.as_deref()
    }

    /// Whether this session records (false when `HIGHWATER=off`, and in a forked child).
    pub fn is_recording(&self) -> bool {
        self.recording
            && lifecycle::is_owner_process()
            && CURRENT.load(Ordering::SeqCst) == self.generation
    }

    /// Why this value may not act on the running session, if it may not.
    fn not_mine(&self) -> Option<Error> {
        if !lifecycle::is_owner_process() {
            Some(Error::ForkedChild)
        } else if CURRENT.load(Ordering::SeqCst) != self.generation {
            Some(Error::Ended)
        } else {
            None
        }
    }

    /// The profile as of now, while recording goes on. Nothing is written.
    ///
    /// Events younger than the collector's merge lag are included: a snapshot merges every event
    /// stamped before the collector took the request. Its `capture` says how capture went so
    /// far: per-thread counts and drops, and late events. The counts of unattributed and
    /// re-entrant drops and of producer waits are made only when the session finishes.
    ///
    /// # Errors
    ///
    /// [`Error::CollectorLost`] if the collector thread died, [`Error::Ended`] if the session
    /// already ended (at a signal), [`Error::ForkedChild`] in a forked child; with
    /// `HIGHWATER=off`, an empty profile.
    pub fn snapshot(&self) -> Result<Profile, Error> {
        if !self.recording {
            return Ok(Profile::empty());
        }
        if let Some(error) = self.not_mine() {
            return Err(error);
        }
        capture::with_recording_paused(|| snapshot_of(self.generation))
    }

    /// Stops recording, analyses what is left, writes the profile and returns it.
    ///
    /// With `HIGHWATER=off` nothing was recorded: returns an empty profile that says so and
    /// writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Write`] when the profile cannot be written: it carries the profile, and where a
    /// fallback copy went (no partial file is left at the output); [`Error::Export`] when the
    /// HTML report asked for beside it cannot be written (the profile was);
    /// [`Error::CollectorLost`] if the collector thread died; [`Error::Ended`] if the session
    /// already ended; [`Error::ForkedChild`] in a forked child (the parent's session goes on
    /// there).
    pub fn finish(mut self) -> Result<Profile, Error> {
        let recording = std::mem::replace(&mut self.recording, false);
        if !recording {
            let mut profile = Profile::empty();
            profile.warnings.push(Warning::RecordingDisabled);
            return Ok(profile);
        }
        if let Some(error) = self.not_mine() {
            return Err(error);
        }
        capture::with_recording_paused(|| finish_active(Some(self.generation)))
            .unwrap_or(Err(Error::Ended))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.recording && self.not_mine().is_none() {
            if let Some(Err(error)) =
                capture::with_recording_paused(|| finish_active(Some(self.generation)))
            {
                eprintln!("highwater: {error}");
            }
        }
    }
}

/// This process's id.
fn this_pid() -> u32 {
    crate::sys::process::pid()
}

/// A snapshot of session `generation`. The session lock is not held while the collector works,
/// so an `exit` on another thread is never kept waiting by a snapshot.
fn snapshot_of(generation: u64) -> Result<Profile, Error> {
    let (reply, profile) = crossbeam_channel::bounded(1);
    let meta = {
        let active = ACTIVE.lock();
        let running = active
            .as_ref()
            .filter(|running| running.generation == generation)
            .ok_or(Error::Ended)?;
        running
            .control
            .send(Control::Snapshot(reply))
            .map_err(|_| Error::CollectorLost)?;
        wake::ring_collector();
        running.meta.clone()
    };
    let mut profile = profile.recv().map_err(|_| Error::CollectorLost)?;
    // The session's run facts, with the collector's count of threads so far.
    let threads = profile.meta.threads;
    profile.meta = meta;
    profile.meta.threads = threads;
    Ok(profile)
}

/// Finishes the active session — only if it is `generation`, when given: stops the collector
/// and writes the profile. `None` when there was nothing of that generation to finish.
fn finish_active(generation: Option<u64>) -> Option<Result<Profile, Error>> {
    let _finishing = FINISHING.lock();
    let running = {
        let mut active = ACTIVE.lock();
        let mine = active.as_ref().is_some_and(|running| {
            lifecycle::is_owner_process() && generation.is_none_or(|g| g == running.generation)
        });
        if !mine {
            return None;
        }
        active.take()?
    };
    Some(finish_running(running))
}

/// Finishes the session for a SIGINT/SIGTERM that would have ended the process (called by the
/// signal watcher thread); waits for a finish already under way on another thread.
#[cfg(target_os = "linux")]
fn finish_for_signal() {
    if let Some(Err(error)) = capture::with_recording_paused(|| finish_active(None)) {
        eprintln!("highwater: {error}");
    }
}

/// Writes the profile so far to the output, for a signal the program handles itself (called by
/// the signal watcher thread). The session keeps recording; a finish that got there first wins.
#[cfg(target_os = "linux")]
fn checkpoint_for_signal() {
    let result = capture::with_recording_paused(|| {
        let _finishing = FINISHING.lock();
        let (generation, output, write) = {
            let active = ACTIVE.lock();
            match active.as_ref().filter(|_| lifecycle::is_owner_process()) {
                Some(running) => (running.generation, running.output.clone(), running.write),
                None => return Ok(()),
            }
        };
        if !write {
            return Ok(());
        }
        let mut profile = snapshot_of(generation)?;
        profile.warnings.push(Warning::Checkpoint);
        profile.write(&output).map_err(Error::from)
    });
    if let Err(error) = result {
        eprintln!("highwater: checkpoint on signal: {error}");
    }
}

/// Installs the SIGINT/SIGTERM handlers of [`SessionBuilder::write_on_signal`].
fn arm_signals() -> Result<(), Error> {
    #[cfg(target_os = "linux")]
    let armed = crate::signal::arm(crate::signal::Handlers {
        finish: finish_for_signal,
        checkpoint: checkpoint_for_signal,
    })
    .map_err(|error| error.to_string());
    #[cfg(not(target_os = "linux"))]
    let armed = Err("writing the profile on a signal is supported on Linux only".to_string());
    armed.map_err(|reason| Error::Setting {
        setting: "write_on_signal",
        reason,
    })
}

/// Removes the handlers [`arm_signals`] installed, if any.
fn disarm_signals() {
    #[cfg(target_os = "linux")]
    crate::signal::disarm();
}

/// The device pools' sink while a session records: each pool state becomes a device event.
fn record_pool_snapshot(s: &crate::device::PoolSnapshot) {
    if capture::recording() {
        capture::record_pool_state(
            capture::names::device(&s.name),
            s.capacity_bytes,
            s.reserved_bytes,
            s.largest_free_block,
            s.fragmentation,
        );
    }
}

/// The device pools' refusal sink while a session records: each device that refused becomes an
/// out-of-memory event, and the calling thread waits (boundedly) for a checkpoint that has them,
/// as a thread whose heap allocation was refused does.
fn record_pool_refusal(shortfalls: &[crate::device::Shortfall]) {
    if !capture::recording() {
        return;
    }
    capture::oom::refused(OomSource::Pool, || {
        let mut recorded = false;
        for shortfall in shortfalls {
            let device = capture::names::device(&shortfall.name);
            recorded |= capture::record_oom(
                device,
                OomSource::Pool,
                shortfall.requested,
                Some(shortfall.largest_free),
            );
        }
        recorded
    });
}

fn finish_running(running: Running) -> Result<Profile, Error> {
    CURRENT.store(0, Ordering::SeqCst);
    crate::device::clear_pool_sink();
    stop_device_capture();
    let (reply, profile) = crossbeam_channel::bounded(1);
    let sent = running.control.send(Control::Stop(reply)).is_ok();
    wake::ring_collector();
    let profile = if sent { profile.recv().ok() } else { None };
    let _ = running.collector.join();
    let Some(mut profile) = profile else {
        disarm_signals();
        return Err(Error::CollectorLost);
    };
    let threads = profile.meta.threads;
    profile.meta = running.meta;
    profile.meta.threads = threads;
    let folded = names::folded().saturating_sub(running.folded_names_before);
    if folded > 0 {
        profile.warnings.push(Warning::NamesFolded {
            names: folded,
            max_names: names::MAX_NAMES as u64,
            shown_as: names::FOLDED_NAME.to_string(),
        });
    }
    let devices = names::folded_devices().saturating_sub(running.folded_devices_before);
    if devices > 0 {
        profile.warnings.push(Warning::DevicesFolded {
            devices,
            max_devices: names::MAX_DEVICES as u64,
            shown_as: names::FOLDED_DEVICE.to_string(),
        });
    }
    let shapes = names::folded_shapes().saturating_sub(running.folded_shapes_before);
    if shapes > 0 {
        profile.warnings.push(Warning::ShapesFolded {
            shapes,
            max_shapes: names::MAX_SHAPES as u64,
        });
    }
    let written = if running.write {
        write_outputs(profile, &running.output, running.html, running.generation)
    } else {
        Ok(profile)
    };
    // The outputs are written (the allocation log closed with the collector): another process
    // may have the names now.
    drop(running.claims);
    // After the write, so a signal during it still waits for the profile.
    disarm_signals();
    written
}

/// Starts recording CUDA device memory when asked to and built with the `cuda` feature; the
/// warning every profile of the session then carries if it could not.
fn device_capture(on: bool) -> Option<Warning> {
    let not_recorded = |reason, detail| Warning::DeviceMemoryNotRecorded {
        api: "cuda".to_string(),
        reason,
        detail,
    };
    #[cfg(feature = "cuda")]
    {
        if !on {
            return Some(not_recorded(
                crate::profile::NotRecordedReason::Disabled,
                String::new(),
            ));
        }
        crate::cuda::start()
            .err()
            .map(|(reason, detail)| not_recorded(reason, detail))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (on, not_recorded);
        None
    }
}

/// Gives back the CUDA subscription, if the session holds one.
fn stop_device_capture() {
    #[cfg(feature = "cuda")]
    crate::cuda::stop();
}

/// Writes the profile and, when asked, the HTML report beside it. A profile that cannot be
/// written is handed back in [`Error::Write`], with a fallback copy when one can be made.
fn write_outputs(
    profile: Profile,
    output: &Path,
    with_html: bool,
    generation: u64,
) -> Result<Profile, Error> {
    if let Err(source) = profile.write(output) {
        let fallback = write_fallback(&profile, generation);
        return Err(Error::Write {
            source,
            profile: Box::new(profile),
            fallback,
        });
    }
    if with_html {
        html::write(&profile, html::path_beside(output))?;
    }
    Ok(profile)
}

/// Writes a copy of a profile whose output failed into the temporary directory, under a new
/// name created exclusively (never a name another user could have planted); its path, if that
/// worked.
fn write_fallback(profile: &Profile, generation: u64) -> Option<PathBuf> {
    let prefix = format!("highwater-profile-{}-{generation}-", this_pid());
    crate::fileio::write_new_file_in(
        &std::env::temp_dir(),
        &prefix,
        ".json",
        profile.to_json().as_bytes(),
    )
    .ok()
}

/// Set once `finish_at_exit` has run: the process is exiting.
static EXIT_HANDLER_RAN: AtomicBool = AtomicBool::new(false);

/// Installs, once per process, the `exit` handler and the fork handlers. A session started
/// after the exit handler ran (from a handler the program registered before highwater's, which
/// runs after it) registers it again: C's `exit` runs handlers registered while it runs them,
/// so that session is written too.
fn install_process_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if EXIT_HANDLER_RAN.swap(false, Ordering::SeqCst) {
        sys::process::on_exit(finish_at_exit);
    }
    ONCE.call_once(|| {
        // `finish_at_exit` does not unwind; the fork handlers only lock and unlock the
        // session's two mutexes and the names table's (and cannot unwind).
        sys::process::on_exit(finish_at_exit);
        sys::process::on_fork(
            Some(before_fork),
            Some(after_fork_unlock),
            Some(after_fork_unlock),
        );
    });
}

/// Takes both session locks and the names table's before `fork`, so the child never inherits
/// one held by a thread that does not exist there (its `Session::start`, or its first op, would
/// then wait forever). Nothing holding the names table waits for a session lock.
extern "C" fn before_fork() {
    let held = HeldOverFork {
        _finishing: FINISHING.lock(),
        _active: ACTIVE.lock(),
        _names: names::hold_over_fork(),
    };
    // A thread whose thread-locals are being torn down forks with the locks free, as it would
    // without this handler.
    let _ = HELD_OVER_FORK.try_with(|slot| *slot.borrow_mut() = Some(held));
}

/// Releases what [`before_fork`] took, in the parent and in the child (where this thread is the
/// copy of the one that took them, and the unlock leaves them free: see [`crate::fork_lock`]).
extern "C" fn after_fork_unlock() {
    let _ = HELD_OVER_FORK.try_with(|slot| drop(slot.borrow_mut().take()));
}

/// Finishes the session when the process calls `exit` (including `std::process::exit`) before
/// the session was finished or dropped. Waits (up to [`EXIT_WAIT`]) for a finish or snapshot
/// under way on another thread, and says so on stderr if it cannot.
extern "C" fn finish_at_exit() {
    EXIT_HANDLER_RAN.store(true, Ordering::SeqCst);
    // A forked child that started no session of its own has nothing to finish.
    if !lifecycle::is_owner_process() {
        return;
    }
    let result = std::panic::catch_unwind(|| {
        capture::with_recording_paused(|| {
            let Some(_finishing) = FINISHING.try_lock_for(EXIT_WAIT) else {
                return Err(format!(
                    "the process exited while the profile was being written, which did not end \
                     within {} s; the profile may be missing",
                    EXIT_WAIT.as_secs()
                ));
            };
            let Some(mut active) = ACTIVE.try_lock_for(EXIT_WAIT) else {
                return Err(
                    "the process exited while the session was busy; the profile was \
                            not written"
                        .into(),
                );
            };
            let running = match active.take() {
                Some(running) if lifecycle::is_owner_process() => running,
                // A forked child's copy of the parent's session: not ours to finish.
                Some(inherited) => {
                    std::mem::forget(inherited);
                    return Ok(());
                }
                None => return Ok(()),
            };
            drop(active);
            finish_running(running)
                .map(drop)
                .map_err(|error| error.to_string())
        })
    });
    match result {
        Ok(Ok(())) => {}
        Ok(Err(message)) => eprintln!("highwater: {message}"),
        Err(_) => eprintln!("highwater: finishing the session at exit panicked"),
    }
}

fn program_name() -> String {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|path| {
            path.file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_default()
}

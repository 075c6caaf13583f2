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

pub use crate::config::DEFAULT_OUTPUT;

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

/// Settings for a [`Session`], from the builder and the environment.
///
/// An explicit `HIGHWATER_*` variable overrides what the code set here, which overrides the
/// default: the person running the binary has the last word.
///
/// | variable | values | overrides | default |
/// |---|---|---|---|
/// | `HIGHWATER` | `on`, `off` (also `1`/`0`, `true`/`false`) | — | `on`; `off` disables recording with no code change |
/// | `HIGHWATER_OUT` | a path (any bytes; placeholders `{rank}`, `{local_rank}`, `{pid}`, `{host}`) | [`SessionBuilder::output`] | `highwater-profile.json` (`highwater-profile.rankN.json` with a rank) |
/// | `HIGHWATER_ALLOC_LOG` | a path (any bytes) | [`SessionBuilder::alloc_log`] | none ([`crate::alloc_log`]) |
/// | `HIGHWATER_HTML` | `1`/`0` (also `on`/`off`, `true`/`false`) | [`SessionBuilder::html`] | on: the report beside a profile written to a file |
/// | `HIGHWATER_CAPTURE` | `lossless`, `drop` | [`SessionBuilder::capture_mode`] | `lossless`: a full ring waits for the collector; `drop` drops and counts ([`CaptureMode`]) |
/// | `HIGHWATER_RING_EVENTS` | a power of two, 1024 to 16777216 | [`SessionBuilder::ring_events`] | 65536 (2 MiB per thread) |
/// | `HIGHWATER_CLOCK` | `tsc`, `monotonic` | — | `tsc` where available |
/// | `HIGHWATER_SIGNALS` | `on`, `off` (also `1`/`0`, …) | [`SessionBuilder::write_on_signal`] | off |
/// | `HIGHWATER_CHECKPOINT` | seconds (`10`, `0.5`); `0` for none | [`SessionBuilder::checkpoint_every`] | 10 s |
/// | `HIGHWATER_SAMPLE_BYTES` | bytes: `0` off, `1` every allocation | [`SessionBuilder::sample_bytes`] | 524288 (512 KiB) |
/// | `HIGHWATER_CUDA` | `on`, `off` (also `1`/`0`, …) | [`SessionBuilder::cuda`] | on (with the `cuda` feature) |
/// | `HIGHWATER_MAX_THREADS` | 1 to 4096 | [`SessionBuilder::max_threads`] | 1024 |
/// | `HIGHWATER_RUN_ID` | any text | [`SessionBuilder::run_id`] | the launcher's run id, if any |
///
/// # Many processes, one run
///
/// Under a launcher (torchrun, `mpirun`, `srun`; see [`SessionBuilder::rank`]) each process
/// knows its rank, and the profile records it with the world size, the host and the run id.
/// The output paths (the profile's, and with it the HTML report's and the checkpoints', and
/// the allocation log's) take placeholders, `{rank}`, `{local_rank}`, `{pid}` and `{host}`;
/// with a rank known and no placeholder, the file name carries the rank
/// (`highwater-profile.rank3.json`). [`Session::output`] says where the profile goes.
///
/// No two live processes write one file: each output is claimed when recording starts (a lock
/// the kernel drops when the process ends, however it ends), and a process that finds its name
/// held by another live one says so on standard error and in the profile
/// ([`Warning::OutputTaken`](crate::profile::Warning::OutputTaken)) and writes beside it
/// (`highwater-profile.pid4242.json`).
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), highwater::Error> {
/// let session = highwater::Session::builder().output("out/profile.json").start()?;
/// // … train …
/// let profile = session.finish()?;
/// println!("peak: {} bytes", profile.summary.peak_bytes);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct SessionBuilder {
    requested: Requested,
    timeline: TimelineConfig,
}

impl SessionBuilder {
    /// Writes the profile to `path` (default `./highwater-profile.json`; `$HIGHWATER_OUT`
    /// overrides). `{rank}`, `{local_rank}`, `{pid}` and `{host}` in it are filled in; with a
    /// rank known and no placeholder, the file name carries the rank (see [Many processes, one
    /// run](SessionBuilder#many-processes-one-run)). Missing directories are created when
    /// recording starts. A regular file is replaced atomically;
    /// anything else (`/dev/null`, `/dev/stdout`, a FIFO) is written through, and the target of
    /// a symlink this user or root owns is written, not the link (a symlink another user owns
    /// is refused).
    pub fn output(mut self, path: impl Into<PathBuf>) -> SessionBuilder {
        self.requested.output = Some(path.into());
        self
    }

    /// Events each thread's ring holds (a power of two, 1024 to 16 Mi; default 64 Ki, 2 MiB
    /// per thread). A full ring waits for the collector or drops, by the [`CaptureMode`]; a
    /// bigger ring means fewer waits (or drops) under bursts, at 32 bytes per event per thread.
    /// `HIGHWATER_RING_EVENTS` overrides it.
    pub fn ring_events(mut self, events: usize) -> SessionBuilder {
        self.requested.ring_events = Some(events);
        self
    }

    /// Mean bytes between call-site samples, `R` (default 512 KiB; `HIGHWATER_SAMPLE_BYTES`
    /// overrides). Each thread counts down a distance drawn from an exponential distribution
    /// with mean `R`; the allocation that crosses it has its stack recorded, so an allocation
    /// of `s` bytes is sampled with probability `1 - e^(-s/R)` and allocations far above `R`
    /// practically always. `0` turns sampling off; `1` records the stack of every allocation
    /// (exact per-site figures, for small programs and tests). See [`crate::profile::CallSite`].
    pub fn sample_bytes(mut self, mean_bytes: u64) -> SessionBuilder {
        self.requested.sample_bytes = Some(mean_bytes);
        self
    }

    /// What a thread does when its ring is full (default [`CaptureMode::Lossless`]: it waits
    /// for the collector). `HIGHWATER_CAPTURE` overrides it.
    pub fn capture_mode(mut self, mode: CaptureMode) -> SessionBuilder {
        self.requested.capture_mode = Some(mode);
        self
    }

    /// Whether finishing writes the profile file (default `true`); [`Session::finish`] returns
    /// the profile either way.
    pub fn write_profile(mut self, write: bool) -> SessionBuilder {
        self.requested.write = Some(write);
        self
    }

    /// Whether SIGINT (Ctrl+C) and SIGTERM write the profile (default off;
    /// `$HIGHWATER_SIGNALS` overrides). Linux only.
    ///
    /// The handler itself only wakes a watcher thread (a handler may not allocate or lock).
    /// What happens next depends on what the signal did before the session started:
    ///
    /// - It would have ended the process (no handler of the program's): the watcher finishes
    ///   the session as [`Session::finish`] would, puts back the previous disposition and
    ///   raises the signal again, so the process still ends by that signal. A second signal
    ///   while the profile is being written ends the process at once without it.
    /// - The program handles it: highwater calls the program's handler straight away, the
    ///   session keeps recording, and the watcher writes a checkpoint of the profile so far to
    ///   the output. The program's own `finish` (or drop, or `exit`) later writes the whole run.
    ///
    /// Signals ignored at start (`nohup`) stay ignored. The handlers are removed when the
    /// session finishes (unless the program has installed another handler since).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), highwater::Error> {
    /// // Ctrl+C during training still leaves a profile behind.
    /// let session = highwater::Session::builder().write_on_signal(true).start()?;
    /// # drop(session); Ok(()) }
    /// ```
    pub fn write_on_signal(mut self, on: bool) -> SessionBuilder {
        self.requested.signals = Some(on);
        self
    }

    /// Whether the self-contained HTML report is written next to the profile (`profile.html`
    /// beside `profile.json`) when the session ends. Default on; `$HIGHWATER_HTML` overrides
    /// (`HIGHWATER_HTML=0` leaves it out). A profile written to something that is not a file
    /// (`/dev/null`, `/dev/stdout`, a FIFO) gets no report beside it.
    pub fn html(mut self, html: bool) -> SessionBuilder {
        self.requested.html = Some(html);
        self
    }

    /// Also write the allocation log (every allocation and free, for `highwater simulate`) to
    /// `path`. Default none; `$HIGHWATER_ALLOC_LOG` overrides. See [`crate::alloc_log`].
    pub fn alloc_log(mut self, path: impl Into<PathBuf>) -> SessionBuilder {
        self.requested.alloc_log = Some(path.into());
        self
    }

    /// Writes the profile so far to the output path every `interval` while recording
    /// (default [`DEFAULT_CHECKPOINT_INTERVAL`](crate::DEFAULT_CHECKPOINT_INTERVAL), 10 s;
    /// `Duration::ZERO` for none), so a run killed with SIGKILL still leaves a profile.
    /// `HIGHWATER_CHECKPOINT=<seconds>` overrides it. A refused allocation writes one at once
    /// whatever the interval, even with periodic ones off.
    ///
    /// A checkpoint is a complete profile marked `meta.partial: true` with its time
    /// (`meta.checkpoint_unix_ms`); the collector's own writer thread writes it atomically, so
    /// user threads never wait for it. The final profile replaces it. Nothing is written when
    /// [`SessionBuilder::write_profile`] is off.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), highwater::Error> {
    /// use std::time::Duration;
    /// let session = highwater::Session::builder()
    ///     .checkpoint_every(Duration::from_secs(30))
    ///     .start()?;
    /// # drop(session); Ok(()) }
    /// ```
    pub fn checkpoint_every(mut self, interval: Duration) -> SessionBuilder {
        self.requested.checkpoint_every = Some(interval);
        self
    }

    /// Threads that can record at the same time (1 to 4096, default 1024;
    /// `HIGHWATER_MAX_THREADS` overrides). Each recording thread holds a ring; a thread started
    /// while every ring is held by a live thread has its events counted as dropped until one is
    /// handed back, and the profile says so (`Warning::ThreadLimit`). Rings of exited threads
    /// are handed back once drained, and a thread waits for one in lossless mode.
    pub fn max_threads(mut self, threads: usize) -> SessionBuilder {
        self.requested.max_threads = Some(threads);
        self
    }

    /// Longest a thread whose allocation was refused waits for the checkpoint that records the
    /// refusal (default 5 s). Rust aborts the process right after a failed allocation, so that
    /// checkpoint is what the run leaves; a larger profile or a busier machine may need longer.
    /// The wait ends as soon as the checkpoint is on disk, so a generous bound costs nothing
    /// when the writer keeps up.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), highwater::Error> {
    /// use std::time::Duration;
    /// let session = highwater::Session::builder()
    ///     .oom_wait(Duration::from_secs(60))
    ///     .start()?;
    /// # drop(session); Ok(()) }
    /// ```
    pub fn oom_wait(mut self, bound: Duration) -> SessionBuilder {
        self.requested.oom_wait = Some(bound);
        self
    }

    /// Whether CUDA device memory is recorded (default on; `$HIGHWATER_CUDA` overrides). Takes
    /// effect with the `cuda` feature: the session then subscribes to CUPTI's memory callbacks
    /// when a CUDA driver and CUPTI load, and the profile says why if they do not. Without the
    /// feature no device memory is recorded either way.
    pub fn cuda(mut self, on: bool) -> SessionBuilder {
        self.requested.cuda = Some(on);
        self
    }

    /// This process is rank `rank` of `world_size` processes of one run (default: what a
    /// launcher's environment says, see below; nothing for a process launched alone). The
    /// profile's `meta` records it, and the output's name carries it unless the path has a
    /// placeholder (see [Many processes, one run](SessionBuilder#many-processes-one-run)).
    ///
    /// Without it, the rank comes from the first launcher whose variables are set:
    /// torchrun's `RANK`/`WORLD_SIZE`/`LOCAL_RANK`, Open MPI's
    /// `OMPI_COMM_WORLD_RANK`/`_SIZE`/`_LOCAL_RANK`, PMI's `PMI_RANK`/`PMI_SIZE` (MPICH, Intel
    /// MPI), then Slurm's `SLURM_PROCID`/`SLURM_STEP_NUM_TASKS` in a task `srun` started. What
    /// the program says here wins over them: it knows its rank (a pipeline stage, say).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), highwater::Error> {
    /// // Stage 2 of a four-stage pipeline: writes highwater-profile.rank2.json.
    /// let session = highwater::Session::builder().rank(2, 4).start()?;
    /// # drop(session); Ok(()) }
    /// ```
    pub fn rank(mut self, rank: u32, world_size: u32) -> SessionBuilder {
        self.requested.rank = Some((rank, world_size));
        self
    }

    /// What every process of this run shares and other runs do not (default: the launcher's:
    /// torchrun's `TORCHELASTIC_RUN_ID`, PMIx's namespace, Slurm's job and step;
    /// `$HIGHWATER_RUN_ID` overrides). `highwater ranks` compares the profiles of one run by it.
    pub fn run_id(mut self, id: impl Into<String>) -> SessionBuilder {
        self.requested.run_id = Some(id.into());
        self
    }

    /// Analysis settings (timeline resolution, table sizes).
    pub fn timeline(mut self, config: TimelineConfig) -> SessionBuilder {
        self.timeline = config;
        self
    }

    /// Starts recording.
    ///
    /// The output is checked here, not at the end: an empty path, a path ending in `/`, an
    /// existing directory, or a path under a regular file or a read-only directory is refused
    /// before anything is recorded.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid `HIGHWATER_*` variable, [`Error::Setting`] for an
    /// invalid setting (an output that cannot be written, signal handlers that cannot be
    /// installed, `write_on_signal` off Linux), [`Error::AlreadyRunning`] if a session is
    /// recording, [`Error::Spawn`] if the collector thread cannot start.
    pub fn start(self) -> Result<Session, Error> {
        capture::with_recording_paused(|| self.start_paused())
    }

    fn start_paused(self) -> Result<Session, Error> {
        let mut settings = Settings::resolve(&self.requested, &EnvConfig::read()?);
        if !settings.enabled {
            return Ok(Session::inert());
        }
        if let Some((rank, world_size)) = self.requested.rank {
            if rank >= world_size {
                return Err(Error::Setting {
                    setting: "rank",
                    reason: format!("rank {rank} is not below the world size {world_size}"),
                });
            }
        }
        let host = rank::host_name();
        name_outputs(&mut settings, &host)?;
        check_ring_events(settings.ring_events).map_err(|reason| Error::Setting {
            setting: "ring_events",
            reason,
        })?;
        check_max_threads(settings.max_threads).map_err(|reason| Error::Setting {
            setting: "max_threads",
            reason,
        })?;
        let Outputs {
            mut output,
            html,
            mut alloc_log,
            checkpoints,
        } = outputs::resolve(
            settings.write,
            &settings.output,
            settings.html,
            settings.alloc_log.as_deref(),
        )
        .map_err(|(setting, reason)| Error::Setting { setting, reason })?;
        install_process_handlers();
        let mut active = ACTIVE.lock();
        if active.is_some() && !lifecycle::is_owner_process() {
            // Inherited through fork: its collector thread stayed in the parent. Forget it
            // without touching its channel or thread handle, which belong to the parent.
            std::mem::forget(active.take());
        }
        if active.is_some() || capture::recording() {
            return Err(Error::AlreadyRunning);
        }
        // Only now, with no session of this process holding them: a second claim of a name this
        // process holds would succeed (record locks are per process) and its release would
        // drop the running session's.
        let mut claims = Vec::new();
        let mut warnings = Vec::new();
        if settings.write {
            output = claim(&output, "output", &host, &mut claims, &mut warnings)?;
        }
        if let Some(log) = &alloc_log {
            alloc_log = Some(claim(log, "alloc_log", &host, &mut claims, &mut warnings)?);
        }
        // Before the signal handlers: they ask `lifecycle` whether this is the owner process.
        capture::install_process_handlers();
        if settings.signals {
            arm_signals()?;
        }
        let clock_name = clock::init(settings.force_monotonic);
        capture::set_ring_capacity(settings.ring_events);
        capture::oom::set_wait(settings.oom_wait);
        capture::begin_session(
            settings.capture_mode == CaptureMode::Lossless,
            settings.sample_bytes,
            settings.max_threads,
        );
        capture::oom::new_session();
        enable_asymmetric_barrier();
        let calibration = clock::Calibration::measure(Duration::from_millis(5));
        let meta = RunMeta {
            program: program_name(),
            highwater_version: env!("CARGO_PKG_VERSION").to_string(),
            started_unix_ms: crate::checkpoint::unix_ms_now(),
            clock: clock_name.to_string(),
            threads: 0,
            alloc_log: alloc_log
                .as_ref()
                .map(|path| path.to_string_lossy().into_owned()),
            pid: std::process::id(),
            partial: false,
            checkpoint_unix_ms: None,
            host,
            rank: settings.rank.as_ref().map(|r| r.rank),
            local_rank: settings.rank.as_ref().and_then(|r| r.local_rank),
            world_size: settings.rank.as_ref().map(|r| r.world_size),
            launcher: settings.rank.as_ref().map(|r| r.launcher.to_string()),
            run_id: settings.run_id.clone(),
        };
        warnings.extend(device_capture(settings.cuda));
        let (collector, control) = collector::spawn(CollectorConfig {
            calibration,
            interval: Duration::from_millis(2),
            lag: collector::MERGE_LAG,
            timeline: self.timeline,
            sample_bytes: settings.sample_bytes,
            alloc_log: alloc_log.clone(),
            warnings,
            // Even with periodic checkpoints off, a refused allocation writes one.
            // Nothing goes through a device or FIFO output but the final profile.
            checkpoint: (settings.write && checkpoints).then(|| CheckpointConfig {
                every: settings.checkpoint_every,
                path: output.clone(),
                meta: meta.clone(),
            }),
        })
        .map_err(|error| {
            stop_device_capture();
            capture::collector_stopped();
            disarm_signals();
            Error::Spawn(error)
        })?;
        let generation = LAST_GENERATION.fetch_add(1, Ordering::SeqCst) + 1;
        let written = settings.write.then(|| output.clone());
        *active = Some(Running {
            generation,
            collector,
            control,
            output,
            write: settings.write,
            html,
            meta,
            folded_names_before: names::folded(),
            folded_devices_before: names::folded_devices(),
            folded_shapes_before: names::folded_shapes(),
            claims,
        });
        CURRENT.store(generation, Ordering::SeqCst);
        capture::open_gate();
        crate::device::set_pool_sink(record_pool_snapshot);
        crate::device::set_refusal_sink(record_pool_refusal);
        Ok(Session {
            generation,
            recording: true,
            output: written,
        })
    }
}

/// Fills in the placeholders of the session's output paths and puts its rank in their names
/// ([`rank::name_output`]).
fn name_outputs(settings: &mut Settings, host: &str) -> Result<(), Error> {
    let context = NameContext {
        rank: settings.rank.as_ref().map(|r| r.rank),
        local_rank: settings.rank.as_ref().and_then(|r| r.local_rank),
        pid: std::process::id(),
        host,
    };
    settings.output =
        rank::name_output(&settings.output, &context).map_err(|reason| Error::Setting {
            setting: "output",
            reason,
        })?;
    if let Some(log) = &settings.alloc_log {
        let named = rank::name_output(log, &context).map_err(|reason| Error::Setting {
            setting: "alloc_log",
            reason,
        })?;
        settings.alloc_log = Some(named);
    }
    Ok(())
}

/// Claims `path` for this session ([`rank::claim_output`]), or a name beside it when another
/// live process holds it, which is said on standard error and in the profile. What is written
/// through needs no claim: devices, FIFOs, and an open file reached through `/dev/stdout` or
/// `/proc/self/fd` (which processes share on purpose).
fn claim(
    path: &Path,
    setting: &'static str,
    host: &str,
    claims: &mut Vec<rank::Claim>,
    warnings: &mut Vec<Warning>,
) -> Result<PathBuf, Error> {
    if crate::fileio::leads_to_open_file(path)
        || std::fs::metadata(path).is_ok_and(|meta| !meta.is_file())
    {
        return Ok(path.to_path_buf());
    }
    let pid = std::process::id();
    let who = format!("pid {pid} on {host}");
    let claimed = rank::claim_output(path, pid, &who).map_err(|error| Error::Setting {
        setting,
        reason: format!("cannot claim {}: {error}", path.display()),
    })?;
    if let Some(holder) = claimed.taken_by {
        let warning = Warning::OutputTaken {
            wanted: path.to_string_lossy().into_owned(),
            written: claimed.path.to_string_lossy().into_owned(),
            holder,
        };
        eprintln!("highwater: {warning}");
        warnings.push(warning);
    }
    if let Some(why) = claimed.unguarded {
        eprintln!(
            "highwater: nothing keeps other processes from writing {} too: {why}",
            claimed.path.display()
        );
    }
    claims.extend(claimed.claim);
    Ok(claimed.path)
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
fn this_pid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
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
    profile.meta = RunMeta {
        threads: profile.meta.threads,
        ..meta
    };
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
    profile.meta = RunMeta {
        threads: profile.meta.threads,
        ..running.meta
    };
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
        // SAFETY: as below.
        unsafe { libc::atexit(finish_at_exit) };
    }
    ONCE.call_once(|| {
        // SAFETY: `finish_at_exit` is an `extern "C" fn()` that does not unwind; the fork
        // handlers only lock and unlock the session's two mutexes and the names table's (and
        // cannot unwind).
        unsafe {
            libc::atexit(finish_at_exit);
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_unlock),
                Some(after_fork_unlock),
            );
        }
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

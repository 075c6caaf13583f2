//! [`SessionBuilder`]: the settings of a session, checked, and its start: outputs named,
//! resolved and claimed, the capture and the collector armed, the gate opened.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;

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
            settings.unwinder,
        );
        capture::oom::new_session();
        enable_asymmetric_barrier();
        let calibration = clock::Calibration::measure(Duration::from_millis(5));
        let mut meta = RunMeta::default();
        meta.program = program_name();
        meta.highwater_version = env!("CARGO_PKG_VERSION").to_string();
        meta.started_unix_ms = crate::checkpoint::unix_ms_now();
        meta.clock = clock_name.to_string();
        meta.threads = 0;
        meta.alloc_log = alloc_log
            .as_ref()
            .map(|path| path.to_string_lossy().into_owned());
        meta.pid = std::process::id();
        meta.partial = false;
        meta.checkpoint_unix_ms = None;
        meta.host = host;
        meta.rank = settings.rank.as_ref().map(|r| r.rank);
        meta.local_rank = settings.rank.as_ref().and_then(|r| r.local_rank);
        meta.world_size = settings.rank.as_ref().map(|r| r.world_size);
        meta.launcher = settings.rank.as_ref().map(|r| r.launcher.to_string());
        meta.run_id = settings.run_id.clone();
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

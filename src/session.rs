//! [`Session`]: starts recording, and writes the profile when it ends.
//!
//! One session records at a time. It opens the capture gate, runs the collector thread, and on
//! [`Session::finish`] — or when dropped, or when the process calls `exit` — closes the gate,
//! merges what is left and writes the profile atomically.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::analysis::TimelineConfig;
use crate::capture::ring::enable_asymmetric_barrier;
use crate::capture::{self, clock, lifecycle, wake};
use crate::checkpoint::CheckpointConfig;
use crate::collector::{self, CollectorConfig, Control};
use crate::error::Error;
use crate::export::html;
use crate::profile::{CaptureMode, Profile, RunMeta, Warning};

/// Where the profile goes when neither the builder nor `HIGHWATER_OUT` says.
pub const DEFAULT_OUTPUT: &str = "highwater-profile.json";

/// The running session's parts, reachable from the `exit` handler.
static ACTIVE: Mutex<Option<Running>> = Mutex::new(None);

#[derive(Debug)]
struct Running {
    collector: JoinHandle<()>,
    control: Sender<Control>,
    output: PathBuf,
    write: bool,
    html: bool,
    meta: RunMeta,
}

/// Settings for a [`Session`], read from the builder and the environment.
///
/// | variable | values | effect |
/// |---|---|---|
/// | `HIGHWATER` | `on`, `off` (also `1`/`0`, `true`/`false`) | `off` disables recording with no code change |
/// | `HIGHWATER_OUT` | a path | where the profile goes unless [`SessionBuilder::output`] says |
/// | `HIGHWATER_ALLOC_LOG` | a path | also write the allocation log there ([`crate::alloc_log`]) |
/// | `HIGHWATER_HTML` | `1`/`0` (also `on`/`off`, `true`/`false`) | also write the HTML report next to the profile |
/// | `HIGHWATER_CAPTURE` | `lossless`, `drop` | what a full ring does: wait for the collector (default) or drop and count ([`CaptureMode`]); overrides [`SessionBuilder::capture_mode`] |
/// | `HIGHWATER_RING_EVENTS` | a power of two, 1024 to 16777216 | events per thread ring (default 65536, 2 MiB per thread) |
/// | `HIGHWATER_CLOCK` | `tsc`, `monotonic` | force the portable clock |
/// | `HIGHWATER_SIGNALS` | `on`, `off` (also `1`/`0`, …) | write the profile on SIGINT/SIGTERM unless [`SessionBuilder::write_on_signal`] says |
/// | `HIGHWATER_CHECKPOINT` | seconds (`10`, `0.5`); `0` for none | time between checkpoints, over [`SessionBuilder::checkpoint_every`] |
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
    output: Option<PathBuf>,
    ring_events: Option<usize>,
    capture_mode: Option<CaptureMode>,
    write: Option<bool>,
    signals: Option<bool>,
    html: Option<bool>,
    alloc_log: Option<PathBuf>,
    checkpoint_every: Option<Duration>,
    timeline: TimelineConfig,
}

impl SessionBuilder {
    /// Writes the profile to `path` (default: `$HIGHWATER_OUT`, else
    /// `./highwater-profile.json`). Missing directories are created.
    pub fn output(mut self, path: impl Into<PathBuf>) -> SessionBuilder {
        self.output = Some(path.into());
        self
    }

    /// Events each thread's ring holds (a power of two, 1024 to 16 Mi; default 64 Ki, 2 MiB
    /// per thread). A full ring waits for the collector or drops, by the [`CaptureMode`]; a
    /// bigger ring means fewer waits (or drops) under bursts, at 32 bytes per event per thread.
    /// `HIGHWATER_RING_EVENTS` overrides it.
    pub fn ring_events(mut self, events: usize) -> SessionBuilder {
        self.ring_events = Some(events);
        self
    }

    /// What a thread does when its ring is full (default [`CaptureMode::Lossless`]: it waits
    /// for the collector). `HIGHWATER_CAPTURE` overrides it.
    pub fn capture_mode(mut self, mode: CaptureMode) -> SessionBuilder {
        self.capture_mode = Some(mode);
        self
    }

    /// Whether finishing writes the profile file (default `true`); [`Session::finish`] returns
    /// the profile either way.
    pub fn write_profile(mut self, write: bool) -> SessionBuilder {
        self.write = Some(write);
        self
    }

    /// Whether SIGINT (Ctrl+C) and SIGTERM finish the session and write the profile before the
    /// process ends (default: `$HIGHWATER_SIGNALS`, else `false`). Linux only.
    ///
    /// The handler itself only wakes a watcher thread (a handler may not allocate or lock);
    /// the watcher finishes the session as [`Session::finish`] would, puts back the signal's
    /// previous disposition and raises the signal again, so the process still ends by that
    /// signal — or the program's own handler runs. A second signal while the profile is being
    /// written ends the process at once without it. Signals ignored at start (`nohup`) stay
    /// ignored. The handlers are removed when the session finishes.
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
        self.signals = Some(on);
        self
    }

    /// Also write the self-contained HTML report next to the profile (`profile.html` beside
    /// `profile.json`) when the session ends. Default: `$HIGHWATER_HTML`, else off.
    pub fn html(mut self, html: bool) -> SessionBuilder {
        self.html = Some(html);
        self
    }

    /// Also write the allocation log (every allocation and free, for `highwater simulate`) to
    /// `path`. Default: `$HIGHWATER_ALLOC_LOG`, else none. See [`crate::alloc_log`].
    pub fn alloc_log(mut self, path: impl Into<PathBuf>) -> SessionBuilder {
        self.alloc_log = Some(path.into());
        self
    }

    /// Writes the profile so far to the output path every `interval` while recording
    /// (default none; [`SUGGESTED_CHECKPOINT_INTERVAL`](crate::SUGGESTED_CHECKPOINT_INTERVAL) is
    /// a sensible value; `Duration::ZERO` for none), so a run killed with SIGKILL still leaves a profile.
    /// `HIGHWATER_CHECKPOINT=<seconds>` overrides it.
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
        self.checkpoint_every = Some(interval);
        self
    }

    /// Analysis settings (timeline resolution, table sizes).
    pub fn timeline(mut self, config: TimelineConfig) -> SessionBuilder {
        self.timeline = config;
        self
    }

    /// Starts recording.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid `HIGHWATER_*` variable, [`Error::Setting`] for an
    /// invalid builder setting (or signal handlers that cannot be installed, or
    /// `write_on_signal` off Linux), [`Error::AlreadyRunning`] if a session is recording,
    /// [`Error::Spawn`] if the collector thread cannot start.
    pub fn start(self) -> Result<Session, Error> {
        capture::paused(|| self.start_paused())
    }

    fn start_paused(self) -> Result<Session, Error> {
        let env = EnvConfig::read()?;
        if !env.enabled {
            return Ok(Session { recording: false });
        }
        // The person running the binary has the last word: variables override the builder.
        let ring_events = env
            .ring_events
            .or(self.ring_events)
            .unwrap_or(lifecycle::DEFAULT_RING_EVENTS);
        let capture_mode = env.capture_mode.or(self.capture_mode).unwrap_or_default();
        check_ring_events(ring_events).map_err(|reason| Error::Setting {
            setting: "ring_events",
            reason,
        })?;
        let mut active = ACTIVE.lock();
        if active.is_some() || capture::recording() {
            return Err(Error::AlreadyRunning);
        }
        if self.signals.or(env.signals).unwrap_or(false) {
            arm_signals()?;
        }
        let clock_name = clock::init(env.force_monotonic);
        lifecycle::set_ring_capacity(ring_events);
        lifecycle::install();
        capture::begin_session(capture_mode == CaptureMode::Lossless);
        enable_asymmetric_barrier();
        install_exit_handler();
        let calibration = clock::Calibration::measure(Duration::from_millis(5));
        let alloc_log = self.alloc_log.or(env.alloc_log);
        let output = self
            .output
            .or(env.output)
            .unwrap_or_else(|| DEFAULT_OUTPUT.into());
        let write = self.write.unwrap_or(true);
        let meta = RunMeta {
            program: program_name(),
            highwater_version: env!("CARGO_PKG_VERSION").to_string(),
            started_unix_ms: crate::checkpoint::unix_ms_now(),
            clock: clock_name.to_string(),
            threads: 0,
            alloc_log: alloc_log.as_ref().map(|path| path.display().to_string()),
            pid: std::process::id(),
            partial: false,
            checkpoint_unix_ms: None,
        };
        let checkpoint_every = checkpoint_interval(self.checkpoint_every, env.checkpoint);
        let (collector, control) = collector::spawn(CollectorConfig {
            calibration,
            interval: Duration::from_millis(2),
            lag: Duration::from_millis(5),
            timeline: self.timeline,
            alloc_log,
            checkpoint: checkpoint_every
                .filter(|_| write)
                .map(|every| CheckpointConfig {
                    every,
                    path: output.clone(),
                    meta: meta.clone(),
                }),
        })
        .map_err(|error| {
            capture::collector_stopped();
            disarm_signals();
            Error::Spawn(error)
        })?;
        *active = Some(Running {
            collector,
            control,
            output,
            write,
            html: self.html.or(env.html).unwrap_or(false),
            meta,
        });
        capture::open_gate();
        crate::device::set_pool_sink(record_pool_snapshot);
        Ok(Session { recording: true })
    }
}

/// A recording session. Dropping it finishes it (and writes the profile).
///
/// See [`SessionBuilder`] for settings and an example.
#[derive(Debug)]
#[must_use = "dropping the session ends recording at once"]
pub struct Session {
    /// False when `HIGHWATER=off` disabled recording.
    recording: bool,
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

    /// Whether this session records (false when `HIGHWATER=off`).
    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// The profile as of now, while recording goes on. Nothing is written.
    ///
    /// Events younger than the collector's merge lag are included: a snapshot merges every event
    /// stamped before the collector took the request.
    ///
    /// # Errors
    ///
    /// [`Error::CollectorLost`] if the collector thread died; with `HIGHWATER=off`, an empty
    /// profile.
    pub fn snapshot(&self) -> Result<Profile, Error> {
        if !self.recording {
            return Ok(Profile::empty());
        }
        capture::paused(|| {
            let (reply, profile) = crossbeam_channel::bounded(1);
            let active = ACTIVE.lock();
            let running = active.as_ref().ok_or(Error::CollectorLost)?;
            running
                .control
                .send(Control::Snapshot(reply))
                .map_err(|_| Error::CollectorLost)?;
            wake::ring_collector();
            let mut profile = profile.recv().map_err(|_| Error::CollectorLost)?;
            profile.meta = running.meta.clone();
            Ok(profile)
        })
    }

    /// Stops recording, analyses what is left, writes the profile and returns it.
    ///
    /// With `HIGHWATER=off` nothing was recorded: returns an empty profile that says so and
    /// writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Profile`] when the profile cannot be written (no partial file is left),
    /// [`Error::Export`] when the HTML report asked for beside it cannot,
    /// [`Error::CollectorLost`] if the collector thread died.
    pub fn finish(mut self) -> Result<Profile, Error> {
        let recording = std::mem::replace(&mut self.recording, false);
        if !recording {
            let mut profile = Profile::empty();
            profile.warnings.push(Warning::RecordingDisabled);
            return Ok(profile);
        }
        capture::paused(finish_active).unwrap_or(Err(Error::CollectorLost))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.recording {
            if let Some(Err(error)) = capture::paused(finish_active) {
                eprintln!("highwater: {error}");
            }
        }
    }
}

/// Held for a whole finish, so a finish under way on one thread completes before another
/// caller (the signal watcher) goes on.
static FINISHING: Mutex<()> = Mutex::new(());

/// Finishes the active session, if any: stops the collector and writes the profile.
fn finish_active() -> Option<Result<Profile, Error>> {
    let _finishing = FINISHING.lock();
    let running = ACTIVE.lock().take()?;
    Some(finish_running(running))
}

/// Finishes the session for a SIGINT/SIGTERM (called by the signal watcher thread); waits for
/// a finish already under way on another thread.
#[cfg(target_os = "linux")]
fn finish_for_signal() {
    if let Some(Err(error)) = capture::paused(finish_active) {
        eprintln!("highwater: {error}");
    }
}

/// Installs the SIGINT/SIGTERM handlers of [`SessionBuilder::write_on_signal`].
fn arm_signals() -> Result<(), Error> {
    #[cfg(target_os = "linux")]
    let armed = crate::signal::arm(finish_for_signal).map_err(|error| error.to_string());
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

fn finish_running(running: Running) -> Result<Profile, Error> {
    crate::device::clear_pool_sink();
    let (reply, profile) = crossbeam_channel::bounded(1);
    let sent = running.control.send(Control::Stop(reply)).is_ok();
    wake::ring_collector();
    let profile = if sent { profile.recv().ok() } else { None };
    let _ = running.collector.join();
    let mut profile = profile.ok_or(Error::CollectorLost)?;
    profile.meta = RunMeta {
        threads: profile.meta.threads,
        ..running.meta
    };
    let written = if running.write {
        profile
            .write(&running.output)
            .map_err(Error::from)
            .and_then(|()| {
                if running.html {
                    html::write(&profile, html::path_beside(&running.output)).map_err(Error::from)
                } else {
                    Ok(())
                }
            })
    } else {
        Ok(())
    };
    // After the write, so a signal during it still waits for the profile.
    disarm_signals();
    written?;
    Ok(profile)
}

/// Finishes the session when the process calls `exit` (including `std::process::exit`) before
/// the session was finished or dropped.
fn install_exit_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `finish_at_exit` is an `extern "C" fn()` that does not unwind.
        unsafe { libc::atexit(finish_at_exit) };
    });
}

extern "C" fn finish_at_exit() {
    // A forked child shares the parent's statics but not its collector thread.
    if !lifecycle::is_owner_process() {
        return;
    }
    // Never wait on the lock at exit: whoever holds it is already finishing.
    let Some(running) = ACTIVE.try_lock().and_then(|mut active| active.take()) else {
        return;
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        capture::paused(|| finish_running(running))
    }));
    if let Ok(Err(error)) = result {
        eprintln!("highwater: {error}");
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

fn check_ring_events(events: usize) -> Result<(), String> {
    if events.is_power_of_two() && (1 << 10..=1 << 24).contains(&events) {
        Ok(())
    } else {
        Err(format!(
            "{events} is not a power of two between 1024 and 16777216"
        ))
    }
}

/// What the `HIGHWATER_*` environment variables say.
#[derive(Debug, Clone, PartialEq)]
struct EnvConfig {
    enabled: bool,
    output: Option<PathBuf>,
    html: Option<bool>,
    alloc_log: Option<PathBuf>,
    ring_events: Option<usize>,
    capture_mode: Option<CaptureMode>,
    force_monotonic: bool,
    signals: Option<bool>,
    /// `Some(None)`: checkpoints off.
    checkpoint: Option<Option<Duration>>,
}

impl EnvConfig {
    fn read() -> Result<EnvConfig, Error> {
        EnvConfig::parse(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    fn parse(var: impl Fn(&str) -> Option<String>) -> Result<EnvConfig, Error> {
        let invalid = |var: &'static str, value: &str, expected: &'static str| Error::Config {
            var,
            value: value.to_string(),
            expected,
        };
        let switch = |name: &'static str| -> Result<Option<bool>, Error> {
            var(name)
                .map(|value| {
                    parse_switch(&value)
                        .ok_or_else(|| invalid(name, &value, "on or off (1/0, true/false)"))
                })
                .transpose()
        };
        let path = |name: &'static str| -> Result<Option<PathBuf>, Error> {
            match var(name) {
                Some(value) if value.trim().is_empty() => Err(invalid(name, &value, "a file path")),
                value => Ok(value.map(PathBuf::from)),
            }
        };
        let enabled = switch("HIGHWATER")?.unwrap_or(true);
        let output = path("HIGHWATER_OUT")?;
        let alloc_log = path("HIGHWATER_ALLOC_LOG")?;
        let html = switch("HIGHWATER_HTML")?;
        let ring_events = match var("HIGHWATER_RING_EVENTS") {
            None => None,
            Some(value) => {
                let expected = "a power of two between 1024 and 16777216";
                let events: usize = value
                    .trim()
                    .parse()
                    .map_err(|_| invalid("HIGHWATER_RING_EVENTS", &value, expected))?;
                check_ring_events(events)
                    .map_err(|_| invalid("HIGHWATER_RING_EVENTS", &value, expected))?;
                Some(events)
            }
        };
        let capture_mode = var("HIGHWATER_CAPTURE")
            .map(|value| {
                CaptureMode::parse(&value)
                    .ok_or_else(|| invalid("HIGHWATER_CAPTURE", &value, "lossless or drop"))
            })
            .transpose()?;
        let force_monotonic = match var("HIGHWATER_CLOCK").as_deref().map(str::trim) {
            None | Some("tsc") => false,
            Some("monotonic") => true,
            Some(value) => return Err(invalid("HIGHWATER_CLOCK", value, "tsc or monotonic")),
        };
        let signals = switch("HIGHWATER_SIGNALS")?;
        let checkpoint = var("HIGHWATER_CHECKPOINT")
            .map(|value| {
                crate::checkpoint::parse_interval(&value).ok_or_else(|| {
                    invalid(
                        "HIGHWATER_CHECKPOINT",
                        &value,
                        "seconds between checkpoints (0.001 to 86400), or 0 for none",
                    )
                })
            })
            .transpose()?;
        Ok(EnvConfig {
            checkpoint,
            enabled,
            output,
            html,
            alloc_log,
            ring_events,
            capture_mode,
            force_monotonic,
            signals,
        })
    }
}

/// Time between checkpoints: the environment's setting over the builder's; none by default,
/// and zero (or `HIGHWATER_CHECKPOINT=0`) means none.
fn checkpoint_interval(
    builder: Option<Duration>,
    env: Option<Option<Duration>>,
) -> Option<Duration> {
    env.unwrap_or(builder).filter(|every| !every.is_zero())
}

/// Parses an on/off value.
pub(crate) fn parse_switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Some(true),
        "0" | "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_interval_precedence() {
        let secs = Duration::from_secs;
        assert_eq!(checkpoint_interval(None, None), None);
        assert_eq!(checkpoint_interval(Some(secs(3)), None), Some(secs(3)));
        assert_eq!(checkpoint_interval(Some(Duration::ZERO), None), None);
        assert_eq!(
            checkpoint_interval(Some(secs(3)), Some(Some(secs(7)))),
            Some(secs(7))
        );
        assert_eq!(checkpoint_interval(Some(secs(3)), Some(None)), None);
        assert_eq!(
            checkpoint_interval(Some(Duration::ZERO), Some(Some(secs(1)))),
            Some(secs(1))
        );
        let env = EnvConfig::parse(|name| (name == "HIGHWATER_CHECKPOINT").then(|| "0".into()));
        assert_eq!(env.unwrap().checkpoint, Some(None));
        let bad = EnvConfig::parse(|name| (name == "HIGHWATER_CHECKPOINT").then(|| "often".into()));
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("HIGHWATER_CHECKPOINT"));
    }

    #[test]
    fn capture_mode_comes_from_the_variable() {
        assert_eq!(parse(&[]).unwrap().capture_mode, None);
        for (value, mode) in [
            ("lossless", CaptureMode::Lossless),
            ("drop", CaptureMode::DropWhenFull),
            (" Drop ", CaptureMode::DropWhenFull),
            ("drop_when_full", CaptureMode::DropWhenFull),
        ] {
            let config = parse(&[("HIGHWATER_CAPTURE", value)]).unwrap();
            assert_eq!(config.capture_mode, Some(mode), "{value}");
        }
    }

    #[test]
    fn capture_mode_is_written_as_the_issue_names_it() {
        let name = |mode| serde_json::to_string(&mode).unwrap();
        assert_eq!(name(CaptureMode::Lossless), "\"lossless\"");
        assert_eq!(name(CaptureMode::DropWhenFull), "\"drop_when_full\"");
        assert_eq!(CaptureMode::default(), CaptureMode::Lossless);
    }

    fn parse(vars: &[(&str, &str)]) -> Result<EnvConfig, Error> {
        EnvConfig::parse(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn defaults_record_with_no_variables() {
        let config = parse(&[]).unwrap();
        assert!(config.enabled);
        assert_eq!(config.output, None);
    }

    #[test]
    fn off_disables_and_out_sets_the_path() {
        let config = parse(&[("HIGHWATER", "off"), ("HIGHWATER_OUT", "x/p.json")]).unwrap();
        assert!(!config.enabled);
        assert_eq!(config.output, Some(PathBuf::from("x/p.json")));
    }

    #[test]
    fn invalid_values_name_the_variable() {
        for (var, value) in [
            ("HIGHWATER", "maybe"),
            ("HIGHWATER_RING_EVENTS", "1000"),
            ("HIGHWATER_RING_EVENTS", "lots"),
            ("HIGHWATER_CLOCK", "sundial"),
            ("HIGHWATER_OUT", " "),
            ("HIGHWATER_SIGNALS", "sometimes"),
            ("HIGHWATER_HTML", "sometimes"),
            ("HIGHWATER_CAPTURE", "sometimes"),
        ] {
            let message = parse(&[(var, value)]).unwrap_err().to_string();
            assert!(message.contains(var), "{message}");
            assert!(message.contains(value), "{message}");
        }
    }
}

//! A session's settings: what the code asked for on the builder, what the `HIGHWATER_*`
//! environment says, and the rule that joins them.
//!
//! # Precedence
//!
//! An explicit `HIGHWATER_*` variable overrides what the code set on
//! [`SessionBuilder`](crate::SessionBuilder), which overrides the default: the person running
//! the binary has the last word (as `HIGHWATER=off` always had). An unset variable leaves the
//! builder's choice alone.
//!
//! | variable | values | overrides | default |
//! |---|---|---|---|
//! | `HIGHWATER` | `on`, `off` (also `1`/`0`, `true`/`false`, `yes`/`no`) | — | `on` |
//! | `HIGHWATER_OUT` | a path (any bytes, not only UTF-8; placeholders `{rank}`, `{local_rank}`, `{pid}`, `{host}`) | [`output`](crate::SessionBuilder::output) | `highwater-profile.json` |
//! | `HIGHWATER_ALLOC_LOG` | a path (any bytes) | [`alloc_log`](crate::SessionBuilder::alloc_log) | none |
//! | `HIGHWATER_HTML` | on/off | [`html`](crate::SessionBuilder::html) | on (beside a profile written to a file) |
//! | `HIGHWATER_CAPTURE` | `lossless`, `drop` | [`capture_mode`](crate::SessionBuilder::capture_mode) | `lossless` |
//! | `HIGHWATER_RING_EVENTS` | a power of two, 1024 to 16777216 | [`ring_events`](crate::SessionBuilder::ring_events) | 65536 |
//! | `HIGHWATER_CLOCK` | `tsc`, `monotonic` | — | `tsc` where available |
//! | `HIGHWATER_SIGNALS` | on/off | [`write_on_signal`](crate::SessionBuilder::write_on_signal) | off |
//! | `HIGHWATER_CHECKPOINT` | seconds between checkpoints (`10`, `0.5`), 0.001 to 86400; `0` for none | [`checkpoint_every`](crate::SessionBuilder::checkpoint_every) | 10 |
//! | `HIGHWATER_SAMPLE_BYTES` | bytes: `0` off, `1` every allocation | [`sample_bytes`](crate::SessionBuilder::sample_bytes) | 524288 |
//! | `HIGHWATER_CUDA` | on/off | [`cuda`](crate::SessionBuilder::cuda) | on (with the `cuda` feature) |
//! | `HIGHWATER_UNWINDER` | `frame-pointers`, `eh-frame` | — | the method that works for the build |
//! | `HIGHWATER_MAX_THREADS` | 1 to 4096 | [`max_threads`](crate::SessionBuilder::max_threads) | 1024 |
//! | `HIGHWATER_RUN_ID` | any text | [`run_id`](crate::SessionBuilder::run_id) | the launcher's run id, if any |
//!
//! A launcher's rank variables (`RANK`/`WORLD_SIZE`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`,
//! `SLURM_PROCID`; see `rank::detect`) are not highwater's: the program's own
//! [`rank`](crate::SessionBuilder::rank), when it gives one, wins over them.
//!
//! Paths are kept as the operating system gave them ([`OsString`]), so a non-UTF-8 name is
//! written under exactly that name.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::Duration;

use crate::capture::{DEFAULT_RING_EVENTS, DEFAULT_SAMPLE_BYTES};
use crate::error::Error;
use crate::model::Unwinder;
use crate::profile::CaptureMode;
use crate::rank::{Launch, RankInfo};

/// Where the profile goes when neither the builder nor `HIGHWATER_OUT` says.
pub const DEFAULT_OUTPUT: &str = "highwater-profile.json";

/// What the code chose on the builder; `None` where it said nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Requested {
    pub(crate) output: Option<PathBuf>,
    pub(crate) ring_events: Option<usize>,
    pub(crate) capture_mode: Option<CaptureMode>,
    pub(crate) write: Option<bool>,
    pub(crate) signals: Option<bool>,
    pub(crate) html: Option<bool>,
    pub(crate) alloc_log: Option<PathBuf>,
    pub(crate) checkpoint_every: Option<Duration>,
    pub(crate) sample_bytes: Option<u64>,
    pub(crate) cuda: Option<bool>,
    pub(crate) max_threads: Option<usize>,
    pub(crate) oom_wait: Option<Duration>,
    /// `(rank, world_size)`, as the program gave them.
    pub(crate) rank: Option<(u32, u32)>,
    pub(crate) run_id: Option<String>,
}

/// What the `HIGHWATER_*` environment variables say; `None` where a variable is unset.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct EnvConfig {
    pub(crate) enabled: Option<bool>,
    pub(crate) output: Option<PathBuf>,
    pub(crate) html: Option<bool>,
    pub(crate) alloc_log: Option<PathBuf>,
    pub(crate) ring_events: Option<usize>,
    pub(crate) capture_mode: Option<CaptureMode>,
    pub(crate) force_monotonic: Option<bool>,
    pub(crate) signals: Option<bool>,
    /// `Some(None)`: the variable turns checkpoints off.
    pub(crate) checkpoint: Option<Option<Duration>>,
    pub(crate) sample_bytes: Option<u64>,
    pub(crate) cuda: Option<bool>,
    pub(crate) max_threads: Option<usize>,
    /// `HIGHWATER_UNWINDER`: one method for every sampled stack.
    pub(crate) unwinder: Option<Unwinder>,
    /// What a launcher's variables and `HIGHWATER_RUN_ID` say.
    pub(crate) launch: Launch,
}

/// The settings a session runs with, after [precedence](self#precedence).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    pub(crate) enabled: bool,
    pub(crate) output: PathBuf,
    pub(crate) write: bool,
    pub(crate) signals: bool,
    pub(crate) html: bool,
    pub(crate) alloc_log: Option<PathBuf>,
    pub(crate) ring_events: usize,
    pub(crate) capture_mode: CaptureMode,
    pub(crate) force_monotonic: bool,
    /// Time between checkpoints; `None` (a zero interval) for none.
    pub(crate) checkpoint_every: Option<Duration>,
    /// Mean bytes between call-site samples (`0`: off, `1`: every allocation).
    pub(crate) sample_bytes: u64,
    /// Whether CUDA device memory is recorded (with the `cuda` feature).
    pub(crate) cuda: bool,
    /// Threads that can record at the same time.
    pub(crate) max_threads: usize,
    /// One method for every sampled stack; `None`: the one that works for the build.
    pub(crate) unwinder: Option<Unwinder>,
    /// Longest a refused allocation waits for the checkpoint that holds it.
    pub(crate) oom_wait: Duration,
    /// This process's rank: the program's, else a launcher's.
    pub(crate) rank: Option<RankInfo>,
    /// The run every process of it shares: `HIGHWATER_RUN_ID`, else the program's, else the
    /// launcher's.
    pub(crate) run_id: Option<String>,
}

impl Settings {
    /// Joins the builder's choices and the environment: the environment wins.
    pub(crate) fn resolve(requested: &Requested, env: &EnvConfig) -> Settings {
        fn pick<T: Clone>(env: &Option<T>, code: &Option<T>, default: T) -> T {
            env.clone().or_else(|| code.clone()).unwrap_or(default)
        }
        Settings {
            enabled: env.enabled.unwrap_or(true),
            output: pick(&env.output, &requested.output, DEFAULT_OUTPUT.into()),
            write: requested.write.unwrap_or(true),
            signals: pick(&env.signals, &requested.signals, false),
            html: pick(&env.html, &requested.html, true),
            alloc_log: env
                .alloc_log
                .clone()
                .or_else(|| requested.alloc_log.clone()),
            capture_mode: pick(
                &env.capture_mode,
                &requested.capture_mode,
                CaptureMode::default(),
            ),
            ring_events: pick(
                &env.ring_events,
                &requested.ring_events,
                DEFAULT_RING_EVENTS,
            ),
            force_monotonic: env.force_monotonic.unwrap_or(false),
            checkpoint_every: env
                .checkpoint
                .unwrap_or(
                    requested
                        .checkpoint_every
                        .or(Some(crate::checkpoint::DEFAULT_CHECKPOINT_INTERVAL)),
                )
                .filter(|every| !every.is_zero()),
            sample_bytes: pick(
                &env.sample_bytes,
                &requested.sample_bytes,
                DEFAULT_SAMPLE_BYTES,
            ),
            cuda: pick(&env.cuda, &requested.cuda, true),
            unwinder: env.unwinder,
            max_threads: pick(
                &env.max_threads,
                &requested.max_threads,
                crate::capture::DEFAULT_THREAD_LIMIT,
            ),
            oom_wait: requested
                .oom_wait
                .unwrap_or(crate::capture::oom::OOM_CHECKPOINT_WAIT),
            rank: requested
                .rank
                .map(|(rank, world_size)| RankInfo {
                    rank,
                    world_size,
                    local_rank: None,
                    launcher: "builder",
                })
                .or_else(|| env.launch.rank.clone()),
            run_id: env
                .launch
                .explicit_run_id
                .clone()
                .or_else(|| requested.run_id.clone())
                .or_else(|| env.launch.launcher_run_id.clone()),
        }
    }
}

impl EnvConfig {
    /// Reads the process environment.
    pub(crate) fn read() -> Result<EnvConfig, Error> {
        EnvConfig::parse(|name| std::env::var_os(name))
    }

    /// Parses the variables `var` returns.
    pub(crate) fn parse(var: impl Fn(&str) -> Option<OsString>) -> Result<EnvConfig, Error> {
        let invalid = |name: &'static str, value: &OsStr, expected: &'static str| Error::Config {
            var: name,
            value: value.to_string_lossy().into_owned(),
            expected,
        };
        let text = |name: &'static str, expected: &'static str| -> Result<Option<String>, Error> {
            var(name)
                .map(|value| {
                    value
                        .to_str()
                        .map(str::to_owned)
                        .ok_or_else(|| invalid(name, &value, expected))
                })
                .transpose()
        };
        let switch = |name: &'static str| -> Result<Option<bool>, Error> {
            const EXPECTED: &str = "on or off (1/0, true/false)";
            text(name, EXPECTED)?
                .map(|value| {
                    parse_switch(&value).ok_or_else(|| invalid(name, value.as_ref(), EXPECTED))
                })
                .transpose()
        };
        // A count that `check` accepts.
        let checked = |name: &'static str,
                       expected: &'static str,
                       check: fn(usize) -> Result<(), String>|
         -> Result<Option<usize>, Error> {
            text(name, expected)?
                .map(|value| {
                    value
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|count| check(*count).is_ok())
                        .ok_or_else(|| invalid(name, value.as_ref(), expected))
                })
                .transpose()
        };
        let path = |name: &'static str| -> Result<Option<PathBuf>, Error> {
            match var(name) {
                Some(value) if value.to_string_lossy().trim().is_empty() => {
                    Err(invalid(name, &value, "a file path"))
                }
                value => Ok(value.map(PathBuf::from)),
            }
        };
        let ring_events = checked(
            "HIGHWATER_RING_EVENTS",
            "a power of two between 1024 and 16777216",
            check_ring_events,
        )?;
        let unwinder = {
            const NAME: &str = "HIGHWATER_UNWINDER";
            const EXPECTED: &str = "frame-pointers or eh-frame";
            text(NAME, EXPECTED)?
                .map(|value| match value.trim() {
                    crate::model::FRAME_POINTERS_UNWINDER => Ok(Unwinder::FramePointers),
                    crate::model::EH_FRAME_UNWINDER => Ok(Unwinder::EhFrame),
                    _ => Err(invalid(NAME, value.as_ref(), EXPECTED)),
                })
                .transpose()?
        };
        let force_monotonic = {
            const NAME: &str = "HIGHWATER_CLOCK";
            const EXPECTED: &str = "tsc or monotonic";
            text(NAME, EXPECTED)?
                .map(|value| match value.trim() {
                    "tsc" => Ok(false),
                    "monotonic" => Ok(true),
                    _ => Err(invalid(NAME, value.as_ref(), EXPECTED)),
                })
                .transpose()?
        };
        let capture_mode = {
            const NAME: &str = "HIGHWATER_CAPTURE";
            const EXPECTED: &str = "lossless or drop";
            text(NAME, EXPECTED)?
                .map(|value| {
                    value
                        .parse::<CaptureMode>()
                        .ok()
                        .ok_or_else(|| invalid(NAME, value.as_ref(), EXPECTED))
                })
                .transpose()?
        };
        let checkpoint = {
            const NAME: &str = "HIGHWATER_CHECKPOINT";
            const EXPECTED: &str = "seconds between checkpoints (0.001 to 86400), or 0 for none";
            text(NAME, EXPECTED)?
                .map(|value| {
                    crate::checkpoint::parse_interval(&value)
                        .ok_or_else(|| invalid(NAME, value.as_ref(), EXPECTED))
                })
                .transpose()?
        };
        let sample_bytes = {
            const NAME: &str = "HIGHWATER_SAMPLE_BYTES";
            const EXPECTED: &str = "a whole number of bytes (0: sampling off, 1: every allocation)";
            text(NAME, EXPECTED)?
                .map(|value| {
                    value
                        .trim()
                        .parse::<u64>()
                        .map_err(|_| invalid(NAME, value.as_ref(), EXPECTED))
                })
                .transpose()?
        };
        let max_threads = checked(
            "HIGHWATER_MAX_THREADS",
            "a number of threads between 1 and 4096",
            check_max_threads,
        )?;
        Ok(EnvConfig {
            launch: crate::rank::detect(&var)?,
            capture_mode,
            max_threads,
            checkpoint,
            sample_bytes,
            enabled: switch("HIGHWATER")?,
            output: path("HIGHWATER_OUT")?,
            alloc_log: path("HIGHWATER_ALLOC_LOG")?,
            html: switch("HIGHWATER_HTML")?,
            ring_events,
            force_monotonic,
            signals: switch("HIGHWATER_SIGNALS")?,
            cuda: switch("HIGHWATER_CUDA")?,
            unwinder,
        })
    }
}

/// Checks a ring size: a power of two from 1024 to 16 Mi events.
pub(crate) fn check_ring_events(events: usize) -> Result<(), String> {
    if events.is_power_of_two() && (1 << 10..=1 << 24).contains(&events) {
        Ok(())
    } else {
        Err(format!(
            "{events} is not a power of two between 1024 and 16777216"
        ))
    }
}

/// Checks a limit on threads recording at once: 1 to the ring table's size.
pub(crate) fn check_max_threads(threads: usize) -> Result<(), String> {
    if (1..=crate::capture::MAX_THREADS).contains(&threads) {
        Ok(())
    } else {
        Err(format!(
            "{threads} is not between 1 and {}",
            crate::capture::MAX_THREADS
        ))
    }
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

    fn parse_os(vars: &[(&str, OsString)]) -> Result<EnvConfig, Error> {
        EnvConfig::parse(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.clone())
        })
    }

    fn parse(vars: &[(&str, &str)]) -> Result<EnvConfig, Error> {
        let vars: Vec<(&str, OsString)> = vars.iter().map(|(k, v)| (*k, (*v).into())).collect();
        parse_os(&vars)
    }

    #[test]
    fn defaults_record_with_no_variables() {
        let settings = Settings::resolve(&Requested::default(), &parse(&[]).unwrap());
        assert!(settings.enabled);
        assert_eq!(settings.output, PathBuf::from(DEFAULT_OUTPUT));
        assert_eq!(settings.ring_events, DEFAULT_RING_EVENTS);
        assert!(settings.write && !settings.signals && settings.html);
        assert_eq!(settings.alloc_log, None);
        assert_eq!(settings.sample_bytes, 512 * 1024);
    }

    #[test]
    fn off_disables_and_out_sets_the_path() {
        let config = parse(&[("HIGHWATER", "off"), ("HIGHWATER_OUT", "x/p.json")]).unwrap();
        assert_eq!(config.enabled, Some(false));
        assert_eq!(config.output, Some(PathBuf::from("x/p.json")));
    }

    #[test]
    fn the_environment_overrides_every_builder_setting() {
        let requested = Requested {
            output: Some("code.json".into()),
            ring_events: Some(1 << 12),
            capture_mode: Some(CaptureMode::Lossless),
            write: Some(true),
            signals: Some(false),
            html: Some(false),
            alloc_log: Some("code.alloc".into()),
            checkpoint_every: Some(Duration::from_secs(3)),
            sample_bytes: Some(4096),
            cuda: Some(true),
            max_threads: Some(64),
            oom_wait: None,
            rank: Some((1, 4)),
            run_id: Some("code".into()),
        };
        let env = parse(&[
            ("HIGHWATER_OUT", "env.json"),
            ("HIGHWATER_RING_EVENTS", "2048"),
            ("HIGHWATER_SIGNALS", "on"),
            ("HIGHWATER_HTML", "1"),
            ("HIGHWATER_ALLOC_LOG", "env.alloc"),
            ("HIGHWATER_CAPTURE", "drop"),
            ("HIGHWATER_CHECKPOINT", "7"),
            ("HIGHWATER_SAMPLE_BYTES", "0"),
            ("HIGHWATER_CUDA", "off"),
            ("HIGHWATER_MAX_THREADS", "2048"),
            ("HIGHWATER_RUN_ID", "env"),
        ])
        .unwrap();
        let settings = Settings::resolve(&requested, &env);
        assert!(!settings.cuda);
        assert_eq!(settings.max_threads, 2048);
        assert_eq!(settings.run_id.as_deref(), Some("env"));
        assert_eq!(settings.output, PathBuf::from("env.json"));
        assert_eq!(settings.ring_events, 2048);
        assert!(settings.signals);
        assert!(settings.html);
        assert_eq!(settings.alloc_log, Some(PathBuf::from("env.alloc")));
        assert_eq!(settings.capture_mode, CaptureMode::DropWhenFull);
        assert_eq!(settings.checkpoint_every, Some(Duration::from_secs(7)));
        assert_eq!(
            settings.sample_bytes, 0,
            "HIGHWATER_SAMPLE_BYTES=0 turns sampling off"
        );
        // An unset variable leaves the builder's choice.
        let settings = Settings::resolve(&requested, &EnvConfig::default());
        assert_eq!(settings.output, PathBuf::from("code.json"));
        assert_eq!(settings.ring_events, 1 << 12);
        assert_eq!(settings.alloc_log, Some(PathBuf::from("code.alloc")));
        assert_eq!(settings.checkpoint_every, Some(Duration::from_secs(3)));
        assert_eq!(settings.sample_bytes, 4096);
    }

    #[test]
    fn the_programs_rank_wins_over_a_launchers_and_run_ids_fall_back_to_the_launchers() {
        let env = parse(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("TORCHELASTIC_RUN_ID", "j1"),
        ])
        .unwrap();
        let launched = Settings::resolve(&Requested::default(), &env);
        let rank = launched.rank.unwrap();
        assert_eq!(
            (rank.rank, rank.world_size, rank.local_rank),
            (2, 4, Some(0))
        );
        assert_eq!(rank.launcher, "torchrun");
        assert_eq!(launched.run_id.as_deref(), Some("torchrun:j1"));
        let requested = Requested {
            rank: Some((5, 6)),
            run_id: Some("mine".into()),
            ..Requested::default()
        };
        let said = Settings::resolve(&requested, &env);
        let rank = said.rank.unwrap();
        assert_eq!(
            (rank.rank, rank.world_size, rank.launcher),
            (5, 6, "builder")
        );
        assert_eq!(said.run_id.as_deref(), Some("mine"));
        let alone = Settings::resolve(&Requested::default(), &parse(&[]).unwrap());
        assert_eq!((alone.rank, alone.run_id), (None, None));
    }

    #[test]
    fn checkpoints_default_to_every_ten_seconds_and_zero_turns_them_off() {
        let secs = Duration::from_secs;
        let resolve = |code: Option<Duration>, env: &[(&str, &str)]| {
            let requested = Requested {
                checkpoint_every: code,
                ..Requested::default()
            };
            Settings::resolve(&requested, &parse(env).unwrap()).checkpoint_every
        };
        assert_eq!(resolve(None, &[]), Some(secs(10)));
        assert_eq!(resolve(None, &[("HIGHWATER_CHECKPOINT", "0")]), None);
        assert_eq!(resolve(Some(secs(3)), &[]), Some(secs(3)));
        assert_eq!(resolve(Some(Duration::ZERO), &[]), None);
        assert_eq!(
            resolve(Some(secs(3)), &[("HIGHWATER_CHECKPOINT", "7")]),
            Some(secs(7))
        );
        assert_eq!(
            resolve(Some(secs(3)), &[("HIGHWATER_CHECKPOINT", "0")]),
            None
        );
        assert_eq!(
            resolve(Some(Duration::ZERO), &[("HIGHWATER_CHECKPOINT", "1")]),
            Some(secs(1))
        );
        assert_eq!(
            parse(&[("HIGHWATER_CHECKPOINT", "0")]).unwrap().checkpoint,
            Some(None)
        );
    }

    #[test]
    fn non_utf8_paths_are_kept_byte_for_byte() {
        use std::os::unix::ffi::OsStringExt;
        let name = OsString::from_vec(b"out-\xff\xfe.json".to_vec());
        let config = parse_os(&[
            ("HIGHWATER_OUT", name.clone()),
            ("HIGHWATER_ALLOC_LOG", name.clone()),
        ])
        .unwrap();
        assert_eq!(config.output.unwrap().into_os_string(), name);
        assert_eq!(config.alloc_log.unwrap().into_os_string(), name);
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
            ("HIGHWATER_CHECKPOINT", "often"),
            ("HIGHWATER_SAMPLE_BYTES", "-1"),
            ("HIGHWATER_SAMPLE_BYTES", "512k"),
            ("HIGHWATER_CHECKPOINT", "-1"),
            ("HIGHWATER_UNWINDER", "dwarf"),
        ] {
            let message = parse(&[(var, value)]).unwrap_err().to_string();
            assert!(message.contains(var), "{message}");
            assert!(message.contains(value), "{message}");
        }
    }

    #[test]
    fn the_unwinder_comes_from_the_variable() {
        assert_eq!(parse(&[]).unwrap().unwinder, None);
        let forced = |value| parse(&[("HIGHWATER_UNWINDER", value)]).unwrap().unwinder;
        assert_eq!(forced("eh-frame"), Some(Unwinder::EhFrame));
        assert_eq!(forced("frame-pointers"), Some(Unwinder::FramePointers));
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

    #[test]
    fn a_non_utf8_switch_is_an_error_not_a_panic() {
        use std::os::unix::ffi::OsStringExt;
        let value = OsString::from_vec(vec![0xff]);
        let message = parse_os(&[("HIGHWATER", value)]).unwrap_err().to_string();
        assert!(message.contains("HIGHWATER"), "{message}");
    }
}

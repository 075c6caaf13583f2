//! [`Warning`]: what the reader of a profile should know, as data.
//!
//! A profile stores each warning as its stable code and its figures (`{"code":
//! "dropped_events", "events": 7}`), never as a sentence. The sentence is made in one place, the
//! [`Display`](fmt::Display) impl, so every output (the `highwater` command, the HTML report, the
//! Chrome trace) words each notice the same way, and a program can match on the variant.

use std::fmt;

use serde::Serialize;
#[cfg(feature = "read")]
use serde::{Deserialize, Deserializer};

use super::CaptureMode;
use crate::units::format_bytes_delta;

/// Why a session did not record device memory ([`Warning::DeviceMemoryNotRecorded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NotRecordedReason {
    /// Turned off (`HIGHWATER_CUDA=off`).
    Disabled,
    /// No driver library could be loaded.
    NoDriver,
    /// The driver's profiling library (CUPTI) could not be loaded.
    NoProfilingLibrary,
    /// The driver loaded but found no device (or could not start).
    NoDevice,
    /// Another profiler holds the profiling interface, which allows one subscriber only.
    ProfilerAttached,
    /// The profiling interface refused for another reason.
    Refused,
}

impl fmt::Display for NotRecordedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NotRecordedReason::Disabled => "turned off (HIGHWATER_CUDA=off)",
            NotRecordedReason::NoDriver => "no driver library could be loaded",
            NotRecordedReason::NoProfilingLibrary => {
                "the profiling library (CUPTI, libcupti.so) could not be loaded"
            }
            NotRecordedReason::NoDevice => "the driver found no device",
            NotRecordedReason::ProfilerAttached => {
                "another profiler holds CUPTI, which allows one subscriber only"
            }
            NotRecordedReason::Refused => "CUPTI refused the subscription",
        })
    }
}

/// What drops do to the figures, the same in both modes.
const CONSEQUENCE: &str = "a dropped allocation is missing from the figures and a dropped free \
     leaves its block counted as live, so figures can be too low or too high";

/// Something the reader of a profile should know: events were lost, memory grows, a series
/// was sampled.
///
/// Serialised with its [`code`](Warning::code) under `"code"` and its figures beside it.
///
/// # Examples
///
/// ```
/// use highwater_profile::Warning;
///
/// use highwater_profile::CaptureMode;
///
/// let warning = Warning::DroppedEvents { events: 7, mode: CaptureMode::DropWhenFull };
/// assert_eq!(warning.code(), "dropped_events");
/// assert_eq!(
///     serde_json::to_string(&warning).unwrap(),
///     r#"{"code":"dropped_events","events":7,"mode":"drop_when_full"}"#
/// );
/// assert!(warning.to_string().starts_with("7 events were dropped"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[serde(tag = "code", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Warning {
    /// Events were lost while recording. In drop mode a full ring drops; in lossless mode only
    /// the cases where a thread cannot wait do (see [`CaptureMode::Lossless`]). A lost
    /// allocation leaves its bytes out of every figure; a lost free leaves its block counted as
    /// live until the end. So figures can be too high as well as too low.
    DroppedEvents {
        /// Events lost ([`Summary::dropped_events`](super::Summary::dropped_events)).
        events: u64,
        /// The session's capture mode, which decides where the drops can have come from
        /// (profiles written before it was recorded: [`CaptureMode::DropWhenFull`]).
        #[serde(default = "CaptureMode::before_modes")]
        mode: CaptureMode,
    },
    /// Live memory grows across iterations: something allocated each iteration is kept.
    GrowingResidual {
        /// The top-level span that marks iterations.
        span: String,
        /// Iterations the rule looked at (the last ones).
        window: u64,
        /// Of those, how many ended with more live bytes than the one before.
        grew: u64,
        /// Growth over the window, in bytes.
        total_bytes: i64,
        /// Average growth per iteration over the window, in bytes.
        per_iteration_bytes: i64,
        /// Iterations the run had (0 in profiles written before this was recorded).
        #[serde(default)]
        iterations: u64,
        /// Growth over the whole run, from the first iteration's end to the last's, in bytes:
        /// what was kept in all, not only over the window.
        #[serde(default)]
        run_growth_bytes: i64,
    },
    /// The run had more iterations than a profile lists: [`Profile::iterations`] is an even
    /// sample, the last ones included.
    ///
    /// [`Profile::iterations`]: super::Profile::iterations
    IterationsSampled {
        /// The top-level span that marks iterations.
        span: String,
        /// Iterations the run had.
        iterations: u64,
        /// Iterations the profile lists.
        listed: u64,
    },
    /// The allocation log asked for could not be written in full.
    AllocLogIncomplete {
        /// The log's path.
        path: String,
        /// What went wrong.
        error: String,
    },
    /// Recording was disabled (`HIGHWATER=off`): the profile is empty.
    RecordingDisabled,
    /// The profile is a checkpoint (`meta.partial`) of a run that had not finished when it was
    /// written: its figures cover the run's first `recorded_ns`. If the run died, it is what
    /// the run left.
    Partial {
        /// Run time the checkpoint covers, ns.
        recorded_ns: u64,
    },
    /// Spans nested deeper than [`MAX_SPAN_DEPTH`](super::MAX_SPAN_DEPTH) are counted in one
    /// [`FOLDED_SPANS`](super::FOLDED_SPANS) node under the deepest kept one.
    SpansTooDeep {
        /// Span instances folded.
        instances: u64,
        /// The depth limit.
        max_depth: u32,
    },
    /// Spans at paths past the first [`MAX_SPAN_NODES`](super::MAX_SPAN_NODES) are counted in
    /// one top-level [`FOLDED_SPANS`](super::FOLDED_SPANS) node.
    SpansTooMany {
        /// Span instances folded.
        instances: u64,
        /// The node limit.
        max_nodes: u64,
    },
    /// Op or dtype names arrived after the process-wide name table was full; they are shown
    /// under one placeholder name.
    NamesFolded {
        /// Names folded during the session.
        names: u64,
        /// The table's limit.
        max_names: u64,
        /// The placeholder they are shown as.
        shown_as: String,
    },
    /// Devices named after the process-wide device table was full are shown as one.
    DevicesFolded {
        /// Devices folded during the session.
        devices: u64,
        /// The table's limit.
        max_devices: u64,
        /// The device they are shown as.
        shown_as: String,
    },
    /// Tensor shapes seen after the process-wide shape table was full are not recorded: their
    /// rows show no shape.
    ShapesFolded {
        /// Shapes not recorded during the session.
        shapes: u64,
        /// The table's limit.
        max_shapes: u64,
    },
    /// A checkpoint written on a signal the program handles itself; the session was still
    /// recording, and its own end writes the whole run.
    Checkpoint,
    /// Allocations were refused (the heap allocator returned null, or a device pool refused an
    /// admission); [`Profile::oom_events`](super::Profile::oom_events) says what was live then.
    OutOfMemory {
        /// Refusals in the run ([`Summary::oom_count`](super::Summary::oom_count)).
        refusals: u64,
        /// The first one: its device, the bytes it asked for and when, ns into the run.
        device: String,
        /// Bytes the first refusal asked for.
        requested_bytes: u64,
        /// When the first refusal happened, ns since the session started.
        at_ns: u64,
    },
    /// Most call-site samples have a stack that does not start in highwater's allocator hook,
    /// as every walk by trusted frame pointers or by call-frame information does: neither could
    /// walk them (a program built without frame pointers recorded by a highwater that only
    /// walked frame pointers, or one without unwind tables). Release builds then give empty
    /// stacks, debug builds a frame or two of outer code; the sites still hold their bytes,
    /// but cannot say where they were allocated.
    StacksWithoutHook {
        /// Such samples
        /// ([`SiteSampling::stacks_without_hook`](super::SiteSampling::stacks_without_hook)).
        without_hook: u64,
        /// All samples ([`SiteSampling::samples`](super::SiteSampling::samples)).
        samples: u64,
    },
    /// The collector merged events after newer events of other threads
    /// ([`CaptureStats::late_events`](super::CaptureStats::late_events)): their threads
    /// published them later than the merge allowed for. Each was applied at its own time, but a
    /// peak judged in between may be off by its size.
    LateEvents {
        /// Events merged late.
        events: u64,
    },
    /// Threads started while every ring the session may use was owned by a live thread had
    /// their events dropped (they are in [`Warning::DroppedEvents`]'s count too).
    ThreadLimit {
        /// Events dropped so.
        events: u64,
        /// The session's limit on threads recording at once.
        limit: u64,
    },
    /// The session was built to record a device's memory through its driver's profiling
    /// interface (the `cuda` feature) but could not: device memory is missing from every
    /// figure.
    DeviceMemoryNotRecorded {
        /// The interface (`"cuda"`).
        api: String,
        /// Why.
        reason: NotRecordedReason,
        /// What the system said, when it said something (a library's error, an error code).
        #[serde(default)]
        detail: String,
    },
    /// The output path asked for was being written by another live process (another rank of
    /// the run with the same name, or a second copy of the program), so this profile went
    /// beside it, under a name of its own, instead of replacing that process's profile.
    OutputTaken {
        /// The path asked for.
        wanted: String,
        /// The path this profile was written to.
        written: String,
        /// The process holding the path asked for, when it said (its id and host).
        #[serde(default)]
        holder: String,
    },
    /// A warning from a profile written before warnings were typed: its sentence, as written.
    Note {
        /// The sentence.
        text: String,
    },
}

impl Warning {
    /// The warning's stable code, as written in profiles (`"dropped_events"`, …).
    pub fn code(&self) -> &'static str {
        match self {
            Warning::DroppedEvents { .. } => "dropped_events",
            Warning::GrowingResidual { .. } => "growing_residual",
            Warning::IterationsSampled { .. } => "iterations_sampled",
            Warning::AllocLogIncomplete { .. } => "alloc_log_incomplete",
            Warning::RecordingDisabled => "recording_disabled",
            Warning::Partial { .. } => "partial",
            Warning::SpansTooDeep { .. } => "spans_too_deep",
            Warning::SpansTooMany { .. } => "spans_too_many",
            Warning::NamesFolded { .. } => "names_folded",
            Warning::DevicesFolded { .. } => "devices_folded",
            Warning::ShapesFolded { .. } => "shapes_folded",
            Warning::Checkpoint => "checkpoint",
            Warning::OutOfMemory { .. } => "out_of_memory",
            Warning::StacksWithoutHook { .. } => "stacks_without_hook",
            Warning::LateEvents { .. } => "late_events",
            Warning::DeviceMemoryNotRecorded { .. } => "device_memory_not_recorded",
            Warning::ThreadLimit { .. } => "thread_limit",
            Warning::OutputTaken { .. } => "output_taken",
            Warning::Note { .. } => "note",
        }
    }
}

impl fmt::Display for Warning {
    /// The one English rendering of each warning.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::DroppedEvents {
                events,
                mode: CaptureMode::Lossless,
            } => write!(
                f,
                "{events} events were dropped although capture was lossless, where only calls \
                 that cannot wait for the collector drop (on highwater's own threads, in a \
                 forked child, after an exiting thread handed back its ring, with every ring \
                 taken, or inside a signal handler that interrupted a record): {CONSEQUENCE}"
            ),
            Warning::DroppedEvents { events, .. } => write!(
                f,
                "{events} events were dropped while recording (drop mode: full rings, or \
                 threads that had exited): {CONSEQUENCE}"
            ),
            Warning::GrowingResidual {
                span,
                window,
                grew,
                total_bytes,
                per_iteration_bytes,
                iterations,
                run_growth_bytes,
            } => {
                write!(
                    f,
                    "live memory grows across iterations of span `{span}`: {} per iteration on \
                     average, {grew} of the last {window} iterations grew ({} over those \
                     {window}",
                    format_bytes_delta(*per_iteration_bytes),
                    format_bytes_delta(*total_bytes),
                )?;
                if *iterations > *window {
                    write!(
                        f,
                        "; {} over all {iterations}, from the first iteration's end to the \
                         last's",
                        format_bytes_delta(*run_growth_bytes)
                    )?;
                }
                f.write_str("); something allocated each iteration is kept")
            }
            Warning::IterationsSampled {
                span,
                iterations,
                listed,
            } => write!(
                f,
                "{iterations} iterations of span `{span}`: the profile lists an even sample of \
                 {listed} of them, the last ones included"
            ),
            Warning::AllocLogIncomplete { path, error } => write!(
                f,
                "the allocation log {path} could not be written ({error}); it is incomplete"
            ),
            Warning::RecordingDisabled => {
                f.write_str("recording was disabled (HIGHWATER=off); nothing was recorded")
            }
            Warning::Partial { recorded_ns } => write!(
                f,
                "this profile is a checkpoint taken {} into a run that had not finished: its \
                 figures stop there (if the run was killed, this is what it left)",
                crate::units::format_duration_ns(*recorded_ns)
            ),
            Warning::SpansTooDeep {
                instances,
                max_depth,
            } => write!(
                f,
                "{instances} span instances nested deeper than {max_depth} levels are counted \
                 in one `{}` node",
                super::FOLDED_SPANS
            ),
            Warning::SpansTooMany {
                instances,
                max_nodes,
            } => write!(
                f,
                "{instances} span instances at paths past the first {max_nodes} are counted in \
                 one top-level `{}` node",
                super::FOLDED_SPANS
            ),
            Warning::NamesFolded {
                names,
                max_names,
                shown_as,
            } => write!(
                f,
                "{names} op or dtype names arrived after the name table was full ({max_names} \
                 names); they are shown as `{shown_as}`"
            ),
            Warning::Checkpoint => f.write_str(
                "checkpoint written on a signal the program handles; the session was still \
                 recording",
            ),
            Warning::OutOfMemory {
                refusals,
                device,
                requested_bytes,
                at_ns,
            } => write!(
                f,
                "{refusals} allocation{} refused: the first asked {device} for {} at {}; see \
                 the out-of-memory events for what was live then",
                if *refusals == 1 { " was" } else { "s were" },
                crate::units::format_bytes(*requested_bytes),
                crate::units::format_duration_ns(*at_ns)
            ),
            Warning::StacksWithoutHook {
                without_hook,
                samples,
            } => write!(
                f,
                "{without_hook} of {samples} call-site samples have a stack that does not start \
                 at highwater's allocator hook (empty, or in unrelated code): the program keeps \
                 neither frame pointers nor unwind tables that could walk them, so the sites \
                 hold their bytes but not where they were allocated; build with \
                 RUSTFLAGS=\"-C force-frame-pointers=yes\" (or keep unwind tables)"
            ),
            Warning::LateEvents { events } => write!(
                f,
                "{events} events were merged after newer events of other threads (published \
                 later than the merge allowed for, as when two cores' clocks disagree): each \
                 counts at its own time, but a peak judged in between may be off by its size"
            ),
            Warning::DevicesFolded {
                devices,
                max_devices,
                shown_as,
            } => write!(
                f,
                "{devices} devices were named after the first {max_devices}: their memory is \
                 counted as one device, \"{shown_as}\""
            ),
            Warning::ShapesFolded { shapes, max_shapes } => write!(
                f,
                "{shapes} tensor shapes were seen after the first {max_shapes}: their rows show \
                 no shape"
            ),
            Warning::ThreadLimit { events, limit } => write!(
                f,
                "{events} events were dropped because more than {limit} threads recorded at \
                 once; HIGHWATER_MAX_THREADS (or SessionBuilder::max_threads) raises the limit, \
                 up to 4096"
            ),
            Warning::DeviceMemoryNotRecorded {
                api,
                reason,
                detail,
            } => {
                let api = if api == "cuda" { "CUDA" } else { api };
                write!(f, "{api} device memory was not recorded: {reason}")?;
                if !detail.is_empty() {
                    write!(f, " ({detail})")?;
                }
                Ok(())
            }
            Warning::OutputTaken {
                wanted,
                written,
                holder,
            } => {
                write!(f, "{wanted} was being written by another live process")?;
                if !holder.is_empty() {
                    write!(f, " ({holder})")?;
                }
                write!(
                    f,
                    ", so this profile was written beside it as {written} rather than replace it"
                )
            }
            Warning::Note { text } => f.write_str(text),
        }
    }
}

/// Reads [`Profile::warnings`](super::Profile::warnings): typed warnings, the plain sentences
/// profiles held before warnings had a type (as [`Warning::Note`]), and — by the compatibility
/// rule of [`SCHEMA`](super::SCHEMA) — warnings of codes a newer writer added (as a
/// [`Warning::Note`] that shows the code and its figures).
#[cfg(feature = "read")]
pub(super) fn deserialize_list<'de, D>(deserializer: D) -> Result<Vec<Warning>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Stored {
        Typed(Warning),
        Sentence(String),
        Newer(serde_json::Map<String, serde_json::Value>),
    }
    let stored = Vec::<Stored>::deserialize(deserializer)?;
    Ok(stored
        .into_iter()
        .map(|warning| match warning {
            Stored::Typed(warning) => warning,
            Stored::Sentence(text) => Warning::Note { text },
            Stored::Newer(mut fields) => {
                let code = fields
                    .remove("code")
                    .and_then(|code| code.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "unknown".to_string());
                Warning::Note {
                    text: format!(
                        "warning `{code}` from a newer highwater: {}",
                        serde_json::Value::Object(fields)
                    ),
                }
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_warning() -> Vec<Warning> {
        vec![
            Warning::DroppedEvents {
                events: 3,
                mode: CaptureMode::Lossless,
            },
            Warning::GrowingResidual {
                span: "step".into(),
                window: 16,
                grew: 15,
                total_bytes: 16 << 20,
                per_iteration_bytes: 1 << 20,
                iterations: 200,
                run_growth_bytes: 199 << 20,
            },
            Warning::IterationsSampled {
                span: "step".into(),
                iterations: 200_000,
                listed: 4096,
            },
            Warning::AllocLogIncomplete {
                path: "run.alloc".into(),
                error: "disk full".into(),
            },
            Warning::RecordingDisabled,
            Warning::Partial {
                recorded_ns: 1_500_000_000,
            },
            Warning::SpansTooDeep {
                instances: 9936,
                max_depth: 64,
            },
            Warning::SpansTooMany {
                instances: 50,
                max_nodes: 8192,
            },
            Warning::NamesFolded {
                names: 3,
                max_names: 65536,
                shown_as: "(more names)".into(),
            },
            Warning::Checkpoint,
            Warning::OutputTaken {
                wanted: "p.rank3.json".into(),
                written: "p.rank3.pid42.json".into(),
                holder: "pid 41 on node7".into(),
            },
            Warning::OutOfMemory {
                refusals: 2,
                device: "cuda:0".into(),
                requested_bytes: 3 << 30,
                at_ns: 2_000_000_000,
            },
            Warning::StacksWithoutHook {
                without_hook: 10_463,
                samples: 10_463,
            },
            Warning::LateEvents { events: 2 },
            Warning::Note {
                text: "an old sentence".into(),
            },
        ]
    }

    #[test]
    fn each_warning_is_written_with_its_code_and_read_back() {
        for warning in every_warning() {
            let json = serde_json::to_value(&warning).unwrap();
            assert_eq!(json["code"], warning.code(), "{json}");
            let back: Warning = serde_json::from_value(json).unwrap();
            assert_eq!(back, warning);
        }
    }

    #[test]
    fn the_leak_sentence_uses_binary_units() {
        let text = every_warning()[1].to_string();
        assert_eq!(
            text,
            "live memory grows across iterations of span `step`: +1.0 MiB per iteration on \
             average, 15 of the last 16 iterations grew (+16.0 MiB over those 16; +199.0 MiB \
             over all 200, from the first iteration's end to the last's); something allocated \
             each iteration is kept"
        );
    }

    #[test]
    fn a_leak_warning_from_before_the_run_total_reads_back_without_it() {
        let old = r#"{"code":"growing_residual","span":"step","window":16,"grew":16,
            "total_bytes":16,"per_iteration_bytes":1}"#;
        let warning: Warning = serde_json::from_str(old).unwrap();
        let text = warning.to_string();
        assert!(text.contains("(+16 B over those 16); something"), "{text}");
    }

    #[test]
    fn the_drop_notice_says_figures_can_be_off_either_way() {
        let text = Warning::DroppedEvents {
            events: 1234,
            mode: CaptureMode::DropWhenFull,
        }
        .to_string();
        assert!(text.starts_with("1234 events were dropped while recording (drop mode"));
        assert!(text.contains("too low or too high"), "{text}");
    }

    #[test]
    fn the_drop_notice_of_a_lossless_session_names_the_cases_that_drop() {
        let text = Warning::DroppedEvents {
            events: 3,
            mode: CaptureMode::Lossless,
        }
        .to_string();
        assert!(text.starts_with("3 events were dropped although capture was lossless"));
        for case in [
            "own threads",
            "forked child",
            "handed back its ring",
            "signal handler",
        ] {
            assert!(text.contains(case), "{case}: {text}");
        }
        assert!(!text.contains("full rings"), "{text}");
        assert!(text.contains("too low or too high"), "{text}");
    }

    #[test]
    fn a_drop_notice_from_before_the_mode_was_recorded_reads_as_drop_mode() {
        let warning: Warning =
            serde_json::from_str(r#"{"code": "dropped_events", "events": 2}"#).unwrap();
        assert_eq!(
            warning,
            Warning::DroppedEvents {
                events: 2,
                mode: CaptureMode::DropWhenFull
            }
        );
    }

    #[test]
    fn sentences_from_older_profiles_load_as_notes() {
        #[derive(Deserialize)]
        struct List(#[serde(deserialize_with = "deserialize_list")] Vec<Warning>);
        let List(list) =
            serde_json::from_str(r#"["2 events were dropped", {"code": "recording_disabled"}]"#)
                .unwrap();
        assert_eq!(
            list,
            [
                Warning::Note {
                    text: "2 events were dropped".into()
                },
                Warning::RecordingDisabled
            ]
        );
        // A newer writer's code, and a field it added to a known one: both load.
        let List(newer) = serde_json::from_str(
            r#"[{"code": "from_the_future", "bytes": 5}, {"code": "dropped_events", "events": 2, "added": 1}]"#,
        )
        .unwrap();
        assert_eq!(
            newer,
            [
                Warning::Note {
                    text: "warning `from_the_future` from a newer highwater: {\"bytes\":5}".into()
                },
                Warning::DroppedEvents {
                    events: 2,
                    mode: CaptureMode::DropWhenFull
                }
            ]
        );
    }
}

//! The `highwater` command: argument parsing, one file per subcommand (`watch` has its own
//! module, `crate::watch`), and how failures map to exit codes. Subcommands only load profiles and call library functions.

mod args;
mod check;
mod diff;
mod export;
mod fit;
mod fit_page;
mod parse;
mod ranks;
mod replay;
mod simulate;
mod sites;
mod spans;
mod summary;
mod top;

use std::io::{self, Write};
use std::path::Path;

use highwater_profile::Profile;
use highwater_profile::ProfileError;

pub(crate) use args::Cli;
use args::Command;

/// Exit code for a profile that cannot be read: missing, empty, not JSON, wrong schema.
pub(crate) const EXIT_BAD_INPUT: u8 = 2;
/// Exit code for every other failure (an output that cannot be written).
pub(crate) const EXIT_FAILURE: u8 = 1;
/// Exit code of `simulate` and `fit` when the run does not fit the device (for CI).
pub(crate) const EXIT_DOES_NOT_FIT: u8 = 3;

/// Runs the parsed command.
pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Summary { profile, json } => summary::run(&profile, json),
        Command::Top {
            profile,
            limit,
            json,
        } => top::run(&profile, limit, json),
        Command::Sites {
            profile,
            limit,
            sort,
            category,
            site,
            frames,
            all_frames,
            json,
        } => sites::run(
            &profile,
            &crate::report::SiteQuery {
                limit,
                order: match sort {
                    args::SiteSort::Peak => crate::report::SiteOrder::Peak,
                    args::SiteSort::Allocated => crate::report::SiteOrder::Allocated,
                },
                category,
                site,
                frames: (!all_frames).then_some(frames),
            },
            json,
        ),
        Command::Spans { profile, json } => spans::run(&profile, json),
        Command::Diff {
            before,
            after,
            limit,
            json,
        } => diff::run(&before, &after, limit, json),
        Command::Export {
            profiles,
            run,
            format,
            output,
            max_events,
        } => export::run(
            &profiles,
            run.as_deref(),
            format,
            output.as_deref(),
            max_events,
        ),
        Command::Ranks {
            inputs,
            run,
            device,
            limit,
            grow,
            allocator,
            format,
            html,
        } => ranks::run(&ranks::Request {
            inputs: &inputs,
            run: run.as_deref(),
            device,
            limit,
            grow: &grow,
            allocator,
            html: html.as_deref(),
            json: format == args::RanksFormat::Json,
        }),
        Command::Check {
            profile,
            budgets,
            max_peak,
            max_peak_category,
            max_growth_per_iteration,
            warmup_iterations,
            max_dropped,
            baseline,
            max_regression,
        } => check::run(
            &profile,
            budgets.as_deref(),
            check::Budgets {
                max_peak,
                max_peak_category: max_peak_category.into_iter().collect(),
                max_growth_per_iteration,
                warmup_iterations,
                max_dropped,
                baseline,
                max_regression,
            },
        ),
        Command::Simulate {
            input,
            device,
            strategy,
            limit,
            stream,
            min_block,
            json,
        } => simulate::run(&simulate::Request {
            input: &input,
            device,
            strategy,
            limit,
            stream: stream.as_deref(),
            min_block,
            json,
        }),
        Command::Fit {
            input,
            device,
            grow,
            allocator,
            max_split_size_mb,
            limit,
            stream,
            scale,
            shard,
            min_block,
            html,
            json,
        } => {
            let edits = scale
                .into_iter()
                .fold(highwater_device::Edits::new(), |e, (c, f)| e.scale(c, f));
            let edits = shard.into_iter().fold(edits, |e, (c, n)| e.shard(c, n));
            fit::run(&fit::Request {
                input: &input,
                device,
                grow: &grow,
                allocator,
                max_split_size_mb,
                limit,
                stream: stream.as_deref(),
                edits,
                min_block,
                html: html.as_deref(),
                json,
            })
        }
        Command::Watch { profile, refresh } => crate::watch::run(&profile, refresh),
    }
}

/// The exit code for an error returned by [`run`].
pub(crate) fn exit_code(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<replay::DoesNotFit>().is_some() {
        return EXIT_DOES_NOT_FIT;
    }
    if error
        .downcast_ref::<highwater_profile::alloc_log::AllocLogError>()
        .is_some()
        || error.downcast_ref::<replay::InputError>().is_some()
        || error.downcast_ref::<check::BadBudget>().is_some()
        || error
            .downcast_ref::<highwater_profile::ranks::RanksError>()
            .is_some()
        || error
            .downcast_ref::<crate::report::SiteQueryError>()
            .is_some()
    {
        return EXIT_BAD_INPUT;
    }
    match error.downcast_ref::<ProfileError>() {
        Some(ProfileError::Write { .. }) | None => EXIT_FAILURE,
        Some(_) => EXIT_BAD_INPUT,
    }
}

/// The allocation log to read for `input` (a log, or a profile naming one; a relative log path
/// is tried as written, then beside the profile), and the profile when `input` is one.
fn locate_log(input: &Path) -> anyhow::Result<(std::path::PathBuf, Option<Profile>)> {
    // Never blocks on a FIFO without a writer (highwater's reader opens it non-blocking).
    if highwater_profile::alloc_log::AllocLog::is_log(input) {
        return Ok((input.to_path_buf(), None));
    }
    let profile = load(input)?;
    let named = profile.meta.alloc_log.clone().ok_or_else(|| {
        replay::InputError(format!(
            "profile {} has no allocation log; record one with HIGHWATER_ALLOC_LOG=path",
            input.display()
        ))
    })?;
    let named = std::path::PathBuf::from(named);
    let beside = input
        .parent()
        .map(|dir| dir.join(named.file_name().unwrap_or_default()));
    let path = match beside {
        Some(beside) if !named.exists() && beside.exists() => beside,
        _ => named,
    };
    Ok((path, Some(profile)))
}

/// Loads a profile; its errors already name the file and the problem. A checkpoint (a run
/// that had not finished, or died) is said so on standard error, whatever the command prints.
fn load(path: &Path) -> anyhow::Result<Profile> {
    let profile = Profile::load(path)?;
    if profile.meta.partial {
        let _ = writeln!(
            io::stderr(),
            "highwater: note: {} is a checkpoint of a run that had not finished (meta.partial); \
             its figures stop at {}",
            path.display(),
            highwater_profile::units::format_duration_ns(profile.summary.duration_ns)
        );
    }
    Ok(profile)
}

/// Writes `text` to standard output. A closed pipe (`highwater top p | head -1`) is not an
/// error: the reader has what it wanted.
fn emit(text: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(error) if error.kind() != io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(error).context("cannot write to standard output"))
        }
        _ => Ok(()),
    }
}

/// Writes `value` as pretty JSON and a newline to standard output.
fn emit_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    emit(&text)
}

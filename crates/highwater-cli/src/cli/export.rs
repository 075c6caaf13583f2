//! `highwater export`: an HTML report, a Chrome/Perfetto trace, PyTorch's memory snapshot
//! (from the run's allocation log) or a pprof profile of the call sites, from a profile.

use std::path::{Path, PathBuf};

use highwater_export::{chrome, html, pprof, torch};
use highwater_profile::alloc_log::AllocLog;
use highwater_profile::units::format_bytes;

use super::args::Format;

/// Exports the profile at `paths[0]` in `format` to `output` (a path, `-` for stdout, or the
/// default next to the profile); several profiles, or a directory, make the ranks page.
pub(crate) fn run(
    paths: &[PathBuf],
    run: Option<&str>,
    format: Format,
    output: Option<&Path>,
    max_events: usize,
) -> anyhow::Result<()> {
    let path = match paths {
        [one] if !one.is_dir() => one.as_path(),
        _ if format == Format::Html => return export_ranks(paths, run, output),
        [dir] => {
            return Err(super::replay::InputError(format!(
                "{} is a directory: --format {} exports one profile (a directory of rank \
                 profiles makes the ranks page, with --format html)",
                dir.display(),
                format.name()
            ))
            .into())
        }
        _ => {
            return Err(super::replay::InputError(format!(
                "--format {} exports one profile, and {} were given ({}, …): several rank \
                 profiles make the ranks page, with --format html",
                format.name(),
                paths.len(),
                paths[0].display()
            ))
            .into())
        }
    };
    if run.is_some() {
        return Err(super::replay::InputError(
            "--run picks a run among several rank profiles; one profile was given".to_string(),
        )
        .into());
    }
    if format == Format::Torch {
        return export_torch(path, output, max_events);
    }
    if format == Format::Pprof {
        return export_pprof(path, output);
    }
    let profile = super::load(path)?;
    if output == Some(Path::new("-")) {
        return super::emit(&match format {
            Format::Chrome => chrome::render(&profile),
            _ => html::render(&profile),
        });
    }
    let target = match (output, format) {
        (Some(output), _) => output.to_path_buf(),
        (None, Format::Chrome) => chrome::path_beside(path),
        (None, _) => html::path_beside(path),
    };
    match format {
        Format::Chrome => chrome::write(&profile, &target)?,
        _ => html::write(&profile, &target)?,
    }
    let size = std::fs::metadata(&target).map_or(0, |m| m.len());
    super::emit(&format!(
        "wrote {} ({})\n",
        target.display(),
        format_bytes(size)
    ))
}

/// Writes the ranks page of the rank profiles `paths` (files or directories).
fn export_ranks(paths: &[PathBuf], run: Option<&str>, output: Option<&Path>) -> anyhow::Result<()> {
    let comparison = highwater_profile::ranks::compare(paths, &super::ranks::options(run, true))?;
    if output == Some(Path::new("-")) {
        return super::emit(&html::ranks::render(&comparison, None));
    }
    let target = match output {
        Some(output) => output.to_path_buf(),
        None => {
            let first = &paths[0];
            let dir = if first.is_dir() {
                first.as_path()
            } else {
                first.parent().unwrap_or(Path::new(""))
            };
            dir.join("highwater-ranks.html")
        }
    };
    html::ranks::write(&comparison, None, &target)?;
    let size = std::fs::metadata(&target).map_or(0, |m| m.len());
    super::emit(&format!(
        "wrote {} ({}): {} ranks of run {}\n",
        target.display(),
        format_bytes(size),
        comparison.rows.len(),
        crate::report::clean(&comparison.run.label)
    ))
}

/// Writes PyTorch's memory snapshot of the run's allocation log.
fn export_torch(path: &Path, output: Option<&Path>, max_events: usize) -> anyhow::Result<()> {
    let (log_path, _) = super::locate_log(path)?;
    let log = AllocLog::read(&log_path)?;
    if output == Some(Path::new("-")) {
        let mut out = std::io::stdout().lock();
        return std::io::Write::write_all(&mut out, &torch::render(&log, max_events))
            .map_err(|error| anyhow::Error::new(error).context("cannot write to standard output"));
    }
    let target = match output {
        Some(output) => output.to_path_buf(),
        None => path.with_extension("pickle"),
    };
    torch::write(&log, max_events, &target)?;
    let size = std::fs::metadata(&target).map_or(0, |m| m.len());
    super::emit(&format!(
        "wrote {} ({}); open it at pytorch.org/memory_viz; devices: {}\n",
        target.display(),
        format_bytes(size),
        device_list(&log.devices)
    ))
}

/// Writes the profile's call sites as a gzipped pprof profile.
fn export_pprof(path: &Path, output: Option<&Path>) -> anyhow::Result<()> {
    let profile = super::load(path)?;
    if profile.sites.is_empty() {
        let why = if profile.sampling.mean_bytes == 0 {
            "sampling was off (HIGHWATER_SAMPLE_BYTES=0) or the profile predates call sites"
        } else {
            "no allocation was sampled"
        };
        return Err(super::replay::InputError(format!(
            "profile {} has no call sites to export as pprof: {why}",
            path.display()
        ))
        .into());
    }
    if output == Some(Path::new("-")) {
        let mut out = std::io::stdout().lock();
        return std::io::Write::write_all(&mut out, &pprof::render(&profile))
            .map_err(|error| anyhow::Error::new(error).context("cannot write to standard output"));
    }
    let target = match output {
        Some(output) => output.to_path_buf(),
        None => pprof::path_beside(path),
    };
    pprof::write(&profile, &target)?;
    let size = std::fs::metadata(&target).map_or(0, |m| m.len());
    super::emit(&format!(
        "wrote {} ({}, {} call sites); open it with `go tool pprof -http=: {}`\n",
        target.display(),
        format_bytes(size),
        profile.sites.len(),
        target.display()
    ))
}

/// Most devices named in the message after a torch export; the rest are counted.
const LISTED_DEVICES: usize = 8;

/// `0 = cpu, 1 = cuda:0, …`: the viewer's device numbers, at most [`LISTED_DEVICES`] of them.
fn device_list(devices: &[String]) -> String {
    let mut listed: Vec<String> = devices
        .iter()
        .take(LISTED_DEVICES)
        .enumerate()
        .map(|(i, d)| format!("{i} = {}", crate::report::clean(d)))
        .collect();
    if devices.len() > LISTED_DEVICES {
        listed.push(format!("and {} more", devices.len() - LISTED_DEVICES));
    }
    listed.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_naming_many_devices_gets_a_short_message() {
        let devices: Vec<String> = (0..65_535).map(|i| format!("dev:{i}")).collect();
        let list = device_list(&devices);
        assert!(list.starts_with("0 = dev:0, 1 = dev:1"), "{list}");
        assert!(list.ends_with("and 65527 more"), "{list}");
        assert!(list.len() < 200);
        assert_eq!(device_list(&devices[..2]), "0 = dev:0, 1 = dev:1");
    }
}

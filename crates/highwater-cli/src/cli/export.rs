//! `highwater export`: a Chrome/Perfetto trace or an HTML report from a profile.

use std::path::Path;

use highwater::alloc_log::AllocLog;
use highwater::export::{chrome, html, torch};
use highwater::units::format_bytes;

use super::args::Format;

/// Exports the profile at `path` in `format` to `output` (a path, `-` for stdout, or the
/// default next to the profile).
pub(crate) fn run(
    path: &Path,
    format: Format,
    output: Option<&Path>,
    max_events: usize,
) -> anyhow::Result<()> {
    if format == Format::Torch {
        return export_torch(path, output, max_events);
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
    let devices: Vec<String> = log
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| format!("{i} = {d}"))
        .collect();
    super::emit(&format!(
        "wrote {} ({}); open it at pytorch.org/memory_viz; devices: {}\n",
        target.display(),
        format_bytes(size),
        devices.join(", ")
    ))
}

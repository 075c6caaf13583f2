//! `highwater export`: a Chrome/Perfetto trace or an HTML report from a profile.

use std::path::Path;

use highwater::export::{chrome, html};
use highwater::report::format_bytes;

use super::args::Format;

/// Exports the profile at `path` in `format` to `output` (a path, `-` for stdout, or the
/// default next to the profile).
pub(crate) fn run(path: &Path, format: Format, output: Option<&Path>) -> anyhow::Result<()> {
    let profile = super::load(path)?;
    if output == Some(Path::new("-")) {
        return super::emit(&match format {
            Format::Chrome => chrome::render(&profile),
            Format::Html => html::render(&profile),
        });
    }
    let target = match (output, format) {
        (Some(output), _) => output.to_path_buf(),
        (None, Format::Chrome) => chrome::path_beside(path),
        (None, Format::Html) => html::path_beside(path),
    };
    match format {
        Format::Chrome => chrome::write(&profile, &target)?,
        Format::Html => html::write(&profile, &target)?,
    }
    let size = std::fs::metadata(&target).map_or(0, |m| m.len());
    super::emit(&format!(
        "wrote {} ({})\n",
        target.display(),
        format_bytes(size)
    ))
}

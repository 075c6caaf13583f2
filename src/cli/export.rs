//! `highwater export`: a Chrome/Perfetto trace or an HTML report from a profile.

use std::path::{Path, PathBuf};

use highwater::export::{chrome, html};
use highwater::report::format_bytes;

use super::args::Format;

/// Where an export goes when no `--output` is given: next to the profile, its `.json`
/// extension replaced by `.trace.json` or `.html`.
fn default_output(profile: &Path, format: Format) -> PathBuf {
    let stem = match profile.extension() {
        Some(ext) if ext.eq_ignore_ascii_case("json") => profile.with_extension(""),
        _ => profile.to_path_buf(),
    };
    let mut name = stem.into_os_string();
    name.push(match format {
        Format::Chrome => ".trace.json",
        Format::Html => ".html",
    });
    PathBuf::from(name)
}

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
    let target = output.map_or_else(|| default_output(path, format), Path::to_path_buf);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_output_replaces_the_json_extension() {
        let p = Path::new("runs/highwater-profile.json");
        assert_eq!(
            default_output(p, Format::Chrome),
            Path::new("runs/highwater-profile.trace.json")
        );
        assert_eq!(
            default_output(p, Format::Html),
            Path::new("runs/highwater-profile.html")
        );
        assert_eq!(
            default_output(Path::new("p"), Format::Html),
            Path::new("p.html")
        );
    }
}

//! Outputs people open: a self-contained HTML report, a Chrome/Perfetto trace, PyTorch's
//! memory snapshot and a pprof profile of the call sites.
//!
//! The report and the trace are pure functions of a [`Profile`](highwater_profile::Profile) — `render`
//! returns the document as a string and `write` puts it on disk atomically (a temporary sibling
//! renamed into place, so a viewer never opens half a file). Their size follows the profile's,
//! which is bounded whatever the run's length; the time to make them grows linearly with it.
//!
//! - [`chrome`]: Trace Event JSON for <https://ui.perfetto.dev> and `chrome://tracing`: span
//!   instances as complete events per thread, memory as per-device counters with one series per
//!   category, pool reservations and fragmentation as counters.
//! - [`html`]: one HTML file with inline CSS, script and SVG; no network access, opens from disk.
//! - [`torch`]: PyTorch's CUDA memory snapshot (a pickle for its memory viewer,
//!   `pytorch.org/memory_viz`), made from the allocation log rather than the profile, since it
//!   replays every allocation.
//! - [`pprof`]: the call sites as a gzipped `profile.proto` for `go tool pprof`, Perfetto,
//!   speedscope and Pyroscope: bytes and objects live at the peak and allocated, labelled by
//!   category, span and op.
//!
//! [`vocabulary`] holds the words all of them (and the command-line reports) share, and
//! [`stacks`] how they all show a call site's stack.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub mod chrome;
pub mod html;
mod pickle;
pub mod pprof;
pub mod stacks;
pub mod torch;
pub mod vocabulary;

/// What an export writes, as its errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Output {
    /// The self-contained HTML report ([`html`]).
    HtmlReport,
    /// The Chrome/Perfetto trace ([`chrome`]).
    ChromeTrace,
    /// PyTorch's memory snapshot ([`torch`]).
    TorchSnapshot,
    /// The call sites as a pprof profile ([`pprof`]).
    PprofProfile,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Output::HtmlReport => "HTML report",
            Output::ChromeTrace => "Chrome trace",
            Output::TorchSnapshot => "PyTorch memory snapshot",
            Output::PprofProfile => "pprof profile",
        })
    }
}

/// Why an export could not be written. Nothing partial is left: the destination keeps what
/// it held before.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the {output} {}: {source}", path.display())]
pub struct ExportError {
    output: Output,
    path: PathBuf,
    #[source]
    source: io::Error,
}

impl ExportError {
    /// What was being written.
    pub fn output(&self) -> Output {
        self.output
    }

    /// Where it was being written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes `contents` to `path` atomically, naming `output` and `path` if that fails.
fn write_output(output: Output, path: &Path, contents: &[u8]) -> Result<(), ExportError> {
    highwater_profile::fileio::write_file(path, contents).map_err(|source| ExportError {
        output,
        path: path.to_path_buf(),
        source,
    })
}

/// `profile`'s path with its `.json` extension (if any) replaced by `extension`: where an
/// output is written beside the profile it was made from.
fn beside(profile: &Path, extension: &str) -> PathBuf {
    let stem = match profile.extension() {
        Some(ext) if ext.eq_ignore_ascii_case("json") => profile.with_extension(""),
        _ => profile.to_path_buf(),
    };
    let mut name = stem.into_os_string();
    name.push(extension);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_export_names_what_and_where() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should go makes the final rename fail.
        let taken = dir.path().join("report.html");
        std::fs::create_dir(&taken).unwrap();
        let error = write_output(Output::HtmlReport, &taken, b"x").unwrap_err();
        assert_eq!(error.output(), Output::HtmlReport);
        assert_eq!(error.path(), taken);
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "cannot write the HTML report {}: ",
                taken.display()
            )),
            "{message}"
        );
    }

    #[test]
    fn outputs_go_beside_the_profile_with_its_json_extension_replaced() {
        let p = Path::new("runs/highwater-profile.json");
        assert_eq!(
            chrome::path_beside(p),
            Path::new("runs/highwater-profile.trace.json")
        );
        assert_eq!(
            html::path_beside(p),
            Path::new("runs/highwater-profile.html")
        );
        assert_eq!(html::path_beside(Path::new("p")), Path::new("p.html"));
        assert_eq!(html::path_beside(Path::new("p.JSON")), Path::new("p.html"));
    }
}

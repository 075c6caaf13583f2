//! Outputs people open: a Chrome/Perfetto trace and a self-contained HTML report.
//!
//! Both are pure functions of a [`Profile`](crate::Profile) — `render` returns the document as a
//! string and `write` puts it on disk atomically (a temporary sibling renamed into place, so a
//! viewer never opens half a file). Their size follows the profile's, which is bounded whatever
//! the run's length.
//!
//! - [`chrome`]: Trace Event JSON for <https://ui.perfetto.dev> and `chrome://tracing`: span
//!   instances as complete events per thread, memory as per-device counters with one series per
//!   category, pool reservations and fragmentation as counters.
//! - [`html`]: one HTML file with inline CSS, script and SVG; no network access, opens from disk.
//! - [`torch`]: PyTorch's CUDA memory snapshot (a pickle for its memory viewer), made from the
//!   allocation log rather than the profile, since it replays every allocation.

use std::path::{Path, PathBuf};

pub mod chrome;
pub mod html;
mod pickle;
#[doc(hidden)]
pub mod sample;
pub mod torch;

/// The warning every view shows when the profile lost events, or `None` when it lost none.
pub fn dropped_events_warning(summary: &crate::Summary) -> Option<String> {
    (summary.dropped_events > 0).then(|| {
        format!(
            "{} events were dropped while recording; every figure is a lower bound",
            summary.dropped_events
        )
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

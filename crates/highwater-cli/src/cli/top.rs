//! `highwater top`: the largest groups live at the peak.

use std::path::Path;

use crate::report::{top_rows, top_text};
use highwater_profile::PeakRow;
use serde::Serialize;

/// What `top --json` prints.
#[derive(Debug, Serialize)]
struct TopJson<'a> {
    peak_bytes: u64,
    peak_device: &'a str,
    total_rows: usize,
    rows: Vec<&'a PeakRow>,
}

/// Prints the `limit` largest live-at-peak rows of the profile at `path`.
pub(crate) fn run(path: &Path, limit: usize, json: bool) -> anyhow::Result<()> {
    let profile = super::load(path)?;
    if json {
        super::emit_json(&TopJson {
            peak_bytes: profile.summary.peak_bytes,
            peak_device: &profile.summary.peak_device,
            total_rows: profile.peak_breakdown.len(),
            rows: top_rows(&profile, limit),
        })
    } else {
        super::emit(&top_text(&profile, limit))
    }
}

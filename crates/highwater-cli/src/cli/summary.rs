//! `highwater summary`: the headline figures.

use std::path::Path;

use crate::report::{summary_json, summary_text};

/// Prints the summary of the profile at `path`.
pub(crate) fn run(path: &Path, json: bool) -> anyhow::Result<()> {
    let profile = super::load(path)?;
    if json {
        super::emit_json(&summary_json(&profile))
    } else {
        super::emit(&summary_text(&profile))
    }
}

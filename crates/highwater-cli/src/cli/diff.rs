//! `highwater diff`: what grew and what shrank between two runs.

use std::path::Path;

use crate::report::{diff, diff_text};

/// Prints how the profile at `after` differs from the baseline at `before`.
pub(crate) fn run(before: &Path, after: &Path, limit: usize, json: bool) -> anyhow::Result<()> {
    let old = super::load(before)?;
    let new = super::load(after)?;
    let changes = diff(&old, &new);
    if json {
        super::emit_json(&changes)
    } else {
        super::emit(&diff_text(&changes, limit))
    }
}

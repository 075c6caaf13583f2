//! `highwater spans`: the span tree with its metrics.

use std::path::Path;

use crate::report::{span_rows, spans_text};

/// Prints the span tree of the profile at `path`.
pub(crate) fn run(path: &Path, json: bool) -> anyhow::Result<()> {
    let profile = super::load(path)?;
    if json {
        super::emit_json(&span_rows(&profile))
    } else {
        super::emit(&spans_text(&profile))
    }
}

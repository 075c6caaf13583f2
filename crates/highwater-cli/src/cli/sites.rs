//! `highwater sites`: the call sites, largest at the peak (or allocated) first.

use std::path::Path;

use crate::report::{sites_json, sites_text, SiteQuery};

/// Prints the call sites of the profile at `path` that `query` selects.
pub(crate) fn run(path: &Path, query: &SiteQuery, json: bool) -> anyhow::Result<()> {
    let profile = super::load(path)?;
    let name = path.display().to_string();
    if json {
        super::emit_json(&sites_json(&profile, &name, query)?)
    } else {
        super::emit(&sites_text(&profile, &name, query)?)
    }
}

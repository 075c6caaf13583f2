//! Reading a profile as a person at a terminal: the plain-text and JSON views the `highwater`
//! commands print, and the differences between two runs.
//!
//! Everything here is a pure function of [`Profile`](highwater_profile::Profile) values. Units come from
//! [`highwater_profile::units`] and the span tree's order from [`highwater_profile::span_tree`], the
//! same ones the HTML report uses, so every output shows the same numbers in the same units.

mod diff;
mod ranks;
mod sites;
mod text;

pub(crate) use diff::diff;
pub(crate) use ranks::{rank_list, ranks_json, ranks_text};
pub(crate) use sites::{sites_json, sites_text, SiteOrder, SiteQuery, SiteQueryError};
#[cfg(test)]
pub(crate) use text::tests::with_a_refusal;
pub(crate) use text::{
    clean, diff_text, oom_line, span_rows, spans_text, summary_json, summary_text, top_rows,
    top_text,
};

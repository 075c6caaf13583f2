//! Reading a profile as a person: byte and time units, the span tree in display order, the
//! differences between two runs and the plain-text views the `highwater` command prints.
//!
//! Everything here is a pure function of [`Profile`](crate::Profile) values, so the command-line
//! tool and the HTML report show the same numbers in the same units. Sizes are always binary
//! (`KiB`, `MiB`, `GiB`: powers of 1024, named as such).

mod diff;
mod text;
mod tree;
mod units;

pub use diff::{diff, CategoryDelta, Delta, ProfileDiff, SpanDelta};
pub use text::{
    clean, diff_text, dropped_events_warning, format_shape, span_rows, spans_text, summary_json,
    summary_text, top_rows, top_text, SpanRow, SummaryJson,
};
pub use tree::{span_tree, TreeRow};
pub use units::{format_bytes, format_bytes_delta, format_count, format_duration_ns, signed_delta};

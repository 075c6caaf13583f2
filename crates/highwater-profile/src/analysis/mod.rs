//! Analysis: a pure, deterministic state machine that turns merged events into a [`Profile`].
//!
//! [`Timeline::apply`] takes one [`Event`] at a time, in time order, and keeps only what the
//! profile needs: the live map, per-device and per-category counters, the peak and what was live
//! at it, span metrics and a bounded, downsampled curve. No clocks, threads or I/O live here, so
//! every figure a profile shows can be reproduced from a hand-written list of events.
//!
//! The parts, one file each:
//!
//! - `timeline`: the state machine and the assembly of the [`Profile`];
//! - `live`: the live map and live-at-peak without snapshots;
//! - `spans`: span instances, the span tree, residuals and peaks inside spans;
//! - `downsample`: bounded curves that keep their extremes;
//! - `intern`: the tables behind [`NameId`], [`DeviceId`] and [`ShapeId`];
//! - `iterations`: the bounded series of a top-level span's exits (the leak signal);
//! - `sites`: call-site samples, their weights, and the call sites of the profile;
//! - `temporary`: which bytes live at the peak were freed inside the span that allocated them;
//!
//! `tests/offline/analysis_matches_brute_force.rs` holds the analysis to a brute-force model built from
//! these public types alone.
//!
//! [`Profile`]: crate::Profile

mod downsample;
mod event;
mod intern;
mod iterations;
mod live;
mod sites;
mod span_sample;
mod spans;
mod temporary;
mod timeline;

pub use crate::model::StackWalk;
pub use event::{DeviceId, Event, EventKind, NameId, ShapeId, SpanSeq, StackId};
pub use sites::{qualify_closures, trimmed_frames, ResolveFrames};
pub use timeline::{At, Realloc};
pub use timeline::{Timeline, TimelineConfig, PEAK_WINDOW_BUCKETS};

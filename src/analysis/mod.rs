//! Analysis: a pure, deterministic state machine that turns merged events into a [`Profile`].
//!
//! [`Timeline::apply`] takes one [`Event`] at a time, in time order, and keeps only what the
//! profile needs: the live map, per-device and per-category counters, the peak and what was live
//! at it, span metrics and a bounded, downsampled curve. No clocks, threads or I/O live here, so
//! every figure a profile shows can be reproduced from a hand-written list of events.
//!
//! [`Profile`]: crate::Profile

mod event;

pub use event::{DeviceId, Event, EventKind, NameId, ShapeId, SpanSeq};
mod downsample;
mod intern;
mod live;
mod spans;
mod timeline;

#[cfg(test)]
mod reference;

pub use timeline::{Timeline, TimelineConfig};

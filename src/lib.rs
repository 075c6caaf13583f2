//! highwater: where did my training run's memory go?
//!
//! A memory profiler that a Rust training binary links in.

#![warn(unreachable_pub)]

pub mod analysis;
pub mod export;
mod model;
mod profile;
pub mod report;

pub use model::{Category, SpanLabel, Step};
pub use profile::{
    DeviceStats, IterationResidual, LiveAllocation, PeakRow, PoolPoint, Profile, ProfileError,
    RunMeta, SpanEvent, SpanMetrics, Summary, TimelinePoint, MAX_PROFILE_BYTES, MAX_SPAN_EVENTS,
    SCHEMA,
};

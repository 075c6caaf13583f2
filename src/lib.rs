//! highwater: where did my training run's memory go?
//!
//! A memory profiler that a Rust training binary links in.

#![warn(unreachable_pub)]

pub mod analysis;
pub mod device;
mod model;
mod profile;

pub use model::{Category, SpanLabel, Step};
pub use profile::{
    DeviceStats, IterationResidual, LiveAllocation, PeakRow, PoolPoint, Profile, ProfileError,
    RunMeta, SpanMetrics, Summary, TimelinePoint, MAX_PROFILE_BYTES, SCHEMA,
};

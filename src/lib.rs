//! highwater: where did my training run's memory go?
//!
//! A memory profiler that a Rust training binary links in.

#![warn(unreachable_pub)]
// Under loom only the ring and the registry are built, so much of capture is unused there.
#![cfg_attr(loom, allow(dead_code))]

pub mod analysis;
mod capture;
#[cfg(not(loom))]
pub mod device;
pub mod export;
mod model;
mod profile;
pub mod report;

#[cfg(not(loom))]
mod alloc;
pub mod alloc_log;
#[cfg(not(loom))]
mod collector;
#[cfg(not(loom))]
mod error;
#[cfg(not(loom))]
pub mod ops;
#[cfg(not(loom))]
mod session;
#[cfg(all(not(loom), target_os = "linux"))]
mod signal;
#[cfg(not(loom))]
mod span;

#[cfg(not(loom))]
pub use alloc::Alloc;
#[cfg(not(loom))]
pub use error::Error;
pub use model::{Category, SpanLabel, Step};
pub use profile::{
    CaptureStats, DeviceStats, IterationResidual, LiveAllocation, PeakRow, PoolPoint, Profile,
    ProfileError, RunMeta, SpanEvent, SpanMetrics, Summary, ThreadCapture, TimelinePoint,
    MAX_ITERATIONS, MAX_PROFILE_BYTES, MAX_SPAN_EVENTS, SCHEMA,
};
#[cfg(not(loom))]
pub use session::{Session, SessionBuilder, DEFAULT_OUTPUT};
#[cfg(not(loom))]
pub use span::SpanGuard;

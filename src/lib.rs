//! highwater: where did my training run's memory go?
//!
//! A memory profiler that a Rust training binary links in.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `candle` | `highwater::candle`: name real `candle_core::Tensor`s (op outputs with shape and dtype, `VarMap` storage as parameters); CPU only |
//! | `tracing` | `TracingLayer`: a `tracing_subscriber` layer that turns tracing spans into highwater spans |
//!
//! ```toml
//! [dependencies]
//! highwater = { version = "0.1", features = ["candle"] }
//! ```

#![warn(unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
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
#[cfg(all(feature = "candle", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub mod candle;
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
#[cfg(all(feature = "tracing", not(loom)))]
mod tracing_layer;

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
#[cfg(all(feature = "tracing", not(loom)))]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub use tracing_layer::TracingLayer;

/// The README's Rust examples, compiled and run as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

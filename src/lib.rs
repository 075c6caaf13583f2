//! highwater: where did my training run's memory go?
//!
//! A memory profiler that a Rust training binary links in. Install [`Alloc`] as the global
//! allocator, start a [`Session`], mark forward, backward and optimizer work with
//! [`profile!`](crate::profile!), and a [`Profile`] is written when the session ends: when memory
//! peaked, what was live at the peak, and which span, op and category put it there.
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: highwater::Alloc = highwater::Alloc::system();
//!
//! fn main() -> Result<(), highwater::Error> {
//!     let session = highwater::Session::start()?;
//!     {
//!         let _fwd = highwater::profile!("forward", highwater::Step::Forward);
//!         let activations = vec![0f32; 1 << 20];
//!         # drop(activations);
//!     }
//!     let profile = session.finish()?;
//!     println!("peak {} bytes on {}", profile.summary.peak_bytes, profile.summary.peak_device);
//!     Ok(())
//! }
//! ```
//!
//! - [`Alloc`]: the recording `GlobalAlloc` wrapper (lock-free, allocation-free hot path).
//! - [`Session`] / [`SessionBuilder`]: start and end recording; configuration and `HIGHWATER_*`;
//!   under a launcher (torchrun, `mpirun`, `srun`) each rank writes its own profile
//!   ([many processes, one run](SessionBuilder#many-processes-one-run)), which
//!   [`profile::ranks`] compares.
//! - [`profile!`](crate::profile!) / [`SpanGuard`]: spans, optionally a [`Step`] or a
//!   [`Category`].
//! - [`ops`]: op and tensor hooks (ops, device tensors, categories).
//! - [`Profile`]: the document written at the end ([`profile`](mod@profile) holds its parts); [`export`]
//!   renders it (Chrome trace, HTML, PyTorch snapshot), [`units`] formats its figures, and the
//!   `highwater` command (package `highwater-cli`) reads it.
//! - [`measure`] / [`Measurement`]: exact heap figures of a closure on the calling thread, for
//!   tests; [`Budget`], [`assert_peak_below!`], [`assert_no_leak!`] and [`LeakCheck`] turn
//!   them into assertions with readable failures.
//! - [`analysis::Timeline`]: the pure analysis every figure comes from.
//! - [`device`]: device memory pools with admission control and what-if replay.
//!
//! Linux is the supported platform (thread-exit and fork handling use pthreads). Built and
//! tested with Rust 1.95.
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `candle` | `highwater::candle`: name real `candle_core::Tensor`s (op outputs with shape and dtype, `VarMap` storage as parameters); CPU, and CUDA with `cuda` |
//! | `tracing` | `TracingLayer`: a `tracing_subscriber` layer that turns tracing spans into highwater spans |
//! | `cuda` | CUDA device memory, recorded through CUPTI's callbacks (driver and CUPTI loaded at run time; no toolkit needed to build) |
//! | `read` | reading profiles back in the program: `Profile::load`, `Profile::from_json_bytes`, `profile::ranks::compare`, and `serde::Deserialize` for every type of the document (the `highwater` command does not need it) |
//!
//! ```toml
//! [dependencies]
//! highwater = { version = "0.1", features = ["candle"] }
//! ```

#![warn(unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Under loom only the ring and the registry are built, so much of capture is unused there.
#![cfg_attr(highwater_loom, allow(dead_code))]

// Test support shared with the integration tests names the crate `highwater`.
#[cfg(test)]
extern crate self as highwater;

mod capture;
#[cfg(unix)]
mod sys;

/// The profile document, its vocabulary and the analysis that builds it (the
/// `highwater-profile` crate): the types a [`Profile`] is made of.
pub use highwater_profile as profile;
use highwater_profile::model;
pub use highwater_profile::model::{Category, ParseLabelError, SpanLabel, Step};
pub use highwater_profile::{CaptureMode, Profile};

// Under loom only capture's ring, registry, gate and tickets are built (`capture::sync`).
capture::sync::outside_loom! {
    pub mod device;
    // The parts of the lower crates this library builds on, by their short names.
    use highwater_export as export;
    use highwater_profile::{alloc_log, analysis, fileio, units};

    mod alloc;
    #[cfg(feature = "candle")]
    #[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
    pub mod candle;
    mod checkpoint;
    mod collector;
    mod config;
    #[cfg(feature = "cuda")]
    mod cuda;
    mod error;
    mod fork_lock;
    mod measure;
    pub mod ops;
    mod outputs;
    mod rank;
    mod session;
    #[cfg(target_os = "linux")]
    mod signal;
    mod span;
    mod symbolize;
    #[cfg(feature = "tracing")]
    mod tracing_layer;

    pub use alloc::Alloc;
    pub use checkpoint::DEFAULT_CHECKPOINT_INTERVAL;
    pub use error::Error;
    pub use measure::{
        measure, Budget, BudgetExceeded, IterationReport, LeakCheck, LeakDetected, Measurement,
        SiteFigures, SpanFigures,
    };
    pub use session::{Session, SessionBuilder, DEFAULT_OUTPUT};
    pub use span::SpanGuard;
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub use tracing_layer::TracingLayer;
}

/// The README's Rust examples, compiled and run as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

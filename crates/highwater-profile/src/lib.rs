//! The highwater profile: the document a run leaves, its vocabulary, and the pure analysis that
//! builds it.
//!
//! A training binary links the `highwater` library, which records events and feeds them to
//! [`analysis::Timeline`]; at the end the timeline assembles a [`Profile`], written as
//! `highwater-profile.json`. This crate is everything from the events on: no threads, no
//! allocator hook, no clocks. The command-line tool and the exporters read profiles through it.
//!
//! - [`Profile`] and its parts: peak, live-at-peak rows, spans, devices, call sites, warnings;
//!   [`Profile::write`] writes one. With the feature `read`, `Profile::load` reads one with
//!   every field checked, and every type of the document implements `serde::Deserialize`
//!   (the vocabulary of [`model`] and [`CaptureMode`] always do).
//! - [`model`]: the vocabulary every part shares ([`model::Category`], [`model::Step`],
//!   [`model::SpanLabel`]).
//! - [`analysis`]: the state machine every figure comes from.
//! - [`alloc_log`]: the allocation log, every allocation and free of a run, for replays.
//! - [`ranks`]: the profiles of a multi-process run's ranks, compared (`ranks::compare`: feature
//!   `read`).
//! - [`units`]: how figures are written for people (`1.5 MiB`, `2.3 ms`).
//! - [`fileio`]: how every highwater file is written and read.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod profile;

pub mod alloc_log;
pub mod analysis;
pub mod fileio;
pub mod model;
pub mod ranks;
pub mod units;

pub use profile::*;

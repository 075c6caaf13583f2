//! Test support shared by highwater's crates. Not published; a dev-dependency only.
//!
//! - [`sample`]: a realistic hand-built profile the exporters', the report's and the command's
//!   tests all read.
//! - [`ranks`]: one profile made into the profiles of a multi-process run's ranks.

pub mod ranks;
pub mod sample;

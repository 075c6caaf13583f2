//! Outputs people open: a Chrome/Perfetto trace and a self-contained HTML report.
//!
//! Both are pure functions of a [`Profile`](crate::Profile) — `render` returns the document as a
//! string and `write` puts it on disk atomically (a temporary sibling renamed into place, so a
//! viewer never opens half a file). Their size follows the profile's, which is bounded whatever
//! the run's length.
//!
//! - [`chrome`]: Trace Event JSON for <https://ui.perfetto.dev> and `chrome://tracing`: span
//!   instances as complete events per thread, memory as per-device counters with one series per
//!   category, pool reservations and fragmentation as counters.
//! - [`html`]: one HTML file with inline CSS, script and SVG; no network access, opens from disk.

pub mod chrome;
pub mod html;
#[doc(hidden)]
pub mod sample;

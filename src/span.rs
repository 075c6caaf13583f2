//! Spans: named regions of a thread's work, opened with [`profile!`](crate::profile!).
//!
//! A span names what the memory allocated inside it is for. A span may mark a training
//! [`Step`](crate::Step) — allocations inside default to that step's category — or name a
//! [`Category`](crate::Category) outright. The innermost span that names a category decides;
//! otherwise the innermost step does; otherwise the allocation is `other`.

use std::marker::PhantomData;

use crate::capture;
use crate::measure::meter;
use crate::model::SpanLabel;

/// Opens a span on the current thread until the returned [`SpanGuard`] is dropped.
///
/// `profile!(name)` opens a plain span; `profile!(name, label)` takes a [`Step`](crate::Step)
/// or a [`Category`](crate::Category). The name must be a `&'static str`; it is recorded by
/// reference, never copied.
///
/// # Examples
///
/// ```
/// use highwater::{Category, Step};
///
/// let _step = highwater::profile!("train_step");
/// {
///     let _fwd = highwater::profile!("forward", Step::Forward);
///     let _w = highwater::profile!("load_weights", Category::Parameter);
/// }
/// ```
#[macro_export]
macro_rules! profile {
    ($name:expr $(,)?) => {
        $crate::SpanGuard::enter($name, $crate::SpanLabel::Plain)
    };
    ($name:expr, $label:expr $(,)?) => {
        $crate::SpanGuard::enter($name, $crate::SpanLabel::from($label))
    };
}

/// An open span; closing it (dropping the guard) records the exit.
///
/// Guards must be dropped in the reverse order of creation on the thread that made them, which
/// scoping gives for free; the guard is therefore neither `Send` nor `Sync`.
#[must_use = "the span closes as soon as the guard is dropped"]
#[derive(Debug)]
pub struct SpanGuard {
    restore: capture::SpanRestore,
    /// Which measurements on this thread the span was opened in.
    measured: meter::SpanMark,
    /// Spans belong to the thread that opened them.
    _not_send: PhantomData<*const ()>,
}

impl SpanGuard {
    /// Opens a span named `name` with `label` on the current thread.
    ///
    /// Usually called through [`profile!`](crate::profile!).
    pub fn enter(name: &'static str, label: SpanLabel) -> SpanGuard {
        SpanGuard {
            restore: capture::span_enter(name, label),
            measured: meter::span_enter(name),
            _not_send: PhantomData,
        }
    }
}

impl Drop for SpanGuard {
    fn drop(&mut self) {
        meter::span_exit(self.measured);
        capture::span_exit(self.restore);
    }
}

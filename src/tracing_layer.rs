//! [`TracingLayer`]: `tracing` spans become highwater spans.
//!
//! A program already instrumented with [`tracing`](https://docs.rs/tracing) spans gets memory
//! attribution without `profile!` calls: while a tracing span is entered on a thread, a
//! highwater span of the same name is open on that thread. Two field names carry meaning:
//!
//! - `step = "forward" | "backward" | "optimizer"` marks a training [`Step`];
//! - `category = "parameter" | "activation" | "gradient" | "optimizer" | "other"` names a
//!   [`Category`] outright (it wins when a span has both).
//!
//! Values may be string literals or anything whose `Debug`/`Display` form is one of those words
//! (`step = ?Step::Forward` works too). Other fields, and unrecognised values, are ignored.
//!
//! highwater spans must close in the reverse order they opened, on the thread that opened
//! them. Each thread keeps a stack of the spans this layer opened; an exit closes the matching
//! span together with anything opened after it that is still open, and an exit this layer
//! never saw is ignored. Out-of-order exits therefore never panic; they only shorten the
//! highwater spans involved.

use std::cell::RefCell;
use std::fmt;

use tracing_core::field::{Field, Visit};
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::model::{Category, SpanLabel, Step};
use crate::span::SpanGuard;

/// A `tracing_subscriber` [`Layer`] that opens a highwater span for every entered tracing
/// span.
///
/// Add it to a registry-based subscriber. It records only while a
/// [`Session`](crate::Session) records; otherwise its spans cost a thread-local push and pop.
///
/// # Examples
///
/// ```
/// use tracing_subscriber::layer::SubscriberExt;
///
/// let subscriber = tracing_subscriber::registry().with(highwater::TracingLayer::new());
/// tracing::subscriber::with_default(subscriber, || {
///     let step = tracing::info_span!("train_step");
///     let _step = step.enter();
///     let forward = tracing::info_span!("forward", step = "forward");
///     let _forward = forward.enter();
///     // heap allocations here are activations of `train_step/forward`
/// });
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLayer {
    _private: (),
}

impl TracingLayer {
    /// A new layer.
    pub fn new() -> TracingLayer {
        TracingLayer::default()
    }
}

/// The label a span's fields asked for, kept in the span's extensions.
#[derive(Debug, Clone, Copy, Default)]
struct Fields {
    step: Option<Step>,
    category: Option<Category>,
}

impl Fields {
    fn label(self) -> SpanLabel {
        match (self.category, self.step) {
            (Some(category), _) => SpanLabel::Category(category),
            (None, Some(step)) => SpanLabel::Step(step),
            (None, None) => SpanLabel::Plain,
        }
    }

    fn set(&mut self, field: &Field, value: &str) {
        let value = value.trim().trim_matches('"');
        match field.name() {
            "step" => self.step = parse_step(value).or(self.step),
            "category" => self.category = parse_category(value).or(self.category),
            _ => {}
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if matches!(field.name(), "step" | "category") {
            let mut word = Word::default();
            if fmt::write(&mut word, format_args!("{value:?}")).is_ok() {
                self.set(field, word.as_str());
            }
        }
    }
}

/// A fixed buffer for the short words `step`/`category` values are; longer text is no match.
#[derive(Default)]
struct Word {
    bytes: [u8; 24],
    len: usize,
}

impl Word {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
}

impl fmt::Write for Word {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

fn parse_step(value: &str) -> Option<Step> {
    value.parse().ok()
}

fn parse_category(value: &str) -> Option<Category> {
    value.parse().ok()
}

thread_local! {
    /// The highwater spans this layer opened on this thread, innermost last, with the tracing
    /// span each stands for.
    static OPEN: RefCell<Vec<(Id, SpanGuard)>> = const { RefCell::new(Vec::new()) };
}

impl<S> Layer<S> for TracingLayer
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if fields.label() != SpanLabel::Plain {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(fields);
            }
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        let mut fields = extensions.get_mut::<Fields>().copied().unwrap_or_default();
        values.record(&mut fields);
        if fields.label() != SpanLabel::Plain {
            match extensions.get_mut::<Fields>() {
                Some(slot) => *slot = fields,
                None => extensions.insert(fields),
            }
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let label = span
            .extensions()
            .get::<Fields>()
            .map_or(SpanLabel::Plain, |fields| fields.label());
        let name = span.metadata().name();
        let _ = OPEN.try_with(|open| {
            let Ok(mut open) = open.try_borrow_mut() else {
                return;
            };
            // Grow the stack before the span opens, so its own bytes are not charged to it.
            open.reserve(1);
            open.push((id.clone(), SpanGuard::enter(name, label)));
        });
    }

    fn on_exit(&self, id: &Id, _ctx: Context<'_, S>) {
        let _ = OPEN.try_with(|open| {
            let Ok(mut open) = open.try_borrow_mut() else {
                return;
            };
            if let Some(position) = open.iter().rposition(|(open_id, _)| open_id == id) {
                // Innermost first: guards close in reverse order of opening.
                while open.len() > position {
                    drop(open.pop());
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_parse_case_insensitively() {
        assert_eq!(parse_step("Forward"), Some(Step::Forward));
        assert_eq!(parse_step("optimizer"), Some(Step::Optimizer));
        assert_eq!(parse_step("sideways"), None);
        assert_eq!(parse_category("GRADIENT"), Some(Category::Gradient));
        assert_eq!(parse_category(""), None);
    }

    #[test]
    fn category_wins_over_step() {
        let fields = Fields {
            step: Some(Step::Forward),
            category: Some(Category::Parameter),
        };
        assert_eq!(fields.label(), SpanLabel::Category(Category::Parameter));
        assert_eq!(Fields::default().label(), SpanLabel::Plain);
    }

    #[test]
    fn long_debug_values_are_no_match() {
        let mut word = Word::default();
        assert!(fmt::write(&mut word, format_args!("{}", "x".repeat(40))).is_err());
        let mut word = Word::default();
        fmt::write(&mut word, format_args!("{:?}", "backward")).unwrap();
        assert_eq!(word.as_str(), "\"backward\"");
    }
}

//! What names the heap events around it: spans, op scopes, recording pauses and annotations.

use super::{emit, set_state, state, ThreadState};
use crate::capture::gate::{GATE_EPOCH, RECORDING};
use crate::capture::raw::{RawEvent, RawKind};
use crate::capture::sync::Ordering;
use crate::model::{CategoryScope, SpanLabel};

/// Opens a span on this thread: updates the thread's span state (always, so spans opened before
/// a session still name what runs inside them) and records the entry. Returns what to restore.
pub(crate) fn span_enter(name: &'static str, label: SpanLabel) -> SpanRestore {
    let Some(mut current) = state() else {
        return SpanRestore::default();
    };
    let restore = SpanRestore {
        span: current.span,
        scope: current.scope,
        id: current.last_span.wrapping_add(1).max(1),
        name: current.span_name,
        label: current.span_label,
        announced: current.announced,
    };
    current.last_span = restore.id;
    current.span = restore.id;
    current.scope = current.scope.enter(label);
    current.span_name = (name.as_ptr() as usize, name.len() as u32);
    current.span_label = label.to_byte();
    // The entry below announces this span, when recording (it was never announced otherwise).
    current.announced = if RECORDING.load(Ordering::Relaxed) {
        GATE_EPOCH.load(Ordering::Relaxed)
    } else {
        0
    };
    set_state(current);
    emit([RawKind::SpanEnter], |_, ticks| {
        [RawEvent::span_enter(
            ticks,
            restore.span,
            name,
            restore.id,
            label,
        )]
    });
    restore
}

/// Closes the span that [`span_enter`] opened and restores the thread's state to what it was.
pub(crate) fn span_exit(restore: SpanRestore) {
    if restore.id == 0 {
        return;
    }
    emit([RawKind::SpanExit], |_, ticks| {
        [RawEvent::span_exit(ticks, restore.id)]
    });
    if let Some(mut current) = state() {
        current.span = restore.span;
        current.scope = restore.scope;
        current.span_name = restore.name;
        current.span_label = restore.label;
        current.announced = restore.announced;
        set_state(current);
    }
}

/// What a span guard puts back when it closes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SpanRestore {
    span: u32,
    scope: CategoryScope,
    /// The span this guard opened (`0`: none, the thread-local was unreachable).
    id: u32,
    /// The enclosing span's name, label and announcement, to put back.
    name: (usize, u32),
    label: u8,
    announced: u32,
}

/// Marks the calling thread as highwater's own: nothing it allocates is recorded.
pub(crate) fn mark_internal_thread() {
    if let Some(mut current) = state() {
        current.internal = true;
        set_state(current);
    }
}

/// Runs `f` with recording paused on this thread, for highwater code that allocates on a user
/// thread (interning a name, starting or finishing a session). A measurement running on the
/// thread does not count those allocations either: they are not the user's.
pub(crate) fn with_recording_paused<R>(f: impl FnOnce() -> R) -> R {
    /// Puts the thread's `paused` flag back, even if `f` unwinds.
    struct Resume(bool);
    impl Drop for Resume {
        fn drop(&mut self) {
            if let Some(now) = state() {
                set_state(ThreadState {
                    paused: self.0,
                    ..now
                });
            }
        }
    }
    let _resume = state().map(|current| {
        set_state(ThreadState {
            paused: true,
            ..current
        });
        Resume(current.paused)
    });
    f()
}

/// Whether highwater's own work runs on this thread now ([`with_recording_paused`]), or its
/// thread-locals are gone: what it allocates is not the program's, for recording and for
/// measurement alike.
#[inline(always)]
pub(crate) fn paused_here() -> bool {
    state().is_none_or(|current| current.paused)
}

/// The category the thread's open spans give a new block.
pub(crate) fn scope_category() -> crate::model::Category {
    state().map_or(crate::model::Category::Other, |current| {
        current.scope.category()
    })
}

/// Records the start of an op named by interned `name`.
pub(crate) fn record_op_begin(name: u32) {
    emit([RawKind::OpBegin], |current, ticks| {
        [RawEvent::op_begin(ticks, current.span, name)]
    });
}

/// Records the end of the innermost op.
pub(crate) fn record_op_end() {
    emit([RawKind::OpEnd], |current, ticks| {
        [RawEvent::op_end(ticks, current.span)]
    });
}

/// Records what made the live block `key` on `device`: op name, shape and dtype ids.
pub(crate) fn record_annotation(
    device: u16,
    key: u64,
    op: u32,
    shape: Option<u32>,
    dtype: Option<u32>,
) {
    emit(
        [RawKind::AnnotateHead, RawKind::AnnotateTail],
        |current, ticks| RawEvent::annotation(ticks, current.span, device, key, op, shape, dtype),
    );
}

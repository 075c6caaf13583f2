//! The raw event codec: the fixed-size events a capture hook writes into its thread's ring, and
//! their decoding on the collector's side, in one place.
//!
//! A [`RawEvent`] is 32 bytes of plain data. The hook builds every event with one of the
//! constructors below (one per kind), and the collector turns them back into [`Record`]s with a
//! [`Decoder`], which joins the two halves of four-word records. The only pointer an event
//! carries is a span name's `&'static str`: [`RawEvent::span_enter`] is the one place that
//! writes it and [`Decoder::decode`] the one place that reads it back, so the invariant the
//! rebuilt `&'static str` rests on is kept in this file.

use crate::model::OomSource;
use crate::model::StackWalk;
use crate::model::{Category, SpanLabel, Unwinder};

/// What a [`RawEvent`] records. Also the index of per-kind drop counters.
///
/// Names, shapes and devices of op hooks are ids from the process-wide interner
/// (`capture::names`); `device` is always such a device id (`0` = the CPU heap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RawKind {
    /// `a` = address, `b` = size, `flags` = category index.
    Alloc = 0,
    /// `a` = address, `b` = size.
    Free = 1,
    /// First half of a realloc: `a` = old address, `b` = old size.
    ReallocFrom = 2,
    /// Second half of a realloc: `a` = new address, `b` = new size, `flags` = category index.
    ReallocTo = 3,
    /// `a` = `&'static str` pointer, `b` = name length (low 32 bits) and the new span's
    /// sequence number (high 32 bits), `flags` = label byte; `span` = the parent.
    SpanEnter = 4,
    /// `span` = the closing span.
    SpanExit = 5,
    /// An op started: `a` = name id.
    OpBegin = 6,
    /// The innermost op ended.
    OpEnd = 7,
    /// A device tensor became live: `a` = tensor id, `b` = bytes, `flags` = category index.
    DeviceAlloc = 8,
    /// A device tensor died: `a` = tensor id, `b` = bytes.
    DeviceFree = 9,
    /// A live block's category changed: `a` = address or tensor id, `flags` = category index.
    SetCategory = 10,
    /// First half of an annotation: `a` = address or tensor id, `b` = op name id.
    AnnotateHead = 11,
    /// Second half: `a` = shape id + 1, `b` = dtype name id + 1 (`0`: unknown).
    AnnotateTail = 12,
    /// First half of a pool report: `a` = capacity, `b` = reserved bytes.
    PoolHead = 13,
    /// Second half: `a` = largest free block, `b` = fragmentation as `f64` bits.
    PoolTail = 14,
    /// An allocation was refused: `a` = bytes asked for, `b` = largest free block + 1 (`0`:
    /// unknown, as for the heap), `flags` = [`OomSource`] byte.
    Oom = 15,
    /// Part of a sampled allocation's call stack, in the events before its `Alloc` or
    /// `ReallocFrom`: `a`, `b` = return addresses, innermost first (`0`: padding), `flags` bit 0
    /// = the stack was cut (set on every part). Stamped like the record it precedes.
    StackPcs = 16,
    /// A device driver's memory pools hold `a` bytes.
    DeviceReserved = 17,
    /// The device held `a` bytes, of `b` in all, before its first recorded allocation.
    DeviceMemory = 18,
    /// Virtual range at `a` now maps the physical allocation with handle `b`.
    VmmMap = 19,
    /// The mappings starting in `a .. a + b` were unmapped.
    VmmUnmap = 20,
    /// The handle `a` to a physical allocation was released.
    VmmRelease = 21,
}

/// Set in the key of a physical device allocation (a handle from CUDA's `cuMemCreate`), so it
/// never equals a device address: those are user-space addresses, below 2^63.
pub(crate) const PHYSICAL_KEY: u64 = 1 << 63;

/// Bit of an `Alloc`'s or `ReallocTo`'s `flags`: the events before it carry its call stack.
const SAMPLED: u8 = 0x80;

/// Bit of a `StackPcs`' `flags`: the walk stopped before the stack's first frame.
const TRUNCATED: u8 = 0x01;

/// Bit of a `StackPcs`' `flags`: the stack was unwound by call-frame information
/// ([`Unwinder::EhFrame`]), not walked by frame pointers.
const EH_FRAME: u8 = 0x02;

impl RawKind {
    /// Number of kinds (length of per-kind counter arrays).
    pub(crate) const COUNT: usize = 22;

    /// Decodes a kind byte; `None` for bytes no writer produces.
    pub(crate) const fn from_byte(byte: u8) -> Option<RawKind> {
        Some(match byte {
            0 => RawKind::Alloc,
            1 => RawKind::Free,
            2 => RawKind::ReallocFrom,
            3 => RawKind::ReallocTo,
            4 => RawKind::SpanEnter,
            5 => RawKind::SpanExit,
            6 => RawKind::OpBegin,
            7 => RawKind::OpEnd,
            8 => RawKind::DeviceAlloc,
            9 => RawKind::DeviceFree,
            10 => RawKind::SetCategory,
            11 => RawKind::AnnotateHead,
            12 => RawKind::AnnotateTail,
            13 => RawKind::PoolHead,
            14 => RawKind::PoolTail,
            15 => RawKind::Oom,
            16 => RawKind::StackPcs,
            17 => RawKind::DeviceReserved,
            18 => RawKind::DeviceMemory,
            19 => RawKind::VmmMap,
            20 => RawKind::VmmUnmap,
            21 => RawKind::VmmRelease,
            _ => return None,
        })
    }

    /// Whether this event leads a record of several events (the first half of a two-event
    /// record, or a part of a sampled stack), whose last event counts it.
    pub(crate) const fn is_head(self) -> bool {
        matches!(
            self,
            RawKind::ReallocFrom | RawKind::AnnotateHead | RawKind::PoolHead | RawKind::StackPcs
        )
    }
}

/// One captured event.
///
/// The fields are visible to `capture` (the ring copies events, its models build them) but not
/// to the collector, which reads events only through [`Decoder`]: outside `capture`, a
/// `SpanEnter` event can only come from [`RawEvent::span_enter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct RawEvent {
    /// Clock reading when the event happened (see `clock`).
    pub(super) ticks: u64,
    /// A [`RawKind`] byte.
    pub(super) kind: u8,
    /// Kind-specific byte (category index, span label, sub-kind).
    pub(super) flags: u8,
    /// Device id from the interner (`0` = the CPU heap).
    pub(super) device: u16,
    /// The innermost span open on the thread (`0`: none).
    pub(super) span: u32,
    /// First payload word.
    pub(super) a: u64,
    /// Second payload word.
    pub(super) b: u64,
}

const _: () = assert!(std::mem::size_of::<RawEvent>() == 32);

/// Longest span name an event carries: the length shares a word with the span's id.
const MAX_NAME_LEN: usize = u32::MAX as usize;

impl RawEvent {
    #[inline(always)]
    const fn new(
        kind: RawKind,
        ticks: u64,
        span: u32,
        flags: u8,
        device: u16,
        a: u64,
        b: u64,
    ) -> RawEvent {
        RawEvent {
            ticks,
            kind: kind as u8,
            flags,
            device,
            span,
            a,
            b,
        }
    }

    /// The clock reading the event was stamped with.
    #[inline(always)]
    pub(crate) fn ticks(&self) -> u64 {
        self.ticks
    }

    /// The innermost span open on the thread when the event was stamped.
    #[inline(always)]
    pub(crate) fn span(&self) -> u32 {
        self.span
    }

    /// The heap address whose block the event ends (a free, a realloc's first half), for a
    /// hint to the live map ahead of it.
    #[inline(always)]
    pub(crate) fn ended_heap_address(&self) -> Option<u64> {
        (self.kind == RawKind::Free as u8 || self.kind == RawKind::ReallocFrom as u8)
            .then_some(self.a)
    }

    /// A heap block of `size` bytes became live at `addr`.
    #[inline(always)]
    pub(crate) fn alloc(
        ticks: u64,
        span: u32,
        category: Category,
        addr: u64,
        size: u64,
    ) -> RawEvent {
        RawEvent::new(RawKind::Alloc, ticks, span, category as u8, 0, addr, size)
    }

    /// The heap block at `addr` is about to be freed.
    #[inline(always)]
    pub(crate) fn free(ticks: u64, span: u32, addr: u64, size: u64) -> RawEvent {
        RawEvent::new(RawKind::Free, ticks, span, 0, 0, addr, size)
    }

    /// A completed realloc, as its two halves: the old block given up at `released` (clamped
    /// to `ticks`, so the halves stay in order) and the new block live at `ticks`.
    #[inline(always)]
    pub(crate) fn realloc(
        released: u64,
        ticks: u64,
        span: u32,
        category: Category,
        old: (u64, u64),
        new: (u64, u64),
    ) -> [RawEvent; 2] {
        let category = category as u8;
        [
            RawEvent::new(
                RawKind::ReallocFrom,
                released.min(ticks),
                span,
                category,
                0,
                old.0,
                old.1,
            ),
            RawEvent::new(RawKind::ReallocTo, ticks, span, category, 0, new.0, new.1),
        ]
    }

    /// Span `id` named `name` opened inside `parent`. A name longer than 4 GiB is cut at the
    /// last character boundary that fits.
    #[inline(always)]
    pub(crate) fn span_enter(
        ticks: u64,
        parent: u32,
        name: &'static str,
        id: u32,
        label: SpanLabel,
    ) -> RawEvent {
        let mut len = name.len().min(MAX_NAME_LEN);
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        let b = len as u64 | (u64::from(id) << 32);
        RawEvent::new(
            RawKind::SpanEnter,
            ticks,
            parent,
            label.to_byte(),
            0,
            name.as_ptr() as u64,
            b,
        )
    }

    /// Span `id` closed.
    #[inline(always)]
    pub(crate) fn span_exit(ticks: u64, id: u32) -> RawEvent {
        RawEvent::new(RawKind::SpanExit, ticks, id, 0, 0, 0, 0)
    }

    /// An op named by interned `name` started.
    #[inline(always)]
    pub(crate) fn op_begin(ticks: u64, span: u32, name: u32) -> RawEvent {
        RawEvent::new(RawKind::OpBegin, ticks, span, 0, 0, u64::from(name), 0)
    }

    /// The innermost op ended.
    #[inline(always)]
    pub(crate) fn op_end(ticks: u64, span: u32) -> RawEvent {
        RawEvent::new(RawKind::OpEnd, ticks, span, 0, 0, 0, 0)
    }

    /// Device tensor `tensor` of `bytes` became live on interned `device`.
    #[inline(always)]
    pub(crate) fn device_alloc(
        ticks: u64,
        span: u32,
        device: u16,
        category: Category,
        tensor: u64,
        bytes: u64,
    ) -> RawEvent {
        RawEvent::new(
            RawKind::DeviceAlloc,
            ticks,
            span,
            category as u8,
            device,
            tensor,
            bytes,
        )
    }

    /// Device tensor `tensor` died.
    #[inline(always)]
    pub(crate) fn device_free(
        ticks: u64,
        span: u32,
        device: u16,
        tensor: u64,
        bytes: u64,
    ) -> RawEvent {
        RawEvent::new(RawKind::DeviceFree, ticks, span, 0, device, tensor, bytes)
    }

    /// The live block `key` on `device` has `category` from now on.
    #[inline(always)]
    pub(crate) fn set_category(
        ticks: u64,
        span: u32,
        device: u16,
        key: u64,
        category: Category,
    ) -> RawEvent {
        RawEvent::new(
            RawKind::SetCategory,
            ticks,
            span,
            category as u8,
            device,
            key,
            0,
        )
    }

    /// What made the live block `key` on `device`: interned op name, shape and dtype.
    #[inline(always)]
    pub(crate) fn annotation(
        ticks: u64,
        span: u32,
        device: u16,
        key: u64,
        op: u32,
        shape: Option<u32>,
        dtype: Option<u32>,
    ) -> [RawEvent; 2] {
        let plus_one = |id: Option<u32>| id.map_or(0, |id| u64::from(id) + 1);
        [
            RawEvent::new(
                RawKind::AnnotateHead,
                ticks,
                span,
                0,
                device,
                key,
                u64::from(op),
            ),
            RawEvent::new(
                RawKind::AnnotateTail,
                ticks,
                span,
                0,
                device,
                plus_one(shape),
                plus_one(dtype),
            ),
        ]
    }

    /// `source` refused `requested` bytes on `device`; `largest_free` is the pool's largest
    /// free block, when the refuser knows it.
    #[inline(always)]
    pub(crate) fn oom(
        ticks: u64,
        span: u32,
        device: u16,
        source: OomSource,
        requested: u64,
        largest_free: Option<u64>,
    ) -> RawEvent {
        RawEvent::new(
            RawKind::Oom,
            ticks,
            span,
            source as u8,
            device,
            requested,
            largest_free.map_or(0, |bytes| bytes.saturating_add(1)),
        )
    }

    /// A device event of kind `kind` with its two words: the driver's pool figure, the
    /// device's memory before recording, or a step of a virtual-memory mapping (see
    /// [`RawKind`] for what `a` and `b` hold in each).
    #[inline(always)]
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn device_memory(
        kind: DeviceMemoryKind,
        ticks: u64,
        span: u32,
        device: u16,
        a: u64,
        b: u64,
    ) -> RawEvent {
        RawEvent::new(kind.raw_kind(), ticks, span, 0, device, a, b)
    }

    /// A device pool's state.
    #[inline(always)]
    pub(crate) fn pool_state(
        ticks: u64,
        span: u32,
        device: u16,
        pool: PoolReport,
    ) -> [RawEvent; 2] {
        [
            RawEvent::new(
                RawKind::PoolHead,
                ticks,
                span,
                0,
                device,
                pool.capacity,
                pool.reserved,
            ),
            RawEvent::new(
                RawKind::PoolTail,
                ticks,
                span,
                0,
                device,
                pool.largest_free,
                pool.fragmentation.to_bits(),
            ),
        ]
    }
}

impl RawEvent {
    /// Whether this is a plain heap allocation (not sampled) and `next` the free of the very
    /// block it made: the pair a short-lived block leaves in its thread's ring.
    #[inline]
    pub(crate) fn is_freed_by(&self, next: &RawEvent) -> bool {
        self.kind == RawKind::Alloc as u8
            && self.flags & SAMPLED == 0
            && next.kind == RawKind::Free as u8
            && next.a == self.a
            && next.device == self.device
    }

    /// Whether this is a realloc's first half and `next` its second.
    #[inline]
    pub(crate) fn is_completed_by(&self, next: &RawEvent) -> bool {
        self.kind == RawKind::ReallocFrom as u8 && next.kind == RawKind::ReallocTo as u8
    }

    /// The first half of a realloc, as it is merged: its clock reading and the old block's
    /// address and size. The analysis frees the old address at this point, so that another
    /// thread's reuse of it, stamped before the second half, is a new block.
    #[inline]
    pub(crate) fn realloc_release(&self) -> Option<ReallocRelease> {
        (self.kind == RawKind::ReallocFrom as u8).then_some(ReallocRelease {
            ticks: self.ticks,
            span: self.span,
            old_addr: self.a,
            old_size: self.b,
        })
    }

    /// A sampled allocation as one unit of `N` events: its call stack `pcs` (innermost first,
    /// at most `2 * (N - T)` of them; more are cut) in `N - T` `StackPcs` events, then the `T`
    /// events of the record itself (`Alloc`, or the two halves of a realloc), the last one
    /// marked as sampled. The stack parts are stamped like the record's first event.
    #[inline]
    pub(crate) fn sampled<const N: usize, const T: usize>(
        pcs: &[u64],
        walk: StackWalk,
        record: [RawEvent; T],
    ) -> [RawEvent; N] {
        let parts = N - T;
        let kept = pcs.len().min(2 * parts);
        let truncated = walk.truncated || kept < pcs.len();
        let flags = if truncated { TRUNCATED } else { 0 }
            | match walk.unwinder {
                Unwinder::FramePointers => 0,
                Unwinder::EhFrame => EH_FRAME,
            };
        let ticks = record.first().map_or(0, |first| first.ticks);
        let mut unit: [RawEvent; N] = std::array::from_fn(|index| {
            if index >= parts {
                return record[index - parts];
            }
            let pc = |at: usize| if at < kept { pcs[at] } else { 0 };
            RawEvent::new(
                RawKind::StackPcs,
                ticks,
                0,
                flags,
                0,
                pc(2 * index),
                pc(2 * index + 1),
            )
        });
        if let Some(last) = unit.last_mut() {
            last.flags |= SAMPLED;
        }
        unit
    }

    /// The kinds of a [`RawEvent::sampled`] unit, for counting it when it is dropped.
    pub(crate) fn sampled_kinds<const N: usize, const T: usize>(
        record: [RawKind; T],
    ) -> [RawKind; N] {
        std::array::from_fn(|index| {
            if index + T >= N {
                record[index + T - N]
            } else {
                RawKind::StackPcs
            }
        })
    }
}

/// The device events with two plain words and nothing else (see [`RawKind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceMemoryKind {
    /// [`RawKind::DeviceReserved`].
    Reserved,
    /// [`RawKind::DeviceMemory`].
    Memory,
    /// [`RawKind::VmmMap`].
    Map,
    /// [`RawKind::VmmUnmap`].
    Unmap,
    /// [`RawKind::VmmRelease`].
    Release,
}

impl DeviceMemoryKind {
    /// The kind of the event it is recorded as.
    pub(crate) const fn raw_kind(self) -> RawKind {
        match self {
            DeviceMemoryKind::Reserved => RawKind::DeviceReserved,
            DeviceMemoryKind::Memory => RawKind::DeviceMemory,
            DeviceMemoryKind::Map => RawKind::VmmMap,
            DeviceMemoryKind::Unmap => RawKind::VmmUnmap,
            DeviceMemoryKind::Release => RawKind::VmmRelease,
        }
    }
}

/// What a device pool reports about itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PoolReport {
    /// Usable bytes.
    pub(crate) capacity: u64,
    /// Bytes reserved now.
    pub(crate) reserved: u64,
    /// Largest free block.
    pub(crate) largest_free: u64,
    /// `1 - largest free block / free bytes`.
    pub(crate) fragmentation: f64,
}

/// A decoded record: one event, or both halves of a four-word one. Ids of names, shapes and
/// devices are the process-wide interner's (`capture::names`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Record {
    /// A heap block became live.
    Alloc {
        addr: u64,
        size: u64,
        category: Category,
    },
    /// A heap block was freed.
    Free { addr: u64, size: u64 },
    /// A heap block was resized; the old block was given up at `released` ticks.
    Realloc {
        released: u64,
        old_addr: u64,
        old_size: u64,
        new_addr: u64,
        new_size: u64,
        category: Category,
    },
    /// A span opened; the record's `span` is its parent.
    SpanEnter {
        name: &'static str,
        id: u32,
        label: SpanLabel,
    },
    /// The span in the record's `span` closed.
    SpanExit,
    /// An op started.
    OpBegin { name: u32 },
    /// The innermost op ended.
    OpEnd,
    /// A device tensor became live.
    DeviceAlloc {
        device: u16,
        tensor: u64,
        bytes: u64,
        category: Category,
    },
    /// A device tensor died.
    DeviceFree {
        device: u16,
        tensor: u64,
        bytes: u64,
    },
    /// A live block's category changed.
    SetCategory {
        device: u16,
        key: u64,
        category: Category,
    },
    /// What made a live block.
    Annotate {
        device: u16,
        key: u64,
        op: u32,
        shape: Option<u32>,
        dtype: Option<u32>,
    },
    /// A device pool's state.
    PoolState { device: u16, pool: PoolReport },
    /// An allocation was refused.
    Oom {
        device: u16,
        source: OomSource,
        requested: u64,
        largest_free: Option<u64>,
    },
    /// A device event with two plain words (see [`RawKind`]).
    DeviceMemory {
        kind: DeviceMemoryKind,
        device: u16,
        a: u64,
        b: u64,
    },
}

/// A [`Record`] with the stamp and span of the event that completed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Decoded {
    /// The record is a sampled allocation: [`Decoder::stack`] holds its call stack.
    pub(crate) sampled: bool,
    /// Clock reading of the (last) event.
    pub(crate) ticks: u64,
    /// The innermost open span, the parent for `SpanEnter`, the closing span for `SpanExit`.
    pub(crate) span: u32,
    /// What happened.
    pub(crate) record: Record,
}

/// A short-lived heap block: a plain allocation and the free of it right after
/// ([`Decoder::decode_short_lived`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShortLived {
    /// The allocation's clock reading and innermost open span.
    pub(crate) made: (u64, u32),
    /// The free's clock reading and innermost open span.
    pub(crate) ended: (u64, u32),
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) category: Category,
}

/// A plain heap event: an allocation or a realloc that was not sampled, or a free
/// ([`Decoder::decode_plain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plain {
    Alloc {
        addr: u64,
        size: u64,
        category: Category,
    },
    Free {
        addr: u64,
    },
    /// A realloc's second half, with what its first half held.
    Realloc {
        /// The first half's clock reading.
        released: u64,
        old_addr: u64,
        new_addr: u64,
        new_size: u64,
        category: Category,
    },
}

/// The first half of a realloc ([`RawEvent::realloc_release`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReallocRelease {
    /// Clock reading taken before the inner realloc ran.
    pub(crate) ticks: u64,
    /// The innermost open span.
    pub(crate) span: u32,
    /// The old block's address and size.
    pub(crate) old_addr: u64,
    pub(crate) old_size: u64,
}

/// Decodes one ring's events in order, holding the first half of a two-event record until its
/// second arrives (the halves may be drained in different rounds).
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    head: Option<RawEvent>,
    /// The stack parts of the record being decoded (or of the last one, once complete).
    stack: Vec<u64>,
    stack_walk: StackWalk,
    /// The last record completed: the next stack part starts a new stack.
    stack_done: bool,
}

impl Decoder {
    /// Forgets a held first half and stack (the ring changed hands).
    pub(crate) fn reset(&mut self) {
        self.head = None;
        self.stack.clear();
        self.stack_walk = StackWalk::default();
    }

    /// A plain allocation and the free of its block that follows it ([`RawEvent::is_freed_by`]),
    /// decoded as [`Decoder::decode`] would decode the two one after the other.
    #[inline]
    pub(crate) fn decode_short_lived(&mut self, alloc: &RawEvent, free: &RawEvent) -> ShortLived {
        debug_assert!(alloc.is_freed_by(free));
        // Neither event is sampled, a first half or a stack part: like any such record, they
        // leave no stack behind them.
        if !self.stack.is_empty() || self.stack_walk != StackWalk::default() {
            self.stack.clear();
            self.stack_walk = StackWalk::default();
        }
        self.stack_done = true;
        ShortLived {
            made: (alloc.ticks, alloc.span),
            ended: (free.ticks, free.span),
            addr: alloc.a,
            size: alloc.b,
            category: Category::from_index(alloc.flags),
        }
    }

    /// `raw` decoded as [`Decoder::decode`] would decode it when it is a plain heap event,
    /// most of any stream, without building a [`Record`]; otherwise `None`, and nothing
    /// changes.
    #[inline]
    pub(crate) fn decode_plain(&mut self, raw: &RawEvent) -> Option<Plain> {
        let plain = if raw.kind == RawKind::Alloc as u8 && raw.flags & SAMPLED == 0 {
            Plain::Alloc {
                addr: raw.a,
                size: raw.b,
                category: Category::from_index(raw.flags),
            }
        } else if raw.kind == RawKind::Free as u8 {
            Plain::Free { addr: raw.a }
        } else if raw.kind == RawKind::ReallocTo as u8 && raw.flags & SAMPLED == 0 {
            let first = self.head.take().unwrap_or_default();
            Plain::Realloc {
                released: first.ticks,
                old_addr: first.a,
                new_addr: raw.a,
                new_size: raw.b,
                category: Category::from_index(raw.flags),
            }
        } else {
            return None;
        };
        // Like any record that is not sampled, it leaves no stack behind it.
        if !self.stack.is_empty() || self.stack_walk != StackWalk::default() {
            self.stack.clear();
            self.stack_walk = StackWalk::default();
        }
        self.stack_done = true;
        Some(plain)
    }

    /// The call stack of the last record decoded, when it was `sampled`: return addresses,
    /// innermost first, and how it was walked (cut or not, by which unwinder).
    pub(crate) fn stack(&self) -> (&[u64], StackWalk) {
        (&self.stack, self.stack_walk)
    }

    /// The record `raw` completes, if any: `None` for a first half (held) or an unknown kind.
    /// A second half without its first is decoded with zero words for the missing half.
    #[inline]
    pub(crate) fn decode(&mut self, raw: RawEvent) -> Option<Decoded> {
        let kind = RawKind::from_byte(raw.kind)?;
        if kind == RawKind::StackPcs {
            if std::mem::take(&mut self.stack_done) {
                self.stack.clear();
                self.stack_walk = StackWalk::default();
            }
            self.stack
                .extend([raw.a, raw.b].into_iter().filter(|&pc| pc != 0));
            self.stack_walk.truncated |= raw.flags & TRUNCATED != 0;
            if raw.flags & EH_FRAME != 0 {
                self.stack_walk.unwinder = Unwinder::EhFrame;
            }
            return None;
        }
        if kind.is_head() {
            self.head = Some(raw);
            return None;
        }
        let sampled =
            matches!(kind, RawKind::Alloc | RawKind::ReallocTo) && raw.flags & SAMPLED != 0;
        if !sampled {
            self.stack.clear();
            self.stack_walk = StackWalk::default();
        }
        self.stack_done = true;
        let category = Category::from_index(raw.flags & !SAMPLED);
        let device = raw.device;
        let mut first = || self.head.take().unwrap_or_default();
        let device_memory = |kind| Record::DeviceMemory {
            kind,
            device,
            a: raw.a,
            b: raw.b,
        };
        let record = match kind {
            RawKind::Alloc => Record::Alloc {
                addr: raw.a,
                size: raw.b,
                category,
            },
            RawKind::Free => Record::Free {
                addr: raw.a,
                size: raw.b,
            },
            RawKind::ReallocTo => {
                let first = first();
                Record::Realloc {
                    released: first.ticks,
                    old_addr: first.a,
                    old_size: first.b,
                    new_addr: raw.a,
                    new_size: raw.b,
                    category,
                }
            }
            RawKind::SpanEnter => Record::SpanEnter {
                // SAFETY: a `SpanEnter` event is built only by `RawEvent::span_enter` (the
                // fields are private to `capture`, whose hook calls it), which stores the
                // pointer of a `&'static str` and a length at one of its char boundaries: the
                // bytes are valid UTF-8 and live for the rest of the process.
                name: unsafe {
                    std::str::from_utf8_unchecked(std::slice::from_raw_parts(
                        raw.a as usize as *const u8,
                        (raw.b & 0xFFFF_FFFF) as usize,
                    ))
                },
                id: (raw.b >> 32) as u32,
                label: SpanLabel::from_byte(raw.flags),
            },
            RawKind::SpanExit => Record::SpanExit,
            RawKind::OpBegin => Record::OpBegin { name: raw.a as u32 },
            RawKind::OpEnd => Record::OpEnd,
            RawKind::DeviceAlloc => Record::DeviceAlloc {
                device,
                tensor: raw.a,
                bytes: raw.b,
                category,
            },
            RawKind::DeviceFree => Record::DeviceFree {
                device,
                tensor: raw.a,
                bytes: raw.b,
            },
            RawKind::SetCategory => Record::SetCategory {
                device,
                key: raw.a,
                category,
            },
            RawKind::AnnotateTail => {
                let first = first();
                let minus_one = |word: u64| word.checked_sub(1).map(|id| id as u32);
                Record::Annotate {
                    device,
                    key: first.a,
                    op: first.b as u32,
                    shape: minus_one(raw.a),
                    dtype: minus_one(raw.b),
                }
            }
            RawKind::PoolTail => {
                let first = first();
                Record::PoolState {
                    device,
                    pool: PoolReport {
                        capacity: first.a,
                        reserved: first.b,
                        largest_free: raw.a,
                        fragmentation: f64::from_bits(raw.b),
                    },
                }
            }
            RawKind::Oom => Record::Oom {
                device,
                source: OomSource::from_byte(raw.flags),
                requested: raw.a,
                largest_free: raw.b.checked_sub(1),
            },
            RawKind::DeviceReserved => device_memory(DeviceMemoryKind::Reserved),
            RawKind::DeviceMemory => device_memory(DeviceMemoryKind::Memory),
            RawKind::VmmMap => device_memory(DeviceMemoryKind::Map),
            RawKind::VmmUnmap => device_memory(DeviceMemoryKind::Unmap),
            RawKind::VmmRelease => device_memory(DeviceMemoryKind::Release),
            RawKind::ReallocFrom
            | RawKind::AnnotateHead
            | RawKind::PoolHead
            | RawKind::StackPcs => return None,
        };
        Some(Decoded {
            sampled,
            ticks: raw.ticks,
            span: raw.span,
            record,
        })
    }
}

impl Record {
    /// The kind of the event that completes this record (the counter its drops go to).
    pub(crate) fn kind(&self) -> RawKind {
        match self {
            Record::Alloc { .. } => RawKind::Alloc,
            Record::Free { .. } => RawKind::Free,
            Record::Realloc { .. } => RawKind::ReallocTo,
            Record::SpanEnter { .. } => RawKind::SpanEnter,
            Record::SpanExit => RawKind::SpanExit,
            Record::OpBegin { .. } => RawKind::OpBegin,
            Record::OpEnd => RawKind::OpEnd,
            Record::DeviceAlloc { .. } => RawKind::DeviceAlloc,
            Record::DeviceFree { .. } => RawKind::DeviceFree,
            Record::SetCategory { .. } => RawKind::SetCategory,
            Record::Annotate { .. } => RawKind::AnnotateTail,
            Record::PoolState { .. } => RawKind::PoolTail,
            Record::Oom { .. } => RawKind::Oom,
            Record::DeviceMemory { kind, .. } => kind.raw_kind(),
        }
    }
}

#[cfg(test)]
mod tests;

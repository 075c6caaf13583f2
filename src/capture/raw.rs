//! The fixed-size event a capture hook writes into its thread's ring.
//!
//! 32 bytes, plain data, no pointers the collector must follow except `&'static str` names,
//! which stay valid for the life of the process.

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
}

impl RawKind {
    /// Number of kinds (length of per-kind counter arrays).
    pub(crate) const COUNT: usize = 15;

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
            _ => return None,
        })
    }

    /// Whether this is the first half of a two-event record, whose second half counts it.
    pub(crate) const fn is_head(self) -> bool {
        matches!(
            self,
            RawKind::ReallocFrom | RawKind::AnnotateHead | RawKind::PoolHead
        )
    }
}

/// One captured event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct RawEvent {
    /// Clock reading when the event happened (see `clock`).
    pub(crate) ticks: u64,
    /// A [`RawKind`] byte.
    pub(crate) kind: u8,
    /// Kind-specific byte (category index, span label, sub-kind).
    pub(crate) flags: u8,
    /// Device id from the interner (`0` = the CPU heap).
    pub(crate) device: u16,
    /// The innermost span open on the thread (`0`: none).
    pub(crate) span: u32,
    /// First payload word.
    pub(crate) a: u64,
    /// Second payload word.
    pub(crate) b: u64,
}

const _: () = assert!(std::mem::size_of::<RawEvent>() == 32);

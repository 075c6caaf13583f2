//! The fixed-size event a capture hook writes into its thread's ring.
//!
//! 32 bytes, plain data, no pointers the collector must follow except `&'static str` names,
//! which stay valid for the life of the process.

/// What a [`RawEvent`] records. Also the index of per-kind drop counters.
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
    /// Op hooks, device tensors and pools: decoded by the op/pool layer.
    /// `a`, `b` are interned ids and values, `flags` the sub-kind.
    Other = 6,
}

impl RawKind {
    /// Number of kinds (length of per-kind counter arrays).
    pub(crate) const COUNT: usize = 7;

    /// Decodes a kind byte; `None` for bytes no writer produces.
    pub(crate) const fn from_byte(byte: u8) -> Option<RawKind> {
        Some(match byte {
            0 => RawKind::Alloc,
            1 => RawKind::Free,
            2 => RawKind::ReallocFrom,
            3 => RawKind::ReallocTo,
            4 => RawKind::SpanEnter,
            5 => RawKind::SpanExit,
            6 => RawKind::Other,
            _ => return None,
        })
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
    /// Device index for allocation events (`0` = the CPU heap).
    pub(crate) device: u16,
    /// The innermost span open on the thread (`0`: none).
    pub(crate) span: u32,
    /// First payload word.
    pub(crate) a: u64,
    /// Second payload word.
    pub(crate) b: u64,
}

const _: () = assert!(std::mem::size_of::<RawEvent>() == 32);

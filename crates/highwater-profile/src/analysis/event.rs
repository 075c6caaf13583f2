//! The events the analysis replays.
//!
//! The collector decodes each thread's ring into these, already in nanoseconds and merged into
//! one order; tests write them by hand; a recorded run can be saved and, with the feature `read`, replayed. Strings are
//! interned by the [`Timeline`](super::Timeline) that consumes them ([`NameId`], [`DeviceId`]).

use serde::Serialize;

use crate::model::OomSource;
use crate::model::{Category, SpanLabel};

/// An interned string (span name, op name, dtype) in a [`Timeline`](super::Timeline)'s table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
pub struct NameId(pub u32);

/// An interned device name in a [`Timeline`](super::Timeline)'s table; `cpu` is always
/// [`DeviceId::CPU`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
pub struct DeviceId(pub u16);

impl DeviceId {
    /// The host heap, where the allocator hook's allocations live.
    pub const CPU: DeviceId = DeviceId(0);
}

/// An interned tensor shape in a [`Timeline`](super::Timeline)'s table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
pub struct ShapeId(pub u32);

/// An interned call stack (program counters) in a [`Timeline`](super::Timeline)'s table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
pub struct StackId(pub u32);

/// A span instance, unique within its thread for the session; `0` means "no span".
pub type SpanSeq = u32;

/// One thing that happened on one thread.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
pub struct Event {
    /// When it happened, in nanoseconds since the session started.
    pub ts_ns: u64,
    /// The thread it happened on (unique for the session).
    pub thread: u32,
    /// The innermost span open on that thread when it happened (`0`: none).
    pub span: SpanSeq,
    /// What happened.
    pub kind: EventKind,
}

/// What an [`Event`] records.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    /// A block of `size` bytes became live at `addr` on `device`.
    Alloc {
        /// Device the block lives on.
        device: DeviceId,
        /// Address (heap) or tensor id (device tensors) that identifies the block.
        addr: u64,
        /// Bytes requested.
        size: u64,
        /// Category decided by the span stack (or by an op hook).
        category: Category,
    },
    /// The block at `addr` on `device` stopped being live. `size` is what the freer knew.
    Free {
        /// Device the block lived on.
        device: DeviceId,
        /// Address or tensor id.
        addr: u64,
        /// Bytes the freer says the block had (used when the block was never seen).
        size: u64,
    },
    /// A heap block was resized, possibly moving: one event, never an extra alloc + free.
    Realloc {
        /// Address before.
        old_addr: u64,
        /// Size before, as the caller said.
        old_size: u64,
        /// Address after (may equal `old_addr`).
        new_addr: u64,
        /// Size after.
        new_size: u64,
        /// Category decided by the span stack at the time of the resize.
        category: Category,
        /// When the old block was given up, if earlier than the event's own time: the old
        /// address is judged as of then (a later allocation of it by another thread is a new
        /// life), while the new block is live from the event's time.
        #[serde(default)]
        released_ns: Option<u64>,
    },
    /// The first half of this thread's next [`EventKind::Realloc`]: the heap block at
    /// `old_addr` was handed back to the allocator to be resized (stamped before the resize
    /// ran). The address may be reused by another thread from now on, so the block leaves it;
    /// its bytes stay live and counted until the realloc completes. The realloc that follows
    /// names the same `old_addr`. Not counted as an event of its own.
    ReallocRelease {
        /// Address before.
        old_addr: u64,
        /// Size before, as the caller said.
        old_size: u64,
    },
    /// A span opened on this thread. The event's `span` field is the parent.
    SpanEnter {
        /// The new span instance.
        id: SpanSeq,
        /// Span name.
        name: NameId,
        /// What the span says about its allocations.
        label: SpanLabel,
    },
    /// The span `id` on this thread closed.
    SpanExit {
        /// The closing span instance.
        id: SpanSeq,
    },
    /// An op started on this thread: heap allocations until the matching [`EventKind::OpEnd`]
    /// are attributed to it.
    OpBegin {
        /// Op name (`matmul`, …).
        name: NameId,
        /// Output tensor id, `0` when unknown.
        output: u64,
        /// Output shape, when known.
        shape: Option<ShapeId>,
        /// Output dtype, when known.
        dtype: Option<NameId>,
    },
    /// The innermost op on this thread ended.
    OpEnd,
    /// A live block's category was set explicitly (for example: this storage is a parameter).
    SetCategory {
        /// Device the block lives on.
        device: DeviceId,
        /// Address or tensor id.
        addr: u64,
        /// Its category from now on.
        category: Category,
    },
    /// Names what a live block is: the op that made it and its shape (an op hook that learns
    /// its output after the op ran). Unknown blocks are ignored.
    Annotate {
        /// Device the block lives on.
        device: DeviceId,
        /// Address or tensor id.
        addr: u64,
        /// Op that made it.
        op: NameId,
        /// Its shape, when known.
        shape: Option<ShapeId>,
        /// Its dtype, when known.
        dtype: Option<NameId>,
    },
    /// The heap block that the previous event of this thread made live at `addr` (an
    /// [`EventKind::Alloc`] on the CPU or the new side of an [`EventKind::Realloc`]) was a
    /// call-site sample, allocated from `stack`. Not counted as an event of its own.
    Sampled {
        /// Address of the sampled block.
        addr: u64,
        /// Its bytes.
        size: u64,
        /// Its category when it was allocated.
        category: Category,
        /// Its call stack ([`Timeline::intern_stack`](super::Timeline::intern_stack)).
        stack: StackId,
    },
    /// A device pool's state after a reservation or release.
    PoolState {
        /// The pool's device.
        device: DeviceId,
        /// Usable bytes of the pool.
        capacity: u64,
        /// Bytes reserved now.
        reserved: u64,
        /// Largest free block now.
        largest_free: u64,
        /// `1 - largest free block / free bytes` (0 when nothing is free).
        fragmentation: f64,
    },
    /// The device driver's memory pools hold `bytes` now (CUDA's stream-ordered allocator keeps
    /// freed blocks for reuse, so it holds more than the live buffers).
    Reserved {
        /// The device.
        device: DeviceId,
        /// Bytes the pools hold.
        bytes: u64,
    },
    /// What the device already used when recording first saw it, before its first recorded
    /// allocation (the context's fixed overhead, and any other process's memory), and its
    /// total memory, as the driver reported them. Counted once per device; later reports are
    /// ignored.
    DeviceMemory {
        /// The device.
        device: DeviceId,
        /// Bytes in use on the device then.
        in_use: u64,
        /// The device's total memory.
        total: u64,
    },
    /// An allocation on this thread was refused: the heap allocator returned null, a device
    /// pool refused an admission, or a device driver ran out of memory.
    Oom {
        /// The device it was asked of.
        device: DeviceId,
        /// Who refused it.
        source: OomSource,
        /// Bytes asked for.
        requested: u64,
        /// The pool's largest free block, when known.
        #[serde(default)]
        largest_free: Option<u64>,
    },
}

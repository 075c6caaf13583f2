//! Capture: what runs inside user threads, including inside the allocator hook.
//!
//! Every entry point here follows the hot-path rules of `docs/ARCHITECTURE.md`: it never
//! allocates through the global allocator, never takes a lock, never blocks indefinitely and
//! never panics.
//! It writes fixed-size [`RawEvent`]s into the calling thread's [`Ring`](ring::Ring). When the
//! ring is full it waits, boundedly, for the collector (lossless mode, the default) or counts the
//! event as dropped (drop mode); where it cannot record at all (no free ring, thread exiting,
//! re-entered from a signal handler) it counts the event.

pub(crate) mod frames;
pub(crate) mod gate;
pub(crate) mod oom;
pub(crate) mod raw;
pub(crate) mod registry;
pub(crate) mod ring;
pub(crate) mod sample;
pub(crate) mod sync;

sync::outside_loom! {
    pub(crate) mod wake;
    pub(crate) mod clock;
    mod hook;
    pub(crate) mod lifecycle;
    pub(crate) mod names;
    pub(crate) mod recent;
    pub(crate) mod stack;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub(crate) mod unwind;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    mod unwind_unsupported;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub(crate) use unwind_unsupported as unwind;

    pub(crate) use gate::{open_gate, recording};
    pub(crate) use hook::*;
    pub(crate) use registry::{DEFAULT_THREAD_LIMIT, MAX_THREADS};
    pub(crate) use sample::DEFAULT_SAMPLE_BYTES;
}

sync::only_in_loom! {
    #[cfg(test)]
    mod loom_models;
}

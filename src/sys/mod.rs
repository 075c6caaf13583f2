//! The operating system, in one place: memory mappings, futexes, the membarrier, the clock,
//! process and thread identity, fork, exit and thread-exit hooks, signals, the loaded modules
//! and their call-frame sections, and the few file calls std has no word for.
//!
//! Every `unsafe` call into libc lives here, as a small safe function that says what it needs;
//! clippy's `disallowed-methods` (see `clippy.toml`) refuses those calls anywhere else. Nothing
//! here allocates through the global allocator or takes a lock: the allocator hook, the
//! collector, signal handlers and `atfork` handlers all call in.

pub(crate) mod clock;
pub(crate) mod file;
pub(crate) mod futex;
pub(crate) mod membarrier;
pub(crate) mod memory;
pub(crate) mod modules;
pub(crate) mod process;
pub(crate) mod signal;

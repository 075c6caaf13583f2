//! Resolving sampled call stacks to functions, files and lines, after the session.
//!
//! Capture stores return addresses only; the collector resolves them when it assembles a
//! profile, through the `backtrace` crate (DWARF line tables via gimli, inlined frames,
//! demangled names). Each address is looked up as `pc - 1`, inside the call instruction, so
//! the line is the call's and not the next statement's.
//!
//! A resolver remembers what it resolved: a session assembles a profile at every checkpoint, and
//! resolving the same addresses again each time (about 90 ms for the candle example) would take
//! that CPU from the training threads every interval.
//!
//! A process forked from one that already ran a session does not symbolise: its sites list
//! program counters only. Resolving there hung the child in testing (a fork taken while the
//! parent's threads run can leave state the resolver needs, such as a lock, held for good).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rustc_hash::FxHashMap;

use crate::analysis::ResolveFrames;
use crate::profile::Frame;

/// Where this library's sources were when it was built: every sampled stack starts in its hook,
/// and inlined frames say whose they are only by their file.
pub(crate) const RECORDER_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");

/// The process that first made a resolver (`0`: none yet).
static FIRST_PID: AtomicU32 = AtomicU32::new(0);

/// The process's own resolver: `backtrace::resolve`, timed.
#[derive(Debug)]
pub(crate) struct Resolver {
    last_ns: AtomicU64,
    /// Frames of every address resolved so far. Only the collector and the thread that
    /// finishes the session resolve (never the allocator hook), one at a time.
    resolved: Mutex<FxHashMap<u64, Vec<Frame>>>,
}

impl Default for Resolver {
    fn default() -> Resolver {
        let _ =
            FIRST_PID.compare_exchange(0, std::process::id(), Ordering::SeqCst, Ordering::SeqCst);
        Resolver {
            last_ns: AtomicU64::new(0),
            resolved: Mutex::new(FxHashMap::default()),
        }
    }
}

impl ResolveFrames for Resolver {
    fn recorder_sources(&self) -> &str {
        RECORDER_SOURCES
    }

    fn resolve(&self, pcs: &[u64]) -> Vec<Vec<Frame>> {
        if FIRST_PID.load(Ordering::SeqCst) != std::process::id() {
            // A forked child: addresses only (see the module docs).
            return Vec::new();
        }
        let started = Instant::now();
        let mut resolved = self
            .resolved
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let frames = pcs
            .iter()
            .map(|&pc| {
                resolved
                    .entry(pc)
                    .or_insert_with(|| resolve_one(pc))
                    .clone()
            })
            .collect();
        drop(resolved);
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.store(ns, Ordering::Relaxed);
        frames
    }

    fn last_resolve_ns(&self) -> u64 {
        self.last_ns.load(Ordering::Relaxed)
    }
}

/// The frames at one return address, innermost (inlined) first.
fn resolve_one(pc: u64) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    let probe = pc.saturating_sub(1) as usize as *mut std::ffi::c_void;
    backtrace::resolve(probe, |symbol| {
        frames.push(Frame {
            pc,
            // `{:#}` leaves out the hash suffix of legacy-mangled names.
            function: symbol.name().map(|name| format!("{name:#}")),
            file: symbol.filename().map(|path| path.display().to_string()),
            line: symbol.lineno(),
            inlined: true,
        });
    });
    if let Some(outer) = frames.last_mut() {
        outer.inlined = false;
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn here() -> u64 {
        // The return address into the caller, as a stack walk records it.
        let bounds = std::cell::Cell::new(crate::capture::stack::StackBounds::UNKNOWN);
        crate::capture::stack::walk(&bounds).pcs[1]
    }

    #[test]
    fn a_return_address_resolves_to_its_caller_with_file_and_line() {
        let pc = here();
        let line = line!() - 1;
        let frames = Resolver::default().resolve(&[pc]);
        let frame = frames[0].last().expect("a frame");
        let function = frame.function.as_deref().unwrap_or_default();
        assert!(
            function.contains("a_return_address_resolves_to_its_caller"),
            "{frames:?}"
        );
        assert!(frame
            .file
            .as_deref()
            .unwrap_or_default()
            .ends_with("symbolize.rs"));
        assert_eq!(frame.line, Some(line));
        assert!(!frame.inlined);
    }

    #[test]
    fn a_second_resolve_of_the_same_addresses_gives_the_same_frames_from_the_cache() {
        let pc = here();
        let resolver = Resolver::default();
        let first = resolver.resolve(&[pc, pc + 1]);
        assert_eq!(resolver.resolved.lock().unwrap().len(), 2);
        assert_eq!(
            resolver.resolve(&[pc + 1, pc]),
            [first[1].clone(), first[0].clone()]
        );
        assert_eq!(resolver.resolved.lock().unwrap().len(), 2);
    }
}

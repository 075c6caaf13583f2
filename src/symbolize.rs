//! Resolving sampled call stacks to functions, files and lines, after the session.
//!
//! Capture stores return addresses only; the collector resolves them when it assembles a
//! profile. Each loaded module's file is opened once ([`addr2line::Loader`]: DWARF line tables
//! with inlined frames, and the symbol table), and each address is looked up as `pc - 1`,
//! inside the call instruction, so the line is the call's and not the next statement's.
//!
//! # Full paths with any debug info
//!
//! With `debug = "line-tables-only"` (what a release profile keeps for file:line at little
//! cost), DWARF names a function by its short name only (`make`, `try_allocate_in<alloc::alloc::
//! Global>`): no linkage name, no enclosing module. So names come, in this order, from:
//!
//! - for the function an address is in (not inlined): the symbol table, whose mangled name is
//!   the whole path (`call_sites::few_large`), demangled without its hash;
//! - for a function inlined there: DWARF's name when it is a path already (full debug info, or
//!   the standard library's own units); otherwise the path of the symbol table's functions of
//!   that name whose code is in the inlined frame's file, joined to DWARF's name
//!   (`alloc::raw_vec::RawVecInner::try_allocate_in<alloc::alloc::Global>`);
//! - for the standard library's functions with no such symbol, the module their file is
//!   (`alloc::vec::from_elem<u8>` from `library/alloc/src/vec/mod.rs`);
//! - else DWARF's short name as it is (a function of the program's own crate inlined everywhere
//!   has no symbol to take a path from; an inlined closure, `{closure#0}`, is given the path of
//!   the function around it once the whole stack is known: `analysis::qualify_closures`).
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
use crate::sys::modules::{loaded_images, Image};

/// Where this library's sources were when it was built: every sampled stack starts in its hook,
/// and inlined frames say whose they are only by their file.
pub(crate) const RECORDER_SOURCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/");

/// The process that first made a resolver (`0`: none yet).
static FIRST_PID: AtomicU32 = AtomicU32::new(0);

/// The process's own resolver, timed.
#[derive(Debug)]
pub(crate) struct Resolver {
    last_ns: AtomicU64,
    /// Only the collector and the thread that finishes the session resolve (never the allocator
    /// hook), one at a time.
    state: Mutex<State>,
}

/// What a resolver has learnt.
#[derive(Debug, Default)]
struct State {
    /// Frames of every address resolved so far.
    resolved: FxHashMap<u64, Vec<Frame>>,
}

/// The loaded modules' files, opened as first needed and kept for the process, so a later
/// session does not parse their debug info again (listed again when an address falls outside
/// all of them: a module loaded since).
static MODULES: Mutex<Vec<Module>> = Mutex::new(Vec::new());

impl Default for Resolver {
    fn default() -> Resolver {
        let _ =
            FIRST_PID.compare_exchange(0, std::process::id(), Ordering::SeqCst, Ordering::SeqCst);
        Resolver {
            last_ns: AtomicU64::new(0),
            state: Mutex::new(State::default()),
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
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let frames = pcs.iter().map(|&pc| state.frames_at(pc)).collect();
        drop(state);
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_ns.store(ns, Ordering::Relaxed);
        frames
    }

    fn last_resolve_ns(&self) -> u64 {
        self.last_ns.load(Ordering::Relaxed)
    }
}

impl State {
    /// The frames at return address `pc`, innermost (inlined) first.
    fn frames_at(&mut self, pc: u64) -> Vec<Frame> {
        if let Some(frames) = self.resolved.get(&pc) {
            return frames.clone();
        }
        let mut modules = MODULES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let frames = match module_of(&mut modules, pc) {
            Some(module) => module.frames_at(pc),
            None => Vec::new(),
        };
        drop(modules);
        self.resolved.insert(pc, frames.clone());
        frames
    }
}

/// The module mapped at `pc`, among `modules` (listed again if none is).
fn module_of(modules: &mut Vec<Module>, pc: u64) -> Option<&mut Module> {
    let find = |modules: &[Module]| modules.iter().position(|m| m.image.avma.contains(&pc));
    let index = match find(modules) {
        Some(index) => index,
        None => {
            let listed: Vec<Module> = loaded_images().into_iter().map(Module::new).collect();
            // Keep the files already opened for modules still mapped at the same place.
            let mut kept = std::mem::take(modules);
            *modules = listed
                .into_iter()
                .map(|fresh| {
                    match kept.iter().position(|old| {
                        old.image.avma == fresh.image.avma && old.image.path == fresh.image.path
                    }) {
                        Some(at) => kept.swap_remove(at),
                        None => fresh,
                    }
                })
                .collect();
            find(modules)?
        }
    };
    Some(&mut modules[index])
}

/// One loaded module's file, opened as first needed.
struct Module {
    image: Image,
    /// `None` until first used; then `Some(None)` if the file cannot be read.
    file: Option<Option<addr2line::Loader>>,
    /// Rust functions in the symbol table by their last path segment, made when a short DWARF
    /// name first needs a path: (address, demangled path) of each.
    by_base_name: Option<FxHashMap<String, Vec<(u64, String)>>>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("image", &self.image)
            .finish_non_exhaustive()
    }
}

impl Module {
    fn new(image: Image) -> Module {
        Module {
            image,
            file: None,
            by_base_name: None,
        }
    }

    /// The frames at return address `pc` (a process address inside this module).
    fn frames_at(&mut self, pc: u64) -> Vec<Frame> {
        let path = self.image.path.clone();
        let file = self
            .file
            .get_or_insert_with(|| path.and_then(|path| addr2line::Loader::new(path).ok()));
        let Some(file) = file.as_ref() else {
            return Vec::new();
        };
        // The address as the file states it, inside the call instruction.
        let probe = pc.saturating_sub(1).wrapping_sub(self.image.bias);
        let mut frames: Vec<Frame> = Vec::new();
        if let Ok(mut found) = file.find_frames(probe) {
            while let Ok(Some(frame)) = found.next() {
                let location = frame.location;
                frames.push({
                    let mut made = Frame::default();
                    made.pc = pc;
                    made.function = frame
                        .function
                        .and_then(|name| name.demangle().ok().map(|name| name.into_owned()));
                    made.file = location.as_ref().and_then(|l| l.file).map(str::to_owned);
                    made.line = location.as_ref().and_then(|l| l.line);
                    made.inlined = true;
                    made
                });
            }
        }
        let symbol = file.find_symbol(probe).map(demangled);
        match frames.last_mut() {
            Some(outer) => {
                outer.inlined = false;
                if symbol.is_some() {
                    outer.function = symbol;
                }
            }
            None if symbol.is_some() => frames.push({
                let mut frame = Frame::default();
                frame.pc = pc;
                frame.function = symbol;
                frame
            }),
            None => {}
        }
        let inlined = frames.len().saturating_sub(1);
        for frame in &mut frames[..inlined] {
            let short = match &frame.function {
                Some(name) if !has_path(name) => name.clone(),
                _ => continue,
            };
            let full = self.full_path(&short, frame.file.as_deref()).or_else(|| {
                std_module_path(frame.file.as_deref()?).map(|module| format!("{module}::{short}"))
            });
            if let Some(full) = full {
                frame.function = Some(full);
            }
        }
        frames
    }

    /// The path of a function DWARF names only by `short`, from the symbol table: the path of
    /// its functions of that name whose code is in `file` (the inlined frame's), when they have
    /// one, joined to `short` (so the generic arguments are the inlined frame's own, not
    /// another instance's).
    fn full_path(&mut self, short: &str, file: Option<&str>) -> Option<String> {
        if self.by_base_name.is_none() {
            let path = self.image.path.clone();
            self.by_base_name = Some(path.map(|path| index_symbols(&path)).unwrap_or_default());
        }
        let candidates = self.by_base_name.as_ref()?.get(base_name(short))?;
        const MOST_LOOKED_AT: usize = 64;
        let file = file?;
        let loader = self.file.as_ref()?.as_ref()?;
        let mut found: Option<&String> = None;
        for (address, name) in candidates.iter().take(MOST_LOOKED_AT) {
            // The function's own file: its outermost frame's at its first address (whose
            // instruction may be inlined code's, from another file).
            let mut own_file = None;
            if let Ok(mut found) = loader.find_frames(*address) {
                while let Ok(Some(frame)) = found.next() {
                    own_file = frame.location.and_then(|location| location.file);
                }
            }
            let in_file = own_file == Some(file);
            if in_file {
                match found {
                    Some(earlier) if !same_path(earlier, name) => return None,
                    _ => found = Some(name),
                }
            }
        }
        let prefix = enclosing_path(found?)?;
        Some(format!("{prefix}::{short}"))
    }
}

/// Rust functions of the file at `path` by the last segment of their path.
fn index_symbols(path: &std::path::Path) -> FxHashMap<String, Vec<(u64, String)>> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let mut index: FxHashMap<String, Vec<(u64, String)>> = FxHashMap::default();
    let Ok(file) = std::fs::File::open(path) else {
        return index;
    };
    // SAFETY: a read-only private mapping of the file; the symbol table is parsed from it and
    // copied out before it is unmapped. A file changed meanwhile gives wrong names, never
    // unsoundness the parser does not guard against (it bounds-checks every read).
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return index;
    };
    let Ok(object) = object::File::parse(&*map) else {
        return index;
    };
    for symbol in object.symbols().chain(object.dynamic_symbols()) {
        if symbol.kind() != SymbolKind::Text || symbol.address() == 0 {
            continue;
        }
        let Ok(raw) = symbol.name() else {
            continue;
        };
        let Ok(name) = rustc_demangle::try_demangle(raw) else {
            continue;
        };
        let name = format!("{name:#}");
        let entry = index.entry(base_name(&name).to_owned()).or_default();
        if !entry.iter().any(|(_, known)| *known == name) {
            entry.push((symbol.address(), name));
        }
    }
    index
}

/// A symbol's name demangled without its hash, or as it is when it is not a Rust name.
fn demangled(raw: &str) -> String {
    match rustc_demangle::try_demangle(raw) {
        Ok(name) => format!("{name:#}"),
        Err(_) => raw.to_owned(),
    }
}

/// `name` with what is between `<` and `>` (generic arguments, qualified `<T as Trait>` paths)
/// left out: `a::B<T>::c::<U>` gives `a::B::c::`.
fn without_generics(name: &str) -> String {
    let mut depth = 0usize;
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// Whether a function name has a path (`::` outside its generic arguments).
fn has_path(name: &str) -> bool {
    without_generics(name).trim_end_matches("::").contains("::")
}

/// The last segment of a function's path without its generic arguments:
/// `alloc::raw_vec::RawVecInner<A>::try_allocate_in` and `try_allocate_in<alloc::alloc::Global>`
/// both give `try_allocate_in`.
fn base_name(name: &str) -> &str {
    // The end of the name, less trailing generic arguments (`f<T>`, `f::<T>`).
    let mut end = name.len();
    loop {
        let trimmed = &name[..end];
        if !trimmed.ends_with('>') {
            break;
        }
        let mut depth = 0usize;
        let mut open = None;
        for (at, c) in trimmed.char_indices().rev() {
            match c {
                '>' => depth += 1,
                '<' => {
                    depth -= 1;
                    if depth == 0 {
                        open = Some(at);
                        break;
                    }
                }
                _ => {}
            }
        }
        match open {
            Some(at) if at > 0 => end = name[..at].trim_end_matches("::").len(),
            _ => break,
        }
    }
    let trimmed = &name[..end];
    // The segment after the last `::` outside generic arguments.
    let mut depth = 0usize;
    let bytes = trimmed.as_bytes();
    let mut start = 0;
    for at in 0..bytes.len() {
        match bytes[at] {
            b'<' => depth += 1,
            b'>' => depth = depth.saturating_sub(1),
            b':' if depth == 0 && at + 1 < bytes.len() && bytes[at + 1] == b':' => start = at + 2,
            _ => {}
        }
    }
    &trimmed[start.min(trimmed.len())..]
}

/// The module a standard library source file is (`…/library/alloc/src/vec/mod.rs` is
/// `alloc::vec`), for a function of it inlined with its short name and no symbol to take a path
/// from: the path a reader needs to tell it apart, though a method's type is not in it.
fn std_module_path(file: &str) -> Option<String> {
    let (_, rest) = file.split_once("/library/")?;
    let (krate, rest) = rest.split_once("/src/")?;
    if !["alloc", "core", "std"].contains(&krate) {
        return None;
    }
    let module = rest.strip_suffix(".rs")?;
    let mut path = vec![krate];
    path.extend(
        module
            .split('/')
            .filter(|part| !matches!(*part, "mod" | "lib")),
    );
    Some(path.join("::"))
}

/// The path a function's name is in, without generic arguments: `alloc::raw_vec::RawVecInner`
/// for `alloc::raw_vec::RawVecInner<A>::try_allocate_in` and for v0's
/// `<alloc::raw_vec::RawVecInner>::try_allocate_in::<u8>`; `None` for a trait method
/// (`<T as Trait>::f`), whose path is the whole name.
fn enclosing_path(name: &str) -> Option<String> {
    // v0 writes an inherent method as `<Type>::f`: the brackets hold the type, not arguments.
    let unwrapped = match name.strip_prefix('<') {
        Some(rest) => {
            let mut depth = 1usize;
            let close = rest.char_indices().find_map(|(at, c)| {
                match c {
                    '<' => depth += 1,
                    '>' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(at)
            })?;
            if rest[..close].contains(" as ") {
                return None;
            }
            format!("{}{}", &rest[..close], &rest[close + 1..])
        }
        None => name.to_owned(),
    };
    let plain = without_generics(&unwrapped);
    let plain = plain.trim_end_matches("::");
    let (path, _) = plain.rsplit_once("::")?;
    Some(path.to_owned())
}

/// Whether two demangled names are one function's path, whatever their generic arguments.
fn same_path(a: &str, b: &str) -> bool {
    without_generics(a) == without_generics(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn here() -> u64 {
        // The return address into the caller, as a stack walk records it.
        let bounds = std::cell::Cell::new(crate::capture::frames::StackBounds::UNKNOWN);
        crate::capture::stack::walk(&bounds).pcs[1]
    }

    #[test]
    fn a_return_address_resolves_to_its_caller_with_file_and_line() {
        let pc = here();
        let line = line!() - 1;
        let frames = Resolver::default().resolve(&[pc]);
        let frame = frames[0].last().expect("a frame");
        assert_eq!(
            frame.function.as_deref(),
            Some(
                "highwater::symbolize::tests::\
                 a_return_address_resolves_to_its_caller_with_file_and_line"
            ),
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
        assert_eq!(resolver.state.lock().unwrap().resolved.len(), 2);
        assert_eq!(
            resolver.resolve(&[pc + 1, pc]),
            [first[1].clone(), first[0].clone()]
        );
        assert_eq!(resolver.state.lock().unwrap().resolved.len(), 2);
    }

    #[test]
    fn base_names_leave_out_paths_and_generic_arguments() {
        for (name, base) in [
            (
                "alloc::raw_vec::RawVecInner<A>::try_allocate_in",
                "try_allocate_in",
            ),
            ("try_allocate_in<alloc::alloc::Global>", "try_allocate_in"),
            (
                "<alloc::raw_vec::RawVecInner>::try_allocate_in::<u8>",
                "try_allocate_in",
            ),
            ("<T as core::clone::Clone>::clone", "clone"),
            ("{closure#0}<std::env::Args>", "{closure#0}"),
            ("make", "make"),
        ] {
            assert_eq!(base_name(name), base, "{name}");
        }
        assert_eq!(
            enclosing_path("alloc::raw_vec::RawVecInner<A>::try_allocate_in").as_deref(),
            Some("alloc::raw_vec::RawVecInner")
        );
        assert_eq!(
            enclosing_path("<alloc::vec::Vec<alloc::string::String>>::extend_trusted::<u8>")
                .as_deref(),
            Some("alloc::vec::Vec")
        );
        assert_eq!(enclosing_path("<T as core::clone::Clone>::clone"), None);
        assert_eq!(
            std_module_path("/rustc/0123/library/alloc/src/vec/mod.rs").as_deref(),
            Some("alloc::vec")
        );
        assert_eq!(
            std_module_path("/rustc/0123/library/core/src/iter/adapters/map.rs").as_deref(),
            Some("core::iter::adapters::map")
        );
        assert_eq!(std_module_path("/src/tests/a.rs"), None);
        assert!(has_path("alloc::raw_vec::RawVecInner<A>::try_allocate_in"));
        assert!(!has_path("try_allocate_in<alloc::alloc::Global>"));
        assert!(same_path(
            "alloc::vec::Vec<T,A>::push",
            "alloc::vec::Vec<u8, alloc::alloc::Global>::push"
        ));
    }
}

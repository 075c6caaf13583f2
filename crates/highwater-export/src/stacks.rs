//! How the views show a call site's stack: which frames are worth a reader's eye, and short
//! names for functions and files.
//!
//! A recorded stack (innermost first) starts with the allocation machinery (`RawVec::grow`,
//! `Vec::with_capacity`, …: frames of `std`, `core` and `alloc`) and ends with the runtime that
//! called `main` or started the thread (`std::rt::lang_start`, `__libc_start_main`, …). Neither
//! says *which code* allocated, so [`interesting`] trims both ends; `highwater sites` and the
//! HTML report show what is left and say how many frames they left out. The profile and the
//! pprof export keep every frame.

use highwater_profile::Frame;

/// A stack with its uninteresting ends cut off (see [`interesting`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trimmed<'a> {
    /// Frames of the standard library's allocation machinery cut from the inner end.
    pub inner_std: usize,
    /// What is left, innermost first.
    pub frames: &'a [Frame],
    /// Runtime frames (thread start, `main`'s callers) cut from the outer end.
    pub outer_runtime: usize,
}

/// Entry points of the C runtime and the thread library, which call Rust's `main` or a thread's
/// closure.
const RUNTIME_ENTRIES: [&str; 9] = [
    "main",
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
];

/// Whether `name` is a function of Rust's standard library (`std`, `core`, `alloc`), the
/// global-allocator shims, or a standard trait implemented for a primitive, a reference or a
/// trait object (`<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem`).
pub fn is_std_function(name: &str) -> bool {
    if name.starts_with("__rust_") || name.starts_with("__rdl_") || name.starts_with("__rg_") {
        return true;
    }
    let std_path = |path: &str| {
        let path = ["&mut ", "&", "*const ", "*mut ", "dyn "]
            .iter()
            .fold(path.trim_start(), |p, prefix| {
                p.strip_prefix(prefix).unwrap_or(p)
            });
        ["std::", "core::", "alloc::"]
            .iter()
            .any(|p| path.starts_with(p))
    };
    let Some(qualified) = name.strip_prefix('<') else {
        return std_path(name);
    };
    match qualified.split_once(" as ") {
        // `<Type as Trait>::f`: std if the type is std's, or a primitive (or a generic) with a
        // std trait.
        Some((ty, rest)) => std_path(ty) || (!ty.contains("::") && std_path(rest)),
        None => std_path(qualified),
    }
}

/// Whether `path` is a source file of Rust's standard library, as the toolchain's line tables
/// name them (`/rustc/<hash>/library/alloc/src/…`, or a local `…/library/core/src/…`).
pub fn is_std_file(path: &str) -> bool {
    path.starts_with("/rustc/")
        || [
            "/library/std/src/",
            "/library/core/src/",
            "/library/alloc/src/",
        ]
        .iter()
        .any(|dir| path.contains(dir))
}

/// Whether `frame` is the standard library's, by its function's name or its source file (an
/// inlined frame's name can be as short as `with_capacity_in<f32, alloc::alloc::Global>`).
pub fn is_std_frame(frame: &Frame) -> bool {
    frame.function.as_deref().is_some_and(is_std_function)
        || frame.file.as_deref().is_some_and(is_std_file)
}

/// Whether `frame` belongs to what starts the program or a thread: the C runtime, or the
/// standard library's frames around `main` and thread closures. Frames with no symbol count
/// too (the C library's are usually stripped).
fn is_runtime(frame: &Frame) -> bool {
    match frame.function.as_deref() {
        None => true,
        Some(name) => RUNTIME_ENTRIES.contains(&name) || is_std_frame(frame),
    }
}

/// `frames` (innermost first) without the standard library's allocation frames at the inner
/// end and the runtime's frames at the outer end. When nothing would be left (a stack that is
/// all standard library), every frame is kept.
///
/// # Examples
///
/// ```
/// use highwater_export::stacks::interesting;
/// use highwater_profile::Frame;
///
/// let frame = |name: &str| {
///     let mut frame = Frame::at(0x1000);
///     frame.function = Some(name.into());
///     frame
/// };
/// let stack = [
///     frame("alloc::raw_vec::RawVecInner<A>::try_allocate_in"),
///     frame("train::model::forward"),
///     frame("train::main"),
///     frame("std::rt::lang_start_internal"),
///     frame("main"),
/// ];
/// let trimmed = interesting(&stack);
/// assert_eq!((trimmed.inner_std, trimmed.frames.len(), trimmed.outer_runtime), (1, 2, 2));
/// ```
pub fn interesting(frames: &[Frame]) -> Trimmed<'_> {
    let inner_std = frames.iter().take_while(|f| is_std_frame(f)).count();
    let rest = &frames[inner_std..];
    let outer_runtime = rest.iter().rev().take_while(|f| is_runtime(f)).count();
    if outer_runtime == rest.len() {
        return Trimmed {
            inner_std: 0,
            frames,
            outer_runtime: 0,
        };
    }
    Trimmed {
        inner_std,
        frames: &rest[..rest.len() - outer_runtime],
        outer_runtime,
    }
}

/// An estimate with its standard error, in binary units: `1.5 GiB ± 12.0 KiB`.
///
/// # Examples
///
/// ```
/// assert_eq!(highwater_export::stacks::estimate(3 << 20, 1536), "3.0 MiB ± 1.5 KiB");
/// ```
pub fn estimate(bytes: u64, error: u64) -> String {
    format!(
        "{} ± {}",
        highwater_profile::units::format_bytes(bytes),
        highwater_profile::units::format_bytes(error)
    )
}

/// `name` without generic arguments, for reading: `fold<alloc::vec::Vec<f32>, …>` becomes
/// `fold<…>` and `Vec<T,A>::push` becomes `Vec<…>::push`; a qualified path's brackets
/// (`<Linear as Module>::forward`) stay.
///
/// # Examples
///
/// ```
/// use highwater_export::stacks::without_generics;
/// assert_eq!(without_generics("fold<alloc::vec::Vec<f32>, ()>"), "fold<…>");
/// assert_eq!(
///     without_generics("<alloc::vec::Vec<T> as core::iter::FromIterator<T>>::from_iter"),
///     "<alloc::vec::Vec<…> as core::iter::FromIterator<…>>::from_iter"
/// );
/// ```
pub fn without_generics(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut skipping = 0usize;
    let mut previous = ' ';
    for c in name.chars() {
        if skipping > 0 {
            match c {
                '<' => skipping += 1,
                '>' => skipping -= 1,
                _ => {}
            }
            if skipping == 0 {
                out.push_str("<…>");
            }
            continue;
        }
        // Generic arguments follow a name (`Vec<`) or a turbofish (`::<`); a qualified path
        // opens at the start or after a space, `&` or `(`.
        if c == '<' && (previous.is_alphanumeric() || previous == '_' || out.ends_with("::")) {
            skipping = 1;
            previous = c;
            continue;
        }
        out.push(c);
        previous = c;
    }
    if skipping > 0 {
        // Unbalanced: keep what was cut.
        out.push_str("<…");
    }
    out
}

/// The frame's function name, or its address when it has no symbol.
pub fn function_name(frame: &Frame) -> String {
    match &frame.function {
        Some(name) => name.clone(),
        None => format!("0x{:x}", frame.pc),
    }
}

/// `file:line` with the file shortened by [`short_file`], `None` when the frame has no file.
pub fn source_location(frame: &Frame) -> Option<String> {
    let file = short_file(frame.file.as_deref()?);
    Some(match frame.line {
        Some(line) => format!("{file}:{line}"),
        None => file.to_string(),
    })
}

/// A source path without the parts every reader knows: the Cargo registry's directory
/// (`…/.cargo/registry/src/index.crates.io-…/candle-core-0.11.0/src/tensor.rs` becomes
/// `candle-core-0.11.0/src/tensor.rs`), a git checkout's, and the Rust toolchain's build
/// directory (`/rustc/<hash>/library/alloc/src/raw_vec.rs` becomes
/// `library/alloc/src/raw_vec.rs`). Other paths are kept whole.
///
/// # Examples
///
/// ```
/// use highwater_export::stacks::short_file;
/// assert_eq!(
///     short_file("/home/me/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/syn-2.0.1/src/lib.rs"),
///     "syn-2.0.1/src/lib.rs"
/// );
/// assert_eq!(short_file("/rustc/17067e9ac6d/library/alloc/src/vec/mod.rs"), "library/alloc/src/vec/mod.rs");
/// assert_eq!(short_file("src/main.rs"), "src/main.rs");
/// ```
pub fn short_file(path: &str) -> &str {
    // The registry's index directory, and a checkout's name and revision, are dropped too.
    for (marker, skip) in [("/.cargo/registry/src/", 1), ("/.cargo/git/checkouts/", 2)] {
        if let Some(at) = path.find(marker) {
            let mut rest = &path[at + marker.len()..];
            for _ in 0..skip {
                rest = rest.split_once('/').map_or("", |(_, inside)| inside);
            }
            if !rest.is_empty() {
                return rest;
            }
        }
    }
    if let Some(rest) = path.strip_prefix("/rustc/") {
        if let Some((_, inside)) = rest.split_once('/') {
            return inside;
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: Option<&str>) -> Frame {
        let mut frame = Frame::default();
        frame.pc = 0x1000;
        frame.function = name.map(String::from);
        frame
    }

    #[test]
    fn standard_library_names_are_recognised() {
        for std in [
            "alloc::raw_vec::RawVec<T,A>::grow_one",
            "<alloc::vec::Vec<T> as core::clone::Clone>::clone",
            "<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem",
            "<[T] as alloc::slice::hack::ConvertVec>::to_vec",
            "core::ops::function::FnOnce::call_once",
            "std::rt::lang_start_internal",
            "__rust_alloc",
            "__rdl_alloc",
        ] {
            assert!(is_std_function(std), "{std}");
        }
        for user in [
            "train::main",
            "<train::Model as core::ops::Fn<()>>::call",
            "candle_core::tensor::Tensor::matmul",
            "<candle_core::Tensor as std::ops::Add>::add",
            "stdlib_wrapper::f",
        ] {
            assert!(!is_std_function(user), "{user}");
        }
    }

    #[test]
    fn inlined_std_frames_with_short_names_are_known_by_their_files() {
        let mut inlined = frame(Some("with_capacity_in<f32, alloc::alloc::Global>"));
        inlined.file = Some("/rustc/59807616e1fa/library/alloc/src/raw_vec/mod.rs".into());
        assert!(is_std_frame(&inlined));
        let mut user = frame(Some("with_capacity_in"));
        user.file = Some("/work/mylib/src/library/pool.rs".into());
        assert!(!is_std_frame(&user));
        assert!(is_std_function(
            "<&dyn core::ops::function::Fn<(), Output = i32> as core::ops::function::FnOnce<()>>::call_once"
        ));
        let stack = [inlined, frame(Some("app::buffer")), frame(Some("main"))];
        let trimmed = interesting(&stack);
        assert_eq!((trimmed.inner_std, trimmed.frames.len()), (1, 1));
    }

    #[test]
    fn generic_arguments_are_cut_and_qualified_paths_kept() {
        assert_eq!(without_generics("a::b::f"), "a::b::f");
        assert_eq!(without_generics("Vec<T,A>::push"), "Vec<…>::push");
        assert_eq!(
            without_generics("iter::collect::<Vec<u8>>"),
            "iter::collect::<…>"
        );
        assert_eq!(
            without_generics("<candle_nn::Linear as candle_core::Module>::forward"),
            "<candle_nn::Linear as candle_core::Module>::forward"
        );
        assert_eq!(without_generics("f<a<b>"), "f<…");
    }

    #[test]
    fn a_stack_of_only_std_frames_is_kept_whole() {
        let stack = [
            frame(Some("alloc::alloc::alloc")),
            frame(Some("std::thread::spawn")),
            frame(None),
        ];
        let trimmed = interesting(&stack);
        assert_eq!(trimmed.frames.len(), 3);
        assert_eq!((trimmed.inner_std, trimmed.outer_runtime), (0, 0));
    }

    #[test]
    fn unknown_frames_inside_the_stack_stay_and_stripped_libc_at_the_end_goes() {
        let stack = [
            frame(Some("train::a")),
            frame(None),
            frame(Some("train::b")),
            frame(Some(
                "std::sys::pal::unix::thread::Thread::new::thread_start",
            )),
            frame(Some("start_thread")),
            frame(None),
        ];
        let trimmed = interesting(&stack);
        assert_eq!(trimmed.frames.len(), 3);
        assert_eq!(trimmed.outer_runtime, 3);
        assert_eq!(function_name(&trimmed.frames[1]), "0x1000");
    }

    #[test]
    fn source_locations_are_short_and_say_when_the_line_is_missing() {
        let mut f = frame(Some("x"));
        assert_eq!(source_location(&f), None);
        f.file =
            Some("/root/.cargo/git/checkouts/candle-0a1b/9f8e7d6/candle-core/src/op.rs".into());
        assert_eq!(source_location(&f).unwrap(), "candle-core/src/op.rs");
        f.line = Some(42);
        assert_eq!(source_location(&f).unwrap(), "candle-core/src/op.rs:42");
    }
}

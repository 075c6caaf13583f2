//! The modules loaded in this process and their call-frame information, found from their
//! program headers as the dynamic linker mapped them (`dl_iterate_phdr`).
//!
//! Every module the linker loads has a `PT_GNU_EH_FRAME` segment: `.eh_frame_hdr`, a sorted
//! table from function addresses to their entries in `.eh_frame`, whose address it holds. The
//! length of `.eh_frame` is found by stepping over its entries to the zero terminator, never
//! past the end of the segment that holds it.
//!
//! The main program and the vDSO are never unmapped, so their sections are read where they lie.
//! Any other module could be unloaded (`dlclose`) while tables built over it are still in use,
//! so its two sections are copied. Runs outside the allocator hook: it allocates.

#![allow(clippy::disallowed_methods)]

use std::ops::{Deref, Range};

/// Section data the unwinder reads.
#[derive(Debug)]
pub(crate) enum Section {
    /// Mapped for the life of the process (the main program, the vDSO).
    Mapped(&'static [u8]),
    /// A copy, for a module that may be unloaded.
    Copied(Box<[u8]>),
}

impl Default for Section {
    fn default() -> Section {
        Section::Mapped(&[])
    }
}

impl Deref for Section {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Section::Mapped(bytes) => bytes,
            Section::Copied(bytes) => bytes,
        }
    }
}

/// One loaded module's unwind information.
#[derive(Debug)]
pub(crate) struct LoadedModule {
    /// Its path, as the dynamic linker has it (empty for the main program).
    pub(crate) name: String,
    /// Where its segments are mapped.
    pub(crate) avma: Range<u64>,
    /// Load bias: mapped address minus the address the module states.
    pub(crate) bias: u64,
    /// The stated addresses of its executable segment.
    pub(crate) text_svma: Range<u64>,
    /// The stated addresses and the bytes of `.eh_frame_hdr` and of `.eh_frame`.
    pub(crate) eh_frame_hdr: (Range<u64>, Section),
    pub(crate) eh_frame: (Range<u64>, Section),
}

/// Where one loaded module's file is mapped, for resolving addresses in it.
#[derive(Debug, Clone)]
pub(crate) struct Image {
    /// Its file (`/proc/self/exe` for the main program); `None` for the vDSO, which has none.
    pub(crate) path: Option<std::path::PathBuf>,
    /// Where its segments are mapped.
    pub(crate) avma: Range<u64>,
    /// Load bias: mapped address minus the address the file states.
    pub(crate) bias: u64,
}

/// Every loaded module's mapping and file.
pub(crate) fn loaded_images() -> Vec<Image> {
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> i32 {
        // SAFETY: `info` is valid during the callback; `out` is the `Vec` passed below.
        let (info, images) = unsafe { (&*info, &mut *out.cast::<Vec<Image>>()) };
        if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
            return 0;
        }
        // SAFETY: the linker's `dlpi_phnum` program headers for this module, mapped while it
        // is loaded (it cannot be unloaded during the iteration).
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let loads = headers.iter().filter(|h| h.p_type == libc::PT_LOAD);
        let start = loads.clone().map(|h| h.p_vaddr).min();
        let end = loads.map(|h| h.p_vaddr.saturating_add(h.p_memsz)).max();
        let (Some(start), Some(end)) = (start, end) else {
            return 0;
        };
        let path = if is_main_program(info) {
            Some(std::path::PathBuf::from("/proc/self/exe"))
        } else if is_vdso(info) || info.dlpi_name.is_null() {
            None
        } else {
            // SAFETY: a NUL-terminated string owned by the linker, valid during the callback.
            let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) };
            use std::os::unix::ffi::OsStrExt;
            (!name.is_empty())
                .then(|| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
        };
        images.push(Image {
            path,
            avma: info.dlpi_addr.wrapping_add(start)..info.dlpi_addr.wrapping_add(end),
            bias: info.dlpi_addr,
        });
        0
    }
    let mut images: Vec<Image> = Vec::new();
    // SAFETY: the callback reads the linker's description of each module and writes `images`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut images).cast()) };
    images
}

/// How many modules the dynamic linker has loaded and unloaded so far: when either changes,
/// the tables are out of date.
pub(crate) type LoadCounts = (u64, u64);

/// The dynamic linker's load and unload counts, without listing the modules (one call of the
/// iterator, stopped at its first module).
pub(crate) fn load_counts() -> LoadCounts {
    extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        out: *mut libc::c_void,
    ) -> i32 {
        // SAFETY: `info` is valid during the callback; `out` is the `LoadCounts` passed below.
        unsafe {
            let info = &*info;
            *out.cast::<LoadCounts>() = (info.dlpi_adds, info.dlpi_subs);
        }
        1
    }
    let mut counts: LoadCounts = (0, 0);
    // SAFETY: the callback only reads `info` and writes `counts`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut counts).cast()) };
    counts
}

/// Every loaded module that has call-frame information, and the load counts they were listed
/// at.
pub(crate) fn loaded_modules() -> (Vec<LoadedModule>, LoadCounts) {
    struct Listing {
        modules: Vec<LoadedModule>,
        counts: LoadCounts,
    }
    extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> i32 {
        // SAFETY: `info` is valid during the callback; `out` is the `Listing` passed below.
        let (info, listing) = unsafe { (&*info, &mut *out.cast::<Listing>()) };
        listing.counts = (info.dlpi_adds, info.dlpi_subs);
        // SAFETY: the linker's program headers for this module: `dlpi_phnum` entries at
        // `dlpi_phdr`, mapped while the module is loaded (it cannot be unloaded during the
        // iteration, which holds the linker's lock).
        if let Some(module) = unsafe { module_of(info) } {
            listing.modules.push(module);
        }
        0
    }
    let mut listing = Listing {
        modules: Vec::new(),
        counts: (0, 0),
    };
    // SAFETY: the callback reads the linker's description of each module and writes `listing`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut listing).cast()) };
    (listing.modules, listing.counts)
}

/// Reads one module's segments.
///
/// # Safety
///
/// `info` describes a module that stays loaded during the call: `dlpi_phdr` points to
/// `dlpi_phnum` program headers, and its `PT_LOAD` segments are mapped at `dlpi_addr` plus their
/// stated addresses.
unsafe fn module_of(info: &libc::dl_phdr_info) -> Option<LoadedModule> {
    if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
        return None;
    }
    // SAFETY: the caller's contract.
    let headers =
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let bias = info.dlpi_addr;
    let segment =
        |header: &libc::Elf64_Phdr| header.p_vaddr..header.p_vaddr.saturating_add(header.p_memsz);
    let loads: Vec<Range<u64>> = headers
        .iter()
        .filter(|h| h.p_type == libc::PT_LOAD)
        .map(segment)
        .collect();
    let start = loads.iter().map(|r| r.start).min()?;
    let end = loads.iter().map(|r| r.end).max()?;
    let text_svma = headers
        .iter()
        .find(|h| h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_X != 0)
        .map(segment)?;
    let hdr_svma = headers
        .iter()
        .find(|h| h.p_type == libc::PT_GNU_EH_FRAME)
        .map(segment)?;
    let holding = |address: u64| loads.iter().find(|r| r.contains(&address)).cloned();
    let hdr_load = holding(hdr_svma.start)?;
    if hdr_svma.end > hdr_load.end {
        return None;
    }
    // SAFETY: inside a `PT_LOAD` segment of a loaded module (checked above), mapped readable
    // (the linker reads `.eh_frame_hdr` there itself) for as long as the module is loaded.
    let hdr = unsafe { mapped(bias, &hdr_svma) };
    let eh_frame_start = eh_frame_address(hdr, hdr_svma.start)?;
    let eh_load = holding(eh_frame_start)?;
    // SAFETY: as above: the rest of the segment that holds `.eh_frame`.
    let rest = unsafe { mapped(bias, &(eh_frame_start..eh_load.end)) };
    let eh_frame_svma = eh_frame_start..eh_frame_start + eh_frame_length(rest) as u64;
    // SAFETY: a prefix of `rest`.
    let eh_frame = unsafe { mapped(bias, &eh_frame_svma) };
    let main_or_vdso = is_main_program(info) || is_vdso(info);
    let keep = |bytes: &'static [u8]| {
        if main_or_vdso {
            Section::Mapped(bytes)
        } else {
            Section::Copied(bytes.into())
        }
    };
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string owned by the linker, valid during the callback.
        unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    Some(LoadedModule {
        name,
        avma: bias.wrapping_add(start)..bias.wrapping_add(end),
        bias,
        text_svma,
        eh_frame_hdr: (hdr_svma, keep(hdr)),
        eh_frame: (eh_frame_svma, keep(eh_frame)),
    })
}

/// The bytes at stated addresses `svma` of a module loaded with `bias`.
///
/// # Safety
///
/// Those bytes are mapped and readable, and stay so for as long as the slice is used (for the
/// life of the process where it is kept as [`Section::Mapped`]).
unsafe fn mapped(bias: u64, svma: &Range<u64>) -> &'static [u8] {
    let start = bias.wrapping_add(svma.start) as usize as *const u8;
    let len = (svma.end - svma.start) as usize;
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(start, len) }
}

/// Whether `info` is the main program: its program headers are the ones the kernel passed in
/// the auxiliary vector.
fn is_main_program(info: &libc::dl_phdr_info) -> bool {
    // SAFETY: `getauxval` reads the process's auxiliary vector; no preconditions.
    let phdr = unsafe { libc::getauxval(libc::AT_PHDR) };
    phdr != 0 && phdr == info.dlpi_phdr as usize as u64
}

/// Whether `info` is the vDSO the kernel mapped.
fn is_vdso(info: &libc::dl_phdr_info) -> bool {
    // SAFETY: as above.
    let vdso = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    vdso != 0 && vdso == info.dlpi_addr
}

/// The stated address of `.eh_frame`, from the pointer at the head of `.eh_frame_hdr` (stated
/// at `hdr_svma`).
fn eh_frame_address(hdr: &[u8], hdr_svma: u64) -> Option<u64> {
    let header = gimli::EhFrameHdr::new(hdr, gimli::NativeEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(hdr_svma);
    let parsed = header
        .parse(&bases, std::mem::size_of::<usize>() as u8)
        .ok()?;
    match parsed.eh_frame_ptr() {
        gimli::Pointer::Direct(address) => Some(address),
        gimli::Pointer::Indirect(_) => None,
    }
}

/// The length of the `.eh_frame` that starts `bytes`: its entries, up to and including the
/// zero terminator, or all of `bytes` where they run out first.
fn eh_frame_length(bytes: &[u8]) -> usize {
    let word = |at: usize, len: usize| -> Option<u64> {
        let field = bytes.get(at..at.checked_add(len)?)?;
        let mut value = [0u8; 8];
        value[..len].copy_from_slice(field);
        Some(u64::from_ne_bytes(value))
    };
    let mut at = 0usize;
    while let Some(length) = word(at, 4) {
        let next = match length {
            0 => return at + 4,
            0xffff_ffff => word(at + 4, 8)
                .and_then(|long| usize::try_from(long).ok())
                .and_then(|long| (at + 12).checked_add(long)),
            short => (at + 4).checked_add(short as usize),
        };
        match next {
            Some(next) if next <= bytes.len() => at = next,
            _ => break,
        }
    }
    at.min(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_program_is_listed_with_its_call_frame_information_in_place() {
        let (modules, counts) = loaded_modules();
        assert!(counts.0 >= 1, "{counts:?}");
        let here = the_main_program_is_listed_with_its_call_frame_information_in_place as fn()
            as usize as u64;
        let main = modules
            .iter()
            .find(|m| m.avma.contains(&here))
            .expect("the test binary has unwind information");
        assert!(matches!(main.eh_frame.1, Section::Mapped(_)));
        assert!(main.eh_frame.1.len() > 1000, "{}", main.eh_frame.1.len());
        let text = main.bias + main.text_svma.start..main.bias + main.text_svma.end;
        assert!(text.contains(&here));
        // Another module (the C library) is copied.
        assert!(
            modules
                .iter()
                .any(|m| matches!(m.eh_frame.1, Section::Copied(_))),
            "{:?}",
            modules.iter().map(|m| &m.name).collect::<Vec<_>>()
        );
        assert_eq!(load_counts(), counts);
    }

    #[test]
    fn the_length_of_eh_frame_ends_at_its_terminator_or_its_segment() {
        let mut bytes = Vec::new();
        for body in [8u32, 12] {
            bytes.extend_from_slice(&body.to_ne_bytes());
            bytes.extend(std::iter::repeat_n(0xaa, body as usize));
        }
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        let terminated = bytes.len();
        bytes.extend_from_slice(&[0xff; 16]);
        assert_eq!(eh_frame_length(&bytes), terminated);
        // An entry running past the segment stops the count before it.
        assert_eq!(eh_frame_length(&bytes[..20]), 12);
        assert_eq!(eh_frame_length(&[]), 0);
        // A 64-bit length.
        let mut long = 0xffff_ffffu32.to_ne_bytes().to_vec();
        long.extend_from_slice(&4u64.to_ne_bytes());
        long.extend_from_slice(&[1, 2, 3, 4, 0, 0, 0, 0]);
        assert_eq!(eh_frame_length(&long), 20);
    }
}

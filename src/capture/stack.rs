//! Walking the calling thread's stack from inside the allocator, by frame pointers.
//!
//! # Why frame pointers
//!
//! A sampled allocation records its call stack while the allocator hook runs, so the walk may
//! not allocate, take a lock or fault. A DWARF unwinder (libunwind, gimli's, the `backtrace`
//! crate) parses `.eh_frame` tables, caches them behind locks and allocates while it does; a
//! signal or a fork can leave those locks held. A frame-pointer walk is a loop of two loads
//! per frame: each frame starts with the caller's frame pointer, followed by the return
//! address (x86-64 `push rbp; mov rbp, rsp`, AArch64 `stp x29, x30, [sp, …]; mov x29, sp`).
//! The build sets `-C force-frame-pointers=yes`, and Rust's standard library ships with frame
//! pointers kept.
//!
//! # Why every frame pointer is checked
//!
//! Code compiled without frame pointers may use the frame-pointer register for anything, so
//! a chain can lead to garbage. The walk only follows a pointer that is aligned to 16 bytes,
//! strictly above the previous one (stacks grow down, callers sit higher) and, with the two
//! words it reads, inside the thread's stack mapping: `[sp, top)`, where `top` is the end of
//! the mapping that holds `sp`. That mapping is found once per thread (again only when `sp`
//! leaves it: a signal handler on an alternate stack) by reading `/proc/self/maps` with plain
//! `open`/`read` system calls into a buffer on the stack. A pointer that fails a check ends
//! the walk; the depth is bounded by [`MAX_FRAMES`]. The walk thus only ever reads this
//! thread's own mapped stack memory.

use std::cell::Cell;

/// Deepest stack recorded, in program counters.
pub(crate) const MAX_FRAMES: usize = 64;

/// How stacks are walked, as the profile names it.
pub(crate) const UNWINDER: &str = if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
    crate::model::FRAME_POINTERS_UNWINDER
} else {
    "none"
};

/// The calling thread's stack mapping as last found: `[low, high)`; `(0, 0)` when unknown.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StackBounds {
    low: usize,
    high: usize,
}

impl StackBounds {
    /// Not looked up yet.
    pub(crate) const UNKNOWN: StackBounds = StackBounds { low: 0, high: 0 };

    fn holds(&self, sp: usize) -> bool {
        self.low <= sp && sp < self.high
    }
}

/// A walked stack: return addresses, innermost first.
#[derive(Debug)]
pub(crate) struct Walked {
    pub(crate) pcs: [u64; MAX_FRAMES],
    pub(crate) len: usize,
    /// The walk stopped at the depth limit, or at a frame pointer inside the stack that failed
    /// a check (a frame compiled without frame pointers).
    pub(crate) truncated: bool,
}

/// Walks the caller's stack. `bounds` caches this thread's stack mapping (refreshed when the
/// stack pointer is outside it). Never allocates, locks or panics.
#[inline(never)]
pub(crate) fn walk(bounds: &Cell<StackBounds>) -> Walked {
    let mut walked = Walked {
        pcs: [0; MAX_FRAMES],
        len: 0,
        truncated: false,
    };
    let Some((mut fp, sp)) = registers() else {
        return walked;
    };
    let mut known = bounds.get();
    if !known.holds(sp) {
        known = mapping_holding(sp).unwrap_or(StackBounds::UNKNOWN);
        bounds.set(known);
        if !known.holds(sp) {
            return walked;
        }
    }
    let word = std::mem::size_of::<usize>();
    let mut floor = sp;
    loop {
        let valid = fp >= floor
            && fp.is_multiple_of(16)
            && fp
                .checked_add(2 * word)
                .is_some_and(|end| end <= known.high);
        if !valid {
            // A null frame pointer ends a chain (the thread's first frame); anything else
            // inside the stack is a frame we could not follow.
            walked.truncated = fp != 0 && known.holds(fp);
            break;
        }
        if walked.len == MAX_FRAMES {
            walked.truncated = true;
            break;
        }
        // SAFETY: `fp` and `fp + word` lie in `[sp, high)`, this thread's own stack mapping
        // (found in `/proc/self/maps` for the current `sp`), which is mapped and readable for as
        // long as this thread runs; `fp` is aligned for `usize` (checked above). The words may
        // hold anything; they are read as plain integers.
        let (next, pc) = unsafe {
            let frame = fp as *const usize;
            (
                std::ptr::read_volatile(frame),
                std::ptr::read_volatile(frame.add(1)),
            )
        };
        if pc == 0 {
            break;
        }
        walked.pcs[walked.len] = pc as u64;
        walked.len += 1;
        // Callers sit strictly higher: this also ends a loop of frames.
        floor = fp + 2 * word;
        fp = next;
    }
    walked
}

/// This function's frame pointer and the stack pointer.
#[inline(always)]
fn registers() -> Option<(usize, usize)> {
    #[cfg(target_arch = "x86_64")]
    {
        let (fp, sp): (usize, usize);
        // SAFETY: copies two registers; touches no memory, the stack or flags.
        unsafe {
            std::arch::asm!("mov {}, rbp", "mov {}, rsp", out(reg) fp, out(reg) sp,
                options(nomem, nostack, preserves_flags));
        }
        Some((fp, sp))
    }
    #[cfg(target_arch = "aarch64")]
    {
        let (fp, sp): (usize, usize);
        // SAFETY: copies two registers; touches no memory, the stack or flags.
        unsafe {
            std::arch::asm!("mov {}, x29", "mov {}, sp", out(reg) fp, out(reg) sp,
                options(nomem, nostack, preserves_flags));
        }
        Some((fp, sp))
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// The mapping of `/proc/self/maps` that holds `addr`, read with raw system calls into a
/// buffer on the stack (no allocation, no lock).
fn mapping_holding(addr: usize) -> Option<StackBounds> {
    // SAFETY: a NUL-terminated path; `open` allocates nothing and its descriptor is closed
    // below on every path.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut parser = MapsParser::default();
    let mut buffer = [0u8; 4096];
    let found = loop {
        // SAFETY: `buffer` is writable for its length; `fd` is open.
        let read = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        if read <= 0 {
            break None;
        }
        if let Some(found) = parser.feed(&buffer[..read as usize], addr) {
            break found;
        }
    };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    found
}

/// Reads `start-end ...` lines byte by byte, across reads.
#[derive(Debug, Default)]
struct MapsParser {
    /// 0: reading `start`, 1: reading `end`, 2: skipping to the end of the line.
    field: u8,
    start: usize,
    end: usize,
}

impl MapsParser {
    /// Feeds bytes; `Some(answer)` once the mapping holding `addr` is found or cannot follow
    /// (lines are sorted by address).
    fn feed(&mut self, bytes: &[u8], addr: usize) -> Option<Option<StackBounds>> {
        for &byte in bytes {
            match (self.field, byte) {
                (_, b'\n') => {
                    self.field = 0;
                    self.start = 0;
                    self.end = 0;
                }
                (0, b'-') => self.field = 1,
                (1, b' ') => {
                    self.field = 2;
                    if self.start <= addr && addr < self.end {
                        return Some(Some(StackBounds {
                            low: self.start,
                            high: self.end,
                        }));
                    }
                    if self.start > addr {
                        return Some(None);
                    }
                }
                (0 | 1, digit) => {
                    let value = match digit {
                        b'0'..=b'9' => digit - b'0',
                        b'a'..=b'f' => digit - b'a' + 10,
                        _ => {
                            self.field = 2;
                            continue;
                        }
                    };
                    let field = if self.field == 0 {
                        &mut self.start
                    } else {
                        &mut self.end
                    };
                    *field = field.wrapping_shl(4) | usize::from(value);
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn nested(depth: u32, bounds: &Cell<StackBounds>) -> Walked {
        if depth == 0 {
            walk(bounds)
        } else {
            let walked = nested(depth - 1, bounds);
            std::hint::black_box(depth);
            walked
        }
    }

    #[test]
    fn the_walk_sees_every_frame_of_a_recursion() {
        let bounds = Cell::new(StackBounds::UNKNOWN);
        let shallow = nested(2, &bounds);
        let deep = nested(12, &bounds);
        assert!(shallow.len >= 3, "{} frames", shallow.len);
        assert!(
            deep.len >= shallow.len + 10 || deep.len == MAX_FRAMES,
            "{} frames for 12 levels, {} for 2",
            deep.len,
            shallow.len
        );
        // The recursion's frames share one return address.
        let repeated = deep.pcs[1..deep.len.min(12)]
            .windows(2)
            .filter(|pair| pair[0] == pair[1])
            .count();
        assert!(repeated >= 8, "{:x?}", &deep.pcs[..deep.len]);
    }

    #[test]
    fn the_depth_is_bounded() {
        let bounds = Cell::new(StackBounds::UNKNOWN);
        let walked = nested(200, &bounds);
        assert_eq!(walked.len, MAX_FRAMES);
        assert!(walked.truncated);
    }

    #[test]
    fn the_stack_mapping_holds_a_local() {
        let local = 0u64;
        let addr = std::hint::black_box(&local) as *const u64 as usize;
        let bounds = mapping_holding(addr).expect("/proc/self/maps lists the stack");
        assert!(bounds.holds(addr));
        assert!(mapping_holding(0).is_none());
    }

    #[test]
    fn the_maps_parser_reads_lines_split_across_reads() {
        let text = b"1000-2000 r-xp 0 0:0 0 /bin/x\n7ff0-8000 rw-p 0 0:0 0 [stack]\n";
        for split in 0..text.len() {
            let mut parser = MapsParser::default();
            let found = parser
                .feed(&text[..split], 0x7ff8)
                .or_else(|| parser.feed(&text[split..], 0x7ff8));
            let bounds = found.flatten().expect("found");
            assert_eq!((bounds.low, bounds.high), (0x7ff0, 0x8000), "split {split}");
        }
        let mut parser = MapsParser::default();
        assert_eq!(parser.feed(text, 0x3000).map(|f| f.is_none()), Some(true));
    }
}

//! Walking the calling thread's stack from inside the allocator: by frame pointers where that
//! works, by call-frame information where it does not.
//!
//! # Frame pointers first
//!
//! A sampled allocation records its call stack while the allocator hook runs, so the walk may
//! not allocate, take a lock or fault. A frame-pointer walk is a loop of two loads per frame:
//! each frame starts with the caller's frame pointer, followed by the return address (x86-64
//! `push rbp; mov rbp, rsp`, AArch64 `stp x29, x30, [sp, …]; mov x29, sp`). It is the fast
//! path, and it is right wherever every frame keeps a frame pointer (this repository builds with
//! `-C force-frame-pointers=yes`; Rust's standard library ships with frame pointers kept).
//!
//! # Call-frame information where frame pointers fail
//!
//! An ordinary release build keeps no frame pointers: the walk starts from a register the hook
//! never set and gives no frame, or a frame or two of outer code. Whether this build's frame
//! pointers can be trusted is decided once, when the unwind tables are first prepared
//! ([`frame_pointers_agree_with_unwind_tables`]: the two methods must give the same first return
//! addresses from the same registers). Where they cannot, every stack is unwound by the
//! binary's `.eh_frame` instead ([`super::unwind`]), from the same registers, so both give the
//! same addresses for the same frames. [`Walked::unwinder`] says which did.
//!
//! The choice is the build's, not each walk's: one thread's stacks are all walked one way, so
//! they end at the same outermost frame (the frame-pointer walk stops where the C library's
//! frames keep none, the unwind goes on to the thread's first frame) and `measure` can drop the
//! frames a sample shares with the stack it was called from. A walk that falls back for a
//! short frame-pointer chain alone made the same closure's sites differ between threads.
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
//! the walk; the depth is bounded by [`MAX_FRAMES`]. The call-frame unwind reads within the same
//! bounds. Either walk thus only ever reads this thread's own mapped stack memory.

use std::cell::Cell;

use super::frames::{Registers, StackBounds, Walked, MAX_FRAMES};
use crate::model::Unwinder;

/// How stacks are walked, as the profile names it.
pub(crate) const UNWINDER: &str = if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
    crate::model::FRAME_POINTERS_THEN_EH_FRAME
} else {
    "none"
};

/// Walks the caller's stack: by frame pointers where they can be trusted, by call-frame
/// information otherwise (see the module docs). `bounds` caches this thread's stack mapping
/// (refreshed when the stack pointer is outside it). Never allocates, locks or panics.
#[inline(never)]
pub(crate) fn walk(bounds: &Cell<StackBounds>) -> Walked {
    let mut walked = Walked::EMPTY;
    let by_pointers = super::unwind::frame_pointers_trusted() != Some(false);
    if !by_pointers {
        // Should the unwind not run (no stack bounds, no free cache), the stack says it was
        // cut, and which method was to walk it.
        walked.unwinder = Unwinder::EhFrame;
        walked.truncated = true;
    }
    let Some(registers) = registers() else {
        return walked;
    };
    let Some(known) = bounds_holding(bounds, registers.sp) else {
        return walked;
    };
    if by_pointers {
        frame_pointer_walk(&registers, &known, &mut walked);
        return walked;
    }
    // A thread's bounds cell is its own: its address spreads threads over the cache pool.
    let hint = std::ptr::from_ref(bounds) as usize >> 6;
    super::unwind::unwind(&registers, &known, hint, &mut walked);
    walked
}

/// The thread's stack mapping that holds `sp`, looked up again when the cached one does not.
/// `/proc/self/maps` is read in pieces, and a mapping another thread makes or removes between
/// two reads can shift the lines so that one is missed: a lookup that finds nothing is tried
/// once more.
fn bounds_holding(bounds: &Cell<StackBounds>, sp: usize) -> Option<StackBounds> {
    let mut known = bounds.get();
    if !known.holds(sp) {
        known = mapping_holding(sp)
            .or_else(|| mapping_holding(sp))
            .unwrap_or(StackBounds::UNKNOWN);
        bounds.set(known);
    }
    known.holds(sp).then_some(known)
}

/// The frame-pointer walk from `registers` (the walking function's own frame is not recorded).
fn frame_pointer_walk(registers: &Registers, known: &StackBounds, walked: &mut Walked) {
    let word = std::mem::size_of::<usize>();
    let mut floor = registers.sp;
    let mut fp = registers.fp;
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
}

/// Gets the unwind tables ready for the modules loaded now (see [`super::unwind`]) and, the
/// first time, judges whether this build's frame pointers can be trusted: every stack is then
/// walked by the one method that works for the build. Outside the hook only.
pub(crate) fn prepare() {
    super::unwind::prepare();
    if super::unwind::frame_pointers_unjudged() {
        super::unwind::judge_frame_pointers(frame_pointers_agree_with_unwind_tables());
    }
}

/// Whether this build's frame-pointer walk gives the return addresses its call-frame
/// information gives, walked from the same registers: the hook's own code then keeps frame
/// pointers. `true` where the call-frame unwind cannot run (frame pointers are all there is).
/// Called once the unwind tables are prepared, outside the hook.
#[inline(never)]
pub(crate) fn frame_pointers_agree_with_unwind_tables() -> bool {
    let bounds = Cell::new(StackBounds::UNKNOWN);
    let (by_pointers, by_tables) = both_walks(&bounds);
    let Some(by_tables) = by_tables.filter(|walked| walked.len >= 3) else {
        return true;
    };
    by_pointers.len >= 3 && by_pointers.pcs[..3] == by_tables.pcs[..3]
}

/// The two walks from one set of registers: by frame pointers, and by call-frame information
/// (`None` where it could not run).
#[inline(never)]
fn both_walks(bounds: &Cell<StackBounds>) -> (Walked, Option<Walked>) {
    let mut by_pointers = Walked::EMPTY;
    let Some(registers) = registers() else {
        return (by_pointers, None);
    };
    let Some(known) = bounds_holding(bounds, registers.sp) else {
        return (by_pointers, None);
    };
    frame_pointer_walk(&registers, &known, &mut by_pointers);
    let mut by_tables = Walked::EMPTY;
    let unwound = super::unwind::unwind(&registers, &known, 0, &mut by_tables);
    (by_pointers, unwound.then_some(by_tables))
}

/// The calling function's registers, all taken at one instruction of it (inlined into it).
#[inline(always)]
fn registers() -> Option<Registers> {
    #[cfg(target_arch = "x86_64")]
    {
        let (pc, sp, fp): (usize, usize, usize);
        // SAFETY: copies the address of the next instruction and two registers; touches no
        // memory, the stack or flags.
        unsafe {
            std::arch::asm!("lea {}, [rip]", "mov {}, rsp", "mov {}, rbp",
                out(reg) pc, out(reg) sp, out(reg) fp,
                options(nomem, nostack, preserves_flags));
        }
        Some(Registers { pc, sp, fp })
    }
    #[cfg(target_arch = "aarch64")]
    {
        let (pc, sp, fp, lr): (usize, usize, usize, usize);
        // SAFETY: copies the address of this instruction and three registers; touches no
        // memory, the stack or flags.
        unsafe {
            std::arch::asm!("adr {}, .", "mov {}, sp", "mov {}, x29", "mov {}, x30",
                out(reg) pc, out(reg) sp, out(reg) fp, out(reg) lr,
                options(nomem, nostack, preserves_flags));
        }
        Some(Registers { pc, sp, fp, lr })
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// The mapping of `/proc/self/maps` that holds `addr`, read with raw system calls into a
/// buffer on the stack (no allocation, no lock).
fn mapping_holding(addr: usize) -> Option<StackBounds> {
    let mut parser = MapsParser::default();
    let mut buffer = [0u8; 4096];
    crate::sys::file::scan(c"/proc/self/maps", &mut buffer, |chunk| {
        parser.feed(chunk, addr)
    })
    .flatten()
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

    #[inline(never)]
    fn nested_both(depth: u32, bounds: &Cell<StackBounds>) -> (Walked, Option<Walked>) {
        if depth == 0 {
            both_walks(bounds)
        } else {
            let walked = nested_both(depth - 1, bounds);
            std::hint::black_box(depth);
            walked
        }
    }

    /// Issue 35: the call-frame unwind gives, frame for frame, the return addresses the
    /// frame-pointer walk gives in this build (which keeps frame pointers), from the same
    /// registers: so a stack names the same sites whichever method walked it.
    #[test]
    fn both_methods_give_the_same_return_addresses() {
        crate::capture::stack::prepare();
        let bounds = Cell::new(StackBounds::UNKNOWN);
        let (by_pointers, by_tables) = nested_both(12, &bounds);
        let by_tables = by_tables.expect("the unwind tables are prepared");
        assert_eq!(by_tables.unwinder, Unwinder::EhFrame);
        assert_eq!(by_pointers.unwinder, Unwinder::FramePointers);
        assert!(by_pointers.len >= 14, "{} frames", by_pointers.len);
        // The frame-pointer walk stops where the C library's frames keep none; the call-frame
        // unwind goes on to the thread's first frame.
        assert!(by_tables.len >= by_pointers.len);
        assert_eq!(
            by_tables.pcs[..by_pointers.len],
            by_pointers.pcs[..by_pointers.len]
        );
        assert!(frame_pointers_agree_with_unwind_tables());
        assert_eq!(crate::capture::unwind::frame_pointers_trusted(), Some(true));
    }

    /// The call-frame unwind runs inside the allocator on any thread, so it must fit small
    /// stacks: on a thread of 32 KiB (128 KiB unoptimised, where gimli's rows are copied about
    /// on the stack: about 45 KB for both walks, against 9 KB optimised) it unwinds a stack of
    /// 20 frames. A stack overflow would kill the test process.
    #[test]
    fn the_unwind_fits_a_small_thread_stack() {
        crate::capture::stack::prepare();
        let stack = if cfg!(debug_assertions) { 128 } else { 32 } << 10;
        let unwound = std::thread::Builder::new()
            .stack_size(stack)
            .spawn(|| {
                let bounds = Cell::new(StackBounds::UNKNOWN);
                nested_both(20, &bounds).1.map(|walked| walked.len)
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(unwound.is_some_and(|len| len >= 22), "{unwound:?}");
    }

    #[test]
    fn the_depth_is_bounded() {
        let bounds = Cell::new(StackBounds::UNKNOWN);
        let walked = nested(200, &bounds);
        assert_eq!(walked.len, MAX_FRAMES);
        assert!(walked.truncated);
        crate::capture::stack::prepare();
        let (_, by_tables) = nested_both(200, &bounds);
        let by_tables = by_tables.expect("the unwind tables are prepared");
        assert_eq!(by_tables.len, MAX_FRAMES);
        assert!(by_tables.truncated);
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

//! The live blocks themselves, in a slab that grows a page at a time.

use super::free_slots::FreeSlots;
use super::Block;

/// Blocks per slab page: the slab grows a page at a time, never by doubling.
pub(super) const PAGE: usize = 4096;

/// Blocks in pages, addressed by `u32` index; a new block takes a free slot likely to be
/// cached ([`FreeSlots`]).
#[derive(Debug, Default)]
pub(super) struct Slab {
    pub(super) pages: Vec<Box<[Block; PAGE]>>,
    /// Slots ever handed out (the next fresh index).
    pub(super) used: u32,
    pub(super) free: FreeSlots,
}

impl Slab {
    #[inline]
    pub(super) fn get(&self, index: u32) -> &Block {
        &self.pages[index as usize / PAGE][index as usize % PAGE]
    }

    #[inline]
    pub(super) fn get_mut(&mut self, index: u32) -> &mut Block {
        &mut self.pages[index as usize / PAGE][index as usize % PAGE]
    }

    /// The index the next [`Slab::insert`] returns.
    #[inline]
    pub(super) fn next_index(&self) -> u32 {
        self.free.next().unwrap_or(self.used)
    }

    pub(super) fn insert(&mut self, block: Block) -> u32 {
        if let Some(index) = self.free.take() {
            *self.get_mut(index) = block;
            return index;
        }
        let index = self.used;
        if (index as usize).is_multiple_of(PAGE) {
            self.pages.push(new_page());
            self.free.cover(self.pages.len() * PAGE);
        }
        self.used += 1;
        *self.get_mut(index) = block;
        index
    }

    pub(super) fn remove(&mut self, index: u32) -> Block {
        self.free.insert(index);
        *self.get(index)
    }

    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.pages.capacity() * std::mem::size_of::<usize>()
            + self.pages.len() * std::mem::size_of::<[Block; PAGE]>()
            + self.free.heap_bytes()
    }
}

/// A slab page of empty blocks, its memory mapped in one call before it is written.
///
/// A slab page spans many system pages, and a growing live set adds one every few thousand
/// inserts. Written block by block, each system page would stop the collector with a page
/// fault of its own, and on a program that keeps allocating, as a parser or a sort does,
/// those faults are a large share of the collector's CPU. Where [`populate`] cannot map them,
/// the writes fault as before.
fn new_page() -> Box<[Block; PAGE]> {
    let mut page = Box::<[Block; PAGE]>::new_uninit();
    populate(
        page.as_mut_ptr() as usize,
        std::mem::size_of::<[Block; PAGE]>(),
    );
    let blocks = page.as_mut_ptr().cast::<Block>();
    for i in 0..PAGE {
        // SAFETY: `i` is within the page's `PAGE` blocks, which `new_uninit` allocated.
        unsafe { blocks.add(i).write(Block::default()) };
    }
    // SAFETY: every block was written above.
    unsafe { page.assume_init() }
}

/// Maps the whole system pages within `len` bytes from `start` for writing, as writing to
/// them would, without changing a byte; returns whether the system did (Linux 5.14 on).
pub(super) fn populate(start: usize, len: usize) -> bool {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let Some(page) = system_page() else {
            return false;
        };
        let first = start.next_multiple_of(page);
        let end = (start + len) / page * page;
        if end <= first {
            return false;
        }
        // SAFETY: the range lies within one live allocation the caller owns; the advice maps
        // its pages and changes no byte. On a kernel without it, the call fails and nothing
        // changes.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                end - first,
                libc::MADV_POPULATE_WRITE,
            ) == 0
        }
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    {
        let _ = (start, len);
        false
    }
}

/// The system's page size, where it can be read.
#[cfg(all(target_os = "linux", not(miri)))]
fn system_page() -> Option<usize> {
    // SAFETY: `sysconf` only reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).ok().filter(|&page| page > 0)
}

/// Asks the processor to bring `block`'s line into the caches; a hint, never a fault.
#[inline(always)]
pub(super) fn prefetch(block: &Block) {
    prefetch_line(std::ptr::from_ref(block) as usize);
}

/// Asks the processor to bring the line at `address` into the caches: a hint, which never
/// faults, whatever the address.
#[inline(always)]
pub(super) fn prefetch_line(address: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: `_mm_prefetch` needs the `sse` target feature, which every x86-64 processor has
    // (it is in the target's baseline); a prefetch only hints the cache and never faults, so
    // any address will do, and nothing is read through the pointer.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address as *const i8);
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = address;
}

#[cfg(all(test, target_os = "linux", not(miri)))]
mod tests {
    use super::{populate, system_page};

    /// Which of the `pages` system pages from `start` are resident.
    fn resident(start: *mut libc::c_void, pages: usize, page: usize) -> Vec<bool> {
        let mut flags = vec![0u8; pages];
        // SAFETY: `start` is a live mapping of `pages` pages; `flags` has a byte for each.
        let done = unsafe { libc::mincore(start, pages * page, flags.as_mut_ptr()) };
        assert_eq!(done, 0, "mincore: {}", std::io::Error::last_os_error());
        flags.iter().map(|flag| flag & 1 == 1).collect()
    }

    #[test]
    // Test support: a fresh mapping, so that no page of it is mapped before populating.
    #[allow(clippy::disallowed_methods)]
    fn populating_maps_every_page_and_keeps_every_byte() {
        const PAGES: usize = 16;
        let page = system_page().expect("the system's page size");
        // SAFETY: a fresh private anonymous mapping, unmapped at the end of the test.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGES * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(start, libc::MAP_FAILED);
        // SAFETY: the mapping is `PAGES * page` bytes, readable and writable, and only this
        // test uses it.
        let bytes = unsafe { std::slice::from_raw_parts_mut(start.cast::<u8>(), PAGES * page) };
        bytes[..page].fill(0xa5);
        assert_eq!(
            resident(start, PAGES, page).iter().filter(|&&r| r).count(),
            1,
            "only the written page is mapped before populating"
        );

        // From a byte into the first page: only the whole pages after it are asked for.
        let populated = populate(start as usize + 1, PAGES * page - 1);

        let after = resident(start, PAGES, page);
        if populated {
            assert!(after.iter().all(|&r| r), "every page mapped: {after:?}");
        } else {
            // A kernel without the advice: nothing is mapped behind the program's back.
            assert_eq!(after.iter().filter(|&&r| r).count(), 1);
        }
        assert!(
            bytes[..page].iter().all(|&b| b == 0xa5),
            "the written page kept its bytes"
        );
        assert!(
            bytes[page..].iter().all(|&b| b == 0),
            "the others read as zero"
        );
        // SAFETY: the mapping made above, no longer used.
        assert_eq!(unsafe { libc::munmap(start, PAGES * page) }, 0);
    }

    #[test]
    fn a_range_within_one_page_is_left_alone() {
        assert!(!populate(4096 + 8, 100));
    }
}

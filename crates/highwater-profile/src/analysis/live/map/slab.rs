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

/// A slab page of empty blocks.
fn new_page() -> Box<[Block; PAGE]> {
    let mut page = Box::<[Block; PAGE]>::new_uninit();
    let blocks = page.as_mut_ptr().cast::<Block>();
    for i in 0..PAGE {
        // SAFETY: `i` is within the page's `PAGE` blocks, which `new_uninit` allocated.
        unsafe { blocks.add(i).write(Block::default()) };
    }
    // SAFETY: every block was written above.
    unsafe { page.assume_init() }
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

//! Small heap blocks found by where their address falls rather than by a hash: the address
//! space in regions of 64 KiB, and for each region with live small blocks a leaf of one cell
//! per 16-byte unit holding the block's slab index.
//!
//! A lookup in a leaf reads one cell, at a place known from the address alone, where the hash
//! table reads a group of control bytes and an entry, compares fingerprints, and grows by
//! building itself anew twice as large (see `LiveMap::make_room`). On a live set of millions
//! of blocks each of those reads waits for memory. A leaf costs four bytes per sixteen of its
//! region, so only blocks under [`SMALL`] bytes take cells, and the leaves take at most a
//! quarter of the address span those blocks lie in. The map turns the regions on only once
//! its heap table holds [`REGIONS_FROM`] blocks: below that the table stays in the caches and
//! leaves would only add memory.
//!
//! Larger blocks, and blocks at addresses off the 16-byte grid (an allocator may hand out
//! small blocks at 8-byte steps), stay in the hash table; each region counts its blocks there,
//! so that a lookup asks the table only in a region that has some.

use hashbrown::hash_table::Entry;
use hashbrown::HashTable;

/// Address bits below a region's number: 64 KiB regions.
const REGION_SHIFT: u32 = 16;
/// Address bits below a cell's number: the allocator's 16-byte alignment.
const CELL_SHIFT: u32 = 4;
/// Cells in a leaf.
const CELLS: usize = 1 << (REGION_SHIFT - CELL_SHIFT);
/// Bytes of one leaf.
const LEAF_BYTES: usize = CELLS * std::mem::size_of::<u32>();

/// Blocks under this many bytes take cells.
pub(super) const SMALL: u64 = 1024;

/// Heap blocks in the table from which the regions are turned on (`LiveMap::regions_on`).
pub(super) const REGIONS_FROM: usize = 1 << 20;

/// A leaf: per 16-byte unit of its region, the slab index of the block starting there plus
/// one, or `0`.
type Leaf = [u32; CELLS];

/// `Region::leaf` of a region without one.
const NO_LEAF: u32 = u32::MAX;

/// A region with live heap blocks.
#[derive(Debug, Clone, Copy)]
struct Region {
    number: u64,
    /// Its leaf's index in `Regions::leaves`, or [`NO_LEAF`].
    leaf: u32,
    /// Live blocks starting in it held in its leaf, and in the table.
    in_leaf: u32,
    in_table: u32,
}

/// The regions with live heap blocks, and their leaves.
#[derive(Debug, Default)]
pub(super) struct Regions {
    directory: HashTable<Region>,
    /// Leaves, in use or spare; a spare one is all zeroes.
    leaves: Vec<Box<Leaf>>,
    spare: Vec<u32>,
}

/// The directory's hash of a region number: Fibonacci hashing, its well-mixed top half turned
/// down to where the table picks buckets.
#[inline]
fn region_hash(number: u64) -> u64 {
    number.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(32)
}

#[inline]
fn region_of(addr: u64) -> u64 {
    addr >> REGION_SHIFT
}

/// Whether `addr` is on the grid of cells: 16-byte aligned, in the lower half of the address
/// space, where user-space heap addresses are (the timeline keeps blocks of reallocs in flight
/// at keys in the upper half, one per thread, each used once per realloc).
#[inline]
pub(super) fn has_cell(addr: u64) -> bool {
    addr.trailing_zeros() >= CELL_SHIFT && addr < 1 << 63
}

/// The cell of `addr` in its region's leaf.
#[inline]
fn cell_of(addr: u64) -> usize {
    (addr >> CELL_SHIFT) as usize & (CELLS - 1)
}

/// The cell of `addr` in leaf `leaf`, unless the region has no leaf (`NO_LEAF`).
#[inline]
fn leaf_cell(leaves: &mut [Box<Leaf>], leaf: u32, addr: u64) -> Option<&mut u32> {
    (leaf != NO_LEAF).then(|| &mut leaves[leaf as usize][cell_of(addr)])
}

/// A leaf for a region: a spare one, or a new one.
#[cold]
#[inline(never)]
fn take_leaf(leaves: &mut Vec<Box<Leaf>>, spare: &mut Vec<u32>) -> u32 {
    if let Some(leaf) = spare.pop() {
        return leaf;
    }
    leaves.push(new_leaf());
    u32::try_from(leaves.len() - 1).expect("fewer leaves than slab slots")
}

/// An empty leaf, its memory mapped for writing before it is cleared.
///
/// Memory fresh from the system reads as zeroes, but a leaf left so would be read (a lookup,
/// a prefetch) before its first write, which maps the system's shared page of zeroes and makes
/// that write copy it: a fault, and a flush of every other core's address translations, which
/// costs as much again in a program whose threads run on the other cores.
fn new_leaf() -> Box<Leaf> {
    let mut leaf = Box::<Leaf>::new_uninit();
    populate(leaf.as_mut_ptr() as usize, LEAF_BYTES);
    // SAFETY: the pointer is to the box's own allocation of one `Leaf`, and all-zero bytes
    // are a valid `Leaf`.
    unsafe {
        leaf.as_mut_ptr().write_bytes(0, 1);
        leaf.assume_init()
    }
}

/// Maps the whole system pages within `len` bytes from `start` for writing, as writing to
/// them would, without changing a byte; returns whether the system did (Linux 5.14 on).
fn populate(start: usize, len: usize) -> bool {
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

/// Where a heap address stands, found to look a block up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// The block starting there is in a leaf, at this slab index.
    Leaf(u32),
    /// If a block starts there, the table holds it.
    Table,
    /// No block starts there.
    Nothing,
}

/// A heap address's region, found to change what starts there.
#[derive(Debug)]
pub(super) struct Place<'a> {
    region: &'a mut Region,
    /// The address's cell, when its region has a leaf.
    cell: Option<&'a mut u32>,
}

impl Place<'_> {
    /// The slab index of the block in the address's cell, if one is there.
    #[inline]
    pub(super) fn in_cell(&self) -> Option<u32> {
        self.cell.as_deref().and_then(|cell| cell.checked_sub(1))
    }

    /// Whether the table holds blocks of this region.
    #[inline]
    pub(super) fn has_table_blocks(&self) -> bool {
        self.region.in_table > 0
    }

    /// Slab index `at` starts at the address's cell, which held none.
    #[inline]
    pub(super) fn fill(self, at: u32) {
        let cell = self.cell.expect("a place with a cell");
        debug_assert_eq!(*cell, 0);
        *cell = at + 1;
        self.region.in_leaf += 1;
    }

    /// Slab index `at` replaces the block in the address's cell; returns that block's index.
    #[inline]
    pub(super) fn replace(self, at: u32) -> Option<u32> {
        let cell = self.cell.expect("a place with a cell");
        std::mem::replace(cell, at + 1).checked_sub(1)
    }

    /// The block in the address's cell ended (or moved away); returns whether the region has
    /// no live blocks left, to be forgotten ([`Regions::forget_if_empty`]).
    #[inline]
    pub(super) fn clear(self) -> bool {
        let cell = self.cell.expect("a place with a cell");
        debug_assert_ne!(*cell, 0);
        *cell = 0;
        self.region.in_leaf -= 1;
        self.region.in_leaf == 0 && self.region.in_table == 0
    }

    /// A block starting here entered the table.
    #[inline]
    pub(super) fn table_gained(self) {
        self.region.in_table += 1;
    }

    /// A block starting here left the table; returns whether the region has no live blocks
    /// left.
    #[inline]
    pub(super) fn table_lost(self) -> bool {
        self.region.in_table -= 1;
        self.region.in_leaf == 0 && self.region.in_table == 0
    }
}

impl Regions {
    /// The region of `addr`, if it has live blocks.
    #[inline]
    fn region(&self, addr: u64) -> Option<&Region> {
        let number = region_of(addr);
        self.directory
            .find(region_hash(number), |region| region.number == number)
    }

    /// Where a block starting at heap address `addr` would be.
    #[inline]
    pub(super) fn find(&self, addr: u64) -> Found {
        if !has_cell(addr) {
            return Found::Table;
        }
        let Some(region) = self.region(addr) else {
            return Found::Nothing;
        };
        if region.leaf != NO_LEAF {
            let cell = self.leaves[region.leaf as usize][cell_of(addr)];
            if let Some(at) = cell.checked_sub(1) {
                return Found::Leaf(at);
            }
        }
        if region.in_table > 0 {
            Found::Table
        } else {
            Found::Nothing
        }
    }

    /// The place of `addr` (`None` off the grid of cells, where the table alone holds blocks),
    /// its region opened if it had no live blocks; with a cell when its region has a leaf, or
    /// gets one because `small`.
    #[inline]
    pub(super) fn open(&mut self, addr: u64, small: bool) -> Option<Place<'_>> {
        if !has_cell(addr) {
            return None;
        }
        let number = region_of(addr);
        let region = match self.directory.entry(
            region_hash(number),
            |region| region.number == number,
            |region| region_hash(region.number),
        ) {
            Entry::Occupied(found) => found.into_mut(),
            Entry::Vacant(vacant) => vacant
                .insert(Region {
                    number,
                    leaf: NO_LEAF,
                    in_leaf: 0,
                    in_table: 0,
                })
                .into_mut(),
        };
        if small && region.leaf == NO_LEAF {
            region.leaf = take_leaf(&mut self.leaves, &mut self.spare);
        }
        let cell = leaf_cell(&mut self.leaves, region.leaf, addr);
        Some(Place { region, cell })
    }

    /// The place of `addr`, if it is on the grid and its region has live blocks.
    #[inline]
    pub(super) fn place(&mut self, addr: u64) -> Option<Place<'_>> {
        if !has_cell(addr) {
            return None;
        }
        let number = region_of(addr);
        let region = self
            .directory
            .find_mut(region_hash(number), |region| region.number == number)?;
        let cell = leaf_cell(&mut self.leaves, region.leaf, addr);
        Some(Place { region, cell })
    }

    /// Forgets the region of `addr` if it has no live blocks left; its leaf, all clear, becomes
    /// a spare.
    pub(super) fn forget_if_empty(&mut self, addr: u64) {
        let number = region_of(addr);
        let Ok(found) = self
            .directory
            .find_entry(region_hash(number), |region| region.number == number)
        else {
            return;
        };
        let region = *found.get();
        if region.in_leaf > 0 || region.in_table > 0 {
            return;
        }
        found.remove();
        if region.leaf != NO_LEAF {
            debug_assert!(self.leaves[region.leaf as usize]
                .iter()
                .all(|&cell| cell == 0));
            self.spare.push(region.leaf);
        }
    }

    /// The address of the cell of `addr`, if its region has a leaf: for a prefetch.
    #[inline]
    pub(super) fn cell_address(&self, addr: u64) -> Option<usize> {
        if !has_cell(addr) {
            return None;
        }
        let region = self.region(addr)?;
        (region.leaf != NO_LEAF)
            .then(|| std::ptr::from_ref(&self.leaves[region.leaf as usize][cell_of(addr)]) as usize)
    }

    /// Every slab index held in a leaf.
    pub(super) fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.directory
            .iter()
            .filter(|region| region.leaf != NO_LEAF)
            .flat_map(|region| {
                self.leaves[region.leaf as usize]
                    .iter()
                    .filter_map(|&cell| cell.checked_sub(1))
            })
    }

    /// Heap bytes the regions hold: leaves (spare ones too) and the directory.
    #[cfg(test)]
    pub(super) fn heap_bytes(&self) -> usize {
        self.leaves.len() * LEAF_BYTES
            + self.leaves.capacity() * std::mem::size_of::<Box<Leaf>>()
            + self.spare.capacity() * std::mem::size_of::<u32>()
            + self.directory.allocation_size()
    }
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

//! Physical allocations behind virtual-memory mappings: when their memory is really freed.
//!
//! With CUDA's virtual memory management a program creates physical memory (`cuMemCreate`,
//! recorded as an allocation keyed by its handle), maps it into reserved address ranges
//! (`cuMemMap`), and later unmaps it (`cuMemUnmap`) and releases the handle (`cuMemRelease`).
//! The memory is freed only when both have happened: the handle released and every mapping of
//! it unmapped, in either order. The ledger keeps the mappings and the released handles still
//! mapped, and says which physical allocations each unmap or release ends.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

/// Mappings and released handles of one device.
#[derive(Debug, Default)]
pub(crate) struct VmmLedger {
    /// Start of each mapped range → the handle mapped there.
    mappings: BTreeMap<u64, u64>,
    /// Handle → how many ranges map it now.
    mapped: FxHashMap<u64, u32>,
    /// Handles released while still mapped: freed by their last unmap.
    released: FxHashMap<u64, ()>,
}

impl VmmLedger {
    /// The range starting at `va` now maps `handle`.
    pub(crate) fn map(&mut self, va: u64, handle: u64) {
        if let Some(previous) = self.mappings.insert(va, handle) {
            // A range mapped twice without an unmap: the driver refuses that, so the old entry
            // is stale; forget it.
            self.unmapped(previous);
        }
        *self.mapped.entry(handle).or_default() += 1;
    }

    /// The mappings starting in `va .. va + size` were unmapped; `ended` is told each handle
    /// whose memory that frees (released, and no longer mapped anywhere).
    pub(crate) fn unmap(&mut self, va: u64, size: u64, mut ended: impl FnMut(u64)) {
        let end = va.saturating_add(size.max(1));
        let starts: Vec<u64> = self.mappings.range(va..end).map(|(&at, _)| at).collect();
        for start in starts {
            if let Some(handle) = self.mappings.remove(&start) {
                if self.unmapped(handle) && self.released.remove(&handle).is_some() {
                    ended(handle);
                }
            }
        }
    }

    /// `handle` was released: whether that frees its memory now (nothing maps it).
    pub(crate) fn release(&mut self, handle: u64) -> bool {
        if self.mapped.contains_key(&handle) {
            self.released.insert(handle, ());
            false
        } else {
            true
        }
    }

    /// One mapping of `handle` is gone: whether it was the last.
    fn unmapped(&mut self, handle: u64) -> bool {
        match self.mapped.get_mut(&handle) {
            Some(count) if *count > 1 => {
                *count -= 1;
                false
            }
            Some(_) => {
                self.mapped.remove(&handle);
                true
            }
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unmap(ledger: &mut VmmLedger, va: u64, size: u64) -> Vec<u64> {
        let mut ended = Vec::new();
        ledger.unmap(va, size, |handle| ended.push(handle));
        ended
    }

    #[test]
    fn release_after_unmap_frees_at_the_release() {
        let mut ledger = VmmLedger::default();
        ledger.map(0x1000, 7);
        assert_eq!(unmap(&mut ledger, 0x1000, 0x1000), Vec::<u64>::new());
        assert!(ledger.release(7));
    }

    #[test]
    fn release_while_mapped_frees_at_the_last_unmap() {
        let mut ledger = VmmLedger::default();
        ledger.map(0x1000, 7);
        ledger.map(0x9000, 7);
        assert!(!ledger.release(7));
        assert_eq!(unmap(&mut ledger, 0x1000, 0x1000), Vec::<u64>::new());
        assert_eq!(unmap(&mut ledger, 0x9000, 0x1000), vec![7]);
        // Gone for good: a second unmap of the range frees nothing.
        assert_eq!(unmap(&mut ledger, 0x9000, 0x1000), Vec::<u64>::new());
    }

    #[test]
    fn one_unmap_can_end_several_mappings() {
        let mut ledger = VmmLedger::default();
        // Expandable segments: pages mapped side by side, unmapped as one range.
        for (page, handle) in [(0x20_0000u64, 1u64), (0x40_0000, 2), (0x60_0000, 3)] {
            ledger.map(page, handle);
            assert!(!ledger.release(handle));
        }
        let mut ended = unmap(&mut ledger, 0x20_0000, 0x40_0000);
        ended.sort_unstable();
        assert_eq!(ended, vec![1, 2]);
        assert_eq!(unmap(&mut ledger, 0x60_0000, 0x20_0000), vec![3]);
    }

    #[test]
    fn a_handle_never_mapped_is_freed_by_its_release() {
        let mut ledger = VmmLedger::default();
        assert!(ledger.release(42));
        assert_eq!(unmap(&mut ledger, 0, u64::MAX), Vec::<u64>::new());
    }
}

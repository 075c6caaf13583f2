//! State vs temporary: which of the bytes live at the peak were freed before the span that
//! allocated them exited.
//!
//! # The rule
//!
//! A block live at the peak is *temporary* when it is freed while the span instance that owns it
//! (the innermost span open on its thread when the alloc, or the realloc that made it, ran: the
//! owner residuals use) is still open. Every other byte live at the peak is *state*: it outlived
//! its span. In the stream's order, so:
//!
//! - a block allocated outside every span has no span to be freed inside: state;
//! - a block still live when the session ends was never freed: state, even when its span is
//!   still open then;
//! - a span still open at the end never exited, so a block it owns that was freed before the end
//!   is temporary;
//! - a free on another thread counts by when it comes in the merged stream: temporary if the
//!   owner (on the allocating thread) is still open then;
//! - a realloc moves a block, it does not free it: a block live at the peak that is resized
//!   later is judged by how the resized block ends (through any number of reallocs), against the
//!   owner it had at the peak; likewise a block recategorised after the peak counts in the
//!   category it had at the peak. An alloc over a key that is still live (a repair) ends the old
//!   block as a free would.
//!
//! # Cost
//!
//! Nothing per allocation. A free looks at one flag the live map hands back (was the block live
//! at the peak?) and, only then, whether its owner is open. Blocks live at the peak that are
//! resized or recategorised afterwards are *carried*, keyed by the block they became, in a map
//! that is empty most of the time and is looked at only when it is not. A new peak clears both.

use rustc_hash::FxHashMap;

use crate::model::Category;

use super::event::DeviceId;
use super::sites::PeakSample;

/// What a block live at the peak was, kept while the block it became lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Carried {
    /// Bytes at the peak.
    pub(crate) bytes: u64,
    /// Category at the peak.
    pub(crate) category: Category,
    /// The owner at the peak (a span instance, open when carried).
    pub(crate) owner: u32,
    /// When that owner entered, to tell it from a later instance in the same slot.
    pub(crate) owner_entered: u64,
    /// The call sites' record of the block at the peak, when it was sampled: told when the
    /// block turns out temporary.
    pub(crate) sample: Option<PeakSample>,
}

/// Temporary bytes at the latest peak, on the peak's device.
#[derive(Debug, Default)]
pub(crate) struct Temporaries {
    /// Bytes live at the peak freed since while their owner was open, by [`Category::index`].
    by_category: [u64; Category::COUNT],
    /// Blocks live at the peak whose fate is not known yet because they changed after it, by
    /// (device, address) of the block they are now.
    carried: FxHashMap<(DeviceId, u64), Carried>,
    /// Something was counted or carried since the peak.
    dirty: bool,
}

impl Temporaries {
    /// A new peak: everything live now is live at it, and nothing is decided yet.
    #[inline]
    pub(crate) fn mark_peak(&mut self) {
        if self.dirty {
            self.by_category = [0; Category::COUNT];
            self.carried.clear();
            self.dirty = false;
        }
    }

    /// Bytes live at the peak, of `category`, were freed inside their span.
    pub(crate) fn count(&mut self, category: Category, bytes: u64) {
        let slot = &mut self.by_category[category.index()];
        *slot = slot.saturating_add(bytes);
        self.dirty = true;
    }

    /// Takes out what the block at `(device, addr)` was at the peak, if it was carried.
    #[inline]
    pub(crate) fn take(&mut self, device: DeviceId, addr: u64) -> Option<Carried> {
        if self.carried.is_empty() {
            return None;
        }
        self.carried.remove(&(device, addr))
    }

    /// The block now at `(device, addr)` carries `carried` from the peak.
    pub(crate) fn carry(&mut self, device: DeviceId, addr: u64, carried: Carried) {
        self.carried.insert((device, addr), carried);
        self.dirty = true;
    }

    /// What the block at `(device, from)` carries moves with it to `to`.
    pub(crate) fn rekey(&mut self, device: DeviceId, from: u64, to: u64) {
        if let Some(carried) = self.take(device, from) {
            self.carry(device, to, carried);
        }
    }

    /// Temporary bytes at the peak by [`Category::index`].
    pub(crate) fn by_category(&self) -> &[u64; Category::COUNT] {
        &self.by_category
    }

    /// Blocks carried now.
    #[cfg(test)]
    pub(crate) fn carried_len(&self) -> usize {
        self.carried.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(bytes: u64) -> Carried {
        Carried {
            bytes,
            category: Category::Optimizer,
            owner: 3,
            owner_entered: 7,
            sample: None,
        }
    }

    #[test]
    fn a_new_peak_forgets_counts_and_carried_blocks() {
        let mut t = Temporaries::default();
        t.count(Category::Activation, 10);
        t.carry(DeviceId::CPU, 0x10, carried(5));
        assert_eq!(t.by_category()[Category::Activation.index()], 10);
        assert_eq!(t.carried_len(), 1);
        t.mark_peak();
        assert_eq!(t.by_category(), &[0; Category::COUNT]);
        assert_eq!(t.take(DeviceId::CPU, 0x10), None);
    }

    #[test]
    fn carried_blocks_are_keyed_by_device_and_address() {
        let mut t = Temporaries::default();
        t.carry(DeviceId(1), 0x10, carried(5));
        assert_eq!(t.take(DeviceId::CPU, 0x10), None);
        assert_eq!(t.take(DeviceId(1), 0x10), Some(carried(5)));
        assert_eq!(t.take(DeviceId(1), 0x10), None);
    }
}

//! The state/temporary split's part of applying an event (see [`super::super::temporary`]):
//! what a block that ends or changes did to the temporary bytes at the peak.

use super::super::event::DeviceId;
use super::super::live::LiveEntry;
use super::super::temporary::Carried;
use super::Timeline;

impl Timeline {
    /// A block ended for good (freed, or displaced at its key): its bytes at the peak, or what
    /// it carried from the peak, were temporary if their owner at the peak is still open.
    #[inline]
    pub(super) fn split_ended(&mut self, device: DeviceId, addr: u64, entry: &LiveEntry) {
        if entry.at_peak {
            if self.peak.device == Some(device) && self.spans.open_since(entry.owner).is_some() {
                self.temporaries.count(entry.category, entry.size);
            }
        } else if let Some(carried) = self.temporaries.take(device, addr) {
            if self.spans.open_since(carried.owner) == Some(carried.owner_entered) {
                self.temporaries.count(carried.category, carried.bytes);
            }
        }
    }

    /// A block is about to become another one (resized, or recategorised): what it was at the
    /// peak, while that is still undecided, for the caller to carry to the new block.
    #[inline]
    pub(super) fn split_changed(
        &mut self,
        device: DeviceId,
        addr: u64,
        entry: &LiveEntry,
    ) -> Option<Carried> {
        if !entry.at_peak {
            return self.temporaries.take(device, addr);
        }
        if self.peak.device != Some(device) {
            return None;
        }
        // An owner that already exited was outlived: state, whatever happens to the block now.
        let owner_entered = self.spans.open_since(entry.owner)?;
        Some(Carried {
            bytes: entry.size,
            category: entry.category,
            owner: entry.owner,
            owner_entered,
        })
    }
}

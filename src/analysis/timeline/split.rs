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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::analysis::{Event, EventKind, SpanSeq, Timeline, TimelineConfig};
    use crate::model::{Category, SpanLabel, Step};
    use crate::profile::Profile;

    use super::DeviceId;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    /// Events on any thread, 10 ns apart, with explicit span instances.
    struct Stream {
        timeline: Timeline,
        ts: u64,
        next_id: SpanSeq,
    }

    impl Stream {
        fn new() -> Stream {
            Stream {
                timeline: Timeline::new(TimelineConfig::default()),
                ts: 0,
                next_id: 1,
            }
        }

        fn on(&mut self, thread: u32, span: SpanSeq, kind: EventKind) {
            self.ts += 10;
            self.timeline.apply(&Event {
                ts_ns: self.ts,
                thread,
                span,
                kind,
            });
        }

        /// Opens a span on `thread` under `parent` (`0`: none); returns its id.
        fn enter(&mut self, thread: u32, parent: SpanSeq, name: &str, label: SpanLabel) -> SpanSeq {
            let name = self.timeline.intern_name(name);
            let id = self.next_id;
            self.next_id += 1;
            self.on(thread, parent, EventKind::SpanEnter { id, name, label });
            id
        }

        fn exit(&mut self, thread: u32, id: SpanSeq) {
            self.on(thread, id, EventKind::SpanExit { id });
        }

        fn alloc(&mut self, thread: u32, span: SpanSeq, addr: u64, size: u64, category: Category) {
            let device = DeviceId::CPU;
            let kind = EventKind::Alloc {
                device,
                addr,
                size,
                category,
            };
            self.on(thread, span, kind);
        }

        fn free(&mut self, thread: u32, span: SpanSeq, addr: u64) {
            let device = DeviceId::CPU;
            self.on(
                thread,
                span,
                EventKind::Free {
                    device,
                    addr,
                    size: 0,
                },
            );
        }

        fn realloc(&mut self, thread: u32, span: SpanSeq, old_addr: u64, new_addr: u64, size: u64) {
            let kind = EventKind::Realloc {
                old_addr,
                old_size: 0,
                new_addr,
                new_size: size,
                category: Category::Other,
                released_ns: None,
            };
            self.on(thread, span, kind);
        }

        fn profile(&self) -> Profile {
            self.timeline.profile(self.ts + 10)
        }
    }

    fn cats(pairs: &[(Category, u64)]) -> BTreeMap<Category, u64> {
        pairs.iter().copied().collect()
    }

    /// Every edge case of the rule in `analysis::temporary`, each with its own byte size, all
    /// live at one peak and settled after it.
    #[test]
    fn temporaries_at_the_peak_are_exactly_the_bytes_freed_inside_their_span() {
        use Category::{Activation, Gradient, Optimizer, Other};
        let mut s = Stream::new();
        let (main, loader) = (1, 2);
        s.alloc(main, 0, 0x1, KIB, Other); // outside every span, freed later: state
        let init = s.enter(main, 0, "init", SpanLabel::Step(Step::Optimizer));
        s.alloc(main, init, 0x2, 2 * KIB, Optimizer); // outlives `init`: state
        s.exit(main, init);
        let step = s.enter(main, 0, "step", SpanLabel::Plain);
        let child = s.enter(main, step, "child", SpanLabel::Plain);
        s.alloc(main, child, 0x3, 4 * KIB, Activation); // freed by `step` after `child`: state
        s.exit(main, child);
        s.alloc(main, step, 0x4, 8 * KIB, Optimizer); // freed in `step`: temporary
        s.alloc(main, step, 0x5, 16 * KIB, Gradient); // freed by another thread, in `step`
        s.alloc(main, step, 0x6, 32 * KIB, Optimizer); // resized in `step`, then freed in it
        s.alloc(main, step, 0x7, 64 * KIB, Optimizer); // resized in `step`, outlives it
        s.alloc(main, step, 0x8, 128 * KIB, Activation); // recategorised, then freed in `step`
        s.alloc(main, step, 0x9, 256 * KIB, Other); // displaced by an alloc at its key in `step`
        s.alloc(main, step, 0xa, 512 * KIB, Activation); // resized after `step`, then freed
        let open = s.enter(loader, 0, "loader", SpanLabel::Plain); // never exits
        s.alloc(loader, open, 0xb, MIB, Other); // freed before the end: temporary
        s.alloc(loader, open, 0xc, 2 * MIB, Other); // live at the end: state
        let peak_ts = s.ts;

        // After the peak: only frees and shrinking changes.
        s.free(main, step, 0x4);
        s.free(loader, open, 0x5);
        s.realloc(main, step, 0x6, 0x16, 16 * KIB);
        s.free(main, step, 0x16);
        s.realloc(main, step, 0x7, 0x17, 32 * KIB);
        s.on(
            main,
            step,
            EventKind::SetCategory {
                device: DeviceId::CPU,
                addr: 0x8,
                category: Gradient,
            },
        );
        s.free(main, step, 0x8);
        s.alloc(main, step, 0x9, KIB, Other);
        s.free(main, step, 0x3);
        s.exit(main, step);
        s.free(loader, open, 0x17); // another thread, after `step` exited: state
        s.realloc(main, 0, 0xa, 0x1a, 8 * KIB);
        s.free(main, 0, 0x1a);
        s.free(main, 0, 0x2);
        s.free(main, 0, 0x1);
        s.free(loader, open, 0xb);

        let profile = s.profile();
        let summary = &profile.summary;
        assert_eq!(summary.peak_timestamp_ns, peak_ts);
        assert_eq!(
            summary.peak_by_category,
            cats(&[
                (Other, KIB + 256 * KIB + MIB + 2 * MIB),
                (Optimizer, 2 * KIB + 8 * KIB + 32 * KIB + 64 * KIB),
                (Activation, 4 * KIB + 128 * KIB + 512 * KIB),
                (Gradient, 16 * KIB),
            ])
        );
        assert_eq!(
            summary.peak_temporary_by_category,
            cats(&[
                (Other, 256 * KIB + MIB),
                (Optimizer, 8 * KIB + 32 * KIB),
                (Activation, 128 * KIB),
                (Gradient, 16 * KIB),
            ])
        );
        assert_eq!(s.timeline.temporaries.carried_len(), 0);
    }

    #[test]
    fn a_higher_peak_starts_the_split_again() {
        let mut s = Stream::new();
        let step = s.enter(1, 0, "step", SpanLabel::Plain);
        s.alloc(1, step, 0x1, 100, Category::Optimizer);
        // Resized after the peak, then freed in the span: its 100 bytes at the peak count.
        s.realloc(1, step, 0x1, 0x2, 60);
        s.free(1, step, 0x2);
        assert_eq!(
            s.profile().summary.peak_temporary_by_category,
            cats(&[(Category::Optimizer, 100)])
        );
        s.alloc(1, step, 0x3, 50, Category::Other);
        s.realloc(1, step, 0x3, 0x4, 50);
        s.alloc(1, step, 0x5, 200, Category::Activation);
        // A higher peak: nothing of it is decided yet, and nothing is carried.
        let second = s.profile();
        assert_eq!(second.summary.peak_bytes, 250);
        assert!(second.summary.peak_temporary_by_category.is_empty());
        assert_eq!(s.timeline.temporaries.carried_len(), 0);
        s.free(1, step, 0x4);
        s.exit(1, step);
        s.free(1, 0, 0x5);
        assert_eq!(
            s.profile().summary.peak_temporary_by_category,
            cats(&[(Category::Other, 50)])
        );
    }

    #[test]
    fn only_the_peak_device_is_split() {
        let mut s = Stream::new();
        let gpu = s.timeline.intern_device("cuda:0");
        let step = s.enter(1, 0, "step", SpanLabel::Plain);
        s.alloc(1, step, 0x1, 100, Category::Activation);
        let kind = EventKind::Alloc {
            device: gpu,
            addr: 0x1,
            size: 1000,
            category: Category::Activation,
        };
        s.on(1, step, kind);
        s.free(1, step, 0x1);
        s.on(
            1,
            step,
            EventKind::Free {
                device: gpu,
                addr: 0x1,
                size: 0,
            },
        );
        let profile = s.profile();
        assert_eq!(profile.summary.peak_device, "cuda:0");
        assert_eq!(
            profile.summary.peak_temporary_by_category,
            cats(&[(Category::Activation, 1000)])
        );
    }
}

//! The state/temporary split's part of applying an event (see [`super::super::temporary`]):
//! what a block that ends or changes did to the temporary bytes at the peak, and to those of
//! its call site when it was sampled.

use super::super::event::DeviceId;
use super::super::live::LiveEntry;
use super::super::sites::PeakSample;
use super::super::temporary::Carried;
use super::Timeline;

impl Timeline {
    /// The block at `addr` of `device` ended: the call sites, which follow the CPU heap only,
    /// forget it; where they keep it as it was at the peak, if they do.
    #[inline]
    pub(super) fn sampled_ended(&mut self, device: DeviceId, addr: u64) -> Option<PeakSample> {
        if device == DeviceId::CPU {
            self.sites.ended(addr)
        } else {
            None
        }
    }

    /// A block ended for good (freed, or displaced at its key): its bytes at the peak, or what
    /// it carried from the peak, were temporary if their owner at the peak is still open.
    /// `sample`: where the call sites keep the block as it was at the peak, if it was sampled.
    #[inline]
    pub(super) fn split_ended(
        &mut self,
        device: DeviceId,
        addr: u64,
        entry: &LiveEntry,
        sample: Option<PeakSample>,
    ) {
        let (category, bytes, sample) = if entry.at_peak {
            if self.peak.device != Some(device) || self.spans.open_since(entry.owner).is_none() {
                return;
            }
            (entry.category, entry.size, sample)
        } else if let Some(carried) = self.temporaries.take(device, addr) {
            if self.spans.open_since(carried.owner) != Some(carried.owner_entered) {
                return;
            }
            (carried.category, carried.bytes, carried.sample)
        } else {
            return;
        };
        self.temporaries.count(category, bytes);
        if let Some(sample) = sample {
            self.sites.temporary_at_peak(sample);
        }
    }

    /// A block is about to become another one (resized, or recategorised): what it was at the
    /// peak, while that is still undecided, for the caller to carry to the new block.
    /// `sample`: as for [`Timeline::split_ended`].
    #[inline]
    pub(super) fn split_changed(
        &mut self,
        device: DeviceId,
        addr: u64,
        entry: &LiveEntry,
        sample: Option<PeakSample>,
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
            sample,
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
        /// Category of the latest alloc, for its sample.
        last_category: Category,
    }

    impl Stream {
        fn new() -> Stream {
            Stream {
                timeline: Timeline::new(TimelineConfig::default()),
                ts: 0,
                next_id: 1,
                last_category: Category::Other,
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
            self.last_category = category;
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

        /// The allocation just applied was sampled, from the stack `[pc]`.
        fn sampled(&mut self, thread: u32, span: SpanSeq, addr: u64, size: u64, pc: u64) {
            let stack = self.timeline.intern_stack(&[pc], false);
            let category = self.last_category;
            let kind = EventKind::Sampled {
                addr,
                size,
                category,
                stack,
            };
            self.on(thread, span, kind);
        }

        fn profile(&self) -> Profile {
            self.timeline.profile(self.ts + 10)
        }
    }

    /// Each call site's (category, bytes at the peak, temporary bytes at the peak, blocks at
    /// the peak) by its only frame's address, with the shares' spans left out.
    fn site_shares(profile: &Profile) -> BTreeMap<u64, Vec<(Category, u64, u64, u64)>> {
        profile
            .sites
            .iter()
            .map(|site| {
                let mut shares: Vec<_> = site
                    .shares
                    .iter()
                    .map(|s| {
                        (
                            s.category,
                            s.peak_bytes,
                            s.peak_temporary_bytes,
                            s.peak_count,
                        )
                    })
                    .collect();
                shares.sort();
                (site.frames[0].pc, shares)
            })
            .collect()
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

    /// The split, per call site: every sampled block's fate at the peak (freed in its span,
    /// outliving it, resized or recategorised after the peak) lands in its own site's share,
    /// and with every allocation sampled the shares add up to the summary's split exactly.
    #[test]
    fn each_sites_share_has_the_temporary_bytes_of_its_own_blocks_at_the_peak() {
        use Category::{Activation, Gradient, Optimizer};
        let (a, b, c) = (0xa, 0xb, 0xc);
        let mut s = Stream::new();
        s.timeline.set_sampling(1, "frame-pointers");
        let step = s.enter(1, 0, "step", SpanLabel::Plain);
        s.alloc(1, step, 0x1, 1000, Optimizer); // freed after `step`: state
        s.sampled(1, step, 0x1, 1000, a);
        s.alloc(1, step, 0x2, 200, Optimizer); // freed in `step`: temporary
        s.sampled(1, step, 0x2, 200, b);
        s.alloc(1, step, 0x3, 300, Activation); // resized after the peak, freed in `step`
        s.sampled(1, step, 0x3, 300, c);
        s.alloc(1, step, 0x4, 400, Activation); // recategorised after the peak, freed in `step`
        s.sampled(1, step, 0x4, 400, b);
        s.alloc(1, step, 0x6, 600, Optimizer); // resized after the peak, outlives `step`
        s.sampled(1, step, 0x6, 600, a);

        s.free(1, step, 0x2);
        s.realloc(1, step, 0x3, 0x13, 100);
        s.on(
            1,
            step,
            EventKind::SetCategory {
                device: DeviceId::CPU,
                addr: 0x4,
                category: Gradient,
            },
        );
        s.free(1, step, 0x4);
        s.free(1, step, 0x13);
        s.realloc(1, step, 0x6, 0x16, 60);
        s.exit(1, step);
        s.free(1, 0, 0x1);
        s.free(1, 0, 0x16);

        let profile = s.profile();
        assert_eq!(profile.summary.peak_bytes, 2500);
        assert_eq!(
            profile.summary.peak_temporary_by_category,
            cats(&[(Optimizer, 200), (Activation, 700)])
        );
        let expected: BTreeMap<u64, Vec<(Category, u64, u64, u64)>> = [
            (a, vec![(Optimizer, 1600, 0, 2)]),
            (b, vec![(Optimizer, 200, 200, 1), (Activation, 400, 400, 1)]),
            (c, vec![(Activation, 300, 300, 1)]),
        ]
        .into_iter()
        .map(|(pc, mut shares)| {
            shares.sort();
            (pc, shares)
        })
        .collect();
        assert_eq!(site_shares(&profile), expected);
        let mut by_category: BTreeMap<Category, u64> = BTreeMap::new();
        for share in profile.sites.iter().flat_map(|site| &site.shares) {
            if share.peak_temporary_bytes > 0 {
                *by_category.entry(share.category).or_default() += share.peak_temporary_bytes;
            }
        }
        assert_eq!(by_category, profile.summary.peak_temporary_by_category);
        let site_b = profile.sites.iter().find(|site| site.frames[0].pc == b);
        assert_eq!(site_b.map(|site| site.peak_count), Some(2));
    }

    /// Sampled at `R`, a share's temporary bytes are its temporary samples weighted by
    /// `s / p`, as its bytes at the peak are (and its blocks by `1 / p`); a higher peak starts
    /// them again.
    #[test]
    fn a_sites_temporary_bytes_are_weighted_like_its_bytes_at_the_peak() {
        let mean = 1000;
        let mut s = Stream::new();
        s.timeline.set_sampling(mean, "frame-pointers");
        let step = s.enter(1, 0, "step", SpanLabel::Plain);
        s.alloc(1, step, 0x1, 100, Category::Optimizer);
        s.sampled(1, step, 0x1, 100, 0xa);
        s.alloc(1, step, 0x2, 5000, Category::Optimizer);
        s.sampled(1, step, 0x2, 5000, 0xb);
        s.free(1, step, 0x1);
        s.exit(1, step);
        let p = crate::model::sample_probability(100, mean);
        let (weight, blocks) = ((100.0 / p).round() as u64, (1.0 / p).round() as u64);
        let expected: BTreeMap<u64, Vec<(Category, u64, u64, u64)>> = [
            (0xa, vec![(Category::Optimizer, weight, weight, blocks)]),
            (0xb, vec![(Category::Optimizer, 5000, 0, 1)]),
        ]
        .into_iter()
        .collect();
        assert!(weight > 100);
        assert_eq!(site_shares(&s.profile()), expected);

        // A higher peak, in a new span: the freed block was not live there, and nothing of
        // the new one is decided yet.
        let next = s.enter(1, 0, "next", SpanLabel::Plain);
        s.alloc(1, next, 0x3, 8000, Category::Activation);
        s.sampled(1, next, 0x3, 8000, 0xc);
        let profile = s.profile();
        assert_eq!(profile.summary.peak_bytes, 13_000);
        assert!(profile
            .sites
            .iter()
            .flat_map(|site| &site.shares)
            .all(|share| share.peak_temporary_bytes == 0));
        s.free(1, next, 0x3);
        let shares = site_shares(&s.profile());
        assert_eq!(shares[&0xc], [(Category::Activation, 8000, 8000, 1)]);
        assert_eq!(shares[&0xb], [(Category::Optimizer, 5000, 0, 1)]);
    }
}

//! The live set against a plain model of it: whatever the operations, on keys that share
//! a page (so an index window) and keys spread further, it finds, frees, moves and
//! recategorises the blocks the model says, and counts at the peak what was live there.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// What the model keeps of a live block.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Modeled {
    size: u64,
    ts: u64,
    category: Category,
    /// Live at the latest peak as it is now.
    at_peak: bool,
}

#[derive(Debug, Default)]
struct Model {
    live: BTreeMap<(u16, u64), Modeled>,
    /// Bytes and count per category of the blocks live at the latest peak.
    at_peak: BTreeMap<Category, (u64, u64)>,
}

#[derive(Debug, Clone)]
enum Op {
    Insert {
        device: u16,
        key: usize,
        size: u64,
        category: u8,
    },
    Free {
        device: u16,
        key: usize,
        early: bool,
    },
    SetCategory {
        device: u16,
        key: usize,
        category: u8,
    },
    Annotate {
        key: usize,
        op: u32,
    },
    /// A realloc's release: the block moves to the pending key of a thread (`Ok`) or, to try
    /// the set's rule for a key already live, to another key of the pool (`Err`).
    Rekey {
        key: usize,
        to: Result<u64, usize>,
        early: bool,
    },
    MarkPeak,
}

fn op() -> impl Strategy<Value = Op> {
    let device = prop_oneof![4 => Just(0u16), 1 => Just(1u16)];
    prop_oneof![
        6 => (device.clone(), 0..KEYS, 1u64..5000, 0u8..5)
            .prop_map(|(device, key, size, category)| Op::Insert { device, key, size, category }),
        5 => (device.clone(), 0..KEYS, prop::bool::weighted(0.1))
            .prop_map(|(device, key, early)| Op::Free { device, key, early }),
        1 => (device, 0..KEYS, 0u8..5)
            .prop_map(|(device, key, category)| Op::SetCategory { device, key, category }),
        1 => (0..KEYS, 0u32..3).prop_map(|(key, op)| Op::Annotate { key, op }),
        1 => (0..KEYS, prop_oneof![(0u64..2).prop_map(Ok), (0..KEYS).prop_map(Err)], prop::bool::weighted(0.1))
            .prop_map(|(key, to, early)| Op::Rekey { key, to, early }),
        1 => Just(Op::MarkPeak),
    ]
}

/// Keys the operations pick from.
const KEYS: usize = 28;

/// Addresses for the keys: the first six in one page, the last the highest address (a
/// corrupt stream may name it), the rest neighbours a page apart.
fn addresses() -> Vec<u64> {
    let shared = (0..6).map(|unit| 0x10_0000 + unit * 16);
    let spread = (0..).map(|page| 0x20_0000 + page * 4096 + 48);
    shared
        .chain(spread)
        .take(KEYS - 1)
        .chain([u64::MAX])
        .collect()
}

fn entry(size: u64, ts: u64, category: Category) -> LiveEntry {
    LiveEntry {
        size,
        ts,
        thread: 0,
        owner: NONE,
        origin: Origin::NOWHERE,
        category,
        at_peak: false,
    }
}

fn modeled(entry: &LiveEntry) -> Modeled {
    Modeled {
        size: entry.size,
        ts: entry.ts,
        category: entry.category,
        at_peak: entry.at_peak,
    }
}

/// Bytes and count per category of `rows`.
fn by_category(rows: &[(GroupKey, u64, u64)]) -> BTreeMap<Category, (u64, u64)> {
    let mut totals = BTreeMap::new();
    for (key, bytes, count) in rows {
        let total: &mut (u64, u64) = totals.entry(key.category).or_default();
        total.0 += bytes;
        total.1 += count;
    }
    totals
}

fn totals<'a>(blocks: impl Iterator<Item = &'a Modeled>) -> BTreeMap<Category, (u64, u64)> {
    let mut totals = BTreeMap::new();
    for block in blocks {
        let total: &mut (u64, u64) = totals.entry(block.category).or_default();
        total.0 += block.size;
        total.1 += 1;
    }
    totals
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_live_set_keeps_what_a_plain_map_keeps(
        ops in prop::collection::vec(op(), 1..300),
        near_the_wrap in any::<bool>(),
        small_below in prop_oneof![Just(0u64), Just(1024), Just(u64::MAX)],
        leaves_from in prop_oneof![Just(0usize), Just(4), Just(usize::MAX)],
    ) {
        let addrs = addresses();
        // Heap blocks all in the table, small ones (sizes up to 5000) in leaves and the
        // others in the table, or all that can in leaves; from the start, from when the table
        // has held a few (counting those in the regions then), or never.
        let mut live = LiveSet::with_leaves(4, small_below, leaves_from);
        if near_the_wrap {
            // A few peaks from the epoch's wrap, which renumbers every live block.
            live.epoch = u32::MAX - 3;
        }
        let mut model = Model::default();
        let mut peaked = false;
        for (ts, op) in (1u64..).zip(ops) {
            match op {
                Op::Insert { device, key, size, category } => {
                    let category = Category::from_index(category);
                    let at = (device, addrs[key]);
                    let got = live.insert(DeviceId(device), at.1, entry(size, ts, category));
                    let fresh = Modeled { size, ts, category, at_peak: false };
                    let want = model.live.insert(at, fresh);
                    prop_assert_eq!(got.as_ref().map(modeled), want, "insert {:?}", at);
                }
                Op::Free { device, key, early } => {
                    let at = (device, addrs[key]);
                    let when = match model.live.get(&at) {
                        Some(block) if early => block.ts - 1,
                        _ => ts,
                    };
                    let got = live.free(DeviceId(device), at.1, when);
                    match (got, model.live.get(&at).copied()) {
                        (Freed::Ended(entry), Some(block)) if !early => {
                            prop_assert_eq!(modeled(&entry), block);
                            model.live.remove(&at);
                        }
                        (Freed::Straggler, Some(_)) if early => {}
                        (Freed::Unknown, None) => {}
                        (got, want) => prop_assert!(false, "free {:?}: {:?}, model {:?}", at, got, want),
                    }
                }
                Op::SetCategory { device, key, category } => {
                    let category = Category::from_index(category);
                    let at = (device, addrs[key]);
                    let got = live.set_category(DeviceId(device), at.1, category);
                    let want = match model.live.get_mut(&at) {
                        Some(block) if block.category != category => {
                            let before = *block;
                            block.category = category;
                            block.at_peak = false;
                            Some(before)
                        }
                        _ => None,
                    };
                    prop_assert_eq!(got.as_ref().map(modeled), want, "set_category {:?}", at);
                }
                Op::Annotate { key, op } => {
                    live.annotate(DeviceId::CPU, addrs[key], op);
                }
                Op::Rekey { key, to, early } => {
                    let from = (0, addrs[key]);
                    let to = (0, to.map_or_else(|key| addrs[key], |thread| (1 << 63) | thread));
                    let when = match model.live.get(&from) {
                        Some(block) if early => block.ts - 1,
                        _ => ts,
                    };
                    let got = live.rekey(DeviceId::CPU, from.1, to.1, when);
                    match (got, model.live.get(&from).copied()) {
                        (Rekeyed::Moved(displaced), Some(block)) if !early => {
                            model.live.remove(&from);
                            let want = model.live.insert(to, block);
                            prop_assert_eq!(displaced.as_ref().map(modeled), want);
                        }
                        (Rekeyed::Straggler, Some(_)) if early => {}
                        (Rekeyed::Unknown, None) => {}
                        (got, want) => prop_assert!(false, "rekey {:?}: {:?}, model {:?}", from, got, want),
                    }
                }
                Op::MarkPeak => {
                    live.mark_peak();
                    peaked = true;
                    for block in model.live.values_mut() {
                        block.at_peak = true;
                    }
                    model.at_peak = totals(model.live.values());
                }
            }
            prop_assert_eq!(live.len(), model.live.len());
            for device in [0u16, 1] {
                for &addr in addrs.iter().chain(&[1 << 63, (1 << 63) | 1]) {
                    let want = model.live.contains_key(&(device, addr));
                    prop_assert_eq!(live.contains(DeviceId(device), addr), want, "{:?}", (device, addr));
                }
            }
        }
        for device in [0u16, 1] {
            let want = totals(model.live.iter().filter(|((d, _), _)| *d == device).map(|(_, b)| b));
            prop_assert_eq!(by_category(&group_live_now(&live, DeviceId(device))), want);
        }
        let at_peak = by_category(&group_at_peak(&live));
        prop_assert_eq!(at_peak, if peaked { model.at_peak } else { BTreeMap::new() });
    }
}

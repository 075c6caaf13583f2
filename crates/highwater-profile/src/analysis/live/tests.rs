//! The live set's unit tests.

use super::*;

fn entry(size: u64, ts: u64) -> LiveEntry {
    LiveEntry {
        size,
        ts,
        thread: 0,
        owner: NONE,
        origin: Origin::NOWHERE,
        category: Category::Other,
        at_peak: false,
    }
}

fn sizes_at_peak(live: &LiveSet) -> Vec<u64> {
    let mut sizes: Vec<u64> = largest_at_peak(live, usize::MAX >> 1)
        .iter()
        .map(|(_, e)| e.size)
        .collect();
    sizes.sort_unstable();
    let grouped: u64 = group_at_peak(live).iter().map(|(_, bytes, _)| bytes).sum();
    assert_eq!(grouped, sizes.iter().sum::<u64>(), "rows and blocks agree");
    sizes
}

#[test]
fn blocks_freed_after_the_peak_still_count_at_the_peak() {
    let cpu = DeviceId::CPU;
    let mut live = LiveSet::new(8);
    live.insert(cpu, 1, entry(10, 0));
    live.insert(cpu, 2, entry(20, 1));
    live.mark_peak();
    assert!(matches!(live.free(cpu, 1, 2), Freed::Ended(_)));
    live.insert(cpu, 3, entry(5, 3));
    assert_eq!(sizes_at_peak(&live), vec![10, 20]);
    // A higher peak forgets the side rows.
    live.insert(cpu, 4, entry(100, 4));
    live.mark_peak();
    assert_eq!(sizes_at_peak(&live), vec![5, 20, 100]);
}

#[test]
fn ended_blocks_say_whether_they_were_live_at_the_peak() {
    let cpu = DeviceId::CPU;
    let mut live = LiveSet::new(8);
    live.insert(cpu, 1, entry(10, 0));
    let Freed::Ended(before_any_peak) = live.free(cpu, 1, 1) else {
        panic!("the block was live");
    };
    assert!(!before_any_peak.at_peak);
    live.insert(cpu, 2, entry(20, 2));
    live.mark_peak();
    live.insert(cpu, 3, entry(30, 3));
    let Freed::Ended(at_peak) = live.free(cpu, 2, 4) else {
        panic!("the block was live");
    };
    let Freed::Ended(after_peak) = live.free(cpu, 3, 4) else {
        panic!("the block was live");
    };
    assert!(at_peak.at_peak);
    assert!(!after_peak.at_peak);
}

#[test]
fn a_free_older_than_the_block_is_a_straggler() {
    let mut live = LiveSet::new(8);
    live.insert(DeviceId::CPU, 1, entry(10, 50));
    assert!(matches!(live.free(DeviceId::CPU, 1, 49), Freed::Straggler));
    assert!(matches!(live.free(DeviceId(1), 1, 60), Freed::Unknown));
    assert_eq!(live.len(), 1);
    assert!(matches!(live.free(DeviceId::CPU, 1, 50), Freed::Ended(_)));
    assert_eq!(live.len(), 0);
}

#[test]
fn the_same_address_on_two_devices_is_two_blocks() {
    let mut live = LiveSet::new(8);
    assert_eq!(live.insert(DeviceId::CPU, 7, entry(10, 0)), None);
    assert_eq!(live.insert(DeviceId(3), 7, entry(20, 1)), None);
    assert_eq!(
        live.insert(DeviceId(3), 7, entry(30, 2)),
        Some(entry(20, 1))
    );
    let Freed::Ended(ended) = live.free(DeviceId::CPU, 7, 5) else {
        panic!("the CPU block was live");
    };
    assert_eq!(ended, entry(10, 0));
    assert_eq!(live.len(), 1);
}

#[test]
fn recategorised_blocks_count_at_the_peak_as_they_were() {
    let mut live = LiveSet::new(8);
    live.insert(DeviceId::CPU, 1, entry(10, 0));
    live.mark_peak();
    let changed = live.set_category(DeviceId::CPU, 1, Category::Parameter);
    assert_eq!(
        changed,
        Some(LiveEntry {
            at_peak: true,
            ..entry(10, 0)
        })
    );
    let at_peak: Vec<Category> = largest_at_peak(&live, 8)
        .iter()
        .map(|(_, e)| e.category)
        .collect();
    assert_eq!(at_peak, vec![Category::Other]);
    let rows: Vec<(Category, u64)> = group_at_peak(&live)
        .iter()
        .map(|(key, bytes, _)| (key.category, *bytes))
        .collect();
    assert_eq!(rows, vec![(Category::Other, 10)]);
    // After a new peak the block counts as it is now.
    live.mark_peak();
    assert_eq!(largest_at_peak(&live, 8)[0].1.category, Category::Parameter);
}

#[test]
fn side_rows_keep_bytes_per_context_and_only_the_largest_blocks() {
    let cpu = DeviceId::CPU;
    let mut live = LiveSet::new(2);
    for addr in 0..100u64 {
        live.insert(cpu, addr, entry(addr + 1, addr));
    }
    live.mark_peak();
    for addr in 0..100u64 {
        assert!(matches!(live.free(cpu, addr, 200), Freed::Ended(_)));
    }
    assert_eq!(live.since_peak.rows().count(), 1);
    assert_eq!(live.since_peak_top.len(), 2);
    let rows = group_at_peak(&live);
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].1, rows[0].2), ((1..=100).sum::<u64>(), 100));
    let top: Vec<u64> = largest_at_peak(&live, 2)
        .iter()
        .map(|(_, e)| e.size)
        .collect();
    assert_eq!(top, vec![100, 99]);
}

#[test]
fn side_rows_are_made_once_per_context_and_cleared_together() {
    let mut rows = SideRows::default();
    assert!(rows.is_empty());
    assert!(rows.add(7, 10));
    assert!(!rows.add(7, 5));
    assert!(rows.add(2, 1));
    assert_eq!(
        rows.rows().collect::<Vec<_>>(),
        vec![(7, (15, 2)), (2, (1, 1))]
    );
    let mut cleared = Vec::new();
    rows.clear(|context| cleared.push(context));
    cleared.sort_unstable();
    assert_eq!(cleared, vec![2, 7]);
    assert!(rows.is_empty());
    assert_eq!(rows.rows().count(), 0);
    // A cleared context starts a new row.
    assert!(rows.add(7, 3));
    assert_eq!(rows.rows().collect::<Vec<_>>(), vec![(7, (3, 1))]);
}

#[test]
fn contexts_no_block_uses_are_swept_and_reused() {
    let cpu = DeviceId::CPU;
    let mut live = LiveSet::new(4);
    for owner in 0..100_000u32 {
        let mut e = entry(8, u64::from(owner));
        e.owner = owner;
        live.insert(cpu, 1, e);
        assert!(matches!(live.free(cpu, 1, u64::MAX), Freed::Ended(_)));
    }
    assert!(
        live.contexts.table.len() < 4096,
        "{}",
        live.contexts.table.len()
    );
}

#[test]
fn the_epoch_wraps_without_losing_who_was_live_at_the_peak() {
    let cpu = DeviceId::CPU;
    let mut live = LiveSet::new(8);
    live.insert(cpu, 1, entry(10, 0));
    live.epoch = u32::MAX - 1;
    live.mark_peak();
    live.insert(cpu, 2, entry(20, 1));
    live.mark_peak();
    assert_eq!(live.epoch, 1);
    live.insert(cpu, 3, entry(30, 2));
    assert_eq!(sizes_at_peak(&live), vec![10, 20]);
}

#[test]
fn largest_keeps_the_top_n_in_order() {
    let mut live = LiveSet::new(3);
    for (i, size) in [5u64, 50, 7, 50, 1].into_iter().enumerate() {
        live.insert(DeviceId::CPU, i as u64, entry(size, i as u64));
    }
    live.mark_peak();
    let top: Vec<(u64, u64)> = largest_at_peak(&live, 3)
        .iter()
        .map(|(_, e)| (e.size, e.ts))
        .collect();
    assert_eq!(top, vec![(50, 1), (50, 3), (7, 2)]);
}

#[test]
fn neighbouring_addresses_get_neighbouring_buckets_with_different_tags() {
    const LOW: u64 = (1 << 57) - 1;
    let page = 0x7f12_3456_7000u64;
    let first = hash(page);
    for unit in 1..256u64 {
        let h = hash(page + unit * 16);
        assert_eq!(
            h & LOW,
            (first & LOW) + unit,
            "unit {unit}: the next bucket"
        );
        if unit < 128 {
            assert_ne!(h >> 57, first >> 57, "unit {unit}: its own tag");
        }
    }
    // Pages spread over the windows of a 2^26-bucket table.
    let windows: std::collections::HashSet<u64> = (0..4096u64)
        .map(|p| (hash(page + p * 4096) & LOW) >> 8)
        .collect();
    assert!(windows.len() > 4000, "{} windows", windows.len());
    // Small ids (device tensor ids) in one page still get a hash each.
    let ids: std::collections::HashSet<u64> = (0..4096u64).map(hash).collect();
    assert_eq!(ids.len(), 4096);
}

#[test]
fn a_packed_entry_keeps_its_slot_and_tells_most_other_addresses_apart() {
    let packing = Packing::NARROWEST;
    let addr = 0x7f3a_1c00_0040;
    let entry = packing.pack(0xbeef, addr);
    assert_eq!(packing.slot(entry), 0xbeef);
    assert!(packing.may_be(entry, addr));
    // Neighbours, the addresses a probe meets, are told apart without the slab.
    let told_apart = (1..=1000u64)
        .filter(|i| !packing.may_be(entry, addr + i * 16))
        .count();
    assert!(
        told_apart >= 990,
        "{told_apart} of 1000 neighbours told apart"
    );
}

#[test]
fn widening_a_packing_keeps_every_entry_matching_its_address() {
    let narrow = Packing::NARROWEST;
    let wide = narrow.to_hold(1 << 20);
    assert!(wide.slot_mask >= 1 << 20 && wide != narrow);
    assert_eq!(
        narrow.to_hold(5),
        narrow,
        "a slot that fits changes nothing"
    );
    assert_eq!(narrow.to_hold(u32::MAX).slot_mask, u32::MAX);
    for (slot, addr) in [
        (0, 0x1000),
        (0xffff, 0x7fff_ffff_fff0),
        (77, 0xdead_beef_0000),
    ] {
        let entry = narrow.widen(wide, narrow.pack(slot, addr));
        assert_eq!(wide.slot(entry), slot);
        assert!(wide.may_be(entry, addr));
        assert_eq!(
            entry,
            wide.pack(slot, addr),
            "as if packed wide from the start"
        );
    }
}

#[test]
fn blocks_stay_findable_when_the_slab_outgrows_the_packing() {
    // 2^16 slots fit the narrowest packing; go past it with blocks freed and moved on
    // both sides of the widening.
    const BLOCKS: u64 = 70_000;
    let mut live = LiveSet::new(0);
    let addr = |i: u64| 0x5500_0000_0000 + i * 32;
    for i in 0..BLOCKS {
        live.insert(DeviceId::CPU, addr(i), entry(8 + i % 64, i));
        if i == 40_000 {
            assert!(matches!(
                live.rekey(DeviceId::CPU, addr(7), addr(BLOCKS + 7), i),
                Rekeyed::Moved(None)
            ));
        }
    }
    assert!(live.packing != Packing::NARROWEST, "the packing widened");
    assert!(matches!(
        live.rekey(DeviceId::CPU, addr(9), addr(BLOCKS + 9), BLOCKS),
        Rekeyed::Moved(None)
    ));
    for i in 0..BLOCKS {
        let key = if i == 7 || i == 9 {
            addr(BLOCKS + i)
        } else {
            addr(i)
        };
        match live.free(DeviceId::CPU, key, BLOCKS + 1) {
            Freed::Ended(ended) => assert_eq!(ended.size, 8 + i % 64, "block {i}"),
            other => panic!("block {i} not found: {other:?}"),
        }
    }
    assert_eq!(live.len(), 0);
    assert!(matches!(
        live.free(DeviceId::CPU, addr(3), BLOCKS + 2),
        Freed::Unknown
    ));
}

/// An address remembered as not indexed (its block was freed) is forgotten when a block
/// there enters the index again: a new block at the address still ends that one, as a block
/// never freed is ended when its address is reused.
#[test]
fn an_address_remembered_as_unindexed_is_forgotten_when_indexed_again() {
    let mut live = LiveSet::new(0);
    let reused = 0x4400_0000_0000;
    live.insert(DeviceId::CPU, reused, entry(16, 1));
    assert!(!live.unindexed.knows(reused));
    assert!(matches!(
        live.free(DeviceId::CPU, reused, 2),
        Freed::Ended(_)
    ));
    assert!(live.unindexed.knows(reused));
    assert!(!live.contains(DeviceId::CPU, reused));
    // Made again and never freed: the next block there ends it.
    assert!(live.insert(DeviceId::CPU, reused, entry(24, 3)).is_none());
    assert!(!live.unindexed.knows(reused));
    assert!(live.contains(DeviceId::CPU, reused));
    let displaced = live.insert(DeviceId::CPU, reused, entry(32, 100));
    assert_eq!(displaced.map(|old| old.size), Some(24));
    // Moved away, it is remembered again.
    let elsewhere = 0x4500_0000_0000;
    assert!(matches!(
        live.rekey(DeviceId::CPU, reused, elsewhere, 200),
        Rekeyed::Moved(None)
    ));
    assert!(live.unindexed.knows(reused));
    assert!(live.contains(DeviceId::CPU, elsewhere));
}

/// A block at `addr` made at `ts`, with a context of its own set's.
fn block_at(live: &mut LiveSet, addr: u64, ts: u64) -> Block {
    let context = live.contexts.acquire(Context {
        device: DeviceId::CPU,
        category: Category::Other,
        thread: 0,
        owner: NONE,
        origin: Origin::NOWHERE,
    });
    Block {
        addr,
        size: 16,
        ts,
        context,
        epoch: live.epoch,
    }
}

/// Tables are built anew by `make_room` as they fill: the table never grows by itself (the
/// room `make_room` recorded is its whole room), at most doubles its room at a time, and keeps
/// every block.
#[test]
fn tables_built_anew_grow_by_doubling_at_most_and_keep_every_block() {
    let mut live = LiveSet::new(0);
    // Addresses spread over many pages, so the blocks land all over the table.
    let addr = |i: u64| 0x6600_0000_0000 + (i.wrapping_mul(0x9e37_79b9) % (1 << 30)) * 16;
    let mut inserted = std::collections::HashSet::new();
    let mut room = 0;
    for i in 0..50_000 {
        let key = addr(i);
        if !inserted.insert(key) {
            continue;
        }
        let block = block_at(&mut live, key, i);
        live.index_insert(DeviceId::CPU, block);
        let table = &live.index[0];
        assert_eq!(live.index_room[0], table.capacity(), "grown by itself");
        assert!(table.capacity() >= inserted.len());
        if table.capacity() != room {
            assert!(
                room == 0 || table.capacity() <= 2 * room + 8,
                "room {room} became {}",
                table.capacity()
            );
            room = table.capacity();
        }
    }
    for &key in &inserted {
        assert!(live.contains(DeviceId::CPU, key), "{key:#x} lost");
    }
}

/// Blocks freed and made at a steady count leave tombstones; building the table anew
/// clears them: the table doubles at most once past its size when filled (its room then
/// holds the blocks with half to spare), however long the churn goes on.
#[test]
fn churn_at_a_steady_size_grows_the_table_at_most_once() {
    const LIVE: u64 = 6_000;
    let mut live = LiveSet::new(0);
    let addr = |i: u64| 0x7700_0000_0000 + (i.wrapping_mul(0x9e37_79b9) % (1 << 32)) * 16;
    for i in 0..LIVE {
        live.insert(DeviceId::CPU, addr(i), entry(16, i));
    }
    let filled = live.index[0].allocation_size();
    for i in LIVE..40 * LIVE {
        assert!(matches!(
            live.free(DeviceId::CPU, addr(i - LIVE), i),
            Freed::Ended(_)
        ));
        assert!(live.insert(DeviceId::CPU, addr(i), entry(16, i)).is_none());
    }
    assert!(
        live.index[0].allocation_size() <= 2 * filled,
        "{} bytes, {filled} when filled",
        live.index[0].allocation_size()
    );
    for i in 39 * LIVE..40 * LIVE {
        assert!(live.contains(DeviceId::CPU, addr(i)));
    }
}

#[test]
fn the_slab_reuses_a_free_slot_before_a_fresh_one() {
    let block = |addr| Block {
        addr,
        ..Block::default()
    };
    let mut slab = Slab::default();
    let slots: Vec<u32> = (0..5000).map(|i| slab.insert(block(i))).collect();
    assert_eq!(slots, (0..5000).collect::<Vec<u32>>());
    for slot in [4999, 17, 4096, 3] {
        assert_eq!(slab.remove(slot).addr, u64::from(slot));
    }
    // The freed last first.
    assert_eq!(slab.next_index(), 3);
    let reused: Vec<u32> = (0..5).map(|i| slab.insert(block(10_000 + i))).collect();
    assert_eq!(reused, [3, 4096, 17, 4999, 5000]);
    assert_eq!(slab.get(17).addr, 10_002);
    assert_eq!(slab.next_index(), 5001);
}

/// The budget: recording adds at most 48 bytes per live allocation.
#[test]
fn a_million_live_blocks_cost_at_most_48_bytes_each() {
    const BLOCKS: u64 = 1_000_000;
    let mut live = LiveSet::new(32);
    for (i, addr) in (0..BLOCKS).map(|i| (i, 0x7f00_0000_0000 + i * 48)) {
        let mut e = entry(32 + i % 512, i);
        // A few thousand contexts: span instances and ops as a training step has them.
        e.owner = (i % 4096) as u32;
        e.category = Category::from_index((i % 5) as u8);
        live.insert(DeviceId::CPU, addr, e);
    }
    live.mark_peak();
    // Free and reallocate a tenth, so the free list is used as well.
    for i in (0..BLOCKS).step_by(10) {
        let addr = 0x7f00_0000_0000 + i * 48;
        assert!(matches!(
            live.free(DeviceId::CPU, addr, i + BLOCKS),
            Freed::Ended(_)
        ));
        live.insert(DeviceId::CPU, addr, entry(64, i + BLOCKS));
    }
    assert_eq!(live.len() as u64, BLOCKS);
    let per_block = live.heap_bytes() as f64 / BLOCKS as f64;
    assert!(per_block <= 48.0, "{per_block:.1} bytes per live block");
}

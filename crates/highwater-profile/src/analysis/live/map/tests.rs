//! The live map's unit tests: the index hash, the packing, the table rebuilds, the memo and the
//! slab, on the map alone.

use super::index::{buckets_for, capacity_for, hash, past_first_group, room_in, Packing};
use super::regions::{Found, SMALL};
use super::slab::Slab;
use super::*;

/// A block at `addr` made at `ts`, of `size` bytes.
fn block(addr: u64, size: u64, ts: u64) -> Block {
    Block {
        addr,
        size,
        ts,
        ..Block::default()
    }
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
    let mut map = LiveMap::without_leaves();
    let addr = |i: u64| 0x5500_0000_0000 + i * 32;
    for i in 0..BLOCKS {
        map.insert(DeviceId::CPU, block(addr(i), 8 + i % 64, i));
        if i == 40_000 {
            assert!(matches!(
                map.rekey(DeviceId::CPU, addr(7), addr(BLOCKS + 7), i),
                Ok(None)
            ));
        }
    }
    assert!(map.packing != Packing::NARROWEST, "the packing widened");
    assert!(matches!(
        map.rekey(DeviceId::CPU, addr(9), addr(BLOCKS + 9), BLOCKS),
        Ok(None)
    ));
    for i in 0..BLOCKS {
        let key = if i == 7 || i == 9 {
            addr(BLOCKS + i)
        } else {
            addr(i)
        };
        match map.remove(DeviceId::CPU, key, BLOCKS + 1) {
            Ok(ended) => assert_eq!(ended.size, 8 + i % 64, "block {i}"),
            Err(missed) => panic!("block {i} not found: {missed:?}"),
        }
    }
    assert_eq!(map.len(), 0);
    assert_eq!(
        map.remove(DeviceId::CPU, addr(3), BLOCKS + 2).err(),
        Some(Missed::Unknown)
    );
}

/// An address remembered as not indexed (its block was freed) is forgotten when a block
/// there enters the index again: a new block at the address still ends that one, as a block
/// never freed is ended when its address is reused.
#[test]
fn an_address_remembered_as_unindexed_is_forgotten_when_indexed_again() {
    let mut map = LiveMap::without_leaves();
    let reused = 0x4400_0000_0000;
    map.insert(DeviceId::CPU, block(reused, 16, 1));
    assert!(!map.unindexed.knows(reused));
    assert!(map.remove(DeviceId::CPU, reused, 2).is_ok());
    assert!(map.unindexed.knows(reused));
    assert!(map.find(DeviceId::CPU, reused).is_none());
    // Made again and never freed: the next block there ends it.
    assert!(map.insert(DeviceId::CPU, block(reused, 24, 3)).is_none());
    assert!(!map.unindexed.knows(reused));
    assert!(map.find(DeviceId::CPU, reused).is_some());
    let displaced = map.insert(DeviceId::CPU, block(reused, 32, 100));
    assert_eq!(displaced.map(|old| old.size), Some(24));
    // Moved away, it is remembered again.
    let elsewhere = 0x4500_0000_0000;
    assert!(matches!(
        map.rekey(DeviceId::CPU, reused, elsewhere, 200),
        Ok(None)
    ));
    assert!(map.unindexed.knows(reused));
    assert!(map.find(DeviceId::CPU, elsewhere).is_some());
}

/// Tables are built anew by `make_room` as they fill: the table never grows by itself (its
/// buckets are those `make_room` recorded room for), at most doubles its room at a time, and
/// keeps every block.
#[test]
fn tables_built_anew_grow_by_doubling_at_most_and_keep_every_block() {
    let mut map = LiveMap::without_leaves();
    // Addresses spread over many pages, so the blocks land all over the table.
    let addr = |i: u64| 0x6600_0000_0000 + (i.wrapping_mul(0x9e37_79b9) % (1 << 30)) * 16;
    let mut inserted = std::collections::HashSet::new();
    let mut room = 0;
    for i in 0..50_000 {
        let key = addr(i);
        if !inserted.insert(key) {
            continue;
        }
        map.insert(DeviceId::CPU, block(key, 16, i));
        let table = &map.index[0];
        assert_eq!(
            map.index_room[0],
            room_in(table.num_buckets(), map.index_sparse[0]),
            "grown by itself"
        );
        assert!(map.index_room[0] >= inserted.len());
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
        assert!(map.find(DeviceId::CPU, key).is_some(), "{key:#x} lost");
    }
    assert!(
        !map.index_sparse[0],
        "blocks spread over the table left runs"
    );
}

/// Blocks freed and made at a steady count leave tombstones; building the table anew
/// clears them: the table doubles at most once past its size when filled (its room then
/// holds the blocks with half to spare), however long the churn goes on.
#[test]
fn churn_at_a_steady_size_grows_the_table_at_most_once() {
    const LIVE: u64 = 6_000;
    let mut map = LiveMap::without_leaves();
    let addr = |i: u64| 0x7700_0000_0000 + (i.wrapping_mul(0x9e37_79b9) % (1 << 32)) * 16;
    for i in 0..LIVE {
        map.insert(DeviceId::CPU, block(addr(i), 16, i));
    }
    let filled = map.index[0].allocation_size();
    for i in LIVE..40 * LIVE {
        assert!(map.remove(DeviceId::CPU, addr(i - LIVE), i).is_ok());
        assert!(map.insert(DeviceId::CPU, block(addr(i), 16, i)).is_none());
    }
    assert!(
        map.index[0].allocation_size() <= 2 * filled,
        "{} bytes, {filled} when filled",
        map.index[0].allocation_size()
    );
    for i in 39 * LIVE..40 * LIVE {
        assert!(map.find(DeviceId::CPU, addr(i)).is_some());
    }
}

/// How many of the blocks in `table` sit past the first group their lookup reads, and the
/// lines asked for ahead.
fn found_past_the_first_group(table: &HashTable<u32>, packing: Packing, slab: &Slab) -> usize {
    table
        .iter_buckets()
        .filter(|&bucket| {
            let entry = *table.get_bucket(bucket).expect("an occupied bucket");
            past_first_group(bucket, packing.rehash(slab, entry), table.num_buckets())
        })
        .count()
}

/// Blocks allocated one after another, as a parser's are, fill the windows of the pages they
/// share unevenly: a table at hashbrown's limit has runs, the map sees them when it builds the
/// table anew and holds it sparse from then on, where fewer blocks sit past the first group
/// their lookup reads (how many fewer depends on how the pages fall in the windows; the
/// benchmarks measure what it earns).
#[test]
fn a_table_with_runs_is_held_sparse() {
    let mut map = LiveMap::without_leaves();
    let mut addrs = Vec::new();
    let mut addr = 0x5555_0000_0000u64;
    let mut state = 0x1234_5678_9abc_def1u64;
    // As many as make the table's windows many: with few, the hash spreads the pages of
    // one run evenly over them.
    for i in 0..1_800_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // 32 to 112 bytes apart.
        addr += 16 * (2 + state % 6);
        map.insert(DeviceId::CPU, block(addr, 32, i));
        addrs.push(addr);
    }
    assert!(map.index_sparse[0]);
    let sparse = found_past_the_first_group(&map.index[0], map.packing, &map.slab);

    // The same blocks in a table as full as hashbrown keeps one, in the order they came.
    let (slab, packing) = (&map.slab, map.packing);
    let mut full = HashTable::with_capacity(capacity_for(buckets_for(addrs.len(), false)));
    for &addr in &addrs {
        let entry = *map.index[0]
            .find(hash(addr), |&v| packing.is(slab, v, addr))
            .expect("every block is found");
        full.insert_unique(hash(addr), entry, |&e| packing.rehash(slab, e));
    }
    let dense = found_past_the_first_group(&full, packing, slab);
    assert!(
        dense * 16 > addrs.len() && sparse < dense,
        "past the first group: {sparse} sparse, {dense} full, of {}",
        addrs.len()
    );
}

#[test]
fn the_slab_reuses_a_free_slot_before_a_fresh_one() {
    let mut slab = Slab::default();
    let slots: Vec<u32> = (0..5000).map(|i| slab.insert(block(i, 0, 0))).collect();
    assert_eq!(slots, (0..5000).collect::<Vec<u32>>());
    for slot in [4999, 17, 4096, 3] {
        assert_eq!(slab.remove(slot).addr, u64::from(slot));
    }
    // The freed last first.
    assert_eq!(slab.next_index(), 3);
    let reused: Vec<u32> = (0..5)
        .map(|i| slab.insert(block(10_000 + i, 0, 0)))
        .collect();
    assert_eq!(reused, [3, 4096, 17, 4999, 5000]);
    assert_eq!(slab.get(17).addr, 10_002);
    assert_eq!(slab.next_index(), 5001);
}

/// Small blocks go to leaves once the regions are on, those the table held then with them;
/// large ones, and addresses off the 16-byte grid, stay in the table; every block is found
/// and ends where it is, and regions left without blocks are forgotten.
#[test]
fn small_blocks_move_to_leaves_when_the_regions_turn_on() {
    const FROM: usize = 100;
    let mut map = LiveMap::with_leaves(SMALL, FROM);
    let base = 0x5600_0000_0000u64;
    let small = |i: u64| base + i * 48;
    let large = |i: u64| base + (1 << 20) + i * 4096;
    let odd = |i: u64| base + (2 << 20) + i * 32 + 8;
    for i in 0..79 {
        map.insert(DeviceId::CPU, block(small(i), 32, i));
    }
    for i in 0..10 {
        map.insert(DeviceId::CPU, block(large(i), 4000, 100 + i));
        map.insert(DeviceId::CPU, block(odd(i), 24, 200 + i));
    }
    assert!(
        !map.regions_on,
        "{} blocks in the table",
        map.index[0].len()
    );
    // The next block fills the table to the mark.
    for i in 79..200 {
        map.insert(DeviceId::CPU, block(small(i), 32, 300 + i));
    }
    assert!(map.regions_on);
    assert_eq!(
        map.index[0].len(),
        20,
        "only the large and the odd stay in the table"
    );
    // Built anew for what it kept.
    assert!(
        map.index[0].num_buckets() <= 32,
        "{} buckets",
        map.index[0].num_buckets()
    );
    assert_eq!(
        map.index_room[0],
        room_in(map.index[0].num_buckets(), map.index_sparse[0])
    );
    assert_eq!(map.regions.slots().count(), 200);
    for i in 0..200 {
        assert_eq!(
            map.find(DeviceId::CPU, small(i)).map(|s| map.block(s).size),
            Some(32)
        );
    }
    for i in 0..10 {
        assert!(map.find(DeviceId::CPU, large(i)).is_some());
        assert!(map.find(DeviceId::CPU, odd(i)).is_some());
    }
    for i in 0..200 {
        assert_eq!(
            map.remove(DeviceId::CPU, small(i), 1000).map(|b| b.size),
            Ok(32)
        );
    }
    for i in 0..10 {
        assert_eq!(
            map.remove(DeviceId::CPU, large(i), 1000).map(|b| b.size),
            Ok(4000)
        );
        assert_eq!(
            map.remove(DeviceId::CPU, odd(i), 1000).map(|b| b.size),
            Ok(24)
        );
    }
    assert_eq!(map.len(), 0);
    assert_eq!(map.regions.slots().count(), 0);
    assert_eq!(map.regions.find(small(3)), Found::Nothing);
    assert_eq!(
        map.remove(DeviceId::CPU, small(3), 2000).err(),
        Some(Missed::Unknown)
    );
}

/// A small block at the address of a large one the table holds (whose free was never seen)
/// ends it, as in the table alone; and a block of one size moved to an address in another
/// region keeps its kind of home.
#[test]
fn a_region_with_blocks_in_both_keeps_one_block_per_address() {
    let mut map = LiveMap::with_leaves(SMALL, 0);
    let base = 0x5700_0000_0000u64;
    assert!(map.insert(DeviceId::CPU, block(base, 4096, 1)).is_none());
    assert!(map
        .insert(DeviceId::CPU, block(base + 8192, 64, 2))
        .is_none());
    // Never freed: the next block at its address ends it, leaf or table.
    let displaced = map.insert(DeviceId::CPU, block(base, 48, 3));
    assert_eq!(displaced.map(|old| old.size), Some(4096));
    assert_eq!(map.len(), 2);
    let displaced = map.insert(DeviceId::CPU, block(base + 8192, 5000, 4));
    assert_eq!(displaced.map(|old| old.size), Some(64));
    // A move into another region, onto a live block there.
    let elsewhere = base + (1 << 16);
    assert!(map.insert(DeviceId::CPU, block(elsewhere, 16, 5)).is_none());
    let moved = map.rekey(DeviceId::CPU, base, elsewhere, 6);
    assert_eq!(moved.map(|old| old.map(|b| b.size)), Ok(Some(16)));
    assert_eq!(
        map.find(DeviceId::CPU, elsewhere)
            .map(|s| map.block(s).size),
        Some(48)
    );
    assert!(map.find(DeviceId::CPU, base).is_none());
    assert_eq!(map.len(), 2);
    // And to a key no heap address can be, as reallocs in flight are kept.
    let pending = (1 << 63) | 3;
    assert!(matches!(
        map.rekey(DeviceId::CPU, elsewhere, pending, 7),
        Ok(None)
    ));
    assert_eq!(
        map.find(DeviceId::CPU, pending).map(|s| map.block(s).size),
        Some(48)
    );
    assert_eq!(
        map.remove(DeviceId::CPU, pending, 8).map(|b| b.size),
        Ok(48)
    );
    assert_eq!(
        map.remove(DeviceId::CPU, base + 8192, 8).map(|b| b.size),
        Ok(5000)
    );
    assert_eq!(map.len(), 0);
    assert_eq!(map.regions.find(base), Found::Nothing);
}

/// Leaves cost a quarter of the span their blocks lie in: a million small blocks 48 bytes
/// apart, as a parser's, take no more room with the leaves than the table did.
#[test]
fn a_million_small_blocks_in_leaves_cost_at_most_48_bytes_each() {
    const BLOCKS: u64 = 1_000_000;
    let mut map = LiveMap::with_leaves(SMALL, 0);
    for i in 0..BLOCKS {
        map.insert(DeviceId::CPU, block(0x7f00_0000_0000 + i * 48, 32, i));
    }
    assert_eq!(map.index.first().map_or(0, HashTable::len), 0);
    let per_block = map.heap_bytes() as f64 / BLOCKS as f64;
    assert!(per_block <= 48.0, "{per_block:.1} bytes per live block");
}

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

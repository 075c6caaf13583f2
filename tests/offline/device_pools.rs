//! `PoolManager` used from several threads at once, through the public API only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use highwater::device::{DeviceIndex, DeviceKind, PoolError, PoolManager, Reservation, Strategy};

const MIB: u64 = 1 << 20;

/// splitmix64, so every thread's sequence is reproducible.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn concurrent_multi_device_reservations_conserve_bytes_under_every_strategy() {
    for strategy in Strategy::ALL {
        let pools = Arc::new(
            PoolManager::builder()
                .limit(64 * MIB)
                .devices(4)
                .strategy(strategy)
                .build(),
        );
        let observed = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&observed);
        pools.set_observer(Box::new(move |s| {
            assert!(s.reserved_bytes <= s.capacity_bytes);
            counter.fetch_add(1, Ordering::Relaxed);
        }));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let pools = Arc::clone(&pools);
                thread::spawn(move || {
                    let mut rng = t + 1;
                    let mut held: Vec<Reservation> = Vec::new();
                    let (mut ok, mut refused) = (0u64, 0u64);
                    for _ in 0..2_000 {
                        if held.len() < 8 && !next(&mut rng).is_multiple_of(3) {
                            let a = DeviceIndex((next(&mut rng) % 4) as u32);
                            let b = DeviceIndex((next(&mut rng) % 4) as u32);
                            let size = 1 + next(&mut rng) % (4 * MIB);
                            match pools.reserve(&[(a, size), (b, size / 2 + 1)]) {
                                Ok(r) => {
                                    ok += 1;
                                    held.push(r);
                                }
                                Err(PoolError::Admission(_)) => refused += 1,
                                Err(e) => panic!("unexpected error: {e}"),
                            }
                        } else if !held.is_empty() {
                            let i = (next(&mut rng) % held.len() as u64) as usize;
                            let r = held.swap_remove(i);
                            let bytes = r.reserved_bytes();
                            assert_eq!(pools.release(r).expect("own reservation"), bytes);
                        }
                    }
                    (ok, refused, held)
                })
            })
            .collect();
        let mut still_held = Vec::new();
        let (mut ok, mut refused) = (0, 0);
        for t in threads {
            let (o, r, held) = t.join().expect("worker panicked");
            ok += o;
            refused += r;
            still_held.extend(held);
        }
        let held_bytes: u128 = still_held.iter().map(Reservation::reserved_bytes).sum();
        let held_bytes = u64::try_from(held_bytes).expect("held bytes fit the pool");
        let total = pools.total_stats();
        assert_eq!(total.in_use_bytes, held_bytes, "{strategy}");
        assert_eq!(
            total.free_bytes,
            total.capacity_bytes - held_bytes,
            "{strategy}"
        );
        assert!(total.peak_bytes <= total.capacity_bytes, "{strategy}");
        assert!(ok > 0, "{strategy}");
        // Every device of a successful call counts once; refusals count only on failed devices.
        assert!(
            total.reservations >= ok && total.reservations <= 2 * ok,
            "{strategy}"
        );
        assert!(total.failures >= refused, "{strategy}");
        for r in still_held {
            pools.release(r).expect("own reservation");
        }
        for d in 0..4 {
            let s = pools.stats(DeviceIndex(d)).expect("device exists");
            assert_eq!((s.in_use_bytes, s.requested_bytes), (0, 0), "{strategy}");
            assert_eq!(s.free_bytes, s.capacity_bytes, "{strategy}");
            assert_eq!(s.fragmentation, 0.0, "{strategy}: coalesced back");
        }
        assert!(observed.load(Ordering::Relaxed) > 0);
    }
}

#[test]
fn threads_racing_for_one_device_never_overcommit_it() {
    let pools = Arc::new(
        PoolManager::builder()
            .limit(32 * MIB)
            .devices(1)
            .strategy(Strategy::BestFit)
            .build(),
    );
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let pools = Arc::clone(&pools);
            thread::spawn(move || {
                let mut mine = Vec::new();
                while let Ok(r) = pools.reserve(&[(DeviceIndex(0), MIB)]) {
                    mine.push(r);
                }
                mine
            })
        })
        .collect();
    let held: Vec<Reservation> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("worker"))
        .collect();
    assert_eq!(held.len(), 32);
    let s = pools.stats(DeviceIndex(0)).expect("device 0");
    assert_eq!((s.in_use_bytes, s.free_bytes, s.failures), (32 * MIB, 0, 4));
    let freed: u128 = held
        .into_iter()
        .map(|r| pools.release(r).expect("release"))
        .sum();
    assert_eq!(freed, u128::from(32 * MIB));
}

#[test]
fn issue_example_two_tpu_v4_devices() {
    let pools = PoolManager::builder()
        .kind(DeviceKind::TpuV4)
        .devices(2)
        .strategy(Strategy::BestFit)
        .build();
    let r = pools
        .reserve(&[(DeviceIndex(0), 1 << 30), (DeviceIndex(1), 1 << 30)])
        .expect("fits");
    let s = pools.stats(DeviceIndex(0)).expect("device 0");
    assert_eq!(
        (s.capacity_bytes, s.in_use_bytes, s.peak_bytes),
        (32 << 30, 1 << 30, 1 << 30)
    );
    assert_eq!((s.free_blocks, s.largest_free_block), (1, 31 << 30));
    let freed: u128 = pools.release(r).expect("release");
    assert_eq!(freed, 2 << 30);
    let snap = pools.snapshot(DeviceIndex(1)).expect("device 1");
    assert_eq!((snap.name.as_str(), snap.reserved_bytes), ("tpu:1", 0));

    let limited = PoolManager::builder()
        .limit(30 << 30)
        .devices(2)
        .strategy(Strategy::BestFit)
        .build();
    let err = limited
        .reserve(&[(DeviceIndex(0), 31 << 30), (DeviceIndex(1), 31 << 30)])
        .expect_err("too large");
    let text = err.to_string();
    assert!(
        text.contains("device:0") && text.contains("device:1"),
        "{text}"
    );
    assert!(
        text.contains("capacity 30 GiB") && text.contains("requested 31 GiB"),
        "{text}"
    );
    let source: &dyn std::error::Error = &err;
    assert!(!source.to_string().is_empty());
}

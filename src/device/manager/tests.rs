//! The manager's unit tests.
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::device::{AdmissionError, PoolSnapshot};

const MIB: u64 = 1 << 20;

/// Every pool's state with the failure counters zeroed: what a refused call must not change.
fn state(m: &PoolManager) -> Vec<Pool> {
    m.pools.iter().map(|p| p.lock().pool.clone()).collect()
}

fn admission(err: PoolError) -> AdmissionError {
    match err {
        PoolError::Admission(a) => a,
        other => panic!("expected an admission error, got {other}"),
    }
}

#[test]
fn refused_reservation_leaves_every_pool_identical() {
    for strategy in Strategy::ALL {
        let m = PoolManager::builder()
            .limit(64 * MIB)
            .devices(3)
            .strategy(strategy)
            .build();
        // Some history so the pools are not trivially fresh.
        let a = m
            .reserve(&[(DeviceIndex(0), 5 * MIB), (DeviceIndex(1), 7 * MIB)])
            .unwrap();
        let b = m
            .reserve(&[(DeviceIndex(0), 3000), (DeviceIndex(2), 9 * MIB)])
            .unwrap();
        let _keep = m.reserve(&[(DeviceIndex(1), MIB)]).unwrap();
        m.release(a).unwrap();
        let before = state(&m);
        let stats_before: Vec<_> = (0..3).map(|d| m.stats(DeviceIndex(d)).unwrap()).collect();
        let err = m
            .reserve(&[
                (DeviceIndex(0), MIB),
                (DeviceIndex(1), 80 * MIB),
                (DeviceIndex(2), 2 * MIB),
            ])
            .unwrap_err();
        assert_eq!(admission(err).shortfalls().len(), 1, "{strategy}");
        assert_eq!(state(&m), before, "{strategy}");
        // The single-device path, too.
        assert!(
            m.reserve(&[(DeviceIndex(2), 60 * MIB)]).is_err(),
            "{strategy}"
        );
        assert_eq!(state(&m), before, "{strategy}");
        let stats_after: Vec<_> = (0..3).map(|d| m.stats(DeviceIndex(d)).unwrap()).collect();
        assert_eq!(stats_after[1].failures, stats_before[1].failures + 1);
        assert_eq!(stats_after[0], stats_before[0], "{strategy}");
        let mut before_2 = stats_before[2].clone();
        before_2.failures += 1;
        before_2.success_rate = stats_after[2].success_rate;
        assert_eq!(stats_after[2], before_2, "{strategy}");
        m.release(b).unwrap();
    }
}

#[test]
fn capacity_error_names_every_failed_device_with_its_figures() {
    let m = PoolManager::builder()
        .kind(DeviceKind::TpuV4)
        .limit(8 * MIB)
        .devices(3)
        .strategy(Strategy::BestFit)
        .build();
    let _held = m.reserve(&[(DeviceIndex(2), 3 * MIB)]).unwrap();
    let err = m
        .reserve(&[
            (DeviceIndex(0), 9 * MIB),
            (DeviceIndex(1), MIB),
            (DeviceIndex(2), 6 * MIB),
        ])
        .unwrap_err();
    let text = err.to_string();
    let a = admission(err);
    let failed: Vec<_> = a.shortfalls().iter().map(|s| s.device).collect();
    assert_eq!(failed, [DeviceIndex(0), DeviceIndex(2)]);
    let s = &a.shortfalls()[1];
    assert_eq!(s.name, "tpu:2");
    assert_eq!(
        (s.requested, s.rounded, s.capacity),
        (6 * MIB, 6 * MIB, 8 * MIB)
    );
    assert_eq!(
        (s.in_use, s.free, s.largest_free),
        (3 * MIB, 5 * MIB, 5 * MIB)
    );
    assert_eq!(s.cause, ShortfallCause::Capacity);
    assert!(!a.is_fragmentation());
    for needle in [
        "tpu:0",
        "tpu:2",
        "requested 6 MiB",
        "capacity 8 MiB",
        "in use 3 MiB",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from {text}");
    }
    assert!(text.contains("free 5 MiB") && text.contains("largest free block 5 MiB"));
    assert!(!text.contains("tpu:1"), "{text}");
    assert!(!text.contains("fragmentation"), "{text}");
}

#[test]
fn fragmentation_error_says_so_when_free_bytes_would_cover_the_request() {
    let m = PoolManager::builder()
        .limit(4 * MIB)
        .devices(1)
        .strategy(Strategy::BestFit)
        .build();
    let blocks: Vec<_> = (0..4)
        .map(|_| m.reserve(&[(DeviceIndex(0), MIB)]).unwrap())
        .collect();
    let mut blocks = blocks.into_iter();
    let first = blocks.next().unwrap();
    let _second = blocks.next().unwrap();
    let third = blocks.next().unwrap();
    m.release(first).unwrap();
    m.release(third).unwrap();
    let s = m.stats(DeviceIndex(0)).unwrap();
    assert_eq!(
        (s.free_bytes, s.largest_free_block, s.free_blocks),
        (2 * MIB, MIB, 2)
    );
    assert_eq!(s.fragmentation, 0.5);
    let err = m.reserve(&[(DeviceIndex(0), 2 * MIB)]).unwrap_err();
    let text = err.to_string();
    let a = admission(err);
    assert!(a.is_fragmentation());
    assert_eq!(a.shortfalls()[0].cause, ShortfallCause::Fragmentation);
    assert!(
        text.contains("fragmentation") && text.contains("device:0"),
        "{text}"
    );
    assert_eq!(m.stats(DeviceIndex(0)).unwrap().failures, 1);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let m = PoolManager::builder()
        .limit(MIB)
        .devices(2)
        .strategy(Strategy::BuddySystem)
        .build();
    assert!(matches!(m.reserve(&[]), Err(PoolError::EmptyRequest)));
    assert!(matches!(
        m.reserve_even(5, &[]),
        Err(PoolError::EmptyRequest)
    ));
    assert!(matches!(
        m.reserve(&[(DeviceIndex(0), 1), (DeviceIndex(1), 0)]),
        Err(PoolError::ZeroBytes {
            device: DeviceIndex(1)
        })
    ));
    assert!(matches!(
        m.reserve(&[(DeviceIndex(2), 1)]),
        Err(PoolError::UnknownDevice {
            device: DeviceIndex(2),
            devices: 2
        })
    ));
    assert!(matches!(
        m.reserve(&[(DeviceIndex(0), u64::MAX)]),
        Err(PoolError::Overflow { .. })
    ));
    assert!(matches!(
        m.reserve(&[
            (DeviceIndex(1), u64::MAX / 2 + 1),
            (DeviceIndex(1), u64::MAX / 2 + 1)
        ]),
        Err(PoolError::Overflow {
            device: DeviceIndex(1),
            ..
        })
    ));
    let best = PoolManager::builder()
        .limit(MIB)
        .devices(1)
        .strategy(Strategy::BestFit)
        .build();
    assert!(matches!(
        best.reserve(&[(DeviceIndex(0), u64::MAX - 10)]),
        Err(PoolError::Overflow { .. })
    ));
    assert!(matches!(
        best.stats(DeviceIndex(1)),
        Err(PoolError::UnknownDevice { .. })
    ));
    assert!(matches!(
        best.snapshot(DeviceIndex(9)),
        Err(PoolError::UnknownDevice { .. })
    ));
    // A request larger than the pool is a capacity refusal, not an overflow.
    assert!(matches!(
        best.reserve(&[(DeviceIndex(0), u64::MAX - 300)]),
        Err(PoolError::Admission(_))
    ));
    let empty = PoolManager::builder()
        .limit(0)
        .devices(1)
        .strategy(Strategy::FirstFit)
        .build();
    assert!(matches!(
        empty.reserve(&[(DeviceIndex(0), 1)]),
        Err(PoolError::Admission(_))
    ));
    assert_eq!(m.total_stats().in_use_bytes, 0);
}

#[test]
fn duplicate_devices_are_summed_into_one_block() {
    let m = PoolManager::builder()
        .limit(MIB)
        .devices(2)
        .strategy(Strategy::BestFit)
        .build();
    let r = m
        .reserve(&[
            (DeviceIndex(1), 1000),
            (DeviceIndex(0), 10),
            (DeviceIndex(1), 24),
        ])
        .unwrap();
    let got: Vec<_> = r
        .blocks()
        .iter()
        .map(|b| (b.device, b.requested, b.reserved))
        .collect();
    assert_eq!(
        got,
        [(DeviceIndex(0), 10, 256), (DeviceIndex(1), 1024, 1024)]
    );
    assert_eq!(m.release(r).unwrap(), 1280);
}

#[test]
fn even_split_gives_the_remainder_to_the_last_device_and_skips_zero_shares() {
    let m = PoolManager::builder()
        .limit(MIB)
        .devices(4)
        .strategy(Strategy::BestFit)
        .build();
    let r = m
        .reserve_even(
            10,
            &[
                DeviceIndex(0),
                DeviceIndex(1),
                DeviceIndex(2),
                DeviceIndex(3),
            ],
        )
        .unwrap();
    let got: Vec<_> = r.blocks().iter().map(|b| (b.device, b.requested)).collect();
    assert_eq!(
        got,
        [
            (DeviceIndex(0), 2),
            (DeviceIndex(1), 2),
            (DeviceIndex(2), 2),
            (DeviceIndex(3), 4)
        ]
    );
    m.release(r).unwrap();
    let r = m
        .reserve_even(
            3,
            &[
                DeviceIndex(0),
                DeviceIndex(1),
                DeviceIndex(2),
                DeviceIndex(3),
            ],
        )
        .unwrap();
    let got: Vec<_> = r.blocks().iter().map(|b| (b.device, b.requested)).collect();
    assert_eq!(got, [(DeviceIndex(3), 3)]);
    m.release(r).unwrap();
    assert!(matches!(
        m.reserve_even(0, &[DeviceIndex(0)]),
        Err(PoolError::ZeroBytes { .. })
    ));
}

#[test]
fn stats_track_peak_requests_and_success_rate_and_reset_peak_rebases() {
    let m = PoolManager::builder()
        .limit(8 * MIB)
        .devices(2)
        .strategy(Strategy::FirstFit)
        .build();
    let a = m
        .reserve(&[(DeviceIndex(0), 3 * MIB), (DeviceIndex(1), 100)])
        .unwrap();
    let b = m.reserve(&[(DeviceIndex(0), 2 * MIB)]).unwrap();
    assert!(m.reserve(&[(DeviceIndex(0), 4 * MIB)]).is_err());
    m.release(b).unwrap();
    let s = m.stats(DeviceIndex(0)).unwrap();
    assert_eq!(
        (s.in_use_bytes, s.peak_bytes, s.reservations, s.failures),
        (3 * MIB, 5 * MIB, 2, 1)
    );
    assert!((s.success_rate - 2.0 / 3.0).abs() < 1e-12);
    let s1 = m.stats(DeviceIndex(1)).unwrap();
    assert_eq!((s1.in_use_bytes, s1.requested_bytes), (256, 100));
    let t = m.total_stats();
    assert_eq!(
        (t.capacity_bytes, t.in_use_bytes, t.peak_bytes),
        (16 * MIB, 3 * MIB + 256, 5 * MIB + 256)
    );
    assert_eq!(
        (t.reservations, t.failures, t.requested_bytes),
        (3, 1, 3 * MIB + 100)
    );
    assert_eq!(t.largest_free_block, 8 * MIB - 256);
    m.reset_peak();
    assert_eq!(m.stats(DeviceIndex(0)).unwrap().peak_bytes, 3 * MIB);
    assert_eq!(m.total_stats().peak_bytes, 3 * MIB + 256);
    m.release(a).unwrap();
    assert_eq!(m.total_stats().in_use_bytes, 0);
    assert_eq!(m.total_stats().fragmentation, 0.0);
}

#[test]
fn observer_sees_each_touched_device_after_reserve_and_release() {
    let m = PoolManager::builder()
        .kind(DeviceKind::A100_80GB)
        .devices(3)
        .strategy(Strategy::BestFit)
        .build();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    m.set_observer(Box::new(move |s: &PoolSnapshot| {
        sink.lock().push((s.name.clone(), s.reserved_bytes));
    }));
    let r = m
        .reserve(&[(DeviceIndex(2), MIB), (DeviceIndex(0), 2 * MIB)])
        .unwrap();
    assert!(m.reserve(&[(DeviceIndex(1), 1 << 40)]).is_err());
    m.release(r).unwrap();
    m.clear_observer();
    let _r = m.reserve(&[(DeviceIndex(1), MIB)]).unwrap();
    let seen = seen.lock().clone();
    let want = [
        ("cuda:0", 2 * MIB),
        ("cuda:2", MIB),
        ("cuda:0", 0),
        ("cuda:2", 0),
    ];
    let want: Vec<_> = want.iter().map(|&(n, b)| (n.to_string(), b)).collect();
    assert_eq!(seen, want);
}

#[test]
fn observer_may_call_back_into_the_manager() {
    let m = Arc::new(
        PoolManager::builder()
            .limit(MIB)
            .devices(1)
            .strategy(Strategy::BestFit)
            .build(),
    );
    let inner = Arc::downgrade(&m);
    let frags = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&frags);
    m.set_observer(Box::new(move |s: &PoolSnapshot| {
        if let Some(m) = inner.upgrade() {
            sink.lock()
                .push(m.stats(s.device).map(|st| st.in_use_bytes).ok());
        }
    }));
    let r = m.reserve(&[(DeviceIndex(0), 512)]).unwrap();
    m.release(r).unwrap();
    assert_eq!(*frags.lock(), [Some(512), Some(0)]);
}

#[test]
fn releasing_into_another_manager_hands_the_reservation_back() {
    let a = PoolManager::builder()
        .limit(MIB)
        .devices(1)
        .strategy(Strategy::BestFit)
        .build();
    let b = PoolManager::builder()
        .limit(MIB)
        .devices(1)
        .strategy(Strategy::BestFit)
        .build();
    let r = a.reserve(&[(DeviceIndex(0), 4096)]).unwrap();
    let err = b.release(r).unwrap_err();
    assert!(
        err.to_string().contains("released into pool manager"),
        "{err}"
    );
    let PoolError::WrongManager { reservation, .. } = err else {
        panic!("{err}")
    };
    assert_eq!(b.total_stats().in_use_bytes, 0);
    assert_eq!(a.release(reservation).unwrap(), 4096);
}

#[test]
fn manager_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PoolManager>();
    check::<Reservation>();
    check::<PoolError>();
}

#[test]
fn totals_of_huge_pools_saturate_with_a_flag_instead_of_wrapping() {
    let m = PoolManager::builder()
        .limit(u64::MAX)
        .devices(2)
        .strategy(Strategy::BestFit)
        .build();
    let t = m.total_stats();
    assert!(t.saturated);
    assert_eq!(t.capacity_bytes, u64::MAX);
    assert_eq!(t.free_bytes, u64::MAX);
    assert!(!m.stats(DeviceIndex(0)).unwrap().saturated);
    let one = PoolManager::builder().limit(u64::MAX).devices(1).build();
    assert!(!one.total_stats().saturated);
}

#[test]
fn reserving_more_than_u64_in_all_neither_panics_nor_leaves_blocks_behind() {
    let m = PoolManager::builder()
        .limit(u64::MAX)
        .devices(2)
        .strategy(Strategy::BestFit)
        .build();
    let r = m
        .reserve(&[(DeviceIndex(0), 1 << 63), (DeviceIndex(1), 1 << 63)])
        .expect("each device has room for its half");
    assert_eq!(r.reserved_bytes(), 1u128 << 64);
    assert_eq!(r.requested_bytes(), 1u128 << 64);
    let t = m.total_stats();
    assert!(t.saturated && t.in_use_bytes == u64::MAX && t.peak_bytes == u64::MAX);
    assert_eq!(m.release(r).unwrap(), 1u128 << 64);
    let t = m.total_stats();
    assert_eq!(t.in_use_bytes, 0);
    for d in 0..2 {
        assert_eq!(m.stats(DeviceIndex(d)).unwrap().in_use_bytes, 0);
    }
    // reset_peak rebases the u128 total too.
    m.reset_peak();
    assert_eq!(m.total_stats().peak_bytes, 0);
}

#[test]
fn builder_sizes_from_the_limit_then_the_kind_then_zero() {
    let named = PoolManager::builder().kind(DeviceKind::L4).build();
    assert_eq!(
        named.stats(DeviceIndex(0)).unwrap().capacity_bytes,
        24 << 30
    );
    assert_eq!(named.devices(), 1);
    let limited = PoolManager::builder()
        .kind(DeviceKind::L4)
        .limit(MIB)
        .build();
    assert_eq!(limited.stats(DeviceIndex(0)).unwrap().capacity_bytes, MIB);
    assert_eq!(limited.device_name(DeviceIndex(0)), "cuda:0");
    let nothing = PoolManager::builder().devices(3).build();
    assert_eq!(nothing.total_stats().capacity_bytes, 0);
    assert!(matches!(
        nothing.reserve(&[(DeviceIndex(2), 1)]),
        Err(PoolError::Admission(_))
    ));
}

#[test]
fn snapshots_reach_an_installed_sink_and_stop_when_it_is_cleared() {
    static SEEN: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());
    fn sink(s: &PoolSnapshot) {
        // Other tests run managers at the same time: hear only this one's odd capacity.
        if s.capacity_bytes == 12_345 << 8 {
            SEEN.lock().push((s.name.clone(), s.reserved_bytes));
        }
    }
    let m = PoolManager::builder()
        .kind(DeviceKind::TpuV2)
        .limit(12_345 << 8)
        .build();
    set_pool_sink(sink);
    let r = m.reserve(&[(DeviceIndex(0), MIB)]).unwrap();
    clear_pool_sink();
    m.release(r).unwrap();
    assert_eq!(*SEEN.lock(), [("tpu:0".to_string(), MIB)]);
}

/// Hardening III, row 13: an observer that panics inside `reserve` unwound after the block was
/// placed, so the caller never got the reservation and the bytes stayed held for good. The
/// reservation is released before the panic goes on, on one device and on several.
#[test]
fn an_observer_that_panics_leaves_nothing_reserved() {
    let pools = PoolManager::builder()
        .limit(64 * MIB)
        .devices(2)
        .strategy(Strategy::BestFit)
        .build();
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = calls.clone();
    pools.set_observer(Box::new(move |_| {
        if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            panic!("observer failed");
        }
    }));
    for request in [
        vec![(DeviceIndex(0), 8 * MIB)],
        vec![(DeviceIndex(0), 8 * MIB), (DeviceIndex(1), 4 * MIB)],
    ] {
        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pools.reserve(&request)));
        let panic = result.expect_err("the observer's panic goes on");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"observer failed"));
        for device in [DeviceIndex(0), DeviceIndex(1)] {
            assert_eq!(pools.stats(device).unwrap().in_use_bytes, 0, "{request:?}");
        }
    }
    // Still usable afterwards.
    let kept = pools.reserve(&[(DeviceIndex(1), MIB)]).unwrap();
    assert_eq!(pools.release(kept).unwrap(), u128::from(MIB));
}

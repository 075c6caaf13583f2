//! Export cost against input size: the HTML report of a profile naming N timeline devices or N
//! pool devices, and the torch snapshot of an allocation log naming N devices, each at N and
//! 10 N. Linear exports take about 10 times as long at 10 N; the quadratic ones they replaced
//! (issue 11 item 7) took about 100 times as long (10 k → 0.9 s, 100 k > 120 s).
//!
//! Run: `cargo bench --bench exports -- --warm-up-time 1 --measurement-time 5`

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use highwater::profile::alloc_log::{AllocLog, AllocRecord};
use highwater::Profile;
use highwater_export::{html, torch};

/// A profile whose timeline (or pool timeline) names `devices` devices, one point each.
fn profile_with_devices(devices: u64, pools: bool) -> Profile {
    let mut profile = Profile::empty();
    for i in 0..devices {
        let device = format!("dev:{i}");
        if pools {
            profile.pool_timeline.push({
                let mut pool_point = highwater::profile::PoolPoint::default();
                pool_point.timestamp_ns = i;
                pool_point.device = device;
                pool_point.capacity_bytes = 1 << 30;
                pool_point.reserved_bytes = i;
                pool_point.largest_free_bytes = 0;
                pool_point.fragmentation = 0.0;
                pool_point
            });
        } else {
            profile.timeline.push({
                let mut timeline_point = highwater::profile::TimelinePoint::default();
                timeline_point.timestamp_ns = i;
                timeline_point.device = device;
                timeline_point.live_bytes = i;
                timeline_point.by_category = Default::default();
                timeline_point
            });
        }
    }
    profile
}

/// A log naming `devices` devices with one allocation and one free on each.
fn log_with_devices(devices: usize) -> AllocLog {
    let record = |device: usize, alloc: bool| {
        AllocRecord::new(
            device as u16,
            device as u64,
            device as u64,
            4096,
            alloc,
            None,
        )
    };
    AllocLog {
        devices: (0..devices).map(|i| format!("dev:{i}")).collect(),
        records: (0..devices)
            .flat_map(|d| [record(d, true), record(d, false)])
            .collect(),
    }
}

fn exports(c: &mut Criterion) {
    let mut group = c.benchmark_group("html_timeline_devices");
    group.sample_size(10);
    for devices in [10_000u64, 100_000] {
        let profile = profile_with_devices(devices, false);
        group.bench_with_input(BenchmarkId::from_parameter(devices), &profile, |b, p| {
            b.iter(|| black_box(html::render(p)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("html_pool_devices");
    group.sample_size(10);
    for devices in [10_000u64, 100_000] {
        let profile = profile_with_devices(devices, true);
        group.bench_with_input(BenchmarkId::from_parameter(devices), &profile, |b, p| {
            b.iter(|| black_box(html::render(p)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("torch_log_devices");
    group.sample_size(10);
    for devices in [6_553usize, 65_535] {
        let log = log_with_devices(devices);
        group.bench_with_input(BenchmarkId::from_parameter(devices), &log, |b, log| {
            b.iter(|| black_box(torch::render(log, torch::DEFAULT_MAX_EVENTS)))
        });
    }
    group.finish();
}

criterion_group!(benches, exports);
criterion_main!(benches);

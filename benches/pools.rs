//! Reserve + release throughput of every strategy against the original `Vec`-based pool.
//!
//! Workload: a 16 GiB pool, request sizes log-uniform in 256 B – 64 MiB from a seeded
//! splitmix64, allocating while the requested bytes are at or below the target occupancy (0.75
//! or 0.9) and releasing a random live block above it. The stream is generated once, from a
//! model that does not depend on the allocator, so every implementation replays the same
//! operations; an allocation an implementation refuses is counted and its later release skipped.
//! A third configuration uses a 64 GiB pool at 0.75 to hold about 10 k live blocks.
//!
//! Besides criterion's per-operation timings this prints, per configuration, full 1 M
//! operation replays per implementation (see [`full_replay`] for how they are timed):
//! wall-clock ops/s, the ratio to the baseline, refusals, mean live blocks and mean
//! fragmentation, and the baseline's number of full coalescing passes.
//!
//! It then times the what-if replays (`highwater fit` and `simulate`'s figures): every
//! [`Allocator`] — the PyTorch and TensorFlow emulations and each strategy — replaying the same
//! stream, against the `Vec` baseline measured in the same run, by wall clock and by the
//! replaying thread's CPU time. `WHATIF_ONLY=1` prints only that table;
//! `WHATIF_ALLOCATORS=pytorch,tf-bfc` narrows it to those allocators.
//!
//! Run: `cargo bench --bench pools -- --warm-up-time 1 --measurement-time 3`

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use highwater::device::{DeviceIndex, PoolManager, Reservation, Strategy};
use highwater_device::{replay, Allocator, SimOp, Trace};
use highwater_testkit::cpu::thread_cpu_time;

const GIB: u64 = 1 << 30;
const OPS: usize = 1_000_000;

// ---------------------------------------------------------------------------------------------
// Workload

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Log-uniform in [256 B, 64 MiB].
    fn size(&mut self) -> u64 {
        (2f64.powf(8.0 + 18.0 * self.unit()) as u64).clamp(256, 64 << 20)
    }
}

#[derive(Clone, Copy)]
enum Op {
    Alloc { id: usize, size: u64 },
    Free { id: usize },
}

/// `ops` operations around `target` occupancy, then frees of whatever is left (so the stream
/// can be replayed in a loop). An allocation's id is a slot number reused once it is freed, so
/// ids stay below the most blocks ever live and replayers can keep live blocks in a small
/// vector indexed by id (the harness should not be what the benchmark measures).
fn workload(capacity: u64, target: f64, ops: usize, seed: u64) -> (Vec<Op>, usize) {
    let mut rng = Rng(seed);
    let mut live: Vec<(usize, u64)> = Vec::new();
    let mut vacant: Vec<usize> = Vec::new();
    let mut slots = 0;
    let mut sum = 0u64;
    let mut out = Vec::with_capacity(ops + 20_000);
    let limit = (capacity as f64 * target) as u64;
    for _ in 0..ops {
        if sum > limit && !live.is_empty() {
            let (id, size) = live.swap_remove((rng.next() % live.len() as u64) as usize);
            sum -= size;
            vacant.push(id);
            out.push(Op::Free { id });
        } else {
            let size = rng.size();
            let id = vacant.pop().unwrap_or_else(|| {
                slots += 1;
                slots - 1
            });
            live.push((id, size));
            sum += size;
            out.push(Op::Alloc { id, size });
        }
    }
    for (id, _) in live {
        out.push(Op::Free { id });
    }
    (out, slots)
}

// ---------------------------------------------------------------------------------------------
// The implementations under test

/// Something that replays ops.
trait Replayer {
    /// Applies one op; returns false if an allocation was refused.
    fn apply(&mut self, op: Op) -> bool;
    /// (live blocks, fragmentation) now.
    fn shape(&self) -> (usize, f64);
    /// Anything worth printing after a replay.
    fn note(&self) -> Option<String> {
        None
    }
}

/// highwater's manager with one device.
struct Highwater {
    pools: PoolManager,
    live: Vec<Option<Reservation>>,
    count: usize,
}

impl Highwater {
    fn new(capacity: u64, strategy: Strategy, ids: usize) -> Self {
        Self {
            pools: PoolManager::builder()
                .limit(capacity)
                .devices(1)
                .strategy(strategy)
                .build(),
            live: (0..ids).map(|_| None).collect(),
            count: 0,
        }
    }
}

impl Replayer for Highwater {
    fn apply(&mut self, op: Op) -> bool {
        match op {
            Op::Alloc { id, size } => match self.pools.reserve(&[(DeviceIndex(0), size)]) {
                Ok(r) => {
                    self.live[id] = Some(r);
                    self.count += 1;
                    true
                }
                Err(_) => false,
            },
            Op::Free { id } => {
                if let Some(r) = self.live[id].take() {
                    black_box(self.pools.release(r).ok());
                    self.count -= 1;
                }
                true
            }
        }
    }

    fn shape(&self) -> (usize, f64) {
        let frag = self
            .pools
            .stats(DeviceIndex(0))
            .map_or(0.0, |s| s.fragmentation);
        (self.count, frag)
    }
}

/// A re-implementation of the original optirs-tpu pool's behaviour, best-fit mode, with its
/// garbage collector: a `Vec` free list scanned linearly to choose a block; release pushes the
/// block and re-sorts the list by address, then the release path coalesces the whole list;
/// a refused allocation triggers a full coalescing pass and one retry when utilisation is at
/// least 0.8 or fragmentation (1 - largest / free) exceeds 0.5; every allocation outcome and
/// every release recomputes the fragmentation statistic by scanning the list. Requests are not
/// rounded. Kept here as the benchmark's baseline; not part of the library.
struct VecBaseline {
    total: u64,
    available: u64,
    /// (start, size), kept sorted by start after each release.
    free: Vec<(u64, u64)>,
    allocated: HashMap<usize, (u64, u64)>,
    gc_passes: u64,
    fragmentation_stat: f64,
}

impl VecBaseline {
    fn new(total: u64) -> Self {
        Self {
            total,
            available: total,
            free: vec![(0, total)],
            allocated: HashMap::new(),
            gc_passes: 0,
            fragmentation_stat: 0.0,
        }
    }

    fn largest(&self) -> u64 {
        self.free.iter().map(|b| b.1).max().unwrap_or(0)
    }

    fn fragmentation(&self) -> f64 {
        if self.available == 0 {
            0.0
        } else {
            1.0 - self.largest() as f64 / self.available as f64
        }
    }

    fn try_carve(&mut self, size: u64) -> Option<u64> {
        if size == 0 || size > self.available {
            return None;
        }
        let index = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.1 >= size)
            .min_by_key(|(_, b)| b.1)
            .map(|(i, _)| i)?;
        let start = self.free[index].0;
        if self.free[index].1 == size {
            self.free.remove(index);
        } else {
            self.free[index].0 += size;
            self.free[index].1 -= size;
        }
        self.available -= size;
        Some(start)
    }

    fn coalesce(&mut self) {
        if self.free.len() < 2 {
            return;
        }
        self.free.sort_by_key(|b| b.0);
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.free.len());
        for b in self.free.drain(..) {
            match merged.last_mut() {
                Some(prev) if prev.0 + prev.1 == b.0 => prev.1 += b.1,
                _ => merged.push(b),
            }
        }
        self.free = merged;
        self.gc_passes += 1;
    }

    fn alloc(&mut self, id: usize, size: u64) -> bool {
        let mut got = self.try_carve(size);
        if got.is_none() {
            let utilization = (self.total - self.available) as f64 / self.total as f64;
            if utilization >= 0.8 || self.fragmentation() > 0.5 {
                self.coalesce();
                got = self.try_carve(size);
            }
        }
        self.fragmentation_stat = self.fragmentation();
        match got {
            Some(start) => {
                self.allocated.insert(id, (start, size));
                true
            }
            None => false,
        }
    }

    fn release(&mut self, id: usize) {
        if let Some(block) = self.allocated.remove(&id) {
            self.available += block.1;
            self.free.push(block);
            self.free.sort_by_key(|b| b.0);
            self.coalesce();
            self.fragmentation_stat = self.fragmentation();
        }
    }
}

impl Replayer for VecBaseline {
    fn apply(&mut self, op: Op) -> bool {
        match op {
            Op::Alloc { id, size } => self.alloc(id, size),
            Op::Free { id } => {
                self.release(id);
                true
            }
        }
    }

    fn shape(&self) -> (usize, f64) {
        (self.allocated.len(), self.fragmentation())
    }

    fn note(&self) -> Option<String> {
        Some(format!("{} full coalescing passes", self.gc_passes))
    }
}

// ---------------------------------------------------------------------------------------------
// Harness

struct Config {
    label: &'static str,
    capacity: u64,
    target: f64,
}

const CONFIGS: [Config; 3] = [
    Config {
        label: "16GiB@0.75",
        capacity: 16 * GIB,
        target: 0.75,
    },
    Config {
        label: "16GiB@0.90",
        capacity: 16 * GIB,
        target: 0.90,
    },
    Config {
        label: "64GiB@0.75",
        capacity: 64 * GIB,
        target: 0.75,
    },
];

const BASELINE: &str = "vec-baseline";

/// The baseline and every strategy; `POOLS_ONLY=best-fit,buddy` narrows the list.
fn implementations() -> Vec<&'static str> {
    let mut names = vec![BASELINE];
    names.extend(Strategy::ALL.iter().map(|s| s.name()));
    if let Ok(only) = std::env::var("POOLS_ONLY") {
        names.retain(|n| only.split(',').any(|o| o == *n));
    }
    names
}

fn make(name: &str, capacity: u64, ids: usize) -> Box<dyn Replayer> {
    match name.parse::<Strategy>() {
        Ok(strategy) => Box::new(Highwater::new(capacity, strategy, ids)),
        Err(_) => Box::new(VecBaseline::new(capacity)),
    }
}

/// Full replays: (ops/s, refusals, mean live blocks, mean fragmentation, note).
///
/// A highwater strategy's replay takes a fraction of a second, so on a shared machine one
/// burst of load can halve it: it is timed three times and the fastest run counts. The
/// baseline's replay takes seconds and averages such bursts out; it runs once.
fn full_replay(name: &str, cfg: &Config, ops: &[Op], ids: usize) -> (f64, u64, f64, f64, String) {
    let runs = if name == BASELINE { 1 } else { 3 };
    let mut best = Duration::MAX;
    let mut refused = 0u64;
    let mut note = String::new();
    for _ in 0..runs {
        let mut r = make(name, cfg.capacity, ids);
        refused = 0;
        let started = Instant::now();
        for &op in ops {
            if !r.apply(op) {
                refused += 1;
            }
        }
        best = best.min(started.elapsed());
        note = r.note().unwrap_or_default();
    }
    let rate = ops.len() as f64 / best.as_secs_f64();
    if name == BASELINE {
        return (rate, refused, f64::NAN, f64::NAN, note);
    }
    // Shape in a separate pass so sampling does not distort the timing.
    let mut r = make(name, cfg.capacity, ids);
    let (mut live_sum, mut frag_sum, mut samples) = (0f64, 0f64, 0f64);
    for (i, &op) in ops.iter().enumerate() {
        r.apply(op);
        if i % 256 == 0 && i < OPS {
            let (live, frag) = r.shape();
            live_sum += live as f64;
            frag_sum += frag;
            samples += 1.0;
        }
    }
    (rate, refused, live_sum / samples, frag_sum / samples, note)
}

fn report_full_replays() {
    println!("\nfull replays of {OPS} operations (+ final frees), one per implementation:");
    for cfg in &CONFIGS {
        let (ops, ids) = workload(cfg.capacity, cfg.target, OPS, 0x5eed);
        println!("\n{}  ({} ops)", cfg.label, ops.len());
        println!(
            "{:<13} {:>12} {:>9} {:>10} {:>11} {:>10}",
            "impl", "ops/s", "vs base", "refusals", "live (avg)", "frag (avg)"
        );
        let mut base = 0.0;
        for name in implementations() {
            let (rate, refused, live, frag, note) = full_replay(name, cfg, &ops, ids);
            if name == BASELINE {
                base = rate;
            }
            println!(
                "{name:<13} {rate:>12.0} {:>8.1}x {refused:>10} {live:>11.0} {frag:>10.4}",
                rate / base
            );
            if !note.is_empty() {
                println!("{:<13} ({note})", "");
            }
        }
    }
    println!();
}

/// The machine's 1-minute load average, for the table's caption.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The allocators to time; `WHATIF_ALLOCATORS=pytorch,tf-bfc` narrows the list.
fn whatif_allocators() -> Vec<Allocator> {
    let mut all = Allocator::standard();
    if let Ok(only) = std::env::var("WHATIF_ALLOCATORS") {
        all.retain(|a| only.split(',').any(|o| o == a.to_string()));
    }
    all
}

/// What-if replays (`highwater fit`, `simulate`'s figures): each allocator replays the same
/// stream from a prepared [`Trace`]; the rate is against the original `Vec` pool on the same
/// stream, timed in this run. Fastest of five runs counts, by wall clock and by the thread's
/// CPU time (each its own fastest run).
fn report_whatif_replays() {
    println!("\nwhat-if replays ({OPS} operations + final frees), device = the config's pool:");
    for cfg in &CONFIGS[..2] {
        let (ops, ids) = workload(cfg.capacity, cfg.target, OPS, 0x5eed);
        let sim: Vec<SimOp> = ops
            .iter()
            .enumerate()
            .map(|(ts, op)| match *op {
                Op::Alloc { id, size } => SimOp::alloc(ts as u64, id as u64, size),
                Op::Free { id } => SimOp::free(ts as u64, id as u64),
            })
            .collect();
        let trace = Trace::new(&sim);
        let load_before = load_average();
        let cpu_started = thread_cpu_time();
        let (base, ..) = full_replay(BASELINE, cfg, &ops, ids);
        let base_cpu = ops.len() as f64 / (thread_cpu_time() - cpu_started).as_secs_f64();
        println!("\n{}  ({} ops)", cfg.label, ops.len());
        println!(
            "{:<19} {:>12} {:>9} {:>14} {:>9} {:>10} {:>14}",
            "allocator", "ops/s", "vs base", "ops/cpu-s", "vs base", "refusals", "peak"
        );
        println!(
            "{BASELINE:<19} {base:>12.0} {:>8.1}x {base_cpu:>14.0} {:>8.1}x",
            1.0, 1.0
        );
        for allocator in whatif_allocators() {
            let (mut best, mut best_cpu) = (Duration::MAX, Duration::MAX);
            let mut last = None;
            for _ in 0..5 {
                let (started, cpu_started) = (Instant::now(), thread_cpu_time());
                last = Some(black_box(replay(&trace, allocator, cfg.capacity)));
                best = best.min(started.elapsed());
                best_cpu = best_cpu.min(thread_cpu_time() - cpu_started);
            }
            let r = last.expect("five runs");
            let rate = trace.len() as f64 / best.as_secs_f64();
            let rate_cpu = trace.len() as f64 / best_cpu.as_secs_f64();
            println!(
                "{:<19} {rate:>12.0} {:>8.1}x {rate_cpu:>14.0} {:>8.1}x {:>10} {:>11} MiB",
                allocator.to_string(),
                rate / base,
                rate_cpu / base_cpu,
                r.refused,
                r.peak_bytes >> 20
            );
        }
        println!(
            "(1-minute load average {load_before} before, {} after)",
            load_average()
        );
    }
    println!();
}

fn bench_pools(c: &mut Criterion) {
    if std::env::var_os("WHATIF_ONLY").is_some() {
        report_whatif_replays();
        return;
    }
    report_full_replays();
    report_whatif_replays();
    for cfg in &CONFIGS {
        let (ops, ids) = workload(cfg.capacity, cfg.target, OPS, 0x5eed);
        let mut group = c.benchmark_group(format!("pools/{}", cfg.label));
        for name in implementations() {
            let mut r = make(name, cfg.capacity, ids);
            // Start from steady state: replay the first 100 k ops untimed.
            let warm = 100_000.min(ops.len());
            for &op in &ops[..warm] {
                r.apply(op);
            }
            let mut at = warm;
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let started = Instant::now();
                    for _ in 0..iters {
                        black_box(r.apply(ops[at]));
                        at += 1;
                        if at == ops.len() {
                            at = 0;
                        }
                    }
                    started.elapsed()
                })
            });
        }
        group.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args()
}

criterion_group! {
    name = pools;
    config = config();
    targets = bench_pools
}
criterion_main!(pools);

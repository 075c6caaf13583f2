//! Comparing 1,024 ranks (issue 33): `highwater ranks DIR` over 1,024 rank profiles of a real
//! size, the process timed end to end, and its peak memory (max RSS) beside one profile's.
//!
//! The profiles are built from a real one: this process records a session of a training-shaped
//! loop (spans per step and layer, activations made in forward and freed in backward,
//! optimizer state kept) long enough to fill the profile's bounded tables, then writes it as
//! each rank of a world of 1,024 (`highwater_testkit::ranks::as_rank`: its rank, host and run
//! in `meta`, and a different number of extra activation bytes per rank).
//!
//! Run: `cargo bench -p highwater-cli --bench ranks` (HIGHWATER_BENCH_RANKS for another count;
//! the profiles take about 3 GB under the temporary directory while it runs, or in
//! HIGHWATER_BENCH_DIR, where they are kept).

// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::Criterion;
use highwater::profile::ranks::{compare, CompareOptions};
use highwater::{Profile, Session, Step};
use highwater_testkit::ranks::as_rank;

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// The profiles, written once.
struct Fixture {
    /// Removed at the end of `main` (a static is never dropped), unless `HIGHWATER_BENCH_DIR`
    /// named the directory.
    temporary: Option<tempfile::TempDir>,
    path: PathBuf,
    ranks: u32,
    profile_bytes: u64,
}

fn ranks() -> u32 {
    std::env::var("HIGHWATER_BENCH_RANKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

/// A real profile: a session recording `steps` training-shaped steps.
fn record(steps: usize) -> Profile {
    let session = Session::builder()
        .write_profile(false)
        .checkpoint_every(Duration::ZERO)
        .start()
        .expect("start a session");
    let params: Vec<Vec<f32>> = {
        let _init = highwater::profile!("build_model", highwater::Category::Parameter);
        (0..8).map(|_| vec![0.0f32; 256 << 10]).collect()
    };
    let mut state: Vec<Vec<f32>> = Vec::new();
    for step in 0..steps {
        let _step = highwater::profile!("train_step");
        let activations: Vec<Vec<f32>> = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            (0..8)
                .map(|layer| {
                    let _layer = highwater::profile!("layer");
                    vec![layer as f32; (64 << 10) + (step % 7) * 1024]
                })
                .collect()
        };
        {
            let _bwd = highwater::profile!("backward", Step::Backward);
            let grads: Vec<Vec<f32>> = activations.iter().map(|a| vec![0.5; a.len()]).collect();
            drop(activations);
            black_box(grads);
        }
        {
            let _opt = highwater::profile!("optimizer", Step::Optimizer);
            if state.is_empty() {
                state = params.iter().map(|p| vec![0.0; 2 * p.len()]).collect();
            }
            black_box(vec![0u8; 1 << 20]);
        }
    }
    black_box(&params);
    drop(state);
    session.finish().expect("finish the session")
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let started = Instant::now();
        let profile = record(3_000);
        // HIGHWATER_BENCH_DIR: write the profiles there and keep them (to look at, or to time
        // `highwater ranks` on them by hand).
        let (dir, path) = match std::env::var_os("HIGHWATER_BENCH_DIR") {
            Some(kept) => {
                let path = PathBuf::from(kept);
                std::fs::create_dir_all(&path).expect("create HIGHWATER_BENCH_DIR");
                (None, path)
            }
            None => {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let path = dir.path().to_path_buf();
                (Some(dir), path)
            }
        };
        let ranks = ranks();
        let mut profile_bytes = 0;
        for rank in 0..ranks {
            let extra = u64::from(rank % 61) << 20;
            let file = path.join(format!("highwater-profile.rank{rank}.json"));
            as_rank(profile.clone(), rank, ranks, "torchrun:bench", extra)
                .write(&file)
                .expect("write a rank profile");
            profile_bytes = profile_bytes.max(std::fs::metadata(&file).unwrap().len());
        }
        eprintln!(
            "ranks bench: {ranks} rank profiles of up to {:.2} MB written in {:.1} s",
            profile_bytes as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
        Fixture {
            path,
            temporary: dir,
            ranks,
            profile_bytes,
        }
    })
}

fn highwater(args: &[&str]) -> std::process::Output {
    let output = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(args)
        .output()
        .expect("run highwater");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `highwater args` and follows its peak resident set (`VmHWM` in `/proc/PID/status`,
/// read until it exits: a high-water mark, so the last reading is the peak but for the last
/// milliseconds). Not `getrusage`: a child spawned with vfork counts this large process's
/// pages as its own until it execs. Its time and peak, bytes.
fn measured(args: &[&str]) -> (Duration, u64) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run highwater");
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            peak = peak.max(hwm.unwrap_or(0) * 1024);
        }
        if let Some(exit) = child.try_wait().expect("wait for highwater") {
            assert!(exit.success(), "highwater {args:?}: {exit}");
            return (started.elapsed(), peak);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn bench(c: &mut Criterion) {
    let fixture = fixture();
    let dir = fixture.path.to_str().unwrap();
    let mut group = c.benchmark_group(format!("ranks_{}", fixture.ranks));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(30));
    group.bench_function("highwater_ranks_process", |b| {
        b.iter(|| black_box(highwater(&["ranks", dir])))
    });
    group.bench_function("compare_in_process", |b| {
        b.iter(|| {
            black_box(compare(std::slice::from_ref(&fixture.path), &CompareOptions::new()).unwrap())
        })
    });
    group.bench_function("compare_in_process_one_thread", |b| {
        b.iter(|| {
            let options = CompareOptions::new().threads(1);
            black_box(compare(std::slice::from_ref(&fixture.path), &options).unwrap())
        })
    });
    group.finish();
}

/// What one process of `highwater ranks` and of the ranks page needs at most, against one
/// profile's size.
fn memory_report(fixture: &Fixture) {
    let dir = fixture.path.to_str().unwrap();
    let (took, rss) = measured(&["ranks", dir]);
    let page = Path::new(dir).join("highwater-ranks.html");
    let (page_took, page_rss) = measured(&[
        "export",
        "--format",
        "html",
        dir,
        "-o",
        page.to_str().unwrap(),
    ]);
    eprintln!(
        "ranks bench: `highwater ranks` over {} profiles of {:.2} MB: {:.2} s, peak RSS {:.1} MB; \
         `export --format html` (the ranks page, {:.1} MB): {:.2} s, peak RSS {:.1} MB",
        fixture.ranks,
        fixture.profile_bytes as f64 / 1e6,
        took.as_secs_f64(),
        rss as f64 / 1e6,
        std::fs::metadata(&page).map_or(0, |m| m.len()) as f64 / 1e6,
        page_took.as_secs_f64(),
        page_rss as f64 / 1e6,
    );
    let _ = std::fs::remove_file(page);
}

fn main() {
    let fixture = fixture();
    memory_report(fixture);
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
    if let Some(dir) = &fixture.temporary {
        // Gigabytes of profiles: the static holding the directory is never dropped.
        let _ = std::fs::remove_dir_all(dir.path());
    }
}

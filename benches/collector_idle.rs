//! What a recording session costs the process while the program allocates little: the
//! collector's CPU per second of wall time, against the same seconds with no session.
//!
//! A training step allocates a few thousand blocks and spends the rest of its time computing on
//! every core, so whatever the collector does at each wake, apart from applying events, is taken
//! from the training threads. This bench holds `THREADS` threads alive (each has claimed a ring)
//! and sleeping, and measures the process's CPU time per wall-clock second with no session and
//! with a session recording, in alternating rounds; it prints the medians and what the session
//! adds. (Applying events has its own bench, `analysis`.) Run: `cargo bench --bench collector_idle`
//! (`HIGHWATER_BENCH_IDLE_ROUNDS`, default 5, and `HIGHWATER_BENCH_IDLE_SECONDS`, default 2).

#![allow(missing_docs)]

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use highwater::{Alloc, Session};
use highwater_testkit::cpu::process_cpu_time;

#[global_allocator]
static ALLOC: Alloc = Alloc::system();

/// Threads kept alive with a claimed ring.
const THREADS: usize = 4;

/// What the held threads do.
const SLEEP: u8 = 0;
const QUIT: u8 = 1;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .filter(|&value| value > 0)
        .unwrap_or(default)
}

/// Process CPU per wall second over `window`.
fn cpu_per_second(window: Duration) -> f64 {
    let (cpu, wall) = (process_cpu_time(), Instant::now());
    std::thread::sleep(window);
    let used = process_cpu_time() - cpu;
    used.as_secs_f64() / wall.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let rounds = setting("HIGHWATER_BENCH_IDLE_ROUNDS", 5) as usize;
    let window = Duration::from_secs(setting("HIGHWATER_BENCH_IDLE_SECONDS", 2));
    let mode = Arc::new(AtomicU8::new(SLEEP));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let mode = Arc::clone(&mode);
            std::thread::spawn(move || loop {
                // One allocation claims the thread's ring.
                std::hint::black_box(vec![0u8; 64]);
                if mode.load(Ordering::SeqCst) == QUIT {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            })
        })
        .collect();
    let mut samples: [Vec<f64>; 2] = Default::default();
    for round in 0..rounds {
        for turn in 0..2 {
            let recorded = (round + turn) % 2 == 1;
            let session = recorded.then(|| {
                Session::builder()
                    .write_profile(false)
                    .start()
                    .expect("a session starts")
            });
            samples[usize::from(recorded)].push(cpu_per_second(window));
            if let Some(session) = session {
                session.finish().expect("the session finishes");
            }
        }
    }
    mode.store(QUIT, Ordering::SeqCst);
    for thread in threads {
        thread.join().expect("a held thread ends");
    }
    let [off, on] = samples.map(median);
    println!(
        "collector_idle: {:.2} ms CPU per second unrecorded, {:.2} recorded: {:+.2} ms per second \
         ({rounds} rounds of {} s each way, {THREADS} sleeping threads holding rings)",
        off * 1e3,
        on * 1e3,
        (on - off) * 1e3,
        window.as_secs()
    );
}

//! A budget failure names the call sites that allocated (function, file and line), from the
//! stacks a measurement samples; the estimates are close to the exact figures and the same on
//! every run.

use std::hint::black_box;

use highwater::{Budget, LeakCheck, Measurement};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// This file as the failure message names it (relative to the package, where tests run).
const FILE: &str = "tests/measure_budget_names_call_sites.rs";

/// One 1 MiB block (always sampled: 256 KiB and up are), and the line that allocates it.
#[inline(never)]
fn build_lookup_table() -> (Vec<u8>, u32) {
    let line = line!() + 1;
    let table = black_box(vec![7u8; 1 << 20]);
    (table, line)
}

/// The message's line that names `function`.
fn line_naming<'a>(message: &'a str, function: &str) -> &'a str {
    message
        .lines()
        .find(|line| line.contains(function))
        .unwrap_or_else(|| panic!("no line names {function}:\n{message}"))
}

#[test]
fn a_peak_failure_names_the_function_and_line_that_allocated() {
    let (line, m) = highwater::measure(|| {
        let (table, line) = build_lookup_table();
        drop(black_box(table));
        drop(black_box(vec![0u8; 100]));
        line
    });
    assert_eq!(m.peak_bytes, 1 << 20);
    let message = Budget::new()
        .max_peak_bytes(512 * 1024)
        .check(&m)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(
            "largest contributors by call site (live at the peak; estimated, one sample per \
             64.0 KiB allocated):"
        ),
        "{message}"
    );
    let site = line_naming(&message, "build_lookup_table");
    assert_eq!(
        site,
        format!(
            "      ~1.0 MiB  measure_budget_names_call_sites::build_lookup_table at {FILE}:{line} \
             (1 sample)"
        ),
        "{message}"
    );
    assert!(message.lines().count() <= 24, "one screenful:\n{message}");
}

/// 512 KiB kept: the line that allocates it.
#[inline(never)]
fn fill_a_cache(cache: &mut Vec<Vec<u64>>) -> u32 {
    let line = line!() + 1;
    cache.push(black_box(vec![1u64; 64 * 1024]));
    line
}

#[test]
fn a_leak_failure_names_the_function_that_kept_the_block() {
    let mut cache = Vec::with_capacity(4);
    let (line, m) = highwater::measure(|| fill_a_cache(&mut cache));
    assert_eq!(m.leaked_bytes, 512 * 1024);
    let message = Budget::new()
        .max_leaked_bytes(0)
        .check(&m)
        .unwrap_err()
        .to_string();
    let site = line_naming(&message, "fill_a_cache");
    assert!(
        site.starts_with("    ~512.0 KiB  measure_budget_names_call_sites::fill_a_cache at "),
        "{message}"
    );
    assert!(site.contains(&format!("{FILE}:{line} ")), "{message}");
    assert!(
        message.contains("largest contributors by call site (still live at the end;"),
        "{message}"
    );
}

#[test]
fn a_leak_across_iterations_names_the_function_that_grows() {
    let mut cache = Vec::with_capacity(64);
    let mut line = 0;
    let report = LeakCheck::new()
        .warmups(1)
        .iterations(5)
        .run(|| line = fill_a_cache(&mut cache));
    let message = report.check().unwrap_err().to_string();
    let site = line_naming(&message, "fill_a_cache");
    assert!(site.starts_with("      ~2.5 MiB  "), "{message}");
    assert!(
        site.contains(&format!("{FILE}:{line} (5 samples)")),
        "{message}"
    );
}

/// 16 384 blocks of 1 KiB, all kept: about 256 samples.
#[allow(clippy::vec_box)] // the boxes are the point: one allocation each
#[inline(never)]
fn many_small_blocks() -> Vec<Box<[u8; 1024]>> {
    (0..16 * 1024)
        .map(|_| black_box(Box::new([0u8; 1024])))
        .collect()
}

fn measure_small_blocks() -> Measurement {
    let (blocks, m) = highwater::measure(many_small_blocks);
    drop(blocks);
    m
}

#[test]
fn sampled_estimates_are_close_to_the_exact_figures_and_the_same_every_run() {
    // Measured from one call site, so that the stacks are the same too.
    let runs: Vec<Measurement> = (0..21).map(|_| measure_small_blocks()).collect();
    let first = &runs[0];
    let samples: u64 = first.sites.iter().map(|site| site.samples).sum();
    assert!((150..400).contains(&samples), "{samples} samples");
    // The boxes' site holds nearly everything; its estimate is within 20 % (the standard
    // error is about 6 %), and the same on every run (one seed per measurement).
    let boxes = first
        .sites
        .iter()
        .max_by_key(|site| site.leaked_bytes)
        .expect("sites");
    let exact = 16 * 1024 * 1024;
    let ratio = boxes.leaked_bytes as f64 / exact as f64;
    assert!((0.8..1.2).contains(&ratio), "estimate {ratio} of exact");
    assert!(boxes.live_at_peak_bytes >= boxes.leaked_bytes);
    for run in &runs[1..] {
        assert_eq!(run, first);
    }
    let message = Budget::new()
        .max_leaked_bytes(exact - 1)
        .check(first)
        .unwrap_err()
        .to_string();
    line_naming(&message, "many_small_blocks");
}

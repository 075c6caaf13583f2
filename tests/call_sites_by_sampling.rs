//! Call sites by sampling bytes (issue 12, items 1 and 5): three functions allocate known byte
//! totals, and the profile's per-site estimates land within the error it states, run after
//! run; every allocation of at least 4R has its stack; `R = 1` (also through
//! `HIGHWATER_SAMPLE_BYTES`) counts every allocation exactly; `R = 0` records no site.

use std::sync::Mutex;

use highwater::profile::CallSite;
use highwater::{Alloc, Profile, Session};

#[global_allocator]
static ALLOC: Alloc = Alloc::system();

/// One session at a time, and the environment changed only under it.
static SERIAL: Mutex<()> = Mutex::new(());

/// A few large blocks: 6 of 3 MiB.
const LARGE: (usize, usize) = (6, 3 << 20);
/// Many small ones: 100,000 of 96 bytes.
const SMALL: (usize, usize) = (100_000, 96);
/// In between: 1,500 of 12 KiB.
const MEDIUM: (usize, usize) = (1_500, 12 << 10);

#[inline(never)]
fn few_large(out: &mut Vec<Vec<u8>>) {
    for _ in 0..LARGE.0 {
        out.push(std::hint::black_box(vec![1u8; LARGE.1]));
    }
}

#[inline(never)]
fn many_small(out: &mut Vec<Vec<u8>>) {
    for _ in 0..SMALL.0 {
        out.push(std::hint::black_box(vec![2u8; SMALL.1]));
    }
}

#[inline(never)]
fn some_medium(out: &mut Vec<Vec<u8>>) {
    for _ in 0..MEDIUM.0 {
        out.push(std::hint::black_box(vec![3u8; MEDIUM.1]));
    }
}

/// Runs the three functions with everything they allocate live at once (the peak), then
/// frees it.
fn three_functions(session: Session) -> Profile {
    let mut kept = Vec::with_capacity(LARGE.0 + SMALL.0 + MEDIUM.0);
    few_large(&mut kept);
    many_small(&mut kept);
    some_medium(&mut kept);
    drop(kept);
    session.finish().unwrap()
}

/// The sites whose stack passes through `function`.
fn sites_of<'a>(profile: &'a Profile, function: &str) -> Vec<&'a CallSite> {
    let name = format!("call_sites_by_sampling::{function}");
    profile
        .sites
        .iter()
        .filter(|site| {
            site.frames
                .iter()
                .any(|frame| frame.function.as_deref() == Some(name.as_str()))
        })
        .collect()
}

/// (estimate, standard error) summed over sites, for `field` and its error.
fn total(sites: &[&CallSite], field: fn(&CallSite) -> (u64, u64)) -> (f64, f64) {
    let (sum, variance) = sites.iter().fold((0.0, 0.0), |(sum, variance), site| {
        let (value, error) = field(site);
        (sum + value as f64, variance + (error as f64).powi(2))
    });
    (sum, variance.sqrt())
}

#[test]
fn per_site_estimates_fall_within_their_stated_error_across_seeds() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let runs = 12;
    let mut checks = 0;
    let mut within_two = 0;
    for run in 0..runs {
        let session = Session::builder().write_profile(false).start().unwrap();
        let profile = three_functions(session);
        assert_eq!(profile.sampling.mean_bytes, 512 << 10);
        assert_eq!(profile.sampling.unwinder, "frame-pointers");
        assert!(profile.sampling.samples > 0);
        for (function, (count, size)) in [
            ("few_large", LARGE),
            ("many_small", SMALL),
            ("some_medium", MEDIUM),
        ] {
            let truth = (count * size) as f64;
            let sites = sites_of(&profile, function);
            assert!(!sites.is_empty(), "run {run}: no site in {function}");
            for (what, (estimate, error)) in [
                (
                    "allocated",
                    total(&sites, |s| (s.alloc_bytes, s.alloc_bytes_error)),
                ),
                (
                    "live at the peak",
                    total(&sites, |s| (s.peak_bytes, s.peak_bytes_error)),
                ),
            ] {
                checks += 1;
                let off = (estimate - truth).abs();
                // Four standard errors: a true estimate lands outside once in 16,000.
                assert!(
                    off <= 4.0 * error + 1.0,
                    "run {run}, {function}, {what}: {estimate} vs {truth} ± {error}"
                );
                if off <= 2.0 * error + 1.0 {
                    within_two += 1;
                }
                // The stated error is the one sampling theory gives: about √(R · bytes).
                if function != "few_large" {
                    let theory = ((512 << 10) as f64 * truth).sqrt();
                    assert!(
                        error > theory * 0.3 && error < theory * 3.0,
                        "run {run}, {function}, {what}: error {error}, theory {theory}"
                    );
                }
            }
        }
    }
    // About 95 % land within two standard errors; far fewer means the error is understated.
    assert!(
        within_two * 100 >= checks * 80,
        "{within_two} of {checks} within two standard errors"
    );
}

#[test]
fn every_allocation_of_four_r_or_more_has_its_stack() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let r = 64 << 10;
    let session = Session::builder()
        .write_profile(false)
        .sample_bytes(r)
        .start()
        .unwrap();
    let profile = three_functions(session);
    let large = sites_of(&profile, "few_large");
    let samples: u64 = large.iter().map(|s| s.samples).sum();
    assert_eq!(samples, LARGE.0 as u64, "{large:?}");
    let bytes: u64 = large.iter().map(|s| s.alloc_bytes).sum();
    assert_eq!(bytes, (LARGE.0 * LARGE.1) as u64);
    assert!(large.iter().all(|s| s.alloc_bytes_error == 0));
    // The large blocks are live at the peak, and their row names their site.
    let site = large[0].id;
    assert_eq!(large[0].peak_bytes, large[0].alloc_bytes);
    let row = profile
        .peak_breakdown
        .iter()
        .find(|row| row.top_sites.contains(&site));
    assert!(row.is_some(), "{:?}", profile.peak_breakdown);
    // The site is named by file and line, innermost frame first, without highwater's frames.
    let frames = &large[0].frames;
    let names: Vec<String> = frames
        .iter()
        .map(|f| format!("{:?} {:?}:{:?}", f.function, f.file, f.line))
        .collect();
    assert!(
        frames.iter().all(|frame| !frame
            .function
            .as_deref()
            .unwrap_or_default()
            .contains("highwater::")),
        "{names:#?}"
    );
    let ours = frames
        .iter()
        .find(|frame| frame.function.as_deref() == Some("call_sites_by_sampling::few_large"))
        .unwrap();
    assert!(ours
        .file
        .as_deref()
        .unwrap_or_default()
        .ends_with("call_sites_by_sampling.rs"));
    assert!(ours.line.is_some());
}

/// Checks the exact figures a run with every allocation sampled must give.
fn assert_exact(profile: &Profile) {
    assert_eq!(profile.sampling.mean_bytes, 1);
    for (function, (count, size)) in [("many_small", SMALL), ("some_medium", MEDIUM)] {
        let sites = sites_of(profile, function);
        let allocs: u64 = sites.iter().map(|s| s.alloc_count).sum();
        let bytes: u64 = sites.iter().map(|s| s.alloc_bytes).sum();
        let peak: u64 = sites.iter().map(|s| s.peak_bytes).sum();
        assert_eq!(allocs, count as u64, "{function}");
        assert_eq!(bytes, (count * size) as u64, "{function}");
        assert_eq!(peak, (count * size) as u64, "{function}");
        assert!(sites
            .iter()
            .all(|s| s.alloc_bytes_error == 0 && s.peak_bytes_error == 0));
    }
}

#[test]
fn sampling_every_allocation_counts_each_site_exactly() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let session = Session::builder()
        .write_profile(false)
        .sample_bytes(1)
        .start()
        .unwrap();
    assert_exact(&three_functions(session));
}

#[test]
fn the_environment_variable_wins_over_the_builder() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::env::set_var("HIGHWATER_SAMPLE_BYTES", "1");
    let session = Session::builder()
        .write_profile(false)
        .sample_bytes(0)
        .start();
    std::env::remove_var("HIGHWATER_SAMPLE_BYTES");
    assert_exact(&three_functions(session.unwrap()));
}

#[test]
fn sampling_off_records_no_site() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let session = Session::builder()
        .write_profile(false)
        .sample_bytes(0)
        .start()
        .unwrap();
    let profile = three_functions(session);
    assert!(profile.sites.is_empty());
    assert_eq!(profile.sampling.samples, 0);
    assert_eq!(profile.sampling.mean_bytes, 0);
    assert_eq!(profile.sampling.unwinder, "");
    assert!(profile
        .peak_breakdown
        .iter()
        .all(|row| row.top_sites.is_empty()));
    // The byte figures are the same exact ones with sampling off.
    assert!(profile.summary.peak_bytes >= (LARGE.0 * LARGE.1 + SMALL.0 * SMALL.1) as u64);
}

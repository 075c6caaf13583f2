//! Call sites by sampling bytes (issue 12, items 1 and 5): three functions allocate known byte
//! totals, and the profile's per-site estimates land within the error it states, run after
//! run; every allocation of at least 4R has its stack; `R = 1` (also through
//! `HIGHWATER_SAMPLE_BYTES`) counts every allocation exactly; `R = 0` records no site.

use std::sync::Mutex;

use highwater::profile::CallSite;
use highwater::{Profile, Session};

use highwater_testkit::child::isolated;

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
    let name = format!("{}::{function}", module_path!());
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

/// The standard error sampling theory gives the estimate of `count` allocations of `size`
/// bytes at mean `r`: each is sampled with probability `p = 1 - e^(-size/r)` and then stands
/// for `size / p` bytes, so the variance is `count · size² (1 - p) / p`. The profile's stated
/// error estimates it from the samples (`√Σ size² (1 - p) / p²`). From `4r` on every
/// allocation is sampled: exact.
fn theory_error(count: usize, size: usize, r: u64) -> f64 {
    if size as u64 >= 4 * r {
        return 0.0;
    }
    let size = size as f64;
    let p = -(-size / r as f64).exp_m1();
    (count as f64 * size * size * (1.0 - p) / p).sqrt()
}

/// Runs of the estimate test.
const RUNS: usize = 12;

/// The bounds below hold for a correct sampler except with the probabilities given, computed
/// from the exact binomial distribution of a site's sample count (`many_small`: 100,000
/// allocations sampled with p = 1.83e-4, 18.3 samples a run, σ = 23 % of its bytes;
/// `some_medium`: 1,500 with p = 0.0232, 34.7 samples, σ = 17 %). They are measured against
/// σ, the error of the true totals, not the stated error of one run: that is computed from the
/// run's own samples, so it shrinks with a low count, and a bound of 4 stated errors failed
/// for 7 `many_small` samples or fewer (2.4e-3 a run, one invocation of this test in 29; the
/// failure seen in CI was 5 samples, 2,621,680 B ± 1,172,344 B, which is 3.1 σ off and
/// happens to a correct sampler in 2.6e-4 of runs). Per invocation, the chance that a correct
/// sampler fails any of them is below 2.4e-5.
#[test]
fn per_site_estimates_fall_within_their_stated_error_across_seeds() {
    isolated(
        "per_site_estimates_fall_within_their_stated_error_across_seeds",
        || {
            let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
            let r = 512 << 10;
            let mut checks = 0;
            let mut within_two = 0;
            let mut pooled = [0.0f64; 3];
            let sites_known = [
                ("few_large", LARGE),
                ("many_small", SMALL),
                ("some_medium", MEDIUM),
            ];
            for run in 0..RUNS {
                let session = Session::builder().write_profile(false).start().unwrap();
                let profile = three_functions(session);
                assert_eq!(profile.sampling.mean_bytes, r);
                assert_eq!(profile.sampling.unwinder, "frame-pointers, eh-frame");
                assert!(profile.sampling.samples > 0);
                // Each sample's stack was walked by one of the two, and each site says which.
                let by_unwinder = &profile.sampling.samples_by_unwinder;
                assert_eq!(by_unwinder.values().sum::<u64>(), profile.sampling.samples);
                for site in &profile.sites {
                    assert_eq!(site.samples_by_unwinder.values().sum::<u64>(), site.samples);
                }
                assert_eq!(profile.sampling.stacks_without_hook, 0);
                for (index, &(function, (count, size))) in sites_known.iter().enumerate() {
                    let truth = (count * size) as f64;
                    let sigma = theory_error(count, size, r);
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
                        // Six σ: 2.5e-7 a run for `many_small`, 6.3e-8 for `some_medium`
                        // (`few_large` is always sampled: exact, σ = 0).
                        assert!(
                            off <= 6.0 * sigma + 1.0,
                            "run {run}, {function}, {what}: {estimate} vs {truth} (σ {sigma}), \
                     stated error {error}"
                        );
                        if off <= 2.0 * error + 1.0 {
                            within_two += 1;
                        }
                        // The stated error is the one sampling theory gives, as well as a run's
                        // samples can tell: its ratio to σ is √(samples / mean samples), outside
                        // (0.3, 3) in 2.2e-7 of runs for `many_small`, 4.4e-12 for `some_medium`.
                        if sigma > 0.0 {
                            assert!(
                                error > sigma * 0.3 && error < sigma * 3.0,
                                "run {run}, {function}, {what}: error {error}, σ {sigma}"
                            );
                        } else {
                            assert_eq!(error, 0.0, "run {run}, {function}, {what}");
                        }
                    }
                    pooled[index] += total(&sites, |s| (s.alloc_bytes, 0)).0 / RUNS as f64;
                }
            }
            // Unbiased: the mean over the runs is within 5 of its σ (σ / √12) of the truth. A correct
            // sampler misses by more in 1.1e-6 of invocations for `many_small`, 8.6e-7 for
            // `some_medium`; a bias of more than 34 % of `many_small`'s bytes (24 % of
            // `some_medium`'s) cannot pass.
            for (&(function, (count, size)), mean) in sites_known.iter().zip(pooled) {
                let truth = (count * size) as f64;
                let sigma = theory_error(count, size, r) / (RUNS as f64).sqrt();
                assert!(
                    (mean - truth).abs() <= 5.0 * sigma + 1.0,
                    "{function}: mean of {RUNS} runs {mean} vs {truth} (σ {sigma})"
                );
            }
            // A true estimate is within two of its stated errors about 95 % of the time (94.5 % for
            // `many_small`, 95.4 % for `some_medium`, always for `few_large`); under 80 % of the checks
            // happens to a correct sampler in 1.5e-5 of invocations, and means the error is understated.
            assert!(
                within_two * 100 >= checks * 80,
                "{within_two} of {checks} within two standard errors"
            );
        },
    );
}

#[test]
fn every_allocation_of_four_r_or_more_has_its_stack() {
    isolated("every_allocation_of_four_r_or_more_has_its_stack", || {
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
        let few_large = format!("{}::few_large", module_path!());
        let ours = frames
            .iter()
            .find(|frame| frame.function.as_deref() == Some(few_large.as_str()))
            .unwrap();
        assert!(ours
            .file
            .as_deref()
            .unwrap_or_default()
            .ends_with("call_sites_by_sampling.rs"));
        assert!(ours.line.is_some());
    });
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
    isolated("sampling_every_allocation_counts_each_site_exactly", || {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let session = Session::builder()
            .write_profile(false)
            .sample_bytes(1)
            .start()
            .unwrap();
        assert_exact(&three_functions(session));
    });
}

#[test]
fn the_environment_variable_wins_over_the_builder() {
    isolated("the_environment_variable_wins_over_the_builder", || {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var("HIGHWATER_SAMPLE_BYTES", "1");
        let session = Session::builder()
            .write_profile(false)
            .sample_bytes(0)
            .start();
        std::env::remove_var("HIGHWATER_SAMPLE_BYTES");
        assert_exact(&three_functions(session.unwrap()));
    });
}

#[test]
fn sampling_off_records_no_site() {
    isolated("sampling_off_records_no_site", || {
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
    });
}

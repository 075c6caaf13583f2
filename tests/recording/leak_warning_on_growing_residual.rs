//! A loop that keeps something every iteration gets a leak warning naming its top-level span,
//! and per-iteration residuals that grow by what it keeps.

use highwater::profile::Warning;
use highwater::{Session, Step};

use highwater_testkit::child::isolated;

const KEPT: usize = 48 * 1024;

#[test]
fn growing_residual_warns_and_names_the_iteration_span() {
    isolated(
        "growing_residual_warns_and_names_the_iteration_span",
        || {
            let session = Session::builder().write_profile(false).start().unwrap();
            let mut leaked: Vec<Vec<u8>> = Vec::with_capacity(64);
            {
                let _setup = highwater::profile!("setup");
            }
            for _ in 0..24 {
                let _step = highwater::profile!("train_step");
                let activation = {
                    let _fwd = highwater::profile!("forward", Step::Forward);
                    vec![7u8; KEPT]
                };
                {
                    let _bwd = highwater::profile!("backward", Step::Backward);
                    let gradient = vec![1u8; 2 * KEPT];
                    drop(gradient);
                }
                leaked.push(activation);
            }
            let profile = session.finish().unwrap();
            drop(leaked);

            assert_eq!(profile.iterations.len(), 24, "{:#?}", profile.iterations);
            assert!(profile.iterations.iter().all(|i| i.span == "train_step"));
            // Residuals count every thread's live bytes; allow a little for the test harness's own.
            for iteration in &profile.iterations[1..] {
                assert!(
                    (KEPT as i64..KEPT as i64 + 1024).contains(&iteration.delta_bytes),
                    "each iteration keeps one activation: {:#?}",
                    profile.iterations
                );
            }
            let leak = profile
                .warnings
                .iter()
                .find_map(|w| match w {
                    Warning::GrowingResidual {
                        span,
                        window,
                        grew,
                        total_bytes,
                        iterations,
                        run_growth_bytes,
                        ..
                    } => Some((
                        (span.as_str(), *window, *grew, *total_bytes),
                        (*iterations, *run_growth_bytes, w.to_string()),
                    )),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("no leak warning in {:#?}", profile.warnings));
            // The rule looks at the last 16 iterations; every one of them kept an activation.
            let ((span, window, grew, total_bytes), (iterations, run_growth, sentence)) =
                leak.clone();
            let leak = leak.0;
            assert_eq!((span, window, grew), ("train_step", 16, 16));
            assert!(
                (16 * KEPT as i64..16 * (KEPT as i64 + 1024)).contains(&total_bytes),
                "{leak:?}"
            );
            // And what the whole run kept, in human units, not only the last 16 iterations'.
            let (first, last) = (&profile.iterations[0], &profile.iterations[23]);
            assert_eq!(iterations, 24);
            assert_eq!(run_growth, last.live_bytes as i64 - first.live_bytes as i64);
            assert!(run_growth >= 23 * KEPT as i64, "{run_growth}");
            assert!(!sentence.contains(" bytes"), "raw bytes in {sentence}");
            assert!(
                sentence.contains(&format!(
                    "{} over all 24, from the first iteration's end",
                    highwater::profile::units::format_bytes_delta(run_growth)
                )),
                "{sentence}"
            );
        },
    );
}

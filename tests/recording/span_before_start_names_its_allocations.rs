//! A span opened before `Session::start` names the allocations made inside it once recording
//! starts (it used to give only its category: its allocations showed as outside every span).

use std::hint::black_box;

use highwater::{Category, Session, Step};

use highwater_testkit::child::isolated;

const MIB: usize = 1 << 20;

#[test]
fn a_span_opened_before_the_session_names_what_runs_inside_it() {
    isolated(
        "a_span_opened_before_the_session_names_what_runs_inside_it",
        || {
            let training = highwater::profile!("training_loop", Step::Forward);
            let session = Session::builder().write_profile(false).start().unwrap();
            let block = black_box(vec![1u8; 2 * MIB]);
            let inner = {
                let _inner = highwater::profile!("inner");
                black_box(vec![2u8; MIB])
            };
            let profile = session.snapshot().unwrap();
            drop(training);
            drop((block, inner));
            session.finish().unwrap();
            let row = profile
                .peak_breakdown
                .iter()
                .find(|row| row.bytes >= 2 * MIB as u64)
                .unwrap_or_else(|| panic!("no 2 MiB row: {:#?}", profile.peak_breakdown));
            assert_eq!(
                row.span_path, "training_loop",
                "{:#?}",
                profile.peak_breakdown
            );
            assert_eq!(row.category, Category::Activation);
            assert!(
                profile.spans.iter().any(|s| s.name == "training_loop"),
                "{:#?}",
                profile.spans
            );
            assert!(profile.spans.iter().any(|s| s.name == "inner"));
        },
    );
}

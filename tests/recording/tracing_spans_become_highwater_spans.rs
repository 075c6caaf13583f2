//! `TracingLayer`: entered tracing spans become highwater spans with the same names and
//! nesting; `step = "…"` and `category = "…"` fields set the label, so allocations inside are
//! categorised; exits out of order do not panic.

use highwater::{Category, Session, Step, TracingLayer};
use tracing_subscriber::layer::SubscriberExt;

use highwater_testkit::child::isolated;

const KIB: usize = 1024;

#[test]
fn tracing_spans_name_and_categorise_allocations() {
    isolated("tracing_spans_name_and_categorise_allocations", || {
        let subscriber = tracing_subscriber::registry().with(TracingLayer::new());
        let session = Session::builder().write_profile(false).start().unwrap();
        let kept = tracing::subscriber::with_default(subscriber, || {
            let mut kept = Vec::new();
            for _ in 0..3 {
                let step = tracing::info_span!("train_step", n = 1);
                let _step = step.enter();
                {
                    let forward = tracing::info_span!("forward", step = "forward");
                    let _forward = forward.enter();
                    kept.push(vec![1u8; 64 * KIB]);
                }
                {
                    let backward = tracing::info_span!("backward", step = ?Step::Backward);
                    let _backward = backward.enter();
                    kept.push(vec![2u8; 32 * KIB]);
                }
            }
            {
                let load = tracing::info_span!("load", category = "parameter", step = "forward");
                let _load = load.enter();
                kept.push(vec![3u8; 16 * KIB]);
            }
            // Exits out of order: the outer guard is dropped while the inner span is entered.
            let outer = tracing::info_span!("outer");
            let inner = tracing::info_span!("inner");
            let outer_guard = outer.enter();
            let inner_guard = inner.enter();
            drop(outer_guard);
            drop(inner_guard);
            kept
        });
        let profile = session.finish().unwrap();
        drop(kept);

        let span = |path: &str| {
            profile
                .spans
                .iter()
                .find(|s| profile.span_path(s.id) == path)
                .unwrap_or_else(|| panic!("no span {path}: {:#?}", profile.spans))
        };
        let forward = span("train_step/forward");
        assert_eq!(forward.calls, 3);
        assert_eq!(forward.step, Some(Step::Forward));
        assert!(forward.residual_bytes >= (3 * 64 * KIB) as u64);
        let backward = span("train_step/backward");
        assert_eq!(backward.step, Some(Step::Backward));
        assert_eq!(span("train_step").calls, 3);
        assert_eq!(span("load").category, Some(Category::Parameter));
        assert_eq!(span("outer").calls, 1);

        let in_category = |category: Category| {
            profile
                .peak_breakdown
                .iter()
                .filter(|r| r.category == category)
                .map(|r| r.bytes)
                .sum::<u64>()
        };
        assert!(in_category(Category::Activation) >= (3 * 64 * KIB) as u64);
        assert!(in_category(Category::Gradient) >= (3 * 32 * KIB) as u64);
        let params = in_category(Category::Parameter);
        assert!(
            (16 * KIB as u64..32 * KIB as u64).contains(&params),
            "category wins over step: {params}"
        );
    });
}

#[test]
fn layer_without_a_session_records_nothing_and_does_not_panic() {
    isolated(
        "layer_without_a_session_records_nothing_and_does_not_panic",
        || {
            let subscriber = tracing_subscriber::registry().with(TracingLayer::new());
            tracing::subscriber::with_default(subscriber, || {
                let span = tracing::info_span!("idle", step = "optimizer");
                let _entered = span.enter();
                let _ = vec![0u8; 1024];
            });
        },
    );
}

//! A loop whose iterations free what they allocate has flat residuals and no leak warning,
//! even when each iteration allocates a lot.

use highwater::profile::Warning;
use highwater::{Session, Step};

use highwater_testkit::child::isolated;

#[test]
fn steady_loop_has_flat_residuals_and_no_leak_warning() {
    isolated("steady_loop_has_flat_residuals_and_no_leak_warning", || {
        let session = Session::builder().write_profile(false).start().unwrap();
        let weights = vec![0.5f32; 64 * 1024];
        for _ in 0..24 {
            let _step = highwater::profile!("train_step");
            let activations = {
                let _fwd = highwater::profile!("forward", Step::Forward);
                weights.iter().map(|w| w * 2.0).collect::<Vec<f32>>()
            };
            let _bwd = highwater::profile!("backward", Step::Backward);
            let gradients: Vec<f32> = activations.iter().map(|a| a - 1.0).collect();
            drop((activations, gradients));
        }
        let profile = session.finish().unwrap();
        drop(weights);

        assert_eq!(profile.iterations.len(), 24);
        // Residuals count every thread's live bytes; allow a little for the test harness's own.
        assert!(
            profile
                .iterations
                .iter()
                .all(|i| i.delta_bytes.abs() < 1024),
            "{:#?}",
            profile.iterations
        );
        assert!(
            !profile
                .warnings
                .iter()
                .any(|w| matches!(w, Warning::GrowingResidual { .. })),
            "{:#?}",
            profile.warnings
        );
    });
}

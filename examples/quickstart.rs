//! The smallest useful highwater run: a pretend training loop with forward, backward and
//! optimizer spans, and a profile written at the end.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```

use highwater::{Category, Session, Step};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// A stand-in for a layer's weights and state: plain `f32` buffers.
fn buffer(floats: usize) -> Vec<f32> {
    vec![0.5; floats]
}

fn main() -> Result<(), highwater::Error> {
    let session = Session::builder()
        .output("highwater-profile.json")
        .start()?;

    let weights = {
        let _load = highwater::profile!("load_weights", Category::Parameter);
        (0..4).map(|_| buffer(256 * 1024)).collect::<Vec<_>>()
    };
    let mut moments: Vec<Vec<f32>> = Vec::new();
    for _step in 0..20 {
        let _step_span = highwater::profile!("train_step");
        let activations = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            weights
                .iter()
                .map(|w| buffer(w.len() * 2))
                .collect::<Vec<_>>()
        };
        let gradients = {
            let _bwd = highwater::profile!("backward", Step::Backward);
            let grads = weights.iter().map(|w| buffer(w.len())).collect::<Vec<_>>();
            drop(activations);
            grads
        };
        {
            let _opt = highwater::profile!("optimizer", Step::Optimizer);
            if moments.is_empty() {
                moments = weights.iter().map(|w| buffer(w.len() * 2)).collect();
            }
            drop(gradients);
        }
    }

    let profile = session.finish()?;
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!(
        "peak {:.1} MiB at {:.1} ms on {}",
        mib(profile.summary.peak_bytes),
        profile.summary.peak_timestamp_ns as f64 / 1e6,
        profile.summary.peak_device
    );
    for (category, bytes) in &profile.summary.peak_by_category {
        println!("  {category:<10} {:>8.1} MiB", mib(*bytes));
    }
    println!(
        "{} allocations, {} frees, {} dropped events; profile written to highwater-profile.json",
        profile.summary.alloc_count, profile.summary.free_count, profile.summary.dropped_events
    );
    drop(moments);
    Ok(())
}

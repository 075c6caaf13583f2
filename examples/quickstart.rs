//! The smallest useful highwater run: a pretend training loop with forward, backward and
//! optimizer spans, and a profile written at the end, with the HTML report beside it.
//!
//! It writes `target/highwater/quickstart.json` and `quickstart.html` (under the repository's
//! ignored `target/`, so the work tree stays clean); `HIGHWATER_OUT` sends them elsewhere.
//!
//! ```text
//! cargo run --release --example quickstart
//! ```

use std::path::PathBuf;

use highwater::profile::units::{format_bytes, format_count, format_duration_ns};
use highwater::{Category, Session, Step};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// A stand-in for a layer's weights and state: plain `f32` buffers.
fn buffer(floats: usize) -> Vec<f32> {
    vec![0.5; floats]
}

fn main() -> Result<(), highwater::Error> {
    // The profile goes to $HIGHWATER_OUT, else where the code says: its own name, under the
    // repository's `target/highwater/`, so it never replaces another example's profile.
    let out = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/highwater/quickstart.json"
    ));
    let session = Session::builder().output(&out).start()?;

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
    let summary = &profile.summary;
    println!(
        "peak {} at {} on {}",
        format_bytes(summary.peak_bytes),
        format_duration_ns(summary.peak_timestamp_ns),
        summary.peak_device
    );
    for (category, bytes) in &summary.peak_by_category {
        println!("  {category:<11}{:>12}", format_bytes(*bytes));
    }
    // An explicit HIGHWATER_OUT overrides the builder's `.output()` (the project's rule).
    let written_to = std::env::var_os("HIGHWATER_OUT")
        .filter(|path| !path.is_empty())
        .map_or(out, PathBuf::from);
    println!(
        "{} allocations, {} frees, {} events dropped",
        format_count(summary.alloc_count),
        format_count(summary.free_count),
        format_count(summary.dropped_events),
    );
    println!("profile: {}", written_to.display());
    if std::env::var("HIGHWATER_HTML")
        .map_or(true, |v| !matches!(v.trim(), "0" | "off" | "false" | "no"))
    {
        println!(
            "report: {} (open it in a browser)",
            highwater_export::html::path_beside(&written_to).display()
        );
    }
    drop(moments);
    Ok(())
}

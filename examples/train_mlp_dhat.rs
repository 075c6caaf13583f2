//! The training steps of `train_mlp`, with dhat's heap profiler as the global allocator: what
//! the same steps cost under the peer a user would otherwise pick (BENCHMARKS.md §2).
//!
//! ```text
//! cargo run --release --features candle --example train_mlp_dhat -- --steps 20
//! ```

use highwater_testkit::mlp;

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use candle_core::{DType, Device};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use mlp::{synthetic_data, Mlp, BATCH, BATCHES};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn steps_from_args() -> Result<usize> {
    let mut args = std::env::args().skip(1);
    let mut steps = 20;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--steps" => {
                let value = args.next().context("--steps needs a number")?;
                steps = value
                    .parse()
                    .with_context(|| format!("--steps {value:?} is not a number"))?;
            }
            other => bail!("unknown argument {other:?} (expected --steps N)"),
        }
    }
    if steps == 0 {
        bail!("--steps must be at least 1");
    }
    Ok(steps)
}

fn main() -> Result<()> {
    let steps = steps_from_args()?;
    let report = std::env::temp_dir().join(format!("highwater-dhat-{}.json", std::process::id()));
    let profiler = dhat::Profiler::builder().file_name(&report).build();

    let device = Device::Cpu;
    let (x, labels) = synthetic_data(&device)?;
    let varmap = VarMap::new();
    let model = Mlp::new(&VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    let mut optimizer = AdamW::new(
        varmap.all_vars(),
        ParamsAdamW {
            lr: 1e-3,
            ..ParamsAdamW::default()
        },
    )?;
    let mut times: Vec<Duration> = Vec::with_capacity(steps);
    for step in 0..steps {
        let start = Instant::now();
        let batch = step % BATCHES;
        let xb = x.narrow(0, batch * BATCH, BATCH)?;
        let yb = labels.narrow(0, batch * BATCH, BATCH)?;
        let (logits, _) = model.forward(&xb)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &yb)?;
        let grads = loss.backward()?;
        optimizer.step(&grads)?;
        drop((loss, grads));
        times.push(start.elapsed());
    }
    drop(profiler);
    let _ = std::fs::remove_file(&report);
    let mean = times.iter().sum::<Duration>() / steps as u32;
    times.sort();
    let median = times[steps / 2];
    println!(
        "step time mean {:.2} ms, median {:.2} ms over {steps} steps (dhat heap profiler)",
        mean.as_secs_f64() * 1e3,
        median.as_secs_f64() * 1e3
    );
    Ok(())
}

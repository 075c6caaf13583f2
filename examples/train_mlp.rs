//! Train a real candle MLP under highwater and say what the memory was.
//!
//! A 784→512→512→10 multilayer perceptron, batch 128, AdamW, on synthetic data generated here
//! (no downloads). Each step is a top-level `train_step` span with `forward`, `backward` and
//! `optimizer` spans inside; every matmul, bias add, ReLU and the loss run as recorded ops, so
//! the live-at-peak rows name the op and the tensor shape. At the end the profile is written
//! and summarised.
//!
//! ```text
//! cargo run --release --features candle --example train_mlp
//! cargo run --release --features candle --example train_mlp -- --leak        # keep one activation per step
//! cargo run --release --features candle --example train_mlp -- --steps 100
//! HIGHWATER=off cargo run --release --features candle --example train_mlp   # same run, not recorded
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{AdamW, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use highwater::report::{format_bytes, format_bytes_delta, format_shape};
use highwater::{Category, PeakRow, Profile, Session, Step};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// Layer widths, input first.
const WIDTHS: [usize; 4] = [784, 512, 512, 10];
const BATCH: usize = 128;
/// Batches in the synthetic data set; steps cycle through them.
const BATCHES: usize = 8;
/// Op names per layer: matmul, bias add, activation.
const OPS: [[&str; 3]; 3] = [
    ["fc1.matmul", "fc1.bias", "fc1.relu"],
    ["fc2.matmul", "fc2.bias", "fc2.relu"],
    ["fc3.matmul", "fc3.bias", "fc3.relu"],
];

struct Args {
    steps: usize,
    leak: bool,
    out: PathBuf,
    /// Timing mode: alternate recorded and unrecorded blocks of steps in one process.
    ab: bool,
}

/// Steps per block in `--ab` mode.
const AB_BLOCK: usize = 10;

impl Args {
    fn parse() -> Result<Args> {
        let mut args = Args {
            steps: 200,
            leak: false,
            out: PathBuf::from("highwater-profile.json"),
            ab: false,
        };
        let mut argv = std::env::args().skip(1);
        while let Some(arg) = argv.next() {
            match arg.as_str() {
                "--steps" => {
                    let value = argv.next().context("--steps needs a number")?;
                    args.steps = value
                        .parse()
                        .with_context(|| format!("--steps {value}: not a number"))?;
                }
                "--leak" => args.leak = true,
                "--ab" => args.ab = true,
                "--out" => args.out = argv.next().context("--out needs a path")?.into(),
                "-h" | "--help" => {
                    println!("usage: train_mlp [--steps N] [--leak] [--out PATH] [--ab]");
                    println!(
                        "  --ab  timing only: blocks of {AB_BLOCK} steps alternate recorded and \
                         unrecorded (on, off, off, on, …) in one process; no profile"
                    );
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?} (try --help)"),
            }
        }
        if args.steps == 0 {
            bail!("--steps must be at least 1");
        }
        Ok(args)
    }
}

struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(vb: &VarBuilder) -> candle_core::Result<Mlp> {
        let layers = (0..WIDTHS.len() - 1)
            .map(|i| candle_nn::linear(WIDTHS[i], WIDTHS[i + 1], vb.pp(format!("fc{}", i + 1))))
            .collect::<candle_core::Result<_>>()?;
        Ok(Mlp { layers })
    }

    /// Logits, and the first hidden activation (what `--leak` keeps).
    fn forward(&self, x: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        let mut h = x.clone();
        let mut first_hidden = None;
        let last = self.layers.len() - 1;
        for (i, layer) in self.layers.iter().enumerate() {
            let [matmul, bias_add, relu] = OPS[i];
            let w = layer.weight();
            let z = highwater::candle::op(matmul, &[&h, w], || h.matmul(&w.t()?))?;
            h = match layer.bias() {
                Some(b) => highwater::candle::op(bias_add, &[&z, b], || z.broadcast_add(b))?,
                None => z,
            };
            if i < last {
                h = highwater::candle::op(relu, &[&h], || h.relu())?;
                first_hidden.get_or_insert_with(|| h.clone());
            }
        }
        let first_hidden = first_hidden.unwrap_or_else(|| h.clone());
        Ok((h, first_hidden))
    }
}

/// Inputs uniform in [-1, 1), labels from a fixed random linear "teacher", so the loss has
/// something to learn. Seeded, so every run trains on the same data.
fn synthetic_data(device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                // xorshift64*: plenty for synthetic data.
                state ^= state >> 12;
                state ^= state << 25;
                state ^= state >> 27;
                let bits = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                bits as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    };
    let (n, d, k) = (BATCHES * BATCH, WIDTHS[0], WIDTHS[3]);
    let x = Tensor::from_vec(uniform(n * d), (n, d), device)?;
    let teacher = Tensor::from_vec(uniform(d * k), (d, k), device)?;
    let labels = x.matmul(&teacher)?.argmax(D::Minus1)?;
    Ok((x, labels))
}

struct Run {
    step_times: Vec<Duration>,
    /// Per step: whether a session recorded it (`--ab` mode).
    step_recorded: Vec<bool>,
    first_loss: f32,
    last_loss: f32,
    params: usize,
}

fn train(args: &Args) -> Result<Run> {
    let device = Device::Cpu;
    let (x, labels) = {
        let _data = highwater::profile!("load_data");
        synthetic_data(&device)?
    };
    let varmap = VarMap::new();
    let model = {
        let _build = highwater::profile!("build_model");
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        Mlp::new(&vb)?
    };
    highwater::candle::mark_parameters(&varmap);
    let params = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    {
        // gemm keeps a per-thread packing buffer (L2-cache sized) from its first use on; let it
        // be allocated here, as what it is, rather than in the first step's backward.
        let _warmup = highwater::profile!("runtime_warmup", Category::Other);
        let (logits, _) = model.forward(&x.narrow(0, 0, BATCH)?)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &labels.narrow(0, 0, BATCH)?)?;
        drop(loss.backward()?);
    }
    let mut optimizer = {
        // candle-nn's AdamW allocates both moment buffers here, one pair per variable.
        let _init = highwater::profile!("optimizer_init", Step::Optimizer);
        AdamW::new(
            varmap.all_vars(),
            ParamsAdamW {
                lr: 1e-3,
                ..ParamsAdamW::default()
            },
        )?
    };

    let mut leaked = Vec::new();
    let mut step_times = Vec::with_capacity(args.steps);
    let mut step_recorded = Vec::with_capacity(args.steps);
    let mut ab_session: Option<Session> = None;
    let (mut first_loss, mut last_loss) = (f32::NAN, f32::NAN);
    for step in 0..args.steps {
        if args.ab && step % AB_BLOCK == 0 {
            if let Some(session) = ab_session.take() {
                session.finish()?;
            }
            let block = step / AB_BLOCK;
            // on, off, off, on, on, off, …: each mode equally often early and late.
            if (block % 2 == 0) == (block / 2 % 2 == 0) {
                let session = Session::builder().write_profile(false).start()?;
                ab_session = Some(session).filter(Session::is_recording);
            }
        }
        step_recorded.push(ab_session.is_some());
        let start = Instant::now();
        let step_span = highwater::profile!("train_step");
        let batch = step % BATCHES;
        let xb = x.narrow(0, batch * BATCH, BATCH)?;
        let yb = labels.narrow(0, batch * BATCH, BATCH)?;
        let (loss, hidden) = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            let (logits, hidden) = model.forward(&xb)?;
            let loss = highwater::candle::op("cross_entropy", &[&logits], || {
                candle_nn::loss::cross_entropy(&logits, &yb)
            })?;
            (loss, hidden)
        };
        let grads = {
            let _bwd = highwater::profile!("backward", Step::Backward);
            loss.backward()?
        };
        {
            let _opt = highwater::profile!("optimizer", Step::Optimizer);
            optimizer.step(&grads)?;
        }
        let loss_value = loss.to_scalar::<f32>()?;
        if step == 0 {
            first_loss = loss_value;
        }
        last_loss = loss_value;
        if args.leak {
            // The bug --leak demonstrates: a "debug" copy of an activation kept every step.
            leaked.push(hidden.detach());
        }
        // Everything the step made goes before the step's span closes, so the span's residual
        // (and the per-iteration figure) shows only what outlives the step.
        drop((loss, grads, hidden));
        drop(step_span);
        step_times.push(start.elapsed());
    }
    drop(leaked);
    if let Some(session) = ab_session {
        session.finish()?;
    }
    Ok(Run {
        step_times,
        step_recorded,
        first_loss,
        last_loss,
        params,
    })
}

fn main() -> Result<()> {
    let args = Args::parse()?;
    if args.ab {
        return time_ab(&args);
    }
    let session = Session::builder().output(&args.out).start()?;
    let recording = session.is_recording();
    let run = train(&args)?;
    let profile = session.finish()?;

    let mut times: Vec<f64> = run
        .step_times
        .iter()
        .map(|t| t.as_secs_f64() * 1e3)
        .collect();
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "candle MLP {}, batch {BATCH}, AdamW, {} parameters; {} steps{}",
        WIDTHS.map(|w| w.to_string()).join("-"),
        run.params,
        args.steps,
        if args.leak { " with --leak" } else { "" },
    );
    println!(
        "loss {:.3} -> {:.3}; step time mean {mean:.2} ms, median {median:.2} ms (recording {})",
        run.first_loss,
        run.last_loss,
        if recording { "on" } else { "off" },
    );
    if recording {
        print_summary(&profile, &args.out);
    } else {
        println!("HIGHWATER=off: nothing recorded, no profile written");
    }
    Ok(())
}

/// `--ab`: mean step time of recorded vs unrecorded blocks, after one warm-up round.
fn time_ab(args: &Args) -> Result<()> {
    let run = train(args)?;
    let warmup = if args.steps >= 8 * AB_BLOCK {
        4 * AB_BLOCK
    } else {
        0
    };
    let mean = |recorded: bool| {
        let times: Vec<f64> = run
            .step_times
            .iter()
            .zip(&run.step_recorded)
            .skip(warmup)
            .filter(|(_, &r)| r == recorded)
            .map(|(t, _)| t.as_secs_f64() * 1e3)
            .collect();
        (
            times.iter().sum::<f64>() / times.len().max(1) as f64,
            times.len(),
        )
    };
    let (on, on_steps) = mean(true);
    let (off, off_steps) = mean(false);
    println!(
        "ab: recorded {on:.2} ms/step ({on_steps} steps), unrecorded {off:.2} ms/step \
         ({off_steps} steps), ratio {:.3} (first {warmup} steps skipped)",
        on / off
    );
    if on_steps == 0 {
        println!("ab: nothing was recorded (HIGHWATER=off?)");
    }
    Ok(())
}

fn print_rows<'a>(rows: impl Iterator<Item = &'a PeakRow>) {
    for row in rows {
        println!(
            "  {:>10}  {:<10} {:<13} {:<11} {:<4} x{:<3} {}",
            format_bytes(row.bytes),
            row.category.as_str(),
            row.op.as_deref().unwrap_or("-"),
            format_shape(row.shape.as_deref()),
            row.dtype.as_deref().unwrap_or("-"),
            row.count,
            if row.span_path.is_empty() {
                "(no span)"
            } else {
                &row.span_path
            },
        );
    }
}

fn print_summary(profile: &Profile, out: &std::path::Path) {
    let summary = &profile.summary;
    println!();
    println!(
        "peak {} at {:.1} ms on {}",
        format_bytes(summary.peak_bytes),
        summary.peak_timestamp_ns as f64 / 1e6,
        summary.peak_device
    );
    for (category, bytes) in &summary.peak_by_category {
        println!("  {category:<11}{:>12}", format_bytes(*bytes));
    }

    println!("\ntop spans by peak (residual = live bytes left at exit, per call):");
    let mut spans: Vec<_> = profile.spans.iter().collect();
    spans.sort_by_key(|s| std::cmp::Reverse((s.peak_bytes, s.calls)));
    for span in spans.iter().take(5) {
        println!(
            "  {:<28} calls {:>4}  peak {:>10}  residual/call {:>10}",
            span.path,
            span.calls,
            format_bytes(span.peak_bytes),
            format_bytes(span.residual_bytes / span.calls.max(1)),
        );
    }

    println!(
        "\nlive at peak (top 5 of {} rows):",
        profile.peak_breakdown.len()
    );
    print_rows(profile.peak_breakdown.iter().take(5));
    println!("live at peak, tensors named by an op (top 5):");
    print_rows(
        profile
            .peak_breakdown
            .iter()
            .filter(|row| row.op.is_some() && row.shape.is_some())
            .take(5),
    );

    if let (Some(first), Some(last)) = (profile.iterations.first(), profile.iterations.last()) {
        let n = profile.iterations.len();
        let growth = last.live_bytes as i64 - first.live_bytes as i64;
        println!(
            "\niterations: {n} of `{}`; live at end {} (first) -> {} (last), {} per iteration",
            first.span,
            format_bytes(first.live_bytes),
            format_bytes(last.live_bytes),
            format_bytes_delta(growth / (n as i64 - 1).max(1)),
        );
    }
    if profile.warnings.is_empty() {
        println!("warnings: none");
    }
    for warning in &profile.warnings {
        println!("warning: {warning}");
    }
    println!("profile: {}", out.display());
}

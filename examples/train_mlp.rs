//! Train a real candle MLP under highwater and say what the memory was.
//!
//! A 784→512→512→10 multilayer perceptron, batch 128, AdamW, on synthetic data generated here
//! (no downloads). Each step is a top-level `train_step` span with `forward`, `backward` and
//! `optimizer` spans inside; every matmul, bias add, ReLU and the loss run as recorded ops, so
//! the live-at-peak rows name the op and the tensor shape. At the end the profile is written
//! and summarised; each category at the peak is split into state (it outlived the span that
//! allocated it) and temporaries (freed before that span exited), which is how the optimizer's
//! bytes read as AdamW's two moments (2x the parameters) apart from its update's scratch, each
//! with the call sites that allocated it (from the profile's sampled stacks).
//!
//! Everything it writes lands under the repository's ignored `target/highwater/`: the profile
//! `train_mlp.json`, the HTML report `train_mlp.html` beside it, and the allocation log
//! `train_mlp.alloc` that `highwater simulate`, `fit` and `export --format torch` replay
//! (`--out` moves all three; `HIGHWATER_OUT` and `HIGHWATER_ALLOC_LOG` override them).
//!
//! ```text
//! cargo run --release --features candle --example train_mlp
//! cargo run --release --features candle --example train_mlp -- --leak        # keep one activation per step
//! cargo run --release --features candle --example train_mlp -- --steps 100
//! cargo run --release --features candle --example train_mlp -- --out runs/mlp.json  # and runs/mlp.alloc
//! HIGHWATER_OUT=runs/mlp.json cargo run --release --features candle --example train_mlp  # wins over --out
//! HIGHWATER=off cargo run --release --features candle --example train_mlp   # same run, not recorded
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use candle_core::{DType, Device};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use highwater::profile::units::{
    format_bytes, format_bytes_delta, format_duration_ns, format_shape,
};
use highwater::profile::PeakRow;
use highwater::{Category, Profile, Session, Step};
use highwater_export::vocabulary as words;

use highwater_testkit::cpu::{collector_thread_cpu, process_cpu_time};
use highwater_testkit::{mlp, peak_sites as sites};

use mlp::{synthetic_data, Mlp, BATCH, BATCHES, WIDTHS};
use sites::{places_holding, Part};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

struct Args {
    steps: usize,
    leak: bool,
    /// `--out`: where the code asks the profile to go (`HIGHWATER_OUT` overrides it).
    out: Option<PathBuf>,
    /// Timing mode: alternate recorded and unrecorded blocks of steps in one process.
    ab: bool,
    /// Timing mode: recorded blocks with checkpoints off, at the default interval and at 1 s.
    checkpoint_ab: bool,
    /// `--device cuda`: train on the first GPU (needs candle built with CUDA, and highwater's
    /// `cuda` feature to record the device memory).
    cuda: bool,
}

/// Where the profile goes unless `--out` or `HIGHWATER_OUT` says: the repository's ignored
/// `target/`, whatever the working directory.
const DEFAULT_OUT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/target/highwater/train_mlp.json"
);

/// Steps per block in `--checkpoint-ab` mode: over 10 s of steps, so a block at the default
/// interval writes a checkpoint too.
const CHECKPOINT_BLOCK: usize = 330;

/// The checkpoint intervals `--checkpoint-ab` compares (zero: off), by name.
const CHECKPOINT_MODES: [(&str, Duration); 3] = [
    ("off", Duration::ZERO),
    ("10 s", highwater::DEFAULT_CHECKPOINT_INTERVAL),
    ("1 s", Duration::from_secs(1)),
];

/// The order of the blocks, by index into [`CHECKPOINT_MODES`]: each mode as often early as
/// late.
const CHECKPOINT_ORDER: [usize; 6] = [0, 2, 1, 1, 2, 0];

/// Steps per block in `--ab` mode.
const AB_BLOCK: usize = 5;

impl Args {
    fn parse() -> Result<Args> {
        let mut args = Args {
            steps: 200,
            leak: false,
            out: None,
            ab: false,
            checkpoint_ab: false,
            cuda: false,
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
                "--checkpoint-ab" => args.checkpoint_ab = true,
                "--out" => args.out = Some(argv.next().context("--out needs a path")?.into()),
                "--device" => match argv.next().as_deref() {
                    Some("cpu") => args.cuda = false,
                    Some("cuda") => args.cuda = true,
                    other => bail!("--device takes cpu or cuda, not {other:?}"),
                },
                "-h" | "--help" => {
                    println!(
                        "usage: train_mlp [--steps N] [--leak] [--out PATH] [--device cpu|cuda] [--ab] \
                         [--checkpoint-ab]"
                    );
                    println!(
                        "  --device cuda  train on GPU 0 (candle built with CUDA; highwater's \
                         `cuda` feature records its memory); falls back to the CPU, saying why"
                    );
                    println!(
                        "  --out PATH  where the profile goes (default {DEFAULT_OUT}), with the \
                         report and the allocation log beside it; HIGHWATER_OUT overrides it"
                    );
                    println!(
                        "  --ab  timing only: blocks of {AB_BLOCK} steps alternate recorded and \
                         unrecorded (on, off, off, on, …) in one process; no profile"
                    );
                    println!(
                        "  --checkpoint-ab  timing only: recorded blocks of {CHECKPOINT_BLOCK} steps \
                         with checkpoints off, at the default interval and every 1 s (writing to \
                         --out), in one process"
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

struct Run {
    step_times: Vec<Duration>,
    /// CPU time of the whole process (every thread, the collector included) per step.
    step_cpu: Vec<Duration>,
    /// Per step: whether a session recorded it (`--ab` mode).
    step_recorded: Vec<bool>,
    /// Per step: the index into [`CHECKPOINT_MODES`] its session ran with (`--checkpoint-ab`).
    step_checkpoint_mode: Vec<usize>,
    /// CPU time of the collector threads of the `--ab` sessions, each read before its session
    /// finished (so without building the profile); `None` where Linux's per-thread figures
    /// cannot be read.
    collector_cpu: Option<Duration>,
    first_loss: f32,
    last_loss: f32,
    params: usize,
}

/// The device to train on: GPU 0 when asked for and there is one, else the CPU, saying why.
fn pick_device(cuda: bool) -> Device {
    if !cuda {
        return Device::Cpu;
    }
    match Device::new_cuda(0) {
        Ok(device) => device,
        Err(error) => {
            eprintln!("--device cuda: no CUDA device to train on ({error}); training on the CPU");
            Device::Cpu
        }
    }
}

fn train(args: &Args) -> Result<Run> {
    let device = pick_device(args.cuda);
    let (x, labels) = {
        let _data = highwater::profile!("load_data");
        synthetic_data(&device)?
    };
    let varmap = VarMap::new();
    let model = {
        // On a GPU the variables' storage is found by no tensor hook: what this span allocates
        // on the device is the parameters. On the CPU `mark_parameters` names them below.
        let _build = if device.is_cuda() {
            highwater::profile!("build_model", Category::Parameter)
        } else {
            highwater::profile!("build_model")
        };
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
    let mut step_cpu = Vec::with_capacity(args.steps);
    let mut step_recorded = Vec::with_capacity(args.steps);
    let mut step_checkpoint_mode = Vec::with_capacity(args.steps);
    let mut ab_session: Option<Session> = None;
    let mut collector_cpu = Some(Duration::ZERO);
    let (mut first_loss, mut last_loss) = (f32::NAN, f32::NAN);
    for step in 0..args.steps {
        if args.ab && step % AB_BLOCK == 0 {
            if let Some(session) = ab_session.take() {
                finish_ab_block(session, &mut collector_cpu)?;
            }
            let block = step / AB_BLOCK;
            // on, off, off, on, on, off, …: each mode equally often early and late.
            if block.is_multiple_of(2) == (block / 2).is_multiple_of(2) {
                let session = Session::builder().write_profile(false).start()?;
                ab_session = Some(session).filter(Session::is_recording);
            }
        }
        if args.checkpoint_ab && step % CHECKPOINT_BLOCK == 0 {
            if let Some(session) = ab_session.take() {
                session.finish()?;
            }
            let mode = CHECKPOINT_ORDER[(step / CHECKPOINT_BLOCK) % CHECKPOINT_ORDER.len()];
            let out = args.out.clone().unwrap_or_else(|| DEFAULT_OUT.into());
            let session = Session::builder()
                .output(out)
                .checkpoint_every(CHECKPOINT_MODES[mode].1)
                .start()?;
            ab_session = Some(session).filter(Session::is_recording);
        }
        if args.checkpoint_ab {
            let block = step / CHECKPOINT_BLOCK;
            step_checkpoint_mode.push(CHECKPOINT_ORDER[block % CHECKPOINT_ORDER.len()]);
        }
        step_recorded.push(ab_session.is_some());
        let start = Instant::now();
        let cpu_start = process_cpu_time();
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
        step_cpu.push(process_cpu_time().saturating_sub(cpu_start));
    }
    drop(leaked);
    if let Some(session) = ab_session {
        finish_ab_block(session, &mut collector_cpu)?;
    }
    Ok(Run {
        step_times,
        step_cpu,
        step_recorded,
        step_checkpoint_mode,
        collector_cpu,
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
    if args.checkpoint_ab {
        return time_checkpoints(&args);
    }
    // The project's precedence rule: an explicit HIGHWATER_OUT overrides what the code asked
    // for, so that is where the profile goes, and what to print.
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    let written_to = env_path("HIGHWATER_OUT").unwrap_or_else(|| out.clone());
    // The allocation log goes beside the profile, for `simulate`, `fit` and the torch export
    // (HIGHWATER_ALLOC_LOG wins); the HTML report goes there by default (HIGHWATER_HTML=0
    // leaves it out).
    let log = written_to.with_extension("alloc");
    let logged_to = env_path("HIGHWATER_ALLOC_LOG").unwrap_or_else(|| log.clone());
    let session = Session::builder().output(&out).alloc_log(&log).start()?;
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
        print_summary(&profile, &written_to, &logged_to);
    } else {
        println!("HIGHWATER=off: nothing recorded, no profile written");
    }
    Ok(())
}

/// The path in environment variable `name`, when it is set and not empty.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
}

/// Ends an `--ab` block's session, adding its collector's CPU time (read before the profile is
/// built) to `collector_cpu`; the total stays `None` once a reading was missing.
fn finish_ab_block(session: Session, collector_cpu: &mut Option<Duration>) -> Result<()> {
    *collector_cpu = collector_cpu
        .zip(collector_thread_cpu())
        .map(|(sum, this)| sum + this);
    session.finish()?;
    Ok(())
}

/// `--ab`: step time of recorded vs unrecorded blocks, after one warm-up round.
///
/// Blocks come in pairs (one recorded, one not, order alternating); the median of the pairs'
/// ratios is robust to bursts of load from other processes, the ratio of means is not.
fn time_ab(args: &Args) -> Result<()> {
    let run = train(args)?;
    println!(
        "ab: {} steps, blocks of {AB_BLOCK} alternating recorded/unrecorded",
        args.steps
    );
    for (what, times) in [("wall", &run.step_times), ("cpu", &run.step_cpu)] {
        match ab_ratio(times, &run.step_recorded) {
            Some(ab) => println!(
                "ab {what:<4}: recorded {:.2} ms/step, unrecorded {:.2} ms/step; ratio of means \
                 {:.3}, median pair ratio {:.3} ({} pairs)",
                ab.on_ms,
                ab.off_ms,
                ab.on_ms / ab.off_ms,
                ab.median_ratio,
                ab.pairs
            ),
            None => println!("ab: no recorded/unrecorded pairs (HIGHWATER=off, or too few steps)"),
        }
    }
    let recorded: Vec<f64> = run
        .step_times
        .iter()
        .zip(&run.step_recorded)
        .filter(|(_, &recorded)| recorded)
        .map(|(t, _)| t.as_secs_f64() * 1e3)
        .collect();
    if let (Some(cpu), false) = (run.collector_cpu, recorded.is_empty()) {
        // Less noisy than the step ratio: on a machine whose cores all train, the collector's
        // CPU is what it takes from the training threads, whatever else the machine does.
        let per_step = cpu.as_secs_f64() * 1e3 / recorded.len() as f64;
        let step_ms = recorded.iter().sum::<f64>() / recorded.len() as f64;
        println!(
            "ab collector: {per_step:.3} ms CPU per recorded step, {:.2} % of a recorded step's \
             wall time",
            100.0 * per_step / step_ms
        );
    }
    Ok(())
}

/// `--checkpoint-ab`: mean step time per checkpoint mode, against checkpoints off.
fn time_checkpoints(args: &Args) -> Result<()> {
    if std::env::var_os("HIGHWATER_CHECKPOINT").is_some() {
        bail!("--checkpoint-ab sets the interval itself; unset HIGHWATER_CHECKPOINT");
    }
    let run = train(args)?;
    println!(
        "checkpoint-ab: {} steps, recorded blocks of {CHECKPOINT_BLOCK} (the first 20 steps of \
         each block left out as warm-up)",
        args.steps
    );
    let mean_ms = |times: &[Duration], mode: usize| {
        let kept: Vec<f64> = times
            .iter()
            .zip(&run.step_checkpoint_mode)
            .enumerate()
            .filter(|(step, (_, m))| **m == mode && step % CHECKPOINT_BLOCK >= 20)
            .map(|(_, (t, _))| t.as_secs_f64() * 1e3)
            .collect();
        (!kept.is_empty()).then(|| kept.iter().sum::<f64>() / kept.len() as f64)
    };
    for (what, times) in [("wall", &run.step_times), ("cpu", &run.step_cpu)] {
        let Some(off) = mean_ms(times, 0) else {
            bail!(
                "no block ran with checkpoints off: use --steps {}",
                6 * CHECKPOINT_BLOCK
            );
        };
        for (mode, (name, interval)) in CHECKPOINT_MODES.iter().enumerate() {
            if let Some(ms) = mean_ms(times, mode) {
                println!(
                    "checkpoint-ab {what:<4}: {name:<7} ({:>4.1} s) {ms:.2} ms/step, {:.3}× off",
                    interval.as_secs_f64(),
                    ms / off
                );
            }
        }
    }
    Ok(())
}

struct Ab {
    on_ms: f64,
    off_ms: f64,
    median_ratio: f64,
    pairs: usize,
}

/// Per-block means, then per-pair ratios, after two warm-up pairs.
fn ab_ratio(times: &[Duration], recorded: &[bool]) -> Option<Ab> {
    let ms: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e3).collect();
    let blocks: Vec<(bool, f64)> = ms
        .chunks_exact(AB_BLOCK)
        .zip(recorded.chunks_exact(AB_BLOCK))
        .map(|(times, recorded)| (recorded[0], times.iter().sum::<f64>() / AB_BLOCK as f64))
        .collect();
    let warmup_pairs = if blocks.len() >= 16 { 2 } else { 0 };
    let mut ratios: Vec<f64> = blocks
        .chunks_exact(2)
        .skip(warmup_pairs)
        .filter_map(|pair| match (pair[0], pair[1]) {
            ((true, on), (false, off)) | ((false, off), (true, on)) => Some(on / off),
            _ => None,
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    let mean = |recorded: bool| {
        let times: Vec<f64> = blocks
            .iter()
            .skip(2 * warmup_pairs)
            .filter(|(r, _)| *r == recorded)
            .map(|(_, t)| *t)
            .collect();
        times.iter().sum::<f64>() / times.len().max(1) as f64
    };
    ratios.sort_by(f64::total_cmp);
    Some(Ab {
        on_ms: mean(true),
        off_ms: mean(false),
        median_ratio: ratios[ratios.len() / 2],
        pairs: ratios.len(),
    })
}

fn print_rows<'a>(rows: impl Iterator<Item = &'a PeakRow>) {
    let [bytes, category, op, shape, dtype, count, path] = words::LIVE_AT_PEAK_HEADER;
    println!("  {bytes:>10}  {category:<10} {op:<13} {shape:<11} {dtype:<5} {count:<4} {path}");
    for row in rows {
        println!(
            "  {:>10}  {:<10} {:<13} {:<11} {:<5} x{:<3} {}",
            format_bytes(row.bytes),
            row.category.as_str(),
            row.op.as_deref().unwrap_or("-"),
            format_shape(row.shape.as_deref()),
            row.dtype.as_deref().unwrap_or("-"),
            row.count,
            if row.span_path.is_empty() {
                words::OUTSIDE_SPANS
            } else {
                &row.span_path
            },
        );
    }
}

/// Most places in the code named per part.
const PLACES_PER_PART: usize = 2;

/// Where the code allocated `category`'s state and its temporaries at the peak, from the
/// profile's call sites (estimates from sampled stacks, hence the `~`).
fn print_sites(profile: &Profile, category: Category) {
    if profile.sites.is_empty() {
        println!("  (no call sites: sampling was off, HIGHWATER_SAMPLE_BYTES=0)");
        return;
    }
    for (part, name) in [(Part::State, "state"), (Part::Temporary, "temporaries")] {
        let places = places_holding(profile, category, part);
        let label = format!("{name} allocated in");
        if places.is_empty() {
            println!("  {label:<24} no sampled call site");
        }
        for (i, place) in places.iter().take(PLACES_PER_PART).enumerate() {
            let at = place
                .at
                .as_ref()
                .map_or("-".to_string(), ToString::to_string);
            let mut ids: Vec<String> = place
                .sites
                .iter()
                .take(3)
                .map(|id| format!("#{id}"))
                .collect();
            if place.sites.len() > ids.len() {
                ids.push(format!("+{}", place.sites.len() - ids.len()));
            }
            println!(
                "  {:<24} {:>10}  {at}  (site{} {})",
                if i == 0 { label.as_str() } else { "" },
                format!("~{}", format_bytes(place.bytes)),
                if place.sites.len() == 1 { "" } else { "s" },
                ids.join(" ")
            );
        }
        if places.len() > PLACES_PER_PART {
            let rest: u64 = places[PLACES_PER_PART..].iter().map(|p| p.bytes).sum();
            let more = places.len() - PLACES_PER_PART;
            println!(
                "  {:<24} {:>10}  elsewhere, {more} more place{} (highwater sites --category {category})",
                "",
                format!("~{}", format_bytes(rest)),
                if more == 1 { "" } else { "s" },
            );
        }
    }
}

fn print_summary(profile: &Profile, out: &std::path::Path, log: &std::path::Path) {
    let summary = &profile.summary;
    println!();
    println!(
        "peak {} at {} on {}",
        format_bytes(summary.peak_bytes),
        format_duration_ns(summary.peak_timestamp_ns),
        summary.peak_device
    );
    let temporary = |category: &Category| {
        let bytes = summary.peak_temporary_by_category.get(category).copied();
        bytes.unwrap_or(0)
    };
    println!(
        "  {:<11}{:>12}{:>12}{:>12}",
        "",
        "at peak",
        words::STATE.to_lowercase(),
        words::TEMPORARY.to_lowercase()
    );
    for (category, bytes) in &summary.peak_by_category {
        let temporary = temporary(category).min(*bytes);
        println!(
            "  {category:<11}{:>12}{:>12}{:>12}",
            format_bytes(*bytes),
            format_bytes(bytes - temporary),
            format_bytes(temporary)
        );
    }
    println!("  ({})", words::STATE_VS_TEMPORARY_EXPLAINED);
    let parameters = summary
        .peak_by_category
        .get(&Category::Parameter)
        .copied()
        .unwrap_or(0);
    let optimizer = summary
        .peak_by_category
        .get(&Category::Optimizer)
        .copied()
        .unwrap_or(0);
    let update_temporaries = temporary(&Category::Optimizer).min(optimizer);
    let optimizer_state = optimizer - update_temporaries;
    if parameters > 0 && optimizer > 0 {
        println!(
            "optimizer at the peak: state {} = {:.2}x the parameters' {} (AdamW's two moments \
             per parameter, made in `optimizer_init`), and {} of the update's temporaries \
             (allocated and freed inside the `optimizer` span)",
            format_bytes(optimizer_state),
            optimizer_state as f64 / parameters as f64,
            format_bytes(parameters),
            format_bytes(update_temporaries),
        );
        print_sites(profile, Category::Optimizer);
    }
    println!(
        "{}: {} ({})",
        words::KEPT_FOR_BACKWARD.to_lowercase(),
        format_bytes(summary.autograd_retained_bytes),
        words::KEPT_FOR_BACKWARD_EXPLAINED
    );

    println!("\ntop spans by peak ({})", words::RESIDUAL_EXPLAINED);
    let mut spans: Vec<_> = profile.spans.iter().collect();
    spans.sort_by_key(|s| std::cmp::Reverse((s.peak_bytes, s.calls)));
    for span in spans.iter().take(5) {
        println!(
            "  {:<28} calls {:>4}  peak {:>10}  {} {:>10}",
            profile.span_path(span.id),
            span.calls,
            format_bytes(span.peak_bytes),
            words::RESIDUAL_HEAD,
            format_bytes(span.residual_per_call()),
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
    // The report is on by default; only the environment can have turned it off.
    let html_off = std::env::var("HIGHWATER_HTML").is_ok_and(|value| {
        matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "0" | "off" | "false" | "no"
        )
    });
    if !html_off {
        let report = highwater_export::html::path_beside(out);
        println!("report: {} (open it in a browser)", report.display());
    }
    println!(
        "allocation log: {} (for highwater simulate, fit and export --format torch)",
        log.display()
    );
}

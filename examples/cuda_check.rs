//! The check on real hardware (`scripts/gpu_check.sh` runs it on a machine with an NVIDIA GPU):
//! device buffers of known sizes allocated through cudarc inside spans, some freed, then a
//! request for more than the device has. It prints highwater's device peak against the known
//! sizes (which must be equal), against the driver's own `cuMemGetInfo` figures, and the rows of
//! the checkpoint the refusal wrote; with `--ab`, the time of allocation-heavy steps with device
//! recording on against off, in one process.
//!
//! ```sh
//! cargo run --release --features cuda --example cuda_check -- --out target/highwater/cuda.json
//! ```
//!
//! Exit status: 0 when every figure matched, 1 on a mismatch, 2 without a GPU.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use highwater::profile::model::OomSource;
use highwater::profile::units::format_bytes;
use highwater::{Category, Profile, Session, Step};

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

const MIB: usize = 1 << 20;

/// What the check allocates, by span: (span, step or category, buffers in MiB).
const PARAMETERS_MIB: [usize; 2] = [256, 64];
const ACTIVATIONS_MIB: [usize; 3] = [512, 512, 128];
const GRADIENTS_MIB: [usize; 2] = [256, 64];

struct Args {
    out: PathBuf,
    ab: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        out: PathBuf::from("target/highwater/cuda_check.json"),
        ab: false,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--out" => args.out = argv.next().context("--out needs a path")?.into(),
            "--ab" => args.ab = true,
            other => bail!("unknown argument {other:?} (--out PATH, --ab)"),
        }
    }
    Ok(args)
}

fn alloc(stream: &Arc<CudaStream>, mib: usize) -> Result<CudaSlice<u8>> {
    Ok(stream.alloc_zeros::<u8>(mib * MIB)?)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let session = Session::builder()
        .output(&args.out)
        .checkpoint_every(Duration::ZERO)
        .start()?;
    // SAFETY: probing for the driver library has no preconditions (cudarc panics when it is
    // missing, so ask first).
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("no GPU to check: no CUDA driver library could be loaded");
        std::process::exit(2);
    }
    let ctx = match CudaContext::new(0) {
        Ok(ctx) => ctx,
        Err(error) => {
            eprintln!("no GPU to check: {error:?}");
            std::process::exit(2);
        }
    };
    let stream = ctx.default_stream();
    let (free_before, total) = ctx.mem_get_info()?;

    let parameters = {
        let _init = highwater::profile!("init", Category::Parameter);
        PARAMETERS_MIB
            .iter()
            .map(|&mib| alloc(&stream, mib))
            .collect::<Result<Vec<_>>>()?
    };
    let (mut activations, gradients, driver_at_peak) = {
        let _step = highwater::profile!("step");
        let activations = {
            let _forward = highwater::profile!("forward", Step::Forward);
            ACTIVATIONS_MIB
                .iter()
                .map(|&mib| alloc(&stream, mib))
                .collect::<Result<Vec<_>>>()?
        };
        let gradients = {
            let _backward = highwater::profile!("backward", Step::Backward);
            GRADIENTS_MIB
                .iter()
                .map(|&mib| alloc(&stream, mib))
                .collect::<Result<Vec<_>>>()?
        };
        stream.synchronize()?;
        let (free_at_peak, _) = ctx.mem_get_info()?;
        (activations, gradients, free_before - free_at_peak)
    };
    let known_peak: usize = PARAMETERS_MIB
        .iter()
        .chain(&ACTIVATIONS_MIB)
        .chain(&GRADIENTS_MIB)
        .sum::<usize>()
        * MIB;
    // The forward's two large activations go; the rest stays to the end.
    activations.drain(..2);
    stream.synchronize()?;

    // More than the device has: the driver refuses, and the refusal is checkpointed.
    let refused = {
        let _grow = highwater::profile!("grow", Step::Forward);
        // SAFETY: never read; the allocation is expected to fail.
        unsafe { stream.alloc::<u8>(total + 1024 * MIB) }
    };
    let refusal_error = refused.err().map(|error| format!("{error:?}"));
    let checkpoint = Profile::load(&args.out).ok();

    drop((parameters, activations, gradients));
    stream.synchronize()?;
    let profile = session.finish()?;

    let mut ok = true;
    let cuda0 = profile
        .devices
        .iter()
        .find(|d| d.device == "cuda:0")
        .context("the profile has no cuda:0: was highwater built with the `cuda` feature?")?;
    let exact = cuda0.peak_bytes == known_peak as u64;
    ok &= exact;
    println!(
        "cuda:0 peak: highwater {} ({} B), allocated by this program {} ({} B): {}",
        format_bytes(cuda0.peak_bytes),
        cuda0.peak_bytes,
        format_bytes(known_peak as u64),
        known_peak,
        if exact { "exact" } else { "MISMATCH" }
    );
    println!(
        "driver: free memory fell by {} ({} B) from the first allocation to the peak \
         (cuMemGetInfo; the pool's granularity and the allocator's own state included)",
        format_bytes(driver_at_peak as u64),
        driver_at_peak
    );
    println!(
        "driver pools reserved: peak {}, at the end {}; in use before the first allocation \
         (context): {}; device total {}",
        cuda0.reserved_peak_bytes.map_or("-".into(), format_bytes),
        cuda0.reserved_final_bytes.map_or("-".into(), format_bytes),
        cuda0.context_bytes.map_or("-".into(), format_bytes),
        format_bytes(total as u64)
    );
    for (category, bytes) in &cuda0.peak_by_category {
        println!("  at the peak: {category} {}", format_bytes(*bytes));
    }
    match (&refusal_error, profile.oom_events.first()) {
        (Some(error), Some(oom)) if oom.source == OomSource::Driver => {
            println!(
                "refusal: {error}; recorded on {} asking {} in span {}, {} live then",
                oom.device,
                format_bytes(oom.requested_bytes),
                oom.span_path,
                format_bytes(oom.live_bytes)
            );
            for row in &oom.live {
                println!(
                    "  live then: {} {} {}",
                    row.span_path,
                    row.category,
                    format_bytes(row.bytes)
                );
            }
            let checkpointed = checkpoint
                .as_ref()
                .is_some_and(|c| c.meta.partial && c.oom_events.first() == Some(oom));
            ok &= checkpointed;
            println!(
                "checkpoint written at the refusal: {}",
                if checkpointed {
                    "yes, same rows"
                } else {
                    "MISSING"
                }
            );
        }
        (error, oom) => {
            ok = false;
            println!("refusal NOT recorded: driver said {error:?}, profile has {oom:?}");
        }
    }
    for warning in &profile.warnings {
        println!("warning: {warning}");
    }
    if args.ab {
        time_steps(&ctx, &stream, &args)?;
    }
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}

/// Times allocation-heavy steps (allocate, zero and free 16 buffers) with device recording on
/// and off, in alternating blocks of one process, and prints the ratio of means.
fn time_steps(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, args: &Args) -> Result<()> {
    const BLOCKS: usize = 10;
    const STEPS: usize = 50;
    let step = || -> Result<()> {
        let buffers = (0..16)
            .map(|i| alloc(stream, 1 + i % 4))
            .collect::<Result<Vec<_>>>()?;
        drop(buffers);
        stream.synchronize()?;
        Ok(())
    };
    let mut times = [Vec::new(), Vec::new()];
    for block in 0..BLOCKS {
        // on, off, off, on, …: each mode as often early as late.
        let on = block % 2 == (block / 2) % 2;
        let session = Session::builder()
            .output(args.out.with_extension("ab.json"))
            .write_profile(false)
            .cuda(on)
            .start()?;
        ctx.bind_to_thread()?;
        for _ in 0..STEPS {
            let started = Instant::now();
            step()?;
            times[usize::from(on)].push(started.elapsed());
        }
        session.finish()?;
    }
    let mean = |times: &[Duration]| times.iter().sum::<Duration>() / times.len().max(1) as u32;
    let (off, on) = (mean(&times[0]), mean(&times[1]));
    println!(
        "step time (16 allocations, zeroed, freed, synchronised): recording on {on:.2?}, off \
         {off:.2?}: ratio {:.3}",
        on.as_secs_f64() / off.as_secs_f64()
    );
    Ok(())
}

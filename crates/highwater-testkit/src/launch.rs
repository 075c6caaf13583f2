//! A multi-process training run, launched as torchrun launches one: `examples/ranks.rs` and the
//! end-to-end test of `highwater ranks` both use it, the test binary standing in for the
//! example as the program each worker runs.
//!
//! The launcher starts one worker process per rank, each with the environment torchrun gives
//! its workers (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`, `TORCHELASTIC_RUN_ID`) and one `HIGHWATER_OUT` for all of them: highwater puts
//! each rank into its own file's name. The work is uneven, pipeline style: each rank holds one
//! stage of a stack of linear layers, and the heavy rank's stage holds the most layers, so it
//! keeps the most parameters, optimizer state and activations.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use anyhow::{bail, Context as _, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Linear, Module as _, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use highwater::{Session, Step};

/// What a launch runs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Processes (ranks) to start.
    pub ranks: u32,
    /// Training steps each rank runs.
    pub steps: usize,
    /// Where the profiles go (`DIR/highwater-profile.rankN.json`).
    pub dir: PathBuf,
    /// The rank whose stage holds the most layers.
    pub heavy: u32,
    /// A rank that dies (aborts) half way through, leaving no profile.
    pub fail_rank: Option<u32>,
    /// Width of every layer.
    pub width: usize,
    /// Rows per micro-batch.
    pub batch: usize,
}

impl Plan {
    /// `ranks` ranks of `steps` steps into `dir`; the heavy rank is the middle one.
    pub fn new(ranks: u32, steps: usize, dir: PathBuf) -> Plan {
        Plan {
            ranks,
            steps,
            dir,
            heavy: ranks / 2,
            fail_rank: None,
            width: 256,
            batch: 64,
        }
    }

    /// The arguments a worker is started with (after the program's own `prefix`).
    fn worker_args(&self) -> Vec<String> {
        let mut args = vec![
            "--worker".to_string(),
            "--steps".into(),
            self.steps.to_string(),
            "--heavy".into(),
            self.heavy.to_string(),
            "--width".into(),
            self.width.to_string(),
            "--batch".into(),
            self.batch.to_string(),
        ];
        if let Some(rank) = self.fail_rank {
            args.extend(["--fail-rank".into(), rank.to_string()]);
        }
        args
    }
}

/// Layers rank `rank`'s stage holds: 4 on the heavy rank, 1 or 2 elsewhere.
pub fn layers_of(rank: u32, heavy: u32) -> usize {
    if rank == heavy {
        4
    } else {
        1 + (rank % 2) as usize
    }
}

/// The profile rank `rank` writes.
pub fn profile_of(dir: &Path, rank: u32) -> PathBuf {
    dir.join(format!("highwater-profile.rank{rank}.json"))
}

/// What a launch left: the run's id (as `highwater ranks --run` names it) and each rank's exit
/// status, by rank.
#[derive(Debug)]
pub struct Launched {
    /// `torchrun:` and the `TORCHELASTIC_RUN_ID` the workers were given.
    pub run: String,
    /// Each rank's exit status.
    pub statuses: Vec<(u32, ExitStatus)>,
}

/// Starts `plan.ranks` workers of `program` (with `prefix` before the worker's arguments), as
/// torchrun would, and waits for all of them. Rank profiles an earlier launch left in the
/// directory are removed first: they are of another run.
pub fn launch(program: &Path, prefix: &[&str], plan: &Plan) -> Result<Launched> {
    std::fs::create_dir_all(&plan.dir)
        .with_context(|| format!("cannot create {}", plan.dir.display()))?;
    for entry in std::fs::read_dir(&plan.dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("highwater-profile.rank") && name.ends_with(".json") {
            std::fs::remove_file(plan.dir.join(&*name))?;
        }
    }
    let run_id = format!(
        "ranks-example-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    let mut children = Vec::new();
    for rank in 0..plan.ranks {
        let child = Command::new(program)
            .args(prefix)
            .args(plan.worker_args())
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("GROUP_RANK", "0")
            .env("WORLD_SIZE", plan.ranks.to_string())
            .env("LOCAL_WORLD_SIZE", plan.ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "29500")
            .env("TORCHELASTIC_RUN_ID", &run_id)
            .env("HIGHWATER_OUT", plan.dir.join("highwater-profile.json"))
            .spawn()
            .with_context(|| format!("cannot start rank {rank}"))?;
        children.push((rank, child));
    }
    let statuses = children
        .into_iter()
        .map(|(rank, mut child)| Ok((rank, child.wait()?)))
        .collect::<Result<_>>()?;
    Ok(Launched {
        run: format!("torchrun:{run_id}"),
        statuses,
    })
}

/// A worker's settings, from its arguments.
struct WorkerArgs {
    steps: usize,
    heavy: u32,
    fail_rank: Option<u32>,
    width: usize,
    batch: usize,
}

fn worker_args(args: &[String]) -> Result<WorkerArgs> {
    let mut parsed = WorkerArgs {
        steps: 5,
        heavy: 0,
        fail_rank: None,
        width: 256,
        batch: 64,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<usize> {
            let text = it
                .next()
                .with_context(|| format!("{name} needs a number"))?;
            text.parse()
                .with_context(|| format!("{name} {text}: not a number"))
        };
        match arg.as_str() {
            "--worker" => {}
            "--steps" => parsed.steps = value("--steps")?,
            "--heavy" => parsed.heavy = value("--heavy")? as u32,
            "--fail-rank" => parsed.fail_rank = Some(value("--fail-rank")? as u32),
            "--width" => parsed.width = value("--width")?,
            "--batch" => parsed.batch = value("--batch")?,
            other => bail!("unknown worker argument {other:?}"),
        }
    }
    Ok(parsed)
}

/// One rank's process: reads its rank as torchrun gives it, records a session while training
/// its pipeline stage, and writes its profile (the name carries the rank).
pub fn worker(args: &[String]) -> Result<()> {
    let args = worker_args(args)?;
    let rank: u32 = std::env::var("RANK")
        .context("a worker is started by the launcher, with RANK set")?
        .parse()
        .context("RANK is not a number")?;
    let session = Session::builder().html(false).start()?;
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let layers: Vec<Linear> = {
        let _build = highwater::profile!("build_stage");
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        (0..layers_of(rank, args.heavy))
            .map(|i| candle_nn::linear(args.width, args.width, vb.pp(format!("layer{i}"))))
            .collect::<candle_core::Result<_>>()?
    };
    highwater::candle::mark_parameters(&varmap);
    let mut optimizer = {
        let _init = highwater::profile!("optimizer_init", Step::Optimizer);
        AdamW::new(varmap.all_vars(), ParamsAdamW::default())?
    };
    let input = Tensor::randn(0f32, 1.0, (args.batch, args.width), &device)?;
    let target = Tensor::randn(0f32, 1.0, (args.batch, args.width), &device)?;
    for step in 0..args.steps {
        let _step = highwater::profile!("train_step");
        let loss = {
            let _fwd = highwater::profile!("forward", Step::Forward);
            let mut h = input.clone();
            for layer in &layers {
                let z = highwater::candle::op("linear", &[&h], || layer.forward(&h))?;
                h = highwater::candle::op("relu", &[&z], || z.relu())?;
            }
            highwater::candle::op("mse", &[&h], || (h.sub(&target)?.sqr()?).mean_all())?
        };
        let grads = {
            let _bwd = highwater::profile!("backward", Step::Backward);
            loss.backward()?
        };
        if args.fail_rank == Some(rank) && step == args.steps / 2 {
            // A rank that dies mid-run: no profile is written (checkpoints are off).
            eprintln!("rank {rank}: dying at step {step}, as asked");
            std::process::abort();
        }
        {
            let _opt = highwater::profile!("optimizer", Step::Optimizer);
            optimizer.step(&grads)?;
        }
    }
    let written = session.output().map(Path::to_path_buf);
    session.finish()?;
    if let Some(path) = written {
        println!("rank {rank}: {}", path.display());
    }
    Ok(())
}

//! Many processes, one run: launch four worker processes of this example as torchrun would,
//! each recording its own profile, then compare the ranks.
//!
//! Each worker trains one stage of a pipeline of candle linear layers (`examples/support/
//! ranks.rs`): the middle rank's stage holds four layers, the others one or two, so it holds
//! the most parameters, optimizer state and activations. Every worker is given the same
//! `HIGHWATER_OUT`; highwater reads the rank from torchrun's variables and writes
//! `highwater-profile.rankN.json`. The launcher then compares the directory with the library
//! `highwater ranks` is built on, and names the heavy rank.
//!
//! ```text
//! cargo run --release --features candle --example ranks                       # 4 ranks into ranks-run/
//! cargo run --release --features candle --example ranks -- --ranks 8 --steps 20 --out /tmp/run
//! cargo run --release --features candle --example ranks -- --fail-rank 1       # rank 1 dies: reported missing
//! cargo run --release -p highwater-cli -- ranks ranks-run                      # the full table
//! cargo run --release -p highwater-cli -- export --format html ranks-run       # ranks-run/highwater-ranks.html
//! ```

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use highwater::profile::ranks::{compare, CompareOptions};
use highwater::profile::units::format_bytes;

use highwater_testkit::launch as ranks;

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        return ranks::worker(&args);
    }
    let mut plan = ranks::Plan::new(4, 10, PathBuf::from("ranks-run"));
    let mut heavy = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<String> {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--ranks" => plan.ranks = value("--ranks")?.parse().context("--ranks")?,
            "--steps" => plan.steps = value("--steps")?.parse().context("--steps")?,
            "--out" => plan.dir = value("--out")?.into(),
            "--heavy" => heavy = Some(value("--heavy")?.parse().context("--heavy")?),
            "--fail-rank" => {
                plan.fail_rank = Some(value("--fail-rank")?.parse().context("--fail-rank")?)
            }
            "-h" | "--help" => {
                println!(
                    "usage: ranks [--ranks N] [--steps N] [--out DIR] [--heavy RANK] [--fail-rank RANK]"
                );
                return Ok(());
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    if plan.ranks == 0 || plan.steps == 0 {
        bail!("--ranks and --steps must be at least 1");
    }
    plan.heavy = heavy.unwrap_or(plan.ranks / 2);
    let program = std::env::current_exe()?;
    println!(
        "launching {} ranks of {} steps into {} (rank {} holds {} layers, the others 1 or 2)",
        plan.ranks,
        plan.steps,
        plan.dir.display(),
        plan.heavy,
        ranks::layers_of(plan.heavy, plan.heavy)
    );
    let launched = ranks::launch(&program, &[], &plan)?;
    for (rank, status) in &launched.statuses {
        if !status.success() {
            println!("rank {rank} failed: {status}");
        }
    }
    let run = compare(
        &[plan.dir.clone()],
        &CompareOptions::new().run(launched.run.clone()),
    )?;
    for row in &run.rows {
        println!(
            "  rank {}: {} layer{}, peak {} ({})",
            row.rank,
            ranks::layers_of(row.rank, plan.heavy),
            if ranks::layers_of(row.rank, plan.heavy) == 1 {
                ""
            } else {
                "s"
            },
            format_bytes(row.peak_bytes),
            row.file.display()
        );
    }
    let i = &run.imbalance;
    println!(
        "heaviest: rank {} at {}, {:.2}x the mean peak",
        i.heaviest_rank,
        format_bytes(i.max_peak_bytes),
        i.max_over_mean
    );
    if !run.missing_ranks.is_empty() {
        println!("missing: ranks {:?} left no profile", run.missing_ranks);
    }
    println!(
        "the whole table: cargo run --release -p highwater-cli -- ranks {}",
        plan.dir.display()
    );
    Ok(())
}

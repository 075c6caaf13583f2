//! One allocation-heavy workload run as a real program under highwater, so it can be timed
//! with recording on and off (`HIGHWATER=off`) and run under heaptrack or valgrind's massif for
//! comparison (`scripts/compare_profilers.py` does all of that in one go).
//!
//! ```text
//! cargo build --release --example workload
//! target/release/examples/workload --kind syn --sources ~/src/some-crate/src --copies 4
//! target/release/examples/workload --kind json --json-mib 25
//! target/release/examples/workload --kind maps --threads 4 --rounds 40
//! target/release/examples/workload --kind rayon --threads 2 --strings 3000000
//! target/release/examples/workload --kind tight --threads 2 --pairs 20000000
//! target/release/examples/workload --kind realloc --rounds 400
//! HIGHWATER=off target/release/examples/workload --kind maps        # same work, not recorded
//! HIGHWATER=off heaptrack target/release/examples/workload --kind json
//! ```
//!
//! The session starts before the workload reads or generates its input and finishes after
//! everything was freed, so highwater sees every allocation the work makes, as an external
//! profiler does. The last line of output is one JSON object: the work time (the workload
//! only, without session start and finish), the process's CPU time during it (every thread, the
//! collector's included) and the collector thread's alone (Linux), the finish time, and the
//! profile's figures.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::{Parser, ValueEnum};
use highwater::Session;

use highwater_testkit::cpu::{collector_thread_cpu, process_cpu_time};
use highwater_testkit::workloads;

#[global_allocator]
static ALLOC: highwater::Alloc = highwater::Alloc::system();

/// Which workload to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// syn parses Rust sources several times, keeping every tree alive until the end.
    Syn,
    /// A generated JSON document parsed to a `serde_json::Value`, walked, written, re-parsed.
    Json,
    /// Threads build `HashMap<String, Vec<u64>>`s and pass them to the next thread to free.
    Maps,
    /// rayon: strings made and sorted in parallel, then folded and reduced into `HashMap`s.
    Rayon,
    /// Threads allocate 64 to 256 bytes and free them at once, as fast as they can.
    Tight,
    /// `Vec`s and `String`s grown one element at a time: mostly `realloc`s.
    Realloc,
}

/// Runs one allocation-heavy workload under highwater (see the module docs).
#[derive(Debug, Parser)]
struct Args {
    /// The workload.
    #[arg(long, value_enum)]
    kind: Kind,
    /// syn: directories whose `.rs` files are parsed (repeatable); default this crate's `src/`.
    #[arg(long)]
    sources: Vec<PathBuf>,
    /// syn: parses of the whole source set kept alive together.
    #[arg(long, default_value_t = 4)]
    copies: usize,
    /// json: size of the generated document, in MiB.
    #[arg(long, default_value_t = 25)]
    json_mib: usize,
    /// maps: worker threads, in a ring; rayon: the pool's threads; tight: looping threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// maps: rounds of build, hand over, free; realloc: rounds of 128 buffers grown.
    #[arg(long, default_value_t = 40)]
    rounds: usize,
    /// maps: maps each thread builds per round.
    #[arg(long, default_value_t = 8)]
    maps: usize,
    /// maps: entries per map.
    #[arg(long, default_value_t = 4_000)]
    entries: usize,
    /// rayon: strings sorted and counted.
    #[arg(long, default_value_t = 3_000_000)]
    strings: usize,
    /// tight: alloc + free pairs per thread.
    #[arg(long, default_value_t = 20_000_000)]
    pairs: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let session = Session::start()?;
    let (began, began_cpu) = (Instant::now(), process_cpu_time());
    let figures = run(&args)?;
    let work_s = began.elapsed().as_secs_f64();
    let work_cpu_s = (process_cpu_time() - began_cpu).as_secs_f64();
    let collector_cpu_s = collector_thread_cpu().map(|cpu| cpu.as_secs_f64());
    let recording = session.is_recording();
    let finishing = Instant::now();
    let profile = session.finish()?;
    let finish_s = finishing.elapsed().as_secs_f64();
    let summary = &profile.summary;
    println!(
        "{}",
        serde_json::json!({
            "kind": format!("{:?}", args.kind).to_lowercase(),
            "recording": recording,
            "work_s": work_s,
            "work_cpu_s": work_cpu_s,
            "finish_s": finish_s,
            "collector_cpu_s": collector_cpu_s,
            "peak_bytes": summary.peak_bytes,
            "dropped_events": summary.dropped_events,
            "events": summary.event_count,
            "ring_events": profile.capture.ring_events,
            "capture_mode": profile.capture.mode,
            "workload": figures,
        })
    );
    Ok(())
}

/// Runs the chosen workload; returns what it did, for the output line.
fn run(args: &Args) -> Result<serde_json::Value> {
    Ok(match args.kind {
        Kind::Syn => {
            let roots = if args.sources.is_empty() {
                vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")]
            } else {
                args.sources.clone()
            };
            let sources = workloads::rust_sources(&roots).map_err(|error| anyhow!(error))?;
            let source_bytes: usize = sources.iter().map(String::len).sum();
            let trees = workloads::parse_trees(&sources, args.copies)
                .map_err(|error| anyhow!("parsing: {error}"))?;
            serde_json::json!({
                "files": sources.len(),
                "source_bytes": source_bytes,
                "trees": trees.trees,
                "items": trees.items,
            })
        }
        Kind::Json => {
            let document = workloads::json_document(args.json_mib << 20);
            let trip = workloads::json_round_trip(&document).map_err(|error| anyhow!(error))?;
            serde_json::json!({
                "document_bytes": document.len(),
                "nodes": trip.nodes,
                "written_bytes": trip.written_bytes,
            })
        }
        Kind::Maps => {
            let maps = workloads::pass_maps(workloads::MapsConfig {
                threads: args.threads,
                rounds: args.rounds,
                maps_per_round: args.maps,
                entries: args.entries,
            });
            serde_json::json!({ "maps": maps.maps, "entries": maps.entries })
        }
        Kind::Rayon => {
            let sorted = workloads::sort_and_count(workloads::SortConfig {
                threads: args.threads,
                strings: args.strings,
            });
            serde_json::json!({ "strings": sorted.strings, "prefixes": sorted.prefixes })
        }
        Kind::Tight => {
            let threads = workloads::alloc_free_loop(args.threads, args.pairs);
            serde_json::json!({ "threads": threads.len(), "pairs_per_thread": args.pairs })
        }
        Kind::Realloc => {
            let grown = workloads::grow_buffers(args.rounds);
            serde_json::json!({ "buffers": grown.buffers, "kept_bytes": grown.kept_bytes })
        }
    })
}

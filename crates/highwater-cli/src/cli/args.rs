//! The command line, as clap parses it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use highwater_device::{Allocator, DeviceKind, Factor, ParseNameError, Strategy};
use highwater_profile::model::Category;

use super::parse::{
    parse_budget_bytes, parse_category, parse_category_budget, parse_percent, parse_size,
};

/// Read highwater memory profiles: where did the memory go?
#[derive(Debug, Parser)]
#[command(name = "highwater", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The peak (how high, when, on which device, by category), counts, devices and warnings.
    Summary {
        /// A profile written by highwater (`highwater-profile.json`).
        profile: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The largest groups of memory live at the peak.
    ///
    /// Rows group live bytes by span path, op, category and device. OUTPUT OF OP names the op
    /// whose output tensor the row holds, with that tensor's shape; CATEGORY says what the bytes
    /// are (an op's output in the forward pass is an activation, not the parameter it read).
    Top {
        /// A profile written by highwater.
        profile: PathBuf,
        /// How many rows to show.
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The call sites: the stacks that allocated, largest at the peak first, each with its
    /// estimated bytes ± standard error, what it allocated, its category, span and op mix and
    /// its stack (innermost first, file:line).
    ///
    /// Sites come from allocations sampled by bytes (HIGHWATER_SAMPLE_BYTES, 0 for off). The
    /// standard library's allocation frames and the runtime's frames are trimmed from the
    /// stacks; `--site N` shows one site with every frame. The ids (#N) are those the `top`
    /// rows, the HTML report and `--json` name.
    Sites {
        /// A profile written by highwater.
        profile: PathBuf,
        /// How many sites to show.
        #[arg(short = 'n', long, default_value_t = 20)]
        limit: usize,
        /// Rank by bytes live at the peak or by bytes allocated over the run.
        #[arg(long, value_enum, default_value_t = SiteSort::Peak)]
        sort: SiteSort,
        /// Only sites with bytes of this category, ranked by them: parameter, activation,
        /// gradient, optimizer, other.
        #[arg(long, value_parser = parse_category)]
        category: Option<Category>,
        /// Only the site with this id (as `#N` shows it), with every frame of its stack (none
        /// trimmed).
        #[arg(long, value_name = "N")]
        site: Option<u32>,
        /// Most frames shown per stack, after trimming.
        #[arg(long, default_value_t = 8, value_name = "N")]
        frames: usize,
        /// Show every frame, the standard library's and the runtime's too.
        #[arg(long)]
        all_frames: bool,
        /// Print JSON instead of text (the sites as the profile stores them, every frame).
        #[arg(long)]
        json: bool,
    },
    /// The span tree with calls, time and memory metrics (PEAK and RESIDUAL/CALL explained below).
    ///
    /// Every path of the span tree; TIME and ALLOCATED add up all calls. ALLOCATED: bytes
    /// allocated inside, children included. PEAK: the highest live bytes on the peak's device
    /// while the span was open. RESIDUAL/CALL: bytes one call of the span allocated and still held
    /// when it exited, averaged over its calls (a step that keeps nothing shows 0 B).
    Spans {
        /// A profile written by highwater.
        profile: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// What grew or shrank from one profile to another: peak, categories and spans.
    Diff {
        /// The baseline profile.
        before: PathBuf,
        /// The profile to compare with it.
        after: PathBuf,
        /// How many changed spans to show (text output only).
        #[arg(short = 'n', long, default_value_t = 30)]
        limit: usize,
        /// Print JSON instead of text (all changed spans).
        #[arg(long)]
        json: bool,
    },
    /// Write the profile as a self-contained HTML report, a Chrome/Perfetto trace, PyTorch's
    /// memory snapshot or a pprof profile of its call sites.
    ///
    /// html: one file that opens from disk (charts, zoom, tables). chrome: Trace Event JSON for
    /// ui.perfetto.dev and chrome://tracing. torch: a pickle for pytorch.org/memory_viz, made
    /// from the run's allocation log (record with HIGHWATER_ALLOC_LOG=path). pprof: a gzipped
    /// profile.proto of the call sites for `go tool pprof`, Perfetto, speedscope or Pyroscope
    /// (bytes and objects live at the peak and allocated; labels category, span and op).
    ///
    /// Several rank profiles of one run (or a directory of them) make, with --format html, the
    /// ranks page: every rank's memory by iteration, side by side and overlaid, the heaviest
    /// marked, and the table `highwater ranks` prints.
    Export {
        /// A profile written by highwater; for the ranks page, several, or a directory.
        #[arg(required = true, value_name = "PROFILE")]
        profiles: Vec<PathBuf>,
        /// The ranks page only: the run to draw when the profiles hold several.
        #[arg(long, value_name = "RUN")]
        run: Option<String>,
        /// The output format.
        #[arg(short, long, value_enum)]
        format: Format,
        /// Where to write; `-` for standard output. Default: next to the profile, with the
        /// extension `.trace.json` (chrome), `.html` (html), `.pickle` (torch) or `.pb.gz`
        /// (pprof); the ranks page goes to `highwater-ranks.html` in the directory (or the
        /// first profile's).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// torch only: most allocations and frees per device, a window ending at the device's
        /// peak (the viewer replays every event in the browser).
        #[arg(long, default_value_t = highwater_export::torch::DEFAULT_MAX_EVENTS)]
        max_events: usize,
    },
    /// Check memory budgets on a profile, for CI: exit 0 when all hold, 1 with one line per
    /// broken budget, 2 on bad input.
    ///
    /// Budgets come from the flags, a TOML file (`--budgets`, keys named as the flags), or
    /// both; a flag overrides the file's value.
    Check {
        /// A profile written by highwater.
        profile: PathBuf,
        /// A TOML file of budgets (`max-peak = "2 GiB"`, `[max-peak-category]`, …).
        #[arg(long, value_name = "FILE")]
        budgets: Option<PathBuf>,
        /// Most bytes live at the peak (`2GiB`, `512MiB`, `1073741824`).
        #[arg(long, value_name = "SIZE", value_parser = parse_budget_bytes)]
        max_peak: Option<u64>,
        /// Most bytes of one category live at the peak, as CATEGORY=SIZE (repeatable):
        /// `--max-peak-category optimizer=512MiB`.
        #[arg(long, value_name = "CATEGORY=SIZE", value_parser = parse_category_budget)]
        max_peak_category: Vec<(Category, u64)>,
        /// Most growth of live bytes per iteration, from the first iteration after the
        /// warm-ups to the last (`0`, `4KiB`).
        #[arg(long, value_name = "SIZE", value_parser = parse_budget_bytes)]
        max_growth_per_iteration: Option<u64>,
        /// Iterations left out of the growth at the start (default 1).
        #[arg(long, value_name = "N")]
        warmup_iterations: Option<u64>,
        /// Most events dropped while recording.
        #[arg(long, value_name = "N")]
        max_dropped: Option<u64>,
        /// A profile to compare the peak with (needs --max-regression).
        #[arg(long, value_name = "OTHER.json")]
        baseline: Option<PathBuf>,
        /// How much higher than the baseline's the peak may be (`5%`).
        #[arg(long, value_name = "PERCENT", value_parser = parse_percent)]
        max_regression: Option<f64>,
    },
    /// Replay a run's allocations through a device pool: would it fit, when would it run out,
    /// how fragmented would it get, under each strategy? Also prints the three what-if figures
    /// (lower bound, offline packing, PyTorch's and TensorFlow's allocators, with their
    /// fragmentation tax).
    ///
    /// Exit code 3 when the run does not fit under --strategy (2 for unreadable input).
    ///
    /// Needs the allocation log (record with `HIGHWATER_ALLOC_LOG=path`); pass the profile that
    /// names it, or the log itself.
    Simulate {
        /// A profile recorded with an allocation log, or the log itself.
        input: PathBuf,
        /// The device to size the pool from: tpu-v2, tpu-v3, tpu-v4, tpu-v5e, tpu-v5p,
        /// a100-40gb, a100-80gb, h100, h200, l4. Default: the stream's own device as the
        /// profile recorded it (a CUDA device's total memory).
        #[arg(long, value_parser = parse_kind)]
        device: Option<DeviceKind>,
        /// Allocation strategy to report on: first-fit, best-fit, worst-fit, buddy,
        /// pool-based, adaptive.
        #[arg(long, default_value = "best-fit", value_parser = parse_strategy)]
        strategy: Strategy,
        /// Usable bytes instead of the device's nominal size (`30GiB`, `512MiB`, `1073741824`).
        #[arg(long, value_parser = parse_size)]
        limit: Option<u64>,
        /// Which recorded device's allocations to replay (`cpu` for the heap, `cuda:0`, …).
        /// Default: the device of the profile's peak, else the log's first device. `cpu`
        /// replays the heap's tensor-sized blocks as a proxy for a device (see --min-block).
        #[arg(long)]
        stream: Option<String>,
        /// With `--stream cpu`: the smallest heap block taken for a tensor.
        #[arg(long, default_value = "4KiB", value_parser = parse_size)]
        min_block: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Will it fit? The largest factor on the --grow categories (a doubled batch is
    /// `--grow activation` at ×2) that still fits the device under --allocator, with the peak,
    /// the allocator's fragmentation tax there, what fills the device first, and the curve of
    /// peak against factor.
    ///
    /// Exit code 3 when the run as recorded (with --scale/--shard) does not fit (2 for
    /// unreadable input).
    Fit {
        /// A profile recorded with an allocation log, or the log itself.
        input: PathBuf,
        /// The device: tpu-v2, tpu-v3, tpu-v4, tpu-v5e, tpu-v5p, a100-40gb, a100-80gb, h100,
        /// h200, l4. Default: the stream's own device as the profile recorded it.
        #[arg(long, value_parser = parse_kind)]
        device: Option<DeviceKind>,
        /// A category to grow: parameter, activation, gradient, optimizer, other (repeat for
        /// several).
        #[arg(long, required = true, value_parser = parse_category)]
        grow: Vec<Category>,
        /// The allocator: pytorch, pytorch-expandable, tf-bfc, or one of highwater's
        /// strategies (first-fit, best-fit, worst-fit, buddy, pool-based, adaptive).
        #[arg(long, default_value = "pytorch", value_parser = parse_allocator)]
        allocator: Allocator,
        /// PyTorch's `max_split_size_mb` (more than 20).
        #[arg(long)]
        max_split_size_mb: Option<u64>,
        /// Usable bytes instead of the device's nominal size (`30GiB`, `512MiB`).
        #[arg(long, value_parser = parse_size)]
        limit: Option<u64>,
        /// Which recorded device to replay, as for `simulate` (`cpu`: the CPU proxy).
        #[arg(long)]
        stream: Option<String>,
        /// Scale a category before the search: `parameter=0.5` for bf16 weights (repeatable).
        #[arg(long, value_parser = parse_scale)]
        scale: Vec<(Category, Factor)>,
        /// Shard a category over N ranks: `optimizer=8` for ZeRO stage 1 (repeatable).
        #[arg(long, value_parser = parse_shard)]
        shard: Vec<(Category, u64)>,
        /// With `--stream cpu`: the smallest heap block taken for a tensor.
        #[arg(long, default_value = "4KiB", value_parser = parse_size)]
        min_block: u64,
        /// Also write an HTML report with the figures table and the fit curve.
        #[arg(long)]
        html: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Compare the ranks of a multi-process run: one row per rank (peak and when, categories
    /// at the peak, the span that held most, residual growth per iteration, device), then the
    /// imbalance, the missing and unfinished ranks, and with --device which rank runs out first.
    ///
    /// Takes rank profiles (highwater names them PROFILE.rankN.json under torchrun, mpirun,
    /// srun or SessionBuilder::rank), or directories of them: every *.json there that is not
    /// hidden and not a .trace.json. Profiles of several runs are refused unless --run picks
    /// one. With --device, ranks whose profiles name an allocation log are also replayed as
    /// `fit` does: the largest --grow factor per rank and the run's.
    ///
    /// Exit code 3 when a rank does not fit --device; 2 for bad input (a file that is not a
    /// profile, two profiles of one rank, several runs).
    Ranks {
        /// Rank profiles, or directories of them.
        #[arg(required = true, value_name = "PROFILES_OR_DIR")]
        inputs: Vec<PathBuf>,
        /// The run to compare when the profiles hold several (the labels the error lists).
        #[arg(long, value_name = "RUN")]
        run: Option<String>,
        /// Check every rank against this device: tpu-v2, tpu-v3, tpu-v4, tpu-v5e, tpu-v5p,
        /// a100-40gb, a100-80gb, h100, h200, l4.
        #[arg(long, value_parser = parse_kind)]
        device: Option<DeviceKind>,
        /// Usable bytes instead of the device's nominal size (`30GiB`).
        #[arg(long, value_parser = parse_size, requires = "device")]
        limit: Option<u64>,
        /// With --device and allocation logs: a category to grow (repeatable; default
        /// activation, a batch factor).
        #[arg(long, value_parser = parse_category, requires = "device")]
        grow: Vec<Category>,
        /// With --device and allocation logs: the allocator of the replay, as for `fit`.
        #[arg(long, default_value = "pytorch", value_parser = parse_allocator)]
        allocator: Allocator,
        /// Print as text (a table) or JSON.
        #[arg(long, value_enum, default_value_t = RanksFormat::Text)]
        format: RanksFormat,
        /// Also write the HTML ranks page (curves by iteration and the table).
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Follow a running session's profile on the terminal: live and peak bytes by category,
    /// recent memory, the top spans, the current iteration; says whether the run is still
    /// going, finished or died. `q` quits.
    ///
    /// The session rewrites its profile as checkpoints while it records (HIGHWATER_CHECKPOINT);
    /// the profile need not exist yet when this starts.
    Watch {
        /// The profile the session writes (`highwater-profile.json`).
        profile: PathBuf,
        /// How often to read the file again, in seconds.
        #[arg(long, default_value = "0.5", value_parser = parse_refresh)]
        refresh: Duration,
    },
}

/// Refresh periods from 50 ms to an hour, in seconds (`0.5`, `2`).
fn parse_refresh(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds like 0.5 or 2"))?;
    if !(0.05..=3600.0).contains(&seconds) {
        return Err(format!("{text:?} is outside 0.05 to 3600 seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn parse_allocator(text: &str) -> Result<Allocator, String> {
    text.parse()
        .map_err(|error: ParseNameError| error.to_string())
}

/// `category=factor`.
fn parse_scale(text: &str) -> Result<(Category, Factor), String> {
    let (category, factor) = text
        .split_once('=')
        .ok_or_else(|| format!("expected CATEGORY=FACTOR such as parameter=0.5, got {text:?}"))?;
    let factor = factor
        .parse()
        .map_err(|e: highwater_device::ParseFactorError| e.to_string())?;
    Ok((parse_category(category)?, factor))
}

/// `category=ranks`.
fn parse_shard(text: &str) -> Result<(Category, u64), String> {
    let (category, ranks) = text
        .split_once('=')
        .ok_or_else(|| format!("expected CATEGORY=RANKS such as optimizer=8, got {text:?}"))?;
    let ranks: u64 = ranks
        .trim()
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("ranks must be a whole number above 0, got {ranks:?}"))?;
    Ok((parse_category(category)?, ranks))
}

fn parse_kind(text: &str) -> Result<DeviceKind, String> {
    text.parse()
        .map_err(|error: ParseNameError| error.to_string())
}

fn parse_strategy(text: &str) -> Result<Strategy, String> {
    text.parse()
        .map_err(|error: ParseNameError| error.to_string())
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Chrome Trace Event JSON, for ui.perfetto.dev and chrome://tracing.
    Chrome,
    /// A self-contained HTML report that opens from disk.
    Html,
    /// PyTorch's CUDA memory snapshot (a pickle for pytorch.org/memory_viz), from the run's
    /// allocation log (record with HIGHWATER_ALLOC_LOG=path).
    Torch,
    /// A gzipped pprof profile.proto of the call sites, for `go tool pprof`, Perfetto,
    /// speedscope and Pyroscope.
    Pprof,
}

/// What `highwater ranks` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum RanksFormat {
    /// A table, then the run's figures.
    Text,
    /// JSON: the run, a row per rank, the figures and the device check.
    Json,
}

impl Format {
    /// The name `--format` takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Chrome => "chrome",
            Format::Html => "html",
            Format::Torch => "torch",
            Format::Pprof => "pprof",
        }
    }
}

/// How `highwater sites` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SiteSort {
    /// Bytes live at the peak.
    Peak,
    /// Bytes allocated over the run.
    Allocated,
}

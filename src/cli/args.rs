//! The command line, as clap parses it.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

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
    /// The span tree with calls, time and memory metrics.
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
    /// Write the profile as a Chrome/Perfetto trace or a self-contained HTML report.
    Export {
        /// A profile written by highwater.
        profile: PathBuf,
        /// The output format.
        #[arg(short, long, value_enum)]
        format: Format,
        /// Where to write; `-` for standard output. Default: next to the profile, with the
        /// extension `.trace.json` (chrome) or `.html` (html).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

/// Export formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Chrome Trace Event JSON, for ui.perfetto.dev and chrome://tracing.
    Chrome,
    /// A self-contained HTML report that opens from disk.
    Html,
}

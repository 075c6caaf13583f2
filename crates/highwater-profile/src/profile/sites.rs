//! Call sites: where the sampled allocations of a run came from.
//!
//! Allocations are sampled by bytes (see [`SiteSampling`]); each sample stands for
//! `s / (1 - e^(-s/R))` bytes, so the per-site figures below are unbiased estimates, each with
//! its standard error.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::Category;

/// Most [`CallSite`]s a profile lists; the rest are summed in
/// [`SiteSampling::unlisted_peak_bytes`] and [`SiteSampling::unlisted_alloc_bytes`].
pub const MAX_CALL_SITES: usize = 1000;

/// How call sites were sampled in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct SiteSampling {
    /// Mean bytes between samples (`R`); `0` when sampling was off, `1` when every allocation's
    /// stack was recorded.
    pub mean_bytes: u64,
    /// How stacks could be walked, fast path first (`"frame-pointers, eh-frame"`: by frame
    /// pointers where they can be trusted, by call-frame information elsewhere;
    /// `"frame-pointers"` in profiles written before the second), empty when sampling was off.
    pub unwinder: String,
    /// Allocations whose stack was recorded.
    pub samples: u64,
    /// [`SiteSampling::samples`] by the unwinder that walked each stack
    /// ([`Unwinder::as_str`](crate::model::Unwinder::as_str): `"frame-pointers"`,
    /// `"eh-frame"`). Empty in profiles written before this was counted.
    #[serde(default)]
    pub samples_by_unwinder: BTreeMap<String, u64>,
    /// Samples whose stack was cut at the depth limit or at a frame the walk could not follow.
    pub truncated_stacks: u64,
    /// Samples whose stack does not start in highwater's allocator hook: empty, or starting at
    /// a named frame of other code. What a program built without frame pointers gives (see
    /// [`Warning::StacksWithoutHook`](super::Warning::StacksWithoutHook)). `0` in profiles
    /// written before this was counted.
    #[serde(default)]
    pub stacks_without_hook: u64,
    /// Deepest stack kept, in frames.
    pub max_depth: u32,
    /// Distinct stacks seen, listed or not.
    pub distinct_sites: u64,
    /// Estimated bytes live at the peak from sites past [`MAX_CALL_SITES`].
    pub unlisted_peak_bytes: u64,
    /// Estimated bytes allocated by sites past [`MAX_CALL_SITES`].
    pub unlisted_alloc_bytes: u64,
    /// Time spent symbolising after the session, ns.
    pub symbolize_ns: u64,
}

/// One distinct stack that allocated, with estimated figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct CallSite {
    /// Index of this site in [`Profile::sites`](crate::Profile::sites).
    pub id: u32,
    /// The stack, innermost (the allocating function) first; highwater's and the allocator's own
    /// frames trimmed. Inlined functions are frames of their own sharing the caller's `pc`,
    /// listed before the function they were inlined into.
    pub frames: Vec<Frame>,
    /// Estimated bytes live at the peak.
    pub peak_bytes: u64,
    /// Standard error of [`CallSite::peak_bytes`].
    pub peak_bytes_error: u64,
    /// Estimated allocations live at the peak.
    pub peak_count: u64,
    /// Estimated bytes allocated over the run.
    pub alloc_bytes: u64,
    /// Standard error of [`CallSite::alloc_bytes`].
    pub alloc_bytes_error: u64,
    /// Estimated allocations over the run.
    pub alloc_count: u64,
    /// Samples behind these estimates.
    pub samples: u64,
    /// [`CallSite::samples`] by the unwinder that walked their stacks (see
    /// [`SiteSampling::samples_by_unwinder`]). Empty in profiles written before this was
    /// counted.
    #[serde(default)]
    pub samples_by_unwinder: BTreeMap<String, u64>,
    /// The site's estimates split by where its allocations were made (span, op, category),
    /// largest at the peak first, at most [`MAX_SITE_SHARES`]; the rest are summed in one share
    /// with no span and no op, category [`Category::Other`].
    pub shares: Vec<SiteShare>,
}

/// Most [`SiteShare`]s one [`CallSite`] lists.
pub const MAX_SITE_SHARES: usize = 16;

/// The part of one call site's estimates made in one (span, op, category).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct SiteShare {
    /// Index into [`Profile::spans`](crate::Profile::spans), `None` outside every span.
    pub span: Option<u32>,
    /// The innermost op open at the allocation, when one was recorded.
    pub op: Option<String>,
    /// Category of the allocations.
    pub category: Category,
    /// Estimated bytes live at the peak.
    pub peak_bytes: u64,
    /// Estimated allocations live at the peak (blocks, each weighted like its bytes).
    #[serde(default)]
    pub peak_count: u64,
    /// The part of [`SiteShare::peak_bytes`] that was temporary: freed before the span that
    /// allocated it exited, on the peak's device, by the rule of
    /// [`Summary::peak_temporary_by_category`](crate::profile::Summary::peak_temporary_by_category)
    /// (an estimate, weighted like [`SiteShare::peak_bytes`]).
    #[serde(default)]
    pub peak_temporary_bytes: u64,
    /// Estimated bytes allocated over the run.
    pub alloc_bytes: u64,
    /// Estimated allocations over the run.
    pub alloc_count: u64,
}

/// One frame of a call site's stack.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "read", derive(serde::Deserialize))]
#[non_exhaustive]
pub struct Frame {
    /// Program counter (return address, as recorded), in the running process.
    pub pc: u64,
    /// Demangled function name, when the symbol was found.
    pub function: Option<String>,
    /// Source file, when line tables were present.
    pub file: Option<String>,
    /// Source line, when line tables were present.
    pub line: Option<u32>,
    /// Whether this frame was inlined into the next one (both share `pc`).
    pub inlined: bool,
}

impl Frame {
    /// The frame at program counter `pc`, not symbolised.
    pub fn at(pc: u64) -> Frame {
        Frame {
            pc,
            ..Frame::default()
        }
    }
}

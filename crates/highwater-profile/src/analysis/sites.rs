//! Call sites: the sampled allocations' stacks, their weights, and what they add up to.
//!
//! # Weights
//!
//! Capture samples an allocation of `s` bytes with probability `p(s) = 1 - e^(-s/R)`, or 1
//! from `4R` bytes on (and for every allocation when `R = 1`); see [`sample_probability`].
//! Each sample stands for `s / p` bytes and `1 / p` allocations, so a sum of weights over any
//! set of allocations (one site's, those live at the peak) is an unbiased estimate of its true
//! total. Its variance is `Σ s² (1 - p) / p` over the set's allocations, which the samples
//! estimate without bias as `Σ s² (1 - p) / p²` over the samples: the standard error
//! reported is its square root (about `√(R · bytes)`, a relative error of `1/√(bytes/R)`).
//!
//! # Live at the peak
//!
//! The sampled blocks that are live are kept in a side table keyed by address, each with the
//! peak epoch it became what it is, the way `live` does for every block: a block of an older
//! epoch than the current one was live at the latest peak, and one that is ended or
//! recategorised after the peak is kept, as it was, in a side list that a new peak clears.
//!
//! # Temporary at the peak
//!
//! Whether a block live at the peak was temporary is decided by the timeline's state/temporary
//! split (`analysis::temporary`), when the block (or what it was resized into) ends. A sampled
//! block that leaves the live table after the peak is handed back as a [`PeakSample`], its
//! place in the side list; the split carries it along with the block's fate and, when the block
//! turns out temporary, marks it ([`Sites::temporary_at_peak`]). Each share's temporary bytes
//! are then the weighted bytes of its marked samples: the same estimate as its bytes at the
//! peak, restricted to the blocks the summary's `peak_temporary_by_category` counts.
//!
//! # Sites
//!
//! Stacks are interned as program counters. When a profile is assembled they are resolved
//! ([`ResolveFrames`]), the innermost frames of highwater itself and of the allocator are
//! trimmed, and stacks that are the same once trimmed are one [`CallSite`].

use rustc_hash::FxHashMap;

use std::collections::BTreeMap;

use crate::model::{Category, StackWalk, Unwinder};
use crate::profile::{CallSite, Frame, SiteSampling, SiteShare, MAX_CALL_SITES, MAX_SITE_SHARES};

use super::event::StackId;
use super::live::NONE;
use crate::model::sample_probability;

/// Most sites a live-at-peak row names.
const TOP_SITES_PER_ROW: usize = 3;

/// Resolves program counters to frames, after the session (it may read files and allocate).
pub trait ResolveFrames: Send + std::fmt::Debug {
    /// The frames at each of `pcs` (return addresses as recorded), innermost first: functions
    /// inlined at that address before the function they were inlined into. An address that
    /// cannot be resolved gives one frame with only its `pc`.
    fn resolve(&self, pcs: &[u64]) -> Vec<Vec<Frame>>;

    /// The directory of the recording library's own sources, ending in `/`. Every sampled
    /// stack starts in the recorder's hook; its frames (inlined ones carry short names only, so
    /// they are told by their file) are trimmed from the stacks.
    fn recorder_sources(&self) -> &str;

    /// Time the last [`ResolveFrames::resolve`] took, ns.
    fn last_resolve_ns(&self) -> u64 {
        0
    }
}

/// Where a sampled block was allocated, as the live-at-peak rows group blocks: span node,
/// innermost op id and category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ShareKey {
    pub(crate) node: u32,
    pub(crate) op: u32,
    pub(crate) category: Category,
}

/// A sampled block live at the latest peak that has ended or changed since: its place in the
/// side list, until a new peak clears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PeakSample(u32);

/// Weighted sums of samples.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    samples: u64,
    bytes: f64,
    count: f64,
    variance: f64,
}

impl Figures {
    fn add_sample(&mut self, size: u64, mean: u64) {
        let p = sample_probability(size, mean);
        let size = size as f64;
        self.samples += 1;
        self.bytes += size / p;
        self.count += 1.0 / p;
        self.variance += size * size * (1.0 - p) / (p * p);
    }

    fn add(&mut self, other: &Figures) {
        self.samples += other.samples;
        self.bytes += other.bytes;
        self.count += other.count;
        self.variance += other.variance;
    }
}

/// Weighted sums of the samples live at the peak in one share.
#[derive(Debug, Clone, Copy, Default)]
struct AtPeak {
    bytes: f64,
    count: f64,
    /// The part of `bytes` that was temporary.
    temporary_bytes: f64,
}

impl AtPeak {
    fn add(&mut self, other: &AtPeak) {
        self.bytes += other.bytes;
        self.count += other.count;
        self.temporary_bytes += other.temporary_bytes;
    }
}

/// One interned stack and the samples taken from it.
#[derive(Debug)]
struct Stack {
    pcs: Box<[u64]>,
    /// Some walk of this stack was cut.
    truncated: bool,
    /// The method that walked it (the same addresses walked another way are another stack).
    unwinder: Unwinder,
    allocated: Figures,
    /// Allocated figures by where the samples were taken.
    shares: FxHashMap<ShareKey, Figures>,
}

/// A sampled block live now (or, in the side list, as it was at the peak).
#[derive(Debug, Clone, Copy)]
struct Block {
    stack: u32,
    size: u64,
    key: ShareKey,
    /// Peaks marked before it became what it is.
    epoch: u64,
    /// In the side list: it turned out temporary at the peak.
    temporary: bool,
}

/// The call-site state of a timeline.
#[derive(Debug, Default)]
pub(crate) struct Sites {
    mean_bytes: u64,
    unwinder: String,
    stacks: Vec<Stack>,
    ids: FxHashMap<(Box<[u64]>, Unwinder), u32>,
    live: FxHashMap<u64, Block>,
    epoch: u64,
    peaked: bool,
    /// Sequence number of the event that marked the latest peak.
    peak_seq: u64,
    /// Sampled blocks live at the peak that were ended or recategorised since.
    since_peak: Vec<Block>,
    resolver: Option<Box<dyn ResolveFrames>>,
}

/// What [`Sites::report`] gives the profile.
#[derive(Debug, Default)]
pub(crate) struct SitesReport {
    pub(crate) sites: Vec<CallSite>,
    pub(crate) sampling: SiteSampling,
    /// The listed sites behind each live-at-peak group, largest first.
    pub(crate) top_sites: FxHashMap<ShareKey, Vec<u32>>,
}

/// One call site while the report is built.
#[derive(Debug, Default)]
struct Group<'a> {
    /// Borrowed from the resolved table: only listed sites' frames are ever copied.
    frames: Vec<&'a Frame>,
    /// Samples by the unwinder that walked their stacks.
    unwinders: BTreeMap<Unwinder, u64>,
    allocated: Figures,
    at_peak: Figures,
    /// (figures at the peak, allocated figures) by where.
    shares: FxHashMap<ShareKey, (AtPeak, Figures)>,
}

impl Sites {
    /// Says how the session sampled: mean bytes `R` and the unwinder's name.
    pub(crate) fn set_sampling(&mut self, mean_bytes: u64, unwinder: &str) {
        self.mean_bytes = mean_bytes;
        self.unwinder = if mean_bytes == 0 {
            String::new()
        } else {
            unwinder.to_string()
        };
    }

    /// Resolves stacks when a profile is assembled.
    pub(crate) fn set_resolver(&mut self, resolver: Box<dyn ResolveFrames>) {
        self.resolver = Some(resolver);
    }

    /// The id of a stack, innermost first, walked as `walk` says.
    pub(crate) fn intern_stack(&mut self, pcs: &[u64], walk: impl Into<StackWalk>) -> StackId {
        let walk: StackWalk = walk.into();
        let key = (Box::<[u64]>::from(pcs), walk.unwinder);
        if let Some(&id) = self.ids.get(&key) {
            let stack = &mut self.stacks[id as usize];
            stack.truncated |= walk.truncated;
            return StackId(id);
        }
        let id = u32::try_from(self.stacks.len()).unwrap_or(NONE);
        let pcs = key.0.clone();
        self.ids.insert(key, id);
        self.stacks.push(Stack {
            pcs,
            truncated: walk.truncated,
            unwinder: walk.unwinder,
            allocated: Figures::default(),
            shares: FxHashMap::default(),
        });
        StackId(id)
    }

    /// The block just made live at `addr` by event `alloc_seq` was sampled from `stack`.
    /// A stack id never interned is ignored.
    pub(crate) fn sampled(
        &mut self,
        addr: u64,
        size: u64,
        key: ShareKey,
        stack: StackId,
        alloc_seq: u64,
    ) {
        let Some(entry) = self.stacks.get_mut(stack.0 as usize) else {
            return;
        };
        entry.allocated.add_sample(size, self.mean_bytes);
        entry
            .shares
            .entry(key)
            .or_default()
            .add_sample(size, self.mean_bytes);
        // The allocation itself may have set the latest peak: then it counts there.
        let epoch = if self.peaked && self.peak_seq == alloc_seq {
            self.epoch - 1
        } else {
            self.epoch
        };
        let block = Block {
            stack: stack.0,
            size,
            key,
            epoch,
            temporary: false,
        };
        if let Some(old) = self.live.insert(addr, block) {
            self.forget(old);
        }
    }

    fn was_live_at_peak(&self, block: &Block) -> bool {
        self.peaked && block.epoch < self.epoch
    }

    /// A block left the live table (or changed): the side list keeps it, as it was, if it
    /// counted at the peak.
    fn forget(&mut self, block: Block) -> Option<PeakSample> {
        if !self.was_live_at_peak(&block) {
            return None;
        }
        let at = u32::try_from(self.since_peak.len()).ok()?;
        self.since_peak.push(block);
        Some(PeakSample(at))
    }

    /// The heap block at `addr` ended (freed, or the old side of a realloc); if it was a
    /// sampled block live at the peak, where it is kept now.
    #[inline]
    pub(crate) fn ended(&mut self, addr: u64) -> Option<PeakSample> {
        if self.live.is_empty() {
            return None;
        }
        let block = self.live.remove(&addr)?;
        self.forget(block)
    }

    /// The sampled block kept at `sample` was temporary at the peak (see the module docs).
    pub(crate) fn temporary_at_peak(&mut self, sample: PeakSample) {
        if let Some(block) = self.since_peak.get_mut(sample.0 as usize) {
            block.temporary = true;
        }
    }

    /// The sampled block at `from`, if any, is known by `to` from now on (see `LiveSet::rekey`).
    pub(crate) fn rekeyed(&mut self, from: u64, to: u64) {
        if let Some(block) = self.live.remove(&from) {
            if let Some(displaced) = self.live.insert(to, block) {
                self.forget(displaced);
            }
        }
    }

    /// The heap block at `addr` has `category` from now on; if it was a sampled block live
    /// at the peak, where what it was there is kept now.
    pub(crate) fn recategorised(&mut self, addr: u64, category: Category) -> Option<PeakSample> {
        let epoch = self.epoch;
        let block = self.live.get_mut(&addr)?;
        let before = *block;
        block.key.category = category;
        block.epoch = epoch;
        self.forget(before)
    }

    /// The heap block at `addr` was made by op `op`.
    pub(crate) fn annotated(&mut self, addr: u64, op: u32) {
        if let Some(block) = self.live.get_mut(&addr) {
            block.key.op = op;
        }
    }

    /// Event `seq` set a new global peak: every sampled block live now counts at it.
    pub(crate) fn mark_peak(&mut self, seq: u64) {
        self.epoch += 1;
        self.peaked = true;
        self.peak_seq = seq;
        self.since_peak.clear();
    }

    /// The call sites as of now. `op_name` names an op id.
    pub(crate) fn report(&self, op_name: impl Fn(u32) -> Option<String>) -> SitesReport {
        let mut report = SitesReport {
            sampling: SiteSampling {
                mean_bytes: self.mean_bytes,
                unwinder: self.unwinder.clone(),
                ..SiteSampling::default()
            },
            ..SitesReport::default()
        };
        if self.stacks.is_empty() {
            return report;
        }
        // What was live at the peak, by stack and by (stack, where).
        let mut at_peak: FxHashMap<u32, Figures> = FxHashMap::default();
        let mut share_at_peak: FxHashMap<(u32, ShareKey), AtPeak> = FxHashMap::default();
        let live_at_peak = self
            .live
            .values()
            .filter(|block| self.was_live_at_peak(block))
            .chain(&self.since_peak);
        for block in live_at_peak {
            let mut one = Figures::default();
            one.add_sample(block.size, self.mean_bytes);
            at_peak.entry(block.stack).or_default().add(&one);
            let share = AtPeak {
                bytes: one.bytes,
                count: one.count,
                temporary_bytes: if block.temporary { one.bytes } else { 0.0 },
            };
            share_at_peak
                .entry((block.stack, block.key))
                .or_default()
                .add(&share);
        }

        let frames_at = self.resolve_all();
        let recorder = self.resolver.as_ref().map_or("", |r| r.recorder_sources());
        report.sampling.symbolize_ns = self.resolver.as_ref().map_or(0, |r| r.last_resolve_ns());

        // Stacks that are the same once trimmed are one site.
        let mut groups: Vec<Group> = Vec::new();
        let mut group_of: FxHashMap<Vec<u64>, usize> = FxHashMap::default();
        let mut stack_group: Vec<usize> = Vec::with_capacity(self.stacks.len());
        for (id, stack) in self.stacks.iter().enumerate() {
            let frames = trimmed_frames(&stack.pcs, &frames_at, recorder);
            let key: Vec<u64> = frames.iter().map(|frame| frame.pc).collect();
            let index = *group_of.entry(key).or_insert_with(|| {
                groups.push(Group {
                    frames,
                    ..Group::default()
                });
                groups.len() - 1
            });
            stack_group.push(index);
            let group = &mut groups[index];
            *group.unwinders.entry(stack.unwinder).or_default() += stack.allocated.samples;
            *report
                .sampling
                .samples_by_unwinder
                .entry(stack.unwinder.as_str().to_string())
                .or_default() += stack.allocated.samples;
            group.allocated.add(&stack.allocated);
            if let Some(peak) = at_peak.get(&(id as u32)) {
                group.at_peak.add(peak);
            }
            for (key, figures) in &stack.shares {
                group.shares.entry(*key).or_default().1.add(figures);
            }
            report.sampling.samples += stack.allocated.samples;
            if stack.truncated {
                report.sampling.truncated_stacks += stack.allocated.samples;
            }
            if !starts_at_the_hook(&stack.pcs, &frames_at, recorder) {
                report.sampling.stacks_without_hook += stack.allocated.samples;
            }
            report.sampling.max_depth = report.sampling.max_depth.max(stack.pcs.len() as u32);
        }
        for (&(stack, key), peak) in &share_at_peak {
            let group = &mut groups[stack_group[stack as usize]];
            group.shares.entry(key).or_default().0.add(peak);
        }
        report.sampling.distinct_sites = groups.len() as u64;

        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&groups[a], &groups[b]);
            b.at_peak
                .bytes
                .total_cmp(&a.at_peak.bytes)
                .then(b.allocated.bytes.total_cmp(&a.allocated.bytes))
                .then_with(|| {
                    let pcs = |g: &Group| g.frames.iter().map(|f| f.pc).collect::<Vec<_>>();
                    pcs(a).cmp(&pcs(b))
                })
        });
        let mut site_of_group = vec![None; groups.len()];
        for (rank, &index) in order.iter().enumerate() {
            let group = &mut groups[index];
            if rank >= MAX_CALL_SITES {
                report.sampling.unlisted_peak_bytes += estimate(group.at_peak.bytes);
                report.sampling.unlisted_alloc_bytes += estimate(group.allocated.bytes);
                continue;
            }
            let id = rank as u32;
            site_of_group[index] = Some(id);
            let mut frames: Vec<Frame> = group.frames.iter().map(|&frame| frame.clone()).collect();
            qualify_closures(&mut frames);
            report.sites.push(CallSite {
                id,
                frames,
                peak_bytes: estimate(group.at_peak.bytes),
                peak_bytes_error: estimate(group.at_peak.variance.sqrt()),
                peak_count: estimate(group.at_peak.count),
                alloc_bytes: estimate(group.allocated.bytes),
                alloc_bytes_error: estimate(group.allocated.variance.sqrt()),
                alloc_count: estimate(group.allocated.count),
                samples: group.allocated.samples,
                samples_by_unwinder: group
                    .unwinders
                    .iter()
                    .map(|(unwinder, &samples)| (unwinder.as_str().to_string(), samples))
                    .collect(),
                shares: shares(&group.shares, &op_name),
            });
        }

        // The listed sites behind each live-at-peak group.
        let mut by_key: FxHashMap<ShareKey, Vec<(u32, f64)>> = FxHashMap::default();
        for (index, group) in groups.iter().enumerate() {
            let Some(site) = site_of_group[index] else {
                continue;
            };
            for (key, (peak, _)) in &group.shares {
                if peak.bytes > 0.0 {
                    by_key.entry(*key).or_default().push((site, peak.bytes));
                }
            }
        }
        for (key, mut sites) in by_key {
            sites.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            sites.truncate(TOP_SITES_PER_ROW);
            report
                .top_sites
                .insert(key, sites.into_iter().map(|(site, _)| site).collect());
        }
        report
    }

    /// Frames of every program counter of every stack.
    fn resolve_all(&self) -> FxHashMap<u64, Vec<Frame>> {
        let mut pcs: Vec<u64> = self
            .stacks
            .iter()
            .flat_map(|stack| stack.pcs.iter().copied())
            .collect();
        pcs.sort_unstable();
        pcs.dedup();
        let resolved = match &self.resolver {
            Some(resolver) => resolver.resolve(&pcs),
            None => Vec::new(),
        };
        let mut resolved = resolved.into_iter();
        pcs.into_iter()
            .map(|pc| {
                let frames = resolved
                    .next()
                    .filter(|frames| !frames.is_empty())
                    .unwrap_or_else(|| vec![bare(pc)]);
                (pc, frames)
            })
            .collect()
    }
}

/// A frame known only by its address.
fn bare(pc: u64) -> Frame {
    Frame {
        pc,
        ..Frame::default()
    }
}

/// A stack's frames, innermost first, without the leading frames of the recorder (whose
/// sources are under `recorder`, see [`ResolveFrames::recorder_sources`]) and of the allocator
/// (all of them kept when nothing else is left).
///
/// The leading run is the frames that are highwater's or the allocator's, or the standard
/// library's (a thread-local access inlined into the hook); it is trimmed up to its last frame
/// of highwater or the allocator, so `RawVec` and the caller's frames stay.
pub fn trimmed_frames<'a>(
    pcs: &[u64],
    frames_at: &'a FxHashMap<u64, Vec<Frame>>,
    recorder: &str,
) -> Vec<&'a Frame> {
    let all: Vec<&Frame> = pcs
        .iter()
        .flat_map(|pc| frames_at.get(pc).map(Vec::as_slice).unwrap_or_default())
        .collect();
    let mut trimmed = 0;
    for (index, frame) in all.iter().enumerate() {
        if is_allocator_frame(frame, recorder) {
            trimmed = index + 1;
        } else if !is_std_frame(frame) {
            break;
        }
    }
    let mut all = all;
    if trimmed < all.len() {
        all.drain(..trimmed);
    }
    all
}

/// Gives each inlined closure that DWARF names only `{closure#0}` (line-tables-only debug info)
/// the path of the function it is written in: the nearest frame outward in the stack whose code
/// is in the same file and whose name is a path (a closure is usually called where it is
/// written, through the standard library's iterator adapters in between).
pub fn qualify_closures(frames: &mut [Frame]) {
    for index in 0..frames.len() {
        let short = match &frames[index].function {
            Some(name) if name.starts_with("{closure") && !has_path(name) => name.clone(),
            _ => continue,
        };
        let Some(file) = frames[index].file.clone() else {
            continue;
        };
        let around = frames[index + 1..].iter().find(|outer| {
            outer.file.as_deref() == Some(file.as_str())
                && outer.function.as_deref().is_some_and(has_path)
        });
        let path = around
            .and_then(|outer| outer.function.clone())
            .or_else(|| closure_type_path(&frames[index + 1..], &short));
        if let Some(path) = path {
            frames[index].function = Some(format!("{path}::{short}"));
        }
    }
}

/// The path of the function a closure `{closure#N}` is written in, from the name of its type
/// (`a::f::{closure_env#N}`) as it appears among the generic arguments of the frames around it
/// (an iterator adapter instantiated for it), where the function itself left no frame.
fn closure_type_path(outer: &[Frame], short: &str) -> Option<String> {
    let number = short.strip_prefix("{closure#")?.split('}').next()?;
    let needle = format!("::{{closure_env#{number}}}");
    outer.iter().find_map(|frame| {
        let name = frame.function.as_deref()?;
        let at = name.find(&needle)?;
        let start = name[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(0, |before| before + 1);
        let path = &name[start..at];
        has_path(path).then(|| path.to_string())
    })
}

/// Whether a function name has a path: `::` outside its generic arguments.
fn has_path(name: &str) -> bool {
    let mut depth = 0usize;
    let mut previous = ' ';
    for c in name.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            ':' if depth == 0 && previous == ':' => return true,
            _ => {}
        }
        previous = c;
    }
    false
}

/// Whether a walked stack starts in highwater's hook, as every frame-pointer walk does when the
/// hook has frame pointers. `false` for an empty stack or one whose innermost frame is named
/// and someone else's (the walk started from a frame-pointer register the hook never set);
/// `true` when the frame has no name to tell (no symbols).
fn starts_at_the_hook(pcs: &[u64], frames_at: &FxHashMap<u64, Vec<Frame>>, recorder: &str) -> bool {
    let Some(innermost) = pcs.first() else {
        return false;
    };
    // The standard library's frames the hook calls through (a thread-local access, named so
    // where highwater was built without debug info) come before the hook's own.
    let outer_frames = pcs
        .iter()
        .map(|pc| frames_at.get(pc).and_then(|frames| frames.last()));
    for frame in outer_frames {
        match frame {
            Some(frame) if frame.function.is_some() && is_std_frame(frame) => continue,
            Some(frame) => {
                return frame.function.is_none() || is_allocator_frame(frame, recorder);
            }
            None => return true,
        }
    }
    frames_at.get(innermost).is_none()
}

/// Whether a frame is the recorder's own (its sources under `recorder`) or the allocator's:
/// what every sampled stack starts with, which says nothing about the caller. Inlined frames
/// are named by their short function name only, so their file says whose they are.
fn is_allocator_frame(frame: &Frame, recorder: &str) -> bool {
    /// The standard library's allocator front ends (`alloc::alloc`, `std::alloc`,
    /// `core::alloc`), by source file: inlined, their frames carry short names only.
    const STD_ALLOCATOR_FILES: [&str; 3] = [
        "/library/alloc/src/alloc.rs",
        "/library/std/src/alloc.rs",
        "/library/core/src/alloc/",
    ];
    frame.file.as_deref().is_some_and(|file| {
        (!recorder.is_empty() && file.starts_with(recorder))
            || (file.starts_with("/rustc/")
                && STD_ALLOCATOR_FILES.iter().any(|part| file.contains(part)))
    }) || frame.function.as_deref().is_some_and(is_allocator_function)
}

/// Whether a frame is the standard library's, by its source path or, where it has none (code
/// instantiated in a crate built without debug info), by its name.
fn is_std_frame(frame: &Frame) -> bool {
    const PREFIXES: [&str; 6] = [
        "std::", "core::", "alloc::", "<std::", "<core::", "<alloc::",
    ];
    match (frame.file.as_deref(), frame.function.as_deref()) {
        (Some(file), _) => file.starts_with("/rustc/"),
        (None, Some(function)) => PREFIXES.iter().any(|prefix| function.starts_with(prefix)),
        (None, None) => false,
    }
}

/// Whether a (demangled) function name is highwater's or the global allocator's.
fn is_allocator_function(function: &str) -> bool {
    const PREFIXES: [&str; 12] = [
        "highwater::",
        "<highwater::",
        "__rust_",
        "__rustc::",
        "__rg_",
        "__rdl_",
        "alloc::alloc::",
        "<alloc::alloc::Global",
        "std::alloc::",
        "<std::alloc::System",
        "core::alloc::",
        "<core::alloc::",
    ];
    PREFIXES.iter().any(|prefix| function.starts_with(prefix))
}

/// An estimate rounded to whole bytes or allocations.
fn estimate(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value.round() as u64
    } else {
        0
    }
}

/// A site's shares, largest at the peak first; past [`MAX_SITE_SHARES`], the rest in one.
fn shares(
    by_key: &FxHashMap<ShareKey, (AtPeak, Figures)>,
    op_name: &impl Fn(u32) -> Option<String>,
) -> Vec<SiteShare> {
    let mut rows: Vec<(&ShareKey, &(AtPeak, Figures))> = by_key.iter().collect();
    rows.sort_by(|a, b| {
        b.1 .0
            .bytes
            .total_cmp(&a.1 .0.bytes)
            .then(b.1 .1.bytes.total_cmp(&a.1 .1.bytes))
            .then((a.0.node, a.0.op, a.0.category).cmp(&(b.0.node, b.0.op, b.0.category)))
    });
    let share = |key: Option<&ShareKey>, peak: &AtPeak, allocated: &Figures| SiteShare {
        span: key.and_then(|key| (key.node != NONE).then_some(key.node)),
        op: key.and_then(|key| (key.op != NONE).then(|| op_name(key.op)).flatten()),
        category: key.map_or(Category::Other, |key| key.category),
        peak_bytes: estimate(peak.bytes),
        peak_count: estimate(peak.count),
        // Summed apart, the part could round a byte above the whole.
        peak_temporary_bytes: estimate(peak.temporary_bytes).min(estimate(peak.bytes)),
        alloc_bytes: estimate(allocated.bytes),
        alloc_count: estimate(allocated.count),
    };
    if rows.len() <= MAX_SITE_SHARES {
        return rows
            .into_iter()
            .map(|(key, (peak, allocated))| share(Some(key), peak, allocated))
            .collect();
    }
    let rest = rows.split_off(MAX_SITE_SHARES - 1);
    let mut out: Vec<SiteShare> = rows
        .into_iter()
        .map(|(key, (peak, allocated))| share(Some(key), peak, allocated))
        .collect();
    let mut peak = AtPeak::default();
    let mut allocated = Figures::default();
    for (_, (at_peak, figures)) in rest {
        peak.add(at_peak);
        allocated.add(figures);
    }
    out.push(share(None, &peak, &allocated));
    out
}

#[cfg(test)]
mod tests;

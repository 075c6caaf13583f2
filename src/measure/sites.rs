//! Call sites of a measurement: which code allocated, from stacks sampled by bytes.
//!
//! Exact figures per call site would take a stack walk on every allocation, several times the
//! cost of the rest of the meter. Instead a meter samples as capture does: a countdown of bytes
//! drawn from an exponential distribution with mean [`SAMPLE_BYTES`], so a block of `s` bytes
//! is sampled with probability `p(s) = 1 - e^(-s/R)`, and always from `4R` bytes on. A sample
//! stands for `s / p` bytes: summed by site, the estimates are unbiased. The generator starts
//! from the same seed in every meter, so a closure that allocates the same way gives the same
//! samples, and the same failure message, on every run.
//!
//! Only a sampled allocation walks the stack (by frame pointers, [`crate::capture::stack`]);
//! its stack is interned in a table mapped with `mmap` on the first sample. Symbols are
//! resolved only when a budget fails ([`name_sites`]), never in the hook.

use std::cell::Cell;
use std::ptr::NonNull;

use rustc_hash::FxHashMap;

use super::SiteFigures;
use crate::analysis::{qualify_closures, trimmed_frames, ResolveFrames};
use crate::capture::frames::{StackBounds, Walked, MAX_FRAMES};
use crate::capture::sample;
use crate::capture::stack;
use crate::model::sample_probability;
use crate::profile::Frame;

/// Mean bytes between samples in a measurement (`R`): 64 KiB, so a test's megabytes give
/// dozens of samples, and blocks from 256 KiB up are always sampled.
pub(crate) const SAMPLE_BYTES: u64 = 64 * 1024;
/// Blocks of at least this many bytes are always sampled (the session's rule, at this mean).
const ALWAYS_SAMPLED: u64 = sample::ALWAYS_SAMPLED_MEANS * SAMPLE_BYTES;
/// Distinct stacks a meter keeps; samples of further stacks are summed in one row with no
/// stack.
pub(crate) const MAX_SITES: usize = 64;
/// The site tag of a block that was not sampled.
pub(crate) const UNSAMPLED: u16 = 0;
/// The site tag of samples past [`MAX_SITES`] stacks (or with no memory for the table).
const OTHER: u16 = MAX_SITES as u16 + 1;
/// Every meter's generator starts here (any odd constant).
const SEED: u64 = 0x5EED_0F5A_3B1E_0005;

thread_local! {
    /// This thread's stack mapping, found on its first sample.
    static STACK_BOUNDS: Cell<StackBounds> = const { Cell::new(StackBounds::UNKNOWN) };
}

const _: () = assert!(!std::mem::needs_drop::<Cell<StackBounds>>());

/// One site's estimates, in bytes (fractional: each sample adds `s / p`).
#[derive(Debug, Clone, Copy, Default)]
struct Estimates {
    allocated: f64,
    live: f64,
    /// `live` at the meter's peak number `epoch` (as the meter's span nodes keep it).
    at_peak: f64,
    epoch: u64,
    samples: u64,
}

impl Estimates {
    fn live(&mut self, peak_epoch: u64, change: f64) {
        if self.epoch != peak_epoch {
            self.at_peak = self.live;
            self.epoch = peak_epoch;
        }
        self.live += change;
    }

    fn at_peak(&self, peak_epoch: u64) -> f64 {
        if self.epoch == peak_epoch {
            self.at_peak
        } else {
            self.live
        }
    }
}

/// A sampled stack and its estimates.
#[derive(Debug, Clone, Copy)]
struct Site {
    figures: Estimates,
    len: usize,
    truncated: bool,
    pcs: [u64; MAX_FRAMES],
}

/// A meter's sampling state and its sites. Nothing here allocates through the global
/// allocator, locks or panics.
///
/// The countdown lives in the meter (`left`, what its fast path compares a size with) and
/// here (`rest`): `left` is capped at `4R` so that a block that is always sampled always takes
/// the slow path, and `rest` is the drawn distance beyond the cap.
#[derive(Debug)]
pub(crate) struct Sampler {
    /// The stack `measure` was called from, walked when the meter was made: a sampled stack
    /// loses the frames it shares with it, so that the same closure gives the same stacks
    /// wherever it is measured from.
    outer: [u64; MAX_FRAMES],
    outer_len: usize,
    rest: u64,
    state: u64,
    /// `MAX_SITES` slots from `mmap` once a sample was taken.
    sites: Option<NonNull<Site>>,
    len: usize,
    other: Estimates,
}

impl Sampler {
    /// A sampler, and the countdown its meter starts with.
    pub(crate) fn new() -> (Sampler, u64) {
        let outer = walk();
        let mut sampler = Sampler {
            outer: outer.pcs,
            outer_len: outer.len.min(MAX_FRAMES),
            rest: 0,
            state: SEED,
            sites: None,
            len: 0,
            other: Estimates::default(),
        };
        let distance = sample::next_distance(&mut sampler.state, SAMPLE_BYTES);
        let left = sampler.split(distance);
        (sampler, left)
    }

    /// Splits a distance into the capped countdown (returned) and `rest`.
    fn split(&mut self, distance: u64) -> u64 {
        let left = distance.min(ALWAYS_SAMPLED);
        self.rest = distance - left;
        left
    }

    /// A block of `size` bytes reached the countdown `left` (`size >= *left`): sample it if
    /// the whole drawn distance or the always-sampled size says so, and set the next
    /// countdown. Returns the block's site tag ([`UNSAMPLED`] if not sampled). `growth` is what
    /// the block added to the meter's allocated bytes.
    #[inline(never)]
    pub(crate) fn allocated(
        &mut self,
        size: u64,
        growth: u64,
        peak_epoch: u64,
        left: &mut u64,
    ) -> u16 {
        let distance = left.saturating_add(self.rest);
        if size < distance && size < ALWAYS_SAMPLED {
            // Only the cap sent it here.
            *left = self.split(distance - size);
            return UNSAMPLED;
        }
        let next = sample::next_distance(&mut self.state, SAMPLE_BYTES);
        *left = self.split(next);
        let walked = walk();
        let pcs = &walked.pcs[..walked.len.min(MAX_FRAMES)];
        let shared = pcs
            .iter()
            .rev()
            .zip(self.outer[..self.outer_len].iter().rev())
            .take_while(|(a, b)| a == b)
            .count();
        let tag = self.intern(&pcs[..pcs.len() - shared], walked.truncated);
        let weight = 1.0 / sample_probability(size, SAMPLE_BYTES);
        let figures = self.figures(tag);
        figures.samples += 1;
        figures.allocated += growth as f64 * weight;
        figures.live(peak_epoch, size as f64 * weight);
        tag
    }

    /// A sampled block of `size` bytes, of site `tag`, ended.
    #[inline(never)]
    pub(crate) fn ended(&mut self, tag: u16, size: u64, peak_epoch: u64) {
        let weight = 1.0 / sample_probability(size, SAMPLE_BYTES);
        self.figures(tag).live(peak_epoch, -(size as f64 * weight));
    }

    /// The site tag of `pcs`, interned if new.
    fn intern(&mut self, pcs: &[u64], truncated: bool) -> u16 {
        let Some(sites) = self.mapped() else {
            return OTHER;
        };
        let found = (0..self.len).find(|&index| {
            // SAFETY: indices below `len` are initialised slots of the mapping.
            let site = unsafe { &*sites.as_ptr().add(index) };
            site.len == pcs.len() && site.pcs[..site.len] == *pcs
        });
        let index = match found {
            Some(index) => index,
            None if self.len == MAX_SITES => return OTHER,
            None => {
                let mut site = Site {
                    figures: Estimates::default(),
                    len: pcs.len(),
                    truncated,
                    pcs: [0; MAX_FRAMES],
                };
                site.pcs[..pcs.len()].copy_from_slice(pcs);
                // SAFETY: `len < MAX_SITES`, a slot of the mapping; writing it whole.
                unsafe { sites.as_ptr().add(self.len).write(site) };
                self.len += 1;
                self.len - 1
            }
        };
        index as u16 + 1
    }

    fn figures(&mut self, tag: u16) -> &mut Estimates {
        let index = usize::from(tag).wrapping_sub(1);
        match self.sites {
            // SAFETY: a tag other than `OTHER` was handed out by `intern` for an initialised
            // slot (`index < len`), which stays valid until `drop`.
            Some(sites) if index < self.len => unsafe { &mut (*sites.as_ptr().add(index)).figures },
            _ => &mut self.other,
        }
    }

    /// The site table, mapped on first use; `None` if no memory can be mapped.
    fn mapped(&mut self) -> Option<NonNull<Site>> {
        if self.sites.is_none() {
            self.sites =
                crate::sys::memory::map_zeroed(MAX_SITES * size_of::<Site>()).map(NonNull::cast);
        }
        self.sites
    }

    /// Every site with samples, as public rows, largest at the peak first; called once the
    /// meter is out of the hook's reach, so it may allocate.
    pub(crate) fn finish(&self, peak_epoch: u64) -> Vec<SiteFigures> {
        let mut rows: Vec<SiteFigures> = Vec::new();
        let row = |stack: &[u64], truncated: bool, figures: &Estimates| SiteFigures {
            stack: stack.to_vec(),
            truncated,
            samples: figures.samples,
            allocated_bytes: estimate(figures.allocated),
            live_at_peak_bytes: estimate(figures.at_peak(peak_epoch)),
            leaked_bytes: estimate(figures.live),
        };
        if let Some(sites) = self.sites {
            for index in 0..self.len {
                // SAFETY: indices below `len` are initialised slots of the mapping.
                let site = unsafe { &*sites.as_ptr().add(index) };
                rows.push(row(&site.pcs[..site.len], site.truncated, &site.figures));
            }
        }
        if self.other.samples > 0 {
            rows.push(row(&[], true, &self.other));
        }
        rows.sort_by(|a, b| {
            (b.live_at_peak_bytes, b.leaked_bytes, b.allocated_bytes)
                .cmp(&(a.live_at_peak_bytes, a.leaked_bytes, a.allocated_bytes))
                .then_with(|| a.stack.cmp(&b.stack))
        });
        rows
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(sites) = self.sites {
            // SAFETY: the mapping made in `mapped`, of exactly this size, unmapped once.
            unsafe { crate::sys::memory::unmap(sites.cast(), MAX_SITES * size_of::<Site>()) };
        }
    }
}

/// The calling thread's stack (empty if its thread-local is gone).
fn walk() -> Walked {
    STACK_BOUNDS.try_with(stack::walk).unwrap_or(Walked {
        truncated: true,
        ..Walked::EMPTY
    })
}

fn estimate(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value.round() as u64
    } else {
        0
    }
}

/// A call site as a failure message names it: the stacks of a measurement that are the same
/// once highwater's and the allocator's frames are trimmed, summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NamedSite {
    /// `function at file:line` of the innermost frame left; `(other sites)` for the row of
    /// stacks past the limit, an address when nothing resolved.
    pub(crate) name: String,
    pub(crate) samples: u64,
    pub(crate) allocated_bytes: u64,
    pub(crate) live_at_peak_bytes: u64,
    pub(crate) leaked_bytes: u64,
}

/// Resolves and names the sites of a measurement, summing stacks that name the same frames.
/// Reads debug information (the first time in a process it takes a moment): for failures.
pub(crate) fn name_sites(sites: &[SiteFigures]) -> Vec<NamedSite> {
    let mut pcs: Vec<u64> = sites
        .iter()
        .flat_map(|site| site.stack.iter().copied())
        .collect();
    pcs.sort_unstable();
    pcs.dedup();
    let resolved = crate::symbolize::Resolver::default().resolve(&pcs);
    let mut resolved = resolved.into_iter();
    let frames_at: FxHashMap<u64, Vec<Frame>> = pcs
        .into_iter()
        .map(|pc| {
            let frames = resolved
                .next()
                .filter(|frames| !frames.is_empty())
                .unwrap_or_else(|| vec![Frame::at(pc)]);
            (pc, frames)
        })
        .collect();
    let here = std::env::current_dir()
        .ok()
        .map(|dir| format!("{}/", dir.display()));
    let mut named: Vec<NamedSite> = Vec::new();
    for site in sites {
        let mut frames: Vec<Frame> =
            trimmed_frames(&site.stack, &frames_at, crate::symbolize::RECORDER_SOURCES)
                .into_iter()
                .cloned()
                .collect();
        qualify_closures(&mut frames);
        // The caller of the standard library's collections, not `RawVec`.
        let caller = frames
            .iter()
            .find(|frame| !is_library_frame(frame))
            .or(frames.first());
        let name = match caller {
            None => "(other sites)".to_owned(),
            Some(frame) => frame_name(frame, here.as_deref()),
        };
        match named.iter_mut().find(|row| row.name == name) {
            Some(row) => {
                row.samples += site.samples;
                row.allocated_bytes += site.allocated_bytes;
                row.live_at_peak_bytes += site.live_at_peak_bytes;
                row.leaked_bytes += site.leaked_bytes;
            }
            None => named.push(NamedSite {
                name,
                samples: site.samples,
                allocated_bytes: site.allocated_bytes,
                live_at_peak_bytes: site.live_at_peak_bytes,
                leaked_bytes: site.leaked_bytes,
            }),
        }
    }
    named
}

/// Whether a frame is the standard library's: by its source path, or, as the prebuilt
/// library's generic code carries no line tables, by its name when it has no file (a trait
/// method of a library trait counts: `<u8 as alloc::vec::spec_from_elem::SpecFromElem>`).
fn is_library_frame(frame: &Frame) -> bool {
    const CRATES: [&str; 3] = ["alloc::", "core::", "std::"];
    match (&frame.file, frame.function.as_deref()) {
        (Some(file), _) => file.starts_with("/rustc/"),
        (None, Some(function)) => {
            let bare = function.trim_start_matches('<');
            let trait_path = function.split_once(" as ").map(|(_, path)| path);
            CRATES.iter().any(|name| {
                bare.starts_with(name) || trait_path.is_some_and(|path| path.starts_with(name))
            })
        }
        (None, None) => false,
    }
}

/// `function at file:line`, the file relative to `here` (the working directory) when under it.
fn frame_name(frame: &Frame, here: Option<&str>) -> String {
    let function = frame
        .function
        .clone()
        .unwrap_or_else(|| format!("{:#x}", frame.pc));
    match (&frame.file, frame.line) {
        (Some(file), line) => {
            let file = here
                .and_then(|here| file.strip_prefix(here))
                .unwrap_or(file);
            match line {
                Some(line) => format!("{function} at {file}:{line}"),
                None => format!("{function} at {file}"),
            }
        }
        (None, _) => function,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_meter_draws_the_same_distances() {
        let ((a, left_a), (b, left_b)) = (Sampler::new(), Sampler::new());
        assert_eq!((left_a, a.rest, a.state), (left_b, b.rest, b.state));
    }

    #[test]
    fn distances_are_exponential_with_mean_r() {
        let mut state = SEED;
        let n = 100_000;
        let mean = (0..n)
            .map(|_| sample::next_distance(&mut state, SAMPLE_BYTES) as f64)
            .sum::<f64>()
            / n as f64;
        // Standard error of the mean is R / sqrt(n), about 0.3 % of R.
        assert!(
            (mean / SAMPLE_BYTES as f64 - 1.0).abs() < 0.015,
            "mean {mean}"
        );
    }

    #[test]
    fn large_blocks_are_always_sampled_and_weigh_their_size() {
        let (mut sampler, mut left) = Sampler::new();
        assert!(left <= ALWAYS_SAMPLED);
        // From one call site, so one stack. The meter passes the peak's epoch from before
        // the block's own rise: each block here raises the peak (to epochs 1, then 2).
        let tags: Vec<u16> = [(1, 0), (2, 1)]
            .into_iter()
            .map(|(times, epoch)| {
                let size = ALWAYS_SAMPLED * times;
                sampler.allocated(size, size, epoch, &mut left)
            })
            .collect();
        let tag = tags[0];
        assert_ne!(tag, UNSAMPLED);
        assert_eq!(tags[1], tag, "one call site, one stack");
        sampler.ended(tag, ALWAYS_SAMPLED, 2);
        let rows = sampler.finish(2);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].samples, 2);
        assert_eq!(rows[0].allocated_bytes, 3 * ALWAYS_SAMPLED);
        assert_eq!(rows[0].leaked_bytes, 2 * ALWAYS_SAMPLED);
        // At the latest peak (epoch 2, before the first block ended) both were live.
        assert_eq!(rows[0].live_at_peak_bytes, 3 * ALWAYS_SAMPLED);
    }

    #[test]
    fn the_cap_on_the_countdown_does_not_sample_a_small_block() {
        let (mut sampler, _) = Sampler::new();
        let mut left = sampler.split(ALWAYS_SAMPLED + 1000);
        assert_eq!(left, ALWAYS_SAMPLED);
        // The fast path counted the countdown down to 10; 1010 bytes of distance are left.
        left = 10;
        assert_eq!(sampler.allocated(10, 10, 0, &mut left), UNSAMPLED);
        assert_eq!((left, sampler.rest), (1000, 0));
        assert!(sampler.finish(0).is_empty());
        assert_ne!(sampler.allocated(1000, 1000, 0, &mut left), UNSAMPLED);
    }
}

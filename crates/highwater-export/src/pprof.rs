//! The call sites as a pprof profile: a gzipped `profile.proto` that `go tool pprof`,
//! Perfetto, speedscope and Pyroscope read.
//!
//! # What is in it
//!
//! Four sample types, one value each per sample: `inuse_space`/`bytes` and
//! `inuse_objects`/`count` (live at the peak; `inuse_space` is the default view),
//! `alloc_space`/`bytes` and `alloc_objects`/`count` (allocated over the run). Each
//! [`SiteShare`](highwater_profile::SiteShare) of each [`CallSite`] is one sample on that site's
//! stack, labelled with its `category`, its `span` (the span path, when it was made inside a
//! span) and its `op` (when an op was recorded), so `-tagfocus=category=optimizer` or
//! `-tagfocus=span=step/forward` selects the memory of one category or span. Each share's
//! values are its own estimates, objects live at the peak included
//! ([`SiteShare::peak_count`](highwater_profile::SiteShare::peak_count)). Whatever a site's figures
//! hold beyond its shares (rounding, or a profile written before shares counted their blocks)
//! is one more sample with no labels, and the sites past
//! [`MAX_CALL_SITES`](highwater_profile::MAX_CALL_SITES) are one sample
//! at a location of their own, so every view adds up to the profile's totals.
//!
//! Each distinct program counter with its chain of inlined functions is one location: its
//! lines list the innermost inlined function first and the function it was inlined into last,
//! as the schema says. The locations are already symbolised, so the one mapping (the
//! program) says so and viewers look nothing up. Figures are estimates from sampled
//! allocations (the sampling period is the mean bytes between samples); their standard errors
//! stay in the highwater profile, which `highwater sites` shows.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message as _;

use super::{write_output, ExportError, Output};
use highwater_profile::Profile;
use highwater_profile::{CallSite, Frame};

mod proto;

/// The sample types, in the order of every sample's values.
const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("inuse_space", "bytes"),
    ("inuse_objects", "count"),
    ("alloc_space", "bytes"),
    ("alloc_objects", "count"),
];

/// The function name of the location that stands for the sites the profile does not list.
pub const UNLISTED_SITES: &str = "(call sites past the listed ones)";

/// Where the pprof export of the profile at `profile_path` goes by default: beside it, its
/// `.json` extension replaced by `.pb.gz` (`run/highwater-profile.json` →
/// `run/highwater-profile.pb.gz`).
pub fn path_beside(profile_path: &Path) -> PathBuf {
    super::beside(profile_path, ".pb.gz")
}

/// The profile's call sites as a gzipped `profile.proto` (see the [module docs](self)).
///
/// A profile with no call sites (sampling was off) gives a valid profile with no samples.
///
/// # Examples
///
/// ```
/// let gzipped = highwater_export::pprof::render(&highwater_profile::Profile::empty());
/// assert_eq!(gzipped[..2], [0x1f, 0x8b]);
/// ```
pub fn render(profile: &Profile) -> Vec<u8> {
    gzip(&build(profile).encode_to_vec())
}

/// Writes [`render`]`(profile)` to `path` atomically (a temporary sibling renamed into place).
///
/// # Errors
///
/// [`ExportError`] naming the file when it cannot be written; `path` keeps what it held before.
pub fn write(profile: &Profile, path: impl AsRef<Path>) -> Result<(), ExportError> {
    write_output(Output::PprofProfile, path.as_ref(), &render(profile))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(bytes.len() / 4), Compression::default());
    // Writing into memory cannot fail: `Vec`'s `Write` never returns an error.
    match encoder.write_all(bytes).and_then(|()| encoder.try_finish()) {
        Ok(()) => encoder.get_ref().clone(),
        Err(_) => unreachable!("compressing into a Vec cannot fail"),
    }
}

/// The string table and the ids handed out while building.
#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(i64, i64), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<(u64, Vec<(u64, i64)>), u64>,
    lowest_pc: Option<u64>,
    highest_pc: u64,
}

impl Builder {
    fn new() -> Builder {
        let mut builder = Builder::default();
        // The schema requires the empty string first.
        builder.string("");
        builder
    }

    fn string(&mut self, text: &str) -> i64 {
        if let Some(&id) = self.string_ids.get(text) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(text.to_string());
        self.string_ids.insert(text.to_string(), id);
        id
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = (self.string(name), self.string(file));
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        // No system (mangled) name: with one equal to the name, `go tool pprof` would take the
        // name for an undemangled symbol and cut `<…>` out of it
        // (`<Linear as Module>::forward` became `::forward`).
        self.functions.push(proto::Function {
            id,
            name: key.0,
            system_name: 0,
            filename: key.1,
        });
        self.function_ids.insert(key, id);
        id
    }

    /// The location of one program counter and its frames (inlined ones first), made once.
    fn location(&mut self, pc: u64, frames: &[Frame]) -> u64 {
        let lines: Vec<(u64, i64)> = frames
            .iter()
            .map(|frame| {
                let name = super::stacks::function_name(frame);
                let function = self.function(&name, frame.file.as_deref().unwrap_or(""));
                (function, frame.line.map_or(0, i64::from))
            })
            .collect();
        let key = (pc, lines);
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        let mapping_id = if pc == 0 { 0 } else { 1 };
        if pc != 0 {
            self.lowest_pc = Some(self.lowest_pc.map_or(pc, |low| low.min(pc)));
            self.highest_pc = self.highest_pc.max(pc);
        }
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: pc,
            line: key
                .1
                .iter()
                .map(|&(function_id, line)| proto::Line { function_id, line })
                .collect(),
        });
        self.location_ids.insert(key, id);
        id
    }

    /// The site's stack as location ids, the leaf first.
    fn stack(&mut self, site: &CallSite) -> Vec<u64> {
        location_groups(&site.frames)
            .into_iter()
            .map(|group| self.location(group[0].pc, group))
            .collect()
    }

    fn label(&mut self, key: &str, value: &str) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: self.string(value),
            ..proto::Label::default()
        }
    }
}

/// `frames` (innermost first) cut into locations: the frames inlined at one program counter
/// together with the function they were inlined into, which closes the group. A group also
/// ends where the program counter changes, should a stack end on an inlined frame.
fn location_groups(frames: &[Frame]) -> Vec<&[Frame]> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (i, frame) in frames.iter().enumerate() {
        let next_pc_differs = frames.get(i + 1).is_none_or(|next| next.pc != frame.pc);
        if !frame.inlined || next_pc_differs {
            groups.push(&frames[start..=i]);
            start = i + 1;
        }
    }
    groups
}

/// A figure as a pprof value (they are signed).
fn value(figure: u64) -> i64 {
    i64::try_from(figure).unwrap_or(i64::MAX)
}

fn build(profile: &Profile) -> proto::Profile {
    let mut b = Builder::new();
    let sample_type: Vec<proto::ValueType> = SAMPLE_TYPES
        .iter()
        .map(|(name, unit)| proto::ValueType {
            r#type: b.string(name),
            unit: b.string(unit),
        })
        .collect();
    let span_paths = profile.span_paths();
    let mut samples = Vec::new();
    for site in &profile.sites {
        let stack = b.stack(site);
        let mut left = [
            site.peak_bytes,
            site.peak_count,
            site.alloc_bytes,
            site.alloc_count,
        ];
        for share in &site.shares {
            let figures = [
                share.peak_bytes,
                share.peak_count,
                share.alloc_bytes,
                share.alloc_count,
            ];
            for (rest, figure) in left.iter_mut().zip(figures) {
                *rest = rest.saturating_sub(figure);
            }
            let mut label = vec![b.label("category", share.category.as_str())];
            let span = share
                .span
                .and_then(|id| span_paths.get(id as usize))
                .filter(|path| !path.is_empty());
            if let Some(path) = span {
                label.push(b.label("span", path));
            }
            if let Some(op) = &share.op {
                label.push(b.label("op", op));
            }
            samples.push(proto::Sample {
                location_id: stack.clone(),
                value: figures.map(value).to_vec(),
                label,
            });
        }
        if left.iter().any(|&rest| rest > 0) {
            samples.push(proto::Sample {
                location_id: stack,
                value: left.map(value).to_vec(),
                label: Vec::new(),
            });
        }
    }
    let sampling = &profile.sampling;
    if sampling.unlisted_peak_bytes > 0 || sampling.unlisted_alloc_bytes > 0 {
        let mut unlisted = Frame::default();
        unlisted.function = Some(UNLISTED_SITES.to_string());
        let location = b.location(0, std::slice::from_ref(&unlisted));
        samples.push(proto::Sample {
            location_id: vec![location],
            value: vec![
                value(sampling.unlisted_peak_bytes),
                0,
                value(sampling.unlisted_alloc_bytes),
                0,
            ],
            label: Vec::new(),
        });
    }
    let program = if profile.meta.program.is_empty() {
        "(unnamed program)"
    } else {
        &profile.meta.program
    };
    let mapping = b.lowest_pc.map(|low| proto::Mapping {
        id: 1,
        memory_start: low,
        memory_limit: b.highest_pc.saturating_add(1),
        filename: b.string(program),
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: true,
        ..proto::Mapping::default()
    });
    let comment = [
        format!(
            "highwater call sites of {program}: peak {} bytes on {}",
            profile.summary.peak_bytes, profile.summary.peak_device
        ),
        format!(
            "estimates from allocations sampled every {} bytes on average; standard errors are \
             in the highwater profile (highwater sites)",
            sampling.mean_bytes
        ),
    ]
    .map(|text| b.string(&text))
    .to_vec();
    let period_type = Some(proto::ValueType {
        r#type: b.string("space"),
        unit: b.string("bytes"),
    });
    let default_sample_type = b.string(SAMPLE_TYPES[0].0);
    proto::Profile {
        sample_type,
        sample: samples,
        mapping: mapping.into_iter().collect(),
        location: b.locations,
        function: b.functions,
        string_table: b.strings,
        time_nanos: value(profile.meta.started_unix_ms.saturating_mul(1_000_000)),
        duration_nanos: value(profile.summary.duration_ns),
        period_type,
        period: value(sampling.mean_bytes),
        comment,
        default_sample_type,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_profile::model::Category;
    use highwater_profile::SiteShare;
    use highwater_testkit::sample::sample_profile;
    use std::io::Read as _;

    fn decode(gzipped: &[u8]) -> proto::Profile {
        assert_eq!(gzipped[..2], [0x1f, 0x8b], "gzip magic");
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gzipped)
            .read_to_end(&mut raw)
            .unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    fn text(p: &proto::Profile, id: i64) -> &str {
        &p.string_table[id as usize]
    }

    /// Sum of value `index` over the samples whose labels satisfy `keep`.
    fn total(p: &proto::Profile, index: usize, keep: impl Fn(&[(&str, &str)]) -> bool) -> i64 {
        p.sample
            .iter()
            .filter(|s| {
                let labels: Vec<(&str, &str)> = s
                    .label
                    .iter()
                    .map(|l| (text(p, l.key), text(p, l.str)))
                    .collect();
                keep(&labels)
            })
            .map(|s| s.value[index])
            .sum()
    }

    #[test]
    fn totals_match_the_profiles_sites_in_every_sample_type() {
        let profile = sample_profile();
        assert!(profile.sites.len() >= 8, "the sample has sites");
        let p = decode(&render(&profile));
        assert_eq!(p.string_table[0], "");
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (text(&p, t.r#type), text(&p, t.unit)))
            .collect();
        assert_eq!(types, SAMPLE_TYPES);
        assert_eq!(text(&p, p.default_sample_type), "inuse_space");
        let sites = &profile.sites;
        let sampling = &profile.sampling;
        let sum = |f: fn(&CallSite) -> u64| sites.iter().map(f).sum::<u64>() as i64;
        assert_eq!(
            total(&p, 0, |_| true),
            sum(|s| s.peak_bytes) + sampling.unlisted_peak_bytes as i64
        );
        assert_eq!(total(&p, 1, |_| true), sum(|s| s.peak_count));
        assert_eq!(
            total(&p, 2, |_| true),
            sum(|s| s.alloc_bytes) + sampling.unlisted_alloc_bytes as i64
        );
        assert_eq!(total(&p, 3, |_| true), sum(|s| s.alloc_count));
        assert_eq!(p.period, sampling.mean_bytes as i64);
        assert_eq!(p.duration_nanos, profile.summary.duration_ns as i64);
    }

    #[test]
    fn labels_select_a_category_span_or_op_exactly() {
        let profile = sample_profile();
        let p = decode(&render(&profile));
        let paths = profile.span_paths();
        let shares = || profile.sites.iter().flat_map(|s| &s.shares);
        let optimizer: u64 = shares()
            .filter(|s| s.category == Category::Optimizer)
            .map(|s| s.peak_bytes)
            .sum();
        assert!(optimizer > 0);
        assert_eq!(
            total(&p, 0, |l| l.contains(&("category", "optimizer"))),
            optimizer as i64
        );
        let optimizer_blocks: u64 = shares()
            .filter(|s| s.category == Category::Optimizer)
            .map(|s| s.peak_count)
            .sum();
        assert!(optimizer_blocks > 0);
        assert_eq!(
            total(&p, 1, |l| l.contains(&("category", "optimizer"))),
            optimizer_blocks as i64
        );
        let forward: u64 = shares()
            .filter(|s| {
                s.span
                    .is_some_and(|id| paths[id as usize] == "step/forward/embed")
            })
            .map(|s| s.alloc_bytes)
            .sum();
        assert!(forward > 0);
        assert_eq!(
            total(&p, 2, |l| l.contains(&("span", "step/forward/embed"))),
            forward as i64
        );
        let exp_avg: u64 = shares()
            .filter(|s| s.op.as_deref() == Some("exp_avg"))
            .map(|s| s.peak_bytes)
            .sum();
        assert_eq!(
            total(&p, 0, |l| l.contains(&("op", "exp_avg"))),
            exp_avg as i64
        );
        // A share outside every span has no span label; every share has a category.
        assert!(p
            .sample
            .iter()
            .all(|s| s.label.is_empty() || s.label.iter().any(|l| text(&p, l.key) == "category")));
    }

    #[test]
    fn inlined_frames_share_one_location_innermost_first() {
        let profile = sample_profile();
        let site = profile
            .sites
            .iter()
            .find(|s| s.frames.iter().any(|f| f.inlined))
            .expect("the sample has inlined frames");
        let p = decode(&render(&profile));
        let sample = &p.sample[0];
        assert_eq!(
            sample.location_id.len(),
            location_groups(&site.frames).len()
        );
        assert!(sample.location_id.len() < site.frames.len());
        let leaf = &p.location[sample.location_id[0] as usize - 1];
        assert_eq!(leaf.address, site.frames[0].pc);
        let names: Vec<&str> = leaf
            .line
            .iter()
            .map(|l| text(&p, p.function[l.function_id as usize - 1].name))
            .collect();
        let inlined_here: Vec<&str> = site
            .frames
            .iter()
            .take_while(|f| f.pc == site.frames[0].pc)
            .map(|f| f.function.as_deref().unwrap())
            .collect();
        assert_eq!(names, inlined_here);
        assert_eq!(p.mapping.len(), 1);
        let mapping = &p.mapping[0];
        assert!(mapping.has_functions && mapping.has_inline_frames);
        assert!(p
            .location
            .iter()
            .filter(|l| l.mapping_id == 1)
            .all(|l| (mapping.memory_start..mapping.memory_limit).contains(&l.address)));
        // Locations and functions are made once, however many sites share them.
        let frames: usize = profile.sites.iter().map(|s| s.frames.len()).sum();
        assert!(p.location.len() < frames);
    }

    #[test]
    fn what_a_site_holds_beyond_its_shares_is_an_unlabelled_sample() {
        let mut profile = Profile::empty();
        profile.sites = vec![{
            let mut call_site = CallSite::default();
            call_site.frames = vec![{
                let mut frame = Frame::default();
                frame.pc = 0x10;
                frame.function = Some("f".into());
                frame
            }];
            call_site.peak_bytes = 1000;
            call_site.peak_count = 10;
            call_site.alloc_bytes = 5000;
            call_site.alloc_count = 50;
            call_site.shares = vec![
                {
                    let mut site_share = SiteShare::default();
                    site_share.category = Category::Activation;
                    site_share.peak_bytes = 600;
                    site_share.peak_count = 2;
                    site_share.alloc_bytes = 3000;
                    site_share.alloc_count = 30;
                    site_share
                },
                {
                    let mut site_share = SiteShare::default();
                    site_share.category = Category::Gradient;
                    site_share.peak_bytes = 300;
                    site_share.peak_count = 7;
                    site_share.alloc_bytes = 1000;
                    site_share.alloc_count = 10;
                    site_share
                },
            ];
            call_site
        }];
        profile.sampling.unlisted_peak_bytes = 7;
        let p = decode(&render(&profile));
        let values: Vec<&[i64]> = p.sample.iter().map(|s| s.value.as_slice()).collect();
        // Each share's blocks at the peak are its own (not in proportion to its bytes, which
        // would give 7 and 3); the rest is unlabelled.
        assert_eq!(
            values,
            [
                &[600, 2, 3000, 30][..],
                &[300, 7, 1000, 10],
                &[100, 1, 1000, 10],
                &[7, 0, 0, 0]
            ]
        );
        assert!(p.sample[2].label.is_empty());
        let unlisted = &p.location[p.sample[3].location_id[0] as usize - 1];
        assert_eq!(unlisted.mapping_id, 0);
        let function = &p.function[unlisted.line[0].function_id as usize - 1];
        assert_eq!(text(&p, function.name), UNLISTED_SITES);
    }

    #[test]
    fn an_unsymbolised_frame_is_named_by_its_address() {
        let mut profile = Profile::empty();
        profile.sites = vec![{
            let mut call_site = CallSite::default();
            call_site.frames = vec![{
                let mut frame = Frame::default();
                frame.pc = 0xabc;
                frame
            }];
            call_site.peak_bytes = 1;
            call_site
        }];
        let p = decode(&render(&profile));
        assert_eq!(text(&p, p.function[0].name), "0xabc");
        assert_eq!(p.location[0].line[0].line, 0);
    }
}

//! The `sites` view: which code allocated, largest at the peak (or allocated) first, each site
//! with its estimates and their errors, where its bytes were made (category, span, op) and a
//! readable stack.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::text::{clean, percent, Table};
use highwater_export::stacks::{self, estimate};
use highwater_export::vocabulary as words;
use highwater_profile::model::Category;
use highwater_profile::units::{format_bytes, format_count};
use highwater_profile::Profile;
use highwater_profile::{CallSite, SiteSampling, SiteShare};

/// Which figure ranks the sites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SiteOrder {
    /// Bytes live at the peak.
    Peak,
    /// Bytes allocated over the run.
    Allocated,
}

/// What `highwater sites` was asked for.
#[derive(Debug, Clone)]
pub struct SiteQuery {
    /// Most sites shown.
    pub limit: usize,
    /// How they are ranked.
    pub order: SiteOrder,
    /// Only sites with bytes of this category, ranked by those bytes.
    pub category: Option<Category>,
    /// Only this site (its id), every frame of its stack shown.
    pub site: Option<u32>,
    /// Most frames shown per stack after trimming; `None`: every frame, untrimmed (as for
    /// [`SiteQuery::site`]).
    pub frames: Option<usize>,
}

/// Why the sites asked for cannot be shown.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SiteQueryError(String);

/// The figure of `site` that `query` ranks by: bytes at the peak or allocated, of the asked
/// category only when one was asked.
fn rank_bytes(site: &CallSite, query: &SiteQuery) -> u64 {
    let figure = |peak: u64, alloc: u64| match query.order {
        SiteOrder::Peak => peak,
        SiteOrder::Allocated => alloc,
    };
    match query.category {
        None => figure(site.peak_bytes, site.alloc_bytes),
        Some(category) => site
            .shares
            .iter()
            .filter(|s| s.category == category)
            .fold(0u64, |sum, s| {
                sum.saturating_add(figure(s.peak_bytes, s.alloc_bytes))
            }),
    }
}

/// The sites `query` selects, in its order.
///
/// # Errors
///
/// [`SiteQueryError`] naming the profile when `query.site` is not one of its sites.
pub fn select_sites<'a>(
    profile: &'a Profile,
    name: &str,
    query: &SiteQuery,
) -> Result<Vec<&'a CallSite>, SiteQueryError> {
    if let Some(id) = query.site {
        return match profile.sites.get(id as usize) {
            Some(site) => Ok(vec![site]),
            None if profile.sites.is_empty() => Err(SiteQueryError(format!(
                "profile {name} has no call sites, so no site #{id}"
            ))),
            None => Err(SiteQueryError(format!(
                "profile {name} has {} call sites (#0 to #{}); there is no site #{id}",
                profile.sites.len(),
                profile.sites.len() - 1
            ))),
        };
    }
    let mut sites: Vec<&CallSite> = profile
        .sites
        .iter()
        .filter(|site| {
            query.category.is_none_or(|category| {
                site.shares
                    .iter()
                    .any(|s| s.category == category && (s.peak_bytes > 0 || s.alloc_bytes > 0))
            })
        })
        .collect();
    sites.sort_by_key(|site| (std::cmp::Reverse(rank_bytes(site, query)), site.id));
    sites.truncate(query.limit);
    Ok(sites)
}

/// Shares of one key (a category, a span path, an op) of a site, largest first.
fn mix<K: Ord>(shares: &[SiteShare], key: impl Fn(&SiteShare) -> K, peak: bool) -> Vec<(K, u64)> {
    let mut totals: BTreeMap<K, u64> = BTreeMap::new();
    for share in shares {
        let total = totals.entry(key(share)).or_default();
        *total = total.saturating_add(if peak {
            share.peak_bytes
        } else {
            share.alloc_bytes
        });
    }
    let mut list: Vec<(K, u64)> = totals.into_iter().filter(|(_, b)| *b > 0).collect();
    list.sort_by_key(|(_, bytes)| std::cmp::Reverse(*bytes));
    list
}

/// Most entries one mix line names; the rest are counted.
const MIX_ENTRIES: usize = 3;

/// `name 62%, other 38%` for at most [`MIX_ENTRIES`] entries, then `+N more`.
fn mix_line(list: &[(String, u64)], whole: u64) -> String {
    let mut parts: Vec<String> = list
        .iter()
        .take(MIX_ENTRIES)
        .map(|(name, bytes)| format!("{} {}", clean(name), percent(*bytes, whole)))
        .collect();
    if list.len() > MIX_ENTRIES {
        parts.push(format!("+{} more", list.len() - MIX_ENTRIES));
    }
    parts.join(", ")
}

/// The text view of the sites `query` selects from `profile` (read from `name`).
///
/// # Errors
///
/// As [`select_sites`].
pub fn sites_text(
    profile: &Profile,
    name: &str,
    query: &SiteQuery,
) -> Result<String, SiteQueryError> {
    let mut out = String::new();
    let sampling = &profile.sampling;
    if profile.sites.is_empty() {
        let why = if sampling.mean_bytes == 0 {
            "sampling was off (HIGHWATER_SAMPLE_BYTES=0), or the profile was written before \
             highwater recorded call sites"
        } else {
            "no allocation was sampled"
        };
        let _ = writeln!(out, "no call sites in {name}: {why}");
        return select_sites(profile, name, query).map(|_| out);
    }
    let sites = select_sites(profile, name, query)?;
    header(&mut out, profile, sampling, sites.len());
    let spans = profile.span_paths();
    for site in &sites {
        site_block(&mut out, profile, &spans, site, query);
    }
    if sites.is_empty() {
        let _ = writeln!(
            out,
            "\nno call site has {} bytes",
            query.category.map_or("any".to_string(), |c| c.to_string())
        );
    }
    footer(&mut out, profile, &sites, query);
    Ok(out)
}

fn header(out: &mut String, profile: &Profile, sampling: &SiteSampling, shown: usize) {
    let program = if profile.meta.program.is_empty() {
        "(unnamed program)"
    } else {
        &profile.meta.program
    };
    let every = if sampling.mean_bytes == 1 {
        "every allocation recorded".to_string()
    } else {
        format!(
            "one every {} allocated on average",
            format_bytes(sampling.mean_bytes)
        )
    };
    let listed = profile.sites.len() as u64;
    let seen = sampling.distinct_sites.max(listed);
    let showing = if shown as u64 == listed {
        format!("all {} listed", format_count(listed))
    } else {
        format!(
            "{} shown of {} listed",
            format_count(shown as u64),
            format_count(listed)
        )
    };
    let seen = if seen > listed {
        format!(" ({} seen)", format_count(seen))
    } else {
        String::new()
    };
    // Which method walked the stacks: counted per method since issue 35, else the one named.
    let walked = if sampling.samples_by_unwinder.is_empty() {
        format!(
            "{} stacks",
            clean(if sampling.unwinder.is_empty() {
                "unknown"
            } else {
                &sampling.unwinder
            })
        )
    } else {
        let by: Vec<String> = sampling
            .samples_by_unwinder
            .iter()
            .map(|(unwinder, samples)| format!("{} {}", clean(unwinder), format_count(*samples)))
            .collect();
        format!("stacks by {}", by.join(", "))
    };
    let _ = writeln!(
        out,
        "call sites of {}: {showing}{seen}, estimated from {} sampled allocations ({every}; \
         {walked})",
        clean(program),
        format_count(sampling.samples),
    );
    let (bytes, variance) = profile.sites.iter().fold((0u64, 0u128), |(b, v), s| {
        (
            b.saturating_add(s.peak_bytes),
            v + u128::from(s.peak_bytes_error).pow(2),
        )
    });
    let bytes = bytes.saturating_add(sampling.unlisted_peak_bytes);
    let _ = writeln!(
        out,
        "peak: {} on {}; the sites hold {} of it ({})",
        format_bytes(profile.summary.peak_bytes),
        clean(&profile.summary.peak_device),
        estimate(bytes, variance.isqrt() as u64),
        percent(bytes, profile.summary.peak_bytes)
    );
    let _ = writeln!(out, "{}", words::SITES_EXPLAINED);
}

fn site_block(
    out: &mut String,
    profile: &Profile,
    spans: &[String],
    site: &CallSite,
    query: &SiteQuery,
) {
    let peak = profile.summary.peak_bytes;
    let _ = writeln!(
        out,
        "\n#{}  {} live at the peak ({}), {} block{}; allocated {} in {} allocation{}",
        site.id,
        estimate(site.peak_bytes, site.peak_bytes_error),
        percent(site.peak_bytes, peak),
        format_count(site.peak_count),
        if site.peak_count == 1 { "" } else { "s" },
        estimate(site.alloc_bytes, site.alloc_bytes_error),
        format_count(site.alloc_count),
        if site.alloc_count == 1 { "" } else { "s" }
    );
    // The mix of the bytes that rank the site: at the peak, unless it holds none there.
    let by_peak = query.order == SiteOrder::Peak && site.peak_bytes > 0;
    let whole = if by_peak {
        site.peak_bytes
    } else {
        site.alloc_bytes
    };
    let categories: Vec<(String, u64)> = mix(&site.shares, |s| s.category, by_peak)
        .into_iter()
        .map(|(c, b)| (c.to_string(), b))
        .collect();
    let span_mix: Vec<(String, u64)> = mix(
        &site.shares,
        |s| match s.span.and_then(|id| spans.get(id as usize)) {
            Some(path) => path.clone(),
            None => words::OUTSIDE_SPANS.to_string(),
        },
        by_peak,
    );
    let ops: Vec<(String, u64)> = mix(&site.shares, |s| s.op.clone(), by_peak)
        .into_iter()
        .filter_map(|(op, b)| op.map(|op| (op, b)))
        .collect();
    let _ = writeln!(
        out,
        "    {}: {}",
        if by_peak { "at the peak" } else { "allocated" },
        mix_line(&categories, whole)
    );
    let temporary = site
        .shares
        .iter()
        .fold(0u64, |sum, s| sum.saturating_add(s.peak_temporary_bytes));
    if temporary > 0 {
        let _ = writeln!(
            out,
            "    temporary: {} of it ({}) was freed before the span that allocated it exited",
            format_bytes(temporary),
            percent(temporary, site.peak_bytes)
        );
    }
    if let Some(category) = query.category {
        let part = rank_bytes(site, query);
        let _ = writeln!(out, "    of which {category}: {}", format_bytes(part));
    }
    if !span_mix.is_empty() {
        let _ = writeln!(out, "    spans: {}", mix_line(&span_mix, whole));
    }
    if !ops.is_empty() {
        let _ = writeln!(out, "    ops: {}", mix_line(&ops, whole));
    }
    stack(out, site, query);
}

fn stack(out: &mut String, site: &CallSite, query: &SiteQuery) {
    // One site asked for by id shows its whole stack, as recorded.
    let (frames, inner, outer, most) = match (query.frames, query.site) {
        (Some(most), None) => {
            let t = stacks::interesting(&site.frames);
            (t.frames, t.inner_std, t.outer_runtime, most.max(1))
        }
        _ => (&site.frames[..], 0, 0, usize::MAX),
    };
    if inner > 0 {
        let _ = writeln!(
            out,
            "      ({inner} frame{} of the standard library's allocation code above)",
            if inner == 1 { "" } else { "s" }
        );
    }
    let mut table = Table::new(&[("FUNCTION", false), ("AT", false)]);
    let collapse = query.frames.is_some() && query.site.is_none();
    // `most` counts lines shown: a collapsed run is one.
    let (mut k, mut lines) = (0, 0);
    while k < frames.len() && lines < most {
        lines += 1;
        // A run of the standard library's frames between the program's (iterator adapters,
        // closures' shims) is one line unless every frame was asked for.
        let run = frames[k..]
            .iter()
            .take_while(|f| stacks::is_std_frame(f))
            .count();
        if collapse && run >= 2 {
            table.push(vec![
                format!("({run} frames of the standard library)"),
                String::new(),
            ]);
            k += run;
            continue;
        }
        let frame = &frames[k];
        // Generic arguments can run to hundreds of characters; the whole stack keeps them.
        let name = stacks::function_name(frame);
        let name = if collapse {
            stacks::without_generics(&name)
        } else {
            name
        };
        let mut function = clean(&name).into_owned();
        if frame.inlined {
            function.push_str(" (inlined)");
        }
        let at = stacks::source_location(frame).unwrap_or_else(|| "-".to_string());
        table.push(vec![function, clean(&at).into_owned()]);
        k += 1;
    }
    table.render_body(out, "      ");
    let hidden = frames.len() - k;
    let mut notes = Vec::new();
    if hidden > 0 {
        notes.push(format!(
            "{hidden} more frame{}",
            if hidden == 1 { "" } else { "s" }
        ));
    }
    if outer > 0 {
        notes.push(format!(
            "{outer} frame{} of the runtime that called them",
            if outer == 1 { "" } else { "s" }
        ));
    }
    if !notes.is_empty() {
        let _ = writeln!(
            out,
            "      ({}; --site {} shows every frame)",
            notes.join(", "),
            site.id
        );
    }
}

fn footer(out: &mut String, profile: &Profile, shown: &[&CallSite], query: &SiteQuery) {
    let sampling = &profile.sampling;
    let eligible = match query.category {
        None => profile.sites.len(),
        Some(category) => profile
            .sites
            .iter()
            .filter(|s| s.shares.iter().any(|x| x.category == category))
            .count(),
    };
    if query.site.is_none() && shown.len() < eligible {
        let _ = writeln!(
            out,
            "\n{} more sites (-n to show more)",
            format_count((eligible - shown.len()) as u64)
        );
    }
    if sampling.unlisted_peak_bytes > 0 || sampling.unlisted_alloc_bytes > 0 {
        let _ = writeln!(
            out,
            "\nsites past the {} listed hold {} at the peak and allocated {}",
            format_count(profile.sites.len() as u64),
            format_bytes(sampling.unlisted_peak_bytes),
            format_bytes(sampling.unlisted_alloc_bytes)
        );
    }
    if sampling.truncated_stacks > 0 {
        let _ = writeln!(
            out,
            "{} sampled stacks were cut short (at the depth limit or at a frame the walk could \
             not follow): their outer frames are missing",
            format_count(sampling.truncated_stacks)
        );
    }
}

/// What `sites --json` prints: the sampling, the selected sites as the profile stores them,
/// and the paths of the spans their shares name.
#[derive(Debug, Serialize)]
pub struct SitesJson<'a> {
    /// How the sites were sampled.
    pub sampling: &'a SiteSampling,
    /// The profile's peak.
    pub peak_bytes: u64,
    /// Where it was reached.
    pub peak_device: &'a str,
    /// How the sites are ranked.
    pub order: SiteOrder,
    /// The category asked for, if any.
    pub category: Option<Category>,
    /// Sites in the profile.
    pub total_sites: usize,
    /// The selected sites, in order.
    pub sites: Vec<&'a CallSite>,
    /// Path of each span id the sites' shares name.
    pub span_paths: BTreeMap<u32, String>,
}

/// The `sites --json` document.
///
/// # Errors
///
/// As [`select_sites`].
pub fn sites_json<'a>(
    profile: &'a Profile,
    name: &str,
    query: &SiteQuery,
) -> Result<SitesJson<'a>, SiteQueryError> {
    let sites = select_sites(profile, name, query)?;
    let paths = profile.span_paths();
    let span_paths = sites
        .iter()
        .flat_map(|s| &s.shares)
        .filter_map(|share| share.span)
        .filter_map(|id| Some((id, paths.get(id as usize)?.clone())))
        .collect();
    Ok(SitesJson {
        sampling: &profile.sampling,
        peak_bytes: profile.summary.peak_bytes,
        peak_device: &profile.summary.peak_device,
        order: query.order,
        category: query.category,
        total_sites: profile.sites.len(),
        sites,
        span_paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_testkit::sample::sample_profile;

    fn query() -> SiteQuery {
        SiteQuery {
            limit: 20,
            order: SiteOrder::Peak,
            category: None,
            site: None,
            frames: Some(8),
        }
    }

    #[test]
    fn sites_come_largest_first_by_the_asked_figure() {
        let p = sample_profile();
        let by_peak = select_sites(&p, "p", &query()).unwrap();
        assert!(by_peak
            .windows(2)
            .all(|w| w[0].peak_bytes >= w[1].peak_bytes));
        let allocated = SiteQuery {
            order: SiteOrder::Allocated,
            limit: 3,
            ..query()
        };
        let by_alloc = select_sites(&p, "p", &allocated).unwrap();
        assert_eq!(by_alloc.len(), 3);
        assert!(by_alloc
            .windows(2)
            .all(|w| w[0].alloc_bytes >= w[1].alloc_bytes));
        // The update temporaries hold nothing at the peak but rank by allocation.
        assert_ne!(by_peak[0].id, by_alloc[0].id);
        let optimizer = SiteQuery {
            category: Some(Category::Optimizer),
            ..query()
        };
        let selected = select_sites(&p, "p", &optimizer).unwrap();
        assert!(!selected.is_empty());
        assert!(selected
            .iter()
            .all(|s| s.shares.iter().any(|x| x.category == Category::Optimizer)));
    }

    #[test]
    fn the_text_shows_estimates_mixes_and_a_trimmed_stack() {
        let p = sample_profile();
        let text = sites_text(&p, "p.json", &query()).unwrap();
        let first = &p.sites[0];
        assert!(
            text.contains(&format!(
                "#0  {} live at the peak",
                estimate(first.peak_bytes, first.peak_bytes_error)
            )),
            "{text}"
        );
        assert!(text.contains("spans: step/optimizer/adam 100.0%"), "{text}");
        assert!(
            text.contains("train_gpt::optim::AdamW::state_for (inlined)"),
            "{text}"
        );
        assert!(
            text.contains("candle-core-0.11.0/src/tensor.rs:380"),
            "{text}"
        );
        // The allocation machinery and the runtime are counted, not listed.
        assert!(!text.contains("RawVecInner"), "{text}");
        assert!(!text.contains("__libc_start_main"), "{text}");
        assert!(text.contains("2 frames of the standard library"), "{text}");
        assert!(text.contains("sites past the"), "{text}");
        // A stack with a frame that has no symbol shows its address.
        assert!(text.contains("0x5555"), "{text}");
        // Every frame when asked.
        let all = SiteQuery {
            frames: None,
            site: Some(0),
            ..query()
        };
        let full = sites_text(&p, "p.json", &all).unwrap();
        assert!(full.contains("__libc_start_main"), "{full}");
        assert_eq!(full.matches("\n#").count(), 1, "{full}");
    }

    /// Issue 35: the header says which method walked how many stacks; a profile from before
    /// they were counted names its one method.
    #[test]
    fn the_header_says_which_unwinder_walked_the_stacks() {
        let mut p = sample_profile();
        let text = sites_text(&p, "p.json", &query()).unwrap();
        assert!(text.contains("; frame-pointers stacks)"), "{text}");
        p.sampling.unwinder = "frame-pointers, eh-frame".into();
        p.sampling.samples_by_unwinder = [
            ("eh-frame".to_string(), 1200),
            ("frame-pointers".to_string(), 34),
        ]
        .into();
        let text = sites_text(&p, "p.json", &query()).unwrap();
        assert!(
            text.contains("; stacks by eh-frame 1,200, frame-pointers 34)"),
            "{text}"
        );
    }

    #[test]
    fn temporaries_at_the_peak_are_shown_when_the_profile_has_them() {
        let mut p = sample_profile();
        let text = sites_text(&p, "p.json", &query()).unwrap();
        assert!(!text.contains("temporary:"), "{text}");
        let half = p.sites[3].shares[0].peak_bytes / 2;
        p.sites[3].shares[0].peak_temporary_bytes = half;
        let text = sites_text(&p, "p.json", &query()).unwrap();
        let line = format!("    temporary: {} of it", format_bytes(half));
        assert_eq!(text.matches(&line).count(), 1, "{text}");
    }

    #[test]
    fn an_unknown_site_and_a_profile_without_sites_are_explained() {
        let p = sample_profile();
        let missing = SiteQuery {
            site: Some(999),
            ..query()
        };
        let error = sites_text(&p, "p.json", &missing).unwrap_err().to_string();
        assert!(
            error.contains("p.json") && error.contains("#999"),
            "{error}"
        );
        let empty = Profile::empty();
        let text = sites_text(&empty, "e.json", &query()).unwrap();
        assert!(
            text.starts_with("no call sites in e.json: sampling was off"),
            "{text}"
        );
        let json = sites_json(&p, "p.json", &query()).unwrap();
        assert_eq!(json.sites.len(), p.sites.len());
        assert!(json
            .span_paths
            .values()
            .any(|path| path == "step/optimizer/adam"));
    }
}

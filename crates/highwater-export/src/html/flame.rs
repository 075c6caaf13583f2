//! The report's icicle graph of the bytes live at the peak by stack, and the table of call
//! sites that the live-at-peak rows link to.
//!
//! The icicle is a tree made from [`Profile::sites`]: each site's stack, trimmed to its
//! interesting frames ([`stacks::interesting`]), is a path from the root (all sites) down to
//! the frame that allocated; a node's bytes are those of every site through it, its error the
//! root of the summed variances (sites are sampled independently), its category mix from the
//! sites' shares. Frames of one function under one caller are one node, whichever line called
//! on (the node lists its lines), so a function that allocates in several places is one block
//! with its callees below it, not one block per line. The script draws it (`flame.js`) with the timeline's category
//! colours; hovering shows a frame's bytes ± error and file:line, clicking zooms into it.
//!
//! The tree is bounded: nodes narrower than [`MIN_NODE_SHARE`] of the total are left out (they
//! would be under a pixel wide) and at most [`MAX_FLAME_NODES`] are kept, the widest first.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::tables::{
    breakable, limited_table_of, row_start_of, share, show_all_of, site_anchor, SHOWN_SITE_ROWS,
};
use super::{escape_html, words, MAX_TABLE_ROWS};
use crate::pprof::UNLISTED_SITES;
use crate::stacks;
use highwater_profile::model::Category;
use highwater_profile::units::{format_bytes, format_count};
use highwater_profile::Profile;
use highwater_profile::{CallSite, Frame};

/// Most nodes the icicle draws.
pub const MAX_FLAME_NODES: usize = 4_000;
/// Narrowest node drawn, as a share of all sites' bytes at the peak.
pub const MIN_NODE_SHARE: f64 = 1.0 / 2_000.0;
/// Most site ids a node lists in its tooltip.
const NODE_SITES: usize = 8;
/// Most source lines a node lists.
const NODE_LINES: usize = 4;

/// One frame of the icicle (a node of the stack tree).
#[derive(Debug, Serialize)]
pub(super) struct FlameNode {
    /// Parent's index, `None` for the root.
    p: Option<u32>,
    /// Function name (or address).
    f: String,
    /// `file:line` (the lines the node's sites went through, up to [`NODE_LINES`], joined by
    /// `, `), empty when unknown.
    at: String,
    /// Whether the frame was inlined into its caller.
    inl: bool,
    /// Bytes live at the peak through this frame.
    b: u64,
    /// Standard error of `b`.
    e: u64,
    /// Bytes by category (category index order).
    c: [u64; Category::COUNT],
    /// The largest sites through this frame (ids), at most [`NODE_SITES`].
    s: Vec<u32>,
    /// Sites through this frame.
    n: u32,
}

/// The icicle's nodes, parents before children, children widest first.
#[derive(Debug, Serialize)]
pub(super) struct Flame {
    pub(super) nodes: Vec<FlameNode>,
    /// Nodes left out as too narrow or past [`MAX_FLAME_NODES`].
    pub(super) nodes_left_out: usize,
}

/// A node while the tree is built.
struct Building {
    parent: Option<usize>,
    /// Function name, and whether it was inlined in every site through the node.
    frame: Option<(String, bool)>,
    /// Source locations of the node's frames, in the order first seen.
    lines: Vec<String>,
    /// Sites past the listed lines had more.
    more_lines: bool,
    bytes: u64,
    variance: u128,
    categories: [u64; Category::COUNT],
    sites: Vec<(u64, u32)>,
    children: HashMap<String, usize>,
}

impl Building {
    fn new(parent: Option<usize>, frame: Option<(String, bool)>) -> Building {
        Building {
            parent,
            frame,
            lines: Vec::new(),
            more_lines: false,
            bytes: 0,
            variance: 0,
            categories: [0; Category::COUNT],
            sites: Vec::new(),
            children: HashMap::new(),
        }
    }

    fn add(&mut self, site: &CallSite, categories: &[u64; Category::COUNT]) {
        self.bytes = self.bytes.saturating_add(site.peak_bytes);
        self.variance += u128::from(site.peak_bytes_error).pow(2);
        for (total, part) in self.categories.iter_mut().zip(categories) {
            *total = total.saturating_add(*part);
        }
        self.sites.push((site.peak_bytes, site.id));
    }
}

/// What a node is told apart by under its parent: the function.
fn key(frame: &Frame) -> String {
    stacks::without_generics(&stacks::function_name(frame))
}

impl Building {
    /// Notes that `frame` went through this node: its line, and whether it was inlined.
    fn saw(&mut self, frame: &Frame) {
        if let Some((_, inlined)) = &mut self.frame {
            *inlined &= frame.inlined;
        }
        if let Some(at) = stacks::source_location(frame) {
            if !self.lines.contains(&at) {
                if self.lines.len() < NODE_LINES {
                    self.lines.push(at);
                } else {
                    self.more_lines = true;
                }
            }
        }
    }
}

/// A site's bytes at the peak by category, from its shares (what they leave out counts as
/// `other`, so the parts add up to the site).
fn site_categories(site: &CallSite) -> [u64; Category::COUNT] {
    let mut parts = [0u64; Category::COUNT];
    for share in &site.shares {
        let part = &mut parts[share.category.index()];
        *part = part.saturating_add(share.peak_bytes);
    }
    let listed = parts
        .iter()
        .fold(0u64, |sum, part| sum.saturating_add(*part));
    let other = &mut parts[Category::Other.index()];
    *other = other.saturating_add(site.peak_bytes.saturating_sub(listed));
    parts
}

/// The category a site's row names: the one holding most of its bytes at the peak, or, for a
/// site that holds nothing then, the one it allocated most of (a gradient buffer freed before
/// the peak is still a gradient).
fn site_category(site: &CallSite) -> Category {
    let mut parts = [0u64; Category::COUNT];
    let at_peak = site.peak_bytes > 0;
    for share in &site.shares {
        let bytes = if at_peak {
            share.peak_bytes
        } else {
            share.alloc_bytes
        };
        let part = &mut parts[share.category.index()];
        *part = part.saturating_add(bytes);
    }
    if at_peak {
        // What the shares leave out of the site's bytes at the peak counts as `other`.
        let listed = parts.iter().fold(0u64, |sum, p| sum.saturating_add(*p));
        let other = &mut parts[Category::Other.index()];
        *other = other.saturating_add(site.peak_bytes.saturating_sub(listed));
    }
    parts
        .iter()
        .enumerate()
        .filter(|(_, &bytes)| bytes > 0)
        .max_by_key(|&(i, &bytes)| (bytes, std::cmp::Reverse(i)))
        .map_or(Category::Other, |(i, _)| Category::from_index(i as u8))
}

/// The icicle of `profile`'s sites, `None` when no site holds bytes at the peak.
pub(super) fn flame(profile: &Profile) -> Option<Flame> {
    let mut nodes = vec![Building::new(None, None)];
    for site in profile.sites.iter().filter(|s| s.peak_bytes > 0) {
        let categories = site_categories(site);
        nodes[0].add(site, &categories);
        let mut at = 0;
        // Outermost first: the icicle hangs from `main` down to the allocating frame.
        for frame in stacks::interesting(&site.frames).frames.iter().rev() {
            let k = key(frame);
            let next = match nodes[at].children.get(&k) {
                Some(&child) => child,
                None => {
                    nodes.push(Building::new(Some(at), Some((k.clone(), frame.inlined))));
                    let child = nodes.len() - 1;
                    nodes[at].children.insert(k, child);
                    child
                }
            };
            nodes[next].saw(frame);
            nodes[next].add(site, &categories);
            at = next;
        }
    }
    let unlisted = profile.sampling.unlisted_peak_bytes;
    if unlisted > 0 {
        let mut node = Building::new(Some(0), Some((UNLISTED_SITES.to_string(), false)));
        node.bytes = unlisted;
        node.categories[Category::Other.index()] = unlisted;
        nodes[0].bytes = nodes[0].bytes.saturating_add(unlisted);
        let other = &mut nodes[0].categories[Category::Other.index()];
        *other = other.saturating_add(unlisted);
        nodes.push(node);
    }
    if nodes[0].bytes == 0 {
        return None;
    }
    Some(keep_widest(nodes))
}

/// The nodes worth drawing, parents before children and children widest first, renumbered.
fn keep_widest(mut nodes: Vec<Building>) -> Flame {
    let total = nodes[0].bytes;
    let narrowest = (total as f64 * MIN_NODE_SHARE).ceil() as u64;
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (index, node) in nodes.iter().enumerate().skip(1) {
        if let Some(parent) = node.parent {
            children[parent].push(index);
        }
    }
    // Widest first, whatever the depth: a node is only reached through its (wider) parent.
    let mut order = Vec::new();
    let mut frontier: std::collections::BinaryHeap<(u64, std::cmp::Reverse<usize>)> =
        std::collections::BinaryHeap::new();
    frontier.push((total, std::cmp::Reverse(0)));
    while let Some((_, std::cmp::Reverse(index))) = frontier.pop() {
        if order.len() == MAX_FLAME_NODES {
            break;
        }
        order.push(index);
        for &child in &children[index] {
            if nodes[child].bytes >= narrowest.max(1) {
                frontier.push((nodes[child].bytes, std::cmp::Reverse(child)));
            }
        }
    }
    let kept: std::collections::HashSet<usize> = order.iter().copied().collect();
    // Parents before children, children widest first: a depth-first walk of what is kept.
    let mut walk = Vec::with_capacity(order.len());
    let mut stack = vec![0usize];
    while let Some(index) = stack.pop() {
        walk.push(index);
        let mut kids: Vec<usize> = children[index]
            .iter()
            .copied()
            .filter(|c| kept.contains(c))
            .collect();
        kids.sort_by_key(|&c| (nodes[c].bytes, std::cmp::Reverse(c)));
        stack.extend(kids);
    }
    let mut renumbered = vec![u32::MAX; nodes.len()];
    for (new, &old) in walk.iter().enumerate() {
        renumbered[old] = new as u32;
    }
    let out = walk
        .iter()
        .map(|&old| {
            let node = &mut nodes[old];
            node.sites
                .sort_by_key(|&(bytes, id)| (std::cmp::Reverse(bytes), id));
            let (f, inl) = node
                .frame
                .take()
                .unwrap_or_else(|| ("all call sites".to_string(), false));
            let mut at = node.lines.join(", ");
            if node.more_lines {
                at.push_str(", …");
            }
            FlameNode {
                p: node.parent.map(|p| renumbered[p]),
                f,
                at,
                inl,
                b: node.bytes,
                e: node.variance.isqrt() as u64,
                c: node.categories,
                s: node
                    .sites
                    .iter()
                    .take(NODE_SITES)
                    .map(|&(_, id)| id)
                    .collect(),
                n: node.sites.len() as u32,
            }
        })
        .collect();
    Flame {
        nodes: out,
        nodes_left_out: nodes.len() - walk.len(),
    }
}

/// A cell of an estimate: `2.8 MiB ± 562.5 KiB`, the error on a line of its own when the
/// column is narrow.
fn estimate_cell(out: &mut String, bytes: u64, error: u64) {
    let _ = write!(
        out,
        "<td class=\"num est\" data-v=\"{bytes}\">{} <span class=\"err\">± {}</span></td>",
        format_bytes(bytes),
        format_bytes(error)
    );
}

/// The section: the icicle (drawn by the script) and the sites' table.
pub(super) fn section(out: &mut String, profile: &Profile) {
    out.push_str("<section id=\"sites\"><h2>Where the peak was allocated</h2>");
    if profile.sites.is_empty() {
        let why = if profile.sampling.mean_bytes == 0 {
            "sampling was off (HIGHWATER_SAMPLE_BYTES=0)"
        } else {
            "no allocation was sampled"
        };
        let _ = write!(
            out,
            "<p class=\"note\">No call sites were recorded: {why}.</p></section>"
        );
        return;
    }
    let _ = write!(
        out,
        "<p class=\"note\">Bytes live at the peak by the stack that allocated them: the whole \
         width is every call site, each frame below its caller, as wide as the bytes allocated \
         through it, coloured by the category most of them hold. Hover a frame for its bytes \
         ± error and file:line; click to zoom into it, click the top bar to zoom out. {}</p>\
         <div id=\"flame-chart\" class=\"chart\"></div>\
         <p id=\"flame-detail\" class=\"note\">Click a frame to keep its figures here.</p>",
        escape_html(words::SITES_EXPLAINED)
    );
    sites_table(out, profile);
    out.push_str("</section>");
}

fn sites_table(out: &mut String, profile: &Profile) {
    let peak = profile.summary.peak_bytes;
    let _ = write!(
        out,
        "<h3>Call sites, largest at the peak first</h3>\
         <p class=\"note\">Every byte figure here is an estimate from sampled stacks (± its \
         standard error); the summary and the tables above are exact. Sites that hold nothing at \
         the peak are folded and named by what they allocated.</p>\
         <div class=\"scroll\">{}<thead><tr>\
         <th data-type=\"num\" class=\"num\">#</th>\
         <th data-type=\"num\" class=\"num\" aria-sort=\"descending\">At the peak (est.)</th>\
         <th data-type=\"num\" class=\"num\">Share</th>\
         <th data-type=\"num\" class=\"num\">Allocated (est.)</th>\
         <th data-type=\"num\" class=\"num\">Allocations (est.)</th>\
         <th data-type=\"text\">Category</th><th data-type=\"text\">Allocated in</th>\
         </tr></thead><tbody>",
        limited_table_of("site-table", "sortable", SHOWN_SITE_ROWS)
    );
    let mut sites: Vec<&CallSite> = profile.sites.iter().collect();
    sites.sort_by_key(|s| (std::cmp::Reverse(s.peak_bytes), s.id));
    let zero = sites
        .iter()
        .take(MAX_TABLE_ROWS)
        .filter(|s| s.peak_bytes == 0)
        .count();
    for (index, site) in sites.iter().take(MAX_TABLE_ROWS).enumerate() {
        let anchor = site_anchor(site.id);
        row_start_of(
            out,
            index,
            SHOWN_SITE_ROWS,
            site.peak_bytes == 0,
            Some(&anchor),
        );
        let _ = write!(
            out,
            "<td class=\"num\" data-v=\"{}\">#{}</td>",
            site.id, site.id
        );
        estimate_cell(out, site.peak_bytes, site.peak_bytes_error);
        let pct = share(site.peak_bytes, peak);
        let _ = write!(out, "<td class=\"num\" data-v=\"{pct:.4}\">{pct:.1}%</td>");
        estimate_cell(out, site.alloc_bytes, site.alloc_bytes_error);
        let _ = write!(
            out,
            "<td class=\"num\" data-v=\"{}\">{}</td>",
            site.alloc_count,
            format_count(site.alloc_count)
        );
        let category = site_category(site);
        let _ = write!(
            out,
            "<td class=\"cat\"><i class=\"dot c{}\"></i>{category}</td>",
            category.index()
        );
        out.push_str("<td class=\"stack\">");
        // The program's own frames: the standard library's between them are left out here
        // (the icicle shows them).
        let own: Vec<&Frame> = stacks::interesting(&site.frames)
            .frames
            .iter()
            .filter(|f| !stacks::is_std_frame(f))
            .collect();
        for (k, frame) in own.iter().take(3).enumerate() {
            let at = stacks::source_location(frame)
                .map(|at| format!(" <span class=\"at\">{}</span>", breakable(&at)))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<div{}>{}{at}</div>",
                if k == 0 { " class=\"leaf\"" } else { "" },
                breakable(&stacks::without_generics(&stacks::function_name(frame)))
            );
        }
        if own.len() > 3 {
            let _ = write!(
                out,
                "<div class=\"more\">… {} more frames of the program</div>",
                own.len() - 3
            );
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</tbody></table></div>");
    show_all_of(out, "site-table", sites.len(), SHOWN_SITE_ROWS, zero);
    if profile.sites.len() > MAX_TABLE_ROWS {
        let _ = write!(
            out,
            "<p class=\"note\">{} more sites are in the profile JSON.</p>",
            format_count((profile.sites.len() - MAX_TABLE_ROWS) as u64)
        );
    }
    let unlisted = &profile.sampling;
    if unlisted.unlisted_peak_bytes > 0 || unlisted.unlisted_alloc_bytes > 0 {
        let _ = write!(
            out,
            "<p class=\"note\">Sites past the {} listed hold an estimated {} at the peak and \
             allocated {}.</p>",
            format_count(profile.sites.len() as u64),
            format_bytes(unlisted.unlisted_peak_bytes),
            format_bytes(unlisted.unlisted_alloc_bytes)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use highwater_testkit::sample::sample_profile;

    #[test]
    fn the_tree_adds_up_and_puts_parents_first_and_wide_children_left() {
        let profile = sample_profile();
        let flame = flame(&profile).unwrap();
        let nodes = &flame.nodes;
        let sites: u64 = profile.sites.iter().map(|s| s.peak_bytes).sum();
        assert_eq!(nodes[0].b, sites + profile.sampling.unlisted_peak_bytes);
        assert_eq!(nodes[0].c.iter().sum::<u64>(), nodes[0].b);
        for (i, node) in nodes.iter().enumerate().skip(1) {
            let parent = node.p.unwrap() as usize;
            assert!(parent < i, "parents first");
            assert!(node.b <= nodes[parent].b);
        }
        // Children of one parent never add up to more than it.
        for (i, parent) in nodes.iter().enumerate() {
            let kids: Vec<&FlameNode> = nodes.iter().filter(|n| n.p == Some(i as u32)).collect();
            assert!(kids.iter().map(|k| k.b).sum::<u64>() <= parent.b);
            assert!(kids.windows(2).all(|w| w[0].b >= w[1].b), "widest first");
        }
        // The root's children are where the stacks start: `main`'s callees, not the runtime.
        let top: Vec<&str> = nodes
            .iter()
            .filter(|n| n.p == Some(0))
            .map(|n| n.f.as_str())
            .collect();
        assert!(top.contains(&"train_gpt::main"), "{top:?}");
        assert!(!top.iter().any(|f| f.starts_with("std::") || *f == "main"));
        // A frame through several sites sums their variances.
        let train = nodes
            .iter()
            .find(|n| n.f == "train_gpt::train_step")
            .unwrap();
        assert!(train.n > 1);
        let leaf = nodes.iter().find(|n| n.at.contains("optim.rs:58")).unwrap();
        assert!(leaf.inl);
        // What is drawn is at least the narrowest width; the sample's tiny embedding site
        // (a few bytes at the peak) is left out.
        let narrowest = (nodes[0].b as f64 * MIN_NODE_SHARE).ceil() as u64;
        assert!(nodes.iter().all(|n| n.b >= narrowest));
        assert!(flame.nodes_left_out > 0);
    }

    #[test]
    fn narrow_and_excess_nodes_are_left_out() {
        let mut profile = sample_profile();
        let template = profile.sites[0].clone();
        // 20,000 distinct one-byte leaves under one frame: far too narrow to draw.
        for i in 0..20_000u32 {
            let mut site = template.clone();
            site.id = profile.sites.len() as u32;
            site.peak_bytes = 1;
            site.frames.insert(0, {
                let mut frame = Frame::default();
                frame.pc = u64::from(i) + 1;
                frame.function = Some(format!("tiny_{i}"));
                frame
            });
            profile.sites.push(site);
        }
        let flame = flame(&profile).unwrap();
        assert!(flame.nodes.len() <= MAX_FLAME_NODES);
        assert!(flame.nodes_left_out >= 20_000);
        assert!(!flame.nodes.iter().any(|n| n.f.starts_with("tiny_")));
    }

    #[test]
    fn no_sites_no_icicle_and_a_note_that_says_why() {
        let profile = Profile::empty();
        assert!(flame(&profile).is_none());
        let mut page = String::new();
        section(&mut page, &profile);
        assert!(page.contains("sampling was off"), "{page}");
    }

    /// Issue 34: a site holding 0 B at the peak was labelled "parameter" (the first category
    /// of an all-zero mix); it is named by what it allocated, and its row starts folded.
    #[test]
    fn a_site_with_nothing_at_the_peak_is_named_by_what_it_allocated_and_folded() {
        let profile = sample_profile();
        let update = profile
            .sites
            .iter()
            .find(|s| s.peak_bytes == 0 && s.alloc_bytes > 0)
            .expect("the sample's update temporaries");
        assert_eq!(site_category(update), Category::Optimizer);
        let page = super::super::render(&profile);
        let row = &page[page
            .find(&format!("<tr id=\"site-{}\"", update.id))
            .unwrap()..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(row.contains("class=\"zero more\""), "{row}");
        assert!(row.contains("</i>optimizer</td>"), "{row}");
        // The others keep the category holding most of their bytes at the peak.
        for site in profile.sites.iter().filter(|s| s.peak_bytes > 0) {
            let top = site
                .shares
                .iter()
                .max_by_key(|share| share.peak_bytes)
                .unwrap();
            if top.peak_bytes * 2 > site.peak_bytes {
                assert_eq!(site_category(site), top.category, "site #{}", site.id);
            }
        }
    }

    /// Frames of one function under one caller are one node whatever line called on.
    #[test]
    fn frames_of_one_function_merge_across_lines() {
        let mut profile = sample_profile();
        let mut twin = profile.sites[0].clone();
        twin.id = 9_999;
        for frame in &mut twin.frames {
            frame.line = frame.line.map(|line| line + 1);
        }
        profile.sites.push(twin);
        let flame = flame(&profile).unwrap();
        let mut seen = std::collections::HashSet::new();
        for node in &flame.nodes {
            assert!(
                seen.insert((node.p, node.f.clone())),
                "{} twice under one parent",
                node.f
            );
        }
        assert!(flame.nodes.iter().any(|n| n.at.contains(", ")));
    }

    #[test]
    fn every_row_link_has_its_anchor() {
        let profile = sample_profile();
        let page = super::super::render(&profile);
        let mut links = 0;
        for row in &profile.peak_breakdown {
            for id in &row.top_sites {
                assert!(page.contains(&format!("href=\"#site-{id}\"")));
                assert!(page.contains(&format!("<tr id=\"site-{id}\"")));
                links += 1;
            }
        }
        assert!(links > 0);
    }
}

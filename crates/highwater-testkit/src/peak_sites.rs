//! The code behind a category's bytes at the peak, from the profile's call sites: its state
//! (bytes that outlived the span that allocated them) apart from its temporaries (freed before
//! that span exited), each with the sites that hold it, named the way `highwater sites` names
//! them.

use highwater::profile::{CallSite, Frame, SiteShare};
use highwater::{Category, Profile};
use highwater_export::stacks;

/// Which part of a category's bytes at the peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// Outlived the span that allocated it.
    State,
    /// Freed before the span that allocated it exited.
    Temporary,
}

impl Part {
    fn of(self, share: &SiteShare) -> u64 {
        let temporary = share.peak_temporary_bytes.min(share.peak_bytes);
        match self {
            Part::State => share.peak_bytes - temporary,
            Part::Temporary => temporary,
        }
    }
}

/// One call site's estimated bytes of a part of a category at the peak.
#[derive(Debug, Clone, Copy)]
pub struct SiteBytes<'a> {
    /// The site.
    pub site: &'a CallSite,
    /// Its estimated bytes of the part.
    pub bytes: u64,
}

/// The sites holding `part` of `category`'s bytes at the peak, largest first.
pub fn sites_holding(profile: &Profile, category: Category, part: Part) -> Vec<SiteBytes<'_>> {
    let mut sites: Vec<SiteBytes> = profile
        .sites
        .iter()
        .map(|site| SiteBytes {
            site,
            bytes: site
                .shares
                .iter()
                .filter(|share| share.category == category)
                .map(|share| part.of(share))
                .sum(),
        })
        .filter(|held| held.bytes > 0)
        .collect();
    sites.sort_by_key(|held| (std::cmp::Reverse(held.bytes), held.site.id));
    sites
}

/// A frame as a reader wants it: the function without generic arguments, and `file:line`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The function, without generic arguments.
    pub function: String,
    /// `file:line`, when known.
    pub location: Option<String>,
}

impl Named {
    fn of(frame: &Frame) -> Named {
        // The program's own files read best relative to where it was run from.
        let here = std::env::current_dir().ok();
        let location = stacks::source_location(frame).map(|at| {
            let relative = here
                .as_ref()
                .and_then(|dir| at.strip_prefix(&format!("{}/", dir.display())));
            relative.map_or(at.clone(), str::to_string)
        });
        Named {
            function: stacks::without_generics(&stacks::function_name(frame)),
            location,
        }
    }
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.location {
            Some(at) => write!(f, "{} ({at})", self.function),
            None => write!(f, "{}", self.function),
        }
    }
}

/// Where a site allocated: the innermost frame left once the allocation machinery is trimmed
/// (as `highwater sites` shows it first), the first frame of the program's own code below it
/// when that is another one, and the library function that frame called, when that is not the
/// innermost one either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Where {
    /// The program's function that allocated.
    pub allocated_in: Named,
    /// The library function it allocated through, if any.
    pub through: Option<Named>,
    /// Who called the allocating function.
    pub called_from: Option<Named>,
}

/// Whether a frame is the program's own: a source file that is neither a dependency's (the
/// Cargo registry's or a git checkout's) nor the toolchain's, in a function that is not
/// highwater's (whose op wrapper sits between a model and candle).
fn is_programs(frame: &Frame) -> bool {
    let own_file = frame
        .file
        .as_deref()
        .is_some_and(|file| stacks::short_file(file) == file && !stacks::is_std_file(file));
    let highwaters = frame
        .function
        .as_deref()
        .is_some_and(|name| name.starts_with("highwater::") || name.starts_with("<highwater::"));
    own_file && !highwaters
}

/// Where `site` allocated; `None` for a site with no frames.
pub fn where_allocated(site: &CallSite) -> Option<Where> {
    let frames = stacks::interesting(&site.frames).frames;
    let first = frames.first()?;
    let caller = frames.iter().position(is_programs).filter(|&at| at > 0);
    let through = caller
        .filter(|&at| at > 1)
        .map(|at| &frames[at - 1])
        .filter(|frame| !stacks::is_std_frame(frame));
    Some(Where {
        allocated_in: Named::of(first),
        through: through.map(Named::of),
        called_from: caller.map(|at| Named::of(&frames[at])),
    })
}

impl std::fmt::Display for Where {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.allocated_in)?;
        if let Some(through) = &self.through {
            write!(f, " in {through}")?;
        }
        if let Some(caller) = &self.called_from {
            write!(f, ", called from {caller}")?;
        }
        Ok(())
    }
}

/// One place in the code (as [`where_allocated`] names it) and what its sites hold: stacks that
/// differ only past the frames named are one place.
#[derive(Debug, Clone)]
pub struct Place {
    /// Where, when the stacks name the program's code.
    pub at: Option<Where>,
    /// The sites' estimated bytes together.
    pub bytes: u64,
    /// The sites' ids, largest first.
    pub sites: Vec<u32>,
}

/// The places holding `part` of `category`'s bytes at the peak, largest first.
pub fn places_holding(profile: &Profile, category: Category, part: Part) -> Vec<Place> {
    let mut places: Vec<Place> = Vec::new();
    for held in sites_holding(profile, category, part) {
        let at = where_allocated(held.site);
        match places.iter_mut().find(|place| place.at == at) {
            Some(place) => {
                place.bytes += held.bytes;
                place.sites.push(held.site.id);
            }
            None => places.push(Place {
                at,
                bytes: held.bytes,
                sites: vec![held.site.id],
            }),
        }
    }
    places.sort_by_key(|place| (std::cmp::Reverse(place.bytes), place.sites[0]));
    places
}

//! `highwater fit`: the largest scale of chosen categories that still fits a device under an
//! allocator, with the peak, the allocator's tax there and what fills the device first.

use std::path::Path;

use highwater_device::{figures, fit, Allocator, DeviceKind, Edits, FitAnswer, FitQuery};
use highwater_profile::model::Category;
use highwater_profile::units::{format_bytes, format_factor};
use highwater_profile::Profile;
use serde_json::json;

use super::fit_page::{section, DeviceFigures};
use super::replay::{self, DoesNotFit};

/// What to search.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    pub(crate) input: &'a Path,
    pub(crate) device: Option<DeviceKind>,
    pub(crate) grow: &'a [Category],
    pub(crate) allocator: Allocator,
    pub(crate) max_split_size_mb: Option<u64>,
    pub(crate) limit: Option<u64>,
    pub(crate) stream: Option<&'a str>,
    pub(crate) edits: Edits,
    pub(crate) min_block: u64,
    pub(crate) html: Option<&'a Path>,
    pub(crate) json: bool,
}

/// Searches, prints the answer (and writes the HTML page when asked); a [`DoesNotFit`] error
/// afterwards when the run as recorded does not fit.
pub(crate) fn run(request: &Request<'_>) -> anyhow::Result<()> {
    let allocator = match (request.allocator, request.max_split_size_mb) {
        (Allocator::PyTorch(options), Some(mb)) => Allocator::PyTorch(
            options
                .max_split_size_mb(mb)
                .map_err(|e| replay::InputError(e.to_string()))?,
        ),
        (other, Some(_)) => {
            return Err(replay::InputError(format!(
                "--max-split-size-mb applies to the pytorch allocators, not {other}"
            ))
            .into())
        }
        (other, None) => other,
    };
    let stream = replay::load_stream(request.input, request.stream, request.min_block)?;
    let target = replay::Target::resolve(request.device, request.limit, &stream)?;
    let capacity = target.capacity;
    let recorded = stream.trace.edited(&request.edits);
    let mut compared = Allocator::standard();
    if !compared.contains(&allocator) {
        compared.insert(0, allocator);
    }
    let whatif = figures(&recorded, capacity, &compared);
    let query = FitQuery::new(allocator, capacity, request.grow.to_vec()).with_edits(request.edits);
    let answer = fit(&stream.trace, &query);
    let note = stream.proxy.map(replay::proxy_note).unwrap_or_default();
    if let Some(path) = request.html {
        let profile = stream.profile.clone().unwrap_or_else(Profile::empty);
        let html = section(
            &[DeviceFigures {
                device: &stream.name,
                figures: &whatif,
            }],
            Some(&answer),
            note.trim(),
        );
        highwater_export::html::write_with(&profile, &html, path)?;
    }
    if request.json {
        super::emit_json(&answer_json(
            &stream.name,
            &target,
            request,
            &answer,
            &whatif,
        ))?;
    } else {
        let mut text = short_answer(&answer, &target, &whatif);
        text.push_str(&format!(
            "\ndetail: {} from {} on {} ({}), growing {} under {}; other edits: {}\n",
            stream.name,
            stream.log_path.display(),
            target.name,
            format_bytes(capacity),
            names(request.grow),
            allocator,
            request.edits,
        ));
        text.push_str(&note);
        text.push('\n');
        text.push_str(&replay::figures_text(&stream.name, &whatif));
        text.push('\n');
        text.push_str(&answer_text(&answer));
        if let Some(path) = request.html {
            text.push_str(&format!("report: {}\n", path.display()));
        }
        super::emit(&text)?;
    }
    if answer.fits_as_recorded {
        Ok(())
    } else {
        Err(DoesNotFit(format!(
            "{} as recorded does not fit {} ({}) under {allocator}",
            stream.name,
            target.name,
            format_bytes(capacity)
        ))
        .into())
    }
}

fn names(categories: &[Category]) -> String {
    categories
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The answer in a few lines, before the detail: whether the run fits as recorded and by how
/// much, how far the grown categories can go (a plain number), and the allocator that decides.
fn short_answer(
    answer: &FitAnswer,
    target: &replay::Target,
    whatif: &highwater_device::Figures,
) -> String {
    let grown = names(&answer.query.grow);
    let allocator = answer.query.allocator;
    let capacity = answer.query.capacity;
    let recorded = whatif
        .allocators
        .iter()
        .find(|a| a.allocator == allocator)
        .map_or(whatif.lower_bound, |a| a.peak_bytes);
    let mut text = if answer.fits_as_recorded {
        format!(
            "answer: fits as recorded, with {} to spare on {} ({}) under {allocator}, which \
             decides: the run needs {} under it\n",
            format_bytes(capacity.saturating_sub(recorded)),
            target.name,
            format_bytes(capacity),
            format_bytes(recorded)
        )
    } else {
        format!(
            "answer: does not fit as recorded: it needs {} under {allocator}, which decides, \
             {} more than {} ({})\n",
            format_bytes(recorded),
            format_bytes(recorded.saturating_sub(capacity)),
            target.name,
            format_bytes(capacity)
        )
    };
    match answer.factor {
        Some(factor) => text.push_str(&format!(
            "  {grown} can grow to {} times its recorded size{}\n",
            format_factor(factor.as_f64()),
            if answer.ceiling {
                " (the search's ceiling: it still fits)"
            } else {
                " before the device fills"
            }
        )),
        None => text.push_str(&format!(
            "  no size of {grown} fits: the rest of the run is too large on its own\n"
        )),
    }
    text
}

fn answer_text(answer: &FitAnswer) -> String {
    let grown = names(&answer.query.grow);
    let mut text = match answer.factor {
        Some(factor) => {
            let factor = format_factor(factor.as_f64());
            let mut line = format!(
                "largest factor that fits: {grown} ×{factor}{}\n  at ×{factor}: peak {}, lower \
                 bound {}, {} overhead {} ({:.1} %)\n",
                if answer.ceiling {
                    " (the search's ceiling: it still fits)"
                } else {
                    ""
                },
                format_bytes(answer.peak_bytes),
                format_bytes(answer.lower_bound),
                answer.query.allocator,
                format_bytes(answer.tax_bytes),
                answer.tax_percent,
            );
            if !answer.fits_as_recorded {
                line.push_str("  the run as recorded does not fit: the factor is below 1\n");
            }
            line
        }
        None => format!(
            "does not fit at any factor of {grown}: the rest of the run is too large on its own\n"
        ),
    };
    if let Some(first) = &answer.first_to_fill {
        let live: Vec<String> = Category::ALL
            .into_iter()
            .filter(|c| first.live[c.index()] > 0)
            .map(|c| format!("{} {}", c.as_str(), format_bytes(first.live[c.index()])))
            .collect();
        text.push_str(&format!(
            "  just past it the device fills first with {}: {} of {} refused with {} live\n",
            first.category.as_str(),
            format_bytes(first.refused.1),
            first.refused.0.as_str(),
            if live.is_empty() {
                "nothing".to_string()
            } else {
                live.join(", ")
            }
        ));
    }
    text.push_str(&format!(
        "peak against factor (no device limit; capacity {}):\n",
        format_bytes(answer.query.capacity)
    ));
    for p in &answer.curve {
        text.push_str(&format!(
            "  ×{:<8} peak {:>10}  lower bound {:>10}  {}\n",
            format_factor(p.factor),
            format_bytes(p.peak_bytes),
            format_bytes(p.lower_bound),
            if p.fits { "fits" } else { "does not fit" }
        ));
    }
    text
}

fn answer_json(
    stream: &str,
    target: &replay::Target,
    request: &Request<'_>,
    answer: &FitAnswer,
    whatif: &highwater_device::Figures,
) -> serde_json::Value {
    json!({
        "stream": stream,
        "device": target.name,
        "capacity_bytes": answer.query.capacity,
        "allocator": answer.query.allocator.to_string(),
        "grow": request.grow.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        "edits": request.edits.to_string(),
        "fits_as_recorded": answer.fits_as_recorded,
        "factor": answer.factor.map(|f| f.as_f64()),
        "at_ceiling": answer.ceiling,
        "peak_bytes": answer.peak_bytes,
        "lower_bound_bytes": answer.lower_bound,
        "tax_bytes": answer.tax_bytes,
        "tax_percent": answer.tax_percent,
        "first_to_fill": answer.first_to_fill.as_ref().map(|f| json!({
            "factor": f.factor.as_f64(),
            "category": f.category.as_str(),
            "refused_category": f.refused.0.as_str(),
            "refused_bytes": f.refused.1,
            "live_bytes": Category::ALL.iter().map(|c| (c.as_str().to_string(), json!(f.live[c.index()])))
                .collect::<serde_json::Map<_, _>>(),
        })),
        "curve": answer.curve.iter().map(|p| json!({
            "factor": p.factor,
            "peak_bytes": p.peak_bytes,
            "lower_bound_bytes": p.lower_bound,
            "fits": p.fits,
        })).collect::<Vec<_>>(),
        "figures": replay::figures_json(whatif),
    })
}

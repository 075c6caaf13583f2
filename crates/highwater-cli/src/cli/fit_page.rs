//! The "will it fit?" section `highwater fit --html` adds to the HTML report: per device, the
//! lower bound, the offline packing and each allocator's peak with its overhead; for a fit
//! search, the curve of peak against the scale factor with the device's capacity drawn across
//! it.
//!
//! The curve is inline SVG (a few dozen points), so the section needs no script.

use std::fmt::Write as _;

use highwater_device::{CurvePoint, Figures, FitAnswer};
use highwater_export::html::escape_html;
use highwater_profile::units::format_bytes;

/// One device's figures, named.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceFigures<'a> {
    /// The device (or stream) name, such as `cuda:0` or `cpu`.
    pub(crate) device: &'a str,
    /// Its figures.
    pub(crate) figures: &'a Figures,
}

/// The section: a table per device, then the fit curve when `answer` is given. `note` (such as
/// what the CPU proxy assumes) is shown above the tables.
pub(crate) fn section(
    devices: &[DeviceFigures<'_>],
    answer: Option<&FitAnswer>,
    note: &str,
) -> String {
    let mut out = String::from(
        "<section id=\"fit\"><h2>Will it fit?</h2><p class=\"note\">Lower bound: the most \
         bytes live at once. Offline packing: the run planned with every lifetime known in \
         advance. Each allocator: the most memory it holds from the device while serving the \
         run; its overhead is that peak minus the lower bound (rounding, caching and fragmentation).</p>",
    );
    if !note.is_empty() {
        let _ = write!(out, "<p class=\"note\">{}</p>", escape_html(note));
    }
    for d in devices {
        device_table(&mut out, d);
    }
    if let Some(answer) = answer {
        curve(&mut out, answer);
    }
    out.push_str("</section>");
    out
}

fn device_table(out: &mut String, d: &DeviceFigures<'_>) {
    let f = d.figures;
    let _ = write!(
        out,
        "<h3>{} <span class=\"note\">capacity {}, {} allocations</span></h3>\
         <table class=\"fit-table\"><thead><tr><th>Figure</th><th class=\"num\">Peak</th>\
         <th class=\"num\">Overhead</th><th class=\"num\">Overhead %</th><th>On this device</th>\
         </tr></thead><tbody>",
        escape_html(d.device),
        format_bytes(f.capacity),
        f.allocations
    );
    let row = |out: &mut String, name: &str, peak: u64, tax: Option<(u64, f64)>, verdict: &str| {
        let (tax, percent) = match tax {
            Some((bytes, percent)) => (format_bytes(bytes), format!("{percent:.1}")),
            None => ("-".to_string(), "-".to_string()),
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{tax}</td>\
             <td class=\"num\">{percent}</td><td>{}</td></tr>",
            escape_html(name),
            format_bytes(peak),
            escape_html(verdict)
        );
    };
    let fits = |bytes: u64| {
        if bytes <= f.capacity {
            "fits"
        } else {
            "too large"
        }
    };
    row(out, "Lower bound", f.lower_bound, None, fits(f.lower_bound));
    row(
        out,
        "Offline packing",
        f.offline,
        Some((
            f.offline.saturating_sub(f.lower_bound),
            f.offline_tax_percent,
        )),
        fits(f.offline),
    );
    for a in &f.allocators {
        let verdict = if a.fits {
            "fits".to_string()
        } else {
            format!("out of memory ({} refused)", a.failures)
        };
        row(
            out,
            &a.allocator.to_string(),
            a.peak_bytes,
            Some((a.tax_bytes, a.tax_percent)),
            &verdict,
        );
    }
    out.push_str("</tbody></table>");
}

/// Peak and lower bound against the factor, with the capacity as a horizontal line.
fn curve(out: &mut String, answer: &FitAnswer) {
    const W: f64 = 640.0;
    const H: f64 = 240.0;
    const PAD: f64 = 48.0;
    let capacity = answer.query.capacity;
    let points = &answer.curve;
    let grown: Vec<&str> = answer.query.grow.iter().map(|c| c.as_str()).collect();
    let _ = write!(
        out,
        "<h3>Peak against the {} factor under {}</h3>",
        escape_html(&grown.join(" + ")),
        escape_html(&answer.query.allocator.to_string())
    );
    let max_x = points
        .iter()
        .map(|p| p.factor)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let max_y = points
        .iter()
        .map(|p| p.peak_bytes.max(p.lower_bound))
        .chain([capacity])
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.05;
    let x = |v: f64| PAD + v / max_x * (W - 2.0 * PAD);
    let y = |v: u64| H - PAD + -(v as f64 / max_y) * (H - 2.0 * PAD);
    let path = |value: &dyn Fn(&CurvePoint) -> u64| {
        points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "{}{:.1},{:.1}",
                    if i == 0 { "M" } else { "L" },
                    x(p.factor),
                    y(value(p))
                )
            })
            .collect::<String>()
    };
    let _ = write!(
        out,
        "<svg id=\"fit-curve\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" \
         aria-label=\"peak against factor\">\
         <line x1=\"{PAD}\" y1=\"{cy:.1}\" x2=\"{x2}\" y2=\"{cy:.1}\" stroke=\"#c0392b\" \
         stroke-dasharray=\"6 4\"/><text x=\"{x2}\" y=\"{ty:.1}\" text-anchor=\"end\" \
         font-size=\"11\" fill=\"#c0392b\">capacity {}</text>\
         <path d=\"{}\" fill=\"none\" stroke=\"#888\" stroke-width=\"1.5\"/>\
         <path d=\"{}\" fill=\"none\" stroke=\"#2c6fbb\" stroke-width=\"2\"/>",
        escape_html(&format_bytes(capacity)),
        path(&|p| p.lower_bound),
        path(&|p| p.peak_bytes),
        cy = y(capacity),
        ty = y(capacity) - 4.0,
        x2 = W - PAD,
    );
    for p in points {
        let _ = write!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"><title>×{:.2}: peak {}{}</title></circle>",
            x(p.factor),
            y(p.peak_bytes),
            if p.fits { "#2c6fbb" } else { "#c0392b" },
            p.factor,
            escape_html(&format_bytes(p.peak_bytes)),
            if p.fits { "" } else { " (does not fit)" }
        );
    }
    let _ = write!(
        out,
        "<text x=\"{PAD}\" y=\"{}\" font-size=\"11\">×0</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">×{:.2}</text>\
         <text x=\"{PAD}\" y=\"{}\" font-size=\"11\">peak (blue), lower bound (grey)</text></svg>",
        H - PAD + 16.0,
        W - PAD,
        H - PAD + 16.0,
        max_x,
        PAD - 16.0
    );
    match answer.factor {
        Some(factor) => {
            let _ = write!(
                out,
                "<p id=\"fit-answer\">Largest factor that fits: <b>{}</b> (peak {}, tax {}, {:.1} %).</p>",
                escape_html(&factor.to_string()),
                escape_html(&format_bytes(answer.peak_bytes)),
                escape_html(&format_bytes(answer.tax_bytes)),
                answer.tax_percent
            );
        }
        None => out.push_str(
            "<p id=\"fit-answer\">The run does not fit at any factor: what is not grown is too \
             large on its own.</p>",
        ),
    }
}

#[cfg(test)]
mod tests {
    use highwater_device::{figures, Allocator, SimOp, Trace};

    use super::*;

    #[test]
    fn the_section_names_the_lower_bound_and_each_allocator() {
        let trace = Trace::new(&[SimOp::alloc(0, 1, 4096)]);
        let f = figures(&trace, 1 << 30, &[Allocator::pytorch()]);
        let html = section(
            &[DeviceFigures {
                device: "cuda:0",
                figures: &f,
            }],
            None,
            "",
        );
        assert!(html.contains("Lower bound") && html.contains("pytorch"));
        assert!(!html.contains("fit-curve"), "no curve without a search");
    }
}

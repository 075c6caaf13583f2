//! What `simulate` and `fit` share: finding the stream to replay, the CPU proxy, the three
//! figures as a table, and the "does not fit" outcome.

use std::path::{Path, PathBuf};

use highwater_device::{blocks_at_least, ops_from_log, DeviceKind, Figures, SimOp, Trace};
use highwater_profile::alloc_log::AllocLog;
use highwater_profile::units::format_bytes;
use highwater_profile::Profile;
use serde_json::json;

/// The input cannot be replayed (no log, unknown stream).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InputError(pub(crate) String);

/// The run does not fit the device: reported after the output, exit code
/// [`super::EXIT_DOES_NOT_FIT`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct DoesNotFit(pub(crate) String);

/// The stream name of the host heap, which `--stream cpu` replays as a proxy device.
pub(crate) const CPU: &str = "cpu";

/// One device's recorded allocations, ready to replay.
pub(crate) struct Stream {
    pub(crate) log_path: PathBuf,
    pub(crate) profile: Option<Profile>,
    pub(crate) name: String,
    /// The operations replayed (for `cpu`, its tensor-sized blocks only).
    pub(crate) ops: Vec<SimOp>,
    /// The same stream for the what-if allocators.
    pub(crate) trace: Trace,
    /// `Some(min block)` when the stream is the CPU heap standing in for a device.
    pub(crate) proxy: Option<u64>,
}

/// The device a stream is replayed onto: its name as the output says it, and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) capacity: u64,
}

impl Target {
    /// `--limit` bytes if given, else `--device`'s size, else the capacity the profile recorded
    /// for the stream's own device (its driver's total memory, or its pool's size).
    pub(crate) fn resolve(
        device: Option<DeviceKind>,
        limit: Option<u64>,
        stream: &Stream,
    ) -> Result<Target, InputError> {
        let recorded = stream.profile.as_ref().and_then(|profile| {
            profile
                .devices
                .iter()
                .find(|d| d.device == stream.name)
                .and_then(|d| d.capacity_bytes)
        });
        let name = match device {
            Some(kind) => kind.name().to_string(),
            None if limit.is_some() => "the given limit".to_string(),
            None => format!("{} as recorded", stream.name),
        };
        let capacity = limit
            .or(device.map(DeviceKind::capacity_bytes))
            .or(recorded)
            .ok_or_else(|| {
                InputError(format!(
                    "name the device to replay on (--device) or its size (--limit): the profile \
                     records no capacity for {}",
                    stream.name
                ))
            })?;
        Ok(Target { name, capacity })
    }
}

/// Reads the log behind `input` and picks the stream: `stream`, else the device of the
/// profile's peak, else the log's first device.
pub(crate) fn load_stream(
    input: &Path,
    stream: Option<&str>,
    min_block: u64,
) -> anyhow::Result<Stream> {
    let (log_path, profile) = super::locate_log(input)?;
    let peak_device = profile
        .as_ref()
        .map(|p| p.summary.peak_device.clone())
        .filter(|d| !d.is_empty());
    let log = AllocLog::read(&log_path)?;
    let name = stream
        .map(str::to_string)
        .or(peak_device.filter(|d| log.device(d).is_some()))
        .or_else(|| log.devices.first().cloned())
        .ok_or_else(|| InputError(format!("{} records no allocations", log_path.display())))?;
    let index = log.device(&name).ok_or_else(|| {
        InputError(format!(
            "{} has no device {name:?}; it has {}",
            log_path.display(),
            log.devices.join(", ")
        ))
    })?;
    let proxy = (name == CPU).then_some(min_block);
    let ops = match proxy {
        Some(min) => blocks_at_least(&ops_from_log(&log, index), min),
        None => ops_from_log(&log, index),
    };
    let trace = Trace::new(&ops);
    Ok(Stream {
        log_path,
        profile,
        name,
        ops,
        trace,
        proxy,
    })
}

/// What the CPU proxy assumes, said plainly.
pub(crate) fn proxy_note(min_block: u64) -> String {
    format!(
        "CPU proxy: the host heap stands in for a device stream. Assumed: blocks of {} or more \
         are tensors and would live on the device for the same span of the run (same \
         allocation and free order); smaller blocks are the framework's bookkeeping and stay \
         in host memory; the device framework frees at the same points (no extra caching, no \
         asynchronous streams, no CUDA context or workspaces, which add a fixed amount).\n",
        format_bytes(min_block)
    )
}

/// The three figures as a table: lower bound, offline packing, each allocator with its tax.
pub(crate) fn figures_text(stream: &str, figures: &Figures) -> String {
    let mut text = format!(
        "{stream}: {} allocations; device capacity {}\n",
        highwater_profile::units::format_count(figures.allocations as u64),
        format_bytes(figures.capacity)
    );
    text.push_str(&format!(
        "  {:<20} {:>12} {:>22}  {}\n",
        "", "peak", "overhead", "on this device"
    ));
    text.push_str(&format!(
        "  {:<20} {:>12} {:>22}  {}\n",
        "lower bound (live)",
        format_bytes(figures.lower_bound),
        "-",
        fits_word(figures.lower_bound <= figures.capacity)
    ));
    text.push_str(&format!(
        "  {:<20} {:>12} {:>22}  {}\n",
        "offline packing",
        format_bytes(figures.offline),
        tax_text(
            figures.offline.saturating_sub(figures.lower_bound),
            figures.offline_tax_percent
        ),
        fits_word(figures.offline <= figures.capacity)
    ));
    for a in &figures.allocators {
        let verdict = if a.fits {
            "fits".to_string()
        } else {
            format!("OUT OF MEMORY ({} refused)", a.failures)
        };
        text.push_str(&format!(
            "  {:<20} {:>12} {:>22}  {verdict}\n",
            a.allocator.to_string(),
            format_bytes(a.peak_bytes),
            tax_text(a.tax_bytes, a.tax_percent),
        ));
    }
    text.push_str(
        "  lower bound: most bytes live at once; offline packing: the run planned with every \
         lifetime known; peak: most memory the allocator holds from the device with room to \
         spare; overhead: peak - lower bound (rounding, caching and fragmentation).\n",
    );
    text
}

fn fits_word(fits: bool) -> &'static str {
    if fits {
        "fits"
    } else {
        "too large"
    }
}

fn tax_text(bytes: u64, percent: f64) -> String {
    format!("{} ({percent:.1} %)", format_bytes(bytes))
}

/// The figures as JSON.
pub(crate) fn figures_json(figures: &Figures) -> serde_json::Value {
    json!({
        "capacity_bytes": figures.capacity,
        "allocations": figures.allocations,
        "lower_bound_bytes": figures.lower_bound,
        "offline_bytes": figures.offline,
        "offline_tax_percent": figures.offline_tax_percent,
        "allocators": figures.allocators.iter().map(|a| json!({
            "allocator": a.allocator.to_string(),
            "peak_bytes": a.peak_bytes,
            "tax_bytes": a.tax_bytes,
            "tax_percent": a.tax_percent,
            "fits": a.fits,
            "refused": a.failures,
            "peak_on_device_bytes": a.peak_on_device,
        })).collect::<Vec<_>>(),
    })
}

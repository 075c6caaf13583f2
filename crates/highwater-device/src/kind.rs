//! Devices: which accelerator a pool stands for, and how much memory it has.

use std::fmt;
use std::str::FromStr;

const GIB: u64 = 1 << 30;

/// Index of a device within a pool manager (`highwater::device::PoolManager`), from 0.
///
/// # Examples
///
/// ```
/// use highwater_device::DeviceIndex;
/// assert_eq!(DeviceIndex(3).to_string(), "device 3");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceIndex(pub u32);

impl fmt::Display for DeviceIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.0)
    }
}

/// An accelerator model, for its memory size and its name prefix.
///
/// Capacities are the spec-sheet figures read as binary units (32 GiB for a TPU v4 core). The
/// runtimes report somewhat less usable memory than the sheet (an "80 GB" H100 shows about
/// 79.6 GiB); size pools from what the runtime reports with
/// `highwater::device::PoolManagerBuilder::limit` when you know it.
///
/// | kind | parse name | per device |
/// |---|---|---|
/// | `TpuV2` | `tpu-v2` | 8 GiB per core |
/// | `TpuV3` | `tpu-v3` | 16 GiB per core |
/// | `TpuV4` | `tpu-v4` | 32 GiB per core |
/// | `TpuV5e` | `tpu-v5e` | 16 GiB per core |
/// | `TpuV5p` | `tpu-v5p` | 95 GiB per core |
/// | `A100_40GB` | `a100-40gb` | 40 GiB |
/// | `A100_80GB` | `a100-80gb` | 80 GiB |
/// | `H100` | `h100` | 80 GiB |
/// | `H200` | `h200` | 141 GiB |
/// | `L4` | `l4` | 24 GiB |
///
/// # Examples
///
/// ```
/// use highwater_device::DeviceKind;
/// let kind: DeviceKind = "tpu-v4".parse()?;
/// assert_eq!(kind.capacity_bytes(), 32 << 30);
/// assert_eq!(kind.device_name(1), "tpu:1");
/// assert_eq!(DeviceKind::H100.device_name(0), "cuda:0");
/// # Ok::<(), highwater_device::ParseNameError>(())
/// ```
#[allow(non_camel_case_types)] // `A100_40GB` reads as the product is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Cloud TPU v2, 8 GiB HBM per core.
    TpuV2,
    /// Cloud TPU v3, 16 GiB HBM per core.
    TpuV3,
    /// Cloud TPU v4, 32 GiB HBM per core.
    TpuV4,
    /// Cloud TPU v5e, 16 GiB HBM per core.
    TpuV5e,
    /// Cloud TPU v5p, 95 GiB HBM per core.
    TpuV5p,
    /// NVIDIA A100 40 GB.
    A100_40GB,
    /// NVIDIA A100 80 GB.
    A100_80GB,
    /// NVIDIA H100 80 GB.
    H100,
    /// NVIDIA H200 141 GB.
    H200,
    /// NVIDIA L4 24 GB.
    L4,
}

impl DeviceKind {
    /// Every kind, in the table's order.
    pub const ALL: [DeviceKind; 10] = [
        DeviceKind::TpuV2,
        DeviceKind::TpuV3,
        DeviceKind::TpuV4,
        DeviceKind::TpuV5e,
        DeviceKind::TpuV5p,
        DeviceKind::A100_40GB,
        DeviceKind::A100_80GB,
        DeviceKind::H100,
        DeviceKind::H200,
        DeviceKind::L4,
    ];

    /// Memory of one device (one core for TPUs), in bytes.
    pub const fn capacity_bytes(self) -> u64 {
        match self {
            DeviceKind::TpuV2 => 8 * GIB,
            DeviceKind::TpuV3 | DeviceKind::TpuV5e => 16 * GIB,
            DeviceKind::TpuV4 => 32 * GIB,
            DeviceKind::TpuV5p => 95 * GIB,
            DeviceKind::A100_40GB => 40 * GIB,
            DeviceKind::A100_80GB | DeviceKind::H100 => 80 * GIB,
            DeviceKind::H200 => 141 * GIB,
            DeviceKind::L4 => 24 * GIB,
        }
    }

    /// The name prefix of this kind's devices: `"tpu"` or `"cuda"`.
    pub const fn prefix(self) -> &'static str {
        match self {
            DeviceKind::TpuV2
            | DeviceKind::TpuV3
            | DeviceKind::TpuV4
            | DeviceKind::TpuV5e
            | DeviceKind::TpuV5p => "tpu",
            _ => "cuda",
        }
    }

    /// The name [`FromStr`] accepts, such as `"tpu-v4"`.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceKind::TpuV2 => "tpu-v2",
            DeviceKind::TpuV3 => "tpu-v3",
            DeviceKind::TpuV4 => "tpu-v4",
            DeviceKind::TpuV5e => "tpu-v5e",
            DeviceKind::TpuV5p => "tpu-v5p",
            DeviceKind::A100_40GB => "a100-40gb",
            DeviceKind::A100_80GB => "a100-80gb",
            DeviceKind::H100 => "h100",
            DeviceKind::H200 => "h200",
            DeviceKind::L4 => "l4",
        }
    }

    /// The profile's name for device `index` of this kind: `"tpu:0"`, `"cuda:1"`.
    pub fn device_name(self, index: u32) -> String {
        format!("{}:{index}", self.prefix())
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DeviceKind {
    type Err = ParseNameError;

    /// Parses a [`DeviceKind::name`], ignoring ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeviceKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ParseNameError {
                what: "device kind",
                given: s.to_owned(),
                valid: DeviceKind::ALL.map(DeviceKind::name).to_vec(),
            })
    }
}

/// An unrecognised [`DeviceKind`] or [`Strategy`](super::Strategy) name; lists the valid names.
///
/// # Examples
///
/// ```
/// use highwater_device::DeviceKind;
/// let err = "tpu-v9".parse::<DeviceKind>().unwrap_err();
/// assert!(err.to_string().contains("tpu-v4"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; valid names: {}", valid.join(", "))]
pub struct ParseNameError {
    what: &'static str,
    given: String,
    valid: Vec<&'static str>,
}

impl ParseNameError {
    pub(crate) fn new(what: &'static str, given: &str, valid: Vec<&'static str>) -> Self {
        Self {
            what,
            given: given.to_owned(),
            valid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_name() {
        for kind in DeviceKind::ALL {
            assert_eq!(kind.name().parse::<DeviceKind>(), Ok(kind));
            assert_eq!(
                kind.to_string().to_uppercase().parse::<DeviceKind>(),
                Ok(kind)
            );
        }
    }

    #[test]
    fn table_matches_the_spec_sheets() {
        assert_eq!(DeviceKind::TpuV2.capacity_bytes(), 8 << 30);
        assert_eq!(DeviceKind::TpuV5p.capacity_bytes(), 95 << 30);
        assert_eq!(DeviceKind::H200.capacity_bytes(), 141 << 30);
        assert_eq!(DeviceKind::L4.capacity_bytes(), 24 << 30);
        assert_eq!(DeviceKind::A100_40GB.device_name(2), "cuda:2");
    }

    #[test]
    fn unknown_kind_error_lists_valid_names() {
        let err = "v100".parse::<DeviceKind>().unwrap_err().to_string();
        assert!(err.contains("\"v100\""), "{err}");
        for kind in DeviceKind::ALL {
            assert!(err.contains(kind.name()), "{err}");
        }
    }
}

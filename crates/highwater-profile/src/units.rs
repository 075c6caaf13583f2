//! Human units: bytes in binary multiples (KiB, MiB, GiB), durations, counts and shapes.
//!
//! The one formatter every output uses (the HTML report, the Chrome trace's labels, the
//! `highwater` command, the examples), so a figure reads the same wherever it is shown. Sizes
//! are always binary: powers of 1024, named as such.

/// Binary unit names, each 1024 times the one before.
const BYTE_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// Formats a byte count in binary units with one decimal: `512 B`, `1.5 KiB`, `12.0 MiB`,
/// `3.2 GiB`.
///
/// Units are powers of 1024 and named as such (`GiB`, never `GB`). A value that would round up
/// to 1024 of a unit is shown in the next unit instead (`1.0 MiB`, not `1024.0 KiB`).
///
/// # Examples
///
/// ```
/// use highwater_profile::units::format_bytes;
/// assert_eq!(format_bytes(512), "512 B");
/// assert_eq!(format_bytes(1536), "1.5 KiB");
/// assert_eq!(format_bytes(3 << 30), "3.0 GiB");
/// ```
pub fn format_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < BYTE_UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    // One decimal: 1023.96 KiB would print as "1024.0 KiB"; move it up a unit.
    if (value * 10.0).round() >= 10240.0 && unit + 1 < BYTE_UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", BYTE_UNITS[unit])
}

/// Formats a signed byte change with an explicit sign: `+1.5 MiB`, `-512 B`, `0 B`.
///
/// # Examples
///
/// ```
/// use highwater_profile::units::format_bytes_delta;
/// assert_eq!(format_bytes_delta(-2048), "-2.0 KiB");
/// assert_eq!(format_bytes_delta(0), "0 B");
/// ```
pub fn format_bytes_delta(delta: i64) -> String {
    match delta {
        0 => "0 B".to_string(),
        d if d > 0 => format!("+{}", format_bytes(d.unsigned_abs())),
        d => format!("-{}", format_bytes(d.unsigned_abs())),
    }
}

/// Formats a duration given in nanoseconds: `850 ns`, `12.5 µs`, `3.2 ms`, `1.25 s`.
///
/// # Examples
///
/// ```
/// use highwater_profile::units::format_duration_ns;
/// assert_eq!(format_duration_ns(1_500_000), "1.5 ms");
/// ```
pub fn format_duration_ns(ns: u64) -> String {
    let value = ns as f64;
    // Thresholds sit where one decimal would round up to 1000 of the smaller unit.
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 999_950 {
        format!("{:.1} µs", value / 1e3)
    } else if ns < 999_950_000 {
        format!("{:.1} ms", value / 1e6)
    } else {
        format!("{:.2} s", value / 1e9)
    }
}

/// Formats a count with thousands separators: `1,234,567`.
///
/// # Examples
///
/// ```
/// assert_eq!(highwater_profile::units::format_count(1234567), "1,234,567");
/// ```
pub fn format_count(count: u64) -> String {
    let digits = count.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A factor (how many times a size) as a person reads it: whole and with thousands separators
/// from 100 on, one decimal from 10, two below (`53,192`, `12.5`, `0.79`, `0`).
///
/// # Examples
///
/// ```
/// use highwater_profile::units::format_factor;
/// assert_eq!(format_factor(53192.01), "53,192");
/// assert_eq!(format_factor(12.46), "12.5");
/// assert_eq!(format_factor(0.787), "0.79");
/// assert_eq!(format_factor(0.0), "0");
/// assert_eq!(format_factor(2.0), "2");
/// ```
pub fn format_factor(factor: f64) -> String {
    if !factor.is_finite() || factor <= 0.0 {
        return "0".to_string();
    }
    let text = if factor >= 100.0 {
        return format_count(factor.floor() as u64);
    } else if factor >= 10.0 {
        format!("{factor:.1}")
    } else {
        format!("{factor:.2}")
    };
    // `2.00` reads as `2`, `2.50` as `2.5`.
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Bytes per iteration as a person reads them: `256.2 KiB per iteration`, `-4.0 MiB per
/// iteration`, `0 B per iteration`.
///
/// # Examples
///
/// ```
/// use highwater_profile::units::format_bytes_per_iteration;
/// assert_eq!(format_bytes_per_iteration(262394.2), "256.2 KiB per iteration");
/// assert_eq!(format_bytes_per_iteration(-4194304.0), "-4.0 MiB per iteration");
/// ```
pub fn format_bytes_per_iteration(bytes: f64) -> String {
    let rounded = bytes.round();
    let magnitude = format_bytes(rounded.abs().min(u64::MAX as f64) as u64);
    if rounded < 0.0 {
        format!("-{magnitude} per iteration")
    } else {
        format!("{magnitude} per iteration")
    }
}

/// A shape as `[2, 3, 4]`, or `-` when unknown.
///
/// # Examples
///
/// ```
/// use highwater_profile::units::format_shape;
/// assert_eq!(format_shape(Some(&[128, 512])), "[128, 512]");
/// assert_eq!(format_shape(None), "-");
/// ```
pub fn format_shape(shape: Option<&[u64]>) -> String {
    match shape {
        Some(dims) => {
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            format!("[{}]", dims.join(", "))
        }
        None => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_binary_units_with_one_decimal() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1024), "1.0 KiB");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(10 << 20), "10.0 MiB");
        assert_eq!(format_bytes((5 << 30) + (1 << 29)), "5.5 GiB");
        assert_eq!(format_bytes(1 << 40), "1.0 TiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn bytes_never_show_1024_of_a_unit() {
        assert_eq!(format_bytes(1024 * 1024 - 1), "1.0 MiB");
        assert_eq!(format_bytes((1 << 30) - 1), "1.0 GiB");
        assert_eq!(format_bytes(1024 * 1023), "1023.0 KiB");
    }

    #[test]
    fn bytes_never_use_decimal_unit_names() {
        for shift in [10, 20, 30, 40, 50, 60] {
            let text = format_bytes(3u64 << shift);
            assert!(text.ends_with("iB"), "{text}");
        }
    }

    #[test]
    fn deltas_carry_a_sign() {
        assert_eq!(format_bytes_delta(1536), "+1.5 KiB");
        assert_eq!(format_bytes_delta(-512), "-512 B");
        assert_eq!(format_bytes_delta(i64::MIN), "-8.0 EiB");
    }

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(1000), "1,000");
        assert_eq!(format_count(u64::MAX), "18,446,744,073,709,551,615");
    }

    #[test]
    fn durations_pick_a_readable_unit() {
        assert_eq!(format_duration_ns(999), "999 ns");
        assert_eq!(format_duration_ns(12_500), "12.5 µs");
        assert_eq!(format_duration_ns(3_200_000), "3.2 ms");
        assert_eq!(format_duration_ns(1_250_000_000), "1.25 s");
        assert_eq!(format_duration_ns(999_999_999), "1.00 s");
        assert_eq!(format_duration_ns(999_960), "1.0 ms");
    }
}

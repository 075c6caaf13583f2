//! Values typed on the command line: byte sizes, percentages and budgets.

use highwater_profile::model::Category;

/// A category by name, in any case.
pub(crate) fn parse_category(text: &str) -> Result<Category, String> {
    text.trim()
        .to_ascii_lowercase()
        .parse()
        .map_err(|error: highwater_profile::model::ParseLabelError| error.to_string())
}

/// Parses a byte count: a whole number with an optional binary unit (KiB, MiB, GiB, TiB;
/// K, M, G, T mean the same).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        other => return Err(format!("unknown unit {other:?} (use KiB, MiB, GiB or TiB)")),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count like 30GiB or 1073741824"))?;
    value
        .checked_mul(1u64 << shift)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("{text:?} is zero or does not fit in 64 bits"))
}

/// Parses a `--max-regression` value: a percentage, `5%` or `5` or `2.5%`.
pub(crate) fn parse_percent(text: &str) -> Result<f64, String> {
    let number = text.trim().trim_end_matches('%').trim();
    match number.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err(format!(
            "{text:?} is not a percentage like 5% (a number of at least 0)"
        )),
    }
}

/// Parses a budget in bytes, where 0 is a budget too: `0`, `512`, `30MiB`, `2 GiB`.
pub(crate) fn parse_budget_bytes(text: &str) -> Result<u64, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    parse_size(text)
}

/// Parses `CATEGORY=SIZE` for `--max-peak-category`.
pub(crate) fn parse_category_budget(text: &str) -> Result<(Category, u64), String> {
    let (name, size) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not CATEGORY=SIZE, e.g. optimizer=512MiB"))?;
    Ok((parse_category(name.trim())?, parse_budget_bytes(size)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn values_parse_with_units_and_percent_signs() {
        assert_eq!(parse_budget_bytes("0"), Ok(0));
        assert_eq!(parse_budget_bytes("2GiB"), Ok(2 << 30));
        assert!(parse_budget_bytes("lots").is_err());
        assert_eq!(parse_percent("5%"), Ok(5.0));
        assert_eq!(parse_percent("2.5"), Ok(2.5));
        assert!(parse_percent("-1%").is_err());
        assert!(parse_percent("NaN").is_err());
        assert_eq!(
            parse_category_budget("optimizer=512MiB"),
            Ok((Category::Optimizer, 512 * MIB))
        );
        assert!(parse_category_budget("optimiser=1")
            .unwrap_err()
            .contains("unknown category \"optimiser\": expected parameter, activation"));
        assert!(parse_category_budget("optimizer").is_err());
    }
}

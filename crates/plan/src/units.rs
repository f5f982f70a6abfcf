//! Number parsing for flags (`200e9`, `200B`, `4M`) and the formatting the report uses.

use anyhow::{bail, Result};

/// Parses a count such as `200e9`, `200B`, `6.7e9`, `4M`, `512K` or `1_000_000`.
/// Suffixes are decimal (K = 1e3, M = 1e6, B or G = 1e9, T = 1e12): token and parameter
/// counts are quoted in powers of ten.
pub fn parse_count(text: &str) -> Result<f64> {
    let cleaned: String = text
        .trim()
        .chars()
        .filter(|c| *c != '_' && *c != ',')
        .collect();
    let (number, scale) = match cleaned.chars().last() {
        Some('K' | 'k') => (&cleaned[..cleaned.len() - 1], 1e3),
        Some('M') => (&cleaned[..cleaned.len() - 1], 1e6),
        Some('B' | 'G') => (&cleaned[..cleaned.len() - 1], 1e9),
        Some('T') => (&cleaned[..cleaned.len() - 1], 1e12),
        _ => (cleaned.as_str(), 1.0),
    };
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v * scale),
        _ => bail!("{text:?} is not a positive number (examples: 200e9, 200B, 4M, 6.7e9)"),
    }
}

/// `6195253248` → `6,195,253,248`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Short decimal form: `6.20B`, `509.7K`, `40.2` (three significant digits).
pub fn si(x: f64) -> String {
    let a = x.abs();
    let (v, suffix) = if a >= 1e12 {
        (x / 1e12, "T")
    } else if a >= 1e9 {
        (x / 1e9, "B")
    } else if a >= 1e6 {
        (x / 1e6, "M")
    } else if a >= 1e3 {
        (x / 1e3, "K")
    } else {
        (x, "")
    };
    format!("{}{suffix}", sig3(v))
}

/// Three significant digits without exponent: 6.20, 40.2, 496.
fn sig3(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Scientific notation with three significant digits: `8.04e21`.
pub fn sci(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let exp = x.abs().log10().floor() as i32;
    let mut mant = x / 10f64.powi(exp);
    let mut exp = exp;
    // Rounding 9.995 to two decimals carries into the exponent.
    if (mant.abs() * 100.0).round() >= 1000.0 {
        mant /= 10.0;
        exp += 1;
    }
    format!("{mant:.2}e{exp}")
}

/// Dollars: cents below $100, whole dollars with separators above.
pub fn usd(x: f64) -> String {
    if x.abs() < 100.0 {
        format!("${x:.2}")
    } else {
        format!("${}", group(x.round() as u64))
    }
}

/// Bytes as GiB with one decimal (device memory tables mix GB and GiB; we print GiB).
pub fn gib(bytes: f64) -> String {
    format!("{:.1}", bytes / GIB)
}

/// Hours with one decimal, and days when it is more than two days.
pub fn hours(h: f64) -> String {
    if h >= 48.0 {
        format!("{h:.1} h ({:.1} d)", h / 24.0)
    } else {
        format!("{h:.1} h")
    }
}

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
pub const GB: f64 = 1e9;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_and_exponents() {
        assert_eq!(parse_count("200e9").unwrap(), 200e9);
        assert_eq!(parse_count("200B").unwrap(), 200e9);
        assert_eq!(parse_count("4M").unwrap(), 4e6);
        assert_eq!(parse_count("512K").unwrap(), 512e3);
        assert_eq!(parse_count("1_000").unwrap(), 1000.0);
        assert_eq!(parse_count("6.7e9").unwrap(), 6.7e9);
        for bad in ["", "abc", "-5", "0", "1e999", "4X"] {
            let e = parse_count(bad).unwrap_err().to_string();
            assert!(e.contains("positive number"), "{bad}: {e}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(group(6_195_253_248), "6,195,253,248");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(si(6_195_253_248.0), "6.20B");
        assert_eq!(si(509_700.0), "510K");
        assert_eq!(si(40.2e9), "40.2B");
        assert_eq!(sci(8.04e21), "8.04e21");
        assert_eq!(sci(9.999e21), "1.00e22");
        assert_eq!(usd(28.56), "$28.56");
        assert_eq!(usd(47_716.4), "$47,716");
        assert_eq!(hours(62.1), "62.1 h (2.6 d)");
        assert_eq!(hours(24.0), "24.0 h");
    }
}

//! Wall-clock time as Unix seconds (`f64`) and RFC 3339 text: the one timestamp format of a run
//! folder (events.jsonl, status.json, budget.json), which several processes write.

use anyhow::{anyhow, Result};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Seconds since the Unix epoch, now.
pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// `2026-11-21T20:05:03.123Z` (UTC, milliseconds).
pub fn format_utc(unix: f64) -> String {
    // Round to whole milliseconds first: f64 seconds carry ~0.2 µs of noise at today's epoch.
    let millis = (unix * 1e3).round() as i128;
    let t = OffsetDateTime::from_unix_timestamp_nanos(millis * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let ms = t.millisecond();
    let t = t.replace_nanosecond(0).unwrap_or(t);
    let base = t.format(&Rfc3339).unwrap_or_default(); // ends in "Z" for UTC
    format!("{}.{ms:03}Z", base.trim_end_matches('Z'))
}

/// Parses RFC 3339 (`Z` or an offset, optional fraction) into Unix seconds.
pub fn parse_utc(text: &str) -> Result<f64> {
    let t = OffsetDateTime::parse(text.trim(), &Rfc3339)
        .map_err(|e| anyhow!("{text:?} is not an RFC 3339 time ({e})"))?;
    Ok(t.unix_timestamp_nanos() as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_accepts_offsets() {
        let t = 1_795_000_000.25;
        let s = format_utc(t);
        assert!(s.ends_with(".250Z"), "{s}");
        assert!((parse_utc(&s).unwrap() - t).abs() < 1e-6);
        let a = parse_utc("2026-11-21T20:00:00Z").unwrap();
        let b = parse_utc("2026-11-21T21:00:00+01:00").unwrap();
        assert_eq!(a, b);
        assert!(parse_utc("yesterday").is_err());
    }
}

//! Parsing what users type: durations with units (`500us`, `500µs`, `2ms`, `1.5s`, `750ns`,
//! `5m`, `1h`), intervals, pids; and formatting durations and sizes the way people read them.

use std::time::Duration;

use crate::error::UserError;

/// Parses a duration that must carry one of the units ns, us, µs, ms, s, m, h.
pub fn parse_duration(text: &str) -> Result<Duration, UserError> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(|| {
        UserError::new(format!(
            "{text:?} has no unit: write it as e.g. 500us, 2ms, 1s or 5m (units: ns, us, µs, ms, s, m, h)"
        ))
    })?;
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| UserError::new(format!("{text:?} does not start with a number (e.g. 500us)")))?;
    let nanos_per_unit = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" | "μs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        other => {
            return Err(UserError::new(format!(
                "unknown unit {other:?} in {text:?}: use ns, us (or µs), ms, s, m or h"
            )));
        }
    };
    let nanos = value * nanos_per_unit;
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(UserError::new(format!("{text:?} is too large")));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// The shortest `--interval`: each interval prints a line and reads every map, so a shorter one
/// floods the terminal and costs more than it shows.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// Parses an `--interval`: a duration of at least [`MIN_INTERVAL`]; the error quotes what was
/// typed.
pub fn parse_interval(text: &str) -> Result<Duration, UserError> {
    let interval = parse_duration(text)?;
    if interval.is_zero() {
        return Err(UserError::new(format!(
            "an interval of {:?} never ends: give one of at least 100ms, or leave --interval out for no interval lines",
            text.trim()
        )));
    }
    if interval < MIN_INTERVAL {
        return Err(UserError::new(format!("an interval of {:?} is too short: the shortest is 100ms", text.trim())));
    }
    Ok(interval)
}

/// Parses a pid: a positive decimal number.
pub fn parse_pid(text: &str) -> Result<u32, UserError> {
    match text.trim().parse::<u32>() {
        Ok(0) => Err(UserError::new("pid 0 is the idle task, not a process: give the pid of a running process")),
        Ok(pid) => Ok(pid),
        Err(_) => Err(UserError::new(format!("{:?} is not a pid: give a process id such as 4242", text.trim()))),
    }
}

/// Formats nanoseconds the way latency people read them: `850ns`, `12.3µs`, `1.97ms`, `2.1s`.
pub fn format_nanos(nanos: u64) -> String {
    let n = nanos as f64;
    match nanos {
        0..1_000 => format!("{nanos}ns"),
        1_000..1_000_000 => trim(format!("{:.1}", n / 1e3)) + "µs",
        1_000_000..1_000_000_000 => trim(format!("{:.2}", n / 1e6)) + "ms",
        _ => trim(format!("{:.2}", n / 1e9)) + "s",
    }
}

fn trim(number: String) -> String {
    if number.contains('.') { number.trim_end_matches('0').trim_end_matches('.').to_string() } else { number }
}

/// Formats a byte count with binary units: `4 KiB`, `2 MiB`, `1.5 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", trim(format!("{value:.1}")), UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_unit() {
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("500µs").unwrap(), Duration::from_micros(500));
        assert_eq!(parse_duration("750ns").unwrap(), Duration::from_nanos(750));
        assert_eq!(parse_duration("2ms").unwrap(), Duration::from_millis(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration(" 3 ms ").unwrap(), Duration::from_millis(3));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
    }

    #[test]
    fn intervals_must_be_at_least_100ms_and_errors_quote_what_was_typed() {
        assert_eq!(parse_interval("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_interval("100ms").unwrap(), Duration::from_millis(100));
        let zero = parse_interval("0s").unwrap_err().to_string();
        assert!(zero.contains("\"0s\"") && zero.contains("never ends"), "{zero}");
        let tiny = parse_interval("1ns").unwrap_err().to_string();
        assert!(tiny.contains("\"1ns\"") && tiny.contains("too short"), "{tiny}");
    }

    #[test]
    fn pids_are_positive_numbers() {
        assert_eq!(parse_pid("4242").unwrap(), 4242);
        assert!(parse_pid("0").unwrap_err().to_string().contains("idle task"));
        assert!(parse_pid("abc").unwrap_err().to_string().contains("\"abc\" is not a pid"));
        assert!(parse_pid("-1").is_err());
    }

    #[test]
    fn rejects_missing_or_unknown_units_with_a_hint() {
        let err = parse_duration("500").unwrap_err().to_string();
        assert!(err.contains("no unit"), "{err}");
        let err = parse_duration("5min").unwrap_err().to_string();
        assert!(err.contains("unknown unit \"min\""), "{err}");
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("1e999s").is_err());
    }

    #[test]
    fn formats_nanos_and_bytes() {
        assert_eq!(format_nanos(850), "850ns");
        assert_eq!(format_nanos(1_969_000), "1.97ms");
        assert_eq!(format_nanos(87_000), "87µs");
        assert_eq!(format_bytes(2 * 1024 * 1024), "2 MiB");
        assert_eq!(format_bytes(4096), "4 KiB");
        assert_eq!(format_bytes(1536 * 1024 * 1024), "1.5 GiB");
    }
}

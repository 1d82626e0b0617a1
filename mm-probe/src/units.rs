//! Parsing what users type: durations with units (`500us`, `500µs`, `2ms`, `1.5s`, `750ns`,
//! `5m`, `1h`, `1m30s`), intervals, pids; and formatting durations and sizes the way people read them.

use std::time::Duration;

use crate::error::UserError;

/// The units a duration may carry, largest first, with their length in nanoseconds.
const DURATION_UNITS: [(&[&str], f64); 6] =
    [(&["h"], 3600e9), (&["m"], 60e9), (&["s"], 1e9), (&["ms"], 1e6), (&["us", "µs", "μs"], 1e3), (&["ns"], 1.0)];

const DURATION_HINT: &str = "write it as e.g. 500us, 2ms, 1.5s, 1m30s or 1h (units: ns, us, µs, ms, s, m, h)";

/// Parses a duration: one or more numbers, each with its unit, largest unit first (`500us`,
/// `1.5s`, `1m30s`, `1h 2m`), as `sleep`, systemd and Go's `time.ParseDuration` users type them.
pub fn parse_duration(text: &str) -> Result<Duration, UserError> {
    let text = text.trim();
    let bad = |why: String| UserError::new(format!("{text:?} {why}: {DURATION_HINT}"));
    if text.is_empty() {
        return Err(UserError::new(format!("an empty duration: {DURATION_HINT}")));
    }
    let mut rest = text;
    let mut nanos = 0.0;
    // Index into DURATION_UNITS of the last unit read: each part's unit must be smaller.
    let mut previous: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad(format!("has {:?} where a number should be", rest)));
        }
        let number: f64 = rest[..digits].parse().map_err(|_| bad(format!("has a bad number {:?}", &rest[..digits])))?;
        rest = rest[digits..].trim_start();
        let letters = rest.find(|c: char| !c.is_alphabetic()).unwrap_or(rest.len());
        let unit = &rest[..letters];
        if unit.is_empty() {
            return Err(if previous.is_none() {
                UserError::new(format!("{text:?} has no unit: {DURATION_HINT}"))
            } else {
                bad(format!("ends in {number} without a unit"))
            });
        }
        let index = DURATION_UNITS.iter().position(|(names, _)| names.contains(&unit)).ok_or_else(|| {
            UserError::new(format!("unknown unit {unit:?} in {text:?}: use ns, us (or µs), ms, s, m or h"))
        })?;
        if previous.is_some_and(|p| index <= p) {
            return Err(bad(format!("repeats a unit or puts {unit:?} after a smaller one")));
        }
        previous = Some(index);
        nanos += number * DURATION_UNITS[index].1;
        rest = rest[letters..].trim_start();
    }
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

/// Parses a WARN or CRIT limit given as a duration: zero would flag every event, so it is
/// refused (the error is shown after the option's name).
pub fn parse_limit_duration(text: &str) -> Result<Duration, UserError> {
    let limit = parse_duration(text)?;
    if limit.is_zero() {
        return Err(UserError::new("a limit of zero would flag everything: give one above zero"));
    }
    Ok(limit)
}

/// Parses the `--duration` of a run that has nothing to show without live tracing: zero would
/// end it before it began.
pub fn parse_run_duration(text: &str) -> Result<Duration, UserError> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(UserError::new("a run of zero ends before it starts: leave --duration out to run until Ctrl-C"));
    }
    Ok(duration)
}

/// Parses `triage --duration`: a bounded watch, so zero (a watch of nothing) is refused.
pub fn parse_watch_duration(text: &str) -> Result<Duration, UserError> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        return Err(UserError::new("a watch of zero sees nothing: give a duration above zero (default 30s)"));
    }
    Ok(duration)
}

/// Parses a WARN or CRIT limit given as a plain number (percent, per second, ratio): finite and
/// above zero, for the same reason as [`parse_limit_duration`].
pub fn parse_limit_number(text: &str) -> Result<f64, UserError> {
    let value: f64 = text.trim().parse().map_err(|_| UserError::new("not a number: write e.g. 5, 0.5 or 1000"))?;
    if !value.is_finite() {
        return Err(UserError::new("not a finite number: write e.g. 5, 0.5 or 1000"));
    }
    if value <= 0.0 {
        return Err(UserError::new("a limit of zero or below would flag everything: give one above zero"));
    }
    Ok(value)
}

/// Parses the port of an `ADDRESS:PORT` option: decimal, 1-65535, or 0 for any free port (as
/// bind(2) takes it). The error completes a sentence that names the option and its value.
pub fn parse_port(text: &str) -> Result<u16, String> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("has no port number after the last ':'".into());
    }
    text.parse().map_err(|_| format!("has port {text}, which is out of range (1-65535)"))
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
    fn accepts_compound_durations_largest_unit_first() {
        let seconds = Duration::from_secs;
        for (text, expected) in [
            ("1m30s", seconds(90)),
            ("1h2m", seconds(3720)),
            ("1h 2m 3s", seconds(3723)),
            ("2s500ms", Duration::from_millis(2500)),
            ("1m0.5s", Duration::from_millis(60_500)),
            ("1ms500µs", Duration::from_micros(1500)),
        ] {
            assert_eq!(parse_duration(text).unwrap(), expected, "{text}");
        }
    }

    #[test]
    fn refuses_garbage_in_compound_durations_with_a_hint() {
        for (text, why) in [
            ("30s1m", "after a smaller one"),
            ("1s1s", "repeats a unit"),
            ("1m30", "ends in 30 without a unit"),
            ("1m-5s", "\"-5s\" where a number should be"),
            ("1.2.3s", "bad number \"1.2.3\""),
            ("", "an empty duration"),
        ] {
            let err = parse_duration(text).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("1m30s"), "{text:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn zero_limits_and_zero_runs_are_refused_but_zero_stays_a_duration() {
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert!(parse_limit_duration("0us").unwrap_err().to_string().contains("above zero"));
        assert_eq!(parse_limit_duration("1ns").unwrap(), Duration::from_nanos(1));
        assert!(parse_run_duration("0s").unwrap_err().to_string().contains("leave --duration out"));
        assert_eq!(parse_run_duration("1m30s").unwrap(), Duration::from_secs(90));
    }

    #[test]
    fn number_limits_are_finite_and_above_zero() {
        assert_eq!(parse_limit_number("20").unwrap(), 20.0);
        assert_eq!(parse_limit_number(" 0.1 ").unwrap(), 0.1);
        for text in ["0", "-5", "0.0"] {
            assert!(parse_limit_number(text).unwrap_err().to_string().contains("above zero"), "{text}");
        }
        for text in ["nan", "inf", "5%", "x"] {
            assert!(parse_limit_number(text).unwrap_err().to_string().contains("number"), "{text}");
        }
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
    fn ports_out_of_range_are_told_apart_from_missing_ones() {
        assert_eq!(parse_port("9479"), Ok(9479));
        assert_eq!(parse_port("0"), Ok(0));
        assert_eq!(parse_port("99999").unwrap_err(), "has port 99999, which is out of range (1-65535)");
        assert!(parse_port("65536").unwrap_err().contains("out of range"));
        for text in ["", "http", "-1", "+80"] {
            assert!(parse_port(text).unwrap_err().contains("no port number"), "{text:?}");
        }
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

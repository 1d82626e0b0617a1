//! The comparison as text: both runs in two columns, one row per metric with its move, then the
//! conclusion and the notes, fitted to the terminal.

use super::report::{Comparison, Side};
use crate::{
    report::text::{table, wrap},
    units::format_nanos,
};

pub fn render(c: &Comparison, width: usize) -> String {
    let mut out = wrap(&format!("{}: {} → {}", c.compared_command, c.before.file, c.after.file), width, 2);
    out += &table(&["", "before", "after"], &runs(c), width, 2);
    out.push('\n');
    out += &table(&["metric", "before", "after", "change", "level", "move"], &metrics(c), width, 2);
    out.push('\n');
    out += &wrap(&c.conclusion, width, 2);
    for note in &c.notes {
        out += &wrap(&format!("  note: {note}"), width, 8);
    }
    out
}

fn runs(c: &Comparison) -> Vec<Vec<String>> {
    let row = |label: &str, f: &dyn Fn(&Side) -> String| vec![label.to_string(), f(&c.before), f(&c.after)];
    let mut rows = vec![row("verdict", &|s| s.level.name().to_string())];
    // thp-why examines a process rather than watching a stream: nothing to say here.
    if [&c.before, &c.after].iter().any(|s| s.duration_ns.is_some() || s.work.is_some()) {
        rows.push(row("watched", &watched));
    }
    // triage's losses are its watches' own (see the note): no row rather than a false one.
    if c.compared_command != super::findings::TRIAGE {
        rows.push(row("events lost", &|s| s.lost_events.map_or_else(|| "not all counted".into(), |n| n.to_string())));
    }
    rows
}

/// "2.00 s, 1546 walks (773/s)".
fn watched(side: &Side) -> String {
    let length = side.duration_ns.map(format_nanos);
    let work = side.work.map(|w| match w.per_second {
        Some(rate) => format!("{} {} ({rate:.0}/s)", w.count, w.what),
        None => format!("{} {}", w.count, w.what),
    });
    match (length, work) {
        (Some(l), Some(w)) => format!("{l}, {w}"),
        (l, w) => l.or(w).unwrap_or_else(|| "-".into()),
    }
}

fn metrics(c: &Comparison) -> Vec<Vec<String>> {
    c.metrics
        .iter()
        .map(|m| {
            let value = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| m.unit.format(v));
            let change = match (m.ratio, m.before, m.after) {
                (Some(r), _, _) if (r - 1.0).abs() < 0.005 => "=".to_string(),
                (Some(r), _, _) => format!("{:+.0} %", (r - 1.0) * 100.0),
                (None, Some(b), Some(a)) if a == b => "=".to_string(),
                (None, Some(_), Some(_)) => "from 0".to_string(),
                _ => "-".to_string(),
            };
            let level = if m.before_level == m.after_level {
                m.after_level.name().to_string()
            } else {
                format!("{} → {}", m.before_level.name(), m.after_level.name())
            };
            vec![m.metric.clone(), value(m.before), value(m.after), change, level, m.movement.name().to_string()]
        })
        .collect()
}

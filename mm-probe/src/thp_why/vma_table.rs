//! The VMA table of the text, fitted to the terminal: no row wraps. Columns are as wide as their
//! content; where the row does not fit, the least needed columns go first (END, KIND, FLAGS,
//! LIVE, START, ELIG) and a long NAME keeps its end (a library's file name, not its directory).
//! SIZE, ANON, HUGE, REASON and NAME always stay; the JSON has every field.

use std::fmt::Write as _;

use super::{
    reasons::ReasonCode,
    report::{Report, VmaEntry},
    words::count_of,
};
use crate::units::format_bytes;

/// VMAs listed without `--all-vmas`.
pub const DEFAULT_VMA_ROWS: usize = 12;

/// Room NAME keeps before another column is dropped for it.
const NAME_MIN: usize = 16;

const INDENT: usize = 2;
const GAP: usize = 2;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Col {
    Start,
    End,
    Size,
    Anon,
    Huge,
    Flags,
    Kind,
    Elig,
    Live,
    Reason,
}

/// Left to right.
const ORDER: [Col; 10] =
    [Col::Start, Col::End, Col::Size, Col::Anon, Col::Huge, Col::Flags, Col::Kind, Col::Elig, Col::Live, Col::Reason];

/// Dropped in this order while the row does not fit.
const DROP: [Col; 6] = [Col::End, Col::Kind, Col::Flags, Col::Live, Col::Start, Col::Elig];

impl Col {
    fn header(self) -> &'static str {
        match self {
            Col::Start => "START",
            Col::End => "END",
            Col::Size => "SIZE",
            Col::Anon => "ANON",
            Col::Huge => "HUGE",
            Col::Flags => "FLAGS",
            Col::Kind => "KIND",
            Col::Elig => "ELIG",
            Col::Live => "LIVE",
            Col::Reason => "REASON",
        }
    }

    /// What the column means, for the legend.
    fn legend(self) -> Option<&'static str> {
        match self {
            Col::Size => Some("SIZE virtual size"),
            Col::Anon => Some("ANON resident anonymous memory"),
            Col::Huge => Some("HUGE the part of it in 2 MiB pages (AnonHugePages)"),
            Col::Flags => Some("FLAGS 2M: a 2 MiB-aligned window fits, hg/nh: MADV_HUGEPAGE/MADV_NOHUGEPAGE"),
            Col::Elig => Some("ELIG the kernel's own THPeligible from smaps (1: may get huge pages, 0: may not)"),
            Col::Live => Some("LIVE allow-check denials/checks during the run (–: not traced)"),
            _ => None,
        }
    }

    fn right_aligned(self) -> bool {
        matches!(self, Col::Size | Col::Anon | Col::Huge | Col::Live)
    }

    fn cell(self, v: &VmaEntry) -> String {
        match self {
            Col::Start => v.start.trim_start_matches("0x").to_string(),
            Col::End => v.end.trim_start_matches("0x").to_string(),
            Col::Size => format_bytes(v.size_bytes),
            Col::Anon => format_bytes(v.anonymous_bytes),
            Col::Huge => format_bytes(v.anon_huge_bytes),
            Col::Flags => {
                let flags: Vec<&str> = [(v.aligned_2m_window, "2M"), (v.hg, "hg"), (v.nh, "nh")]
                    .iter()
                    .filter(|(set, _)| *set)
                    .map(|(_, name)| *name)
                    .collect();
                if flags.is_empty() { "-".into() } else { flags.join(",") }
            }
            Col::Kind => if v.stack { "stack" } else { v.kind.as_str() }.to_string(),
            Col::Elig => v.thp_eligible.map_or("?", |e| if e { "1" } else { "0" }).to_string(),
            Col::Live => match (v.live.denied, v.live.checks) {
                (Some(denied), Some(checks)) => format!("{denied}/{checks}"),
                _ => "–".into(),
            },
            Col::Reason => reason_cell(v).to_string(),
        }
    }
}

/// The table's reason: what blocks the region, the application's own opt-out named as such.
fn reason_cell(v: &VmaEntry) -> &'static str {
    match v.blocking_reason() {
        ReasonCode::VmaNohugepage => "opt-out (MADV_NOHUGEPAGE)",
        code => code.as_str(),
    }
}

fn columns(text: &str) -> usize {
    text.chars().count()
}

/// `name` in at most `room` columns, its end kept.
fn fit_name(name: &str, room: usize) -> String {
    let n = columns(name);
    if n <= room || room < 2 {
        return name.to_string();
    }
    let tail: String = name.chars().skip(n - (room - 1)).collect();
    format!("…{tail}")
}

/// The columns kept for `width` and their widths, NAME aside.
fn layout(cells: &[Vec<String>], names: &[&str], width: usize) -> Vec<(Col, usize)> {
    let mut kept: Vec<(Col, usize)> = ORDER
        .iter()
        .enumerate()
        .map(|(i, &col)| (col, cells.iter().map(|row| columns(&row[i])).fold(columns(col.header()), usize::max)))
        .collect();
    let name_want = names.iter().map(|n| columns(n)).fold(columns("NAME"), usize::max).min(NAME_MIN);
    let used = |kept: &[(Col, usize)]| INDENT + kept.iter().map(|(_, w)| w + GAP).sum::<usize>();
    let all = kept.clone();
    for drop in DROP {
        if used(&kept) + name_want <= width {
            break;
        }
        kept.retain(|(col, _)| *col != drop);
    }
    // A narrow column dropped for a wide one's sake comes back where it fits, most needed first.
    let dropped: Vec<Col> = DROP.iter().rev().filter(|c| !kept.iter().any(|(k, _)| k == *c)).copied().collect();
    for back in &dropped {
        let Some(&(col, w)) = all.iter().find(|(c, _)| c == back) else { continue };
        if used(&kept) + w + GAP + name_want <= width {
            kept.push((col, w));
            kept.sort_by_key(|(c, _)| ORDER.iter().position(|o| o == c));
        }
    }
    kept
}

fn line(kept: &[(Col, usize)], cells: &[String], name: &str) -> String {
    let mut text = " ".repeat(INDENT);
    for ((col, w), cell) in kept.iter().zip(cells) {
        if col.right_aligned() {
            let _ = write!(text, "{cell:>w$}{:GAP$}", "");
        } else {
            let _ = write!(text, "{cell:<w$}{:GAP$}", "");
        }
    }
    text + name
}

pub fn table(out: &mut String, r: &Report, all: bool, width: usize) {
    let shown = if all { r.vmas.len() } else { r.vmas.len().min(DEFAULT_VMA_ROWS) };
    let vmas = &r.vmas[..shown];
    let more =
        if shown < r.vmas.len() { format!("; {shown} of {}, --all-vmas for all", r.vmas.len()) } else { String::new() };
    let _ = writeln!(out, "VMAs (largest first{more})");
    let cells: Vec<Vec<String>> = vmas.iter().map(|v| ORDER.iter().map(|c| c.cell(v)).collect()).collect();
    let names: Vec<&str> = vmas.iter().map(|v| v.name.as_str()).collect();
    let kept = layout(&cells, &names, width);
    let legend: Vec<&str> = kept.iter().filter_map(|(col, _)| col.legend()).collect();
    let dropped: Vec<&str> = ORDER.iter().filter(|c| !kept.iter().any(|(k, _)| k == *c)).map(|c| c.header()).collect();
    let left_out = if dropped.is_empty() {
        String::new()
    } else {
        format!("; left out at this width: {} (see --json)", dropped.join(", "))
    };
    let _ = writeln!(out, "  {}{left_out}", legend.join("; "));
    let name_room = width.saturating_sub(INDENT + kept.iter().map(|(_, w)| w + GAP).sum::<usize>());
    let header: Vec<String> = kept.iter().map(|(c, _)| c.header().to_string()).collect();
    let _ = writeln!(out, "{}", line(&kept, &header, "NAME"));
    for (row, v) in cells.iter().zip(vmas) {
        let picked: Vec<String> =
            kept.iter().map(|(col, _)| row[ORDER.iter().position(|c| c == col).unwrap_or(0)].clone()).collect();
        let _ = writeln!(out, "{}", line(&kept, &picked, &fit_name(&v.name, name_room)).trim_end());
    }
    let hidden_denials: u64 = r.vmas.iter().skip(shown).filter_map(|v| v.live.denied).sum();
    if hidden_denials > 0 {
        let _ = writeln!(out, "  ({} on VMAs not shown)", count_of(hidden_denials, "live denial"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_name_keeps_its_end() {
        assert_eq!(fit_name("/usr/lib/x86_64-linux-gnu/libc.so.6", 12), "…u/libc.so.6");
        assert_eq!(fit_name("[heap]", 12), "[heap]");
        assert_eq!(columns(&fit_name("/usr/lib/x86_64-linux-gnu/libc.so.6", 12)), 12);
    }
}

//! The report as text (verdict, evidence, fix, VMA table) or as one JSON object.

use std::fmt::Write as _;

use super::{
    reasons::DisableMode,
    report::{LiveFacts, ReasonEntry, Report, StoppedBy, lost_events},
    sysfs::SizeMode,
    vma_table,
    words::{count_of, counted},
};
use crate::{report::json, units::format_bytes};

/// Two JSON lines, as every command of the family ends: the report (`type` summary), then its
/// lost events. The JSON always carries every VMA; `--all-vmas` only widens the text table.
pub fn json(report: &Report) -> String {
    let summary = json::line(json::Line::ThpWhySummary, report);
    format!("{summary}\n{}", json::line(json::Line::ThpWhyLostEvents, &lost_events(&report.live)))
}

/// The text for a terminal `width` columns wide: prose wraps (`report::text::fit`), table rows
/// are made to fit.
pub fn text(report: &Report, all_vmas: bool, width: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}: {}\n", report.verdict.level.name(), report.verdict.headline);
    evidence(&mut out, report);
    reasons(&mut out, report);
    fix(&mut out, report);
    collapse(&mut out, report);
    per_size(&mut out, report);
    vma_table::table(&mut out, report, all_vmas, width);
    if !report.notes.is_empty() {
        let _ = writeln!(out, "\nNotes");
        for note in &report.notes {
            let _ = writeln!(out, "  - {note}");
        }
    }
    out
}

fn mode_word(mode: Option<DisableMode>) -> &'static str {
    match mode {
        Some(DisableMode::None) => "enabled",
        Some(DisableMode::Completely) => "DISABLED",
        Some(DisableMode::ExceptAdvised) => "disabled except advised",
        None => "unknown",
    }
}

/// How long the live window lasted and what ended it.
fn window(live: &LiveFacts) -> String {
    let secs = live.duration_ns as f64 / 1e9;
    match live.stopped_by {
        StoppedBy::Duration => format!("watched {secs:.1}s"),
        StoppedBy::Interrupted => format!("interrupted after {secs:.1}s"),
        StoppedBy::TargetExited => format!("watched {secs:.1}s, until the process exited"),
        StoppedBy::RingBufferError => format!("stopped after {secs:.1}s: reading the prctl ring buffer failed"),
        StoppedBy::NotRun => format!("not watched live ({})", live.why_not.as_deref().unwrap_or("no live window")),
    }
}

/// A count that may not have been measured: `–` then, never 0.
fn measured(count: Option<u64>) -> String {
    count.map_or_else(|| "–".into(), |n| n.to_string())
}

fn evidence(out: &mut String, r: &Report) {
    let _ = writeln!(out, "Evidence");
    let _ = writeln!(out, "  window    {}", window(&r.live));
    let p = &r.process;
    let flags = p.mm_flags.as_deref().map(|f| format!(", mm->flags {f}")).unwrap_or_default();
    let status = p
        .status_thp_enabled
        .map(|e| format!("THP_enabled {}", u8::from(e)))
        .unwrap_or_else(|| "no THP_enabled line".into());
    let _ = writeln!(
        out,
        "  process   THP {} (from {}{flags}; /proc/{}/status {status})",
        mode_word(p.thp_disable),
        p.source.as_str(),
        r.pid
    );
    if p.ancestors.len() > 1 {
        let chain: Vec<String> =
            p.ancestors.iter().map(|a| format!("{} {} [{}]", a.pid, a.comm, mode_word(a.disable))).collect();
        let _ = writeln!(out, "  ancestry  {}", chain.join(" <- "));
    }
    for call in &p.prctl_calls {
        let _ = writeln!(
            out,
            "  prctl     caught live: pid {} ({}, {}) PR_SET_THP_DISABLE arg2={} arg3={} -> {}",
            call.tgid,
            call.comm,
            call.relation.as_str(),
            call.arg2,
            call.arg3,
            call.effect.as_str()
        );
    }
    let s = &r.system.policy;
    let word = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    let enabled = s.enabled.map(|e| format!("{e:?}").to_lowercase()).unwrap_or_else(|| "-".into());
    let _ = writeln!(
        out,
        "  system    enabled={enabled} defrag={} shmem_enabled={}",
        word(&s.defrag),
        word(&s.shmem_enabled)
    );
    let sizes: Vec<String> = s
        .sizes
        .iter()
        .filter_map(|c| c.enabled.map(|m| (c.size_bytes / 1024, m)))
        .filter(|(_, m)| *m != SizeMode::Never)
        .map(|(kb, m)| format!("{kb}kB {}", format!("{m:?}").to_lowercase()))
        .collect();
    if !s.sizes.is_empty() {
        let _ = writeln!(
            out,
            "            per-size: {}",
            if sizes.is_empty() { "all never".into() } else { sizes.join(", ") + ", others never" }
        );
    }
    if !s.khugepaged.is_empty() {
        let k = |name: &str| s.khugepaged.get(name).map(u64::to_string).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "            khugepaged: pages_to_scan={} scan_sleep={}ms max_ptes_none={}",
            k("pages_to_scan"),
            k("scan_sleep_millisecs"),
            k("max_ptes_none")
        );
    }
    let l = &r.live;
    if l.allow_check_observed {
        let by_call: Vec<String> =
            l.by_call.iter().map(|(c, n)| format!("{} {}/{}", c.label(), n.denied, n.checks)).collect();
        let _ = writeln!(
            out,
            "  live      {} over {:.1}s: {} checks, {} denied (denied/checks by caller: {})",
            l.allow_check,
            l.duration_ns as f64 / 1e9,
            measured(l.checks),
            measured(l.denied),
            if by_call.is_empty() { "none".into() } else { by_call.join(", ") }
        );
        if l.unexplained > Some(0) || l.disagreements > Some(0) {
            let _ = writeln!(
                out,
                "            {} denials unexplained, {} allowed against the model",
                measured(l.unexplained),
                measured(l.disagreements)
            );
        }
        if let Some(note) = &l.wrapper_note {
            let _ = writeln!(out, "            {note}");
        }
    } else {
        let _ = writeln!(
            out,
            "  live      THP allow-check not observed, its counts are – (not measured): {} {}",
            l.why_not.as_deref().unwrap_or("unknown"),
            crate::probes::DOCTOR_POINTER
        );
    }
    let f = &r.faults;
    if f.observed {
        let _ = writeln!(
            out,
            "  faults    {} page faults in {} of 2 MiB, ~{} got a huge page; system-wide (every process): \
             thp_fault_alloc {:+}, thp_fault_fallback {:+}",
            f.total,
            count_of(f.ranges as u64, "range"),
            f.in_huge_pages,
            f.thp_fault_alloc,
            f.thp_fault_fallback
        );
    } else {
        let _ = writeln!(
            out,
            "  faults    not traced ({}); system-wide (every process): thp_fault_alloc {:+}, thp_fault_fallback {:+}",
            f.why_not.as_deref().unwrap_or("unknown"),
            f.thp_fault_alloc,
            f.thp_fault_fallback
        );
    }
    let lost = lost_events(l).total();
    if lost > 0 {
        let _ = writeln!(out, "  lost      {lost} events (maps or ring buffer full)");
    }
    out.push('\n');
}

/// Rows of the reasons table: a reason that decides an anonymous VMA, a process-wide one, or one
/// the kernel was seen refusing live.
fn shown(reason: &ReasonEntry) -> bool {
    reason.deciding_vmas > 0 || reason.code.is_process_wide() || reason.count > Some(0)
}

/// Each anonymous VMA once, under the reason that decides it, in the verdict's measure; the detail
/// of each reason on the line below its row.
fn reasons(out: &mut String, r: &Report) {
    let rows: Vec<&ReasonEntry> = r.reasons.iter().filter(|reason| shown(reason)).collect();
    let _ = writeln!(out, "Reasons");
    let _ = writeln!(
        out,
        "  each anonymous VMA under the reason that decides it; RESIDENT: its resident anonymous memory, SMALL: \
         the part in small pages; LIVE: refusals counted during the run (–: not traced)"
    );
    let code_width = rows.iter().map(|reason| reason.code.as_str().len()).fold("REASON".len(), usize::max);
    let _ =
        writeln!(out, "  {:<code_width$}  {:>4}  {:>9}  {:>9}  {:>6}", "REASON", "VMAS", "RESIDENT", "SMALL", "LIVE");
    for reason in rows {
        let _ = writeln!(
            out,
            "  {:<code_width$}  {:>4}  {:>9}  {:>9}  {:>6}",
            reason.code.as_str(),
            reason.deciding_vmas,
            format_bytes(reason.resident_bytes),
            format_bytes(reason.small_bytes),
            measured(reason.count),
        );
        let set_by = reason.set_by.as_ref().map(|s| format!(" [set by {} {}]", s.pid, s.comm)).unwrap_or_default();
        let _ = writeln!(out, "      {}{set_by}", reason.detail);
    }
    let other = &r.non_anonymous;
    if other.vmas > 0 {
        let _ = writeln!(
            out,
            "  not counted above: {} ({} resident) that are not anonymous memory (file-backed, shmem, special); \
             their reasons are in the VMA list",
            count_of(other.vmas as u64, "VMA"),
            format_bytes(other.rss_bytes)
        );
    }
    out.push('\n');
}

/// The fixes of the causes present, or why nothing needs fixing.
fn fix(out: &mut String, r: &Report) {
    let _ = writeln!(out, "Fix");
    if r.verdict.advice.is_empty() {
        let resident: u64 = r.reasons.iter().map(|reason| reason.resident_bytes).sum();
        let small: u64 = r.reasons.iter().map(|reason| reason.small_bytes).sum();
        let why = if resident == 0 {
            "there is no resident anonymous memory yet".to_string()
        } else if small == 0 {
            format!("all {} of resident anonymous memory is in huge pages", format_bytes(resident))
        } else {
            format!(
                "no cause keeps 2 MiB or more of resident anonymous memory in small pages ({} of {} is small in all)",
                format_bytes(small),
                format_bytes(resident)
            )
        };
        let _ = writeln!(out, "  nothing to fix: {why}");
    }
    for advice in &r.verdict.advice {
        let _ = writeln!(out, "  - {}", advice.action);
    }
    out.push('\n');
}

/// khugepaged's side: its scans of the process, why ranges stayed small, what would help.
fn collapse(out: &mut String, r: &Report) {
    let c = &r.collapse;
    let _ = writeln!(out, "Collapse (khugepaged)");
    if let Some(why) = &c.kept_away {
        let _ = writeln!(out, "  kept away: {why}");
    }
    if !c.observed {
        let _ =
            writeln!(out, "  not observed, counts are – (not measured): {}", c.why_not.as_deref().unwrap_or("unknown"));
        out.push('\n');
        return;
    }
    let madvise = match c.by_madvise_collapse {
        Some(n) if n > 0 => format!(", {n} by the process's MADV_COLLAPSE"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "  scans     {} of this process's ranges ({} by khugepaged{madvise}): {} collapsed, {} stayed small; \
         AnonHugePages {}{}",
        measured(c.scans),
        measured(c.by_khugepaged),
        measured(c.collapsed),
        measured(c.failed),
        if c.anon_huge_bytes_delta < 0 { "-" } else { "+" },
        format_bytes(c.anon_huge_bytes_delta.unsigned_abs())
    );
    let result_width = c.results.iter().map(|r| r.result.len()).fold("RESULT".len(), usize::max);
    if !c.results.is_empty() {
        let _ = writeln!(out, "  {:<result_width$}  {:>6}  LIMIT", "RESULT", "SCANS");
    }
    for result in &c.results {
        let knob = match (result.knob, result.knob_value) {
            (Some(knob), Some(value)) => format!("{knob} {value}"),
            _ => "-".into(),
        };
        let _ = writeln!(out, "  {:<result_width$}  {:>6}  {knob}", result.result, result.count);
        let _ = writeln!(out, "      {}", result.why);
    }
    if let Some(why) = c.not_reached.as_ref().filter(|why| Some(*why) != c.kept_away.as_ref()) {
        let _ = writeln!(out, "  not reached: {why}");
    }
    for advice in &c.advice {
        let _ = writeln!(out, "  - {advice}");
    }
    out.push('\n');
}

/// Per-size THP (6.8+): each size the policy leaves on, the regions it may serve, its counters.
fn per_size(out: &mut String, r: &Report) {
    let on: Vec<_> = r.sizes.iter().filter(|s| s.effective != "never").collect();
    if r.sizes.is_empty() {
        return;
    }
    let _ = writeln!(out, "Per-size THP");
    if on.is_empty() {
        let _ = writeln!(out, "  every size is never\n");
        return;
    }
    for size in on {
        let stat = |name: &str| size.stats_delta.as_ref().and_then(|d| d.get(name)).map(|n| format!("{n:+}"));
        let counters = match (stat("anon_fault_alloc"), stat("anon_fault_fallback")) {
            (Some(alloc), Some(fallback)) => {
                format!("; system-wide: anon_fault_alloc {alloc}, anon_fault_fallback {fallback}")
            }
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {:>8}  {:<7}  {}, {}",
            format_bytes(size.size_bytes),
            size.effective,
            counted(size.regions as u64, "region", "regions"),
            format_bytes(size.bytes)
        );
        if !counters.is_empty() {
            let _ = writeln!(out, "            {}", counters.trim_start_matches("; "));
        }
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thp_why::{
        judge::{
            build,
            tests::{inputs, inputs_with, live, smaps_entry},
        },
        reasons::DisableMode,
    };

    #[test]
    fn json_has_the_stable_keys() {
        let report = build(inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never"));
        let text = json(&report);
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        let v = &lines[0];
        assert_eq!((v["type"].as_str(), v["command"].as_str()), (Some("summary"), Some("thp-why")));
        assert_eq!((lines[1]["type"].as_str(), lines[1]["prctl_events"].as_u64()), (Some("lost_events"), Some(0)));
        for key in ["pid", "verdict", "reasons", "vmas", "faults", "system"] {
            assert!(!v[key].is_null(), "missing {key}: {v}");
        }
        let first = &v["reasons"][0];
        assert_eq!(first["code"], "prctl_thp_disable");
        // No live window: the count was not measured, so it is null, not 0.
        assert!(first["count"].is_null() && first["detail"].is_string(), "{first}");
        assert_eq!((first["set_by"]["pid"].as_u64(), first["set_by"]["comm"].as_str()), (Some(4321), Some("lkp")));
        assert_eq!(v["vmas"].as_array().unwrap().len(), 3, "JSON carries every VMA");
    }

    #[test]
    fn text_starts_with_the_verdict_and_marks_the_table() {
        let report = build(inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never"));
        let text = text(&report, false, 100);
        let first = format!("{}: {}", report.verdict.level.name(), report.verdict.headline);
        assert_eq!(text.lines().next(), Some(first.as_str()));
        let order: Vec<usize> =
            ["Evidence", "Reasons", "Fix", "VMAs (largest first)"].iter().map(|h| text.find(h).unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(
            text.contains("live      THP allow-check not observed, its counts are – (not measured): --duration 0s"),
            "{text}"
        );
        assert!(text.contains("window    not watched live (--duration 0s)"), "{text}");
        assert!(text.contains("[set by 4321 lkp]"), "{text}");
    }

    #[test]
    fn the_text_says_how_long_it_watched_and_what_is_system_wide() {
        let mut input = inputs(DisableMode::None, "6.1.0-57-amd64", "always [madvise] never");
        input.live_skipped = None;
        input.live = Some(live(Vec::new()));
        let mut report = build(input);
        let text = text(&report, false, 100);
        assert!(text.contains("window    watched 5.0s\n"), "{text}");
        assert!(text.contains("system-wide (every process): thp_fault_alloc +0"), "{text}");
        report.live.stopped_by = StoppedBy::Interrupted;
        report.live.duration_ns = 1_200_000_000;
        assert!(super::text(&report, false, 100).contains("window    interrupted after 1.2s\n"));
    }

    /// Unmeasured counts are `–` in the text; an opted-out region's row says so.
    #[test]
    fn unmeasured_counts_are_dashes_and_an_opt_out_is_named_in_its_row() {
        let smaps =
            smaps_entry(0x7f00_0000_0000, 8192, 8192, 8192, "hg") + &smaps_entry(0x7f10_0000_0000, 4096, 4096, 0, "nh");
        let report = build(inputs_with(&smaps, DisableMode::None, "6.18.44", "always [madvise] never"));
        let text = text(&report, false, 100);
        let row = text.lines().find(|l| l.trim_start().starts_with("7f1000000000")).unwrap();
        assert!(row.contains("opt-out (MADV_NOHUGEPAGE)"), "{row}");
        assert!(row.split_whitespace().any(|cell| cell == "–"), "LIVE is not measured: {row}");
        let reason = text.lines().find(|l| l.trim_start().starts_with("vma_nohugepage")).unwrap();
        assert!(reason.contains("–"), "{reason}");
        assert!(!reason.contains(" 0 live"), "{reason}");
    }
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod user_facing_tests;

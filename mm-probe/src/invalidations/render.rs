//! invalidations' text: the plan on stderr, a line per interval, the summary.

use std::fmt::Write as _;

use super::{
    judge::Fit,
    locks::LockRow,
    probes::Observability,
    report::{Interval, InvalidatorRow, SubscriberRow, Summary},
};
use crate::{
    collect::Stop,
    probes::Plan,
    report::{Log2Histogram, statement, text},
    units::{format_bytes, format_nanos},
};

pub fn plan_text(kernel: &str, plan: &Plan, callbacks_timed: &[&str], seen: &Observability) -> String {
    let mut out = statement::plan_text("invalidations", kernel, plan, &seen.statements);
    if !callbacks_timed.is_empty() {
        let _ = writeln!(out, "  timing callbacks: {}", callbacks_timed.join(", "));
    }
    out
}

pub fn interval_text(i: &Interval) -> String {
    let lost = if i.lost > 0 { format!("  LOST {}", i.lost) } else { String::new() };
    format!(
        "[{:>7.1}s] invalidations {:>8}  contended {:>8}  waited {:>9}  callbacks {:>8}{lost}",
        i.end_ns as f64 / 1e9,
        i.invalidations,
        or_dash(i.contended.map(|c| c.to_string())),
        or_dash(i.wait_ns.map(format_nanos)),
        or_dash(i.callback_calls.map(|c| c.to_string())),
    )
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".into())
}

pub fn summary_text(s: &Summary, stopped_by: Stop) -> String {
    summary_text_at(s, stopped_by, text::width())
}

fn summary_text_at(s: &Summary, stopped_by: Stop, width: usize) -> String {
    let mut out = invalidations_text(s, stopped_by, width);
    out += &locks_text(s, width);
    out += &subscribers_text(s, width);
    out.push('\n');
    out += &s.lost_events.text();
    out += &s.verdict.text();
    out
}

fn invalidations_text(s: &Summary, stopped_by: Stop, width: usize) -> String {
    let mut out = String::new();
    let i = &s.invalidations;
    let seconds = s.duration_ns as f64 / 1e9;
    match (i.count, &i.not_observable) {
        (Some(count), _) => {
            let _ = writeln!(
                out,
                "Invalidations of {}: {count} in {seconds:.1} s ({:.0}/s), {} ({})",
                i.scope,
                i.per_second.unwrap_or(0.0),
                format_bytes(i.bytes),
                stopped_by.name()
            );
        }
        (None, why) => {
            let why = why.as_deref().unwrap_or("not observable here");
            let _ = writeln!(out, "Invalidations: UNKNOWN in {seconds:.1} s ({}): {why}", stopped_by.name());
        }
    }
    if let Some(peak) = &i.peak {
        let whose = peak.owner_tgid.map_or_else(String::new, |t| format!(" of pid {t}'s memory"));
        let _ = writeln!(
            out,
            "  busiest second{whose}: {:.0}/s, ending at {:.1} s",
            peak.per_second,
            peak.end_ns as f64 / 1e9
        );
    }
    if i.whole_address_space > 0 {
        let _ = writeln!(out, "  whole address spaces (at exit, no size): {}", i.whole_address_space);
    }
    if let Some(ns) = i.mean_duration_ns {
        let _ = writeln!(out, "  start to end: {} on average", format_nanos(ns as u64));
    }
    out += &invalidators_text(s, width);
    out += &causes_text(s, width);
    out
}

/// A share as a whole percentage, "<1%" for a small one that is not none.
fn percent(share: f64) -> String {
    if share > 0.0 && share < 0.005 { "<1%".to_string() } else { format!("{:.0}%", share * 100.0) }
}

/// Why the invalidations happened, most first, with each cause's settings on this machine.
fn causes_text(s: &Summary, width: usize) -> String {
    let causes = &s.invalidations.by_cause;
    if causes.is_empty() {
        return String::new();
    }
    let cells: Vec<Vec<String>> = causes
        .iter()
        .map(|c| {
            let owners: Vec<String> = c.owners.iter().take(3).map(u32::to_string).collect();
            let more = if c.owners.len() > 3 { format!(" +{}", c.owners.len() - 3) } else { String::new() };
            let whose = if owners.is_empty() { "-".to_string() } else { format!("{}{more}", owners.join(",")) };
            vec![c.cause.to_string(), c.count.to_string(), percent(c.share), whose]
        })
        .collect();
    let mut out = String::from("  why (the invalidating thread's context):\n");
    out += &text::table(&["CAUSE", "COUNT", "SHARE", "MEMORY OF PID"], &cells, width, 4);
    for c in causes.iter().filter(|c| !c.knobs.is_empty() || c.remedy.is_some()) {
        let _ = writeln!(out, "    {}", crate::cause::settings_line(&c.cause, &c.knobs, c.remedy));
    }
    out
}

/// The invalidators grouped by whose memory they invalidated.
fn invalidators_text(s: &Summary, width: usize) -> String {
    let mut out = String::new();
    let mut owners: Vec<Option<u32>> = Vec::new();
    for row in &s.invalidations.by_invalidator {
        if !owners.contains(&row.owner_tgid) {
            owners.push(row.owner_tgid);
        }
    }
    for owner in owners {
        let rows: Vec<&InvalidatorRow> =
            s.invalidations.by_invalidator.iter().filter(|r| r.owner_tgid == owner).collect();
        let whose = owner.map_or_else(|| "memory not named".to_string(), |t| format!("memory of pid {t}"));
        let _ = writeln!(out, "  {whose}:");
        let cells: Vec<Vec<String>> = rows
            .iter()
            .take(INVALIDATORS_SHOWN)
            .map(|r| {
                vec![
                    r.comm.clone(),
                    r.tgid.to_string(),
                    r.event.map_or_else(|| hook_name(r.source).to_string(), str::to_string),
                    r.count.to_string(),
                    or_dash(r.mean_bytes.map(|b| format_bytes(b as u64))),
                    or_dash(r.mean_duration_ns.map(|ns| format_nanos(ns as u64))),
                ]
            })
            .collect();
        out += &text::table(&["INVALIDATOR", "PID", "EVENT", "COUNT", "MEAN SIZE", "MEAN TIME"], &cells, width, 4);
        if rows.len() > INVALIDATORS_SHOWN {
            let more: u64 = rows[INVALIDATORS_SHOWN..].iter().map(|r| r.count).sum();
            let _ =
                writeln!(out, "    {} more invalidators: {more} (--json lists them)", rows.len() - INVALIDATORS_SHOWN);
        }
    }
    out
}

/// Invalidators listed per memory owner in text.
const INVALIDATORS_SHOWN: usize = 6;

/// The hook that saw an invalidation, short, where no event says more.
fn hook_name(source: &str) -> &str {
    match source {
        "kvm_unmap_hva_range" => "kvm unmap",
        "kvm_age_hva" => "kvm age",
        other => other,
    }
}

fn locks_text(s: &Summary, width: usize) -> String {
    let mut out = String::new();
    if !s.lock_waits_observable {
        return out;
    }
    if s.locks.is_empty() {
        let _ = writeln!(out, "\nLock contention related to invalidations: none seen");
    } else {
        let _ = writeln!(out, "\nLock contention related to invalidations, VMs' locks first, then most waited-on");
        for (rank, lock) in s.locks.iter().take(LOCKS_SHOWN).enumerate() {
            out += &lock_text(lock, width, rank == 0);
        }
        let rest = &s.locks[s.locks.len().min(LOCKS_SHOWN)..];
        if !rest.is_empty() {
            let contended: u64 = rest.iter().map(|l| l.contended).sum();
            let waited: u64 = rest.iter().map(|l| l.wait_ns).sum();
            let _ = writeln!(
                out,
                "  {} more locks: {contended} contended, {} waited (--json lists them)",
                rest.len(),
                format_nanos(waited)
            );
        }
    }
    out += &other_contention_text(s, width);
    out
}

/// The rest of the machine's contention, folded into a few lines.
fn other_contention_text(s: &Summary, width: usize) -> String {
    let o = &s.other_contention;
    if o.locks == 0 {
        return String::new();
    }
    let mut out = format!(
        "\nOther contention (unrelated to invalidations): {} locks, {} contended, {} waited\n",
        o.locks,
        o.contended,
        format_nanos(o.wait_ns)
    );
    for lock in &o.top {
        let line = format!("  {}: {} contended, {} waited", lock.name, lock.contended, format_nanos(lock.wait_ns));
        out += &text::wrap(&line, width, 4);
    }
    out
}

/// Locks listed in text (JSON lists all); the histogram is drawn for the first only.
const LOCKS_SHOWN: usize = 5;

/// Waiter names shown per path before "+N more".
const WAITERS_SHOWN: usize = 2;

fn lock_text(lock: &LockRow, width: usize, histogram: bool) -> String {
    let mut out = String::new();
    let header = format!(
        "  {} [{}]: {} contended, {} waited, max {}",
        lock.name,
        lock.kind,
        lock.contended,
        format_nanos(lock.wait_ns),
        format_nanos(lock.max_ns)
    );
    out += &text::wrap(&header, width, 4);
    let rows: Vec<Vec<String>> = lock
        .paths
        .iter()
        .map(|p| vec![p.name.to_string(), p.contended.to_string(), format_nanos(p.wait_ns), format_nanos(p.max_ns)])
        .collect();
    let columns = text::Columns::fit(&["PATH", "CONTENDED", "WAITED", "MAX"], &rows, 4);
    out += &columns.line(&["PATH", "CONTENDED", "WAITED", "MAX"], width);
    for (path, row) in lock.paths.iter().zip(&rows) {
        out += &columns.line(row, width);
        // The caller first: a symbol is one long word, which a wrap would leave on a line alone.
        let caller = path.caller.as_deref().map_or_else(String::new, |c| format!("in {c}, "));
        out += &text::wrap(&format!("      {caller}by {}", waiters_text(&path.waiters)), width, 8);
    }
    out += &lock_causes_text(lock, width);
    if histogram {
        let _ = write!(out, "{}", Log2Histogram::new(lock.buckets.clone()).render("nsecs", None));
    }
    out
}

/// "inside invalidations, by cause: compaction migration 12 waits 3.1ms; …"; nothing when no
/// invalidation waited.
fn lock_causes_text(lock: &LockRow, width: usize) -> String {
    if lock.by_cause.is_empty() {
        return String::new();
    }
    let causes: Vec<String> = lock
        .by_cause
        .iter()
        .map(|c| format!("{} {} waits {}", c.cause, c.contended, format_nanos(c.wait_ns)))
        .collect();
    text::wrap(&format!("    inside invalidations, by cause: {}", causes.join("; ")), width, 6)
}

/// "kvm-madv, qemu-kvm +23 more"; "-" for none.
fn waiters_text(waiters: &[String]) -> String {
    if waiters.is_empty() {
        return "-".into();
    }
    let shown = waiters.iter().take(WAITERS_SHOWN).cloned().collect::<Vec<_>>().join(", ");
    match waiters.len().saturating_sub(WAITERS_SHOWN) {
        0 => shown,
        more => format!("{shown} +{more} more"),
    }
}

fn subscribers_text(s: &Summary, width: usize) -> String {
    let mut out = String::new();
    if !s.callbacks_observable {
        return out;
    }
    if s.subscribers.is_empty() {
        let _ = writeln!(out, "\nSubscriber callbacks: no subscriber's callback ran on the watched memory");
        return out;
    }
    let _ = writeln!(out, "\nSubscriber callbacks, slowest first");
    for c in &s.subscribers {
        let module = c.module.as_deref().map_or_else(String::new, |m| format!(" [{m}]"));
        out += &text::wrap(&format!("  {}: {}{module}", c.subscriber, c.callback), width, 4);
        let numbers = format!(
            "    {} calls, mean {}, p99 <= {}, max {}, {}/call, lock wait {}",
            c.calls,
            format_nanos(c.mean_ns as u64),
            format_nanos(c.p99_le_ns),
            format_nanos(c.max_ns),
            format_bytes(c.bytes_per_call as u64),
            waiting_share(c),
        );
        out += &text::wrap(&numbers, width, 6);
        let fit = c.fit.as_ref().map_or_else(|| "one size only".into(), fit_text);
        out += &text::wrap(&format!("    fit (own time): {fit}"), width, 6);
    }
    let refused: u64 = s.subscribers.iter().map(|c| c.refused).sum();
    let nonblocking: u64 = s.subscribers.iter().map(|c| c.nonblocking).sum();
    if nonblocking > 0 {
        let _ = writeln!(out, "  non-blockable calls (OOM reaper): {nonblocking}, refused: {refused}");
    }
    out
}

/// The share of a callback's time spent waiting on contended locks ("-" where not traced).
fn waiting_share(c: &SubscriberRow) -> String {
    let total = c.mean_ns * c.calls as f64;
    match c.lock_wait_ns {
        Some(wait) if total > 0.0 => format!("{:.0}%", wait as f64 * 100.0 / total),
        _ => "-".into(),
    }
}

/// A callback's time against size in one phrase:
/// `30µs + 40µs/page; a page of 4K costs 1x one of 2M (4K: 50% of the time)`.
pub fn fit_text(f: &Fit) -> String {
    let small = format_bytes(f.smallest_bytes);
    format!(
        "{} + {}/page; a page of {small} costs {:.0}x one of {} ({small}: {:.0}% of the time)",
        format_nanos(f.fixed_ns as u64),
        format_nanos(f.per_page_ns.max(0.0) as u64),
        f.amplification,
        format_bytes(f.largest_bytes),
        f.smallest_time_share * 100.0
    )
}

/// A metric's value or threshold in its unit.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::cause::{CauseName, Knob};
    use crate::invalidations::{
        judge::{self, Busiest, Evidence},
        locks::WaitPath,
        locks::{LockCauseRow, OtherContention, PathRow},
        report::{CauseRow, Invalidations},
    };

    fn busy_summary() -> Summary {
        let path = |path: WaitPath, waiters: usize| PathRow {
            path,
            name: path.name(),
            in_notifier: path.in_notifier(),
            kind: "rwlock, write",
            contended: 1_234_567,
            wait_ns: 9_876_543_210,
            max_ns: 12_345_678,
            waiters: (0..waiters).map(|i| format!("kvm-madv-{i:04}")).collect(),
            caller: Some("kvm_mmu_notifier_invalidate_range_start".into()),
            stack: Vec::new(),
        };
        let lock = LockRow {
            address: "0xffffc90000a1b2c3".into(),
            name: "kvm->mmu_lock of VM pid 4194303".into(),
            class: "kvm_mmu_lock",
            relation: "vm_lock",
            owner_tgid: Some(4_194_303),
            kind: "rwlock, write",
            contended: 2_469_134,
            wait_ns: 19_753_086_420,
            max_ns: 12_345_678,
            buckets: vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 340, 5600, 800, 3],
            paths: vec![path(WaitPath::NotifierStart, 25), path(WaitPath::VcpuFault, 3), path(WaitPath::Interrupt, 1)],
            by_cause: vec![
                LockCauseRow {
                    cause: CauseName { class: "syscall", detail: Some("madvise(MADV_DONTNEED)".into()) },
                    contended: 1_234_000,
                    wait_ns: 9_876_000_000,
                },
                LockCauseRow {
                    cause: CauseName { class: "compaction", detail: Some("migration".into()) },
                    contended: 567,
                    wait_ns: 543_210,
                },
            ],
        };
        let row = |comm: &str| InvalidatorRow {
            comm: comm.into(),
            tgid: 4_194_303,
            owner_tgid: Some(4_194_303),
            source: "invalidate_range_start",
            event: Some("PROTECTION_PAGE"),
            cause: CauseName { class: "syscall", detail: Some("mprotect()".into()) },
            count: 123_456_789,
            bytes: 0,
            mean_bytes: Some(4096.0),
            whole_address_space: 0,
            mean_duration_ns: Some(123_456.0),
        };
        let busiest =
            Busiest { owner_tgid: Some(4_194_303), comm: "qemu-system-x86".into(), count: 1, mean_bytes: Some(4096.0) };
        let mut summary = Summary {
            duration_ns: 3_600_000_000_000,
            invalidations: Invalidations {
                count: Some(123_456_789),
                per_second: Some(34_293.0),
                scope: "every mm with subscribers",
                busiest: Some(busiest.clone()),
                by_invalidator: vec![row("kvm-madv-thread"), row("kcompactd0")],
                by_cause: vec![CauseRow {
                    cause: CauseName { class: "compaction", detail: Some("migration".into()) },
                    count: 123_456_789,
                    share: 0.5,
                    owners: vec![4_194_303, 4_194_302, 4_194_301, 4_194_300],
                    knobs: vec![
                        Knob { setting: "vm.compaction_proactiveness".into(), value: Some("20".into()) },
                        Knob { setting: "/sys/kernel/mm/transparent_hugepage/defrag".into(), value: None },
                    ],
                    remedy: crate::cause::remedy("compaction"),
                }],
                ..Invalidations::default()
            },
            locks: vec![lock.clone()],
            other_contention: OtherContention { locks: 1500, contended: 99_999_999, wait_ns: 1 << 40, top: vec![lock] },
            lock_waits_observable: true,
            ..Summary::default()
        };
        let evidence = Evidence {
            invalidate_freq: Some(98_765.0),
            invalidate_freq_mean: Some(34_293.0),
            busiest: Some(busiest),
            wait_per_invalidation_ns: Some(160_000.0),
            mean_invalidation_bytes: Some(4096.0),
            notifier_lock: Some(("kvm->mmu_lock of VM pid 4194303".into(), 19_753_086_420)),
            vcpu_faults_wait: true,
            ..Evidence::default()
        };
        summary.verdict = judge::judge(&evidence, &judge::tests::thresholds());
        summary
    }

    #[test]
    fn a_busy_report_fits_80_columns_with_waiters_capped_and_the_caller_beside_them() {
        for width in [80, 100] {
            let text = text::fit(&summary_text_at(&busy_summary(), Stop::Interrupted, width), width);
            for line in text.lines() {
                assert!(line.chars().count() <= width, "{} columns at {width}: {line:?}", line.chars().count());
            }
        }
        let text = text::fit(&summary_text_at(&busy_summary(), Stop::Interrupted, 80), 80);
        let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let expected = "in kvm_mmu_notifier_invalidate_range_start, by kvm-madv-0000, kvm-madv-0001 +23 more";
        assert!(one_line.contains(expected), "{text}");
        assert!(text.lines().all(|l| l.trim() != "kvm_mmu_notifier_invalidate_range_start"), "no caller alone: {text}");
        assert!(text.contains("Other contention (unrelated to invalidations): 1500 locks"), "{text}");
        assert!(
            one_line.contains("inside invalidations, by cause: syscall madvise(MADV_DONTNEED) 1234000 waits 9.88s; compaction migration 567 waits"),
            "{text}"
        );
        assert!(text.contains("(warn 1000/s, crit 10000/s)"), "each metric with its bands: {text}");
        assert!(one_line.contains("compaction migration 123456789 50% 4194303,4194302,4194301 +1"), "{text}");
        assert!(
            one_line.contains(
                "compaction: vm.compaction_proactiveness=20, /sys/kernel/mm/transparent_hugepage/defrag=UNKNOWN; mlock"
            ),
            "{text}"
        );
    }
}

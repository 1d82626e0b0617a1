//! The verdict: its level from the share of resident anonymous memory kept in small pages, and
//! its headline: a process-wide cause first (no THP in the kernel, the prctl and who set it,
//! enabled=never), else how much of the resident anonymous memory is in huge pages and what keeps
//! the rest small, largest first, each cause in the words and the code of the reasons table.

use std::collections::BTreeMap;

use super::{
    collapse::Refusal,
    inputs::{Inputs, prctl_calls},
    reasons::{DisableMode, Metric, NO_THP, ReasonCode, Verdict},
    report::{FaultFacts, LiveFacts, PrctlCall, PrctlEffect, Relation, VmaClass, VmaEntry},
    sysfs::GlobalMode,
};
use crate::{
    kernel::layout::ThpDisableBits,
    report::verdict::{Advice, Band, MetricVerdict, Unit},
    units::format_bytes,
};

/// docs/thresholds.md, "thp-why": a tenth of the memory that could be huge kept small is worth
/// a look, half of it is the process not getting THP.
pub const SMALL_SHARE: Band = Band { warn: 0.10, crit: 0.50 };

const SMALL_SHARE_IS: &str = "resident anonymous memory in small pages ÷ resident anonymous memory, in regions a 2 MiB page fits (aligned, large enough)";

/// Regions no huge page fits: their memory is small whatever the settings, so it is not judged.
fn fits_no_huge_page(vma: &VmaEntry) -> bool {
    matches!(vma.blocking_reason(), ReasonCode::VmaTooSmall | ReasonCode::VmaUnaligned)
}

/// The verdict: `headline` (the line `verdict_line` says), the small-pages share judged, and the
/// advice of the causes present.
pub fn judge(headline: String, vmas: &[VmaEntry], advice: Vec<Advice<ReasonCode>>) -> Verdict {
    let judged = vmas.iter().filter(|v| v.kind == VmaClass::Anon && !fits_no_huge_page(v));
    let (resident, small) =
        judged.fold((0u64, 0u64), |(r, s), v| (r + v.anonymous_bytes, s + v.small_anonymous_bytes()));
    let value = (resident > 0).then(|| small as f64 / resident as f64);
    let nothing = "no resident anonymous memory in regions a 2 MiB page fits: nothing for huge pages to back";
    let metric = MetricVerdict::judged(Metric::SmallShare, SMALL_SHARE_IS, Unit::Fraction, value, SMALL_SHARE, None);
    let metric = MetricVerdict { unknown_because: value.is_none().then(|| nothing.into()), ..metric };
    Verdict { level: metric.level, headline, metrics: vec![metric], advice }
}

/// The prctl call caught live that explains the target's mode, if any: the target's own or an
/// ancestor's, the last one that set the mode the target has.
fn caught_prctl<'a>(input: &Inputs, calls: &'a [PrctlCall]) -> Option<&'a PrctlCall> {
    let want = match input.disable.mode? {
        DisableMode::Completely => PrctlEffect::Disable,
        DisableMode::ExceptAdvised => PrctlEffect::DisableExceptAdvised,
        DisableMode::None => return None,
    };
    calls.iter().rev().find(|c| c.effect == want && c.relation != Relation::Other)
}

pub fn verdict_line(
    input: &Inputs,
    vmas: &[VmaEntry],
    live: &LiveFacts,
    faults: &FaultFacts,
    refusal: Option<&Refusal>,
) -> String {
    let who = format!("pid {} ({})", input.pid, input.comm);
    let mode = input.disable.mode.unwrap_or(DisableMode::None);
    let calls = prctl_calls(input);
    let caught = caught_prctl(input, &calls);
    let setter = match (&input.set_by, caught) {
        (_, Some(c)) if c.relation == Relation::Target => " by prctl in the process itself (caught live)".to_string(),
        (_, Some(c)) => format!(" by prctl in ancestor {} ({}) (caught live)", c.tgid, c.comm),
        (Some(s), None) if s.is_target => " by prctl in the process itself".to_string(),
        (Some(s), None) => format!(
            " by prctl in ancestor {} ({}), inherited across fork/exec",
            s.pid,
            if s.cmdline.is_empty() { &s.comm } else { &s.cmdline }
        ),
        (None, None) => " by prctl".to_string(),
    };
    let mut line = match mode {
        _ if !input.policy.thp_built_in => format!("THP unavailable for {who}: {NO_THP}"),
        DisableMode::Completely => {
            let flag = if matches!(input.bits, ThpDisableBits::Split { .. }) {
                "MMF_DISABLE_THP_COMPLETELY"
            } else {
                "MMF_DISABLE_THP"
            };
            format!("THP disabled for {who}: {flag} set{setter}")
        }
        DisableMode::ExceptAdvised => {
            format!("THP disabled for {who} except MADV_HUGEPAGE regions: MMF_DISABLE_THP_EXCEPT_ADVISED set{setter}")
        }
        DisableMode::None
            if input.policy.enabled == Some(GlobalMode::Never) && input.policy.anon_orders_allowed(true).is_empty() =>
        {
            format!("THP disabled system-wide for {who}: /sys/kernel/mm/transparent_hugepage/enabled is never")
        }
        DisableMode::None => memory_verdict(&who, vmas, refusal),
    };
    if let (true, Some(checks), Some(denied)) = (live.allow_check_observed, live.checks, live.denied) {
        line.push_str(&format!("; {checks} THP checks, {denied} denied"));
    } else if faults.observed && faults.total > 0 {
        // Without the allow-check probe (no kprobes, no trampolines) the faults still tell.
        line.push_str(&format!("; {} page faults, ~{} in huge pages", faults.total, faults.in_huge_pages));
    }
    line
}

/// Without a process-wide cause, what matters: how much of the resident anonymous memory (what
/// THP is for) is in huge pages, then what keeps the rest in small pages, largest first.
fn memory_verdict(who: &str, vmas: &[VmaEntry], refusal: Option<&Refusal>) -> String {
    let anon: Vec<&VmaEntry> = vmas.iter().filter(|v| v.kind == VmaClass::Anon).collect();
    let resident: u64 = anon.iter().map(|v| v.anonymous_bytes).sum();
    let huge: u64 = anon.iter().map(|v| v.anon_huge_bytes).sum();
    if resident == 0 {
        return format!("{who}: no resident anonymous memory yet, so nothing for huge pages to back");
    }
    let share = 100.0 * huge as f64 / resident as f64;
    let mut line = format!(
        "{who}: {} of {} resident anonymous memory is in huge pages ({share:.0} %)",
        format_bytes(huge),
        format_bytes(resident)
    );
    let mut small: BTreeMap<ReasonCode, u64> = BTreeMap::new();
    for v in anon.iter().filter(|v| v.small_anonymous_bytes() > 0) {
        *small.entry(v.blocking_reason()).or_default() += v.small_anonymous_bytes();
    }
    let mut small: Vec<(ReasonCode, u64)> = small.into_iter().collect();
    small.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let parts: Vec<String> = small.iter().take(3).map(|&(code, bytes)| small_part(code, bytes, refusal)).collect();
    if !parts.is_empty() {
        line.push_str("; in small pages: ");
        line.push_str(&parts.join(", "));
        if small.len() > parts.len() {
            line.push_str(", …");
        }
    }
    line
}

/// One cause of resident anonymous memory in small pages, for the verdict.
fn small_part(code: ReasonCode, bytes: u64, refusal: Option<&Refusal>) -> String {
    let refused = refusal.map(|r| format!("eligible, but khugepaged could not collapse it: {}", r.summary()));
    let what = match code {
        ReasonCode::CollapseRefused => refused.as_deref().unwrap_or("eligible, but khugepaged could not collapse it"),
        ReasonCode::VmaNohugepage => "opted out by the application itself (MADV_NOHUGEPAGE)",
        ReasonCode::SysfsMadviseNotAdvised => "without MADV_HUGEPAGE under enabled=madvise",
        ReasonCode::SysfsNever => "refused by sysfs (never)",
        ReasonCode::VmaTooSmall => "in regions too small for a 2 MiB page",
        ReasonCode::VmaUnaligned => "in regions without an aligned 2 MiB window",
        ReasonCode::AllocFallback => "eligible, but the kernel fell back to small pages",
        ReasonCode::None => "eligible, but not (yet) in huge pages",
        _ => "refused",
    };
    format!("{} {what} ({})", format_bytes(bytes), code.as_str())
}

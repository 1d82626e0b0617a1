//! Collection: on every scrape, each attached capability reads what its kernel programs counted
//! (per-CPU sums) into one [`Snapshot`] of plain numbers, named as the metric families are.
//! Nothing accumulates here between scrapes: every value is the kernel's own running total since
//! the object was loaded, or (invalidations) the totals its source drained the kernel's tables
//! into.
//!
//! A capability's part of the exporter is its own `export` module: a [`Slice`] from the command
//! line to its settings and its attach, which yields its [`Source`]: what every attached
//! capability is to the exporter, and its own [`Reader`] of its maps. This module
//! names no capability: what every slice shares (the choice, the snapshot, the series every
//! capability has, the one KVM family) is written once here.

use std::time::Duration;

use anyhow::Result;
use aya::Ebpf;

use super::buckets::Histogram;
use crate::{
    capability::CapabilityId,
    cli::ExporterArgs,
    kernel::{Kernel, release::Release},
    probes::{GlobalValue, LogicalProbe, Plan},
    report::verdict::{Level, Verdict},
};

/// What the exporter was asked for, as each chosen capability's slice reads it.
pub struct Choice<'a> {
    pub args: &'a ExporterArgs,
    /// Every chosen capability: a slice may leave to another what both could attach.
    pub capabilities: &'a [CapabilityId],
}

impl Choice<'_> {
    pub fn includes(&self, capability: CapabilityId) -> bool {
        self.capabilities.contains(&capability)
    }
}

/// One chosen capability before it attaches. It is built from the command line before the
/// privileges are checked, so that its own options are refused first; then the exporter takes
/// every slice through each step before the next: the kernel check, the settings of the one
/// object they share, the attach.
pub trait Slice {
    /// Refuses what the running kernel cannot do, before anything loads (default: nothing).
    fn check(&self, _kernel: &Kernel) -> Result<()> {
        Ok(())
    }

    /// Its programs' globals, with its rings switched off: the exporter reads only maps.
    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)>;

    /// Attaches it through its own catalog; what cannot attach is in the source's plan.
    fn attach(self: Box<Self>, kernel: &Kernel, ebpf: &mut Ebpf) -> Result<Source>;
}

/// What every attached capability is to the exporter: which, its plan, and its programs.
pub struct Attached {
    pub capability: CapabilityId,
    pub plan: Plan,
    /// Its own programs, whose runs skipped by the kernel's recursion guard it counts as lost.
    pub programs: Programs,
}

/// A capability's programs: those of its catalog, or every program named with its prefix (where
/// it attaches programs the catalog does not list, such as each subscriber's callback).
pub enum Programs {
    Catalog(Vec<&'static str>),
    Prefix(&'static str),
}

impl Programs {
    pub fn contains(&self, program: &str) -> bool {
        match self {
            Programs::Catalog(names) => names.contains(&program),
            Programs::Prefix(prefix) => program.starts_with(prefix),
        }
    }
}

/// One capability as the exporter keeps it attached: what every capability has, and the reader
/// of its own maps.
pub struct Source {
    pub attached: Attached,
    pub reader: Box<dyn Reader>,
}

/// The part of an attached capability only it knows: how to drain and read its maps.
pub trait Reader {
    /// How often its kernel tables must be drained so that none fills (default: it has none).
    fn drain_period(&self) -> Option<Duration> {
        None
    }

    /// Moves drained kernel tables into its totals (default: nothing to drain).
    fn drain(&self, _ebpf: &mut Ebpf) -> Result<()> {
        Ok(())
    }

    /// Adds this capability's series to the scrape.
    fn read(&self, ebpf: &Ebpf, snapshot: &mut Snapshot) -> Result<()>;

    /// Its verdict over the window since the previous call (since the attach for the first),
    /// `window_ns` long, judged as its command judges with the command's default limits. The
    /// tables are drained just before. Default: it has no verdict in the exporter.
    fn judge(&self, _ebpf: &Ebpf, _window_ns: u64) -> Result<Option<WindowVerdict>> {
        Ok(None)
    }
}

/// A capability's verdict over one window as the exporter serves it: its level and the metric
/// that decided it (the one its command's headline names).
#[derive(Clone, Debug, PartialEq)]
pub struct WindowVerdict {
    pub level: Level,
    pub metric: Option<String>,
}

impl WindowVerdict {
    /// `verdict` of a window in which the capability saw `work` of what it judges (walks,
    /// wakeups, invalidations). With none, a verdict below WARN is UNKNOWN, as triage says
    /// "nothing to judge": no walk at all is not a healthy retry rate.
    pub fn of<M: std::fmt::Display, C>(verdict: &Verdict<M, C>, work: u64) -> Self {
        if work == 0 && verdict.level < Level::Warn {
            return Self { level: Level::Unknown, metric: None };
        }
        Self { level: verdict.level, metric: verdict.deciding().map(|m| m.metric.to_string()) }
    }

    /// `mm_probe_verdict`: one series per level, 1 for this verdict's (a state set, so that a
    /// window judged OK and one that could judge nothing stay apart).
    pub fn levels(&self, capability: CapabilityId) -> impl Iterator<Item = Series> + '_ {
        let levels = [Level::Unknown, Level::Ok, Level::Warn, Level::Crit];
        levels.into_iter().map(move |level| {
            Series::new(&[("capability", capability.name()), ("level", level.name())], u64::from(level == self.level))
        })
    }

    /// `mm_probe_finding`: present while the verdict is WARN or CRIT, as `triage` reports it,
    /// labelled with the deciding metric (bounded: a capability's metrics are a fixed list).
    pub fn finding(&self, capability: CapabilityId) -> Option<Series> {
        let metric = self.metric.as_deref().unwrap_or("none");
        (self.level >= Level::Warn).then(|| {
            Series::new(&[("capability", capability.name()), ("level", self.level.name()), ("metric", metric)], 1)
        })
    }
}

/// One labelled value of a counter or gauge family (labels in the family's order).
#[derive(Clone, Debug, PartialEq)]
pub struct Series<V = u64> {
    pub labels: Vec<(&'static str, String)>,
    pub value: V,
}

/// A counter counted in a fractional unit (seconds).
pub type FloatSeries = Series<f64>;

impl<V> Series<V> {
    pub fn new(labels: &[(&'static str, &str)], value: V) -> Self {
        Self { labels: labels.iter().map(|(k, v)| (*k, v.to_string())).collect(), value }
    }
}

/// What one scrape read, named as the metric families are.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub build_info: Vec<Series>,
    pub probe_attached: Vec<Series>,
    pub lost_events: Vec<Series>,
    pub map_update_failures: Vec<Series>,
    pub wakeup_latency: Option<Histogram>,
    pub wakeups_over_threshold: Option<u64>,
    /// (function, duration histogram, calls over the threshold), attached slots only.
    pub function_durations: Vec<(String, Histogram, u64)>,
    pub hmm_range_fault_returns: Vec<Series>,
    /// Retries of a stale sequence, where the walks' sequences are readable.
    pub hmm_stale_retries: Option<u64>,
    pub mmu_invalidations: Vec<Series>,
    /// The same invalidations by cause class: bounded by the class list.
    pub mirrored_invalidation_causes: Vec<Series>,
    pub mmu_invalidation_callback: Option<Histogram>,
    pub kvm_notifier_events: Vec<Series>,
    pub thp_checks: Vec<Series>,
    /// invalidations: by hook (source) and event; contended locks and waits by lock class and
    /// waiting path; callbacks by subscriber. Every label set is bounded by a table of names.
    pub notifier_invalidations: Vec<Series>,
    /// invalidations by the hook counted (the function probe where attached, else KVM's unmap
    /// tracepoint) and cause class: bounded by the class list.
    pub invalidation_causes: Vec<Series>,
    pub lock_contended: Vec<Series>,
    pub lock_wait_seconds: Vec<FloatSeries>,
    pub callback_calls: Vec<Series>,
    pub callback_seconds: Vec<FloatSeries>,
    /// The last judged window's verdict of each capability that judges one, and its finding.
    pub verdicts: Vec<Series>,
    pub findings: Vec<Series>,
}

impl Snapshot {
    /// A scrape before any capability has read: mm-probe's version and the running kernel.
    pub fn new(release: &Release) -> Self {
        Self {
            build_info: vec![Series::new(&[("version", env!("CARGO_PKG_VERSION")), ("kernel", &release.text)], 1)],
            ..Self::default()
        }
    }
}

/// The runs the kernel's recursion guard skipped; no series where this kernel does not count
/// them all (kprobes and classic tracepoints before 6.7): absent, not a false 0.
pub fn recursion_guard(capability: CapabilityId, skipped: Option<u64>) -> Option<Series> {
    skipped.map(|n| Series::new(&[("capability", capability.name()), ("kind", "recursion_guard")], n))
}

/// One 0/1 series per logical probe of the plan.
pub fn probe_series(capability: CapabilityId, plan: &Plan) -> impl Iterator<Item = Series> + '_ {
    plan.probes
        .iter()
        .map(move |p| Series::new(&[("capability", capability.name()), ("probe", p.probe)], u64::from(p.attached())))
}

/// The one KVM family: each of KVM's tracepoints only where it attached (`None` otherwise).
/// Whichever capability attached them fills it; the other's tracepoints are left out.
pub fn kvm_events(unmaps: Option<u64>, ages: Option<u64>) -> Vec<Series> {
    [("unmap_hva_range", unmaps), ("age_hva", ages)]
        .into_iter()
        .filter_map(|(event, count)| Some(Series::new(&[("event", event)], count?)))
        .collect()
}

/// Every program a catalog may attach (for the recursion-guard count of its capability).
pub fn catalog_programs(probes: &[LogicalProbe]) -> Programs {
    Programs::Catalog(probes.iter().flat_map(|p| p.candidates).flat_map(|c| c.hooks).map(|h| h.program).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(series: impl Iterator<Item = Series>) -> Vec<(String, u64)> {
        series
            .map(|s| (s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), s.value))
            .collect()
    }

    #[test]
    fn a_verdict_is_one_level_of_four_and_a_finding_only_at_warn_or_crit() {
        let crit = WindowVerdict { level: Level::Crit, metric: Some("retry_rate".into()) };
        let levels = values(crit.levels(CapabilityId::RetryStorm));
        assert_eq!(levels.len(), 4);
        assert_eq!(levels.iter().filter(|(_, v)| *v == 1).count(), 1);
        assert!(levels.contains(&("capability=retry-storm,level=CRIT".into(), 1)), "{levels:?}");
        let finding = values(crit.finding(CapabilityId::RetryStorm).into_iter());
        assert_eq!(finding, [("capability=retry-storm,level=CRIT,metric=retry_rate".to_string(), 1)]);
        let verdict: Verdict<&str, ()> = Verdict { level: Level::Ok, ..Verdict::default() };
        assert_eq!(WindowVerdict::of(&verdict, 0).level, Level::Unknown, "OK over no work is nothing judged");
        assert_eq!(WindowVerdict::of(&verdict, 1).level, Level::Ok);
        for level in [Level::Ok, Level::Unknown] {
            let quiet = WindowVerdict { level, metric: None };
            assert_eq!(quiet.finding(CapabilityId::Latency), None, "{level:?} is no finding");
        }
    }
}

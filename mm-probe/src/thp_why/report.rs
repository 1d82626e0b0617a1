//! The JSON model of `thp-why --json`: what is printed, field by field (schemas/thp-why/). The
//! judgement that fills it is in `judge.rs`; the text is `render.rs`.

use std::collections::BTreeMap;

use mm_probe_common::thp::Counter;
use serde::{Serialize, Serializer};

use super::{
    ancestry::{Ancestor, SetBy},
    checks::{AllowCheck, Call},
    reasons::{DisableMode, ModeSource, ReasonCode, Verdict},
    scan_result::{NamesFrom, Outcome},
    sysfs::{SizeMode, SystemPolicy},
};
use crate::{
    probes::Plan,
    report::lost::{self, loss_kinds},
};

/// Allow-check counts of one caller (the maps holding them are empty where it was not traced).
#[derive(Clone, Debug, Default, Serialize)]
pub struct CallCounts {
    pub checks: u64,
    pub denied: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct VmaLive {
    /// `null` where the allow-check was not traced (not 0: nothing was measured).
    pub checks: Option<u64>,
    pub denied: Option<u64>,
    pub by_call: BTreeMap<Call, CallCounts>,
    /// Live denials by decoded reason code.
    pub denied_by: BTreeMap<ReasonCode, u64>,
    pub faults: u64,
}

/// What backs a VMA, as the JSON names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VmaClass {
    Anon,
    File,
    Shmem,
    Special,
    Gate,
}

impl VmaClass {
    pub fn as_str(self) -> &'static str {
        match self {
            VmaClass::Anon => "anon",
            VmaClass::File => "file",
            VmaClass::Shmem => "shmem",
            VmaClass::Special => "special",
            VmaClass::Gate => "gate",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct VmaEntry {
    pub start: String,
    pub end: String,
    pub size_bytes: u64,
    pub kind: VmaClass,
    pub name: String,
    pub stack: bool,
    pub aligned_2m_window: bool,
    pub hg: bool,
    pub nh: bool,
    pub vm_flags: String,
    pub thp_eligible: Option<bool>,
    pub anon_huge_bytes: u64,
    pub rss_bytes: u64,
    /// smaps `Anonymous`: the resident anonymous memory (AnonHugePages included).
    pub anonymous_bytes: u64,
    /// The first refusal in the kernel's order for this version (`none`: eligible).
    pub reason: ReasonCode,
    /// Every refusal, in the kernel's order (empty when eligible).
    pub reasons: Vec<ReasonCode>,
    pub detail: String,
    /// What would let this region have huge pages (empty when nothing needs doing).
    pub fix: String,
    /// The first refusal happens in the 6.8+ inline wrapper, before the probed function.
    pub in_wrapper: bool,
    /// Whether the kernel's THPeligible matches this judgement (null: no THPeligible line).
    pub kernel_agrees: Option<bool>,
    pub live: VmaLive,
    #[serde(skip)]
    pub start_addr: u64,
    /// Not PROT_NONE: it can fault.
    #[serde(skip)]
    pub accessible: bool,
    /// The detail of each of `reasons`, same order.
    #[serde(skip)]
    pub details: Vec<String>,
}

impl VmaEntry {
    pub fn detail_of(&self, code: ReasonCode) -> &str {
        self.reasons.iter().position(|c| *c == code).and_then(|i| self.details.get(i)).map_or(&self.detail, |d| d)
    }

    /// The application opted this region out itself (madvise(MADV_NOHUGEPAGE), MAP_STACK):
    /// no sysfs setting overrides that.
    pub fn opted_out(&self) -> bool {
        self.reasons.contains(&ReasonCode::VmaNohugepage)
    }

    /// The refusal that has to go for this region to get huge pages: a process-wide one first
    /// (nothing per region helps while it holds), then the application's own opt-out (a sysfs
    /// refusal ahead of it in the kernel's order would only give way to it), else the first.
    pub fn blocking_reason(&self) -> ReasonCode {
        if let Some(code) = self.reasons.iter().find(|c| c.is_process_wide()) {
            return *code;
        }
        if self.opted_out() {
            return ReasonCode::VmaNohugepage;
        }
        self.reason
    }

    /// Resident anonymous memory not in huge pages.
    pub fn small_anonymous_bytes(&self) -> u64 {
        self.anonymous_bytes.saturating_sub(self.anon_huge_bytes)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ReasonEntry {
    pub code: ReasonCode,
    /// Live denials decoded to this reason; `null` where the allow-check was not traced.
    pub count: Option<u64>,
    pub detail: String,
    /// Who set the flag behind this reason; `null` for reasons no process sets (a stable key,
    /// present on every reason).
    pub set_by: Option<SetBy>,
    /// VMAs whose judgement includes this reason, and their size (one VMA may be counted under
    /// several reasons; file-backed VMAs included).
    pub vmas: usize,
    pub bytes: u64,
    /// Page faults of the target in those VMAs during the run.
    pub faults: u64,
    /// Anonymous VMAs this reason decides (`VmaEntry::blocking_reason`): each anonymous VMA is
    /// counted under exactly one reason, so these add up to the anonymous VMAs.
    pub deciding_vmas: usize,
    /// Their resident anonymous memory, and how much of it is in small pages: the measure of the
    /// verdict, which these add up to.
    pub resident_bytes: u64,
    pub small_bytes: u64,
    pub fix: String,
}

/// What the reasons' deciding counts leave out: VMAs that are not anonymous memory (file-backed,
/// shmem, special), whose reasons are in the VMA list.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NonAnonymous {
    pub vmas: usize,
    pub rss_bytes: u64,
}

/// What a prctl(PR_SET_THP_DISABLE) call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrctlEffect {
    Disable,
    DisableExceptAdvised,
    Enable,
}

impl PrctlEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            PrctlEffect::Disable => "disable",
            PrctlEffect::DisableExceptAdvised => "disable_except_advised",
            PrctlEffect::Enable => "enable",
        }
    }
}

/// Who made a prctl call, seen from the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    Target,
    Ancestor,
    Other,
}

impl Relation {
    pub fn as_str(self) -> &'static str {
        match self {
            Relation::Target => "target",
            Relation::Ancestor => "ancestor",
            Relation::Other => "other",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PrctlCall {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub arg2: u64,
    pub arg3: u64,
    pub effect: PrctlEffect,
    pub relation: Relation,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessFacts {
    pub thp_disable: Option<DisableMode>,
    pub source: ModeSource,
    pub mm_flags: Option<String>,
    pub status_thp_enabled: Option<bool>,
    pub ancestors: Vec<Ancestor>,
    pub set_by: Option<SetBy>,
    pub prctl_calls: Vec<PrctlCall>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FaultFacts {
    pub observed: bool,
    pub total: u64,
    /// Faults that got a PMD huge page: AnonHugePages growth per VMA over the run in 2 MiB
    /// units, capped by that VMA's faults (an estimate; the tracepoint does not say).
    pub in_huge_pages: u64,
    /// Distinct 2 MiB ranges the faults fell in.
    pub ranges: usize,
    /// System-wide /proc/vmstat deltas over the run (every process's, not only the target's).
    pub thp_fault_alloc: i64,
    pub thp_fault_fallback: i64,
    pub thp_fault_fallback_charge: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SystemFacts {
    #[serde(flatten)]
    pub policy: SystemPolicy,
    /// thp_* counters of /proc/vmstat: change over the run (system-wide).
    pub vmstat_delta: BTreeMap<String, i64>,
}

/// One scan result on the target's memory during the run, with what it means.
#[derive(Clone, Debug, Serialize)]
pub struct CollapseResult {
    /// The result's name on this kernel (`exceed_none_pte`), `result_<n>` if it had none.
    pub result: String,
    /// The kernel's raw number (it moves between versions: shown for reference only).
    pub raw: u32,
    /// `anon` or `file` (file and shmem ranges).
    pub path: &'static str,
    /// `khugepaged`, or `madvise_collapse` (the process's own MADV_COLLAPSE).
    pub origin: &'static str,
    pub count: u64,
    pub outcome: Outcome,
    pub why: String,
    /// The khugepaged knob whose limit this is, and its value at the end of the run.
    pub knob: Option<&'static str>,
    pub knob_value: Option<u64>,
    pub fix: String,
}

/// khugepaged's collapse scans of the target's memory during the run (`collapse` in JSON). Every
/// count is `null` where the scan tracepoint was not attached (nothing was measured).
#[derive(Clone, Debug, Serialize)]
pub struct CollapseFacts {
    pub observed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// Where the result names came from (BTF, tracefs, or unknown: shown by number).
    pub names_from: NamesFrom,
    /// Scans of the target's ranges, by khugepaged and by the process's MADV_COLLAPSE.
    pub scans: Option<u64>,
    pub by_khugepaged: Option<u64>,
    pub by_madvise_collapse: Option<u64>,
    /// Ranges collapsed into huge pages.
    pub collapsed: Option<u64>,
    /// Ranges that stay small (outcome `failed`).
    pub failed: Option<u64>,
    /// Results, most frequent first.
    pub results: Vec<CollapseResult>,
    /// Scans of other processes' memory meanwhile.
    pub other_mm_scans: Option<u64>,
    /// khugepaged has the process on its list (MMF_VM_HUGEPAGE in mm->flags); `null` when the
    /// kernel's mm->flags were not read.
    pub registered: Option<bool>,
    /// khugepaged scanned the target at least once during the run.
    pub reached: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_reached: Option<String>,
    /// A process-wide refusal that keeps khugepaged from the whole process (the prctl, the 2 MiB
    /// size off system-wide, no THP in the kernel), whatever its regions' madvise says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_away: Option<String>,
    /// Regions khugepaged may collapse (eligible, with an aligned 2 MiB range) and their resident
    /// memory still in small pages, at the end of the run.
    pub candidate_regions: usize,
    pub candidate_small_bytes: u64,
    /// khugepaged's full passes over its list and pages it collapsed, system-wide, over the run.
    pub full_scans_delta: Option<i64>,
    pub pages_collapsed_delta: Option<i64>,
    /// The growth of the target's AnonHugePages over the run.
    pub anon_huge_bytes_delta: i64,
    pub advice: Vec<String>,
}

/// One THP size (6.8+ per-size controls) as it applies to the target (`sizes` in JSON).
#[derive(Clone, Debug, Serialize)]
pub struct SizeFacts {
    pub size_bytes: u64,
    pub enabled: Option<SizeMode>,
    /// `inherit` resolved against the global mode: `always`, `madvise` or `never`.
    pub effective: &'static str,
    /// The target's anonymous regions this size may be used for (the policy, the region's
    /// madvise flags, the process's prctl mode, and room for one aligned block), and their size.
    pub regions: usize,
    pub bytes: u64,
    /// Change of the size's counters over the run (`stats/`, 6.10+; system-wide); `null` where
    /// the kernel has none.
    pub stats_delta: Option<BTreeMap<String, i64>>,
}

/// Why the live window ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    Duration,
    Interrupted,
    TargetExited,
    RingBufferError,
    NotRun,
}

/// A key of `live.counters`: a kernel counter slot, or the faults user space sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LiveCounter {
    Kernel(Counter),
    /// The target's page faults: the fault map's sum plus those that did not fit.
    Faults,
}

impl LiveCounter {
    pub fn name(self) -> &'static str {
        match self {
            LiveCounter::Kernel(counter) => counter.name(),
            LiveCounter::Faults => "faults",
        }
    }
}

impl Serialize for LiveCounter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// The live counters by slot; a slot never read is 0 (every slot is read when there are any).
#[derive(Clone, Debug, Default, Serialize)]
#[serde(transparent)]
pub struct Counters(pub BTreeMap<LiveCounter, u64>);

impl Counters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.0.get(&LiveCounter::Kernel(counter)).copied().unwrap_or(0)
    }

    pub fn faults(&self) -> u64 {
        self.0.get(&LiveCounter::Faults).copied().unwrap_or(0)
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct LiveFacts {
    pub duration_ns: u64,
    pub stopped_by: StoppedBy,
    pub allow_check_observed: bool,
    pub allow_check: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// The allow-check counts below are `null` where it was not traced (never a measured 0).
    pub checks: Option<u64>,
    pub denied: Option<u64>,
    pub by_call: BTreeMap<Call, CallCounts>,
    /// Denials the kernel's order of checks does not explain with what mm-probe sees.
    pub unexplained: Option<u64>,
    /// Allowed by the kernel but refused by the evaluation (a sign the model is off).
    pub disagreements: Option<u64>,
    /// khugepaged skipping never-faulted VMAs: not a reason for missing huge pages.
    pub benign_denials: Option<u64>,
    /// Checks on VMAs gone by the end of the run, and their denials by reason.
    pub gone_vmas: Option<u64>,
    pub denied_on_gone_vmas: BTreeMap<ReasonCode, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wrapper_note: Option<String>,
    pub counters: Counters,
    pub plan: Option<Plan>,
}

/// How this kernel stores the THP-disable flags in mm->flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DisableBitsLayout {
    /// MMF_DISABLE_THP, bit 24.
    Single,
    /// 6.18: MMF_DISABLE_THP_COMPLETELY 24, MMF_DISABLE_THP_EXCEPT_ADVISED 23.
    Split,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelFacts {
    pub release: String,
    pub allow_check: AllowCheck,
    pub thp_disable_bits: DisableBitsLayout,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    /// Its advice holds the fixes of the causes present (none when nothing keeps memory from
    /// huge pages).
    pub verdict: Verdict,
    pub reasons: Vec<ReasonEntry>,
    /// VMAs outside the reasons' deciding counts (not anonymous memory).
    pub non_anonymous: NonAnonymous,
    pub process: ProcessFacts,
    pub vmas: Vec<VmaEntry>,
    pub faults: FaultFacts,
    pub system: SystemFacts,
    pub live: LiveFacts,
    pub collapse: CollapseFacts,
    /// Per-size THP (empty before 6.8, which has only the PMD size).
    pub sizes: Vec<SizeFacts>,
    pub kernel: KernelFacts,
    pub notes: Vec<String>,
}

loss_kinds! {
    /// What the kernel side could not record during the live window (all zero when nothing was
    /// traced): the `lost_events` line, and the text's `lost` row.
    pub enum Loss {
        /// Allow-checks not counted by key: the check map was full.
        AllowChecks => "allow_checks", "allow-checks not counted by key (check map full)",
        /// Faults counted in the total but not placed in their 2 MiB range: the fault map was
        /// full.
        FaultRanges => "fault_ranges", "faults not placed in their range (fault map full)",
        /// prctl calls not reported: the ring buffer was full.
        PrctlEvents => "prctl_events", "prctl calls (ring buffer full)",
    }
}

pub type LostEvents = lost::LostEvents<Loss>;

/// The ledger of a live window, from its kernel counters.
pub fn lost_events(live: &LiveFacts) -> LostEvents {
    LostEvents::from_fn(|kind| {
        Some(live.counters.get(match kind {
            Loss::AllowChecks => Counter::CheckMapFull,
            Loss::FaultRanges => Counter::FaultMapFull,
            Loss::PrctlEvents => Counter::PrctlLost,
        }))
    })
}

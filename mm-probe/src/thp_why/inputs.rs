//! What the judgement is given: the facts gathered from /proc, /sys and the kernel programs, and
//! the prctl calls caught live read from them. Below every part of the judgement (`decoder`,
//! `collapse`, `per_size`, `rank`, `verdict` and `judge` over them), which all read it.

use std::collections::BTreeMap;

use mm_probe_common::thp::{PrctlEvent, ThpCheckKey};

use super::{
    ancestry::{Ancestor, SetBy},
    checks::AllowCheck,
    procfs::{Mount, Vma},
    reasons::{DisableMode, ModeSource},
    report::{Counters, PrctlCall, PrctlEffect, Relation, StoppedBy},
    scan_result::ScanResults,
    sysfs::SystemPolicy,
};
use crate::{
    kernel::{layout::ThpDisableBits, process::comm_text},
    probes::Plan,
};

/// prctl arg3 flag of 6.18 (uapi prctl.h).
const PR_THP_DISABLE_EXCEPT_ADVISED: u64 = 1 << 1;

/// How the target's THP-disable mode was learned.
#[derive(Clone, Debug)]
pub struct DisableFacts {
    pub mode: Option<DisableMode>,
    pub source: ModeSource,
    pub mm_flags: Option<u64>,
    pub status_thp_enabled: Option<bool>,
}

/// The live run's raw material.
pub struct LiveInput {
    pub plan: Plan,
    pub checks: Vec<(ThpCheckKey, u64)>,
    pub fault_ranges: Vec<(u64, u64)>,
    pub counters: Counters,
    /// Collapse scan results on the target's mm: (`collapse_slot`, count).
    pub collapse: Vec<(u32, u64)>,
    pub duration_ns: u64,
    pub stopped_by: StoppedBy,
}

/// Everything `judge::build` needs.
pub struct Inputs {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub kernel_release: String,
    pub allow_check: AllowCheck,
    pub bits: ThpDisableBits,
    /// The sysfs policy at the end of the run (judged) and at its start (for counter deltas).
    pub policy: SystemPolicy,
    pub policy_start: SystemPolicy,
    pub policy_changed: bool,
    /// This kernel's names of khugepaged's scan results.
    pub scan_results: ScanResults,
    pub vmstat_start: BTreeMap<String, u64>,
    pub vmstat_end: BTreeMap<String, u64>,
    /// smaps at the start of the run (for AnonHugePages deltas) and at the end (judged).
    pub vmas_start: Vec<Vma>,
    pub vmas_end: Vec<Vma>,
    pub mounts: Vec<Mount>,
    pub disable: DisableFacts,
    pub ancestors: Vec<Ancestor>,
    pub set_by: Option<SetBy>,
    pub prctl_events: Vec<PrctlEvent>,
    pub live: Option<LiveInput>,
    /// Why there is no live part, when there is none.
    pub live_skipped: Option<String>,
    pub notes: Vec<String>,
}

fn prctl_effect(event: &PrctlEvent) -> PrctlEffect {
    if event.arg2 == 0 {
        PrctlEffect::Enable
    } else if event.arg3 & PR_THP_DISABLE_EXCEPT_ADVISED != 0 {
        PrctlEffect::DisableExceptAdvised
    } else {
        PrctlEffect::Disable
    }
}

pub(super) fn prctl_calls(input: &Inputs) -> Vec<PrctlCall> {
    input
        .prctl_events
        .iter()
        .map(|e| PrctlCall {
            pid: e.pid,
            tgid: e.tgid,
            comm: comm_text(&e.comm),
            arg2: e.arg2,
            arg3: e.arg3,
            effect: prctl_effect(e),
            relation: if e.tgid == input.pid {
                Relation::Target
            } else if input.ancestors.iter().any(|a| a.pid == e.tgid) {
                Relation::Ancestor
            } else {
                Relation::Other
            },
        })
        .collect()
}

//! The kernel hooks retry-storm uses, best first, what an attach plan of them lets it see, and
//! the settings its programs are loaded with.
//! None of these functions has a tracepoint upstream (no `mmu_notifier:*` events from 5.15 to
//! 6.18: docs/kernel-facts.md, "MMU-notifier invalidations"), so each has a fentry/fexit candidate and a kprobe/kretprobe fallback; KVM's own
//! tracepoints add the secondary-MMU view where kvm is loaded.

use mm_probe_common::{hmm as names, layout as layout_names};

use super::report::{Observability, Statement};
use crate::{
    cause::probes as cause,
    function_probe,
    kernel::{Kernel, layout::Layout},
    probes::{GlobalValue, LogicalProbe, Plan, Target},
    tracepoint_probe,
};

const HMM_RANGE_FAULT: &[Target] = &[Target { name: "hmm_range_fault", kernels: "5.8+, CONFIG_HMM_MIRROR" }];
const READ_BEGIN: &[Target] = &[Target { name: "mmu_interval_read_begin", kernels: "5.10+, CONFIG_MMU_NOTIFIER" }];
const NOTIFIER_REMOVE: &[Target] =
    &[Target { name: "mmu_interval_notifier_remove", kernels: "5.10+, CONFIG_MMU_NOTIFIER" }];
const RANGE_START: &[Target] =
    &[Target { name: "__mmu_notifier_invalidate_range_start", kernels: "all, CONFIG_MMU_NOTIFIER" }];
const RANGE_END: &[Target] = &[Target {
    name: "__mmu_notifier_invalidate_range_end",
    kernels: "all; (range, only_end) up to 6.5, (range) from 6.6 — only the range is read",
}];

/// Walk probe name, as the plan and the tests refer to it.
pub const WALK_PROBE: &str = "hmm_range_fault walk";
pub const READ_BEGIN_PROBE: &str = "mmu_interval_read_begin";
pub const REMOVE_PROBE: &str = "mmu_interval_notifier_remove";
pub const INVALIDATE_START_PROBE: &str = "invalidate_range_start";
pub const INVALIDATE_END_PROBE: &str = "invalidate_range_end";
pub const KVM_UNMAP_PROBE: &str = "kvm_unmap_hva_range";
pub const KVM_AGE_PROBE: &str = "kvm_age_hva";

pub const WALK: LogicalProbe = function_probe!(
    WALK_PROBE, "every mirror walk: duration, result (-EBUSY = retry), range, notifier", HMM_RANGE_FAULT;
    Fentry "hmm_fault_entry", Fexit "hmm_fault_exit" | Kprobe "hmm_fault_kprobe", Kretprobe "hmm_fault_kretprobe"
);

pub const READ_BEGINS: LogicalProbe = function_probe!(
    READ_BEGIN_PROBE,
    "sequence starts per notifier and process (storms stay visible where the retry moves inside the kernel), and the start of each walk's invalidation window",
    READ_BEGIN;
    Fentry "read_begin_fentry" | Kprobe "read_begin_kprobe"
);

pub const REMOVES: LogicalProbe = function_probe!(
    REMOVE_PROBE, "a driver dropping a notifier: a retry loop still failing at that point gave up", NOTIFIER_REMOVE;
    Fentry "notifier_remove_fentry" | Kprobe "notifier_remove_kprobe"
);

pub const INVALIDATE_START: LogicalProbe = function_probe!(
    INVALIDATE_START_PROBE,
    "every invalidation of a mirrored mm: range, event (UNMAP, CLEAR, …), who invalidated, time in the invalidate callbacks",
    RANGE_START;
    Fentry "invalidate_start_fentry", Fexit "invalidate_start_fexit"
        | Kprobe "invalidate_start_kprobe", Kretprobe "invalidate_start_kretprobe"
);

pub const INVALIDATE_END: LogicalProbe = function_probe!(
    INVALIDATE_END_PROBE, "how long each invalidation held its range (read_begin on it waits that long)", RANGE_END;
    Fentry "invalidate_end_fentry" | Kprobe "invalidate_end_kprobe"
);

pub const KVM_UNMAP: LogicalProbe = tracepoint_probe!(
    KVM_UNMAP_PROBE, "KVM secondary-MMU unmaps of a VMM's memory (kvm.ko loaded)";
    "kvm:kvm_unmap_hva_range" on "KVM with MMU notifiers, kvm.ko loaded" => raw "kvm_unmap_hva_range_raw" | "kvm_unmap_hva_range"
);

pub const KVM_AGE: LogicalProbe = tracepoint_probe!(
    KVM_AGE_PROBE, "KVM secondary-MMU aging (clear_young) of a VMM's memory";
    "kvm:kvm_age_hva" on "KVM with MMU notifiers, kvm.ko loaded" => raw "kvm_age_hva_raw" | "kvm_age_hva"
);

/// In attach order: the cause brackets before the invalidations they classify, then the walk
/// and read_begin probes, which mark mms as mirrored, before the invalidation probes, which
/// filter on it.
const ALL: [LogicalProbe; 15] =
    cause::bracketed([WALK, READ_BEGINS, REMOVES, INVALIDATE_START, INVALIDATE_END, KVM_UNMAP, KVM_AGE]);
pub const PROBES: &[LogicalProbe] = &ALL;

/// Whether the kernel has hmm_range_fault at all (CONFIG_HMM_MIRROR), from BTF or kallsyms.
fn has_hmm(kernel: &Kernel) -> bool {
    kernel.btf().ok().and_then(|b| b.function_params("hmm_range_fault")).is_some()
        || kernel.kallsyms().ok().and_then(|k| k.resolve("hmm_range_fault")).is_some()
}

/// Whether both sequences the stale-sequence check compares have offsets on this kernel.
fn reads_sequences(kernel: &Kernel) -> bool {
    let Ok(btf) = kernel.btf() else { return false };
    [layout_names::HMM_RANGE_NOTIFIER_SEQ, layout_names::INTERVAL_NOTIFIER_INVALIDATE_SEQ]
        .iter()
        .all(|global| Layout::offset_in(&btf, global).is_some())
}

/// Reads the plan into what can be observed, with a plain sentence for each gap.
pub fn observability(kernel: &Kernel, plan: &Plan) -> Observability {
    let mut seen = Observability {
        walks: plan.is_attached(WALK_PROBE),
        read_begins: plan.is_attached(READ_BEGIN_PROBE),
        notifier_removes: plan.is_attached(REMOVE_PROBE),
        invalidations: plan.is_attached(INVALIDATE_START_PROBE),
        invalidation_ends: plan.is_attached(INVALIDATE_END_PROBE),
        kvm_unmap: plan.is_attached(KVM_UNMAP_PROBE),
        kvm_age: plan.is_attached(KVM_AGE_PROBE),
        sequences: false,
        statements: Vec::new(),
    };
    seen.sequences = seen.walks && reads_sequences(kernel);
    seen.statements.extend(cause::statements(plan, kernel));
    let why = |probe: &str| plan.get(probe).map(|p| p.why_unavailable());
    let note =
        |subject: &str, why: Option<String>, cost: &str| Statement { subject: subject.into(), why, cost: cost.into() };
    if !seen.walks {
        let subject = if has_hmm(kernel) {
            "hmm_range_fault is not observable: it exists on this kernel but could not be probed"
        } else {
            "hmm_range_fault is not observable: this kernel has no hmm_range_fault (not in its BTF nor in /proc/kallsyms: it is built without CONFIG_HMM_MIRROR), so nothing here can mirror memory through HMM"
        };
        let cost = "retry rates, timeouts, retry loops and walk latency cannot be measured here.";
        seen.statements.push(note(subject, why(WALK_PROBE), cost));
    }
    if !seen.read_begins && seen.walks {
        seen.statements.push(note(
            "mmu_interval_read_begin is not observable",
            why(READ_BEGIN_PROBE),
            "walk windows start at walk entry and sequence starts are not counted.",
        ));
    }
    if seen.walks && !seen.sequences {
        seen.statements.push(note(
            "the walks' sequences are not readable",
            Some("hmm_range.notifier_seq or mmu_interval_notifier.invalidate_seq is not in this kernel's BTF".into()),
            "retries that cannot succeed (a stale sequence) cannot be told from live collisions.",
        ));
    }
    if !seen.notifier_removes && seen.walks {
        seen.statements.push(note(
            "mmu_interval_notifier_remove is not observable",
            why(REMOVE_PROBE),
            "a retry loop that gives up before --timeout is seen only if it ran past --timeout.",
        ));
    }
    if !seen.invalidations {
        seen.statements.push(note(
            "MMU-notifier invalidations are not observable",
            why(INVALIDATE_START_PROBE),
            "retry_rate per invalidation, invalidate_freq, invalidators and overlaps cannot be measured.",
        ));
    } else if !seen.walks && !seen.read_begins {
        // Only mms seen mirroring are watched, and nothing can see them mirror here.
        seen.invalidations = false;
        seen.statements.push(note(
            "MMU-notifier invalidations are not watched",
            None,
            "they are attributed to mirrored memory, which cannot be recognised without the walk or read_begin probes.",
        ));
    }
    if seen.invalidations && !seen.invalidation_ends {
        seen.statements.push(note(
            "__mmu_notifier_invalidate_range_end is not observable",
            why(INVALIDATE_END_PROBE),
            "invalidation windows are not measured.",
        ));
    }
    if !seen.kvm_unmap && !seen.kvm_age {
        seen.statements.push(note(
            "KVM's kvm_unmap_hva_range/kvm_age_hva tracepoints are not available",
            why(KVM_UNMAP_PROBE),
            "KVM's secondary-MMU unmaps and aging are not counted.",
        ));
    }
    seen
}

/// Globals: whether only the `-p` processes are watched, and the cause classifier's.
pub fn settings(kernel: &Kernel, pids: &[u32]) -> Vec<(&'static str, GlobalValue)> {
    let mut settings = vec![(names::FILTER_TGIDS, GlobalValue::U32(u32::from(!pids.is_empty())))];
    settings.extend(cause::settings(kernel));
    settings
}

//! The kernel hooks thp-why uses, best first.

use aya::Ebpf;

use super::checks::AllowCheck;
use crate::{
    function_probe,
    kernel::Kernel,
    probes::{
        AttachFailure, Attempt, Candidate, Hook, LogicalProbe, Mechanism, Outcome, Plan, Planner, ProbePlan, Target,
    },
    tracepoint_probe,
};

/// The THP allow-check: `hugepage_vma_check` (6.0–6.7), `__thp_vma_allowable_orders` (6.8+).
const ALLOW_CHECK_FUNCTIONS: &[Target] = &[
    Target { name: "__thp_vma_allowable_orders", kernels: "6.8+" },
    Target { name: "hugepage_vma_check", kernels: "6.0-6.7" },
];

pub const ALLOW_CHECK: LogicalProbe = function_probe!(
    "THP allow-check", "live count of THP checks on the target's memory and the reason for each denial", ALLOW_CHECK_FUNCTIONS;
    Fexit "thp_allowable_exit" | Kprobe "thp_allowable_entry", Kretprobe "thp_allowable_return"
);

pub const PAGE_FAULTS: LogicalProbe = LogicalProbe {
    name: "user page faults",
    purpose: "the target's page faults during the run",
    candidates: &[
        // The BTF tracepoint costs each fault on the machine less than the classic one, which
        // fills a trace record before the program runs.
        Candidate {
            hooks: &[Hook { mechanism: Mechanism::BtfTracepoint, program: "thp_page_fault_user_btf" }],
            targets: &[Target { name: "page_fault_user", kernels: "x86 with BTF" }],
        },
        Candidate {
            hooks: &[Hook { mechanism: Mechanism::Tracepoint, program: "thp_page_fault_user" }],
            targets: &[Target { name: "exceptions:page_fault_user", kernels: "x86, 3.13+" }],
        },
    ],
};

pub const PRCTL: LogicalProbe = tracepoint_probe!(
    "prctl(PR_SET_THP_DISABLE)", "catching processes that disable THP while the tool runs";
    "syscalls:sys_enter_prctl" on "CONFIG_FTRACE_SYSCALLS" => "thp_prctl_enter"
);

pub const MMAP_LOCK: LogicalProbe = tracepoint_probe!(
    "mmap_lock",
    "reading a process's mm->flags from the kernel (the 6.18 except-advised mode, which \
     /proc/PID/status hides) and learning the target's mm while it sleeps";
    "mmap_lock:mmap_lock_start_locking" on "5.10+" => "thp_mmap_lock"
);

pub const KHUGEPAGED_SCAN: LogicalProbe = tracepoint_probe!(
    "khugepaged scan",
    "the result of every collapse scan of the target's anonymous memory (khugepaged or MADV_COLLAPSE)";
    "huge_memory:mm_khugepaged_scan_pmd" on "CONFIG_TRANSPARENT_HUGEPAGE" => "thp_scan_pmd"
);

pub const KHUGEPAGED_SCAN_FILE: LogicalProbe = tracepoint_probe!(
    "khugepaged file scan",
    "the result of every collapse scan of the target's file and shmem memory";
    "huge_memory:mm_khugepaged_scan_file" on "6.2+ with CONFIG_TRANSPARENT_HUGEPAGE" => "thp_scan_file"
);

pub const PROBES: &[LogicalProbe] =
    &[ALLOW_CHECK, PAGE_FAULTS, PRCTL, MMAP_LOCK, KHUGEPAGED_SCAN, KHUGEPAGED_SCAN_FILE];

/// Attaches `catalog`, except the allow-check where its calls cannot be counted: that probe is
/// not tried (a kprobe on 5.x's two-argument hugepage_vma_check would decode garbage) and the
/// plan says why.
pub fn attach_catalog(kernel: &Kernel, ebpf: &mut Ebpf, catalog: &[LogicalProbe]) -> Plan {
    let Some(why) = AllowCheck::uncountable(kernel) else {
        return Planner::new(kernel).attach_all(ebpf, catalog);
    };
    let others: Vec<LogicalProbe> = catalog.iter().filter(|p| p.name != ALLOW_CHECK.name).copied().collect();
    let mut plan = Planner::new(kernel).attach_all(ebpf, &others);
    if others.len() < catalog.len() {
        let attempt = Attempt {
            mechanism: "fexit".into(),
            target: "hugepage_vma_check".into(),
            reason: AttachFailure::Other(why),
        };
        let untried = ProbePlan {
            probe: ALLOW_CHECK.name,
            purpose: ALLOW_CHECK.purpose,
            outcome: Outcome::Unavailable,
            failed_attempts: vec![attempt],
        };
        plan.probes.insert(0, untried);
    }
    plan
}

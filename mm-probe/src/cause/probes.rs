//! The tracepoints that bracket a thread's mm work, and the globals the classifier needs.

use mm_probe_common::cause::{MADVISE_NR_GLOBAL, MIGRATE_REASON_OFFSET_GLOBAL, SYSCALL_FROM_REGS_GLOBAL};

use crate::{
    kernel::{Kernel, syscalls, tracefs},
    probes::{GlobalValue, LogicalProbe, Plan},
    report::statement::Statement,
    tracepoint_probe,
};

pub const MIGRATE_START: LogicalProbe = tracepoint_probe!(
    "cause_migrate_start", "which invalidations page migration makes (compaction, NUMA, mbind), with its reason";
    "migrate:mm_migrate_pages_start" on "5.9+" => "cause_migrate_start"
);
pub const MIGRATE_END: LogicalProbe = tracepoint_probe!(
    "cause_migrate_end", "where page migration ends";
    "migrate:mm_migrate_pages" on "all" => "cause_migrate_end"
);
pub const COMPACTION_BEGIN: LogicalProbe = tracepoint_probe!(
    "cause_compaction_begin", "which invalidations compaction makes";
    "compaction:mm_compaction_begin" on "all, CONFIG_COMPACTION" => "cause_compaction_begin"
);
pub const COMPACTION_END: LogicalProbe = tracepoint_probe!(
    "cause_compaction_end", "where compaction ends";
    "compaction:mm_compaction_end" on "all, CONFIG_COMPACTION" => "cause_compaction_end"
);
pub const DIRECT_RECLAIM_BEGIN: LogicalProbe = tracepoint_probe!(
    "cause_direct_reclaim_begin", "which invalidations an allocation's direct reclaim makes";
    "vmscan:mm_vmscan_direct_reclaim_begin" on "all" => "cause_direct_reclaim_begin"
);
pub const DIRECT_RECLAIM_END: LogicalProbe = tracepoint_probe!(
    "cause_direct_reclaim_end", "where direct reclaim ends";
    "vmscan:mm_vmscan_direct_reclaim_end" on "all" => "cause_direct_reclaim_end"
);
pub const CGROUP_RECLAIM_BEGIN: LogicalProbe = tracepoint_probe!(
    "cause_cgroup_reclaim_begin", "which invalidations a memory cgroup's reclaim (memory.high, memory.max) makes";
    "vmscan:mm_vmscan_memcg_reclaim_begin" on "all, CONFIG_MEMCG" => "cause_cgroup_reclaim_begin"
);
pub const CGROUP_RECLAIM_END: LogicalProbe = tracepoint_probe!(
    "cause_cgroup_reclaim_end", "where a memory cgroup's reclaim ends";
    "vmscan:mm_vmscan_memcg_reclaim_end" on "all, CONFIG_MEMCG" => "cause_cgroup_reclaim_end"
);

/// Ends before begins: a begin attached without its end would leave a thread marked inside
/// that work until its entry ages out.
pub const BRACKETS: [LogicalProbe; 8] = [
    MIGRATE_END,
    COMPACTION_END,
    DIRECT_RECLAIM_END,
    CGROUP_RECLAIM_END,
    MIGRATE_START,
    COMPACTION_BEGIN,
    DIRECT_RECLAIM_BEGIN,
    CGROUP_RECLAIM_BEGIN,
];

/// The classifier's globals: where migrate_pages' reason sits in its record, and whether the
/// saved user registers can be read to name a syscall.
pub fn settings(kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
    let reason = tracefs::root()
        .ok()
        .and_then(|root| tracefs::field_offset(&root, "migrate", "mm_migrate_pages_start", "reason"));
    let registers = syscalls::registers_unreadable(kernel).is_none();
    vec![
        (MIGRATE_REASON_OFFSET_GLOBAL, GlobalValue::U32(reason.unwrap_or(12))),
        (SYSCALL_FROM_REGS_GLOBAL, GlobalValue::U32(u32::from(registers))),
        (MADVISE_NR_GLOBAL, GlobalValue::U32(libc::SYS_madvise as u32)),
    ]
}

/// One sentence per bracket that could not be attached, and for unreadable registers: the
/// invalidations that work makes are then named by their thread instead.
pub fn statements(plan: &Plan, kernel: &Kernel) -> Vec<Statement> {
    let pairs = [
        (MIGRATE_START, MIGRATE_END, "page migration"),
        (COMPACTION_BEGIN, COMPACTION_END, "compaction"),
        (DIRECT_RECLAIM_BEGIN, DIRECT_RECLAIM_END, "direct reclaim"),
        (CGROUP_RECLAIM_BEGIN, CGROUP_RECLAIM_END, "a memory cgroup's reclaim"),
    ];
    let mut statements: Vec<Statement> = pairs
        .iter()
        .filter(|(begin, end, _)| !(plan.is_attached(begin.name) && plan.is_attached(end.name)))
        .map(|(begin, end, work)| {
            let failed = if plan.is_attached(begin.name) { end } else { begin };
            Statement {
                subject: format!("{work} is not bracketed"),
                why: plan.get(failed.name).map(|p| p.why_unavailable()),
                cost: format!("invalidations made by {work} are named by the thread that made them (its syscall, or kernel thread)."),
            }
        })
        .collect();
    if let Some(why) = syscalls::registers_unreadable(kernel) {
        statements.push(Statement {
            subject: "the invalidating syscall is not readable".into(),
            why: Some(why),
            cost: "a user thread's invalidations outside the bracketed work have cause unknown.".into(),
        });
    }
    statements
}

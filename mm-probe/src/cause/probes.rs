//! The tracepoints that bracket a thread's mm work, and the globals the classifier needs.

use anyhow::{Context as _, Result};
use aya::{Ebpf, maps::Array};
use mm_probe_common::cause::{
    ARMED_MAP, COUNTS_MAP, MADVISE_NR_GLOBAL, MIGRATE_REASON_ARG_GLOBAL, REASON_UNREAD, REFUSED_BEGINS,
    SYSCALL_FROM_REGS_GLOBAL, UNMATCHED_ENDS,
};

use crate::{
    collect::counters::percpu_sum,
    kernel::Kernel,
    probes::{GlobalValue, LogicalProbe, Plan},
    report::statement::Statement,
    tracepoint_probe,
};

/// Two raw-tracepoint probes around one kind of mm work: `$begin` on `category:begin_event`
/// named after its program, `$end` on the end event. Raw, as a classic tracepoint's perf event
/// waits for RCU grace periods when it is closed, 52 to 84 ms each on the host, one after another
/// (docs/kernel-facts.md#raw-tracepoints-close-at-once).
macro_rules! bracket {
    ($begin:ident, $end:ident, $work:literal, $kernels:literal:
     $begin_event:literal => $begin_program:literal, $end_event:literal => $end_program:literal) => {
        pub const $begin: LogicalProbe = tracepoint_probe!(
            $begin_program, concat!("which invalidations ", $work, " makes"); $begin_event on $kernels => raw $begin_program
        );
        pub const $end: LogicalProbe = tracepoint_probe!(
            $end_program, concat!("where ", $work, " ends"); $end_event on $kernels => raw $end_program
        );
    };
}

bracket!(MIGRATE_START, MIGRATE_END, "page migration (compaction, NUMA, mbind; with its reason)", "5.9+":
    "migrate:mm_migrate_pages_start" => "cause_migrate_start", "migrate:mm_migrate_pages" => "cause_migrate_end");
bracket!(COMPACTION_BEGIN, COMPACTION_END, "compaction", "all, CONFIG_COMPACTION":
    "compaction:mm_compaction_begin" => "cause_compaction_begin",
    "compaction:mm_compaction_end" => "cause_compaction_end");
bracket!(DIRECT_RECLAIM_BEGIN, DIRECT_RECLAIM_END, "an allocation's direct reclaim", "all":
    "vmscan:mm_vmscan_direct_reclaim_begin" => "cause_direct_reclaim_begin",
    "vmscan:mm_vmscan_direct_reclaim_end" => "cause_direct_reclaim_end");
bracket!(CGROUP_RECLAIM_BEGIN, CGROUP_RECLAIM_END, "a memory cgroup's reclaim (memory.high, memory.max)",
    "all, CONFIG_MEMCG":
    "vmscan:mm_vmscan_memcg_reclaim_begin" => "cause_cgroup_reclaim_begin",
    "vmscan:mm_vmscan_memcg_reclaim_end" => "cause_cgroup_reclaim_end");

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

/// `rest` after the brackets: a capability's probes in attach order, the brackets first so
/// that nothing is classified before the work around it can be seen.
pub const fn bracketed<const N: usize, const M: usize>(rest: [LogicalProbe; N]) -> [LogicalProbe; M] {
    assert!(M == BRACKETS.len() + N, "M must be the brackets plus the capability's probes");
    let mut all = [BRACKETS[0]; M];
    let mut i = 0;
    while i < M {
        all[i] = if i < BRACKETS.len() { BRACKETS[i] } else { rest[i - BRACKETS.len()] };
        i += 1;
    }
    all
}

/// Counts unmatched bracket ends from now on: called once every probe of the run is attached.
pub fn arm(ebpf: &mut Ebpf) -> Result<()> {
    let mut armed: Array<_, u32> = Array::try_from(ebpf.map_mut(ARMED_MAP).context("map CAUSE_ARMED missing")?)?;
    armed.set(0, 1, 0).context("arming the count of unmatched bracket ends")
}

/// Bracket ends that found their thread outside that work (cumulative): its entry was evicted
/// from the full table, or the work began before the probes attached. The invalidations made
/// in between were named by their thread instead of the work.
pub fn unmatched_ends(ebpf: &Ebpf) -> Result<u64> {
    percpu_sum(ebpf, COUNTS_MAP, UNMATCHED_ENDS)
}

/// Begins the brackets' table refused (cumulative): each one's end is then unmatched too.
pub fn refused_begins(ebpf: &Ebpf) -> Result<u64> {
    percpu_sum(ebpf, COUNTS_MAP, REFUSED_BEGINS)
}

/// The classifier's globals: whether the saved user registers can be read to name a syscall,
/// which syscall is madvise, and where migrate_pages' start event carries its reason.
pub fn settings(kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
    let registers = kernel.registers_unreadable().is_none();
    vec![
        (SYSCALL_FROM_REGS_GLOBAL, GlobalValue::U32(u32::from(registers))),
        (MADVISE_NR_GLOBAL, GlobalValue::U32(libc::SYS_madvise as u32)),
        (MIGRATE_REASON_ARG_GLOBAL, GlobalValue::U32(migrate_reason_arg(kernel))),
    ]
}

/// The event whose arguments say why pages migrate.
const MIGRATE_START_EVENT: &str = "mm_migrate_pages_start";

/// Which argument of [`MIGRATE_START_EVENT`] is its reason: the `int` of BTF's prototype
/// (`enum migrate_mode mode, int reason` from 5.9 to 7.2). Without BTF, the place those
/// kernels use; a prototype without one, [`REASON_UNREAD`].
fn migrate_reason_arg(kernel: &Kernel) -> u32 {
    match kernel.btf().ok().and_then(|btf| btf.tracepoint_args(MIGRATE_START_EVENT)) {
        Some(args) => reason_place(&args),
        None => 1,
    }
}

fn reason_place(args: &[String]) -> u32 {
    args.iter()
        .position(|a| a == "int")
        .and_then(|i| u32::try_from(i).ok())
        .filter(|&i| i <= 2)
        .unwrap_or(REASON_UNREAD)
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
    if plan.is_attached(MIGRATE_START.name) && migrate_reason_arg(kernel) == REASON_UNREAD {
        statements.push(Statement {
            subject: "a migration's reason is not readable".into(),
            why: Some(format!("this kernel's {MIGRATE_START_EVENT} has no int argument (BTF)")),
            cost: "migrations are named without their reason: compaction's and NUMA balancing's are not told apart."
                .into(),
        });
    }
    if let Some(why) = kernel.registers_unreadable() {
        statements.push(Statement {
            subject: "the invalidating syscall is not readable".into(),
            why: Some(why),
            cost: "a user thread's invalidations outside the bracketed work have cause unknown.".into(),
        });
    }
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_int_of_the_events_prototype() {
        let args = |types: &[&str]| types.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(reason_place(&args(&["enum migrate_mode", "int"])), 1);
        assert_eq!(reason_place(&args(&["int", "enum migrate_mode"])), 0);
        assert_eq!(reason_place(&args(&["enum migrate_mode"])), REASON_UNREAD);
        assert_eq!(reason_place(&args(&["long", "long", "long", "int"])), REASON_UNREAD, "past what is read");
    }

    /// This machine's kernel, where its BTF is readable: argument 1, as every kernel from 5.9.
    #[test]
    fn this_kernels_migration_reason_is_argument_one() {
        let Ok(btf) = crate::kernel::KernelBtf::from_sys_fs() else { return };
        let args = btf.tracepoint_args(MIGRATE_START_EVENT).expect("the event's prototype");
        assert_eq!(args, ["enum migrate_mode", "int"]);
        assert_eq!(reason_place(&args), 1);
        assert_eq!(btf.tracepoint_args("no_such_event"), None);
    }
}

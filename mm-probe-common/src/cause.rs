//! Why an invalidation happens: the class the kernel program decides from the invalidating
//! thread's context at the moment it happens, with one detail number. User space names them.

crate::slots! {
    /// What the invalidating thread was doing (decided in this order, first match wins); the
    /// names are the kernel side's, user space names the causes from them and their details.
    pub enum CauseClass {
        /// Not decided: the context could not be read (no saved registers on this kernel).
        Unknown => "unknown",
        /// Inside migrate_pages (migrate:mm_migrate_pages_start → mm_migrate_pages); detail:
        /// the `enum migrate_reason` (compaction, NUMA misplaced, mbind, demotion, …).
        Migration => "migration",
        /// Inside compact_zone (compaction:mm_compaction_begin → _end) but not migrating.
        Compaction => "compaction",
        /// Inside direct reclaim (vmscan:mm_vmscan_direct_reclaim_begin → _end).
        DirectReclaim => "direct_reclaim",
        /// Inside a memory cgroup's reclaim (vmscan:mm_vmscan_memcg_reclaim_begin → _end).
        CgroupReclaim => "cgroup_reclaim",
        /// kswapd (PF_KSWAPD), outside the brackets above.
        Kswapd => "kswapd",
        /// Another kernel thread (PF_KTHREAD): khugepaged, ksmd, kdamond, a kworker; its comm
        /// names it.
        KernelThread => "kernel_thread",
        /// A user thread inside a syscall; detail: the syscall number, arg: madvise's advice (0
        /// for other calls).
        Syscall => "syscall",
        /// A user thread outside any syscall: a fault (copy-on-write) or work run on the way
        /// back to user space (NUMA hinting's task_numa_work).
        UserContext => "user_context",
    }
}

impl CauseClass {
    pub fn from_raw(raw: u32) -> CauseClass {
        Self::ALL.get(raw as usize).copied().unwrap_or(CauseClass::Unknown)
    }
}

/// The cause of one invalidation as the kernel program records it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cause {
    /// A [`CauseClass`].
    pub class: u32,
    pub detail: u32,
    pub arg: u32,
    pub _pad: u32,
}

/// Bits of a thread's bracket state: which mm work it is inside.
pub const IN_MIGRATION: u32 = 1;
pub const IN_COMPACTION: u32 = 1 << 1;
pub const IN_DIRECT_RECLAIM: u32 = 1 << 2;
pub const IN_CGROUP_RECLAIM: u32 = 1 << 3;

/// task_struct.flags bits (include/linux/sched.h; unchanged 2.6 → 7.2, not in BTF: #defines).
pub const PF_KSWAPD: u32 = 0x0002_0000;
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// Global: madvise's syscall number on this architecture.
pub const MADVISE_NR_GLOBAL: &str = "CAUSE_MADVISE_NR";
/// Global: which argument of mm_migrate_pages_start is the migration's reason (BTF's prototype
/// of the event), or [`REASON_UNREAD`].
pub const MIGRATE_REASON_ARG_GLOBAL: &str = "CAUSE_MIGRATE_REASON_ARG";
/// [`MIGRATE_REASON_ARG_GLOBAL`] when the prototype has no `int` reason: a migration is then
/// counted with this as its reason, which names none.
pub const REASON_UNREAD: u32 = u32::MAX;
/// Global: 1 when the saved user registers can be read (bpf_task_pt_regs and BTF offsets).
pub const SYSCALL_FROM_REGS_GLOBAL: &str = "CAUSE_SYSCALL_FROM_REGS";
/// Per-CPU counts of the brackets' table: [`UNMATCHED_ENDS`] and [`REFUSED_BEGINS`].
pub const COUNTS_MAP: &str = "CAUSE_COUNTS";
/// Slot: bracket ends, once every probe of the run is attached, that found their thread outside
/// that work. Its entry was evicted (more threads inside brackets at once than the table
/// holds), the table refused its begin, or the work began before the begins were attached. The
/// invalidations made in between were classified without the bracket.
pub const UNMATCHED_ENDS: u32 = 0;
/// Slot: begins the table refused (its update failed: no free entry, or its lock busy).
pub const REFUSED_BEGINS: u32 = 1;
/// Array of one u32, set to 1 by user space once every probe of the run is attached: before
/// that, ends are not counted (under emulation attaching takes seconds, and a bracket that ends
/// while the rest attach misnames nothing).
pub const ARMED_MAP: &str = "CAUSE_ARMED";

/// Slots per class in a count of invalidations by cause: what the name of a cause depends on
/// beyond its class. A migration's reason (compaction and NUMA balancing move pages through
/// migrate_pages), and for a user thread outside any syscall the range's `enum
/// mmu_notifier_event` (a CLEAR is copy-on-write, a PROTECTION_VMA NUMA hinting). Both number
/// fewer than 16 in every kernel from 5.9 to 7.2; a larger value shares the last slot.
pub const CAUSE_SUBSLOTS: u32 = 16;
/// Slots of a count of invalidations by cause: every class's subslots.
pub const CAUSE_COUNT_SLOTS: u32 = CauseClass::COUNT * CAUSE_SUBSLOTS;

/// The slot `cause` is counted in, for a range of `event`: bounded by design, so a scrape
/// can name each count as the reports do without reading any record.
#[inline(always)]
pub fn count_slot(cause: &Cause, event: u32) -> u32 {
    let sub = if cause.class == CauseClass::Migration as u32 {
        cause.detail
    } else if cause.class == CauseClass::UserContext as u32 {
        event
    } else {
        0
    };
    cause.class.min(CauseClass::COUNT - 1) * CAUSE_SUBSLOTS + sub.min(CAUSE_SUBSLOTS - 1)
}

/// What [`count_slot`] kept of a cause: the cause (class and, for a migration, its reason),
/// and the event for a user thread outside any syscall.
pub fn counted_cause(slot: u32) -> (Cause, Option<u32>) {
    let (class, sub) = (slot / CAUSE_SUBSLOTS, slot % CAUSE_SUBSLOTS);
    let detail = if class == CauseClass::Migration as u32 { sub } else { 0 };
    let event = (class == CauseClass::UserContext as u32).then_some(sub);
    (Cause { class, detail, arg: 0, _pad: 0 }, event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counted_cause_keeps_what_its_name_depends_on() {
        let cause = |class: CauseClass, detail| Cause { class: class as u32, detail, arg: 7, _pad: 0 };
        let migration = cause(CauseClass::Migration, 5);
        assert_eq!(counted_cause(count_slot(&migration, 3)), (Cause { arg: 0, ..migration }, None));
        let fault = cause(CauseClass::UserContext, 0);
        assert_eq!(counted_cause(count_slot(&fault, 1)), (Cause { arg: 0, ..fault }, Some(1)));
        // A syscall's number and advice are details the count leaves to the reports.
        let madvise = cause(CauseClass::Syscall, 28);
        let syscall = Cause { class: CauseClass::Syscall as u32, ..Cause::default() };
        assert_eq!(counted_cause(count_slot(&madvise, 0)), (syscall, None));
        assert_eq!(count_slot(&cause(CauseClass::Migration, 99), 0), count_slot(&cause(CauseClass::Migration, 15), 0));
        let slots: Vec<u32> = CauseClass::ALL.iter().map(|&c| count_slot(&cause(c, 99), 99)).collect();
        assert!(slots.iter().all(|&s| s < CAUSE_COUNT_SLOTS), "{slots:?}");
    }
}

//! Why an invalidation happens, decided in the invalidating thread when it happens, for every
//! capability that counts invalidations.
//!
//! The mm's own tracepoints bracket the work that invalidates other processes' memory:
//! migrate_pages (with its reason: compaction, NUMA misplaced, mbind, demotion, …), compact_zone,
//! direct reclaim and a memory cgroup's reclaim. Each begin sets a bit in the thread's entry,
//! each end clears it, so classifying costs one lookup, and no stack is walked. Outside the
//! brackets the thread itself says it: kswapd and the other kernel threads by their task flags,
//! a user thread by the syscall in its saved user registers (orig_ax, with ax still -ENOSYS while
//! the call runs, as x86-64's entry code leaves it), and a user thread outside any syscall is in
//! a fault or in work run on its way back to user space.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_task, generated},
    macros::{map, raw_tracepoint},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use mm_probe_common::cause::{
    Cause, CauseClass, IN_CGROUP_RECLAIM, IN_COMPACTION, IN_DIRECT_RECLAIM, IN_MIGRATION, PF_KSWAPD, PF_KTHREAD,
    REASON_UNREAD, REFUSED_BEGINS, UNMATCHED_ENDS,
};

use crate::kernel::{bump, current_pid, offsets::*, read_at};

/// Threads inside a bracket at once: every CPU's few, with room for threads whose end was
/// missed (LRU, so such an entry ages out).
const THREADS: u32 = 8192;
/// -ENOSYS: x86-64's entry code stores it in pt_regs->ax before running a syscall.
const ENOSYS: i64 = -38;

#[unsafe(no_mangle)]
static CAUSE_SYSCALL_FROM_REGS: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CAUSE_MIGRATE_REASON_ARG: Global<u32> = Global::new(1);
/// madvise's number: only its third argument (the advice) is kept, so that other calls'
/// arguments do not split their rows.
#[unsafe(no_mangle)]
static CAUSE_MADVISE_NR: Global<u32> = Global::new(u32::MAX);

/// The mm work a thread is inside.
#[repr(C)]
#[derive(Clone, Copy)]
struct Brackets {
    bits: u32,
    migrate_reason: u32,
}

#[map]
static CAUSE_BRACKETS: LruHashMap<u32, Brackets> = LruHashMap::with_max_entries(THREADS, 0);

/// Ends whose begin was not in the table (an LRU eviction says nothing, so this is how the
/// entries it took are counted), and begins the table refused.
#[map]
static CAUSE_COUNTS: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);
/// Slot 0: 1 once every probe of the run is attached (ends are counted from then on).
#[map]
static CAUSE_ARMED: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
fn enter(bit: u32, migrate_reason: u32) -> u32 {
    let pid = current_pid();
    let now = match unsafe { CAUSE_BRACKETS.get(pid) } {
        Some(open) => Brackets {
            bits: open.bits | bit,
            migrate_reason: if bit == IN_MIGRATION { migrate_reason } else { open.migrate_reason },
        },
        None => Brackets { bits: bit, migrate_reason },
    };
    if CAUSE_BRACKETS.insert(pid, now, 0).is_err() {
        bump(&CAUSE_COUNTS, REFUSED_BEGINS, 1);
    }
    0
}

#[inline(always)]
fn leave(bit: u32) -> u32 {
    let pid = current_pid();
    match CAUSE_BRACKETS.get_ptr_mut(pid) {
        Some(open) if unsafe { (*open).bits } & bit != 0 => {
            let open = unsafe { &mut *open };
            open.bits &= !bit;
            if open.bits == 0 {
                let _ = CAUSE_BRACKETS.remove(pid);
            }
        }
        _ if CAUSE_ARMED.get(0).is_some_and(|armed| *armed != 0) => bump(&CAUSE_COUNTS, UNMATCHED_ENDS, 1),
        _ => {}
    }
    0
}

// Raw tracepoints: their links detach at once, where each classic tracepoint's perf event
// waits for RCU grace periods as it closes, one after another (52 to 84 ms each on the host:
// docs/kernel-facts.md#raw-tracepoints-close-at-once); their own recursion guard also keeps
// them running while a map syscall is preempted holding the CPU's bpf_prog_active. Only
// migrate_pages' start reads an argument.

/// mm_migrate_pages_start(enum migrate_mode mode, int reason) from 5.9, where the event came, to
/// 7.2: user space finds the reason's place in BTF's prototype of the event. A context offset
/// must be a constant, hence one read per place.
#[raw_tracepoint(tracepoint = "mm_migrate_pages_start")]
pub fn cause_migrate_start(ctx: RawTracePointContext) -> u32 {
    let reason = match CAUSE_MIGRATE_REASON_ARG.load() {
        0 => ctx.arg::<u64>(0) as u32,
        1 => ctx.arg::<u64>(1) as u32,
        2 => ctx.arg::<u64>(2) as u32,
        _ => REASON_UNREAD,
    };
    enter(IN_MIGRATION, reason)
}

/// One raw-tracepoint program that enters or leaves a bracket without reading its event.
macro_rules! bracket_program {
    ($program:ident, $event:literal, enter $bit:expr) => {
        #[raw_tracepoint(tracepoint = $event)]
        pub fn $program(_ctx: RawTracePointContext) -> u32 {
            enter($bit, 0)
        }
    };
    ($program:ident, $event:literal, leave $bit:expr) => {
        #[raw_tracepoint(tracepoint = $event)]
        pub fn $program(_ctx: RawTracePointContext) -> u32 {
            leave($bit)
        }
    };
}

bracket_program!(cause_migrate_end, "mm_migrate_pages", leave IN_MIGRATION);
bracket_program!(cause_compaction_begin, "mm_compaction_begin", enter IN_COMPACTION);
bracket_program!(cause_compaction_end, "mm_compaction_end", leave IN_COMPACTION);
bracket_program!(cause_direct_reclaim_begin, "mm_vmscan_direct_reclaim_begin", enter IN_DIRECT_RECLAIM);
bracket_program!(cause_direct_reclaim_end, "mm_vmscan_direct_reclaim_end", leave IN_DIRECT_RECLAIM);
bracket_program!(cause_cgroup_reclaim_begin, "mm_vmscan_memcg_reclaim_begin", enter IN_CGROUP_RECLAIM);
bracket_program!(cause_cgroup_reclaim_end, "mm_vmscan_memcg_reclaim_end", leave IN_CGROUP_RECLAIM);

#[inline(always)]
fn cause(class: CauseClass, detail: u32, arg: u32) -> Cause {
    Cause { class: class as u32, detail, arg, _pad: 0 }
}

/// The cause of an invalidation the current thread is making now.
#[inline(always)]
pub fn classify() -> Cause {
    let packed = cause_classify();
    let detail = (packed >> DETAIL_SHIFT) as u32 & DETAIL_MASK;
    Cause { class: packed as u32 & CLASS_MASK, detail, arg: (packed >> ARG_SHIFT) as u32, _pad: 0 }
}

/// A cause in one scalar, as a global function returns it: class in bits 0-7, detail (a
/// syscall number or a migrate reason) in 8-31, arg (madvise's advice) in 32-63.
const CLASS_MASK: u32 = 0xff;
const DETAIL_SHIFT: u32 = 8;
const DETAIL_MASK: u32 = 0xff_ffff;
const ARG_SHIFT: u32 = 32;

/// [`classify`]'s work as a global BPF function: the kernel verifies it once, not again in
/// every state of each of the four programs that call it.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn cause_classify() -> u64 {
    let cause = classified();
    u64::from(cause.class & CLASS_MASK)
        | u64::from(cause.detail & DETAIL_MASK) << DETAIL_SHIFT
        | u64::from(cause.arg) << ARG_SHIFT
}

#[inline(always)]
fn classified() -> Cause {
    if let Some(open) = unsafe { CAUSE_BRACKETS.get(current_pid()) } {
        let bits = open.bits;
        if bits & IN_MIGRATION != 0 {
            return cause(CauseClass::Migration, open.migrate_reason, 0);
        }
        if bits & IN_COMPACTION != 0 {
            return cause(CauseClass::Compaction, 0, 0);
        }
        if bits & IN_DIRECT_RECLAIM != 0 {
            return cause(CauseClass::DirectReclaim, 0, 0);
        }
        if bits & IN_CGROUP_RECLAIM != 0 {
            return cause(CauseClass::CgroupReclaim, 0, 0);
        }
    }
    let task = unsafe { bpf_get_current_task() };
    let flags: u32 = read_at(task, OFF_TASK_STRUCT_FLAGS.load()).unwrap_or(0);
    if flags & PF_KSWAPD != 0 {
        return cause(CauseClass::Kswapd, 0, 0);
    }
    if flags & PF_KTHREAD != 0 {
        return cause(CauseClass::KernelThread, 0, 0);
    }
    user_context()
}

/// A user thread's syscall from its saved registers, else a fault or return-to-user work.
#[inline(always)]
fn user_context() -> Cause {
    if CAUSE_SYSCALL_FROM_REGS.load() == 0 {
        return cause(CauseClass::Unknown, 0, 0);
    }
    let task = unsafe { generated::bpf_get_current_task_btf() };
    let regs = unsafe { generated::bpf_task_pt_regs(task) } as u64;
    let (Some(orig_ax), Some(ax)) =
        (read_at::<i64>(regs, OFF_PT_REGS_ORIG_AX.load()), read_at::<i64>(regs, OFF_PT_REGS_AX.load()))
    else {
        return cause(CauseClass::Unknown, 0, 0);
    };
    if orig_ax >= 0 && ax == ENOSYS {
        let nr = orig_ax as u32;
        let advice =
            if nr == CAUSE_MADVISE_NR.load() { read_at::<u64>(regs, OFF_PT_REGS_DX.load()).unwrap_or(0) } else { 0 };
        return cause(CauseClass::Syscall, nr, advice as u32);
    }
    cause(CauseClass::UserContext, 0, 0)
}

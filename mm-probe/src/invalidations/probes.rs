//! The kernel hooks invalidations uses and what an attach plan of them lets it see.
//!
//! Tracepoints carry the host-side view (KVM's unmap/age events, the lock contention events of
//! 5.19+), which works where function probes are refused; the notifier's own functions (no
//! tracepoint exists for them) and the subscribers' callbacks need kprobes or fentry.

use anyhow::Result;
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, PerCpuHashMap, PerCpuValues},
    programs::KProbe,
};
use mm_probe_common::invalidations::{self as names, CallbackKey, CallbackStats, ReturnKind};

use crate::{
    cause::probes as cause,
    function_probe,
    kernel::Kernel,
    probes::{LogicalProbe, Plan, Target},
    report::statement::Statement,
    tracepoint_probe,
};

pub const KVM_UNMAP_PROBE: &str = "kvm_unmap_hva_range";
pub const KVM_AGE_PROBE: &str = "kvm_age_hva";
pub const KVM_FAULT_PROBE: &str = "kvm_page_fault";
pub const KVM_WAKEUP_PROBE: &str = "kvm_vcpu_wakeup";
pub const CONTENTION_BEGIN_PROBE: &str = "contention_begin";
pub const CONTENTION_END_PROBE: &str = "contention_end";
pub const RANGE_START_PROBE: &str = "invalidate_range_start";
pub const RANGE_END_PROBE: &str = "invalidate_range_end";
pub const SUBSCRIPTIONS_PROBE: &str = "subscriptions";
pub const INTERVAL_BEGIN_PROBE: &str = "interval_read_begin";

const RANGE_START: &[Target] =
    &[Target { name: "__mmu_notifier_invalidate_range_start", kernels: "all, CONFIG_MMU_NOTIFIER" }];
const RANGE_END: &[Target] = &[Target {
    name: "__mmu_notifier_invalidate_range_end",
    kernels: "all; (range, only_end) up to 6.5, (range) from 6.6 — only the range is read",
}];

const READ_BEGIN: &[Target] = &[Target { name: "mmu_interval_read_begin", kernels: "5.10+, CONFIG_MMU_NOTIFIER" }];

pub const KVM_UNMAP: LogicalProbe = tracepoint_probe!(
    KVM_UNMAP_PROBE, "invalidations of a VM's memory (KVM's notifier), and each VM's mmu_lock";
    "kvm:kvm_unmap_hva_range" on "KVM with MMU notifiers" => raw "inv_kvm_unmap_raw" | "inv_kvm_unmap"
);

pub const KVM_AGE: LogicalProbe = tracepoint_probe!(
    KVM_AGE_PROBE, "reclaim's aging of a VM's memory (clear_young through KVM's notifier)";
    "kvm:kvm_age_hva" on "KVM with MMU notifiers" => raw "inv_kvm_age_raw" | "inv_kvm_age"
);

pub const KVM_FAULT: LogicalProbe = tracepoint_probe!(
    KVM_FAULT_PROBE, "the mmu_lock of VMs that fault before any invalidation names it";
    "kvm:kvm_page_fault" on "KVM on x86" => raw "inv_kvm_fault"
);

pub const KVM_WAKEUP: LogicalProbe = tracepoint_probe!(
    KVM_WAKEUP_PROBE, "idle VMs (their vCPUs wake at each guest tick), whose memory others' invalidations may be";
    "kvm:kvm_vcpu_wakeup" on "KVM" => raw "inv_kvm_wakeup"
);

pub const CONTENTION_BEGIN: LogicalProbe = tracepoint_probe!(
    CONTENTION_BEGIN_PROBE, "contended lock acquisitions: which lock, how taken, the waiter's stack";
    "lock:contention_begin" on "5.19+" => raw "inv_contention_begin"
);

pub const CONTENTION_END: LogicalProbe = tracepoint_probe!(
    CONTENTION_END_PROBE, "how long each contended acquisition waited";
    "lock:contention_end" on "5.19+" => raw "inv_contention_end"
);

pub const RANGE_STARTS: LogicalProbe = function_probe!(
    RANGE_START_PROBE, "every invalidation of an mm with subscribers: event, size, invalidator", RANGE_START;
    Fentry "inv_range_start_fentry" | Kprobe "inv_range_start_kprobe"
);

pub const RANGE_ENDS: LogicalProbe = function_probe!(
    RANGE_END_PROBE, "how long each invalidation lasted, start to end", RANGE_END;
    Fentry "inv_range_end_fentry" | Kprobe "inv_range_end_kprobe"
);

pub const CLEAR_YOUNG_PROBE: &str = "clear_young";
pub const CLEAR_FLUSH_YOUNG_PROBE: &str = "clear_flush_young";

const CLEAR_YOUNG: &[Target] = &[Target { name: "__mmu_notifier_clear_young", kernels: "all, CONFIG_MMU_NOTIFIER" }];
const CLEAR_FLUSH_YOUNG: &[Target] =
    &[Target { name: "__mmu_notifier_clear_flush_young", kernels: "all, CONFIG_MMU_NOTIFIER" }];

pub const CLEAR_YOUNGS: LogicalProbe = function_probe!(
    CLEAR_YOUNG_PROBE, "whose memory reclaim's aging (kdamond, kswapd) ages, for KVM's kvm_age_hva", CLEAR_YOUNG;
    Fentry "inv_clear_young_fentry" | Kprobe "inv_clear_young_kprobe"
);

pub const CLEAR_FLUSH_YOUNGS: LogicalProbe = function_probe!(
    CLEAR_FLUSH_YOUNG_PROBE, "whose memory the rmap walk ages, for KVM's kvm_age_hva", CLEAR_FLUSH_YOUNG;
    Fentry "inv_clear_flush_young_fentry" | Kprobe "inv_clear_flush_young_kprobe"
);

pub const SUBSCRIPTIONS: LogicalProbe = function_probe!(
    SUBSCRIPTIONS_PROBE, "the callbacks of a watched mm's subscribers (its subscription list), to time them", RANGE_START;
    Fentry "inv_subscriptions_fentry" | Kprobe "inv_subscriptions_kprobe"
);

pub const INTERVAL_BEGIN: LogicalProbe = function_probe!(
    INTERVAL_BEGIN_PROBE, "the callbacks of interval notifiers (HMM, userptr, ODP drivers), to time them", READ_BEGIN;
    Fentry "inv_interval_begin_fentry" | Kprobe "inv_interval_begin_kprobe"
);

/// In attach order: the cause brackets before anything they classify (ends before begins),
/// then the KVM probes, which learn the locks the contention probes name.
const ALL: [LogicalProbe; 20] = cause::bracketed([
    KVM_UNMAP,
    KVM_AGE,
    KVM_FAULT,
    KVM_WAKEUP,
    RANGE_STARTS,
    RANGE_ENDS,
    CLEAR_YOUNGS,
    CLEAR_FLUSH_YOUNGS,
    CONTENTION_BEGIN,
    CONTENTION_END,
    SUBSCRIPTIONS,
    INTERVAL_BEGIN,
]);
pub const PROBES: &[LogicalProbe] = &ALL;

/// The KVM callback whose address identifies a KVM subscription (the ops table itself is a
/// data symbol, which kernels without CONFIG_KALLSYMS_ALL do not list).
pub const KVM_RANGE_START: &str = "kvm_mmu_notifier_invalidate_range_start";

/// A known subscriber callback: the function, which driver it belongs to, how it refuses.
#[derive(Clone, Copy, Debug)]
pub struct KnownCallback {
    pub function: &'static str,
    pub subscriber: &'static str,
    pub returns: ReturnKind,
}

const fn callback(function: &'static str, subscriber: &'static str, returns: ReturnKind) -> KnownCallback {
    KnownCallback { function, subscriber, returns }
}

/// Friendly names of the callbacks of well-known subscribers. Which callbacks are timed comes
/// from the kernel (callbacks.rs); these only name them, and those this kernel already has are
/// attached at start, so that their first calls are not lost before discovery finds them. All
/// take the range as their second argument (mmu_notifier_ops.invalidate_range_start/_end,
/// mmu_interval_notifier_ops.invalidate).
pub const CALLBACKS: &[KnownCallback] = &[
    callback(KVM_RANGE_START, "kvm", ReturnKind::Int),
    callback("kvm_mmu_notifier_invalidate_range_end", "kvm", ReturnKind::Void),
    callback("mirror_invalidate", "hmm_mirror", ReturnKind::Bool),
    callback("amdgpu_hmm_invalidate_gfx", "amdgpu", ReturnKind::Bool),
    callback("amdgpu_hmm_invalidate_hsa", "amdgpu", ReturnKind::Bool),
    callback("svm_range_cpu_invalidate_pagetables", "amdkfd", ReturnKind::Bool),
    callback("nouveau_svmm_invalidate_range_start", "nouveau", ReturnKind::Int),
    callback("nouveau_svm_range_invalidate", "nouveau", ReturnKind::Bool),
    callback("drm_gpusvm_notifier_invalidate", "xe/drm_gpusvm", ReturnKind::Bool),
    callback("vma_userptr_invalidate", "xe", ReturnKind::Bool),
    callback("i915_gem_userptr_invalidate", "i915", ReturnKind::Bool),
    callback("mlx5_ib_invalidate_range", "ib_umem_odp/mlx5", ReturnKind::Bool),
    callback("gntdev_invalidate", "xen gntdev", ReturnKind::Bool),
];

/// The friendly subscriber name of a callback function, if known.
pub fn subscriber_of(function: &str) -> Option<&'static str> {
    CALLBACKS.iter().find(|c| c.function == function).map(|c| c.subscriber)
}

/// A callback's subscriber: its friendly name, else the function and its module
/// (`my_invalidate [mymod]`), as kernel stack traces write them.
pub fn subscriber_name(function: &str, module: Option<&str>) -> String {
    match (subscriber_of(function), module) {
        (Some(friendly), _) => friendly.to_string(),
        (None, Some(module)) => format!("{function} [{module}]"),
        (None, None) => function.to_string(),
    }
}

/// Callback attachment at start: which known callbacks are timed, and what else can be.
#[derive(Clone, Debug, Default)]
pub struct CallbackPlan {
    pub timed: Vec<&'static str>,
    /// Their addresses (kallsyms), not to be attached again when discovery finds them.
    pub addresses: Vec<u64>,
    /// Kprobes work and kallsyms is readable: any function found can be timed.
    pub can_attach: bool,
    /// The discovery hooks are attached (set by the caller that polls what they find).
    pub discovery: bool,
    /// Why no callback can be timed, or why the known ones could not.
    pub why_not: Option<String>,
}

impl CallbackPlan {
    /// Callbacks are timed now, or will be as their subscribers are found.
    pub fn observable(&self) -> bool {
        !self.timed.is_empty() || (self.can_attach && self.discovery)
    }

    /// Why callbacks cannot be timed (`None` when they can).
    pub fn why_unobservable(&self) -> Option<String> {
        if self.observable() {
            return None;
        }
        Some(self.why_not.clone().unwrap_or_else(|| {
            "no subscriber callback mm-probe knows by name is in this kernel's symbols, and the hooks that find the others are not attached".into()
        }))
    }
}

const CALLBACK_ENTRY: &str = "inv_callback_kprobe";
const CALLBACK_RETURN: &str = "inv_callback_kretprobe";

/// Whether this kernel lets perf attach kprobes at all.
pub fn kprobes_available() -> bool {
    std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists()
}

/// Attaches the callback pair to every known callback this kernel has (one program, many
/// attach points). Kprobes only: a trampoline is one program per function.
pub fn attach_callbacks(kernel: &Kernel, ebpf: &mut Ebpf) -> CallbackPlan {
    if !kprobes_available() {
        return CallbackPlan { why_not: Some("this kernel has no kprobes".into()), ..CallbackPlan::default() };
    }
    if let Some(why) = runtime_allocation_unsafe(kernel) {
        return CallbackPlan { why_not: Some(why), ..CallbackPlan::default() };
    }
    let Ok(kallsyms) = kernel.kallsyms() else {
        return CallbackPlan { why_not: Some("/proc/kallsyms is unreadable".into()), ..CallbackPlan::default() };
    };
    let mut plan = CallbackPlan { can_attach: true, ..CallbackPlan::default() };
    let mut failures = Vec::new();
    for known in CALLBACKS.iter().filter(|c| kallsyms.resolve(c.function).is_some()) {
        let Some(address) = kallsyms.address_of(known.function) else { continue };
        match attach_timing(ebpf, known.function, address, known.returns) {
            Ok(()) => {
                plan.timed.push(known.function);
                plan.addresses.push(address);
            }
            Err(error) => failures.push(format!("{}: {error:#}", known.function)),
        }
    }
    if !failures.is_empty() {
        plan.why_not = Some(failures.join("; "));
    }
    plan
}

/// Why the timing kprobes must not load here. Their per-callback table is allocated as calls
/// come (a preallocated one would reserve several KiB per CPU for every possible callback), and
/// a kernel without the BPF memory allocator (`struct bpf_mem_alloc` in BTF, 6.1+) refuses such
/// a map in a kprobe program when it is PREEMPT_RT, and otherwise loads it with a kernel
/// WARNING, which panic_on_warn turns into a crash.
pub fn runtime_allocation_unsafe(kernel: &Kernel) -> Option<String> {
    let safe = kernel.btf().is_ok_and(|btf| btf.has_type("bpf_mem_alloc"));
    (!safe).then(|| {
        "this kernel has no BPF memory allocator (6.1+): a kprobe with a run-time allocated map would raise a \
         kernel WARNING (refused on PREEMPT_RT), so callbacks are not timed"
            .into()
    })
}

/// Times `function` (at `address`), whose refusal is a `returns`.
pub fn attach_timing(ebpf: &mut Ebpf, function: &str, address: u64, returns: ReturnKind) -> Result<()> {
    set_return_kind(ebpf, address, returns)?;
    create_stats(ebpf, address)?;
    attach_one(ebpf, function)
}

/// Creates the callback's (zeroed) entry in the callbacks table from here, where allocating
/// may sleep. Created by its first call instead, the per-CPU value (several KiB) must be
/// allocated without sleeping, which can fail: in a 6.1 guest a new callback's first two calls
/// were lost so (counted as callbacks_map_full).
fn create_stats(ebpf: &mut Ebpf, address: u64) -> Result<()> {
    const BPF_NOEXIST: u64 = 1;
    let map = ebpf.map_mut(names::CALLBACKS_MAP).ok_or_else(|| anyhow::anyhow!("callbacks map missing"))?;
    let mut table: PerCpuHashMap<_, CallbackKey, CallbackStats> = PerCpuHashMap::try_from(map)?;
    let cpus = aya::util::nr_cpus().map_err(|(_, error)| error)?;
    // SAFETY: CallbackStats is plain integers, for which all zero bytes is a valid value.
    let zero: CallbackStats = unsafe { std::mem::zeroed() };
    let values = PerCpuValues::try_from(vec![zero; cpus])?;
    match table.insert(CallbackKey { ip: address }, values, BPF_NOEXIST) {
        Ok(()) => Ok(()),
        // Already there: attached before (an earlier run of the exporter, another name).
        Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn attach_one(ebpf: &mut Ebpf, function: &str) -> Result<()> {
    for name in [CALLBACK_ENTRY, CALLBACK_RETURN] {
        let program: &mut KProbe =
            ebpf.program_mut(name).ok_or_else(|| anyhow::anyhow!("{name} missing from the object"))?.try_into()?;
        if program.fd().is_err() {
            program.load()?;
        }
        program.attach(function, 0)?;
    }
    Ok(())
}

fn set_return_kind(ebpf: &mut Ebpf, address: u64, returns: ReturnKind) -> Result<()> {
    let map = ebpf.map_mut(names::CALLBACK_KINDS_MAP).ok_or_else(|| anyhow::anyhow!("callback kinds map missing"))?;
    let mut kinds: BpfHashMap<_, u64, u32> = BpfHashMap::try_from(map)?;
    kinds.insert(address, returns as u32, 0)?;
    Ok(())
}

/// A callback found but not timed, and why.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SkippedCallback {
    pub callback: String,
    pub module: Option<String>,
    /// The ops member it was found in (`mmu_notifier_ops.clear_young`).
    pub member: String,
    pub why: String,
}

/// What the plan lets the command see.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Observability {
    pub kvm_unmaps: bool,
    pub kvm_ages: bool,
    pub lock_waits: bool,
    pub range_starts: bool,
    pub range_ends: bool,
    pub callbacks: bool,
    /// Each VM's mmu_lock can be named (struct kvm in BTF, KVM's callback in kallsyms).
    pub kvm_lock_names: bool,
    pub statements: Vec<Statement>,
    /// Callbacks found in subscribers' ops whose prototype the timing program would misread.
    pub callbacks_skipped: Vec<SkippedCallback>,
}

/// Reads the plan into what can be observed, with a plain sentence for each gap.
pub fn observability(plan: &Plan, callbacks: &CallbackPlan, kvm_lock_names: bool, kernel: &Kernel) -> Observability {
    let mut seen = Observability {
        kvm_unmaps: plan.is_attached(KVM_UNMAP_PROBE),
        kvm_ages: plan.is_attached(KVM_AGE_PROBE),
        lock_waits: plan.is_attached(CONTENTION_BEGIN_PROBE) && plan.is_attached(CONTENTION_END_PROBE),
        range_starts: plan.is_attached(RANGE_START_PROBE),
        range_ends: plan.is_attached(RANGE_END_PROBE),
        callbacks: callbacks.observable(),
        kvm_lock_names,
        statements: Vec::new(),
        callbacks_skipped: Vec::new(),
    };
    seen.statements.extend(cause::statements(plan, kernel));
    let why = |probe: &str| plan.get(probe).map(|p| p.why_unavailable());
    let mut note = |subject: &str, why: Option<String>, cost: &str| {
        seen.statements.push(Statement { subject: subject.into(), why, cost: cost.into() })
    };
    if !plan.is_attached(RANGE_START_PROBE) {
        note(
            "__mmu_notifier_invalidate_range_start is not observable",
            why(RANGE_START_PROBE),
            "only KVM's invalidations are counted (its tracepoints), without their event or duration.",
        );
    } else if !plan.is_attached(RANGE_END_PROBE) {
        note(
            "__mmu_notifier_invalidate_range_end is not observable",
            why(RANGE_END_PROBE),
            "invalidation durations are not measured.",
        );
    }
    if !plan.is_attached(KVM_UNMAP_PROBE) {
        note(
            "KVM's kvm_unmap_hva_range tracepoint is not available",
            why(KVM_UNMAP_PROBE),
            "VMs' mmu_locks are named only from their page faults.",
        );
    }
    if !(plan.is_attached(CONTENTION_BEGIN_PROBE) && plan.is_attached(CONTENTION_END_PROBE)) {
        note(
            "lock contention is not observable",
            why(CONTENTION_BEGIN_PROBE).or_else(|| why(CONTENTION_END_PROBE)),
            "waits on kvm->mmu_lock and other locks during invalidations cannot be measured.",
        );
    }
    if !callbacks.observable() {
        note(
            "subscriber callbacks are not timed",
            callbacks.why_unobservable(),
            "per-subscriber callback time and amplification cannot be measured.",
        );
    }
    if !kvm_lock_names && plan.is_attached(KVM_UNMAP_PROBE) {
        note(
            "VMs' mmu_locks cannot be named",
            None,
            "struct kvm is not in this kernel's BTF (KVM built as a module), so its locks show as addresses.",
        );
    }
    seen
}

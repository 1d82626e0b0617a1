//! Names of the `Global` offsets user space resolves from the running kernel's BTF and injects
//! before load. Rust eBPF gets no CO-RE relocations, so every struct member a program reads goes
//! through one of these (see mm-probe's `kernel::layout`). The value `OFFSET_UNKNOWN` means the
//! member does not exist on this kernel and the program must not read it.

/// A member offset that could not be resolved on this kernel.
pub const OFFSET_UNKNOWN: u32 = u32::MAX;

pub const TASK_STRUCT_MM: &str = "OFF_TASK_STRUCT_MM";
pub const TASK_STRUCT_PID: &str = "OFF_TASK_STRUCT_PID";
pub const TASK_STRUCT_TGID: &str = "OFF_TASK_STRUCT_TGID";
pub const TASK_STRUCT_PRIO: &str = "OFF_TASK_STRUCT_PRIO";
pub const TASK_STRUCT_COMM: &str = "OFF_TASK_STRUCT_COMM";
pub const TASK_STRUCT_CPU: &str = "OFF_TASK_STRUCT_CPU";
pub const TASK_STRUCT_EXEC_RUNTIME: &str = "OFF_TASK_STRUCT_EXEC_RUNTIME";
pub const TASK_STRUCT_FLAGS: &str = "OFF_TASK_STRUCT_FLAGS";
pub const MM_STRUCT_FLAGS: &str = "OFF_MM_STRUCT_FLAGS";
pub const VMA_VM_MM: &str = "OFF_VMA_VM_MM";
pub const VMA_VM_FLAGS: &str = "OFF_VMA_VM_FLAGS";
pub const VMA_VM_START: &str = "OFF_VMA_VM_START";
pub const VMA_VM_END: &str = "OFF_VMA_VM_END";
pub const NOTIFIER_RANGE_MM: &str = "OFF_NOTIFIER_RANGE_MM";
pub const NOTIFIER_RANGE_START: &str = "OFF_NOTIFIER_RANGE_START";
pub const NOTIFIER_RANGE_END: &str = "OFF_NOTIFIER_RANGE_END";
pub const NOTIFIER_RANGE_EVENT: &str = "OFF_NOTIFIER_RANGE_EVENT";
pub const NOTIFIER_RANGE_FLAGS: &str = "OFF_NOTIFIER_RANGE_FLAGS";
pub const MM_NOTIFIER_SUBSCRIPTIONS: &str = "OFF_MM_NOTIFIER_SUBSCRIPTIONS";
pub const MM_MMAP_LOCK: &str = "OFF_MM_MMAP_LOCK";
pub const MM_OWNER: &str = "OFF_MM_OWNER";
pub const SUBSCRIPTIONS_LIST: &str = "OFF_SUBSCRIPTIONS_LIST";
pub const SUBSCRIPTIONS_INVALIDATE_SEQ: &str = "OFF_SUBSCRIPTIONS_INVALIDATE_SEQ";
pub const MMU_NOTIFIER_HLIST: &str = "OFF_MMU_NOTIFIER_HLIST";
pub const MMU_NOTIFIER_OPS: &str = "OFF_MMU_NOTIFIER_OPS";
pub const NOTIFIER_OPS_RANGE_START: &str = "OFF_NOTIFIER_OPS_RANGE_START";
/// `struct kvm` lives in vmlinux BTF when KVM is built in, in the kvm module's BTF otherwise.
pub const KVM_MMU_NOTIFIER: &str = "OFF_KVM_MMU_NOTIFIER";
pub const KVM_MMU_LOCK: &str = "OFF_KVM_MMU_LOCK";
pub const KVM_MEMSLOTS: &str = "OFF_KVM_MEMSLOTS";
pub const KVM_MEMSLOTS_HVA_ROOT: &str = "OFF_KVM_MEMSLOTS_HVA_ROOT";
pub const INTERVAL_NODE_RB: &str = "OFF_INTERVAL_NODE_RB";
pub const INTERVAL_NODE_START: &str = "OFF_INTERVAL_NODE_START";
pub const INTERVAL_NODE_LAST: &str = "OFF_INTERVAL_NODE_LAST";
pub const INTERVAL_NODE_SUBTREE_LAST: &str = "OFF_INTERVAL_NODE_SUBTREE_LAST";
pub const RB_NODE_RIGHT: &str = "OFF_RB_NODE_RIGHT";
pub const RB_NODE_LEFT: &str = "OFF_RB_NODE_LEFT";
pub const HMM_RANGE_NOTIFIER: &str = "OFF_HMM_RANGE_NOTIFIER";
pub const HMM_RANGE_START: &str = "OFF_HMM_RANGE_START";
pub const HMM_RANGE_END: &str = "OFF_HMM_RANGE_END";
pub const HMM_RANGE_NOTIFIER_SEQ: &str = "OFF_HMM_RANGE_NOTIFIER_SEQ";
pub const INTERVAL_NOTIFIER_MM: &str = "OFF_INTERVAL_NOTIFIER_MM";
pub const INTERVAL_NOTIFIER_START: &str = "OFF_INTERVAL_NOTIFIER_START";
pub const INTERVAL_NOTIFIER_LAST: &str = "OFF_INTERVAL_NOTIFIER_LAST";
pub const INTERVAL_NOTIFIER_OPS: &str = "OFF_INTERVAL_NOTIFIER_OPS";
pub const INTERVAL_NOTIFIER_INVALIDATE_SEQ: &str = "OFF_INTERVAL_NOTIFIER_INVALIDATE_SEQ";
pub const INTERVAL_OPS_INVALIDATE: &str = "OFF_INTERVAL_OPS_INVALIDATE";
/// A sleep timer: when it should fire, its callback (`hrtimer_wakeup` for a sleeper), and the
/// task a sleeper wakes (`struct hrtimer_sleeper` embeds its `struct hrtimer` first).
pub const HRTIMER_SOFTEXPIRES: &str = "OFF_HRTIMER_SOFTEXPIRES";
pub const HRTIMER_FUNCTION: &str = "OFF_HRTIMER_FUNCTION";
pub const HRTIMER_SLEEPER_TASK: &str = "OFF_HRTIMER_SLEEPER_TASK";
/// x86-64 saved user registers: the syscall number, -ENOSYS while the syscall runs, and
/// arguments 1-4 (the 4th is in r10, not rcx).
pub const PT_REGS_ORIG_AX: &str = "OFF_PT_REGS_ORIG_AX";
pub const PT_REGS_AX: &str = "OFF_PT_REGS_AX";
pub const PT_REGS_DI: &str = "OFF_PT_REGS_DI";
pub const PT_REGS_SI: &str = "OFF_PT_REGS_SI";
pub const PT_REGS_DX: &str = "OFF_PT_REGS_DX";
pub const PT_REGS_R10: &str = "OFF_PT_REGS_R10";

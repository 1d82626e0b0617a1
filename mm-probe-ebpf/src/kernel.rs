//! Reading kernel memory at offsets user space resolved from BTF, and small shared helpers.

use aya_ebpf::helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel};
use mm_probe_common::layout::OFFSET_UNKNOWN;

/// Reads a `T` at `base + offset`. `None` when the offset is unknown on this kernel or the read
/// faults. The mask keeps the verifier's view of the offset bounded.
#[inline(always)]
pub fn read_at<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 || offset == OFFSET_UNKNOWN {
        return None;
    }
    let addr = (base as *const u8).wrapping_add((offset & 0xffff) as usize);
    unsafe { bpf_probe_read_kernel(addr as *const T).ok() }
}

/// Reads a u64 at `base + offset` for a pointer walk; 0 when the read faults (the helper zeroes
/// its destination then) or the offset is unknown. No branch on the helper's result: in a
/// pointer walk each such branch multiplies the paths the verifier explores.
#[inline(always)]
pub fn read_or_zero(base: u64, offset: u32) -> u64 {
    // A constant from the layout table: the verifier drops whichever branch is dead.
    if offset == OFFSET_UNKNOWN {
        return 0;
    }
    let mut value: u64 = 0;
    let addr = (base as *const u8).wrapping_add((offset & 0xffff) as usize);
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_kernel((&mut value as *mut u64).cast(), 8, addr.cast());
    }
    value
}

/// Reads a `T` at `base + offset` with a plain load, for `base` the verifier knows as a BTF
/// pointer (a tp_btf or fentry argument). The offset comes from a frozen read-only global, so
/// the verifier sees a constant, checks the access against the kernel's BTF, and the JIT emits a
/// fault-tolerant load: a few cycles where `read_at` costs a helper call. `None` when the
/// member does not exist on this kernel (the verifier drops that branch as dead).
#[inline(always)]
pub fn btf_read<T: Copy>(base: u64, offset: u32) -> Option<T> {
    if offset == OFFSET_UNKNOWN {
        return None;
    }
    let addr = (base as *const u8).wrapping_add((offset & 0xffff) as usize);
    Some(unsafe { core::ptr::read_volatile(addr.cast::<T>()) })
}

/// A 16-byte `comm` read with [`btf_read`] as two 8-byte loads (a byte array would load byte
/// by byte).
#[inline(always)]
pub fn btf_read_comm(base: u64, offset: u32) -> Option<[u8; 16]> {
    let words: [u64; 2] = [btf_read(base, offset)?, btf_read(base, offset.wrapping_add(8))?];
    Some(unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>(words) })
}

/// The calling thread group (process) id.
#[inline(always)]
pub fn current_tgid() -> u32 {
    (bpf_get_current_pid_tgid() >> 32) as u32
}

/// The calling thread id.
#[inline(always)]
pub fn current_pid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

/// Submit flags that wake user space only once `wake_at_bytes` are waiting: a wakeup per record
/// would cost a context switch per event at high rates. User space must then also drain on a
/// timer (`RingReader::read_within`), so records below the mark are read within one tick.
#[inline(always)]
pub fn wakeup_flags(ring: &aya_ebpf::maps::RingBuf, wake_at_bytes: u64) -> u64 {
    const BPF_RB_AVAIL_DATA: u64 = 0;
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    if ring.query(BPF_RB_AVAIL_DATA) >= wake_at_bytes { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP }
}

/// The field of a classic tracepoint's record at the offset user space read from the event's
/// tracefs `format` file (offsets move between kernels). The mask bounds the offset for the
/// verifier: every record mm-probe reads is far smaller than 4 KiB.
#[inline(always)]
pub fn tp_field<T>(ctx: &aya_ebpf::programs::TracePointContext, offset: &aya_ebpf::Global<u32>) -> Option<T> {
    unsafe { ctx.read_at::<T>((offset.load() & 0xfff) as usize) }.ok()
}

/// bpf_map_update_elem's flag: insert only if absent (include/uapi/linux/bpf.h).
pub const BPF_NOEXIST: u64 = 1;

/// `map[key]` as a pointer, inserting `init` first when the key is absent; `None` when the map
/// is full. Works for every hash-map type (aya-ebpf gives them no common trait, hence a macro).
/// The insert is BPF_NOEXIST so that a value another CPU inserted in between is kept, and the
/// second lookup finds whichever value won.
macro_rules! get_or_insert {
    ($map:expr, $key:expr, $init:expr) => {
        match $map.get_ptr_mut($key) {
            Some(value) => Some(value),
            None => {
                let _ = $map.insert($key, $init, $crate::kernel::BPF_NOEXIST);
                $map.get_ptr_mut($key)
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use get_or_insert;

/// A fentry program and its kprobe fallback on the same function, both handing its first
/// argument (a pointer) to one handler: the pair every function probe of a catalog offers.
/// A kprobe that cannot read the register hands 0, which every handler treats as "no object".
macro_rules! entry_programs {
    ($fentry:ident, $kprobe:ident => $handler:ident) => {
        #[aya_ebpf::macros::fentry]
        pub fn $fentry(ctx: aya_ebpf::programs::FEntryContext) -> u32 {
            $handler(ctx.arg::<u64>(0))
        }

        #[aya_ebpf::macros::kprobe]
        pub fn $kprobe(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            $handler(ctx.arg::<u64>(0).unwrap_or(0))
        }
    };
}
pub(crate) use entry_programs;

/// Adds `delta` to slot `index` of a per-CPU counter array.
#[inline(always)]
pub fn bump(map: &aya_ebpf::maps::PerCpuArray<u64>, index: u32, delta: u64) {
    if let Some(counter) = map.get_ptr_mut(index) {
        unsafe { *counter += delta };
    }
}

pub use mm_probe_common::histogram::log2_bucket;

/// Struct member offsets resolved by user space from this kernel's BTF (names in
/// `mm_probe_common::layout`). `OFFSET_UNKNOWN` when the member does not exist here.
pub mod offsets {
    use aya_ebpf::Global;
    use mm_probe_common::layout::OFFSET_UNKNOWN;

    macro_rules! offsets {
        ($($name:ident),* $(,)?) => {
            $(
                #[unsafe(no_mangle)]
                pub static $name: Global<u32> = Global::new(OFFSET_UNKNOWN);
            )*
        };
    }

    offsets!(
        OFF_TASK_STRUCT_MM,
        OFF_TASK_STRUCT_PID,
        OFF_TASK_STRUCT_TGID,
        OFF_TASK_STRUCT_PRIO,
        OFF_TASK_STRUCT_COMM,
        OFF_TASK_STRUCT_CPU,
        OFF_TASK_STRUCT_EXEC_RUNTIME,
        OFF_TASK_STRUCT_FLAGS,
        OFF_MM_STRUCT_FLAGS,
        OFF_VMA_VM_MM,
        OFF_VMA_VM_FLAGS,
        OFF_VMA_VM_START,
        OFF_VMA_VM_END,
        OFF_NOTIFIER_RANGE_MM,
        OFF_NOTIFIER_RANGE_START,
        OFF_NOTIFIER_RANGE_END,
        OFF_NOTIFIER_RANGE_EVENT,
        OFF_NOTIFIER_RANGE_FLAGS,
        OFF_MM_NOTIFIER_SUBSCRIPTIONS,
        OFF_MM_MMAP_LOCK,
        OFF_MM_OWNER,
        OFF_SUBSCRIPTIONS_LIST,
        OFF_SUBSCRIPTIONS_INVALIDATE_SEQ,
        OFF_MMU_NOTIFIER_HLIST,
        OFF_MMU_NOTIFIER_OPS,
        OFF_NOTIFIER_OPS_RANGE_START,
        OFF_KVM_MMU_NOTIFIER,
        OFF_KVM_MMU_LOCK,
        OFF_KVM_MEMSLOTS,
        OFF_KVM_MEMSLOTS_HVA_ROOT,
        OFF_INTERVAL_NODE_RB,
        OFF_INTERVAL_NODE_START,
        OFF_INTERVAL_NODE_LAST,
        OFF_INTERVAL_NODE_SUBTREE_LAST,
        OFF_RB_NODE_RIGHT,
        OFF_RB_NODE_LEFT,
        OFF_HMM_RANGE_NOTIFIER,
        OFF_HMM_RANGE_START,
        OFF_HMM_RANGE_END,
        OFF_HMM_RANGE_NOTIFIER_SEQ,
        OFF_INTERVAL_NOTIFIER_MM,
        OFF_INTERVAL_NOTIFIER_START,
        OFF_INTERVAL_NOTIFIER_LAST,
        OFF_INTERVAL_NOTIFIER_OPS,
        OFF_INTERVAL_NOTIFIER_INVALIDATE_SEQ,
        OFF_INTERVAL_OPS_INVALIDATE,
        OFF_HRTIMER_SOFTEXPIRES,
        OFF_HRTIMER_FUNCTION,
        OFF_HRTIMER_SLEEPER_TASK,
        OFF_PT_REGS_ORIG_AX,
        OFF_PT_REGS_AX,
        OFF_PT_REGS_DI,
        OFF_PT_REGS_SI,
        OFF_PT_REGS_DX,
        OFF_PT_REGS_R10,
    );
}

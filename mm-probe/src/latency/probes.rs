//! The kernel hooks latency uses, best first.
//!
//! Wakeup latency comes from classic sched tracepoints, which every kernel of the matrix has
//! (the host included). Function durations need function probes: fentry/fexit where the kernel
//! allows trampolines and the function is in vmlinux BTF, kprobe/kretprobe otherwise (module
//! functions have no vmlinux BTF). The object has one program pair per function slot.

use anyhow::{Context as _, Result};
use aya::{Ebpf, maps::HashMap as BpfHashMap};
use mm_probe_common::{
    latency::{self as names, FILTER_PIDS, MAX_FUNCS},
    layout,
};

use super::{
    options::Options,
    report::{Availability, FunctionPlan},
};
use crate::{
    kernel::{Kernel, layout::Layout, tracefs},
    probes::{Candidate, GlobalValue, Hook, LogicalProbe, Mechanism, Plan, Planner, Target},
    user_bail,
};

/// The function every run traces unless told otherwise: it walks up to 512 PTEs under the PTE
/// lock per call, and without the cond_resched() of upstream b2f557a21bc8 (v6.7) it can hold
/// the CPU for milliseconds (docs/kernel-facts.md#madvise-pageout).
pub const DEFAULT_FUNCTION: &str = "madvise_cold_or_pageout_pte_range";

/// What one call of a traced function covers, where it is a fixed step of a walk: the default
/// function is a pmd_entry callback of the page walker, so one call is one PMD, 512 PTEs on
/// x86-64 (docs/kernel-facts.md). The verdict names a bound in those terms.
pub fn one_call_is(function: &str) -> Option<&'static str> {
    (function == DEFAULT_FUNCTION).then_some("one 2 MiB step of the walk")
}

/// A sched hook: the BTF tracepoint program first (the kernel's recursion guard for those is
/// per program, so a wakeup raised while another tracing program runs on that CPU is not
/// skipped, as it is for classic tracepoint programs), then the classic tracepoint.
macro_rules! sched_probe {
    ($name:literal, $purpose:literal, $btf_program:literal, $program:literal) => {
        LogicalProbe {
            name: $name,
            purpose: $purpose,
            candidates: &[
                Candidate {
                    hooks: &[Hook { mechanism: Mechanism::BtfTracepoint, program: $btf_program }],
                    targets: &[Target { name: $name, kernels: "BTF; sched_switch: 5.18+ (prev_state argument)" }],
                },
                Candidate {
                    hooks: &[Hook { mechanism: Mechanism::Tracepoint, program: $program }],
                    targets: &[Target { name: concat!("sched:", $name), kernels: "all" }],
                },
            ],
        }
    };
}

pub const WAKEUP: LogicalProbe = sched_probe!(
    "sched_wakeup",
    "when a task became runnable (start of its wakeup latency)",
    "lat_sched_wakeup_btf",
    "lat_sched_wakeup"
);

pub const WAKEUP_NEW: LogicalProbe = sched_probe!(
    "sched_wakeup_new",
    "when a new task first became runnable",
    "lat_sched_wakeup_new_btf",
    "lat_sched_wakeup_new"
);

pub const SWITCH: LogicalProbe = sched_probe!(
    "sched_switch",
    "when a woken task ran, and who held the CPU until then (blocker and its stack)",
    "lat_sched_switch_btf",
    "lat_sched_switch"
);

/// The sched probes without their BTF candidates, for kernels whose BTF lacks a task_struct
/// member the BTF programs read (they would attach and then see nothing).
pub fn classic_only(probe: &LogicalProbe) -> LogicalProbe {
    LogicalProbe { candidates: &probe.candidates[probe.candidates.len() - 1..], ..*probe }
}

/// The probes that do not depend on the command line.
pub const SCHED_PROBES: &[LogicalProbe] = &[WAKEUP, WAKEUP_NEW, SWITCH];

macro_rules! slot_hooks {
    ($($slot:literal),*) => {
        [$(
            [
                [
                    Hook { mechanism: Mechanism::Fentry, program: concat!("lat_func_entry_", $slot) },
                    Hook { mechanism: Mechanism::Fexit, program: concat!("lat_func_exit_", $slot) },
                ],
                [
                    Hook { mechanism: Mechanism::Kprobe, program: concat!("lat_func_kprobe_", $slot) },
                    Hook { mechanism: Mechanism::Kretprobe, program: concat!("lat_func_kretprobe_", $slot) },
                ],
            ]
        ),*]
    };
}

/// Per slot: the fentry/fexit pair, then the kprobe/kretprobe pair.
static SLOT_HOOKS: [[[Hook; 2]; 2]; MAX_FUNCS] = slot_hooks!(0, 1, 2, 3, 4, 5, 6, 7);

const DEFAULT_TARGETS: &[Target] =
    &[Target { name: DEFAULT_FUNCTION, kernels: "5.4+ (static, called through cold_walk_ops, never inlined)" }];

/// Slot 0 with its default function, as `doctor` shows it.
pub const DEFAULT_FUNCTION_PROBE: LogicalProbe = LogicalProbe {
    name: DEFAULT_FUNCTION,
    purpose: "how long madvise_cold_or_pageout_pte_range held the CPU, and attribution of spikes to it",
    candidates: &[
        Candidate { hooks: &SLOT_HOOKS[0][0], targets: DEFAULT_TARGETS },
        Candidate { hooks: &SLOT_HOOKS[0][1], targets: DEFAULT_TARGETS },
    ],
};

/// What `doctor` tries for this capability.
pub const PROBES: &[LogicalProbe] = &[WAKEUP, WAKEUP_NEW, SWITCH, DEFAULT_FUNCTION_PROBE];

/// The probe for function `name` in slot `slot` (< MAX_FUNCS). The catalog vocabulary is
/// `'static` because it is normally a table; a `--func` name is leaked once per run to join it.
pub fn function_probe(slot: usize, name: &str) -> LogicalProbe {
    if slot == 0 && name == DEFAULT_FUNCTION {
        return DEFAULT_FUNCTION_PROBE;
    }
    let name: &'static str = Box::leak(name.to_string().into_boxed_str());
    let targets: &'static [Target] = Box::leak(Box::new([Target { name, kernels: "named with --func" }]));
    let hooks = &SLOT_HOOKS[slot % MAX_FUNCS];
    let candidates: &'static [Candidate] =
        Box::leak(Box::new([Candidate { hooks: &hooks[0], targets }, Candidate { hooks: &hooks[1], targets }]));
    LogicalProbe {
        name,
        purpose: "entry-to-return time of a --func target, and attribution of spikes to it",
        candidates,
    }
}

// Loading settings and attaching.

/// A mistyped `--func` is a usage error, not a silently empty histogram.
pub fn check_functions_exist(kernel: &Kernel, options: &Options) -> Result<()> {
    if options.functions.len() < 2 {
        return Ok(());
    }
    let Ok(kallsyms) = kernel.kallsyms() else { return Ok(()) };
    for f in options.functions.iter().skip(1) {
        if kallsyms.resolve(f).is_none() {
            user_bail!(
                "--func {f}: no such kernel function in /proc/kallsyms (inlined, renamed, or its module is not loaded)"
            );
        }
    }
    Ok(())
}

/// Globals: threshold, selection, syscall reading (`syscall_attribution`), and the tracepoint
/// field offsets of this kernel.
pub fn settings(options: &Options, syscalls: &Availability) -> Vec<(&'static str, GlobalValue)> {
    let mut settings = vec![
        (names::THRESHOLD_NS, GlobalValue::U64(options.threshold_ns)),
        (names::FILTER_MODE, GlobalValue::U32(options.filter)),
        (names::SYSCALL_FROM_REGS, GlobalValue::U32(u32::from(syscalls.available))),
    ];
    let Ok(root) = tracefs::root() else { return settings };
    // (category, event, [(field, global)]).
    type Fields<'a> = (&'a str, &'a str, &'a [(&'a str, &'static str)]);
    let fields: &[Fields] = &[
        (
            "sched",
            "sched_wakeup",
            &[
                ("comm", names::TP_WAKEUP_COMM),
                ("pid", names::TP_WAKEUP_PID),
                ("prio", names::TP_WAKEUP_PRIO),
                ("target_cpu", names::TP_WAKEUP_TARGET_CPU),
            ],
        ),
        (
            "sched",
            "sched_switch",
            &[
                ("prev_comm", names::TP_SWITCH_PREV_COMM),
                ("prev_pid", names::TP_SWITCH_PREV_PID),
                ("prev_prio", names::TP_SWITCH_PREV_PRIO),
                ("prev_state", names::TP_SWITCH_PREV_STATE),
                ("next_comm", names::TP_SWITCH_NEXT_COMM),
                ("next_pid", names::TP_SWITCH_NEXT_PID),
                ("next_prio", names::TP_SWITCH_NEXT_PRIO),
            ],
        ),
    ];
    for (category, event, wanted) in fields {
        // sched_wakeup_new shares sched_wakeup's record layout (sched_wakeup_template).
        let Ok(offsets) = tracefs::field_offsets(&root, category, event) else { continue };
        for (field, global) in *wanted {
            if let Some((_, offset)) = offsets.iter().find(|(name, _)| name == field) {
                settings.push((global, GlobalValue::U32(*offset)));
            }
        }
    }
    settings
}

/// The probes without which there is no wakeup latency.
pub const REQUIRED_PROBES: [&str; 2] = ["sched_wakeup", "sched_switch"];

/// Attaches the sched probes, then each function slot; fails (exit 1) only when wakeup latency
/// itself cannot be measured.
pub(super) fn attach(kernel: &Kernel, ebpf: &mut Ebpf, options: &Options) -> Result<(Plan, Vec<FunctionPlan>)> {
    let (plan, functions) = attach_probes(kernel, ebpf, options);
    for required in REQUIRED_PROBES {
        if let Some(p) = plan.get(required).filter(|p| !p.attached()) {
            user_bail!(
                "cannot measure wakeup latency: {required} did not attach ({}); check that tracefs is mounted \
                 and this kernel has sched tracepoints (mm-probe doctor shows more)",
                p.why_unavailable()
            );
        }
    }
    Ok((plan, functions))
}

/// Attaches every probe it can: the sched probes, then each function slot.
pub fn attach_probes(kernel: &Kernel, ebpf: &mut Ebpf, options: &Options) -> (Plan, Vec<FunctionPlan>) {
    let planner = Planner::new(kernel);
    let mut plan = planner.attach_all(ebpf, &sched_probes(kernel));
    let mut functions = Vec::new();
    for (slot, name) in options.functions.iter().enumerate() {
        let probe = planner.attach(ebpf, &function_probe(slot, name));
        functions.push(FunctionPlan {
            slot,
            function: name.clone(),
            attached: probe.attached(),
            mechanism: probe.mechanism().map(str::to_string),
            reason: (!probe.attached()).then(|| probe.why_unavailable()),
        });
        plan.probes.push(probe);
    }
    if functions.iter().any(|f| f.attached) {
        mark_functions_traced(ebpf);
    }
    (plan, functions)
}

/// Lets the sched programs look for function state (they skip the lookup until then). Should
/// the map be unwritable, attribution to functions is lost, not the measurement: say so.
fn mark_functions_traced(ebpf: &mut Ebpf) {
    let written = ebpf
        .map_mut(names::FUNCS_TRACED_MAP)
        .context("map missing")
        .and_then(|map| Ok(aya::maps::Array::<_, u32>::try_from(map)?))
        .and_then(|mut flag| Ok(flag.set(0, 1, 0)?));
    if let Err(e) = written {
        eprintln!("mm-probe: warning: spikes will not be attributed to functions ({}: {e:#})", names::FUNCS_TRACED_MAP);
    }
}

/// Tells the kernel side which threads `-p` selected.
pub fn select_pids(ebpf: &mut Ebpf, options: &Options) -> Result<()> {
    if options.filter != FILTER_PIDS {
        return Ok(());
    }
    let mut pids: BpfHashMap<_, u32, u8> =
        BpfHashMap::try_from(ebpf.map_mut(names::PIDS_MAP).context("pid filter map missing")?)?;
    for pid in &options.pids {
        pids.insert(pid, 1, 0).with_context(|| format!("adding pid {pid} to the filter"))?;
    }
    Ok(())
}

/// Set to `tracepoint` to use the classic sched tracepoints even where BTF ones work (the
/// end-to-end tests exercise the fallback with it).
pub const SCHED_HOOKS_ENV: &str = "MM_PROBE_SCHED_HOOKS";

/// The sched probes for this kernel: the BTF tracepoint programs read task_struct members, so
/// where BTF lacks one of them only the classic tracepoints are tried.
fn sched_probes(kernel: &Kernel) -> Vec<LogicalProbe> {
    let forced_classic = std::env::var(SCHED_HOOKS_ENV).is_ok_and(|v| v == "tracepoint");
    let members =
        [layout::TASK_STRUCT_PID, layout::TASK_STRUCT_PRIO, layout::TASK_STRUCT_COMM, layout::TASK_STRUCT_CPU];
    let btf_usable = kernel.btf().is_ok_and(|btf| members.iter().all(|m| Layout::offset_in(btf, m).is_some()));
    SCHED_PROBES
        .iter()
        .map(|p| if (btf_usable && !forced_classic) || p.candidates.len() == 1 { *p } else { classic_only(p) })
        .collect()
}

/// Whether a blocker's syscall can be read from its saved user registers: that needs the
/// bpf_task_pt_regs helper (5.15+) and x86-64's pt_regs members, both learned from BTF.
pub fn syscall_attribution(kernel: &Kernel) -> Availability {
    const MEMBERS: [&str; 6] = [
        layout::PT_REGS_ORIG_AX,
        layout::PT_REGS_AX,
        layout::PT_REGS_DI,
        layout::PT_REGS_SI,
        layout::PT_REGS_DX,
        layout::PT_REGS_R10,
    ];
    let unavailable = |reason: String| Availability { available: false, reason: Some(reason) };
    let btf = match kernel.btf() {
        Ok(btf) => btf,
        Err(why) => return unavailable(format!("no kernel BTF to find the saved registers in: {why}")),
    };
    if btf.enumerator("BPF_FUNC_task_pt_regs").is_none() {
        return unavailable(format!("kernel {} has no bpf_task_pt_regs helper (5.15+)", kernel.release));
    }
    match MEMBERS.iter().find(|m| Layout::offset_in(btf, m).is_none()) {
        Some(missing) => unavailable(format!("{missing} is not in this kernel's BTF (x86-64 only)")),
        None => Availability { available: true, reason: None },
    }
}

pub fn function_availability(functions: &[FunctionPlan]) -> Availability {
    let missing: Vec<String> = functions
        .iter()
        .filter(|f| !f.attached)
        .map(|f| format!("{}: {}", f.function, f.reason.as_deref().unwrap_or("did not attach")))
        .collect();
    let available = functions.iter().any(|f| f.attached);
    let reason = (!missing.is_empty()).then(|| {
        let mut text = missing.join("; ");
        if !available {
            text += ". Wakeup latency, blockers, stacks and syscalls are still measured from tracepoints; \
                     spikes cannot be attributed to functions";
        }
        text
    });
    Availability { available, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sched_probes_prefer_btf_tracepoints_and_keep_the_classic_fallback() {
        for probe in [WAKEUP, WAKEUP_NEW, SWITCH] {
            assert_eq!(probe.candidates[0].label(), "tp_btf", "{}", probe.name);
            assert_eq!(probe.candidates[1].targets[0].name, format!("sched:{}", probe.name));
            let classic = classic_only(&probe);
            assert_eq!(classic.candidates.len(), 1);
            assert_eq!(classic.candidates[0].label(), "tracepoint");
        }
    }

    #[test]
    fn every_slot_has_its_own_programs() {
        let a = function_probe(1, "zap_pte_range");
        let b = function_probe(2, "zap_pte_range");
        assert_eq!(a.candidates[0].hooks[0].program, "lat_func_entry_1");
        assert_eq!(a.candidates[1].hooks[1].program, "lat_func_kretprobe_1");
        assert_eq!(b.candidates[0].hooks[1].program, "lat_func_exit_2");
        assert_eq!(a.candidates[0].label(), "fentry+fexit");
        assert_eq!(a.candidates[1].label(), "kprobe+kretprobe");
        assert_eq!(function_probe(0, DEFAULT_FUNCTION).name, DEFAULT_FUNCTION);
        assert_eq!(SLOT_HOOKS[7][1][0].program, "lat_func_kprobe_7");
    }

    #[test]
    fn missing_functions_are_explained_with_every_attempt() {
        let functions = vec![FunctionPlan {
            slot: 0,
            function: "a".into(),
            attached: false,
            mechanism: None,
            reason: Some("kprobes are not built in".into()),
        }];
        let a = function_availability(&functions);
        assert!(!a.available);
        let reason = a.reason.unwrap();
        assert!(reason.starts_with("a: kprobes are not built in."), "{reason}");
        assert!(reason.contains("still measured from tracepoints"), "{reason}");
    }
}

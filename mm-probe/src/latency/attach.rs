//! Latency's settings, and attaching its probes (the hooks of `probes`) for what `options` asks;
//! whether this kernel lets spikes be attributed to functions and syscalls.

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::HashMap as BpfHashMap,
    programs::{
        PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use mm_probe_common::{
    latency::{self as names, FILTER_PIDS},
    layout,
};
use serde::Serialize;

use super::{
    options::Options,
    probes::{SCHED_PROBES, TIMER_EXPIRY, classic_only, function_probe},
    sampling,
};
use crate::{
    kernel::{Kernel, layout::Layout, tracefs},
    probes::{GlobalValue, LogicalProbe, Plan, Planner},
    user_bail,
};

/// Whether a facility works here, and why not.
#[derive(Clone, Debug, Serialize)]
pub struct Availability {
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One traced function and how it attached.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionPlan {
    pub slot: usize,
    pub function: String,
    pub attached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

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

/// Globals: threshold, selection, syscall reading (`syscall_attribution`), where function
/// stacks are taken, and the tracepoint field offsets of this kernel.
pub fn settings(options: &Options, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
    let mut settings = vec![
        (names::THRESHOLD_NS, GlobalValue::U64(options.threshold_ns)),
        (names::FILTER_MODE, GlobalValue::U32(options.filter)),
        (names::SYSCALL_FROM_REGS, GlobalValue::U32(u32::from(syscall_attribution(kernel).available))),
        (names::STACK_AT_ENTRY, GlobalValue::U32(u32::from(return_stacks_end_at_trampoline(kernel)))),
        (names::OWN_TGID, GlobalValue::U32(std::process::id())),
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

/// What attaching gave: the plan, each function slot, and where timer wakeups start.
pub struct Attachment {
    pub plan: Plan,
    pub functions: Vec<FunctionPlan>,
    pub timer_expiry: Availability,
}

/// Attaches the sched probes, the timer expiry, then each function slot; fails (exit 1) only
/// when wakeup latency itself cannot be measured.
pub(super) fn attach(kernel: &Kernel, ebpf: &mut Ebpf, options: &Options) -> Result<Attachment> {
    let attached = attach_probes(kernel, ebpf, options);
    let plan = &attached.plan;
    for required in REQUIRED_PROBES {
        if let Some(p) = plan.get(required).filter(|p| !p.attached()) {
            user_bail!(
                "cannot measure wakeup latency: {required} did not attach ({}); check that tracefs is mounted \
                 and this kernel has sched tracepoints (mm-probe doctor shows more)",
                p.why_unavailable()
            );
        }
    }
    Ok(attached)
}

/// Attaches every probe it can: the sched probes, the timer expiry, then each function slot.
pub fn attach_probes(kernel: &Kernel, ebpf: &mut Ebpf, options: &Options) -> Attachment {
    let planner = Planner::new(kernel);
    let mut plan = planner.attach_all(ebpf, &sched_probes(kernel));
    let timer_expiry = attach_timer_expiry(kernel, &planner, ebpf, &mut plan);
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
    Attachment { plan, functions, timer_expiry }
}

/// The timer members the expiry program reads.
const TIMER_MEMBERS: [&str; 4] =
    [layout::HRTIMER_FUNCTION, layout::HRTIMER_SOFTEXPIRES, layout::HRTIMER_SLEEPER_TASK, layout::TASK_STRUCT_TGID];

/// Attaches the timer expiry program and has it learn the sleep timers' callback. Without it,
/// timer wakeups are measured from sched_wakeup, and the plan says why.
fn attach_timer_expiry(kernel: &Kernel, planner: &Planner, ebpf: &mut Ebpf, plan: &mut Plan) -> Availability {
    let unavailable = |reason: String| Availability { available: false, reason: Some(reason) };
    let missing: Vec<&str> = match kernel.btf() {
        Ok(btf) => TIMER_MEMBERS.into_iter().filter(|m| Layout::offset_in(&btf, m).is_none()).collect(),
        Err(e) => return unavailable(format!("no kernel BTF ({e:#}); timer wakeups are measured from sched_wakeup")),
    };
    if !missing.is_empty() {
        return unavailable(format!(
            "this kernel's BTF lacks {}; timer wakeups are measured from sched_wakeup",
            missing.join(", ")
        ));
    }
    let probe = planner.attach(ebpf, &TIMER_EXPIRY);
    let attached = probe.attached();
    let why = probe.why_unavailable();
    plan.probes.push(probe);
    if !attached {
        return unavailable(format!("{why}; timer wakeups are measured from sched_wakeup"));
    }
    match teach_sleep_callback(ebpf) {
        Ok(()) => Availability { available: true, reason: None },
        Err(e) => unavailable(format!("{e:#}; timer wakeups are measured from sched_wakeup")),
    }
}

/// Sleeps this thread until the expiry program has learned the sleep timers' callback from one
/// of its sleeps (a millisecond each, fifty at most).
fn teach_sleep_callback(ebpf: &Ebpf) -> Result<()> {
    let map = ebpf.map(names::TIMER_FN_MAP).context("the timer callback map is not in the object")?;
    let learned = aya::maps::Array::<_, u64>::try_from(map)?;
    for _ in 0..TEACHING_SLEEPS {
        std::thread::sleep(std::time::Duration::from_millis(1));
        if learned.get(&0, 0)? != 0 {
            return Ok(());
        }
    }
    anyhow::bail!("no sleep timer of mm-probe's own fired within {TEACHING_SLEEPS} ms of sleeping")
}

const TEACHING_SLEEPS: u32 = 50;

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

/// The sampler as it attached: its period and how many CPUs it ticks on, or why it could not.
#[derive(Clone, Debug, Serialize)]
pub struct Sampling {
    #[serde(flatten)]
    pub availability: Availability,
    pub period_ns: u64,
    pub cpus: usize,
}

/// Starts the sampler on every online CPU, a tick every quarter threshold. Without it spikes
/// are still measured and explained from the switches; only where the holder's time went is
/// lost, and the plan says why.
pub fn attach_sampler(ebpf: &mut Ebpf, options: &Options) -> Sampling {
    let period_ns = sampling::period_ns(options.threshold_ns);
    let unavailable = |reason: String| Sampling {
        availability: Availability { available: false, reason: Some(reason) },
        period_ns,
        cpus: 0,
    };
    if !options.samples {
        return unavailable("turned off with --no-samples".into());
    }
    match start_sampler(ebpf, period_ns) {
        Ok(cpus) => Sampling { availability: Availability { available: true, reason: None }, period_ns, cpus },
        Err(e) => {
            // Unloading detaches the CPUs it had started on: all of them or none.
            if let Some(Ok(program)) = ebpf.program_mut(names::SAMPLER_PROGRAM).map(<&mut PerfEvent>::try_from) {
                let _ = program.unload();
            }
            unavailable(format!("{e:#}"))
        }
    }
}

fn start_sampler(ebpf: &mut Ebpf, period_ns: u64) -> Result<usize> {
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
    let program: &mut PerfEvent =
        ebpf.program_mut(names::SAMPLER_PROGRAM).context("the sampler is not in the object")?.try_into()?;
    program.load().context("loading the sampler")?;
    for &cpu in &cpus {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(period_ns),
                false,
            )
            .with_context(|| format!("a cpu-clock perf event on CPU {cpu}"))?;
    }
    Ok(cpus.len())
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
    let btf_usable = kernel.btf().is_ok_and(|btf| members.iter().all(|m| Layout::offset_in(&btf, m).is_some()));
    SCHED_PROBES
        .iter()
        .map(|p| if (btf_usable && !forced_classic) || p.candidates.len() == 1 { *p } else { classic_only(p) })
        .collect()
}

/// Whether a kretprobe's stack ends at the kretprobe trampoline. Before 5.15 the unwinder does
/// not step over it; the series that taught it to also renamed the trampoline
/// `__kretprobe_trampoline`, so the old name in kallsyms says which kernel this is.
fn return_stacks_end_at_trampoline(kernel: &Kernel) -> bool {
    kernel.kallsyms().is_ok_and(|k| k.address_of("kretprobe_trampoline").is_some())
}

/// Whether a blocker's syscall can be read from its saved user registers.
pub fn syscall_attribution(kernel: &Kernel) -> Availability {
    let reason = kernel.registers_unreadable();
    Availability { available: reason.is_none(), reason }
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

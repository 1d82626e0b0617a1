//! Which program types really work here: attach one trivial program of each type, make the
//! kernel fire it (fsync(2) calls from this process), and count. Used by `doctor` and by the
//! end-to-end tests on every kernel of the matrix.

use std::{fs::File, io::Write as _};

use anyhow::{Context as _, Result};
use aya::maps::PerCpuArray;
use mm_probe_common::selftest::{self as names, Slot};
use serde::Serialize;

use crate::{
    collect::run::{Limits, Stopper, run},
    kernel::Kernel,
    probes::{
        AttachFailure, Candidate, GlobalValue, Hook, LogicalProbe, MapFamily, Mechanism, Outcome, Planner, ProbePlan,
        Target, load_object,
    },
};

/// fsync(2)'s own entry point carries its architecture's prefix (since 4.17 on x86-64, 4.19 on
/// arm64): only this build's architecture is tried, since a kernel of another one never runs
/// this binary and "__arm64_sys_fsync is not in BTF" on x86-64 only misleads.
const FSYNC_FUNCTION: &[Target] = &[
    #[cfg(target_arch = "x86_64")]
    Target { name: names::FUNCTIONS[0], kernels: "x86-64, 4.17+" },
    #[cfg(target_arch = "aarch64")]
    Target { name: names::FUNCTIONS[1], kernels: "arm64, 4.19+" },
    Target { name: names::FUNCTIONS[2], kernels: "all" },
];
const SYS_ENTER: &[Target] = &[Target { name: "sys_enter", kernels: "all" }];

/// One probe per program type with exactly one candidate: the point is to learn whether that
/// type works here, not to fall back.
macro_rules! type_check {
    ($slot:expr, $name:literal, $mechanism:expr, $program:literal, $targets:expr) => {
        (
            $slot,
            LogicalProbe {
                name: $name,
                purpose: "program type check",
                candidates: &[Candidate {
                    hooks: &[Hook { mechanism: $mechanism, program: $program }],
                    targets: $targets,
                }],
            },
        )
    };
}

pub const PROBES: &[(Slot, LogicalProbe)] = &[
    type_check!(
        Slot::Tracepoint,
        "tracepoint",
        Mechanism::Tracepoint,
        "selftest_tracepoint",
        &[Target { name: "syscalls:sys_enter_fsync", kernels: "CONFIG_FTRACE_SYSCALLS" }]
    ),
    type_check!(Slot::RawTracepoint, "raw_tracepoint", Mechanism::RawTracepoint, "selftest_raw_tracepoint", SYS_ENTER),
    type_check!(Slot::BtfTracepoint, "tp_btf", Mechanism::BtfTracepoint, "selftest_btf_tracepoint", SYS_ENTER),
    type_check!(Slot::Kprobe, "kprobe", Mechanism::Kprobe, "selftest_kprobe", FSYNC_FUNCTION),
    type_check!(Slot::Kretprobe, "kretprobe", Mechanism::Kretprobe, "selftest_kretprobe", FSYNC_FUNCTION),
    type_check!(Slot::Fentry, "fentry", Mechanism::Fentry, "selftest_fentry", FSYNC_FUNCTION),
    type_check!(Slot::Fexit, "fexit", Mechanism::Fexit, "selftest_fexit", FSYNC_FUNCTION),
];

/// The verdict on one program type.
#[derive(Clone, Debug, Serialize)]
pub struct TypeCheck {
    pub program_type: &'static str,
    pub attached: bool,
    /// What it attached to (`syscalls:sys_enter_fsync`, `__x64_sys_fsync`, …).
    pub target: Option<String>,
    /// Events counted after `calls` fsync(2) calls; equal to `calls` when the type works.
    pub counted: u64,
    pub calls: u64,
    /// Why it did not attach.
    pub reason: Option<String>,
    /// Each failed attempt, as values to match on.
    #[serde(skip)]
    pub failures: Vec<AttachFailure>,
}

impl TypeCheck {
    pub fn works(&self) -> bool {
        self.attached && self.counted == self.calls
    }
}

/// Attaches every type's program, makes `calls` fsync(2) calls, and reads the counts.
pub fn check_program_types(kernel: &Kernel, calls: u64) -> Result<Vec<TypeCheck>> {
    let settings = [
        (names::TARGET_TGID, GlobalValue::U32(std::process::id())),
        (names::FSYNC_NR, GlobalValue::U64(libc::SYS_fsync as u64)),
    ];
    let mut ebpf = load_object(kernel, &[MapFamily::Selftest], &settings)?;
    let planner = Planner::new(kernel);
    let plans: Vec<(Slot, ProbePlan)> =
        PROBES.iter().map(|(slot, probe)| (*slot, planner.attach(&mut ebpf, probe))).collect();
    fsync_repeatedly(calls)?;
    let hits: PerCpuArray<_, u64> =
        PerCpuArray::try_from(ebpf.map(names::HITS_MAP).context("self-test counter map missing")?)?;
    plans
        .into_iter()
        .map(|(slot, plan)| {
            let counted = hits.get(&(slot as u32), 0)?.iter().sum();
            Ok(TypeCheck {
                target: match &plan.outcome {
                    Outcome::Attached { target, .. } => Some(target.clone()),
                    Outcome::Unavailable => None,
                },
                program_type: plan.probe,
                attached: plan.attached(),
                counted,
                calls,
                reason: (!plan.attached()).then(|| distinct_reasons(&plan)),
                failures: plan.failed_attempts.iter().map(|a| a.reason.clone()).collect(),
            })
        })
        .collect()
}

/// Each failure's sentence once, in the order tried: on a kernel without kprobes every target
/// fails the same way, and the sentence said once is the whole reason.
fn distinct_reasons(plan: &ProbePlan) -> String {
    let mut reasons: Vec<String> = Vec::new();
    for reason in plan.failed_attempts.iter().map(|a| a.reason.to_string()) {
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
    }
    reasons.join("; ")
}

fn fsync_repeatedly(calls: u64) -> Result<()> {
    let path = std::env::temp_dir().join(format!("mm-probe-selftest-{}", std::process::id()));
    let mut file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    for _ in 0..calls {
        file.write_all(b"x")?;
        file.sync_all()?;
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// The shared ring-buffer path under load: records received and lost for one process's
/// getppid(2) calls, and what reading them cost this process.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RingCheck {
    pub received: u64,
    pub lost: u64,
    pub malformed: u64,
    /// CPU time from the moment the program was attached: the cost of reading.
    pub cpu_user_ns: u64,
    pub cpu_system_ns: u64,
    /// CPU time until attached.
    pub startup_cpu_ns: u64,
    pub max_rss_bytes: u64,
}

pub const RING_PROBE: LogicalProbe = crate::tracepoint_probe!(
    "ring buffer", "ring-buffer capacity check";
    "syscalls:sys_enter_getppid" on "CONFIG_FTRACE_SYSCALLS" => "selftest_ring"
);

/// How often user space drains a ring whose programs wake it only in batches.
const DRAIN_TICK: std::time::Duration = std::time::Duration::from_millis(20);

/// Attaches the ring program for `tgid`, calls `on_attached`, reads until `stop` resolves, then
/// drains what is left and reports. Used by `cargo xtask bench` through a hidden subcommand.
pub async fn check_ring(
    kernel: &Kernel,
    tgid: u32,
    on_attached: impl FnOnce(),
    stop: impl std::future::Future<Output = ()>,
) -> Result<RingCheck> {
    let settings = [(names::TARGET_TGID, GlobalValue::U32(tgid))];
    let mut ebpf = load_object(kernel, &[MapFamily::Selftest], &settings)?;
    let plan = Planner::new(kernel).attach(&mut ebpf, &RING_PROBE);
    if !plan.attached() {
        anyhow::bail!("the ring-buffer check cannot attach: {}", plan.why_unavailable());
    }
    let mut reader = crate::collect::RingReader::<names::RingRecord>::new(
        ebpf.take_map(names::RING_MAP).context("ring map missing")?,
    )?;
    let mut received = 0u64;
    // getrusage counts in microseconds: finer than a rate-0 run measured apart, whose start-up
    // cost varies by more than what reading 100k records/s costs.
    let at_attach = self_usage();
    on_attached();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            read = reader.read_within(DRAIN_TICK, |_| received += 1) => { read?; }
        }
    }
    reader.drain_now(|_| received += 1);
    let lost = crate::collect::counters::percpu_sum(&ebpf, names::RING_LOST_MAP, 0)?;
    let at_end = self_usage();
    Ok(RingCheck {
        received,
        lost,
        malformed: reader.malformed,
        cpu_user_ns: at_end.cpu_user_ns - at_attach.cpu_user_ns,
        cpu_system_ns: at_end.cpu_system_ns - at_attach.cpu_system_ns,
        startup_cpu_ns: at_attach.cpu_user_ns + at_attach.cpu_system_ns,
        max_rss_bytes: at_end.max_rss_bytes,
    })
}

/// CPU time and peak RSS of this process so far.
fn self_usage() -> RingCheck {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    RingCheck {
        cpu_user_ns: ns(usage.ru_utime),
        cpu_system_ns: ns(usage.ru_stime),
        max_rss_bytes: usage.ru_maxrss as u64 * 1024,
        ..RingCheck::default()
    }
}

/// `mm-probe bench-ring PID`: prints `attached` once the program is in place, then one JSON
/// line with the [`RingCheck`] after SIGINT.
pub fn run_ring_check(tgid: u32) -> Result<()> {
    crate::kernel::privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    let check = run(Limits::default(), async |stopper: &mut Stopper| {
        check_ring(&kernel, tgid, || println!("attached"), async {
            stopper.wait().await;
        })
        .await
    })?;
    println!("{}", crate::report::json::line(crate::report::json::Line::BenchRingCheck, &check));
    Ok(())
}

pub const NOOP_HOOK: Hook = Hook { mechanism: Mechanism::BtfTracepoint, program: "selftest_noop_btf" };

/// `mm-probe bench-hooks --btf-tracepoint NAME…`: attaches a program that returns at once to
/// each named BTF tracepoint (one object each: a program attaches to one tracepoint), prints
/// `attached`, and holds them until SIGINT or SIGTERM.
pub fn hold_noop_programs(tracepoints: &[String]) -> Result<()> {
    crate::kernel::privileges::require_tracing()?;
    let kernel = Kernel::running()?;
    run(Limits::default(), async |stopper: &mut Stopper| {
        let planner = Planner::new(&kernel);
        let mut held = Vec::new();
        for tracepoint in tracepoints {
            let mut ebpf = load_object(&kernel, &[MapFamily::Selftest], &[])?;
            planner
                .attach_hook(&mut ebpf, &NOOP_HOOK, tracepoint)
                .map_err(|why| anyhow::anyhow!("cannot attach to {tracepoint}: {why}"))?;
            held.push(ebpf);
        }
        println!("attached");
        stopper.wait().await;
        Ok(())
    })
}

//! Which program types really work here: attach one trivial program of each type, make the
//! kernel fire it (fsync(2) calls from this process), and count. Used by `doctor` and by the
//! end-to-end tests on every kernel of the matrix.

use std::{fs::File, io::Write as _};

use anyhow::{Context as _, Result};
use aya::maps::PerCpuArray;
use mm_probe_common::selftest::{self as names, Slot};
use serde::Serialize;

use crate::{
    kernel::Kernel,
    probes::{Candidate, GlobalValue, Hook, LogicalProbe, Mechanism, Planner, ProbePlan, Target, load_object},
};

const FSYNC_FUNCTION: &[Target] = &[Target { name: names::FUNCTION, kernels: "all" }];
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
                candidates: &[Candidate { hooks: &[Hook { mechanism: $mechanism, program: $program }], targets: $targets }],
            },
        )
    };
}

pub const PROBES: &[(Slot, LogicalProbe)] = &[
    type_check!(Slot::Tracepoint, "tracepoint", Mechanism::Tracepoint, "selftest_tracepoint",
        &[Target { name: "syscalls:sys_enter_fsync", kernels: "CONFIG_FTRACE_SYSCALLS" }]),
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
    /// Events counted after `calls` fsync(2) calls; equal to `calls` when the type works.
    pub counted: u64,
    pub calls: u64,
    /// Why it did not attach.
    pub reason: Option<String>,
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
    let mut ebpf = load_object(kernel, &settings)?;
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
                program_type: plan.probe,
                attached: plan.attached(),
                counted,
                calls,
                reason: (!plan.attached()).then(|| plan.failed_attempts.iter().map(|a| a.reason.clone()).collect::<Vec<_>>().join("; ")),
            })
        })
        .collect()
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

//! The attach planner: tries each logical probe's candidates in order, really loading and
//! attaching (a BTF or kallsyms hit alone proves nothing: fentry can still be refused, a kprobe
//! can still be blacklisted), and records the outcome of every attempt.

use std::path::{Path, PathBuf};

use aya::{
    Ebpf,
    programs::{BtfTracePoint, FEntry, FExit, KProbe, PerfEvent, Program, RawTracePoint, TracePoint},
};
use serde::Serialize;

use super::{
    catalog::{Candidate, Hook, LogicalProbe, Mechanism},
    failure::AttachFailure,
};
use crate::kernel::{Kernel, kallsyms::SymbolMatch, tracefs};

/// The file whose absence means the kernel was built without kprobes (CONFIG_KPROBES off).
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe/type";

/// One failed try: which mechanism, on which target, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    pub mechanism: String,
    pub target: String,
    pub reason: AttachFailure,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Attached {
        mechanism: String,
        /// The symbol or event actually used (e.g. `foo.isra.0`, `sched:sched_switch`).
        target: String,
        /// Set when the attachment is partial, e.g. a compiler clone that misses inlined calls.
        caveat: Option<String>,
    },
    Unavailable,
}

/// What happened to one logical probe.
#[derive(Clone, Debug, Serialize)]
pub struct ProbePlan {
    pub probe: &'static str,
    pub purpose: &'static str,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Candidates tried before the one that attached (or all of them, if none did).
    pub failed_attempts: Vec<Attempt>,
}

impl ProbePlan {
    pub fn attached(&self) -> bool {
        matches!(self.outcome, Outcome::Attached { .. })
    }

    /// The mechanism that attached, if any.
    pub fn mechanism(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Attached { mechanism, .. } => Some(mechanism),
            Outcome::Unavailable => None,
        }
    }

    /// One line: why nothing attached (the last, most portable, attempt's reason first).
    pub fn why_unavailable(&self) -> String {
        self.failed_attempts
            .iter()
            .map(|a| format!("{} {}: {}", a.mechanism, a.target, a.reason))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The plan of one capability: every logical probe's outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    pub probes: Vec<ProbePlan>,
}

impl Plan {
    pub fn get(&self, probe: &str) -> Option<&ProbePlan> {
        self.probes.iter().find(|p| p.probe == probe)
    }

    pub fn is_attached(&self, probe: &str) -> bool {
        self.get(probe).is_some_and(ProbePlan::attached)
    }

    pub fn unavailable(&self) -> impl Iterator<Item = &ProbePlan> {
        self.probes.iter().filter(|p| !p.attached())
    }
}

pub struct Planner<'k> {
    kernel: &'k Kernel,
    tracefs: Result<PathBuf, AttachFailure>,
}

impl<'k> Planner<'k> {
    pub fn new(kernel: &'k Kernel) -> Self {
        Self { kernel, tracefs: tracefs::root().map_err(|e| AttachFailure::TracefsUnusable(format!("{e:#}"))) }
    }

    /// Attaches every probe it can, in catalog order.
    pub fn attach_all(&self, ebpf: &mut Ebpf, probes: &[LogicalProbe]) -> Plan {
        Plan { probes: probes.iter().map(|p| self.attach(ebpf, p)).collect() }
    }

    /// Tries `probe`'s candidates in order until one attaches.
    pub fn attach(&self, ebpf: &mut Ebpf, probe: &LogicalProbe) -> ProbePlan {
        let mut failed_attempts = Vec::new();
        for candidate in probe.candidates {
            for target in candidate.targets {
                match self.attach_candidate(ebpf, candidate, target.name) {
                    Ok((used, caveat)) => {
                        return ProbePlan {
                            probe: probe.name,
                            purpose: probe.purpose,
                            outcome: Outcome::Attached { mechanism: candidate.label(), target: used, caveat },
                            failed_attempts,
                        };
                    }
                    Err(reason) => failed_attempts.push(Attempt {
                        mechanism: candidate.label(),
                        target: target.name.to_string(),
                        reason,
                    }),
                }
            }
        }
        ProbePlan { probe: probe.name, purpose: probe.purpose, outcome: Outcome::Unavailable, failed_attempts }
    }

    /// Attaches every hook of `candidate` to `target` in the order listed, or none of them.
    fn attach_candidate(
        &self,
        ebpf: &mut Ebpf,
        candidate: &Candidate,
        target: &str,
    ) -> Result<(String, Option<String>), AttachFailure> {
        let mut attached: Vec<&Hook> = Vec::new();
        let mut resolved = (target.to_string(), None);
        for hook in candidate.hooks {
            match self.attach_hook(ebpf, hook, target) {
                Ok(used) => {
                    resolved = used;
                    attached.push(hook);
                }
                Err(reason) => {
                    for done in attached {
                        unload(ebpf, done.program);
                    }
                    return Err(reason);
                }
            }
        }
        Ok(resolved)
    }

    /// Loads and attaches one program to one target. Public so that capabilities that attach one
    /// program to many user-chosen functions (`latency --func`) use the same checks.
    pub fn attach_hook(
        &self,
        ebpf: &mut Ebpf,
        hook: &Hook,
        target: &str,
    ) -> Result<(String, Option<String>), AttachFailure> {
        let symbol = self.preflight(hook.mechanism, target)?;
        let program = ebpf.program_mut(hook.program).ok_or(AttachFailure::ProgramMissing { program: hook.program })?;
        // A half-loaded program would make the next candidate's load fail: unload it first.
        load_and_attach(self.kernel, program, hook.mechanism, &symbol.0).inspect_err(|_| unload_program(program))?;
        Ok(symbol)
    }

    /// Checks that make a failure's reason plain before trying: the symbol or event exists, the
    /// kernel has the facility. Returns the exact name to attach to, and any caveat.
    fn preflight(&self, mechanism: Mechanism, target: &str) -> Result<(String, Option<String>), AttachFailure> {
        match mechanism {
            Mechanism::Fentry | Mechanism::Fexit => {
                let btf = self.kernel.btf().map_err(AttachFailure::NoBtf)?;
                btf.function_params(target)
                    .ok_or_else(|| AttachFailure::FunctionNotInBtf { function: target.to_string() })?;
                Ok((target.to_string(), None))
            }
            Mechanism::Kprobe | Mechanism::Kretprobe => {
                if !Path::new(KPROBE_PMU).exists() {
                    return Err(AttachFailure::KprobesNotBuiltIn);
                }
                let kallsyms = self.kernel.kallsyms().map_err(|e| AttachFailure::KallsymsUnreadable(e.to_string()))?;
                match kallsyms.resolve(target) {
                    Some(SymbolMatch::Exact(name)) => Ok((name, None)),
                    Some(SymbolMatch::Clone(name)) => Ok((
                        name.clone(),
                        Some(format!("only the compiler clone {name} exists; calls inlined elsewhere are not seen")),
                    )),
                    None => Err(AttachFailure::FunctionNotInKallsyms { function: target.to_string() }),
                }
            }
            Mechanism::Tracepoint => {
                let root = self.tracefs.as_ref().map_err(Clone::clone)?;
                let (category, event) = split_event(target)?;
                if !tracefs::event_exists(root, category, event) {
                    return Err(AttachFailure::TracepointAbsent { event: target.to_string() });
                }
                Ok((target.to_string(), None))
            }
            Mechanism::RawTracepoint => Ok((target.to_string(), None)),
            Mechanism::BtfTracepoint => {
                let btf = self.kernel.btf().map_err(AttachFailure::NoBtf)?;
                if !btf.has_type(&format!("btf_trace_{target}")) {
                    return Err(AttachFailure::BtfTracepointAbsent { event: target.to_string() });
                }
                Ok((target.to_string(), None))
            }
        }
    }
}

fn split_event(target: &str) -> Result<(&str, &str), AttachFailure> {
    target.split_once(':').ok_or_else(|| AttachFailure::NotCategoryEvent { target: target.to_string() })
}

fn load_and_attach(
    kernel: &Kernel,
    program: &mut Program,
    mechanism: Mechanism,
    target: &str,
) -> Result<(), AttachFailure> {
    let btf = || kernel.btf().map_err(AttachFailure::NoBtf);
    let result = match mechanism {
        Mechanism::Fentry => {
            let p: &mut FEntry = program.try_into().map_err(|e| AttachFailure::ProgramTypeMismatch(describe(&e)))?;
            p.load(target, &btf()?.aya).and_then(|()| p.attach().map(drop))
        }
        Mechanism::Fexit => {
            let p: &mut FExit = program.try_into().map_err(|e| AttachFailure::ProgramTypeMismatch(describe(&e)))?;
            p.load(target, &btf()?.aya).and_then(|()| p.attach().map(drop))
        }
        Mechanism::Kprobe | Mechanism::Kretprobe => {
            let p: &mut KProbe = program.try_into().map_err(|e| AttachFailure::ProgramTypeMismatch(describe(&e)))?;
            p.load().and_then(|()| p.attach(target, 0).map(drop))
        }
        Mechanism::Tracepoint => {
            let (category, event) = split_event(target)?;
            let p: &mut TracePoint =
                program.try_into().map_err(|e| AttachFailure::ProgramTypeMismatch(describe(&e)))?;
            p.load().and_then(|()| p.attach(category, event).map(drop))
        }
        Mechanism::RawTracepoint => {
            let p: &mut RawTracePoint =
                program.try_into().map_err(|e| AttachFailure::ProgramTypeMismatch(describe(&e)))?;
            // Raw tracepoints are named without their category ("kvm:kvm_age_hva" → "kvm_age_hva").
            let event = target.split_once(':').map_or(target, |(_, event)| event);
            p.load().and_then(|()| p.attach(event).map(drop))
        }
        Mechanism::BtfTracepoint => {
            let p: &mut BtfTracePoint =
                program.try_into().map_err(|e| AttachFailure::ProgramTypeMismatch(describe(&e)))?;
            p.load(target, &btf()?.aya).and_then(|()| p.attach().map(drop))
        }
    };
    result.map_err(|e| explain(mechanism, &e))
}

/// The verifier's reason from its log: the last line that is not its closing statistics
/// ("processed N insns …", "verification time …", "stack depth …"), which say nothing of why.
fn verifier_verdict(log: &str) -> String {
    const STATISTICS: [&str; 3] = ["processed ", "verification time", "stack depth"];
    let mut lines = log.lines().rev().map(str::trim).filter(|l| !l.is_empty());
    let last = lines.clone().next().unwrap_or("").to_string();
    lines.find(|l| !STATISTICS.iter().any(|s| l.starts_with(s))).map_or(last, str::to_string)
}

/// Turns aya's error into the reason a kernel engineer wants to read.
fn explain(mechanism: Mechanism, error: &aya::programs::ProgramError) -> AttachFailure {
    use aya::programs::ProgramError;
    match error {
        ProgramError::LoadError { io_error, .. } if io_error.raw_os_error() == Some(libc::EPERM) => {
            if matches!(mechanism, Mechanism::Fentry | Mechanism::Fexit) {
                AttachFailure::TrampolinesRefused
            } else {
                AttachFailure::LoadRefused { errno: libc::EPERM, detail: describe(error) }
            }
        }
        ProgramError::LoadError { verifier_log, .. } => {
            AttachFailure::VerifierRejected(verifier_verdict(&verifier_log.to_string()))
        }
        _ => AttachFailure::Other(describe(error)),
    }
}

/// An error and its sources, on one line.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn unload(ebpf: &mut Ebpf, program: &str) {
    if let Some(p) = ebpf.program_mut(program) {
        unload_program(p);
    }
}

/// How long a program run that began before a detach may still take to finish: the kernel
/// unlinks programs without waiting for runs in progress on other CPUs. Microseconds on
/// hardware, but an emulated vCPU can stall for tens of milliseconds.
const IN_FLIGHT_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

/// Detaches and unloads every program of the object, then waits out runs still in flight; the
/// maps and rings stay readable. Called before a run's final reads, so that histograms, tables,
/// counters and rings all describe the same events.
pub async fn detach_all(ebpf: &mut Ebpf) {
    for (_, program) in ebpf.programs_mut() {
        unload_program(program);
    }
    tokio::time::sleep(IN_FLIGHT_GRACE).await;
}

/// Unloads a program (detaching its links) so that a later candidate can load it again.
fn unload_program(program: &mut Program) {
    macro_rules! unload_as {
        ($($ty:ty),*) => {
            $( if let Ok(p) = <&mut $ty>::try_from(&mut *program) { let _ = p.unload(); return; } )*
        };
    }
    unload_as!(FEntry, FExit, KProbe, TracePoint, RawTracePoint, BtfTracePoint, PerfEvent);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::privileges::{can_trace, effective_caps};

    /// Every program type the capabilities attach (here the latency tracer's, BTF tracepoints
    /// where the kernel has BTF) must really be unloaded: a missed type keeps counting while
    /// the final tables are read.
    #[test]
    fn detach_all_unloads_every_attached_program() {
        if !can_trace(effective_caps()) {
            eprintln!("skipped: needs permission to load eBPF programs");
            return;
        }
        let kernel = Kernel::running().unwrap();
        let mut ebpf = crate::probes::load_object(&kernel, crate::probes::MapFamily::ALL, &[]).unwrap();
        let plan = Planner::new(&kernel).attach_all(&mut ebpf, crate::latency::probes::SCHED_PROBES);
        assert!(plan.probes.iter().any(ProbePlan::attached), "nothing attached: {:?}", plan.probes);
        crate::collect::run::run(Default::default(), async |_: &mut crate::collect::Stopper| {
            detach_all(&mut ebpf).await;
            Ok(())
        })
        .unwrap();
        for (name, program) in ebpf.programs() {
            assert!(program.fd().is_err(), "{name} is still loaded after detach_all");
        }
    }

    #[test]
    fn the_verifiers_reason_is_its_last_word_before_the_statistics() {
        let log = "0: (bf) r6 = r1\n; R1 invalid mem access 'scalar'\nprocessed 2064 insns (limit 1000000) max_states_per_insn 7\n";
        assert_eq!(verifier_verdict(log), "; R1 invalid mem access 'scalar'");
        assert_eq!(verifier_verdict("only this\n"), "only this");
        assert_eq!(verifier_verdict(""), "");
    }
}

//! `mm-probe doctor`: what this kernel offers and what each capability will use, tried for real.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::{
    capability::CapabilityId,
    cli::DoctorArgs,
    invalidations,
    kernel::{Kernel, btf::VMLINUX_BTF, layout::Layout, privileges, tracefs},
    probes::{AttachFailure, Attempt, MapFamily, Outcome, Plan, Planner, ProbePlan, load_object},
    report::{
        json,
        text::{self, Columns, wrap},
    },
    selftest::{self, TypeCheck},
    thp_why,
};

#[derive(Debug, Serialize)]
pub struct KernelFacts {
    pub release: String,
    pub preempt_rt: bool,
    /// Why BTF is unusable, or null when it is usable.
    pub btf_error: Option<String>,
    pub btf: bool,
    pub jit_enabled: Option<bool>,
    /// `{"Ok": mount point}` or `{"Err": why tracefs is unusable}`.
    pub tracefs: Result<String, String>,
    pub kprobes_built_in: bool,
    /// Struct members the programs read, with their offsets on this kernel.
    pub layout: Vec<MemberOffset>,
}

/// Where one struct member the kernel programs read lies on this kernel.
#[derive(Debug, Serialize)]
pub struct MemberOffset {
    /// `struct.member`, e.g. `mm_struct.flags`.
    pub member: String,
    /// Null when BTF does not have the member.
    pub offset_bytes: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub kernel: KernelFacts,
    pub program_types: Vec<TypeCheck>,
    pub capabilities: Vec<(String, Plan)>,
}

pub fn run(args: &DoctorArgs) -> Result<()> {
    privileges::require_tracing()?;
    let report = examine()?;
    if args.json {
        println!("{}", json::line(json::Line::Doctor, &report));
    } else {
        print!("{}", render(&report, text::width()));
    }
    Ok(())
}

/// Gathers the facts and really tries every program type and every capability's probes.
pub fn examine() -> Result<Report> {
    let kernel = Kernel::running()?;
    let btf = kernel.btf();
    let layout = btf.as_ref().map(|b| Layout::resolve(b)).unwrap_or_else(|_| Layout::unknown());
    let facts = KernelFacts {
        release: kernel.release.text.clone(),
        preempt_rt: kernel.release.preempt_rt,
        btf_error: btf.as_ref().err().map(|e| e.to_string()),
        btf: btf.is_ok(),
        jit_enabled: std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable").ok().map(|s| s.trim() != "0"),
        tracefs: tracefs::root().map(|p| p.display().to_string()).map_err(|e| format!("{e:#}")),
        kprobes_built_in: Path::new("/sys/bus/event_source/devices/kprobe/type").exists(),
        layout: layout
            .resolved
            .iter()
            .map(|(m, off)| MemberOffset { member: format!("{}.{}", m.struct_name, m.paths[0]), offset_bytes: *off })
            .collect(),
    };
    let program_types = selftest::check_program_types(&kernel, 3)?;
    let planner = Planner::new(&kernel);
    let mut capabilities = Vec::new();
    for capability in CapabilityId::ALL {
        // A fresh object per capability: the plan is what that capability would get alone.
        let mut ebpf = load_object(&kernel, MapFamily::ALL, &[])?;
        let mut plan = match capability {
            // The allow-check is not tried where its calls cannot be decoded (before 6.0).
            CapabilityId::Thp => thp_why::probes::attach_catalog(&kernel, &mut ebpf, capability.catalog()),
            _ => planner.attach_all(&mut ebpf, capability.catalog()),
        };
        if *capability == CapabilityId::Invalidations {
            let refused = invalidations::probes::runtime_allocation_unsafe(&kernel);
            plan.probes.push(subscriber_callbacks(&program_types, refused));
        }
        capabilities.push((capability.command().to_string(), plan));
    }
    Ok(Report { kernel: facts, program_types, capabilities })
}

/// The row of `invalidations`' subscriber callbacks. It times them with a kprobe and a
/// kretprobe on each callback function of the watched memory's subscribers, which it finds at
/// run time in the kernel's subscription lists: no catalog names them, so nothing can be tried
/// on them here. Whether they will be timed is whether kprobes and kretprobes attach, which the
/// program-type check has just tried for real, and whether this kernel lets their run-time
/// allocated table be used from a kprobe (`refused` says why not).
fn subscriber_callbacks(types: &[TypeCheck], refused: Option<String>) -> ProbePlan {
    const TARGET: &str = "each subscriber callback";
    let mut failed_attempts: Vec<Attempt> = refused
        .map(|why| Attempt {
            mechanism: "kprobe+kretprobe".into(),
            target: TARGET.into(),
            reason: AttachFailure::Other(why),
        })
        .into_iter()
        .collect();
    for check in types.iter().filter(|t| ["kprobe", "kretprobe"].contains(&t.program_type) && !t.attached) {
        let reason = check.failures.last().cloned().unwrap_or_else(|| AttachFailure::Other("did not attach".into()));
        match failed_attempts.iter_mut().find(|a| a.reason == reason) {
            Some(same) => same.mechanism += &format!("+{}", check.program_type),
            None => {
                failed_attempts.push(Attempt { mechanism: check.program_type.into(), target: TARGET.into(), reason })
            }
        }
    }
    let outcome = if failed_attempts.is_empty() {
        Outcome::Attached {
            mechanism: "kprobe+kretprobe".into(),
            target: TARGET.into(),
            caveat: Some("the callbacks are found at run time, from the subscribers of the memory watched".into()),
        }
    } else {
        Outcome::Unavailable
    };
    ProbePlan {
        probe: "subscriber callbacks",
        purpose: "the time of each subscriber's invalidate callbacks: which subscriber is slow or amplified",
        outcome,
        failed_attempts,
    }
}

/// The widest the text report gets, whatever the terminal: wider lines are harder to follow.
const MAX_WIDTH: usize = 100;

/// The report as text, no line wider than `width` (nor [`MAX_WIDTH`]).
pub fn render(report: &Report, width: usize) -> String {
    let width = width.min(MAX_WIDTH);
    let mut out = kernel_text(&report.kernel, width);
    out += "\n";
    out += &wrap("program types (loaded, attached, and fired by this process's fsync calls):", width, 2);
    out += &program_types_text(&report.program_types, width);
    out += &silent_types_text(report, width);
    let plans: Vec<&Plan> = report.capabilities.iter().map(|(_, plan)| plan).collect();
    let columns = plan_columns(&plans);
    for (name, plan) in &report.capabilities {
        let attached = plan.probes.iter().filter(|p| p.attached()).count();
        out += "\n";
        out += &wrap(&format!("{name}: {attached} of {} probes attach", plan.probes.len()), width, 2);
        out += &plan_text(plan, &columns, width);
    }
    out
}

/// Facts are labelled in a column as wide as the longest label.
const FACT_LABEL_WIDTH: usize = 12;

fn kernel_text(k: &KernelFacts, width: usize) -> String {
    let btf = match &k.btf_error {
        None => format!("yes ({VMLINUX_BTF})"),
        Some(e) => format!("NO: {e}"),
    };
    let jit = match k.jit_enabled {
        Some(true) => "enabled",
        Some(false) => "disabled (programs run interpreted, slower)",
        None => "unknown (/proc/sys/net/core/bpf_jit_enable unreadable)",
    };
    let kprobes = if k.kprobes_built_in { "built in" } else { "not built in (CONFIG_KPROBES off)" };
    let facts = [
        ("kernel", format!("{}{}", k.release, if k.preempt_rt { " (PREEMPT_RT)" } else { "" })),
        ("BTF", btf),
        ("JIT", jit.to_string()),
        ("tracefs", k.tracefs.as_ref().unwrap_or_else(|e| e).clone()),
        ("kprobes", kprobes.to_string()),
    ];
    facts
        .iter()
        .map(|(label, value)| wrap(&format!("{label:<FACT_LABEL_WIDTH$}{value}"), width, FACT_LABEL_WIDTH))
        .collect()
}

fn program_types_text(types: &[TypeCheck], width: usize) -> String {
    let rows: Vec<Vec<String>> = types
        .iter()
        .map(|t| {
            let status = if t.works() {
                format!("works ({} of {} events seen)", t.counted, t.calls)
            } else if t.attached {
                format!("attached but saw {} of {} events", t.counted, t.calls)
            } else {
                format!("unavailable: {}", t.reason.as_deref().unwrap_or("unknown"))
            };
            vec![t.program_type.to_string(), status]
        })
        .collect();
    text::table(&["TYPE", "RESULT"], &rows, width, 2)
}

/// For each type that attached but missed fsync calls: what that means for the capabilities'
/// plans that use it, so a reader knows which live counts to doubt.
fn silent_types_text(report: &Report, width: usize) -> String {
    let mut out = String::new();
    for t in report.program_types.iter().filter(|t| t.attached && !t.works()) {
        let users: Vec<String> = report
            .capabilities
            .iter()
            .flat_map(|(command, plan)| {
                plan.probes.iter().filter_map(move |p| match &p.outcome {
                    Outcome::Attached { mechanism, .. } if mechanism.split('+').any(|m| m == t.program_type) => {
                        Some(format!("{command} ({})", p.probe))
                    }
                    _ => None,
                })
            })
            .collect();
        let meaning = if users.is_empty() {
            "no capability's plan uses it here".to_string()
        } else {
            format!("read the live counts of {} as lower bounds", users.join(", "))
        };
        out += &wrap(
            &format!(
                "note: {} attached to {} but saw {} of {} fsync calls: the type loads and attaches here, but this \
                 kernel's fsync path did not fire it; {meaning}",
                t.program_type,
                t.target.as_deref().unwrap_or("its target"),
                t.counted,
                t.calls
            ),
            width,
            2,
        );
    }
    out
}

const PLAN_HEADER: [&str; 3] = ["STATUS", "PROBE", "ATTACHED AS / LOST"];

/// The widest probe name that keeps its row on one line: wider names (a long kernel function)
/// get a line of their own, so that the last column keeps room at 80 columns.
const PROBE_COLUMN_MAX: usize = 28;

fn plan_row(p: &ProbePlan) -> [String; 3] {
    match &p.outcome {
        Outcome::Attached { mechanism, target, .. } => {
            ["ok".into(), p.probe.into(), format!("{mechanism} on {target}")]
        }
        Outcome::Unavailable => ["MISS".into(), p.probe.into(), format!("lost: {}", p.purpose)],
    }
}

/// One set of columns for every capability's table, so that they line up under each other;
/// names over [`PROBE_COLUMN_MAX`] do not widen them.
fn plan_columns(plans: &[&Plan]) -> Columns {
    let rows: Vec<[&str; 3]> = plans
        .iter()
        .flat_map(|plan| &plan.probes)
        .map(|p| ["MISS", if p.probe.chars().count() <= PROBE_COLUMN_MAX { p.probe } else { "" }, ""])
        .collect();
    Columns::fit(&PLAN_HEADER, &rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>(), 2)
}

/// One row per probe: attached how, or what is lost; under it the caveat and every failed
/// attempt.
fn plan_text(plan: &Plan, columns: &Columns, width: usize) -> String {
    let note = |text: String| {
        let start = columns.start(1);
        wrap(&format!("{:start$}{text}", ""), width, start + 2)
    };
    let mut out = columns.line(&PLAN_HEADER, width);
    for p in &plan.probes {
        let [status, probe, how] = plan_row(p);
        if probe.chars().count() > PROBE_COLUMN_MAX {
            out += &columns.line(&[status, probe], width);
            out += &columns.line(&[String::new(), String::new(), how], width);
        } else {
            out += &columns.line(&[status, probe, how], width);
        }
        if let Outcome::Attached { caveat: Some(c), .. } = &p.outcome {
            out += &note(format!("caveat: {c}"));
        }
        for a in &p.failed_attempts {
            out += &note(if p.attached() {
                format!("(not {} {}: {})", a.mechanism, a.target, a.reason)
            } else {
                format!("{} {}: {}", a.mechanism, a.target, a.reason)
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let refused = |target: &str| Attempt {
            mechanism: "fentry+fexit".into(),
            target: target.into(),
            reason: AttachFailure::TrampolinesRefused,
        };
        let no_kprobes = |target: &str| Attempt {
            mechanism: "kprobe+kretprobe".into(),
            target: target.into(),
            reason: AttachFailure::KprobesNotBuiltIn,
        };
        let plan = Plan {
            probes: vec![
                ProbePlan {
                    probe: "invalidate_range_start",
                    purpose: "who invalidates mirrored memory",
                    outcome: Outcome::Attached {
                        mechanism: "tracepoint".into(),
                        target: "mmu_notifier:invalidate_range_start".into(),
                        caveat: Some(
                            "only the compiler clone f.isra.0 exists; calls inlined elsewhere are not seen".into(),
                        ),
                    },
                    failed_attempts: vec![refused("__mmu_notifier_invalidate_range_start")],
                },
                ProbePlan {
                    probe: "hmm_range_fault walk",
                    purpose: "walk durations, -EBUSY returns and retry chains: the storm itself",
                    outcome: Outcome::Unavailable,
                    failed_attempts: vec![refused("hmm_range_fault"), no_kprobes("hmm_range_fault")],
                },
            ],
        };
        Report {
            kernel: KernelFacts {
                release: "6.18.0-test".into(),
                preempt_rt: false,
                btf_error: None,
                btf: true,
                jit_enabled: Some(true),
                tracefs: Err("tracefs is mounted at neither /sys/kernel/tracing nor /sys/kernel/debug/tracing: \
                              mount it with mount -t tracefs nodev /sys/kernel/tracing"
                    .into()),
                kprobes_built_in: false,
                layout: Vec::new(),
            },
            program_types: vec![TypeCheck {
                program_type: "fentry",
                target: None,
                attached: false,
                counted: 0,
                calls: 3,
                reason: Some(AttachFailure::TrampolinesRefused.to_string()),
                failures: vec![AttachFailure::TrampolinesRefused],
            }],
            capabilities: vec![("retry-storm".into(), plan)],
        }
    }

    #[test]
    fn no_line_of_the_text_report_is_wider_than_the_terminal() {
        for width in [60, 80, 100] {
            let text = render(&report(), width);
            for line in text.lines() {
                assert!(line.chars().count() <= width, "{line:?} is over {width} columns:\n{text}");
            }
            let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(words.contains("kprobes are not built into this kernel (CONFIG_KPROBES is off)"), "{text}");
        }
    }

    #[test]
    fn the_plan_header_is_aligned_with_its_rows() {
        let text = render(&report(), 200);
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().position(|l| l.trim_start().starts_with("STATUS")).unwrap();
        let probe_column = lines[header].find("PROBE").unwrap();
        let how_column = lines[header].find("ATTACHED AS").unwrap();
        let ok = lines.iter().find(|l| l.trim_start().starts_with("ok ")).unwrap();
        let miss = lines.iter().find(|l| l.trim_start().starts_with("MISS ")).unwrap();
        assert_eq!(ok.find("invalidate_range_start"), Some(probe_column), "{text}");
        assert_eq!(miss.find("hmm_range_fault walk"), Some(probe_column), "{text}");
        assert_eq!(ok.find("tracepoint on"), Some(how_column), "{text}");
        assert_eq!(miss.find("lost:"), Some(how_column), "{text}");
        let types = lines.iter().position(|l| l.trim_start().starts_with("TYPE")).unwrap();
        assert_eq!(lines[types + 1].find("unavailable:"), lines[types].find("RESULT"), "{text}");
    }

    /// Debian's 7.2 as first seen: a kprobe attached but counted none of the fsync calls. The
    /// report says so once, and names the plans that rely on kprobes here.
    #[test]
    fn a_type_that_attaches_but_sees_nothing_names_the_plans_that_use_it() {
        let mut report = report();
        report.program_types.push(TypeCheck {
            program_type: "kprobe",
            target: Some("vfs_fsync_range".into()),
            attached: true,
            counted: 0,
            calls: 3,
            reason: None,
            failures: Vec::new(),
        });
        report.capabilities.push((
            "thp-why".into(),
            Plan {
                probes: vec![ProbePlan {
                    probe: "THP allow-check",
                    purpose: "",
                    outcome: Outcome::Attached {
                        mechanism: "kprobe+kretprobe".into(),
                        target: "__thp_vma_allowable_orders".into(),
                        caveat: None,
                    },
                    failed_attempts: Vec::new(),
                }],
            },
        ));
        let text = render(&report, 100);
        let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(words.contains("attached but saw 0 of 3 events"), "{text}");
        assert!(
            words.contains("note: kprobe attached to vfs_fsync_range but saw 0 of 3 fsync calls")
                && words.contains("read the live counts of thp-why (THP allow-check) as lower bounds"),
            "{text}"
        );
        assert_eq!(words.matches("note: ").count(), 1, "fentry did not attach: no note for it\n{text}");
    }

    fn type_check(program_type: &'static str, failures: Vec<AttachFailure>) -> TypeCheck {
        TypeCheck {
            program_type,
            target: None,
            attached: failures.is_empty(),
            counted: if failures.is_empty() { 3 } else { 0 },
            calls: 3,
            reason: None,
            failures,
        }
    }

    /// Without kprobes the callbacks cannot be timed: the row says so once for both program
    /// types; with them it says how they will be attached.
    #[test]
    fn the_subscriber_callbacks_row_follows_the_kprobe_check() {
        let without = [
            type_check("kprobe", vec![AttachFailure::KprobesNotBuiltIn, AttachFailure::KprobesNotBuiltIn]),
            type_check("kretprobe", vec![AttachFailure::KprobesNotBuiltIn]),
            type_check("tracepoint", Vec::new()),
        ];
        let row = subscriber_callbacks(&without, None);
        assert!(!row.attached());
        assert_eq!(row.failed_attempts.len(), 1, "{row:?}");
        assert_eq!(row.failed_attempts[0].mechanism, "kprobe+kretprobe");
        assert_eq!(row.failed_attempts[0].reason, AttachFailure::KprobesNotBuiltIn);
        let with = [type_check("kprobe", Vec::new()), type_check("kretprobe", Vec::new())];
        let row = subscriber_callbacks(&with, None);
        assert_eq!(row.mechanism(), Some("kprobe+kretprobe"), "{row:?}");
        // Before 6.1 the kprobes attach, but their run-time allocated table would warn: refused.
        let row = subscriber_callbacks(&with, Some("no BPF memory allocator".into()));
        assert!(!row.attached(), "{row:?}");
        assert_eq!(row.failed_attempts[0].reason, AttachFailure::Other("no BPF memory allocator".into()));
    }

    /// Every capability's table puts its columns in the same place, and a probe name too long
    /// for the column (a long kernel function) gets a line of its own instead of pushing the
    /// last column off the screen.
    #[test]
    fn the_plans_line_up_and_a_long_probe_name_gets_its_own_line() {
        let mut report = report();
        report.capabilities.push((
            "latency".into(),
            Plan {
                probes: vec![ProbePlan {
                    probe: "madvise_cold_or_pageout_pte_range",
                    purpose: "how long it held the CPU",
                    outcome: Outcome::Unavailable,
                    failed_attempts: Vec::new(),
                }],
            },
        ));
        for width in [80, 200] {
            let text = render(&report, width);
            assert!(text.lines().all(|l| l.chars().count() <= width.min(MAX_WIDTH)), "{text}");
            let headers: Vec<usize> = text.lines().filter_map(|l| l.find("ATTACHED AS")).collect();
            assert_eq!(headers.len(), 2, "{text}");
            assert_eq!(headers[0], headers[1], "the tables do not line up:\n{text}");
            let lines: Vec<&str> = text.lines().collect();
            let long = lines.iter().position(|l| l.ends_with("madvise_cold_or_pageout_pte_range")).expect(&text);
            assert_eq!(lines[long + 1].find("lost:"), Some(headers[0]), "{text}");
        }
    }
}

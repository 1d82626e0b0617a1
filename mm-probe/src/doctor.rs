//! `mm-probe doctor`: what this kernel offers and what each capability will use, tried for real.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::{
    cli::DoctorArgs,
    kernel::{Kernel, btf::VMLINUX_BTF, layout::Layout, privileges, tracefs},
    latency,
    probes::{LogicalProbe, MapFamily, Outcome, Plan, Planner, load_object},
    report::json,
    retry_storm,
    selftest::{self, TypeCheck},
    thp_why,
};

/// The capabilities and their catalogs, in the order `doctor` prints them.
pub const CAPABILITIES: &[(&str, &[LogicalProbe])] = &[
    ("retry-storm", retry_storm::probes::PROBES),
    ("thp-why", thp_why::probes::PROBES),
    ("latency", latency::probes::PROBES),
];

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
        print!("{}", render(&report));
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
    for (name, probes) in CAPABILITIES {
        // A fresh object per capability: the plan is what that capability would get alone.
        let mut ebpf = load_object(&kernel, MapFamily::ALL, &[])?;
        capabilities.push((name.to_string(), planner.attach_all(&mut ebpf, probes)));
    }
    Ok(Report { kernel: facts, program_types, capabilities })
}

pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let k = &report.kernel;
    out += &format!("kernel      {}{}\n", k.release, if k.preempt_rt { " (PREEMPT_RT)" } else { "" });
    out += &format!(
        "BTF         {}\n",
        match &k.btf_error {
            None => format!("yes ({VMLINUX_BTF})"),
            Some(e) => format!("NO: {e}"),
        }
    );
    out += &format!(
        "JIT         {}\n",
        match k.jit_enabled {
            Some(true) => "enabled",
            Some(false) => "disabled (programs run interpreted, slower)",
            None => "unknown (/proc/sys/net/core/bpf_jit_enable unreadable)",
        }
    );
    out += &format!("tracefs     {}\n", k.tracefs.as_ref().unwrap_or_else(|e| e));
    out +=
        &format!("kprobes     {}\n", if k.kprobes_built_in { "built in" } else { "not built in (CONFIG_KPROBES off)" });
    out += "\nprogram types (loaded, attached, and fired by this process's fsync calls):\n";
    for t in &report.program_types {
        let status = if t.works() {
            format!("works ({} of {} events seen)", t.counted, t.calls)
        } else if t.attached {
            format!("attached but saw {} of {} events", t.counted, t.calls)
        } else {
            format!("unavailable: {}", t.reason.as_deref().unwrap_or("unknown"))
        };
        out += &format!("  {:<15} {status}\n", t.program_type);
    }
    for (name, plan) in &report.capabilities {
        let attached = plan.probes.iter().filter(|p| p.attached()).count();
        out += &format!("\n{name}: {attached} of {} probes attach\n", plan.probes.len());
        for p in &plan.probes {
            match &p.outcome {
                Outcome::Attached { mechanism, target, caveat } => {
                    out += &format!("  ok    {:<28} {mechanism} on {target}\n", p.probe);
                    if let Some(c) = caveat {
                        out += &format!("        caveat: {c}\n");
                    }
                    for a in &p.failed_attempts {
                        out += &format!("        (not {} {}: {})\n", a.mechanism, a.target, a.reason);
                    }
                }
                Outcome::Unavailable => {
                    out += &format!("  MISS  {:<28} lost: {}\n", p.probe, p.purpose);
                    for a in &p.failed_attempts {
                        out += &format!("        {} {}: {}\n", a.mechanism, a.target, a.reason);
                    }
                }
            }
        }
    }
    out
}

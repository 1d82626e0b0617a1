//! The foundation on a real kernel: program types load, attach and count events this test
//! causes; doctor reports what is missing with the real reason; no privileges is a clean error.

mod common;

use std::process::Command;

use common::{first_of, json_lines, require_root, run_tool, vm_kernel};
use mm_probe::{kernel::Kernel, selftest::check_program_types};

#[test]
fn tracepoints_attach_and_count_this_process_fsyncs() {
    require_root();
    let kernel = Kernel::running().unwrap();
    let checks = check_program_types(&kernel, 5).unwrap();
    for check in &checks {
        eprintln!("{check:?}");
    }
    for kind in ["tracepoint", "raw_tracepoint", "tp_btf"] {
        let check = checks.iter().find(|c| c.program_type == kind).unwrap();
        assert!(check.attached, "{kind} must attach on every kernel: {check:?}");
        assert_eq!(check.counted, 5, "{kind} counted the wrong number of fsync calls: {check:?}");
    }
}

#[test]
fn function_probes_work_where_the_kernel_allows_them() {
    require_root();
    let kernel = Kernel::running().unwrap();
    let checks = check_program_types(&kernel, 4).unwrap();
    let has_kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    for check in checks.iter().filter(|c| ["kprobe", "kretprobe", "fentry", "fexit"].contains(&c.program_type)) {
        if vm_kernel().is_some() {
            // Every Debian kernel of the matrix has kprobes, BTF and trampolines.
            assert!(check.works(), "{} must attach and count 4 fsyncs on {:?}: {check:?}", check.program_type, vm_kernel());
        } else if check.attached {
            assert_eq!(check.counted, 4, "{check:?}");
        } else {
            let reason = check.reason.as_deref().unwrap_or_default();
            if check.program_type.starts_with('k') {
                assert!(!has_kprobes && reason.contains("CONFIG_KPROBES"), "{check:?}");
            } else {
                assert!(reason.contains("EPERM") || reason.contains("BTF"), "unexplained fentry failure: {check:?}");
            }
        }
    }
}

#[test]
fn doctor_json_reports_plans_with_reasons() {
    require_root();
    let out = run_tool(&["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let lines = json_lines(&out.stdout);
    let doctor = first_of(&lines, "doctor").expect("a doctor object");
    assert!(doctor["kernel"]["btf"].as_bool().unwrap());
    let capabilities = doctor["capabilities"].as_array().unwrap();
    let names: Vec<&str> = capabilities.iter().map(|c| c[0].as_str().unwrap()).collect();
    assert_eq!(names, ["retry-storm", "thp-why", "latency"]);
    for (name, plan) in capabilities.iter().map(|c| (&c[0], &c[1])) {
        for probe in plan["probes"].as_array().unwrap() {
            if probe["status"] == "unavailable" {
                let attempts = probe["failed_attempts"].as_array().unwrap();
                assert!(!attempts.is_empty(), "{name}: unavailable probe without a reason: {probe}");
                assert!(attempts.iter().all(|a| !a["reason"].as_str().unwrap().is_empty()), "{probe}");
            }
        }
    }
}

#[test]
fn without_privileges_doctor_says_what_is_needed_and_exits_1() {
    require_root();
    // setpriv drops to nobody with no capabilities, as an unprivileged user would run it.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(common::mm_probe())
        .arg("doctor")
        .output()
        .expect("running setpriv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line, not a panic: {stderr}");
    assert!(stderr.contains("CAP_BPF") && stderr.contains("root"), "{stderr}");
}

#[test]
fn bad_units_are_rejected_with_a_hint() {
    let out = run_tool(&["latency", "--threshold", "500"]);
    assert_eq!(out.status.code(), Some(1), "bad input is a usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no unit"), "{stderr}");
}

#[test]
fn doctor_leaves_no_program_loaded() {
    require_root();
    let before = common::our_programs();
    let out = run_tool(&["doctor"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(common::leftover_programs(&before), Vec::<String>::new(), "programs left in the kernel after doctor exited");
}

#[test]
fn leftover_detector_sees_our_programs_while_attached_and_none_after_drop() {
    require_root();
    let kernel = Kernel::running().unwrap();
    let before = common::our_programs();
    let mut ebpf = mm_probe::probes::load_object(&kernel, &[]).unwrap();
    let planner = mm_probe::probes::Planner::new(&kernel);
    let (_, tracepoint) = &mm_probe::selftest::PROBES[0];
    assert!(planner.attach(&mut ebpf, tracepoint).attached());
    assert!(!common::programs_loaded_since(&before).is_empty(), "the detector must see an attached program");
    drop(ebpf);
    assert_eq!(common::leftover_programs(&before), Vec::<String>::new());
}

//! The foundation on a real kernel: program types load, attach and count events this test
//! causes; doctor reports what is missing with the real reason; no privileges is a clean error.

mod common;

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Read as _},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{LINE_SCHEMAS, first_of, json_lines, require_root, run_tool, schema_violations, vm_kernel};
use mm_probe::{kernel::Kernel, probes::AttachFailure, report::json::Line, selftest::check_program_types};

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
            assert!(
                check.works(),
                "{} must attach and count 4 fsyncs on {:?}: {check:?}",
                check.program_type,
                vm_kernel()
            );
        } else if check.attached {
            assert_eq!(check.counted, 4, "{check:?}");
        } else {
            let failures = &check.failures;
            if check.program_type.starts_with('k') {
                assert!(!has_kprobes && failures.contains(&AttachFailure::KprobesNotBuiltIn), "{check:?}");
            } else {
                assert!(
                    failures.iter().any(|f| f.is_permission_refusal() || f.is_missing_btf()),
                    "unexplained fentry failure: {check:?}"
                );
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
    assert_eq!(doctor["command"], "doctor");
    assert!(doctor["kernel"]["btf"].as_bool().unwrap());
    let capabilities = doctor["capabilities"].as_array().unwrap();
    let names: Vec<&str> = capabilities.iter().map(|c| c[0].as_str().unwrap()).collect();
    assert_eq!(names, ["retry-storm", "thp-why", "latency", "invalidations"]);
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

/// What a new user reads first, at 80 columns: each reason once, no other architecture's
/// functions, and a row saying whether the invalidations' subscriber callbacks will be timed
/// (kprobes on callbacks found at run time) and why not.
#[test]
fn doctor_text_fits_80_columns_and_says_each_thing_once() {
    require_root();
    let out = Command::new(common::mm_probe()).arg("doctor").env("COLUMNS", "80").output().expect("mm-probe doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "over 80 columns:\n{line}");
    }
    let foreign = if cfg!(target_arch = "x86_64") { "__arm64_" } else { "__x64_" };
    assert!(!text.contains(foreign), "another architecture's function is reported:\n{text}");
    let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let kprobe_cell = words.split(" kprobe ").nth(1).and_then(|rest| rest.split(" kretprobe ").next()).expect(&words);
    assert!(kprobe_cell.matches("CONFIG_KPROBES").count() <= 1, "a reason repeated: {kprobe_cell}");
    let invalidations = words.split("invalidations: ").nth(1).expect("an invalidations plan");
    let has_kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    if has_kprobes {
        assert!(
            invalidations.contains("ok subscriber callbacks kprobe+kretprobe on each subscriber callback"),
            "{text}"
        );
    } else {
        assert!(invalidations.contains("MISS subscriber callbacks lost:"), "{text}");
        assert!(invalidations.contains("each subscriber callback: kprobes are not built into this kernel"), "{text}");
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

/// The hidden subcommand `cargo xtask bench` reads: its one JSON line, in its schema, counting
/// this process's getppid(2) calls.
#[test]
fn bench_ring_reports_this_process_getppid_calls_in_its_schema() {
    require_root();
    const CALLS: u64 = 1000;
    let mut child = Command::new(common::mm_probe())
        .args(["bench-ring", &std::process::id().to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting mm-probe bench-ring");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut attached = String::new();
    stdout.read_line(&mut attached).unwrap();
    assert_eq!(attached.trim(), "attached");
    for _ in 0..CALLS {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() };
    }
    common::interrupt(&child);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let lines = json_lines(&rest);
    let check = first_of(&lines, "ring_check").expect("a ring_check line");
    let n = |k: &str| check[k].as_u64().unwrap();
    // At least: the test harness itself may call getppid too.
    assert!(n("received") + n("lost") >= CALLS, "{check}");
}

#[test]
fn bad_units_are_rejected_with_a_hint() {
    let out = run_tool(&["latency", "--threshold", "500"]);
    assert_eq!(out.status.code(), Some(1), "bad input is a usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no unit"), "{stderr}");
}

/// Doctor loads and attaches every program type and every capability's probes; once it has
/// exited, none of the programs it held may still be loaded. They are told by the ids doctor
/// itself held (read from its descriptors while it ran), not by name, so that another mm-probe
/// started on the machine meanwhile is not taken for a leak.
#[test]
fn doctor_leaves_no_program_loaded() {
    require_root();
    let mut doctor = Command::new(common::mm_probe())
        .arg("doctor")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting mm-probe doctor");
    let mut held = BTreeSet::new();
    let status = loop {
        // Read before reaping: once reaped, its descriptors are no longer in /proc.
        held.extend(programs_held_by(doctor.id()));
        if let Some(status) = doctor.try_wait().expect("waiting for doctor") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut stderr = String::new();
    let _ = doctor.stderr.take().expect("piped stderr").read_to_string(&mut stderr);
    assert!(status.success(), "doctor ended with {status:?}: {stderr}");
    assert!(!held.is_empty(), "doctor was never seen holding a program: this test would prove nothing");
    eprintln!("doctor held {} programs while it ran: {held:?}", held.len());
    // The kernel frees a program after its last reference goes, through RCU: allow it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let loaded: BTreeSet<u32> = aya::programs::loaded_programs().filter_map(Result::ok).map(|p| p.id()).collect();
        let left: Vec<&u32> = held.intersection(&loaded).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "programs {left:?} of the {} doctor held are loaded after it exited",
            held.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ids of the eBPF programs process `pid` holds now: the kernel writes `prog_id:` in the
/// fdinfo of every program and link descriptor. Descriptors closed while being read are skipped.
fn programs_held_by(pid: u32) -> Vec<u32> {
    let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return Vec::new() };
    descriptors
        .flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|l| l.strip_prefix("prog_id:"))
                .filter_map(|id| id.trim().parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn leftover_detector_sees_our_programs_while_attached_and_none_after_drop() {
    require_root();
    let kernel = Kernel::running().unwrap();
    let before = common::our_programs();
    let mut ebpf = mm_probe::probes::load_object(&kernel, mm_probe::probes::MapFamily::ALL, &[]).unwrap();
    let planner = mm_probe::probes::Planner::new(&kernel);
    let (_, tracepoint) = &mm_probe::selftest::PROBES[0];
    assert!(planner.attach(&mut ebpf, tracepoint).attached());
    assert!(!common::programs_loaded_since(&before).is_empty(), "the detector must see an attached program");
    drop(ebpf);
    assert_eq!(common::leftover_programs(&before), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// The NDJSON schema family: the documents themselves (no kernel needed)

#[test]
fn every_schema_is_a_valid_draft_2020_12_document_that_compiles() {
    let common = common::schema_document(common::COMMON_SCHEMA);
    assert_eq!(common["$id"], common::COMMON_SCHEMA_ID, "the line schemas refer to common.schema.json by this $id");
    for (command, kind, text) in LINE_SCHEMAS.iter().chain([&("", "common", common::COMMON_SCHEMA)]) {
        let schema = common::schema_document(text);
        assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema", "{command} {kind}");
        if let Some(problem) = common::meta_schema_violation(&schema) {
            panic!("the {command} {kind} schema breaks the 2020-12 meta-schema {problem}");
        }
        if !command.is_empty() {
            common::compile_schema(text);
        }
    }
}

#[test]
fn every_line_the_code_can_print_has_a_schema_and_no_schema_is_stale() {
    let has_schema = |command: &str, kind: &str| LINE_SCHEMAS.iter().any(|(c, k, _)| (*c, *k) == (command, kind));
    for line in Line::ALL {
        assert!(has_schema(line.command(), line.kind()), "{line:?} has no schema under schemas/{}/", line.command());
    }
    for (command, kind, _) in LINE_SCHEMAS {
        assert!(
            Line::ALL.iter().any(|l| (l.command(), l.kind()) == (*command, *kind)),
            "schemas/{command}/{kind}.schema.json describes a line the code no longer prints"
        );
    }
}

/// Files under schemas/ that the tests would not check are as bad as a missing schema. The
/// source tree is not inside the qemu guests: there only the embedded copies exist.
#[test]
fn every_schema_file_is_embedded_in_the_tests() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
    let Ok(commands) = std::fs::read_dir(&root) else {
        eprintln!(
            "skipped: {} is not on this machine (a qemu guest); the embedded schemas were checked",
            root.display()
        );
        return;
    };
    for entry in commands.map(Result::unwrap).filter(|e| e.path().is_dir()) {
        let command = entry.file_name().to_string_lossy().into_owned();
        for file in std::fs::read_dir(entry.path()).unwrap().map(Result::unwrap) {
            let name = file.file_name().to_string_lossy().into_owned();
            let kind =
                name.strip_suffix(".schema.json").unwrap_or_else(|| panic!("{command}/{name}: not a .schema.json"));
            let embedded = LINE_SCHEMAS.iter().find(|(c, k, _)| (*c, *k) == (command.as_str(), kind));
            let on_disk = std::fs::read_to_string(file.path()).unwrap();
            assert_eq!(
                embedded.map(|e| e.2),
                Some(on_disk.as_str()),
                "schemas/{command}/{name} is not in LINE_SCHEMAS"
            );
        }
    }
}

#[test]
fn a_renamed_or_missing_field_breaks_the_schema() {
    let lost = serde_json::json!({
        "type": "lost_events", "command": "retry-storm", "schema_version": mm_probe::report::json::SCHEMA_VERSION,
        "walk_events": 0, "invalidate_events": 2, "walk_entries_missed": 0, "read_begin_callers": 0,
        "cause_brackets_missed": 0,
    });
    assert_eq!(schema_violations(&lost), Vec::<String>::new());
    let mut renamed = lost.clone();
    let value = renamed.as_object_mut().unwrap().remove("invalidate_events").unwrap();
    renamed["invalidation_events"] = value;
    assert_eq!(schema_violations(&renamed).len(), 2, "one field missing, one unknown: {renamed}");
    let mut other_command = lost.clone();
    other_command["command"] = "latency".into();
    assert!(!schema_violations(&other_command).is_empty(), "latency's lost_events has other fields");
    let mut old_version = lost;
    old_version["schema_version"] = 1.into();
    assert!(!schema_violations(&old_version).is_empty());
}

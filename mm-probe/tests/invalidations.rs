//! `mm-probe invalidations` against a real KVM: a VM whose memslot host threads madvise away
//! (testing/workloads kvm_storm), checked against the workload's own counts.
//!
//! The host's /dev/kvm is a software hypervisor with a shadow MMU: kvm->mmu_lock is taken for
//! write both by the notifier and by vCPU faults. Waits are inflated by tracing, so the tests
//! assert who waited on what and relations between runs, never times.

mod common;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use common::{mm_probe, require_root, run_tool, workload};
use serde_json::Value;

/// Whether this kernel can run the workload: /dev/kvm and KVM's tracepoints.
fn kvm_available() -> bool {
    let tracepoint = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|root| std::path::Path::new(root).join("events/kvm/kvm_unmap_hva_range").exists());
    std::path::Path::new("/dev/kvm").exists() && tracepoint
}

/// Runs kvm_storm under the tool (-p its pid, attached before the workload starts); returns the
/// workload's counts and the tool's summary line.
fn traced(workload_args: &[&str], tool_args: &[&str]) -> (Value, Value) {
    let mut storm = Command::new(workload("kvm_storm"))
        .args(workload_args)
        .arg("--wait")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting kvm_storm");
    let mut storm_out = BufReader::new(storm.stdout.take().expect("piped stdout"));
    let mut pid = String::new();
    storm_out.read_line(&mut pid).expect("kvm_storm prints its pid");
    let pid = pid.trim().to_string();
    let mut tool = Command::new(mm_probe())
        .args(["invalidations", "--json", "--duration", "120s", "-p", &pid])
        .args(tool_args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting mm-probe");
    let (send, lines) = mpsc::channel();
    let stdout = tool.stdout.take().expect("piped stdout");
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    let plan = common::tool_line(&lines.recv_timeout(Duration::from_secs(90)).expect("a plan line"));
    assert_eq!(plan["type"], "probe_plan", "{plan}");
    storm.stdin.take().expect("piped stdin").write_all(b"go\n").expect("starting the storm");
    let mut counts = String::new();
    storm_out.read_line(&mut counts).expect("kvm_storm's counts");
    assert!(storm.wait().expect("kvm_storm").success(), "kvm_storm failed");
    let counts: Value = serde_json::from_str(&counts).expect("kvm_storm prints one JSON object");
    // The run ends by itself once the -p process has exited.
    let status = tool.wait().expect("mm-probe");
    assert_eq!(status.code(), Some(0), "the run ends with a summary when the target exits");
    let summary = lines.iter().map(|l| common::tool_line(&l)).find(|l| l["type"] == "summary").expect("a summary line");
    assert_eq!(summary["stopped_by"], "target_exited", "{summary}");
    eprintln!("== kvm_storm {workload_args:?}\nworkload: {counts}\ntool: {summary}");
    (counts, summary)
}

fn u(value: &Value) -> u64 {
    value.as_u64().unwrap_or_else(|| panic!("not a count: {value}"))
}

/// The VM's mmu_lock, if it was contended.
fn mmu_lock(summary: &Value) -> Option<&Value> {
    summary["locks"].as_array().unwrap().iter().find(|l| l["class"] == "kvm_mmu_lock")
}

/// The invalidations the madvise threads made, as the tool counted them.
fn madvise_invalidations(summary: &Value) -> u64 {
    summary["invalidations"]["by_invalidator"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["comm"] == "kvm-madv")
        .map(|r| u(&r["count"]))
        .sum()
}

fn causes(summary: &Value) -> Vec<String> {
    summary["advice"].as_array().unwrap().iter().map(|a| a["cause"].as_str().unwrap().to_string()).collect()
}

/// Outside the memslot, a thread's start and end invalidate a few ranges of its own (the C
/// library's per-thread malloc arena is mapped, trimmed and protected, its stack released with
/// madvise): 8 per thread on the host.
const THREAD_OWN_UNMAPS: u64 = 16;

/// Every madvise inside the memslot is one kvm_unmap_hva_range; each thread adds a few of its own.
fn assert_unmaps_match(counts: &Value, summary: &Value, threads: u64) {
    let calls = u(&counts["madvise_calls"]);
    let seen = madvise_invalidations(summary);
    assert!((calls..=calls + THREAD_OWN_UNMAPS * threads).contains(&seen), "{seen} unmaps for {calls} madvise calls");
}

#[test]
fn one_invalidating_thread_meets_no_contention_and_the_unmaps_match_its_madvises() {
    require_root();
    if !kvm_available() {
        eprintln!("skipped: no /dev/kvm or no kvm tracepoints on this kernel");
        return;
    }
    let (counts, summary) = traced(&["--threads", "1", "--passes", "5", "--size", "32M"], &[]);
    assert_unmaps_match(&counts, &summary, 1);
    assert!(mmu_lock(&summary).is_none(), "nobody else takes the VM's mmu_lock: {}", summary["locks"]);
    assert_eq!(summary["invalidations"]["by_invalidator"][0]["owner_tgid"], counts["pid"]);
    // Nothing this kernel cannot measure is shown as 0.
    if summary["callbacks_observable"] == false {
        let callback = summary["metrics"].as_array().unwrap().iter().find(|m| m["metric"] == "callback_mean").unwrap();
        assert!(callback["value"].is_null(), "{callback}");
    }
}

#[test]
fn two_threads_contend_on_the_vms_mmu_lock_inside_the_notifier_and_batching_lowers_it() {
    require_root();
    if !kvm_available() {
        eprintln!("skipped: no /dev/kvm or no kvm tracepoints on this kernel");
        return;
    }
    // A low wait threshold, so that the advice is given whenever the notifier waits at all.
    let low = ["--wait-warn", "1ns", "--wait-crit", "1s"];
    let (counts, small) = traced(&["--threads", "2", "--passes", "10", "--size", "32M"], &low);
    assert_unmaps_match(&counts, &small, 2);
    let lock = mmu_lock(&small).unwrap_or_else(|| panic!("two madvise threads contend: {}", small["locks"]));
    assert_eq!(lock["name"], format!("kvm->mmu_lock of VM pid {}", counts["pid"]));
    assert_eq!(lock["owner_tgid"], counts["pid"]);
    let paths = lock["paths"].as_array().unwrap();
    assert!(paths.iter().any(|p| p["in_notifier"] == true), "waited in the notifier: {paths:?}");
    assert!(
        paths.iter().all(|p| p["waiters"] == serde_json::json!(["kvm-madv"])),
        "only the madvise threads: {paths:?}"
    );
    assert!(causes(&small).contains(&"fine-grained invalidations".to_string()), "{}", small["advice"]);

    // The same bytes in 2 MiB madvises: a 512th of the invalidations, far fewer waits.
    let (counts, batched) = traced(&["--threads", "2", "--passes", "10", "--size", "32M", "--chunk", "2M"], &low);
    assert_unmaps_match(&counts, &batched, 2);
    let contended = |s: &Value| mmu_lock(s).map_or(0, |l| u(&l["contended"]));
    assert!(
        contended(&batched) * 10 < contended(&small),
        "batched {} vs 4 KiB {} contended acquisitions",
        contended(&batched),
        contended(&small)
    );
    assert!(!causes(&batched).contains(&"fine-grained invalidations".to_string()), "{}", batched["advice"]);
}

#[test]
fn a_running_vcpu_waits_on_the_same_lock_in_its_fault_path() {
    require_root();
    if !kvm_available() {
        eprintln!("skipped: no /dev/kvm or no kvm tracepoints on this kernel");
        return;
    }
    let (counts, summary) = traced(&["--threads", "2", "--passes", "10", "--size", "32M", "--vcpus", "1"], &[]);
    assert!(u(&counts["vcpu_passes"]) > 0, "the guest ran: {counts}");
    let lock = mmu_lock(&summary).unwrap_or_else(|| panic!("contended: {}", summary["locks"]));
    let fault = lock["paths"].as_array().unwrap().iter().find(|p| p["path"] == "vcpu_fault");
    let fault = fault.unwrap_or_else(|| panic!("the vCPU's faults wait on mmu_lock: {}", lock["paths"]));
    assert_eq!(fault["waiters"], serde_json::json!(["kvm-vcpu"]));
    assert_eq!(fault["in_notifier"], false);
}

#[test]
fn a_missing_process_is_a_usage_error() {
    require_root();
    let out = run_tool(&["invalidations", "-p", "4194303", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

//! The collapse path on a real kernel: khugepaged's scans of a workload's memory, counted by
//! result name while the tool watches, and what the report makes of them.

use super::*;

const KHUGEPAGED: &str = "/sys/kernel/mm/transparent_hugepage/khugepaged";

/// Sets khugepaged knobs for the test's duration; the old values come back on drop, in reverse
/// order (also when the test fails). Writing scan_sleep_millisecs wakes khugepaged.
fn khugepaged_set(knobs: &[(&str, &str)]) -> common::Knobs {
    let mut set = common::Knobs::default();
    for &(knob, value) in knobs {
        set.set(format!("{KHUGEPAGED}/{knob}"), value);
    }
    set
}

/// A thp_collapse workload: MIB MiB touched every EVERY-th page under MADV_NOHUGEPAGE.
fn collapse_workload(mib: &str, every: &str) -> (Workload, u64, u64) {
    let mut w = Workload::spawn("thp_collapse", &[mib, every]);
    let line = w.next();
    (w, line["start"].as_u64().unwrap(), line["len"].as_u64().unwrap())
}

fn advise(w: &mut Workload) {
    w.command("advise");
    let answer = w.next();
    assert_eq!(answer["advised"], true, "{answer}");
}

fn region_huge_kb(pid: u32, start: u64) -> u64 {
    Proc::new(pid).smaps().unwrap().into_iter().find(|v| v.start == start).map_or(0, |v| v.anon_huge_kb)
}

/// Polls `done` until it holds or the answer timeout passes.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + ANSWER_TIMEOUT;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// khugepaged's completed passes over every registered mm.
fn full_scans() -> u64 {
    std::fs::read_to_string(format!("{KHUGEPAGED}/full_scans")).unwrap().trim().parse().unwrap()
}

fn result_count(report: &Value, name: &str) -> u64 {
    let results = report["collapse"]["results"].as_array().unwrap();
    results.iter().filter(|r| r["result"] == name).map(|r| r["count"].as_u64().unwrap()).sum()
}

/// The scan tracepoint is there wherever THP is; without THP nothing here applies.
fn collapse_applies() -> bool {
    require_root();
    if !thp_built_in() {
        eprintln!("this kernel has no THP: khugepaged does not exist, the test does not apply");
        return false;
    }
    true
}

/// Both of this kernel's sources of scan result names agree: BTF's `enum scan_result` and the
/// scan tracepoint's printed table (mapped to BTF's spelling), value for value.
#[test]
fn scan_result_names_from_btf_and_tracefs_agree() {
    if !collapse_applies() {
        return;
    }
    let kernel = Kernel::running().unwrap();
    let from_btf = ScanResults::from_btf(&kernel.btf().unwrap()).expect("enum scan_result in BTF");
    let root = mm_probe::kernel::tracefs::root().unwrap();
    let printed = tracefs::print_symbols(&root, "huge_memory", "mm_khugepaged_scan_pmd", "status").unwrap();
    let from_tracefs = ScanResults::from_tracefs(&printed);
    eprintln!("scan results of this kernel: {printed:?}");
    for (value, name) in &printed {
        let raw = *value as u32;
        assert_eq!(from_btf.name(raw), from_tracefs.name(raw), "result {raw} (printed {name})");
        assert!(scan_result::meaning(&from_btf.name(raw)).is_some(), "no meaning for {}", from_btf.name(raw));
    }
    assert_eq!(from_btf.name(1), "succeed");
}

/// A region filled with small pages and then madvised huge is collapsed by khugepaged while the
/// tool watches: counted as collapses of the target, AnonHugePages grows by the region.
#[test]
fn khugepaged_collapsing_a_region_is_counted_as_success() {
    if !collapse_applies() {
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    let _pace = khugepaged_set(&[("pages_to_scan", "32768"), ("scan_sleep_millisecs", "100")]);
    let (mut w, start, len) = collapse_workload("16", "1");
    let pid = w.target();
    assert_eq!(region_huge_kb(pid, start), 0, "faults under MADV_NOHUGEPAGE give small pages");
    let report = thp_why_live(pid, || {
        advise(&mut w);
        wait_for("khugepaged to collapse the region", || region_huge_kb(pid, start) * 1024 >= len);
    });
    let c = &report["collapse"];
    eprintln!("collapse: {c}");
    assert_eq!(c["observed"], true, "{c}");
    let pmds = len >> 21;
    // Under enabled=madvise only the advised region is eligible: exactly its ranges collapse.
    assert_eq!(result_count(&report, "succeed"), pmds, "{pmds} ranges collapsed: {c}");
    assert_eq!(c["collapsed"].as_u64(), Some(pmds), "{c}");
    assert!(c["by_khugepaged"].as_u64().unwrap() >= pmds && c["pages_collapsed_delta"].as_i64() >= Some(pmds as i64));
    assert_eq!(c["reached"], true, "{c}");
    assert!(c["anon_huge_bytes_delta"].as_i64().unwrap() >= len as i64, "{c}");
    if !report["process"]["mm_flags"].is_null() {
        assert_eq!(c["registered"], true, "madvise(MADV_HUGEPAGE) put it on khugepaged's list: {c}");
    }
    let success = c["results"].as_array().unwrap().iter().find(|r| r["result"] == "succeed").unwrap();
    assert_eq!((success["outcome"].as_str(), success["origin"].as_str()), (Some("collapsed"), Some("khugepaged")));
    assert_eq!(c["failed"], 0, "{c}");
    // The region is all huge now, and the workload's other memory (its heap and stack, without
    // MADV_HUGEPAGE) is less than one huge page: no fix is offered, and the text says so.
    assert_eq!(report["verdict"]["advice"], serde_json::json!([]), "{}", report["reasons"]);
    let out = run_tool(&["thp-why", &pid.to_string(), "--duration", "0s"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let fix = text.split("\nFix\n").nth(1).unwrap().split("\n\n").next().unwrap();
    assert!(fix.starts_with("  nothing to fix: "), "{text}");
}

/// A sparsely touched region (64 of each 2 MiB's 512 pages) under a lowered max_ptes_none stays
/// small: every scan of it fails with exceed_none_pte, by name, with the knob and its value, and
/// the advice names the knob and MADV_COLLAPSE.
#[test]
fn a_sparse_region_fails_with_exceed_none_pte_under_a_low_max_ptes_none() {
    if !collapse_applies() {
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    let _pace = khugepaged_set(&[("max_ptes_none", "32"), ("pages_to_scan", "32768"), ("scan_sleep_millisecs", "100")]);
    let (mut w, start, len) = collapse_workload("16", "8");
    let pid = w.target();
    let pmds = len >> 21;
    // The kernel's count of these failures (thp_scan_exceed_none_pte) is not in 5.10's vmstat:
    // there two of khugepaged's full passes (its own count) have scanned every range.
    let failures_counted = std::fs::read_to_string("/proc/vmstat").unwrap().contains("thp_scan_exceed_none_pte ");
    let (before, passes_before) = (common::vmstat_or_zero("thp_scan_exceed_none_pte"), full_scans());
    let report = thp_why_live(pid, || {
        advise(&mut w);
        wait_for("khugepaged to scan the region", || match failures_counted {
            true => common::vmstat_or_zero("thp_scan_exceed_none_pte") >= before + pmds,
            false => full_scans() >= passes_before + 2,
        });
    });
    let c = &report["collapse"];
    eprintln!("collapse: {c}");
    assert_eq!(region_huge_kb(pid, start), 0, "the region stayed small");
    assert!(result_count(&report, "exceed_none_pte") >= pmds, "each of its {pmds} ranges failed: {c}");
    let failure = c["results"].as_array().unwrap().iter().find(|r| r["result"] == "exceed_none_pte").unwrap();
    assert_eq!((failure["knob"].as_str(), failure["knob_value"].as_u64()), (Some("max_ptes_none"), Some(32)));
    assert_eq!(failure["outcome"], "failed");
    let advice: Vec<&str> = c["advice"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(advice.iter().any(|a| a.contains("failed with exceed_none_pte") && a.contains("max_ptes_none is 32")));
    assert!(advice.iter().any(|a| a.contains("MADV_COLLAPSE")), "{advice:?}");
    // The refusals are a cause of the verdict and of the ranking, with their count and knob.
    let refused = reason(&report, "collapse_refused").unwrap_or_else(|| panic!("{}", report["reasons"]));
    assert!(refused["count"].as_u64().unwrap() >= pmds, "{refused}");
    assert!(refused["detail"].as_str().unwrap().contains("exceed_none_pte"), "{refused}");
    assert_eq!(vma(&report, &format!("{start:#x}"))["reason"], "collapse_refused");
    let verdict = report["verdict"]["headline"].as_str().unwrap();
    assert!(verdict.contains("(khugepaged/max_ptes_none is 32) (collapse_refused)"), "{verdict}");
    assert!(
        report["verdict"]["advice"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["action"].as_str().unwrap().contains("max_ptes_none"))
    );
}

/// A registered process that khugepaged does not come to during a short run (it sleeps 10
/// minutes between passes) is reported as not reached, with khugepaged's pace, not as an empty
/// result.
#[test]
fn a_process_khugepaged_does_not_reach_is_reported_as_such() {
    if !collapse_applies() {
        return;
    }
    let _policy = EnabledGuard::set("madvise");
    // The write wakes khugepaged for one pass; the decoy, registered next, makes its list
    // non-empty (so that the target's registration wakes nobody) and shows when the pass is over.
    let _pace = khugepaged_set(&[("scan_sleep_millisecs", "600000")]);
    let (mut decoy, decoy_start, decoy_len) = collapse_workload("4", "1");
    advise(&mut decoy);
    let pass = Duration::from_secs(if vm_kernel().is_some() { 20 } else { 3 });
    let deadline = std::time::Instant::now() + pass;
    while region_huge_kb(decoy.target(), decoy_start) * 1024 < decoy_len && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));

    let (mut w, start, _) = collapse_workload("8", "1");
    advise(&mut w);
    let pid = w.target();
    let report = thp_why_live(pid, || std::thread::sleep(Duration::from_secs(2)));
    let c = &report["collapse"];
    eprintln!("collapse: {c}");
    assert_eq!(region_huge_kb(pid, start), 0);
    assert_eq!(
        (c["observed"].as_bool(), c["scans"].as_u64(), c["reached"].as_bool()),
        (Some(true), Some(0), Some(false))
    );
    if !report["process"]["mm_flags"].is_null() {
        assert_eq!(c["registered"], true, "{c}");
    }
    let why = c["not_reached"].as_str().unwrap();
    assert!(why.contains("did not scan this process") && why.contains("600000 ms"), "{why}");
    assert!(c["results"].as_array().unwrap().is_empty());
    assert!(c["candidate_small_bytes"].as_u64().unwrap() >= 8 << 20, "{c}");
}

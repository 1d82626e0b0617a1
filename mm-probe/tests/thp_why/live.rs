//! The live window: faults and prctl calls caught, and, where the kernel lets the allow-check be
//! probed (the Debian guests), its counts against the checks a workload's first touches cause.

use super::*;

#[test]
fn live_round_is_counted_and_a_prctl_is_caught() {
    require_root();
    let (mut w, _) = Workload::regions(&[]);
    let target = w.target();
    let mut round = Value::Null;
    let report = thp_why_live(target, || {
        w.command("round");
        round = w.next();
        w.command("prctl-disable");
        assert_eq!(w.next()["done"], "prctl-disable");
    });
    assert_eq!(round["round"], 1);
    // The prctl during the run: caught by syscalls:sys_enter_prctl and named.
    let calls = report["process"]["prctl_calls"].as_array().unwrap();
    let call = calls.iter().find(|c| c["tgid"] == target).unwrap_or_else(|| panic!("prctl not caught: {calls:?}"));
    assert_eq!((call["effect"].as_str(), call["relation"].as_str()), (Some("disable"), Some("target")));
    assert_eq!(report["process"]["thp_disable"], "completely");
    assert_eq!(reason(&report, "prctl_thp_disable").unwrap()["set_by"]["pid"], target);
    let faults = &report["faults"];
    assert_eq!(faults["observed"], true, "exceptions:page_fault_user attaches everywhere on x86: {faults}");
    // VM_NOHUGEPAGE: one fault per 4 KiB page, whatever the policy. So for the regions too
    // small or unaligned for a 2 MiB page, as long as no smaller (mTHP) size is enabled.
    let nohuge = vma(&report, &start_of(region(&round, "nohuge")));
    assert_eq!(nohuge["live"]["faults"], 1024, "{nohuge}");
    if !thp_built_in() {
        // Without THP every page of every region faults on its own.
        for (name, pages) in [("advised", 1024), ("plain", 1024), ("small", 256), ("unaligned", 640)] {
            assert_eq!(vma(&report, &start_of(region(&round, name)))["live"]["faults"], pages, "{name}");
        }
        assert_eq!(faults["in_huge_pages"], 0);
        return;
    }
    let small_sizes_enabled = report["system"]["sizes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["size_bytes"] != 2048 * 1024 && !s["enabled"].is_null() && s["enabled"] != "never");
    if !small_sizes_enabled {
        for (name, pages) in [("small", 256), ("unaligned", 640)] {
            let v = vma(&report, &start_of(region(&round, name)));
            assert_eq!(v["live"]["faults"], pages, "{name}: {v}");
        }
    }
    // A region backed by huge pages faulted once per 2 MiB, and those faults were satisfied by them.
    let advised = vma(&report, &start_of(region(&round, "advised")));
    let huge_pages = advised["anon_huge_bytes"].as_u64().unwrap() / (2 << 20);
    assert!(huge_pages > 0, "{advised}");
    assert_eq!(advised["live"]["faults"].as_u64().unwrap(), 1024 - huge_pages * 511, "{advised}");
    assert!(faults["in_huge_pages"].as_u64().unwrap() >= huge_pages, "{faults}");
    assert!(faults["total"].as_u64().unwrap() >= 1024 + 256 + 640, "{faults}");
    let per_region: Vec<String> = ["advised", "plain", "nohuge", "small", "unaligned"]
        .iter()
        .map(|name| format!("{name} {}", vma(&report, &start_of(region(&round, name)))["live"]["faults"]))
        .collect();
    eprintln!(
        "{}: round faults: {}; total {}, ~{} in huge pages",
        vm_kernel().unwrap_or("host".into()),
        per_region.join(", "),
        faults["total"],
        faults["in_huge_pages"]
    );
    assert!(
        report["verdict"]["headline"].as_str().unwrap().contains("by prctl in the process itself (caught live)"),
        "{}",
        report["verdict"]
    );
}

/// A fault table shrunk to one 2 MiB block (the test hook): the faults of a round it cannot
/// place in their range are counted lost (`fault_ranges`), and the total stays exact.
#[test]
fn a_full_fault_table_is_counted_as_lost_and_the_total_stays_exact() {
    require_root();
    let (mut w, _) = Workload::regions(&[]);
    let target = w.target();
    let (report, lost) = thp_why_live_lines(
        target,
        || {
            w.command("round");
            w.next();
        },
        true,
        &[("MM_PROBE_MAP_ENTRIES", "THP_FAULTS=1")],
    );
    let faults = &report["faults"];
    assert_eq!(faults["observed"], true, "{faults}");
    // The round touches five regions, in more than one 2 MiB block.
    assert!(lost["fault_ranges"].as_u64().unwrap() > 0, "{lost}");
    let placed: u64 = report["vmas"].as_array().unwrap().iter().map(|v| v["live"]["faults"].as_u64().unwrap()).sum();
    let total = faults["total"].as_u64().unwrap();
    assert!(placed + lost["fault_ranges"].as_u64().unwrap() >= total, "{placed} placed, {lost}, {total} in all");
    assert!(total >= 256 + 640, "the total is counted apart: {faults}");
}

/// Guests only: the allow-check counts of a round equal the PMD-level checks its first touches
/// cause. Tolerance: exact on 6.8+ (the PUD-level check of an anonymous VMA stops in the
/// wrapper, whose mask has no PUD order); on 6.1 up to one extra PUD-level check per region,
/// made when its first touch is also the first in a 1 GiB range (pud_none).
fn pud_tolerance(check: &AllowCheck, regions: usize) -> u64 {
    if check.has_wrapper() { 0 } else { regions as u64 }
}

fn fault_checks(vma: &Value) -> (u64, u64) {
    let c = &vma["live"]["by_call"]["page_fault"];
    (c["checks"].as_u64().unwrap_or(0), c["denied"].as_u64().unwrap_or(0))
}

/// Guests only: one round of the workload `spawn` starts, traced live under THP policy `mode`
/// (set before the workload maps anything), as (report, round, workload). `None` where the
/// allow-check cannot be attached: then there is nothing to check.
fn traced_round(mode: &str, spawn: impl FnOnce() -> (Workload, Value)) -> Option<(Value, Value, Workload)> {
    if !allow_check_attachable() {
        return None;
    }
    let _policy = EnabledGuard::set(mode);
    let (mut workload, _) = spawn();
    let mut round = Value::Null;
    let report = thp_why_live(workload.target(), || {
        workload.command("round");
        round = workload.next();
    });
    assert!(allow_check_observed(&report), "{}", report["live"]);
    Some((report, round, workload))
}

#[test]
fn guest_allow_check_counts_match_the_workload() {
    require_root();
    let Some((report, round, _)) = traced_round("always", || Workload::regions(&[])) else { return };
    let check = kernel_allow_check();
    let live = &report["live"];
    assert_eq!(live["unexplained"], 0, "{live}");
    assert_eq!(live["disagreements"], 0, "{live}");
    assert_eq!(live["counters"]["check_map_full"], 0, "{live}");
    let expected_denials = [
        ("advised", None),
        ("plain", None),
        ("nohuge", Some("vma_nohugepage")),
        ("small", Some("vma_too_small")),
        ("unaligned", Some("vma_unaligned")),
    ];
    let mut total = 0;
    for (name, denial) in expected_denials {
        let r = region(&round, name);
        let v = vma(&report, &start_of(r));
        let pmd_ranges = r["pmd_ranges"].as_u64().unwrap();
        let (checks, denied) = fault_checks(v);
        eprintln!(
            "{name}: {pmd_ranges} first touches of 2 MiB ranges, {checks} fault-path checks, {denied} denied; {}",
            v["live"]
        );
        assert!(
            checks >= pmd_ranges && checks <= pmd_ranges + pud_tolerance(check, 1),
            "{name}: {checks} fault-path checks for {pmd_ranges} 2 MiB ranges: {v}"
        );
        total += checks;
        // Faults skip the size check (do_huge_pmd_anonymous_page falls back later), so only
        // VM_NOHUGEPAGE refuses a fault here; khugepaged refuses the small and unaligned ones.
        let fault_denials_expected = if name == "nohuge" { checks } else { 0 };
        assert_eq!(denied, fault_denials_expected, "{name}: {v}");
        let denied_by = v["live"]["denied_by"].as_object().unwrap();
        for (code, n) in denied_by {
            assert_eq!(Some(code.as_str()), denial, "{name}: {n} denials decoded as {code}: {v}");
        }
        match denial {
            None => {
                assert_eq!(v["reason"], "none", "{name}: {v}");
                assert!(v["anon_huge_bytes"].as_u64().unwrap() > 0, "{name} is eligible and touched: {v}");
            }
            Some(code) => assert_eq!(v["reason"], code, "{name}: {v}"),
        }
    }
    let regions = expected_denials.len();
    assert!(total >= 9 && total <= 9 + pud_tolerance(check, regions), "{total} fault-path checks for 9 ranges");
    let nohuge = reason(&report, "vma_nohugepage").unwrap();
    assert!(nohuge["count"].as_u64().unwrap() >= 2, "{nohuge}");
    assert!(report["faults"]["in_huge_pages"].as_u64().unwrap() >= 4, "{}", report["faults"]);
    eprintln!("{}: {total} fault-path checks on the round's regions", vm_kernel().unwrap_or_default());
}

#[test]
fn guest_prctl_denials_are_counted_and_attributed() {
    require_root();
    let Some((report, round, tree)) = traced_round("always", || Workload::tree(&[])) else { return };
    let check = kernel_allow_check();
    let mut fault_checks_total = 0;
    for r in round["regions"].as_array().unwrap() {
        let v = vma(&report, &start_of(r));
        let (checks, denied) = fault_checks(v);
        let pmd_ranges = r["pmd_ranges"].as_u64().unwrap();
        assert!(checks >= pmd_ranges && checks <= pmd_ranges + pud_tolerance(check, 1), "{}: {v}", r["name"]);
        assert_eq!(denied, checks, "every check of a prctl-disabled process is denied: {v}");
        // VM_NOHUGEPAGE is tested before the mm flag, so the nohuge region's fault-path
        // denials name it. Its khugepaged check at mmap time, before madvise set the flag,
        // saw only the mm flag: the key's own vm_flags decide, and say prctl.
        let denied_by = &v["live"]["denied_by"];
        let all: u64 = denied_by.as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum();
        assert_eq!(all, v["live"]["denied"].as_u64().unwrap(), "every denial explained: {v}");
        if r["name"] == "nohuge" {
            assert_eq!(denied_by["vma_nohugepage"], denied, "{v}");
            assert!(
                denied_by.as_object().unwrap().keys().all(|k| k == "vma_nohugepage" || k == "prctl_thp_disable"),
                "{v}"
            );
        } else {
            assert_eq!(denied_by["prctl_thp_disable"], v["live"]["denied"], "{}: {v}", r["name"]);
        }
        assert_eq!(v["anon_huge_bytes"], 0);
        fault_checks_total += checks;
    }
    let prctl = reason(&report, "prctl_thp_disable").unwrap();
    assert!(prctl["count"].as_u64().unwrap() >= fault_checks_total - 2 - pud_tolerance(check, 1), "{prctl}");
    assert_eq!(prctl["set_by"]["pid"], tree.pids[0]);
    let verdict = report["verdict"]["headline"].as_str().unwrap();
    let live = &report["live"];
    assert!(verdict.ends_with(&format!("; {} THP checks, {} denied", live["checks"], live["denied"])), "{verdict}");
    assert_eq!(live["checks"], live["denied"], "{live}");
    eprintln!("{}: {verdict}; by caller {}", vm_kernel().unwrap_or_default(), live["by_call"]);
}

#[test]
fn guest_madvise_policy_denials_are_counted_on_6_1_and_derived_on_6_8_plus() {
    require_root();
    let Some((report, round, _)) = traced_round("madvise", || Workload::regions(&[])) else { return };
    let check = kernel_allow_check();
    let plain = vma(&report, &start_of(region(&round, "plain")));
    let (checks, denied) = fault_checks(plain);
    assert_eq!(plain["reason"], "sysfs_madvise_not_advised");
    if check.has_wrapper() {
        // The wrapper refuses it before __thp_vma_allowable_orders: nothing to count, and the
        // report says the reason is derived.
        assert_eq!(checks, 0, "{plain}");
        assert_eq!(plain["in_wrapper"], true);
        assert!(report["live"]["wrapper_note"].as_str().unwrap().contains("derived from sysfs and vm_flags"));
    } else {
        assert!(checks >= 2 && checks <= 2 + pud_tolerance(check, 1), "{plain}");
        assert_eq!(denied, checks, "{plain}");
        // denied_by counts every caller's denials: khugepaged may scan the region too.
        assert_eq!(plain["live"]["denied_by"]["sysfs_madvise_not_advised"], plain["live"]["denied"], "{plain}");
    }
    let advised = vma(&report, &start_of(region(&round, "advised")));
    assert_eq!(advised["reason"], "none");
    assert!(advised["anon_huge_bytes"].as_u64().unwrap() > 0, "{advised}");
    assert_eq!(fault_checks(advised).1, 0, "{advised}");
    eprintln!(
        "{}: plain region under madvise: {checks} fault-path checks seen, {denied} denied",
        vm_kernel().unwrap_or_default()
    );
}

#[test]
fn the_allow_check_layout_comes_from_btf() {
    require_root();
    if !thp_built_in() {
        // No THP: the allow-check function is compiled out.
        assert!(!kernel_facts().allow_check_in_btf);
        return;
    }
    let kernel = Kernel::running().unwrap();
    if let Some(why) = AllowCheck::uncountable(&kernel) {
        // Before 6.0 BTF has no prototype with the caller's arguments, which is how it is told.
        assert!(AllowCheck::from_btf(&kernel.btf().unwrap()).is_none(), "{why}");
        eprintln!("{}: {why}", kernel.release.text);
        return;
    }
    let check = kernel_allow_check();
    assert_eq!(check.decided_from, DecidedFrom::Btf, "every kernel of the matrix has BTF");
    let params: Vec<&str> = check.params.iter().map(String::as_str).collect();
    // The prototypes of docs/kernel-facts.md#thp-allow-check, as this kernel's BTF states them.
    let expected: &[&str] = if kernel.release.at_least(6, 18) {
        &["vma", "vm_flags", "type", "orders"]
    } else if kernel.release.at_least(6, 10) {
        &["vma", "vm_flags", "tva_flags", "orders"]
    } else if kernel.release.at_least(6, 8) {
        &["vma", "vm_flags", "smaps", "in_pf", "enforce_sysfs", "orders"]
    } else {
        &["vma", "vm_flags", "smaps", "in_pf", "enforce_sysfs"]
    };
    assert_eq!(params, expected, "{}", check.function);
    eprintln!("{}: {}({})", kernel.release.text, check.function, params.join(", "));
}

#[test]
fn guest_kprobe_fallback_counts_like_the_fexit() {
    require_root();
    if !allow_check_attachable() {
        return;
    }
    let _policy = EnabledGuard::set("always");
    let (mut w, _) = Workload::regions(&[]);
    let kernel = Kernel::running().unwrap();
    let check = kernel_allow_check();
    let bits = ThpDisableBits::from_btf(&kernel.btf().unwrap());
    // Only the allow-check's second candidate: kprobe at entry, kretprobe at return.
    let kprobe_only = LogicalProbe { candidates: &probes::ALLOW_CHECK.candidates[1..], ..probes::ALLOW_CHECK };
    let catalog = [kprobe_only, probes::PAGE_FAULTS, probes::MMAP_LOCK];
    let settings = mm_probe::thp_why::live::settings(w.target(), check, DisableMode::mask(bits));
    let mut ebpf = load_object(&kernel, &[MapFamily::Thp], &settings).unwrap();
    let mut live = Live::attach(&kernel, &mut ebpf, &catalog).unwrap();
    let plan = live.plan.get(probes::ALLOW_CHECK.name).unwrap();
    assert_eq!(plan.mechanism(), Some("kprobe+kretprobe"), "{plan:?}");
    let seen = live.probe_mm(&Proc::new(w.target())).expect("mmap_lock tells the target's mm");
    live.offer_target_mm(seen).unwrap();
    w.command("round");
    let round = w.next();
    let counts = read_counts(&ebpf).unwrap();
    assert_eq!(counts.counter(mm_probe_common::thp::Counter::ReturnWithoutEntry), 0);
    for r in round["regions"].as_array().unwrap() {
        let start = r["start"].as_u64().unwrap();
        let faults = |denied_only: bool| -> u64 {
            counts
                .checks
                .iter()
                .filter(|(k, _)| k.vm_start == start && check.encoding.decode(k.call_args) == Some(Call::PageFault))
                .filter(|(k, _)| !denied_only || !check.allowed(k.ret))
                .map(|(_, n)| n)
                .sum()
        };
        let pmd_ranges = r["pmd_ranges"].as_u64().unwrap();
        let (checks, denied) = (faults(false), faults(true));
        eprintln!("kprobe: {}: {pmd_ranges} first touches, {checks} fault-path checks, {denied} denied", r["name"]);
        assert!(checks >= pmd_ranges && checks <= pmd_ranges + pud_tolerance(check, 1), "{}", r["name"]);
        assert_eq!(denied, if r["name"] == "nohuge" { checks } else { 0 }, "{}", r["name"]);
    }
}

//! What a new user reads: the collapse section under the prctl, collapse refusals in the verdict,
//! a reasons table that adds up to the verdict, fixes only for causes present, and rows that fit
//! 80 columns.

use mm_probe_common::thp::{ScanOrigin, ScanPath, collapse_slot};

use super::text;
use crate::{
    report::text::fit,
    thp_why::{
        ancestry::SetBy,
        inputs::Inputs,
        judge::{
            build,
            tests::{inputs, inputs_with, live, smaps_entry},
        },
        reasons::{DisableMode, ReasonCode},
        report::{Report, VmaClass},
        scan_result::{ScanResults, tests::scan_result_6_18},
    },
};

/// A file mapping with a long path, as a process's libraries are mapped.
fn library(start: u64, size_kb: u64, name: &str) -> String {
    format!(
        "{start:x}-{:x} r-xp 00000000 fe:00 326389 {name}\nSize: {size_kb} kB\nRss: {size_kb} kB\nAnonymous: 0 kB\n\
         AnonHugePages: 0 kB\nTHPeligible: 0\nVmFlags: rd ex mr mw me \n",
        start + size_kb * 1024
    )
}

/// A process like the tester's: a huge heap, a 16 MiB madvised region touched sparsely, a plain
/// 64 MiB arena, a stack, and two libraries.
fn process_smaps() -> String {
    [
        smaps_entry(0x7f00_0000_0000, 65536, 65536, 65536, "hg"),
        smaps_entry(0x7f10_0000_0000, 16384, 2048, 0, "hg"),
        smaps_entry(0x7f20_0000_0000, 65536, 8192, 0, ""),
        smaps_entry(0x7ffc_0000_0000, 132, 24, 0, ""),
        library(0x7f30_0000_0000, 1604, "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"),
        library(0x7f31_0000_0000, 1388, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
    ]
    .concat()
}

fn names_6_18() -> ScanResults {
    let btf = crate::kernel::KernelBtf::from_bytes(crate::kernel::btf::tests::btf_with_enum(
        "scan_result",
        &scan_result_6_18(),
    ));
    ScanResults::from_btf(&btf.unwrap()).unwrap()
}

/// khugepaged scanned the process during a live run: 48 ranges failed with exceed_none_pte under
/// max_ptes_none 32 (6.18's numbering: 5), 2 were already huge.
fn scanned(mut input: Inputs) -> Inputs {
    input.scan_results = names_6_18();
    input.policy.khugepaged.insert("max_ptes_none".into(), 32);
    let mut run = live(Vec::new());
    let slot = |raw| collapse_slot(ScanPath::Anon, ScanOrigin::Khugepaged, raw);
    run.collapse = vec![(slot(5), 48), (slot(3), 2)];
    input.live = Some(run);
    input.live_skipped = None;
    input
}

fn process(mode: DisableMode) -> Report {
    let mut input = inputs_with(&process_smaps(), mode, "6.18.44", "always [madvise] never");
    input.set_by = None;
    build(scanned(input))
}

fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    text.split(&format!("\n{heading}")).nth(1).and_then(|s| s.split("\n\n").next()).unwrap_or("")
}

/// Item 1: under the prctl the collapse section names the prctl and its setter as what keeps
/// khugepaged away, never "no region registered … madvise(MADV_HUGEPAGE)".
#[test]
fn under_the_prctl_the_collapse_section_names_it_and_who_set_it() {
    let mut input = inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never");
    input.disable.mm_flags = Some(1 << 24);
    input.live = Some(live(Vec::new()));
    input.live_skipped = None;
    let report = build(input);
    let kept = report.collapse.kept_away.as_deref().unwrap();
    assert!(kept.starts_with("prctl(PR_SET_THP_DISABLE) keeps khugepaged away from this process"), "{kept}");
    assert!(kept.contains("inherited from ancestor 4321 (lkp run job.yaml)"), "{kept}");
    assert_eq!(report.collapse.not_reached.as_deref(), Some(kept));
    let collapse = section(&text(&report, false, 100), "Collapse (khugepaged)").to_string();
    assert!(collapse.contains("kept away: prctl(PR_SET_THP_DISABLE)"), "{collapse}");
    assert!(!collapse.contains("no region has registered") && !collapse.contains("not reached"), "{collapse}");
    assert!(report.collapse.advice.is_empty(), "no khugepaged pace advice: {:?}", report.collapse.advice);
    // Set by the process itself, it says so.
    let mut input = inputs(DisableMode::Completely, "6.1.0-57-amd64", "[always] madvise never");
    input.set_by = Some(SetBy { pid: 4440, comm: "usemem".into(), cmdline: String::new(), is_target: true });
    assert!(build(input).collapse.kept_away.unwrap().contains("(the process set it itself)"));
    // Not under the prctl: nothing keeps khugepaged away.
    assert_eq!(build(inputs(DisableMode::None, "6.1.0-57-amd64", "[always] madvise never")).collapse.kept_away, None);
}

/// Item 2: the sparse madvised region khugepaged refused is in the verdict and the reasons with
/// the count of failed scans and the knob that limits them.
#[test]
fn collapse_refusals_are_a_cause_in_the_verdict_and_the_ranking() {
    let report = process(DisableMode::None);
    assert!(
        report.verdict.headline.contains(
            "2 MiB eligible, but khugepaged could not collapse it: 48 failed scans, all with exceed_none_pte \
             (khugepaged/max_ptes_none is 32) (collapse_refused)"
        ),
        "{}",
        report.verdict.headline
    );
    let sparse = report.vmas.iter().find(|v| v.start == "0x7f1000000000").unwrap();
    assert_eq!(sparse.reason, ReasonCode::CollapseRefused);
    assert!(sparse.fix.contains("raise khugepaged/max_ptes_none") && sparse.fix.contains("MADV_COLLAPSE"));
    let row = report.reasons.iter().find(|r| r.code == ReasonCode::CollapseRefused).unwrap();
    assert_eq!((row.count, row.deciding_vmas, row.small_bytes), (Some(48), 1, 2 << 20));
    assert!(row.detail.contains("exceed_none_pte") && row.detail.contains("max_ptes_none is 32"), "{}", row.detail);
    // Ranked above the reasons the kernel was not seen refusing live.
    let at = |code| report.reasons.iter().position(|r| r.code == code).unwrap();
    assert!(at(ReasonCode::CollapseRefused) < at(ReasonCode::SysfsMadviseNotAdvised), "{:?}", report.reasons);
    assert!(report.verdict.advice.iter().any(|a| a.action.contains("max_ptes_none")), "{:?}", report.verdict.advice);
}

/// Item 3: every anonymous VMA once, under its deciding reason, in resident anonymous bytes that
/// add up to the verdict's; the file VMAs left out and said so.
#[test]
fn the_reasons_table_adds_up_to_the_verdict() {
    let report = process(DisableMode::None);
    let anon: Vec<_> = report.vmas.iter().filter(|v| v.kind == VmaClass::Anon).collect();
    assert_eq!(report.reasons.iter().map(|r| r.deciding_vmas).sum::<usize>(), anon.len());
    let resident: u64 = report.reasons.iter().map(|r| r.resident_bytes).sum();
    assert_eq!(resident, anon.iter().map(|v| v.anonymous_bytes).sum::<u64>());
    let small: u64 = report.reasons.iter().map(|r| r.small_bytes).sum();
    assert_eq!(resident - small, 64 << 20, "what is not small is the huge heap");
    let headline = format!("64 MiB of {} resident anonymous memory", crate::units::format_bytes(resident));
    assert!(report.verdict.headline.contains(&headline), "{}", report.verdict.headline);
    assert_eq!((report.non_anonymous.vmas, report.non_anonymous.rss_bytes), (2, (1604 + 1388) << 10));
    let text = text(&report, false, 100);
    let reasons = section(&text, "Reasons");
    assert!(reasons.contains("not counted above: 2 VMAs (2.9 MiB resident) that are not anonymous memory"));
    assert!(!reasons.contains("file_not_eligible"), "file VMAs are not rows: {reasons}");
    let none = report.reasons.iter().find(|r| r.code == ReasonCode::None).unwrap();
    assert_eq!(none.detail, "eligible: 64 MiB of the 64 MiB resident anonymous memory of this VMA is in huge pages");
    assert!(!text.contains("these 1 VMA") && !text.contains("(s)"), "{text}");
}

/// Item 4: only the fixes of causes present; none, and said so, when all memory is huge.
#[test]
fn fixes_are_listed_only_for_causes_present() {
    let huge =
        smaps_entry(0x7f00_0000_0000, 65536, 65536, 65536, "hg") + &smaps_entry(0x7ffc_0000_0000, 132, 24, 0, "");
    let report = build(inputs_with(&huge, DisableMode::None, "6.18.44", "always [madvise] never"));
    assert!(report.verdict.advice.is_empty(), "{:?}", report.verdict.advice);
    let fix = section(&text(&report, false, 100), "Fix").to_string();
    assert!(fix.contains("nothing to fix: no cause keeps 2 MiB or more"), "{fix}");
    let only_huge = smaps_entry(0x7f00_0000_0000, 65536, 65536, 65536, "hg");
    let report = build(inputs_with(&only_huge, DisableMode::None, "6.18.44", "always [madvise] never"));
    assert!(section(&text(&report, false, 100), "Fix").contains("nothing to fix: all 64 MiB"));
    // The mixed process: the arena's madvise fix and the sparse region's, not the stack's size fix.
    let report = process(DisableMode::None);
    assert_eq!(report.verdict.advice.len(), 2, "{:?}", report.verdict.advice);
    assert!(report.verdict.advice.iter().all(|a| !a.action.contains("at least 4 MiB")), "{:?}", report.verdict.advice);
}

/// Item 6: at 80 columns no table row is wider than the terminal (so none is wrapped), and the
/// VMA table keeps SIZE, ANON, HUGE, REASON and NAME with a legend for what it shows.
#[test]
fn at_80_columns_no_table_row_wraps() {
    for mode in [DisableMode::None, DisableMode::Completely] {
        let report = process(mode);
        let raw = text(&report, true, 80);
        let rows = |heading: &str| -> Vec<String> {
            section(&raw, heading).lines().skip(1).filter(|l| !l.starts_with("      ")).map(String::from).collect()
        };
        for heading in ["Reasons", "Collapse (khugepaged)"] {
            for row in rows(heading).iter().filter(|l| !l.contains(": ")) {
                assert!(row.chars().count() <= 80, "{heading} row of {} columns:\n{row}", row.chars().count());
            }
        }
        let table = raw.split("\nVMAs (").nth(1).unwrap().split("\n\n").next().unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].contains("ELIG the kernel's own THPeligible"), "{}", lines[1]);
        for row in &lines[2..] {
            assert!(row.chars().count() <= 80, "VMA row of {} columns:\n{row}", row.chars().count());
        }
        assert!(lines[2].contains("SIZE") && lines[2].contains("REASON") && lines[2].ends_with("NAME"));
        assert!(lines.iter().any(|l| l.ends_with("libc.so.6")), "{table}");
        // Fitted to the terminal, every row stays one line as it was.
        let fitted = fit(&raw, 80);
        for row in &lines[2..] {
            assert!(fitted.lines().any(|l| l == *row), "wrapped: {row}\n{fitted}");
        }
        assert_eq!(lines.len() - 3, report.vmas.len(), "{table}");
    }
}

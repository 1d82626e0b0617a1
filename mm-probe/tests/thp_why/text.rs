//! The text a user reads: the verdict first, the VMAs largest first, reasons that add up, and
//! rows that fit 80 columns through a pipe.

use super::*;

/// The reasons table counts each anonymous VMA once, under its deciding reason, in resident
/// anonymous bytes that add up to the VMAs'; the other VMAs are left out and said so. At 80
/// columns, through a pipe, no row of the text is wrapped.
#[test]
fn the_reasons_add_up_and_the_text_fits_80_columns() {
    require_root();
    let (w, _) = Workload::regions(&[]);
    let pid = w.target().to_string();
    let report = thp_why_static(w.target());
    let vmas = report["vmas"].as_array().unwrap();
    let (anon, other): (Vec<&Value>, Vec<&Value>) = vmas.iter().partition(|v| v["kind"] == "anon");
    let reasons = report["reasons"].as_array().unwrap();
    let sum = |key: &str| reasons.iter().map(|r| r[key].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("deciding_vmas"), anon.len() as u64, "each anonymous VMA once: {reasons:?}");
    assert_eq!(sum("resident_bytes"), anon.iter().map(|v| v["anonymous_bytes"].as_u64().unwrap()).sum::<u64>());
    assert_eq!(report["non_anonymous"]["vmas"], other.len());

    let out = Command::new(mm_probe())
        .args(["thp-why", &pid, "--duration", "0s", "--all-vmas"])
        .env("COLUMNS", "80")
        .output()
        .expect("running mm-probe");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    assert!(!text.contains("these 1 VMA") && !text.contains("(s)"), "{text}");
    if !other.is_empty() {
        assert!(text.contains("not counted above:"), "{text}");
    }
    // The VMA rows: after the header (…NAME) up to the blank line, one line per VMA.
    let table = text.split("\nVMAs (").nth(1).unwrap();
    let rows = table.lines().skip_while(|l| !l.ends_with("NAME")).skip(1).take_while(|l| !l.is_empty()).count();
    assert_eq!(rows, vmas.len(), "{table}");
    assert!(table.contains("ELIG the kernel's own THPeligible") || !table.contains("ELIG"), "{table}");
}

#[test]
fn text_output_puts_the_verdict_first_and_lists_vmas_largest_first() {
    require_root();
    let (tree, _) = Workload::tree(&[]);
    let out = run_tool(&["thp-why", &tree.target().to_string(), "--duration", "0s"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let (level, headline) = text.lines().next().unwrap().split_once(": ").unwrap();
    assert!(["UNKNOWN", "OK", "WARN", "CRIT"].contains(&level), "the verdict's level first: {text}");
    let expected = if thp_built_in() { "THP disabled for pid" } else { "THP unavailable for pid" };
    assert!(headline.starts_with(expected), "{text}");
    for heading in ["Evidence", "Reasons", "Fix", "VMAs (largest first"] {
        assert!(text.contains(heading), "no {heading} in:\n{text}");
    }
    assert!(text.contains("--all-vmas for all"), "{text}");
    let all = run_tool(&["thp-why", &tree.target().to_string(), "--duration", "0s", "--all-vmas"]);
    assert!(String::from_utf8_lossy(&all.stdout).lines().count() > text.lines().count());
}

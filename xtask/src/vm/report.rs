//! Reading what the guest left in the results share (libtest output, exit statuses) and printing
//! one table per kernel plus a summary.

use std::{fmt::Write as _, path::Path, time::Duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Failed,
    Ignored,
    /// Started (or expected) but no result: the guest died or was killed meanwhile.
    Unfinished,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Passed => "ok",
            Verdict::Failed => "FAILED",
            Verdict::Ignored => "ignored",
            Verdict::Unfinished => "DID NOT FINISH",
        }
    }

    pub fn failed(self) -> bool {
        matches!(self, Verdict::Failed | Verdict::Unfinished)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestResult {
    pub name: String,
    pub verdict: Verdict,
    /// How long the test ran, where libtest said (`--report-time`: `ok <2.929s>`).
    pub elapsed: Option<Duration>,
}

/// The per-test results in libtest's human output (`test name ... ok|FAILED|ignored`). A test's
/// result word may land on a later line when a child process it ran wrote to the inherited
/// stdout in between; the `failures:` list at the end settles any test still open.
pub fn parse_libtest(output: &str) -> Vec<TestResult> {
    let mut results: Vec<TestResult> = Vec::new();
    let mut open: Option<usize> = None;
    let mut in_failure_list = false;
    for line in output.lines() {
        let trimmed = line.trim();
        if let Some(rest) = line.strip_prefix("test ")
            && let Some((name, tail)) = rest.split_once(" ... ")
        {
            results.push(TestResult { name: name.trim().to_owned(), verdict: Verdict::Unfinished, elapsed: None });
            open = None;
            match verdict_word(tail) {
                Some(verdict) => results.last_mut().into_iter().for_each(|r| settle(r, verdict, tail)),
                None => open = Some(results.len() - 1),
            }
            continue;
        }
        if let Some(index) = open
            && let Some(verdict) = verdict_word(trimmed)
        {
            settle(&mut results[index], verdict, trimmed);
            open = None;
            continue;
        }
        if trimmed == "failures:" {
            in_failure_list = true;
            continue;
        }
        if trimmed.starts_with("test result:") {
            in_failure_list = false;
            continue;
        }
        // The list repeats the names of the failed tests, indented, after the captured outputs.
        if in_failure_list
            && line.starts_with("    ")
            && !trimmed.contains(' ')
            && let Some(result) = results.iter_mut().find(|r| r.name == trimmed)
        {
            result.verdict = Verdict::Failed;
        }
    }
    results
}

fn settle(result: &mut TestResult, verdict: Verdict, tail: &str) {
    result.verdict = verdict;
    result.elapsed = reported_time(tail);
}

/// `<2.929s>`, which `--report-time` puts after the verdict word.
fn reported_time(tail: &str) -> Option<Duration> {
    let (_, after) = tail.rsplit_once('<')?;
    let seconds: f64 = after.strip_suffix('>')?.strip_suffix('s')?.parse().ok()?;
    Duration::try_from_secs_f64(seconds).ok()
}

/// `ok`, `FAILED`, `ignored` or `ignored, <reason>` as libtest ends a test line (with
/// `--report-time`, the test's time after it).
fn verdict_word(text: &str) -> Option<Verdict> {
    let word = text.trim().split([',', ' ']).next()?.trim();
    match word {
        "ok" => Some(Verdict::Passed),
        "FAILED" => Some(Verdict::Failed),
        "ignored" => Some(Verdict::Ignored),
        _ => None,
    }
}

/// The `---- <test> stdout ----` blocks libtest prints for failed tests, to show the cause.
pub fn failure_details(output: &str) -> String {
    let mut details = String::new();
    let mut inside = false;
    for line in output.lines() {
        if line.trim() == "failures:" && !inside {
            inside = true;
            continue;
        }
        if inside {
            // The second `failures:` heading starts the bare name list; stop there.
            if line.trim() == "failures:" || line.starts_with("test result:") {
                break;
            }
            let _ = writeln!(details, "{line}");
        }
    }
    details.trim().to_owned()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.trim_end().lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One test binary's run in one guest.
#[derive(Debug)]
pub struct BinaryRun {
    pub binary: String,
    pub tests: Vec<TestResult>,
    /// Exit status written by the guest; None when the guest never finished the binary.
    pub status: Option<i32>,
    pub elapsed: Option<Duration>,
    pub failure_details: String,
}

impl BinaryRun {
    /// A binary fails when a test failed, when it exited non-zero without naming a failed test
    /// (a crash, a harness panic), or when it never finished.
    pub fn failed(&self) -> bool {
        self.status != Some(0) || self.tests.iter().any(|t| t.verdict.failed())
    }

    /// Why the binary failed beyond its tests' own rows, if it did.
    fn binary_problem(&self) -> Option<String> {
        match self.status {
            None => Some("did not finish (guest stopped or was killed)".to_owned()),
            Some(super::binaries::KILLED_AT_LIMIT) => Some(format!(
                "killed after {} in the guest: it hung (the programs after it still ran)",
                format_duration(super::binaries::PROGRAM_LIMIT)
            )),
            Some(code) if code != 0 && !self.tests.iter().any(|t| t.verdict.failed()) => {
                Some(format!("exited with status {code} without a failed test (crash?)"))
            }
            Some(_) => None,
        }
    }
}

/// Everything known about one kernel of the matrix.
#[derive(Debug)]
pub struct KernelRun {
    pub line: String,
    /// Package, version, release and accelerator, or why the kernel was not available.
    pub description: String,
    pub notes: Vec<String>,
    pub binaries: Vec<BinaryRun>,
    /// Problems of the run itself: no kernel, boot failure, timeout, kernel panic/Oops.
    pub run_failures: Vec<String>,
    pub elapsed: Duration,
}

impl KernelRun {
    pub fn failed(&self) -> bool {
        !self.run_failures.is_empty() || self.binaries.iter().any(BinaryRun::failed)
    }

    /// Each failed test (`binary test`), each binary that failed beyond its tests, and the
    /// first line of each failure of the run itself.
    fn failures(&self) -> Vec<String> {
        let tests = self.binaries.iter().flat_map(|b| {
            let failed = b.tests.iter().filter(|t| t.verdict.failed()).map(move |t| format!("{} {}", b.binary, t.name));
            failed.chain(b.binary_problem().map(|p| format!("{}: {p}", b.binary)))
        });
        let runs = self.run_failures.iter().map(|f| f.lines().next().unwrap_or_default().chars().take(160).collect());
        tests.chain(runs).collect()
    }

    /// Passed, failed and ignored tests; a binary that crashed or never finished counts as one
    /// failure on top of its tests.
    fn counts(&self) -> (usize, usize, usize) {
        let tests = self.binaries.iter().flat_map(|b| &b.tests);
        let (mut passed, mut ignored) = (0, 0);
        let mut failed = self.binaries.iter().filter(|b| b.binary_problem().is_some()).count();
        for test in tests {
            match test.verdict {
                Verdict::Passed => passed += 1,
                Verdict::Ignored => ignored += 1,
                Verdict::Failed | Verdict::Unfinished => failed += 1,
            }
        }
        (passed, failed, ignored)
    }
}

pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 { format!("{secs:.1} s") } else { format!("{}m{:04.1}s", (secs / 60.0) as u64, secs % 60.0) }
}

/// The table of one kernel: one row per test, then the binary and run problems.
pub fn render_kernel(run: &KernelRun) -> String {
    let mut out = String::new();
    let verdict = if run.failed() { "FAILED" } else { "ok" };
    let _ =
        writeln!(out, "== kernel {}: {verdict} in {} ({})", run.line, format_duration(run.elapsed), run.description);
    for note in &run.notes {
        let _ = writeln!(out, "   note: {note}");
    }
    let name_width = run.binaries.iter().flat_map(|b| &b.tests).map(|t| t.name.len()).max().unwrap_or(0);
    let binary_width = run.binaries.iter().map(|b| b.binary.len()).max().unwrap_or(0);
    for binary in &run.binaries {
        let elapsed = binary.elapsed.map(format_duration).unwrap_or_else(|| "-".to_owned());
        for test in &binary.tests {
            let time = test.elapsed.map(format_duration).unwrap_or_default();
            let _ = writeln!(
                out,
                "   {:binary_width$}  {:name_width$}  {:14}  {time:>9}",
                binary.binary,
                test.name,
                test.verdict.label()
            );
        }
        if let Some(problem) = binary.binary_problem() {
            let _ = writeln!(out, "   {:binary_width$}  {problem}", binary.binary);
        }
        let _ =
            writeln!(out, "   {:binary_width$}  ({} tests, {elapsed} in the guest)", binary.binary, binary.tests.len());
        if binary.failed() && !binary.failure_details.is_empty() {
            let _ = writeln!(out, "   --- {} failures on {} ---", binary.binary, run.line);
            for line in binary.failure_details.lines() {
                let _ = writeln!(out, "   | {line}");
            }
        }
    }
    for failure in &run.run_failures {
        let _ = writeln!(out, "   RUN FAILED: {failure}");
    }
    out
}

/// One line per kernel and the total.
pub fn render_summary(runs: &[KernelRun], total: Duration) -> String {
    let mut out = String::from("== vm-test summary\n");
    let width = runs.iter().map(|r| r.line.len()).max().unwrap_or(0);
    for run in runs {
        let (passed, failed, ignored) = run.counts();
        let verdict = if run.failed() { "FAILED" } else { "ok" };
        let _ = writeln!(
            out,
            "   {:width$}  {verdict:6}  {passed} passed, {failed} failed, {ignored} ignored{}  {}",
            run.line,
            if run.run_failures.is_empty() {
                String::new()
            } else {
                format!(", {} run failure(s)", run.run_failures.len())
            },
            format_duration(run.elapsed),
        );
        // Named again here: the per-kernel tables have scrolled away in a CI log's tail.
        for failure in run.failures() {
            let _ = writeln!(out, "   {:width$}    - {failure}", "");
        }
        // A failed line's notes too: they say which of its boots failed before and how, the
        // evidence for telling a repeated emulator failure from one of ours.
        for note in run.notes.iter().filter(|_| run.failed()) {
            let first_line: String = note.lines().next().unwrap_or_default().chars().take(240).collect();
            let _ = writeln!(out, "   {:width$}    note: {first_line}", "");
        }
    }
    out += &slowest_tests(runs, SLOWEST_SHOWN);
    let _ = writeln!(out, "   total {}", format_duration(total));
    out
}

/// How many of the matrix's slowest tests the summary names.
const SLOWEST_SHOWN: usize = 12;

/// The `count` tests that took longest on any line, longest first: where the matrix's time goes.
fn slowest_tests(runs: &[KernelRun], count: usize) -> String {
    let mut timed: Vec<(Duration, String)> =
        runs.iter()
            .flat_map(|run| run.binaries.iter().map(move |binary| (run, binary)))
            .flat_map(|(run, binary)| {
                binary.tests.iter().filter_map(move |test| {
                    Some((test.elapsed?, format!("{} {}::{}", run.line, binary.binary, test.name)))
                })
            })
            .collect();
    if timed.is_empty() {
        return String::new();
    }
    timed.sort_by_key(|(elapsed, _)| std::cmp::Reverse(*elapsed));
    let mut out = String::from("   slowest tests:\n");
    for (elapsed, name) in timed.into_iter().take(count) {
        let _ = writeln!(out, "   {:>9}  {name}", format_duration(elapsed));
    }
    out
}

/// Reads one binary's files from the results directory.
pub fn read_binary_run(
    results: &Path,
    binary: &str,
    output_file: &str,
    status_file: &str,
    elapsed_file: &str,
) -> BinaryRun {
    let output = std::fs::read_to_string(results.join(output_file)).unwrap_or_default();
    let status = std::fs::read_to_string(results.join(status_file)).ok().and_then(|s| s.trim().parse().ok());
    let elapsed = std::fs::read_to_string(results.join(elapsed_file))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map(Duration::from_millis);
    // Without libtest's failure section (killed, crashed), the end of the output is the evidence.
    let details = match failure_details(&output) {
        d if d.is_empty() => tail(&output, 20),
        d => d,
    };
    BinaryRun { binary: binary.to_owned(), tests: parse_libtest(&output), status, elapsed, failure_details: details }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAILED_RUN: &str = "
running 4 tests
test bad_units_are_rejected_with_a_hint ... ok
test doctor_json_reports_plans_with_reasons ... FAILED
test slow_one ... ignored, needs a real GPU
test function_probes_work_where_the_kernel_allows_them ... child wrote this
ok

failures:

---- doctor_json_reports_plans_with_reasons stdout ----
thread 'doctor_json_reports_plans_with_reasons' panicked at mm-probe/tests/foundation.rs:58:5:
assertion `left == right` failed

failures:
    doctor_json_reports_plans_with_reasons

test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.21s
";

    fn verdicts(output: &str) -> Vec<(String, Verdict)> {
        parse_libtest(output).into_iter().map(|r| (r.name, r.verdict)).collect()
    }

    #[test]
    fn libtest_lines_give_one_verdict_per_test() {
        assert_eq!(
            verdicts(FAILED_RUN),
            [
                ("bad_units_are_rejected_with_a_hint".to_owned(), Verdict::Passed),
                ("doctor_json_reports_plans_with_reasons".to_owned(), Verdict::Failed),
                ("slow_one".to_owned(), Verdict::Ignored),
                ("function_probes_work_where_the_kernel_allows_them".to_owned(), Verdict::Passed),
            ]
        );
    }

    #[test]
    fn reported_times_are_read_after_the_verdict() {
        let output =
            "test fast ... ok <0.250s>\ntest slow ... FAILED <95.125s>\ntest skipped ... ignored, needs <a> GPU\n";
        let results = parse_libtest(output);
        let times: Vec<_> = results.iter().map(|r| (r.verdict, r.elapsed)).collect();
        assert_eq!(
            times,
            [
                (Verdict::Passed, Some(Duration::from_millis(250))),
                (Verdict::Failed, Some(Duration::from_millis(95_125))),
                (Verdict::Ignored, None),
            ]
        );
    }

    #[test]
    fn a_test_cut_off_by_a_dying_guest_did_not_finish() {
        let output = "running 2 tests\ntest first ... ok\ntest second ... ";
        assert_eq!(
            verdicts(output),
            [("first".to_owned(), Verdict::Passed), ("second".to_owned(), Verdict::Unfinished)]
        );
    }

    #[test]
    fn failure_list_settles_a_test_whose_result_word_was_lost() {
        let output = "test noisy ... child output without newlineFAILED\n\nfailures:\n\nfailures:\n    noisy\n\ntest result: FAILED.";
        assert_eq!(verdicts(output), [("noisy".to_owned(), Verdict::Failed)]);
    }

    #[test]
    fn failure_details_are_the_captured_outputs() {
        let details = failure_details(FAILED_RUN);
        assert!(details.starts_with("---- doctor_json_reports_plans_with_reasons stdout ----"), "{details}");
        assert!(details.ends_with("assertion `left == right` failed"), "{details}");
    }

    #[test]
    fn nonzero_exit_without_a_failed_test_fails_the_binary() {
        let run = BinaryRun {
            binary: "foundation".into(),
            tests: parse_libtest("test a ... ok\n"),
            status: Some(101),
            elapsed: None,
            failure_details: String::new(),
        };
        assert!(run.failed());
        assert!(run.binary_problem().unwrap().contains("101"));
        let unfinished = BinaryRun { status: None, ..run };
        assert!(unfinished.failed());
    }

    #[test]
    fn the_summary_names_every_failure_of_a_failed_kernel() {
        let binary = BinaryRun {
            binary: "latency".into(),
            tests: parse_libtest("test a ... ok\ntest b ... FAILED\n"),
            status: Some(101),
            elapsed: None,
            failure_details: String::new(),
        };
        let run = KernelRun {
            line: "6.1-rt".into(),
            description: String::new(),
            notes: vec!["6.1-rt boot 2: the guest before went silent\nSeaBIOS".into()],
            binaries: vec![binary],
            run_failures: vec!["guest timed out\nconsole: ...".into()],
            elapsed: Duration::from_secs(60),
        };
        let summary = render_summary(&[run], Duration::from_secs(60));
        assert!(summary.contains("- latency b\n"), "{summary}");
        assert!(summary.contains("- guest timed out\n"), "{summary}");
        assert!(!summary.contains("latency a"), "{summary}");
        assert!(summary.contains("note: 6.1-rt boot 2: the guest before went silent\n"), "{summary}");
        assert!(!summary.contains("SeaBIOS"), "one line a note: {summary}");
    }
}

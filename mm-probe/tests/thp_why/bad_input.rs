//! Bad input and refused access: one line that says what to do, exit 1, never a panic.

use super::*;

fn assert_one_line_error(out: &std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line, not a panic: {stderr}");
    assert!(stderr.contains(needle), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn unknown_pid_is_a_one_line_error() {
    require_root();
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let unused = (300..pid_max).rev().find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).unwrap();
    assert_one_line_error(&run_tool(&["thp-why", &unused.to_string()]), "does not exist");
}

#[test]
fn a_kernel_thread_is_refused() {
    require_root();
    // kthreadd is pid 2 on every Linux system.
    assert_one_line_error(&run_tool(&["thp-why", "2"]), "kernel thread");
}

#[test]
fn a_zombie_is_refused() {
    require_root();
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    // Not reaped yet: a zombie until wait().
    let zombie = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
    });
    assert!(zombie);
    assert_one_line_error(&run_tool(&["thp-why", &pid.to_string()]), "zombie");
    child.wait().unwrap();
}

#[test]
fn without_permission_to_read_the_target_it_says_what_to_do() {
    require_root();
    let (w, _) = Workload::regions(&[]);
    // nobody may not read a root process's smaps (ptrace access check).
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(mm_probe())
        .args(["thp-why", &w.target().to_string()])
        .output()
        .expect("running setpriv");
    assert_one_line_error(&out, "permission denied");
    assert!(String::from_utf8_lossy(&out.stderr).contains("run as root"));
}

/// pid 1 as root: either examined, or refused with the real reason, never "run as root".
#[test]
fn init_as_root_is_examined_or_refused_with_the_real_reason() {
    require_root();
    let out = run_tool(&["thp-why", "1", "--duration", "0s", "--json"]);
    if out.status.code() == Some(0) {
        parse_report(&out.stdout);
        return;
    }
    assert_one_line_error(&out, "permission denied");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("run as root"), "mm-probe already runs as root: {stderr}");
    assert!(stderr.contains("CAP_SYS_PTRACE"), "{stderr}");
}

#[test]
fn a_target_exiting_mid_run_gives_a_partial_result() {
    require_root();
    let (mut w, round) = Workload::regions(&[]);
    let target = w.target();
    let report = thp_why_live_until(target, || w.command("exit"), false);
    assert_eq!(report["live"]["stopped_by"], "target_exited", "{}", report["live"]);
    let notes = report["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().unwrap().contains("exited during the run")), "{notes:?}");
    // The VMAs from the start of the run are still judged.
    let expected = if thp_built_in() { "vma_too_small" } else { "sysfs_never" };
    assert_eq!(vma(&report, &start_of(region(&round, "small")))["reason"], expected);
}

//! `invalidations` left running on a busy host, as the command and through the exporter at once:
//! ten minutes of short-lived processes (testing/workloads `churn`: thousands of names, each
//! process contending on its own mmap_lock from a few paths), then a two-thread KVM storm
//! (`kvm_storm`). Both must still name the VM's mmu_lock with its contention, fold the rest, count
//! every loss, and never show a figure computed from lost data as measured.
//!
//! Host only: the matrix guests emulate every instruction, and thousands of processes there would
//! take the whole allowance.

mod common;

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use common::{kvm_available, leftover_programs, mm_probe, our_programs, require_root, workload};
use serde_json::Value;

/// The churn the exporter must survive (the command, beside it, sees the same).
const CHURN: Duration = Duration::from_secs(600);

#[test]
fn after_ten_minutes_of_short_lived_processes_the_vms_lock_is_still_named_and_nothing_lost_reads_as_measured() {
    require_root();
    if !kvm_available() || common::vm_kernel().is_some() {
        eprintln!("skipped: needs /dev/kvm with KVM's tracepoints, on the host");
        return;
    }
    let before = our_programs();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut exporter = spawn(&["exporter", "--only", "invalidations", "--listen", &format!("127.0.0.1:{port}")]);
    let exporter_lines = lines_of(&mut exporter);
    let started = exporter_lines.recv_timeout(Duration::from_secs(90)).expect("the exporter's start-up");
    assert!(started.contains("listening on"), "{started}");
    let mut tool = spawn(&["invalidations", "--json", "--duration", "3600s"]);
    let tool_lines = lines_of(&mut tool);
    let plan = common::tool_line(&tool_lines.recv_timeout(Duration::from_secs(90)).expect("a plan line"));
    assert_eq!(plan["type"], "probe_plan", "{plan}");

    let churn = Command::new(workload("churn"))
        .args(["--duration-ms", &CHURN.as_millis().to_string(), "--concurrency", "4", "--processes", "100000000"])
        .output()
        .expect("running churn");
    assert!(churn.status.success(), "churn failed");
    let churned: Value = serde_json::from_slice(&churn.stdout).expect("churn prints one JSON object");
    assert!(churned["processes"].as_u64().unwrap() >= 5000, "a busy host: {churned}");
    let (storm_pid, contended) = storm_until_contended(port);

    common::interrupt(&tool);
    assert_eq!(tool.wait().expect("mm-probe").code(), Some(0));
    let lines: Vec<Value> = tool_lines.iter().map(|l| common::tool_line(&l)).collect();
    let served = scrape(port);
    common::interrupt(&exporter);
    assert_eq!(exporter.wait().expect("the exporter").code(), Some(0));
    let left = leftover_programs(&before);
    assert!(left.is_empty(), "programs still loaded: {left:?}");

    eprintln!("churn: {churned}\nVM pid {storm_pid}: the exporter served {contended} contended acquisitions");
    check_the_command(&lines, storm_pid);
    check_the_exporter(&served);
}

/// The command's summary: the VM's lock first, the churn folded, losses counted and honoured.
fn check_the_command(lines: &[Value], storm_pid: u32) {
    let summary = lines.iter().rfind(|l| l["type"] == "summary").expect("a summary line");
    let lost = lines.iter().find(|l| l["type"] == "lost_events").expect("a lost_events line");
    eprintln!("command: lost {lost}\nother contention: {}", summary["other_contention"]["locks"]);
    let locks = summary["locks"].as_array().unwrap();
    let vm_lock = format!("kvm->mmu_lock of VM pid {storm_pid}");
    let first = locks.first().unwrap_or_else(|| panic!("the VM's lock is reported: {summary}"));
    assert_eq!(first["name"], vm_lock.as_str(), "ranked first: {}", summary["locks"]);
    assert_eq!(first["relation"], "vm_lock");
    assert!(first["contended"].as_u64().unwrap() > 0, "{first}");
    assert!(locks.iter().all(|l| l["relation"] != "unrelated"), "unrelated locks are folded, not ranked");
    assert!(summary["other_contention"]["contended"].as_u64().unwrap() > 0, "the churn's contention, folded");
    let metric =
        |name: &str| summary["verdict"]["metrics"].as_array().unwrap().iter().find(|m| m["metric"] == name).cloned();
    let wait = metric("wait_per_invalidation").expect("the wait metric");
    if lost["waits"].as_u64().unwrap() > 0 || lost["invalidations"].as_u64().unwrap() > 0 {
        assert!(wait["value"].is_null() && wait["level"] == "UNKNOWN", "{wait}");
        assert!(wait["unknown_because"].as_str().unwrap().contains("lost"), "{wait}");
    } else {
        assert!(wait["value"].as_f64().is_some(), "nothing lost, measured: {wait}");
    }
    let crit = summary["verdict"]["metrics"].as_array().unwrap().iter().any(|m| m["level"] == "CRIT");
    assert!(
        !crit || !summary["verdict"]["advice"].as_array().unwrap().is_empty(),
        "a CRIT comes with advice: {summary}"
    );
}

/// The exporter's scrape: the VM's lock contention served, every loss under its map's name.
fn check_the_exporter(served: &str) {
    let value = |series: &str| -> Option<f64> {
        served.lines().find(|l| l.starts_with(series)).and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
    };
    for map in ["INV_WAITS", "INV_INVALIDATIONS"] {
        let series = format!("mm_probe_map_update_failures_total{{capability=\"invalidations\",map=\"{map}\"}}");
        let failures = value(&series).unwrap_or_else(|| panic!("{series} is served"));
        eprintln!("exporter: {series} {failures}");
    }
    assert!(
        value("mm_probe_lock_contended_total{lock_class=\"unrelated\",path=\"other\"}").is_some_and(|v| v > 0.0),
        "the churn's contention is one folded series"
    );
}

/// Storms until the exporter has served contention on a VM's mmu_lock (whether two threads
/// overlap is the scheduler's doing); the last storm's pid and the contended count served.
fn storm_until_contended(port: u16) -> (u32, f64) {
    const STORMS: usize = 3;
    for storm in 1..=STORMS {
        let mut child = Command::new(workload("kvm_storm"))
            .args(["--threads", "2", "--passes", "5", "--size", "16M", "--wait"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting kvm_storm");
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut pid = String::new();
        out.read_line(&mut pid).expect("kvm_storm prints its pid");
        child.stdin.take().expect("piped stdin").write_all(b"go\n").expect("starting the storm");
        let mut counts = String::new();
        out.read_line(&mut counts).expect("kvm_storm's counts");
        assert!(child.wait().expect("kvm_storm").success());
        let contended: f64 = scrape(port)
            .lines()
            .filter(|l| l.starts_with("mm_probe_lock_contended_total{lock_class=\"kvm_mmu_lock\""))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        if contended > 0.0 || storm == STORMS {
            return (pid.trim().parse().expect("a pid"), contended);
        }
    }
    unreachable!()
}

fn spawn(args: &[&str]) -> Child {
    Command::new(mm_probe()).args(args).stdout(Stdio::piped()).spawn().expect("starting mm-probe")
}

/// The child's stdout, a line at a time, until it closes.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (send, lines) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    lines
}

/// One scrape, in the classic text format.
fn scrape(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut stream = TcpStream::connect(("127.0.0.1", port))?;
            stream.set_read_timeout(Some(Duration::from_secs(20)))?;
            stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: text/plain\r\n\r\n")?;
            let mut answer = String::new();
            stream.read_to_string(&mut answer)?;
            Ok(answer)
        })();
        match attempt {
            Ok(answer) if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") => return answer,
            other => assert!(Instant::now() < deadline, "no scrape: {other:?}"),
        }
        thread::sleep(Duration::from_millis(200));
    }
}

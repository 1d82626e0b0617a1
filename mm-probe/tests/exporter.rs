//! `mm-probe exporter` end to end, against a real Prometheus: a SCHED_FIFO waker's wakeups are
//! counted by the kernel, served by the exporter, scraped by Prometheus (`prometheus` from
//! Debian, which `cargo xtask setup` installs), and what Prometheus answers equals what the
//! exporter served. Also: the threshold is an exact `le` edge, `promtool check metrics` accepts
//! the output, a bad `--listen`, a taken port or no privileges are one-line errors, and Ctrl-C
//! leaves nothing loaded.
//!
//! In the qemu guests loopback may be down: it is brought up, or the tests that need it say why
//! they skip.

mod common;
mod latency_support;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use common::{interrupt, leftover_programs, mm_probe, our_programs, require_root, run_tool, vm_kernel};
use latency_support::{HeldWaker, assert_plausible_wakeups};
use serde_json::Value;

/// The exporter's default threshold, 500 µs, as the `le` Prometheus stores.
const THRESHOLD_SECONDS: f64 = 0.0005;

#[test]
fn prometheus_scrapes_exactly_what_the_kernel_counted_for_a_fifo_waker() {
    if !root_with_loopback() {
        return;
    }
    let before = our_programs();
    let mut held = HeldWaker::spawn(&["--prio", "80", "--period-us", "2000", "--loops", "500"]);
    // Every capability (the default), so Prometheus parses every family; -p selects the
    // waker's wakeups.
    let exporter = Exporter::start(&["-p", &held.pid.to_string()]);
    let prometheus = Prometheus::start(exporter.port);
    prometheus.wait_for_first_scrape();

    let waker = held.run();
    let ended = unix_now();
    prometheus.wait_for_scrape_after("mm_probe_wakeup_latency_seconds_count", ended);
    // The waker now waits on stdin and nothing else is traced (-p): the totals stand still, so
    // what the exporter serves now is what Prometheus stored at its last scrape.
    let served = samples(&exporter.get_metrics(false));

    let count = value_of(&served, "mm_probe_wakeup_latency_seconds_count", &[]);
    let over = value_of(&served, "mm_probe_wakeups_over_threshold_total", &[]);
    let sum = value_of(&served, "mm_probe_wakeup_latency_seconds_sum", &[]);
    assert_eq!(prometheus.value("mm_probe_wakeup_latency_seconds_count"), count);
    assert_eq!(prometheus.value("mm_probe_wakeups_over_threshold_total"), over);
    assert!((prometheus.value("mm_probe_wakeup_latency_seconds_sum") - sum).abs() <= sum * 1e-12);
    let served_buckets = buckets(&served);
    assert_eq!(prometheus.buckets("mm_probe_wakeup_latency_seconds_bucket"), served_buckets);
    eprintln!("served and scraped: count {count}, over the threshold {over}, sum {sum} s");

    assert_plausible_wakeups(count as u64, &waker, &Value::String(format!("{served_buckets:?}")));
    let at_threshold = served_buckets.iter().find(|(le, _)| *le == THRESHOLD_SECONDS).map(|(_, n)| *n);
    assert_eq!(at_threshold, Some(count - over), "the threshold edge holds count - over_threshold: {served_buckets:?}");
    assert!(served_buckets.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1), "{served_buckets:?}");
    assert_eq!(served_buckets.last(), Some(&(f64::INFINITY, count)));

    let attached =
        value_of(&served, "mm_probe_probe_attached", &[("capability", "latency"), ("probe", "sched_switch")]);
    assert_eq!(attached, 1.0);
    exporter.stop_and_check_nothing_left(&before);
    held.exit();
}

/// Each window is judged as `mm-probe latency` would judge a run of it: the waker's loops, every
/// wakeup slower than 1 µs, are a CRIT finding; a window in which no watched task woke is
/// UNKNOWN, not OK, and no finding; with a limit nothing reaches, the same loops are OK.
#[test]
fn each_window_is_judged_a_finding_while_wakeups_are_slow_and_unknown_when_none_happen() {
    if !root_with_loopback() {
        return;
    }
    let before = our_programs();
    for (threshold, judged) in [("1us", "CRIT"), ("10s", "OK")] {
        let mut held = HeldWaker::spawn(&["--prio", "80", "--period-us", "2000", "--loops", "500"]);
        let pid = held.pid.to_string();
        let args = ["--only", "latency", "--window", "2s", "--threshold", threshold, "-p", &pid];
        let exporter = Exporter::start(&args);
        let found = exporter.metrics_when("no verdict yet", |s| verdict(s, "latency").is_some());
        assert_eq!(verdict(&found, "latency").as_deref(), Some("UNKNOWN"), "a window before the loops");
        held.run();
        let served = exporter.metrics_when(judged, |s| verdict(s, "latency").as_deref() == Some(judged));
        let finding = served.iter().filter(|s| s.name == "mm_probe_finding").collect::<Vec<_>>();
        if judged == "CRIT" {
            promtool_accepts(&exporter.get_metrics(false));
            let labels: Vec<_> = finding.iter().map(|s| (&s.labels["level"], &s.labels["metric"], s.value)).collect();
            assert_eq!(labels, [(&"CRIT".to_string(), &"over_threshold".to_string(), 1.0)]);
        } else {
            assert!(finding.is_empty(), "an OK window is no finding");
        }
        // The waker now waits on stdin: the next whole window saw no wakeup.
        let quiet = exporter.metrics_when("UNKNOWN", |s| verdict(s, "latency").as_deref() == Some("UNKNOWN"));
        assert!(!quiet.iter().any(|s| s.name == "mm_probe_finding"), "a window with nothing to judge is no finding");
        exporter.stop_and_check_nothing_left(&before);
        held.exit();
    }
}

/// In the guests, with the mirror driver: a retry loop that reuses a stale sequence cannot
/// succeed, and its window is a CRIT finding on stale_retries; whole-range walks under a madvise
/// storm are a finding on what the counters measure, never called stale. The -EBUSY returns
/// served are the driver's own count.
#[test]
fn a_retry_storms_window_is_a_finding_and_a_loop_that_cannot_succeed_is_named() {
    if !root_with_loopback() {
        return;
    }
    if vm_kernel().is_none() {
        eprintln!("skipped on the host: the mirror driver's storms run in the guests");
        return;
    }
    let _module = common::MirrorModule::load();
    let before = our_programs();
    let exporter = Exporter::start(&["--only", "retry-storm", "--window", "2s"]);
    exporter.metrics_when("a first window", |s| verdict(s, "retry-storm").is_some());
    let storms: [(&str, &[&str]); 2] = [
        ("stale sequence", &["--timeout-ms", "20", "--chunk", "2M", "--stale-seq", "--duration-ms", "1500"]),
        ("whole-range walks", &["--timeout-ms", "1000", "--duration-ms", "2000"]),
    ];
    for (label, args) in storms {
        let ebusy = |s: &[Sample]| value_of(s, "mm_probe_hmm_range_fault_returns_total", &[("result", "ebusy")]);
        let before = samples(&exporter.get_metrics(false));
        let start = ebusy(&before);
        let out = Command::new(common::workload("hmm_storm"))
            .args(["--size", "64M", "--interval-us", "50"])
            .args(args)
            .output()
            .expect("running hmm_storm");
        assert!(out.status.success(), "hmm_storm {label}: {}", String::from_utf8_lossy(&out.stderr));
        let driver: Value = serde_json::from_slice(&out.stdout).expect("hmm_storm's counts");
        let bad = |s: &[Sample]| verdict(s, "retry-storm").is_some_and(|level| level == "WARN" || level == "CRIT");
        let judged = exporter.metrics_when(&format!("a finding for the {label} storm"), bad);
        assert_eq!(ebusy(&judged) - start, driver["busy_returns"].as_f64().unwrap(), "{label}: {driver}");
        check_storm_causes(label, &before, &judged, &driver);
        let finding = judged.iter().find(|s| s.name == "mm_probe_finding").expect("a finding");
        let (level, metric) = (finding.labels["level"].as_str(), finding.labels["metric"].as_str());
        eprintln!("{label}: {level} on {metric}; driver {driver}");
        if label == "stale sequence" {
            assert_eq!((level, metric), ("CRIT", "stale_retries"), "{finding:?}");
        } else {
            assert!(["retry_rate", "invalidate_freq"].contains(&metric), "{finding:?}");
        }
        // The storm is over: a window without walks judges nothing.
        exporter.metrics_when("a window without walks", |s| verdict(s, "retry-storm").as_deref() == Some("UNKNOWN"));
    }
    exporter.stop_and_check_nothing_left(&before);
}

/// The storm thread's madvise(MADV_DONTNEED) calls are the mirrored memory's invalidations by
/// cause, `syscall` first; every invalidation counted by event is counted by cause.
fn check_storm_causes(label: &str, before: &[Sample], after: &[Sample], driver: &Value) {
    let by = |samples: &[Sample], family: &str, label: &str| -> BTreeMap<String, f64> {
        let mut sums = BTreeMap::new();
        for s in samples.iter().filter(|s| s.name == family) {
            *sums.entry(s.labels[label].clone()).or_default() += s.value;
        }
        sums
    };
    let grown = |family: &str, label: &str| -> BTreeMap<String, f64> {
        let earlier = by(before, family, label);
        let mut now = by(after, family, label);
        now.iter_mut().for_each(|(k, v)| *v -= earlier.get(k).copied().unwrap_or(0.0));
        now.retain(|_, v| *v > 0.0);
        now
    };
    let causes = grown("mm_probe_mirrored_invalidation_causes_total", "cause");
    let events = grown("mm_probe_mmu_invalidations_total", "event");
    eprintln!("{label}: invalidations by cause {causes:?}, by event {events:?}");
    assert_eq!(causes.values().sum::<f64>(), events.values().sum::<f64>(), "{label}: {causes:?} vs {events:?}");
    let first = causes.iter().max_by(|a, b| a.1.total_cmp(b.1)).map(|(cause, _)| cause.as_str());
    // Where the invalidating syscall cannot be read (before 5.15), madvise's are `unknown`, and
    // the plan says why; never another cause.
    if let Some(why) = mm_probe::kernel::Kernel::running().unwrap().registers_unreadable() {
        eprintln!("{label}: syscalls are not read here ({why})");
        assert_eq!(first, Some("unknown"), "{label}: {causes:?}");
        return;
    }
    assert_eq!(first, Some("syscall"), "{label}: {causes:?}");
    // One madvise can invalidate twice (splitting a THP, then zapping), and the storm starts just
    // before the mm is first seen mirrored: most, not exactly all, of its calls.
    assert!(2.0 * causes["syscall"] >= driver["storm_ops"].as_f64().unwrap(), "{label}: {causes:?} vs {driver}");
}

#[test]
fn every_capability_reports_its_plan_and_promtool_accepts_the_output() {
    if !root_with_loopback() {
        return;
    }
    let before = our_programs();
    let exporter = Exporter::start(&["--only", "latency,retry-storm,thp"]);
    touch_advised_memory();
    let classic = exporter.get_metrics(false);
    promtool_accepts(&classic);
    let openmetrics = exporter.get_metrics(true);
    assert!(openmetrics.ends_with("# EOF\n"), "Prometheus gets OpenMetrics when it asks");
    let served = samples(&classic);

    for capability in ["latency", "retry-storm", "thp"] {
        let probes: Vec<&Sample> = served
            .iter()
            .filter(|s| s.name == "mm_probe_probe_attached" && s.labels["capability"] == capability)
            .collect();
        assert!(!probes.is_empty(), "{capability} has no mm_probe_probe_attached series:\n{classic}");
        let listed = attached_in_startup(&exporter.startup, capability);
        for probe in probes {
            // The start-up lines and the gauge tell the same story.
            let name = &probe.labels["probe"];
            assert_eq!(listed.contains(name), probe.value == 1.0, "{name}: {:#?}", exporter.startup);
        }
    }
    let unavailable = served.iter().filter(|s| s.name == "mm_probe_probe_attached" && s.value == 0.0).count();
    let said = exporter.startup.last().unwrap();
    match unavailable {
        0 => assert_eq!(said, "  unavailable: none"),
        1 => assert_eq!(said, "  unavailable: 1 probe, see `mm-probe doctor`"),
        n => assert_eq!(*said, format!("  unavailable: {n} probes, see `mm-probe doctor`")),
    }
    let attached =
        |probe: &str| served.iter().any(|s| s.labels.get("probe").is_some_and(|p| p == probe) && s.value == 1.0);
    let has = |family: &str| served.iter().any(|s| s.name == family);
    assert_eq!(has("mm_probe_hmm_range_fault_returns_total"), attached("hmm_range_fault walk"), "{classic}");
    // Every kernel that can walk has both sequences in its BTF (5.10+).
    assert_eq!(has("mm_probe_hmm_stale_sequence_retries_total"), attached("hmm_range_fault walk"), "{classic}");
    let thp_never =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").is_ok_and(|m| m.contains("[never]"));
    if attached("THP allow-check") && !thp_never {
        // Every fault on the advised region passed the allow-check: counted system-wide. (With
        // enabled=never the 6.8+ inline wrapper refuses before the probed function runs.)
        let checks: f64 = served.iter().filter(|s| s.name == "mm_probe_thp_checks_total").map(|s| s.value).sum();
        assert!(checks > 0.0, "no THP check counted after faulting 16 MiB of MADV_HUGEPAGE memory:\n{classic}");
    } else if let Some(kernel) = vm_kernel().filter(|k| !k.ends_with("-rt")) {
        // Before 6.0 no one function takes the caller's arguments: not tried, as thp-why says.
        let running = mm_probe::kernel::Kernel::running().unwrap();
        let uncountable = mm_probe::thp_why::checks::AllowCheck::uncountable(&running);
        assert!(uncountable.is_some(), "the THP allow-check must attach on {kernel}: {:#?}", exporter.startup);
    }
    exporter.stop_and_check_nothing_left(&before);
}

#[test]
fn bad_listen_addresses_and_taken_ports_are_one_line_usage_errors() {
    require_root();
    let out = run_tool(&["exporter", "--listen", "localhost"]);
    assert_one_line_usage_error(&out, "--listen \"localhost\" has no :PORT");
    let out = run_tool(&["exporter", "--listen", "no-such-host.invalid:9479"]);
    assert_one_line_usage_error(&out, "does not resolve");
    let out = run_tool(&["exporter", "--window", "0s"]);
    assert_one_line_usage_error(&out, "give a duration above zero");
    match loopback() {
        Ok(()) => {
            let taken = TcpListener::bind("127.0.0.1:0").expect("binding a port to take");
            let address = taken.local_addr().unwrap().to_string();
            let before = our_programs();
            let out = run_tool(&["exporter", "--listen", &address]);
            assert_one_line_usage_error(&out, "in use");
            assert!(leftover_programs(&before).is_empty(), "nothing is loaded before the port is taken");
        }
        Err(why) => eprintln!("skipped the taken-port case: {why}"),
    }
    // Without privileges (as nobody, when nobody can reach the binary).
    use std::os::unix::process::CommandExt as _;
    match Command::new(mm_probe()).args(["exporter", "--listen", "127.0.0.1:0"]).uid(65534).gid(65534).output() {
        Ok(out) => assert_one_line_usage_error(&out, "run it as root"),
        Err(e) => eprintln!("skipped the unprivileged run: nobody cannot start {}: {e}", mm_probe().display()),
    }
}

#[test]
fn latency_flags_with_an_only_that_leaves_latency_out_are_refused_in_one_line() {
    let out = run_tool(&["exporter", "--only", "thp", "--threshold", "1ms"]);
    assert_one_line_usage_error(&out, "--threshold applies only to latency, which --only thp leaves out");
    let out = run_tool(&["exporter", "--only", "retry-storm", "-p", "1", "--func", "do_madvise"]);
    assert_one_line_usage_error(&out, "-p, --func apply only to latency");
}

#[test]
fn localhost_and_a_bare_port_listen_where_go_exporters_would() {
    if !root_with_loopback() {
        return;
    }
    let port = free_port();
    let exporter = Exporter::start_with(
        &format!("localhost:{port}"),
        &[&format!("127.0.0.1:{port}")],
        &[],
        &["--only", "retry-storm"],
    );
    assert!(exporter.get_metrics(false).contains("mm_probe_build_info"));
    exporter.stop_and_check_nothing_left(&our_programs());
    // Every interface: IPv6 and IPv4 on one socket, or IPv4 alone on a host without IPv6.
    let port = free_port();
    let (v6, v4) = (format!("[::]:{port}"), format!("0.0.0.0:{port}"));
    let exporter = Exporter::start_with(&format!(":{port}"), &[&v6, &v4], &[], &["--only", "retry-storm"]);
    assert!(exporter.get_metrics(false).contains("mm_probe_build_info"), "reached on 127.0.0.1");
    exporter.stop_and_check_nothing_left(&our_programs());
}

/// The header timeout the tests give the exporter, instead of its 10 s.
const TEST_HEADER_TIMEOUT: Duration = Duration::from_millis(1500);

#[test]
fn idle_and_half_sent_connections_are_closed_after_the_header_timeout() {
    if !root_with_loopback() {
        return;
    }
    let before = our_programs();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let timeout_ms = TEST_HEADER_TIMEOUT.as_millis().to_string();
    let exporter = Exporter::start_with(
        &listen,
        &[&listen],
        &[("MM_PROBE_HEADER_TIMEOUT_MS", &timeout_ms)],
        &["--only", "retry-storm"],
    );
    let idle = TcpStream::connect(&listen).unwrap();
    let mut half = TcpStream::connect(&listen).unwrap();
    half.write_all(b"GET /metr").unwrap();
    let mut headers_unfinished = TcpStream::connect(&listen).unwrap();
    headers_unfinished.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
    let opened = Instant::now();
    for (what, stream) in [("idle", idle), ("half a request line", half), ("unfinished headers", headers_unfinished)] {
        let closed = closed_after(stream, opened);
        eprintln!("{what}: closed after {closed:?}");
        assert!(closed >= TEST_HEADER_TIMEOUT - Duration::from_millis(100), "{what} closed early: {closed:?}");
        assert!(closed < TEST_HEADER_TIMEOUT + Duration::from_secs(3), "{what} held for {closed:?}");
    }
    // A kept-alive connection idle after its answer goes the same way.
    let mut kept = TcpStream::connect(&listen).unwrap();
    kept.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut answer = [0; 512];
    let n = kept.read(&mut answer).unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
    let answered = Instant::now();
    let closed = closed_after(kept, answered);
    assert!(closed < TEST_HEADER_TIMEOUT + Duration::from_secs(3), "kept-alive and idle, held for {closed:?}");
    assert_eq!(http_get(port, "/metrics", "text/plain").0, 200, "served as before");
    exporter.stop_and_check_nothing_left(&before);
}

#[test]
fn a_scrape_gets_through_a_neighbour_holding_every_connection_open() {
    if !root_with_loopback() {
        return;
    }
    const CAP: usize = 64;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    // Long enough that none of the held connections times out during the test.
    let exporter = Exporter::start_with(
        &listen,
        &[&listen],
        &[("MM_PROBE_HEADER_TIMEOUT_MS", "20000")],
        &["--only", "retry-storm"],
    );
    // A kept-alive client that has scraped once, then a neighbour's idle connections to the cap.
    let mut scraper = TcpStream::connect(&listen).unwrap();
    scraper.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    assert!(scraper.read(&mut [0; 512]).unwrap() > 0, "the scraper is served");
    let held: Vec<TcpStream> = (1..CAP).map(|_| TcpStream::connect(&listen).unwrap()).collect();
    // Each new scrape takes the place of an idle connection that never asked for anything.
    for attempt in 0..3 {
        let started = Instant::now();
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
            "scrape {attempt}: {answer:.80}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "served at once, not after a timeout");
    }
    // The oldest idle ones were closed to make room; the scraper that had asked kept its place.
    let closed_first = closed_after(held[0].try_clone().unwrap(), Instant::now());
    assert!(closed_first < Duration::from_secs(2), "the oldest idle connection was held {closed_first:?}");
    scraper.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    assert!(scraper.read(&mut [0; 512]).unwrap() > 0, "the kept-alive scraper is still served");
    drop((held, scraper));
    exporter.stop_and_check_nothing_left(&our_programs());
}

/// How long after `since` the server closed `stream` (read gives end of file or a reset),
/// reading and discarding whatever it answered first; at most 30 s.
fn closed_after(mut stream: TcpStream, since: Instant) -> Duration {
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buffer = [0; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return since.elapsed(),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return since.elapsed(),
            Err(e) => panic!("the connection was not closed ({e}) after {:?}", since.elapsed()),
        }
    }
}

#[test]
fn a_selection_of_which_nothing_attaches_is_refused_unless_allowed() {
    if !root_with_loopback() {
        return;
    }
    let before = our_programs();
    let port = free_port();
    let (mut child, _stdout, startup) = spawn_exporter(&format!("127.0.0.1:{port}"), &[], &["--only", "thp"]);
    if !startup.is_empty() {
        // This kernel lets the allow-check attach: the refusal cannot be shown here.
        assert_eq!(attached_in_startup(&startup, "thp"), ["THP allow-check"], "{startup:#?}");
        interrupt(&child);
        assert_eq!(child.wait().unwrap().code(), Some(0));
        eprintln!("skipped: the THP allow-check attaches on this kernel");
        return;
    }
    let out = child.wait_with_output().unwrap();
    assert_one_line_usage_error(&out, "no probe of thp (THP allow-check) attached on this kernel");
    assert_one_line_usage_error(&out, "--allow-empty");
    assert!(leftover_programs(&before).is_empty(), "the refused exporter left programs loaded");

    let exporter = Exporter::start(&["--only", "thp", "--allow-empty"]);
    assert_eq!(exporter.startup[1], "  thp: nothing attached", "{:#?}", exporter.startup);
    let served = samples(&exporter.get_metrics(false));
    assert_eq!(value_of(&served, "mm_probe_probe_attached", &[("capability", "thp")]), 0.0);
    assert!(served.iter().all(|s| s.name != "mm_probe_thp_checks_total"), "nothing unmeasured is served");
    exporter.stop_and_check_nothing_left(&before);
}

#[test]
fn a_vms_invalidations_and_the_lock_they_contend_on_are_counted() {
    if !root_with_loopback() {
        return;
    }
    let before = our_programs();
    let exporter = Exporter::start(&["--only", "retry-storm,invalidations", "--window", "2s"]);
    let served = samples(&exporter.get_metrics(false));
    let attached = |capability: &str, probe: &str| {
        value_of(&served, "mm_probe_probe_attached", &[("capability", capability), ("probe", probe)]) == 1.0
    };
    let kvm_family = "mm_probe_kvm_mmu_notifier_events_total";
    for (probe, event) in [("kvm_unmap_hva_range", "unmap_hva_range"), ("kvm_age_hva", "age_hva")] {
        let series = served.iter().find(|s| s.name == kvm_family && s.labels.get("event").is_some_and(|e| e == event));
        // Attached once, by invalidations (which learns VMs' locks there), and served once.
        let in_retry_storm = served.iter().any(|s| {
            s.name == "mm_probe_probe_attached"
                && s.labels.get("capability").is_some_and(|c| c == "retry-storm")
                && s.labels.get("probe").is_some_and(|p| p == probe)
        });
        assert!(!in_retry_storm, "{probe} is attached once, by invalidations");
        assert_eq!(
            series.is_some(),
            attached("invalidations", probe),
            "{event} is served exactly where {probe} attached"
        );
    }
    if !attached("invalidations", "kvm_unmap_hva_range") || !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("skipped the VM: no /dev/kvm or no kvm_unmap_hva_range here ({:?})", exporter.startup);
        exporter.stop_and_check_nothing_left(&before);
        return;
    }
    let unmaps = |text: &str| value_of(&samples(text), kvm_family, &[("event", "unmap_hva_range")]);
    let contended = |served: &[Sample]| -> f64 {
        served
            .iter()
            .filter(|s| {
                s.name == "mm_probe_lock_contended_total"
                    && s.labels.get("lock_class").is_some_and(|c| c == "kvm_mmu_lock")
            })
            .map(|s| s.value)
            .sum()
    };
    let counts_contention = attached("invalidations", "contention_begin");
    // Two threads madvise a VM's memslot away 4 KiB at a time: one unmap each, on one mmu_lock.
    // Whether they overlap is the scheduler's doing: in a 7.2 guest whose two vCPUs shared the
    // host's two cores with another guest, 8192 madvises once met no contention at all. So the
    // storm runs again, up to STORMS times, until the lock has been contended; every storm's
    // unmaps are checked against its madvise calls.
    const STORMS: usize = 3;
    for storm in 1..=STORMS {
        let start = unmaps(&exporter.get_metrics(false));
        let out = std::process::Command::new(common::workload("kvm_storm"))
            .args(["--threads", "2", "--passes", "2", "--size", "16M", "--fifo"])
            .output()
            .expect("running kvm_storm");
        assert!(out.status.success(), "kvm_storm: {}", String::from_utf8_lossy(&out.stderr));
        let counts: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kvm_storm's counts");
        let calls = counts["madvise_calls"].as_f64().unwrap();
        let text = exporter.get_metrics(true);
        let end = unmaps(&text);
        eprintln!(
            "storm {storm}: kvm_unmap_hva_range {start} -> {end} after {calls} MADV_DONTNEED calls on the memslot"
        );
        // Exact: the KVM events are raw tracepoints, which a map syscall of the exporter's,
        // preempted by these FIFO threads on their CPU, does not make the kernel skip (as a
        // classic tracepoint's are: with those, one CI run counted 8084 of 8192).
        let guard: Vec<&str> = text.lines().filter(|l| l.contains("recursion_guard")).collect();
        assert!(end - start >= calls, "{calls} unmaps of the VM's memory, {} counted ({guard:?})", end - start);
        let served = samples(&text);
        if attached("invalidations", "kvm_unmap_hva_range") {
            // The madvises are counted again by why they happened: syscalls, at least one each.
            let by_syscall: f64 = served
                .iter()
                .filter(|s| s.name == "mm_probe_invalidation_causes_total")
                .filter(|s| s.labels.get("cause").is_some_and(|c| c == "syscall"))
                .map(|s| s.value)
                .sum();
            assert!(by_syscall >= calls, "{calls} madvise calls, {by_syscall} invalidations by syscalls");
        }
        let again = served.iter().any(|s| {
            s.name == "mm_probe_notifier_invalidations_total"
                && s.labels.get("source").is_some_and(|source| source == "kvm_unmap_hva_range")
        });
        assert!(!again, "KVM's unmaps are served under one name");
        if !counts_contention || contended(&served) > 0.0 {
            break;
        }
        assert!(storm < STORMS, "the two threads contended on the VM's mmu_lock in none of {STORMS} storms");
    }
    // The storm's window is judged as `mm-probe invalidations` judges a run: thousands of unmaps
    // of one VM's memory in its busiest second are a finding; a window without any is UNKNOWN.
    let bad = |s: &[Sample]| verdict(s, "invalidations").is_some_and(|level| level == "WARN" || level == "CRIT");
    let judged = exporter.metrics_when("a WARN or CRIT window", bad);
    let finding = judged.iter().find(|s| s.name == "mm_probe_finding" && s.labels["capability"] == "invalidations");
    let finding = finding.expect("the storm's window is a finding");
    assert_eq!(Some(&finding.labels["level"]), verdict(&judged, "invalidations").as_ref());
    let metrics = ["invalidate_freq", "wait_per_invalidation", "callback_mean", "amplification"];
    assert!(metrics.contains(&finding.labels["metric"].as_str()), "{finding:?}");
    let quiet = exporter
        .metrics_when("a window without invalidations", |s| verdict(s, "invalidations").as_deref() == Some("UNKNOWN"));
    assert!(!quiet.iter().any(|s| s.name == "mm_probe_finding"), "nothing invalidated: no finding");
    exporter.stop_and_check_nothing_left(&before);
}

fn assert_one_line_usage_error(out: &std::process::Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

/// The exporter as a child, killed if the test fails before stopping it.
struct Exporter {
    child: Option<Child>,
    _stdout: BufReader<ChildStdout>,
    port: u16,
    /// The start-up lines, the `listening` line first, the `unavailable` line last.
    startup: Vec<String>,
}

impl Exporter {
    fn start(args: &[&str]) -> Self {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        Self::start_with(&listen, &[&listen], &[], args)
    }

    /// `--listen listen`, expected to listen on one of `addresses`, with `env` added.
    fn start_with(listen: &str, addresses: &[&str], env: &[(&str, &str)], args: &[&str]) -> Self {
        let (child, stdout, startup) = spawn_exporter(listen, env, args);
        assert!(!startup.is_empty(), "the exporter printed nothing");
        let listening =
            addresses.iter().find(|a| startup[0] == format!("mm-probe exporter: listening on http://{a}/metrics"));
        let address = listening.unwrap_or_else(|| panic!("not listening on any of {addresses:?}: {startup:#?}"));
        let port = address.rsplit_once(':').unwrap().1.parse().unwrap();
        Self { child: Some(child), _stdout: stdout, port, startup }
    }

    /// The exposition, as Prometheus (OpenMetrics) or as curl (classic text) gets it.
    fn get_metrics(&self, openmetrics: bool) -> String {
        let accept = if openmetrics { "application/openmetrics-text; version=1.0.0" } else { "text/plain" };
        let (status, body) = http_get(self.port, "/metrics", accept);
        assert_eq!(status, 200, "{body}");
        body
    }

    /// The samples served once `done` holds of them, polled for up to 20 s (windows of 2 s).
    fn metrics_when(&self, what: &str, done: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let served = samples(&self.get_metrics(false));
            if done(&served) {
                return served;
            }
            let verdicts: Vec<_> = served.iter().filter(|s| s.name == "mm_probe_verdict" && s.value == 1.0).collect();
            assert!(Instant::now() < deadline, "no {what} within 20 s: {verdicts:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Ctrl-C: a clean exit, and every program it loaded gone.
    fn stop_and_check_nothing_left(mut self, before: &[(u32, String)]) {
        let mut child = self.child.take().unwrap();
        interrupt(&child);
        let status = child.wait().expect("waiting for the exporter");
        assert_eq!(status.code(), Some(0), "the exporter ends cleanly on SIGINT");
        let left = leftover_programs(before);
        assert!(left.is_empty(), "programs still loaded after SIGINT: {left:?}");
    }
}

/// `mm-probe exporter --listen listen ARGS`, and its start-up lines (none: it exited).
fn spawn_exporter(listen: &str, env: &[(&str, &str)], args: &[&str]) -> (Child, BufReader<ChildStdout>, Vec<String>) {
    let mut child = Command::new(mm_probe())
        .args(["exporter", "--listen", listen])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting mm-probe exporter");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let startup = startup_lines(&mut stdout);
    (child, stdout, startup)
}

/// The start-up lines, up to the `unavailable` line that ends them (all of stdout, should it
/// end before); each fits 100 columns.
fn startup_lines(stdout: &mut impl BufRead) -> Vec<String> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).expect("reading the start-up lines") == 0 {
            break;
        }
        let line = line.trim_end_matches('\n').to_string();
        eprintln!("{line}");
        assert!(line.chars().count() <= 100, "a start-up line over 100 columns: {line}");
        let last = line.starts_with("  unavailable: ");
        lines.push(line);
        if last {
            break;
        }
    }
    lines
}

/// The probes the start-up lines list as attached for `capability` (its line and the lines
/// continuing it, indented by four).
fn attached_in_startup(startup: &[String], capability: &str) -> Vec<String> {
    let head = format!("  {capability}: attached ");
    let Some(at) = startup.iter().position(|l| l.starts_with(&head)) else { return Vec::new() };
    let continued = startup[at + 1..].iter().take_while(|l| l.starts_with("    ")).map(|l| l.trim_start());
    let text = std::iter::once(&startup[at][head.len()..]).chain(continued).collect::<Vec<_>>().join(" ");
    text.split(", ").map(str::to_string).collect()
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A real Prometheus server scraping the exporter every second, with its data in a temp dir.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start(exporter_port: u16) -> Self {
        let binary = Path::new("/usr/bin/prometheus");
        assert!(binary.exists(), "prometheus is not installed: cargo xtask setup installs the Debian package");
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("mm-probe-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: mm-probe\n    \
             static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        let prometheus = Self { child, port, dir };
        prometheus.wait_until("ready", Duration::from_secs(90), || {
            http_get_opt(port, "/-/ready").is_some_and(|(s, _)| s == 200)
        });
        prometheus
    }

    fn wait_until(&self, what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !done() {
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
                // A scrape that failed (an exposition Prometheus cannot parse) says why here.
                let targets = http_get_opt(self.port, "/api/v1/targets").map(|(_, body)| body).unwrap_or_default();
                panic!("prometheus not {what} after {limit:?}; its targets: {targets}\nits log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn wait_for_first_scrape(&self) {
        self.wait_until("scraping", Duration::from_secs(60), || {
            self.query("up{job=\"mm-probe\"}").first().is_some_and(|r| r["value"][1] == "1")
        });
    }

    /// Until the newest stored sample of `series` was scraped after `unix_seconds`.
    fn wait_for_scrape_after(&self, series: &str, unix_seconds: f64) {
        self.wait_until("scraping after the workload", Duration::from_secs(60), || {
            self.query(&format!("timestamp({series})"))
                .first()
                .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok())
                .is_some_and(|t| t > unix_seconds)
        });
    }

    /// `/api/v1/query`: the result vector (empty on any error, which the callers wait out).
    fn query(&self, promql: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let Some((200, body)) = http_get_opt(self.port, &path) else { return Vec::new() };
        let answer: Value = serde_json::from_str(&body).unwrap_or_default();
        answer["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The one series' value.
    fn value(&self, promql: &str) -> f64 {
        let result = self.query(promql);
        assert_eq!(result.len(), 1, "{promql}: {result:?}");
        parse_value(&result[0]["value"][1])
    }

    /// Every bucket of a histogram, (le, count) by ascending le.
    fn buckets(&self, series: &str) -> Vec<(f64, f64)> {
        let mut buckets: Vec<(f64, f64)> = self
            .query(series)
            .iter()
            .map(|r| (parse_le(r["metric"]["le"].as_str().unwrap()), parse_value(&r["value"][1])))
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: kill with the pid of a child we spawned.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One sample line of the text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn samples(text: &str) -> Vec<Sample> {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(parse_sample).collect()
}

/// `name{a="x",b="y"} value` (the exporter's label values hold no quotes or commas).
fn parse_sample(line: &str) -> Sample {
    let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, rest.trim_end_matches('}')),
        None => (series, ""),
    };
    let labels = labels
        .split(',')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("bad label in {line}"));
            (k.to_string(), v.trim_matches('"').to_string())
        })
        .collect();
    Sample { name: name.to_string(), labels, value: value.parse().unwrap_or_else(|_| panic!("bad value in {line}")) }
}

/// The level of `capability`'s last window (the one `mm_probe_verdict` series at 1), if judged.
fn verdict(samples: &[Sample], capability: &str) -> Option<String> {
    let levels = samples.iter().filter(|s| s.name == "mm_probe_verdict" && s.labels["capability"] == capability);
    let mut set: Vec<&Sample> = levels.collect();
    if set.is_empty() {
        return None;
    }
    assert_eq!(set.len(), 4, "one series per level");
    set.retain(|s| s.value == 1.0);
    assert_eq!(set.len(), 1, "exactly one level set");
    Some(set[0].labels["level"].clone())
}

fn value_of(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v)))
        .unwrap_or_else(|| panic!("no {name} {labels:?} served"))
        .value
}

/// The wakeup histogram's buckets as served, (le, count) by ascending le.
fn buckets(samples: &[Sample]) -> Vec<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.name == "mm_probe_wakeup_latency_seconds_bucket")
        .map(|s| (parse_le(&s.labels["le"]), s.value))
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

fn parse_le(text: &str) -> f64 {
    if text == "+Inf" { f64::INFINITY } else { text.parse().unwrap_or_else(|_| panic!("bad le {text}")) }
}

fn parse_value(value: &Value) -> f64 {
    value.as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("bad value {value}"))
}

fn promtool_accepts(text: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool (Debian package prometheus)");
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{text}");
}

/// Faults 16 MiB of MADV_HUGEPAGE memory: every fault passes through the THP allow-check.
fn touch_advised_memory() {
    const LEN: usize = 16 << 20;
    // SAFETY: a private anonymous mapping, advised, written page by page, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::madvise(p, LEN, libc::MADV_HUGEPAGE);
        for offset in (0..LEN).step_by(4096) {
            p.cast::<u8>().add(offset).write_volatile(1);
        }
        libc::munmap(p, LEN);
    }
}

/// HTTP/1.0 GET on loopback (no chunked bodies to decode): status and body.
fn http_get(port: u16, path: &str, accept: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connecting to the exporter");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("reading the response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, body.to_string())
}

/// As `http_get`, `None` while nothing listens yet.
fn http_get_opt(port: u16, path: &str) -> Option<(u16, String)> {
    TcpStream::connect(("127.0.0.1", port)).ok()?;
    Some(http_get(port, path, "application/json"))
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"_.-".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }
        })
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("binding a loopback port").local_addr().unwrap().port()
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// Loopback up (the qemu guests boot with it down), or why it cannot be.
/// Root (the exporter loads programs), and a loopback interface to serve on; a guest without
/// one skips the HTTP tests, saying so.
fn root_with_loopback() -> bool {
    require_root();
    match loopback() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("skipped: {why}");
            false
        }
    }
}

fn loopback() -> Result<(), String> {
    bring_lo_up().map_err(|e| format!("cannot bring the loopback interface up: {e}"))?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no loopback address: {e}"))?;
    TcpStream::connect(listener.local_addr().unwrap()).map_err(|e| format!("loopback does not connect: {e}"))?;
    Ok(())
}

fn bring_lo_up() -> std::io::Result<()> {
    // SAFETY: an ifreq for "lo" read and written by SIOCGIFFLAGS/SIOCSIFFLAGS on our own socket.
    unsafe {
        let socket = libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0);
        if socket < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *to = *from as libc::c_char;
        }
        let mut result = Ok(());
        if libc::ioctl(socket, libc::SIOCGIFFLAGS, &mut request) != 0 {
            result = Err(std::io::Error::last_os_error());
        } else if request.ifr_ifru.ifru_flags & libc::IFF_UP as libc::c_short == 0 {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(socket, libc::SIOCSIFFLAGS, &request) != 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
        libc::close(socket);
        result
    }
}

//! What the latency end-to-end tests share: the tool running with `--json` until Ctrl-C,
//! workloads held until tracing has begun, and checks of the tool's NDJSON.
#![allow(dead_code)]

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    process::{Child, ChildStdout, Command, Stdio},
};

use serde_json::Value;

use crate::common::{json_lines, mm_probe, tool_line, vm_kernel, workload};

/// The tool, running with `--json`, after it printed its plan (its probes are attached).
pub struct Tracing {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
    pub plan: Value,
}

impl Tracing {
    pub fn start(args: &[&str]) -> Self {
        Self::start_with(args, &[])
    }

    /// `start`, with these variables in the tool's environment (the test hooks).
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(mm_probe())
            .arg("latency")
            .arg("--json")
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting mm-probe latency");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut first = String::new();
        stdout.read_line(&mut first).expect("reading the plan line");
        let plan = tool_line(&first);
        assert_eq!(plan["type"], "probe_plan", "{plan}");
        eprintln!("probe plan: {}", serde_json::to_string_pretty(&plan["functions"]).unwrap());
        Self { child, stdout, plan }
    }

    /// Ctrl-C, then every line the tool printed after its plan.
    pub fn interrupt(self) -> Vec<Value> {
        // SAFETY: kill with a pid we spawned and a valid signal number.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.finish()
    }

    pub fn finish(mut self) -> Vec<Value> {
        let mut rest = Vec::new();
        self.stdout.read_to_end(&mut rest).expect("reading mm-probe output");
        let status = self.child.wait().expect("waiting for mm-probe");
        assert_eq!(status.code(), Some(0), "mm-probe latency failed");
        json_lines(&rest)
    }

    /// The plan entry of traced function `name`.
    pub fn function(&self, name: &str) -> &Value {
        self.plan["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["function"] == name)
            .unwrap_or_else(|| panic!("{name} is not in the plan: {}", self.plan))
    }
}

/// A test that fails before it interrupts the tool must not leave it tracing behind it.
impl Drop for Tracing {
    fn drop(&mut self) {
        // A child already waited for is not signalled again (std keeps its status).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn only<'a>(lines: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = lines.iter().filter(|l| l["type"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind} line in {lines:#?}");
    found[0]
}

pub fn spikes<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["type"] == "spike" && l["kind"] == kind).collect()
}

/// What rt_waker printed: its pid, its loops, how many times it really blocked (its
/// voluntary context switches, as the kernel counted them), and how late it woke on average by
/// its own clock (from its timer's expiry, as cyclictest measures).
pub struct WakerRun {
    pub pid: u32,
    pub loops: u64,
    pub blocked: u64,
    pub avg_late_us: u64,
}

impl WakerRun {
    fn parse(text: &str) -> Self {
        let field = |name: &str| -> u64 {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name}= in {text:?}"))
        };
        Self {
            pid: field("pid") as u32,
            loops: field("loops"),
            blocked: field("blocked"),
            avg_late_us: field("avg_late_us"),
        }
    }
}

pub fn run_waker(args: &[&str]) -> WakerRun {
    let out = Command::new(workload("rt_waker")).args(args).output().expect("running rt_waker");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "rt_waker failed: {text} {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    WakerRun::parse(&text)
}

/// The waker's wakeups as the tool counted them, against the kernel's own count of the times
/// the waker blocked: each block ends in exactly one wakeup (a timer, the line that released a
/// held waker, and on PREEMPT_RT a contended spinlock_t, which sleeps there). The slack is for
/// the edges of the traced window.
pub fn assert_plausible_wakeups(measured: u64, waker: &WakerRun, context: &Value) {
    let slack = 2 + waker.blocked / 100;
    assert!(
        measured.abs_diff(waker.blocked) <= slack,
        "rt_waker blocked {} times in {} loops, the tool measured {measured} wakeups: {context}",
        waker.blocked,
        waker.loops
    );
}

/// Sanity of one quantity's summary: percentiles in order, histogram rows summing to the count
/// and tiling the nanosecond axis, the threshold row named.
pub fn check_quantity(q: &Value, threshold_ns: u64) {
    let n = |k: &str| q[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {q}"));
    assert!(n("p50_ns") <= n("p90_ns") && n("p90_ns") <= n("p99_ns") && n("p99_ns") <= n("p999_ns"), "{q}");
    assert!(n("p999_ns") <= n("max_ns"), "{q}");
    let histogram = &q["histogram"];
    let buckets = histogram["buckets"].as_array().unwrap();
    let rows: u64 = buckets.iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert_eq!(rows, n("count"), "histogram rows must hold every sample: {q}");
    let bound = |b: &Value, k: &str| b[k].as_u64().unwrap();
    assert!(
        buckets.windows(2).all(|w| bound(&w[0], "high_ns") + 1 == bound(&w[1], "low_ns")),
        "rows tile the ns axis: {q}"
    );
    let threshold_us = threshold_ns / 1000;
    assert_eq!(histogram["threshold_bucket"].as_u64().unwrap(), 63 - u64::from(threshold_us.leading_zeros()), "{q}");
}

/// Where function probes attach: every Debian kernel of the matrix. On the host (no kprobes,
/// trampolines refused) the plan must say they do not, and why.
pub fn check_function_plan(tracing: &Tracing, name: &str) -> bool {
    let plan = tracing.function(name);
    let attribution = &tracing.plan["function_attribution"];
    if vm_kernel().is_some() {
        assert_eq!(plan["attached"], true, "{name} must attach on {:?}: {plan}", vm_kernel());
        return true;
    }
    if plan["attached"] == true {
        return true;
    }
    let reason = plan["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("CONFIG_KPROBES") || reason.contains("EPERM") || reason.contains("BTF"),
        "unexplained function probe failure: {plan}"
    );
    assert_eq!(attribution["available"], false, "{attribution}");
    let why = attribution["reason"].as_str().unwrap_or_default();
    assert!(why.contains(name) && why.contains(reason), "the reason must name the function and why: {attribution}");
    false
}

/// A waker started as SCHED_FIFO but held before its first loop, so that tracing (even with -p)
/// starts first; after its loops it is held again until `exit`, so that what its exit does
/// (on PREEMPT_RT, freeing its locked memory sleeps on contended spinlock_t locks) happens after
/// tracing has stopped and is not counted against its loops.
pub struct HeldWaker {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
    pub stdin: Option<std::process::ChildStdin>,
    pub pid: u32,
}

/// Starts a workload with `--go-on-stdin` and reads the line it prints once it is ready.
fn spawn_held(program: &str, args: &[&str]) -> (Child, BufReader<ChildStdout>, String) {
    let mut child = Command::new(workload(program))
        .args(args)
        .arg("--go-on-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {program}: {e}"));
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap_or_else(|e| panic!("{program}'s ready line: {e}"));
    (child, stdout, ready)
}

impl HeldWaker {
    pub fn spawn(args: &[&str]) -> Self {
        let (mut child, stdout, ready) = spawn_held("rt_waker", args);
        let stdin = child.stdin.take();
        let pid = ready.trim().strip_prefix("ready pid=").and_then(|p| p.parse().ok()).expect("ready pid=N");
        Self { child, stdout, stdin, pid }
    }

    /// Lets it loop and waits for its report (it then waits for `exit`).
    pub fn run(&mut self) -> WakerRun {
        let stdin = self.stdin.as_mut().expect("released once");
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
        let mut report = String::new();
        self.stdout.read_line(&mut report).expect("rt_waker report line");
        eprintln!("{report}");
        let run = WakerRun::parse(&report);
        assert_eq!(run.pid, self.pid);
        run
    }

    /// Lets it exit.
    pub fn exit(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "rt_waker failed: {status}");
    }
}

/// A storm prepared (memory faulted in) but held until released.
pub struct HeldStorm {
    pub child: Child,
    stdout: BufReader<ChildStdout>,
}

impl HeldStorm {
    pub fn spawn(args: &[&str]) -> Self {
        let (child, stdout, ready) = spawn_held("pageout_storm", args);
        assert!(ready.starts_with("ready"), "{ready}");
        Self { child, stdout }
    }

    pub fn release(&mut self) {
        self.child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }

    pub fn finish(mut self) -> Value {
        let mut report = Vec::new();
        self.stdout.read_to_end(&mut report).expect("reading pageout_storm's report");
        assert!(self.child.wait().unwrap().success());
        serde_json::from_slice(&report).expect("pageout_storm prints JSON")
    }
}

/// One traced run of a SCHED_FIFO 99 waker on CPU 1 (5 ms period, like a slow cyclictest),
/// alone or beside a storm; only the waker is traced (-p), as cyclictest measures only itself.
pub fn trace_waker(loops: &str, threshold: &str, storms: &[&[&str]]) -> (Vec<Value>, WakerRun, Vec<Value>, bool) {
    trace_waker_on("1", "5000", loops, threshold, storms)
}

/// The same with the waker on `cpu`, woken every `period_us`.
pub fn trace_waker_on(
    cpu: &str,
    period_us: &str,
    loops: &str,
    threshold: &str,
    storms: &[&[&str]],
) -> (Vec<Value>, WakerRun, Vec<Value>, bool) {
    let mut storms: Vec<HeldStorm> = storms.iter().map(|args| HeldStorm::spawn(args)).collect();
    let mut held = HeldWaker::spawn(&["--prio", "99", "--period-us", period_us, "--loops", loops, "--cpu", cpu]);
    let pid = held.pid.to_string();
    let tracing = Tracing::start(&["-p", &pid, "--threshold", threshold, "--top", "100"]);
    let traced = check_function_plan(&tracing, "madvise_cold_or_pageout_pte_range");
    for storm in &mut storms {
        storm.release();
    }
    let waker = held.run();
    let storms = storms.into_iter().map(HeldStorm::finish).collect();
    let lines = tracing.interrupt();
    held.exit();
    (lines, waker, storms, traced)
}

/// The summary's entry for the traced function `name`, if it was traced.
pub fn find_function<'a>(summary: &'a Value, name: &str) -> Option<&'a Value> {
    summary["functions"].as_array()?.iter().find(|f| f["name"] == name)
}

/// The same, where it must be there: a panic that shows the summary if it is not.
pub fn function_summary<'a>(summary: &'a Value, name: &str) -> &'a Value {
    find_function(summary, name).unwrap_or_else(|| panic!("no {name} summary: {summary}"))
}

pub const WALK: &str = "madvise_cold_or_pageout_pte_range";

pub fn walk_summary(summary: &Value) -> &Value {
    function_summary(summary, WALK)
}

/// A stack's frames, innermost first.
pub fn frames(stack: &Value) -> Vec<&str> {
    stack["frames"].as_array().map(|f| f.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// Whether `function` is one of the stack's frames.
pub fn has_frame(stack: &Value, function: &str) -> bool {
    frames(stack).iter().any(|f| f.starts_with(&format!("{function}+")))
}

/// Processes that keep `count` CPUs busy in user space: `stress-ng --cpu` where it is installed,
/// shell busy loops otherwise. Killed on drop.
pub struct CpuHogs {
    children: Vec<Child>,
    /// What their comm starts with.
    pub comm: &'static str,
}

impl CpuHogs {
    pub fn start(count: usize) -> Self {
        // stress-ng refuses to start where it cannot write its temporary files (the guests'
        // working directory is read-only): it is given the temporary directory.
        let temp = std::env::temp_dir();
        let stress = Command::new("stress-ng")
            .args(["--cpu", &count.to_string(), "--timeout", "60s", "--quiet"])
            .arg("--temp-path")
            .arg(&temp)
            .current_dir(&temp)
            .stdout(Stdio::null())
            .spawn();
        // One that starts and quits at once (a refused option) is no hog either.
        let running = stress.ok().and_then(|mut child| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            matches!(child.try_wait(), Ok(None)).then_some(child)
        });
        match running {
            Some(child) => Self { children: vec![child], comm: "stress-ng" },
            None => Self {
                children: (0..count)
                    .map(|_| Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("starting sh"))
                    .collect(),
                comm: "sh",
            },
        }
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for child in &mut self.children {
            // SIGTERM first: stress-ng then stops its workers.
            // SAFETY: kill with a pid we spawned and a valid signal number.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}

/// Threads named `comm` that sleep 1 ms in a loop (clock_nanosleep) until dropped.
pub struct Sleepers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Sleepers {
    pub fn start(count: usize, comm: &str) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..count)
            .map(|_| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(comm.to_string())
                    .spawn(move || {
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                        }
                    })
                    .expect("starting a sleeper")
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Syscalls that only wait: a task in one of them never held the CPU because of it.
pub const WAITING_SYSCALLS: [&str; 9] =
    ["clock_nanosleep", "nanosleep", "futex", "epoll_wait", "epoll_pwait", "poll", "ppoll", "select", "pselect6"];

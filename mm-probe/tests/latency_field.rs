//! The field case under `mm-probe latency`: a SCHED_FIFO 99 waker woken every millisecond (like
//! `cyclictest -m -p 99 -i 1000`) shares its CPU with a loop of madvise(MADV_COLD) over 512 MiB
//! of small pages, every page touched again before each call. Upstream b2f557a21bc8 (6.7) added a
//! reschedule point inside madvise_cold_or_pageout_pte_range's PTE loop; before it the function
//! reschedules only when a call ends, and one call walks one PMD (512 PTEs, one 2 MiB step).
//!
//! So with T, the time of one step (the mean madvise call ÷ the 2 MiB steps it walks, measured
//! in the same run), a woken task waits up to about T on 6.1 and a small fraction of T on 6.12;
//! on PREEMPT_RT the walk is preemptible and does not delay it at all. Those relations are what
//! this test asserts, where the guest's clock is instruction-counted (the harness runs this
//! binary so: MM_PROBE_VM_CLOCK): there a guest task's wait follows the instructions the kernel
//! executes, not the host's load. Elsewhere (the host, a free-running guest) it runs the same
//! phases and checks only what the kernel counts. Each phase prints a `MEASURED` line.

mod common;
mod latency_support;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use common::{require_root, vm_kernel};
use latency_support::*;
use serde_json::Value;

const STEP_BYTES: u64 = 2 << 20;
const THRESHOLD_NS: u64 = 500_000;

/// What the kernel line's code makes of the walk, read from its source (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// 6.1: the woken task gets the CPU when a call ends: the worst wait is about T.
    OneStep,
    /// 6.12: need_resched is checked inside the PTE loop: the worst wait is a small part of T.
    WithinAStep,
    /// PREEMPT_RT: the walk is preempted at once: waits as in the control.
    Preemptible,
    /// Not a kernel line of the matrix, or a clock that follows the host: nothing about time.
    Unknown,
}

fn expectation(kernel: Option<&str>, counted: bool) -> Expect {
    match (kernel, counted) {
        (_, false) | (None, _) => Expect::Unknown,
        (Some(k), true) if k.ends_with("-rt") => Expect::Preemptible,
        (Some("6.1"), true) => Expect::OneStep,
        (Some("6.12"), true) => Expect::WithinAStep,
        _ => Expect::Unknown,
    }
}

/// One traced phase: the waker beside `advice` (or no madvise at all: "none").
struct Phase {
    lines: Vec<Value>,
    storm: Value,
    waker: WakerRun,
}

impl Phase {
    fn run(cpu: &str, bytes: &str, advice: &str) -> Self {
        let storm: &[&str] = &["--bytes", bytes, "--duration-ms", "4000", "--cpu", cpu, "--advice", advice];
        let threshold = format!("{}us", THRESHOLD_NS / 1000);
        let (lines, waker, storms, _traced) = trace_waker_on(cpu, "1000", "1500", &threshold, &[storm]);
        Self { lines, storm: storms.into_iter().next().unwrap_or_default(), waker }
    }

    fn summary(&self) -> &Value {
        only(&self.lines, "summary")
    }

    fn worst_ns(&self) -> u64 {
        self.summary()["wakeup"]["max_ns"].as_u64().unwrap_or(0)
    }

    /// T: the mean madvise call ÷ the 2 MiB steps each call walks; `None` without a call.
    fn step_ns(&self) -> Option<f64> {
        let calls = self.storm["calls"].as_u64().filter(|&c| c > 0)?;
        let steps = self.storm["bytes_per_call"].as_u64()? / STEP_BYTES;
        Some(self.storm["total_madvise_us"].as_u64()? as f64 * 1000.0 / calls as f64 / steps as f64)
    }

    /// Every spike over the threshold the verdict blames on the walk (the listed ones are the
    /// worst `--top` only).
    fn spikes_caused_by_walk(&self) -> u64 {
        let causes = self.summary()["spike_causes"].as_array().cloned().unwrap_or_default();
        causes.iter().find(|c| c[0] == WALK).and_then(|c| c[1].as_u64()).unwrap_or(0)
    }

    fn p99_ns(&self) -> u64 {
        self.summary()["wakeup"]["p99_ns"].as_u64().unwrap_or(0)
    }

    fn blamed_on_walk(&self) -> Vec<&Value> {
        spikes(&self.lines, "wakeup").into_iter().filter(|s| s["cause"] == WALK).collect()
    }

    fn measured(&self, kernel: &str, clock: &str, phase: &str, step_ns: Option<f64>) {
        let wakeup = &self.summary()["wakeup"];
        let us = |ns: u64| ns as f64 / 1000.0;
        let of_step = |ns: u64| step_ns.map_or("-".into(), |t| format!("{:.2}", ns as f64 / t));
        let walk = find_function(self.summary(), WALK).unwrap_or(&Value::Null);
        eprintln!(
            "MEASURED kernel={kernel} clock={clock} phase={phase} wakeups={} p99_us={:.0} max_us={:.0} \
             max_in_steps={} step_us={} over_500us={} blamed_on_walk={} madvise_calls={} walk_calls={} \
             walk_mean_us={} verdict={:?}",
            wakeup["count"],
            us(wakeup["p99_ns"].as_u64().unwrap_or(0)),
            us(self.worst_ns()),
            of_step(self.worst_ns()),
            step_ns.map_or("-".into(), |t| format!("{:.0}", t / 1000.0)),
            wakeup["over_threshold"],
            self.blamed_on_walk().len(),
            self.storm["calls"],
            walk["count"],
            walk["mean_ns"].as_f64().map_or("-".into(), |m| format!("{:.0}", m / 1000.0)),
            self.summary()["verdict"]["headline"].as_str().unwrap_or_default(),
        );
        for spike in spikes(&self.lines, "wakeup").iter().take(2) {
            eprintln!("SPIKE {}\n  stack: {:?}", spike["explanation"], frames(&spike["stack"]));
        }
    }

    /// What the kernel counts, on every clock: one wakeup per block, every spike listed or lost.
    fn check_counts(&self) {
        let wakeup = &self.summary()["wakeup"];
        assert_plausible_wakeups(wakeup["count"].as_u64().unwrap(), &self.waker, wakeup);
        let lost = only(&self.lines, "lost_events")["wakeup_spikes"].as_u64().unwrap();
        assert_eq!(
            self.summary()["wakeup_spikes"].as_u64().unwrap() + lost,
            wakeup["over_threshold"].as_u64().unwrap()
        );
        for spike in spikes(&self.lines, "wakeup") {
            assert_eq!(spike["pid"], self.waker.pid, "only the waker is traced: {spike}");
        }
    }
}

#[test]
fn the_madvise_walk_delays_a_fifo_waker_by_at_most_one_2mib_step() {
    require_root();
    let kernel = vm_kernel();
    let clock = std::env::var("MM_PROBE_VM_CLOCK").unwrap_or_else(|_| "host".into());
    let expect = expectation(kernel.as_deref(), clock == "instruction-counted");
    // MGLRU on in every kernel, so that one step does comparable work on all of them; THP on
    // madvise, so that khugepaged's own stretches stay out. Both put back afterwards.
    let mut knobs = common::Knobs::default();
    if expect != Expect::Unknown {
        knobs.try_set("/sys/kernel/mm/lru_gen/enabled", "y");
        knobs.try_set("/sys/kernel/mm/transparent_hugepage/enabled", "madvise");
    }
    // The waker and the walk share one CPU: the only one of an instruction-counted guest.
    let cpu = if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 { "1" } else { "0" };
    let bytes = if expect == Expect::Unknown { "64M" } else { "512M" };
    let label = kernel.clone().unwrap_or_else(|| "host".into());

    let control = Phase::run(cpu, bytes, "none");
    let walks = [Phase::run(cpu, bytes, "cold"), Phase::run(cpu, bytes, "cold")];
    let step_ns = walks[0].step_ns();
    control.measured(&label, &clock, "control", step_ns);
    for (i, walk) in walks.iter().enumerate() {
        walk.measured(&label, &clock, &format!("cold#{}", i + 1), walk.step_ns());
    }
    control.check_counts();
    walks.iter().for_each(Phase::check_counts);
    if expect == Expect::Unknown {
        return;
    }

    for walk in &walks {
        assert!(walk.storm["calls"].as_u64().unwrap() >= 2, "T needs whole madvise calls: {}", walk.storm);
        let t = walk.step_ns().unwrap();
        let worst = walk.worst_ns() as f64 / t;
        let blamed = walk.blamed_on_walk();
        let over = walk.summary()["wakeup"]["over_threshold"].as_u64().unwrap();
        let bound = &walk.summary()["call_bound"];
        match expect {
            Expect::OneStep => {
                assert!((0.6..=1.5).contains(&worst), "6.1: the worst wait is about one step, {worst:.2} T");
                let on_walk = walk.spikes_caused_by_walk();
                assert!(on_walk * 10 >= over * 9, "nearly every wait is the walk's: {on_walk} of {over}");
                assert!(!blamed.is_empty(), "the worst waits are listed with the walk as their cause");
                // The stack is taken at the switch to the woken task, from the task that ran
                // last: the blocker, unless a kernel thread (migration/0) ran after it for a few
                // µs. Then the spike says whose stack it is, and the blocker is still named.
                let (blockers, others): (Vec<&Value>, Vec<&Value>) =
                    blamed.iter().partition(|spike| spike["stack_of"]["pid"] == spike["blocker"]["pid"]);
                assert!(blockers.len() * 10 >= blamed.len() * 9, "nearly every stack is the blocker's: {others:?}");
                for spike in &blockers {
                    assert!(has_frame(&spike["stack"], WALK), "the walk is in the blocker's stack: {spike}");
                    sampled_in_walk(spike);
                }
                for spike in &blockers {
                    let says = spike["explanation"].as_str().unwrap();
                    assert!(says.contains("MADV_COLD") && says.contains("512 MiB"), "advice and length named: {says}");
                }
                // Its syscall, read with its stack, is then not known: the blocker and the walk
                // are named all the same.
                for spike in &others {
                    assert_eq!(spike["stack_of"], spike["prev"], "the stack is named as the last task's: {spike}");
                    assert_eq!(spike["held_by"]["pid"], spike["blocker"]["pid"], "the blocker is still named: {spike}");
                    let says = spike["explanation"].as_str().unwrap();
                    let blocker = spike["blocker"]["comm"].as_str().unwrap();
                    assert!(says.contains(blocker) && says.contains(WALK), "the blocker in the walk named: {says}");
                }
                assert_eq!(bound["bound"], "one_call", "the verdict says waits are bounded by one step: {bound}");
            }
            Expect::WithinAStep => {
                assert!(worst <= 0.35, "6.12: the worst wait is a small part of a step, {worst:.2} T");
                assert!(blamed.is_empty(), "no wait is the walk's on 6.12: {blamed:?}");
                assert_eq!(bound["bound"], "within_a_call", "the verdict says the walk lets the task in: {bound}");
            }
            Expect::Preemptible => {
                assert!(worst <= 0.25, "PREEMPT_RT: the walk does not delay the waker, {worst:.2} T");
                assert!(blamed.is_empty(), "no wait is the walk's on PREEMPT_RT: {blamed:?}");
            }
            Expect::Unknown => unreachable!(),
        }
    }
    // The control, measured against the same T: what the guest and the tool cost on their own.
    let t = step_ns.unwrap();
    assert!((control.worst_ns() as f64 / t) <= 0.15, "control: {:.2} T", control.worst_ns() as f64 / t);
    // Instruction counting makes the runs repeat; which figure repeats depends on the kernel.
    // Where one step bounds the waits (6.1), half the wakeups land anywhere in [0, T] and the
    // P99 sits on that range's upper edge, where a few wakeups move it by a histogram slot
    // (measured 0.000-0.068 T apart), while the maximum is the step itself (0.001-0.009 T
    // apart). Elsewhere the P99 is the steady part and the maximum one rare coincidence of a
    // wakeup with the walk's longest stretch (up to 0.13 T apart). Measured from the wakeup,
    // the P99 was 0.000-0.003 T apart; measured from the timer's expiry it also holds how late
    // the timer interrupt came, which depends on where it met the walk's interrupts-off
    // sections, and that moves between runs as the waker's own clock shows (6.12: its mean
    // lateness 130 µs in one run, 167 µs in the next, 0.016 T). So the P99 must repeat as well
    // as the waker's own lateness does.
    let spread = |of: fn(&Phase) -> u64| of(&walks[0]).abs_diff(of(&walks[1])) as f64 / t;
    let (p99_spread, max_spread) = (spread(Phase::p99_ns), spread(Phase::worst_ns));
    let own_spread = walks[0].waker.avg_late_us.abs_diff(walks[1].waker.avg_late_us) as f64 * 1000.0 / t;
    eprintln!(
        "MEASURED kernel={label} spread_in_steps p99={p99_spread:.3} max={max_spread:.3} waker_mean_late={own_spread:.3}"
    );
    if expect == Expect::OneStep {
        assert!(max_spread <= 0.05, "two identical runs' worst waits differ by {max_spread:.3} T");
    } else {
        assert!(
            p99_spread <= 0.02 + own_spread,
            "two identical runs' P99 differ by {p99_spread:.3} T, the waker's own mean lateness by {own_spread:.3} T"
        );
    }
}

/// The samples of the blocker during a wait the walk caused agree with its exact timing: most of
/// those with a kernel stack have the walk on it.
fn sampled_in_walk(spike: &Value) {
    let samples = &spike["samples"];
    let n = |key: &str| samples[key].as_u64().unwrap_or(0);
    let in_kernel = n("of_task") - n("in_user_space") - n("unreadable");
    assert!(in_kernel > 0, "the sampler ticked in the blocker's kernel time during the wait: {spike}");
    let in_walk = samples["in_traced"].as_array().unwrap().iter().find(|t| t["function"] == WALK);
    let in_walk = in_walk.and_then(|t| t["samples"].as_u64()).unwrap_or(0);
    assert!(in_walk * 2 > in_kernel, "most samples fell in the walk ({in_walk} of {in_kernel}): {samples}");
}

/// The worst wait's samples, where the sampler ran: it ticked during the wait, and named the
/// function most of the holder's kernel samples fell in. A wait that began on an idle CPU has
/// no holder, and the sampler records nothing there by design (the host's CI run of
/// 2026-12-07 had such a worst wait: 1.11 ms waking CPU 0).
fn sampled_worst(plan: &Value, worst: &Value) {
    let sampling = &plan["sampling"];
    let period_ns = sampling["period_ns"].as_u64().unwrap();
    let latency_ns = worst["since_wakeup_ns"].as_u64().unwrap();
    let holder_was_idle = worst["samples"]["task"]["pid"] == 0;
    if sampling["available"] != true
        || worst["target_cpu"] != worst["run_cpu"]
        || latency_ns < 4 * period_ns
        || holder_was_idle
    {
        return;
    }
    let samples = &worst["samples"];
    let n = |key: &str| samples[key].as_u64().unwrap_or(0);
    assert!(n("taken") > 0, "the sampler ticked during a wait of {latency_ns} ns: {samples}");
    let in_kernel = n("of_task") - n("in_user_space") - n("unreadable");
    assert!(in_kernel == 0 || samples["hottest"].is_object(), "a function is named from the samples: {samples}");
}

/// The field report's own reproduction, with the distributions' tools: cyclictest measuring
/// itself on CPU 0 beside stress-ng's vm stressor there (its madvise calls with random advice
/// and its munmaps walk 512 MiB), while mm-probe watches every real-time task. Both measure a
/// timer wakeup from the timer's expiry: cyclictest to its own clock read after it runs,
/// mm-probe to the switch that runs it, a few instructions earlier. So cyclictest's Max bounds
/// mm-probe's worst wait of that thread on every kernel, and where guest time follows
/// instructions (not PREEMPT_RT, whose soft timers count only from their thread's switch-in:
/// docs/kernel-facts.md#timer-expiry) they agree within a few per cent. Before waits started
/// at the expiry, one 6.1 run gave 20.5 ms against mm-probe's 5.3 ms: the timer interrupt had
/// been held off while the stressor freed pages with interrupts off.
#[test]
fn cyclictest_beside_stress_ngs_vm_stressor_bounds_mm_probes_worst_wait() {
    require_root();
    let kernel = vm_kernel();
    let clock = std::env::var("MM_PROBE_VM_CLOCK").unwrap_or_else(|_| "host".into());
    let tracing = Tracing::start(&["--threshold", "500us", "--top", "100"]);
    let cyclictest = Command::new("cyclictest")
        .args(["-m", "-p", "99", "-a", "0", "-t", "1", "-i", "1000", "-D", "10", "-q"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("cyclictest (rt-tests, which cargo xtask setup installs)");
    // The stressor starts once cyclictest's thread sleeps in its loop and ends before it does:
    // every wait of that thread while the stressor runs is one of cyclictest's samples.
    std::thread::sleep(Duration::from_millis(500));
    let temp = std::env::temp_dir();
    let stress = Command::new("stress-ng")
        .args(["--vm", "1", "--vm-bytes", "512M", "--vm-method", "write64", "--taskset", "0"])
        .args(["--timeout", "6s", "--quiet", "--temp-path"])
        .arg(&temp)
        .current_dir(&temp)
        .stdout(Stdio::null())
        .status()
        .expect("stress-ng (which cargo xtask setup installs)");
    assert!(stress.success(), "stress-ng --vm failed: {stress}");
    let cyclictest = cyclictest.wait_with_output().expect("waiting for cyclictest");
    let plan = tracing.plan.clone();
    let lines = tracing.interrupt();
    let (tid, max_us) = cyclictest_result(&String::from_utf8_lossy(&cyclictest.stdout));
    let tasks = only(&lines, "summary")["tasks"].as_array().unwrap();
    let row =
        tasks.iter().find(|t| t["pid"] == tid).unwrap_or_else(|| panic!("no row of cyclictest's {tid}: {tasks:?}"));
    let ours_ns = row["max_ns"].as_u64().unwrap();
    let mut waits: Vec<&Value> = spikes(&lines, "wakeup").into_iter().filter(|s| s["pid"] == tid).collect();
    waits.sort_by_key(|s| std::cmp::Reverse(s["latency_ns"].as_u64()));
    let worst = waits.first().copied();
    let label = kernel.unwrap_or_else(|| "host".into());
    eprintln!(
        "MEASURED kernel={label} clock={clock} cyclictest_max_us={max_us} mm_probe_max_ns={ours_ns} spikes={} worst_syscall={}",
        waits.len(),
        worst.map_or(Value::Null, |s| s["syscall"].clone())
    );
    for spike in waits.iter().take(3) {
        eprintln!("  {}", spike["explanation"]);
    }
    eprintln!("  worst's samples: {}", worst.map_or(Value::Null, |s| s["samples"].clone()));
    let summary = only(&lines, "summary");
    eprintln!("  verdict: {}", summary["verdict"]["headline"]);
    // A spike no traced function explains whose samples name a place puts a place in the verdict.
    let placed = spikes(&lines, "wakeup")
        .into_iter()
        .any(|s| s["functions"].as_array().is_some_and(Vec::is_empty) && s["samples"]["hottest"].is_object());
    if placed {
        assert!(
            !summary["sampled_places"].as_array().unwrap().is_empty(),
            "the verdict names where samples fell: {summary}"
        );
    }
    eprintln!("  lost: {}", only(&lines, "lost_events"));
    if let Some(worst) = worst {
        sampled_worst(&plan, worst);
    }
    // cyclictest prints whole microseconds.
    assert!(ours_ns <= (max_us + 1) * 1000, "mm-probe's {ours_ns} ns over cyclictest's Max of {max_us} µs");
    let comparable = clock == "instruction-counted" && !label.ends_with("-rt");
    if comparable && max_us * 1000 > THRESHOLD_NS {
        assert!(
            ours_ns * 100 >= max_us * 1000 * 95,
            "mm-probe's worst wait {ours_ns} ns is more than 5 % below cyclictest's Max of {max_us} µs"
        );
    }
    if let Some(worst) = worst {
        syscall_named(worst);
    }
}

/// The worst wait names its syscall whenever one entered the code that delayed it: the code a
/// late timer interrupted, else the task that held the CPU (its stack entered through a
/// syscall).
fn syscall_named(worst: &Value) {
    let interrupted = &worst["timer"]["interrupted"];
    let late_timer = worst["cause"] == "late timer";
    let (stack, syscall) = if late_timer {
        (&interrupted["stack"], &interrupted["syscall"])
    } else {
        (&worst["stack"], &worst["syscall"])
    };
    let entered_by_syscall = stack["frames"]
        .as_array()
        .and_then(|frames| frames.last())
        .and_then(Value::as_str)
        .is_some_and(|outermost| outermost.starts_with("entry_SYSCALL"));
    if entered_by_syscall {
        assert!(syscall["summary"].is_string(), "the worst wait's syscall is named: {worst}");
    }
}

/// The measuring thread's id and its Max, in µs, from `cyclictest -q`'s line
/// `T: 0 ( 186) P:99 I:1000 C:  10000 Min: 9 Act: 31 Avg: 40 Max: 34400`.
fn cyclictest_result(out: &str) -> (u64, u64) {
    let line = out.lines().find(|l| l.starts_with("T: 0")).unwrap_or_else(|| panic!("no thread line in {out}"));
    let tid = line.split(['(', ')']).nth(1).and_then(|t| t.trim().parse().ok());
    let max = line.split("Max:").nth(1).and_then(|m| m.trim().parse().ok());
    tid.zip(max).unwrap_or_else(|| panic!("unreadable cyclictest line {line:?}"))
}

//! The field case under `mm-probe latency`: a periodic SCHED_FIFO waker beside an madvise
//! storm, measured on every kernel of the matrix for the before/after table (a binary of its
//! own, so that its several traced runs have their own time in an emulated guest).

mod common;
mod latency_support;

use common::{require_root, vm_kernel};
use latency_support::*;
use serde_json::Value;

/// The field case: a periodic SCHED_FIFO 99 waker shares CPU 1 with an madvise storm while
/// another process keeps 256 MiB hot (like `stress-ng --vm`; a separate process, so the storm's
/// TLB flushes stay local). Three phases, each traced with a 1 ms threshold: a control with both
/// CPUs just as busy but the storm only touching its pages in user space (the emulated guest's
/// own noise under load: vCPU threads stall on a shared host), beside
/// MADV_PAGEOUT (the field case: each pmd_entry call walks 512 PTEs, then reclaims the isolated
/// pages, which reschedules per page), and beside MADV_COLD (the PTE walk alone, the part that
/// upstream b2f557a21bc8 breaks up with cond_resched).
/// Prints a `MEASURED` line per phase for the README's table, and the worst spikes as the tool
/// explains them.
#[test]
fn a_fifo_waker_beside_an_madvise_pageout_storm() {
    require_root();
    let threshold_ns: u64 = 1_000_000;
    let kernel = vm_kernel().unwrap_or_else(|| "host".into());
    let _swap = guest_swap();
    let us = |v: &Value| v.as_u64().map_or("-".to_string(), |n| format!("{}", n / 1000));
    let pressure: &[&str] = &["--threads", "0", "--pressure-bytes", "256M", "--duration-ms", "3500"];
    let pageout: &[&str] = &["--bytes", "64M", "--duration-ms", "3500", "--cpu", "1", "--advice", "pageout"];
    let cold: &[&str] = &["--bytes", "64M", "--duration-ms", "3500", "--cpu", "1", "--advice", "cold"];
    let control: &[&str] = &["--bytes", "64M", "--duration-ms", "3500", "--cpu", "1", "--advice", "none"];
    let phases: [(&str, &str, &[&[&str]]); 3] = [
        ("control", "500", &[control, pressure]),
        ("pageout", "500", &[pageout, pressure]),
        ("cold", "500", &[cold, pressure]),
    ];
    for (phase, loops, storms) in phases {
        let (lines, waker, storms, traced) = trace_waker(loops, "1ms", storms);
        let summary = only(&lines, "summary");
        let wakeup = &summary["wakeup"];
        let walk = walk_summary(summary);
        let waits = spikes(&lines, "wakeup");
        let blamed: Vec<&&Value> = waits.iter().filter(|s| s["cause"] == "madvise_cold_or_pageout_pte_range").collect();
        let worst_blamed = blamed.iter().filter_map(|s| s["latency_ns"].as_u64()).max();
        // Where the blocker let the waker in: the first frame below the scheduler. Inside the
        // PTE loop (6.7+: its cond_resched every 32 PTEs), in reclaim, or at an interrupt return.
        let mut switch_sites = std::collections::BTreeMap::<String, u64>::new();
        for spike in &blamed {
            let site = frames(&spike["stack"])
                .into_iter()
                .map(|f| f.split('+').next().unwrap_or(f))
                .find(|f| !(f.contains("schedule") || f.contains("cond_resched")))
                .unwrap_or("?")
                .to_string();
            *switch_sites.entry(site).or_default() += 1;
        }
        let storm = storms.first().cloned().unwrap_or_default();
        eprintln!(
            "MEASURED kernel={kernel} phase={phase} wakeups={} p50_us={} p99_us={} p999_us={} max_us={} over_1ms={} \
             blamed_on_walk={} worst_blamed_us={} madvise_calls={} walk_calls={} walk_p50_us={} walk_p99_us={} \
             walk_max_us={} faults={} swap_kib={} switch_sites={switch_sites:?} causes={}",
            wakeup["count"],
            us(&wakeup["p50_ns"]),
            us(&wakeup["p99_ns"]),
            us(&wakeup["p999_ns"]),
            us(&wakeup["max_ns"]),
            wakeup["over_threshold"],
            blamed.len(),
            worst_blamed.map_or("-".into(), |n| (n / 1000).to_string()),
            storm["calls"],
            walk["count"],
            us(&walk["p50_ns"]),
            us(&walk["p99_ns"]),
            us(&walk["max_ns"]),
            storm["minor_faults"],
            storm["swap_total_kib"],
            summary["verdict"]["causes"],
        );
        for spike in waits.iter().take(3) {
            eprintln!("SPIKE {}\n  stack: {:?}", spike["explanation"], frames(&spike["stack"]));
        }

        assert_plausible_wakeups(wakeup["count"].as_u64().unwrap(), &waker, wakeup);
        if traced && matches!(phase, "pageout" | "cold") {
            assert!(walk["count"].as_u64().unwrap_or(0) >= storm["calls"].as_u64().unwrap() * 32, "{walk} {storm}");
        }
        assert_eq!(
            summary["wakeup_spikes"].as_u64().unwrap() + only(&lines, "lost_events")["wakeup_spikes"].as_u64().unwrap(),
            wakeup["over_threshold"].as_u64().unwrap(),
            "every spike is listed or counted lost"
        );
        for spike in &waits {
            assert_eq!(spike["pid"], waker.pid, "only the waker is traced: {spike}");
            assert!(spike["latency_ns"].as_u64().unwrap() > threshold_ns);
            assert!(!spike["explanation"].as_str().unwrap().is_empty());
        }
    }
}

//! The cause of each invalidation, by the kernel's own mechanism, checked against the kernel's
//! own counts. Under `mm-probe retry-storm`, with the hmm_mirror driver walking the buffer
//! (the non-RT guests only: the host has no HMM): copy-on-write after a fork (and the fork
//! itself), khugepaged collapsing the buffer, ksmd merging it. Where the mechanism fails walks
//! (copy-on-write, KSM), it must be what most failed walks collided with; khugepaged works under
//! the mmap lock the walks hold, so it is checked by its count. Between two NUMA nodes (the
//! matrix boots this executable's guests as two; on one node these two skip, saying so): NUMA
//! balancing on and then off, and move_pages(2) between the nodes. Compaction by another
//! process, checked by the pages of the buffer it moved (it may move none). Under `mm-probe
//! invalidations` beside an idle VM, wherever KVM runs: no cause of the mm's own work is named
//! unless the kernel counted that work. And the cause table's evictions, made on purpose with
//! two threads compacting, are counted.

mod common;
mod retry_storm_support;

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use common::{Knobs, MirrorModule, require_root, vmstat_or_zero};
use retry_storm_support::{collisions, f, has_advice, hmm_storm, traced};
use serde_json::Value;

/// The mirror driver in the non-RT guests; `None` elsewhere, said.
fn mirror_here() -> Option<MirrorModule> {
    require_root();
    common::cause_guest().then(MirrorModule::load)
}

/// The mirror driver, where `dir` shows the kernel has the mechanism (`what`) and the cause
/// tests run; `None` elsewhere, said.
fn mechanism_here(dir: &str, what: &str) -> Option<MirrorModule> {
    if !Path::new(dir).exists() {
        eprintln!("skipped: this kernel has no {what} ({dir})");
        return None;
    }
    mirror_here()
}

/// The rows of `by_cause` of `class` whose detail satisfies `detail`.
fn rows<'a>(summary: &'a Value, class: &str, detail: impl Fn(&str) -> bool) -> Vec<&'a Value> {
    let all = summary["invalidations"]["by_cause"].as_array().expect("by_cause");
    all.iter().filter(|r| r["cause"]["class"] == class && detail(r["cause"]["detail"].as_str().unwrap_or(""))).collect()
}

fn sum(rows: &[&Value], field: &str) -> f64 {
    rows.iter().map(|r| f(&r[field])).sum()
}

fn read_u64(path: &str) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("{path}"))
}

#[test]
fn copy_on_write_after_fork_and_the_fork_are_each_named() {
    let Some(_module) = mirror_here() else { return };
    let (summary, driver) = traced(|| {
        let fork = ["--mode", "fork", "--no-huge", "--piece", "64K", "--interval-us", "2000", "--duration-ms", "3000"];
        hmm_storm(&[], &[&["--size", "64M"][..], &fork].concat())
    });
    eprintln!("MEASURED fork: driver {driver}\ncauses: {}", summary["invalidations"]["by_cause"]);
    let cow = rows(&summary, "fault", |d| d == "copy-on-write");
    let forks = rows(&summary, "syscall", |d| d.starts_with("clone"));
    let lost = f(&summary["lost_events"]["invalidate_events"]);
    let written = f(&driver["cow_writes"]);
    assert!(written > 0.0, "{driver}");
    // Each write to a page the child still maps copies it: one invalidation, in a fault. The
    // process's other writes while a child lives (its stacks, its heap) copy pages too.
    if lost == 0.0 {
        assert!(sum(&cow, "invalidations") >= written, "every page written was copied: {cow:?} vs {written}");
    }
    // fork write-protects the parent's private memory: at least one invalidation per fork.
    assert!(sum(&forks, "invalidations") >= f(&driver["storm_ops"]), "{forks:?} vs {driver}");
    let named = sum(&cow, "failed_walks") + sum(&forks, "failed_walks");
    assert!(named * 2.0 > collisions(&summary), "the fork and its copies failed most walks: {summary}");
}

#[test]
fn khugepaged_collapsing_the_mirrored_buffer_is_named_with_its_settings() {
    const THP: &str = "/sys/kernel/mm/transparent_hugepage";
    let Some(_module) = mechanism_here(&format!("{THP}/khugepaged"), "transparent huge pages") else { return };
    let mut settings = Knobs::default();
    settings
        .set(format!("{THP}/enabled"), "madvise")
        .set(format!("{THP}/khugepaged/scan_sleep_millisecs"), "0")
        .set(format!("{THP}/khugepaged/alloc_sleep_millisecs"), "0")
        .set(format!("{THP}/khugepaged/pages_to_scan"), "8192");
    let collapsed = || read_u64(&format!("{THP}/khugepaged/pages_collapsed"));
    let before = collapsed();
    let (summary, driver) =
        traced(|| hmm_storm(&[], &["--size", "64M", "--mode", "none", "--collapse", "--duration-ms", "4000"]));
    let collapses = collapsed() - before;
    drop(settings);
    let khugepaged = rows(&summary, "kernel_thread", |d| d == "khugepaged");
    eprintln!(
        "MEASURED khugepaged: {collapses} collapses; driver {driver}\ncauses: {}",
        summary["invalidations"]["by_cause"]
    );
    assert!(collapses > 0, "khugepaged collapsed the buffer");
    // A collapse invalidates its 2 MiB once; the first may come before the mirror's first walk
    // (then its mm is not watched yet).
    let invalidations = sum(&khugepaged, "invalidations");
    assert!(invalidations > 0.0 && invalidations <= collapses as f64, "one per collapse: {khugepaged:?}");
    // A collapse holds the mmap lock for writing, which a walk holds for reading, so it fails
    // only a walk whose sequence it moved before the walk took the lock; the rest surface as the
    // driver's own read_retry after the walk (`seq_retries`), which returns no -EBUSY to count.
    let knobs = khugepaged[0]["knobs"].to_string();
    assert!(knobs.contains("pages_to_scan") && knobs.contains("\"8192\""), "its settings as read: {knobs}");
}

#[test]
fn ksmd_merging_the_mirrored_buffer_is_named_with_its_settings() {
    const KSM: &str = "/sys/kernel/mm/ksm";
    let Some(_module) = mechanism_here(KSM, "KSM") else { return };
    // Put back in reverse: run 2 unmerges what the test merged, then the old run state returns.
    let mut settings = Knobs::default();
    settings
        .set(format!("{KSM}/run"), "2")
        .set(format!("{KSM}/sleep_millisecs"), "0")
        .set(format!("{KSM}/pages_to_scan"), "4096")
        .set(format!("{KSM}/run"), "1");
    // Merged pages are counted while their process lives: the most seen during the run.
    let (stop, most) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (stop, most) = (stop.clone(), most.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(read_u64(&format!("{KSM}/pages_sharing")), Ordering::Relaxed);
                thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let (summary, driver) = traced(|| {
        hmm_storm(&[], &["--size", "32M", "--mode", "none", "--mergeable", "--no-huge", "--duration-ms", "4000"])
    });
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let sharing = most.load(Ordering::Relaxed);
    let ksmd = rows(&summary, "kernel_thread", |d| d == "ksmd");
    eprintln!(
        "MEASURED ksmd: pages_sharing up to {sharing}; driver {driver}\nfailed walks {}\ncauses: {}",
        summary["walks"]["busy_causes"], summary["invalidations"]["by_cause"]
    );
    let run_setting = ksmd.first().map(|r| r["knobs"].to_string()).unwrap_or_default();
    drop(settings);
    assert!(sharing > 0, "ksmd merged the buffer's pages");
    assert!(sum(&ksmd, "invalidations") >= sharing as f64, "each merged page was invalidated: {ksmd:?}");
    assert!(sum(&ksmd, "failed_walks") * 2.0 > collisions(&summary), "ksmd failed most walks: {summary}");
    assert!(run_setting.contains("ksm/run") && run_setting.contains("\"1\""), "its setting as read: {run_setting}");
}

/// NUMA balancing, with the mirroring thread moving between the guest's two nodes: while
/// kernel.numa_balancing is 1, task_numa_work's hinting and the migration of the pages it finds
/// misplaced are named `numa_balancing`, with the setting as read, when the kernel counted that
/// work, and they are what the failed walks collided with; at 0 the kernel does none of it and
/// none is named.
#[test]
fn numa_balancing_is_named_while_on_and_gone_when_off() {
    let Some(_module) = two_nodes_here("/proc/sys/kernel/numa_balancing", "NUMA balancing") else { return };
    let (on, driver, updates, migrated) = under_numa_balancing("1");
    let numa = rows(&on, "numa_balancing", |_| true);
    let misplaced = rows(&on, "numa_balancing", |d| d.starts_with("migration"));
    eprintln!(
        "MEASURED numa on: numa_pte_updates +{updates}, numa_pages_migrated +{migrated}; driver {driver}\ncauses: {}",
        on["invalidations"]["by_cause"]
    );
    assert!(f(&driver["node_hops"]) > 1.0, "the mirroring thread moved between nodes: {driver}");
    assert!(updates > 0, "the kernel set up hinting faults while it was on");
    assert!(sum(&numa, "invalidations") > 0.0, "NUMA balancing named: {}", on["invalidations"]["by_cause"]);
    // Each misplaced page moved is one migration of this mm's memory; the kernel counts them all.
    assert!(sum(&misplaced, "invalidations") <= migrated as f64, "{misplaced:?} vs {migrated} migrated");
    let knobs = numa[0]["knobs"].to_string();
    assert!(knobs.contains("kernel.numa_balancing") && knobs.contains("\"1\""), "its setting as read: {knobs}");
    // Nothing else invalidates the buffer: the walks that failed collided with NUMA balancing.
    if f(&on["walks"]["ebusy"]) > 0.0 {
        assert!(sum(&numa, "failed_walks") * 2.0 > collisions(&on), "NUMA balancing failed most walks: {on}");
        let advice = has_advice(&on, "NUMA balancing").unwrap_or_else(|| panic!("{}", on["verdict"]));
        let evidence = advice["evidence"].as_str().unwrap();
        assert!(evidence.contains("kernel.numa_balancing = 1"), "the setting as read: {evidence}");
    }

    let (off, _, updates, _) = under_numa_balancing("0");
    eprintln!("MEASURED numa off: numa_pte_updates +{updates}; causes: {}", off["invalidations"]["by_cause"]);
    assert_eq!(updates, 0, "with kernel.numa_balancing=0 the kernel sets up no hinting fault");
    assert!(rows(&off, "numa_balancing", |_| true).is_empty(), "none named while off: {off}");
    assert!(has_advice(&off, "NUMA balancing").is_none(), "no NUMA advice while off: {}", off["verdict"]);
}

/// The mirror walking 64 MiB of small pages for 5 s with its thread hopping between nodes, under
/// the tool, with kernel.numa_balancing = `setting`: the summary, the driver's counters, and how
/// far the kernel's numa_pte_updates and numa_pages_migrated moved.
fn under_numa_balancing(setting: &str) -> (Value, Value, u64, u64) {
    let mut settings = Knobs::default();
    settings.set("/proc/sys/kernel/numa_balancing", setting);
    let counters = || (vmstat_or_zero("numa_pte_updates"), vmstat_or_zero("numa_pages_migrated"));
    let before = counters();
    let storm = ["--size", "64M", "--mode", "none", "--no-huge", "--hop-nodes-ms", "700", "--duration-ms", "5000"];
    let (summary, driver) = traced(|| hmm_storm(&[], &storm));
    let after = counters();
    (summary, driver, after.0 - before.0, after.1 - before.1)
}

/// Page migration between the guest's two nodes (the process's own storm thread calling
/// move_pages(2)): named `migration` with the kernel's reason, at least one invalidation per page
/// the workload moved and no more than the kernel migrated, and what the failed walks collided
/// with.
#[test]
fn page_migration_between_nodes_is_named_with_its_reason() {
    let Some(_module) = two_nodes_here("/proc/sys/vm", "page migration") else { return };
    let before = vmstat_or_zero("pgmigrate_success");
    let migrate = ["--mode", "migrate", "--piece", "2M", "--interval-us", "20000", "--duration-ms", "4000"];
    let (summary, driver) = traced(|| hmm_storm(&[], &[&["--size", "64M", "--no-huge"][..], &migrate].concat()));
    let migrated = vmstat_or_zero("pgmigrate_success") - before;
    let migration = rows(&summary, "migration", |_| true);
    eprintln!(
        "MEASURED migration: pgmigrate_success +{migrated}; driver {driver}\ncauses: {}",
        summary["invalidations"]["by_cause"]
    );
    let moved = f(&driver["moved_pages"]);
    assert!(moved > 0.0, "the workload moved pages: {driver}");
    // move_pages(2) migrates for the syscall: the kernel's reason, named from its own table.
    assert!(migration.iter().all(|r| r["cause"]["detail"] == "syscall_or_cpuset"), "{migration:?}");
    let named = sum(&migration, "invalidations");
    // Each page moved was unmapped from the mirrored mm once, but the first piece moves before
    // the mirror's first walk (the workload starts walking once its storm runs), when the tool
    // does not watch the mm yet. The kernel counts every page moved.
    // SAFETY: sysconf has no preconditions.
    let first_piece = (2 << 20) as f64 / unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    if f(&summary["lost_events"]["invalidate_events"]) == 0.0 {
        assert!(named + first_piece >= moved, "{named} migration invalidations for {moved} pages moved");
    }
    assert!(named <= migrated as f64, "{named} migration invalidations for {migrated} pages migrated");
    assert!(sum(&migration, "failed_walks") * 2.0 > collisions(&summary), "migration failed most walks: {summary}");
    assert!(has_advice(&summary, "page migration").is_some(), "{}", summary["verdict"]);
}

/// Compaction of all memory by another process (`sh` writing /proc/sys/vm/compact_memory,
/// again until a page of the mirrored buffer moved, at most five times) while the mirror walks:
/// named `compaction` with its settings as read, at least once per page of the buffer whose
/// frame changed, never more often than the kernel migrated pages, and, where it failed walks,
/// what they collided with. Compaction picks its blocks and may leave the buffer alone: then
/// nothing is asked of the tool but the kernel's bound.
#[test]
fn compaction_of_the_mirrored_buffer_is_named_with_its_settings() {
    const COMPACT: &str = "/proc/sys/vm/compact_memory";
    let Some(_module) = mechanism_here(COMPACT, "compaction") else { return };
    let migrations = || vmstat_or_zero("pgmigrate_success") + vmstat_or_zero("pgmigrate_fail");
    let before = migrations();
    let (summary, driver) =
        traced(|| hmm_storm(&[], &["--size", "64M", "--mode", "compact", "--no-huge", "--duration-ms", "4000"]));
    let migrated = migrations() - before;
    let compaction = rows(&summary, "compaction", |_| true);
    eprintln!(
        "MEASURED compaction: pgmigrate_success + pgmigrate_fail +{migrated}; driver {driver}\ncauses: {}",
        summary["invalidations"]["by_cause"]
    );
    assert!(f(&driver["compactions"]) > 0.0, "compaction was asked for: {driver}");
    let (named, moved) = (sum(&compaction, "invalidations"), f(&driver["moved_pages"]));
    // A page moves by being unmapped first: one invalidation of the buffer's mm per page moved.
    if f(&summary["lost_events"]["invalidate_events"]) == 0.0 {
        assert!(named >= moved, "{named} compaction invalidations for {moved} pages of the buffer moved");
    }
    assert!(named <= migrated as f64, "{named} compaction invalidations for {migrated} pages migrated or failed");
    let Some(row) = compaction.first() else { return };
    let knobs = row["knobs"].to_string();
    let proactiveness = std::fs::read_to_string("/proc/sys/vm/compaction_proactiveness").unwrap();
    assert!(knobs.contains(&format!("\"{}\"", proactiveness.trim())), "its settings as read: {knobs}");
    // Nothing else invalidates the buffer meanwhile.
    if f(&summary["walks"]["ebusy"]) > 0.0 {
        assert!(
            sum(&compaction, "failed_walks") * 2.0 > collisions(&summary),
            "compaction failed most walks: {summary}"
        );
    }
}

/// The mirror driver where the guest has two NUMA nodes with CPUs and `dir` shows the kernel
/// has the mechanism (`what`); `None` elsewhere, said.
fn two_nodes_here(dir: &str, what: &str) -> Option<MirrorModule> {
    let module = mechanism_here(dir, what)?;
    let nodes = nodes_with_cpus();
    if nodes < 2 {
        eprintln!("skipped: {what} needs two NUMA nodes with CPUs; this machine has {nodes}");
        return None;
    }
    Some(module)
}

fn nodes_with_cpus() -> usize {
    let nodes =
        std::fs::read_dir("/sys/devices/system/node").map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    nodes
        .iter()
        .filter(|n| std::fs::read_to_string(n.path().join("cpulist")).is_ok_and(|l| !l.trim().is_empty()))
        .count()
}

/// The kernel's own counters that move when a cause's mechanism runs.
const EVIDENCE: &[(&str, &[&str])] = &[
    ("kswapd", &["pgscan_kswapd"]),
    ("direct_reclaim", &["pgscan_direct"]),
    // A memory cgroup's reclaim is counted as direct in the machine's counters.
    ("cgroup_reclaim", &["pgscan_direct"]),
    ("compaction", &["compact_migrate_scanned", "compact_free_scanned"]),
    ("migration", &["pgmigrate_success", "pgmigrate_fail"]),
    ("numa_balancing", &["numa_pte_updates", "pgmigrate_success", "pgmigrate_fail"]),
];

/// `invalidations` beside an idle VM (KVM subscribes to its memory, so whatever the machine
/// does to that memory is counted): every cause it names for the mm's own work (reclaim,
/// compaction, migration, NUMA balancing) must be one whose counters the kernel moved
/// meanwhile. An idle guest mostly makes none; the host, whatever else it runs.
#[test]
fn an_idle_vm_gets_no_invented_cause() {
    require_root();
    if !common::kvm_available() {
        eprintln!("skipped: no KVM here to run an idle VM");
        return;
    }
    let mut vm = std::process::Command::new(common::workload("kvm_storm"))
        .args(["--size", "64M", "--passes", "0", "--idle-ms", "6000"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("starting kvm_storm");
    // Created and populated well before the tool looks.
    thread::sleep(Duration::from_secs(1));
    let before: Vec<u64> = EVIDENCE.iter().flat_map(|(_, names)| names.iter().map(|n| vmstat_or_zero(n))).collect();
    let out = common::run_tool(&["invalidations", "--json", "--duration", "3s"]);
    let _ = vm.kill();
    let _ = vm.wait();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after: Vec<u64> = EVIDENCE.iter().flat_map(|(_, names)| names.iter().map(|n| vmstat_or_zero(n))).collect();
    let lines = common::json_lines(&out.stdout);
    let summary = common::first_of(&lines, "summary").expect("a summary line");
    let rows = summary["invalidations"]["by_cause"].as_array().expect("by_cause");
    eprintln!("MEASURED idle: {rows:?}");
    let mut at = 0;
    for (class, names) in EVIDENCE {
        let moved = (at..at + names.len()).any(|i| after[i] > before[i]);
        at += names.len();
        let named: Vec<&Value> = rows.iter().filter(|r| r["cause"]["class"] == *class).collect();
        assert!(moved || named.is_empty(), "{class} named while {names:?} stood still: {named:?}");
    }
}

/// `invalidations` for 5 s, once attached, while two threads ask for compaction of all memory
/// again and again for 2 s, with these map sizes: its lost_events line (if any) and its summary.
fn two_compactors_traced(map_entries: &str) -> (Option<Value>, Value) {
    use std::io::{BufRead as _, Read as _};
    let mut tool = std::process::Command::new(common::mm_probe())
        .args(["invalidations", "--json", "--duration", "5s"])
        .env("MM_PROBE_MAP_ENTRIES", map_entries)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting mm-probe");
    let mut stdout = std::io::BufReader::new(tool.stdout.take().expect("piped stdout"));
    let mut text = String::new();
    while !text.contains("\"probe_plan\"") {
        assert!(stdout.read_line(&mut text).expect("reading mm-probe") > 0, "no plan: {text}");
    }
    let compactors: Vec<_> = (0..2)
        .map(|_| {
            thread::spawn(|| {
                let start = std::time::Instant::now();
                while start.elapsed() < Duration::from_secs(2) {
                    std::fs::write("/proc/sys/vm/compact_memory", "1").expect("asking for compaction");
                }
            })
        })
        .collect();
    compactors.into_iter().for_each(|c| c.join().expect("a compactor"));
    stdout.read_to_string(&mut text).expect("reading mm-probe");
    let out = tool.wait_with_output().expect("waiting for mm-probe");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = common::json_lines(text.as_bytes());
    let summary = common::first_of(&lines, "summary").expect("a summary line").clone();
    (common::first_of(&lines, "lost_events").cloned(), summary)
}

/// The cause table's evictions are counted. Shrunk to one thread (the test hook) under two
/// threads compacting at once, each thread's compaction takes the other's entry: the ends that
/// find theirs gone are counted in `lost_events.cause_brackets_missed` (the lost_events line and
/// the summary agree). At its size, the same work evicts none: an end is alone only where the
/// table refused its begin (counted apart, `counters.cause_begins_refused`).
#[test]
fn bracket_ends_the_full_cause_table_lost_are_counted() {
    require_root();
    if !common::cause_guest() {
        eprintln!("skipped: compaction of all memory is asked for in the test guests only");
        return;
    }
    let compactions_before = vmstat_or_zero("compact_migrate_scanned");
    let (lost, summary) = two_compactors_traced("");
    let missed = |summary: &Value| f(&summary["lost_events"]["cause_brackets_missed"]);
    let refused = f(&summary["counters"]["cause_begins_refused"]);
    eprintln!("MEASURED table at its size: {}; begins refused {refused}", summary["lost_events"]);
    // Nothing is evicted; a begin the table refused (its update failed) leaves its end alone.
    assert!(missed(&summary) <= refused, "every end found its begin, or its begin was refused: {lost:?}");
    let (lost, shrunk) = two_compactors_traced("CAUSE_BRACKETS=1");
    eprintln!(
        "MEASURED table of one: {}; compact_migrate_scanned +{}",
        shrunk["lost_events"],
        vmstat_or_zero("compact_migrate_scanned") - compactions_before
    );
    let lost = lost.expect("a lost_events line: the ends whose begin was evicted are a loss");
    assert!(f(&lost["cause_brackets_missed"]) > 0.0, "{lost}");
    assert_eq!(shrunk["lost_events"]["cause_brackets_missed"], lost["cause_brackets_missed"], "{shrunk}");
}

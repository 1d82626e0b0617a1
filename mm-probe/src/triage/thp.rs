//! THP across the machine: the processes whose THP a prctl(PR_SET_THP_DISABLE) turned off, as
//! /proc/PID/status says (`THP_enabled: 0`), grouped by the ancestor the setting came down from
//! (a wrapper, a service manager's `MemoryTHP=`, a runtime's launcher), and the largest of each
//! group examined by `thp-why PID --duration 0s` (its /proc and sysfs facts), as this same
//! executable, so the finding is thp-why's own verdict.

use std::{collections::BTreeMap, process::Command};

use anyhow::{Context as _, Result};

use crate::{compare::input::Run, thp_why::Proc};

/// At most this many groups are examined (each a thp-why run of a fraction of a second): a
/// machine where more ancestors each disabled THP has its first ones named and the rest counted.
pub const MAX_GROUPS: usize = 8;

/// What the scan found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Processes whose status was read (user processes: kernel threads have no THP_enabled).
    pub processes_read: usize,
    pub groups: Vec<Group>,
    /// Groups past [`MAX_GROUPS`], not examined.
    pub groups_not_examined: usize,
}

/// The processes under one ancestor with THP disabled, and thp-why's examination of the largest.
#[derive(Debug)]
pub struct Group {
    /// The topmost process of the chain of THP-disabled parents: where the prctl was made, or
    /// inherited from a process that is gone.
    pub ancestor: (u32, String),
    pub pids: Vec<u32>,
    /// The member examined: the one with the most resident memory.
    pub examined: u32,
    pub outcome: Result<Box<Run>, String>,
}

/// Where the kernel's THP controls live; absent when it was built without THP, and then every
/// process's status says `THP_enabled: 0` with no prctl behind it.
const THP_SYSFS: &str = "/sys/kernel/mm/transparent_hugepage";

/// Reads every process's status, groups the THP-disabled ones and examines one of each group.
pub fn scan() -> Result<Scan> {
    if !std::path::Path::new(THP_SYSFS).exists() {
        anyhow::bail!(
            "this kernel has no transparent huge pages (CONFIG_TRANSPARENT_HUGEPAGE is off: {THP_SYSFS} does not exist)"
        );
    }
    let mut scan = Scan::default();
    let mut disabled: BTreeMap<u32, (u32, String)> = BTreeMap::new();
    for pid in pids()? {
        let Ok(status) = Proc::new(pid).status() else { continue };
        let Some(enabled) = status.thp_enabled else { continue };
        scan.processes_read += 1;
        if !enabled {
            disabled.insert(pid, (status.ppid, status.name));
        }
    }
    let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for &pid in disabled.keys() {
        groups.entry(topmost(pid, &disabled)).or_default().push(pid);
    }
    scan.groups_not_examined = groups.len().saturating_sub(MAX_GROUPS);
    // Read once per process: the sort and the choice of the examined member agree.
    let resident: BTreeMap<u32, u64> = disabled.keys().map(|&pid| (pid, resident_pages(pid))).collect();
    let largest = |pids: &[u32]| pids.iter().copied().max_by_key(|pid| resident.get(pid).copied().unwrap_or(0));
    let mut by_size: Vec<(u32, Vec<u32>)> = groups.into_iter().collect();
    by_size.sort_by_key(|(_, pids)| std::cmp::Reverse(largest(pids).and_then(|pid| resident.get(&pid).copied())));
    for (ancestor, pids) in by_size.into_iter().take(MAX_GROUPS) {
        let examined = largest(&pids).unwrap_or(ancestor);
        let name = disabled.get(&ancestor).map(|(_, n)| n.clone()).unwrap_or_default();
        scan.groups.push(Group { ancestor: (ancestor, name), pids, examined, outcome: examine(examined) });
    }
    Ok(scan)
}

/// The numeric entries of /proc.
fn pids() -> Result<Vec<u32>> {
    let entries = std::fs::read_dir("/proc").context("reading /proc")?;
    Ok(entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
}

/// Follows `pid`'s parents while they have THP disabled too; the last one is the group's root.
fn topmost(pid: u32, disabled: &BTreeMap<u32, (u32, String)>) -> u32 {
    let mut current = pid;
    // Bounded: a parent chain read while processes come and go could, in theory, loop.
    for _ in 0..disabled.len() {
        match disabled.get(&current) {
            Some(&(parent, _)) if disabled.contains_key(&parent) => current = parent,
            _ => break,
        }
    }
    current
}

/// Resident pages (the second field of /proc/PID/statm); 0 for a process gone meanwhile.
fn resident_pages(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// thp-why's verdict on `pid` from /proc and sysfs (no watch), or its one-line error.
fn examine(pid: u32) -> Result<Box<Run>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding mm-probe's own executable: {e}"))?;
    let output = Command::new(exe)
        .args(["thp-why", &pid.to_string(), "--duration", "0s", "--json"])
        .output()
        .map_err(|e| format!("starting thp-why: {e}"))?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    super::watch::read_run("thp-why", output.status.success(), &stdout, &stderr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_of_disabled_parents_is_one_group_under_its_top() {
        // 10 (wrapper) → 11 (shell) → 12 (app); 20 alone; 12's parent chain stops at 10, whose
        // parent 1 has THP enabled.
        let disabled: BTreeMap<u32, (u32, String)> =
            [(10, (1, "wrapper".into())), (11, (10, "sh".into())), (12, (11, "app".into())), (20, (1, "other".into()))]
                .into_iter()
                .collect();
        assert_eq!(topmost(12, &disabled), 10);
        assert_eq!(topmost(11, &disabled), 10);
        assert_eq!(topmost(20, &disabled), 20);
    }

    #[test]
    fn a_parent_loop_ends() {
        let disabled: BTreeMap<u32, (u32, String)> = [(5, (6, "a".into())), (6, (5, "b".into()))].into_iter().collect();
        let top = topmost(5, &disabled);
        assert!(top == 5 || top == 6);
    }
}

//! The settings that stop each cause of invalidations, with their values on this machine, and
//! what the usual remedy does not do.

use std::path::Path;

use serde::Serialize;

use super::names::CauseName;

/// One setting and its current value (`None` when it cannot be read here).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Knob {
    /// A sysctl (`vm.compaction_proactiveness`) or a sysfs/cgroup file.
    pub setting: String,
    pub value: Option<String>,
}

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// The settings behind `cause`, read under `root` ("/" on a live machine); `tgid` is the
/// invalidating process (a cgroup's reclaim: its cgroup's limits).
pub fn knobs(root: &Path, cause: &CauseName, tgid: u32) -> Vec<Knob> {
    let sysctl = |name: &str| sysctl_knob(root, name);
    let file = |path: &str| file_knob(root, path);
    match cause.class {
        "compaction" => vec![
            sysctl("vm.compaction_proactiveness"),
            sysctl("vm.compact_unevictable_allowed"),
            file(&format!("{THP}/defrag")),
        ],
        "numa_balancing" => vec![sysctl("kernel.numa_balancing")],
        "kswapd" | "direct_reclaim" => {
            vec![sysctl("vm.watermark_scale_factor"), sysctl("vm.min_free_kbytes"), sysctl("vm.swappiness")]
        }
        "cgroup_reclaim" => cgroup_limits(root, tgid),
        "migration" if cause.detail.as_deref() == Some("demotion") => {
            vec![file("/sys/kernel/mm/numa/demotion_enabled")]
        }
        "kernel_thread" => match cause.detail.as_deref() {
            Some("khugepaged") => {
                vec![file(&format!("{THP}/enabled")), file(&format!("{THP}/khugepaged/pages_to_scan"))]
            }
            Some("ksmd") => vec![file("/sys/kernel/mm/ksm/run")],
            Some(kcompactd) if kcompactd.starts_with("kcompactd") => vec![sysctl("vm.compaction_proactiveness")],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// "compaction: vm.compaction_proactiveness=20, …; mlock does not stop compaction …": one
/// cause's settings as read (UNKNOWN when unreadable) and its remedy, for text reports.
pub fn settings_line(cause: &CauseName, knobs: &[Knob], remedy: Option<&str>) -> String {
    let knobs: Vec<String> =
        knobs.iter().map(|k| format!("{}={}", k.setting, k.value.as_deref().unwrap_or("UNKNOWN"))).collect();
    let settings = if knobs.is_empty() { String::new() } else { format!(" {}", knobs.join(", ")) };
    let remedy = remedy.map_or_else(String::new, |r| format!("; {r}"));
    format!("{}:{settings}{remedy}", cause.class.replace('_', " "))
}

/// What stops the cause, or what does not, in a sentence.
pub fn remedy(class: &str) -> Option<&'static str> {
    match class {
        "compaction" => Some("mlock does not stop compaction unless vm.compact_unevictable_allowed is 0"),
        "numa_balancing" => {
            Some("mlock does not stop NUMA balancing; kernel.numa_balancing=0 or a bound mempolicy does")
        }
        "kswapd" | "direct_reclaim" => Some("memory pressure: raise the watermarks or give the machine memory"),
        "cgroup_reclaim" => Some("the cgroup is at its memory.high or memory.max"),
        "migration" => Some("mlock does not stop page migration; whoever moves the pages (the reason) does"),
        "fault" => Some("copy-on-write after fork: MADV_DONTFORK or MADV_WIPEONFORK on the mirrored range"),
        _ => None,
    }
}

fn sysctl_knob(root: &Path, name: &str) -> Knob {
    let path = root.join("proc/sys").join(name.replace('.', "/"));
    Knob { setting: name.to_string(), value: read_value(&path) }
}

fn file_knob(root: &Path, path: &str) -> Knob {
    Knob { setting: path.to_string(), value: read_value(&root.join(path.trim_start_matches('/'))) }
}

/// The memory.high and memory.max of `tgid`'s cgroup (v2).
fn cgroup_limits(root: &Path, tgid: u32) -> Vec<Knob> {
    let membership = std::fs::read_to_string(root.join(format!("proc/{tgid}/cgroup"))).ok();
    let Some(path) = membership.as_deref().and_then(|m| m.lines().find_map(|l| l.strip_prefix("0::"))) else {
        return vec![Knob { setting: "memory.high of the reclaiming cgroup".into(), value: None }];
    };
    ["memory.high", "memory.max"]
        .iter()
        .map(|limit| file_knob(root, &format!("/sys/fs/cgroup{}/{limit}", path.trim_end_matches('/'))))
        .collect()
}

fn read_value(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|v| v.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, value: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, value).unwrap();
    }

    fn cause(class: &'static str, detail: Option<&str>) -> CauseName {
        CauseName { class, detail: detail.map(str::to_string) }
    }

    #[test]
    fn each_cause_comes_with_its_settings_as_read_on_the_machine() {
        let dir = std::env::temp_dir().join(format!("mm-probe-knobs-{}", std::process::id()));
        let root = dir.as_path();
        write(root, "proc/sys/kernel/numa_balancing", "1\n");
        write(root, "proc/sys/vm/compaction_proactiveness", "20\n");
        write(root, "proc/77/cgroup", "0::/gpu.slice/job\n");
        write(root, "sys/fs/cgroup/gpu.slice/job/memory.high", "1073741824\n");
        let numa = knobs(root, &cause("numa_balancing", None), 1);
        assert_eq!(numa, [Knob { setting: "kernel.numa_balancing".into(), value: Some("1".into()) }]);
        let compaction = knobs(root, &cause("compaction", Some("in sh")), 1);
        assert_eq!(compaction[0].value.as_deref(), Some("20"));
        assert_eq!(compaction[1].value, None, "not readable here: unknown, never a default");
        let cgroup = knobs(root, &cause("cgroup_reclaim", Some("in job")), 77);
        assert_eq!(cgroup[0].setting, "/sys/fs/cgroup/gpu.slice/job/memory.high");
        assert_eq!(cgroup[0].value.as_deref(), Some("1073741824"));
        assert!(knobs(root, &cause("syscall", Some("madvise(MADV_DONTNEED)")), 1).is_empty());
        write(root, "sys/kernel/mm/numa/demotion_enabled", "true\n");
        let demotion = knobs(root, &cause("migration", Some("demotion")), 1);
        assert_eq!(demotion[0].value.as_deref(), Some("true"));
        assert!(knobs(root, &cause("migration", Some("syscall_or_cpuset")), 1).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! Why the kernel refused to show a process's memory map, in one line that says what would help.
//!
//! /proc/PID/smaps (and maps, environ, ns/*) are guarded by the ptrace read-access check
//! (`ptrace_may_access(task, PTRACE_MODE_READ_FSCREDS)` in proc_mem_open). It passes for the
//! process's owner, and for anyone holding CAP_SYS_PTRACE, except that the capability check
//! (cap_ptrace_access_check) also wants the caller's effective set to cover the target's permitted
//! set unless the caller has CAP_SYS_PTRACE; then every active security module (SELinux, AppArmor,
//! Landlock, a BPF LSM) may refuse as well. Yama does not take part: it checks attach, not read.
//! So "run as root" is the answer only for a caller that is not root: root with CAP_SYS_PTRACE
//! that is refused has met a security policy, which no privilege of its own overrides.

/// CAP_SYS_PTRACE (include/uapi/linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;

/// What decides the check, as far as the caller can read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessFacts {
    /// The caller's effective uid and capabilities (its fsuid is its euid: mm-probe never sets it).
    pub caller_euid: u32,
    pub caller_caps: u64,
    /// The target's real uid and permitted capabilities (/proc/PID/status stays readable).
    pub target_uid: Option<u32>,
    pub target_caps: Option<u64>,
    /// The active security modules (/sys/kernel/security/lsm), where securityfs is mounted.
    pub lsms: Option<Vec<String>>,
}

impl AccessFacts {
    pub fn read(pid: u32) -> Self {
        let own = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let target = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
        let lsms = std::fs::read_to_string("/sys/kernel/security/lsm")
            .ok()
            .map(|list| list.trim().split(',').filter(|s| !s.is_empty()).map(str::to_string).collect());
        Self {
            caller_euid: status_uid(&own, 1).unwrap_or(u32::MAX),
            caller_caps: status_hex(&own, "CapEff:").unwrap_or(0),
            target_uid: target.as_deref().and_then(|s| status_uid(s, 0)),
            target_caps: target.as_deref().and_then(|s| status_hex(s, "CapPrm:")),
            lsms,
        }
    }
}

/// The `Uid:` line's field `index` (0 real, 1 effective).
fn status_uid(status: &str, index: usize) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line["Uid:".len()..].split_whitespace().nth(index)?.parse().ok()
}

fn status_hex(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    u64::from_str_radix(line[key.len()..].trim(), 16).ok()
}

/// What to do about a refused read of process `pid`'s memory map, as the end of one line.
pub fn denied_hint(pid: u32, facts: &AccessFacts) -> String {
    let has_ptrace = facts.caller_caps & (1 << CAP_SYS_PTRACE) != 0;
    if facts.caller_euid != 0 && !has_ptrace {
        return format!("run as root, or as the owner of process {pid}");
    }
    if !has_ptrace {
        let extra = match facts.target_caps {
            Some(target) if target & !facts.caller_caps != 0 => {
                format!(" and process {pid} holds capabilities mm-probe lacks ({:#x})", target & !facts.caller_caps)
            }
            _ => String::new(),
        };
        return format!(
            "mm-probe runs as root but without CAP_SYS_PTRACE{extra}: run it with CAP_SYS_PTRACE (a container \
             drops it by default: --cap-add SYS_PTRACE)"
        );
    }
    let modules = match facts.lsms.as_deref() {
        Some(active) => {
            let enforcing: Vec<&str> =
                active.iter().map(String::as_str).filter(|m| !matches!(*m, "capability" | "yama")).collect();
            if enforcing.is_empty() { String::new() } else { format!(" (active: {})", enforcing.join(", ")) }
        }
        None => String::new(),
    };
    format!(
        "mm-probe already runs as root with CAP_SYS_PTRACE, so a security module's policy{modules} refused the \
         kernel's ptrace read check on process {pid}: no privilege overrides it; run mm-probe where that policy \
         allows it, or examine another process"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_CAPS: u64 = 0x1ff_ffff_ffff;

    fn facts(euid: u32, caps: u64, target_caps: u64) -> AccessFacts {
        AccessFacts {
            caller_euid: euid,
            caller_caps: caps,
            target_uid: Some(0),
            target_caps: Some(target_caps),
            lsms: None,
        }
    }

    #[test]
    fn an_unprivileged_caller_is_told_to_run_as_root() {
        let hint = denied_hint(4242, &facts(65534, 0, ALL_CAPS));
        assert_eq!(hint, "run as root, or as the owner of process 4242");
    }

    /// Root in a container: CAP_SYS_PTRACE dropped, and init holds capabilities root lacks.
    #[test]
    fn root_without_cap_sys_ptrace_is_told_which_capability() {
        let caps = ALL_CAPS & !(1 << CAP_SYS_PTRACE);
        let hint = denied_hint(1, &facts(0, caps, ALL_CAPS));
        assert!(hint.starts_with("mm-probe runs as root but without CAP_SYS_PTRACE and process 1 holds"), "{hint}");
        assert!(hint.contains("(0x80000)") && !hint.contains("run as root,"), "{hint}");
    }

    /// Root with CAP_SYS_PTRACE refused: a security module decided, not a missing privilege.
    #[test]
    fn root_with_cap_sys_ptrace_is_told_a_security_policy_refused() {
        let caps = ALL_CAPS & !(1 << 24);
        let hint = denied_hint(1, &facts(0, caps, ALL_CAPS));
        assert!(hint.starts_with("mm-probe already runs as root with CAP_SYS_PTRACE, so a security module's policy"));
        assert!(!hint.contains("run as root,"), "{hint}");
        let mut with_lsms = facts(0, caps, ALL_CAPS);
        with_lsms.lsms = Some(["capability", "landlock", "yama", "bpf"].map(String::from).to_vec());
        assert!(denied_hint(1, &with_lsms).contains("policy (active: landlock, bpf) refused"));
    }

    #[test]
    fn status_fields_are_parsed() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nCapPrm:\t000001ffffffffff\n";
        assert_eq!((status_uid(status, 0), status_uid(status, 1)), (Some(1000), Some(0)));
        assert_eq!(status_hex(status, "CapPrm:"), Some(ALL_CAPS));
        assert_eq!(status_hex(status, "CapEff:"), None);
    }
}

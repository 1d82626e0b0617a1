//! Whether this process may load and attach eBPF programs.

use crate::error::UserError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective capabilities, from /proc/self/status.
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|s| parse_cap_eff(&s)).unwrap_or(0)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

fn has(caps: u64, cap: u32) -> bool {
    caps & (1u64 << cap) != 0
}

/// Tracing programs need CAP_BPF and CAP_PERFMON (5.8+), or CAP_SYS_ADMIN.
pub fn can_trace(caps: u64) -> bool {
    has(caps, CAP_SYS_ADMIN) || (has(caps, CAP_BPF) && has(caps, CAP_PERFMON))
}

/// Fails with a one-line, actionable message when tracing is not permitted.
pub fn require_tracing() -> Result<(), UserError> {
    if !can_trace(effective_caps()) {
        return Err(UserError::new(
            "mm-probe needs to load eBPF programs: run it as root (sudo mm-probe …) or grant \
             CAP_BPF and CAP_PERFMON (setcap cap_bpf,cap_perfmon+ep $(which mm-probe))",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cap_eff() {
        let status = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        let caps = parse_cap_eff(status).unwrap();
        assert!(can_trace(caps));
    }

    #[test]
    fn bpf_and_perfmon_or_sys_admin() {
        assert!(!can_trace(0));
        assert!(!can_trace(1 << CAP_BPF));
        assert!(can_trace((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(can_trace(1 << CAP_SYS_ADMIN));
    }
}

//! Who disabled THP: MMF_DISABLE_THP is copied to the child's mm at fork and to the new mm at
//! execve (mm_init copies MMF_INIT_MASK), so the process that called prctl is usually an
//! ancestor. Walk up through /proc/PID/stat's ppid and name the outermost ancestor of the
//! unbroken run of processes whose flag is set.

use serde::Serialize;

use super::{
    procfs::Proc,
    reasons::{DisableMode, ModeSource},
};

/// One process of the chain, target first.
#[derive(Clone, Debug, Serialize)]
pub struct Ancestor {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub disable: Option<DisableMode>,
    /// Where `disable` came from: `kernel` (mm->flags read by eBPF) or `status` (THP_enabled).
    pub source: ModeSource,
}

/// Who set the flag, as JSON's `set_by`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SetBy {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    /// The target itself rather than an ancestor.
    pub is_target: bool,
}

/// Reads the chain from `pid` up to (not including) pid 0, at most `limit` processes.
/// `disable_of(pid)` answers from the best source available (kernel read, else status).
pub fn walk(
    pid: u32,
    limit: usize,
    mut disable_of: impl FnMut(&Proc) -> (Option<DisableMode>, ModeSource),
) -> Vec<Ancestor> {
    let mut chain = Vec::new();
    let mut current = pid;
    while current != 0 && chain.len() < limit {
        let proc = Proc::new(current);
        let Ok(stat) = proc.stat() else { break };
        let (disable, source) = disable_of(&proc);
        chain.push(Ancestor {
            pid: current,
            comm: stat.comm.clone(),
            cmdline: proc.cmdline().unwrap_or_default(),
            disable,
            source,
        });
        current = stat.ppid;
    }
    chain
}

/// The outermost process of the unbroken run, starting at the target, whose mode equals the
/// target's. `None` when the target's flag is not set (or unknown).
pub fn set_by(chain: &[Ancestor]) -> Option<SetBy> {
    let target = chain.first()?;
    let mode = target.disable?;
    if mode == DisableMode::None {
        return None;
    }
    let outermost = chain.iter().take_while(|a| a.disable == Some(mode)).last()?;
    Some(SetBy {
        pid: outermost.pid,
        comm: outermost.comm.clone(),
        cmdline: outermost.cmdline.clone(),
        is_target: outermost.pid == target.pid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(pid: u32, comm: &str, disable: Option<DisableMode>) -> Ancestor {
        Ancestor { pid, comm: comm.into(), cmdline: format!("{comm} args"), disable, source: ModeSource::Status }
    }

    #[test]
    fn the_lkp_wrapper_is_the_outermost_with_the_flag() {
        let d = Some(DisableMode::Completely);
        let n = Some(DisableMode::None);
        let chain = [a(4440, "usemem", d), a(4400, "sh", d), a(4321, "lkp", d), a(100, "bash", n), a(1, "init", n)];
        let who = set_by(&chain).unwrap();
        assert_eq!((who.pid, who.comm.as_str(), who.is_target), (4321, "lkp", false));
        assert_eq!(who.cmdline, "lkp args");
    }

    #[test]
    fn the_target_itself_or_nobody() {
        let d = Some(DisableMode::Completely);
        let n = Some(DisableMode::None);
        let who = set_by(&[a(9, "app", d), a(8, "bash", n)]).unwrap();
        assert!(who.is_target);
        assert_eq!(set_by(&[a(9, "app", n), a(8, "bash", d)]), None);
        assert_eq!(set_by(&[a(9, "app", None)]), None, "unknown is not set");
        assert_eq!(set_by(&[]), None);
    }

    #[test]
    fn a_different_mode_breaks_the_run() {
        let ea = Some(DisableMode::ExceptAdvised);
        let c = Some(DisableMode::Completely);
        let who = set_by(&[a(9, "app", ea), a(8, "wrap", ea), a(7, "outer", c)]).unwrap();
        assert_eq!(who.pid, 8);
        // An unknown ancestor (e.g. permission denied) stops the walk too.
        let who = set_by(&[a(9, "app", c), a(8, "hidden", None), a(7, "outer", c)]).unwrap();
        assert_eq!(who.pid, 9);
    }

    #[test]
    fn walk_reads_this_process_chain() {
        let chain = walk(std::process::id(), 64, |_| (Some(DisableMode::None), ModeSource::Status));
        assert!(!chain.is_empty());
        assert_eq!(chain[0].pid, std::process::id());
        assert!(chain.iter().all(|a| a.pid != 0));
        let limited = walk(std::process::id(), 1, |_| (None, ModeSource::Status));
        assert_eq!(limited.len(), 1);
    }
}

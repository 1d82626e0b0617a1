//! The one check every `-p PID` goes through, and whether a target is still alive.
//!
//! /proc/PID/stat's third field is the task state; `Z` (zombie) and `X` (dead) mean the process
//! has exited: its memory is gone and nothing it does can be traced any more. A kernel thread
//! has PF_KTHREAD (0x00200000) in the ninth field, flags; that bit is part of the kernel's
//! user-visible ABI (sched.h, shown by every ps since 2.6).

use crate::error::UserError;

/// PF_KTHREAD in /proc/PID/stat's flags field.
const PF_KTHREAD: u64 = 0x0020_0000;

/// A process that exists and has not exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// The thread group (process) `pid` belongs to; `pid` itself unless it names a thread.
    pub tgid: u32,
    pub comm: String,
    pub kernel_thread: bool,
}

/// The fields of /proc/PID/stat this module reads.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stat {
    comm: String,
    state: char,
    ppid: u32,
    flags: u64,
}

/// Checks that `pid` names a running process (or thread), with one line that says what to do
/// when it does not.
pub fn running_process(pid: u32) -> Result<Process, UserError> {
    if pid == 0 {
        return Err(UserError::new("pid 0 is the idle task, not a process: give the pid of a running process"));
    }
    let stat = read_stat(pid).ok_or_else(|| {
        UserError::new(format!("process {pid} does not exist (no /proc/{pid}); check the pid with ps"))
    })?;
    if matches!(stat.state, 'Z' | 'X') {
        return Err(UserError::new(format!(
            "process {pid} ({}) is a zombie: it has exited (its parent {} has not reaped it yet), so there is \
             nothing left to trace",
            stat.comm, stat.ppid
        )));
    }
    Ok(Process { pid, tgid: tgid_of(pid).unwrap_or(pid), comm: stat.comm, kernel_thread: stat.flags & PF_KTHREAD != 0 })
}

/// Every `pid`, checked; the first that fails ends the check.
pub fn running_processes(pids: &[u32]) -> Result<Vec<Process>, UserError> {
    pids.iter().map(|&pid| running_process(pid)).collect()
}

/// Whether `pid` is a kernel thread (false when it is gone: nothing says it was one).
pub fn is_kernel_thread(pid: u32) -> bool {
    read_stat(pid).is_some_and(|s| s.flags & PF_KTHREAD != 0)
}

/// Whether `pid` still exists and has not exited.
pub fn is_alive(pid: u32) -> bool {
    read_stat(pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X'))
}

fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `comm` may hold spaces and parentheses, so the fields after it are split from the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // After comm: state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8) flags(9).
    Some(Stat {
        comm,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        flags: rest.get(6)?.parse().ok()?,
    })
}

fn tgid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok())
}

/// A task's comm as text (NUL-padded by the kernel, not always terminated).
pub fn comm_text(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_past_a_comm_with_spaces_and_parentheses() {
        let stat = parse_stat("42 (my (odd) app) S 7 42 42 0 -1 4194560 100 0 0 0").unwrap();
        assert_eq!(stat, Stat { comm: "my (odd) app".into(), state: 'S', ppid: 7, flags: 4194560 });
    }

    #[test]
    fn this_process_is_running_and_not_a_kernel_thread() {
        let me = running_process(std::process::id()).unwrap();
        assert_eq!(me.tgid, std::process::id());
        assert!(!me.kernel_thread);
        assert!(is_alive(std::process::id()));
    }

    #[test]
    fn pid_0_and_unknown_pids_are_refused_with_one_line() {
        assert!(running_process(0).unwrap_err().to_string().contains("idle task"));
        let err = running_process(999_999_999).unwrap_err().to_string();
        assert!(err.contains("does not exist") && !err.contains('\n'), "{err}");
        assert!(!is_alive(999_999_999));
    }

    #[test]
    fn a_zombie_is_refused_with_one_line() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: it stays a zombie until wait() below.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while read_stat(pid).is_some_and(|s| s.state != 'Z') && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let err = running_process(pid).unwrap_err().to_string();
        child.wait().unwrap();
        assert!(err.contains("is a zombie") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn kthreadd_is_a_kernel_thread() {
        // pid 2 is kthreadd on every Linux since 2.6.22 (outside a pid namespace).
        if let Ok(p) = running_process(2)
            && p.comm == "kthreadd"
        {
            assert!(p.kernel_thread);
        }
    }
}

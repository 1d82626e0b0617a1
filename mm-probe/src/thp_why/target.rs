//! The process thp-why examines, checked before anything runs so that bad input is a one-line
//! error (pid 0, a kernel thread, a zombie, no such process, a memory map it may not read), and
//! read as it goes away: a target that exits during the run leaves its start to judge.

use anyhow::Result;

use super::procfs::{Proc, ProcError, Vma};
use crate::{error::UserError, user_bail};

/// The process to examine, after the checks that make bad input a one-line error.
#[derive(Clone, Debug)]
pub struct Target {
    pub proc: Proc,
    pub comm: String,
    pub cmdline: String,
    /// What the report says about the choice (a thread given for its process).
    pub notes: Vec<String>,
}

pub fn validate_target(pid: u32) -> Result<Target> {
    if pid == 0 {
        user_bail!("pid 0 is the idle task, not a process: give the pid of a running process");
    }
    let mut notes = Vec::new();
    let mut proc = Proc::new(pid);
    let stat = proc.stat().map_err(|e| user_error(pid, e))?;
    if stat.is_kernel_thread() {
        user_bail!(
            "pid {pid} ({}) is a kernel thread: it has no user memory, so transparent huge pages do not apply",
            stat.comm
        );
    }
    if matches!(stat.state, 'Z' | 'X') {
        user_bail!(
            "pid {pid} ({}) is a zombie: it has exited and its memory is gone (parent {} has not reaped it yet)",
            stat.comm,
            stat.ppid
        );
    }
    let status = proc.status().map_err(|e| user_error(pid, e))?;
    if status.tgid != 0 && status.tgid != pid {
        notes.push(format!(
            "pid {pid} is a thread of process {}; examining the process (threads share one mm)",
            status.tgid
        ));
        proc = Proc::new(status.tgid);
    }
    proc.check_smaps_access().map_err(|e| user_error(pid, e))?;
    let comm = proc.stat().map(|s| s.comm).unwrap_or(stat.comm);
    let cmdline = proc.cmdline().unwrap_or_default();
    Ok(Target { proc, comm, cmdline, notes })
}

fn user_error(pid: u32, error: ProcError) -> anyhow::Error {
    match error {
        ProcError::Gone { .. } => {
            UserError::new(format!("no process {pid}: it does not exist (or has already exited)")).into()
        }
        ProcError::Denied { .. } => UserError::new(error.to_string()).into(),
        other => anyhow::Error::new(other),
    }
}

/// The target's VMAs; its exit before they could be read is the user's error (there is nothing
/// to judge).
pub fn read_smaps(proc: &Proc) -> Result<Vec<Vma>> {
    let vmas = proc.smaps().map_err(|e| match e {
        ProcError::Gone { pid } => UserError::new(format!("process {pid} exited before it could be examined")).into(),
        ProcError::Denied { .. } => anyhow::Error::new(UserError::new(e.to_string())),
        other => anyhow::Error::new(other).context("reading smaps"),
    })?;
    if vmas.is_empty() && !is_alive(proc) {
        user_bail!("process {} exited before it could be examined", proc.pid);
    }
    Ok(vmas)
}

pub fn is_alive(proc: &Proc) -> bool {
    proc.stat().is_ok_and(|s| !matches!(s.state, 'Z' | 'X'))
}

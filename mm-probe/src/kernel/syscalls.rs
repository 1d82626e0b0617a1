//! The syscall a task is in, from its saved user registers: whether this kernel lets a program
//! read them, x86-64 syscall names by number, and which syscalls only wait.
//!
//! x86-64's syscall numbers are a stable ABI, so the table is data: the libc crate's `SYS_*`
//! constants for x86-64, each named after itself. Elsewhere registers are not read (see
//! [`registers_unreadable`]), so the table is empty.

use mm_probe_common::layout;

use super::{btf::KernelBtf, layout::Layout, release::Release};

/// Why a kernel program cannot read a task's syscall from its saved user registers here, or
/// `None` when it can: that needs the bpf_task_pt_regs helper (5.15+) and x86-64's pt_regs
/// members, both learned from BTF.
pub fn registers_unreadable(btf: Result<&KernelBtf, &str>, release: &Release) -> Option<String> {
    const MEMBERS: [&str; 6] = [
        layout::PT_REGS_ORIG_AX,
        layout::PT_REGS_AX,
        layout::PT_REGS_DI,
        layout::PT_REGS_SI,
        layout::PT_REGS_DX,
        layout::PT_REGS_R10,
    ];
    let btf = match btf {
        Ok(btf) => btf,
        Err(why) => return Some(format!("no kernel BTF to find the saved registers in: {why}")),
    };
    if btf.enumerator("BPF_FUNC_task_pt_regs").is_none() {
        return Some(format!("kernel {release} has no bpf_task_pt_regs helper (5.15+)"));
    }
    let missing = MEMBERS.iter().find(|m| Layout::offset_in(btf, m).is_none())?;
    Some(format!("{missing} is not in this kernel's BTF (x86-64 only)"))
}

/// `(number, "SYS_name")` for each listed constant.
macro_rules! table {
    ($($constant:ident),* $(,)?) => {
        &[$((libc::$constant, stringify!($constant))),*]
    };
}

#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
const SYSCALLS: &[(i64, &str)] = table!(
    SYS_read, SYS_write, SYS_open, SYS_close, SYS_stat, SYS_fstat, SYS_lstat, SYS_poll, SYS_lseek, SYS_mmap,
    SYS_mprotect, SYS_munmap, SYS_brk, SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_ioctl,
    SYS_pread64, SYS_pwrite64, SYS_readv, SYS_writev, SYS_access, SYS_pipe, SYS_select, SYS_sched_yield, SYS_mremap,
    SYS_msync, SYS_mincore, SYS_madvise, SYS_shmget, SYS_shmat, SYS_shmctl, SYS_dup, SYS_dup2, SYS_pause,
    SYS_nanosleep, SYS_getitimer, SYS_alarm, SYS_setitimer, SYS_getpid, SYS_sendfile, SYS_socket, SYS_connect,
    SYS_accept, SYS_sendto, SYS_recvfrom, SYS_sendmsg, SYS_recvmsg, SYS_shutdown, SYS_bind, SYS_listen,
    SYS_getsockname, SYS_getpeername, SYS_socketpair, SYS_setsockopt, SYS_getsockopt, SYS_clone, SYS_fork,
    SYS_vfork, SYS_execve, SYS_exit, SYS_wait4, SYS_kill, SYS_uname, SYS_semget, SYS_semop, SYS_semctl, SYS_shmdt,
    SYS_msgget, SYS_msgsnd, SYS_msgrcv, SYS_msgctl, SYS_fcntl, SYS_flock, SYS_fsync, SYS_fdatasync, SYS_truncate,
    SYS_ftruncate, SYS_getdents, SYS_getcwd, SYS_chdir, SYS_fchdir, SYS_rename, SYS_mkdir, SYS_rmdir, SYS_creat,
    SYS_link, SYS_unlink, SYS_symlink, SYS_readlink, SYS_chmod, SYS_fchmod, SYS_chown, SYS_fchown, SYS_lchown,
    SYS_umask, SYS_gettimeofday, SYS_getrlimit, SYS_getrusage, SYS_sysinfo, SYS_times, SYS_ptrace, SYS_getuid,
    SYS_syslog, SYS_getgid, SYS_setuid, SYS_setgid, SYS_geteuid, SYS_getegid, SYS_setpgid, SYS_getppid, SYS_getpgrp,
    SYS_setsid, SYS_setreuid, SYS_setregid, SYS_getgroups, SYS_setgroups, SYS_setresuid, SYS_getresuid,
    SYS_setresgid, SYS_getresgid, SYS_getpgid, SYS_setfsuid, SYS_setfsgid, SYS_getsid, SYS_capget, SYS_capset,
    SYS_rt_sigpending, SYS_rt_sigtimedwait, SYS_rt_sigqueueinfo, SYS_rt_sigsuspend, SYS_sigaltstack, SYS_utime,
    SYS_mknod, SYS_uselib, SYS_personality, SYS_ustat, SYS_statfs, SYS_fstatfs, SYS_sysfs, SYS_getpriority,
    SYS_setpriority, SYS_sched_setparam, SYS_sched_getparam, SYS_sched_setscheduler, SYS_sched_getscheduler,
    SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_sched_rr_get_interval, SYS_mlock, SYS_munlock,
    SYS_mlockall, SYS_munlockall, SYS_vhangup, SYS_modify_ldt, SYS_pivot_root, SYS__sysctl, SYS_prctl,
    SYS_arch_prctl, SYS_adjtimex, SYS_setrlimit, SYS_chroot, SYS_sync, SYS_acct, SYS_settimeofday, SYS_mount,
    SYS_umount2, SYS_swapon, SYS_swapoff, SYS_reboot, SYS_sethostname, SYS_setdomainname, SYS_iopl, SYS_ioperm,
    SYS_init_module, SYS_delete_module, SYS_quotactl, SYS_nfsservctl, SYS_getpmsg, SYS_putpmsg, SYS_afs_syscall,
    SYS_tuxcall, SYS_security, SYS_gettid, SYS_readahead, SYS_setxattr, SYS_lsetxattr, SYS_fsetxattr, SYS_getxattr,
    SYS_lgetxattr, SYS_fgetxattr, SYS_listxattr, SYS_llistxattr, SYS_flistxattr, SYS_removexattr, SYS_lremovexattr,
    SYS_fremovexattr, SYS_tkill, SYS_time, SYS_futex, SYS_sched_setaffinity, SYS_sched_getaffinity,
    SYS_set_thread_area, SYS_io_setup, SYS_io_destroy, SYS_io_getevents, SYS_io_submit, SYS_io_cancel,
    SYS_get_thread_area, SYS_lookup_dcookie, SYS_epoll_create, SYS_epoll_ctl_old, SYS_epoll_wait_old,
    SYS_remap_file_pages, SYS_getdents64, SYS_set_tid_address, SYS_restart_syscall, SYS_semtimedop, SYS_fadvise64,
    SYS_timer_create, SYS_timer_settime, SYS_timer_gettime, SYS_timer_getoverrun, SYS_timer_delete,
    SYS_clock_settime, SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_exit_group, SYS_epoll_wait,
    SYS_epoll_ctl, SYS_tgkill, SYS_utimes, SYS_vserver, SYS_mbind, SYS_set_mempolicy, SYS_get_mempolicy,
    SYS_mq_open, SYS_mq_unlink, SYS_mq_timedsend, SYS_mq_timedreceive, SYS_mq_notify, SYS_mq_getsetattr,
    SYS_kexec_load, SYS_waitid, SYS_add_key, SYS_request_key, SYS_keyctl, SYS_ioprio_set, SYS_ioprio_get,
    SYS_inotify_init, SYS_inotify_add_watch, SYS_inotify_rm_watch, SYS_migrate_pages, SYS_openat, SYS_mkdirat,
    SYS_mknodat, SYS_fchownat, SYS_futimesat, SYS_newfstatat, SYS_unlinkat, SYS_renameat, SYS_linkat, SYS_symlinkat,
    SYS_readlinkat, SYS_fchmodat, SYS_faccessat, SYS_pselect6, SYS_ppoll, SYS_unshare, SYS_set_robust_list,
    SYS_get_robust_list, SYS_splice, SYS_tee, SYS_sync_file_range, SYS_vmsplice, SYS_move_pages, SYS_utimensat,
    SYS_epoll_pwait, SYS_signalfd, SYS_timerfd_create, SYS_eventfd, SYS_fallocate, SYS_timerfd_settime,
    SYS_timerfd_gettime, SYS_accept4, SYS_signalfd4, SYS_eventfd2, SYS_epoll_create1, SYS_dup3, SYS_pipe2,
    SYS_inotify_init1, SYS_preadv, SYS_pwritev, SYS_rt_tgsigqueueinfo, SYS_perf_event_open, SYS_recvmmsg,
    SYS_fanotify_init, SYS_fanotify_mark, SYS_prlimit64, SYS_name_to_handle_at, SYS_open_by_handle_at,
    SYS_clock_adjtime, SYS_syncfs, SYS_sendmmsg, SYS_setns, SYS_getcpu, SYS_process_vm_readv, SYS_process_vm_writev,
    SYS_kcmp, SYS_finit_module, SYS_sched_setattr, SYS_sched_getattr, SYS_renameat2, SYS_seccomp, SYS_getrandom,
    SYS_memfd_create, SYS_kexec_file_load, SYS_bpf, SYS_execveat, SYS_userfaultfd, SYS_membarrier, SYS_mlock2,
    SYS_copy_file_range, SYS_preadv2, SYS_pwritev2, SYS_pkey_mprotect, SYS_pkey_alloc, SYS_pkey_free, SYS_statx,
    SYS_rseq, SYS_pidfd_send_signal, SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register, SYS_open_tree,
    SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick, SYS_pidfd_open, SYS_clone3, SYS_close_range,
    SYS_openat2, SYS_pidfd_getfd, SYS_faccessat2, SYS_process_madvise, SYS_epoll_pwait2, SYS_mount_setattr,
    SYS_quotactl_fd, SYS_landlock_create_ruleset, SYS_landlock_add_rule, SYS_landlock_restrict_self,
    SYS_memfd_secret, SYS_process_mrelease, SYS_futex_waitv, SYS_set_mempolicy_home_node, SYS_fchmodat2, SYS_mseal,
);

#[cfg(not(target_arch = "x86_64"))]
const SYSCALLS: &[(i64, &str)] = &[];

/// The name of syscall `nr` ("epoll_wait" for 232), `None` for a number this table lacks.
pub fn name(nr: i64) -> Option<&'static str> {
    SYSCALLS.iter().find(|(n, _)| *n == nr).map(|(_, constant)| &constant["SYS_".len()..])
}

/// futex(2) operations that wait (the low bits of `futex_op`, without the private and
/// realtime-clock flags): WAIT, LOCK_PI, WAIT_BITSET, WAIT_REQUEUE_PI, LOCK_PI2.
const FUTEX_WAITING_OPS: [u64; 5] = [0, 6, 9, 11, 13];
const FUTEX_CMD_MASK: u64 = 0x7f;

/// Whether syscall `name` (with its first arguments) exists to wait: a task in one of these was
/// going to sleep or coming back from sleep, never holding the CPU because of it. Syscalls that
/// only sometimes wait (read on a pipe, recvmsg) are judged by how the task left the CPU.
pub fn only_waits(name: &str, args: &[u64; 4]) -> bool {
    match name {
        "futex" => FUTEX_WAITING_OPS.contains(&(args[1] & FUTEX_CMD_MASK)),
        "nanosleep" | "clock_nanosleep" | "epoll_wait" | "epoll_pwait" | "epoll_pwait2" | "poll" | "ppoll"
        | "select" | "pselect6" | "pause" | "rt_sigsuspend" | "rt_sigtimedwait" | "wait4" | "waitid"
        | "io_getevents" | "io_pgetevents" | "msgrcv" | "semop" | "semtimedop" | "mq_timedreceive" | "futex_wait"
        | "futex_waitv" | "sched_yield" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn syscalls_are_named_by_their_x86_64_numbers() {
        assert_eq!(name(232), Some("epoll_wait"));
        assert_eq!(name(230), Some("clock_nanosleep"));
        assert_eq!(name(28), Some("madvise"));
        assert_eq!(name(0), Some("read"));
        assert_eq!(name(99_999), None);
    }

    #[test]
    fn sleeping_syscalls_are_told_from_working_ones() {
        assert!(only_waits("clock_nanosleep", &[0; 4]));
        assert!(only_waits("epoll_wait", &[0; 4]));
        // FUTEX_WAIT_PRIVATE (128 | 0) waits; FUTEX_WAKE_PRIVATE (128 | 1) does not.
        assert!(only_waits("futex", &[0, 128, 0, 0]));
        assert!(!only_waits("futex", &[0, 129, 0, 0]));
        assert!(!only_waits("madvise", &[0; 4]));
        assert!(!only_waits("read", &[0; 4]), "read is judged by how the task left the CPU");
    }
}

//! Readers for what /proc says about a process: status (THP_enabled), stat (ppid, flags),
//! cmdline, smaps (sizes, AnonHugePages, THPeligible, VmFlags), mountinfo (which devices are
//! tmpfs) and /proc/vmstat's thp_* counters. Parsers take text so they are tested on captured
//! samples; `Proc` does the reading and turns I/O errors into what they mean for a pid.

use std::{collections::BTreeMap, io, path::PathBuf};

use thiserror::Error;

/// `PF_KTHREAD` in /proc/PID/stat's flags field (include/linux/sched.h, every version).
const PF_KTHREAD: u64 = 0x0020_0000;

#[derive(Debug, Error)]
pub enum ProcError {
    #[error("process {pid} does not exist (or has exited)")]
    Gone { pid: u32 },
    /// `hint` says what would help (see `access`): "run as root" only where that is the answer.
    #[error("cannot read {path}: permission denied ({hint})")]
    Denied { pid: u32, path: String, hint: String },
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("cannot parse {path}: {what}")]
    Parse { path: String, what: String },
}

/// One process's files under /proc.
#[derive(Clone, Debug)]
pub struct Proc {
    pub pid: u32,
    root: PathBuf,
}

impl Proc {
    pub fn new(pid: u32) -> Self {
        Self { pid, root: PathBuf::from(format!("/proc/{pid}")) }
    }

    pub fn exists(&self) -> bool {
        self.root.join("stat").exists()
    }

    fn read(&self, file: &str) -> Result<String, ProcError> {
        let path = self.root.join(file);
        let bytes = std::fs::read(&path).map_err(|e| self.error(file, e))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn error(&self, file: &str, e: io::Error) -> ProcError {
        let path = self.root.join(file).display().to_string();
        match e.kind() {
            io::ErrorKind::NotFound => ProcError::Gone { pid: self.pid },
            io::ErrorKind::PermissionDenied => {
                let hint = super::access::denied_hint(self.pid, &super::access::AccessFacts::read(self.pid));
                ProcError::Denied { pid: self.pid, path, hint }
            }
            // ESRCH: the task died between open and read.
            _ if e.raw_os_error() == Some(libc::ESRCH) => ProcError::Gone { pid: self.pid },
            _ => ProcError::Io { path, source: e },
        }
    }

    /// Opening /proc/PID/smaps is where the kernel checks ptrace access (proc_mem_open): a cheap
    /// way to fail early, before any work, when the caller may not look at this process.
    pub fn check_smaps_access(&self) -> Result<(), ProcError> {
        std::fs::File::open(self.root.join("smaps")).map(drop).map_err(|e| self.error("smaps", e))
    }

    pub fn status(&self) -> Result<Status, ProcError> {
        Ok(parse_status(&self.read("status")?))
    }

    pub fn stat(&self) -> Result<Stat, ProcError> {
        let text = self.read("stat")?;
        parse_stat(&text).ok_or_else(|| ProcError::Parse {
            path: format!("/proc/{}/stat", self.pid),
            what: "no `pid (comm) state` prefix".into(),
        })
    }

    pub fn cmdline(&self) -> Result<String, ProcError> {
        let bytes = std::fs::read(self.root.join("cmdline")).map_err(|e| self.error("cmdline", e))?;
        Ok(parse_cmdline(&bytes))
    }

    pub fn smaps(&self) -> Result<Vec<Vma>, ProcError> {
        Ok(parse_smaps(&self.read("smaps")?))
    }

    /// Reading smaps_rollup takes the mm's mmap lock once: the live side uses that to learn the
    /// mm's flags from the kernel (mmap_lock tracepoint). The content itself is not needed.
    pub fn touch_smaps_rollup(&self) -> Result<(), ProcError> {
        self.read("smaps_rollup").map(drop)
    }

    pub fn mountinfo(&self) -> Result<Vec<Mount>, ProcError> {
        Ok(parse_mountinfo(&self.read("mountinfo")?))
    }
}

/// The lines of /proc/PID/status that thp-why uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub name: String,
    /// The state letter: R, S, D, Z (zombie), X, T, t, I…
    pub state: char,
    pub tgid: u32,
    pub ppid: u32,
    /// `THP_enabled:` (5.0+): 0 when the prctl disabled THP (on 6.18 only the COMPLETELY mode).
    /// Absent for kernel threads and zombies (no mm).
    pub thp_enabled: Option<bool>,
    /// `Kthread:` (6.3+).
    pub kthread: Option<bool>,
    /// `VmSize:` present: the task has an mm.
    pub has_mm: bool,
}

pub fn parse_status(text: &str) -> Status {
    let mut status = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        match key {
            "Name" => status.name = value.to_string(),
            "State" => status.state = value.chars().next().unwrap_or('?'),
            "Tgid" => status.tgid = value.parse().unwrap_or(0),
            "PPid" => status.ppid = value.parse().unwrap_or(0),
            "THP_enabled" => status.thp_enabled = Some(value != "0"),
            "Kthread" => status.kthread = Some(value != "0"),
            "VmSize" => status.has_mm = true,
            _ => {}
        }
    }
    status
}

/// The fields of /proc/PID/stat that thp-why uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    pub flags: u64,
}

impl Stat {
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

/// `pid (comm) state ppid pgrp session tty tpgid flags …`; comm may hold spaces and parentheses,
/// so it ends at the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    // pgrp, session, tty_nr, tpgid, then flags.
    let flags = rest.nth(4)?.parse().ok()?;
    Some(Stat { pid, comm, state, ppid, flags })
}

/// NUL-separated arguments, joined by spaces.
pub fn parse_cmdline(bytes: &[u8]) -> String {
    bytes.split(|b| *b == 0).filter(|arg| !arg.is_empty()).map(String::from_utf8_lossy).collect::<Vec<_>>().join(" ")
}

/// One VMA as /proc/PID/smaps describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// `rw-p`: the 4th letter is `s` for shared, `p` for private.
    pub perms: String,
    /// File offset in bytes (vm_pgoff << PAGE_SHIFT).
    pub offset: u64,
    /// Device major:minor of the backing file (0:0 for anonymous memory).
    pub dev: (u32, u32),
    pub inode: u64,
    /// Path or pseudo-name (`[heap]`, `[stack]`, `[vdso]`, `/dev/zero (deleted)`), empty for
    /// plain anonymous memory.
    pub name: String,
    pub rss_kb: u64,
    pub anonymous_kb: u64,
    pub anon_huge_kb: u64,
    pub shmem_pmd_kb: u64,
    pub file_pmd_kb: u64,
    /// The kernel's own answer (smaps' allow-check call); absent on kernels before 4.19.
    pub thp_eligible: Option<bool>,
    /// VmFlags mnemonics: `rd wr mr mw me ac hg` …
    pub vm_flags: Vec<String>,
}

impl Vma {
    pub fn size_bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn has_flag(&self, mnemonic: &str) -> bool {
        self.vm_flags.iter().any(|f| f == mnemonic)
    }

    pub fn is_shared(&self) -> bool {
        self.perms.as_bytes().get(3) == Some(&b's')
    }
}

/// Parses /proc/PID/smaps: a header line per VMA followed by `Key: value kB` lines and VmFlags.
pub fn parse_smaps(text: &str) -> Vec<Vma> {
    let mut vmas = Vec::new();
    let mut current: Option<Vma> = None;
    for line in text.lines() {
        if let Some(header) = parse_maps_header(line) {
            vmas.extend(current.replace(header));
            continue;
        }
        let Some(vma) = current.as_mut() else { continue };
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        let kb = || value.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
        match key {
            "Rss" => vma.rss_kb = kb(),
            "Anonymous" => vma.anonymous_kb = kb(),
            "AnonHugePages" => vma.anon_huge_kb = kb(),
            "ShmemPmdMapped" => vma.shmem_pmd_kb = kb(),
            "FilePmdMapped" => vma.file_pmd_kb = kb(),
            "THPeligible" => vma.thp_eligible = Some(value != "0"),
            "VmFlags" => vma.vm_flags = value.split_whitespace().map(str::to_string).collect(),
            _ => {}
        }
    }
    vmas.extend(current);
    vmas
}

/// `start-end perms offset major:minor inode [name]` (hex addresses, offset and device).
fn parse_maps_header(line: &str) -> Option<Vma> {
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    if perms.len() != 4 {
        return None;
    }
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let (major, minor) = fields.next()?.split_once(':')?;
    let dev = (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
    let inode = fields.next()?.parse().ok()?;
    let name = fields.next().unwrap_or("").trim().to_string();
    Some(Vma { start, end, perms: perms.to_string(), offset, dev, inode, name, ..Vma::default() })
}

/// One line of /proc/PID/mountinfo, as far as thp-why needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub dev: (u32, u32),
    pub mount_point: String,
    pub fs_type: String,
    /// Per-superblock options (tmpfs: `size=…,huge=within_size`).
    pub super_options: String,
}

impl Mount {
    /// tmpfs `huge=` option; `never` when absent (the tmpfs default).
    pub fn tmpfs_huge(&self) -> &str {
        self.super_options.split(',').find_map(|o| o.strip_prefix("huge=")).unwrap_or("never")
    }
}

/// `id parent major:minor root mount-point options [optional…] - fstype source super-options`
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mut left = left.split(' ');
            let (major, minor) = left.nth(2)?.split_once(':')?;
            let mount_point = left.nth(1)?.to_string();
            let mut right = right.split(' ');
            let fs_type = right.next()?.to_string();
            let super_options = right.nth(1).unwrap_or("").to_string();
            Some(Mount { dev: (major.parse().ok()?, minor.parse().ok()?), mount_point, fs_type, super_options })
        })
        .collect()
}

/// The `thp_*` counters of /proc/vmstat.
pub fn parse_vmstat_thp(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(' ')?;
            key.starts_with("thp_").then(|| Some((key.to_string(), value.trim().parse().ok()?)))?
        })
        .collect()
}

pub fn read_vmstat_thp() -> BTreeMap<String, u64> {
    std::fs::read_to_string("/proc/vmstat").map(|t| parse_vmstat_thp(&t)).unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Captured on 6.18.44 (a kernel thread has neither VmSize nor THP_enabled).
    const STATUS: &str = "Name:\tthp_regions\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4440\nNgid:\t0\n\
        Pid:\t4440\nPPid:\t4321\nTracerPid:\t0\nKthread:\t0\nVmPeak:\t   20480 kB\nVmSize:\t   20480 kB\n\
        CoreDumping:\t0\nTHP_enabled:\t0\nuntag_mask:\t0xffffffffffffffff\nThreads:\t1\n";
    const KTHREAD_STATUS: &str = "Name:\tkthreadd\nUmask:\t0000\nState:\tS (sleeping)\nTgid:\t2\nNgid:\t0\n\
        Pid:\t2\nPPid:\t0\nTracerPid:\t0\nKthread:\t1\nThreads:\t1\n";

    #[test]
    fn status_of_a_process_and_of_a_kernel_thread() {
        let s = parse_status(STATUS);
        assert_eq!(s.name, "thp_regions");
        assert_eq!((s.state, s.tgid, s.ppid), ('S', 4440, 4321));
        assert_eq!(s.thp_enabled, Some(false));
        assert_eq!(s.kthread, Some(false));
        assert!(s.has_mm);
        let k = parse_status(KTHREAD_STATUS);
        assert_eq!((k.kthread, k.thp_enabled, k.has_mm), (Some(true), None, false));
    }

    #[test]
    fn stat_with_awkward_comm() {
        let s = parse_stat("26666 (cat) R 26662 26662 10650 0 -1 4194304 101 0 0 0").unwrap();
        assert_eq!((s.pid, s.comm.as_str(), s.state, s.ppid, s.flags), (26666, "cat", 'R', 26662, 4194304));
        assert!(!s.is_kernel_thread());
        let s = parse_stat("77 (a (b) c) S 1 77 77 0 -1 2129984 0 0").unwrap();
        assert_eq!(s.comm, "a (b) c");
        assert!(s.is_kernel_thread(), "2129984 has PF_KTHREAD");
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("12 (x) Z"), None, "truncated");
    }

    #[test]
    fn cmdline_joins_arguments() {
        assert_eq!(parse_cmdline(b"lkp\0run\0job.yaml\0"), "lkp run job.yaml");
        assert_eq!(parse_cmdline(b""), "");
    }

    /// Three VMAs captured on 6.18.44 (sysfs enabled=madvise): shared anonymous memory (shmem) with
    /// MADV_HUGEPAGE, private anonymous memory with MADV_HUGEPAGE backed by huge pages, and a file.
    pub const SMAPS: &str = "\
7f639f9d5000-7f63a01d5000 rw-s 00000000 00:01 1027                       /dev/zero (deleted)
Size:               8192 kB
KernelPageSize:        4 kB
Rss:                   8 kB
Anonymous:             0 kB
AnonHugePages:         0 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
THPeligible:           0
VmFlags: rd wr sh mr mw me ms hg 
7f63f6000000-7f63f6800000 rw-p 00000000 00:00 0 
Size:               8192 kB
Rss:                8192 kB
Anonymous:          8192 kB
AnonHugePages:      8192 kB
THPeligible:           1
VmFlags: rd wr mr mw me ac hg 
7f63f6880000-7f63f6882000 r--p 00001000 fe:00 326389                     /usr/lib/x86_64-linux-gnu/libffi.so.8.1.2
Size:                  8 kB
Rss:                   8 kB
Anonymous:             0 kB
AnonHugePages:         0 kB
THPeligible:    0
VmFlags: rd mr mw me 
";

    #[test]
    fn smaps_vmas_with_vm_flags() {
        let vmas = parse_smaps(SMAPS);
        assert_eq!(vmas.len(), 3);
        let shm = &vmas[0];
        assert_eq!((shm.start, shm.end), (0x7f639f9d5000, 0x7f63a01d5000));
        assert_eq!(shm.size_bytes(), 8 << 20);
        assert!(shm.is_shared() && shm.has_flag("hg") && !shm.has_flag("nh"));
        assert_eq!((shm.dev, shm.inode, shm.name.as_str()), ((0, 1), 1027, "/dev/zero (deleted)"));
        assert_eq!(shm.thp_eligible, Some(false));
        let anon = &vmas[1];
        assert_eq!((anon.name.as_str(), anon.anon_huge_kb, anon.anonymous_kb), ("", 8192, 8192));
        assert_eq!(anon.thp_eligible, Some(true));
        let file = &vmas[2];
        assert_eq!((file.offset, file.dev), (0x1000, (0xfe, 0)));
        assert_eq!(file.thp_eligible, Some(false), "6.6+ pads the value");
    }

    #[test]
    fn smaps_without_thp_lines_and_with_garbage() {
        let vmas = parse_smaps("00400000-00401000 r-xp 00000000 08:01 12 /bin/x\nSize: 4 kB\nnonsense\n");
        assert_eq!(vmas.len(), 1);
        assert_eq!((vmas[0].thp_eligible, vmas[0].vm_flags.len()), (None, 0));
        assert!(parse_smaps("").is_empty());
    }

    #[test]
    fn mountinfo_finds_tmpfs_and_its_huge_option() {
        let text = "25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684084k\n\
                    27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n\
                    31 27 0:40 / /mnt/huge rw shared:5 - tmpfs none rw,size=1g,huge=within_size\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!((mounts[0].dev, mounts[0].fs_type.as_str(), mounts[0].tmpfs_huge()), ((0, 23), "tmpfs", "never"));
        assert_eq!(mounts[1].dev, (254, 0));
        assert_eq!((mounts[2].mount_point.as_str(), mounts[2].tmpfs_huge()), ("/mnt/huge", "within_size"));
    }

    #[test]
    fn vmstat_keeps_thp_counters() {
        let text = "nr_free_pages 5\nthp_fault_alloc 12\nthp_fault_fallback 3\nthp_collapse_alloc 0\npgfault 99\n";
        let thp = parse_vmstat_thp(text);
        assert_eq!(thp.len(), 3);
        assert_eq!(thp["thp_fault_alloc"], 12);
        assert!(!thp.contains_key("pgfault"));
    }
}

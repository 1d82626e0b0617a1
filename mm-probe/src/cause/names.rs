//! Names for the causes the kernel programs decide: a bounded class (a metric label) and a
//! detail (the call and its advice, the migration's reason, the kernel thread).

use mm_probe_common::cause::{Cause, CauseClass, REASON_UNREAD};
use serde::Serialize;

use crate::kernel::{syscalls, tracefs};

/// One cause as reported.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct CauseName {
    /// Bounded: `compaction`, `numa_balancing`, `migration`, `direct_reclaim`,
    /// `cgroup_reclaim`, `kswapd`, `kernel_thread`, `syscall`, `fault`, `unknown`.
    pub class: &'static str,
    pub detail: Option<String>,
}

impl std::fmt::Display for CauseName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.detail {
            Some(detail) => write!(f, "{} {detail}", self.class.replace('_', " ")),
            None => f.write_str(&self.class.replace('_', " ")),
        }
    }
}

/// Names causes on this kernel: `enum migrate_reason`'s names come from the migration
/// tracepoint's own format (their numbering moved between versions).
#[derive(Clone, Debug, Default)]
pub struct Namer {
    migrate_reasons: Vec<(i64, String)>,
}

/// madvise(2) advice that unmaps or changes mappings, named for the detail (libc's values).
const ADVICE: &[(i32, &str)] = &[
    (libc::MADV_DONTNEED, "MADV_DONTNEED"),
    (libc::MADV_FREE, "MADV_FREE"),
    (libc::MADV_REMOVE, "MADV_REMOVE"),
    (libc::MADV_PAGEOUT, "MADV_PAGEOUT"),
    (libc::MADV_COLD, "MADV_COLD"),
    (libc::MADV_MERGEABLE, "MADV_MERGEABLE"),
    (libc::MADV_HUGEPAGE, "MADV_HUGEPAGE"),
    (libc::MADV_DONTFORK, "MADV_DONTFORK"),
    (libc::MADV_WIPEONFORK, "MADV_WIPEONFORK"),
    (25, "MADV_COLLAPSE"),
];

impl Namer {
    pub fn from_tracefs() -> Self {
        let reasons = tracefs::root()
            .ok()
            .and_then(|root| tracefs::print_symbols(&root, "migrate", "mm_migrate_pages_start", "reason"));
        Self { migrate_reasons: reasons.unwrap_or_default() }
    }

    /// `comm` is the invalidating thread's; `event` the range's `enum mmu_notifier_event`
    /// where the hook carries it.
    pub fn name(&self, cause: &Cause, comm: &str, event: Option<&str>) -> CauseName {
        let named = |class, detail: Option<String>| CauseName { class, detail };
        match CauseClass::from_raw(cause.class) {
            CauseClass::Migration => self.migration(cause.detail),
            CauseClass::Compaction => named("compaction", Some(format!("in {comm}"))),
            CauseClass::DirectReclaim => named("direct_reclaim", Some(format!("in {comm}"))),
            CauseClass::CgroupReclaim => named("cgroup_reclaim", Some(format!("in {comm}"))),
            CauseClass::Kswapd => named("kswapd", None),
            CauseClass::KernelThread => named("kernel_thread", Some(comm.to_string())),
            CauseClass::Syscall => named("syscall", Some(call(cause.detail, cause.arg))),
            CauseClass::UserContext => match event {
                // Outside any syscall, only task_numa_work changes a whole VMA's protection.
                Some("PROTECTION_VMA") => {
                    named("numa_balancing", Some("hinting faults set up by task_numa_work".into()))
                }
                Some("CLEAR") => named("fault", Some("copy-on-write".into())),
                _ => named("fault", None),
            },
            CauseClass::Unknown => named("unknown", None),
        }
    }

    fn migration(&self, reason: u32) -> CauseName {
        if reason == REASON_UNREAD {
            return CauseName { class: "migration", detail: Some("reason not readable".into()) };
        }
        let name = self.migrate_reasons.iter().find(|(v, _)| *v == i64::from(reason as i32)).map(|(_, n)| n.as_str());
        match name {
            Some("compaction") => CauseName { class: "compaction", detail: Some("migration".into()) },
            Some("numa_misplaced") => {
                CauseName { class: "numa_balancing", detail: Some("migration of misplaced pages".into()) }
            }
            Some(other) => CauseName { class: "migration", detail: Some(other.to_string()) },
            None => CauseName { class: "migration", detail: Some(format!("reason {}", reason as i32)) },
        }
    }
}

/// "madvise(MADV_DONTNEED)", "mprotect()", "syscall 999()".
fn call(nr: u32, third: u32) -> String {
    let name = syscalls::name(i64::from(nr)).map_or_else(|| format!("syscall {nr}"), str::to_string);
    if name == "madvise" {
        let advice =
            ADVICE.iter().find(|(v, _)| *v as u32 == third).map_or_else(|| third.to_string(), |(_, n)| n.to_string());
        format!("madvise({advice})")
    } else {
        format!("{name}()")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(class: CauseClass, detail: u32, arg: u32) -> Cause {
        Cause { class: class as u32, detail, arg, _pad: 0 }
    }

    fn namer() -> Namer {
        let format = r#"print fmt: "mode=%s reason=%s", __print_symbolic(REC->mode, {0, "MIGRATE_ASYNC"}), __print_symbolic(REC->reason, {0, "compaction"}, {1, "memory_failure"}, {5, "numa_misplaced"}, {9, "damon"})"#;
        Namer { migrate_reasons: tracefs::parse_print_symbols(format, "reason") }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_syscall_is_named_with_madvises_advice() {
        let n = namer();
        let madvise = n.name(&cause(CauseClass::Syscall, libc::SYS_madvise as u32, 4), "qemu", None);
        assert_eq!(madvise.to_string(), "syscall madvise(MADV_DONTNEED)");
        let mprotect = n.name(&cause(CauseClass::Syscall, libc::SYS_mprotect as u32, 1), "qemu", None);
        assert_eq!((mprotect.class, mprotect.detail.as_deref()), ("syscall", Some("mprotect()")));
    }

    #[test]
    fn migration_is_named_by_the_kernels_own_reason_names() {
        let n = namer();
        assert_eq!(n.name(&cause(CauseClass::Migration, 0, 0), "sh", None).class, "compaction");
        assert_eq!(n.name(&cause(CauseClass::Migration, 5, 0), "qemu", None).class, "numa_balancing");
        let damon = n.name(&cause(CauseClass::Migration, 9, 0), "kdamond.0", None);
        assert_eq!((damon.class, damon.detail.as_deref()), ("migration", Some("damon")));
        assert_eq!(n.name(&cause(CauseClass::Migration, 42, 0), "x", None).detail.as_deref(), Some("reason 42"));
    }

    #[test]
    fn outside_a_syscall_the_event_tells_numa_hinting_from_copy_on_write() {
        let n = namer();
        let user = cause(CauseClass::UserContext, 0, 0);
        assert_eq!(n.name(&user, "worker", Some("PROTECTION_VMA")).class, "numa_balancing");
        assert_eq!(n.name(&user, "worker", Some("CLEAR")).detail.as_deref(), Some("copy-on-write"));
        assert_eq!(n.name(&user, "worker", None).class, "fault");
        assert_eq!(n.name(&cause(CauseClass::Unknown, 0, 0), "x", None).class, "unknown");
    }
}

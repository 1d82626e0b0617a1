//! Finding the subscribers' callbacks in the kernel and timing each as it is found.
//!
//! The kernel programs record every function pointer of the ops of a watched mm's subscribers
//! (`INV_DISCOVERED_CALLBACKS`: the hlist walked at an invalidation, interval notifiers at
//! mmu_interval_read_begin). At each poll the new ones are named from kallsyms (read again when a
//! module loaded since) and, when their ops member takes the range as its second argument,
//! timed by the callback pair; BTF's prototype of the member says how the callback refuses. A
//! driver loaded mid-run is thus timed from its first poll on.

use std::collections::HashSet;

use aya::{Ebpf, maps::HashMap as BpfHashMap};
use mm_probe_common::invalidations::{self as names, DiscoveredCallback, OpsTable, ReturnKind};

use super::probes::{self, CallbackPlan, SkippedCallback};
use crate::{
    kernel::{Kallsyms, Kernel, btf::FunctionMember},
    probes::{GlobalValue, Plan},
    report::text,
};

/// How often the discovered callbacks are read: a driver's storm is timed from this long
/// after its first invalidation or read_begin.
pub const POLL_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// The argument every timed callback takes second (the timing program reads it).
const RANGE_PARAM: &str = "struct mmu_notifier_range *";
/// Words of an ops table the kernel side can read (its OPS_WORDS).
const OPS_WORDS: u32 = 16;

/// A member of an ops table, and whether its callbacks can be timed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpsMember {
    /// `mmu_notifier_ops.invalidate_range_start`.
    pub name: String,
    pub timing: Timing,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Takes the range second; refuses as its return type says.
    Timed(ReturnKind),
    /// Why not.
    Skipped(String),
}

/// Whether the callbacks of an ops member can be timed, from its prototype: the timing program
/// reads the range from argument 1, so only members that take it there (invalidate_range_start
/// and _end, interval notifiers' invalidate) are timed; clear_young, release or IOMMU SVA's
/// arch_invalidate_secondary_tlbs(subscription, mm, start, end) would be misread.
pub fn timing_of(member: &FunctionMember) -> Timing {
    if member.params.get(1).map(String::as_str) != Some(RANGE_PARAM) {
        return Timing::Skipped(format!(
            "it takes ({}), not the range second, which the timing program reads",
            member.params.join(", ")
        ));
    }
    Timing::Timed(match member.returns.as_str() {
        "void" => ReturnKind::Void,
        "_Bool" | "bool" => ReturnKind::Bool,
        _ => ReturnKind::Int,
    })
}

/// The members of both ops tables, from vmlinux's BTF (the tables are declared in
/// include/linux/mmu_notifier.h and used by mm/mmu_notifier.c, so their types are vmlinux's).
#[derive(Clone, Debug, Default)]
pub struct OpsMembers {
    notifier: Vec<(u32, OpsMember)>,
    interval: Vec<(u32, OpsMember)>,
}

impl OpsMembers {
    pub fn of(kernel: &Kernel) -> Self {
        let Ok(btf) = kernel.btf() else { return Self::default() };
        let table = |name: &str| -> Vec<(u32, OpsMember)> {
            let members = btf.function_members(name).unwrap_or_default();
            members
                .iter()
                .map(|m| (m.offset, OpsMember { name: format!("{name}.{}", m.name), timing: timing_of(m) }))
                .collect()
        };
        Self { notifier: table("mmu_notifier_ops"), interval: table("mmu_interval_notifier_ops") }
    }

    fn member(&self, found: &DiscoveredCallback) -> Option<&OpsMember> {
        let table = if found.table == OpsTable::Interval as u32 { &self.interval } else { &self.notifier };
        table.iter().find(|(offset, _)| *offset == found.member_offset).map(|(_, member)| member)
    }
}

/// Bit i: the word at 8×i of the table is a function pointer, to read.
fn words(table: &[(u32, OpsMember)]) -> u64 {
    let words = table.iter().map(|(offset, _)| offset / 8).filter(|&word| word < OPS_WORDS);
    words.fold(0, |bits, word| bits | 1 << word)
}

/// The globals that tell the kernel side which words of each ops table to read, and how its
/// callback kprobe learns which callback it is in.
pub fn settings(kernel: &Kernel) -> [(&'static str, GlobalValue); 3] {
    let members = OpsMembers::of(kernel);
    [
        (names::NOTIFIER_OPS_WORDS, GlobalValue::U64(words(&members.notifier))),
        (names::INTERVAL_OPS_WORDS, GlobalValue::U64(words(&members.interval))),
        (names::FUNC_IP_FROM_REGS, GlobalValue::U32(u32::from(!has_func_ip_helper(kernel)))),
    ]
}

/// Whether this kernel has bpf_get_func_ip(): its BTF names every helper it knows in
/// `enum bpf_func_id`. Without readable BTF the helper is assumed: a wrong guess fails that one
/// program's load, and the plan says so.
fn has_func_ip_helper(kernel: &Kernel) -> bool {
    kernel.btf().map_or(true, |btf| btf.enumerator("BPF_FUNC_get_func_ip").is_some())
}

/// The callbacks timed so far and those passed over; polled once per tick of the run loop.
pub struct CallbackTimer {
    plan: CallbackPlan,
    members: OpsMembers,
    /// Re-read when a discovered address is past every symbol known (a module loaded since).
    kallsyms: Option<Kallsyms>,
    handled: HashSet<u64>,
    skipped: Vec<SkippedCallback>,
}

impl CallbackTimer {
    /// Times the known callbacks this kernel has and notes whether discovery can add others.
    pub fn start(kernel: &Kernel, ebpf: &mut Ebpf, hooks: &Plan) -> Self {
        let mut plan = probes::attach_callbacks(kernel, ebpf);
        plan.discovery =
            hooks.is_attached(probes::SUBSCRIPTIONS_PROBE) || hooks.is_attached(probes::INTERVAL_BEGIN_PROBE);
        let handled = plan.addresses.iter().copied().collect();
        Self { plan, members: OpsMembers::of(kernel), kallsyms: None, handled, skipped: Vec::new() }
    }

    pub fn plan(&self) -> &CallbackPlan {
        &self.plan
    }

    pub fn skipped(&self) -> &[SkippedCallback] {
        &self.skipped
    }

    /// A symbol table as fresh as the last callback found (`None`: use the kernel's).
    pub fn kallsyms(&self) -> Option<&Kallsyms> {
        self.kallsyms.as_ref()
    }

    /// Attaches the timing pair to each callback found since the last poll, saying so on stderr.
    pub fn poll(&mut self, kernel: &Kernel, ebpf: &mut Ebpf) {
        if !(self.plan.can_attach && self.plan.discovery) {
            return;
        }
        let fresh: Vec<(u64, DiscoveredCallback)> =
            discovered(ebpf).into_iter().filter(|(a, _)| !self.handled.contains(a)).collect();
        for (address, found) in fresh {
            self.handled.insert(address);
            if let Some(line) = self.handle(kernel, ebpf, address, &found) {
                text::eprintln(&format!("mm-probe: {line}"));
            }
        }
    }

    /// Times or skips one callback; returns the line that says which.
    fn handle(&mut self, kernel: &Kernel, ebpf: &mut Ebpf, address: u64, found: &DiscoveredCallback) -> Option<String> {
        let member = self.members.member(found)?.clone();
        let (function, module) = self.symbol(kernel, address)?;
        let shown = match probes::subscriber_of(&function) {
            Some(friendly) => format!("{function} ({friendly})"),
            None => probes::subscriber_name(&function, module.as_deref()),
        };
        match member.timing {
            Timing::Timed(returns) => Some(match probes::attach_timing(ebpf, &function, address, returns) {
                Ok(()) => format!("timing {shown} from now on ({} of a watched mm's subscriber)", member.name),
                Err(error) => format!("cannot time {shown}: {error:#}"),
            }),
            Timing::Skipped(why) => {
                let line = format!("not timing {shown} ({}): {why}", member.name);
                self.skipped.push(SkippedCallback { callback: function, module, member: member.name, why });
                Some(line)
            }
        }
    }

    /// The function starting at `address` and its module; kallsyms is read again when the
    /// address is not a known function's start (a module loaded since it was read).
    fn symbol(&mut self, kernel: &Kernel, address: u64) -> Option<(String, Option<String>)> {
        let at_start = |k: &Kallsyms| {
            k.symbolize(address)
                .filter(|r| r.offset == 0)
                .map(|r| (r.symbol.name.to_string(), r.symbol.module.as_deref().map(str::to_string)))
        };
        let current = self.kallsyms.as_ref().or_else(|| kernel.kallsyms().ok());
        if let Some(found) = current.and_then(at_start) {
            return Some(found);
        }
        self.kallsyms = Kallsyms::read().ok();
        self.kallsyms.as_ref().and_then(at_start)
    }
}

/// Every callback the kernel side has recorded.
fn discovered(ebpf: &Ebpf) -> Vec<(u64, DiscoveredCallback)> {
    let Some(map) = ebpf.map(names::DISCOVERED_CALLBACKS_MAP) else { return Vec::new() };
    let Ok(found) = BpfHashMap::<_, u64, DiscoveredCallback>::try_from(map) else { return Vec::new() };
    found.iter().filter_map(Result::ok).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, returns: &str, params: &[&str]) -> FunctionMember {
        FunctionMember {
            offset: 0,
            name: name.into(),
            returns: returns.into(),
            params: params.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn callbacks_that_take_the_range_second_are_timed_with_the_refusal_their_return_type_allows() {
        let start = member("invalidate_range_start", "int", &["struct mmu_notifier *", RANGE_PARAM]);
        assert_eq!(timing_of(&start), Timing::Timed(ReturnKind::Int));
        let end = member("invalidate_range_end", "void", &["struct mmu_notifier *", RANGE_PARAM]);
        assert_eq!(timing_of(&end), Timing::Timed(ReturnKind::Void));
        let interval =
            member("invalidate", "_Bool", &["struct mmu_interval_notifier *", RANGE_PARAM, "long unsigned int"]);
        assert_eq!(timing_of(&interval), Timing::Timed(ReturnKind::Bool));
    }

    #[test]
    fn callbacks_with_another_signature_are_skipped_with_their_prototype() {
        let params = ["struct mmu_notifier *", "struct mm_struct *", "long unsigned int", "long unsigned int"];
        let sva = member("arch_invalidate_secondary_tlbs", "void", &params);
        let Timing::Skipped(why) = timing_of(&sva) else { panic!("IOMMU SVA's callback would be misread") };
        assert!(why.contains("struct mm_struct *, long unsigned int"), "{why}");
        assert!(matches!(timing_of(&member("release", "void", &params[..2])), Timing::Skipped(_)));
    }

    #[test]
    fn unknown_subscribers_are_named_by_function_and_module() {
        assert_eq!(probes::subscriber_name("mirror_invalidate", Some("hmm_mirror")), "hmm_mirror");
        assert_eq!(probes::subscriber_name("my_invalidate", Some("mymod")), "my_invalidate [mymod]");
        assert_eq!(probes::subscriber_name("built_in_invalidate", None), "built_in_invalidate");
    }

    /// Against this machine's own BTF, where it has one: the members the kernel side reads.
    #[test]
    fn this_kernels_ops_tables_time_the_range_callbacks_only() {
        let Ok(btf) = crate::kernel::KernelBtf::from_sys_fs() else { return };
        let Some(members) = btf.function_members("mmu_notifier_ops") else { return };
        let timed: Vec<&str> =
            members.iter().filter(|m| matches!(timing_of(m), Timing::Timed(_))).map(|m| m.name.as_str()).collect();
        assert_eq!(timed, ["invalidate_range_start", "invalidate_range_end"], "{members:?}");
        let interval = btf.function_members("mmu_interval_notifier_ops").expect("with mmu_notifier_ops");
        let invalidate = interval.iter().find(|m| m.name == "invalidate").expect("interval notifiers' callback");
        assert_eq!(timing_of(invalidate), Timing::Timed(ReturnKind::Bool));
        let words = members.iter().map(|m| m.offset / 8).fold(0u64, |bits, word| bits | 1 << word);
        assert!(words.count_ones() as usize == members.len() && words < 1 << OPS_WORDS, "{members:?}");
    }
}

//! The capabilities, defined once: each one's name on the command line and in metric labels,
//! its subcommand, the family of maps its kernel programs use, and the probe catalog `doctor`
//! tries for it. `exporter --only`, the exporter's labels, the object loader and `doctor` all
//! read this table, so a capability cannot be known to one of them and missing from another.

use clap::{ValueEnum, builder::PossibleValue};

use crate::probes::{LogicalProbe, MapFamily};

/// What one capability is, as the rest of the program sees it.
#[derive(Clone, Copy, Debug)]
pub struct Definition {
    /// `exporter --only` value and the `capability` label of the exporter's series.
    pub name: &'static str,
    /// The subcommand that runs it alone, which `doctor` names its plan after.
    pub command: &'static str,
    /// The maps its programs use (named with the family's prefix on the kernel side): its own
    /// family first, then the shared ones it uses.
    pub map_families: &'static [MapFamily],
    /// Every logical probe it may attach, as `doctor` tries them.
    pub catalog: &'static [LogicalProbe],
    /// What its summary counts as the work it watched, which `compare` sets beside the run's
    /// length (None: it watches no stream of work).
    pub summary_work: Option<SummaryWork>,
    /// Where its summary lists the processes it found involved, first the one to look at
    /// next, which `triage` names in the command it suggests (None: it examines one process).
    pub focus: Option<Focus>,
    /// It measures how long tasks wait for a CPU, which loading and attaching other programs
    /// disturbs (verification and text patching run with preemption off): `triage` starts it
    /// once the other watches are attached, so that it does not blame their start-up.
    pub disturbed_by_loading: bool,
}

/// A list of processes in a capability's summary: the list (a JSON pointer) and each entry's
/// pid field.
#[derive(Clone, Copy, Debug)]
pub struct Focus {
    pub list: &'static str,
    pub pid: &'static str,
}

/// A count in a capability's summary line: what it counts, and where (a JSON pointer).
#[derive(Clone, Copy, Debug)]
pub struct SummaryWork {
    pub what: &'static str,
    pub count: &'static str,
}

/// Declares [`CapabilityId`], [`CapabilityId::ALL`] and [`CapabilityId::definition`] from one list,
/// so that a capability with no definition, or a definition outside `ALL`, cannot be written.
macro_rules! capabilities {
    ($($(#[$doc:meta])* $variant:ident => $definition:expr,)*) => {
        /// Which diagnosis: a row of this table, named on the command line and in labels. What
        /// a capability does when it runs is the `collect::driver::Capability` trait.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum CapabilityId {
            $($(#[$doc])* $variant,)*
        }

        impl CapabilityId {
            /// Every capability, in the order `doctor` prints them and the exporter attaches them.
            pub const ALL: &'static [CapabilityId] = &[$(CapabilityId::$variant,)*];

            pub fn definition(self) -> Definition {
                match self {
                    $(CapabilityId::$variant => $definition,)*
                }
            }
        }
    };
}

capabilities! {
    /// HMM / MMU-notifier retry storms (`retry-storm`).
    RetryStorm => Definition {
        name: "retry-storm",
        command: "retry-storm",
        map_families: &[MapFamily::RetryStorm, MapFamily::Cause],
        catalog: crate::retry_storm::probes::PROBES,
        summary_work: Some(SummaryWork { what: "walks", count: "/walks/calls" }),
        focus: Some(Focus { list: "/read_begins_by_caller", pid: "tgid" }),
        disturbed_by_loading: false,
    },
    /// Why a process gets no transparent huge pages (`thp-why`).
    Thp => Definition {
        name: "thp",
        command: "thp-why",
        map_families: &[MapFamily::Thp],
        catalog: crate::thp_why::probes::PROBES,
        summary_work: None,
        focus: None,
        disturbed_by_loading: false,
    },
    /// Wakeup latency of real-time tasks and the mm code that delays them (`latency`).
    Latency => Definition {
        name: "latency",
        command: "latency",
        map_families: &[MapFamily::Latency],
        catalog: crate::latency::probes::PROBES,
        summary_work: Some(SummaryWork { what: "wakeups", count: "/wakeup/count" }),
        focus: Some(Focus { list: "/tasks", pid: "pid" }),
        disturbed_by_loading: true,
    },
    /// Where MMU-notifier invalidations spend their time (`invalidations`).
    Invalidations => Definition {
        name: "invalidations",
        command: "invalidations",
        map_families: &[MapFamily::Invalidations, MapFamily::Cause],
        catalog: crate::invalidations::probes::PROBES,
        summary_work: Some(SummaryWork { what: "invalidations", count: "/invalidations/count" }),
        focus: Some(Focus { list: "/invalidations/by_invalidator", pid: "owner_tgid" }),
        disturbed_by_loading: false,
    },
}

impl CapabilityId {
    /// The `--only` value and `capability` label: "latency", "retry-storm", "thp", "invalidations".
    pub fn name(self) -> &'static str {
        self.definition().name
    }

    /// The subcommand: "latency", "retry-storm", "thp-why", "invalidations".
    pub fn command(self) -> &'static str {
        self.definition().command
    }

    /// The maps this capability's programs use: its own family first.
    pub fn map_families(self) -> &'static [MapFamily] {
        self.definition().map_families
    }

    /// The logical probes `doctor` tries for it.
    pub fn catalog(self) -> &'static [LogicalProbe] {
        self.definition().catalog
    }
}

/// `--only latency,retry-storm,thp,invalidations`: the values are the table's names.
impl ValueEnum for CapabilityId {
    fn value_variants<'a>() -> &'a [Self] {
        Self::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

/// The schema of `pointer` in `capability`'s summary line, references followed (for the tests of
/// the pointers above).
#[cfg(test)]
pub(crate) fn summary_schema_node(capability: CapabilityId, pointer: &str) -> serde_json::Value {
    use crate::report::schema_check::{COMMON_SCHEMA, LINE_SCHEMAS};
    let (_, _, text) =
        LINE_SCHEMAS.iter().find(|(c, k, _)| *c == capability.command() && *k == "summary").expect("a summary schema");
    let schema: serde_json::Value = serde_json::from_str(text).unwrap();
    let common: serde_json::Value = serde_json::from_str(COMMON_SCHEMA).unwrap();
    let mut node = &schema;
    for key in pointer.trim_start_matches('/').split('/') {
        node = &node["properties"][key];
        // Follow a reference (possibly inside anyOf with null) to the shared definitions.
        let reference = node["$ref"].as_str().or_else(|| node["anyOf"][0]["$ref"].as_str());
        if let Some(r) = reference {
            let name = r.rsplit('/').next().unwrap();
            node = if r.starts_with('#') { &schema["$defs"][name] } else { &common["$defs"][name] };
        }
    }
    node.clone()
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn the_exporter_only_list_takes_the_capability_names() {
        let cli = Cli::try_parse_from(["mm-probe", "exporter", "--only", "latency,retry-storm,thp"]).unwrap();
        let Command::Exporter(args) = cli.command else { panic!("not the exporter") };
        assert_eq!(args.only, [CapabilityId::Latency, CapabilityId::RetryStorm, CapabilityId::Thp]);
        assert!(Cli::try_parse_from(["mm-probe", "exporter", "--only", "thp-why"]).is_err(), "thp is the label name");
    }

    #[test]
    fn names_commands_and_map_families_are_distinct() {
        let distinct = |values: Vec<String>| {
            let mut sorted = values.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), values.len(), "{values:?}");
        };
        distinct(CapabilityId::ALL.iter().map(|c| c.name().to_string()).collect());
        distinct(CapabilityId::ALL.iter().map(|c| c.command().to_string()).collect());
        distinct(CapabilityId::ALL.iter().map(|c| format!("{:?}", c.map_families()[0])).collect());
        assert!(CapabilityId::ALL.iter().all(|c| c.map_families().iter().all(|f| MapFamily::ALL.contains(f))));
    }

    #[test]
    fn every_focus_names_a_list_of_processes_in_its_summary_schema() {
        for &capability in CapabilityId::ALL {
            let Some(focus) = capability.definition().focus else { continue };
            let list = summary_schema_node(capability, focus.list);
            assert_eq!(list["type"], "array", "{capability:?}: {} is {list}", focus.list);
            let pid = &list["items"]["properties"][focus.pid];
            assert!(pid["type"].to_string().contains("integer"), "{capability:?}: {} is {pid}", focus.pid);
        }
    }

    #[test]
    fn every_capability_has_a_catalog() {
        for capability in CapabilityId::ALL {
            assert!(!capability.catalog().is_empty(), "{capability:?}");
        }
    }
}

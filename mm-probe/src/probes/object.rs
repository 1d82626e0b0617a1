//! Loading the embedded eBPF object with this kernel's layout and a capability's settings.

use anyhow::{Context as _, Result};
use aya::{Ebpf, EbpfLoader};

use crate::kernel::{Kernel, layout::Layout};

/// The object mm-probe-ebpf builds, embedded at compile time.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mm-probe-ebpf"));

/// A capability's setting handed to its programs as a global (read-only once loaded).
#[derive(Clone, Copy, Debug)]
pub enum GlobalValue {
    U32(u32),
    U64(u64),
    /// A bitmap of 512 bits.
    Bits([u64; 8]),
}

/// The maps of one capability, known by the prefix its kernel side gives their names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapFamily {
    Invalidations,
    Latency,
    RetryStorm,
    Thp,
    Selftest,
    /// The invalidation-cause classifier's, shared by the capabilities that count invalidations.
    Cause,
}

impl MapFamily {
    pub const ALL: &'static [MapFamily] =
        &[Self::Invalidations, Self::Latency, Self::RetryStorm, Self::Thp, Self::Selftest, Self::Cause];

    fn prefix(self) -> &'static str {
        match self {
            Self::Invalidations => "INV_",
            Self::Latency => "LAT_",
            Self::RetryStorm => "HMM_",
            Self::Thp => "THP_",
            Self::Selftest => "SELFTEST_",
            Self::Cause => "CAUSE_",
        }
    }

    fn of(map_name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|family| map_name.starts_with(family.prefix()))
    }
}

/// Loads the object (creating its maps; programs load later, when the planner attaches them),
/// with struct offsets from this kernel's BTF and the given settings. Without BTF every offset is
/// unknown and the programs that need one stay silent; the plan says so.
///
/// Every map of the object is created, but only `families` are used: the others are created at
/// their smallest size, because preallocating tables and rings nobody reads was most of the
/// start-up time (about 70 of 110 ms on the host).
pub fn load_object(kernel: &Kernel, families: &[MapFamily], settings: &[(&'static str, GlobalValue)]) -> Result<Ebpf> {
    // EbpfLoader::new() parses the kernel's BTF for CO-RE relocations (Rust eBPF has none),
    // and mm-probe parses it again for struct offsets: the two parses (about 20 ms each on the
    // host) run side by side.
    let (mut loader, layout) = std::thread::scope(|scope| {
        let loader = scope.spawn(EbpfLoader::new);
        let layout = kernel.btf().map(|btf| Layout::resolve(&btf)).unwrap_or_else(|_| Layout::unknown());
        (loader.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), layout)
    });
    let offsets = layout.values();
    layout.apply(&mut loader, &offsets);
    for (name, value) in settings {
        match value {
            GlobalValue::U32(v) => loader.override_global(name, v, true),
            GlobalValue::U64(v) => loader.override_global(name, v, true),
            GlobalValue::Bits(v) => loader.override_global(name, v, true),
        };
    }
    let unused = unused_map_sizes(families)?;
    let shrunk = std::env::var(MAP_ENTRIES_ENV).map(|sizes| map_sizes(&sizes)).unwrap_or_default();
    for (name, entries) in unused.iter().chain(&shrunk) {
        loader.map_max_entries(name, *entries);
    }
    loader.load(OBJECT).context("loading mm-probe's eBPF object (creating its maps)")
}

/// Sets maps' sizes for this run, `NAME=ENTRIES,NAME=ENTRIES`: the end-to-end tests shrink a
/// table to fill it on purpose and see its loss counted and the figure built on it UNKNOWN.
pub const MAP_ENTRIES_ENV: &str = "MM_PROBE_MAP_ENTRIES";

/// `NAME=ENTRIES` pairs; a malformed pair is ignored (a test hook, not a user option).
fn map_sizes(text: &str) -> Vec<(String, u32)> {
    text.split(',')
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(name, entries)| Some((name.trim().to_string(), entries.trim().parse().ok()?)))
        .collect()
}

/// Fills a capability's `-p` map (tgid → 1), which its programs consult when filtering.
pub fn select_processes(ebpf: &mut Ebpf, map: &str, pids: &[u32]) -> Result<()> {
    let mut targets: aya::maps::HashMap<_, u32, u8> =
        aya::maps::HashMap::try_from(ebpf.map_mut(map).context("target map missing from the object")?)?;
    for pid in pids {
        targets.insert(pid, 1, 0).with_context(|| format!("watching process {pid}"))?;
    }
    Ok(())
}

/// The smallest size of every map outside `families`.
fn unused_map_sizes(families: &[MapFamily]) -> Result<Vec<(String, u32)>> {
    if MapFamily::ALL.iter().all(|f| families.contains(f)) {
        return Ok(Vec::new());
    }
    let object = aya_obj::Object::parse(OBJECT).context("reading the embedded eBPF object")?;
    Ok(object
        .maps
        .iter()
        .filter(|(name, _)| MapFamily::of(name).is_some_and(|family| !families.contains(&family)))
        .map(|(name, map)| (name.clone(), smallest_size(map.map_type())))
        .collect())
}

/// A ring buffer's size is bytes, a power-of-2 number of pages; every other map holds one entry.
fn smallest_size(map_type: u32) -> u32 {
    const BPF_MAP_TYPE_RINGBUF: u32 = 27;
    if map_type == BPF_MAP_TYPE_RINGBUF { page_size() } else { 1 }
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_sizes_for_a_test_are_name_entries_pairs() {
        assert_eq!(
            map_sizes("INV_INVALIDATIONS_0=1, INV_INVALIDATIONS_1=2"),
            [("INV_INVALIDATIONS_0".to_string(), 1), ("INV_INVALIDATIONS_1".to_string(), 2)]
        );
        assert!(map_sizes("").is_empty());
        assert!(map_sizes("INV_WAITS_0,INV_WAITS_1=x").is_empty());
    }

    #[test]
    fn every_map_of_the_object_belongs_to_a_family_or_is_a_global_section() {
        let object = aya_obj::Object::parse(OBJECT).unwrap();
        for name in object.maps.keys() {
            let global = name.starts_with('.') || name == "aya_global" || name.is_empty();
            assert!(global || MapFamily::of(name).is_some(), "map {name} has no family prefix: it would never shrink");
        }
    }

    /// Every hook of every catalog, with where it comes from: the capabilities' catalogs, every
    /// latency function slot, the self-tests.
    fn every_catalog_hook() -> Vec<(String, crate::probes::Hook)> {
        use crate::{capability::CapabilityId, latency, probes::LogicalProbe, selftest};
        let mut probes: Vec<(String, LogicalProbe)> = Vec::new();
        for capability in CapabilityId::ALL {
            probes.extend(capability.catalog().iter().map(|p| (capability.command().to_string(), *p)));
        }
        probes.extend(latency::probes::SCHED_PROBES.iter().map(|p| ("latency".to_string(), *p)));
        for slot in 0..mm_probe_common::latency::MAX_FUNCS {
            probes.push((format!("latency slot {slot}"), latency::probes::function_probe(slot, "any_function")));
        }
        probes.extend(selftest::PROBES.iter().map(|(_, p)| ("selftest".to_string(), *p)));
        probes.push(("selftest".to_string(), selftest::RING_PROBE));
        let mut hooks: Vec<(String, crate::probes::Hook)> = probes
            .iter()
            .flat_map(|(from, p)| {
                p.candidates.iter().flat_map(|c| c.hooks).map(move |h| (format!("{from}: {}", p.name), *h))
            })
            .collect();
        hooks.push(("selftest: bench-hooks".to_string(), selftest::NOOP_HOOK));
        hooks
    }

    #[test]
    fn every_program_a_catalog_names_is_in_the_object_with_its_mechanism() {
        use aya_obj::ProgramSection as Section;

        use crate::probes::Mechanism;
        let object = aya_obj::Object::parse(OBJECT).unwrap();
        let hooks = every_catalog_hook();
        assert!(hooks.len() > 40, "the catalogs were not all walked: {} hooks", hooks.len());
        for (from, hook) in hooks {
            let Some(program) = object.programs.get(hook.program) else {
                panic!("{from} names program {} that mm-probe's eBPF object does not have", hook.program);
            };
            let matches = match hook.mechanism {
                Mechanism::Fentry => matches!(program.section, Section::FEntry { .. }),
                Mechanism::Fexit => matches!(program.section, Section::FExit { .. }),
                Mechanism::Kprobe => matches!(program.section, Section::KProbe),
                Mechanism::Kretprobe => matches!(program.section, Section::KRetProbe),
                Mechanism::Tracepoint => matches!(program.section, Section::TracePoint),
                Mechanism::RawTracepoint => matches!(program.section, Section::RawTracePoint),
                Mechanism::BtfTracepoint => matches!(program.section, Section::BtfTracePoint),
            };
            assert!(
                matches,
                "{from}: program {} is a {:?} in the object, not a {}",
                hook.program,
                program.section,
                hook.mechanism.name()
            );
        }
    }

    #[test]
    fn only_other_families_shrink_and_rings_keep_a_page() {
        let sizes = unused_map_sizes(&[MapFamily::Latency]).unwrap();
        assert!(sizes.iter().all(|(name, _)| !name.starts_with("LAT_")), "{sizes:?}");
        let size_of = |wanted: &str| sizes.iter().find(|(name, _)| name == wanted).map(|(_, size)| *size);
        assert_eq!(size_of(mm_probe_common::thp::FAULTS_MAP), Some(1));
        assert_eq!(size_of(mm_probe_common::hmm::WALK_EVENTS_MAP), Some(page_size()));
        assert!(unused_map_sizes(MapFamily::ALL).unwrap().is_empty());
    }
}

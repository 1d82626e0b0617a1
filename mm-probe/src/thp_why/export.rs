//! thp-why's slice of `mm-probe exporter`: the allow-check alone, counting every mm, and on every
//! scrape its checks by verdict and, for denials, thp-why's reason code, judged against the
//! sysfs policy in force.

use std::{cell::OnceCell, collections::BTreeMap};

use anyhow::Result;
use aya::Ebpf;
use mm_probe_common::thp::{self as names, Counter};

use super::{
    checks::{AllowCheck, disable_bits},
    decoder::system_wide_outcome,
    live,
    probes::ALLOW_CHECK,
    reasons::DisableMode,
    sysfs::SystemPolicy,
};
use crate::{
    capability::CapabilityId,
    exporter::scrape::{Attached, Choice, Reader, Series, Slice, Snapshot, Source, catalog_programs},
    kernel::{Kernel, layout::ThpDisableBits},
    probes::GlobalValue,
};

/// How this kernel's allow-check names its caller and which mm->flags bits disable THP.
type ThpDecoding = (AllowCheck, ThpDisableBits);

/// thp-why as the exporter was asked for it.
pub fn slice(_choice: &Choice) -> Result<Box<dyn Slice>> {
    Ok(Box::new(ThpSlice { decoding: OnceCell::new() }))
}

/// The running kernel's allow-check and THP-disable bits, as thp-why decides them.
fn thp_allow_check(kernel: &Kernel) -> ThpDecoding {
    (AllowCheck::of(kernel), disable_bits(kernel))
}

struct ThpSlice {
    /// Decided once, for the settings and then for the source that decodes the keys.
    decoding: OnceCell<ThpDecoding>,
}

impl ThpSlice {
    fn decoding(&self, kernel: &Kernel) -> &ThpDecoding {
        self.decoding.get_or_init(|| thp_allow_check(kernel))
    }
}

impl Slice for ThpSlice {
    fn settings(&self, kernel: &Kernel) -> Vec<(&'static str, GlobalValue)> {
        let (allow_check, bits) = self.decoding(kernel);
        // No target process: the allow-check counts every mm (THP_EVERY_MM).
        let mut settings = live::settings(0, allow_check, DisableMode::mask(*bits));
        settings.push((names::EVERY_MM, GlobalValue::U32(1)));
        settings
    }

    fn attach(self: Box<Self>, kernel: &Kernel, ebpf: &mut Ebpf) -> Result<Source> {
        let (allow_check, bits) = self.decoding.into_inner().unwrap_or_else(|| thp_allow_check(kernel));
        // Only the allow-check: the faults, prctl and mmap_lock probes serve one target process.
        let probes = [ALLOW_CHECK];
        let plan = super::probes::attach_catalog(kernel, ebpf, &probes);
        let attached = Attached { capability: CapabilityId::Thp, plan, programs: catalog_programs(&probes) };
        let checks_seen = attached.plan.probes.iter().any(|p| p.attached());
        Ok(Source { attached, reader: Box::new(ThpReader { checks_seen, allow_check, bits }) })
    }
}

/// Reads the THP allow-check as attached, counting every mm, and decodes its keys.
struct ThpReader {
    /// The allow-check probe attached.
    checks_seen: bool,
    allow_check: AllowCheck,
    bits: ThpDisableBits,
}

impl Reader for ThpReader {
    fn read(&self, ebpf: &Ebpf, snapshot: &mut Snapshot) -> Result<()> {
        let name = CapabilityId::Thp.name();
        let counts = live::read_counts(ebpf)?;
        snapshot.lost_events.extend([
            // A kretprobe run without its entry: that check is not counted.
            Series::new(
                &[("capability", name), ("kind", "allow_check_entries")],
                counts.counter(Counter::ReturnWithoutEntry),
            ),
        ]);
        snapshot.map_update_failures.push(Series::new(
            &[("capability", name), ("map", names::CHECKS_MAP)],
            counts.counter(Counter::CheckMapFull),
        ));
        if !self.checks_seen {
            return Ok(());
        }
        // The sysfs policy is read now: a refusal is judged against the policy in force.
        let policy = SystemPolicy::read();
        let mut tally: BTreeMap<(&str, &str), u64> = BTreeMap::new();
        for (key, count) in &counts.checks {
            let (allowed, reason) = system_wide_outcome(&self.allow_check, self.bits, &policy, key);
            *tally.entry((if allowed { "allowed" } else { "denied" }, reason)).or_default() += count;
        }
        snapshot.thp_checks = tally
            .into_iter()
            .map(|((verdict, reason), n)| Series::new(&[("verdict", verdict), ("reason", reason)], n))
            .collect();
        Ok(())
    }
}

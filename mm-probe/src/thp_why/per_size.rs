//! Per-size THP (mTHP, 6.8+): for each size the kernel offers, which of the target's regions the
//! policy lets use it, and how the size's fault counters moved during the run (6.10+).

use std::collections::BTreeMap;

use super::{
    inputs::Inputs,
    reasons::DisableMode,
    report::{SizeFacts, VmaClass, VmaEntry},
    sysfs::{GlobalMode, SizeControl, SizeMode},
};

pub fn judge(input: &Inputs, vmas: &[VmaEntry]) -> Vec<SizeFacts> {
    let mode = input.disable.mode.unwrap_or(DisableMode::None);
    input
        .policy
        .sizes
        .iter()
        .filter_map(|size| {
            let enabled = size.enabled?;
            let effective = effective(enabled, input.policy.enabled);
            let usable: Vec<&VmaEntry> = vmas.iter().filter(|v| may_use(v, size.size_bytes, effective, mode)).collect();
            Some(SizeFacts {
                size_bytes: size.size_bytes,
                enabled: Some(enabled),
                effective,
                regions: usable.len(),
                bytes: usable.iter().map(|v| v.size_bytes).sum(),
                stats_delta: stats_delta(
                    input.policy_start.sizes.iter().find(|s| s.size_bytes == size.size_bytes),
                    size,
                ),
            })
        })
        .collect()
}

/// A per-size mode with `inherit` resolved against the global `enabled`.
fn effective(enabled: SizeMode, global: Option<GlobalMode>) -> &'static str {
    match (enabled, global) {
        (SizeMode::Always, _) | (SizeMode::Inherit, Some(GlobalMode::Always)) => "always",
        (SizeMode::Madvise, _) | (SizeMode::Inherit, Some(GlobalMode::Madvise)) => "madvise",
        _ => "never",
    }
}

/// Whether an anonymous region may get folios of `size`: the policy (madvise needs the region's
/// MADV_HUGEPAGE), the region's own MADV_NOHUGEPAGE, the process's prctl mode (except-advised
/// keeps only madvised regions), and room for one naturally aligned block.
fn may_use(v: &VmaEntry, size: u64, effective: &str, mode: DisableMode) -> bool {
    let policy = match effective {
        "always" => true,
        "madvise" => v.hg,
        _ => false,
    };
    let process = match mode {
        DisableMode::None => true,
        DisableMode::ExceptAdvised => v.hg,
        DisableMode::Completely => false,
    };
    let end = v.start_addr + v.size_bytes;
    let aligned_start = v.start_addr.div_ceil(size) * size;
    v.kind == VmaClass::Anon && !v.nh && policy && process && aligned_start + size <= end
}

/// End minus start of every counter both readings have; `None` where the kernel has no stats.
fn stats_delta(start: Option<&SizeControl>, end: &SizeControl) -> Option<BTreeMap<String, i64>> {
    let start = start?;
    if end.stats.is_empty() {
        return None;
    }
    Some(
        end.stats
            .iter()
            .filter_map(|(name, &value)| Some((name.clone(), value as i64 - *start.stats.get(name)? as i64)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thp_why::judge::{
        build,
        tests::{inputs_with, smaps_entry},
    };

    /// Under enabled=madvise with 64K at `always` and 2M inheriting: a plain 1 MiB region may use
    /// 64K only; a madvised 4 MiB one both; a NOHUGEPAGE one neither.
    #[test]
    fn each_size_lists_the_regions_its_policy_allows() {
        let smaps = [
            smaps_entry(0x7f00_0000_0000, 1024, 1024, 0, ""),
            smaps_entry(0x7f00_0040_0000, 4096, 4096, 0, "hg"),
            smaps_entry(0x7f00_0100_0000, 4096, 4096, 0, "nh"),
        ]
        .concat();
        let mut input = inputs_with(&smaps, DisableMode::None, "6.12.0", "always [madvise] never");
        for size in &mut input.policy.sizes {
            size.enabled = Some(if size.size_bytes == 64 << 10 { SizeMode::Always } else { SizeMode::Inherit });
        }
        let sizes = build(input).sizes;
        let of = |bytes: u64| sizes.iter().find(|s| s.size_bytes == bytes).unwrap();
        assert_eq!((of(64 << 10).effective, of(64 << 10).regions), ("always", 2));
        assert_eq!((of(2 << 20).effective, of(2 << 20).regions, of(2 << 20).bytes), ("madvise", 1, 4 << 20));
        assert!(of(2 << 20).stats_delta.is_none(), "the sample tree has no stats/");
    }
}

//! Steal time, as /proc/stat counts it per CPU: the time a virtual machine's vCPU was ready but
//! the hypervisor ran something else (the 8th value of each `cpuN` line, in USER_HZ ticks). It
//! is counted where the kernel reads a paravirt steal clock (KVM, Xen, Hyper-V guests), whether
//! or not the scheduler also leaves it out of tasks' run time; elsewhere it stays 0. Only a
//! count above 0 is evidence: a zero may mean no steal clock.

use std::collections::BTreeMap;

/// Steal time so far per CPU, in ns; `None` when /proc/stat cannot be read.
pub fn read() -> Option<BTreeMap<u32, u64>> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_s > 0).then(|| parse(&text, 1_000_000_000 / ticks_per_s as u64))
}

/// Each `cpuN` line's steal, converted with `ns_per_tick`.
pub fn parse(stat: &str, ns_per_tick: u64) -> BTreeMap<u32, u64> {
    stat.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let cpu = fields.next()?.strip_prefix("cpu")?.parse().ok()?;
            let steal: u64 = fields.nth(7)?.parse().ok()?;
            Some((cpu, steal * ns_per_tick))
        })
        .collect()
}

/// The steal of each CPU between two readings, CPUs with none left out.
pub fn since(now: &BTreeMap<u32, u64>, before: &BTreeMap<u32, u64>) -> BTreeMap<u32, u64> {
    now.iter()
        .map(|(cpu, ns)| (*cpu, ns.saturating_sub(before.get(cpu).copied().unwrap_or(0))))
        .filter(|(_, ns)| *ns > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cpus_steal_is_its_eighth_value() {
        let stat = "cpu  23687 23777 5326 22498 646 0 74 316 0 0\n\
                    cpu0 10827 11950 2239 12862 102 0 17 156 0 0\n\
                    cpu1 12860 11826 3086 9635 544 0 57 160 0 0\n\
                    intr 123 4 5\n";
        let steal = parse(stat, 10_000_000);
        assert_eq!(steal, BTreeMap::from([(0, 1_560_000_000), (1, 1_600_000_000)]), "the all-CPU line is left out");
        let later = BTreeMap::from([(0, 1_560_000_000), (1, 1_800_000_000)]);
        assert_eq!(since(&later, &steal), BTreeMap::from([(1, 200_000_000)]));
    }
}

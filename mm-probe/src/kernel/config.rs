//! The running kernel's build options, from /proc/config.gz (CONFIG_IKCONFIG_PROC) or the
//! distribution's /boot/config-<release>. Read only for facts no interface exposes at run time.

use std::io::Read as _;

/// The options text; `None` when neither file is readable.
pub struct KernelConfig(String);

impl KernelConfig {
    pub fn running(release: &str) -> Option<Self> {
        let from_proc = std::fs::File::open("/proc/config.gz").ok().and_then(|file| {
            let mut text = String::new();
            flate2::read::GzDecoder::new(file).read_to_string(&mut text).ok().map(|_| text)
        });
        from_proc.or_else(|| std::fs::read_to_string(format!("/boot/config-{release}")).ok()).map(Self)
    }

    #[cfg(test)]
    fn from_text(text: &str) -> Self {
        Self(text.to_owned())
    }

    /// `CONFIG_<name>=y` (built in); `=m` and unset are not.
    pub fn is_set(&self, name: &str) -> bool {
        let wanted = format!("CONFIG_{name}=y");
        self.0.lines().any(|line| line.trim() == wanted)
    }

    /// Whether the scheduler's run time (se.sum_exec_runtime) can differ from time on the CPU:
    /// only where rq->clock_task leaves out steal (paravirt time accounting) or interrupts (IRQ
    /// time accounting). Without either the kernel charges time on the CPU as run time, so a
    /// difference read there is not steal (seen in the emulated Debian 6.1 guest, which sets
    /// neither: 1.7 ms stays in the madvise walk read as 60 µs of run time; cause not found).
    pub fn charges_less_than_wall_time(&self) -> bool {
        self.is_set("PARAVIRT_TIME_ACCOUNTING") || self.is_set("IRQ_TIME_ACCOUNTING")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_built_in_accounting_options_count() {
        let debian = KernelConfig::from_text(
            "# CONFIG_IRQ_TIME_ACCOUNTING is not set\n# CONFIG_PARAVIRT_TIME_ACCOUNTING is not set\n",
        );
        assert!(!debian.charges_less_than_wall_time());
        let cloud = KernelConfig::from_text("CONFIG_PARAVIRT_TIME_ACCOUNTING=y\nCONFIG_HAVE_IRQ_TIME_ACCOUNTING=y\n");
        assert!(cloud.charges_less_than_wall_time());
        assert!(!cloud.is_set("IRQ_TIME_ACCOUNTING"), "HAVE_IRQ_TIME_ACCOUNTING is another option");
    }
}

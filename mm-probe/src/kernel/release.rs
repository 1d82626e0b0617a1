//! The running kernel's release string and version numbers.

use std::fmt;

use anyhow::{Context as _, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// As `uname -r` prints it, e.g. `6.12.117+deb12-rt-amd64`.
    pub text: String,
    pub major: u32,
    pub minor: u32,
    pub preempt_rt: bool,
}

impl Release {
    pub fn running() -> Result<Self> {
        let text =
            std::fs::read_to_string("/proc/sys/kernel/osrelease").context("reading /proc/sys/kernel/osrelease")?;
        let version = std::fs::read_to_string("/proc/version").unwrap_or_default();
        Ok(Self::parse(text.trim(), &version))
    }

    /// Parses a release such as `6.1.0-57-rt-amd64`; `version` is /proc/version, whose
    /// `PREEMPT_RT` word says whether this is a real-time kernel.
    pub fn parse(text: &str, version: &str) -> Self {
        let mut numbers = text.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty());
        let major = numbers.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let minor = numbers.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let preempt_rt = version.contains("PREEMPT_RT") || text.contains("-rt-");
        Self { text: text.to_string(), major, minor, preempt_rt }
    }

    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.text, if self.preempt_rt { " (PREEMPT_RT)" } else { "" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debian_and_rt_releases() {
        let r = Release::parse("6.1.0-57-rt-amd64", "Linux version ... SMP PREEMPT_RT Debian");
        assert_eq!((r.major, r.minor, r.preempt_rt), (6, 1, true));
        let r = Release::parse("6.12.117+deb12-amd64", "Linux version ... SMP PREEMPT_DYNAMIC");
        assert_eq!((r.major, r.minor, r.preempt_rt), (6, 12, false));
        assert!(r.at_least(6, 8) && !r.at_least(6, 13));
    }

    #[test]
    fn garbage_release_is_version_zero() {
        let r = Release::parse("weird", "");
        assert_eq!((r.major, r.minor), (0, 0));
    }
}

//! Decoding the kernel's [`HmmEvent`] records into typed walks, invalidations and notifier
//! removals.

use mm_probe_common::hmm::{EventKind, HmmEvent};
use serde::Serialize;

/// -EBUSY as hmm_range_fault() returns it.
pub const EBUSY: i32 = -16;

/// `enum mmu_notifier_event` (include/linux/mmu_notifier.h): the same values in every kernel
/// from 5.15 to 6.18 (docs/kernel-facts.md#mmu-notifier-events).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum NotifierEvent {
    #[serde(rename = "UNMAP")]
    Unmap,
    #[serde(rename = "CLEAR")]
    Clear,
    #[serde(rename = "PROTECTION_VMA")]
    ProtectionVma,
    #[serde(rename = "PROTECTION_PAGE")]
    ProtectionPage,
    #[serde(rename = "SOFT_DIRTY")]
    SoftDirty,
    #[serde(rename = "RELEASE")]
    Release,
    #[serde(rename = "MIGRATE")]
    Migrate,
    #[serde(rename = "EXCLUSIVE")]
    Exclusive,
    #[serde(rename = "UNKNOWN")]
    Unknown,
}

impl NotifierEvent {
    pub fn from_raw(value: i32) -> Self {
        match value {
            0 => Self::Unmap,
            1 => Self::Clear,
            2 => Self::ProtectionVma,
            3 => Self::ProtectionPage,
            4 => Self::SoftDirty,
            5 => Self::Release,
            6 => Self::Migrate,
            7 => Self::Exclusive,
            _ => Self::Unknown,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Unmap => "UNMAP",
            Self::Clear => "CLEAR",
            Self::ProtectionVma => "PROTECTION_VMA",
            Self::ProtectionPage => "PROTECTION_PAGE",
            Self::SoftDirty => "SOFT_DIRTY",
            Self::Release => "RELEASE",
            Self::Migrate => "MIGRATE",
            Self::Exclusive => "EXCLUSIVE",
            Self::Unknown => "UNKNOWN",
        }
    }
}

/// One hmm_range_fault() call.
#[derive(Clone, Debug, PartialEq)]
pub struct Walk {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub entry_ns: u64,
    pub exit_ns: u64,
    /// `None` when the entry was not seen (the return probe found no stash).
    pub duration_ns: Option<u64>,
    /// This thread's mmu_interval_read_begin() on the same notifier before the walk.
    pub seq_begin_ns: Option<u64>,
    pub ret: i32,
    pub notifier: u64,
    pub mm: u64,
    /// Walked range [start, end).
    pub start: u64,
    pub end: u64,
    /// The notifier's interval [start, last] (inclusive), when BTF gave its offsets.
    pub interval: Option<(u64, u64)>,
}

impl Walk {
    pub fn busy(&self) -> bool {
        self.ret == EBUSY
    }

    pub fn bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// When an invalidation could start failing this walk: from its read_begin (the sequence
    /// it checks was read there), else from its entry.
    pub fn window_start_ns(&self) -> u64 {
        self.seq_begin_ns.unwrap_or(self.entry_ns)
    }
}

/// One __mmu_notifier_invalidate_range_start() on a mirrored mm.
#[derive(Clone, Debug, PartialEq)]
pub struct Invalidation {
    pub pid: u32,
    pub tgid: u32,
    pub comm: String,
    pub ts_ns: u64,
    pub mm: u64,
    /// Invalidated range [start, end).
    pub start: u64,
    pub end: u64,
    pub event: NotifierEvent,
}

impl Invalidation {
    pub fn bytes(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// A driver removed an interval notifier.
#[derive(Clone, Debug, PartialEq)]
pub struct NotifierRemove {
    pub ts_ns: u64,
    pub notifier: u64,
    pub mm: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Walk(Walk),
    Invalidate(Invalidation),
    NotifierRemove(NotifierRemove),
}

/// Turns one raw record into an event; `None` for an unknown kind (a build mismatch).
pub fn decode(raw: &HmmEvent) -> Option<Event> {
    let comm = comm_string(&raw.comm);
    match EventKind::from_u32(raw.kind)? {
        EventKind::Walk => Some(Event::Walk(Walk {
            pid: raw.pid,
            tgid: raw.tgid,
            comm,
            entry_ns: raw.ts_ns,
            exit_ns: raw.ts_ns + raw.duration_ns,
            duration_ns: (raw.duration_ns != 0).then_some(raw.duration_ns),
            seq_begin_ns: (raw.seq_begin_ns != 0).then_some(raw.seq_begin_ns),
            ret: raw.code,
            notifier: raw.notifier,
            mm: raw.mm,
            start: raw.start,
            end: raw.end,
            interval: (raw.interval_last != 0).then_some((raw.interval_start, raw.interval_last)),
        })),
        EventKind::Invalidate => Some(Event::Invalidate(Invalidation {
            pid: raw.pid,
            tgid: raw.tgid,
            comm,
            ts_ns: raw.ts_ns,
            mm: raw.mm,
            start: raw.start,
            end: raw.end,
            event: NotifierEvent::from_raw(raw.code),
        })),
        EventKind::NotifierRemove => {
            Some(Event::NotifierRemove(NotifierRemove { ts_ns: raw.ts_ns, notifier: raw.notifier, mm: raw.mm }))
        }
    }
}

fn comm_string(comm: &[u8; 16]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: EventKind) -> HmmEvent {
        let mut comm = [0u8; 16];
        comm[..10].copy_from_slice(b"madv-storm");
        HmmEvent {
            kind: kind as u32,
            pid: 11,
            tgid: 10,
            code: 0,
            ts_ns: 1_000,
            duration_ns: 500,
            seq_begin_ns: 900,
            notifier: 0xffff_8880_0000_1000,
            mm: 0xffff_8880_0000_2000,
            start: 0x7f00_0000_0000,
            end: 0x7f00_0020_0000,
            interval_start: 0x7f00_0000_0000,
            interval_last: 0x7f00_03ff_ffff,
            comm,
        }
    }

    #[test]
    fn decodes_a_busy_walk() {
        let mut r = raw(EventKind::Walk);
        r.code = EBUSY;
        let Some(Event::Walk(w)) = decode(&r) else { panic!("not a walk") };
        assert!(w.busy());
        assert_eq!((w.entry_ns, w.exit_ns, w.duration_ns), (1_000, 1_500, Some(500)));
        assert_eq!(w.window_start_ns(), 900);
        assert_eq!(w.bytes(), 2 << 20);
        assert_eq!(w.interval, Some((0x7f00_0000_0000, 0x7f00_03ff_ffff)));
        assert_eq!(w.comm, "madv-storm");
    }

    #[test]
    fn decodes_an_invalidation_event_name() {
        let mut r = raw(EventKind::Invalidate);
        r.code = 1;
        let Some(Event::Invalidate(i)) = decode(&r) else { panic!("not an invalidation") };
        assert_eq!(i.event, NotifierEvent::Clear);
        assert_eq!(NotifierEvent::from_raw(42), NotifierEvent::Unknown);
    }

    #[test]
    fn unknown_kind_is_rejected() {
        let mut r = raw(EventKind::Walk);
        r.kind = 99;
        assert!(decode(&r).is_none());
    }
}

//! Unit tests of decoding, chain joining and overlap judging.

mod records {
    use super::super::*;

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
            seq: 6,
            seq_state: SeqState::StaleRetry as u32,
            begin_overtaken: 0,
            cause: mm_probe_common::cause::Cause::default(),
            comm,
        }
    }

    #[test]
    fn decodes_a_busy_walk() {
        let mut r = raw(EventKind::Walk);
        r.code = -EBUSY;
        let Some(Event::Walk(w)) = decode(&r, &Namer::default()) else { panic!("not a walk") };
        assert!(w.busy());
        assert_eq!((w.entry_ns, w.exit_ns, w.duration_ns), (1_000, 1_500, Some(500)));
        assert_eq!(w.window_start_ns(), 900);
        assert_eq!(w.bytes(), 2 << 20);
        assert_eq!(w.interval, Some((0x7f00_0000_0000, 0x7f00_03ff_ffff)));
        assert_eq!(w.comm, "madv-storm");
        assert_eq!((w.seq, w.stale_retry), (Some(6), true));
    }

    #[test]
    fn a_sequence_not_read_is_no_claim_either_way() {
        let mut r = raw(EventKind::Walk);
        r.seq_state = SeqState::Unread as u32;
        let Some(Event::Walk(w)) = decode(&r, &Namer::default()) else { panic!("not a walk") };
        assert_eq!((w.seq, w.stale_retry), (None, false));
        r.seq_state = SeqState::Current as u32;
        let Some(Event::Walk(w)) = decode(&r, &Namer::default()) else { panic!("not a walk") };
        assert_eq!((w.seq, w.stale_retry), (Some(6), false));
    }

    #[test]
    fn decodes_an_invalidation_event_name() {
        let mut r = raw(EventKind::Invalidate);
        r.code = 1;
        let Some(Event::Invalidate(i)) = decode(&r, &Namer::default()) else { panic!("not an invalidation") };
        assert_eq!(i.event, NotifierEvent::Clear);
        assert_eq!(i.cause.class, "unknown", "a class the kernel left undecided is named so");
        assert_eq!(NotifierEvent::from_raw(42), NotifierEvent::Unknown);
        assert_eq!(NotifierEvent::from_raw(-1), NotifierEvent::Unknown);
        assert_eq!(NotifierEvent::from_raw(7), NotifierEvent::Exclusive);
    }

    #[test]
    fn unknown_kind_is_rejected() {
        let mut r = raw(EventKind::Walk);
        r.kind = 99;
        assert!(decode(&r, &Namer::default()).is_none());
    }
}

mod chains {
    use super::super::*;
    use mm_probe_common::hmm::EBUSY;

    const MS: u64 = 1_000_000;

    fn walk(tgid: u32, notifier: u64, begin_ms: u64, exit_ms: u64, ret: i32) -> Walk {
        Walk {
            pid: tgid,
            tgid,
            comm: "gpu".into(),
            entry_ns: begin_ms * MS + 1,
            exit_ns: exit_ms * MS,
            duration_ns: Some(exit_ms * MS - begin_ms * MS - 1),
            seq_begin_ns: Some(begin_ms * MS),
            ret,
            notifier,
            mm: 1,
            start: 0,
            end: 2 << 20,
            interval: None,
            seq: None,
            stale_retry: false,
            begin_overtaken: false,
        }
    }

    #[test]
    fn busy_walks_then_success_make_one_chain() {
        let mut j = ChainJoiner::new(1000 * MS);
        assert!(j.walk(&walk(1, 0xa, 0, 10, -EBUSY)).is_none());
        assert!(j.walk(&walk(1, 0xa, 10, 20, -EBUSY)).is_none());
        let chain = j.walk(&walk(1, 0xa, 20, 30, 0)).expect("success ends the chain");
        assert_eq!(chain.end, ChainEnd::Success);
        assert_eq!((chain.walks, chain.busy_walks), (3, 2));
        assert_eq!(chain.first_ns, 0);
        assert_eq!(chain.duration_ns(), 30 * MS);
        assert_eq!(chain.failed_walk_ns, 2 * (10 * MS - 1));
        assert_eq!(j.open_chains(), 0);
    }

    #[test]
    fn chains_are_per_process_and_notifier() {
        let mut j = ChainJoiner::new(1000 * MS);
        j.walk(&walk(1, 0xa, 0, 10, -EBUSY));
        j.walk(&walk(2, 0xa, 0, 10, -EBUSY));
        j.walk(&walk(1, 0xb, 0, 10, -EBUSY));
        assert_eq!(j.open_chains(), 3);
        let chain = j.walk(&walk(2, 0xa, 10, 20, 0)).unwrap();
        assert_eq!((chain.tgid, chain.notifier, chain.walks), (2, 0xa, 2));
        assert_eq!(j.open_chains(), 2);
    }

    #[test]
    fn a_busy_walk_past_the_timeout_ends_the_chain_as_timed_out() {
        let mut j = ChainJoiner::new(1000 * MS);
        assert!(j.walk(&walk(1, 0xa, 0, 600, -EBUSY)).is_none());
        let chain = j.walk(&walk(1, 0xa, 600, 1000, -EBUSY)).expect("timeout ends it");
        assert_eq!(chain.end, ChainEnd::TimedOut);
        assert!(chain.end.is_timeout());
        // The driver's next call starts a fresh chain.
        assert!(j.walk(&walk(1, 0xa, 1001, 1002, -EBUSY)).is_none());
        assert_eq!(j.open_chains(), 1);
    }

    #[test]
    fn removing_the_notifier_of_a_failing_chain_means_it_gave_up() {
        let mut j = ChainJoiner::new(1000 * MS);
        j.walk(&walk(1, 0xa, 0, 999, -EBUSY));
        j.walk(&walk(1, 0xb, 0, 5, -EBUSY));
        let ended = j.notifier_removed(0xa);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].end, ChainEnd::GaveUp);
        assert!(ended[0].end.is_timeout());
        assert!(j.notifier_removed(0xa).is_empty());
        assert_eq!(j.open_chains(), 1);
    }

    #[test]
    fn a_hard_error_ends_the_chain_and_is_not_a_timeout() {
        let mut j = ChainJoiner::new(1000 * MS);
        let chain = j.walk(&walk(1, 0xa, 0, 1, -14)).unwrap();
        assert_eq!(chain.end, ChainEnd::Error(-14));
        assert!(!chain.end.is_timeout());
    }

    #[test]
    fn finishing_leaves_open_chains_unfinished_not_timed_out() {
        let mut j = ChainJoiner::new(1000 * MS);
        j.walk(&walk(1, 0xa, 0, 10, -EBUSY));
        j.walk(&walk(1, 0xb, 0, 999, -EBUSY));
        let ended = j.finish();
        assert_eq!(ended.len(), 2);
        assert!(ended.iter().all(|c| c.end == ChainEnd::Unfinished && !c.end.is_timeout()));
        assert_eq!(j.open_chains(), 0);
    }

    #[test]
    fn a_loop_counts_the_stale_retries_the_kernel_marked() {
        let mut j = ChainJoiner::new(1000 * MS);
        j.walk(&walk(1, 0xa, 0, 10, -EBUSY));
        for at in 10..13 {
            let mut retry = walk(1, 0xa, at, at + 1, -EBUSY);
            retry.stale_retry = true;
            j.walk(&retry);
        }
        let chain = j.walk(&walk(1, 0xa, 13, 14, 0)).unwrap();
        assert_eq!((chain.walks, chain.busy_walks, chain.stale_retries), (5, 4, 3));
    }

    #[test]
    fn a_walk_without_read_begin_starts_its_chain_at_entry() {
        let mut j = ChainJoiner::new(1000 * MS);
        let mut w = walk(1, 0xa, 5, 10, 0);
        w.seq_begin_ns = None;
        let chain = j.walk(&w).unwrap();
        assert_eq!(chain.first_ns, 5 * MS + 1);
    }
}

mod overlaps {
    use super::super::*;
    use mm_probe_common::hmm::{EBUSY, NotifierEvent};

    const MIB: u64 = 1 << 20;

    fn walk(start: u64, end: u64, window: (u64, u64), ret: i32) -> Walk {
        Walk {
            pid: 1,
            tgid: 1,
            comm: "gpu".into(),
            entry_ns: window.0 + 1,
            exit_ns: window.1,
            duration_ns: Some(window.1 - window.0 - 1),
            seq_begin_ns: Some(window.0),
            ret,
            notifier: 0xa,
            mm: 7,
            start,
            end,
            interval: Some((0, 64 * MIB - 1)),
            seq: None,
            stale_retry: false,
            begin_overtaken: false,
        }
    }

    fn inv(ts: u64, start: u64, end: u64) -> Invalidation {
        Invalidation {
            pid: 2,
            tgid: 1,
            comm: "madv-storm".into(),
            ts_ns: ts,
            mm: 7,
            start,
            end,
            event: NotifierEvent::Clear,
            cause: CauseName { class: "syscall", detail: Some("madvise(MADV_DONTNEED)".into()) },
        }
    }

    fn kswapd(ts: u64, start: u64, end: u64) -> Invalidation {
        Invalidation {
            comm: "kswapd0".into(),
            cause: CauseName { class: "kswapd", detail: None },
            ..inv(ts, start, end)
        }
    }

    #[test]
    fn an_invalidation_of_the_walked_range_is_a_true_conflict() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(150, MIB, MIB + 65536));
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.failures.len(), 1);
        assert_eq!(s.failures[0].why, BusyCause::TrueConflict);
        assert_eq!(s.failures[0].collided_with.as_ref().map(|c| c.class), Some("syscall"));
        let done = j.finish();
        assert!(done.invalidations[0].1.walked_range);
    }

    #[test]
    fn a_failed_walk_is_blamed_on_the_first_invalidation_of_its_range_not_on_false_sharing() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(120, 40 * MIB, 40 * MIB + 4096)); // the interval only
        j.add_invalidation(kswapd(150, MIB, MIB + 4096)); // the range: the collision
        j.add_invalidation(inv(160, 0, 4096)); // the range again, later
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.failures[0].why, BusyCause::TrueConflict);
        assert_eq!(s.failures[0].collided_with.as_ref().map(|c| c.class), Some("kswapd"));
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(kswapd(120, 40 * MIB, 40 * MIB + 4096));
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.failures[0].why, BusyCause::FalseSharing);
        assert_eq!(s.failures[0].collided_with.as_ref().map(|c| c.class), Some("kswapd"));
    }

    #[test]
    fn a_stale_sequence_retry_blames_no_invalidation() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(150, MIB, MIB + 65536));
        let mut retry = walk(0, 2 * MIB, (100, 300), -EBUSY);
        retry.stale_retry = true;
        j.add_walk(retry);
        let s = j.settle(1_000);
        assert_eq!(s.failures[0].why, BusyCause::StaleSequence);
        assert_eq!(s.failures[0].collided_with, None);
        let done = j.finish();
        assert_eq!(done.invalidations[0].1, InvalidationOverlap::default(), "its loop's first failure answers for it");
    }

    #[test]
    fn an_invalidation_elsewhere_in_the_notifier_is_false_sharing() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(150, 40 * MIB, 40 * MIB + 65536));
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.failures[0].why, BusyCause::FalseSharing);
        let done = j.finish();
        assert!(done.invalidations[0].1.interval_only && !done.invalidations[0].1.walked_range);
    }

    #[test]
    fn invalidations_outside_the_window_or_mm_explain_nothing() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(50, 0, MIB)); // before read_begin
        j.add_invalidation(inv(250, 0, MIB)); // after the walk returned
        let mut other_mm = inv(150, 0, MIB);
        other_mm.mm = 8;
        j.add_invalidation(other_mm);
        j.add_invalidation(inv(160, 100 * MIB, 101 * MIB)); // outside the interval
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        let s = j.settle(1_000);
        assert_eq!(s.failures[0].why, BusyCause::Unexplained);
        assert_eq!(s.failures[0].collided_with, None);
        let done = j.finish();
        let outside: Vec<_> = done.invalidations.iter().filter(|(_, o)| o.outside).collect();
        assert_eq!(outside.len(), 1);
        assert_eq!(outside[0].0.start, 100 * MIB);
    }

    /// ksmd write-protects one page at a time: its invalidation can begin just before a walk's
    /// read_begin and reach the notifier just after, failing the walk from outside its window.
    #[test]
    fn an_invalidation_that_overtook_read_begin_is_blamed_only_when_read_begin_saw_it() {
        let judged = |overtaken: bool, earlier: Vec<Invalidation>| {
            let mut j = OverlapJoiner::new(10, 1_000);
            earlier.into_iter().for_each(|i| j.add_invalidation(i));
            let mut w = walk(0, 2 * MIB, (100, 200), -EBUSY);
            w.begin_overtaken = overtaken;
            j.add_walk(w);
            let failure = j.settle(1_000).failures.remove(0);
            (failure.why, failure.collided_with.map(|c| c.class))
        };
        let ksmd = |ts| Invalidation {
            comm: "ksmd".into(),
            cause: CauseName { class: "kernel_thread", detail: Some("ksmd".into()) },
            ..inv(ts, MIB, MIB + 4096)
        };
        // The latest of the range's before the window; an older one, and one elsewhere, are not it.
        let before = vec![kswapd(60, MIB, MIB + 4096), ksmd(90), inv(95, 100 * MIB, 101 * MIB)];
        assert_eq!(judged(true, before.clone()), (BusyCause::TrueConflict, Some("kernel_thread")));
        assert_eq!(judged(false, before), (BusyCause::Unexplained, None), "read_begin waited for it");
        assert_eq!(
            judged(true, vec![kswapd(90, 40 * MIB, 40 * MIB + 4096)]),
            (BusyCause::FalseSharing, Some("kswapd"))
        );
        let mut other_mm = ksmd(90);
        other_mm.mm = 8;
        assert_eq!(judged(true, vec![other_mm]), (BusyCause::Unexplained, None));
    }

    #[test]
    fn walks_wait_until_settled_and_late_invalidations_still_count() {
        let mut j = OverlapJoiner::new(100, 10_000);
        j.add_walk(walk(0, 2 * MIB, (100, 200), -EBUSY));
        assert!(j.settle(250).failures.is_empty(), "not settled yet");
        // Arrives after the walk (other ring), started inside its window.
        j.add_invalidation(inv(180, 0, 4096));
        let s = j.settle(400);
        assert_eq!(s.failures[0].why, BusyCause::TrueConflict);
    }

    #[test]
    fn a_walk_in_flight_longer_than_the_retention_keeps_its_windows_invalidations() {
        let mut j = OverlapJoiner::new(100, 1_000);
        j.add_invalidation(inv(150, 0, 4096));
        // The walk entered at 100 and has not returned by 5_000: its collision must stay.
        j.walks_in_flight_since(Some(100));
        assert!(j.settle(5_000).invalidations.is_empty(), "kept for the walk in flight");
        j.add_walk(walk(0, 2 * MIB, (100, 5_000), -EBUSY));
        j.walks_in_flight_since(None);
        let s = j.settle(6_000);
        assert_eq!(s.failures[0].why, BusyCause::TrueConflict);
        assert_eq!(s.invalidations.len(), 1, "released once no walk can need it");
    }

    #[test]
    fn successful_walks_mark_overlaps_but_have_no_cause() {
        let mut j = OverlapJoiner::new(10, 1_000);
        j.add_invalidation(inv(150, 40 * MIB, 40 * MIB + 4096));
        j.add_walk(walk(0, 2 * MIB, (100, 200), 0));
        let s = j.settle(1_000);
        assert!(s.failures.is_empty());
        assert_eq!(s.other_walks.len(), 1);
    }

    #[test]
    fn empty_joiner_settles_to_nothing() {
        let mut j = OverlapJoiner::new(10, 1_000);
        let s = j.finish();
        assert!(s.failures.is_empty() && s.invalidations.is_empty());
    }
}

use super::*;
use crate::thp_why::{
    checks::{ALLOWABLE_ORDERS_ORDER, ALLOWABLE_ORDERS_TVA_TYPE_ORDER, HUGEPAGE_VMA_CHECK_ORDER},
    facts::classify,
    procfs::{Vma, parse_smaps},
    sysfs::tests::sample_tree,
};

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;

fn anon(start: u64, size: u64, flags: &[&str]) -> VmaFacts {
    VmaFacts {
        start,
        end: start + size,
        pgoff: 0,
        kind: VmaKind::Anonymous,
        vm_hugepage: flags.contains(&"hg"),
        vm_nohugepage: flags.contains(&"nh"),
        special_flags: Vec::new(),
        has_anon_vma: true,
    }
}

fn policy(enabled: &str) -> SystemPolicy {
    let tree = sample_tree(enabled, "always [inherit] madvise never", "always inherit madvise [never]");
    SystemPolicy::read_from(tree.path())
}

/// A kernel before per-size controls (6.1): only `enabled`.
fn policy_6_1(enabled: &str) -> SystemPolicy {
    let tree = crate::thp_why::sysfs::tests::tempdir::TempTree::new();
    tree.write("enabled", enabled);
    tree.write("shmem_enabled", "always within_size advise [never] deny force");
    SystemPolicy::read_from(tree.path())
}

const ALWAYS: &str = "[always] madvise never";
const MADVISE: &str = "always [madvise] never";
const NEVER: &str = "always madvise [never]";

fn codes(order: &[Step], policy: &SystemPolicy, mm: DisableMode, call: Call, vma: &VmaFacts) -> Vec<ReasonCode> {
    evaluate(&Context { order, policy, mm, past_wrapper: false }, call, vma).codes()
}

#[test]
fn the_lkp_case_on_6_1_prctl_first() {
    let p = policy_6_1(ALWAYS);
    let vma = anon(BASE, 64 * MIB, &[]);
    let c = codes(HUGEPAGE_VMA_CHECK_ORDER, &p, DisableMode::Completely, Call::PageFault, &vma);
    assert_eq!(c, [ReasonCode::PrctlThpDisable]);
    // Setting sysfs to always does not help (the material's observation).
    let p = policy_6_1(MADVISE);
    let c = codes(HUGEPAGE_VMA_CHECK_ORDER, &p, DisableMode::Completely, Call::PageFault, &vma);
    assert_eq!(c, [ReasonCode::PrctlThpDisable, ReasonCode::SysfsMadviseNotAdvised]);
}

#[test]
fn on_6_8_and_later_the_wrapper_refuses_before_the_function() {
    let p = policy(MADVISE);
    let vma = anon(BASE, 8 * MIB, &["nh"]);
    let eval = evaluate(
        &Context { order: ALLOWABLE_ORDERS_ORDER, policy: &p, mm: DisableMode::None, past_wrapper: false },
        Call::Smaps,
        &vma,
    );
    assert_eq!(eval.codes(), [ReasonCode::SysfsMadviseNotAdvised, ReasonCode::VmaNohugepage]);
    assert!(eval.denials[0].in_wrapper && !eval.denials[1].in_wrapper);
    assert!(eval.denials[0].detail.contains("not seen live"));
    // When the probed function ran, the wrapper passed: the function's own reason is nh.
    let eval = evaluate(
        &Context { order: ALLOWABLE_ORDERS_ORDER, policy: &p, mm: DisableMode::None, past_wrapper: true },
        Call::PageFault,
        &vma,
    );
    assert_eq!(eval.codes(), [ReasonCode::VmaNohugepage]);
    // With enabled=always the nh flag is the first refusal.
    let p = policy(ALWAYS);
    assert_eq!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Smaps, &vma), [ReasonCode::VmaNohugepage]);
}

#[test]
fn madvise_mode_without_and_with_madv_hugepage() {
    let p = policy(MADVISE);
    let plain = anon(BASE, 8 * MIB, &[]);
    assert_eq!(
        codes(ALLOWABLE_ORDERS_TVA_TYPE_ORDER, &p, DisableMode::None, Call::Smaps, &plain),
        [ReasonCode::SysfsMadviseNotAdvised]
    );
    let advised = anon(BASE, 8 * MIB, &["hg"]);
    let eval = evaluate(
        &Context { order: ALLOWABLE_ORDERS_TVA_TYPE_ORDER, policy: &p, mm: DisableMode::None, past_wrapper: false },
        Call::Smaps,
        &advised,
    );
    assert!(eval.allowed());
    assert_eq!(eval.orders, [9]);
    let p = policy_6_1(MADVISE);
    assert_eq!(
        codes(HUGEPAGE_VMA_CHECK_ORDER, &p, DisableMode::None, Call::Smaps, &plain),
        [ReasonCode::SysfsMadviseNotAdvised]
    );
    assert!(codes(HUGEPAGE_VMA_CHECK_ORDER, &p, DisableMode::None, Call::Smaps, &advised).is_empty());
}

#[test]
fn sysfs_never() {
    let p = policy(NEVER);
    let vma = anon(BASE, 8 * MIB, &["hg"]);
    assert_eq!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Smaps, &vma), [ReasonCode::SysfsNever]);
    let p = policy_6_1(NEVER);
    assert_eq!(
        codes(HUGEPAGE_VMA_CHECK_ORDER, &p, DisableMode::None, Call::Khugepaged, &vma),
        [ReasonCode::SysfsNever]
    );
}

#[test]
fn too_small_and_unaligned_but_not_for_faults() {
    let p = policy(ALWAYS);
    let small = anon(BASE, MIB, &["hg"]);
    assert_eq!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Smaps, &small), [ReasonCode::VmaTooSmall]);
    // Faults skip the size check; do_huge_pmd_anonymous_page falls back later.
    assert!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::PageFault, &small).is_empty());
    // 2.5 MiB starting 1 MiB past an aligned address: no aligned 2 MiB window.
    let unaligned = anon(BASE + MIB, 5 * MIB / 2, &["hg"]);
    assert_eq!(
        codes(HUGEPAGE_VMA_CHECK_ORDER, &policy_6_1(ALWAYS), DisableMode::None, Call::Khugepaged, &unaligned),
        [ReasonCode::VmaUnaligned]
    );
    // 3 MiB from the same start does contain [BASE+2M, BASE+4M).
    assert!(anon(BASE + MIB, 3 * MIB, &[]).fits_order(9));
    assert!(!anon(BASE + MIB, 3 * MIB - 4096, &[]).fits_order(9));
}

#[test]
fn an_enabled_small_size_keeps_a_small_region_eligible() {
    // 64 KiB set to always: a 1 MiB region is eligible for 64 KiB folios (not for 2 MiB).
    let tree = sample_tree(ALWAYS, "always [inherit] madvise never", "[always] inherit madvise never");
    let p = SystemPolicy::read_from(tree.path());
    let eval = evaluate(
        &Context { order: ALLOWABLE_ORDERS_ORDER, policy: &p, mm: DisableMode::None, past_wrapper: false },
        Call::Smaps,
        &anon(BASE, MIB, &[]),
    );
    assert!(eval.allowed());
    assert_eq!(eval.orders, [4]);
}

#[test]
fn except_advised_spares_madvised_regions_on_6_18() {
    let p = policy(ALWAYS);
    let plain = anon(BASE, 8 * MIB, &[]);
    let advised = anon(BASE, 8 * MIB, &["hg"]);
    let o = ALLOWABLE_ORDERS_TVA_TYPE_ORDER;
    assert_eq!(
        codes(o, &p, DisableMode::ExceptAdvised, Call::PageFault, &plain),
        [ReasonCode::PrctlThpDisableExceptAdvised]
    );
    assert!(codes(o, &p, DisableMode::ExceptAdvised, Call::PageFault, &advised).is_empty());
    assert!(codes(o, &p, DisableMode::ExceptAdvised, Call::ForcedCollapse, &plain).is_empty());
    assert_eq!(codes(o, &p, DisableMode::Completely, Call::PageFault, &advised), [ReasonCode::PrctlThpDisable]);
}

#[test]
fn special_mappings_depend_on_caller_since_6_8() {
    let p = policy(ALWAYS);
    let mut vma = anon(BASE, 8 * MIB, &[]);
    vma.special_flags = vec!["pf"];
    assert_eq!(
        codes(HUGEPAGE_VMA_CHECK_ORDER, &policy_6_1(ALWAYS), DisableMode::None, Call::PageFault, &vma),
        [ReasonCode::SpecialVma]
    );
    assert!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::PageFault, &vma).is_empty());
    assert_eq!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Khugepaged, &vma), [ReasonCode::SpecialVma]);
    let gate = VmaFacts { kind: VmaKind::Gate, ..anon(0xffff_ffff_ff60_0000, 4096, &[]) };
    assert_eq!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Smaps, &gate), [ReasonCode::SpecialVma]);
}

#[test]
fn files_and_shmem() {
    let p = policy(ALWAYS);
    let file = VmaFacts { kind: VmaKind::File, ..anon(BASE, 8 * MIB, &[]) };
    let eval = evaluate(
        &Context { order: ALLOWABLE_ORDERS_ORDER, policy: &p, mm: DisableMode::None, past_wrapper: false },
        Call::Smaps,
        &file,
    );
    assert_eq!(eval.codes(), [ReasonCode::FileNotEligible]);
    assert!(eval.uncertain, "read-only file THP is not visible in /proc");
    // Shared anonymous memory follows shmem_enabled (never in the sample), not enabled=always.
    let shm = VmaFacts { kind: VmaKind::Shmem { internal: true, tmpfs_huge: None }, ..anon(BASE, 8 * MIB, &["hg"]) };
    assert_eq!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Smaps, &shm), [ReasonCode::SysfsNever]);
    let tmpfs = VmaFacts { kind: VmaKind::Shmem { internal: false, tmpfs_huge: Some("always".into()) }, ..shm.clone() };
    assert!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Smaps, &tmpfs).is_empty());
    let tmpfs = VmaFacts { kind: VmaKind::Shmem { internal: false, tmpfs_huge: Some("never".into()) }, ..shm };
    assert_eq!(
        codes(HUGEPAGE_VMA_CHECK_ORDER, &policy_6_1(ALWAYS), DisableMode::None, Call::Smaps, &tmpfs),
        [ReasonCode::FileNotEligible]
    );
}

#[test]
fn khugepaged_skips_never_faulted_vmas() {
    let p = policy(ALWAYS);
    let mut vma = anon(BASE, 8 * MIB, &[]);
    vma.has_anon_vma = false;
    assert_eq!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Khugepaged, &vma), [ReasonCode::NoAnonVma]);
    assert!(codes(ALLOWABLE_ORDERS_ORDER, &p, DisableMode::None, Call::Smaps, &vma).is_empty());
}

#[test]
fn mm_flag_bits_depend_on_the_kernel() {
    let single = ThpDisableBits::Single { disable: 24 };
    let split = ThpDisableBits::Split { completely: 24, except_advised: 23 };
    assert_eq!(DisableMode::from_mm_flags(single, 1 << 24), DisableMode::Completely);
    // Before 6.18 bit 23 is MMF_HUGE_ZERO_PAGE, not a THP-disable bit.
    assert_eq!(DisableMode::from_mm_flags(single, 1 << 23), DisableMode::None);
    assert_eq!(DisableMode::from_mm_flags(split, 1 << 23), DisableMode::ExceptAdvised);
    assert_eq!(DisableMode::from_mm_flags(split, (1 << 23) | (1 << 24)), DisableMode::Completely);
    assert_eq!(DisableMode::mask(split), 0x180_0000);
}

#[test]
fn classification_from_captured_smaps() {
    let vmas = parse_smaps(crate::thp_why::procfs::tests::SMAPS);
    let kinds: Vec<VmaKind> = vmas.iter().map(|v| classify(v, &[])).collect();
    assert_eq!(kinds[0], VmaKind::Shmem { internal: true, tmpfs_huge: None });
    assert_eq!(kinds[1], VmaKind::Anonymous);
    assert_eq!(kinds[2], VmaKind::File);
    // The captured kernel (6.18, enabled=madvise, shmem_enabled=never) agrees with the
    // evaluation on every VMA of the sample.
    let p = policy(MADVISE);
    for vma in &vmas {
        let facts = VmaFacts::from_smaps(vma, &[]);
        let eval = evaluate(
            &Context { order: ALLOWABLE_ORDERS_TVA_TYPE_ORDER, policy: &p, mm: DisableMode::None, past_wrapper: false },
            Call::Smaps,
            &facts,
        );
        assert_eq!(Some(eval.allowed()), vma.thp_eligible, "{vma:?}: {eval:?}");
    }
    let stack = Vma { name: "[vdso]".into(), ..vmas[1].clone() };
    assert_eq!(classify(&stack, &[]), VmaKind::Special { name: "[vdso]".into() });
}

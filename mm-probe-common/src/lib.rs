//! Records and map values shared by mm-probe's kernel programs and its user-space agent.
//!
//! One module per capability, and `histogram`, the bucketing both sides agree on. Every type here
//! is `#[repr(C)]` and plain old data so both sides read the same bytes. The `user` feature adds
//! `aya::Pod` so user space can read them from maps.
#![cfg_attr(not(test), no_std)]

pub mod cause;
pub mod histogram;
pub mod hmm;
pub mod invalidations;
pub mod latency;
pub mod layout;
pub mod selftest;
pub mod thp;

/// How much of a ring must be waiting before a submit wakes user space: an eighth. Woken per
/// record, a reader takes a wakeup and two context switches per event, which on a machine with
/// no idle CPU cost more than the traced work itself (retry-storm's walks: 2.47x against 1.07x,
/// instruction-counted). Every reader of such a ring also drains it on a timer, so records
/// below the mark still arrive in time.
pub const fn ring_wakeup_bytes(ring_bytes: u32) -> u64 {
    (ring_bytes / 8) as u64
}

/// Implements `aya::Pod` for records that user space reads out of maps (user side only).
#[macro_export]
macro_rules! user_pod {
    ($($ty:ty),* $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: the type is #[repr(C)], Copy, and every bit pattern is a valid value.
            unsafe impl aya::Pod for $ty {}
        )*
    };
}

/// An enum of slots `0..COUNT` in declaration order, with `ALL`, `COUNT` and each slot's
/// `name` (the key user space prints it under): one list, so the kernel's array size, user
/// space's reading and the printed names cannot drift apart.
#[macro_export]
macro_rules! slots {
    ($(#[$meta:meta])* pub enum $enum:ident { $($(#[$doc:meta])* $slot:ident => $name:literal,)* }) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $enum { $($(#[$doc])* $slot,)* }

        impl $enum {
            pub const ALL: &'static [$enum] = &[$($enum::$slot),*];
            pub const COUNT: u32 = Self::ALL.len() as u32;

            pub const fn name(self) -> &'static str {
                match self { $($enum::$slot => $name,)* }
            }
        }
    };
}

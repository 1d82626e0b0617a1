//! Records and map values shared by mm-probe's kernel programs and its user-space agent.
//!
//! One module per capability; every type here is `#[repr(C)]` and plain old data so both sides
//! read the same bytes. The `user` feature adds `aya::Pod` so user space can read them from maps.
#![no_std]

pub mod hmm;
pub mod latency;
pub mod layout;
pub mod selftest;
pub mod thp;

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

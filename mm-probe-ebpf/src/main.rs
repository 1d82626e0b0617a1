//! mm-probe's kernel programs. One module per hook area; each program is a thin wrapper around a
//! `try_*` function that reads, filters, aggregates or emits, and never judges.
// Built for bpfel-unknown-none by mm-probe's build.rs; a host build (cargo build --workspace)
// compiles an empty binary instead, so workspace-wide commands keep working.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod cause;
mod invalidations;
mod kernel;
mod latency;
mod retry_storm;
mod selftest;
mod thp_why;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

//! mm-probe's kernel programs. One module per hook area; each program is a thin wrapper around a
//! `try_*` function that reads, filters, aggregates or emits, and never judges.
#![no_std]
#![no_main]

mod hmm;
mod kernel;
mod sched;
mod selftest;
mod thp;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

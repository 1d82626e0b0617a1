//! The agent's own memory. Start-up parses the kernel's BTF (twice: the object loader parses its
//! own copy on a thread of its own) and symbol table, several MiB each; once the programs are
//! attached only the symbols are still read. The C allocator keeps what was freed for reuse in
//! the same process unless asked to hand it back, so without that a run of hours would hold its
//! start-up peak: glibc's malloc_trim in the glibc build, a purge of every jemalloc arena in the
//! static (musl) one.

use crate::kernel::Kernel;

/// Lets go of what only start-up needed and hands the memory freed so far back to the kernel,
/// from every allocator arena (the loader thread's too). Called once everything is attached.
pub fn release_startup(kernel: &Kernel) {
    kernel.release_btf();
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointer.
    unsafe {
        libc::malloc_trim(0);
    }
    #[cfg(target_env = "musl")]
    // SAFETY: a mallctl that only writes (no old value read, no new value given) to a name
    // jemalloc defines: purge the unused dirty pages of every arena (MALLCTL_ARENAS_ALL).
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
}

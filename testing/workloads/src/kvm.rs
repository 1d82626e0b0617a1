//! A minimal KVM virtual machine for the invalidation tests: one memslot holding the guest's page
//! tables and code, one memslot over the memory the test invalidates, and vCPUs that run a
//! 64-bit user-mode (CPL3) loop writing one byte per page of that memory.
//!
//! Written against include/uapi/linux/kvm.h (x86-64). User mode because it is what a software
//! hypervisor without nested paging still runs, and it needs no interrupt tables: the loop exits
//! to us once per pass with an `out` instruction (allowed at CPL3 with IOPL 3), which lets the
//! vCPU thread see the stop flag and count passes.

use std::{fs::OpenOptions, os::fd::AsRawFd as _};

use anyhow::{Context as _, Result, bail};

use crate::map_anonymous;

const KVMIO: u64 = 0xae;

const fn io(nr: u64) -> u64 {
    (KVMIO << 8) | nr
}

const fn iow(nr: u64, size: usize) -> u64 {
    (1 << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

const KVM_GET_API_VERSION: u64 = io(0x00);
const KVM_CREATE_VM: u64 = io(0x01);
const KVM_GET_VCPU_MMAP_SIZE: u64 = io(0x04);
// The ioctls' size is the header's alone (struct kvm_cpuid2 ends in a flexible array).
const KVM_GET_SUPPORTED_CPUID: u64 = iowr(0x05, 8);
const KVM_SET_CPUID2: u64 = iow(0x90, 8);
const KVM_CREATE_VCPU: u64 = io(0x41);
const KVM_GET_DIRTY_LOG: u64 = iow(0x42, size_of::<DirtyLog>());
const KVM_SET_USER_MEMORY_REGION: u64 = iow(0x46, size_of::<MemoryRegion>());
const KVM_RUN: u64 = io(0x80);
const KVM_GET_REGS: u64 = ior(0x81, size_of::<Regs>());
const KVM_SET_REGS: u64 = iow(0x82, size_of::<Regs>());
const KVM_GET_SREGS: u64 = ior(0x83, size_of::<Sregs>());
const KVM_SET_SREGS: u64 = iow(0x84, size_of::<Sregs>());

const KVM_MEM_LOG_DIRTY_PAGES: u32 = 1;
const KVM_EXIT_IO: u32 = 2;
const KVM_EXIT_INTR: u32 = 10;

/// Guest-physical layout: page tables and code in slot 0, the invalidated memory in slot 1.
const SETUP_SLOT_BYTES: usize = 2 << 20;
const PML4: u64 = 0x1000;
const PDPT: u64 = 0x2000;
const PD_LOW: u64 = 0x3000;
const PD_DATA: u64 = 0x4000;
const CODE: u64 = 0x8000;
/// The data memslot starts at 1 GiB: PDPT entry 1, one PD of 2 MiB pages (so at most 1 GiB).
pub const DATA_GPA: u64 = 1 << 30;
const MAX_DATA_BYTES: usize = 1 << 30;

/// Page-table entry bits: present, writable, user, 2 MiB page.
const PTE_PRESENT_RW_USER: u64 = 0x7;
const PDE_HUGE: u64 = 0x80;

/// The guest loop, from rdi (first data page) to rsi (end), one write per page, one `out` per
/// pass:
///   0: mov rax, rdi          3: mov byte [rax], 1     6: add rax, 0x1000
///   c: cmp rax, rsi          f: jb 3                 11: out 0x10, al       13: jmp 0
const GUEST_LOOP: [u8; 21] = [
    0x48, 0x89, 0xf8, 0xc6, 0x00, 0x01, 0x48, 0x05, 0x00, 0x10, 0x00, 0x00, 0x48, 0x39, 0xf0, 0x72, 0xf2, 0xe6, 0x10,
    0xeb, 0xeb,
];

#[repr(C)]
#[derive(Default)]
struct MemoryRegion {
    slot: u32,
    flags: u32,
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
}

#[repr(C)]
struct DirtyLog {
    slot: u32,
    padding: u32,
    bitmap: u64,
}

#[repr(C)]
#[derive(Default)]
struct Regs {
    rax: u64,
    rbx: u64,
    rcx: u64,
    rdx: u64,
    rsi: u64,
    rdi: u64,
    rsp: u64,
    rbp: u64,
    r8_r15: [u64; 8],
    rip: u64,
    rflags: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Segment {
    base: u64,
    limit: u32,
    selector: u16,
    kind: u8,
    present: u8,
    dpl: u8,
    db: u8,
    s: u8,
    l: u8,
    g: u8,
    avl: u8,
    unusable: u8,
    padding: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Dtable {
    base: u64,
    limit: u16,
    padding: [u16; 3],
}

#[repr(C)]
#[derive(Default)]
struct Sregs {
    cs: Segment,
    ds: Segment,
    es: Segment,
    fs: Segment,
    gs: Segment,
    ss: Segment,
    tr: Segment,
    ldt: Segment,
    gdt: Dtable,
    idt: Dtable,
    cr0: u64,
    cr2: u64,
    cr3: u64,
    cr4: u64,
    cr8: u64,
    efer: u64,
    apic_base: u64,
    interrupt_bitmap: [u64; 4],
}

/// struct kvm_cpuid2 with room for every leaf a current kernel reports.
#[repr(C)]
struct Cpuid {
    nent: u32,
    padding: u32,
    entries: [CpuidEntry; CPUID_ENTRIES],
}

const CPUID_ENTRIES: usize = 256;

impl Default for Cpuid {
    fn default() -> Self {
        Self { nent: CPUID_ENTRIES as u32, padding: 0, entries: [CpuidEntry::default(); CPUID_ENTRIES] }
    }
}

/// struct kvm_cpuid_entry2.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CpuidEntry {
    function: u32,
    index: u32,
    flags: u32,
    eax: u32,
    ebx: u32,
    ecx: u32,
    edx: u32,
    padding: [u32; 3],
}

/// One ioctl; its result or the errno as an error naming `what`.
fn ioctl(fd: i32, request: u64, arg: u64, what: &str) -> Result<i32> {
    // SAFETY: each caller passes a request with the argument the kernel expects for it (a
    // pointer to a live struct of the request's size, or a plain integer).
    let ret = unsafe { libc::ioctl(fd, request as _, arg) };
    if ret < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(ret)
}

/// A VM with its data memslot. The fds stay open for the life of the process (the workload
/// exits when done), so nothing here closes them.
pub struct Vm {
    kvm_fd: i32,
    vm_fd: i32,
    vcpu_mmap_bytes: usize,
    /// Host address of the data memslot: what the invalidating threads madvise.
    pub data: *mut u8,
    pub data_bytes: usize,
}

// SAFETY: the raw pointer is a process-wide mapping that lives until exit; threads only
// madvise pieces of it or read its address.
unsafe impl Send for Vm {}
unsafe impl Sync for Vm {}

impl Vm {
    /// Creates the VM, its setup memslot (page tables, code) and a data memslot of `data_bytes`
    /// (a multiple of 2 MiB, at most 1 GiB), with dirty logging when `dirty_log` is set.
    pub fn create(data_bytes: usize, dirty_log: bool) -> Result<Self> {
        if data_bytes == 0 || !data_bytes.is_multiple_of(2 << 20) || data_bytes > MAX_DATA_BYTES {
            bail!("the data memslot must be a multiple of 2 MiB up to 1 GiB, not {data_bytes} bytes");
        }
        let kvm = OpenOptions::new().read(true).write(true).open("/dev/kvm").context("opening /dev/kvm")?;
        let kvm_fd = kvm.as_raw_fd();
        let version = ioctl(kvm_fd, KVM_GET_API_VERSION, 0, "KVM_GET_API_VERSION")?;
        if version != 12 {
            bail!("KVM API version {version}, expected 12");
        }
        let vm_fd = ioctl(kvm_fd, KVM_CREATE_VM, 0, "KVM_CREATE_VM")?;
        let vcpu_mmap_bytes = ioctl(kvm_fd, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")? as usize;
        std::mem::forget(kvm);
        let setup = map_anonymous(SETUP_SLOT_BYTES)?;
        // SAFETY: setup is a fresh writable mapping of SETUP_SLOT_BYTES.
        unsafe { write_setup(setup, data_bytes) };
        let data = map_anonymous(data_bytes)?;
        let vm = Self { kvm_fd, vm_fd, vcpu_mmap_bytes, data, data_bytes };
        vm.add_slot(0, 0, setup, SETUP_SLOT_BYTES, 0)?;
        vm.add_slot(1, DATA_GPA, data, data_bytes, if dirty_log { KVM_MEM_LOG_DIRTY_PAGES } else { 0 })?;
        Ok(vm)
    }

    fn add_slot(&self, slot: u32, gpa: u64, host: *mut u8, bytes: usize, flags: u32) -> Result<()> {
        let region =
            MemoryRegion { slot, flags, guest_phys_addr: gpa, memory_size: bytes as u64, userspace_addr: host as u64 };
        ioctl(self.vm_fd, KVM_SET_USER_MEMORY_REGION, &region as *const _ as u64, "KVM_SET_USER_MEMORY_REGION")?;
        Ok(())
    }

    /// KVM_GET_DIRTY_LOG on the data memslot (which write-protects what the guest dirtied: more
    /// mmu_lock traffic, as a migration's dirty-page tracking makes).
    pub fn fetch_dirty_log(&self, bitmap: &mut [u64]) -> Result<()> {
        let log = DirtyLog { slot: 1, padding: 0, bitmap: bitmap.as_mut_ptr() as u64 };
        ioctl(self.vm_fd, KVM_GET_DIRTY_LOG, &log as *const _ as u64, "KVM_GET_DIRTY_LOG")?;
        Ok(())
    }

    /// Words of a dirty bitmap covering the data memslot.
    pub fn dirty_bitmap_words(&self) -> usize {
        (self.data_bytes / 4096).div_ceil(64)
    }

    /// Creates vCPU `id` in 64-bit user mode at the guest loop.
    pub fn create_vcpu(&self, id: u32) -> Result<Vcpu> {
        let fd = ioctl(self.vm_fd, KVM_CREATE_VCPU, u64::from(id), "KVM_CREATE_VCPU")?;
        // SAFETY: the kvm_run area of this vCPU fd, of the size KVM reported.
        let run = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                self.vcpu_mmap_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if run == libc::MAP_FAILED {
            bail!("mapping the vCPU's kvm_run: {}", std::io::Error::last_os_error());
        }
        // Long mode needs a CPUID with LM: a hardware hypervisor refuses EFER.LME otherwise.
        let mut cpuid = Cpuid::default();
        ioctl(self.kvm_fd, KVM_GET_SUPPORTED_CPUID, &mut cpuid as *mut _ as u64, "KVM_GET_SUPPORTED_CPUID")?;
        ioctl(fd, KVM_SET_CPUID2, &cpuid as *const _ as u64, "KVM_SET_CPUID2")?;
        let mut sregs = Sregs::default();
        ioctl(fd, KVM_GET_SREGS, &mut sregs as *mut _ as u64, "KVM_GET_SREGS")?;
        long_mode_user(&mut sregs);
        ioctl(fd, KVM_SET_SREGS, &sregs as *const _ as u64, "KVM_SET_SREGS")?;
        let regs = Regs {
            rip: CODE,
            rdi: DATA_GPA,
            rsi: DATA_GPA + self.data_bytes as u64,
            // Bit 1 is reserved-set; IOPL 3 lets user mode execute `out`.
            rflags: 0x2 | (3 << 12),
            ..Regs::default()
        };
        ioctl(fd, KVM_SET_REGS, &regs as *const _ as u64, "KVM_SET_REGS")?;
        Ok(Vcpu { fd, run: run.cast() })
    }
}

pub struct Vcpu {
    fd: i32,
    run: *mut u8,
}

// SAFETY: a vCPU is run by one thread at a time (the one it is moved to).
unsafe impl Send for Vcpu {}

impl Vcpu {
    /// Runs the guest until its next exit; true for the once-a-pass `out`, false for a signal.
    pub fn run_once(&mut self) -> Result<bool> {
        // SAFETY: KVM_RUN takes no argument; kvm_run.exit_reason is the u32 at offset 8.
        let ret = unsafe { libc::ioctl(self.fd, KVM_RUN as _, 0) };
        if ret < 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            bail!("KVM_RUN: {error}");
        }
        let exit_reason = unsafe { self.run.add(8).cast::<u32>().read_volatile() };
        match exit_reason {
            KVM_EXIT_IO => Ok(true),
            KVM_EXIT_INTR => Ok(false),
            other => {
                let mut regs = Regs::default();
                let _ = ioctl(self.fd, KVM_GET_REGS, &mut regs as *mut _ as u64, "KVM_GET_REGS");
                bail!("the guest exited with reason {other} at rip {:#x}", regs.rip)
            }
        }
    }
}

/// Page tables (identity-mapped 2 MiB user pages for the setup slot and the data slot) and the
/// guest loop, written into the setup slot.
///
/// # Safety
/// `setup` must be a writable mapping of at least SETUP_SLOT_BYTES.
unsafe fn write_setup(setup: *mut u8, data_bytes: usize) {
    let entry = |table: u64, index: usize, value: u64| {
        // SAFETY: every table lies inside the setup slot; index < 512.
        unsafe { setup.add(table as usize + index * 8).cast::<u64>().write(value) };
    };
    entry(PML4, 0, PDPT | PTE_PRESENT_RW_USER);
    entry(PDPT, 0, PD_LOW | PTE_PRESENT_RW_USER);
    entry(PDPT, 1, PD_DATA | PTE_PRESENT_RW_USER);
    entry(PD_LOW, 0, PTE_PRESENT_RW_USER | PDE_HUGE);
    for index in 0..data_bytes / (2 << 20) {
        entry(PD_DATA, index, (DATA_GPA + (index as u64) * (2 << 20)) | PTE_PRESENT_RW_USER | PDE_HUGE);
    }
    // SAFETY: CODE + the loop's length lies inside the setup slot.
    unsafe { std::ptr::copy_nonoverlapping(GUEST_LOOP.as_ptr(), setup.add(CODE as usize), GUEST_LOOP.len()) };
}

/// 64-bit long mode with paging, user-mode code and data segments (no GDT is ever loaded: KVM
/// takes the hidden segment state as given).
fn long_mode_user(sregs: &mut Sregs) {
    let code = Segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: 0x1b,
        kind: 11,
        present: 1,
        dpl: 3,
        s: 1,
        l: 1,
        g: 1,
        ..Segment::default()
    };
    let data = Segment { selector: 0x23, kind: 3, db: 1, l: 0, ..code };
    sregs.cs = code;
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = Segment { base: 0, limit: 0x67, selector: 0x28, kind: 11, present: 1, ..Segment::default() };
    sregs.ldt = Segment { limit: 0xffff, kind: 2, present: 1, ..Segment::default() };
    // PE | MP | ET | NE | WP | PG
    sregs.cr0 = 0x1 | 0x2 | 0x10 | 0x20 | 0x1_0000 | 0x8000_0000;
    sregs.cr3 = PML4;
    sregs.cr4 = 0x20; // PAE
    sregs.efer = 0x100 | 0x400; // LME | LMA
}

//! The running kernel's BTF: struct member offsets, function prototypes and type existence.
//!
//! Rust eBPF programs get no CO-RE relocations, so every struct member a program reads is looked
//! up here at start-up and handed to the programs as a global (see `layout`).

use anyhow::{Context as _, Result, anyhow};
use btfparse::{Offset, Readable, TypeInformation, TypeVariant};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The kernel's BTF, parsed twice: by aya (which needs it to load fentry and tp_btf programs)
/// and by btfparse (which can answer member offsets; aya keeps those private).
pub struct KernelBtf {
    pub aya: aya::Btf,
    types: TypeInformation,
}

struct Bytes(Vec<u8>);

impl Readable for Bytes {
    fn read(&self, offset: u64, buffer: &mut [u8]) -> btfparse::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(buffer.len());
        let source = self.0.get(start..end).ok_or_else(|| {
            btfparse::Error::new(btfparse::ErrorKind::IOError, "read past the end of the BTF blob")
        })?;
        buffer.copy_from_slice(source);
        Ok(())
    }
}

impl KernelBtf {
    pub fn from_sys_fs() -> Result<Self> {
        let bytes = std::fs::read(VMLINUX_BTF).with_context(|| {
            format!("reading {VMLINUX_BTF}: this kernel was built without CONFIG_DEBUG_INFO_BTF")
        })?;
        Self::from_bytes(bytes)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let aya = aya::Btf::parse(&bytes, aya::Endianness::default())
            .map_err(|e| anyhow!("parsing kernel BTF: {e}"))?;
        let types = TypeInformation::new(&Bytes(bytes))
            .map_err(|e| anyhow!("parsing kernel BTF: {e:?}"))?;
        Ok(Self { aya, types })
    }

    /// Byte offset of `path` (e.g. `flags`, `vm_start`, `interval_tree.start`) inside
    /// `struct_name`, looking through anonymous unions and structs. `None` if any part is absent
    /// or the member is a bitfield.
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Option<u32> {
        member_offset(&self.types, struct_name, path)
    }

    /// Whether a named type (struct, typedef, enum, function…) exists.
    pub fn has_type(&self, name: &str) -> bool {
        self.types.id_of(name).is_some()
    }

    /// Whether an enumerator (e.g. `TVA_PAGEFAULT`) exists in any enum.
    pub fn enumerator(&self, name: &str) -> Option<i64> {
        enumerator(&self.types, name)
    }

    /// Parameter names of a kernel function, in order; `None` if BTF has no such function
    /// (absent, inlined everywhere, or static and deduplicated away).
    pub fn function_params(&self, function: &str) -> Option<Vec<String>> {
        function_params(&self.types, function)
    }
}

fn member_offset(types: &TypeInformation, struct_name: &str, path: &str) -> Option<u32> {
    let id = types.id_of(struct_name)?;
    match types.offset_of(id, path).ok()?.1 {
        Offset::ByteOffset(offset) => Some(offset),
        Offset::BitOffsetAndSize(..) => None,
    }
}

fn function_params(types: &TypeInformation, function: &str) -> Option<Vec<String>> {
    let TypeVariant::Func(func) = types.from_id(types.id_of(function)?)? else { return None };
    let TypeVariant::FuncProto(proto) = types.from_id(*func.prototype_tid())? else { return None };
    Some(proto.parameter_list().iter().map(|p| p.name().unwrap_or_default()).collect())
}

fn enumerator(types: &TypeInformation, name: &str) -> Option<i64> {
    types.get().values().find_map(|variant| match variant {
        TypeVariant::Enum(e) => e
            .named_value_list()
            .iter()
            .find(|v| v.name == name)
            .map(|v| match v.value {
                btfparse::Integer32Value::Signed(x) => i64::from(x),
                btfparse::Integer32Value::Unsigned(x) => i64::from(x),
            }),
        _ => None,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A hand-made BTF blob: the shapes the layout table relies on, small enough to read.
    /// `struct vm_area_struct { union { struct { u64 vm_start; u64 vm_end; }; u64 vm_rcu; };
    /// struct mm_struct *vm_mm; union { const u64 vm_flags; u64 __vm_flags; }; }`,
    /// `struct mm_struct { u32 pad; u64 flags; }`, `enum tva_type { TVA_SMAPS, TVA_PAGEFAULT }` and
    /// `int hmm_range_fault(struct hmm_range *range)`.
    pub(crate) fn sample_btf() -> Vec<u8> {
        let mut strings = StringTable::default();
        let mut types: Vec<u8> = Vec::new();
        let mut ty = |kind: u32, name: &str, vlen: u32, size_or_type: u32, extra: &[u32], s: &mut StringTable| {
            let name_off = s.add(name);
            for word in [name_off, (kind << 24) | vlen, size_or_type].iter().chain(extra) {
                types.extend_from_slice(&word.to_le_bytes());
            }
        };
        const INT: u32 = 1;
        const PTR: u32 = 2;
        const STRUCT: u32 = 4;
        const UNION: u32 = 5;
        const ENUM: u32 = 6;
        const CONST: u32 = 10;
        const FUNC: u32 = 12;
        const FUNC_PROTO: u32 = 13;
        let s = &mut strings;
        // 1: u64, 2: u32
        ty(INT, "u64", 0, 8, &[64], s);
        ty(INT, "u32", 0, 4, &[32], s);
        // 3: anonymous struct { vm_start; vm_end }
        let (a, b) = (s.add("vm_start"), s.add("vm_end"));
        ty(STRUCT, "", 2, 16, &[a, 1, 0, b, 1, 64], s);
        // 4: anonymous union { struct 3; vm_rcu }
        let rcu = s.add("vm_rcu");
        ty(UNION, "", 2, 16, &[0, 3, 0, rcu, 1, 0], s);
        // 5: const u64
        ty(CONST, "", 0, 1, &[], s);
        // 6: anonymous union { const u64 vm_flags; u64 __vm_flags }
        let (f, pf) = (s.add("vm_flags"), s.add("__vm_flags"));
        ty(UNION, "", 2, 8, &[f, 5, 0, pf, 1, 0], s);
        // 7: struct mm_struct { u32 pad; u64 flags @8 }
        let (pad, flags) = (s.add("pad"), s.add("flags"));
        ty(STRUCT, "mm_struct", 2, 16, &[pad, 2, 0, flags, 1, 64], s);
        // 8: struct mm_struct *
        ty(PTR, "", 0, 7, &[], s);
        // 9: struct vm_area_struct { union 4 @0; vm_mm @16; union 6 @24 }
        let mm = s.add("vm_mm");
        ty(STRUCT, "vm_area_struct", 3, 32, &[0, 4, 0, mm, 8, 128, 0, 6, 192], s);
        // 10: enum tva_type
        let (e0, e1) = (s.add("TVA_SMAPS"), s.add("TVA_PAGEFAULT"));
        ty(ENUM, "tva_type", 2, 4, &[e0, 0, e1, 1], s);
        // 11: func proto int (struct hmm_range *range) — the parameter type is irrelevant here
        let range = s.add("range");
        ty(FUNC_PROTO, "", 1, 2, &[range, 8], s);
        // 12: func hmm_range_fault
        ty(FUNC, "hmm_range_fault", 1, 11, &[], s);

        let strings = strings.bytes;
        let mut blob = Vec::new();
        blob.extend_from_slice(&0xeb9fu16.to_le_bytes());
        blob.extend_from_slice(&[1, 0]); // version, flags
        blob.extend_from_slice(&24u32.to_le_bytes()); // header length
        blob.extend_from_slice(&0u32.to_le_bytes()); // type offset
        blob.extend_from_slice(&(types.len() as u32).to_le_bytes());
        blob.extend_from_slice(&(types.len() as u32).to_le_bytes()); // string offset
        blob.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        blob.extend_from_slice(&types);
        blob.extend_from_slice(&strings);
        blob
    }

    #[derive(Default)]
    struct StringTable {
        bytes: Vec<u8>,
    }

    impl StringTable {
        fn add(&mut self, s: &str) -> u32 {
            if self.bytes.is_empty() {
                self.bytes.push(0);
            }
            if s.is_empty() {
                return 0;
            }
            let offset = self.bytes.len() as u32;
            self.bytes.extend_from_slice(s.as_bytes());
            self.bytes.push(0);
            offset
        }
    }

    fn sample() -> KernelBtf {
        KernelBtf::from_bytes(sample_btf()).expect("sample BTF parses")
    }

    #[test]
    fn offsets_through_anonymous_unions() {
        let btf = sample();
        assert_eq!(btf.member_offset("vm_area_struct", "vm_start"), Some(0));
        assert_eq!(btf.member_offset("vm_area_struct", "vm_end"), Some(8));
        assert_eq!(btf.member_offset("vm_area_struct", "vm_mm"), Some(16));
        assert_eq!(btf.member_offset("vm_area_struct", "vm_flags"), Some(24));
        assert_eq!(btf.member_offset("mm_struct", "flags"), Some(8));
    }

    #[test]
    fn absent_members_and_types_are_none() {
        let btf = sample();
        assert_eq!(btf.member_offset("vm_area_struct", "vm_pgoff"), None);
        assert_eq!(btf.member_offset("task_struct", "pid"), None);
        assert!(!btf.has_type("mm_flags_t"));
        assert!(btf.has_type("mm_struct"));
    }

    #[test]
    fn function_params_and_enumerators() {
        let btf = sample();
        assert_eq!(btf.function_params("hmm_range_fault"), Some(vec!["range".to_string()]));
        assert_eq!(btf.function_params("hugepage_vma_check"), None);
        assert_eq!(btf.enumerator("TVA_PAGEFAULT"), Some(1));
        assert_eq!(btf.enumerator("TVA_KHUGEPAGED"), None);
    }
}

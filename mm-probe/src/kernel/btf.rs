//! The running kernel's BTF: struct member offsets, function prototypes and type existence.
//!
//! Rust eBPF programs get no CO-RE relocations, so every struct member a program reads is looked
//! up here at start-up and handed to the programs as a global (see `layout`).
//!
//! The reader is deliberately small: it indexes where each type record starts and answers the
//! few questions mm-probe asks by walking the raw records. General-purpose BTF libraries build a
//! map of every type, which costs ~50 MiB for a 5 MiB vmlinux BTF; this costs the blob plus
//! four bytes per type.

use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";
/// Where a loaded module's BTF is, split on top of vmlinux's: `/sys/kernel/btf/<module>`.
const MODULE_BTF_DIR: &str = "/sys/kernel/btf";

const BTF_MAGIC: u16 = 0xeb9f;

/// BTF type kinds (include/uapi/linux/btf.h).
mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

/// The kernel's BTF, held twice: by aya (which needs it to load fentry and tp_btf programs) and
/// as raw records indexed here (aya keeps member offsets private).
pub struct KernelBtf {
    pub aya: aya::Btf,
    raw: Arc<RawBtf>,
}

/// A module's BTF (`struct kvm` when KVM is a module): split BTF, whose type ids continue
/// vmlinux's and whose string offsets past vmlinux's string section are its own. Read for
/// struct layouts only; members whose types live in vmlinux are found, not followed.
pub struct ModuleBtf {
    raw: RawBtf,
}

impl ModuleBtf {
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Option<u32> {
        self.raw.member_offset(struct_name, path)
    }

    pub fn struct_members(&self, struct_name: &str) -> Option<(u32, Vec<(u32, String)>)> {
        self.raw.struct_members(struct_name)
    }
}

impl KernelBtf {
    pub fn from_sys_fs() -> Result<Self> {
        let bytes = std::fs::read(VMLINUX_BTF)
            .with_context(|| format!("reading {VMLINUX_BTF}: this kernel was built without CONFIG_DEBUG_INFO_BTF"))?;
        Self::from_bytes(bytes)
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let aya =
            aya::Btf::parse(&bytes, aya::Endianness::default()).map_err(|e| anyhow!("parsing kernel BTF: {e}"))?;
        let raw = RawBtf::new(bytes, None).context("parsing kernel BTF")?;
        Ok(Self { aya, raw: Arc::new(raw) })
    }

    /// A loaded module's BTF, or `None` when the module is not loaded or has none.
    pub fn module(&self, name: &str) -> Option<ModuleBtf> {
        let bytes = std::fs::read(std::path::Path::new(MODULE_BTF_DIR).join(name)).ok()?;
        Self::split(&self.raw, bytes).ok()
    }

    fn split(base: &Arc<RawBtf>, bytes: Vec<u8>) -> Result<ModuleBtf> {
        Ok(ModuleBtf { raw: RawBtf::new(bytes, Some(Arc::clone(base))).context("parsing module BTF")? })
    }

    /// Byte offset of `path` (e.g. `flags`, `vm_start`, `interval_tree.start`) inside
    /// `struct_name`, looking through anonymous unions and structs. `None` if any part is absent
    /// or the member is a bitfield.
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Option<u32> {
        self.raw.member_offset(struct_name, path)
    }

    /// A struct's size and its named top-level members with their byte offsets, in order (for
    /// naming an address inside an instance: `kvm->mn_invalidate_lock`).
    pub fn struct_members(&self, struct_name: &str) -> Option<(u32, Vec<(u32, String)>)> {
        self.raw.struct_members(struct_name)
    }

    /// The function-pointer members of `struct_name` (an ops table such as `mmu_notifier_ops`),
    /// each with its prototype; `None` if BTF has no such struct.
    pub fn function_members(&self, struct_name: &str) -> Option<Vec<FunctionMember>> {
        self.raw.function_members(struct_name)
    }

    /// Whether a named type (struct, typedef, enum, function…) exists.
    pub fn has_type(&self, name: &str) -> bool {
        self.raw.find(name, |_| true).is_some()
    }

    /// Whether an enumerator (e.g. `TVA_PAGEFAULT`) exists in any enum, and its value.
    pub fn enumerator(&self, name: &str) -> Option<i64> {
        self.raw.enumerator(name)
    }

    /// Every enumerator of the enum `name` (e.g. `scan_result`) with its value, in declaration
    /// order; `None` if BTF has no such enum.
    pub fn enum_values(&self, name: &str) -> Option<Vec<(String, i64)>> {
        let id = self.raw.find(name, |k| k == kind::ENUM || k == kind::ENUM64)?;
        let header = self.raw.header(id)?;
        Some(
            (0..header.vlen)
                .map(|i| self.raw.enumerator_at(&header, i))
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
        )
    }

    /// The types of a tracepoint's arguments as its raw and BTF programs see them, in order, as
    /// C writes them (`enum migrate_mode`, `int`): the prototype of `btf_trace_<event>` less its
    /// leading `void *`. `None` if BTF has no such typedef (no such event, or no BTF for it).
    pub fn tracepoint_args(&self, event: &str) -> Option<Vec<String>> {
        self.raw.tracepoint_args(event)
    }

    /// Parameter names of a kernel function, in order; `None` if BTF has no such function
    /// (absent, inlined everywhere, or static and deduplicated away).
    pub fn function_params(&self, function: &str) -> Option<Vec<String>> {
        let func = self.raw.find(function, |k| k == kind::FUNC)?;
        let proto = self.raw.header(func)?.size_or_type;
        let header = self.raw.header(proto)?;
        (header.kind == kind::FUNC_PROTO).then(|| {
            (0..header.vlen)
                .map(|i| self.raw.string(self.raw.word(header.data + i * 8)).unwrap_or_default().to_string())
                .collect()
        })
    }
}

/// A function-pointer member of a struct: where it is and what its prototype says, with types
/// written as C would after typedefs and qualifiers are stripped (`void`, `_Bool`, `int`,
/// `struct mmu_notifier_range *`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionMember {
    pub offset: u32,
    pub name: String,
    pub returns: String,
    pub params: Vec<String>,
}

/// One type record's fixed part, and where its kind-specific data starts.
#[derive(Clone, Copy, Debug)]
struct TypeHeader {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    size_or_type: u32,
    /// Byte position of the data after the 12-byte header.
    data: usize,
}

/// The BTF blob and the start of every type record, indexed by type id less `first_id` (plus
/// one: index 0 stands for void, or for the base's types in split BTF).
struct RawBtf {
    bytes: Vec<u8>,
    strings: usize,
    strings_len: usize,
    type_starts: Vec<u32>,
    /// The id of this blob's first type: 1, or the base's type count for split BTF.
    first_id: u32,
    /// vmlinux's BTF under a module's: string offsets below its length are its strings.
    base: Option<Arc<RawBtf>>,
}

impl RawBtf {
    fn new(bytes: Vec<u8>, base: Option<Arc<RawBtf>>) -> Result<Self> {
        let u16_at = |p: usize| bytes.get(p..p + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |p: usize| bytes.get(p..p + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        if u16_at(0) != Some(BTF_MAGIC) {
            bail!("not little-endian BTF (bad magic)");
        }
        let field = |p: usize| u32_at(p).map(|v| v as usize).context("truncated BTF header");
        let header_len = field(4)?;
        let (types, types_len) = (header_len + field(8)?, field(12)?);
        let (strings, strings_len) = (header_len + field(16)?, field(20)?);
        if types + types_len > bytes.len() || strings + strings_len > bytes.len() {
            bail!("BTF sections run past the end of the blob");
        }
        let first_id = base.as_ref().map_or(1, |b| b.first_id + b.type_starts.len() as u32 - 1);
        let mut raw = Self { bytes, strings, strings_len, type_starts: vec![0], first_id, base };
        let mut position = types;
        while position < types + types_len {
            raw.type_starts.push(position as u32);
            let header = raw.header_at(position).context("truncated BTF type")?;
            position = header.data + raw.data_len(&header).context("unknown BTF kind")?;
        }
        Ok(raw)
    }

    fn word(&self, position: usize) -> u32 {
        self.bytes.get(position..position + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0)
    }

    fn header_at(&self, position: usize) -> Option<TypeHeader> {
        self.bytes.get(position..position + 12)?;
        let info = self.word(position + 4);
        Some(TypeHeader {
            name_off: self.word(position),
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            size_or_type: self.word(position + 8),
            data: position + 12,
        })
    }

    /// A type of this blob (`None` for void and, in split BTF, for the base's types).
    fn header(&self, id: u32) -> Option<TypeHeader> {
        let index = id.checked_sub(self.first_id)? as usize + 1;
        self.header_at(*self.type_starts.get(index)? as usize)
    }

    fn ids(&self) -> std::ops::Range<u32> {
        self.first_id..self.first_id + self.type_starts.len() as u32 - 1
    }

    fn member_offset(&self, struct_name: &str, path: &str) -> Option<u32> {
        let mut id = self.find(struct_name, |k| k == kind::STRUCT || k == kind::UNION)?;
        let mut offset = 0;
        for component in path.split('.') {
            let (member_type, member_offset) = self.member(id, component)?;
            offset += member_offset;
            id = self.strip_modifiers(member_type);
        }
        Some(offset)
    }

    fn struct_members(&self, struct_name: &str) -> Option<(u32, Vec<(u32, String)>)> {
        let id = self.find(struct_name, |k| k == kind::STRUCT)?;
        let header = self.header(id)?;
        let members = (0..header.vlen)
            .filter_map(|i| {
                let at = header.data + i * 12;
                let name = self.string(self.word(at)).filter(|n| !n.is_empty())?;
                let raw_offset = self.word(at + 8);
                let bits = if header.kind_flag { raw_offset & 0xff_ffff } else { raw_offset };
                Some((bits / 8, name.to_string()))
            })
            .collect();
        Some((header.size_or_type, members))
    }

    fn function_members(&self, struct_name: &str) -> Option<Vec<FunctionMember>> {
        let header = self.header(self.find(struct_name, |k| k == kind::STRUCT)?)?;
        let member = |at: usize| {
            let name = self.string(self.word(at)).filter(|n| !n.is_empty())?;
            let pointer = self.header(self.strip_modifiers(self.word(at + 4))).filter(|h| h.kind == kind::PTR)?;
            let proto =
                self.header(self.strip_modifiers(pointer.size_or_type)).filter(|h| h.kind == kind::FUNC_PROTO)?;
            let raw_offset = self.word(at + 8);
            let bits = if header.kind_flag { raw_offset & 0xff_ffff } else { raw_offset };
            Some(FunctionMember {
                offset: bits / 8,
                name: name.to_string(),
                returns: self.type_name(proto.size_or_type),
                params: (0..proto.vlen).map(|i| self.type_name(self.word(proto.data + i * 8 + 4))).collect(),
            })
        };
        Some((0..header.vlen).filter_map(|i| member(header.data + i * 12)).collect())
    }

    fn tracepoint_args(&self, event: &str) -> Option<Vec<String>> {
        let typedef = self.find(&format!("btf_trace_{event}"), |k| k == kind::TYPEDEF)?;
        let pointer = self.header(self.strip_modifiers(self.header(typedef)?.size_or_type))?;
        let proto = self.header(self.strip_modifiers(pointer.size_or_type)).filter(|h| h.kind == kind::FUNC_PROTO)?;
        Some((1..proto.vlen).map(|i| self.type_name(self.word(proto.data + i * 8 + 4))).collect())
    }

    /// A type as C writes it, typedefs and qualifiers stripped (pointers followed a few deep).
    fn type_name(&self, id: u32) -> String {
        let mut stars = String::new();
        let mut id = self.strip_modifiers(id);
        for _ in 0..4 {
            match self.header(id) {
                Some(h) if h.kind == kind::PTR => {
                    stars.push('*');
                    id = self.strip_modifiers(h.size_or_type);
                }
                _ => break,
            }
        }
        let base = match self.header(id) {
            None if id == 0 => "void".to_string(),
            None => "?".to_string(),
            Some(h) => {
                let name = self.string(h.name_off).unwrap_or_default();
                match h.kind {
                    kind::STRUCT => format!("struct {name}"),
                    kind::UNION => format!("union {name}"),
                    kind::ENUM | kind::ENUM64 => format!("enum {name}"),
                    kind::FUNC_PROTO => "function".to_string(),
                    _ => name.to_string(),
                }
            }
        };
        if stars.is_empty() { base } else { format!("{base} {stars}") }
    }

    /// Length of the kind-specific data after the header.
    fn data_len(&self, header: &TypeHeader) -> Option<usize> {
        Some(match header.kind {
            kind::INT | kind::VAR | kind::DECL_TAG => 4,
            kind::ARRAY => 12,
            kind::STRUCT | kind::UNION | kind::DATASEC => 12 * header.vlen,
            kind::ENUM | kind::FUNC_PROTO => 8 * header.vlen,
            kind::ENUM64 => 12 * header.vlen,
            2
            | 7
            | kind::TYPEDEF
            | kind::VOLATILE
            | kind::CONST
            | kind::RESTRICT
            | kind::FUNC
            | 16
            | kind::TYPE_TAG => 0,
            _ => return None,
        })
    }

    fn string(&self, offset: u32) -> Option<&str> {
        let offset = match &self.base {
            Some(base) if (offset as usize) < base.strings_len => return base.string(offset),
            Some(base) => offset - base.strings_len as u32,
            None => offset,
        };
        let start = self.strings + offset as usize;
        let end = self.strings + self.strings_len;
        let bytes = self.bytes.get(start..end)?;
        let len = bytes.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&bytes[..len]).ok()
    }

    /// The first type named `name` whose kind passes `wanted`.
    fn find(&self, name: &str, wanted: impl Fn(u32) -> bool) -> Option<u32> {
        self.ids().find(|&id| {
            self.header(id).is_some_and(|h| h.name_off != 0 && wanted(h.kind) && self.string(h.name_off) == Some(name))
        })
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn strip_modifiers(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.header(id) {
                Some(h)
                    if matches!(
                        h.kind,
                        kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG
                    ) =>
                {
                    id = h.size_or_type;
                }
                _ => break,
            }
        }
        id
    }

    /// Type id and byte offset of member `name` of struct/union `id`, searching anonymous
    /// members too (the kernel wraps members in anonymous unions as it evolves).
    fn member(&self, id: u32, name: &str) -> Option<(u32, u32)> {
        let header = self.header(id).filter(|h| matches!(h.kind, kind::STRUCT | kind::UNION))?;
        for i in 0..header.vlen {
            let at = header.data + i * 12;
            let (name_off, member_type, raw_offset) = (self.word(at), self.word(at + 4), self.word(at + 8));
            let (bit_offset, bitfield_size) =
                if header.kind_flag { (raw_offset & 0xff_ffff, raw_offset >> 24) } else { (raw_offset, 0) };
            if name_off == 0 {
                if let Some((t, inner)) = self.member(self.strip_modifiers(member_type), name) {
                    return Some((t, bit_offset / 8 + inner));
                }
            } else if self.string(name_off) == Some(name) {
                return (bitfield_size == 0 && bit_offset % 8 == 0).then_some((member_type, bit_offset / 8));
            }
        }
        None
    }

    fn enumerator(&self, name: &str) -> Option<i64> {
        self.ids().find_map(|id| {
            let h = self.header(id).filter(|h| h.kind == kind::ENUM || h.kind == kind::ENUM64)?;
            (0..h.vlen).find_map(|i| {
                let (enumerator, value) = self.enumerator_at(&h, i);
                (enumerator == name).then_some(value)
            })
        })
    }

    /// The `i`th enumerator of an ENUM or ENUM64 record: its name and value.
    fn enumerator_at(&self, h: &TypeHeader, i: usize) -> (&str, i64) {
        let stride = if h.kind == kind::ENUM { 8 } else { 12 };
        let at = h.data + i * stride;
        let value = if h.kind == kind::ENUM {
            // Signedness is in kind_flag; every enumerator mm-probe asks about is small.
            if h.kind_flag { i64::from(self.word(at + 4) as i32) } else { i64::from(self.word(at + 4)) }
        } else {
            (i64::from(self.word(at + 8)) << 32) | i64::from(self.word(at + 4))
        };
        (self.string(self.word(at)).unwrap_or_default(), value)
    }
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

        blob(&types, &strings.bytes)
    }

    /// A BTF blob of one `enum name { enumerators[0] = 0, … }` (4 bytes wide).
    pub(crate) fn btf_with_enum(name: &str, enumerators: &[&str]) -> Vec<u8> {
        const ENUM: u32 = 6;
        let mut strings = StringTable::default();
        let mut types = Vec::new();
        let header = [strings.add(name), (ENUM << 24) | enumerators.len() as u32, 4];
        let values = enumerators.iter().enumerate().flat_map(|(i, e)| [strings.add(e), i as u32]).collect::<Vec<_>>();
        for word in header.iter().chain(&values) {
            types.extend_from_slice(&word.to_le_bytes());
        }
        blob(&types, &strings.bytes)
    }

    /// The header, type section and string section of a BTF blob.
    fn blob(types: &[u8], strings: &[u8]) -> Vec<u8> {
        let mut blob = Vec::new();
        blob.extend_from_slice(&0xeb9fu16.to_le_bytes());
        blob.extend_from_slice(&[1, 0]); // version, flags
        blob.extend_from_slice(&24u32.to_le_bytes()); // header length
        blob.extend_from_slice(&0u32.to_le_bytes()); // type offset
        blob.extend_from_slice(&(types.len() as u32).to_le_bytes());
        blob.extend_from_slice(&(types.len() as u32).to_le_bytes()); // string offset
        blob.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        blob.extend_from_slice(types);
        blob.extend_from_slice(strings);
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
    fn struct_members_list_named_members_with_offsets() {
        let btf = sample();
        let (size, members) = btf.struct_members("vm_area_struct").unwrap();
        assert!(size > 0);
        assert!(members.iter().any(|(offset, name)| name == "vm_mm" && *offset == 16), "{members:?}");
        assert!(btf.struct_members("no_such_struct").is_none());
    }

    /// A module's split BTF over [`sample_btf`] (12 types): type 13 is `struct kvm { u64 pad;
    /// u64 mmu_lock; u64 vm_mm; }`, `u64` being the base's type 1 and the name `vm_mm` the
    /// base's string.
    fn module_over_sample(base: &KernelBtf) -> ModuleBtf {
        let base_strings = base.raw.strings_len as u32;
        let mut strings = Vec::new();
        let mut add = |s: &str| {
            let offset = base_strings + strings.len() as u32;
            strings.extend_from_slice(s.as_bytes());
            strings.push(0);
            offset
        };
        let (kvm, pad, lock) = (add("kvm"), add("pad"), add("mmu_lock"));
        let vm_mm = (0..base_strings).find(|&o| base.raw.string(o) == Some("vm_mm")).unwrap();
        let mut types = Vec::new();
        for word in [kvm, (4 << 24) | 3, 24, pad, 1, 0, lock, 1, 64, vm_mm, 1, 128] {
            types.extend_from_slice(&u32::to_le_bytes(word));
        }
        KernelBtf::split(&base.raw, blob(&types, &strings)).expect("split BTF parses")
    }

    #[test]
    fn a_modules_split_btf_continues_vmlinuxs_ids_and_strings() {
        let base = sample();
        let module = module_over_sample(&base);
        assert_eq!(module.raw.ids(), 13..14);
        assert_eq!(module.member_offset("kvm", "mmu_lock"), Some(8));
        let (size, members) = module.struct_members("kvm").unwrap();
        assert_eq!(size, 24);
        assert_eq!(members, [(0, "pad".to_string()), (8, "mmu_lock".into()), (16, "vm_mm".into())]);
        assert_eq!(module.member_offset("vm_area_struct", "vm_mm"), None, "the base's types are not the module's");
        assert_eq!(base.member_offset("kvm", "mmu_lock"), None);
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
        assert_eq!(btf.enum_values("tva_type"), Some(vec![("TVA_SMAPS".into(), 0), ("TVA_PAGEFAULT".into(), 1)]));
        assert_eq!(btf.enum_values("scan_result"), None);
    }
}

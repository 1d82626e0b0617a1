//! Rebuild when bpf-linker changes: a new linker (or a new LLVM under it) changes the object.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}

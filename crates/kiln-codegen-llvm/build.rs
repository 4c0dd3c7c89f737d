//! Hashes this crate's sources and the kernel layer's (`kiln-kernel`, which decides what the
//! kernels are) into `KILN_CODEGEN_SOURCE_HASH`, which the kernel cache puts in its keys: a
//! library that other code generation built is never loaded (see `src/cache.rs`); and them
//! with the optimizer's and the IR's into `KILN_PREPARE_SOURCE_HASH`, for the index of input
//! programs (`src/cpu/lowering.rs`).

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// 64-bit FNV-1a over each file's path and bytes, in path order, of the files under `dirs`.
fn hash_of(dirs: &[&str]) -> u64 {
    let mut files = Vec::new();
    for d in dirs {
        sources(Path::new(d), &mut files);
    }
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_default();
        for &b in f.to_string_lossy().as_bytes().iter().chain(&bytes) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn main() {
    let codegen = ["src", "../kiln-kernel/src"];
    for d in codegen {
        println!("cargo:rerun-if-changed={d}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!(
        "cargo:rustc-env=KILN_CODEGEN_SOURCE_HASH={:016x}",
        hash_of(&codegen)
    );
    // What the index of input programs (`src/cpu/lowering.rs`) depends on besides this crate:
    // the optimizer (its code and rules) and the IR (its printer and parser).
    let prepare = ["../kiln-opt/src", "../kiln-opt/rules", "../kiln-ir/src"];
    for d in prepare {
        println!("cargo:rerun-if-changed={d}");
    }
    let mut dirs = codegen.to_vec();
    dirs.extend(prepare);
    println!(
        "cargo:rustc-env=KILN_PREPARE_SOURCE_HASH={:016x}",
        hash_of(&dirs)
    );
}

//! Hashes this crate's sources and the kernel layer's (`kiln-kernel`, which decides what the
//! kernels are) into `KILN_CODEGEN_SOURCE_HASH`, which the kernel cache puts in its keys: a
//! library that other code generation built is never loaded (see `src/cache.rs`); and them
//! with the optimizer's and the IR's into `KILN_PREPARE_SOURCE_HASH`, for the index of input
//! programs (`src/cpu/lowering.rs`).
//! It also links LLVM (see [`link_llvm`]).

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

/// What `llvm-config` prints for `args`, trimmed.
fn llvm_config(config: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(config)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", config.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Links LLVM 22 by the profile (inkwell's `llvm-sys` links none: feature
/// `llvm22-1-no-llvm-linking`). Optimized builds (the benchmarks, the CLI, users' release
/// binaries) link LLVM's static libraries, as compile times are measured; debug and test
/// builds link the shared `libLLVM`, so that each of the workspace's test binaries is not a
/// copy of LLVM (about 75 MB each, some 90 binaries).
fn link_llvm() {
    println!("cargo:rerun-if-env-changed=LLVM_SYS_221_PREFIX");
    let prefix = std::env::var_os("LLVM_SYS_221_PREFIX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/llvm-22"));
    let config = prefix.join("bin").join("llvm-config");
    let shared = std::env::var("PROFILE").as_deref() == Ok("debug");
    let (mode, kind) = if shared {
        ("--link-shared", "dylib")
    } else {
        ("--link-static", "static")
    };
    println!(
        "cargo:rustc-link-search=native={}",
        llvm_config(&config, &["--libdir"])
    );
    for file in llvm_config(&config, &[mode, "--libnames"]).split_whitespace() {
        let name = file.strip_prefix("lib").unwrap_or(file);
        let name = name
            .strip_suffix(".a")
            .or_else(|| name.strip_suffix(".so"))
            .unwrap_or(name);
        println!("cargo:rustc-link-lib={kind}={name}");
    }
    for flag in llvm_config(&config, &[mode, "--system-libs"]).split_whitespace() {
        if let Some(name) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={name}");
        } else if flag.starts_with('/') {
            // A library named by its path (`/usr/lib/x86_64-linux-gnu/libz3.so`).
            let path = Path::new(flag);
            let dir = path.parent().expect("an absolute path has a parent");
            let stem = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let name = stem.strip_prefix("lib").unwrap_or(stem);
            let name = name.split(".so").next().unwrap_or(name);
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=dylib={name}");
        }
    }
    println!("cargo:rustc-link-lib=dylib=stdc++");
}

fn main() {
    link_llvm();
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

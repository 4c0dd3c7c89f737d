//! A persistent on-disk cache of compiled kernels.
//!
//! A function whose kernels are expensive to compile (any GEMM, many kernels, or kernels heavy
//! with code: see `cpu::CACHE_WEIGHT`) is compiled ahead of time to a shared library: its
//! kernels are optimized (each matrix product in a module of its own, the others together, on
//! all cores: `cpu::kernel_jobs`), written as position-independent objects, linked by the
//! system linker (`ld -shared`, or `$CC -shared`), and loaded with `dlopen`. The library is
//! stored under a key hashed from what its modules are built from (the function, its fused
//! kernels and in-place outputs), the settings that change their code (vector width, streaming
//! stores, row caches, the pass pipelines), the CPU's name and features, LLVM's version and a
//! hash of this crate's sources (`build.rs`), so the next process that compiles the same
//! function with the same code generation loads it without building any LLVM IR. Next to each
//! library lies a checksum of its bytes; a library whose checksum does not match, that does not
//! load, or that lacks a kernel is rebuilt.
//!
//! The GEMM routines the kernels call (register tiles, packing: `cpu::gemm::Routine`) do not
//! depend on the function: each is stored once as an object file (with its checksum) under a
//! key of its name and the machine settings, and linked into every library that calls it.
//!
//! The directory is `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln/kernels`, else
//! `~/.cache/kiln/kernels`; `KILN_NO_CACHE=1` turns the cache off (everything is JIT-compiled).
//!
//! # What the cache trusts
//!
//! The checksums guard against damage (a write cut short, a disk error, a file left by another
//! build), not against tampering: whoever can write into the directory can replace a library
//! and its checksum together, and a loaded library runs as part of this process. So the cache
//! trusts only what its owner alone can write. kiln creates the directory (and each missing
//! parent) with mode 0700 and its files with mode 0600, and it neither loads from nor stores
//! into a directory that is not owned by the current user or that its group or other users may
//! write ([`check_dir`]): it warns once on stderr, naming the directory and why, and compiles
//! without the cache ([`usable`]). A cached file that others may write or that another user
//! owns is not loaded either (it is rebuilt, replacing it). The check cannot close every race
//! (the library is checked, then opened by its path), which is why the directory itself must
//! be private.

use crate::{Error, Result};
use std::fs::Metadata;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// The effective user id of this process.
fn current_user() -> u32 {
    // SAFETY: geteuid takes nothing, cannot fail and touches no memory of ours.
    unsafe { geteuid() }
}

/// Why a directory or file of permission bits `mode` owned by user `owner` must not be
/// trusted by user `me`: owned by someone else, or writable by its group or by all users.
pub fn distrust(mode: u32, owner: u32, me: u32) -> Option<String> {
    if owner != me {
        return Some(format!(
            "it is owned by user {owner}, not by this process's user {me}"
        ));
    }
    let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (false, false) => return None,
        (true, false) => "its group",
        (false, true) => "all users",
        (true, true) => "its group and all users",
    };
    Some(format!(
        "it is writable by {who} (mode {:03o})",
        mode & 0o7777
    ))
}

fn distrusted(m: &Metadata) -> Option<String> {
    distrust(m.permissions().mode(), m.uid(), current_user())
}

/// Checks that the cache directory `dir` may be trusted: a directory owned by the current
/// user that neither its group nor other users may write. The error names the directory and
/// says what is wrong.
pub fn check_dir(dir: &Path) -> std::result::Result<(), String> {
    let why = match std::fs::metadata(dir) {
        Err(e) => e.to_string(),
        Ok(m) if !m.is_dir() => "it is not a directory".to_string(),
        Ok(m) => match distrusted(&m) {
            None => return Ok(()),
            Some(why) => why,
        },
    };
    Err(format!("kernel cache directory {}: {why}", dir.display()))
}

/// Whether the cache in `dir` may be used: it passes [`check_dir`], or does not exist yet (it
/// is created private when the first library is stored). When it may not, warns on stderr,
/// once per directory, and the caller compiles without the cache.
pub fn usable(dir: &Path) -> bool {
    if !dir.exists() {
        return true;
    }
    let Err(why) = check_dir(dir) else {
        return true;
    };
    static WARNED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !warned.iter().any(|d| d == dir) {
        warned.push(dir.to_path_buf());
        eprintln!(
            "kiln: {why}; not loading kernels from it or storing them there, compiling without \
             the cache (make it a directory only you own and can write, e.g. `chmod 700 {}`, or \
             set KILN_CACHE_DIR)",
            dir.display()
        );
    }
    false
}

/// Creates `dir` and its missing parents for their owner only (mode 0700) and checks it
/// ([`check_dir`]) before anything is stored there.
fn private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::Llvm(format!("kernel cache {}: {e}", dir.display())))?;
    check_dir(dir).map_err(|why| Error::Llvm(format!("{why}; not storing kernels there")))
}

/// Writes `bytes` to a new file at `path` that only its owner may read or write (mode 0600).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

/// The bytes of the cached file at `path`, if it is a regular file that may be trusted (see
/// [`distrust`]); a file that may not is reported once per process.
fn read_trusted(path: &Path) -> Option<Vec<u8>> {
    let mut file = std::fs::File::open(path).ok()?;
    // The open file's own metadata, so the checked file is the one read.
    let m = file.metadata().ok()?;
    if !m.is_file() {
        return None;
    }
    if let Some(why) = distrusted(&m) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            eprintln!(
                "kiln: kernel cache: not loading {}: {why}; it is rebuilt",
                path.display()
            )
        });
        return None;
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// 128-bit FNV-1a of `bytes`, as 32 hex digits (stable across runs and builds): the
/// runtime's library checksum ([`kiln_runtime::library::checksum`]).
pub fn hash(bytes: &[u8]) -> String {
    kiln_runtime::library::checksum(bytes)
}

/// The cache key of `what` (a description of the kernels) compiled for `machine` (everything
/// else that decides their machine code).
pub fn key(what: &str, machine: &str) -> String {
    let (major, minor, patch) = inkwell::support::get_llvm_version();
    hash(format!("kiln-kernels-v2\n{major}.{minor}.{patch}\n{machine}\n{what}").as_bytes())
}

/// A loaded shared library of kernels (the runtime's: `kiln-run` loads an ahead-of-time
/// artifact's with the same code, without LLVM).
pub use kiln_runtime::library::Library;

/// Loads the library at `path` (which the caller checked may be trusted).
fn open_library(path: &Path) -> Result<Library> {
    Library::open(path).map_err(Error::Llvm)
}

fn paths(dir: &Path, key: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{key}.so")),
        dir.join(format!("{key}.sum")),
    )
}

/// The cached library for `key` with every one of `symbols`, if it is there and intact, and
/// the directory and its files may be trusted (see the module docs).
pub fn load(dir: &Path, key: &str, symbols: &[String]) -> Option<Library> {
    check_dir(dir).ok()?;
    let (so, sum) = paths(dir, key);
    read_checked(&so, &sum)?;
    let lib = open_library(&so).ok()?;
    symbols
        .iter()
        .all(|s| lib.symbol(s).is_some())
        .then_some(lib)
}

/// The bytes of the library stored for `key`, if it is there and intact and the directory and
/// its files may be trusted (an ahead-of-time artifact carries them: `cpu::aot`).
pub fn library_bytes(dir: &Path, key: &str) -> Option<Vec<u8>> {
    check_dir(dir).ok()?;
    let (so, sum) = paths(dir, key);
    read_checked(&so, &sum)
}

/// The bytes of `file` if `sum` holds their checksum and both may be trusted.
fn read_checked(file: &Path, sum: &Path) -> Option<Vec<u8>> {
    let bytes = read_trusted(file)?;
    let want = read_trusted(sum)?;
    (String::from_utf8_lossy(&want).trim() == hash(&bytes)).then_some(bytes)
}

/// Links the position-independent objects `objs` into the shared library `out`: with `ld`
/// directly, or through `linker -shared` when one is given ([`kiln_kernel::Options::linker`],
/// `CC`), or `cc` when `ld` fails. The
/// compiler driver runs `collect2` and adds start files a `dlopen`ed library of kernels does not
/// need: linking the MLP step's 28 objects took 19-24 ms through `cc`, 11-12 ms with `ld`,
/// and the link is the one step of a compile that runs on one core. The math library is
/// linked in only when the objects call a function none of them defines (`libm`, `outside`):
/// reading it (its linker script pulls in `libmvec` too) took 3-4 ms of `ld`'s 6 ms for the
/// MLP step's routines on the Zen 4 EPYC, whose kernels call nothing outside.
fn link(objs: &[PathBuf], out: &Path, linker: Option<&str>, outside: bool) -> Result<()> {
    let run = |program: &str| {
        std::process::Command::new(program)
            .arg("-shared")
            .arg("-o")
            .arg(out)
            .args(objs)
            .args(outside.then_some("-lm"))
            .output()
            .map_err(|e| format!("running `{program}` to link kernels: {e}"))
            .and_then(|o| {
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "`{program} -shared` failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    ))
                }
            })
    };
    match linker {
        Some(cc) => run(cc),
        None => run("ld").or_else(|ld| run("cc").map_err(|cc| format!("{ld}; then {cc}"))),
    }
    .map_err(Error::Llvm)
}

/// The cached object file for `key` (a GEMM routine's, which every library that calls it links
/// in), if it is there and intact.
pub fn load_object(dir: &Path, key: &str) -> Option<Vec<u8>> {
    load_file(dir, key, "o")
}

/// Stores the object file `bytes` under `key`, with its checksum.
pub fn store_object(dir: &Path, key: &str, bytes: &[u8]) -> Result<()> {
    store_file(dir, key, "o", bytes)
}

/// The cached file `key.ext` (an object file, or a lowered program of the index of input
/// programs: `cpu::lowering`), if it is there and intact.
pub fn load_file(dir: &Path, key: &str, ext: &str) -> Option<Vec<u8>> {
    check_dir(dir).ok()?;
    read_checked(
        &dir.join(format!("{key}.{ext}")),
        &dir.join(format!("{key}.{ext}.sum")),
    )
}

/// Stores `bytes` as the file `key.ext`, with its checksum.
pub fn store_file(dir: &Path, key: &str, ext: &str, bytes: &[u8]) -> Result<()> {
    let io = |e: std::io::Error| Error::Llvm(format!("kernel cache {}: {e}", dir.display()));
    private_dir(dir)?;
    let tag = temp_tag();
    let sum = format!("{ext}.sum");
    for (ext, data) in [(ext, bytes), (sum.as_str(), hash(bytes).as_bytes())] {
        let tmp = dir.join(format!("{key}.{tag}.{ext}"));
        write_private(&tmp, data).map_err(io)?;
        std::fs::rename(&tmp, dir.join(format!("{key}.{ext}"))).map_err(io)?;
    }
    Ok(())
}

/// A name part unique to this process and thread, for temporary files: several processes may
/// build the same key at once; the renames at the end are atomic, and either result is the same.
fn temp_tag() -> String {
    format!("{}.{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_")
}

/// Links `objects` (with `linker`, if given, else `ld` or `cc`) into a shared library stored under
/// `key`, with its checksum, and loads it.
pub fn store(dir: &Path, key: &str, objects: &[Vec<u8>], linker: Option<&str>) -> Result<Library> {
    let io = |e: std::io::Error| Error::Llvm(format!("kernel cache {}: {e}", dir.display()));
    private_dir(dir)?;
    let (so, sum) = paths(dir, key);
    let tag = temp_tag();
    let objs: Vec<PathBuf> = (0..objects.len())
        .map(|i| dir.join(format!("{key}.{tag}.{i}.o")))
        .collect();
    let tmp = dir.join(format!("{key}.{tag}.so"));
    for (path, bytes) in objs.iter().zip(objects) {
        write_private(path, bytes).map_err(io)?;
    }
    let linked = link(
        &objs,
        &tmp,
        linker,
        crate::elf_symbols::call_outside(objects),
    );
    for path in &objs {
        let _ = std::fs::remove_file(path);
    }
    if let Err(e) = linked {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The linker makes the library executable for everyone; only its owner needs it.
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    let bytes = std::fs::read(&tmp).map_err(io)?;
    std::fs::rename(&tmp, &so).map_err(io)?;
    let sum_tmp = dir.join(format!("{key}.{tag}.sum"));
    write_private(&sum_tmp, hash(&bytes).as_bytes()).map_err(io)?;
    std::fs::rename(&sum_tmp, &sum).map_err(io)?;
    open_library(&so)
}

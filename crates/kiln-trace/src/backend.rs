//! Where tensor programs run: a [`Backend`] compiles a [`Func`] into an [`Executable`].
//!
//! The CPU backend (LLVM kernels, JIT-compiled for this machine) is the default; set
//! `KILN_BACKEND=reference` to run everything on the reference interpreter instead, or install
//! another backend with [`set_backend`]. Compiled executables are cached by backend and program text, so an op or a
//! traced function of a given signature compiles once.

use crate::{Error, Result};
use kiln_ir::{Func, Literal};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

/// A compiled program.
pub trait Executable: Send + Sync {
    /// Runs the program on arguments of its parameter types (borrowed: a backend copies only
    /// what it must).
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>>;

    /// Runs like [`Executable::run`], where the arguments passed by value are donated: a
    /// backend may write results into their buffers (compiled for it with
    /// [`Backend::compile_donating`]). By default they are only read.
    fn run_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>> {
        let refs: Vec<&Literal> = args.iter().map(|a| a.as_ref()).collect();
        self.run(&refs)
    }
}

/// A compiler from IR functions to executables.
pub trait Backend: Send + Sync {
    /// A short name, part of the compile cache key.
    fn name(&self) -> &'static str;
    /// Compiles a verified function.
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>>;

    /// Compiles a verified function whose parameters `p` with `donated[p]` the caller gives up
    /// ([`Executable::run_donating`] passes them by value), so their buffers may hold results.
    /// By default donation is ignored.
    fn compile_donating(&self, f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
        let _ = donated;
        self.compile(f)
    }
}

/// The reference interpreter as a backend: slow, exact, always available.
pub struct Reference;

struct Interpreted(Func);

impl Executable for Interpreted {
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        let args: Vec<Literal> = args.iter().map(|&a| a.clone()).collect();
        kiln_reference::eval(&self.0, &args).map_err(|e| Error::internal("run", e.to_string()))
    }
}

impl Backend for Reference {
    fn name(&self) -> &'static str {
        "reference"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        kiln_ir::verify(f).map_err(|e| Error::internal("compile", e.to_string()))?;
        Ok(Arc::new(Interpreted(f.clone())))
    }
}

/// The CPU backend: fused LLVM kernels, optimized at O2 for the host CPU.
pub struct Cpu;

struct CpuCompiled(kiln_codegen_llvm::cpu::CpuExecutable);

impl Executable for CpuCompiled {
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        self.0
            .call(args)
            .map_err(|e| Error::internal("run", e.to_string()))
    }
    fn run_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>> {
        self.0
            .call_donating(args)
            .map_err(|e| Error::internal("run", e.to_string()))
    }
}

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        self.compile_donating(f, &[])
    }
    fn compile_donating(&self, f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
        let dir = kiln_codegen_llvm::cache::dir();
        let exe =
            kiln_codegen_llvm::cpu::CpuExecutable::compile_donating(f, donated, dir.as_deref())
                .map_err(|e| Error::internal("compile", e.to_string()))?;
        Ok(Arc::new(CpuCompiled(exe)))
    }
}

static BACKEND: RwLock<Option<Arc<dyn Backend>>> = RwLock::new(None);

type Cache = Mutex<Option<HashMap<String, Arc<dyn Executable>>>>;
static CACHE: Cache = Mutex::new(None);

/// Installs the backend used by eager ops and compiled functions from now on.
pub fn set_backend(b: Arc<dyn Backend>) {
    *BACKEND.write().unwrap_or_else(|e| e.into_inner()) = Some(b);
}

/// The installed backend: the CPU backend unless another was set or `KILN_BACKEND=reference`.
pub fn backend() -> Arc<dyn Backend> {
    if let Some(b) = BACKEND.read().unwrap_or_else(|e| e.into_inner()).clone() {
        return b;
    }
    let b: Arc<dyn Backend> = match std::env::var("KILN_BACKEND").as_deref() {
        Ok("reference") => Arc::new(Reference),
        _ => Arc::new(Cpu),
    };
    *BACKEND.write().unwrap_or_else(|e| e.into_inner()) = Some(b.clone());
    b
}

/// Compiles `f` with the installed backend, or returns the cached executable for the same
/// backend and program text.
pub fn compile_cached(f: &Func) -> Result<Arc<dyn Executable>> {
    compile_cached_donating(f, &[])
}

/// [`compile_cached`] for a function whose parameters `p` with `donated[p]` are donated (see
/// [`Backend::compile_donating`]); the donation is part of the cache key.
pub fn compile_cached_donating(f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
    let b = backend();
    let mask: String = donated.iter().map(|&d| if d { 'd' } else { '-' }).collect();
    let key = format!("{}\n{mask}\n{}", b.name(), kiln_ir::print_func(f));
    if let Some(e) = CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return Ok(e.clone());
    }
    let exe = if donated.iter().any(|&d| d) {
        b.compile_donating(f, donated)?
    } else {
        b.compile(f)?
    };
    CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, exe.clone());
    Ok(exe)
}

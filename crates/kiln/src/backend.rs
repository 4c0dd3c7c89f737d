//! Where tensor programs run: [`kiln_trace::backend`]'s registry, the CPU backend, and the
//! choice between backends.
//!
//! The CPU backend ([`Cpu`]: fused LLVM kernels, JIT-compiled for this machine) is the
//! default; set `KILN_BACKEND=reference` to run everything on the reference interpreter
//! instead, `KILN_BACKEND=ptx-emulator` to run compiled functions through the GPU mapping on the
//! GPU emulator ([`PtxEmulator`]), or install another backend with [`set_backend`]. The facade reads the process
//! environment ([`Options::from_vars`]) once, at the first compile, unless [`set_options`]
//! came first.
//!
//! The facade installs these defaults into `kiln_trace` when the program loads, before
//! `main` (a constructor in the platform's init section), so eager ops on a [`crate::Tensor`]
//! run on the CPU with nothing to call first; [`crate::jit`], the transforms, [`options`] and
//! [`backend`] install them too. Without them `kiln_trace` runs nothing: it returns an error
//! that says no backend is installed, never the reference interpreter in the CPU's place.

use crate::{Error, Result};
use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{Func, Literal};
pub use kiln_trace::backend::*;
use std::borrow::Cow;
use std::sync::{Arc, Once};

/// The CPU backend: fused LLVM kernels, optimized at O2 for the host CPU.
pub struct Cpu;

struct CpuCompiled(CpuExecutable);

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
        self.compile_with_options(f, donated, &options())
    }
    fn compile_with_options(
        &self,
        f: &Func,
        donated: &[bool],
        opts: &Options,
    ) -> Result<Arc<dyn Executable>> {
        let exe = CpuExecutable::compile_with_options(f, donated, opts)
            .map_err(|e| Error::internal("compile", e.to_string()))?;
        Ok(Arc::new(CpuCompiled(exe)))
    }
}

/// The GPU mapping on the GPU emulator (`KILN_BACKEND=ptx-emulator`): each function is
/// lowered for an H200 ([`kiln_kernel::TargetInfo::h200`]), its kernels mapped to the GPU IR
/// ([`kiln_kernel::gpu`]) and run, thread by thread, on `kiln_runtime::gpu_emu`, which checks
/// for shared-memory races, divergent barriers and accesses out of bounds. Slow: it is for
/// testing the GPU mapping where there is no GPU.
pub struct PtxEmulator;

struct Emulated {
    lowered: kiln_kernel::pipeline::Lowered,
    target: kiln_kernel::TargetInfo,
}

impl Executable for Emulated {
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        let args: Vec<Literal> = args.iter().map(|&a| a.clone()).collect();
        kiln_runtime::gpu_emu::run_lowered(&self.lowered, &self.target, &args)
            .map(|(outs, _)| outs)
            .map_err(|e| Error::internal("run", e.to_string()))
    }
}

impl Backend for PtxEmulator {
    fn name(&self) -> &'static str {
        "ptx-emulator"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        self.compile_donating(f, &[])
    }
    fn compile_donating(&self, f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
        self.compile_with_options(f, donated, &options())
    }
    fn compile_with_options(
        &self,
        f: &Func,
        donated: &[bool],
        opts: &Options,
    ) -> Result<Arc<dyn Executable>> {
        let target = kiln_kernel::TargetInfo::h200();
        let lowered =
            kiln_kernel::pipeline::lower_program(f, donated, opts, &target, None, &mut |_| {})
                .map_err(|e| Error::internal("compile", e.to_string()))?;
        Ok(Arc::new(Emulated { lowered, target }))
    }
}

/// The backend `opts` choose: the reference interpreter under `KILN_BACKEND=reference`, the
/// GPU emulator under `KILN_BACKEND=ptx-emulator`, else the CPU backend.
fn pick(opts: &Options) -> Arc<dyn Backend> {
    match opts.backend.as_deref() {
        Some("reference") => Arc::new(Reference),
        Some("ptx-emulator") => Arc::new(PtxEmulator),
        _ => Arc::new(Cpu),
    }
}

/// The process environment's options (see [`kiln_kernel::options::SWITCHES`]): the one place
/// below `main` that reads it.
fn from_environment() -> Options {
    Options::from_vars(&|name| std::env::var(name).ok())
}

/// Installs the facade's defaults into `kiln_trace`: the backend choice ([`pick`]) and the
/// environment as the options' source. Neither replaces what was set in code
/// ([`set_backend`], [`set_options`]); installing again does nothing.
pub(crate) fn install() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        kiln_trace::backend::set_default_backend(pick);
        kiln_trace::backend::set_options_source(from_environment);
    });
}

/// [`install`] as a constructor the platform's loader runs before `main`: its pointer lives in
/// the init section (`.init_array` on ELF systems, `__mod_init_func` on Apple's, `.CRT$XCU`
/// on Windows) and is marked used, so the linker keeps it whenever the facade is linked.
#[used]
#[cfg_attr(
    any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "netbsd",
        target_os = "openbsd",
        target_os = "dragonfly",
        target_os = "illumos"
    ),
    unsafe(link_section = ".init_array")
)]
#[cfg_attr(
    target_vendor = "apple",
    unsafe(link_section = "__DATA,__mod_init_func")
)]
#[cfg_attr(windows, unsafe(link_section = ".CRT$XCU"))]
static INSTALL_AT_LOAD: extern "C" fn() = {
    extern "C" fn install_at_load() {
        install();
    }
    install_at_load
};

/// The options compiles run under: those given to [`set_options`], else the process
/// environment's, read once.
pub fn options() -> Options {
    install();
    kiln_trace::backend::options()
}

/// The installed backend: the one set with [`set_backend`], else the CPU backend (the
/// reference interpreter under `KILN_BACKEND=reference`).
pub fn backend() -> Result<Arc<dyn Backend>> {
    install();
    kiln_trace::backend::backend()
}

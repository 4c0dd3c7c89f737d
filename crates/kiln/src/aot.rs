//! Ahead-of-time compilation: a function compiled here, for a GPU or a CPU, into an artifact
//! that the runtime-only `kiln-run` binary (no LLVM linked) loads and runs where no compiler
//! is.
//!
//! [`compile`] traces a function at example arguments (as [`crate::jit`] would), lowers it for
//! the [`Target`] (the whole pipeline: optimized, canonicalized, fused, scheduled), and:
//!
//! - for a GPU ([`Target::h200`], [`Target::a100`], [`Target::ptx`]), derives its device plan
//!   and renders every kernel step as PTX for the target's SM;
//! - for a CPU ([`Target::host`]: this machine, its CPU's name and features as LLVM reports
//!   them), lowers it as the CPU JIT does and builds the kernels of the function and of each
//!   control-flow region (a loop's condition and body, a sort's comparator) into shared
//!   libraries with the kernel cache's code (position-independent objects linked by `ld
//!   -shared`), each stored with its checksum. `kiln-run` checks that its CPU has every
//!   feature the code was compiled for, loads the libraries and runs the steps as the CPU
//!   backend does, so the results are those of [`crate::jit`] on the same machine, bit for
//!   bit.
//!
//! The [`Artifact`]'s files and what `kiln-run` checks are described in `kiln_run::artifact`
//! and `kiln_run::cpu`; `docs/gpu.md` shows the commands:
//!
//! ```text
//! kiln-run mlp.kiln-aot --inputs x.npy --out results            # a CPU artifact: on this CPU
//! kiln-run mlp.kiln-aot --random-inputs 1 --bench 100           # timed calls
//! ```
//!
//! ```no_run
//! use kiln::Tensor;
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
//! let artifact = kiln::aot::compile(|x: &Tensor| x.exp() + x, &x, kiln::aot::Target::h200()).unwrap();
//! artifact.save(std::path::Path::new("exp_plus")).unwrap();
//! // Then, on the GPU machine: kiln-run exp_plus --inputs x.npy --out results
//! ```

use crate::lower::trace_ir;
use crate::{Error, Options, Result, Tree};
use kiln_codegen_llvm::ptx::{PtxTarget, program_ptx};
use kiln_ir::{Func, Loc, Module};
pub use kiln_run::artifact::Kind;
pub use kiln_run::{Artifact, Target};

/// `f` traced at `example`'s signature (its leaves' dtypes and shapes) and compiled for
/// `target` under the process's options ([`crate::options`]).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, aot, jit};
/// let f = |x: &Tensor| x.exp() + x;
/// let x = Tensor::from_vec(vec![0.0f32, 1.0, 2.0], [3]).unwrap();
/// let dir = std::env::temp_dir().join(format!("kiln-doc-aot-compile-{}", std::process::id()));
/// aot::compile(f, &x, aot::Target::host()).unwrap().save(&dir).unwrap();
/// // Loaded and run as `kiln-run` does: jit's results, bit for bit.
/// let artifact = aot::Artifact::load(&dir).unwrap();
/// let runner = kiln_run::Runner::open_cpu(&artifact).unwrap();
/// let out = Tensor::new(runner.run(&[x.to_literal().unwrap()]).unwrap().remove(0));
/// assert_eq!(out.to_vec::<f32>().unwrap(), jit(f).call(&x).unwrap().to_vec::<f32>().unwrap());
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[track_caller]
pub fn compile<I: Tree, O: Tree>(
    f: impl FnOnce(&I) -> O,
    example: &I,
    target: Target,
) -> Result<Artifact> {
    let loc = Loc::caller();
    let func = trace_ir(f, example)?;
    compile_func_with_options(&func, &crate::options(), target)
        .map_err(|e| Error::at("aot::compile", e.message, loc))
}

/// The entry function of `m` (`@main`, else the first) compiled for `target`.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, aot, ir::Module};
/// let f = kiln::lower::trace_ir(|x: &Tensor| x.tanh(), &Tensor::ones(DType::F32, [8])).unwrap();
/// let artifact = aot::compile_module(&Module::from_func(f), aot::Target::a100()).unwrap();
/// assert!(!artifact.ptx.is_empty() && artifact.ptx.iter().all(|p| p.contains(".target sm_80")));
/// let dir = std::env::temp_dir().join(format!("kiln-doc-aot-module-{}", std::process::id()));
/// artifact.save(&dir).unwrap();
/// let back = aot::Artifact::load(&dir).unwrap();
/// assert_eq!((back.ptx, back.results[0].ty.to_string()), (artifact.ptx, "f32[8]".to_string()));
/// std::fs::remove_dir_all(&dir).unwrap();
/// assert!(aot::compile_module(&Module { funcs: vec![] }, aot::Target::a100()).is_err());
/// ```
pub fn compile_module(m: &Module, target: Target) -> Result<Artifact> {
    let f = m
        .entry()
        .ok_or_else(|| Error::internal("aot::compile_module", "the module has no function"))?;
    compile_func_with_options(f, &crate::options(), target)
}

/// `f` compiled for `target` under `opts`: lowered, its device plan derived from the lowered
/// program's text (as `kiln-run` derives it), each kernel step rendered as PTX.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Options, Tensor, aot};
/// let x = Tensor::ones(DType::F32, [16]);
/// let f = kiln::lower::trace_ir(|x: &Tensor| (x.tanh() * 2.0).exp(), &x).unwrap();
/// let fused = aot::compile_func_with_options(&f, &kiln::options(), aot::Target::h200()).unwrap();
/// let opts = Options { fusion: false, ..kiln::options() };
/// let unfused = aot::compile_func_with_options(&f, &opts, aot::Target::h200()).unwrap();
/// assert!(unfused.ptx.len() > fused.ptx.len(), "{} vs {}", unfused.ptx.len(), fused.ptx.len());
/// let dir = std::env::temp_dir().join(format!("kiln-doc-aot-options-{}", std::process::id()));
/// unfused.save(&dir).unwrap();
/// assert!(!aot::Artifact::load(&dir).unwrap().options.fusion); // the switches travel with it
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn compile_func_with_options(f: &Func, opts: &Options, target: Target) -> Result<Artifact> {
    let fail = |m: String| Error::internal("aot::compile", format!("@{}: {m}", f.name));
    if let Kind::Cpu { cpu } = &target.kind {
        return compile_cpu(f, opts, cpu, &target.features).map_err(fail);
    }
    if target.info.gpu.is_none() {
        return Err(fail("the target describes no GPU".into()));
    }
    let opts = opts.clone().without_cache();
    let lowered =
        kiln_kernel::pipeline::lower_program(f, &[], &opts, &target.info, None, &mut |_| {})
            .map_err(|e| fail(e.to_string()))?;
    let ptx_target = PtxTarget {
        sm: target.sm.clone(),
        features: target.features.clone(),
    };
    let render =
        |p: &kiln_kernel::gpu::GpuProgram| program_ptx(p, &ptx_target).map_err(|e| e.to_string());
    Artifact::new(lowered.func, &opts, target, &render).map_err(fail)
}

/// `f` compiled for the CPU `cpu` with `features` under `opts` (see the module's documentation):
/// this machine's (`host`, or its own name and features).
fn compile_cpu(
    f: &Func,
    opts: &Options,
    cpu: &str,
    features: &str,
) -> std::result::Result<Artifact, String> {
    let (host, host_features) = kiln_codegen_llvm::host_cpu();
    let mut opts = opts.clone();
    let (cpu, features) = if cpu == "host" || (cpu == host && features.is_empty()) {
        (host, host_features)
    } else {
        if std::env::consts::ARCH != "x86_64" {
            return Err(format!(
                "compiling for the x86-64 CPU {cpu} needs an x86-64 machine (this one is {})",
                std::env::consts::ARCH
            ));
        }
        check_cpu_name(cpu, features)?;
        opts.cpu.machine = Some(kiln_kernel::options::CpuMachine::new(cpu, features));
        (cpu.to_string(), features.to_string())
    };
    let programs = kiln_codegen_llvm::cpu::aot_programs(f, &opts)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|p| kiln_run::cpu::CpuProgram {
            checksum: p.library.as_deref().map(kiln_runtime::library::checksum),
            program: p.func,
            donated: p.donated,
            library: p.library,
            kernels: p.kernels,
            memory: p.memory,
            regions: p.regions,
        })
        .collect();
    let target = Target {
        kind: Kind::Cpu { cpu },
        sm: String::new(),
        features,
        info: kiln_codegen_llvm::cpu::cpu_target_info(&opts),
    };
    // The CPU is the target's; the kernel layer's switches are the artifact's options.
    opts.cpu.machine = None;
    Artifact::new_cpu(&opts.without_cache(), target, programs)
}

/// Checks a named CPU target's name and features as LLVM writes them: a name of letters,
/// digits, `-`, `_` and `.`, and a non-empty comma-separated list of `+feature` and `-feature`
/// (the features decide the code and what `kiln-run` checks the running CPU for).
fn check_cpu_name(cpu: &str, features: &str) -> std::result::Result<(), String> {
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !word(cpu) {
        return Err(format!(
            "`{cpu}` is not a CPU name as LLVM writes them (x86-64-v3, sapphirerapids)"
        ));
    }
    let bad = features.split(',').find(|f| {
        !(f.strip_prefix('+')
            .or_else(|| f.strip_prefix('-'))
            .is_some_and(word))
    });
    if features.is_empty() || bad.is_some() {
        return Err(format!(
            "the CPU {cpu} needs its features as LLVM lists them (`+sse4.2,+avx2,+fma,...`: what \
             `llc -mcpu={cpu} -mattr=help` shows, or /proc/cpuinfo's flags of that machine){}",
            bad.map(|b| format!("; `{b}` is not a +feature or -feature"))
                .unwrap_or_default()
        ));
    }
    Ok(())
}

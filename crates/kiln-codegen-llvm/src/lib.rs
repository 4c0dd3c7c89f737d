//! Lowers kiln kernels to LLVM IR: host machine code through a JIT, and PTX through LLVM's
//! NVPTX target (no GPU or CUDA toolkit needed to produce PTX).
//!
//! - [`cpu`]: the CPU backend. A function becomes one LLVM module with a kernel per
//!   instruction ([`kernel`]: a loop nest over the output index space whose body is an
//!   expression tree, loads through affine index maps), optimized at O2 for the host CPU and
//!   JIT-compiled.
//! - [`ptx`]: kernels mapped to the GPU ([`kiln_kernel::gpu`]) as PTX for sm_80 and sm_90, a
//!   `.entry` per launch, through LLVM's NVPTX target.
//! - `common`: the element operations and transcendental functions both share.
//!
//! Which ops get kernels is [`kiln_kernel`]'s lowering's to say (`ir-specs/status.md` lists
//! it per op).
#![warn(missing_docs)]

pub mod cache;
mod common;
pub mod cpu;
mod elf_symbols;
pub mod ptx;
pub use kiln_kernel::{canon, fuse, kernel, schedule};

use inkwell::OptimizationLevel;
use inkwell::attributes::AttributeLoc;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::types::BasicTypeEnum;
use inkwell::values::FunctionValue;
use kiln_ir::DType;
use kiln_kernel::options::CpuMachine;
use std::fmt;

/// An error of this crate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The program uses an op or dtype this backend does not lower yet.
    Unsupported(String),
    /// LLVM reported an error (a bug in the lowering, or a missing target).
    Llvm(String),
    /// The arguments do not fit the kernel.
    Args(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unsupported(m) => write!(f, "not supported by the LLVM backend: {m}"),
            Error::Llvm(m) => write!(f, "LLVM error: {m}"),
            Error::Args(m) => write!(f, "bad arguments: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<kiln_kernel::Error> for Error {
    fn from(e: kiln_kernel::Error) -> Self {
        match e {
            kiln_kernel::Error::Args(m) => Error::Args(m),
            kiln_kernel::Error::Lowering(m) => Error::Llvm(m),
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The LLVM type a buffer stores elements of dtype `d` as (f16 and bf16 as their 16 bits,
/// pred as a byte, a complex number as its two parts): what every emitter loads and stores.
pub(crate) fn storage<'c>(ctx: &'c Context, d: DType) -> BasicTypeEnum<'c> {
    match d {
        DType::Pred | DType::I8 | DType::U8 => ctx.i8_type().into(),
        // One byte each, the value sign- or zero-extended.
        DType::I2 | DType::U2 | DType::I4 | DType::U4 => ctx.i8_type().into(),
        // A small float's bit pattern in the low bits of a byte (kernels decode and encode
        // it with integer ops: `kiln_kernel::minifloat`).
        DType::Mini(_) => ctx.i8_type().into(),
        DType::I16 | DType::U16 | DType::F16 | DType::BF16 => ctx.i16_type().into(),
        DType::I32 | DType::U32 => ctx.i32_type().into(),
        DType::I64 | DType::U64 => ctx.i64_type().into(),
        DType::F32 => ctx.f32_type().into(),
        DType::F64 => ctx.f64_type().into(),
        // The real part, then the imaginary part (no kernel computes on them: complex
        // instructions run on the reference interpreter).
        DType::C64 => ctx.f32_type().array_type(2).into(),
        DType::C128 => ctx.f64_type().array_type(2).into(),
    }
}

fn host_machine() -> Result<TargetMachine> {
    Target::initialize_native(&InitializationConfig::default()).map_err(Error::Llvm)?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| Error::Llvm(e.to_string()))?;
    let cpu = TargetMachine::get_host_cpu_name().to_string();
    let features = TargetMachine::get_host_cpu_features().to_string();
    target
        .create_target_machine(
            &triple,
            &cpu,
            &features,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::JITDefault,
        )
        .ok_or_else(|| Error::Llvm("cannot create a host target machine".into()))
}

/// The host machine for position-independent objects (the kernel cache's shared libraries).
fn aot_machine(machine: Option<CpuMachine>) -> Result<TargetMachine> {
    Target::initialize_native(&InitializationConfig::default()).map_err(Error::Llvm)?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| Error::Llvm(e.to_string()))?;
    let (cpu, features) = cpu_of(machine);
    target
        .create_target_machine(
            &triple,
            &cpu,
            &features,
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| Error::Llvm(format!("cannot create a target machine for the CPU {cpu}")))
}

/// The NVPTX machine for the SM `cpu` (`sm_90`) with `features` (`+ptx80`).
fn ptx_machine(cpu: &str, features: &str) -> Result<TargetMachine> {
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let target = Target::from_triple(&triple).map_err(|e| Error::Llvm(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            cpu,
            features,
            OptimizationLevel::Aggressive,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| Error::Llvm("cannot create an NVPTX target machine".into()))
}

/// The optimization pipeline, LLVM's O2 (loop and SLP vectorization included): measured against
/// O3 in one process, alternating calls of both builds (MLP step, softmax, gelu, layernorm, matmul 1024;
/// 195 pairs each), neither won more than 55% of the pairs, and O2 compiles the MLP step's
/// kernels in about 0.65 s instead of 1.0 s.
const PIPELINE: &str = "default<O2>";

/// The optimization pipeline of code emitted as explicit vector operations, unrolled as
/// wanted: the GEMM routines (register tiles and packing, see `cpu::gemm`) and the GEMM kernels
/// without an epilogue, whose loops only walk the cache blocks and call the routines. They need
/// their loop variables promoted to registers, redundant loads and address arithmetic folded
/// and loop invariants hoisted, not LLVM's loop and SLP vectorizers, unrolling or GVN. Measured
/// on the 21 routines of the MLP step and its small instance (`opt -time-passes`): 44 ms
/// instead of 319 ms to optimize, and 154 ms instead of 267 ms to generate code (smaller code);
/// runtime even in alternating calls (see docs/performance.md).
const EXPLICIT_PIPELINE: &str = "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,loop-mssa(licm),instcombine<no-verify-fixpoint>,simplifycfg)";

/// The optimization pipeline of kernels with little work (see `cpu::LIGHT_WORK`), which run
/// for well under a millisecond but took most of a small training step's compile at O2:
/// scalar cleanup (promotion to registers, CSE, instcombine), loop invariants hoisted out of
/// rotated loops, then LLVM's loop and SLP vectorizers. It leaves out GVN, induction-variable
/// rewriting, unrolling and the interprocedural passes; the emitter already computes a
/// reduction once where its loops open (a row's maximum ahead of the loop over the row, also
/// inside another reduction), which O2 otherwise recovered by unrolling and GVN. Measured on
/// the MLP step's four non-GEMM kernels (`opt -time-passes`): 15 ms instead of 68-89 ms, and
/// runtime even in alternating calls (see docs/performance.md).
const LIGHT_PIPELINE: &str = "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,loop-mssa(loop-rotate,licm),loop-vectorize,slp-vectorizer,instcombine<no-verify-fixpoint>,simplifycfg)";

/// [`LIGHT_PIPELINE`] with loops vectorized but not interleaved (one vector an iteration, not
/// four): for the epilogues of small GEMM kernels, loops over a block of the product just
/// computed, in the cache, whose vector stores bound them either way. The interleaved copies
/// were a tenth of such a kernel's code generation (the MLP step's weight-gradient kernels:
/// `llc` on ten copies of one, 105-112 -> 96-102 ms; see docs/performance.md).
const LIGHT_EPILOGUE_PIPELINE: &str = "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,loop-mssa(loop-rotate,licm),loop-vectorize<interleave-forced-only>,slp-vectorizer,instcombine<no-verify-fixpoint>,simplifycfg)";

/// How a module is optimized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pipeline {
    /// [`PIPELINE`] (LLVM's O2), with LLVM's loop unrolling or without.
    O2 { unroll: bool },
    /// [`EXPLICIT_PIPELINE`].
    Explicit,
    /// [`LIGHT_PIPELINE`], or without interleaving ([`LIGHT_EPILOGUE_PIPELINE`]).
    Light { interleave: bool },
}

/// This machine's CPU name and features, as LLVM reports them (once per process): what the CPU
/// backend compiles for, and what an ahead-of-time CPU artifact records.
pub fn host_cpu() -> (String, String) {
    static HOST: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        (
            TargetMachine::get_host_cpu_name().to_string(),
            TargetMachine::get_host_cpu_features().to_string(),
        )
    })
    .clone()
}

/// The CPU code is compiled for: `machine` (ahead of time, for another CPU), else this
/// machine's ([`host_cpu`]); its name and features.
fn cpu_of(machine: Option<CpuMachine>) -> (String, String) {
    match machine {
        Some(m) => (m.name.to_string(), m.features.to_string()),
        None => host_cpu(),
    }
}

/// Names the CPU code is compiled for (`machine`, else this machine's) and its features on `f`
/// (`target-cpu`, `target-features`): LLVM generates code per function attributes, and
/// without them targets baseline x86-64.
fn name_cpu<'c>(ctx: &'c Context, f: FunctionValue<'c>, machine: Option<CpuMachine>) {
    let (cpu, features) = cpu_of(machine);
    f.add_attribute(
        AttributeLoc::Function,
        ctx.create_string_attribute("target-cpu", &cpu),
    );
    f.add_attribute(
        AttributeLoc::Function,
        ctx.create_string_attribute("target-features", &features),
    );
}

fn optimize(m: &Module, tm: &TargetMachine) -> Result<()> {
    optimize_as(m, tm, Pipeline::O2 { unroll: true })
}

/// Optimizes `m` for `tm` with `pipeline`.
fn optimize_as(m: &Module, tm: &TargetMachine, pipeline: Pipeline) -> Result<()> {
    m.set_triple(&tm.get_triple());
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    let options = PassBuilderOptions::create();
    let passes = match pipeline {
        Pipeline::O2 { unroll } => {
            // LLVM's loop unrolling: runtime, partial and full.
            options.set_loop_unrolling(unroll);
            PIPELINE
        }
        Pipeline::Explicit => EXPLICIT_PIPELINE,
        Pipeline::Light { interleave: true } => LIGHT_PIPELINE,
        Pipeline::Light { interleave: false } => LIGHT_EPILOGUE_PIPELINE,
    };
    m.run_passes(passes, tm, options)
        .map_err(|e| Error::Llvm(e.to_string()))
}

//! Lowers kiln kernels to LLVM IR: host machine code through a JIT, and PTX through LLVM's
//! NVPTX target (no GPU or CUDA toolkit needed to produce PTX).
//!
//! - [`cpu`]: the CPU backend. A function becomes one LLVM module with a kernel per
//!   instruction ([`kernel`]: a loop nest over the output index space whose body is an
//!   expression tree, loads through affine index maps), optimized at O2 for the host CPU and
//!   JIT-compiled.
//! - [`ElementwiseKernel`] and [`ptx`]: flat elementwise kernels (add, subtract, multiply,
//!   divide) as PTX for sm_90.
//!
//! Coverage per op is reported by [`cpu_support`] and [`ptx_support`] and in
//! `ir-specs/status.md`.
//!
//! ```
//! use kiln_codegen_llvm::{ElementwiseKernel, run_cpu};
//! use kiln_ir::{parse_func_text, Literal};
//! let f = parse_func_text("func @main(%0: f32[3], %1: f32[3]) -> f32[3] {\n  %2 = add %0, %1 : f32[3]\n  return %2\n}\n").unwrap();
//! let k = ElementwiseKernel::from_func(&f).unwrap();
//! let a = Literal::f32([3], vec![1.0, 2.0, 3.0]).unwrap();
//! let out = run_cpu(&k, &[&a, &a]).unwrap();
//! assert_eq!(out.as_f32s().unwrap(), &[2.0, 4.0, 6.0]);
//! ```
#![warn(missing_docs)]

pub mod cache;
pub mod cpu;
pub use kiln_kernel::{canon, fuse, kernel, schedule};

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PointerValue};
use inkwell::{AddressSpace, OptimizationLevel};
use kiln_ir::{DType, Func, Literal, OpKind, TensorType, ValueId};
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

/// How much of an op a backend lowers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Every dtype the op accepts.
    All,
    /// Some dtypes.
    Some,
    /// None.
    None,
}

/// The binary ops elementwise kernels can contain, and the dtypes each supports.
fn binary_supports(k: OpKind, d: DType) -> bool {
    let arith = matches!(d, DType::F32 | DType::F64 | DType::I32 | DType::I64);
    match k {
        OpKind::Add | OpKind::Subtract | OpKind::Multiply => arith,
        OpKind::Divide => d.is_float() && d != DType::F16 && d != DType::BF16,
        _ => false,
    }
}

/// What the CPU backend compiles into kernels for op `k` (instructions without a kernel run on
/// the reference interpreter inside the executable).
pub fn cpu_support(k: OpKind) -> Support {
    use OpKind::*;
    match k {
        _ if k.props().contains(kiln_ir::Props::ELEMENTWISE) => Support::All,
        // rng_bit_generator runs as integer kernels after `canon::expand_rngs`;
        // optimization_barrier passes its operands through.
        BroadcastInDim | Transpose | Slice | Reverse | Reshape | Iota | Reduce | DotGeneral
        | Constant | Pad | Concatenate | DynamicSlice | DynamicUpdateSlice | Gather
        | Convolution | ReduceWindow | Scatter | SelectAndScatter | BitcastConvert
        | RngBitGenerator | OptimizationBarrier => Support::All,
        _ => Support::None,
    }
}

/// What the PTX backend lowers of op `k`.
pub fn ptx_support(k: OpKind) -> Support {
    if DType::ALL.iter().any(|&d| binary_supports(k, d)) {
        Support::Some
    } else {
        Support::None
    }
}

/// The expression computed at each output position.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// Element i of input buffer n.
    Input(usize),
    /// A binary elementwise op of two subexpressions.
    Binary(OpKind, Box<Expr>, Box<Expr>),
}

/// A flat elementwise kernel: `out[i] = expr(inputs[0][i], ...)` for i in 0..n.
#[derive(Clone, Debug, PartialEq)]
pub struct ElementwiseKernel {
    /// The element type of every input and of the output.
    pub dtype: DType,
    /// The shape of every input and of the output.
    pub shape: Vec<usize>,
    /// Number of input buffers.
    pub inputs: usize,
    /// The body, with producers inlined.
    pub expr: Expr,
}

impl ElementwiseKernel {
    /// Builds a kernel from a function of one output whose instructions are supported
    /// elementwise binary ops over parameters of one type.
    pub fn from_func(f: &Func) -> Result<ElementwiseKernel> {
        kiln_ir::verify(f).map_err(|e| Error::Args(e.to_string()))?;
        let ty: TensorType = f
            .values
            .first()
            .cloned()
            .ok_or_else(|| Error::Unsupported("a kernel needs an input".into()))?;
        if f.outputs.len() != 1 {
            return Err(Error::Unsupported(format!(
                "{} outputs (kernels have one)",
                f.outputs.len()
            )));
        }
        let mut exprs: Vec<Option<Expr>> = vec![None; f.values.len()];
        for (i, &p) in f.params.iter().enumerate() {
            if f.values[p.index()] != ty {
                return Err(Error::Unsupported(format!(
                    "parameters of different types {ty} and {}",
                    f.values[p.index()]
                )));
            }
            exprs[p.index()] = Some(Expr::Input(i));
        }
        for inst in &f.insts {
            let k = inst.op.kind();
            if !binary_supports(k, ty.dtype) {
                return Err(Error::Unsupported(format!("`{k}` on {}", ty.dtype)));
            }
            let get = |v: ValueId| exprs[v.index()].clone().expect("verified SSA");
            exprs[inst.results[0].index()] = Some(Expr::Binary(
                k,
                Box::new(get(inst.operands[0])),
                Box::new(get(inst.operands[1])),
            ));
        }
        let expr = exprs[f.outputs[0].index()].clone().expect("verified SSA");
        Ok(ElementwiseKernel {
            dtype: ty.dtype,
            shape: ty.shape,
            inputs: f.params.len(),
            expr,
        })
    }

    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

fn elem_type<'c>(ctx: &'c Context, d: DType) -> BasicTypeEnum<'c> {
    match d {
        DType::F32 => ctx.f32_type().into(),
        DType::F64 => ctx.f64_type().into(),
        DType::I32 | DType::U32 => ctx.i32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        DType::I8 | DType::Pred => ctx.i8_type().into(),
        DType::F16 | DType::BF16 => ctx.i16_type().into(),
    }
}

/// Emits `expr` at index `i`; loads come from `ptrs`.
fn emit_expr<'c>(
    b: &Builder<'c>,
    k: &ElementwiseKernel,
    ty: BasicTypeEnum<'c>,
    ptrs: &[PointerValue<'c>],
    i: IntValue<'c>,
    e: &Expr,
) -> Result<BasicValueEnum<'c>> {
    let llvm = |e: inkwell::builder::BuilderError| Error::Llvm(e.to_string());
    Ok(match e {
        Expr::Input(n) => {
            // SAFETY: `i` is below the element count of every buffer, which the caller checks.
            let p = unsafe { b.build_in_bounds_gep(ty, ptrs[*n], &[i], "p") }.map_err(llvm)?;
            b.build_load(ty, p, "x").map_err(llvm)?
        }
        Expr::Binary(op, l, r) => {
            let (l, r) = (
                emit_expr(b, k, ty, ptrs, i, l)?,
                emit_expr(b, k, ty, ptrs, i, r)?,
            );
            if k.dtype.is_float() {
                let (l, r) = (l.into_float_value(), r.into_float_value());
                match op {
                    OpKind::Add => b.build_float_add(l, r, "add"),
                    OpKind::Subtract => b.build_float_sub(l, r, "sub"),
                    OpKind::Multiply => b.build_float_mul(l, r, "mul"),
                    OpKind::Divide => b.build_float_div(l, r, "div"),
                    _ => return Err(Error::Unsupported(format!("`{op}`"))),
                }
                .map_err(llvm)?
                .into()
            } else {
                let (l, r) = (l.into_int_value(), r.into_int_value());
                match op {
                    OpKind::Add => b.build_int_add(l, r, "add"),
                    OpKind::Subtract => b.build_int_sub(l, r, "sub"),
                    OpKind::Multiply => b.build_int_mul(l, r, "mul"),
                    _ => return Err(Error::Unsupported(format!("`{op}` on {}", k.dtype))),
                }
                .map_err(llvm)?
                .into()
            }
        }
    })
}

/// Where a kernel runs: the host CPU (a loop over all elements) or an NVIDIA GPU (one thread
/// per element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target_ {
    Host,
    Ptx,
}

const KERNEL_NAME: &str = "kiln_kernel";

/// Emits the kernel function: `(in0, ..., out, n)`.
fn emit<'c>(ctx: &'c Context, k: &ElementwiseKernel, target: Target_) -> Result<Module<'c>> {
    emit_for(ctx, k, target, false)
}

/// [`emit`], with this machine's CPU and features on the function when `for_host` (what the
/// JIT needs to use AVX and FMA).
fn emit_for<'c>(
    ctx: &'c Context,
    k: &ElementwiseKernel,
    target: Target_,
    for_host: bool,
) -> Result<Module<'c>> {
    let llvm = |e: inkwell::builder::BuilderError| Error::Llvm(e.to_string());
    let m = ctx.create_module("kiln");
    let space = if target == Target_::Ptx {
        AddressSpace::from(1u16)
    } else {
        AddressSpace::default()
    };
    let ptr = ctx.ptr_type(space);
    let i64t = ctx.i64_type();
    let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = vec![ptr.into(); k.inputs + 1];
    params.push(i64t.into());
    let f: FunctionValue =
        m.add_function(KERNEL_NAME, ctx.void_type().fn_type(&params, false), None);
    let noalias = ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("noalias"), 0);
    for i in 0..=k.inputs {
        f.add_attribute(AttributeLoc::Param(i as u32), noalias);
    }
    if for_host && target == Target_::Host {
        name_host_cpu(ctx, f);
    }
    let ty = elem_type(ctx, k.dtype);
    let ptrs: Vec<PointerValue> = (0..=k.inputs)
        .map(|i| {
            f.get_nth_param(i as u32)
                .expect("declared")
                .into_pointer_value()
        })
        .collect();
    let n = f
        .get_nth_param(k.inputs as u32 + 1)
        .expect("declared")
        .into_int_value();
    let b = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    let body = ctx.append_basic_block(f, "body");
    let exit = ctx.append_basic_block(f, "exit");
    b.position_at_end(entry);
    match target {
        Target_::Host => {
            let nonempty = b
                .build_int_compare(inkwell::IntPredicate::SGT, n, i64t.const_zero(), "nonempty")
                .map_err(llvm)?;
            b.build_conditional_branch(nonempty, body, exit)
                .map_err(llvm)?;
            b.position_at_end(body);
            let i = b.build_phi(i64t, "i").map_err(llvm)?;
            i.add_incoming(&[(&i64t.const_zero(), entry)]);
            let iv = i.as_basic_value().into_int_value();
            let v = emit_expr(&b, k, ty, &ptrs, iv, &k.expr)?;
            // SAFETY: i < n, the output's element count.
            let p =
                unsafe { b.build_in_bounds_gep(ty, ptrs[k.inputs], &[iv], "po") }.map_err(llvm)?;
            b.build_store(p, v).map_err(llvm)?;
            let next = b
                .build_int_add(iv, i64t.const_int(1, false), "next")
                .map_err(llvm)?;
            i.add_incoming(&[(&next, body)]);
            let more = b
                .build_int_compare(inkwell::IntPredicate::SLT, next, n, "more")
                .map_err(llvm)?;
            b.build_conditional_branch(more, body, exit).map_err(llvm)?;
        }
        Target_::Ptx => {
            f.set_call_conventions(71);
            let sreg = |name: &str| -> Result<IntValue> {
                let intr = Intrinsic::find(name)
                    .ok_or_else(|| Error::Llvm(format!("no intrinsic {name}")))?;
                let decl = intr
                    .get_declaration(&m, &[])
                    .ok_or_else(|| Error::Llvm(format!("no declaration of {name}")))?;
                let v = b
                    .build_call(decl, &[], "r")
                    .map_err(llvm)?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| Error::Llvm(format!("{name} returned nothing")))?;
                b.build_int_z_extend(v.into_int_value(), i64t, "z")
                    .map_err(llvm)
            };
            let tid = sreg("llvm.nvvm.read.ptx.sreg.tid.x")?;
            let ntid = sreg("llvm.nvvm.read.ptx.sreg.ntid.x")?;
            let ctaid = sreg("llvm.nvvm.read.ptx.sreg.ctaid.x")?;
            let base = b.build_int_mul(ctaid, ntid, "base").map_err(llvm)?;
            let iv = b.build_int_add(base, tid, "i").map_err(llvm)?;
            let inside = b
                .build_int_compare(inkwell::IntPredicate::SLT, iv, n, "inside")
                .map_err(llvm)?;
            b.build_conditional_branch(inside, body, exit)
                .map_err(llvm)?;
            b.position_at_end(body);
            let v = emit_expr(&b, k, ty, &ptrs, iv, &k.expr)?;
            // SAFETY: i < n, the output's element count.
            let p =
                unsafe { b.build_in_bounds_gep(ty, ptrs[k.inputs], &[iv], "po") }.map_err(llvm)?;
            b.build_store(p, v).map_err(llvm)?;
            b.build_unconditional_branch(exit).map_err(llvm)?;
        }
    }
    b.position_at_end(exit);
    b.build_return(None).map_err(llvm)?;
    m.verify().map_err(|e| Error::Llvm(e.to_string()))?;
    Ok(m)
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
fn aot_machine() -> Result<TargetMachine> {
    Target::initialize_native(&InitializationConfig::default()).map_err(Error::Llvm)?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| Error::Llvm(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            &TargetMachine::get_host_cpu_name().to_string(),
            &TargetMachine::get_host_cpu_features().to_string(),
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| Error::Llvm("cannot create a host target machine".into()))
}

fn ptx_machine() -> Result<TargetMachine> {
    Target::initialize_nvptx(&InitializationConfig::default());
    let triple = TargetTriple::create("nvptx64-nvidia-cuda");
    let target = Target::from_triple(&triple).map_err(|e| Error::Llvm(e.to_string()))?;
    target
        .create_target_machine(
            &triple,
            "sm_90",
            "+ptx80",
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

/// How a module is optimized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pipeline {
    /// [`PIPELINE`] (LLVM's O2), with LLVM's loop unrolling or without.
    O2 { unroll: bool },
    /// [`EXPLICIT_PIPELINE`].
    Explicit,
    /// [`LIGHT_PIPELINE`].
    Light,
}

/// This machine's CPU name and features, as LLVM reports them (once per process).
fn host_cpu() -> (String, String) {
    static HOST: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        (
            TargetMachine::get_host_cpu_name().to_string(),
            TargetMachine::get_host_cpu_features().to_string(),
        )
    })
    .clone()
}

/// Names this machine's CPU and features on `f` (`target-cpu`, `target-features`): LLVM
/// generates code per function attributes, and without them targets baseline x86-64.
fn name_host_cpu<'c>(ctx: &'c Context, f: FunctionValue<'c>) {
    let (cpu, features) = host_cpu();
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
        Pipeline::Light => LIGHT_PIPELINE,
    };
    m.run_passes(passes, tm, options)
        .map_err(|e| Error::Llvm(e.to_string()))
}

/// The LLVM IR of the host kernel, before (`optimized = false`) or after O2 for this machine's
/// CPU. The unoptimized form is the same on every machine.
pub fn cpu_llvm_ir(k: &ElementwiseKernel, optimized: bool) -> Result<String> {
    let ctx = Context::create();
    let m = emit_for(&ctx, k, Target_::Host, optimized)?;
    if optimized {
        optimize(&m, &host_machine()?)?;
    }
    Ok(m.print_to_string().to_string())
}

/// The PTX assembly of the kernel for sm_90 (PTX ISA 8.0), as a `.entry` named `kiln_kernel`
/// taking the input pointers, the output pointer and the element count; launch it with one
/// thread per element.
pub fn ptx(k: &ElementwiseKernel) -> Result<String> {
    let ctx = Context::create();
    let m = emit(&ctx, k, Target_::Ptx)?;
    let tm = ptx_machine()?;
    optimize(&m, &tm)?;
    let buf = tm
        .write_to_memory_buffer(&m, FileType::Assembly)
        .map_err(|e| Error::Llvm(e.to_string()))?;
    String::from_utf8(buf.as_slice().to_vec()).map_err(|e| Error::Llvm(e.to_string()))
}

/// JIT-compiles the kernel for this machine (O2, host CPU features) and runs it once.
pub fn run_cpu(k: &ElementwiseKernel, inputs: &[&Literal]) -> Result<Literal> {
    let ty = TensorType::new(k.dtype, k.shape.clone());
    if inputs.len() != k.inputs {
        return Err(Error::Args(format!(
            "the kernel takes {} inputs, {} given",
            k.inputs,
            inputs.len()
        )));
    }
    if let Some(bad) = inputs.iter().find(|l| *l.ty() != ty) {
        return Err(Error::Args(format!(
            "inputs must be {ty}, got {}",
            bad.ty()
        )));
    }
    let ctx = Context::create();
    let m = emit_for(&ctx, k, Target_::Host, true)?;
    optimize(&m, &host_machine()?)?;
    let ee = m
        .create_jit_execution_engine(OptimizationLevel::Aggressive)
        .map_err(|e| Error::Llvm(e.to_string()))?;
    let mut out = Literal::zeros(ty);
    let n = k.numel() as i64;
    let mut args: Vec<*const u8> = inputs.iter().map(|l| l.as_ptr()).collect();
    args.push(out.as_mut_ptr());
    // SAFETY: every buffer holds `n` elements of the kernel's dtype (checked above), the output
    // buffer is exclusively ours, and the signature matches the emitted function.
    unsafe {
        match k.inputs {
            1 => {
                let f = ee
                    .get_function::<unsafe extern "C" fn(*const u8, *const u8, i64)>(KERNEL_NAME)
                    .map_err(|e| Error::Llvm(e.to_string()))?;
                f.call(args[0], args[1], n);
            }
            2 => {
                let f = ee
                    .get_function::<unsafe extern "C" fn(*const u8, *const u8, *const u8, i64)>(
                        KERNEL_NAME,
                    )
                    .map_err(|e| Error::Llvm(e.to_string()))?;
                f.call(args[0], args[1], args[2], n);
            }
            3 => {
                let f = ee.get_function::<unsafe extern "C" fn(*const u8, *const u8, *const u8, *const u8, i64)>(KERNEL_NAME).map_err(|e| Error::Llvm(e.to_string()))?;
                f.call(args[0], args[1], args[2], args[3], n);
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "{other} inputs (at most 3 for now)"
                )));
            }
        }
    }
    Ok(out)
}

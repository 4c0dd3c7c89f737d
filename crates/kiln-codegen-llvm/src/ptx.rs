//! PTX through LLVM's NVPTX target, for sm_90 (no GPU or CUDA toolkit needed to produce it):
//! what renders today is a kernel-IR loop nest of elementwise arithmetic that reads every
//! input at its own position, one thread per element. The NVIDIA backend grows from here.

use crate::{Error, Result, storage};
use inkwell::AddressSpace;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::Module;
use inkwell::targets::FileType;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue, PointerValue};
use kiln_ir::{DType, OpKind};
use kiln_kernel::kernel::{Ew, Expr, Idx, Kernel, Schedule};

/// The name of the `.entry` [`ptx`] emits.
pub const KERNEL_NAME: &str = "kiln_kernel";

/// The PTX assembly of `k` for sm_90 (PTX ISA 8.0), as a `.entry` named [`KERNEL_NAME`] taking
/// the input pointers, the output pointer and the element count; launch it with one thread per
/// element. `k` must be a loop nest whose body adds, subtracts, multiplies and divides (integer
/// division aside) inputs read at the output position (directly or through a flat index) and
/// constants, in f32, f64, i32 or i64;
/// anything else is [`Error::Unsupported`].
pub fn ptx(k: &Kernel) -> Result<String> {
    let ctx = Context::create();
    let m = emit(&ctx, k)?;
    let tm = crate::ptx_machine()?;
    crate::optimize(&m, &tm)?;
    let buf = tm
        .write_to_memory_buffer(&m, FileType::Assembly)
        .map_err(|e| Error::Llvm(e.to_string()))?;
    String::from_utf8(buf.as_slice().to_vec()).map_err(|e| Error::Llvm(e.to_string()))
}

/// The inputs `e` reads (one more than the highest input slot), checking that it is
/// elementwise arithmetic in `dtype` over loads at the output position `own` (row-major
/// strides).
fn inputs_of(e: &Expr, dtype: DType, own: &[i64], shape: &[usize]) -> Result<usize> {
    let unsupported = |what: String| Err(Error::Unsupported(format!("{what} in a PTX kernel")));
    if e.dtype() != dtype {
        return unsupported(format!("a value of {} in a {dtype} kernel", e.dtype()));
    }
    match e {
        Expr::Load {
            input, coef, off, ..
        } => {
            let at_own = coef.len() == own.len()
                && *off == 0
                && (0..own.len()).all(|d| coef[d] == own[d] || shape[d] == 1);
            if !at_own {
                return unsupported(format!("a read of input {input} off its own position"));
            }
            Ok(input + 1)
        }
        Expr::Gather {
            input,
            index,
            strides,
            ..
        } => {
            // Fusion reads an inlined producer's input through a flat index; it must be the
            // output position too.
            let mut coef = vec![0i64; own.len()];
            let mut off = 0;
            let linear = index
                .iter()
                .zip(strides)
                .all(|(i, &s)| affine(i, s, &mut coef, &mut off));
            let at_own =
                linear && off == 0 && (0..own.len()).all(|d| coef[d] == own[d] || shape[d] == 1);
            if !at_own {
                return unsupported(format!("a read of input {input} off its own position"));
            }
            Ok(input + 1)
        }
        Expr::Const { .. } => Ok(0),
        Expr::Op {
            op: Ew::Kind(k @ (OpKind::Add | OpKind::Subtract | OpKind::Multiply | OpKind::Divide)),
            args,
            ..
        } => {
            if *k == OpKind::Divide && !dtype.is_float() {
                return unsupported(format!("`divide` on {dtype}"));
            }
            args.iter()
                .try_fold(0, |n, a| Ok(n.max(inputs_of(a, dtype, own, shape)?)))
        }
        Expr::Op { op, .. } => unsupported(format!("`{op:?}`")),
        _ => unsupported("an expression other than elementwise arithmetic".into()),
    }
}

/// Adds `scale` times the affine index `i` to `coef` (per loop variable) and `off`; false if
/// `i` is not affine in the loop variables.
fn affine(i: &Idx, scale: i64, coef: &mut [i64], off: &mut i64) -> bool {
    match i {
        Idx::Var(v) if *v < coef.len() => {
            coef[*v] += scale;
            true
        }
        Idx::Const(c) => {
            *off += scale * c;
            true
        }
        Idx::Add(terms) => terms.iter().all(|t| affine(t, scale, coef, off)),
        Idx::Mul(t, m) => affine(t, scale * m, coef, off),
        _ => false,
    }
}

/// Emits the kernel function `(in0, ..., out, n)`: thread `i` (block index times block size
/// plus thread index) below `n` stores the body at element `i`.
fn emit<'c>(ctx: &'c Context, k: &Kernel) -> Result<Module<'c>> {
    let llvm = |e: inkwell::builder::BuilderError| Error::Llvm(e.to_string());
    let dtype = k.out.dtype;
    if !matches!(dtype, DType::F32 | DType::F64 | DType::I32 | DType::I64) {
        return Err(Error::Unsupported(format!("{dtype} in a PTX kernel")));
    }
    if k.schedule != Schedule::Nest || !k.extra.is_empty() || k.vars != k.out.rank() {
        return Err(Error::Unsupported(
            "a PTX kernel is one loop nest over its output, with one output".into(),
        ));
    }
    let shape = &k.out.shape;
    let mut own = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        own[d] = own[d + 1] * shape[d + 1] as i64;
    }
    let inputs = inputs_of(&k.body, dtype, &own, shape)?;
    let m = ctx.create_module("kiln");
    let ptr = ctx.ptr_type(AddressSpace::from(1u16));
    let i64t = ctx.i64_type();
    let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = vec![ptr.into(); inputs + 1];
    params.push(i64t.into());
    let f: FunctionValue =
        m.add_function(KERNEL_NAME, ctx.void_type().fn_type(&params, false), None);
    // PTX_Kernel: the function is an `.entry`.
    f.set_call_conventions(71);
    let noalias = ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("noalias"), 0);
    for i in 0..=inputs {
        f.add_attribute(AttributeLoc::Param(i as u32), noalias);
    }
    let ptrs: Vec<PointerValue> = (0..=inputs)
        .map(|i| {
            f.get_nth_param(i as u32)
                .expect("declared")
                .into_pointer_value()
        })
        .collect();
    let n = f
        .get_nth_param(inputs as u32 + 1)
        .expect("declared")
        .into_int_value();
    let b = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    let body = ctx.append_basic_block(f, "body");
    let exit = ctx.append_basic_block(f, "exit");
    b.position_at_end(entry);
    let sreg = |name: &str| -> Result<IntValue> {
        let intr =
            Intrinsic::find(name).ok_or_else(|| Error::Llvm(format!("no intrinsic {name}")))?;
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
    let i = b.build_int_add(base, tid, "i").map_err(llvm)?;
    let inside = b
        .build_int_compare(inkwell::IntPredicate::SLT, i, n, "inside")
        .map_err(llvm)?;
    b.build_conditional_branch(inside, body, exit)
        .map_err(llvm)?;
    b.position_at_end(body);
    let ty = storage(ctx, dtype);
    let v = emit_expr(&b, ty, &ptrs, i, &k.body)?;
    // SAFETY: i < n, the output's element count.
    let p = unsafe { b.build_in_bounds_gep(ty, ptrs[inputs], &[i], "po") }.map_err(llvm)?;
    b.build_store(p, v).map_err(llvm)?;
    b.build_unconditional_branch(exit).map_err(llvm)?;
    b.position_at_end(exit);
    b.build_return(None).map_err(llvm)?;
    m.verify().map_err(|e| Error::Llvm(e.to_string()))?;
    Ok(m)
}

/// Emits `e` (checked by [`inputs_of`]) at element `i`; loads come from `ptrs`.
fn emit_expr<'c>(
    b: &Builder<'c>,
    ty: BasicTypeEnum<'c>,
    ptrs: &[PointerValue<'c>],
    i: IntValue<'c>,
    e: &Expr,
) -> Result<BasicValueEnum<'c>> {
    let llvm = |e: inkwell::builder::BuilderError| Error::Llvm(e.to_string());
    Ok(match e {
        Expr::Load { input, .. } | Expr::Gather { input, .. } => {
            // SAFETY: `i` is below the element count of every buffer (each has the output's).
            let p = unsafe { b.build_in_bounds_gep(ty, ptrs[*input], &[i], "p") }.map_err(llvm)?;
            b.build_load(ty, p, "x").map_err(llvm)?
        }
        Expr::Const { value, .. } => match ty {
            BasicTypeEnum::FloatType(t) => t.const_float(*value).into(),
            BasicTypeEnum::IntType(t) => t.const_int(*value as i64 as u64, true).into(),
            _ => return Err(Error::Unsupported(format!("a constant of type {ty}"))),
        },
        Expr::Op {
            op: Ew::Kind(op),
            dtype,
            args,
        } if args.len() == 2 => {
            let l = emit_expr(b, ty, ptrs, i, &args[0])?;
            let r = emit_expr(b, ty, ptrs, i, &args[1])?;
            if dtype.is_float() {
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
                    _ => return Err(Error::Unsupported(format!("`{op}` on {dtype}"))),
                }
                .map_err(llvm)?
                .into()
            }
        }
        _ => return Err(Error::Unsupported("this expression in a PTX kernel".into())),
    })
}

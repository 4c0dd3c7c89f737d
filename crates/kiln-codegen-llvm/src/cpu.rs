//! The CPU backend: a function becomes one LLVM module with a kernel per instruction,
//! optimized at O2 for the host CPU and JIT-compiled, and run by a `kiln_runtime::Program`.
//! Every op has a kernel (constants are held, `optimization_barrier` passes values through);
//! the runtime would run an instruction without one on the reference interpreter, and
//! [`CpuExecutable::plan`] shows which way each instruction runs.

use crate::kernel::{
    Cond, Ew, Expr, Idx, Kernel, Schedule, free_vars, hoistable_reduces, lower, rename_var,
    value_key, var_plus_const, visit,
};
use crate::{Error, Result};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicTypeEnum, FloatType, IntType};
use inkwell::values::{
    BasicValue, BasicValueEnum, FloatValue, FunctionValue, InstructionValue, IntValue,
    MetadataValue, PointerValue,
};
use inkwell::{AddressSpace, FloatPredicate, IntPredicate, OptimizationLevel};
use kiln_ir::{
    Combiner, ComparisonDirection as Cmp, DType, Func, Literal, Op, OpKind, TensorType, strides,
};

mod compile_times;
mod gemm;
mod lowering;
mod math;
mod sum_tree;

use compile_times::PhaseClock;
use lowering::prepare;

pub use kiln_runtime::Step;
use kiln_runtime::{KernelFn, Launch, Program, is_parallel};

/// A function compiled for this CPU: the runtime program and the JIT engine that owns its
/// kernels' code.
pub struct CpuExecutable {
    program: Program,
    // Declared before the context so it is dropped first (the program only holds pointers
    // into the engine's or the library's code).
    _engine: Option<ExecutionEngine<'static>>,
    _library: Option<crate::cache::Library>,
    from_cache: bool,
    lowered_from_cache: bool,
    /// Kernel functions compiled (kernels equal to an earlier one share its function).
    functions: usize,
    _context: Box<Context>,
}

// SAFETY: after construction the engine and context are only kept alive, never touched; the
// kernels are pure functions of their arguments, safe to call from several threads at once.
unsafe impl Send for CpuExecutable {}
unsafe impl Sync for CpuExecutable {}

fn llvm<E: std::fmt::Display>(e: E) -> Error {
    Error::Llvm(e.to_string())
}

struct Emitter<'c> {
    ctx: &'c Context,
    m: &'c Module<'c>,
    b: Builder<'c>,
    f: FunctionValue<'c>,
    inputs: std::cell::Cell<PointerValue<'c>>,
    vars: Vec<PointerValue<'c>>,
    /// Values already computed ahead of the code that uses them, by [`value_key`]: reductions
    /// ahead of their loops, and row caches and their parts (see [`Self::hoist_caching`]);
    /// each entry dominates the code emitted while it is present.
    hoisted: std::cell::RefCell<Vec<(String, Hoisted<'c>)>>,
    /// In a multi-output kernel: alias scopes saying that reads of the inputs (and of the
    /// pointer table) never touch the extra outputs, as `(inputs, extra outputs)` scope lists.
    /// Without them LLVM must assume every store to an extra output may change any input, and
    /// neither vectorizes the loops nor hoists the row constants out of them.
    scopes: std::cell::Cell<Option<(MetadataValue<'c>, MetadataValue<'c>)>>,
    /// Whether the target scales by powers of two in one instruction (AVX-512's `vscalef`,
    /// which `llvm.ldexp` lowers to; taken with 512-bit vectors, so `KILN_VECTOR_BITS=256`
    /// tests the other path); elsewhere a vector `ldexp` would become library calls.
    scalef: bool,
    /// Whether `hoisted` may hold values of elementwise expressions (row caches), which
    /// [`Self::expr`] then looks up.
    memo: std::cell::Cell<bool>,
    /// Whether float sums and products combine in order (not reassociable): in the positions
    /// past the last strip of a column sum (see [`strips`]), which then add in the strips'
    /// order, and are not vectorized along their strided columns.
    in_order: std::cell::Cell<bool>,
    /// What the enclosing loops know: variable `v` lies in `lo..hi` for each `(v, lo, hi)`
    /// (see [`guard_segments`]); guards whose conditions these decide take one side unchecked.
    facts: std::cell::RefCell<Vec<(usize, i64, i64)>>,
    /// Whether the code is for this machine (see [`host_attributes`]).
    for_host: bool,
    /// Where the GEMM routines are compiled.
    routines: Routines,
    /// The keys ([`value_key`]) of the kernel's exponentials whose argument is never positive
    /// (see [`nonpositive_exps`]).
    nonpositive: std::collections::HashSet<String>,
    /// Set just before an exponential of `nonpositive` is emitted, taken by [`Self::op`].
    exp_nonpositive: std::cell::Cell<bool>,
    /// An input whose buffer holds its elements from `offset` on (`(input, offset)`): a
    /// chained GEMM's block of rows, which its epilogue reads as the product.
    shifted: std::cell::Cell<Option<(usize, IntValue<'c>)>>,
}

/// Where the GEMM routines a module's kernels call (`gemm::Routine`) are compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Routines {
    /// In the module itself, once per variant (the JIT and the `--stage llvm` dump).
    Here,
    /// Elsewhere: the module only declares them. The kernel cache compiles each variant once,
    /// in a module of its own, and keeps its object for every function that needs it.
    Apart,
}

/// A value the emitter computed ahead of the code that uses it (see `Emitter::hoisted`).
#[derive(Clone, Copy)]
enum Hoisted<'c> {
    /// The value itself.
    Value(BasicValueEnum<'c>),
    /// A row cache: the value at each position of loop variable `var`, in `buf`.
    Row { buf: PointerValue<'c>, var: usize },
}

fn storage<'c>(ctx: &'c Context, d: DType) -> BasicTypeEnum<'c> {
    match d {
        DType::Pred | DType::I8 => ctx.i8_type().into(),
        DType::F16 | DType::BF16 => ctx.i16_type().into(),
        DType::I32 | DType::U32 => ctx.i32_type().into(),
        DType::I64 => ctx.i64_type().into(),
        DType::F32 => ctx.f32_type().into(),
        DType::F64 => ctx.f64_type().into(),
    }
}

/// The vector of `lanes` elements of the storage type `st` (a float or an integer).
fn vector_of(st: BasicTypeEnum<'_>, lanes: usize) -> Result<BasicTypeEnum<'_>> {
    Ok(match st {
        BasicTypeEnum::FloatType(f) => f.vec_type(lanes as u32).into(),
        BasicTypeEnum::IntType(i) => i.vec_type(lanes as u32).into(),
        _ => return Err(Error::Llvm(format!("no vector of {st}"))),
    })
}

impl<'c> Emitter<'c> {
    /// An emitter for the body of `f`, with `b` positioned in it and `inputs` as its pointer
    /// table.
    fn new(
        ctx: &'c Context,
        m: &'c Module<'c>,
        b: Builder<'c>,
        f: FunctionValue<'c>,
        inputs: PointerValue<'c>,
        for_host: bool,
        routines: Routines,
    ) -> Emitter<'c> {
        Emitter {
            ctx,
            m,
            b,
            f,
            inputs: std::cell::Cell::new(inputs),
            vars: Vec::new(),
            hoisted: Default::default(),
            scopes: Default::default(),
            scalef: wide_vectors(for_host),
            memo: Default::default(),
            in_order: Default::default(),
            facts: Default::default(),
            for_host,
            routines,
            nonpositive: Default::default(),
            exp_nonpositive: Default::default(),
            shifted: Default::default(),
        }
    }

    fn ftype(&self, d: DType) -> FloatType<'c> {
        if d == DType::F64 {
            self.ctx.f64_type()
        } else {
            self.ctx.f32_type()
        }
    }

    fn itype(&self, d: DType) -> IntType<'c> {
        match d {
            DType::Pred => self.ctx.bool_type(),
            DType::I8 => self.ctx.i8_type(),
            DType::I32 | DType::U32 => self.ctx.i32_type(),
            _ => self.ctx.i64_type(),
        }
    }

    fn i64c(&self, v: i64) -> IntValue<'c> {
        self.ctx.i64_type().const_int(v as u64, true)
    }

    fn intrinsic(
        &self,
        name: &str,
        ty: BasicTypeEnum<'c>,
        args: &[BasicValueEnum<'c>],
    ) -> Result<BasicValueEnum<'c>> {
        let i = Intrinsic::find(name).ok_or_else(|| Error::Llvm(format!("no intrinsic {name}")))?;
        let decl = i
            .get_declaration(self.m, &[ty])
            .ok_or_else(|| Error::Llvm(format!("cannot declare {name}")))?;
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        self.b
            .build_call(decl, &args, "r")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| Error::Llvm(format!("{name} returned nothing")))
    }

    /// A call to a C math function (`tanhf` for f32, `tanh` for f64).
    fn libm(&self, name: &str, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let ft = self.ftype(d);
        let sym = if d == DType::F64 {
            name.to_string()
        } else {
            format!("{name}f")
        };
        let f = self.m.get_function(&sym).unwrap_or_else(|| {
            self.m.add_function(
                &sym,
                ft.fn_type(&[ft.into()], false),
                Some(Linkage::External),
            )
        });
        Ok(self
            .b
            .build_call(f, &[x.into()], "m")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| Error::Llvm(format!("{sym} returned nothing")))?
            .into_float_value())
    }

    fn var(&self, k: usize) -> Result<IntValue<'c>> {
        Ok(self
            .b
            .build_load(self.ctx.i64_type(), self.vars[k], "v")
            .map_err(llvm)?
            .into_int_value())
    }

    fn load(&self, input: usize, d: DType, coef: &[i64], off: i64) -> Result<BasicValueEnum<'c>> {
        let mut idx = self.i64c(off);
        for (k, &c) in coef.iter().enumerate() {
            if c != 0 {
                let t = self
                    .b
                    .build_int_mul(self.var(k)?, self.i64c(c), "t")
                    .map_err(llvm)?;
                idx = self.b.build_int_add(idx, t, "i").map_err(llvm)?;
            }
        }
        self.load_at(input, d, idx)
    }

    /// Loads element `idx` of input buffer `input` and widens it to its register type.
    fn load_at(&self, input: usize, d: DType, idx: IntValue<'c>) -> Result<BasicValueEnum<'c>> {
        let ptr = self.ctx.ptr_type(AddressSpace::default());
        // SAFETY (of the emitted code): `input` indexes the pointer array built by `run`.
        let slot = unsafe {
            self.b
                .build_in_bounds_gep(ptr, self.inputs.get(), &[self.i64c(input as i64)], "slot")
        }
        .map_err(llvm)?;
        let base = self.b.build_load(ptr, slot, "base").map_err(llvm)?;
        self.scope_input(base)?;
        let base = base.into_pointer_value();
        let idx = match self.shifted.get() {
            Some((i, offset)) if i == input => {
                self.b.build_int_sub(idx, offset, "i").map_err(llvm)?
            }
            _ => idx,
        };
        let st = storage(self.ctx, d);
        // SAFETY (of the emitted code): the verifier bounds every index inside the buffer.
        let p = unsafe { self.b.build_gep(st, base, &[idx], "p") }.map_err(llvm)?;
        let raw = self.b.build_load(st, p, "x").map_err(llvm)?;
        self.scope_input(raw)?;
        self.load_value(d, raw)
    }

    /// Marks a load as a read of the inputs (see [`Emitter::scopes`]).
    fn scope_input(&self, v: BasicValueEnum<'c>) -> Result<()> {
        self.scope(v.as_instruction_value(), false)
    }

    /// Puts `inst` in the inputs' scope (a load) or the extra outputs' (`extra`, a store),
    /// with no alias in the other.
    fn scope(&self, inst: Option<InstructionValue<'c>>, extra: bool) -> Result<()> {
        let (Some(inst), Some((ins, outs))) = (inst, self.scopes.get()) else {
            return Ok(());
        };
        let (own, other) = if extra { (outs, ins) } else { (ins, outs) };
        inst.set_metadata(own, self.ctx.get_kind_id("alias.scope"))
            .map_err(llvm)?;
        inst.set_metadata(other, self.ctx.get_kind_id("noalias"))
            .map_err(llvm)
    }

    fn load_value(&self, d: DType, raw: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>> {
        Ok(match d {
            DType::Pred => self
                .b
                .build_int_compare(
                    IntPredicate::NE,
                    raw.into_int_value(),
                    self.ctx.i8_type().const_zero(),
                    "p",
                )
                .map_err(llvm)?
                .into(),
            DType::F16 => {
                let h = self
                    .b
                    .build_bit_cast(raw, self.ctx.f16_type(), "h")
                    .map_err(llvm)?
                    .into_float_value();
                self.b
                    .build_float_ext(h, self.ctx.f32_type(), "f")
                    .map_err(llvm)?
                    .into()
            }
            DType::BF16 => {
                let w = self
                    .b
                    .build_int_z_extend(raw.into_int_value(), self.ctx.i32_type(), "w")
                    .map_err(llvm)?;
                let s = self
                    .b
                    .build_left_shift(w, self.ctx.i32_type().const_int(16, false), "s")
                    .map_err(llvm)?;
                self.b
                    .build_bit_cast(s, self.ctx.f32_type(), "f")
                    .map_err(llvm)?
            }
            _ => raw,
        })
    }

    fn store_value(&self, d: DType, v: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>> {
        let i32t = self.ctx.i32_type();
        Ok(match d {
            DType::Pred => self
                .b
                .build_int_z_extend(v.into_int_value(), self.ctx.i8_type(), "p")
                .map_err(llvm)?
                .into(),
            DType::F16 => {
                let h = self
                    .b
                    .build_float_trunc(v.into_float_value(), self.ctx.f16_type(), "h")
                    .map_err(llvm)?;
                self.b
                    .build_bit_cast(h, self.ctx.i16_type(), "b")
                    .map_err(llvm)?
            }
            DType::BF16 => {
                // Round to nearest even on the top 16 bits; NaN stays a quiet NaN.
                let bits = self
                    .b
                    .build_bit_cast(v, i32t, "bits")
                    .map_err(llvm)?
                    .into_int_value();
                let lsb = self
                    .b
                    .build_right_shift(bits, i32t.const_int(16, false), false, "l")
                    .map_err(llvm)?;
                let lsb = self
                    .b
                    .build_and(lsb, i32t.const_int(1, false), "l1")
                    .map_err(llvm)?;
                let bias = self
                    .b
                    .build_int_add(lsb, i32t.const_int(0x7FFF, false), "bias")
                    .map_err(llvm)?;
                let rounded = self.b.build_int_add(bits, bias, "r").map_err(llvm)?;
                let top = self
                    .b
                    .build_right_shift(rounded, i32t.const_int(16, false), false, "t")
                    .map_err(llvm)?;
                let isnan = self
                    .b
                    .build_float_compare(
                        FloatPredicate::UNO,
                        v.into_float_value(),
                        v.into_float_value(),
                        "nan",
                    )
                    .map_err(llvm)?;
                let q = self
                    .b
                    .build_select(isnan, i32t.const_int(0x7FC0, false), top, "q")
                    .map_err(llvm)?
                    .into_int_value();
                self.b
                    .build_int_truncate(q, self.ctx.i16_type(), "h")
                    .map_err(llvm)?
                    .into()
            }
            _ => v,
        })
    }

    fn constant(&self, d: DType, x: f64) -> BasicValueEnum<'c> {
        if d.is_float() {
            self.ftype(d)
                .const_float(kiln_ir::literal::round_to(d, x))
                .into()
        } else if d == DType::Pred {
            self.ctx
                .bool_type()
                .const_int((x != 0.0) as u64, false)
                .into()
        } else {
            self.itype(d)
                .const_int(kiln_ir::literal::convert_f64(d, x) as u64, true)
                .into()
        }
    }

    /// Emits a loop over the counter in stack slot `slot` from `lo` (inclusive) to `hi`
    /// (exclusive) by `step`, running `body` inside.
    fn range_loop_ptr(
        &self,
        slot: PointerValue<'c>,
        lo: IntValue<'c>,
        hi: IntValue<'c>,
        step: i64,
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        self.labeled_loop("head", slot, (lo, hi), step, body)
    }

    /// [`Emitter::range_loop_ptr`] over `range`, its header block named `label` (so dumps and
    /// tests tell loops of different roles apart).
    fn labeled_loop(
        &self,
        label: &str,
        slot: PointerValue<'c>,
        (lo, hi): (IntValue<'c>, IntValue<'c>),
        step: i64,
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        let i64t = self.ctx.i64_type();
        let load = |b: &Builder<'c>| -> Result<IntValue<'c>> {
            Ok(b.build_load(i64t, slot, "v")
                .map_err(llvm)?
                .into_int_value())
        };
        self.b.build_store(slot, lo).map_err(llvm)?;
        let head = self.ctx.append_basic_block(self.f, label);
        let inner = self.ctx.append_basic_block(self.f, "body");
        let exit = self.ctx.append_basic_block(self.f, "exit");
        self.b.build_unconditional_branch(head).map_err(llvm)?;
        self.b.position_at_end(head);
        let more = self
            .b
            .build_int_compare(IntPredicate::SLT, load(&self.b)?, hi, "more")
            .map_err(llvm)?;
        self.b
            .build_conditional_branch(more, inner, exit)
            .map_err(llvm)?;
        self.b.position_at_end(inner);
        body(self)?;
        let next = self
            .b
            .build_int_add(load(&self.b)?, self.i64c(step), "next")
            .map_err(llvm)?;
        self.b.build_store(slot, next).map_err(llvm)?;
        self.b.build_unconditional_branch(head).map_err(llvm)?;
        self.b.position_at_end(exit);
        Ok(())
    }

    /// Emits a loop over `var` from `lo` (inclusive) to `hi` (exclusive) by `step`.
    fn range_loop(
        &self,
        var: usize,
        lo: IntValue<'c>,
        hi: IntValue<'c>,
        step: i64,
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        self.range_loop_ptr(self.vars[var], lo, hi, step, body)
    }

    /// Emits a counted loop over `var` in `0..extent`, running `body` inside.
    fn counted(
        &self,
        var: usize,
        extent: usize,
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        self.range_loop(var, self.i64c(0), self.i64c(extent as i64), 1, body)
    }

    /// `a` where `a p b` holds, else `b`: the larger (`SGT`) or smaller (`SLT`) of two signed
    /// integers.
    fn int_pick(&self, p: IntPredicate, a: IntValue<'c>, b: IntValue<'c>) -> Result<IntValue<'c>> {
        let c = self.b.build_int_compare(p, a, b, "c").map_err(llvm)?;
        Ok(self
            .b
            .build_select(c, a, b, "p")
            .map_err(llvm)?
            .into_int_value())
    }

    /// The larger of two signed integers.
    fn int_max(&self, a: IntValue<'c>, b: IntValue<'c>) -> Result<IntValue<'c>> {
        self.int_pick(IntPredicate::SGT, a, b)
    }

    /// The smaller of two signed integers.
    fn int_min(&self, a: IntValue<'c>, b: IntValue<'c>) -> Result<IntValue<'c>> {
        self.int_pick(IntPredicate::SLT, a, b)
    }

    /// Whether the enclosing loops' facts decide condition `c`: `lo <= v + k < hi` holds at
    /// every value `v` can take here, or at none.
    fn known(&self, c: &Cond) -> Option<bool> {
        let Cond::InRange(i, lo, hi) = c else {
            return None;
        };
        let (v, k) = var_plus_const(i)?;
        let facts = self.facts.borrow();
        let &(_, flo, fhi) = facts.iter().rev().find(|f| f.0 == v)?;
        let (first, last) = (flo + k, fhi - 1 + k);
        if first >= *lo && last < *hi {
            Some(true)
        } else if last < *lo || first >= *hi {
            Some(false)
        } else {
            None
        }
    }

    /// Loop `var` over each of `segments` in turn (together `0..extent`, see
    /// [`guard_segments`]), knowing in each that `var` lies in it.
    fn segmented(
        &self,
        var: usize,
        segments: &[(i64, i64)],
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        for &(lo, hi) in segments {
            self.facts.borrow_mut().push((var, lo, hi));
            let r = self.range_loop(var, self.i64c(lo), self.i64c(hi), 1, body);
            self.facts.borrow_mut().pop();
            r?;
        }
        Ok(())
    }

    /// `cond ? a : e` for floats.
    fn select_float(
        &self,
        cond: IntValue<'c>,
        a: FloatValue<'c>,
        e: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        Ok(self
            .b
            .build_select(cond, a, e, "s")
            .map_err(llvm)?
            .into_float_value())
    }

    /// A pointer table of `len` slots, slot `i` holding `pick(i)` or else slot `i` of the
    /// current table, which it then replaces (in-place kernels and GEMM epilogues read some
    /// buffers through other pointers than the runtime passed). Returns the previous table.
    fn swap_pointer_table(
        &self,
        len: usize,
        pick: &dyn Fn(usize) -> Option<PointerValue<'c>>,
    ) -> Result<PointerValue<'c>> {
        let ptr = self.ctx.ptr_type(AddressSpace::default());
        let table = self.entry_alloca(ptr.array_type(len as u32).into())?;
        let old = self.inputs.get();
        for i in 0..len {
            // SAFETY (of the emitted code): i is below both tables' lengths.
            let at = |base| unsafe {
                self.b
                    .build_in_bounds_gep(ptr, base, &[self.i64c(i as i64)], "slot")
            };
            let p = match pick(i) {
                Some(p) => p,
                None => self
                    .b
                    .build_load(ptr, at(old).map_err(llvm)?, "in")
                    .map_err(llvm)?
                    .into_pointer_value(),
            };
            self.b
                .build_store(at(table).map_err(llvm)?, p)
                .map_err(llvm)?;
        }
        self.inputs.set(table);
        Ok(old)
    }

    /// Computes every reduction of `bodies` that reads only loop variables below `d` and is
    /// not computed yet, for the expressions emitted next to reuse (`hoisted`); returns the
    /// mark to truncate `hoisted` to when those loops end.
    ///
    /// `extents[v]` is the trip count of loop variable `v` below the output's rank. A
    /// reduction whose body computes something costly that the expressions also compute at
    /// their own position along the reduced axis (a softmax's exp(x - max), in its sum and in
    /// its outputs) keeps that value per position in a stack buffer as it reduces (see
    /// [`row_cache`]); the expressions then read the buffer instead of computing it again.
    fn hoist<'e>(
        &self,
        bodies: impl Iterator<Item = &'e Expr>,
        d: usize,
        extents: &[usize],
    ) -> Result<usize> {
        let mark = self.hoisted.borrow().len();
        let bodies: Vec<&Expr> = bodies.collect();
        for r in bodies.iter().flat_map(|b| hoistable_reduces(b)) {
            if !free_vars(r).iter().all(|&v| v < d) || self.is_hoisted(r) {
                continue;
            }
            match row_cache(r, &bodies, d, extents) {
                Some(plan) if row_caches() => self.hoist_caching(r, &plan)?,
                _ => self.hoist_one(r)?,
            }
        }
        Ok(mark)
    }

    /// Computes the reduction `r` (whose single variable is the one `plan` caches along),
    /// storing the value of `plan.part` at each position into a stack buffer, and makes both
    /// the reduction and the buffer available to the expressions emitted next.
    fn hoist_caching(&self, r: &Expr, plan: &RowCache<'_>) -> Result<()> {
        let Expr::Reduce { vars, .. } = r else {
            return Ok(());
        };
        let ct = self.ftype(plan.part.dtype());
        let buf = self.line_buffer(ct.into(), plan.len)?;
        let part_key = value_key(plan.part);
        let v = self.reduce(r, &mut |em: &Self| {
            let x = em.expr(plan.part)?;
            // SAFETY (of the emitted code): the variable runs below `plan.len`, the buffer's
            // length.
            let p = unsafe {
                em.b.build_in_bounds_gep(ct, buf, &[em.var(vars[0].0)?], "rc")
            }
            .map_err(llvm)?;
            em.b.build_store(p, x).map_err(llvm)?;
            em.hoisted
                .borrow_mut()
                .push((part_key.clone(), Hoisted::Value(x)));
            em.memo.set(true);
            Ok(())
        })?;
        let mut hoisted = self.hoisted.borrow_mut();
        hoisted.push((value_key(r), Hoisted::Value(v)));
        hoisted.push((plan.key.clone(), Hoisted::Row { buf, var: plan.var }));
        Ok(())
    }

    /// Computes `e` here, unless already hoisted, for the expressions emitted next to reuse.
    fn hoist_one(&self, e: &Expr) -> Result<()> {
        if !self.is_hoisted(e) {
            let v = self.expr(e)?;
            self.hoisted
                .borrow_mut()
                .push((value_key(e), Hoisted::Value(v)));
        }
        Ok(())
    }

    /// Whether `e` was computed ahead of the current code (see [`Self::hoist`]).
    fn is_hoisted(&self, e: &Expr) -> bool {
        let hoisted = self.hoisted.borrow();
        !hoisted.is_empty() && {
            let key = value_key(e);
            hoisted.iter().any(|(k, _)| *k == key)
        }
    }

    /// `e`'s value if it was computed ahead of the current code (see [`Self::hoist`]): the
    /// value itself, or a row cache's element at the current position.
    fn hoisted_value(&self, e: &Expr) -> Result<Option<BasicValueEnum<'c>>> {
        let found = {
            let hoisted = self.hoisted.borrow();
            if hoisted.is_empty() {
                return Ok(None);
            }
            let key = value_key(e);
            hoisted
                .iter()
                .rev()
                .find(|(k, _)| *k == key)
                .map(|(_, h)| *h)
        };
        match found {
            None => Ok(None),
            Some(Hoisted::Value(v)) => Ok(Some(v)),
            Some(Hoisted::Row { buf, var }) => {
                let ct = self.ftype(e.dtype());
                // SAFETY (of the emitted code): the variable runs below the buffer's length
                // (`row_cache` checks the extents).
                let p = unsafe { self.b.build_in_bounds_gep(ct, buf, &[self.var(var)?], "rc") }
                    .map_err(llvm)?;
                Ok(Some(self.b.build_load(ct, p, "cached").map_err(llvm)?))
            }
        }
    }

    /// The flat position `Σ var(d) * strides[d]` of the current loop variables.
    fn position(&self, strides: &[usize]) -> Result<IntValue<'c>> {
        let mut idx = self.i64c(0);
        for (d, &stride) in strides.iter().enumerate() {
            let t = self
                .b
                .build_int_mul(self.var(d)?, self.i64c(stride as i64), "t")
                .map_err(llvm)?;
            idx = self.b.build_int_add(idx, t, "i").map_err(llvm)?;
        }
        Ok(idx)
    }

    /// A stack slot in the entry block (allocas elsewhere would grow the stack on every
    /// iteration and are not promoted to registers).
    fn entry_alloca(&self, ty: BasicTypeEnum<'c>) -> Result<PointerValue<'c>> {
        let entry = self
            .f
            .get_first_basic_block()
            .expect("the kernel has an entry block");
        let tmp = self.ctx.create_builder();
        match entry.get_first_instruction() {
            Some(first) => tmp.position_before(&first),
            None => tmp.position_at_end(entry),
        }
        tmp.build_alloca(ty, "acc").map_err(llvm)
    }

    /// A stack buffer of `len` elements of `st` in the entry block, aligned to a cache line.
    fn line_buffer(&self, st: BasicTypeEnum<'c>, len: usize) -> Result<PointerValue<'c>> {
        let buf =
            self.entry_alloca(inkwell::types::BasicType::array_type(&st, len as u32).into())?;
        buf.as_instruction()
            .ok_or_else(|| Error::Llvm("an alloca is an instruction".into()))?
            .set_alignment(LINE as u32)
            .map_err(llvm)?;
        Ok(buf)
    }

    fn idx(&self, i: &Idx) -> Result<IntValue<'c>> {
        let b = &self.b;
        Ok(match i {
            Idx::Var(v) => self.var(*v)?,
            Idx::Const(c) => self.i64c(*c),
            Idx::Add(xs) => {
                let mut acc = self.i64c(0);
                for x in xs {
                    acc = b.build_int_add(acc, self.idx(x)?, "ia").map_err(llvm)?;
                }
                acc
            }
            Idx::Mul(x, c) => b
                .build_int_mul(self.idx(x)?, self.i64c(*c), "im")
                .map_err(llvm)?,
            Idx::Div(x, c) => b
                .build_int_signed_div(self.idx(x)?, self.i64c(*c), "id")
                .map_err(llvm)?,
            Idx::Clamp(x, lo, hi) => {
                let v = self.idx(x)?;
                let lo_v = self.i64c(*lo);
                let hi_v = self.i64c(*hi);
                let below = b
                    .build_int_compare(IntPredicate::SLT, v, lo_v, "lo")
                    .map_err(llvm)?;
                let v = b
                    .build_select(below, lo_v, v, "c1")
                    .map_err(llvm)?
                    .into_int_value();
                let above = b
                    .build_int_compare(IntPredicate::SGT, v, hi_v, "hi")
                    .map_err(llvm)?;
                b.build_select(above, hi_v, v, "c2")
                    .map_err(llvm)?
                    .into_int_value()
            }
            Idx::Value(e) => {
                let d = e.dtype();
                let v = self.expr(e)?.into_int_value();
                let i64t = self.ctx.i64_type();
                if v.get_type().get_bit_width() == 64 {
                    v
                } else if d == DType::U32 || d == DType::Pred {
                    b.build_int_z_extend(v, i64t, "z").map_err(llvm)?
                } else {
                    b.build_int_s_extend(v, i64t, "s").map_err(llvm)?
                }
            }
        })
    }

    fn cond(&self, c: &Cond) -> Result<IntValue<'c>> {
        let b = &self.b;
        Ok(match c {
            Cond::InRange(x, lo, hi) => {
                let v = self.idx(x)?;
                let a = b
                    .build_int_compare(IntPredicate::SGE, v, self.i64c(*lo), "ge")
                    .map_err(llvm)?;
                let z = b
                    .build_int_compare(IntPredicate::SLT, v, self.i64c(*hi), "lt")
                    .map_err(llvm)?;
                b.build_and(a, z, "in").map_err(llvm)?
            }
            Cond::Divisible(x, m) => {
                let r = b
                    .build_int_signed_rem(self.idx(x)?, self.i64c(*m), "rem")
                    .map_err(llvm)?;
                b.build_int_compare(IntPredicate::EQ, r, self.i64c(0), "div")
                    .map_err(llvm)?
            }
        })
    }

    fn expr(&self, e: &Expr) -> Result<BasicValueEnum<'c>> {
        match e {
            Expr::Gather {
                input,
                dtype,
                index,
                strides,
            } => {
                let mut parts = Vec::new();
                let mut off = 0i64;
                for (i, s) in index.iter().zip(strides) {
                    match i {
                        Idx::Const(c) => off += c * s,
                        _ => parts.push(Idx::Mul(Box::new(i.clone()), *s)),
                    }
                }
                parts.push(Idx::Const(off));
                let flat = self.idx(&Idx::Add(parts))?;
                self.load_at(*input, *dtype, flat)
            }
            Expr::Guard {
                conds,
                then,
                otherwise,
            } => {
                // Conditions the enclosing loops decide are not checked.
                let mut open = Vec::new();
                for c in conds {
                    match self.known(c) {
                        Some(false) => return self.expr(otherwise),
                        Some(true) => {}
                        None => open.push(c),
                    }
                }
                if open.is_empty() {
                    return self.expr(then);
                }
                let mut ok = self.ctx.bool_type().const_int(1, false);
                for c in open {
                    ok = self.b.build_and(ok, self.cond(c)?, "ok").map_err(llvm)?;
                }
                let tb = self.ctx.append_basic_block(self.f, "then");
                let eb = self.ctx.append_basic_block(self.f, "else");
                let mb = self.ctx.append_basic_block(self.f, "merge");
                self.b.build_conditional_branch(ok, tb, eb).map_err(llvm)?;
                self.b.position_at_end(tb);
                let tv = self.expr(then)?;
                let t_end = self.b.get_insert_block().expect("positioned");
                self.b.build_unconditional_branch(mb).map_err(llvm)?;
                self.b.position_at_end(eb);
                let ev = self.expr(otherwise)?;
                let e_end = self.b.get_insert_block().expect("positioned");
                self.b.build_unconditional_branch(mb).map_err(llvm)?;
                self.b.position_at_end(mb);
                let phi = self.b.build_phi(tv.get_type(), "g").map_err(llvm)?;
                phi.add_incoming(&[(&tv, t_end), (&ev, e_end)]);
                Ok(phi.as_basic_value())
            }
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => {
                if coef.iter().all(|&c| c == 0)
                    && let Some(v) = self.hoisted_value(e)?
                {
                    return Ok(v);
                }
                self.load(*input, *dtype, coef, *off)
            }
            Expr::Iota { var, .. } => Ok(self.var(*var)?.into()),
            Expr::Index { idx, .. } => Ok(self.idx(idx)?.into()),
            Expr::Const { dtype, value } => Ok(self.constant(*dtype, *value)),
            Expr::Op { op, dtype, args } => {
                if self.memo.get()
                    && let Some(v) = self.hoisted_value(e)?
                {
                    return Ok(v);
                }
                let vals: Vec<BasicValueEnum> =
                    args.iter().map(|a| self.expr(a)).collect::<Result<_>>()?;
                let in_dt = match op {
                    Ew::Select => args[1].dtype(),
                    _ => args[0].dtype(),
                };
                if matches!(op, Ew::Kind(OpKind::Exponential))
                    && !self.nonpositive.is_empty()
                    && self.nonpositive.contains(&value_key(e))
                {
                    self.exp_nonpositive.set(true);
                }
                let r = self.op(op, in_dt, *dtype, &vals);
                // Taken by the exponential itself; never left for another one.
                self.exp_nonpositive.set(false);
                r
            }
            Expr::Reduce { .. } => {
                if let Some(v) = self.hoisted_value(e)? {
                    return Ok(v);
                }
                self.reduce(e, &mut |_| Ok(()))
            }
        }
    }

    /// The reduction `e` (an [`Expr::Reduce`]), calling `before` at each position ahead of the
    /// body; whatever `before` adds to `hoisted` is dropped after the body.
    fn reduce(
        &self,
        e: &Expr,
        before: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<BasicValueEnum<'c>> {
        let Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } = e
        else {
            return self.expr(e);
        };
        let ct: BasicTypeEnum = if dtype.is_float() {
            self.ftype(*dtype).into()
        } else {
            self.itype(*dtype).into()
        };
        let acc = self.entry_alloca(ct)?;
        let i = self.expr(init)?;
        self.b.build_store(acc, i).map_err(llvm)?;
        // The reductions inside the body that stay fixed while some of this reduction's loops
        // move (a row's maximum, inside a sum over rows and columns) are computed once where
        // the loops they depend on have opened, not at every step.
        let inner = hoistable_reduces(body);
        let mut inner_bound = std::collections::BTreeSet::new();
        for r in &inner {
            if let Expr::Reduce { vars: own, .. } = r {
                inner_bound.extend(own.iter().map(|v| v.0));
            }
        }
        let sum = sum_tree::Sum::new(*kind, *dtype, ct);
        self.accumulate(vars, &inner, &inner_bound, &sum, &[acc], &mut |em, accs| {
            let mark = em.hoisted.borrow().len();
            before(em)?;
            let x = em.expr(body)?;
            em.hoisted.borrow_mut().truncate(mark);
            let a = em.b.build_load(ct, accs[0], "a").map_err(llvm)?;
            let c = em.combine_with(*kind, *dtype, a, x, !em.in_order.get())?;
            em.b.build_store(accs[0], c).map_err(llvm)?;
            Ok(())
        })?;
        self.b.build_load(ct, acc, "sum").map_err(llvm)
    }

    /// Counted loops over `vars`, outermost first, running `body` inside (no reduction is
    /// hoisted: [`Emitter::accumulate`] hoists those of a reduction's body).
    fn nest(
        &self,
        vars: &[(usize, usize)],
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        let mark = self.hoisted.borrow().len();
        let done = match vars.split_first() {
            None => body(self),
            Some((&(v, n), rest)) => self.counted(v, n, &mut |em: &Self| em.nest(rest, body)),
        };
        self.hoisted.borrow_mut().truncate(mark);
        done
    }

    fn combine(
        &self,
        kind: Combiner,
        d: DType,
        a: BasicValueEnum<'c>,
        x: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>> {
        self.combine_with(kind, d, a, x, true)
    }

    /// [`Emitter::combine`], with float sums and products marked reassociable or not.
    fn combine_with(
        &self,
        kind: Combiner,
        d: DType,
        a: BasicValueEnum<'c>,
        x: BasicValueEnum<'c>,
        reassoc: bool,
    ) -> Result<BasicValueEnum<'c>> {
        let k = match (kind, d) {
            (Combiner::Add, DType::Pred) | (Combiner::Max, DType::Pred) | (Combiner::Or, _) => {
                OpKind::Or
            }
            (Combiner::Mul, DType::Pred) | (Combiner::Min, DType::Pred) | (Combiner::And, _) => {
                OpKind::And
            }
            (Combiner::Add, _) | (Combiner::Replace, _) => OpKind::Add,
            (Combiner::Mul, _) => OpKind::Multiply,
            (Combiner::Max, _) => OpKind::Maximum,
            (Combiner::Min, _) => OpKind::Minimum,
        };
        let r = self.op(&Ew::Kind(k), d, d, &[a, x])?;
        // Float sums and products may be reassociated, so the loop vectorizer can keep several
        // partial accumulators (a scalar chain runs at one add per FMA latency). The order is
        // fixed at compile time, so results are the same on every run.
        if reassoc
            && d.is_float()
            && matches!(k, OpKind::Add | OpKind::Multiply)
            && let Some(inst) = r.as_instruction_value()
        {
            inst.set_fast_math_flags(inkwell::values::FastMathFlags::AllowReassoc)
                .map_err(llvm)?;
        }
        Ok(r)
    }

    fn op(
        &self,
        op: &Ew,
        d: DType,
        out: DType,
        v: &[BasicValueEnum<'c>],
    ) -> Result<BasicValueEnum<'c>> {
        let b = &self.b;
        match op {
            Ew::Select => Ok(b
                .build_select(v[0].into_int_value(), v[1], v[2], "sel")
                .map_err(llvm)?),
            Ew::Clamp => {
                let m = self.op(&Ew::Kind(OpKind::Maximum), d, d, &[v[1], v[0]])?;
                self.op(&Ew::Kind(OpKind::Minimum), d, d, &[m, v[2]])
            }
            Ew::Convert => self.convert(d, out, v[0]),
            Ew::Narrow => self.load_value(out, self.store_value(out, v[0])?),
            Ew::Bitcast => {
                let to: BasicTypeEnum = if out.is_float() {
                    self.ftype(out).into()
                } else {
                    self.itype(out).into()
                };
                Ok(b.build_bit_cast(v[0], to, "bc").map_err(llvm)?)
            }
            Ew::Cmp(dir) => {
                if d.is_float() {
                    let p = match dir {
                        Cmp::Eq => FloatPredicate::OEQ,
                        Cmp::Ne => FloatPredicate::UNE,
                        Cmp::Lt => FloatPredicate::OLT,
                        Cmp::Le => FloatPredicate::OLE,
                        Cmp::Gt => FloatPredicate::OGT,
                        Cmp::Ge => FloatPredicate::OGE,
                    };
                    Ok(b.build_float_compare(
                        p,
                        v[0].into_float_value(),
                        v[1].into_float_value(),
                        "c",
                    )
                    .map_err(llvm)?
                    .into())
                } else {
                    let signed = d.is_signed();
                    let p = match (dir, signed) {
                        (Cmp::Eq, _) => IntPredicate::EQ,
                        (Cmp::Ne, _) => IntPredicate::NE,
                        (Cmp::Lt, true) => IntPredicate::SLT,
                        (Cmp::Le, true) => IntPredicate::SLE,
                        (Cmp::Gt, true) => IntPredicate::SGT,
                        (Cmp::Ge, true) => IntPredicate::SGE,
                        (Cmp::Lt, false) => IntPredicate::ULT,
                        (Cmp::Le, false) => IntPredicate::ULE,
                        (Cmp::Gt, false) => IntPredicate::UGT,
                        (Cmp::Ge, false) => IntPredicate::UGE,
                    };
                    Ok(
                        b.build_int_compare(p, v[0].into_int_value(), v[1].into_int_value(), "c")
                            .map_err(llvm)?
                            .into(),
                    )
                }
            }
            Ew::Kind(k) if d.is_float() => self.float_op(*k, d, v),
            Ew::Kind(k) => self.int_op(*k, d, v),
        }
    }

    fn float_op(
        &self,
        k: OpKind,
        d: DType,
        v: &[BasicValueEnum<'c>],
    ) -> Result<BasicValueEnum<'c>> {
        let b = &self.b;
        let ft = self.ftype(d);
        let x = v[0].into_float_value();
        let y = v.get(1).map(|y| y.into_float_value());
        let one = ft.const_float(1.0);
        let intr = |name: &str| self.intrinsic(name, ft.into(), v);
        let r: BasicValueEnum = match k {
            OpKind::Add => b
                .build_float_add(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Subtract => b
                .build_float_sub(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Multiply => b
                .build_float_mul(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Divide => b
                .build_float_div(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Remainder => b
                .build_float_rem(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Maximum => intr("llvm.maximum")?,
            OpKind::Minimum => intr("llvm.minimum")?,
            OpKind::Power => intr("llvm.pow")?,
            OpKind::Negate => b.build_float_neg(x, "r").map_err(llvm)?.into(),
            OpKind::Abs => intr("llvm.fabs")?,
            OpKind::Sign => {
                let pos = b
                    .build_float_compare(FloatPredicate::OGT, x, ft.const_zero(), "pos")
                    .map_err(llvm)?;
                let neg = b
                    .build_float_compare(FloatPredicate::OLT, x, ft.const_zero(), "neg")
                    .map_err(llvm)?;
                let s = b
                    .build_select(neg, ft.const_float(-1.0), x, "s")
                    .map_err(llvm)?;
                b.build_select(pos, one.into(), s, "r").map_err(llvm)?
            }
            OpKind::Exponential if self.exp_nonpositive.replace(false) => {
                self.exp_nonpositive(d, x)?.into()
            }
            OpKind::Exponential => self.exp_fast(d, x)?.into(),
            OpKind::Log => self.log_fast(d, x)?.into(),
            OpKind::LogPlusOne => self.libm("log1p", d, x)?.into(),
            OpKind::ExponentialMinusOne => self.libm("expm1", d, x)?.into(),
            OpKind::Sqrt => intr("llvm.sqrt")?,
            OpKind::Rsqrt => {
                let s = intr("llvm.sqrt")?.into_float_value();
                b.build_float_div(one, s, "r").map_err(llvm)?.into()
            }
            OpKind::Tanh => self.tanh_fast(d, x)?.into(),
            OpKind::Logistic => self.logistic_fast(d, x)?.into(),
            OpKind::Sine => intr("llvm.sin")?,
            OpKind::Cosine => intr("llvm.cos")?,
            OpKind::Erf => self.erf_fast(d, x)?.into(),
            OpKind::Floor => intr("llvm.floor")?,
            OpKind::Ceil => intr("llvm.ceil")?,
            OpKind::Round => intr("llvm.round")?,
            OpKind::IsFinite => {
                let a = intr("llvm.fabs")?.into_float_value();
                b.build_float_compare(FloatPredicate::ONE, a, ft.const_float(f64::INFINITY), "r")
                    .map_err(llvm)?
                    .into()
            }
            other => return Err(Error::Unsupported(format!("`{other}` on {d}"))),
        };
        Ok(r)
    }

    /// `x` to the power `y` in wrapping integer arithmetic: square-and-multiply over every bit
    /// of `y` (straight-line code, so it vectorizes). A negative exponent gives 1 for a base of
    /// 1, +-1 for -1 (by the exponent's parity) and 0 otherwise.
    fn int_pow(
        &self,
        it: IntType<'c>,
        signed: bool,
        x: IntValue<'c>,
        y: IntValue<'c>,
    ) -> Result<IntValue<'c>> {
        let b = &self.b;
        let one = it.const_int(1, false);
        let sel = |c: IntValue<'c>, t: IntValue<'c>, e: IntValue<'c>| -> Result<IntValue<'c>> {
            Ok(b.build_select(c, t, e, "s").map_err(llvm)?.into_int_value())
        };
        let odd = |e: IntValue<'c>| -> Result<IntValue<'c>> {
            let bit = b.build_and(e, one, "bit").map_err(llvm)?;
            b.build_int_compare(IntPredicate::NE, bit, it.const_zero(), "odd")
                .map_err(llvm)
        };
        let (mut acc, mut base, mut e) = (one, x, y);
        for step in 0..it.get_bit_width() {
            let times = b.build_int_mul(acc, base, "t").map_err(llvm)?;
            acc = sel(odd(e)?, times, acc)?;
            if step + 1 < it.get_bit_width() {
                base = b.build_int_mul(base, base, "sq").map_err(llvm)?;
                e = b.build_right_shift(e, one, false, "e").map_err(llvm)?;
            }
        }
        if !signed {
            return Ok(acc);
        }
        let minus_one = it.const_all_ones();
        let is = |v: IntValue<'c>| {
            b.build_int_compare(IntPredicate::EQ, x, v, "is")
                .map_err(llvm)
        };
        let parity = sel(odd(y)?, minus_one, one)?;
        let neg = sel(is(one)?, one, sel(is(minus_one)?, parity, it.const_zero())?)?;
        let negative = b
            .build_int_compare(IntPredicate::SLT, y, it.const_zero(), "neg")
            .map_err(llvm)?;
        sel(negative, neg, acc)
    }

    fn int_op(&self, k: OpKind, d: DType, v: &[BasicValueEnum<'c>]) -> Result<BasicValueEnum<'c>> {
        let b = &self.b;
        let it = self.itype(d);
        let x = v[0].into_int_value();
        let y = v.get(1).map(|y| y.into_int_value());
        let signed = d.is_signed();
        let pred = d == DType::Pred;
        let bits = it.get_bit_width() as u64;
        let intr = |name: &str| self.intrinsic(name, it.into(), v);
        let r: BasicValueEnum = match k {
            OpKind::Add if pred => b.build_or(x, y.expect("binary"), "r").map_err(llvm)?.into(),
            OpKind::Multiply if pred => b
                .build_and(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Maximum if pred => b.build_or(x, y.expect("binary"), "r").map_err(llvm)?.into(),
            OpKind::Minimum if pred => b
                .build_and(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Add => b
                .build_int_add(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Subtract => b
                .build_int_sub(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Multiply => b
                .build_int_mul(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Power => self.int_pow(it, signed, x, y.expect("binary"))?.into(),
            OpKind::Divide | OpKind::Remainder => {
                let y = y.expect("binary");
                let zero = b
                    .build_int_compare(IntPredicate::EQ, y, it.const_zero(), "z")
                    .map_err(llvm)?;
                let min = it.const_int(1u64 << (bits - 1), false);
                let all = it.const_all_ones();
                let overflow = if signed {
                    let a = b
                        .build_int_compare(IntPredicate::EQ, x, min, "a")
                        .map_err(llvm)?;
                    let c = b
                        .build_int_compare(IntPredicate::EQ, y, all, "c")
                        .map_err(llvm)?;
                    b.build_and(a, c, "o").map_err(llvm)?
                } else {
                    self.ctx.bool_type().const_zero()
                };
                let bad = b.build_or(zero, overflow, "bad").map_err(llvm)?;
                let safe_y = b
                    .build_select(bad, it.const_int(1, false), y, "sy")
                    .map_err(llvm)?
                    .into_int_value();
                if k == OpKind::Divide {
                    let q = if signed {
                        b.build_int_signed_div(x, safe_y, "q")
                    } else {
                        b.build_int_unsigned_div(x, safe_y, "q")
                    }
                    .map_err(llvm)?;
                    // x / 0 = -1 (all bits); MIN / -1 = MIN.
                    let q = b.build_select(overflow, min, q, "q1").map_err(llvm)?;
                    b.build_select(zero, all.into(), q, "r").map_err(llvm)?
                } else {
                    let q = if signed {
                        b.build_int_signed_rem(x, safe_y, "q")
                    } else {
                        b.build_int_unsigned_rem(x, safe_y, "q")
                    }
                    .map_err(llvm)?;
                    // x % 0 = x; MIN % -1 = 0.
                    let q = b
                        .build_select(overflow, it.const_zero(), q, "q1")
                        .map_err(llvm)?;
                    b.build_select(zero, x.into(), q, "r").map_err(llvm)?
                }
            }
            OpKind::Maximum => intr(if signed { "llvm.smax" } else { "llvm.umax" })?,
            OpKind::Minimum => intr(if signed { "llvm.smin" } else { "llvm.umin" })?,
            OpKind::And => b
                .build_and(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Or => b.build_or(x, y.expect("binary"), "r").map_err(llvm)?.into(),
            OpKind::Xor => b
                .build_xor(x, y.expect("binary"), "r")
                .map_err(llvm)?
                .into(),
            OpKind::Not => b.build_not(x, "r").map_err(llvm)?.into(),
            OpKind::ShiftLeft | OpKind::ShiftRightLogical => {
                let y = y.expect("binary");
                // Amounts outside [0, bits) give 0 (as unsigned, negatives are huge).
                let inside = b
                    .build_int_compare(IntPredicate::ULT, y, it.const_int(bits, false), "in")
                    .map_err(llvm)?;
                let safe = b
                    .build_select(inside, y, it.const_zero(), "s")
                    .map_err(llvm)?
                    .into_int_value();
                let sh = if k == OpKind::ShiftLeft {
                    b.build_left_shift(x, safe, "sh")
                } else {
                    b.build_right_shift(x, safe, false, "sh")
                }
                .map_err(llvm)?;
                b.build_select(inside, sh, it.const_zero(), "r")
                    .map_err(llvm)?
            }
            OpKind::Negate => b.build_int_neg(x, "r").map_err(llvm)?.into(),
            OpKind::Abs => {
                let neg = b
                    .build_int_compare(IntPredicate::SLT, x, it.const_zero(), "n")
                    .map_err(llvm)?;
                let nx = b.build_int_neg(x, "nx").map_err(llvm)?;
                b.build_select(neg, nx, x, "r").map_err(llvm)?
            }
            OpKind::Sign => {
                let pos = b
                    .build_int_compare(IntPredicate::SGT, x, it.const_zero(), "p")
                    .map_err(llvm)?;
                let neg = b
                    .build_int_compare(IntPredicate::SLT, x, it.const_zero(), "n")
                    .map_err(llvm)?;
                let s = b
                    .build_select(neg, it.const_all_ones(), it.const_zero(), "s")
                    .map_err(llvm)?
                    .into_int_value();
                b.build_select(pos, it.const_int(1, false), s, "r")
                    .map_err(llvm)?
            }
            other => return Err(Error::Unsupported(format!("`{other}` on {d}"))),
        };
        Ok(r)
    }

    fn convert(&self, from: DType, to: DType, v: BasicValueEnum<'c>) -> Result<BasicValueEnum<'c>> {
        let b = &self.b;
        if from.is_float() && to.is_float() {
            let (ff, tf) = (self.ftype(from), self.ftype(to));
            let x = v.into_float_value();
            // f16/bf16 values are f32 in registers; rounding happens on store.
            return Ok(if ff == tf {
                x.into()
            } else if tf == self.ctx.f64_type() {
                b.build_float_ext(x, tf, "c").map_err(llvm)?.into()
            } else {
                b.build_float_trunc(x, tf, "c").map_err(llvm)?.into()
            });
        }
        if from.is_float() {
            let x = v.into_float_value();
            if to == DType::Pred {
                return Ok(b
                    .build_float_compare(FloatPredicate::UNE, x, self.ftype(from).const_zero(), "c")
                    .map_err(llvm)?
                    .into());
            }
            let it = self.itype(to);
            let name = if to.is_signed() {
                "llvm.fptosi.sat"
            } else {
                "llvm.fptoui.sat"
            };
            let i =
                Intrinsic::find(name).ok_or_else(|| Error::Llvm(format!("no intrinsic {name}")))?;
            let decl = i
                .get_declaration(self.m, &[it.into(), self.ftype(from).into()])
                .ok_or_else(|| Error::Llvm(format!("cannot declare {name}")))?;
            return b
                .build_call(decl, &[x.into()], "c")
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| Error::Llvm("no result".into()));
        }
        let x = v.into_int_value();
        let unsigned_src = from == DType::U32 || from == DType::Pred;
        if to.is_float() {
            let ft = self.ftype(to);
            return Ok(if unsigned_src {
                b.build_unsigned_int_to_float(x, ft, "c")
            } else {
                b.build_signed_int_to_float(x, ft, "c")
            }
            .map_err(llvm)?
            .into());
        }
        if to == DType::Pred {
            return Ok(b
                .build_int_compare(IntPredicate::NE, x, x.get_type().const_zero(), "c")
                .map_err(llvm)?
                .into());
        }
        let it = self.itype(to);
        let (fw, tw) = (x.get_type().get_bit_width(), it.get_bit_width());
        Ok(if fw == tw {
            x.into()
        } else if fw > tw {
            b.build_int_truncate(x, it, "c").map_err(llvm)?.into()
        } else if unsigned_src {
            b.build_int_z_extend(x, it, "c").map_err(llvm)?.into()
        } else {
            b.build_int_s_extend(x, it, "c").map_err(llvm)?.into()
        })
    }
}

/// The attributes every emitted function needs to run on this machine: the JIT generates code
/// per function attributes, so name this machine's CPU and features, or it falls back to
/// baseline x86-64 (no AVX, no FMA).
fn host_attributes<'c>(ctx: &'c Context, f: FunctionValue<'c>, for_host: bool) {
    if for_host {
        crate::name_host_cpu(ctx, f);
        if wide_vectors(true) {
            // Use the 512-bit registers: the GEMM tile was sized for them, and loop nests run
            // twice the lanes per instruction (gelu 17 -> 9.5 ms, softmax 18 -> 14 ms). The
            // host's tuning may prefer 256-bit vectors and would split them.
            for (key, value) in [
                ("prefer-vector-width", "512"),
                ("min-legal-vector-width", "512"),
            ] {
                f.add_attribute(
                    AttributeLoc::Function,
                    ctx.create_string_attribute(key, value),
                );
            }
        }
    }
}

/// Emits `void name(ptr inputs, ptr out, i64 lo, i64 hi)` computing rows `lo..hi` of the
/// kernel's outermost loop (all of it for a scalar output).
///
/// `alias` is `(pairs, slots)` for a kernel compiled in place: of the `slots` pointers of its
/// table (inputs, then extra outputs), input `q` of each pair `(q, o)` is output `o`'s buffer
/// (0: `out`, then the extra outputs), and the kernel reads it through that output's pointer
/// (one pointer for that memory, so `out` stays `noalias`).
#[allow(clippy::too_many_arguments)]
fn emit_kernel<'c>(
    ctx: &'c Context,
    m: &'c Module<'c>,
    name: &str,
    k: &Kernel,
    for_host: bool,
    alias: Option<&Alias>,
    routines: Routines,
    shared_contraction: bool,
) -> Result<FunctionValue<'c>> {
    let ptr = ctx.ptr_type(AddressSpace::default());
    let i64t = ctx.i64_type();
    let f = kernel_function(ctx, m, name, for_host, shared_contraction);
    let b = ctx.create_builder();
    let entry = ctx.append_basic_block(f, "entry");
    b.position_at_end(entry);
    // A GEMM's variables are its epilogue's (none without one).
    let nvars = k.vars;
    let vars = (0..nvars)
        .map(|_| b.build_alloca(i64t, "var"))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(llvm)?;
    for v in &vars {
        b.build_store(*v, i64t.const_zero()).map_err(llvm)?;
    }
    let inputs = f.get_nth_param(0).expect("declared").into_pointer_value();
    let out = f.get_nth_param(1).expect("declared").into_pointer_value();
    // Only kernels worth splitting across threads take their row range at run time; the
    // others keep constant trip counts, which LLVM optimizes faster and better. A function
    // shared by products of different contraction lengths always takes it: whether a product
    // is split depends on its work, so on its length.
    let Launch { rows, work, .. } = kernel_shape(k, wide_vectors(for_host));
    let (lo, hi) = if shared_contraction || is_parallel(rows, work) {
        (
            f.get_nth_param(2).expect("declared").into_int_value(),
            f.get_nth_param(3).expect("declared").into_int_value(),
        )
    } else {
        (i64t.const_zero(), i64t.const_int(rows as u64, false))
    };
    let mut em = Emitter::new(ctx, m, b, f, inputs, for_host, routines);
    em.vars = vars;
    let mut extents: Vec<Option<usize>> = k.out.shape.iter().map(|&e| Some(e)).collect();
    for body in std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body)) {
        nonpositive_exps(body, &mut extents, &mut em.nonpositive);
    }
    if let Some((pairs, slots)) = alias.filter(|a| !a.0.is_empty()) {
        // Each in-place input's slot holds its output's pointer: `out`, or an extra output's
        // (whose own slot is left as it is).
        let targets: Vec<(usize, PointerValue<'c>)> = pairs
            .iter()
            .map(|&(q, o)| {
                if o == 0 {
                    return Ok((q, out));
                }
                let slot = k.extra[o - 1].slot as i64;
                // SAFETY (of the emitted code): the slot is in the runtime's pointer table.
                let at = unsafe {
                    em.b.build_in_bounds_gep(ptr, inputs, &[em.i64c(slot)], "slot")
                }
                .map_err(llvm)?;
                let p = em.b.build_load(ptr, at, "xo").map_err(llvm)?;
                Ok((q, p.into_pointer_value()))
            })
            .collect::<Result<_>>()?;
        em.swap_pointer_table(*slots, &|i| targets.iter().find(|t| t.0 == i).map(|t| t.1))?;
    }
    match k.schedule {
        Schedule::Nest => {
            // Extra outputs are fresh buffers or arena slots apart from every live input,
            // except one written in place of a donated input (which the kernel reads through
            // it): then no scopes.
            let extra_in_place = alias.is_some_and(|a| a.0.iter().any(|&(_, o)| o > 0));
            if !k.extra.is_empty() && !extra_in_place {
                let md = |s: &str| ctx.metadata_string(s);
                let domain = ctx.metadata_node(&[md(&format!("kiln.{name}.domain")).into()]);
                let scope = |what: &str| {
                    let s = ctx
                        .metadata_node(&[md(&format!("kiln.{name}.{what}")).into(), domain.into()]);
                    ctx.metadata_node(&[s.into()])
                };
                em.scopes.set(Some((scope("inputs"), scope("extra"))));
            }
            emit_nest(&em, k, out, lo, hi)?
        }
        Schedule::Gemm {
            batch,
            m: rows,
            n,
            k: kk,
            ref conv,
            a_trans,
            b_trans,
            epilogue,
            ref chain,
        } => {
            let wide = wide_vectors(for_host);
            let (bl, split_columns) = gemm_blocking(k, wide).expect("a GEMM");
            // In place on a donated X: the epilogue X -/+ P s becomes the GEMM's update mode.
            let in_place = alias.and_then(|a| a.0.first());
            let update = match in_place.and_then(|&(q, _)| crate::fuse::gemm_update(k, q)) {
                Some((scale, subtract)) => Some((em.expr(&scale)?, subtract)),
                None if in_place.is_some() => {
                    return Err(Error::Llvm(format!(
                        "{name}: a GEMM compiled in place needs an update epilogue"
                    )));
                }
                None => None,
            };
            let logits = chain.as_ref().and_then(|c| c.online.as_ref());
            let mut apply = |r: (IntValue<'c>, IntValue<'c>),
                             c: (IntValue<'c>, IntValue<'c>),
                             at: PointerValue<'c>,
                             row0: IntValue<'c>,
                             online: Option<&gemm::OnlineBlock<'c>>| {
                let product = epilogue.expect("only called with an epilogue");
                match (conv, online.zip(logits)) {
                    (_, Some((block, h))) => {
                        emit_online_softmax(&em, k, product, h, at, r, c, block)
                    }
                    (Some(p), _) if p.planes => {
                        emit_plane_epilogue(&em, k, product, at, r, c, rows)
                    }
                    _ => emit_epilogue(&em, k, product, (at, row0), r, c, batch * rows, n),
                }
            };
            let chain = chain.as_ref().map(|c| gemm::Chain {
                bl: chain_blocking(k, c, wide),
                n: c.n as i64,
                b: c.b as i64,
                b_trans: c.b_trans,
                out,
                online: c.online.is_some(),
                // The row variable is the row within its batch when the rows per batch are the
                // position's next-to-last dimension.
                masked: c
                    .masked
                    .filter(|_| k.out.rank() >= 2 && k.out.shape[k.out.rank() - 2] == rows),
            });
            gemm::emit(
                &em,
                k.out.dtype,
                bl,
                (rows as i64, n as i64, kk as i64),
                shared_contraction.then(|| f.get_nth_param(5).expect("declared").into_int_value()),
                (a_trans, b_trans),
                conv.as_ref(),
                out,
                f.get_nth_param(4).expect("declared").into_pointer_value(),
                (lo, hi),
                split_columns,
                epilogue
                    .filter(|_| update.is_none())
                    .map(|_| &mut apply as gemm::Epilogue<'_, 'c>),
                update,
                chain,
            )?;
        }
        Schedule::Scatter {
            ref updates,
            ref target,
            kind,
        } => emit_scatter(&em, k, updates, target, kind, out)?,
        Schedule::SelectScatter {
            ref grid,
            ref window,
            ref strides,
            ref pad_low,
            select,
            kind,
        } => emit_select_scatter(&em, k, grid, window, strides, pad_low, select, kind, out)?,
    }
    em.b.build_return(None).map_err(llvm)?;
    Ok(f)
}

/// A kernel's function `name`, declared: `void (ptr inputs, ptr noalias out, i64 lo, i64 hi,
/// ptr scratch)`, and with `shared_contraction` an `i64` contraction length after them, private
/// to its module and never inlined (it is compiled once for the kernels that call it: see
/// [`contraction_groups`]).
fn kernel_function<'c>(
    ctx: &'c Context,
    m: &'c Module<'c>,
    name: &str,
    for_host: bool,
    shared_contraction: bool,
) -> FunctionValue<'c> {
    let ptr = ctx.ptr_type(AddressSpace::default());
    let i64t = ctx.i64_type();
    let mut params = vec![ptr.into(), ptr.into(), i64t.into(), i64t.into(), ptr.into()];
    if shared_contraction {
        params.push(i64t.into());
    }
    let f = m.add_function(
        name,
        ctx.void_type().fn_type(&params, false),
        shared_contraction.then_some(Linkage::Private),
    );
    let attr = |name: &str| ctx.create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0);
    f.add_attribute(AttributeLoc::Param(1), attr("noalias"));
    if shared_contraction {
        f.add_attribute(AttributeLoc::Function, attr("noinline"));
    }
    host_attributes(ctx, f, for_host);
    f
}

/// Kernel `name` as a call of `shared` (a kernel emitted with `shared_contraction`) with
/// contraction length `k`.
fn emit_contraction_wrapper<'c>(
    ctx: &'c Context,
    m: &'c Module<'c>,
    name: &str,
    shared: FunctionValue<'c>,
    k: usize,
    for_host: bool,
) -> Result<()> {
    let f = kernel_function(ctx, m, name, for_host, false);
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(f, "entry"));
    let mut args: Vec<inkwell::values::BasicMetadataValueEnum<'c>> =
        f.get_param_iter().map(Into::into).collect();
    args.push(ctx.i64_type().const_int(k as u64, false).into());
    b.build_call(shared, &args, "").map_err(llvm)?;
    b.build_return(None).map_err(llvm)?;
    Ok(())
}

/// For each of the kernels `ks` (compiled with in-place outputs `aliases`), the first kernel
/// whose matrix product differs from its own only in the contraction length (`Some(i)` for the
/// first itself), when there is another such kernel: they share one function taking the
/// length as a parameter (an MLP's layers of equal width: `[256, 784] x [784, 1024]` and
/// `[256, 1024] x [1024, 1024]`, both with a bias and a ReLU), and each kernel is a call of
/// it. Convolutions and empty contractions keep their own.
fn contraction_groups(ks: &[Option<Kernel>], aliases: &[Alias]) -> Vec<Option<usize>> {
    let key = |k: &Kernel| -> Option<Kernel> {
        match k.schedule {
            Schedule::Gemm {
                conv: None,
                chain: None,
                k: kk,
                ..
            } if kk > 0 => {
                let mut key = k.clone();
                if let Schedule::Gemm { k: kk, .. } = &mut key.schedule {
                    *kk = 0;
                }
                Some(key)
            }
            _ => None,
        }
    };
    let keys: Vec<Option<Kernel>> = ks.iter().map(|k| k.as_ref().and_then(key)).collect();
    let first = first_equal(&keys, aliases);
    first
        .iter()
        .map(|&f| {
            let f = f?;
            (first.iter().filter(|&&g| g == Some(f)).count() > 1).then_some(f)
        })
        .collect()
}

/// Sets the loop variables of dimensions `dims` of `shape` from `x`, their flat (row-major)
/// index.
fn set_index_vars<'c>(
    em: &Emitter<'c>,
    x: IntValue<'c>,
    shape: &[usize],
    dims: std::ops::Range<usize>,
) -> Result<()> {
    for d in dims.clone() {
        let inner: usize = shape[d + 1..dims.end].iter().product();
        let v = if shape[d] == 1 {
            em.i64c(0)
        } else {
            let q =
                em.b.build_int_signed_div(x, em.i64c(inner as i64), "q")
                    .map_err(llvm)?;
            if d == dims.start {
                q
            } else {
                em.b.build_int_signed_rem(q, em.i64c(shape[d] as i64), "v")
                    .map_err(llvm)?
            }
        };
        em.b.build_store(em.vars[d], v).map_err(llvm)?;
    }
    Ok(())
}

/// Applies a GEMM kernel's epilogue (its body) in place to rows `rows` and columns `cols` of
/// the `[m, n]` product, which the body reads as input `product`: stored at `out` from row
/// `row0` on (0 for the kernel's output; a block's first row for a chained GEMM's block
/// buffer).
#[allow(clippy::too_many_arguments)]
fn emit_epilogue<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    product: usize,
    (out, row0): (PointerValue<'c>, IntValue<'c>),
    rows: (IntValue<'c>, IntValue<'c>),
    cols: (IntValue<'c>, IntValue<'c>),
    m: usize,
    n: usize,
) -> Result<()> {
    let i64t = em.ctx.i64_type();
    // The kernel's inputs with the product (this kernel's output buffer) after them.
    let saved = em.swap_pointer_table(product + 1, &|i| (i == product).then_some(out))?;
    // The elements before `out` (none when it holds the product from row 0).
    let first = match row0.get_zero_extended_constant() {
        Some(0) => None,
        _ => Some(
            em.b.build_int_mul(row0, em.i64c(n as i64), "first")
                .map_err(llvm)?,
        ),
    };
    em.shifted.set(first.map(|f| (product, f)));
    let shape = &k.out.shape;
    let split = crate::fuse::row_split(shape, m, n).ok_or_else(|| {
        Error::Llvm(format!(
            "epilogue over {shape:?} is not a [{m}, {n}] matrix"
        ))
    })?;
    // Dimension d of the output from a row (d < split) or column index.
    let set_vars = |em: &Emitter<'c>, x: IntValue<'c>, dims: std::ops::Range<usize>| {
        set_index_vars(em, x, shape, dims)
    };
    let (s_r, s_c) = (em.entry_alloca(i64t.into())?, em.entry_alloca(i64t.into())?);
    let st = storage(em.ctx, k.out.dtype);
    let ost = strides(shape);
    em.range_loop_ptr(s_r, rows.0, rows.1, 1, &mut |em: &Emitter<'c>| {
        let r =
            em.b.build_load(i64t, s_r, "r")
                .map_err(llvm)?
                .into_int_value();
        set_vars(em, r, 0..split)?;
        // The row's reductions (a softmax's max and sum) before any of its elements is
        // overwritten: the block holds whole rows (crate::fuse::row_epilogue).
        let mark = em.hoist(std::iter::once(&k.body), split, shape)?;
        em.range_loop_ptr(s_c, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
            let c =
                em.b.build_load(i64t, s_c, "c")
                    .map_err(llvm)?
                    .into_int_value();
            set_vars(em, c, split..shape.len())?;
            let v = em.expr(&k.body)?;
            let v = em.store_value(k.out.dtype, v)?;
            // The position from the variables, as the body's loads of the product at their
            // own position compute it: LLVM then sees each element read before it is
            // overwritten at the same address, and vectorizes without run-time overlap checks
            // (which fail here, since the row is read and written in place).
            let idx = em.position(&ost)?;
            let idx = match first {
                Some(f) => em.b.build_int_sub(idx, f, "pi").map_err(llvm)?,
                None => idx,
            };
            // SAFETY (of the emitted code): idx is below m * n, the output's element count,
            // less the elements before `out`.
            let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "po") }.map_err(llvm)?;
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })?;
        em.hoisted.borrow_mut().truncate(mark);
        Ok(())
    })?;
    em.inputs.set(saved);
    em.shifted.set(None);
    Ok(())
}

/// One block of a softmax computed online ([`crate::kernel::Chain::online`]): rows `rows` and
/// columns `cols` of the first product, stored at `p` (the block's first row and column first,
/// rows `block.ld` apart). For each row: its logits `h` (from the product, stored over it) and
/// their maximum; the row's running maximum raised to that; the exponentials from it (stored
/// over the logits, for the chained product) and their sum, added to the running sum rescaled
/// by `exp(old maximum - new maximum)`; and after the row's first block, the chained product's
/// row rescaled by the same. While a row's maximum is -inf (every logit so far masked out) its
/// exponentials are taken from 0, so they are 0 rather than NaN; if no finite logit comes, its
/// sum stays 0 and the division at the end gives NaN, as the softmax does.
#[allow(clippy::too_many_arguments)]
fn emit_online_softmax<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    product: usize,
    logits: &Expr,
    p: PointerValue<'c>,
    rows: (IntValue<'c>, IntValue<'c>),
    cols: (IntValue<'c>, IntValue<'c>),
    block: &gemm::OnlineBlock<'c>,
) -> Result<()> {
    let shape = &k.out.shape;
    let col = shape.len() - 1;
    let n = shape[col];
    let d = k.out.dtype;
    let ft = em.ftype(d);
    let i64t = em.ctx.i64_type();
    let own: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
    // In the block buffer, rows are `ld` apart.
    let blocked: Vec<i64> = own
        .iter()
        .enumerate()
        .map(|(v, &s)| if v == col { s } else { s / n as i64 * block.ld })
        .collect();
    let h = crate::kernel::reindex_input(logits, product, (&own, &blocked), shape).ok_or_else(
        || {
            Error::Llvm(format!(
                "{}: the online softmax's logits read the product off their own position",
                k.out
            ))
        },
    )?;
    let blocked: Vec<usize> = blocked.iter().map(|&s| s as usize).collect();
    let saved = em.swap_pointer_table(product + 1, &|i| (i == product).then_some(p))?;
    let b = &em.b;
    let shift = b
        .build_int_add(
            b.build_int_mul(rows.0, em.i64c(block.ld), "sr")
                .map_err(llvm)?,
            cols.0,
            "shift",
        )
        .map_err(llvm)?;
    em.shifted.set(Some((product, shift)));
    // The block buffer's element at the current position.
    let here = |em: &Emitter<'c>| -> Result<PointerValue<'c>> {
        let idx = em.position(&blocked)?;
        let idx = em.b.build_int_sub(idx, shift, "bi").map_err(llvm)?;
        // SAFETY (of the emitted code): the position lies in the block: its rows and columns.
        unsafe { em.b.build_in_bounds_gep(ft, p, &[idx], "pb") }.map_err(llvm)
    };
    let c = |v: f64| ft.const_float(v);
    let s_r = em.entry_alloca(i64t.into())?;
    let (acc_max, acc_sum) = (em.entry_alloca(ft.into())?, em.entry_alloca(ft.into())?);
    let load_f = |em: &Emitter<'c>, at: PointerValue<'c>| -> Result<FloatValue<'c>> {
        Ok(em
            .b
            .build_load(ft, at, "f")
            .map_err(llvm)?
            .into_float_value())
    };
    em.range_loop_ptr(s_r, rows.0, rows.1, 1, &mut |em: &Emitter<'c>| {
        let r =
            em.b.build_load(i64t, s_r, "r")
                .map_err(llvm)?
                .into_int_value();
        set_index_vars(em, r, shape, 0..col)?;
        em.b.build_store(acc_max, c(f64::NEG_INFINITY))
            .map_err(llvm)?;
        em.range_loop(col, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
            let h = em.expr(&h)?;
            em.b.build_store(here(em)?, h).map_err(llvm)?;
            let m = em.b.build_load(ft, acc_max, "m").map_err(llvm)?;
            let m = em.combine_with(Combiner::Max, d, m, h, false)?;
            em.b.build_store(acc_max, m).map_err(llvm)?;
            Ok(())
        })?;
        let b = &em.b;
        let at = |what: PointerValue<'c>| -> Result<PointerValue<'c>> {
            let i = b.build_int_sub(r, block.base, "rl").map_err(llvm)?;
            // SAFETY (of the emitted code): the row lies in its batch, whose rows the state
            // arrays hold.
            unsafe { b.build_in_bounds_gep(ft, what, &[i], "st") }.map_err(llvm)
        };
        let old_max = b
            .build_select(
                block.first,
                c(f64::NEG_INFINITY),
                load_f(em, at(block.max)?)?,
                "m0",
            )
            .map_err(llvm)?;
        let m = load_f(em, acc_max)?;
        let new_max = em
            .combine_with(Combiner::Max, d, old_max, m.into(), false)?
            .into_float_value();
        let masked = b
            .build_float_compare(FloatPredicate::OEQ, new_max, c(f64::NEG_INFINITY), "none")
            .map_err(llvm)?;
        let from = b
            .build_select(masked, c(0.0), new_max, "from")
            .map_err(llvm)?
            .into_float_value();
        let d_old = b
            .build_float_sub(old_max.into_float_value(), from, "dm")
            .map_err(llvm)?;
        let scale = em.exp_nonpositive(d, d_old)?;
        b.build_store(acc_sum, c(0.0)).map_err(llvm)?;
        em.range_loop(col, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
            let at = here(em)?;
            let x = load_f(em, at)?;
            let x = em.b.build_float_sub(x, from, "hd").map_err(llvm)?;
            let e = em.exp_nonpositive(d, x)?;
            em.b.build_store(at, e).map_err(llvm)?;
            let s = em.b.build_load(ft, acc_sum, "s").map_err(llvm)?;
            let s = em.combine_with(Combiner::Add, d, s, e.into(), true)?;
            em.b.build_store(acc_sum, s).map_err(llvm)?;
            Ok(())
        })?;
        let b = &em.b;
        let old_sum = b
            .build_select(block.first, c(0.0), load_f(em, at(block.sum)?)?, "s0")
            .map_err(llvm)?
            .into_float_value();
        let kept = b.build_float_mul(old_sum, scale, "sk").map_err(llvm)?;
        let new_sum = b
            .build_float_add(kept, load_f(em, acc_sum)?, "s1")
            .map_err(llvm)?;
        b.build_store(at(block.max)?, new_max).map_err(llvm)?;
        b.build_store(at(block.sum)?, new_sum).map_err(llvm)?;
        // The chained product's row, from the earlier blocks, rescaled to the new maximum.
        let not_first = b.build_not(block.first, "nf").map_err(llvm)?;
        let then = em.ctx.append_basic_block(em.f, "rescale");
        let join = em.ctx.append_basic_block(em.f, "rescaled");
        b.build_conditional_branch(not_first, then, join)
            .map_err(llvm)?;
        b.position_at_end(then);
        gemm::map_row(em, ft, (block.out, block.n2), r, &|em, v| {
            em.b.build_float_mul(v, scale, "os").map_err(llvm)
        })?;
        em.b.build_unconditional_branch(join).map_err(llvm)?;
        em.b.position_at_end(join);
        Ok(())
    })?;
    em.inputs.set(saved);
    em.shifted.set(None);
    Ok(())
}

/// Applies the epilogue of a convolution's GEMM kernel whose `[N, O, OH, OW]` output is stored
/// by planes (see [`crate::kernel::ConvPatches::planes`]) in place to the product's rows `rows`
/// (pixels of one image, `per` to an image) and columns `cols` (output features), at `out`:
/// for each feature, a loop over the block's output rows and one along each row, so that the
/// innermost loop runs over consecutive elements.
fn emit_plane_epilogue<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    product: usize,
    out: PointerValue<'c>,
    rows: (IntValue<'c>, IntValue<'c>),
    cols: (IntValue<'c>, IntValue<'c>),
    per: usize,
) -> Result<()> {
    let shape = &k.out.shape;
    if shape.len() != 4 || shape[2] * shape[3] != per {
        return Err(Error::Llvm(format!(
            "an epilogue stored by planes over {shape:?} is not [N, O, OH, OW] with {per} pixels \
             per image"
        )));
    }
    let i64t = em.ctx.i64_type();
    let b = &em.b;
    let saved = em.swap_pointer_table(product + 1, &|i| (i == product).then_some(out))?;
    let ow = em.i64c(shape[3] as i64);
    let load = |slot: PointerValue<'c>| -> Result<IntValue<'c>> {
        Ok(b.build_load(i64t, slot, "v")
            .map_err(llvm)?
            .into_int_value())
    };
    // The block's image, and its pixels within it.
    let image = b
        .build_int_signed_div(rows.0, em.i64c(per as i64), "img")
        .map_err(llvm)?;
    let first = b
        .build_int_mul(image, em.i64c(per as i64), "p0")
        .map_err(llvm)?;
    let p0 = b.build_int_sub(rows.0, first, "p0").map_err(llvm)?;
    let p1 = b.build_int_sub(rows.1, first, "p1").map_err(llvm)?;
    b.build_store(em.vars[0], image).map_err(llvm)?;
    let y0 = b.build_int_signed_div(p0, ow, "y0").map_err(llvm)?;
    let y1 = b
        .build_int_signed_div(
            b.build_int_add(p1, em.i64c(shape[3] as i64 - 1), "p1r")
                .map_err(llvm)?,
            ow,
            "y1",
        )
        .map_err(llvm)?;
    let st = storage(em.ctx, k.out.dtype);
    let ost = strides(shape);
    em.range_loop(1, cols.0, cols.1, 1, &mut |em: &Emitter<'c>| {
        em.range_loop(2, y0, y1, 1, &mut |em: &Emitter<'c>| {
            let b = &em.b;
            let row = b
                .build_int_mul(load(em.vars[2])?, ow, "row")
                .map_err(llvm)?;
            // The row's pixels inside the block.
            let lo = b.build_int_sub(p0, row, "lo").map_err(llvm)?;
            let hi = b.build_int_sub(p1, row, "hi").map_err(llvm)?;
            let lo = em
                .intrinsic("llvm.smax", i64t.into(), &[lo.into(), em.i64c(0).into()])?
                .into_int_value();
            let hi = em
                .intrinsic("llvm.smin", i64t.into(), &[hi.into(), ow.into()])?
                .into_int_value();
            em.range_loop(3, lo, hi, 1, &mut |em: &Emitter<'c>| {
                let v = em.expr(&k.body)?;
                let v = em.store_value(k.out.dtype, v)?;
                // As in `emit_epilogue`: the position from the variables, as the body's load
                // of the product computes it.
                let idx = em.position(&ost)?;
                // SAFETY (of the emitted code): the variables index the output's shape.
                let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "po") }.map_err(llvm)?;
                em.b.build_store(p, v).map_err(llvm)?;
                Ok(())
            })
        })
    })?;
    em.inputs.set(saved);
    Ok(())
}

fn emit_scatter<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    updates: &[usize],
    target: &[Idx],
    kind: Combiner,
    out: PointerValue<'c>,
) -> Result<()> {
    let ctx = em.ctx;
    let d = k.out.dtype;
    let st = storage(ctx, d);
    let ptr = ctx.ptr_type(AddressSpace::default());
    // out = operand.
    // SAFETY (of the emitted code): input 0 is the operand, of the output's type.
    let slot = unsafe {
        em.b.build_in_bounds_gep(ptr, em.inputs.get(), &[em.i64c(0)], "slot")
    }
    .map_err(llvm)?;
    let src =
        em.b.build_load(ptr, slot, "src")
            .map_err(llvm)?
            .into_pointer_value();
    let bytes = (k.out.numel() * d.bytes()) as i64;
    if bytes > 0 {
        em.b.build_memcpy(out, 1, src, 1, em.i64c(bytes))
            .map_err(llvm)?;
    }
    let ost = strides(&k.out.shape);
    let vars: Vec<(usize, usize)> = updates.iter().copied().enumerate().collect();
    em.nest(&vars, &mut |em: &Emitter<'c>| {
        let mut ok = ctx.bool_type().const_int(1, false);
        let mut flat = em.i64c(0);
        for (dim, t) in target.iter().enumerate() {
            let v = em.idx(t)?;
            let inside = em.cond(&Cond::InRange(t.clone(), 0, k.out.shape[dim] as i64))?;
            ok = em.b.build_and(ok, inside, "ok").map_err(llvm)?;
            let term =
                em.b.build_int_mul(v, em.i64c(ost[dim] as i64), "t")
                    .map_err(llvm)?;
            flat = em.b.build_int_add(flat, term, "f").map_err(llvm)?;
        }
        let write = ctx.append_basic_block(em.f, "write");
        let done = ctx.append_basic_block(em.f, "done");
        em.b.build_conditional_branch(ok, write, done)
            .map_err(llvm)?;
        em.b.position_at_end(write);
        let upd = em.expr(&k.body)?;
        // SAFETY (of the emitted code): the target was checked to be inside the output.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[flat], "pt") }.map_err(llvm)?;
        let new = if kind == Combiner::Replace {
            upd
        } else {
            let raw = em.b.build_load(st, p, "old").map_err(llvm)?;
            let old = em.load_value(d, raw)?;
            em.combine(kind, d, old, upd)?
        };
        let v = em.store_value(d, new)?;
        em.b.build_store(p, v).map_err(llvm)?;
        em.b.build_unconditional_branch(done).map_err(llvm)?;
        em.b.position_at_end(done);
        Ok(())
    })
}

/// See [`Schedule::SelectScatter`]. Input 0 is the operand, 1 the source, 2 the init value.
#[allow(clippy::too_many_arguments)]
fn emit_select_scatter<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    grid: &[usize],
    window: &[usize],
    strides: &[i64],
    pad_low: &[i64],
    select: Cmp,
    kind: Combiner,
    out: PointerValue<'c>,
) -> Result<()> {
    let ctx = em.ctx;
    let d = k.out.dtype;
    let st = storage(ctx, d);
    let r = k.out.rank();
    let rt: BasicTypeEnum = if d.is_float() {
        em.ftype(d).into()
    } else {
        em.itype(d).into()
    };
    // out = init.
    let init = em.load(2, d, &vec![0; k.vars], 0)?;
    let init_raw = em.store_value(d, init)?;
    let n = k.out.numel() as i64;
    let flat = em.entry_alloca(ctx.i64_type().into())?;
    em.range_loop_ptr(flat, em.i64c(0), em.i64c(n), 1, &mut |em: &Emitter<'c>| {
        let i =
            em.b.build_load(ctx.i64_type(), flat, "i")
                .map_err(llvm)?
                .into_int_value();
        // SAFETY (of the emitted code): i < the output's element count.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[i], "po") }.map_err(llvm)?;
        em.b.build_store(p, init_raw).map_err(llvm)?;
        Ok(())
    })?;
    let best_v = em.entry_alloca(rt)?;
    let best_i = em.entry_alloca(ctx.i64_type().into())?;
    let have = em.entry_alloca(ctx.bool_type().into())?;
    let ost = strides_of(&k.out.shape);
    let grid_vars: Vec<(usize, usize)> = grid.iter().copied().enumerate().collect();
    let win_vars: Vec<(usize, usize)> = window
        .iter()
        .enumerate()
        .map(|(i, &w)| (r + i, w))
        .collect();
    em.nest(&grid_vars, &mut |em: &Emitter<'c>| {
        em.b.build_store(have, ctx.bool_type().const_zero())
            .map_err(llvm)?;
        em.nest(&win_vars, &mut |em: &Emitter<'c>| {
            let mut ok = ctx.bool_type().const_int(1, false);
            let mut pos = em.i64c(0);
            for dim in 0..r {
                let p = Idx::Add(vec![
                    Idx::Mul(Box::new(Idx::Var(dim)), strides[dim]),
                    Idx::Const(-pad_low[dim]),
                    Idx::Var(r + dim),
                ]);
                ok =
                    em.b.build_and(
                        ok,
                        em.cond(&Cond::InRange(p.clone(), 0, k.out.shape[dim] as i64))?,
                        "ok",
                    )
                    .map_err(llvm)?;
                let term =
                    em.b.build_int_mul(em.idx(&p)?, em.i64c(ost[dim]), "t")
                        .map_err(llvm)?;
                pos = em.b.build_int_add(pos, term, "pos").map_err(llvm)?;
            }
            let visit = ctx.append_basic_block(em.f, "visit");
            let next = ctx.append_basic_block(em.f, "next");
            em.b.build_conditional_branch(ok, visit, next)
                .map_err(llvm)?;
            em.b.position_at_end(visit);
            let cand = em.load_at(0, d, pos)?;
            let cur = em.b.build_load(rt, best_v, "cur").map_err(llvm)?;
            let keep = em
                .op(&Ew::Cmp(select), d, DType::Pred, &[cur, cand])?
                .into_int_value();
            let had =
                em.b.build_load(ctx.bool_type(), have, "had")
                    .map_err(llvm)?
                    .into_int_value();
            let keep = em.b.build_and(keep, had, "keep").map_err(llvm)?;
            let v = em.b.build_select(keep, cur, cand, "v").map_err(llvm)?;
            let prev =
                em.b.build_load(ctx.i64_type(), best_i, "pi")
                    .map_err(llvm)?;
            let idx =
                em.b.build_select(keep, prev, pos.into(), "bi")
                    .map_err(llvm)?;
            em.b.build_store(best_v, v).map_err(llvm)?;
            em.b.build_store(best_i, idx).map_err(llvm)?;
            em.b.build_store(have, ctx.bool_type().const_int(1, false))
                .map_err(llvm)?;
            em.b.build_unconditional_branch(next).map_err(llvm)?;
            em.b.position_at_end(next);
            Ok(())
        })?;
        let found =
            em.b.build_load(ctx.bool_type(), have, "found")
                .map_err(llvm)?
                .into_int_value();
        let write = ctx.append_basic_block(em.f, "write");
        let done = ctx.append_basic_block(em.f, "done");
        em.b.build_conditional_branch(found, write, done)
            .map_err(llvm)?;
        em.b.position_at_end(write);
        let src = em.expr(&k.body)?;
        let at =
            em.b.build_load(ctx.i64_type(), best_i, "at")
                .map_err(llvm)?
                .into_int_value();
        // SAFETY (of the emitted code): the selected position is inside the output.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[at], "pt") }.map_err(llvm)?;
        let raw = em.b.build_load(st, p, "old").map_err(llvm)?;
        let old = em.load_value(d, raw)?;
        let new = em.combine(kind, d, old, src)?;
        em.b.build_store(p, em.store_value(d, new)?).map_err(llvm)?;
        em.b.build_unconditional_branch(done).map_err(llvm)?;
        em.b.position_at_end(done);
        Ok(())
    })
}

fn strides_of(shape: &[usize]) -> Vec<i64> {
    strides(shape).iter().map(|&s| s as i64).collect()
}

fn emit_nest<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    out: PointerValue<'c>,
    lo: IntValue<'c>,
    hi: IntValue<'c>,
) -> Result<()> {
    // Each loop variable stays within its dimension (a thread's rows too), which decides the
    // guards of dimensions without padding (see `Emitter::known`); loops cut at guards know
    // narrower ranges.
    let mark = em.facts.borrow().len();
    em.facts.borrow_mut().extend(
        k.out
            .shape
            .iter()
            .enumerate()
            .map(|(v, &n)| (v, 0, n as i64)),
    );
    let r = emit_nest_loops(em, k, out, lo, hi);
    em.facts.borrow_mut().truncate(mark);
    r
}

/// [`emit_nest`]'s loops.
fn emit_nest_loops<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    out: PointerValue<'c>,
    lo: IntValue<'c>,
    hi: IntValue<'c>,
) -> Result<()> {
    let ost = strides(&k.out.shape);
    let ptr = em.ctx.ptr_type(AddressSpace::default());
    let mut store = |em: &Emitter<'c>| -> Result<()> {
        // Every output's value first, then the stores: the values' loads and arithmetic are
        // then one straight-line block (no store between them), which LLVM shares between the
        // outputs of a multi-output kernel.
        let mut values = vec![(k.out.dtype, out, em.expr(&k.body)?)];
        for x in &k.extra {
            // SAFETY (of the emitted code): the slot is in the pointer table (Program::new's
            // contract: extra outputs follow the inputs).
            let slot = unsafe {
                em.b.build_in_bounds_gep(ptr, em.inputs.get(), &[em.i64c(x.slot as i64)], "slot")
            }
            .map_err(llvm)?;
            let base = em.b.build_load(ptr, slot, "xo").map_err(llvm)?;
            em.scope_input(base)?;
            values.push((x.out.dtype, base.into_pointer_value(), em.expr(&x.body)?));
        }
        let idx = em.position(&ost)?;
        for (n, (dtype, base, v)) in values.into_iter().enumerate() {
            let v = em.store_value(dtype, v)?;
            let st = storage(em.ctx, dtype);
            // SAFETY (of the emitted code): idx is below the output's element count, which
            // every output of the kernel shares.
            let p = unsafe { em.b.build_in_bounds_gep(st, base, &[idx], "po") }.map_err(llvm)?;
            let s = em.b.build_store(p, v).map_err(llvm)?;
            if n > 0 {
                em.scope(Some(s), true)?;
            }
        }
        Ok(())
    };
    if let Some(a) = transpose_tile_dim(k) {
        return emit_tiled(em, k, a, (lo, hi), out, &mut store);
    }
    let stream = streams(k).then_some(out);
    // Loop d runs inside loop d - 1. Before it, every reduction that reads only the variables
    // of the enclosing loops is computed once and reused (a row's max and sum ahead of the
    // loop over its columns, which makes softmax one kernel).
    fn level<'c>(
        em: &Emitter<'c>,
        k: &Kernel,
        d: usize,
        lohi: (IntValue<'c>, IntValue<'c>),
        stream: Option<PointerValue<'c>>,
        store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
    ) -> Result<()> {
        let bodies: Vec<&Expr> = std::iter::once(&k.body)
            .chain(k.extra.iter().map(|x| &x.body))
            .collect();
        let mark = em.hoist(bodies.iter().copied(), d, &k.out.shape)?;
        let rank = k.out.rank();
        let (from, to) = if d == 0 {
            lohi
        } else {
            (
                em.i64c(0),
                em.i64c(k.out.shape.get(d).copied().unwrap_or(1) as i64),
            )
        };
        let columns = if d + 1 == rank {
            column_reduces(em, k, d)
        } else {
            Vec::new()
        };
        if !columns.is_empty() {
            strips(em, d, (from, to), &columns, store)?;
        } else if d == rank {
            store(em)?;
        } else if let Some(out) = stream.filter(|_| d + 1 == rank) {
            // (A one-dimensional kernel's range is a thread's rows.)
            let segments = guard_segments(&bodies, d, k.out.shape[d]);
            for &(s, e) in &segments {
                let range = if segments.len() == 1 {
                    (from, to)
                } else {
                    let lo = em.int_max(from, em.i64c(s))?;
                    // An empty range where the thread's rows miss the segment.
                    (lo, em.int_max(lo, em.int_min(to, em.i64c(e))?)?)
                };
                em.facts.borrow_mut().push((d, s, e));
                let r = emit_streaming(em, k, d, range, out, store);
                em.facts.borrow_mut().pop();
                r?;
            }
        } else if d == 0 {
            // A thread's rows, in the segments where the guards on them are decided.
            let segments = guard_segments_up_to(&bodies, 0, k.out.shape[0], MAX_ROW_GUARD_CUTS);
            for &(s, e) in &segments {
                let (from, to) = if segments.len() == 1 {
                    lohi
                } else {
                    (
                        em.int_max(lohi.0, em.i64c(s))?,
                        em.int_min(lohi.1, em.i64c(e))?,
                    )
                };
                em.facts.borrow_mut().push((0, s, e));
                let r = em.range_loop(0, from, to, 1, &mut |em: &Emitter<'c>| {
                    level(em, k, 1, lohi, stream, store)
                });
                em.facts.borrow_mut().pop();
                r?;
            }
        } else {
            let segments = guard_segments(&bodies, d, k.out.shape[d]);
            em.segmented(d, &segments, &mut |em: &Emitter<'c>| {
                level(em, k, d + 1, lohi, stream, store)
            })?;
        }
        em.hoisted.borrow_mut().truncate(mark);
        Ok(())
    }
    level(em, k, 0, (lo, hi), stream, &mut store)?;
    if stream.is_some() {
        // Streaming stores are weakly ordered: drain them before the kernel returns, so the
        // thread that reads the output next (after joining this one) sees them.
        let sfence = em.m.get_function("llvm.x86.sse.sfence").unwrap_or_else(|| {
            em.m.add_function(
                "llvm.x86.sse.sfence",
                em.ctx.void_type().fn_type(&[], false),
                None,
            )
        });
        em.b.build_call(sfence, &[], "").map_err(llvm)?;
    }
    Ok(())
}

/// Outputs at least this large are written with streaming (non-temporal) stores: they do not
/// fit the last-level cache together with their inputs (48 MiB on this machine's CPU), so
/// each line written would otherwise first be read from memory (write-allocate), a third more
/// traffic for an elementwise kernel, and would evict the inputs still to be read.
const STREAM_BYTES: usize = 32 << 20;

/// Whether streaming stores are on: unless `KILN_STREAM=0`.
fn streaming() -> bool {
    !std::env::var("KILN_STREAM").is_ok_and(|v| v == "0")
}

/// Whether loop-nest kernel `k` writes its output with streaming stores (see
/// [`STREAM_BYTES`]): one output, large, on x86-64, whose innermost dimension holds at least
/// [`STREAM_ROW_LINES`] 64-byte lines. `KILN_STREAM=0` in the environment turns them off (for
/// measuring).
fn streams(k: &Kernel) -> bool {
    let bytes = k.out.dtype.bytes();
    cfg!(target_arch = "x86_64")
        && streaming()
        && k.extra.is_empty()
        && k.out.numel() * bytes >= STREAM_BYTES
        && k.out
            .shape
            .last()
            .is_some_and(|&n| n * bytes >= STREAM_ROW_LINES * LINE)
}

/// A cache line, and the width of one streaming store.
const LINE: usize = 64;

/// The fewest cache lines an output row must span for streaming stores: shorter rows spend
/// more on each row's unaligned head and tail, stored one by one, than the stores save (a pad
/// of `[64, 56, 56, 64]` to `[64, 58, 58, 64]`, rows of 4 lines: 93 ms with them, 19 without).
const STREAM_ROW_LINES: usize = 16;

/// The innermost loop of a streaming kernel (see [`streams`]): positions `from..to` of
/// innermost dimension `d` (the other variables set). Positions up to the first 64-byte
/// boundary of the output are stored one by one; then each line's values go through a stack
/// buffer (the loop that fills it vectorizes) and are stored as one aligned non-temporal
/// vector; the positions after the last whole line, one by one again.
fn emit_streaming<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    d: usize,
    (from, to): (IntValue<'c>, IntValue<'c>),
    out: PointerValue<'c>,
    store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
) -> Result<()> {
    let i64t = em.ctx.i64_type();
    let bytes = k.out.dtype.bytes();
    let lanes = (LINE / bytes) as i64;
    let st = storage(em.ctx, k.out.dtype);
    let ost = strides(&k.out.shape);
    let int = |v: BasicValueEnum<'c>| v.into_int_value();
    // Elements from `from` to the next line boundary (the output is aligned to its element).
    em.b.build_store(em.vars[d], from).map_err(llvm)?;
    let idx = em.position(&ost)?;
    // SAFETY (of the emitted code): only the address is used.
    let p0 = unsafe { em.b.build_gep(st, out, &[idx], "p0") }.map_err(llvm)?;
    let addr = em.b.build_ptr_to_int(p0, i64t, "a0").map_err(llvm)?;
    let line = em.i64c(LINE as i64 - 1);
    let past = em.b.build_and(addr, line, "past").map_err(llvm)?;
    let to_line =
        em.b.build_and(
            em.b.build_int_sub(em.i64c(LINE as i64), past, "tl")
                .map_err(llvm)?,
            line,
            "tl",
        )
        .map_err(llvm)?;
    let peel =
        em.b.build_int_unsigned_div(to_line, em.i64c(bytes as i64), "peel")
            .map_err(llvm)?;
    let n = em.b.build_int_sub(to, from, "n").map_err(llvm)?;
    let peel = em.int_min(peel, n)?;
    let mid = em.b.build_int_add(from, peel, "mid").map_err(llvm)?;
    let whole =
        em.b.build_int_signed_div(
            em.b.build_int_sub(to, mid, "rest").map_err(llvm)?,
            em.i64c(lanes),
            "lines",
        )
        .map_err(llvm)?;
    let end =
        em.b.build_int_add(
            mid,
            em.b.build_int_mul(whole, em.i64c(lanes), "span")
                .map_err(llvm)?,
            "end",
        )
        .map_err(llvm)?;
    // Loads of one position (scalars broadcast over the output) ahead of the loops: LLVM
    // hoists them out of a plain loop, but not out of this loop of vectorized lines.
    let mark = em.hoisted.borrow().len();
    for l in invariant_loads(&k.body) {
        em.hoist_one(l)?;
    }
    em.range_loop(d, from, mid, 1, store)?;
    let buf = em.line_buffer(st, lanes as usize)?;
    let (slot, lane) = (em.entry_alloca(i64t.into())?, em.entry_alloca(i64t.into())?);
    let vt = vector_of(st, lanes as usize)?;
    let nontemporal = em.ctx.get_kind_id("nontemporal");
    let one = em
        .ctx
        .metadata_node(&[em.ctx.i32_type().const_int(1, false).into()]);
    em.range_loop_ptr(slot, mid, end, lanes, &mut |em: &Emitter<'c>| {
        let c = int(em.b.build_load(i64t, slot, "c").map_err(llvm)?);
        // A constant trip count (not c..c + lanes), so LLVM turns the loop into vectors.
        em.range_loop_ptr(lane, em.i64c(0), em.i64c(lanes), 1, &mut |em: &Emitter<
            'c,
        >| {
            let at = int(em.b.build_load(i64t, lane, "j").map_err(llvm)?);
            let x = em.b.build_int_nsw_add(c, at, "x").map_err(llvm)?;
            em.b.build_store(em.vars[d], x).map_err(llvm)?;
            let v = em.expr(&k.body)?;
            let v = em.store_value(k.out.dtype, v)?;
            // SAFETY (of the emitted code): `at` is below the buffer's length.
            let p = unsafe { em.b.build_in_bounds_gep(st, buf, &[at], "bp") }.map_err(llvm)?;
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })?;
        let l = em.b.build_load(vt, buf, "line").map_err(llvm)?;
        l.as_instruction_value()
            .ok_or_else(|| Error::Llvm("a load is an instruction".into()))?
            .set_alignment(LINE as u32)
            .map_err(llvm)?;
        em.b.build_store(em.vars[d], c).map_err(llvm)?;
        let idx = em.position(&ost)?;
        // SAFETY (of the emitted code): positions c..c + lanes are in the output, and the
        // address is on a line boundary (c is `mid` plus whole lines).
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "po") }.map_err(llvm)?;
        let s = em.b.build_store(p, l).map_err(llvm)?;
        s.set_alignment(LINE as u32).map_err(llvm)?;
        s.set_metadata(one, nontemporal).map_err(llvm)?;
        Ok(())
    })?;
    em.range_loop(d, end, to, 1, store)?;
    em.hoisted.borrow_mut().truncate(mark);
    Ok(())
}

/// Collects into `out` the keys of the exponentials in `e` whose argument is `a - m`, `m` a
/// maximum over one variable `v` of an expression that is `a` with `v` in place of one of
/// `a`'s variables, `w`, whose range (`extents[w]`, where known) lies inside `v`'s: `m` is then
/// at least `a` (a softmax's `exp(x - max(x))`), so the argument is at most 0 or NaN, and
/// [`Emitter::exp_nonpositive`] computes it with the same bits as [`Emitter::exp_fast`] in
/// fewer operations. `extents` holds the enclosing loops' trip counts by variable.
fn nonpositive_exps(
    e: &Expr,
    extents: &mut Vec<Option<usize>>,
    out: &mut std::collections::HashSet<String>,
) {
    match e {
        Expr::Op {
            op: Ew::Kind(OpKind::Exponential),
            args,
            ..
        } if max_difference(&args[0], extents) => {
            out.insert(value_key(e));
            nonpositive_exps(&args[0], extents, out);
        }
        Expr::Op { args, .. } => args.iter().for_each(|a| nonpositive_exps(a, extents, out)),
        Expr::Reduce {
            init, vars, body, ..
        } => {
            nonpositive_exps(init, extents, out);
            let saved = extents.clone();
            for &(v, n) in vars {
                if extents.len() <= v {
                    extents.resize(v + 1, None);
                }
                extents[v] = Some(n);
            }
            nonpositive_exps(body, extents, out);
            *extents = saved;
        }
        Expr::Guard {
            then, otherwise, ..
        } => {
            nonpositive_exps(then, extents, out);
            nonpositive_exps(otherwise, extents, out);
        }
        _ => {}
    }
}

/// Whether `e` is `a - m` with `m` a maximum of `a` over a range holding `a`'s position (see
/// [`nonpositive_exps`]), through round trips of bit casts (a stop-gradient's).
fn max_difference(e: &Expr, extents: &[Option<usize>]) -> bool {
    let Some((a, m)) = crate::kernel::minus_max(e) else {
        return false;
    };
    let Expr::Reduce { vars, body, .. } = m else {
        return false;
    };
    let [(v, n)] = vars[..] else {
        return false;
    };
    let (fa, fm) = (free_vars(a), free_vars(m));
    fa.difference(&fm).any(|&w| {
        extents
            .get(w)
            .copied()
            .flatten()
            .is_some_and(|ext| ext <= n)
            && crate::kernel::rename_var(body, v, w) == *a
    })
}

/// The loads in `e` that read one position whatever the loop variables.
fn invariant_loads(e: &Expr) -> Vec<&Expr> {
    fn walk<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
        match e {
            Expr::Load { coef, .. } if coef.iter().all(|&c| c == 0) => out.push(e),
            Expr::Op { args, .. } => args.iter().for_each(|a| walk(a, out)),
            Expr::Reduce { init, body, .. } => {
                walk(init, out);
                walk(body, out);
            }
            // Not under guards: what they guard may be out of range.
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(e, &mut out);
    out
}

/// Edge of the square tiles a transposing kernel runs in (a cache line of f32).
const TILE: usize = 16;

/// For a loop-nest kernel without reductions that reads an input with a stride of at least a
/// tile along its innermost output dimension and contiguously along another output dimension
/// (a transpose, NHWC to NCHW and back): that dimension. Run in order, the innermost loop
/// touches a new cache line of the input for every element it writes, and the lines are gone
/// by the time the next row comes back for their neighbours (96 ms for conv 7x7's 103 MB
/// output transpose); in [`TILE`] x [`TILE`] tiles of the two dimensions, each line read and
/// written is used whole while in L1.
fn transpose_tile_dim(k: &Kernel) -> Option<usize> {
    let rank = k.out.rank();
    if rank < 2 || k.out.shape[rank - 1] < TILE {
        return None;
    }
    let bodies: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .collect();
    if bodies.iter().any(|b| !hoistable_reduces(b).is_empty()) {
        return None;
    }
    let reads: Vec<Vec<i64>> = bodies
        .iter()
        .flat_map(|b| crate::kernel::affine_reads(b))
        .collect();
    let inner = rank - 1;
    (0..inner).filter(|&a| k.out.shape[a] >= TILE).find(|&a| {
        reads
            .iter()
            .any(|c| c.get(inner).map_or(0, |x| x.abs()) >= TILE as i64 && c.get(a) == Some(&1))
    })
}

/// Emits loop-nest kernel `k` (no reductions) with its output dimension `a` and its innermost
/// one in [`TILE`] x [`TILE`] tiles, inside loops over the other dimensions in order (see
/// [`transpose_tile_dim`]); `lohi` is this call's range of dimension 0.
fn emit_tiled<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    a: usize,
    lohi: (IntValue<'c>, IntValue<'c>),
    out: PointerValue<'c>,
    store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
) -> Result<()> {
    let rank = k.out.rank();
    let inner = rank - 1;
    let range = |d: usize| -> (IntValue<'c>, IntValue<'c>) {
        if d == 0 {
            lohi
        } else {
            (em.i64c(0), em.i64c(k.out.shape[d] as i64))
        }
    };
    let i64t = em.ctx.i64_type();
    let (s_a, s_b) = (em.entry_alloca(i64t.into())?, em.entry_alloca(i64t.into())?);
    // Whole tiles go through a stack tile and in-register transposes when the kernel writes
    // one output of 4-byte elements.
    let whole_tiles =
        k.extra.is_empty() && matches!(k.out.dtype, DType::F32 | DType::I32 | DType::U32);
    // The tile a loop counter in `slot` is at: its start, and its end (at most `hi`).
    let tile = |em: &Emitter<'c>,
                slot: PointerValue<'c>,
                hi: IntValue<'c>|
     -> Result<(IntValue<'c>, IntValue<'c>)> {
        let x0 =
            em.b.build_load(i64t, slot, "t0")
                .map_err(llvm)?
                .into_int_value();
        let x1 =
            em.b.build_int_add(x0, em.i64c(TILE as i64), "t1")
                .map_err(llvm)?;
        Ok((x0, em.int_min(x1, hi)?))
    };
    let bodies: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .collect();
    // Dimension `a` in segments where the guards on it are decided (see `guard_segments`):
    // the tiles inside a pad's interior then need no check per element.
    // (from, to, the fact that the variable lies in from..to, when both are constants)
    type Segment<'c> = (IntValue<'c>, IntValue<'c>, Option<(i64, i64)>);
    let a_segments: Vec<Segment<'c>> = if a == 0 {
        vec![(range(0).0, range(0).1, None)]
    } else {
        guard_segments(&bodies, a, k.out.shape[a])
            .into_iter()
            .map(|(s, e)| (em.i64c(s), em.i64c(e), Some((s, e))))
            .collect()
    };
    let mut a_tiles = |em: &Emitter<'c>, a_lo: IntValue<'c>, a_hi: IntValue<'c>| -> Result<()> {
        // A stack tile for each copy of the loops (one per segment): with one for all, its
        // many uses exceeded what LLVM's capture tracking follows, and LLVM then guarded the
        // tile's fill against overlapping the input and vectorized it into gathers.
        let buf = if whole_tiles {
            Some(em.line_buffer(storage(em.ctx, k.out.dtype), TILE * TILE)?)
        } else {
            None
        };
        let (b_lo, b_hi) = range(inner);
        em.range_loop_ptr(s_a, a_lo, a_hi, TILE as i64, &mut |em: &Emitter<'c>| {
            let (a0, a1) = tile(em, s_a, a_hi)?;
            em.range_loop_ptr(s_b, b_lo, b_hi, TILE as i64, &mut |em: &Emitter<'c>| {
                let (b0, b1) = tile(em, s_b, b_hi)?;
                // Along `a` innermost: the reads are contiguous there, so that loop vectorizes
                // (measured against the other order: conv 7x7's output transpose 46 -> 29 ms,
                // conv 3x3's transposing pad 30 -> 22 ms, its output transpose 12 -> 15 ms).
                let mut elementwise = |em: &Emitter<'c>| -> Result<()> {
                    em.range_loop(inner, b0, b1, 1, &mut |em: &Emitter<'c>| {
                        em.range_loop(a, a0, a1, 1, &mut |em: &Emitter<'c>| store(em))
                    })
                };
                let Some(buf) = buf else {
                    return elementwise(em);
                };
                // A whole tile: its values into the stack tile (rows along `a`, contiguous
                // reads and writes), then 16 vectors transposed in registers and stored along
                // the innermost dimension.
                let full_a =
                    em.b.build_int_compare(
                        IntPredicate::EQ,
                        a1,
                        em.b.build_int_add(a0, em.i64c(TILE as i64), "af")
                            .map_err(llvm)?,
                        "fa",
                    )
                    .map_err(llvm)?;
                let full_b =
                    em.b.build_int_compare(
                        IntPredicate::EQ,
                        b1,
                        em.b.build_int_add(b0, em.i64c(TILE as i64), "bf")
                            .map_err(llvm)?,
                        "fb",
                    )
                    .map_err(llvm)?;
                let full = em.b.build_and(full_a, full_b, "full").map_err(llvm)?;
                let (t, e, j) = (
                    em.ctx.append_basic_block(em.f, "tile"),
                    em.ctx.append_basic_block(em.f, "edge"),
                    em.ctx.append_basic_block(em.f, "tiled"),
                );
                em.b.build_conditional_branch(full, t, e).map_err(llvm)?;
                em.b.position_at_end(t);
                whole_tile(em, k, a, (a0, b0), buf, out)?;
                em.b.build_unconditional_branch(j).map_err(llvm)?;
                em.b.position_at_end(e);
                elementwise(em)?;
                em.b.build_unconditional_branch(j).map_err(llvm)?;
                em.b.position_at_end(j);
                Ok(())
            })
        })
    };
    let mut tiles = |em: &Emitter<'c>| -> Result<()> {
        for &(a_lo, a_hi, fact) in &a_segments {
            if let Some((s, e)) = fact {
                em.facts.borrow_mut().push((a, s, e));
            }
            let r = a_tiles(em, a_lo, a_hi);
            if fact.is_some() {
                em.facts.borrow_mut().pop();
            }
            r?;
        }
        Ok(())
    };
    // The other dimensions, outside the tiles; those after the first in segments where the
    // guards on them are decided.
    fn outer<'c>(
        em: &Emitter<'c>,
        d: usize,
        (skip, inner): (usize, usize),
        range: &dyn Fn(usize) -> (IntValue<'c>, IntValue<'c>),
        segments: &dyn Fn(usize) -> Vec<(i64, i64)>,
        tiles: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
    ) -> Result<()> {
        if d == inner {
            return tiles(em);
        }
        if d == skip {
            return outer(em, d + 1, (skip, inner), range, segments, tiles);
        }
        let mut next = |em: &Emitter<'c>| outer(em, d + 1, (skip, inner), range, segments, tiles);
        if d == 0 {
            let (from, to) = range(d);
            em.range_loop(d, from, to, 1, &mut next)
        } else {
            em.segmented(d, &segments(d), &mut next)
        }
    }
    let segments = |d: usize| guard_segments(&bodies, d, k.out.shape[d]);
    outer(em, 0, (a, inner), &range, &segments, &mut tiles)
}

/// One whole [`TILE`] x [`TILE`] tile of kernel `k` (one output of 4-byte elements, no
/// reductions) at `a0` along dimension `a` and `b0` along the innermost one (the variables of
/// the other dimensions set): its values computed into the stack tile `buf`, row `b` holding
/// positions `a0..a0 + TILE` (contiguous reads of the input), then the rows transposed in
/// registers and each column stored as one vector along the innermost dimension.
fn whole_tile<'c>(
    em: &Emitter<'c>,
    k: &Kernel,
    a: usize,
    (a0, b0): (IntValue<'c>, IntValue<'c>),
    buf: PointerValue<'c>,
    out: PointerValue<'c>,
) -> Result<()> {
    let inner = k.out.rank() - 1;
    let st = storage(em.ctx, k.out.dtype);
    let t = TILE as i64;
    let end = |x: IntValue<'c>| em.b.build_int_add(x, em.i64c(t), "e").map_err(llvm);
    em.range_loop(inner, b0, end(b0)?, 1, &mut |em: &Emitter<'c>| {
        em.range_loop(a, a0, end(a0)?, 1, &mut |em: &Emitter<'c>| {
            let v = em.expr(&k.body)?;
            let v = em.store_value(k.out.dtype, v)?;
            let bi = em.b.build_int_sub(em.var(inner)?, b0, "bi").map_err(llvm)?;
            let ai = em.b.build_int_sub(em.var(a)?, a0, "ai").map_err(llvm)?;
            let at =
                em.b.build_int_add(
                    em.b.build_int_mul(bi, em.i64c(t), "r").map_err(llvm)?,
                    ai,
                    "at",
                )
                .map_err(llvm)?;
            // SAFETY (of the emitted code): bi and ai are below TILE.
            let p = unsafe { em.b.build_in_bounds_gep(st, buf, &[at], "tp") }.map_err(llvm)?;
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })
    })?;
    let vt = vector_of(st, TILE)?;
    let rows: Vec<inkwell::values::VectorValue<'c>> = (0..t)
        .map(|r| {
            // SAFETY (of the emitted code): row r of the tile is in the buffer.
            let p = unsafe { em.b.build_in_bounds_gep(st, buf, &[em.i64c(r * t)], "tr") }
                .map_err(llvm)?;
            let l = em.b.build_load(vt, p, "row").map_err(llvm)?;
            l.as_instruction_value()
                .ok_or_else(|| Error::Llvm("a load is an instruction".into()))?
                .set_alignment(LINE as u32)
                .map_err(llvm)?;
            Ok(l.into_vector_value())
        })
        .collect::<Result<_>>()?;
    let cols = gemm::transpose_vectors(em, rows)?;
    let ost = strides(&k.out.shape);
    em.b.build_store(em.vars[inner], b0).map_err(llvm)?;
    for (i, col) in cols.into_iter().enumerate() {
        let ai =
            em.b.build_int_add(a0, em.i64c(i as i64), "ac")
                .map_err(llvm)?;
        em.b.build_store(em.vars[a], ai).map_err(llvm)?;
        let idx = em.position(&ost)?;
        // SAFETY (of the emitted code): the tile is whole, so positions b0..b0 + TILE along the
        // innermost dimension are in the output.
        let p = unsafe { em.b.build_in_bounds_gep(st, out, &[idx], "to") }.map_err(llvm)?;
        let s = em.b.build_store(p, col).map_err(llvm)?;
        s.set_alignment(4).map_err(llvm)?;
    }
    Ok(())
}

/// Columns computed side by side by the strip-mined innermost loop (see [`strips`]).
const STRIP: i64 = 16;

/// The reductions of `k`'s bodies that depend on the innermost output variable `d` and read
/// contiguously along it (a column sum: each output element sums a strided column), not yet
/// computed, without duplicates; empty when the loop is too short to strip-mine.
fn column_reduces<'e>(em: &Emitter<'_>, k: &'e Kernel, d: usize) -> Vec<&'e Expr> {
    if (k.out.shape[d] as i64) < STRIP {
        return Vec::new();
    }
    let mut out: Vec<&Expr> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    let bodies = std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body));
    for r in bodies.flat_map(hoistable_reduces) {
        let Expr::Reduce { body, init, .. } = r else {
            continue;
        };
        let free = free_vars(r);
        let key = value_key(r);
        if free.contains(&d)
            && free.iter().all(|&v| v <= d)
            && free_vars(init).is_empty()
            && crate::kernel::contiguous_along(body, d)
            && !keys.contains(&key)
            && !em.hoisted.borrow().iter().any(|(h, _)| *h == key)
        {
            keys.push(key);
            out.push(r);
        }
    }
    out
}

/// The innermost output loop (variable `d` over `range`) in strips of [`STRIP`] consecutive
/// positions: each reduction of `columns` runs once per strip with one accumulator per
/// position, so its loop reads a contiguous run of the row it is at (one vector) instead of
/// one strided element per output; then each position's body runs with the sums ready. The
/// positions past the last whole strip run one by one.
fn strips<'c>(
    em: &Emitter<'c>,
    d: usize,
    range: (IntValue<'c>, IntValue<'c>),
    columns: &[&Expr],
    store: &mut dyn FnMut(&Emitter<'c>) -> Result<()>,
) -> Result<()> {
    let i64t = em.ctx.i64_type();
    let n = em.b.build_int_sub(range.1, range.0, "n").map_err(llvm)?;
    let tail =
        em.b.build_int_signed_rem(n, em.i64c(STRIP), "tail")
            .map_err(llvm)?;
    let end = em.b.build_int_sub(range.1, tail, "end").map_err(llvm)?;
    let s_j = em.entry_alloca(i64t.into())?;
    em.range_loop_ptr(s_j, range.0, end, STRIP, &mut |em: &Emitter<'c>| {
        let j0 =
            em.b.build_load(i64t, s_j, "j0")
                .map_err(llvm)?
                .into_int_value();
        let at = |em: &Emitter<'c>, w: i64| -> Result<()> {
            let j = em.b.build_int_add(j0, em.i64c(w), "j").map_err(llvm)?;
            em.b.build_store(em.vars[d], j).map_err(llvm)?;
            Ok(())
        };
        let mut sums: Vec<(String, Vec<PointerValue<'c>>, BasicTypeEnum<'c>)> = Vec::new();
        for r in columns {
            let Expr::Reduce {
                kind,
                dtype,
                init,
                vars,
                body,
            } = r
            else {
                continue;
            };
            let ct: BasicTypeEnum = if dtype.is_float() {
                em.ftype(*dtype).into()
            } else {
                em.itype(*dtype).into()
            };
            let accs = (0..STRIP)
                .map(|_| em.entry_alloca(ct))
                .collect::<Result<Vec<_>>>()?;
            let i = em.expr(init)?;
            for a in &accs {
                em.b.build_store(*a, i).map_err(llvm)?;
            }
            let sum = sum_tree::Sum::new(*kind, *dtype, ct);
            let none = std::collections::BTreeSet::new();
            em.accumulate(vars, &[], &none, &sum, &accs, &mut |em, accs| {
                for (w, acc) in accs.iter().enumerate() {
                    at(em, w as i64)?;
                    let x = em.expr(body)?;
                    let a = em.b.build_load(ct, *acc, "a").map_err(llvm)?;
                    // In order along the column: the positions' chains are then vectorized
                    // side by side (one vector per row), not each along its strided column.
                    let c = em.combine_with(*kind, *dtype, a, x, false)?;
                    em.b.build_store(*acc, c).map_err(llvm)?;
                }
                Ok(())
            })?;
            sums.push((value_key(r), accs, ct));
        }
        for w in 0..STRIP {
            at(em, w)?;
            let mark = em.hoisted.borrow().len();
            for (key, accs, ct) in &sums {
                let v =
                    em.b.build_load(*ct, accs[w as usize], "sum")
                        .map_err(llvm)?;
                em.hoisted
                    .borrow_mut()
                    .push((key.clone(), Hoisted::Value(v)));
            }
            store(em)?;
            em.hoisted.borrow_mut().truncate(mark);
        }
        Ok(())
    })?;
    let was = em.in_order.replace(true);
    em.range_loop(d, end, range.1, 1, &mut |em: &Emitter<'c>| store(em))?;
    em.in_order.set(was);
    Ok(())
}

/// The fused kernels of `f` (see [`crate::fuse`]); `KILN_NO_FUSION=1` in the environment keeps
/// one kernel per instruction (for measuring what fusion buys, and for debugging).
pub fn fused_kernels(f: &Func) -> crate::fuse::Fused {
    let ks = kernels(f);
    if std::env::var("KILN_NO_FUSION").is_ok_and(|v| v == "1") {
        return crate::fuse::unfused(f, ks);
    }
    crate::fuse::fuse(f, ks)
}

/// The kernels of `f`, one per instruction that has one (`None` for the others).
pub fn kernels(f: &Func) -> Vec<Option<Kernel>> {
    f.insts
        .iter()
        .map(|inst| {
            if inst.results.len() != 1 || matches!(inst.op, Op::Constant { .. }) {
                return None;
            }
            let x: Vec<TensorType> = inst
                .operands
                .iter()
                .map(|o| f.values[o.index()].clone())
                .collect();
            lower(&inst.op, &x, &f.values[inst.results[0].index()])
        })
        .collect()
}

/// The module of `f`'s kernels; `for_host` adds this machine's CPU and features to every
/// function (needed to run them well, left out of machine-independent dumps).
/// In-place inputs of a kernel: `(input, output)` pairs and the pointer table's length (see
/// [`emit_kernel`]).
type Alias = (Vec<(usize, usize)>, usize);

/// `aliases[i]` (if present) is kernel `i`'s in-place alias (see [`emit_kernel`]).
fn build_module<'c>(
    ctx: &'c Context,
    f: &Func,
    ks: &[Option<Kernel>],
    for_host: bool,
    aliases: &[Alias],
    routines: Routines,
) -> Result<Module<'c>> {
    let m = ctx.create_module(&f.name);
    // SAFETY: `m` outlives the emitters, which only borrow it for the calls below.
    let mref: &'c Module<'c> = unsafe { &*(&m as *const Module<'c>) };
    let groups = contraction_groups(ks, aliases);
    let mut shared = std::collections::BTreeMap::new();
    for (i, k) in ks.iter().enumerate() {
        let Some(k) = k else { continue };
        let Some(g) = groups[i] else {
            emit_kernel(
                ctx,
                mref,
                &format!("k{i}"),
                k,
                for_host,
                aliases.get(i),
                routines,
                false,
            )?;
            continue;
        };
        if g == i {
            let body = emit_kernel(
                ctx,
                mref,
                &format!("k{i}.shared"),
                k,
                for_host,
                aliases.get(i),
                routines,
                true,
            )?;
            shared.insert(i, body);
        }
        let Schedule::Gemm { k: kk, .. } = k.schedule else {
            unreachable!("only matrix products share a function")
        };
        emit_contraction_wrapper(ctx, mref, &format!("k{i}"), shared[&g], kk, for_host)?;
    }
    m.verify()
        .map_err(|e| Error::Llvm(format!("invalid module for @{}: {e}", f.name)))?;
    Ok(m)
}

/// For each slot of `keys` that holds one, the first slot (itself, or an earlier one) with an
/// equal key and the same in-place outputs (`aliases`).
fn first_equal<T: PartialEq>(keys: &[Option<T>], aliases: &[Alias]) -> Vec<Option<usize>> {
    (0..keys.len())
        .map(|i| {
            keys[i].as_ref()?;
            (0..=i).find(|&j| keys[j] == keys[i] && aliases.get(j) == aliases.get(i))
        })
        .collect()
}

/// For each of the kernels `ks` (compiled with in-place outputs `aliases`), the index of the
/// first kernel equal to it (the same body over the same types, the same in-place outputs),
/// and the kernels to compile: those that are their own first. The others run through the
/// first one's function (Winograd's 36 products, for one).
fn distinct_kernels(ks: &[Option<Kernel>], aliases: &[Alias]) -> (Vec<usize>, Vec<Option<Kernel>>) {
    let first: Vec<usize> = first_equal(ks, aliases)
        .into_iter()
        .enumerate()
        .map(|(i, f)| f.unwrap_or(i))
        .collect();
    let own = (0..ks.len())
        .map(|i| if first[i] == i { ks[i].clone() } else { None })
        .collect();
    (first, own)
}

/// The LLVM IR of every kernel of `f`, before (`optimized = false`) or after optimization for
/// this CPU, module by module as the kernel cache compiles them (with the GEMM routines they
/// call): a kernel equal to an earlier one is compiled once (`distinct_kernels`) and printed
/// once.
pub fn function_llvm_ir(f: &Func, optimized: bool) -> Result<String> {
    let (f, fused) = lowered_for_printing(f)?;
    let (_, kernels) = distinct_kernels(&fused.kernels, &[]);
    if !optimized {
        let ctx = Context::create();
        let m = build_module(&ctx, &f, &kernels, false, &[], Routines::Here)?;
        return Ok(m.print_to_string().to_string());
    }
    // Optimized as the kernel cache compiles them: the same modules, each with its pipeline.
    let tm = crate::host_machine()?;
    let mut text = String::new();
    let mut jobs = kernel_jobs(&kernels, &[]);
    jobs.extend(
        planned_routines(&kernels, &[])
            .into_iter()
            .map(Job::Routine),
    );
    for job in &jobs {
        let ctx = Context::create();
        let (m, _) = job.module(&ctx, &f, &[])?;
        crate::optimize_as(&m, &tm, job.pipeline())?;
        text.push_str(&m.print_to_string().to_string());
    }
    Ok(text)
}

/// The fused kernels of `f` as the CPU backend builds them (after the optimizer and the
/// canonicalizing rewrites), as text: each kernel with its member instructions and inputs, and
/// for every instruction the reason it has a kernel of its own or runs inside its users.
pub fn describe_fusion(f: &Func) -> Result<String> {
    use std::fmt::Write as _;
    let (g, fused) = lowered_for_printing(f)?;
    let mut s = String::new();
    let _ = writeln!(s, "{g}");
    let count = fused.kernels.iter().filter(|k| k.is_some()).count();
    let _ = writeln!(s, "// {count} kernels");
    for (i, inst) in g.insts.iter().enumerate() {
        let ty = &g.values[inst.results[0].index()];
        if let Some(k) = &fused.kernels[i] {
            let members: Vec<String> = fused.members[i]
                .iter()
                .map(|&m| format!("#{m} {}", g.insts[m].op.mnemonic()))
                .collect();
            let reads: Vec<String> = fused.operands[i].iter().map(|v| v.to_string()).collect();
            let launch = kernel_shape(k, false);
            let also = if fused.extra[i].is_empty() {
                String::new()
            } else {
                let vs: Vec<String> = fused.extra[i]
                    .iter()
                    .map(|v| format!("{v}: {}", g.values[v.index()]))
                    .collect();
                format!("; also writes [{}]", vs.join(", "))
            };
            let _ = writeln!(
                s,
                "kernel k{i}: {} -> {ty}{also}; members [{}]; reads [{}]; rows {}, work {}{}",
                inst.op.mnemonic(),
                members.join(", "),
                reads.join(", "),
                launch.rows,
                launch.work,
                match (&k.schedule, transpose_tile_dim(k)) {
                    (Schedule::Nest, Some(a)) => format!(
                        "; in {TILE} x {TILE} tiles of dimensions {a} and {}",
                        k.out.rank() - 1
                    ),
                    _ => String::new(),
                },
            );
            if let (Schedule::Gemm { chain: Some(c), .. }, Some((bl, _))) =
                (&k.schedule, gemm_blocking(k, false))
            {
                let _ = writeln!(
                    s,
                    "  chained: the epilogue's {} is never stored; each block of {} rows is \
                     multiplied by {} ({} columns) as soon as it is done",
                    k.out,
                    bl.rows_per_block(),
                    fused.operands[i][c.b],
                    c.n
                );
                if c.online.is_some() {
                    let _ = writeln!(
                        s,
                        "  online: the softmax runs over blocks of {} columns, from each row's \
                         running maximum and sum",
                        bl.columns_per_block()
                    );
                }
                if let Some((a, b, c)) = c.masked {
                    let _ = writeln!(
                        s,
                        "  masked: blocks where column * {a} + row * {b} + {c} > 0 throughout \
                         are skipped"
                    );
                }
            }
            // (An online softmax does not run the body as it stands.)
            let online =
                matches!(&k.schedule, Schedule::Gemm { chain: Some(c), .. } if c.online.is_some());
            for note in row_cache_notes(k).into_iter().filter(|_| !online) {
                let _ = writeln!(s, "  {note}");
            }
        }
    }
    for (i, inst) in g.insts.iter().enumerate() {
        let _ = writeln!(
            s,
            "#{i} {} = {}: {}",
            inst.results[0],
            inst.op.mnemonic(),
            fused.decisions[i]
        );
    }
    Ok(s)
}

/// The kernels `ks` of `f` as a shared library: from the cache when an intact one is stored
/// under their key (`true`), else compiled at O2 to objects, linked and stored (`false`).
///
/// A miss compiles the kernels on all cores: each GEMM kernel in a module of its own, the
/// others together, each module optimized and turned into an object in its own LLVM context
/// by whichever thread is free, and the objects are linked into one library.
fn compile_cached(
    f: &Func,
    ks: &[Option<Kernel>],
    aliases: &[Alias],
    dir: &std::path::Path,
    names: &[String],
) -> Result<(crate::cache::Library, bool)> {
    use inkwell::targets::FileType;
    // The key: what the modules are built from (the function, its kernels and the in-place
    // outputs), the settings that change how they are emitted and optimized, the CPU and
    // this crate's sources. Building and printing the LLVM IR to hash it instead took about
    // 40 ms of the MLP step's 60 ms compile with the cache warm.
    let machine = lowering::machine_settings();
    let key = crate::cache::key(&format!("{f}\n{ks:?}\n{aliases:?}"), &machine);
    if let Some(lib) = crate::cache::load(dir, &key, names) {
        return Ok((lib, true));
    }
    crate::aot_machine()?; // initializes LLVM's native target once, before the threads
    let mut jobs = kernel_jobs(ks, aliases);
    // The GEMM routines (register tiles, packing) the kernels call, each compiled once in a
    // module of its own, or loaded as an object from the cache: they depend on the tile and
    // the machine, not on the function, so every function with the same tiles shares them.
    let planned = planned_routines(ks, aliases);
    let routine_key =
        |r: &gemm::Routine| crate::cache::key(&format!("routine {}", r.name()), &machine);
    let mut routine_objects = Vec::new();
    for r in &planned {
        match crate::cache::load_object(dir, &routine_key(r)) {
            Some(o) => routine_objects.push(o),
            None => jobs.push(Job::Routine(*r)),
        }
    }
    // Longest first (a stable sort: equal weights keep their order).
    jobs.sort_by_key(|j| std::cmp::Reverse(j.weight()));
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    // Per-module lines, for functions only: eager ops are tallied (see `compile_times`).
    let times = std::env::var("KILN_COMPILE_TIMES").is_ok_and(|v| v == "1")
        && compile_times::prints_phases(&f.name);
    let t_begin = std::time::Instant::now();
    let compile = |job: &Job, tm: &inkwell::targets::TargetMachine| -> Result<Vec<u8>> {
        let start = std::time::Instant::now();
        let ctx = Context::create();
        let (m, what) = job.module(&ctx, f, aliases)?;
        // The routines the kernels declare must be among those compiled for the library.
        for g in m.get_functions() {
            let name = g.get_name().to_string_lossy();
            if g.count_basic_blocks() == 0
                && name.starts_with(gemm::ROUTINE_PREFIX)
                && !planned.iter().any(|r| r.name() == name)
            {
                return Err(Error::Llvm(format!(
                    "@{}: GEMM routine {name} called but not planned",
                    f.name
                )));
            }
        }
        let built = std::time::Instant::now();
        crate::optimize_as(&m, tm, job.pipeline())?;
        let optimized = std::time::Instant::now();
        let object = tm
            .write_to_memory_buffer(&m, FileType::Object)
            .map_err(llvm)?;
        if let Job::Routine(t) = job {
            crate::cache::store_object(dir, &routine_key(t), object.as_slice())?;
        }
        if times {
            eprintln!(
                "kiln compile @{}: module [{what}]: at {:.1} ms: build {:.1} ms, optimize {:.1} ms, code {:.1} ms",
                f.name,
                (start - t_begin).as_secs_f64() * 1e3,
                (built - start).as_secs_f64() * 1e3,
                (optimized - built).as_secs_f64() * 1e3,
                optimized.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(object.as_slice().to_vec())
    };
    // Each thread's objects, with the index of their job.
    type Objects = Vec<(usize, Vec<u8>)>;
    let done: Vec<Result<Objects>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<Objects> {
                    // One target machine per thread for all its modules: LLVM builds the
                    // subtarget for the host CPU's features once per target machine.
                    let tm = crate::aot_machine()?;
                    let mut objects = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(job) = jobs.get(j) else {
                            return Ok(objects);
                        };
                        objects.push((j, compile(job, &tm)?));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Llvm("a compile thread panicked".into())))
            })
            .collect()
    });
    // Linked in job order, whichever thread compiled them.
    let mut objects: Objects = done
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    objects.sort_by_key(|o| o.0);
    let objects: Vec<Vec<u8>> = objects
        .into_iter()
        .map(|o| o.1)
        .chain(routine_objects)
        .collect();
    Ok((crate::cache::store(dir, &key, &objects)?, false))
}

/// Work (output elements times reduction steps, see [`kernel_shape`]) below which a loop-nest
/// kernel is optimized with the light pipeline (`LIGHT_PIPELINE`); also the outputs below
/// which a GEMM kernel's epilogue is (see [`kernel_jobs`]).
const LIGHT_WORK: usize = 1 << 22;

/// The most expression nodes (see [`kernel_nodes`]) of the non-GEMM kernels that share one
/// module in the kernel cache's compile.
const MODULE_NODES: usize = 500;

/// Expression nodes of `k`'s bodies (its result's and its extra outputs').
fn kernel_nodes(k: &Kernel) -> usize {
    let mut n = 0;
    for body in std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body)) {
        visit(body, &mut |_| n += 1);
    }
    n
}

/// One module the kernel cache compiles: kernels (each in its slot), or a GEMM routine.
enum Job {
    Kernels(Vec<Option<Kernel>>, crate::Pipeline),
    Routine(gemm::Routine),
}

impl Job {
    /// The module, built in `ctx` for function `f` with in-place outputs `aliases`, and what
    /// it holds (kernel names, or the routine's).
    fn module<'c>(
        &self,
        ctx: &'c Context,
        f: &Func,
        aliases: &[Alias],
    ) -> Result<(Module<'c>, String)> {
        Ok(match self {
            Job::Kernels(part, _) => {
                let names: Vec<String> = (0..part.len())
                    .filter(|&i| part[i].is_some())
                    .map(|i| format!("k{i}"))
                    .collect();
                (
                    build_module(ctx, f, part, true, aliases, Routines::Apart)?,
                    names.join(" "),
                )
            }
            Job::Routine(r) => (routine_module(ctx, r)?, r.name()),
        })
    }

    fn pipeline(&self) -> crate::Pipeline {
        match self {
            Job::Kernels(_, p) => *p,
            Job::Routine(_) => crate::Pipeline::Explicit,
        }
    }

    /// About how long the job takes to compile, in milliseconds on the machine the figures
    /// were taken on (`KILN_COMPILE_TIMES=1`, the MLP step): the compile threads take the jobs
    /// longest first, so that the last ones to finish are short.
    fn weight(&self) -> usize {
        match self {
            // Modules of other kernels, filled up to `MODULE_NODES`: the longest (40-80 ms).
            Job::Kernels(part, _) if part.iter().flatten().any(|k| !is_matrix_gemm(k)) => {
                100 + part.iter().flatten().map(kernel_nodes).sum::<usize>()
            }
            // GEMM kernels: their loops and epilogues at O2 (12-37 ms with two kernels), or
            // only loops calling the routines (8-10 ms).
            Job::Kernels(part, pipeline) => {
                let each = match pipeline {
                    crate::Pipeline::O2 { .. } => 15,
                    _ => 8,
                };
                each * part.iter().flatten().count()
            }
            // The routines: tiles 13-19 ms, packing A or transposed B 8-14, plain B 4.
            Job::Routine(r) => match r {
                gemm::Routine::Tile { .. } => 16,
                gemm::Routine::PackA { .. } | gemm::Routine::PackB { trans: true, .. } => 11,
                gemm::Routine::PackB { .. } => 4,
            },
        }
    }
}

/// Whether `k` is a matrix product on the GEMM (not a convolution's, which compiles with the
/// other kernels: see [`split_gemms`]).
fn is_matrix_gemm(k: &Kernel) -> bool {
    matches!(k.schedule, Schedule::Gemm { conv: None, .. })
}

/// The modules the kernels `ks` are compiled in, in the order the threads take them.
///
/// - The non-GEMM kernels, which mostly compile quickly, share modules of up to
///   [`MODULE_NODES`] expression nodes (a large kernel alone), first in the queue: they are
///   the largest jobs, and started last they would finish alone on one core. Kernels with
///   less work than [`LIGHT_WORK`] (a training step's loss, its gradient, bias updates) share
///   modules of their own optimized with the light pipeline (`LIGHT_PIPELINE`), the others
///   are optimized at O2.
/// - Each matrix-product kernel has a module of its own, without LLVM's loop unrolling: its
///   tiles are unrolled as emitted, and the unroll passes took a quarter of its O2 time
///   (`opt -time-passes`); runtime even (matmul 1024 and 2048 76 of 145 and 28 of 55
///   alternating calls, attention 13 of 25; the MLP step 14.6 against 14.7 ms over four
///   alternating processes: see docs/performance.md). One with an epilogue (fused elementwise
///   users, whose loops LLVM vectorizes) is optimized at O2, or with the light pipeline when
///   its output has fewer than [`LIGHT_WORK`] elements; one without with the pipeline of
///   explicit vector code (`EXPLICIT_PIPELINE`): its loops only walk the cache blocks and
///   call the GEMM routines. Products that share a function (`contraction_groups`) share
///   the module.
///
/// The threads take the next module as they finish one, so a few large ones do not leave a
/// core idle.
fn kernel_jobs(ks: &[Option<Kernel>], aliases: &[Alias]) -> Vec<Job> {
    let groups = contraction_groups(ks, aliases);
    let (gemms, others) = split_gemms(ks);
    let mut jobs: Vec<Job> = Vec::new();
    for light in [false, true] {
        let pipeline = if light {
            crate::Pipeline::Light
        } else {
            crate::Pipeline::O2 { unroll: true }
        };
        let mut filled = MODULE_NODES;
        for (i, k) in others.iter().enumerate() {
            let Some(k) = k else { continue };
            if (kernel_shape(k, false).work < LIGHT_WORK) != light {
                continue;
            }
            let size = kernel_nodes(k);
            if filled + size > MODULE_NODES {
                jobs.push(Job::Kernels(vec![None; ks.len()], pipeline));
                filled = 0;
            }
            filled += size;
            if let Some(Job::Kernels(part, _)) = jobs.last_mut() {
                part[i] = Some(k.clone());
            }
        }
    }
    let mut group_job = std::collections::BTreeMap::new();
    for (i, k) in gemms.into_iter().enumerate() {
        let Some(k) = k else { continue };
        if let Some(&j) = groups[i].and_then(|g| group_job.get(&g)) {
            if let Job::Kernels(part, _) = &mut jobs[j] {
                part[i] = Some(k);
            }
            continue;
        }
        if let Some(g) = groups[i] {
            group_job.insert(g, jobs.len());
        }
        let plain =
            matches!(k.schedule, Schedule::Gemm { epilogue: None, .. }) && k.extra.is_empty();
        let pipeline = if plain && !gemm_unroll() {
            crate::Pipeline::Explicit
        } else if k.out.numel() < LIGHT_WORK {
            crate::Pipeline::Light
        } else {
            crate::Pipeline::O2 {
                unroll: gemm_unroll(),
            }
        };
        let mut part = vec![None; ks.len()];
        part[i] = Some(k);
        jobs.push(Job::Kernels(part, pipeline));
    }
    jobs
}

/// The GEMM routines that the kernels `ks` call (see [`gemm::Routine`]), compiled with
/// in-place outputs `aliases`.
fn planned_routines(
    ks: &[Option<Kernel>],
    aliases: &[Alias],
) -> std::collections::BTreeSet<gemm::Routine> {
    let mut routines = std::collections::BTreeSet::new();
    for (i, k) in ks.iter().enumerate() {
        let Some(k) = k else { continue };
        let (
            Schedule::Gemm {
                n,
                a_trans,
                b_trans,
                conv,
                chain,
                ..
            },
            Some((bl, _)),
        ) = (&k.schedule, gemm_blocking(k, wide_vectors(true)))
        else {
            continue;
        };
        if let Some(c) = chain {
            routines.extend(gemm::Routine::of_gemm(
                chain_blocking(k, c, wide_vectors(true)),
                c.n as i64,
                (false, c.b_trans),
                None,
                None,
                false,
            ));
        }
        // As `emit_kernel` decides: in update mode when written in place.
        let update = aliases
            .get(i)
            .and_then(|a| a.0.first())
            .and_then(|&(q, _)| crate::fuse::gemm_update(k, q))
            .map(|u| u.1);
        routines.extend(gemm::Routine::of_gemm(
            bl,
            *n as i64,
            (*a_trans, *b_trans),
            conv.as_ref(),
            update,
            chain.is_some(),
        ));
    }
    routines
}

/// A module defining GEMM routine `r` alone.
fn routine_module<'c>(ctx: &'c Context, r: &gemm::Routine) -> Result<Module<'c>> {
    let m = ctx.create_module(&r.name());
    // SAFETY: `m` outlives the function built in it, which only borrows it for the call.
    let mref: &'c Module<'c> = unsafe { &*(&m as *const Module<'c>) };
    r.function(ctx, mref, Routines::Here, true)?;
    m.verify()
        .map_err(|e| Error::Llvm(format!("invalid module for {}: {e}", r.name())))?;
    Ok(m)
}

/// `part` as its matrix-product GEMM kernels and its other kernels (each in `part`'s slots).
/// Convolutions' GEMMs stay with the others: without LLVM's unrolling, conv 3x3 64 -> 64 lost
/// 10 of 11 alternating calls (73 -> 77 ms).
fn split_gemms(part: &[Option<Kernel>]) -> (Vec<Option<Kernel>>, Vec<Option<Kernel>>) {
    let pick = |gemm: bool| {
        part.iter()
            .map(|k| k.as_ref().filter(|k| is_matrix_gemm(k) == gemm).cloned())
            .collect()
    };
    (pick(true), pick(false))
}

/// Whether loops are cut where guards change (see [`guard_segments`]): yes unless
/// `KILN_GUARD_SPLIT=0` (for measuring).
fn guard_splits() -> bool {
    std::env::var("KILN_GUARD_SPLIT").map_or(true, |v| v != "0")
}

/// The most places a loop is cut at to decide guards (see [`guard_segments`]).
const MAX_GUARD_CUTS: usize = 4;

/// `0..extent` cut where a guard of `bodies` on loop variable `var` (a condition
/// `lo <= var + k < hi`: a pad's edge, a concatenation's seam) changes its outcome, so that
/// in each segment every such condition holds everywhere or nowhere: a padded row then runs
/// its interior without a check per element (and vectorized) and its edges as constants.
/// One segment when there is no such guard, or more than [`MAX_GUARD_CUTS`] cuts.
fn guard_segments(bodies: &[&Expr], var: usize, extent: usize) -> Vec<(i64, i64)> {
    guard_segments_up_to(bodies, var, extent, MAX_GUARD_CUTS)
}

/// The most places a kernel's rows (its outermost loop) are cut at to decide guards: a
/// concatenation of many pieces along its first dimension then runs each piece as a loop nest
/// of its own, with no guard tree per element (measured on 36 pieces of `[12544, 64]`: 168 ->
/// 61 ms). Every segment holds only the pieces it decides, so the code grows by a loop per
/// segment.
const MAX_ROW_GUARD_CUTS: usize = 63;

/// [`guard_segments`] with at most `max_cuts` cuts.
fn guard_segments_up_to(
    bodies: &[&Expr],
    var: usize,
    extent: usize,
    max_cuts: usize,
) -> Vec<(i64, i64)> {
    let n = extent as i64;
    let mut cuts = std::collections::BTreeSet::new();
    for b in bodies {
        visit(b, &mut |x| {
            if let Expr::Guard { conds, .. } = x {
                for c in conds {
                    if let Cond::InRange(i, lo, hi) = c
                        && let Some((v, k)) = var_plus_const(i)
                        && v == var
                    {
                        cuts.extend([lo - k, hi - k].into_iter().filter(|&p| p > 0 && p < n));
                    }
                }
            }
        });
    }
    if cuts.is_empty() || cuts.len() > max_cuts || !guard_splits() {
        return vec![(0, n)];
    }
    let points: Vec<i64> = std::iter::once(0)
        .chain(cuts)
        .chain(std::iter::once(n))
        .collect();
    points.windows(2).map(|w| (w[0], w[1])).collect()
}

/// The largest row cache, in bytes: a softmax row of 4096 f32 values (16 KiB), which stays in
/// the L1 cache between the reduction that fills it and the loop that reads it.
const ROW_CACHE_BYTES: usize = 16 * 1024;

/// Whether reductions keep costly per-position values for the loops after them (see
/// [`row_cache`]): yes unless `KILN_ROW_CACHE=0` (for measuring).
fn row_caches() -> bool {
    std::env::var("KILN_ROW_CACHE").map_or(true, |v| v != "0")
}

/// What a reduction keeps per position for the expressions after it (see [`row_cache`]).
struct RowCache<'e> {
    /// The costly part of the reduction's body, computed at each position of its variable.
    part: &'e Expr,
    /// The loop variable along which the expressions compute the same part.
    var: usize,
    /// [`value_key`] of the part as the expressions compute it (at `var`).
    key: String,
    /// Positions: the reduction's trip count, equal to `var`'s.
    len: usize,
}

/// Whether `op` is much costlier than a multiply-add (a polynomial or a library call).
fn costly_op(op: &Ew) -> bool {
    matches!(
        op,
        Ew::Kind(
            OpKind::Exponential
                | OpKind::ExponentialMinusOne
                | OpKind::Log
                | OpKind::LogPlusOne
                | OpKind::Tanh
                | OpKind::Logistic
                | OpKind::Erf
                | OpKind::Power
        )
    )
}

/// Whether `e` contains a costly operation (see [`costly_op`]).
fn costly(e: &Expr) -> bool {
    let mut found = false;
    visit(e, &mut |x| {
        found |= matches!(x, Expr::Op { op, .. } if costly_op(op));
    });
    found
}

/// The row cache for the reduction `r`, hoisted ahead of loop `d` of expressions `bodies`
/// (whose loop variables below the output's rank have trip counts `extents`), if it is worth
/// one: `r` reduces over one variable, and the largest costly float part of its body that reads
/// nothing but that variable and the enclosing loops' variables is also computed by `bodies`
/// with the reduced variable replaced by an inner loop variable of the same trip count. A
/// softmax's sum of exp(x - max) then stores each exp(x - max) in the buffer, and its outputs
/// read it back instead of computing a second exp.
fn row_cache<'e>(
    r: &'e Expr,
    bodies: &[&Expr],
    d: usize,
    extents: &[usize],
) -> Option<RowCache<'e>> {
    let Expr::Reduce { vars, body, .. } = r else {
        return None;
    };
    let [(from, len)] = vars.as_slice() else {
        return None;
    };
    let (from, len) = (*from, *len);
    // The body's operations reachable through operations, largest first.
    fn parts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
        if let Expr::Op { args, .. } = e {
            out.push(e);
            args.iter().for_each(|a| parts(a, out));
        }
    }
    let mut candidates = Vec::new();
    parts(body, &mut candidates);
    let mut keys: Option<Vec<String>> = None;
    for part in candidates {
        let fv = free_vars(part);
        // Values are kept as they are computed: f64, or f32 for the narrower floats.
        let bytes = if part.dtype() == DType::F64 { 8 } else { 4 };
        if !part.dtype().is_float()
            || len * bytes > ROW_CACHE_BYTES
            || !fv.contains(&from)
            || fv.iter().any(|&v| v != from && v >= d)
            || !costly(part)
        {
            continue;
        }
        // Every value the expressions compute, by key (computed once, when needed).
        let keys = keys.get_or_insert_with(|| {
            let mut ks = Vec::new();
            for b in bodies {
                visit(b, &mut |x| {
                    if matches!(x, Expr::Op { .. }) {
                        ks.push(value_key(x));
                    }
                });
            }
            ks
        });
        for (to, &n) in extents.iter().enumerate().skip(d) {
            if n != len || fv.contains(&to) {
                continue;
            }
            let key = value_key(&rename_var(part, from, to));
            if keys.contains(&key) {
                return Some(RowCache {
                    part,
                    var: to,
                    key,
                    len,
                });
            }
        }
    }
    None
}

/// What the emitter keeps in row caches in kernel `k` (see [`row_cache`]), one line per
/// cached reduction, for the fusion dump.
fn row_cache_notes(k: &Kernel) -> Vec<String> {
    if !row_caches() {
        return Vec::new();
    }
    let bodies: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .collect();
    // Where the emitter hoists each reduction: ahead of the first loop inside all its free
    // variables, or, in a GEMM's row epilogue, ahead of the loop over a row's columns.
    let split = match k.schedule {
        Schedule::Gemm {
            batch,
            m,
            n,
            epilogue: Some(_),
            ..
        } => crate::fuse::row_split(&k.out.shape, batch * m, n),
        Schedule::Nest => None,
        _ => return Vec::new(),
    };
    let mut seen: Vec<String> = Vec::new();
    let mut notes = Vec::new();
    for r in bodies.iter().flat_map(|b| hoistable_reduces(b)) {
        let d = match split {
            Some(d) => d,
            None => free_vars(r).last().map_or(0, |&v| v + 1),
        };
        let key = value_key(r);
        if seen.contains(&key) || free_vars(r).iter().any(|&v| v >= d) {
            continue;
        }
        seen.push(key);
        if let (Expr::Reduce { kind, .. }, Some(plan)) = (r, row_cache(r, &bodies, d, &k.out.shape))
        {
            let op = match plan.part {
                Expr::Op {
                    op: Ew::Kind(op), ..
                } => op.to_string(),
                _ => "costly part".to_string(),
            };
            notes.push(format!(
                "row cache: the {kind} reduction over {} positions keeps its {op} of each for the outputs along dimension {}",
                plan.len, plan.var
            ));
        }
    }
    notes
}

/// Functions without a GEMM go through the kernel cache when their kernels' LLVM instructions
/// as emitted, plus `COSTLY_WEIGHT` for each costly operation (exp, log, tanh, logistic, erf,
/// power: the loop vectorizer and the code generator then work through their polynomials
/// in vector form), reach this weight. Measured JIT compiles: an eager elementwise op (35-180
/// instructions) 7-15 ms, less than linking a library would add on a miss; a 4096 x 4096
/// softmax (213 and one exp) 25-80 ms, layernorm (366) 35-75 ms, the GELU chain (432 and a
/// logistic) 55-80 ms, erf + tanh x logistic over 100 x 100 (180 and three) about 50 ms, where
/// loading a stored library takes about a millisecond.
const CACHE_WEIGHT: usize = 250;

/// What one costly operation adds to a function's compile weight (see [`CACHE_WEIGHT`]).
const COSTLY_WEIGHT: usize = 100;

/// The costly operations (see [`costly_op`]) in kernel `k`'s expressions.
fn costly_ops(k: &Kernel) -> usize {
    let mut n = 0;
    for body in std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body)) {
        visit(body, &mut |x| {
            n += usize::from(matches!(x, Expr::Op { op, .. } if costly_op(op)));
        });
    }
    n
}

/// The number of instructions in `m`'s functions.
fn instruction_count(m: &Module<'_>) -> usize {
    m.get_functions()
        .flat_map(|f| f.get_basic_block_iter())
        .map(|bb| bb.get_instructions().count())
        .sum()
}

/// Whether LLVM unrolls loops in GEMM kernels: not unless `KILN_GEMM_UNROLL=1` (for
/// measuring).
fn gemm_unroll() -> bool {
    std::env::var("KILN_GEMM_UNROLL").is_ok_and(|v| v == "1")
}

/// Reports, once per process, that the kernel cache could not be used (kernels are then
/// JIT-compiled as usual).
fn warn_cache_off(e: &Error) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| eprintln!("kiln: kernel cache not used: {e}"));
}

/// `f` as the backend lowers it (optimized and canonicalized with the reference machine's
/// costs, so the text is the same on every machine) and its fusion: what the dumps print.
fn lowered_for_printing(f: &Func) -> Result<(Func, crate::fuse::Fused)> {
    lowered_for_printing_donating(f, &[]).map(|(g, fused, _)| (g, fused))
}

/// [`lowered_for_printing`] for the parameters `p` with `donated[p]` donated (scheduling
/// depends on them), with the line saying what scheduling decided.
fn lowered_for_printing_donating(
    f: &Func,
    donated: &[bool],
) -> Result<(Func, crate::fuse::Fused, String)> {
    kiln_ir::verify(f).map_err(|e| Error::Args(e.to_string()))?;
    let g = prepare(f, &printing_options())?;
    let fused = fused_kernels(&g);
    scheduled(g, fused, donated)
}

/// The fused program `f`, `fused` in the order [`crate::schedule::step_order`] picks, fused
/// again, when that lowers the memory plan's peak without adding kernels; else (and with
/// `KILN_SCHEDULE=0` in the environment, for measuring) as it is. With it, one line saying
/// which order was kept and the peaks of both.
fn scheduled(
    f: Func,
    fused: crate::fuse::Fused,
    donated: &[bool],
) -> Result<(Func, crate::fuse::Fused, String)> {
    let peak = |g: &Func, fz: &crate::fuse::Fused| {
        let steps = steps_of(g, fz);
        let in_place = crate::fuse::in_place(g, fz, &steps, donated);
        let no_scratch = vec![0; g.insts.len()];
        kiln_runtime::plan::plan(g, &steps, &fz.operands, &no_scratch, &in_place, &fz.extra)
            .peak_bytes()
    };
    let count = |fz: &crate::fuse::Fused| fz.kernels.iter().flatten().count();
    let before = peak(&f, &fused);
    if std::env::var("KILN_SCHEDULE").is_ok_and(|v| v == "0") {
        let note = format!("schedule: program order (KILN_SCHEDULE=0; peak {before} bytes)");
        return Ok((f, fused, note));
    }
    let order = crate::schedule::step_order(&f, &fused, donated);
    if order.windows(2).all(|w| w[0] < w[1]) {
        let note = format!("schedule: program order (the memory-aware order; peak {before} bytes)");
        return Ok((f, fused, note));
    }
    let placement = crate::schedule::placement(&f, &fused, &order);
    let g = crate::schedule::permute(&f, &placement);
    // The reordered program under the same kernels first: when even that does not peak lower,
    // the program order stays without fusing the reordered program (as long as fusing the
    // program itself; the two fusions differ only where multi-output fusion finds other
    // siblings in the new order).
    let estimate = peak(&g, &crate::schedule::carried(&f, &fused, &placement));
    if estimate >= before {
        let note = format!(
            "schedule: program order (peak {before} bytes; the memory-aware order peaks at \
             {estimate} bytes with {} kernels)",
            count(&fused)
        );
        return Ok((f, fused, note));
    }
    let refused = fused_kernels(&g);
    if crate::fuse::check_legal(&g, &refused).is_ok() {
        let after = peak(&g, &refused);
        if after < before && count(&refused) <= count(&fused) {
            // Steps some earlier step in the order comes after in the program.
            let mut latest = 0;
            let moved = order
                .iter()
                .filter(|&&u| {
                    let earlier = latest > u;
                    latest = latest.max(u);
                    earlier
                })
                .count();
            let note = format!(
                "schedule: {moved} step(s) moved earlier for memory; peak {before} -> {after} bytes"
            );
            return Ok((g, refused, note));
        }
        let note = format!(
            "schedule: program order (peak {before} bytes; the memory-aware order peaks at \
             {after} bytes with {} kernels)",
            count(&refused)
        );
        return Ok((f, fused, note));
    }
    let note = format!("schedule: program order (peak {before} bytes)");
    Ok((f, fused, note))
}

/// How each instruction of the prepared function `f` runs, given its fusion.
fn steps_of(f: &Func, fused: &crate::fuse::Fused) -> Vec<Step> {
    f.insts
        .iter()
        .zip(&fused.kernels)
        .enumerate()
        .map(|(i, (inst, k))| match (k, &inst.op) {
            _ if fused.inlined[i] => Step::Fused,
            _ if fused.merged_into[i].is_some() => Step::Merged,
            (Some(_), _) => Step::Kernel,
            (None, Op::Constant { .. }) => Step::Constant,
            (None, Op::OptimizationBarrier {}) => Step::Forward,
            (None, _) => Step::Reference,
        })
        .collect()
}

/// The memory plan of `f` on the CPU backend, as text: the program as lowered, then each
/// intermediate's arena offset, size and live steps, and the arena, outside and peak bytes.
pub fn describe_memory(f: &Func) -> Result<String> {
    describe_memory_donating(f, &[])
}

/// [`describe_memory`] for a function whose parameters `p` with `donated[p]` are donated: the
/// plan also lists the results written in place into their buffers.
pub fn describe_memory_donating(f: &Func, donated: &[bool]) -> Result<String> {
    let (g, fused, note) = lowered_for_printing_donating(f, donated)?;
    let steps = steps_of(&g, &fused);
    let in_place = crate::fuse::in_place(&g, &fused, &steps, donated);
    // The 256-bit blocking's scratch, so the text is the same on every machine.
    let scratch: Vec<usize> = fused
        .kernels
        .iter()
        .map(|k| k.as_ref().map_or(0, |k| kernel_shape(k, false).scratch))
        .collect();
    let plan = kiln_runtime::plan::plan(
        &g,
        &steps,
        &fused.operands,
        &scratch,
        &in_place,
        &fused.extra,
    );
    Ok(format!("{g}\n{note}\n{plan}"))
}

/// The fused graph in Graphviz dot: one box per kernel (its member ops inside), edges for the
/// buffers kernels read.
pub fn fusion_dot(f: &Func) -> Result<String> {
    use std::fmt::Write as _;
    let (g, fused) = lowered_for_printing(f)?;
    let mut producer = vec![None; g.values.len()];
    for (i, inst) in g.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
    }
    let mut s =
        String::from("digraph fused {\n  rankdir=TB;\n  node [shape=box, fontname=monospace];\n");
    for (i, p) in g.params.iter().enumerate() {
        let _ = writeln!(
            s,
            "  p{i} [shape=ellipse, label=\"{p}: {}\"];",
            g.values[p.index()]
        );
    }
    // A merged instruction's value comes from the kernel that writes it.
    for p in producer.iter_mut().flatten() {
        *p = fused.merged_into[*p].unwrap_or(*p);
    }
    for (i, inst) in g.insts.iter().enumerate() {
        if fused.inlined[i] || fused.merged_into[i].is_some() {
            continue;
        }
        let ty = &g.values[inst.results[0].index()];
        let label = if fused.kernels[i].is_some() {
            let members: Vec<String> = fused.members[i]
                .iter()
                .map(|&m| format!("#{m} {}", g.insts[m].op.mnemonic()))
                .collect();
            let also: String = fused.extra[i]
                .iter()
                .map(|v| format!(", {v}: {}", g.values[v.index()]))
                .collect();
            format!("k{i} -> {ty}{also}\\n{}", members.join("\\n"))
        } else {
            format!("#{i} {} -> {ty}", inst.op.mnemonic())
        };
        let _ = writeln!(s, "  n{i} [label=\"{label}\"];");
        for v in &fused.operands[i] {
            match producer[v.index()] {
                Some(p) => {
                    let _ = writeln!(s, "  n{p} -> n{i};");
                }
                None => {
                    if let Some(k) = g.params.iter().position(|q| q == v) {
                        let _ = writeln!(s, "  p{k} -> n{i};");
                    }
                }
            }
        }
    }
    for (k, o) in g.outputs.iter().enumerate() {
        let _ = writeln!(s, "  out{k} [shape=ellipse, label=\"output {k}\"];");
        if let Some(p) = producer[o.index()] {
            let _ = writeln!(s, "  n{p} -> out{k};");
        }
    }
    s.push_str("}\n");
    Ok(s)
}

/// The optimizer's options for printing: the reference machine's costs, so that dumps and
/// snapshots are the same on every machine.
fn printing_options() -> kiln_opt::Options {
    kiln_opt::Options {
        machine: kiln_opt::cost::Machine::REFERENCE,
        ..kiln_opt::Options::from_env()
    }
}

impl CpuExecutable {
    /// Compiles `f` for this CPU, through the kernel cache of [`crate::cache::dir`].
    pub fn compile(f: &Func) -> Result<CpuExecutable> {
        Self::compile_with_cache(f, crate::cache::dir().as_deref())
    }

    /// Compiles `f` for this CPU, with the kernel cache in `cache` (`None`: no cache).
    pub fn compile_with_cache(f: &Func, cache: Option<&std::path::Path>) -> Result<CpuExecutable> {
        Self::compile_donating(f, &[], cache)
    }

    /// Compiles `f` for this CPU, where the parameters `p` with `donated[p]` are donated by the
    /// caller ([`CpuExecutable::call_donating`] passes them by value): kernels that can write
    /// their result into a donated buffer are compiled to do so (see [`crate::fuse::in_place`];
    /// `cargo xtask dump --stage plan` lists them).
    pub fn compile_donating(
        f: &Func,
        donated: &[bool],
        cache: Option<&std::path::Path>,
    ) -> Result<CpuExecutable> {
        kiln_ir::verify(f).map_err(|e| Error::Args(e.to_string()))?;
        // A cache directory others could write is not used (it warns once).
        let cache = cache.filter(|d| crate::cache::usable(d));
        if std::env::var("KILN_EXPLAIN").is_ok_and(|v| v == "1") {
            eprintln!(
                "// kiln: fused kernels of @{}\n{}",
                f.name,
                describe_fusion(f)?
            );
        }
        let mut clock = PhaseClock::new(&f.name);
        let (scheduled, fused, lowered_from_cache) =
            lowering::lowered(f, donated, cache, &mut clock)?;
        let f = &scheduled;
        let ks = &fused.kernels;
        let steps = steps_of(f, &fused);
        let in_place = crate::fuse::in_place(f, &fused, &steps, donated);
        if std::env::var("KILN_EXPLAIN").is_ok_and(|v| v == "1") {
            for (i, pairs) in in_place.iter().enumerate() {
                for &(q, o) in pairs {
                    let r = if o == 0 {
                        f.insts[i].results[0]
                    } else {
                        fused.extra[i][o - 1]
                    };
                    eprintln!(
                        "// kiln: k{i} writes {r} in place of donated {}",
                        fused.operands[i][q]
                    );
                }
            }
        }
        let aliases: Vec<Alias> = in_place
            .iter()
            .zip(fused.operands.iter().zip(&fused.extra))
            .map(|(pairs, (ops, extra))| (pairs.clone(), ops.len() + extra.len()))
            .collect();
        let (first, own) = distinct_kernels(ks, &aliases);
        let context = Box::new(Context::create());
        // SAFETY: the context is boxed (its address is stable) and is dropped after the engine
        // and every value derived from it (field order of CpuExecutable).
        let ctx: &'static Context = unsafe { &*(context.as_ref() as *const Context) };
        let mut kernels_fns = vec![None; f.insts.len()];
        let shape = ks
            .iter()
            .map(|k| {
                k.as_ref()
                    .map(|k| kernel_shape(k, wide_vectors(true)))
                    .unwrap_or_default()
            })
            .collect();
        let names: Vec<String> = (0..own.len())
            .filter(|&i| own[i].is_some())
            .map(|i| format!("k{i}"))
            .collect();
        // Functions that are slow to compile go through the on-disk cache: a GEMM, 8 kernels or
        // more, or kernels whose compile weight (see `CACHE_WEIGHT`) is large.
        let mut module = None;
        let cacheable = ks
            .iter()
            .flatten()
            .any(|k| matches!(k.schedule, Schedule::Gemm { .. }))
            || names.len() >= 8
            || (cache.is_some() && {
                let m = build_module(ctx, f, &own, true, &aliases, Routines::Here)?;
                let n = instruction_count(&m);
                let costly = own.iter().flatten().map(costly_ops).sum::<usize>();
                module = Some(m);
                clock.lap(&format!(
                    "emit LLVM IR ({n} instructions, {costly} costly operations)"
                ));
                n + COSTLY_WEIGHT * costly >= CACHE_WEIGHT
            });
        let mut library = None;
        let mut from_cache = false;
        if cacheable && let Some(dir) = cache {
            match compile_cached(f, &own, &aliases, dir, &names) {
                Ok((lib, hit)) => {
                    clock.lap(if hit {
                        "load from the kernel cache"
                    } else {
                        "LLVM O2, object code, link (stored in the kernel cache)"
                    });
                    for (i, k) in own.iter().enumerate() {
                        if k.is_some() {
                            let p = lib.symbol(&format!("k{i}")).ok_or_else(|| {
                                Error::Llvm(format!("kernel k{i} missing from the library"))
                            })?;
                            // SAFETY: every kernel was emitted with this signature.
                            kernels_fns[i] = Some(unsafe {
                                std::mem::transmute::<*const std::ffi::c_void, KernelFn>(p)
                            });
                        }
                    }
                    library = Some(lib);
                    from_cache = hit;
                }
                Err(e) => warn_cache_off(&e),
            }
        }
        let engine = if library.is_none() && own.iter().any(Option::is_some) {
            let m = match module.take() {
                Some(m) => m,
                None => {
                    let m = build_module(ctx, f, &own, true, &aliases, Routines::Here)?;
                    clock.lap("emit LLVM IR");
                    m
                }
            };
            crate::optimize(&m, &crate::host_machine()?)?;
            clock.lap("LLVM O2");
            let ee = m
                .create_jit_execution_engine(OptimizationLevel::Aggressive)
                .map_err(llvm)?;
            for (i, k) in own.iter().enumerate() {
                if k.is_some() {
                    // SAFETY: every kernel was emitted with this signature.
                    let jf =
                        unsafe { ee.get_function::<KernelFn>(&format!("k{i}")) }.map_err(llvm)?;
                    kernels_fns[i] = Some(unsafe { jf.into_raw() });
                }
            }
            clock.lap("machine code (JIT)");
            Some(ee)
        } else {
            None
        };
        for i in 0..ks.len() {
            kernels_fns[i] = kernels_fns[first[i]];
        }
        // SAFETY: each kernel was emitted for its instruction's operand and result types,
        // writes its whole result (its rows when split), uses the scratch its launch names, and
        // lives in the engine, which the executable keeps alive as long as the program.
        // Kernels compiled in place read their donated operand through the output pointer only
        // (crate::fuse::in_place checked it is their last use, at their own positions).
        let program = unsafe {
            Program::new(
                f.clone(),
                steps,
                kernels_fns,
                shape,
                fused.operands,
                in_place,
                fused.extra,
            )
        };
        Ok(CpuExecutable {
            program,
            _engine: engine,
            _library: library,
            from_cache,
            lowered_from_cache,
            functions: own.iter().flatten().count(),
            _context: context,
        })
    }

    /// How each instruction runs.
    pub fn plan(&self) -> &[Step] {
        self.program.plan()
    }

    /// Whether the kernels were loaded from the on-disk cache (see [`crate::cache`]).
    pub fn loaded_from_cache(&self) -> bool {
        self.from_cache
    }

    /// Whether the optimized, canonicalized and scheduled program came from the kernel cache's
    /// index of input programs (see [`crate::cache`]), so the optimizer did not run.
    pub fn lowered_from_cache(&self) -> bool {
        self.lowered_from_cache
    }

    /// Whether the kernels run from a library of the kernel cache (loaded, or compiled and
    /// stored by this call), rather than from the JIT: false for functions the cache does not
    /// take, without a cache, or when building the library failed (which prints a warning).
    pub fn in_kernel_cache(&self) -> bool {
        self._library.is_some()
    }

    /// How many kernel functions were compiled: one per kernel, except that a kernel equal to
    /// an earlier one (the same body over the same types, the same in-place outputs) runs the
    /// earlier one's function.
    pub fn kernel_functions(&self) -> usize {
        self.functions
    }

    /// Where the intermediates live.
    pub fn memory_plan(&self) -> &kiln_runtime::plan::MemoryPlan {
        self.program.memory_plan()
    }

    /// Runs on arguments of the function's parameter types.
    pub fn run(&self, args: &[Literal]) -> Result<Vec<Literal>> {
        self.program.run(args).map_err(|e| Error::Args(e.0))
    }

    /// Runs on borrowed arguments of the function's parameter types: arguments are read in
    /// place, and results move out of the executable without a copy.
    pub fn call(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        self.program.call(args).map_err(|e| Error::Args(e.0))
    }

    /// Runs like [`CpuExecutable::call`], where arguments passed by value are donated: results
    /// of kernels compiled in place on them (see [`CpuExecutable::compile_donating`]) are
    /// written into their buffers.
    pub fn call_donating(&self, args: Vec<std::borrow::Cow<'_, Literal>>) -> Result<Vec<Literal>> {
        self.program
            .call_donating(args)
            .map_err(|e| Error::Args(e.0))
    }
}

/// The blocking of GEMM kernel `k` and whether its threads split columns: blocks of whole
/// rows, split by rows, when its epilogue reduces over rows ([`crate::fuse::row_epilogue`]).
fn gemm_blocking(k: &Kernel, wide: bool) -> Option<(gemm::Blocking, bool)> {
    let Schedule::Gemm {
        batch,
        m,
        n,
        k: kk,
        ref chain,
        ..
    } = k.schedule
    else {
        return None;
    };
    let bl = gemm::Blocking::new(k.out.dtype, wide, n);
    Some(
        if let Some(c) = chain.as_ref().filter(|c| c.online.is_some()) {
            (bl.online(kk, chain_blocking(k, c, wide)), false)
        } else if chain.is_some() {
            (bl.whole_rows(n).chained(n, kk), false)
        } else if crate::fuse::row_epilogue(k) {
            (bl.whole_rows(n), false)
        } else {
            (bl, bl.split_columns(batch, m, n, kk))
        },
    )
}

/// The blocking of GEMM kernel `k`'s chained product `c` (see [`crate::kernel::Chain`]).
fn chain_blocking(k: &Kernel, c: &crate::kernel::Chain, wide: bool) -> gemm::Blocking {
    gemm::Blocking::new(k.out.dtype, wide, c.n)
}

/// How the runtime calls `k` when compiled with 512-bit vectors (`wide`) or not.
fn kernel_shape(k: &Kernel, wide: bool) -> Launch {
    let mut scratch = 0;
    let (rows, work) = match k.schedule {
        Schedule::Gemm {
            batch,
            m,
            n,
            k: kk,
            ref chain,
            ..
        } => {
            let (bl, split_columns) = gemm_blocking(k, wide).expect("a GEMM kernel");
            scratch = match chain {
                None => bl.scratch_bytes(n as i64),
                Some(c) => {
                    bl.chain_scratch(
                        n as i64,
                        chain_blocking(k, c, wide),
                        c.n as i64,
                        c.online.is_some().then_some(m as i64),
                    )
                    .bytes
                }
            };
            let rows = if split_columns {
                (n as i64 + bl.nr() - 1) as usize / bl.nr() as usize
            } else {
                batch * m
            };
            let chained = chain.as_ref().map_or(0, |c| batch * m * c.n * n);
            (rows, batch * m * n * kk + chained)
        }
        Schedule::Nest => (
            k.out.shape.first().copied().unwrap_or(1),
            k.out.numel()
                * (reduction_work(&k.body)
                    + k.extra
                        .iter()
                        .map(|x| reduction_work(&x.body))
                        .sum::<usize>()),
        ),
        // Updates may hit the same position: one thread, in order.
        Schedule::Scatter { .. } | Schedule::SelectScatter { .. } => (1, 1),
    };
    Launch {
        rows,
        work,
        scratch,
        // A GEMM chunk packs its whole share of the operand it does not split: one chunk per
        // thread.
        chunks_per_thread: if scratch > 0 { 1 } else { 4 },
    }
}

/// Whether kernels use 512-bit vectors: when compiled for a host with AVX-512 (machine-
/// independent dumps assume 256-bit ones).
///
/// `KILN_VECTOR_BITS=256` in the environment keeps 256-bit vectors on an AVX-512 host (the
/// blocking of AVX2 machines), so that path can be tested and measured here too.
fn wide_vectors(for_host: bool) -> bool {
    static NARROW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let narrow =
        *NARROW.get_or_init(|| std::env::var("KILN_VECTOR_BITS").is_ok_and(|v| v == "256"));
    for_host && !narrow && crate::host_cpu().1.split(',').any(|f| f == "+avx512f")
}

/// Total work of one output element: the product of the reduction extents in the body.
fn reduction_work(e: &Expr) -> usize {
    match e {
        Expr::Reduce { vars, body, .. } => {
            vars.iter().map(|v| v.1).product::<usize>().max(1) * reduction_work(body)
        }
        Expr::Op { args, .. } => args.iter().map(reduction_work).max().unwrap_or(1),
        Expr::Guard {
            then, otherwise, ..
        } => reduction_work(then).max(reduction_work(otherwise)),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exponentials of `src`'s kernels proven to take no positive argument, and all of
    /// them.
    fn nonpositive_count(src: &str) -> (usize, usize) {
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let fused = fused_kernels(&f);
        let (mut proven, mut all) = (0, 0);
        for k in fused.kernels.iter().flatten() {
            let mut keys = std::collections::HashSet::new();
            let mut extents: Vec<Option<usize>> = k.out.shape.iter().map(|&e| Some(e)).collect();
            nonpositive_exps(&k.body, &mut extents, &mut keys);
            proven += keys.len();
            crate::kernel::visit(&k.body, &mut |e| {
                if let Expr::Op {
                    op: Ew::Kind(OpKind::Exponential),
                    ..
                } = e
                {
                    all += 1;
                }
            });
        }
        (proven, all)
    }

    fn softmax_like(prefix: &str, max_of: &str, arg: &str) -> String {
        format!(
            "func @main(%0: f32[4,16], %1: f32[4,16]) -> f32[4,16] {{\n{prefix}  %m = constant {{value = -inf}} : f32[]\n  %r = reduce {max_of}, %m {{dimensions = [1], kind = max}} : f32[4]\n  %b = broadcast_in_dim %r {{broadcast_dimensions = [0]}} : f32[4,16]\n  %d = subtract {arg} : f32[4,16]\n  %e = exponential %d : f32[4,16]\n  return %e\n}}\n"
        )
    }

    #[test]
    fn exponentials_of_a_difference_from_the_maximum_are_proven_nonpositive() {
        // exp(x - max(x)) over the row holding x: proven.
        assert_eq!(nonpositive_count(&softmax_like("", "%0", "%0, %b")), (1, 1));
        // The softmax of a scaled product, with a stop-gradient's bit-cast round trip around
        // the maximum (attention's form): both exponentials, in the sum and in the outputs.
        let attention = "func @main(%0: f32[2,16,8], %1: f32[2,16,8]) -> f32[2,16,16] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]} : f32[2,16,16]\n  %3 = constant {value = -inf} : f32[]\n  %4 = reduce %2, %3 {dimensions = [2], kind = max} : f32[2,16]\n  %5 = bitcast_convert %4 : u32[2,16]\n  %6 = bitcast_convert %5 : f32[2,16]\n  %7 = broadcast_in_dim %6 {broadcast_dimensions = [0, 1]} : f32[2,16,16]\n  %8 = subtract %2, %7 : f32[2,16,16]\n  %9 = exponential %8 : f32[2,16,16]\n  %10 = constant {value = 0.0} : f32[]\n  %11 = reduce %9, %10 {dimensions = [2], kind = add} : f32[2,16]\n  %12 = broadcast_in_dim %11 {broadcast_dimensions = [0, 1]} : f32[2,16,16]\n  %13 = divide %9, %12 : f32[2,16,16]\n  return %13\n}\n";
        assert_eq!(nonpositive_count(attention), (2, 2));
    }

    #[test]
    fn other_exponentials_are_not_proven_nonpositive() {
        // The maximum of another tensor.
        assert_eq!(nonpositive_count(&softmax_like("", "%1", "%0, %b")).0, 0);
        // The difference the other way round.
        assert_eq!(nonpositive_count(&softmax_like("", "%0", "%b, %0")).0, 0);
        // The maximum over half the row: x's position may lie outside it.
        let half = "  %h = slice %0 {start_indices = [0, 0], limit_indices = [4, 8], strides = [1, 1]} : f32[4,8]\n";
        assert_eq!(nonpositive_count(&softmax_like(half, "%h", "%0, %b")).0, 0);
        // A minimum, not a maximum.
        let min = softmax_like("", "%0", "%0, %b").replace("kind = max", "kind = min");
        assert_eq!(nonpositive_count(&min).0, 0);
    }
}

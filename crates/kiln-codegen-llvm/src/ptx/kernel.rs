//! One launch ([`GpuKernel`]) as an LLVM function with the PTX kernel calling convention
//! (an `.entry`): statement by statement, as the emulator runs them.

use super::entry_name;
use crate::common::libm::Library;
use crate::common::scalar::Scalar;
use crate::common::{Base, llvm};
use crate::{Error, Result, storage};
use inkwell::AddressSpace;
use inkwell::IntPredicate;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue,
};
use kiln_ir::{Combiner, DType};
use kiln_kernel::gpu::ir::Sc;
use kiln_kernel::gpu::ir::{Buf, GpuKernel, SharedArray, Shuffle, Special, Stmt};
use std::cell::RefCell;

/// The PTX kernel calling convention (`PTX_Kernel`): the function is an `.entry`.
const PTX_KERNEL: u32 = 71;

/// The most static shared memory PTX lets a block declare, as ptxas checks it (a fact of the
/// ISA, as warps of 32 are): a launch whose arrays take more must hold them in dynamic shared
/// memory, as the mapping decides ([`GpuKernel::dynamic_shared`]).
const STATIC_SHARED_BYTES: usize = 48 << 10;

/// The emitter of one launch.
pub(super) struct Emit<'a, 'c> {
    pub(super) ctx: &'c Context,
    pub(super) m: &'a Module<'c>,
    pub(super) b: Builder<'c>,
    pub(super) f: FunctionValue<'c>,
    pub(super) k: &'a GpuKernel,
    /// The launch's inputs, then its outputs, then its tensor maps.
    pub(super) params: Vec<PointerValue<'c>>,
    /// Where each shared array starts (a global of its own, or an offset in the dynamic one).
    shared: Vec<PointerValue<'c>>,
    /// The kernel loop variables' slots (i64).
    pub(super) vars: Vec<PointerValue<'c>>,
    /// Where stack slots go (the entry block, ahead of the body).
    slots: Builder<'c>,
    /// Each register's slot per type it is written in.
    regs: RefCell<Vec<(usize, BasicTypeEnum<'c>, PointerValue<'c>)>>,
    /// The type each register was last written in.
    reg_ty: RefCell<Vec<Option<BasicTypeEnum<'c>>>>,
    /// The type of each register's first write in program order.
    first_types: Vec<Option<BasicTypeEnum<'c>>>,
    /// The value registers the expression being evaluated reads as extra inputs.
    pub(super) scalars: RefCell<Vec<BasicValueEnum<'c>>>,
    /// The arguments of the fold body being applied ([`kiln_kernel::kernel::Expr::Arg`]).
    pub(super) args: RefCell<Vec<BasicValueEnum<'c>>>,
}

impl<'c> Base<'c> for Emit<'_, 'c> {
    fn ctx(&self) -> &'c Context {
        self.ctx
    }

    fn module(&self) -> &Module<'c> {
        self.m
    }

    fn builder(&self) -> &Builder<'c> {
        &self.b
    }

    fn libm_call(&self, name: &str, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        self.library(name, d, x)?.ok_or_else(|| {
            Error::Unsupported(format!("`{name}` on {d} has no GPU implementation yet"))
        })
    }

    fn inline_library(&self) -> bool {
        true
    }

    fn constant_space(&self) -> AddressSpace {
        // PTX's constant state space.
        AddressSpace::from(4u16)
    }
}

/// Adds launch `k` to `m` as an `.entry` taking its inputs' and outputs' pointers.
pub(super) fn emit<'c>(ctx: &'c Context, m: &Module<'c>, k: &GpuKernel) -> Result<()> {
    if k.warp != 32 {
        return Err(Error::Unsupported(format!(
            "{}: a warp of {} threads (PTX warps have 32)",
            k.name, k.warp
        )));
    }
    if k.dynamic_shared == 0 && k.shared_bytes() > STATIC_SHARED_BYTES {
        return Err(Error::Unsupported(format!(
            "{}: {} bytes of shared memory per block (static shared memory holds {})",
            k.name,
            k.shared_bytes(),
            STATIC_SHARED_BYTES
        )));
    }
    let global = ctx.ptr_type(AddressSpace::from(1u16));
    let bufs: Vec<Buf> = k.inputs.iter().chain(&k.outputs).map(|b| b.0).collect();
    // The buffers' global pointers, then each tensor map as a `.param .align 64 .b8 [128]`
    // (a pointer to it, `byval`, read where it lies: `__grid_constant__`).
    let generic = ctx.ptr_type(AddressSpace::default());
    let params: Vec<inkwell::types::BasicMetadataTypeEnum> = bufs
        .iter()
        .map(|_| global.into())
        .chain(k.tensor_maps.iter().map(|_| generic.into()))
        .collect();
    let name = entry_name(k);
    let f = m.add_function(&name, ctx.void_type().fn_type(&params, false), None);
    f.set_call_conventions(PTX_KERNEL);
    // The launch's exact block size (`.reqntid`), so ptxas fits registers to it.
    f.add_attribute(
        AttributeLoc::Function,
        ctx.create_string_attribute("nvvm.reqntid", &k.block.to_string()),
    );
    let noalias = ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("noalias"), 0);
    // Every buffer starts at an arena offset, a multiple of `ALIGN`, in an allocation the
    // driver aligns further: vector loads and stores of consecutive elements need no checks.
    let align = ctx.create_enum_attribute(
        Attribute::get_named_enum_kind_id("align"),
        kiln_kernel::plan::ALIGN as u64,
    );
    for i in 0..bufs.len() {
        f.add_attribute(AttributeLoc::Param(i as u32), align);
    }
    for (i, b) in bufs.iter().enumerate() {
        // A buffer passed once may be marked as not aliasing the others.
        if bufs.iter().filter(|o| *o == b).count() == 1 {
            f.add_attribute(AttributeLoc::Param(i as u32), noalias);
        }
    }
    super::tma::tensor_map_params(ctx, f, bufs.len(), k.tensor_maps.len());
    let align = k.shared_alignment();
    let shared = if k.dynamic_shared > 0 {
        dynamic_shared(ctx, m, k, &name)?
    } else {
        k.shared
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let t = shared_type(ctx, a).array_type(a.len as u32);
                let g = m.add_global(
                    t,
                    Some(AddressSpace::from(3u16)),
                    &format!("{name}_shared{i}"),
                );
                g.set_linkage(Linkage::Internal);
                g.set_initializer(&t.get_undef());
                // 16 bytes: the widest `cp.async` and every `ldmatrix` row address need it;
                // 1024 where a `wgmma` descriptor's swizzle works on the address.
                g.set_alignment(align[i] as u32);
                g.as_pointer_value()
            })
            .collect()
    };
    let entry = ctx.append_basic_block(f, "entry");
    let body = ctx.append_basic_block(f, "body");
    let slots = ctx.create_builder();
    slots.position_at_end(entry);
    let b = ctx.create_builder();
    b.position_at_end(body);
    let i64t = ctx.i64_type();
    let mut vars = Vec::with_capacity(k.vars);
    for _ in 0..k.vars {
        let v = slots.build_alloca(i64t, "var").map_err(llvm)?;
        slots.build_store(v, i64t.const_zero()).map_err(llvm)?;
        vars.push(v);
    }
    let em = Emit {
        ctx,
        m,
        b,
        f,
        k,
        params: (0..bufs.len() + k.tensor_maps.len())
            .map(|i| {
                f.get_nth_param(i as u32)
                    .expect("declared")
                    .into_pointer_value()
            })
            .collect(),
        shared,
        vars,
        slots,
        regs: RefCell::new(Vec::new()),
        reg_ty: RefCell::new(vec![None; k.regs]),
        first_types: Vec::new(),
        scalars: RefCell::new(Vec::new()),
        args: RefCell::new(Vec::new()),
    };
    let mut first = vec![None; k.regs];
    em.first_writes(&k.body, &mut first);
    let em = Emit {
        first_types: first,
        ..em
    };
    em.stmts(&k.body)?;
    em.b.build_return(None).map_err(llvm)?;
    em.slots.build_unconditional_branch(body).map_err(llvm)?;
    Ok(())
}

/// The shared arrays of `k` in one dynamic shared array (`.extern .shared .align 16 .b8
/// NAME_dynamic_shared[]`, sized by the launch), each at its [`GpuKernel::shared_offsets`].
fn dynamic_shared<'c>(
    ctx: &'c Context,
    m: &Module<'c>,
    k: &GpuKernel,
    name: &str,
) -> Result<Vec<PointerValue<'c>>> {
    let (offsets, bytes) = k.shared_offsets();
    if bytes > k.dynamic_shared {
        return Err(Error::Unsupported(format!(
            "{}: shared arrays of {bytes} bytes in {} bytes of dynamic shared memory",
            k.name, k.dynamic_shared
        )));
    }
    let i8t = ctx.i8_type();
    let g = m.add_global(
        i8t.array_type(0),
        Some(AddressSpace::from(3u16)),
        &format!("{name}_dynamic_shared"),
    );
    g.set_linkage(Linkage::External);
    // Each array at its offset from here, aligned as `GpuKernel::shared_alignment` says.
    g.set_alignment(k.shared_alignment().into_iter().max().unwrap_or(16) as u32);
    let base = g.as_pointer_value();
    offsets
        .iter()
        .map(|&at| {
            // SAFETY: every offset lies within the dynamic array the launch sizes.
            Ok(unsafe { base.const_gep(i8t, &[ctx.i64_type().const_int(at as u64, false)]) })
        })
        .collect()
}

/// How a shared array holds its elements (f16 and bf16 as f32 unless packed, pred as a
/// byte).
fn shared_type<'c>(ctx: &'c Context, a: &SharedArray) -> BasicTypeEnum<'c> {
    match a.dtype {
        DType::F16 if a.packed => ctx.f16_type().into(),
        DType::BF16 if a.packed => ctx.bf16_type().into(),
        DType::F16 | DType::BF16 | DType::F32 => ctx.f32_type().into(),
        d => storage(ctx, d),
    }
}

impl<'a, 'c> Emit<'a, 'c> {
    pub(super) fn err<T>(&self, what: String) -> Result<T> {
        Err(Error::Llvm(format!("{}: {what}", self.k.name)))
    }

    /// The type a register holding a value of `d` has.
    pub(super) fn reg_type(&self, d: DType) -> BasicTypeEnum<'c> {
        if d.is_float() && d.mini().is_none() {
            self.ftype(d).into()
        } else {
            self.itype(d).into()
        }
    }

    pub(super) fn i64c(&self, v: i64) -> IntValue<'c> {
        self.ctx.i64_type().const_int(v as u64, true)
    }

    /// A stack slot of type `t` in the entry block.
    pub(super) fn slot(&self, t: BasicTypeEnum<'c>) -> Result<PointerValue<'c>> {
        self.slots.build_alloca(t, "slot").map_err(llvm)
    }

    pub(super) fn write(&self, r: usize, v: BasicValueEnum<'c>) -> Result<()> {
        let t = v.get_type();
        let p = self.reg_slot(r, t)?;
        self.b.build_store(p, v).map_err(llvm)?;
        self.reg_ty.borrow_mut()[r] = Some(t);
        Ok(())
    }

    pub(super) fn read(&self, r: usize) -> Result<BasicValueEnum<'c>> {
        let last = self.reg_ty.borrow().get(r).copied().flatten();
        // A register read before any write in program order (set in a later statement of a
        // loop) is read in the type its first write has, from a slot holding zero until then,
        // as the emulator's registers start at zero.
        let Some(t) = last.or_else(|| self.first_types.get(r).copied().flatten()) else {
            return self.err(format!("register {r} is read but never written"));
        };
        let p = self.reg_slot(r, t)?;
        self.b.build_load(t, p, "r").map_err(llvm)
    }

    /// Register `r`'s slot for values of type `t` (zero until written).
    fn reg_slot(&self, r: usize, t: BasicTypeEnum<'c>) -> Result<PointerValue<'c>> {
        let found = self
            .regs
            .borrow()
            .iter()
            .find(|(q, u, _)| *q == r && *u == t)
            .map(|e| e.2);
        if let Some(p) = found {
            return Ok(p);
        }
        let p = self.slot(t)?;
        self.slots.build_store(p, t.const_zero()).map_err(llvm)?;
        self.regs.borrow_mut().push((r, t, p));
        Ok(p)
    }

    /// Register `r` as an i64 (an integer register, or a value register as the emulator
    /// reads it as an integer).
    fn read_int(&self, r: usize) -> Result<IntValue<'c>> {
        let v = self.read(r)?;
        let i64t = self.ctx.i64_type();
        Ok(match v {
            BasicValueEnum::IntValue(i) => match i.get_type().get_bit_width() {
                64 => i,
                1 => self.b.build_int_z_extend(i, i64t, "z").map_err(llvm)?,
                _ => self.b.build_int_s_extend(i, i64t, "s").map_err(llvm)?,
            },
            BasicValueEnum::FloatValue(x) => self
                .b
                .build_float_to_signed_int(x, i64t, "i")
                .map_err(llvm)?,
            _ => return self.err(format!("register {r} is no number")),
        })
    }

    /// Calls the intrinsic `name` (not overloaded) on `args`.
    pub(super) fn nvvm(
        &self,
        name: &str,
        args: &[BasicMetadataValueEnum<'c>],
    ) -> Result<Option<BasicValueEnum<'c>>> {
        self.nvvm_of(name, &[], args)
    }

    /// Calls the intrinsic `name`, overloaded on `types`, on `args`.
    pub(super) fn nvvm_of(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'c>],
        args: &[BasicMetadataValueEnum<'c>],
    ) -> Result<Option<BasicValueEnum<'c>>> {
        let i = Intrinsic::find(name).ok_or_else(|| Error::Llvm(format!("no intrinsic {name}")))?;
        let decl = i
            .get_declaration(self.m, types)
            .ok_or_else(|| Error::Llvm(format!("cannot declare {name}")))?;
        Ok(self
            .b
            .build_call(decl, args, "n")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic())
    }

    fn sreg(&self, name: &str) -> Result<IntValue<'c>> {
        let v = self
            .nvvm(&format!("llvm.nvvm.read.ptx.sreg.{name}"), &[])?
            .ok_or_else(|| Error::Llvm(format!("{name} returned nothing")))?;
        self.b
            .build_int_z_extend(v.into_int_value(), self.ctx.i64_type(), name)
            .map_err(llvm)
    }

    fn special(&self, s: Special) -> Result<IntValue<'c>> {
        let warp = self.i64c(self.k.warp as i64);
        Ok(match s {
            Special::Thread => self.sreg("tid.x")?,
            Special::Block => self.sreg("ctaid.x")?,
            Special::BlockDim => self.sreg("ntid.x")?,
            Special::GridDim => self.sreg("nctaid.x")?,
            Special::Lane => self
                .b
                .build_int_unsigned_rem(self.sreg("tid.x")?, warp, "lane")
                .map_err(llvm)?,
            Special::Warp => self
                .b
                .build_int_unsigned_div(self.sreg("tid.x")?, warp, "warp")
                .map_err(llvm)?,
        })
    }

    /// A thread-level integer.
    pub(super) fn sc(&self, s: &Sc) -> Result<IntValue<'c>> {
        let b = &self.b;
        let i64t = self.ctx.i64_type();
        let flag = |c: IntValue<'c>| b.build_int_z_extend(c, i64t, "f").map_err(llvm);
        // A divisor of at least 1, as the emulator takes it.
        let divisor = |d: &Sc| -> Result<IntValue<'c>> {
            if let Sc::Const(c) = d {
                return Ok(self.i64c((*c).max(1)));
            }
            let v = self.sc(d)?;
            let small = b
                .build_int_compare(IntPredicate::SLT, v, self.i64c(1), "small")
                .map_err(llvm)?;
            Ok(b.build_select(small, self.i64c(1), v, "d")
                .map_err(llvm)?
                .into_int_value())
        };
        Ok(match s {
            Sc::Const(c) => self.i64c(*c),
            Sc::Special(sp) => self.special(*sp)?,
            Sc::Reg(r) => self.read_int(*r)?,
            Sc::Var(v) => b
                .build_load(i64t, self.vars[*v], "v")
                .map_err(llvm)?
                .into_int_value(),
            Sc::Add(x, y) => b
                .build_int_add(self.sc(x)?, self.sc(y)?, "a")
                .map_err(llvm)?,
            Sc::Mul(x, y) => b
                .build_int_mul(self.sc(x)?, self.sc(y)?, "m")
                .map_err(llvm)?,
            Sc::Div(x, y) => {
                let x = self.sc(x)?;
                b.build_int_signed_div(x, divisor(y)?, "q").map_err(llvm)?
            }
            Sc::Rem(x, y) => {
                let x = self.sc(x)?;
                b.build_int_signed_rem(x, divisor(y)?, "r").map_err(llvm)?
            }
            Sc::Lt(x, y) => flag(
                b.build_int_compare(IntPredicate::SLT, self.sc(x)?, self.sc(y)?, "lt")
                    .map_err(llvm)?,
            )?,
            Sc::Eq(x, y) => flag(
                b.build_int_compare(IntPredicate::EQ, self.sc(x)?, self.sc(y)?, "eq")
                    .map_err(llvm)?,
            )?,
            Sc::And(x, y) => {
                let x = self.nonzero(self.sc(x)?)?;
                let y = self.nonzero(self.sc(y)?)?;
                flag(b.build_and(x, y, "and").map_err(llvm)?)?
            }
        })
    }

    fn nonzero(&self, v: IntValue<'c>) -> Result<IntValue<'c>> {
        self.b
            .build_int_compare(IntPredicate::NE, v, v.get_type().const_zero(), "nz")
            .map_err(llvm)
    }

    /// The pointer and dtype of the launch's buffer `buf` (as statements name them).
    pub(super) fn buffer(&self, buf: Buf) -> Result<(PointerValue<'c>, DType)> {
        let n = self.k.inputs.len();
        let (i, d) = match buf {
            Buf::Input(i) => (i, self.k.inputs.get(i).map(|b| b.1.dtype)),
            Buf::Output(o) => (n + o, self.k.outputs.get(o).map(|b| b.1.dtype)),
            Buf::Scratch(_) => return self.err(format!("a statement names {buf}")),
        };
        match (self.params.get(i), d) {
            (Some(p), Some(d)) => Ok((*p, d)),
            _ => self.err(format!("no buffer {buf}")),
        }
    }

    /// Element `index` of global buffer `p` of `d`.
    pub(super) fn element(
        &self,
        p: PointerValue<'c>,
        d: DType,
        index: IntValue<'c>,
    ) -> Result<PointerValue<'c>> {
        // SAFETY: the mapping keeps every access in bounds (the emulator checks it).
        unsafe {
            self.b
                .build_in_bounds_gep(storage(self.ctx, d), p, &[index], "p")
        }
        .map_err(llvm)
    }

    /// Element `index` of input buffer `input` as a register value of `d`.
    pub(super) fn load_input(
        &self,
        input: usize,
        d: DType,
        index: IntValue<'c>,
    ) -> Result<BasicValueEnum<'c>> {
        let Some(&p) = self
            .params
            .get(input)
            .filter(|_| input < self.k.inputs.len())
        else {
            return self.err(format!("no input {input}"));
        };
        let at = self.element(p, d, index)?;
        let raw = self
            .b
            .build_load(storage(self.ctx, d), at, "x")
            .map_err(llvm)?;
        self.load_value(d, raw)
    }

    /// `v` as a register of `d` holds it (a value computed in another width, stored).
    pub(super) fn coerce(&self, v: BasicValueEnum<'c>, d: DType) -> Result<BasicValueEnum<'c>> {
        let t = self.reg_type(d);
        if v.get_type() == t {
            return Ok(v);
        }
        let b = &self.b;
        Ok(match (v, t) {
            (BasicValueEnum::FloatValue(x), BasicTypeEnum::FloatType(ft)) => {
                b.build_float_cast(x, ft, "c").map_err(llvm)?.into()
            }
            (BasicValueEnum::IntValue(x), BasicTypeEnum::IntType(it)) => {
                if it.get_bit_width() == 1 {
                    self.nonzero(x)?.into()
                } else {
                    b.build_int_cast_sign_flag(x, it, x.get_type().get_bit_width() > 1, "c")
                        .map_err(llvm)?
                        .into()
                }
            }
            _ => {
                return self.err(format!("a register of type {} stored as {d}", v.get_type()));
            }
        })
    }

    /// A shared array's element `index`.
    pub(super) fn shared_at(
        &self,
        array: usize,
        index: &Sc,
    ) -> Result<(PointerValue<'c>, BasicTypeEnum<'c>, DType)> {
        let Some(a) = self.k.shared.get(array) else {
            return self.err(format!("no shared array {array}"));
        };
        let et = shared_type(self.ctx, a);
        let t = et.array_type(a.len as u32);
        let mut i = self.sc(index)?;
        if let Some(s) = a.swizzle {
            // The element's 16-byte chunk (`2^e` elements: 8 packed 16-bit ones or 4 of 32
            // bits, as verified) moved within its group of 8 as `SharedArray::physical` says:
            // i ^ (((i >> (s + e)) & 7) << e).
            let e = u64::from(a.chunk_elems().trailing_zeros());
            let it = i.get_type();
            let key = self
                .b
                .build_right_shift(i, it.const_int(u64::from(s) + e, false), false, "swz")
                .map_err(llvm)?;
            let key = self
                .b
                .build_and(key, it.const_int(7, false), "swz")
                .map_err(llvm)?;
            let key = self
                .b
                .build_left_shift(key, it.const_int(e, false), "swz")
                .map_err(llvm)?;
            i = self.b.build_xor(i, key, "swz").map_err(llvm)?;
        }
        let g = self.shared[array];
        // SAFETY: the mapping keeps shared accesses in bounds (the emulator checks it).
        let p =
            unsafe { self.b.build_in_bounds_gep(t, g, &[self.i64c(0), i], "sh") }.map_err(llvm)?;
        Ok((p, et, a.dtype))
    }

    /// The address of a shared array's element `index` as it lies in memory (not through
    /// the array's swizzle).
    pub(super) fn shared_unswizzled(&self, array: usize, index: &Sc) -> Result<PointerValue<'c>> {
        let Some(a) = self.k.shared.get(array) else {
            return self.err(format!("no shared array {array}"));
        };
        let t = shared_type(self.ctx, a).array_type(a.len as u32);
        let i = self.sc(index)?;
        // SAFETY: the mapping keeps descriptors within their arrays (the emulator checks it).
        unsafe {
            self.b
                .build_in_bounds_gep(t, self.shared[array], &[self.i64c(0), i], "desc")
        }
        .map_err(llvm)
    }

    /// Records in `types` the type of each register's first write in `body`.
    fn first_writes(&self, body: &[Stmt], types: &mut Vec<Option<BasicTypeEnum<'c>>>) {
        let i64t: BasicTypeEnum = self.ctx.i64_type().into();
        for s in body {
            let (reg, t) = match s {
                Stmt::Let { reg, .. } => (*reg, Some(i64t)),
                Stmt::Eval { reg, expr, .. } => (*reg, Some(self.reg_type(expr.dtype()))),
                Stmt::Identity { reg, dtype, .. } => (*reg, Some(self.reg_type(*dtype))),
                Stmt::Combine { acc, dtype, .. } | Stmt::MulAdd { acc, dtype, .. } => {
                    (*acc, Some(self.reg_type(*dtype)))
                }
                Stmt::For { reg, body, .. } => {
                    if let Some(slot @ None) = types.get_mut(*reg) {
                        *slot = Some(i64t);
                    }
                    self.first_writes(body, types);
                    continue;
                }
                Stmt::If { body, .. } => {
                    self.first_writes(body, types);
                    continue;
                }
                Stmt::Load { reg, buf, .. } => {
                    let d = match *buf {
                        Buf::Input(i) => self.k.inputs.get(i),
                        Buf::Output(o) => self.k.outputs.get(o),
                        Buf::Scratch(_) => None,
                    };
                    (*reg, d.map(|b| self.reg_type(b.1.dtype)))
                }
                Stmt::SharedLoad { reg, array, .. } => (
                    *reg,
                    self.k.shared.get(*array).map(|a| self.reg_type(a.dtype)),
                ),
                Stmt::Shuffle { reg, src, .. } => (*reg, types.get(*src).copied().flatten()),
                Stmt::LdMatrix { regs, .. } => {
                    for &r in regs {
                        if let Some(slot @ None) = types.get_mut(r) {
                            *slot = Some(self.ctx.f32_type().into());
                        }
                    }
                    continue;
                }
                Stmt::RoundTf32 { reg } => (*reg, Some(self.ctx.f32_type().into())),
                Stmt::Mma { d, .. } => {
                    for &r in d {
                        if let Some(slot @ None) = types.get_mut(r) {
                            *slot = Some(self.ctx.f32_type().into());
                        }
                    }
                    continue;
                }
                Stmt::Wgmma { acc, .. } => {
                    for &r in acc {
                        if let Some(slot @ None) = types.get_mut(r) {
                            *slot = Some(self.ctx.f32_type().into());
                        }
                    }
                    continue;
                }
                Stmt::SetVar { .. }
                | Stmt::CopyAsync { .. }
                | Stmt::CopyCommit
                | Stmt::CopyWait { .. }
                | Stmt::WgmmaFence
                | Stmt::ProxyFence
                | Stmt::WgmmaCommit
                | Stmt::WgmmaWait { .. }
                | Stmt::MbarInit { .. }
                | Stmt::MbarArrive { .. }
                | Stmt::MbarWait { .. }
                | Stmt::MbarInval { .. }
                | Stmt::TmaLoad { .. }
                | Stmt::Store { .. }
                | Stmt::AtomicAdd { .. }
                | Stmt::SharedStore { .. }
                | Stmt::Barrier
                | Stmt::Note(_) => continue,
            };
            if let Some(slot @ None) = types.get_mut(reg) {
                *slot = t;
            }
        }
    }

    fn stmts(&self, body: &[Stmt]) -> Result<()> {
        for s in body {
            self.stmt(s)?;
        }
        Ok(())
    }

    pub(super) fn block(&self, name: &str) -> BasicBlock<'c> {
        self.ctx.append_basic_block(self.f, name)
    }

    fn stmt(&self, s: &Stmt) -> Result<()> {
        let b = &self.b;
        match s {
            Stmt::Let { reg, value } => self.write(*reg, self.sc(value)?.into())?,
            Stmt::SetVar { var, value } => {
                let Some(&slot) = self.vars.get(*var) else {
                    return self.err(format!("no loop variable {var}"));
                };
                b.build_store(slot, self.sc(value)?).map_err(llvm)?;
            }
            Stmt::Eval { reg, expr, scalars } => {
                let sc = scalars
                    .iter()
                    .map(|&r| self.read(r))
                    .collect::<Result<Vec<_>>>()?;
                let saved = self.scalars.replace(sc);
                let v = self.expr(expr);
                self.scalars.replace(saved);
                self.write(*reg, v?)?;
            }
            Stmt::Identity { reg, kind, dtype } => {
                self.write(*reg, self.identity(*kind, *dtype))?
            }
            Stmt::Combine {
                acc,
                value,
                kind,
                dtype,
            } => {
                let a = self.coerce(self.read(*acc)?, *dtype)?;
                let x = self.coerce(self.read(*value)?, *dtype)?;
                let c = self.combine_with(*kind, *dtype, a, x, false)?;
                self.write(*acc, c)?;
            }
            Stmt::MulAdd { acc, a, b, dtype } => {
                let ft: BasicTypeEnum = self.reg_type(*dtype);
                let z = self.coerce(self.read(*acc)?, *dtype)?;
                let x = self.coerce(self.read(*a)?, *dtype)?;
                let y = self.coerce(self.read(*b)?, *dtype)?;
                let r = self.intrinsic("llvm.fma", ft, &[x, y, z])?;
                self.write(*acc, r)?;
            }
            Stmt::For {
                reg,
                start,
                end,
                step,
                body,
            } => {
                self.write(*reg, self.sc(start)?.into())?;
                let head = self.block("for");
                let inside = self.block("body");
                let exit = self.block("done");
                b.build_unconditional_branch(head).map_err(llvm)?;
                b.position_at_end(head);
                let i = self.read_int(*reg)?;
                let more = b
                    .build_int_compare(IntPredicate::SLT, i, self.sc(end)?, "more")
                    .map_err(llvm)?;
                b.build_conditional_branch(more, inside, exit)
                    .map_err(llvm)?;
                b.position_at_end(inside);
                self.stmts(body)?;
                let i = self.read_int(*reg)?;
                let step = match step {
                    Sc::Const(c) => self.i64c((*c).max(1)),
                    s => {
                        let v = self.sc(s)?;
                        let small = b
                            .build_int_compare(IntPredicate::SLT, v, self.i64c(1), "small")
                            .map_err(llvm)?;
                        b.build_select(small, self.i64c(1), v, "step")
                            .map_err(llvm)?
                            .into_int_value()
                    }
                };
                let next = b.build_int_add(i, step, "next").map_err(llvm)?;
                self.write(*reg, next.into())?;
                b.build_unconditional_branch(head).map_err(llvm)?;
                b.position_at_end(exit);
            }
            Stmt::If { cond, body } => {
                let c = self.nonzero(self.sc(cond)?)?;
                let then = self.block("then");
                let merge = self.block("endif");
                b.build_conditional_branch(c, then, merge).map_err(llvm)?;
                b.position_at_end(then);
                self.stmts(body)?;
                b.build_unconditional_branch(merge).map_err(llvm)?;
                b.position_at_end(merge);
            }
            Stmt::Load { reg, buf, index } => {
                let (p, d) = self.buffer(*buf)?;
                let at = self.element(p, d, self.sc(index)?)?;
                let raw = b.build_load(storage(self.ctx, d), at, "x").map_err(llvm)?;
                self.write(*reg, self.load_value(d, raw)?)?;
            }
            Stmt::Store { buf, index, value } => {
                if !matches!(buf, Buf::Output(_)) {
                    return self.err(format!("a store to {buf}"));
                }
                let (p, d) = self.buffer(*buf)?;
                let v = self.coerce(self.read(*value)?, d)?;
                let at = self.element(p, d, self.sc(index)?)?;
                b.build_store(at, self.store_value(d, v)?).map_err(llvm)?;
            }
            Stmt::AtomicAdd { buf, index, value } => self.atomic_add(*buf, index, *value)?,
            Stmt::SharedLoad { reg, array, index } => {
                let (p, et, d) = self.shared_at(*array, index)?;
                let raw = b.build_load(et, p, "s").map_err(llvm)?;
                let v = if d == DType::Pred {
                    self.nonzero(raw.into_int_value())?.into()
                } else {
                    self.coerce(raw, d)?
                };
                self.write(*reg, v)?;
            }
            Stmt::SharedStore {
                array,
                index,
                value,
            } => {
                let (p, et, d) = self.shared_at(*array, index)?;
                let v = self.coerce(self.read(*value)?, d)?;
                let v = match (v, et) {
                    _ if d == DType::Pred || d.is_sub_byte() => self.store_value(d, v)?,
                    (BasicValueEnum::FloatValue(x), BasicTypeEnum::FloatType(ft))
                        if x.get_type() != ft =>
                    {
                        b.build_float_trunc(x, ft, "packed").map_err(llvm)?.into()
                    }
                    _ => v,
                };
                b.build_store(p, v).map_err(llvm)?;
            }
            Stmt::Barrier => self.barrier()?,
            Stmt::Note(_) => {}
            Stmt::Shuffle { reg, src, mode } => {
                let v = self.read(*src)?;
                self.write(*reg, self.shuffle(v, *mode)?)?;
            }
            Stmt::CopyAsync {
                array,
                index,
                buf,
                src,
                elems,
            } => self.copy_async(*array, index, *buf, src, *elems)?,
            Stmt::CopyCommit => self.copy_commit()?,
            Stmt::WgmmaFence => self.wgmma_fence()?,
            Stmt::ProxyFence => self.proxy_fence()?,
            Stmt::WgmmaCommit => self.wgmma_commit()?,
            Stmt::WgmmaWait { pending } => self.wgmma_wait(*pending)?,
            Stmt::Wgmma {
                acc,
                a,
                b,
                n,
                operand,
            } => self.wgmma(acc, (a, b), *n, *operand)?,
            Stmt::CopyWait { pending } => self.copy_wait(*pending)?,
            Stmt::MbarInit { bar, count } => self.mbar_init(bar, *count)?,
            Stmt::MbarArrive { bar, tx } => self.mbar_arrive(bar, *tx)?,
            Stmt::MbarWait { bar, parity } => self.mbar_wait(bar, parity)?,
            Stmt::MbarInval { bar } => self.mbar_inval(bar)?,
            Stmt::TmaLoad {
                map,
                array,
                index,
                coords,
                bar,
            } => self.tma_load(*map, *array, index, coords, bar)?,
            Stmt::LdMatrix {
                regs,
                array,
                row,
                trans,
            } => self.ldmatrix(regs, *array, row, *trans)?,
            Stmt::RoundTf32 { reg } => self.round_tf32(*reg)?,
            Stmt::Mma {
                d,
                a,
                b,
                c,
                shape,
                operand,
            } => self.mma(d, (a.as_slice(), b.as_slice()), c, *shape, *operand)?,
        }
        Ok(())
    }

    /// The identity of `kind` in `d`, as the emulator's `identity`.
    pub(super) fn identity(&self, kind: Combiner, d: DType) -> BasicValueEnum<'c> {
        if d.is_float() {
            let x = match kind {
                Combiner::Add | Combiner::Replace | Combiner::Or => -0.0,
                Combiner::Mul | Combiner::And => 1.0,
                Combiner::Max => f64::NEG_INFINITY,
                Combiner::Min => f64::INFINITY,
            };
            return self.ftype(d).const_float(x).into();
        }
        // As i64s: a u64's largest value is its bits, all ones.
        let (lo, hi) = d.int_bounds().expect("an integer dtype");
        let (lo, hi) = (lo as i64, hi as i64);
        let v = match kind {
            Combiner::Add | Combiner::Or | Combiner::Replace => 0,
            Combiner::Mul => 1,
            Combiner::And => -1,
            Combiner::Max => lo,
            Combiner::Min => hi,
        };
        let it = self.itype(d);
        if d == DType::Pred {
            it.const_int((v != 0) as u64, false).into()
        } else if d.is_sub_byte() {
            // The value's low bits, which is all an `i4` or `i2` holds.
            it.const_int(v as u64 & ((1 << d.bits()) - 1), false).into()
        } else {
            it.const_int(v as u64, true).into()
        }
    }

    /// `bar.sync 0`.
    fn barrier(&self) -> Result<()> {
        let aligned = "llvm.nvvm.barrier.cta.sync.aligned.all";
        if Intrinsic::find(aligned).is_some() {
            let zero = self.ctx.i32_type().const_zero();
            self.nvvm(aligned, &[zero.into()])?;
        } else {
            self.nvvm("llvm.nvvm.barrier0", &[])?;
        }
        Ok(())
    }

    /// `v` of the lane `mode` picks (`shfl.sync` over the full warp): 32-bit values in one
    /// shuffle, 64-bit ones as two, narrower ones widened.
    fn shuffle(&self, v: BasicValueEnum<'c>, mode: Shuffle) -> Result<BasicValueEnum<'c>> {
        let b = &self.b;
        let i32t = self.ctx.i32_type();
        let i64t = self.ctx.i64_type();
        let (how, n) = match mode {
            Shuffle::Xor(n) => ("bfly", n),
            Shuffle::Down(n) => ("down", n),
        };
        let call = |suffix: &str, x: BasicValueEnum<'c>| -> Result<BasicValueEnum<'c>> {
            let mask = i32t.const_all_ones();
            let lanes = i32t.const_int(n as u64, false);
            let clamp = i32t.const_int(0x1f, false);
            self.nvvm(
                &format!("llvm.nvvm.shfl.sync.{how}.{suffix}"),
                &[mask.into(), x.into(), lanes.into(), clamp.into()],
            )?
            .ok_or_else(|| Error::Llvm("a shuffle returned nothing".into()))
        };
        let wide = |x: IntValue<'c>| -> Result<IntValue<'c>> {
            let lo = b.build_int_truncate(x, i32t, "lo").map_err(llvm)?;
            let hi = b
                .build_right_shift(x, i64t.const_int(32, false), false, "hi")
                .map_err(llvm)?;
            let hi = b.build_int_truncate(hi, i32t, "hi").map_err(llvm)?;
            let lo = call("i32", lo.into())?.into_int_value();
            let hi = call("i32", hi.into())?.into_int_value();
            let lo = b.build_int_z_extend(lo, i64t, "lo").map_err(llvm)?;
            let hi = b.build_int_z_extend(hi, i64t, "hi").map_err(llvm)?;
            let hi = b
                .build_left_shift(hi, i64t.const_int(32, false), "hi")
                .map_err(llvm)?;
            b.build_or(hi, lo, "w").map_err(llvm)
        };
        Ok(match v {
            BasicValueEnum::FloatValue(x) if x.get_type() == self.ctx.f32_type() => call("f32", v)?,
            BasicValueEnum::FloatValue(x) => {
                let bits = b.build_bit_cast(x, i64t, "bits").map_err(llvm)?;
                let w = wide(bits.into_int_value())?;
                b.build_bit_cast(w, x.get_type(), "f").map_err(llvm)?
            }
            BasicValueEnum::IntValue(x) => match x.get_type().get_bit_width() {
                32 => call("i32", v)?,
                64 => wide(x)?.into(),
                _ => {
                    let z = b.build_int_z_extend(x, i32t, "z").map_err(llvm)?;
                    let s = call("i32", z.into())?.into_int_value();
                    b.build_int_truncate(s, x.get_type(), "t")
                        .map_err(llvm)?
                        .into()
                }
            },
            _ => return self.err("a shuffle of a value that is no number".into()),
        })
    }
}

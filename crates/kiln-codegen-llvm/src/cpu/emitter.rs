//! The emitter's core: values, loads and stores, vectors, expressions, reductions and
//! hoisting of a kernel's body (see [`Emitter`]).

use super::*;

impl<'c> Emitter<'c> {
    /// An emitter for the body of `f`, with `b` positioned in it and `inputs` as its pointer
    /// table.
    pub(super) fn new(
        ctx: &'c Context,
        m: &'c Module<'c>,
        b: Builder<'c>,
        f: FunctionValue<'c>,
        inputs: PointerValue<'c>,
        target: Target,
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
            scalef: wide_vectors(target),
            memo: Default::default(),
            in_order: Default::default(),
            facts: Default::default(),
            target,
            routines,
            nonpositive: Default::default(),
            exp_nonpositive: Default::default(),
            shifted: Default::default(),
            schedule: None,
        }
    }

    pub(super) fn ftype(&self, d: DType) -> FloatType<'c> {
        if d == DType::F64 {
            self.ctx.f64_type()
        } else {
            self.ctx.f32_type()
        }
    }

    pub(super) fn itype(&self, d: DType) -> IntType<'c> {
        match d {
            DType::Pred => self.ctx.bool_type(),
            DType::I8 | DType::U8 => self.ctx.i8_type(),
            DType::I32 | DType::U32 => self.ctx.i32_type(),
            DType::I64 | DType::F16 | DType::BF16 | DType::F32 | DType::F64 => self.ctx.i64_type(),
        }
    }

    pub(super) fn i64c(&self, v: i64) -> IntValue<'c> {
        self.ctx.i64_type().const_int(v as u64, true)
    }

    pub(super) fn intrinsic(
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
    pub(super) fn libm(&self, name: &str, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
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

    pub(super) fn var(&self, k: usize) -> Result<IntValue<'c>> {
        Ok(self
            .b
            .build_load(self.ctx.i64_type(), self.vars[k], "v")
            .map_err(llvm)?
            .into_int_value())
    }

    pub(super) fn load(
        &self,
        input: usize,
        d: DType,
        coef: &[i64],
        off: i64,
    ) -> Result<BasicValueEnum<'c>> {
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
    pub(super) fn load_at(
        &self,
        input: usize,
        d: DType,
        idx: IntValue<'c>,
    ) -> Result<BasicValueEnum<'c>> {
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
    pub(super) fn scope_input(&self, v: BasicValueEnum<'c>) -> Result<()> {
        self.scope(v.as_instruction_value(), false)
    }

    /// Puts `inst` in the inputs' scope (a load) or the extra outputs' (`extra`, a store),
    /// with no alias in the other.
    pub(super) fn scope(&self, inst: Option<InstructionValue<'c>>, extra: bool) -> Result<()> {
        let (Some(inst), Some((ins, outs))) = (inst, self.scopes.get()) else {
            return Ok(());
        };
        let (own, other) = if extra { (outs, ins) } else { (ins, outs) };
        inst.set_metadata(own, self.ctx.get_kind_id("alias.scope"))
            .map_err(llvm)?;
        inst.set_metadata(other, self.ctx.get_kind_id("noalias"))
            .map_err(llvm)
    }

    pub(super) fn load_value(
        &self,
        d: DType,
        raw: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>> {
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

    pub(super) fn store_value(
        &self,
        d: DType,
        v: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>> {
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

    pub(super) fn constant(&self, d: DType, x: f64) -> BasicValueEnum<'c> {
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
    pub(super) fn range_loop_ptr(
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
    pub(super) fn labeled_loop(
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
    pub(super) fn range_loop(
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
    pub(super) fn counted(
        &self,
        var: usize,
        extent: usize,
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        self.range_loop(var, self.i64c(0), self.i64c(extent as i64), 1, body)
    }

    /// `a` where `a p b` holds, else `b`: the larger (`SGT`) or smaller (`SLT`) of two signed
    /// integers.
    pub(super) fn int_pick(
        &self,
        p: IntPredicate,
        a: IntValue<'c>,
        b: IntValue<'c>,
    ) -> Result<IntValue<'c>> {
        let c = self.b.build_int_compare(p, a, b, "c").map_err(llvm)?;
        Ok(self
            .b
            .build_select(c, a, b, "p")
            .map_err(llvm)?
            .into_int_value())
    }

    /// The larger of two signed integers.
    pub(super) fn int_max(&self, a: IntValue<'c>, b: IntValue<'c>) -> Result<IntValue<'c>> {
        self.int_pick(IntPredicate::SGT, a, b)
    }

    /// The smaller of two signed integers.
    pub(super) fn int_min(&self, a: IntValue<'c>, b: IntValue<'c>) -> Result<IntValue<'c>> {
        self.int_pick(IntPredicate::SLT, a, b)
    }

    /// Whether the enclosing loops' facts decide condition `c`: `lo <= v + k < hi` holds at
    /// every value `v` can take here, or at none.
    pub(super) fn known(&self, c: &Cond) -> Option<bool> {
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
    /// [`KernelSchedule::segments`]), knowing in each that `var` lies in it.
    pub(super) fn segmented(
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
    pub(super) fn select_float(
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
    pub(super) fn swap_pointer_table(
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
    /// A reduction whose body computes something costly that the expressions also compute at
    /// their own position along the reduced axis (a softmax's exp(x - max), in its sum and in
    /// its outputs) keeps that value per position in a stack buffer as it reduces, where the
    /// kernel's loop schedule says so ([`KernelSchedule::row_caches`], decided by
    /// [`kiln_kernel::loop_schedule::row_caches`] for this `d`); the expressions then read the
    /// buffer instead of computing it again.
    pub(super) fn hoist<'e>(
        &self,
        bodies: impl Iterator<Item = &'e Expr>,
        d: usize,
    ) -> Result<usize> {
        let mark = self.hoisted.borrow().len();
        let bodies: Vec<&Expr> = bodies.collect();
        for r in bodies.iter().flat_map(|b| hoistable_reduces(b)) {
            if !free_vars(r).iter().all(|&v| v < d) || self.is_hoisted(r) {
                continue;
            }
            let cache = self.schedule.as_ref().and_then(|s| {
                s.row_caches
                    .iter()
                    .find(|c| c.at == d && c.reduce == value_key(r))
            });
            match cache {
                Some(plan) => self.hoist_caching(r, plan)?,
                None => self.hoist_one(r)?,
            }
        }
        Ok(mark)
    }

    /// Computes the reduction `r` (whose single variable is the one `plan` caches along),
    /// storing the value of `plan.part` at each position into a stack buffer, and makes both
    /// the reduction and the buffer available to the expressions emitted next.
    pub(super) fn hoist_caching(&self, r: &Expr, plan: &RowCache) -> Result<()> {
        let Expr::Reduce { vars, .. } = r else {
            return Ok(());
        };
        let ct = self.ftype(plan.part.dtype());
        let buf = self.line_buffer(ct.into(), plan.len)?;
        let part_key = value_key(&plan.part);
        let v = self.reduce(r, &mut |em: &Self| {
            let x = em.expr(&plan.part)?;
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
    pub(super) fn hoist_one(&self, e: &Expr) -> Result<()> {
        if !self.is_hoisted(e) {
            let v = self.expr(e)?;
            self.hoisted
                .borrow_mut()
                .push((value_key(e), Hoisted::Value(v)));
        }
        Ok(())
    }

    /// Whether `e` was computed ahead of the current code (see [`Self::hoist`]).
    pub(super) fn is_hoisted(&self, e: &Expr) -> bool {
        let hoisted = self.hoisted.borrow();
        !hoisted.is_empty() && {
            let key = value_key(e);
            hoisted.iter().any(|(k, _)| *k == key)
        }
    }

    /// `e`'s value if it was computed ahead of the current code (see [`Self::hoist`]): the
    /// value itself, or a row cache's element at the current position.
    pub(super) fn hoisted_value(&self, e: &Expr) -> Result<Option<BasicValueEnum<'c>>> {
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
                // (`kiln_kernel::loop_schedule::row_cache` checks the extents).
                let p = unsafe { self.b.build_in_bounds_gep(ct, buf, &[self.var(var)?], "rc") }
                    .map_err(llvm)?;
                Ok(Some(self.b.build_load(ct, p, "cached").map_err(llvm)?))
            }
        }
    }

    /// The flat position `Σ var(d) * strides[d]` of the current loop variables.
    pub(super) fn position(&self, strides: &[usize]) -> Result<IntValue<'c>> {
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
    pub(super) fn entry_alloca(&self, ty: BasicTypeEnum<'c>) -> Result<PointerValue<'c>> {
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
    pub(super) fn line_buffer(
        &self,
        st: BasicTypeEnum<'c>,
        len: usize,
    ) -> Result<PointerValue<'c>> {
        let buf =
            self.entry_alloca(inkwell::types::BasicType::array_type(&st, len as u32).into())?;
        buf.as_instruction()
            .ok_or_else(|| Error::Llvm("an alloca is an instruction".into()))?
            .set_alignment(self.target.cache_line as u32)
            .map_err(llvm)?;
        Ok(buf)
    }

    pub(super) fn idx(&self, i: &Idx) -> Result<IntValue<'c>> {
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
                } else if !d.is_signed() {
                    b.build_int_z_extend(v, i64t, "z").map_err(llvm)?
                } else {
                    b.build_int_s_extend(v, i64t, "s").map_err(llvm)?
                }
            }
        })
    }

    pub(super) fn cond(&self, c: &Cond) -> Result<IntValue<'c>> {
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

    pub(super) fn expr(&self, e: &Expr) -> Result<BasicValueEnum<'c>> {
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
    pub(super) fn reduce(
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
    pub(super) fn nest(
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

    pub(super) fn combine(
        &self,
        kind: Combiner,
        d: DType,
        a: BasicValueEnum<'c>,
        x: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>> {
        self.combine_with(kind, d, a, x, true)
    }

    /// [`Emitter::combine`], with float sums and products marked reassociable or not.
    pub(super) fn combine_with(
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

    pub(super) fn op(
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

    pub(super) fn float_op(
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
            OpKind::Atan2 => intr("llvm.atan2")?,
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
            OpKind::Tan => intr("llvm.tan")?,
            OpKind::Cbrt => self.libm("cbrt", d, x)?.into(),
            OpKind::Erf => self.erf_fast(d, x)?.into(),
            OpKind::Floor => intr("llvm.floor")?,
            OpKind::Ceil => intr("llvm.ceil")?,
            OpKind::RoundNearestAfz => intr("llvm.round")?,
            OpKind::RoundNearestEven => intr("llvm.roundeven")?,
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
    pub(super) fn int_pow(
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

    pub(super) fn int_op(
        &self,
        k: OpKind,
        d: DType,
        v: &[BasicValueEnum<'c>],
    ) -> Result<BasicValueEnum<'c>> {
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
            OpKind::ShiftRightArithmetic => {
                // Amounts outside [0, bits) shift by bits - 1: the top bit fills everything.
                let y = y.expect("binary");
                let inside = b
                    .build_int_compare(IntPredicate::ULT, y, it.const_int(bits, false), "in")
                    .map_err(llvm)?;
                let safe = b
                    .build_select(inside, y, it.const_int(bits - 1, false), "s")
                    .map_err(llvm)?
                    .into_int_value();
                b.build_right_shift(x, safe, true, "r")
                    .map_err(llvm)?
                    .into()
            }
            OpKind::Popcnt => intr("llvm.ctpop")?,
            OpKind::CountLeadingZeros => self.intrinsic(
                "llvm.ctlz",
                it.into(),
                &[x.into(), self.ctx.bool_type().const_zero().into()],
            )?,
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

    pub(super) fn convert(
        &self,
        from: DType,
        to: DType,
        v: BasicValueEnum<'c>,
    ) -> Result<BasicValueEnum<'c>> {
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
        let unsigned_src = !from.is_signed();
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

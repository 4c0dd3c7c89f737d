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
            exp_arg: Default::default(),
            shifted: Default::default(),
            schedule: None,
            args: Default::default(),
        }
    }

    pub(super) fn i64c(&self, v: i64) -> IntValue<'c> {
        self.ctx.i64_type().const_int(v as u64, true)
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

    /// Computes `e` here, unless already hoisted, for the expressions emitted next to reuse
    /// (a fold: every result of it).
    pub(super) fn hoist_one(&self, e: &Expr) -> Result<()> {
        if let Expr::Fold { .. } = e
            && !self.is_hoisted(e)
        {
            return self.hoist_fold(e);
        }
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
                if d == DType::U64 {
                    // Past i64::MAX: saturated, to clamp to the top (`literal::index_of`).
                    let neg = b
                        .build_int_compare(IntPredicate::SLT, v, i64t.const_zero(), "neg")
                        .map_err(llvm)?;
                    let max = i64t.const_int(i64::MAX as u64, false);
                    b.build_select(neg, max, v, "sat")
                        .map_err(llvm)?
                        .into_int_value()
                } else if v.get_type().get_bit_width() == 64 {
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
                // Both sides safe and cheap anywhere (a window's clamped element and its
                // init): a select, no branch.
                if speculatable(then) && speculatable(otherwise) {
                    let tv = self.expr(then)?;
                    let ev = self.expr(otherwise)?;
                    return self.b.build_select(ok, tv, ev, "g").map_err(llvm);
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
                    && let Some(&arg) = self.nonpositive.get(&value_key(e))
                {
                    self.exp_arg.set(arg);
                }
                let r = self.op(op, in_dt, *dtype, &vals);
                // Taken by the exponential itself; never left for another one.
                self.exp_arg.set(ExpArg::Any);
                r
            }
            Expr::Reduce { .. } => {
                if let Some(v) = self.hoisted_value(e)? {
                    return Ok(v);
                }
                self.reduce(e, &mut |_| Ok(()))
            }
            Expr::Fold { result, .. } => {
                if let Some(v) = self.hoisted_value(e)? {
                    return Ok(v);
                }
                Ok(self.fold_results(e)?[*result])
            }
            Expr::Arg { slot, .. } => self.fold_arg(*slot),
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
        let ct: BasicTypeEnum = if dtype.is_float() && dtype.mini().is_none() {
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
}

impl<'c> Base<'c> for Emitter<'c> {
    fn ctx(&self) -> &'c Context {
        self.ctx
    }

    fn module(&self) -> &Module<'c> {
        self.m
    }

    fn builder(&self) -> &Builder<'c> {
        &self.b
    }

    fn scalef(&self) -> bool {
        self.scalef
    }

    fn take_exp_arg(&self) -> ExpArg {
        self.exp_arg.take()
    }

    /// The CPU backend targets x86-64, whose cores take an assist for an underflowing result.
    fn underflow_assists(&self) -> bool {
        true
    }

    /// A call to a C math function (`tanhf` for f32, `tanh` for f64).
    fn libm_call(&self, name: &str, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
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
}

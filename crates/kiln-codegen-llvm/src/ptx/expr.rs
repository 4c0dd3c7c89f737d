//! Kernel-IR expressions at a thread's loop variables (`Stmt::Eval`), as the emulator
//! evaluates them: loads through affine and gathered indices, guards that evaluate only the
//! chosen side, element ops (shared with the CPU), and reductions in order, or, for float
//! sums and products longer than a leaf, in the [`SumTree`] order (chains of `leaf` terms,
//! their results in chains of `fanout`, level by level); a fold a thread computes alone
//! (the mapping's thread per output) in order.

use super::kernel::Emit;
use crate::Result;
use crate::common::llvm;
use crate::common::scalar::Scalar;
use inkwell::IntPredicate;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use kiln_ir::{Combiner, DType};
use kiln_kernel::kernel::{Cond, Ew, Expr, Fold, Idx};

/// The running state of one level of a sum tree: its partial result and how many values it
/// holds.
struct Level<'c> {
    acc: PointerValue<'c>,
    count: PointerValue<'c>,
    /// Values per chunk (`leaf` at the bottom, `fanout` above); `None` at the top, which
    /// receives one value.
    chunk: Option<usize>,
}

impl<'c> Emit<'_, 'c> {
    fn var(&self, v: usize) -> Result<IntValue<'c>> {
        let Some(&slot) = self.vars.get(v) else {
            return Err(crate::Error::Llvm(format!(
                "{}: no loop variable {v}",
                self.k.name
            )));
        };
        Ok(self
            .b
            .build_load(self.ctx.i64_type(), slot, "v")
            .map_err(llvm)?
            .into_int_value())
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
                let (lo, hi) = (self.i64c(*lo), self.i64c(*hi));
                let below = b
                    .build_int_compare(IntPredicate::SLT, v, lo, "lo")
                    .map_err(llvm)?;
                let v = b
                    .build_select(below, lo, v, "c1")
                    .map_err(llvm)?
                    .into_int_value();
                let above = b
                    .build_int_compare(IntPredicate::SGT, v, hi, "hi")
                    .map_err(llvm)?;
                b.build_select(above, hi, v, "c2")
                    .map_err(llvm)?
                    .into_int_value()
            }
            Idx::Value(e) => self.as_index(self.expr(e)?, e.dtype())?,
        })
    }

    /// A value as an i64 index (the emulator's `V::i`).
    fn as_index(&self, v: BasicValueEnum<'c>, d: DType) -> Result<IntValue<'c>> {
        let b = &self.b;
        let i64t = self.ctx.i64_type();
        Ok(match v {
            BasicValueEnum::FloatValue(x) => {
                b.build_float_to_signed_int(x, i64t, "i").map_err(llvm)?
            }
            BasicValueEnum::IntValue(x) if d == DType::U64 => {
                // Past i64::MAX: saturated, to clamp to the top (`literal::index_of`).
                let neg = b
                    .build_int_compare(IntPredicate::SLT, x, i64t.const_zero(), "neg")
                    .map_err(llvm)?;
                let max = i64t.const_int(i64::MAX as u64, false);
                b.build_select(neg, max, x, "sat")
                    .map_err(llvm)?
                    .into_int_value()
            }
            BasicValueEnum::IntValue(x) if x.get_type().get_bit_width() == 64 => x,
            BasicValueEnum::IntValue(x) if !d.is_signed() => {
                b.build_int_z_extend(x, i64t, "z").map_err(llvm)?
            }
            BasicValueEnum::IntValue(x) => b.build_int_s_extend(x, i64t, "s").map_err(llvm)?,
            _ => return Err(crate::Error::Llvm("an index that is no number".into())),
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

    /// An integer index `x` as a value of `d` (the emulator's `int_value`).
    fn index_value(&self, x: IntValue<'c>, d: DType) -> Result<BasicValueEnum<'c>> {
        let b = &self.b;
        Ok(if d.is_float() {
            b.build_signed_int_to_float(x, self.ftype(d), "f")
                .map_err(llvm)?
                .into()
        } else if d == DType::Pred {
            b.build_int_compare(IntPredicate::NE, x, self.i64c(0), "p")
                .map_err(llvm)?
                .into()
        } else if self.itype(d).get_bit_width() == 64 {
            x.into()
        } else {
            b.build_int_truncate(x, self.itype(d), "t")
                .map_err(llvm)?
                .into()
        })
    }

    /// `e` at the thread's loop variables.
    pub(super) fn expr(&self, e: &Expr) -> Result<BasicValueEnum<'c>> {
        match e {
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => {
                let n = self.k.inputs.len();
                if *input >= n {
                    let sc = self.scalars.borrow();
                    let Some(&v) = sc.get(input - n) else {
                        return Err(crate::Error::Llvm(format!(
                            "{}: no input {input}",
                            self.k.name
                        )));
                    };
                    return Ok(v);
                }
                let mut flat = self.i64c(*off);
                for (v, &c) in coef.iter().enumerate() {
                    if c == 0 {
                        continue;
                    }
                    let t = self
                        .b
                        .build_int_mul(self.var(v)?, self.i64c(c), "t")
                        .map_err(llvm)?;
                    flat = self.b.build_int_add(flat, t, "flat").map_err(llvm)?;
                }
                self.load_input(*input, *dtype, flat)
            }
            Expr::Gather {
                input,
                dtype,
                index,
                strides,
            } => {
                let mut flat = self.i64c(0);
                for (i, s) in index.iter().zip(strides) {
                    let t = self
                        .b
                        .build_int_mul(self.idx(i)?, self.i64c(*s), "t")
                        .map_err(llvm)?;
                    flat = self.b.build_int_add(flat, t, "flat").map_err(llvm)?;
                }
                self.load_input(*input, *dtype, flat)
            }
            Expr::Iota { var, dtype } => self.index_value(self.var(*var)?, *dtype),
            Expr::Index { idx, dtype } => self.index_value(self.idx(idx)?, *dtype),
            Expr::Const { dtype, value } => Ok(self.constant(*dtype, *value)),
            Expr::Guard {
                conds,
                then,
                otherwise,
            } => {
                let mut ok = self.ctx.bool_type().const_int(1, false);
                for c in conds {
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
                if tv.get_type() != ev.get_type() {
                    return Err(crate::Error::Llvm(format!(
                        "{}: a guard's sides differ in type",
                        self.k.name
                    )));
                }
                let phi = self.b.build_phi(tv.get_type(), "g").map_err(llvm)?;
                phi.add_incoming(&[(&tv, t_end), (&ev, e_end)]);
                Ok(phi.as_basic_value())
            }
            Expr::Op { op, dtype, args } => {
                let vals: Vec<BasicValueEnum> =
                    args.iter().map(|a| self.expr(a)).collect::<Result<_>>()?;
                let in_dt = match op {
                    Ew::Select => args[1].dtype(),
                    _ => args[0].dtype(),
                };
                self.op(op, in_dt, *dtype, &vals)
            }
            Expr::Reduce {
                kind,
                dtype,
                init,
                vars,
                body,
            } => self.reduce(*kind, *dtype, init, vars, body),
            Expr::Fold { fold, result } => Ok(self.fold_in_order(fold)?[*result]),
            Expr::Arg { slot, .. } => self.args.borrow().get(*slot).copied().ok_or_else(|| {
                crate::Error::Llvm(format!("{}: no fold argument {slot}", self.k.name))
            }),
        }
    }

    /// Every result of `fold` computed by this thread in order: its inits, then the body
    /// applied to the accumulators and the elements at each position of its loops, row-major
    /// (the reference's order), the accumulators in stack slots.
    fn fold_in_order(&self, fold: &Fold) -> Result<Vec<BasicValueEnum<'c>>> {
        let inits = fold
            .inits
            .iter()
            .map(|x| self.expr(x))
            .collect::<Result<Vec<_>>>()?;
        let mut slots = Vec::with_capacity(inits.len());
        for v in &inits {
            let p = self.slot(v.get_type())?;
            self.b.build_store(p, *v).map_err(llvm)?;
            slots.push(p);
        }
        let read = |em: &Self| -> Result<Vec<BasicValueEnum<'c>>> {
            (slots.iter().zip(&inits))
                .map(|(p, v)| em.b.build_load(v.get_type(), *p, "acc").map_err(llvm))
                .collect()
        };
        self.loops(&fold.vars, &mut |em| {
            let mut args = read(em)?;
            for x in &fold.elems {
                args.push(em.expr(x)?);
            }
            let saved = em.args.replace(args);
            let next: Result<Vec<_>> = fold.body.iter().map(|x| em.expr(x)).collect();
            em.args.replace(saved);
            for (p, v) in slots.iter().zip(next?) {
                em.b.build_store(*p, v).map_err(llvm)?;
            }
            Ok(())
        })?;
        read(self)
    }

    /// Counted loops over `vars` (outermost first, each from 0), `body` inside.
    fn loops(
        &self,
        vars: &[(usize, usize)],
        body: &mut dyn FnMut(&Self) -> Result<()>,
    ) -> Result<()> {
        let Some((&(v, n), rest)) = vars.split_first() else {
            return body(self);
        };
        let b = &self.b;
        let Some(&slot) = self.vars.get(v) else {
            return Err(crate::Error::Llvm(format!(
                "{}: no loop variable {v}",
                self.k.name
            )));
        };
        b.build_store(slot, self.i64c(0)).map_err(llvm)?;
        let head = self.ctx.append_basic_block(self.f, "red");
        let inside = self.ctx.append_basic_block(self.f, "red.body");
        let exit = self.ctx.append_basic_block(self.f, "red.done");
        b.build_unconditional_branch(head).map_err(llvm)?;
        b.position_at_end(head);
        let i = self.var(v)?;
        let more = b
            .build_int_compare(IntPredicate::SLT, i, self.i64c(n as i64), "more")
            .map_err(llvm)?;
        b.build_conditional_branch(more, inside, exit)
            .map_err(llvm)?;
        b.position_at_end(inside);
        self.loops(rest, body)?;
        let i = self.var(v)?;
        let next = b.build_int_add(i, self.i64c(1), "next").map_err(llvm)?;
        b.build_store(slot, next).map_err(llvm)?;
        b.build_unconditional_branch(head).map_err(llvm)?;
        b.position_at_end(exit);
        Ok(())
    }

    fn reduce(
        &self,
        kind: Combiner,
        d: DType,
        init: &Expr,
        rv: &[(usize, usize)],
        body: &Expr,
    ) -> Result<BasicValueEnum<'c>> {
        let start = self.expr(init)?;
        let n: usize = rv.iter().map(|v| v.1).product();
        if n == 0 {
            return Ok(start);
        }
        let t: BasicTypeEnum = self.reg_type(d);
        let sums = self.k.sums;
        let tree = d.is_float() && matches!(kind, Combiner::Add | Combiner::Mul) && n > sums.leaf;
        if !tree {
            let acc = self.slot(t)?;
            self.b.build_store(acc, start).map_err(llvm)?;
            self.loops(rv, &mut |em| {
                let x = em.expr(body)?;
                let a = em.b.build_load(t, acc, "a").map_err(llvm)?;
                let c = em.combine_with(kind, d, a, x, false)?;
                em.b.build_store(acc, c).map_err(llvm)?;
                Ok(())
            })?;
            return self.b.build_load(t, acc, "sum").map_err(llvm);
        }
        // Level sizes: n terms in chunks of `leaf`, then chunks of `fanout` until one remains.
        let leaf = sums.leaf.max(1);
        let fanout = sums.fanout.max(2);
        let mut levels = Vec::new();
        let mut size = n;
        let mut chunk = leaf;
        let i64t = self.ctx.i64_type();
        while size > 1 {
            levels.push(Level {
                acc: self.slot(t)?,
                count: self.slot(i64t.into())?,
                chunk: Some(chunk),
            });
            size = size.div_ceil(chunk);
            chunk = fanout;
        }
        levels.push(Level {
            acc: self.slot(t)?,
            count: self.slot(i64t.into())?,
            chunk: None,
        });
        for l in &levels {
            self.b
                .build_store(l.count, i64t.const_zero())
                .map_err(llvm)?;
            self.b
                .build_store(l.acc, self.identity(kind, d))
                .map_err(llvm)?;
        }
        self.loops(rv, &mut |em| {
            let x = em.expr(body)?;
            em.arrive(&levels, 0, kind, d, x)
        })?;
        // The last chunk of each level, however short, goes up in order.
        for l in 0..levels.len() - 1 {
            let c = self
                .b
                .build_load(i64t, levels[l].count, "c")
                .map_err(llvm)?
                .into_int_value();
            let some = self
                .b
                .build_int_compare(IntPredicate::NE, c, i64t.const_zero(), "some")
                .map_err(llvm)?;
            let up = self.ctx.append_basic_block(self.f, "flush");
            let next = self.ctx.append_basic_block(self.f, "flushed");
            self.b
                .build_conditional_branch(some, up, next)
                .map_err(llvm)?;
            self.b.position_at_end(up);
            let v = self.b.build_load(t, levels[l].acc, "p").map_err(llvm)?;
            self.b
                .build_store(levels[l].count, i64t.const_zero())
                .map_err(llvm)?;
            self.arrive(&levels, l + 1, kind, d, v)?;
            self.b.build_unconditional_branch(next).map_err(llvm)?;
            self.b.position_at_end(next);
        }
        let top = levels.last().expect("a top level");
        let total = self.b.build_load(t, top.acc, "total").map_err(llvm)?;
        self.combine_with(kind, d, start, total, false)
    }

    /// `x` joins level `l`: the first value of a chunk starts it, the others are combined in;
    /// a full chunk goes up to the next level.
    fn arrive(
        &self,
        levels: &[Level<'c>],
        l: usize,
        kind: Combiner,
        d: DType,
        x: BasicValueEnum<'c>,
    ) -> Result<()> {
        let b = &self.b;
        let t = x.get_type();
        let i64t = self.ctx.i64_type();
        let level = &levels[l];
        let Some(chunk) = level.chunk else {
            b.build_store(level.acc, x).map_err(llvm)?;
            return Ok(());
        };
        let c = b
            .build_load(i64t, level.count, "c")
            .map_err(llvm)?
            .into_int_value();
        let a = b.build_load(t, level.acc, "a").map_err(llvm)?;
        let first = b
            .build_int_compare(IntPredicate::EQ, c, i64t.const_zero(), "first")
            .map_err(llvm)?;
        let joined = self.combine_with(kind, d, a, x, false)?;
        let v = b.build_select(first, x, joined, "v").map_err(llvm)?;
        b.build_store(level.acc, v).map_err(llvm)?;
        let c1 = b
            .build_int_add(c, i64t.const_int(1, false), "c1")
            .map_err(llvm)?;
        let full = b
            .build_int_compare(
                IntPredicate::EQ,
                c1,
                i64t.const_int(chunk as u64, false),
                "full",
            )
            .map_err(llvm)?;
        let kept = b
            .build_select(full, i64t.const_zero(), c1, "kept")
            .map_err(llvm)?;
        b.build_store(level.count, kept).map_err(llvm)?;
        let up = self.ctx.append_basic_block(self.f, "up");
        let next = self.ctx.append_basic_block(self.f, "joined");
        b.build_conditional_branch(full, up, next).map_err(llvm)?;
        b.position_at_end(up);
        self.arrive(levels, l + 1, kind, d, v)?;
        b.build_unconditional_branch(next).map_err(llvm)?;
        b.position_at_end(next);
        Ok(())
    }
}

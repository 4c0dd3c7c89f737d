//! Contraction steps left out of a GEMM's tiles where one operand is zero (see
//! [`crate::kernel::ZeroBlocks`]: a causal mask's triangle of attention's probabilities or
//! their gradient).
//!
//! The hint names, for a sliver of A's rows (zeros in A) or a panel of B's columns (zeros in
//! B), the steps where that operand should be zero: a prefix or a suffix of the contraction
//! block. A tile leaves them out only when the zero operand is zero there and the other
//! operand finite there: each step left out would have added `0 * finite`, a zero, to every
//! accumulator, which changes none of them (they start from +0, and no sum of terms from +0
//! is -0 but through an underflow's rounding, which the product's order decides in any case),
//! where `0 * inf` or `0 * NaN` would have made it NaN. Otherwise the tile runs over the whole
//! block. B's checks run once per panel, on the panel just packed (finite over the block, or
//! zero over the steps its columns leave out); A's once per block of rows, on A where it is
//! stored (zero over its triangle, or finite), before its tiles.

use super::*;

/// Which check a run of elements takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Every element is +0 or -0.
    Zero,
    /// Every element is finite.
    Finite,
}

/// A GEMM's tiles leaving out zero steps: the hint, and per panel of the column block being
/// computed, a byte set when the panel was packed (zeros in A: the panel is finite over the
/// contraction block; zeros in B: the panel is zero over the steps its columns leave out).
pub(super) struct ZeroSteps<'c> {
    pub(super) z: ZeroBlocks,
    pub(super) flags: PointerValue<'c>,
}

impl<'c> ZeroSteps<'c> {
    /// The steps hint `z` leaves out for the rows or columns `x0..x1` (within their batch,
    /// not empty): what remains of the contraction block `kb..kend`, as `(lo, hi)`.
    pub(super) fn steps(
        &self,
        x: &Arith<'_, 'c>,
        (x0, x1): (IntValue<'c>, IntValue<'c>),
        (kb, kend): (IntValue<'c>, IntValue<'c>),
    ) -> Result<(IntValue<'c>, IntValue<'c>)> {
        let (a, b, c) = self.z.at;
        // `step * a + x * b + c > 0` for every x: the x that makes `x * b` least decides.
        let xl = if b >= 0 { x0 } else { x.addc(x1, -1)? };
        let bx = x.addc(x.mulc(xl, b)?, c)?;
        let clamp = |v: IntValue<'c>| x.min(x.max(v, kb)?, kend);
        if a > 0 {
            // step > -(x * b + c): the steps from -(x * b + c) + 1 on are zeros.
            let first_zero = x.sub(x.c(1), bx)?;
            Ok((kb, clamp(first_zero)?))
        } else {
            // step < x * b + c: the steps before it are zeros.
            Ok((clamp(bx)?, kend))
        }
    }

    /// Whether the packed rows `kb..lo` and `hi..kend` of a sliver or panel at `p` (`width`
    /// elements a step: `mr` or `nr`) pass `check`.
    pub(super) fn outside(
        &self,
        x: &Arith<'_, 'c>,
        (ft, lanes): (FloatType<'c>, u32),
        (p, width): (PointerValue<'c>, i64),
        (lo, hi): (IntValue<'c>, IntValue<'c>),
        (kb, kend): (IntValue<'c>, IntValue<'c>),
        check: Check,
    ) -> Result<IntValue<'c>> {
        let before = all_of(x, ft, lanes, p, x.mulc(x.sub(lo, kb)?, width)?, check)?;
        let after_at = x.at(ft, p, x.mulc(x.sub(hi, kb)?, width)?)?;
        let after = all_of(
            x,
            ft,
            lanes,
            after_at,
            x.mulc(x.sub(kend, hi)?, width)?,
            check,
        )?;
        x.em.b.build_and(before, after, "ok").map_err(llvm)
    }

    /// The byte of the panel of columns from `j` in the column block from `jc`.
    fn flag_at(
        &self,
        x: &Arith<'_, 'c>,
        bl: Blocking,
        (j, jc): (IntValue<'c>, IntValue<'c>),
    ) -> Result<PointerValue<'c>> {
        let i = x.sdiv(x.sub(j, jc)?, bl.nr())?;
        x.at(x.em.ctx.i8_type(), self.flags, i)
    }

    /// Sets the byte of the panel just packed at `panel` (columns `j..j + width` of the block
    /// from `jc`, steps `kb..kend`): zeros in A, whether the panel is finite; zeros in B,
    /// whether it is zero over the steps its columns leave out.
    pub(super) fn check_panel(
        &self,
        x: &Arith<'_, 'c>,
        ft: FloatType<'c>,
        bl: Blocking,
        (panel, jc): (PointerValue<'c>, IntValue<'c>),
        (j, width): (IntValue<'c>, i64),
        (kb, kend): (IntValue<'c>, IntValue<'c>),
    ) -> Result<()> {
        let ok = if self.z.operand == 0 {
            let count = x.mulc(x.sub(kend, kb)?, bl.nr())?;
            all_of(x, ft, bl.lanes, panel, count, Check::Finite)?
        } else {
            let left = self.steps(x, (j, x.addc(j, width)?), (kb, kend))?;
            let p = (panel, bl.nr());
            self.outside(x, (ft, bl.lanes), p, left, (kb, kend), Check::Zero)?
        };
        let em = x.em;
        let byte =
            em.b.build_int_z_extend(ok, em.ctx.i8_type(), "f")
                .map_err(llvm)?;
        em.b.build_store(self.flag_at(x, bl, (j, jc))?, byte)
            .map_err(llvm)?;
        Ok(())
    }

    /// Whether A's rows `ic..ic_end` (the batch's first row `base`) pass their check over the
    /// steps `kb..kend`, read where A is stored (by rows, or by columns when `g.a_trans`):
    /// zeros in A, zero wherever the hint says; zeros in B, finite.
    pub(super) fn a_block(
        &self,
        g: &Gemm<'_, 'c>,
        ft: FloatType<'c>,
        (ic, ic_end, base): (IntValue<'c>, IntValue<'c>, IntValue<'c>),
        (kb, kend): (IntValue<'c>, IntValue<'c>),
    ) -> Result<IntValue<'c>> {
        let x = &g.x;
        let em = x.em;
        let b = &em.b;
        let lanes = g.bl.lanes;
        let ok = em.entry_alloca(em.ctx.bool_type().into())?;
        b.build_store(ok, em.ctx.bool_type().const_all_ones())
            .map_err(llvm)?;
        let and = |v: IntValue<'c>| -> Result<()> {
            let was = b.build_load(em.ctx.bool_type(), ok, "ok").map_err(llvm)?;
            let now = b.build_and(was.into_int_value(), v, "ok").map_err(llvm)?;
            b.build_store(ok, now).map_err(llvm)?;
            Ok(())
        };
        let s_i = x.slot()?;
        let zeros = self.z.operand == 0;
        if !g.a_trans {
            // Row i's steps from kb are consecutive.
            em.range_loop_ptr(s_i, ic, ic_end, 1, &mut |_| {
                let i = x.get(s_i)?;
                let row = x.at(ft, g.a, x.add(g.a_row(i)?, kb)?)?;
                and(if zeros {
                    let xi = x.sub(i, base)?;
                    let left = self.steps(x, (xi, x.addc(xi, 1)?), (kb, kend))?;
                    self.outside(x, (ft, lanes), (row, 1), left, (kb, kend), Check::Zero)?
                } else {
                    all_of(x, ft, lanes, row, x.sub(kend, kb)?, Check::Finite)?
                })
            })?;
        } else {
            // Step kk's rows are consecutive: those the hint makes zero, a prefix or a
            // suffix of them.
            em.range_loop_ptr(s_i, kb, kend, 1, &mut |_| {
                let kk = x.get(s_i)?;
                let (r0, r1) = (x.sub(ic, base)?, x.sub(ic_end, base)?);
                let (lo, hi) = if zeros {
                    let (a, bb, c) = self.z.at;
                    // x * bb + (kk * a + c) > 0, bb being 1 or -1.
                    let rest = x.addc(x.mulc(kk, a)?, c)?;
                    let clamp = |v: IntValue<'c>| x.min(x.max(v, r0)?, r1);
                    if bb > 0 {
                        (clamp(x.sub(x.c(1), rest)?)?, r1)
                    } else {
                        (r0, clamp(rest)?)
                    }
                } else {
                    (r0, r1)
                };
                let at = x.add(g.a_row(x.add(base, lo)?)?, x.mul(kk, g.lda)?)?;
                let check = if zeros { Check::Zero } else { Check::Finite };
                and(all_of(
                    x,
                    ft,
                    lanes,
                    x.at(ft, g.a, at)?,
                    x.sub(hi, lo)?,
                    check,
                )?)
            })?;
        }
        Ok(b.build_load(em.ctx.bool_type(), ok, "ok")
            .map_err(llvm)?
            .into_int_value())
    }

    /// The tiles of rows `ic..ic_end` (the batch's first row `base`) by the panel of columns
    /// `j..j + width` (of the column block from `jc`), steps `kb..kend`, one sliver at a time
    /// through the tile routine `f`: each over the steps the hint leaves where A's rows passed
    /// their check (`a_ok`) and the panel its own, else over all. `a(r, kk)` gives the tile's
    /// A arguments (where, `lda` and `step`) for the sliver from row `r`, from step `kk`;
    /// `c(r)` is C's row `r` at the panel, rows `ldc` apart; `panel` is the packed panel (`nr`
    /// a step); `first` and `scale` are the routine's.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(super) fn slivers(
        &self,
        x: &Arith<'_, 'c>,
        (f, ft, bl): (FunctionValue<'c>, FloatType<'c>, Blocking),
        (ic, ic_end, base, a_ok): (IntValue<'c>, IntValue<'c>, IntValue<'c>, IntValue<'c>),
        (j, width, jc): (IntValue<'c>, i64, IntValue<'c>),
        (kb, kend): (IntValue<'c>, IntValue<'c>),
        (a, panel): (
            &dyn Fn(
                IntValue<'c>,
                IntValue<'c>,
            ) -> Result<(PointerValue<'c>, IntValue<'c>, IntValue<'c>)>,
            PointerValue<'c>,
        ),
        (c, ldc): (
            &dyn Fn(IntValue<'c>) -> Result<PointerValue<'c>>,
            IntValue<'c>,
        ),
        (first, scale): (IntValue<'c>, BasicValueEnum<'c>),
    ) -> Result<()> {
        let em = x.em;
        let b = &em.b;
        let (mr, nr) = (bl.mr, bl.nr());
        let flag = b
            .build_load(em.ctx.i8_type(), self.flag_at(x, bl, (j, jc))?, "f")
            .map_err(llvm)?
            .into_int_value();
        let panel_ok = x.cmp(IntPredicate::NE, flag, em.ctx.i8_type().const_zero())?;
        let ok = b.build_and(panel_ok, a_ok, "ok").map_err(llvm)?;
        // The steps the panel's columns leave, for zeros in B.
        let by_panel = match self.z.operand {
            0 => None,
            _ => Some(self.steps(x, (j, x.addc(j, width)?), (kb, kend))?),
        };
        let pick = |v: IntValue<'c>, all: IntValue<'c>| -> Result<IntValue<'c>> {
            Ok(b.build_select(ok, v, all, "k")
                .map_err(llvm)?
                .into_int_value())
        };
        let s_r = x.slot()?;
        em.range_loop_ptr(s_r, ic, ic_end, mr, &mut |_| {
            let r = x.get(s_r)?;
            let r_end = x.min(x.addc(r, mr)?, ic_end)?;
            let (lo, hi) = match by_panel {
                Some(left) => left,
                None => self.steps(x, (x.sub(r, base)?, x.sub(r_end, base)?), (kb, kend))?,
            };
            let (lo, hi) = (pick(lo, kb)?, pick(hi, kend)?);
            let (at, lda, step) = a(r, lo)?;
            b.build_call(
                f,
                &[
                    c(r)?.into(),
                    ldc.into(),
                    x.sub(r_end, r)?.into(),
                    at.into(),
                    lda.into(),
                    step.into(),
                    x.at(ft, panel, x.mulc(x.sub(lo, kb)?, nr)?)?.into(),
                    x.c(nr).into(),
                    x.sub(hi, lo)?.into(),
                    first.into(),
                    scale.into(),
                    // No update mode: zero steps are left out of plain products only.
                    em.ctx.bool_type().const_zero().into(),
                ],
                "",
            )
            .map_err(llvm)?;
            Ok(())
        })
    }
}

/// Whether the `count` elements of `ft` at `p` all pass `check`: a sum of their magnitudes
/// (zero only if each is) or of their products with zero (NaN if any is infinite or NaN), by
/// vectors of `lanes`, then one at a time.
pub(super) fn all_of<'c>(
    x: &Arith<'_, 'c>,
    ft: FloatType<'c>,
    lanes: u32,
    p: PointerValue<'c>,
    count: IntValue<'c>,
    check: Check,
) -> Result<IntValue<'c>> {
    let em = x.em;
    let b = &em.b;
    let vt = ft.vec_type(lanes);
    let term = |v: BasicValueEnum<'c>, zero: BasicValueEnum<'c>| -> Result<BasicValueEnum<'c>> {
        Ok(match check {
            Check::Zero => em.intrinsic("llvm.fabs", v.get_type(), &[v])?,
            Check::Finite => match v {
                BasicValueEnum::VectorValue(v) => b
                    .build_float_mul(v, zero.into_vector_value(), "z")
                    .map_err(llvm)?
                    .into(),
                _ => b
                    .build_float_mul(v.into_float_value(), zero.into_float_value(), "z")
                    .map_err(llvm)?
                    .into(),
            },
        })
    };
    let add = |s: BasicValueEnum<'c>, t: BasicValueEnum<'c>| -> Result<BasicValueEnum<'c>> {
        Ok(match s {
            BasicValueEnum::VectorValue(s) => b
                .build_float_add(s, t.into_vector_value(), "s")
                .map_err(llvm)?
                .into(),
            _ => b
                .build_float_add(s.into_float_value(), t.into_float_value(), "s")
                .map_err(llvm)?
                .into(),
        })
    };
    let vsum = em.entry_alloca(vt.into())?;
    let ssum = em.entry_alloca(ft.into())?;
    b.build_store(vsum, vt.const_zero()).map_err(llvm)?;
    b.build_store(ssum, ft.const_zero()).map_err(llvm)?;
    let rem = b
        .build_int_signed_rem(count, x.c(lanes as i64), "r")
        .map_err(llvm)?;
    let full = x.sub(count, rem)?;
    let s_i = x.slot()?;
    let bytes = ft.size_of().get_zero_extended_constant().unwrap_or(4) as u32;
    em.range_loop_ptr(s_i, x.c(0), full, lanes as i64, &mut |_| {
        let v = b
            .build_load(vt, x.at(ft, p, x.get(s_i)?)?, "v")
            .map_err(llvm)?;
        let v = align(v, bytes)?;
        let s = b.build_load(vt, vsum, "vs").map_err(llvm)?;
        let t = term(v, vt.const_zero().into())?;
        b.build_store(vsum, add(s, t)?).map_err(llvm)?;
        Ok(())
    })?;
    em.range_loop_ptr(s_i, full, count, 1, &mut |_| {
        let v = b
            .build_load(ft, x.at(ft, p, x.get(s_i)?)?, "e")
            .map_err(llvm)?;
        let s = b.build_load(ft, ssum, "ss").map_err(llvm)?;
        let t = term(v, ft.const_zero().into())?;
        b.build_store(ssum, add(s, t)?).map_err(llvm)?;
        Ok(())
    })?;
    // Every lane of the vector sum, and the scalar sum, equal to zero (false for NaN).
    let vs = b
        .build_load(vt, vsum, "vs")
        .map_err(llvm)?
        .into_vector_value();
    let lanes_ok = b
        .build_float_compare(inkwell::FloatPredicate::OEQ, vs, vt.const_zero(), "vz")
        .map_err(llvm)?;
    let all_lanes = em
        .intrinsic(
            "llvm.vector.reduce.and",
            lanes_ok.get_type().into(),
            &[lanes_ok.into()],
        )?
        .into_int_value();
    let ss = b
        .build_load(ft, ssum, "ss")
        .map_err(llvm)?
        .into_float_value();
    let scalar_ok = b
        .build_float_compare(inkwell::FloatPredicate::OEQ, ss, ft.const_zero(), "sz")
        .map_err(llvm)?;
    b.build_and(all_lanes, scalar_ok, "all").map_err(llvm)
}

//! Tiles a GEMM leaves uncomputed where no reader uses its product (see
//! [`crate::kernel::Unread`]: a causal mask's scores above the diagonal, which every reader
//! selects away).
//!
//! Each panel of columns is multiplied by the rows of the block that some column of the panel
//! needs: the rows the region leaves whole form a prefix of the block (rounded down to whole
//! slivers of `mr` rows, where packed A's slivers start) or a suffix, the rest is one call of
//! the tile routine as before. The rows left out get zeros over the panel's columns, so the
//! product's buffer holds defined values everywhere (what a reader's select discards, and
//! what the product's own epilogue reads and discards). Nothing is checked at run time: the
//! readers' results do not depend on those elements, whatever the operands hold.

use super::*;

/// A GEMM's unread region, `col * a + row * b + c > 0` with `a` and `b` 1 or -1.
pub(super) struct UnreadRows {
    pub(super) at: (i64, i64, i64),
}

impl UnreadRows {
    /// Calls `tile(r0, r1)` over the rows `r0..r1` of the block `ic..ic_end` (the batch's
    /// first row `base`) that the panel of columns `j..j + width` (within the batch) needs,
    /// `r0 - ic` a multiple of `mr`, and stores zeros over the panel's columns in the block's
    /// other rows, whose row `r` starts at `c(r)`.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(super) fn panel<'c>(
        &self,
        x: &Arith<'_, 'c>,
        ft: FloatType<'c>,
        mr: i64,
        (ic, ic_end, base): (IntValue<'c>, IntValue<'c>, IntValue<'c>),
        (j, width): (IntValue<'c>, i64),
        tile: &dyn Fn(IntValue<'c>, IntValue<'c>) -> Result<()>,
        c: &dyn Fn(IntValue<'c>) -> Result<PointerValue<'c>>,
    ) -> Result<()> {
        let (a, b, cc) = self.at;
        // Unread where `row * b + t > 0`, for every column of the panel: the column making
        // `col * a` least decides.
        let col = if a >= 0 { j } else { x.addc(j, width - 1)? };
        let t = x.addc(x.mulc(col, a)?, cc)?;
        let clamp = |v: IntValue<'c>| x.min(x.max(v, ic)?, ic_end);
        let (r0, r1) = if b > 0 {
            // Rows past `-t` (within the batch) unread: the block's rows before `1 - t` needed.
            (ic, clamp(x.add(base, x.sub(x.c(1), t)?)?)?)
        } else {
            // Rows before `t` unread: the needed rows from `t`, from the start of its sliver.
            let from = clamp(x.add(base, t)?)?;
            let slivers = x.sdiv(x.sub(from, ic)?, mr)?;
            (x.add(ic, x.mulc(slivers, mr)?)?, ic_end)
        };
        let some = x.cmp(IntPredicate::SGT, r1, r0)?;
        x.branch(some, &mut || tile(r0, r1), &mut || Ok(()))?;
        self.clear(x, ft, (ic, r0), width, c)?;
        self.clear(x, ft, (r1, ic_end), width, c)
    }

    /// Stores zeros over `width` elements from `c(r)` for each row `r` of `r0..r1`.
    fn clear<'c>(
        &self,
        x: &Arith<'_, 'c>,
        ft: FloatType<'c>,
        (r0, r1): (IntValue<'c>, IntValue<'c>),
        width: i64,
        c: &dyn Fn(IntValue<'c>) -> Result<PointerValue<'c>>,
    ) -> Result<()> {
        let em = x.em;
        let bytes = ft.size_of().get_zero_extended_constant().unwrap_or(4);
        let s_r = x.slot()?;
        em.range_loop_ptr(s_r, r0, r1, 1, &mut |em| {
            let row = c(x.get(s_r)?)?;
            em.b.build_memset(
                row,
                bytes as u32,
                em.ctx.i8_type().const_zero(),
                x.c(width * bytes as i64),
            )
            .map_err(llvm)?;
            Ok(())
        })
    }
}

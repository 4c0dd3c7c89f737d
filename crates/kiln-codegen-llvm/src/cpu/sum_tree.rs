//! Float sums as trees of partial sums, so a reduction's rounding error grows with the
//! logarithm of its length rather than with its length.
//!
//! A plain loop adding `n` values into one accumulator loses up to about `n·ε/2` of relative
//! accuracy (the mean of 10⁷ copies of 0.1f32 came out 0.09985, and a sum of 2⁴⁰ ones stopped
//! growing at 2²⁴·64). Here the loops of a float sum add at most [`SumTree::leaf`] values into
//! one accumulator (a leaf; in the innermost loop, which the loop vectorizer splits over the
//! lanes of the target's widest vector, a leaf per lane: 2048 f32 values with AVX2, so a row of
//! 1024 is one vector loop with one horizontal sum, not four); leaves and
//! the sums of whole inner loops are combined at most [`SumTree::fanout`] at a time, level by
//! level, up to the reduction's own accumulator. The tree's shape is the target's
//! ([`kiln_kernel::target::TargetInfo::sums`]: leaves of 256 values, fanout 16) and depends
//! otherwise only on the static extents, so every run (and every thread split of the output)
//! rounds the same way.
//!
//! Error bound (stated in `ir-specs/ops/reduce.md`): for a sum of `n` values in an accumulator
//! of precision `ε`, `|computed - exact| <= (leaf + 16 ⌈log16(n / leaf)⌉ + 16 r) · ε · Σ|xᵢ|`
//! where `r` is the number of reduced dimensions, as long as the innermost loop is vectorized
//! (every kiln reduction over contiguous values is); in practice it is far smaller, since leaf
//! errors are spread over the vector lanes and the vectorizer's interleaved accumulators.

use super::{Emitter, llvm};
use crate::Result;
use crate::common::scalar::Scalar;
use crate::kernel::Expr;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{IntValue, PointerValue};
use kiln_ir::{Combiner, DType};
use kiln_kernel::target::SumTree;
use std::collections::BTreeSet;

/// The accumulators of a reduction and how they combine.
pub(super) struct Sum<'c> {
    pub kind: Combiner,
    pub dtype: DType,
    /// The accumulators' LLVM type.
    pub ty: BasicTypeEnum<'c>,
    /// Whether the loops form a summation tree (float sums) or add into the accumulators in
    /// one chain (everything else, which is exact or associative).
    pub tree: bool,
}

impl<'c> Sum<'c> {
    pub fn new(kind: Combiner, dtype: DType, ty: BasicTypeEnum<'c>) -> Sum<'c> {
        Sum {
            kind,
            dtype,
            ty,
            tree: kind == Combiner::Add && dtype.is_float(),
        }
    }
}

/// The loop body: emits the values at the current position and adds them into the given
/// accumulators (one per value the caller keeps).
pub(super) type SumBody<'a, 'c> =
    &'a mut dyn FnMut(&Emitter<'c>, &[PointerValue<'c>]) -> Result<()>;

impl<'c> Emitter<'c> {
    /// Counted loops over `vars` (outermost first) running `body`, which adds into `accs`, at
    /// every position. The reductions of `inner` are computed ahead of the first loop that
    /// leaves them fixed (read none of the loop variables still to open nor those bound inside
    /// the body, `inner_bound`), and dropped when that loop ends. For a float sum the loops form a tree:
    /// see the module documentation.
    pub(super) fn accumulate(
        &self,
        vars: &[(usize, usize)],
        inner: &[&Expr],
        inner_bound: &BTreeSet<usize>,
        sum: &Sum<'c>,
        accs: &[PointerValue<'c>],
        body: SumBody<'_, 'c>,
    ) -> Result<()> {
        let mark = self.hoisted.borrow().len();
        for r in inner {
            let free = crate::kernel::free_vars(r);
            if !free
                .iter()
                .any(|v| inner_bound.contains(v) || vars.iter().any(|b| b.0 == *v))
            {
                self.hoist_one(r)?;
            }
        }
        let done = match vars.split_first() {
            None => body(self, accs),
            Some((&(v, n), rest)) => {
                let mut level = |em: &Self, accs: &[PointerValue<'c>]| {
                    em.accumulate(rest, inner, inner_bound, sum, accs, body)
                };
                if !sum.tree {
                    self.counted(v, n, &mut |em: &Self| level(em, accs))
                } else {
                    // Values each iteration of this loop adds: with a leaf's worth or more, an
                    // iteration sums into partials of its own, which the tree combines.
                    let per: usize = rest.iter().map(|x| x.1).product();
                    let SumTree { leaf, fanout } = self.target.sums;
                    let own = per >= leaf;
                    let leaf = if own {
                        fanout
                    } else if rest.is_empty() {
                        // The innermost loop, which the vectorizer splits over its lanes: a
                        // leaf's worth of values per lane.
                        leaf * self.lanes(sum.dtype)
                    } else {
                        leaf / per.max(1)
                    };
                    let mut iteration = |em: &Self, accs: &[PointerValue<'c>]| {
                        if own {
                            let part = em.partials(sum, accs.len())?;
                            level(em, &part)?;
                            em.fold(sum, accs, &part)
                        } else {
                            level(em, accs)
                        }
                    };
                    self.tree_loop(
                        v,
                        (self.i64c(0), self.i64c(n as i64)),
                        (n, true),
                        leaf,
                        sum,
                        accs,
                        &mut iteration,
                    )
                }
            }
        };
        self.hoisted.borrow_mut().truncate(mark);
        done
    }

    /// A loop over `v` in `range` (at most `size` iterations) adding into `accs`: the
    /// iterations one after another when there are at most `leaf` of them, else up to
    /// [`SumTree::fanout`] chunks (of `leaf` times a power of the fanout), each summed into partials
    /// of its own and added to `accs`. When `range` holds exactly `size` iterations (`exact`)
    /// and the chunks divide it, each chunk is a loop of a constant trip count, which the
    /// vectorizer takes without a remainder.
    #[allow(clippy::too_many_arguments)]
    fn tree_loop(
        &self,
        v: usize,
        range: (IntValue<'c>, IntValue<'c>),
        (size, exact): (usize, bool),
        leaf: usize,
        sum: &Sum<'c>,
        accs: &[PointerValue<'c>],
        body: SumBody<'_, 'c>,
    ) -> Result<()> {
        if size <= leaf {
            return self.range_loop(v, range.0, range.1, 1, &mut |em: &Self| body(em, accs));
        }
        let mut chunk = leaf;
        let fanout = self.target.sums.fanout;
        while chunk * fanout < size {
            chunk *= fanout;
        }
        let whole = exact && size % chunk == 0;
        let i64t = self.ctx.i64_type();
        let slot = self.entry_alloca(i64t.into())?;
        self.labeled_loop("tree", slot, range, chunk as i64, &mut |em: &Self| {
            let lo =
                em.b.build_load(i64t, slot, "lo")
                    .map_err(llvm)?
                    .into_int_value();
            let end =
                em.b.build_int_add(lo, em.i64c(chunk as i64), "end")
                    .map_err(llvm)?;
            let hi = if whole {
                end
            } else {
                em.int_min(end, range.1)?
            };
            let part = em.partials(sum, accs.len())?;
            em.tree_loop(v, (lo, hi), (chunk, whole), leaf, sum, &part, body)?;
            em.fold(sum, accs, &part)
        })
    }

    /// The lanes of the target's widest vector for the accumulators of a `dtype` sum (f16
    /// and bf16 sums accumulate in f32).
    fn lanes(&self, dtype: DType) -> usize {
        (self.target.vector_bytes / dtype.bytes().max(4)).max(1)
    }

    /// `n` fresh accumulators holding the combiner's identity (-0 for a float sum, so a sum
    /// of negative zeros stays one).
    fn partials(&self, sum: &Sum<'c>, n: usize) -> Result<Vec<PointerValue<'c>>> {
        let zero = self.constant(sum.dtype, -0.0);
        (0..n)
            .map(|_| {
                let p = self.entry_alloca(sum.ty)?;
                self.b.build_store(p, zero).map_err(llvm)?;
                Ok(p)
            })
            .collect()
    }

    /// Adds each partial of `part` into the accumulator of `accs` at the same place, in order
    /// (not reassociable: the tree's shape is what bounds the error).
    fn fold(
        &self,
        sum: &Sum<'c>,
        accs: &[PointerValue<'c>],
        part: &[PointerValue<'c>],
    ) -> Result<()> {
        for (a, p) in accs.iter().zip(part) {
            let x = self.b.build_load(sum.ty, *a, "a").map_err(llvm)?;
            let y = self.b.build_load(sum.ty, *p, "p").map_err(llvm)?;
            let c = self.combine_with(sum.kind, sum.dtype, x, y, false)?;
            self.b.build_store(*a, c).map_err(llvm)?;
        }
        Ok(())
    }
}

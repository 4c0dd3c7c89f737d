//! Random reductions with a named combiner: `reduce` over dimensions, `reduce_window` and
//! `select_and_scatter` (the gradient of max pooling).

use super::Gen;
use crate::{Combiner, ComparisonDirection, Op, TensorType, ValueId};

impl Gen<'_> {
    /// A sum, maximum or minimum of `a` over random dimensions (a sum for unsigned integers and
    /// `pred`).
    pub(super) fn reduce(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let kind = if d.is_float() || d.is_signed() {
            *self
                .rng
                .pick(&[Combiner::Add, Combiner::Max, Combiner::Min])
        } else {
            Combiner::Add
        };
        let init = match kind {
            Combiner::Add => 0.0,
            Combiner::Max => -100.0,
            _ => 100.0,
        };
        let init = self.scalar_const(d, init);
        let dims: Vec<i64> = (0..r as i64).filter(|_| self.rng.chance(0.5)).collect();
        self.b
            .inst(
                Op::Reduce {
                    dimensions: dims,
                    kind,
                },
                &[a, init],
            )
            .ok()
    }

    /// Windowed sums or maxima of `a` with strides, padding and dilations (for
    /// [`super::Config::differentiable`] programs, maxima without dilations, which have no VJP).
    pub(super) fn reduce_window(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let kind = if self.rng.chance(0.5) {
            Combiner::Add
        } else {
            Combiner::Max
        };
        let init = self.scalar_const(d, if kind == Combiner::Add { 0.0 } else { -100.0 });
        let pick = |g: &mut Self, lo: usize, hi: usize| -> Vec<i64> {
            (0..r)
                .map(|_| (lo + g.rng.below(hi - lo + 1)) as i64)
                .collect()
        };
        let window_dimensions = pick(self, 1, 3);
        let window_strides = pick(self, 1, 2);
        let (mut base_dilations, mut window_dilations) = (pick(self, 1, 2), pick(self, 1, 2));
        if self.cfg.differentiable && kind == Combiner::Max {
            base_dilations = vec![1; r];
            window_dilations = vec![1; r];
        }
        let op = Op::ReduceWindow {
            window_dimensions,
            window_strides,
            base_dilations,
            window_dilations,
            padding: (0..r)
                .map(|_| (self.rng.below(2) as i64, self.rng.below(2) as i64))
                .collect(),
            kind,
        };
        self.b.inst(op, &[a, init]).ok()
    }

    /// The gradient of max pooling over `a`.
    pub(super) fn select_and_scatter(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let wd: Vec<i64> = (0..r).map(|_| self.rng.below(2) as i64 + 1).collect();
        let ws: Vec<i64> = (0..r).map(|_| self.rng.below(2) as i64 + 1).collect();
        let padding: Vec<(i64, i64)> = (0..r).map(|_| (self.rng.below(2) as i64, 0)).collect();
        let grid: Vec<usize> = (0..r)
            .map(|i| crate::verify::window_output_size(t.shape[i], 1, padding[i], wd[i], 1, ws[i]))
            .collect();
        let src = self.value_of(&TensorType::new(d, grid));
        let init = self.scalar_const(d, 0.0);
        let op = Op::SelectAndScatter {
            window_dimensions: wd,
            window_strides: ws,
            padding,
            select: ComparisonDirection::Ge,
            kind: Combiner::Add,
        };
        self.b.inst(op, &[a, src, init]).ok()
    }
}

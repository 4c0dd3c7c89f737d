//! Random matrix products and convolutions.

use super::Gen;
use crate::{DType, Op, TensorType, ValueId};

impl Gen<'_> {
    /// `a` times a matrix, contracting `a`'s last dimension (of [`Gen::dot_width`] columns).
    pub(super) fn dot(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let k = t.shape[r - 1];
        let n = self.dot_width(t);
        let w = self.value_of(&TensorType::new(d, [k, n]));
        self.b
            .inst(
                Op::DotGeneral {
                    lhs_batching_dimensions: vec![],
                    rhs_batching_dimensions: vec![],
                    lhs_contracting_dimensions: vec![r as i64 - 1],
                    rhs_contracting_dimensions: vec![0],
                },
                &[a, w],
            )
            .ok()
    }

    /// A small NCHW convolution with strides, padding, dilation and feature or batch groups.
    pub(super) fn convolution(&mut self, _a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (op, x, k) = self.convolution_parts(t.dtype);
        self.b.inst(op, &[x, k]).ok()
    }

    /// The op and the two operands of [`Gen::convolution`] for element type `d`.
    pub(super) fn convolution_parts(&mut self, d: DType) -> (Op, ValueId, ValueId) {
        let groups = self.rng.below(2) + 1;
        let by_batch = groups > 1 && self.rng.chance(0.5);
        let (fg, bg) = if by_batch { (1, groups) } else { (groups, 1) };
        let (n, c, h, w) = (
            bg * (self.rng.below(2) + 1),
            fg * (self.rng.below(2) + 1),
            self.rng.below(5) + 2,
            self.rng.below(5) + 2,
        );
        let (o, kh, kw) = (
            groups * (self.rng.below(2) + 1),
            self.rng.below(2) + 1,
            self.rng.below(3) + 1,
        );
        let x = self.value_of(&TensorType::new(d, [n, c, h, w]));
        let k = self.value_of(&TensorType::new(d, [o, c / fg, kh, kw]));
        let op = Op::Convolution {
            window_strides: vec![self.rng.below(2) as i64 + 1, self.rng.below(2) as i64 + 1],
            padding: vec![
                (self.rng.below(2) as i64, self.rng.below(2) as i64),
                (self.rng.below(2) as i64, 0),
            ],
            lhs_dilation: vec![self.rng.below(2) as i64 + 1, 1],
            rhs_dilation: vec![1, self.rng.below(2) as i64 + 1],
            feature_group_count: fg as i64,
            input_dims: vec![0, 1, 2, 3],
            kernel_dims: vec![0, 1, 2, 3],
            output_dims: vec![0, 1, 2, 3],
            batch_group_count: bg as i64,
        };
        (op, x, k)
    }
}

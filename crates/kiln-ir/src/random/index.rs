//! Random gathers and scatters at constant, possibly out-of-range indices (a gather clamps
//! them, a scatter skips them): whole rows, or per batch element with batching dimensions.

use super::Gen;
use crate::{Combiner, DType, Literal, Op, TensorType, ValueId};

impl Gen<'_> {
    /// Per batch element along dimension 0, elements of dimension 1 of `a` picked by (possibly
    /// out-of-range, so clamped) indices: a gather with batching dimensions.
    pub(super) fn gather_batched(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let r = t.rank();
        let (b, n) = (t.shape[0], self.rng.below(3) + 1);
        let idx: Vec<i64> = (0..b * n)
            .map(|_| self.rng.below(t.shape[1] + 2) as i64)
            .collect();
        let value =
            Literal::from_i64s(TensorType::new(DType::I32, [b, n]), &idx).expect("sizes match");
        let ids = self.b.inst(Op::Constant { value }, &[]).ok();
        let mut sizes: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        sizes[0] = 1;
        sizes[1] = 1;
        ids.and_then(|ids| {
            let op = Op::Gather {
                offset_dims: (2..r as i64).collect(),
                collapsed_slice_dims: vec![1],
                start_index_map: vec![1],
                index_vector_dim: 2,
                slice_sizes: sizes,
                operand_batching_dims: vec![0],
                start_indices_batching_dims: vec![0],
            };
            self.b.inst(op, &[a, ids]).ok()
        })
    }

    /// Rows of `a` picked by (possibly out-of-range, so clamped) indices.
    pub(super) fn gather_rows(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let r = t.rank();
        let n = self.rng.below(4) + 1;
        let idx: Vec<i64> = (0..n)
            .map(|_| self.rng.below(t.shape[0] + 2) as i64)
            .collect();
        let value =
            Literal::from_i64s(TensorType::new(DType::I32, [n]), &idx).expect("sizes match");
        let ids = self.b.inst(Op::Constant { value }, &[]).ok();
        let mut sizes: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        sizes[0] = 1;
        ids.and_then(|ids| {
            let op = Op::Gather {
                offset_dims: (1..r as i64).collect(),
                collapsed_slice_dims: vec![0],
                start_index_map: vec![0],
                index_vector_dim: 1,
                slice_sizes: sizes,
                operand_batching_dims: Vec::new(),
                start_indices_batching_dims: Vec::new(),
            };
            self.b.inst(op, &[a, ids]).ok()
        })
    }

    /// Per batch element along dimension 0, elements of dimension 1 of `a` added into or
    /// replaced (out-of-range ones are skipped): a scatter with batching dimensions.
    pub(super) fn scatter_batched(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let (b, n) = (t.shape[0], self.rng.below(3) + 1);
        let idx: Vec<i64> = (0..b * n)
            .map(|_| self.rng.below(t.shape[1] + 2) as i64)
            .collect();
        let value =
            Literal::from_i64s(TensorType::new(DType::I32, [b, n]), &idx).expect("sizes match");
        let mut ushape = vec![b, n];
        ushape.extend(&t.shape[2..]);
        let u = self.value_of(&TensorType::new(d, ushape));
        let ids = self.b.inst(Op::Constant { value }, &[]).ok();
        let kind = if self.rng.chance(0.5) {
            Combiner::Add
        } else {
            Combiner::Replace
        };
        ids.and_then(|ids| {
            let op = Op::Scatter {
                update_window_dims: (2..r as i64).collect(),
                inserted_window_dims: vec![1],
                scatter_dims_to_operand_dims: vec![1],
                index_vector_dim: 2,
                kind,
                input_batching_dims: vec![0],
                scatter_indices_batching_dims: vec![0],
            };
            self.b.inst(op, &[a, ids, u]).ok()
        })
    }

    /// Rows added into or written over rows of `a` (out-of-range rows are skipped).
    pub(super) fn scatter_rows(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let n = self.rng.below(4) + 1;
        let idx: Vec<i64> = (0..n)
            .map(|_| self.rng.below(t.shape[0] + 2) as i64)
            .collect();
        let value =
            Literal::from_i64s(TensorType::new(DType::I32, [n, 1]), &idx).expect("sizes match");
        let mut ushape = vec![n];
        ushape.extend(&t.shape[1..]);
        let u = self.value_of(&TensorType::new(d, ushape));
        let ids = self.b.inst(Op::Constant { value }, &[]).ok();
        let kind = if self.rng.chance(0.5) {
            Combiner::Add
        } else {
            Combiner::Replace
        };
        ids.and_then(|ids| {
            let op = Op::Scatter {
                update_window_dims: (1..r as i64).collect(),
                inserted_window_dims: vec![0],
                scatter_dims_to_operand_dims: vec![0],
                index_vector_dim: 1,
                kind,
                input_batching_dims: Vec::new(),
                scatter_indices_batching_dims: Vec::new(),
            };
            self.b.inst(op, &[a, ids, u]).ok()
        })
    }
}

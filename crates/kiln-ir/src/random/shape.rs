//! Random data movement: broadcasts, reshapes, transposes, slices (static and at run-time
//! start indices), reversals, padding, concatenations and windows written at run-time start
//! indices.

use super::Gen;
use crate::{DType, Op, TensorType, ValueId};

impl Gen<'_> {
    /// `a` broadcast along a new leading dimension of 1 to 3 elements.
    pub(super) fn broadcast(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let n = self.rng.below(3) + 1;
        let mut shape = vec![n];
        shape.extend(&t.shape);
        self.b
            .inst_typed(
                Op::BroadcastInDim {
                    broadcast_dimensions: (1..=r as i64).collect(),
                },
                &[a],
                TensorType::new(d, shape),
            )
            .ok()
    }

    /// `a` reshaped: flattened (half the time, from rank 2 up) or with its sizes in reverse
    /// order.
    pub(super) fn reshape(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let shape = if r > 1 && self.rng.chance(0.5) {
            vec![t.numel()]
        } else {
            t.shape.iter().rev().copied().collect()
        };
        let shape = if shape.iter().product::<usize>() == t.numel() {
            shape
        } else {
            vec![t.numel()]
        };
        self.b
            .inst_typed(Op::Reshape {}, &[a], TensorType::new(d, shape))
            .ok()
    }

    /// `a` under a random permutation (in large programs one that moves the innermost dimension,
    /// so transposes run in tiles).
    pub(super) fn transpose(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let r = t.rank();
        let mut p: Vec<i64> = (0..r as i64).collect();
        for i in (1..p.len()).rev() {
            let j = self.rng.below(i + 1);
            p.swap(i, j);
        }
        // Large programs move their innermost dimension (transposes in tiles).
        if self.cfg.elements.is_some() && r >= 2 && p[r - 1] == r as i64 - 1 {
            p.swap(r - 1, self.rng.below(r - 1));
        }
        self.b.inst(Op::Transpose { permutation: p }, &[a]).ok()
    }

    /// A random slice of `a` with strides of 1 or 2.
    pub(super) fn slice(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let mut s = Vec::new();
        let mut l = Vec::new();
        let mut st = Vec::new();
        for &n in &t.shape {
            let x = self.rng.below(n.max(1));
            let y = x + self.size(n - x);
            s.push(x as i64);
            l.push(y as i64);
            st.push(self.rng.below(2) as i64 + 1);
        }
        self.b
            .inst(
                Op::Slice {
                    start_indices: s,
                    limit_indices: l,
                    strides: st,
                },
                &[a],
            )
            .ok()
    }

    /// `a` reversed along random dimensions.
    pub(super) fn reverse(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let r = t.rank();
        let dims: Vec<i64> = (0..r as i64).filter(|_| self.rng.chance(0.5)).collect();
        self.b.inst(Op::Reverse { dimensions: dims }, &[a]).ok()
    }

    /// `a` padded with zeros: edges of -1 to 2 elements (a negative one crops), interiors of 0
    /// or 1.
    pub(super) fn pad(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let pv = self.scalar_const(d, 0.0);
        let lo: Vec<i64> = (0..r).map(|_| self.rng.below(3) as i64 - 1).collect();
        let hi: Vec<i64> = (0..r).map(|_| self.rng.below(3) as i64).collect();
        let int: Vec<i64> = (0..r).map(|_| self.rng.below(2) as i64).collect();
        self.b
            .inst(
                Op::Pad {
                    edge_padding_low: lo,
                    edge_padding_high: hi,
                    interior_padding: int,
                },
                &[a, pv],
            )
            .ok()
    }

    /// `a` and another value of its type joined along a random dimension.
    pub(super) fn concatenate(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let r = t.rank();
        let b = self.value_of(t);
        let dim = self.rng.below(r) as i64;
        self.b
            .inst(Op::Concatenate { dimension: dim }, &[a, b])
            .ok()
    }

    /// A window of `a` at run-time start indices (any values: they are clamped).
    pub(super) fn dynamic_slice(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let r = t.rank();
        let sizes: Vec<i64> = t.shape.iter().map(|&n| self.size(n) as i64).collect();
        let mut ops = vec![a];
        for _ in 0..r {
            let x = self.rng.below(9) as f64 - 4.0;
            ops.push(self.scalar_const(DType::I32, x));
        }
        self.b
            .inst(Op::DynamicSlice { slice_sizes: sizes }, &ops)
            .ok()
    }

    /// A window written into `a` at run-time start indices (clamped).
    pub(super) fn dynamic_update_slice(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let ushape: Vec<usize> = t.shape.iter().map(|&n| self.size(n)).collect();
        let u = self.value_of(&TensorType::new(d, ushape));
        let mut ops = vec![a, u];
        for _ in 0..r {
            let x = self.rng.below(9) as f64 - 4.0;
            ops.push(self.scalar_const(DType::I32, x));
        }
        self.b.inst(Op::DynamicUpdateSlice {}, &ops).ok()
    }
}

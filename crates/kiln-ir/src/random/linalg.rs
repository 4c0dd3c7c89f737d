//! Random linear algebra: `cholesky` of a positive definite matrix and a `triangular_solve`
//! by its factor, and `lu` of a diagonally dominant matrix.

use super::Gen;
use crate::{DType, Literal, Op, TensorType, ValueId};

impl Gen<'_> {
    /// A `cholesky` of a positive definite matrix made from `a` (an f32 or f64 value of rank at
    /// least 2, else a new one): `a aᵀ` plus `(k + 1) I` for `a`'s `k` columns, so its
    /// eigenvalues are at least `k + 1`; then, most of the time, a `triangular_solve` with
    /// the factor as its matrix. One time in eight an `lu` instead, one in eight an `fft`
    /// (`random/fft.rs`).
    pub(super) fn random_linalg(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        if self.rng.chance(0.25) {
            return if self.rng.chance(0.5) {
                self.random_lu()
            } else {
                self.random_fft(a, t)
            };
        }
        let (a, t) = if matches!(t.dtype, DType::F32 | DType::F64) && t.rank() >= 2 {
            (a, t.clone())
        } else {
            let d = self.linalg_dtype();
            let n = self.size(self.cfg.max_dim);
            let k = self.size(self.cfg.max_dim);
            let t = TensorType::new(d, [n, k]);
            (self.value_of(&t), t)
        };
        let r = t.rank() as i64;
        let (m, k) = (t.shape[t.rank() - 2], t.shape[t.rank() - 1]);
        let batch: Vec<i64> = (0..r - 2).collect();
        let gram = self
            .b
            .inst(
                Op::DotGeneral {
                    lhs_batching_dimensions: batch.clone(),
                    rhs_batching_dimensions: batch,
                    lhs_contracting_dimensions: vec![r - 1],
                    rhs_contracting_dimensions: vec![r - 1],
                },
                &[a, a],
            )
            .ok()?;
        let gt = self.ty(gram);
        let diag: Vec<f64> = (0..m * m)
            .map(|i| if i / m == i % m { (k + 1) as f64 } else { 0.0 })
            .collect();
        let value = Literal::from_f64s(TensorType::new(t.dtype, [m, m]), &diag).ok()?;
        let eye = self.b.inst(Op::Constant { value }, &[]).ok()?;
        let eye = self
            .b
            .inst_typed(
                Op::BroadcastInDim {
                    broadcast_dimensions: vec![r - 2, r - 1],
                },
                &[eye],
                gt.clone(),
            )
            .ok()?;
        let spd = self.b.binary(Op::Add {}, gram, eye).ok()?;
        let lower = self.rng.chance(0.5);
        let l = self.b.inst(Op::Cholesky { lower }, &[spd]).ok()?;
        if self.rng.chance(0.3) {
            return Some(l);
        }
        let left_side = self.rng.chance(0.5);
        let mut shape = gt.shape.clone();
        let side = if left_side {
            shape.len() - 1
        } else {
            shape.len() - 2
        };
        shape[side] = self.size(self.cfg.max_dim);
        let rhs = self.value_of(&TensorType::new(t.dtype, shape));
        let op = Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal: self.rng.chance(0.25),
            transpose_a: *self.rng.pick(crate::TransposeA::ALL),
        };
        self.b.inst(op, &[l, rhs]).ok()
    }

    /// An `lu` of `tanh(a) + (n + 2) I` for a square f32 or f64 `a`: strictly diagonally
    /// dominant by columns (every other element of a column is at most 1 in size), so every
    /// pivot is the diagonal one with a wide margin and rounding never changes the
    /// permutation; one of its three results.
    pub(super) fn random_lu(&mut self) -> Option<ValueId> {
        let d = self.linalg_dtype();
        let n = self.size(self.cfg.max_dim);
        let batch = self.rng.below(2);
        let mut shape = vec![2; batch];
        shape.extend([n, n]);
        let t = TensorType::new(d, shape);
        let a = self.value_of(&t);
        let bounded = self.b.unary(Op::Tanh {}, a).ok()?;
        let diag: Vec<f64> = (0..n * n)
            .map(|i| if i / n == i % n { (n + 2) as f64 } else { 0.0 })
            .collect();
        let value = Literal::from_f64s(TensorType::new(d, [n, n]), &diag).ok()?;
        let eye = self.b.inst(Op::Constant { value }, &[]).ok()?;
        let r = t.rank() as i64;
        let eye = self
            .b
            .inst_typed(
                Op::BroadcastInDim {
                    broadcast_dimensions: vec![r - 2, r - 1],
                },
                &[eye],
                t.clone(),
            )
            .ok()?;
        let m = self.b.binary(Op::Add {}, bounded, eye).ok()?;
        let rs = self.b.push(Op::Lu {}, &[m]).ok()?;
        Some(*self.rng.pick(&rs))
    }

    /// `f32` or `f64` at random, for a new matrix; for [`super::Config::differentiable`]
    /// programs the first of them among the configuration's types (if any), so that every
    /// float is one the gradient checks differentiate.
    pub(super) fn linalg_dtype(&mut self) -> DType {
        let d = *self.rng.pick(&[DType::F32, DType::F64]);
        if !self.cfg.differentiable {
            return d;
        }
        self.cfg
            .dtypes
            .iter()
            .copied()
            .find(|t| matches!(t, DType::F32 | DType::F64))
            .unwrap_or(d)
    }
}

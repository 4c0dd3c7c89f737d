//! The types of random values: parameters' types (small, around vector widths or large),
//! sizes with an occasional 0, and matrix products' widths.

use super::Gen;
use crate::{DType, TensorType};

impl Gen<'_> {
    pub(super) fn random_type(&mut self) -> TensorType {
        let dtype = *self.rng.pick(&self.cfg.dtypes);
        if let Some((lo, hi)) = self.cfg.elements {
            return self.large_type(dtype, lo, hi);
        }
        let rank = self.rng.below(self.cfg.max_rank + 1);
        let shape: Vec<usize> = (0..rank)
            .map(|_| {
                if self.cfg.dims.is_empty() {
                    self.size(self.cfg.max_dim)
                } else if self.rng.chance(self.cfg.empty) {
                    0
                } else {
                    *self.rng.pick(&self.cfg.dims)
                }
            })
            .collect();
        TensorType::new(dtype, shape)
    }

    /// A type of rank 1 to `max_rank` with between `lo` and `hi` elements (about): leading
    /// dimensions from `dims`, the last what remains, in a random order.
    pub(super) fn large_type(&mut self, dtype: DType, lo: usize, hi: usize) -> TensorType {
        let n = self.log_uniform(lo, hi);
        let rank = 1 + self.rng.below(self.cfg.max_rank.max(1));
        let mut shape = Vec::with_capacity(rank);
        let mut rest = n;
        for _ in 1..rank {
            let d = if self.cfg.dims.is_empty() {
                1 + self.rng.below(self.cfg.max_dim.max(1))
            } else {
                *self.rng.pick(&self.cfg.dims)
            };
            let d = d.clamp(1, rest);
            shape.push(d);
            rest /= d;
        }
        shape.push(rest.max(1));
        for i in (1..shape.len()).rev() {
            let j = self.rng.below(i + 1);
            shape.swap(i, j);
        }
        TensorType::new(dtype, shape)
    }

    /// An integer in `lo..=hi` (`1 <= lo <= hi`), uniform in its logarithm.
    pub(super) fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo.max(1) as f64).ln(), (hi.max(lo).max(1) as f64).ln());
        (self.rng.uniform(a, b).exp().round() as usize).clamp(lo, hi.max(lo))
    }

    /// A size in `0..=n`: 0 only with the chance `empty` (or when `n` is 0), else uniform in
    /// `1..=n`.
    pub(super) fn size(&mut self, n: usize) -> usize {
        if n == 0 || self.rng.chance(self.cfg.empty) {
            0
        } else {
            1 + self.rng.below(n)
        }
    }

    /// A `dot_general`'s width for a left operand `t`: small, or for large programs up to what
    /// keeps the multiply-adds under `16 * hi` and the right operand and result under `hi`
    /// elements, log-uniformly.
    pub(super) fn dot_width(&mut self, t: &TensorType) -> usize {
        let Some((_, hi)) = self.cfg.elements else {
            return self.size(self.cfg.max_dim);
        };
        let k = t.shape.last().copied().unwrap_or(1).max(1);
        let numel = t.numel().max(1);
        let rows = (numel / k).max(1);
        let max = (16 * hi / numel).min(hi / k).min(hi / rows).max(1);
        self.log_uniform(1, max)
    }
}

//! Random values made from no operand's elements: iotas, constants and random bits from a
//! key.

use super::{Gen, random_literal};
use crate::{DType, Op, TensorType, ValueId};

impl Gen<'_> {
    /// An iota of `a`'s shape along a random dimension (`i32` for `pred`); for a scalar a random
    /// constant.
    pub(super) fn iota_or_constant(&mut self, _a: ValueId, t: &TensorType) -> Option<ValueId> {
        let (d, r) = (t.dtype, t.rank());
        let ty = TensorType::new(if d.is_pred() { DType::I32 } else { d }, t.shape.clone());
        if r > 0 {
            let dim = self.rng.below(r) as i64;
            self.b
                .inst_typed(
                    Op::Iota {
                        iota_dimension: dim,
                    },
                    &[],
                    ty,
                )
                .ok()
        } else {
            let value = random_literal(self.rng, t);
            self.b.inst(Op::Constant { value }, &[]).ok()
        }
    }

    /// Random bits from a constant key: the state as four u32 words or as XLA's two u64s; u32
    /// or u64 bits.
    pub(super) fn random_bits(&mut self) -> Option<ValueId> {
        let state = if self.rng.chance(0.5) {
            TensorType::new(DType::U32, [4])
        } else {
            TensorType::new(DType::U64, [2])
        };
        let bits = *self.rng.pick(&[DType::U32, DType::U64]);
        let key = random_literal(self.rng, &state);
        let key = self.b.inst(Op::Constant { value: key }, &[]).ok();
        let n = self.size(self.cfg.max_dim);
        let shape: Vec<usize> = (0..self.rng.below(3)).map(|_| n).collect();
        key.and_then(|k| {
            self.b
                .push_typed(
                    Op::RngBitGenerator {
                        algorithm: crate::RngAlgorithm::ThreeFry,
                    },
                    &[k],
                    &[state, TensorType::new(bits, shape)],
                )
                .ok()
                .map(|rs| rs[1])
        })
    }
}

//! Random elementwise instructions: the unary and binary ops each element type takes, a
//! comparison choosing between two values, conversions, clamps, finiteness tests and bits
//! reinterpreted as another type of their width.

use super::Gen;
use crate::{ComparisonDirection, DType, Op, TensorType, ValueId};

impl Gen<'_> {
    /// One of the unary ops `a`'s element type takes (for floats a `reduce_precision` of
    /// random exponent and mantissa widths among them).
    pub(super) fn unary(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let d = t.dtype;
        let ops: Vec<Op> = if d.is_complex() {
            vec![
                Op::Negate {},
                Op::Abs {},
                Op::Sign {},
                Op::Exponential {},
                Op::ExponentialMinusOne {},
                Op::Log {},
                Op::LogPlusOne {},
                Op::Sqrt {},
                Op::Rsqrt {},
                Op::Sine {},
                Op::Cosine {},
                Op::Tan {},
                Op::Tanh {},
                Op::Real {},
                Op::Imag {},
            ]
        } else if d.is_float() {
            vec![
                Op::Negate {},
                Op::Abs {},
                Op::Exponential {},
                Op::Tanh {},
                Op::Logistic {},
                Op::Sine {},
                Op::Floor {},
                Op::Erf {},
                Op::Sqrt {},
                Op::Log {},
                Op::Ceil {},
                Op::RoundNearestAfz {},
                Op::Cosine {},
                Op::ExponentialMinusOne {},
                Op::LogPlusOne {},
                Op::Rsqrt {},
                Op::Tan {},
                Op::Cbrt {},
                Op::RoundNearestEven {},
                Op::ReducePrecision {
                    exponent_bits: 1 + self.rng.below(8) as i64,
                    mantissa_bits: self.rng.below(12) as i64,
                },
            ]
        } else if d.is_pred() {
            vec![Op::Not {}]
        } else if d.is_signed() {
            vec![
                Op::Negate {},
                Op::Abs {},
                Op::Sign {},
                Op::Not {},
                Op::Popcnt {},
                Op::CountLeadingZeros {},
            ]
        } else {
            vec![
                Op::Not {},
                Op::Negate {},
                Op::Popcnt {},
                Op::CountLeadingZeros {},
            ]
        };
        // `reduce_precision`'s VJP is a straight-through estimator, not its derivative.
        let ops: Vec<Op> = ops
            .into_iter()
            .filter(|op| !(self.cfg.differentiable && matches!(op, Op::ReducePrecision { .. })))
            .collect();
        let op = self.rng.pick(&ops).clone();
        self.b.inst(op, &[a]).ok()
    }

    /// For a complex `a`, a binary op with another value of its type, or `complex` of their
    /// parts, crossed.
    pub(super) fn complex_binary(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let ops = [
            Op::Add {},
            Op::Subtract {},
            Op::Multiply {},
            Op::Divide {},
            Op::Power {},
            Op::Complex {},
        ];
        let op = self.rng.pick(&ops).clone();
        let b = self.value_of(t);
        if op == (Op::Complex {}) {
            // Parts taken apart and put together again, crossed.
            let re = self.b.inst(Op::Real {}, &[a]).ok();
            let im = self.b.inst(Op::Imag {}, &[b]).ok();
            re.zip(im)
                .and_then(|(re, im)| self.b.inst(op, &[im, re]).ok())
        } else {
            self.b.inst(op, &[a, b]).ok()
        }
    }

    /// One of the binary ops `a`'s element type takes, with another value of its type.
    pub(super) fn binary(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let d = t.dtype;
        let ops: Vec<Op> = if d.is_float() {
            vec![
                Op::Add {},
                Op::Subtract {},
                Op::Multiply {},
                Op::Divide {},
                Op::Maximum {},
                Op::Minimum {},
                Op::Power {},
                Op::Remainder {},
                Op::Atan2 {},
            ]
        } else if d.is_pred() {
            vec![Op::And {}, Op::Or {}, Op::Xor {}, Op::Add {}]
        } else {
            vec![
                Op::Add {},
                Op::Subtract {},
                Op::Multiply {},
                Op::Maximum {},
                Op::And {},
                Op::Xor {},
                Op::ShiftLeft {},
                Op::ShiftRightLogical {},
                Op::ShiftRightArithmetic {},
                Op::Divide {},
            ]
        };
        let op = self.rng.pick(&ops).clone();
        let b = self.value_of(t);
        self.b.inst(op, &[a, b]).ok()
    }

    /// `a` compared with another value of its type in a random direction, choosing between `a`
    /// and a third value.
    pub(super) fn compare_select(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let b = self.value_of(t);
        let dir = *self.rng.pick(ComparisonDirection::ALL);
        let p = self
            .b
            .inst(
                Op::Compare {
                    comparison_direction: dir,
                },
                &[a, b],
            )
            .ok();
        let c = self.value_of(t);
        p.and_then(|p| self.b.inst(Op::Select {}, &[p, a, c]).ok())
    }

    /// `a` converted to one of the configuration's element types.
    pub(super) fn convert(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let to = *self.rng.pick(&self.cfg.dtypes);
        self.b
            .inst_typed(Op::Convert {}, &[a], t.with_dtype(to))
            .ok()
    }

    /// `a` clamped between two values of its type (bounds may cross: the spec's order of max
    /// then min decides).
    pub(super) fn clamp(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let lo = self.value_of(t);
        let hi = self.value_of(t);
        self.b.inst(Op::Clamp {}, &[lo, a, hi]).ok()
    }

    /// A finiteness test of a float `a` half the time, else its bits reinterpreted as another
    /// type of the same width (never for [`super::Config::differentiable`] programs: bits have
    /// no derivative, so only the finiteness test).
    pub(super) fn finite_or_bitcast(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let d = t.dtype;
        if (d.is_float() && self.rng.chance(0.5)) || self.cfg.differentiable {
            self.b.inst(Op::IsFinite {}, &[a]).ok()
        } else {
            // Any other type of the same width (the same type when there is none).
            // Complex types and small floats only where the configuration has them.
            let same: Vec<DType> = DType::ALL
                .into_iter()
                .filter(|&o| o != d && !o.is_pred() && !d.is_pred() && o.bits() == d.bits())
                .filter(|o| !(o.is_complex() || o.mini().is_some()) || self.cfg.dtypes.contains(o))
                .collect();
            let to = if same.is_empty() {
                d
            } else {
                *self.rng.pick(&same)
            };
            self.b
                .inst_typed(Op::BitcastConvert {}, &[a], t.with_dtype(to))
                .ok()
        }
    }
}

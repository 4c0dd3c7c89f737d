//! Random ops whose result element type is not their operands': `bitcast_convert` to and from
//! `pred` (an n-bit element is n `pred`s, least significant bit first), and `dot_general` and
//! `convolution` computing in a wider type than their operands' (`bf16 x bf16 -> f32`,
//! `i8 x i8 -> i32`, `u8 x u8 -> u16`: `verify::widens`).

use super::Gen;
use crate::verify::widens;
use crate::{DType, Op, TensorType, ValueId};

/// The most `pred`s a bitcast to `pred` makes, so that small programs stay small.
const MOST_BITS: usize = 4096;

impl Gen<'_> {
    /// Outside large programs, one step in twelve also adds one of this module's ops (no
    /// bitcast for [`super::Config::differentiable`] programs), drawn
    /// from a stream of its own (as [`Gen::maybe_region_op`]'s), so a seed's program changes
    /// only where one is added.
    pub(super) fn maybe_typed_op(&mut self) {
        if self.cfg.elements.is_some() || self.pool.is_empty() {
            return;
        }
        let v = self.on_side_stream(0xA54F_F53A_5F1D_36F1, 12, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            match g.rng.below(5) {
                // Bits have no derivative: a product for differentiable programs.
                0 | 1 if !g.cfg.differentiable => g.pred_bitcast(a, &t),
                0..=3 => g.widening_dot(a, &t),
                _ => g.widening_convolution(t.dtype),
            }
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
        }
    }

    /// The element types a `pred` tensor with a last dimension of `bits` bitcasts to: not
    /// complex, not a sub-byte integer (`bitcast_convert_c3`), small floats only where the
    /// configuration has them.
    fn pred_partners(&self, bits: usize) -> Vec<DType> {
        DType::ALL
            .into_iter()
            .filter(|d| !d.is_pred() && !d.is_complex() && d.bits() as usize == bits && bits >= 8)
            .filter(|d| d.mini().is_none() || self.cfg.dtypes.contains(d))
            .collect()
    }

    /// `a` bitcast to `pred` (a last dimension of its width in bits), then, half the time,
    /// those bits combined with others (`not`, `xor`) and bitcast back to a type of the same
    /// width; a `pred` `a` whose last dimension is a width is bitcast to a type of that width.
    pub(super) fn pred_bitcast(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let d = t.dtype;
        if d.is_pred() {
            let bits = *t.shape.last()?;
            let partners = self.pred_partners(bits);
            if partners.is_empty() {
                return None;
            }
            let to = *self.rng.pick(&partners);
            let shape = &t.shape[..t.rank() - 1];
            return self
                .b
                .inst_typed(Op::BitcastConvert {}, &[a], TensorType::new(to, shape))
                .ok();
        }
        let bits = d.bits() as usize;
        if self.pred_partners(bits).is_empty() || t.numel() * bits > MOST_BITS {
            return None;
        }
        let mut shape = t.shape.clone();
        shape.push(bits);
        let pt = TensorType::new(DType::Pred, shape);
        let p = self
            .b
            .inst_typed(Op::BitcastConvert {}, &[a], pt.clone())
            .ok()?;
        if self.rng.chance(0.5) {
            return Some(p);
        }
        let q = if self.rng.chance(0.5) {
            self.b.unary(Op::Not {}, p).ok()?
        } else {
            let x = self.value_of(&pt);
            self.b.binary(Op::Xor {}, p, x).ok()?
        };
        let to = *self.rng.pick(&self.pred_partners(bits));
        self.b
            .inst_typed(Op::BitcastConvert {}, &[q], t.with_dtype(to))
            .ok()
    }

    /// The element types of the configuration that `d` widens to.
    fn wider_types(&self, d: DType) -> Vec<DType> {
        (self.cfg.dtypes.iter().copied())
            .filter(|&w| widens(d, w))
            .collect()
    }

    /// An element type of the configuration with a wider one: `d` when it has one, else a
    /// random one.
    fn narrow_type(&mut self, d: DType) -> Option<DType> {
        if !self.wider_types(d).is_empty() {
            return Some(d);
        }
        let narrow: Vec<DType> = (self.cfg.dtypes.iter().copied())
            .filter(|&n| !self.wider_types(n).is_empty())
            .collect();
        (!narrow.is_empty()).then(|| *self.rng.pick(&narrow))
    }

    /// `a` (or a new value of a type with a wider one) times a matrix, contracting the last
    /// dimension, computed in a wider type (`preferred_element_type`); with a batch dimension
    /// one time in three.
    pub(super) fn widening_dot(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let d = self.narrow_type(t.dtype)?;
        let (a, t) = if d == t.dtype && t.rank() >= 1 {
            (a, t.clone())
        } else {
            let t = TensorType::new(d, [self.size(self.cfg.max_dim), self.size(4)]);
            (self.value_of(&t), t)
        };
        let to = *self.rng.pick(&self.wider_types(d));
        let r = t.rank();
        let k = t.shape[r - 1];
        let n = self.dot_width(&t);
        let batched = r >= 2 && self.rng.chance(1.0 / 3.0);
        let (w, op, mut shape) = if batched {
            let w = self.value_of(&TensorType::new(d, [t.shape[0], k, n]));
            let op = Op::DotGeneral {
                lhs_batching_dimensions: vec![0],
                rhs_batching_dimensions: vec![0],
                lhs_contracting_dimensions: vec![r as i64 - 1],
                rhs_contracting_dimensions: vec![1],
            };
            (w, op, t.shape[..r - 1].to_vec())
        } else {
            let w = self.value_of(&TensorType::new(d, [k, n]));
            let op = Op::DotGeneral {
                lhs_batching_dimensions: vec![],
                rhs_batching_dimensions: vec![],
                lhs_contracting_dimensions: vec![r as i64 - 1],
                rhs_contracting_dimensions: vec![0],
            };
            (w, op, t.shape[..r - 1].to_vec())
        };
        shape.push(n);
        self.b
            .inst_typed(op, &[a, w], TensorType::new(to, shape))
            .ok()
    }

    /// A [`Gen::convolution`] of operands of `d` (or of a type of the configuration with a
    /// wider one) computed in a wider type.
    pub(super) fn widening_convolution(&mut self, d: DType) -> Option<ValueId> {
        let d = self.narrow_type(d)?;
        let to = *self.rng.pick(&self.wider_types(d));
        let (op, x, k) = self.convolution_parts(d);
        // The result's shape is the operands' type's: that of the same op built on a copy.
        let mut probe = self.b.clone();
        let same = probe.inst(op.clone(), &[x, k]).ok()?;
        let ty = probe.ty(same)?.with_dtype(to);
        self.b.inst_typed(op, &[x, k], ty).ok()
    }
}

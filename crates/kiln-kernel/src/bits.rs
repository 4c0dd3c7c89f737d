//! `bitcast_convert` to and from `pred`, as integer arithmetic the kernels compute.
//!
//! A `pred` is one bit (StableHLO's `i1`): `X[d...]` bitcasts to `pred[d..., n]` with `n` the
//! width of `X`, element `k` of the last dimension being bit `k` (the least significant
//! first), and back. Lowering has kernels for bitcasts between types that are bytes in
//! memory, not for these, so [`expand_pred_bitcasts`] rewrites them before lowering:
//!
//! - bits out: the value's bits as the unsigned integer of its width (a bitcast between
//!   equal widths), widened to u64, spread along a new last dimension, shifted right by
//!   that dimension's index, `& 1`, `!= 0`;
//! - bits in: each `pred` as a u64 shifted left by its index, or-reduced over the last
//!   dimension, narrowed to the unsigned type of the result's width and bitcast to it.

use crate::canon::rebuild;
use kiln_ir::{Builder, Combiner, ComparisonDirection, DType, Func, Literal, Op, TensorType};
use kiln_ir::{ValueId, VerifyError};

/// The unsigned integer type of `bits` bits.
fn unsigned(bits: u32) -> DType {
    match bits {
        8 => DType::U8,
        16 => DType::U16,
        32 => DType::U32,
        _ => DType::U64,
    }
}

/// A u64 constant of type `ty`, every element `x`.
fn constant(b: &mut Builder, ty: &TensorType, x: i64) -> Result<ValueId, VerifyError> {
    let value =
        Literal::from_i64s(ty.clone(), &vec![x; ty.numel()]).expect("a literal of its own size");
    b.inst_typed(Op::Constant { value }, &[], ty.clone())
}

/// `f` with every `bitcast_convert` to or from `pred` (and a non-`pred` type) computed by
/// shifts and masks (see the module docs).
pub fn expand_pred_bitcasts(f: &Func) -> Result<Func, VerifyError> {
    let is_pred_cast = |i: &kiln_ir::Inst| {
        matches!(i.op, Op::BitcastConvert {})
            && f.values[i.operands[0].index()].dtype.is_pred()
                != f.values[i.results[0].index()].dtype.is_pred()
    };
    if !f.insts.iter().any(is_pred_cast) {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        if !is_pred_cast(inst) {
            return Ok(None);
        }
        let (from, to) = (
            &f.values[inst.operands[0].index()],
            &f.values[inst.results[0].index()],
        );
        let (word_ty, bits_ty) = if from.dtype.is_pred() {
            (to, from)
        } else {
            (from, to)
        };
        let last = bits_ty.rank() as i64 - 1;
        let wide = bits_ty.with_dtype(DType::U64);
        let shifts = b.inst_typed(
            Op::Iota {
                iota_dimension: last,
            },
            &[],
            wide.clone(),
        )?;
        let carrier = unsigned(word_ty.dtype.bits());
        if from.dtype.is_pred() {
            // Bits in.
            let x = b.convert(ops[0], DType::U64)?;
            let x = b.binary(Op::ShiftLeft {}, x, shifts)?;
            let zero = constant(b, &TensorType::scalar(DType::U64), 0)?;
            let word = b.inst(
                Op::Reduce {
                    dimensions: vec![last],
                    kind: Combiner::Or,
                },
                &[x, zero],
            )?;
            let word = if carrier == DType::U64 {
                word
            } else {
                b.convert(word, carrier)?
            };
            let v = if to.dtype == carrier {
                word
            } else {
                b.inst_typed(Op::BitcastConvert {}, &[word], to.clone())?
            };
            return Ok(Some(vec![v]));
        }
        // Bits out.
        let word = if from.dtype == carrier {
            ops[0]
        } else {
            b.inst_typed(Op::BitcastConvert {}, &[ops[0]], from.with_dtype(carrier))?
        };
        let word = if carrier == DType::U64 {
            word
        } else {
            b.convert(word, DType::U64)?
        };
        let spread = b.broadcast(word, &(0..last).collect::<Vec<_>>(), &wide.shape)?;
        let shifted = b.binary(Op::ShiftRightLogical {}, spread, shifts)?;
        let one = constant(b, &wide, 1)?;
        let bit = b.binary(Op::And {}, shifted, one)?;
        let zero = constant(b, &wide, 0)?;
        Ok(Some(vec![b.compare(bit, zero, ComparisonDirection::Ne)?]))
    })
}

//! Which element types the type rules accept: the wider types a product may compute in, the
//! types of elementwise ops, the types each reduction combiner applies to.

use crate::attr::Combiner;
use crate::{DType, OpKind};

/// Whether every value of `from` is a value of `to`, a wider type a matrix product may
/// compute in (`preferred_element_type`): a wider float for floats, a wider signed integer for
/// integers.
pub fn widens(from: DType, to: DType) -> bool {
    use DType::*;
    if let (Some((flo, fhi)), Some((tlo, thi))) = (from.int_bounds(), to.int_bounds()) {
        // An integer type whose range holds the other's (u8 -> i16, i8 -> i32, u32 -> u64).
        return !from.is_pred() && to.bits() > from.bits() && tlo <= flo && thi >= fhi;
    }
    matches!((from, to), (F16 | BF16 | Mini(_), F32 | F64) | (F32, F64))
}

/// Which element types an elementwise op accepts.
pub(super) fn elementwise_dtypes(k: OpKind) -> (&'static str, fn(DType) -> bool) {
    use OpKind::*;
    match k {
        // Complex maximum and minimum: StableHLO's lexicographic order of (real, imaginary).
        Add | Multiply | Maximum | Minimum => ("any", |_| true),
        Atan2 => ("float or complex", |d| d.is_float() || d.is_complex()),
        Subtract | Divide | Power | Negate => ("integer, float or complex", |d| !d.is_pred()),
        Remainder => ("integer or float", |d| !d.is_pred() && !d.is_complex()),
        And | Or | Xor | Not => ("pred or integer", |d| d.is_pred() || d.is_int()),
        ShiftLeft | ShiftRightLogical | ShiftRightArithmetic | Popcnt | CountLeadingZeros => {
            ("integer", |d| d.is_int())
        }
        Abs | Sign => ("signed integer, float or complex", |d| {
            d.is_signed() || d.is_complex()
        }),
        Exponential | ExponentialMinusOne | Log | LogPlusOne | Sqrt | Rsqrt | Sine | Cosine
        | Tan | Tanh | Cbrt | Logistic => ("float or complex", |d| d.is_float() || d.is_complex()),
        Real | Imag => ("float or complex", |d| d.is_float() || d.is_complex()),
        _ => ("float", |d| d.is_float()),
    }
}

/// Whether a combiner applies to a dtype: `and`/`or` need pred or integers, `replace` is only
/// for scatter (checked by the caller).
pub(super) fn combiner_ok(kind: Combiner, d: DType) -> bool {
    match kind {
        Combiner::And | Combiner::Or => d.is_pred() || d.is_int(),
        // Complex numbers have no order.
        Combiner::Max | Combiner::Min => !d.is_complex(),
        _ => true,
    }
}

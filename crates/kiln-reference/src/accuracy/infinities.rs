//! How infinities enter the magnitudes of [`crate::accuracy`]: an infinity carries no rounding
//! (an argument's or constant's has magnitude 0, and an op on it gives that infinity, or NaN,
//! in every backend), but a sum's infinite element whose finite terms pass the accumulator's
//! range may be NaN in a backend, where its partial sums overflowed to the other infinity.

use super::{accumulator_max, map};
use kiln_ir::Literal;

/// A real value's size as a magnitude: `|x|`, but 0 for an infinity, which carries no
/// rounding. (A complex number's modulus stays: its other part may be finite and large.)
pub(super) fn size(x: f64) -> f64 {
    if x.is_infinite() { 0.0 } else { x.abs() }
}

/// The sizes of `l`'s elements ([`size`]; moduli for complex numbers).
pub(super) fn sizes(l: &Literal) -> Literal {
    map(
        l,
        if l.dtype().is_complex() {
            f64::abs
        } else {
            size
        },
    )
}

/// The magnitudes `m` of the elements of `x` as an operand of a maximum or minimum: 0 where the
/// element is an infinity that every backend has. Such an element is the result only where the
/// result is that infinity; elsewhere it is not selected, by the reference nor by a backend,
/// whose value there is that infinity or past the dtype's range.
/// So the `-inf` of a mask (`select` before a row's maximum) bounds nothing it does not select.
pub(super) fn at_finite(x: &Literal, m: &Literal) -> Literal {
    if !x.dtype().is_float() {
        return m.clone();
    }
    // Unless the infinity's finite terms pass the accumulator's range: a backend's partial sums
    // may overflow there to the other infinity, and hold NaN (seed 129799: a convolution's).
    let top = accumulator_max(x.dtype());
    let v: Vec<f64> = m
        .to_f64s()
        .into_iter()
        .zip(x.to_f64s())
        .map(|(mg, v)| {
            if v.is_infinite() && mg <= top {
                0.0
            } else {
                mg
            }
        })
        .collect();
    Literal::from_f64s(m.ty().clone(), &v).expect("same size")
}

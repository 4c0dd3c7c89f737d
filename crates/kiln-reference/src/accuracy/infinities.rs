//! How infinities enter the magnitudes of [`crate::accuracy`]. An infinity that every backend
//! has carries no rounding: an argument's or constant's has magnitude 0, and so has an
//! infinite result of exact operands (`x / 0`, `ln 0`); an infinite result keeps its rule's
//! magnitude (a sum's finite terms) while that stays below its dtype's largest finite value.
//! Past it the infinity may be a backend's rounding (a finite value there) or its partial sums
//! meeting the other infinity (NaN), and its magnitude is infinite.

use super::map;
use kiln_ir::{DType, Literal};

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

/// The largest finite value of float dtype `d` (of its parts for a complex one).
pub(super) fn largest(d: DType) -> f64 {
    match d.part() {
        DType::F16 => 65504.0,
        DType::BF16 => f64::from(f32::from_bits(0x7f7f_0000)),
        DType::F32 => f64::from(f32::MAX),
        DType::Mini(m) => m.max_value(),
        _ => f64::MAX,
    }
}

/// The magnitude of a real result `y` whose rule gave `x` (not NaN): at least `|y|`; for an
/// infinite `y`, `x` where it is below `top` (the dtype's largest finite value: the infinity is
/// an operand's), else infinite.
pub(super) fn of_result(x: f64, y: f64, top: f64) -> f64 {
    match y.is_infinite() {
        true if x < top => x,
        true => f64::INFINITY,
        false => x.max(y.abs()),
    }
}

/// The magnitudes `m` of the elements of `x` as an operand of a maximum or minimum: 0 where the
/// element is an infinity every backend has (its magnitude below the dtype's largest finite
/// value, [`of_result`]). Such an element is the result only where the result is that
/// infinity; elsewhere it is not selected, by the reference nor by a backend. So the `-inf` of
/// a mask (`select` before a row's maximum) bounds nothing it does not select, but a sum's
/// infinity that a backend may have as NaN (seed 129799: a convolution's, its products past
/// f32's range beside an input's `-inf`) keeps its magnitude, and so the maximum's.
pub(super) fn at_finite(x: &Literal, m: &Literal) -> Literal {
    if !x.dtype().is_float() {
        return m.clone();
    }
    let top = largest(x.dtype());
    let v: Vec<f64> = m
        .to_f64s()
        .into_iter()
        .zip(x.to_f64s())
        .map(|(mg, v)| if v.is_infinite() && mg < top { 0.0 } else { mg })
        .collect();
    Literal::from_f64s(m.ty().clone(), &v).expect("same size")
}

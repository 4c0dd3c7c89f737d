//! Random values of a type, with or without special floats.

use super::Rng;
use crate::{DType, Literal, TensorType};

/// Random values of a type: floats in [-4, 4) (`f8e8m0fnu`, which has no sign, in (0, 4)),
/// integers in [-20, 20) (unsigned [0, 40)), random `pred`s.
pub fn random_literal(rng: &mut Rng, ty: &TensorType) -> Literal {
    let n = ty.numel();
    if ty.dtype.is_float() {
        let unsigned = ty.dtype == DType::F8E8M0FNU;
        let v: Vec<f64> = (0..n)
            .map(|_| rng.uniform(-4.0, 4.0))
            .map(|x| if unsigned { x.abs() } else { x })
            .collect();
        Literal::from_f64s(ty.clone(), &v).expect("sizes match")
    } else {
        let v: Vec<i64> = (0..n)
            .map(|_| match ty.dtype {
                DType::Pred => rng.below(2) as i64,
                d if !d.is_signed() => rng.below(40) as i64,
                _ => rng.below(40) as i64 - 20,
            })
            .collect();
        Literal::from_i64s(ty.clone(), &v).expect("sizes match")
    }
}

/// Like [`random_literal`], with each float element replaced, with probability `rate`, by a
/// special value: -0, +inf, -inf, NaN, a subnormal of the dtype or its largest finite value.
pub fn random_literal_with_specials(rng: &mut Rng, ty: &TensorType, rate: f64) -> Literal {
    let l = random_literal(rng, ty);
    if !ty.dtype.is_float() || rate <= 0.0 {
        return l;
    }
    let (sub, max) = match ty.dtype {
        DType::F16 => (3.0e-6, 65504.0),
        DType::BF16 => (5.0e-39, 3.38e38),
        DType::Mini(m) => (m.to_f64(1), m.max_value()),
        DType::F32 => (5.0e-40, f64::from(f32::MAX)),
        _ => (5.0e-310, f64::MAX),
    };
    let specials = [
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        sub,
        -sub,
        max,
        -max,
    ];
    let v: Vec<f64> = l
        .to_f64s()
        .into_iter()
        .map(|x| {
            if rng.chance(rate) {
                *rng.pick(&specials)
            } else {
                x
            }
        })
        .collect();
    Literal::from_f64s(ty.clone(), &v).expect("sizes match")
}

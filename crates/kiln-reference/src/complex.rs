//! Complex numbers (`c64`, `c128`) on the reference: each element a pair `[re, im]` computed
//! in f64 by StableHLO's formulas and rounded to the part type once per op, as real floats are.
//!
//! Ops that only move elements (layout ops, `select`, `gather`, `dynamic_slice`, ...) need
//! nothing here: they copy whole elements whatever their dtype. Reductions and scatters combine
//! with [`combine_c`]; this module computes the elementwise ops, `compare`, `convert`, `real`,
//! `imag`, `complex` and `dot_general`.

use crate::products::{DotDims, dot_general};
use kiln_ir::{Combiner, ComparisonDirection, DType, Literal, Op, TensorType};

/// A complex number: real and imaginary parts.
pub type C = [f64; 2];

const VERIFIED: &str = "the verifier guarantees consistent types";

/// The result of `op` on `x` when the op computes on complex numbers (an operand or the result
/// is complex, or the op is `real`, `imag` or `complex`); `None` for every other op, which
/// [`crate::eval_op`] computes as it does for real types.
pub(crate) fn eval(op: &Op, x: &[&Literal], ty: &TensorType) -> Option<Literal> {
    let complex_in = x.iter().any(|l| l.dtype().is_complex()) || ty.dtype.is_complex();
    let out = |v: Vec<C>| Literal::from_complex_f64s(ty.clone(), &v).expect(VERIFIED);
    let real_out = |v: Vec<f64>| Literal::from_f64s(ty.clone(), &v).expect(VERIFIED);
    Some(match op {
        Op::Real {} => real_out(x[0].to_complex_f64s().iter().map(|z| z[0]).collect()),
        Op::Imag {} => real_out(x[0].to_complex_f64s().iter().map(|z| z[1]).collect()),
        Op::Complex {} => out(x[0]
            .to_f64s()
            .into_iter()
            .zip(x[1].to_f64s())
            .map(|(re, im)| [re, im])
            .collect()),
        _ if !complex_in => return None,
        Op::Add {}
        | Op::Subtract {}
        | Op::Multiply {}
        | Op::Divide {}
        | Op::Power {}
        | Op::Atan2 {} => {
            let f: fn(C, C) -> C = match op {
                Op::Add {} => add,
                Op::Subtract {} => |a, b| [a[0] - b[0], a[1] - b[1]],
                Op::Multiply {} => mul,
                Op::Divide {} => div,
                Op::Atan2 {} => atan2,
                _ => pow,
            };
            let (a, b) = (x[0].to_complex_f64s(), x[1].to_complex_f64s());
            out(a.into_iter().zip(b).map(|(a, b)| f(a, b)).collect())
        }
        Op::Maximum {} | Op::Minimum {} => {
            // lhs when it comes after (maximum) or before (minimum) rhs, else rhs.
            let max = matches!(op, Op::Maximum {});
            let (a, b) = (x[0].to_complex_f64s(), x[1].to_complex_f64s());
            out(a
                .into_iter()
                .zip(b)
                .map(|(a, b)| {
                    let first = if max {
                        lex_greater(a, b)
                    } else {
                        lex_greater(b, a)
                    };
                    if first { a } else { b }
                })
                .collect())
        }
        Op::Abs {} => real_out(
            x[0].to_complex_f64s()
                .iter()
                .map(|z| z[0].hypot(z[1]))
                .collect(),
        ),
        Op::Negate {}
        | Op::Sign {}
        | Op::Exponential {}
        | Op::ExponentialMinusOne {}
        | Op::Log {}
        | Op::LogPlusOne {}
        | Op::Sqrt {}
        | Op::Rsqrt {}
        | Op::Sine {}
        | Op::Cosine {}
        | Op::Tan {}
        | Op::Tanh {}
        | Op::Cbrt {}
        | Op::Logistic {} => {
            let f = unary(op).expect(VERIFIED);
            out(x[0].to_complex_f64s().into_iter().map(f).collect())
        }
        Op::Compare {
            comparison_direction: dir,
        } => {
            let eq = |(a, b): (C, C)| a[0] == b[0] && a[1] == b[1];
            let (a, b) = (x[0].to_complex_f64s(), x[1].to_complex_f64s());
            let v: Vec<i64> = a
                .into_iter()
                .zip(b)
                .map(|p| (eq(p) == (*dir == ComparisonDirection::Eq)) as i64)
                .collect();
            Literal::from_i64s(ty.clone(), &v).expect(VERIFIED)
        }
        Op::Convert {} => {
            let src = x[0];
            if src.dtype().is_complex() && !ty.dtype.is_complex() {
                // The imaginary part is dropped; the real part converts as an f64 does.
                let re = Literal::from_f64s(src.ty().with_dtype(DType::F64), &src.to_f64s())
                    .expect(VERIFIED);
                return Some(crate::eval_op(op, &[&re], std::slice::from_ref(ty)).remove(0));
            }
            // To complex: the operand's value (a complex operand's parts) rounded to the part
            // type, the imaginary part 0 for a real operand.
            out(src.to_complex_f64s())
        }
        Op::DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } => {
            // Four real products in f64: (ar br - ai bi) + i (ar bi + ai br).
            let dims = DotDims { lb, rb, lc, rc };
            let real_ty = ty.with_dtype(DType::F64);
            let (ar, ai) = parts(x[0]);
            let (br, bi) = parts(x[1]);
            let dot = |a: &Literal, b: &Literal| dot_general(a, b, &real_ty, &dims).to_f64s();
            let (rr, ii, ri, ir) = (dot(&ar, &br), dot(&ai, &bi), dot(&ar, &bi), dot(&ai, &br));
            out((0..ty.numel())
                .map(|k| [rr[k] - ii[k], ri[k] + ir[k]])
                .collect())
        }
        _ => return None,
    })
}

/// The real and imaginary parts of a complex literal, as f64 literals of its shape.
fn parts(l: &Literal) -> (Literal, Literal) {
    let z = l.to_complex_f64s();
    let ty = l.ty().with_dtype(DType::F64);
    let part = |k: usize| {
        Literal::from_f64s(ty.clone(), &z.iter().map(|c| c[k]).collect::<Vec<_>>()).expect(VERIFIED)
    };
    (part(0), part(1))
}

/// One step of a complex reduction or scatter: the accumulator `a` combined with `b`.
pub fn combine_c(kind: Combiner, a: C, b: C) -> C {
    match kind {
        Combiner::Replace => b,
        Combiner::Add => add(a, b),
        Combiner::Mul => mul(a, b),
        Combiner::Max | Combiner::Min | Combiner::And | Combiner::Or => {
            unreachable!("the verifier allows no ordering or bitwise combiner on complex numbers")
        }
    }
}

/// The complex function an elementwise unary op computes, or `None` if it has none.
pub fn unary(op: &Op) -> Option<fn(C) -> C> {
    Some(match op {
        Op::Negate {} => |z| [-z[0], -z[1]],
        Op::Sign {} => sign,
        Op::Exponential {} => exp,
        Op::ExponentialMinusOne {} => expm1,
        Op::Log {} => log,
        Op::LogPlusOne {} => log1p,
        Op::Sqrt {} => sqrt,
        Op::Rsqrt {} => |z| div([1.0, 0.0], sqrt(z)),
        Op::Sine {} => |z| [z[0].sin() * z[1].cosh(), z[0].cos() * z[1].sinh()],
        Op::Cosine {} => |z| [z[0].cos() * z[1].cosh(), -(z[0].sin() * z[1].sinh())],
        Op::Tan {} => tan,
        // tanh(z) = -i tan(iz).
        Op::Tanh {} => |z| {
            let t = tan([-z[1], z[0]]);
            [t[1], -t[0]]
        },
        Op::Cbrt {} => cbrt,
        Op::Logistic {} => logistic,
        _ => return None,
    })
}

/// Whether `a` comes after `b` in StableHLO's lexicographic order of (real, imaginary) pairs
/// (a NaN part compares false: the other operand is taken).
pub fn lex_greater(a: C, b: C) -> bool {
    a[0] > b[0] || (a[0] == b[0] && a[1] > b[1])
}

/// `a + b`.
pub fn add(a: C, b: C) -> C {
    [a[0] + b[0], a[1] + b[1]]
}

/// `a * b` = (ac - bd) + i (ad + bc).
pub fn mul(a: C, b: C) -> C {
    [a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]]
}

/// Parts below 2^-969 (2^(emin + p) of f64) lose bits where they are halved, or where hypot's
/// result or Smith's quotients round in the subnormal range: a number whose parts both are
/// scales by 2^108 (exactly; even and a multiple of 3, so that square and cube roots scale
/// back exactly) before `sqrt`, `cbrt`, `log`, `sign` and `div` take it apart. (Only `c128`
/// values get there: the parts of a `c64` are f32 values, 2^-149 and up.)
///
/// Whether both parts of `z` are below 2^-969 (NaN is not).
fn tiny(z: C) -> bool {
    let bound = 2f64.powi(-969);
    z[0].abs() < bound && z[1].abs() < bound
}

/// `z` times 2^e.
fn scale(z: C, e: i32) -> C {
    let s = 2f64.powi(e);
    [z[0] * s, z[1] * s]
}

/// `a / b` by Smith's scaled division: the larger part of `b` divides first, so no square
/// of `b` overflows or underflows; a numerator or divisor of tiny parts scaled up first.
pub fn div(a: C, b: C) -> C {
    match (tiny(a), tiny(b) && b != [0.0, 0.0]) {
        (true, false) => scale(smith(scale(a, 108), b), -108),
        (false, true) => scale(smith(a, scale(b, 108)), 108),
        (true, true) => smith(scale(a, 108), scale(b, 108)),
        (false, false) => smith(a, b),
    }
}

/// Smith's quotient `a / b`.
fn smith(a: C, b: C) -> C {
    let ([p, q], [c, d]) = (a, b);
    if c.abs() >= d.abs() {
        if c == 0.0 && d == 0.0 {
            // Division by zero: each part as a real division by zero gives it.
            return [p / c.abs(), q / c.abs()];
        }
        let r = d / c;
        let t = c + d * r;
        [(p + q * r) / t, (q - p * r) / t]
    } else {
        let r = c / d;
        let t = c * r + d;
        [(p * r + q) / t, (q * r - p) / t]
    }
}

/// `sign(z) = z / |z|`, 0 at 0, NaN parts when a part is NaN; an infinite part counts as the
/// unit in its direction.
pub fn sign(z: C) -> C {
    if z[0].is_nan() || z[1].is_nan() {
        return [f64::NAN, f64::NAN];
    }
    if z[0] == 0.0 && z[1] == 0.0 {
        return [0.0, 0.0];
    }
    let z = if z[0].is_infinite() || z[1].is_infinite() {
        let unit = |x: f64| {
            if x.is_infinite() {
                x.signum()
            } else {
                0.0_f64.copysign(x)
            }
        };
        [unit(z[0]), unit(z[1])]
    } else {
        z
    };
    let z = if tiny(z) { scale(z, 108) } else { z };
    let m = z[0].hypot(z[1]);
    [z[0] / m, z[1] / m]
}

/// `e^z` = e^re (cos im + i sin im); a zero imaginary part stays exactly (a real exponential).
pub fn exp(z: C) -> C {
    if z[1] == 0.0 {
        return [z[0].exp(), z[1]];
    }
    let e = z[0].exp();
    [e * z[1].cos(), e * z[1].sin()]
}

/// `e^z - 1`, accurate near 0: the real part is expm1(re) cos(im) - 2 sin²(im / 2).
pub fn expm1(z: C) -> C {
    if z[1] == 0.0 {
        return [z[0].exp_m1(), z[1]];
    }
    let h = (z[1] / 2.0).sin();
    [
        z[0].exp_m1() * z[1].cos() - 2.0 * h * h,
        z[0].exp() * z[1].sin(),
    ]
}

/// The principal logarithm: ln|z| + i arg(z).
pub fn log(z: C) -> C {
    let re = if tiny(z) {
        let [a, b] = scale(z, 108);
        a.hypot(b).ln() - 108.0 * std::f64::consts::LN_2
    } else {
        z[0].hypot(z[1]).ln()
    };
    [re, z[1].atan2(z[0])]
}

/// `ln(1 + z)`, accurate near 0: ln|1 + z| = ln1p(2 re + re² + im²) / 2 when z is small.
pub fn log1p(z: C) -> C {
    let [a, b] = z;
    let re = if a.abs() < 0.5 && b.abs() < 0.5 {
        (a * (2.0 + a) + b * b).ln_1p() / 2.0
    } else {
        (1.0 + a).hypot(b).ln()
    };
    [re, b.atan2(1.0 + a)]
}

/// The principal square root (real part >= 0), without overflow for large parts.
pub fn sqrt(z: C) -> C {
    let [a, b] = z;
    if a == 0.0 && b == 0.0 {
        return [0.0, b];
    }
    if b.is_infinite() {
        return [f64::INFINITY, b];
    }
    if a.is_nan() || b.is_nan() {
        return [f64::NAN, f64::NAN];
    }
    if a.is_infinite() {
        return if a > 0.0 {
            [a, 0.0_f64.copysign(b)]
        } else {
            [0.0, f64::INFINITY.copysign(b)]
        };
    }
    if tiny(z) {
        return scale(sqrt(scale(z, 108)), -54);
    }
    // t = sqrt((|a| + |z|) / 2), with |a| and |z| halved first so their sum cannot overflow.
    let t = (a.abs() / 2.0 + (a / 2.0).hypot(b / 2.0)).sqrt();
    if a >= 0.0 {
        [t, b / (2.0 * t)]
    } else {
        [b.abs() / (2.0 * t), t.copysign(b)]
    }
}

/// `tan(z)` = (sin 2re + i sinh 2im) / (cos 2re + cosh 2im), computed as
/// (sin re cos re + i sinh im cosh im) / (cos² re + sinh² im), the same quotient halved without
/// the cancellation of cos 2re + 1 near a pole; for a large imaginary part, where cosh
/// overflows, its limit (2 sin 2re e^(-2|im|), ±1).
pub fn tan(z: C) -> C {
    let [a, b] = z;
    if b.abs() > 20.0 {
        return [2.0 * (2.0 * a).sin() * (-2.0 * b.abs()).exp(), b.signum()];
    }
    let (s, c, sh) = (a.sin(), a.cos(), b.sinh());
    let d = c * c + sh * sh;
    [s * c / d, sh * b.cosh() / d]
}

/// `z^w` = e^(w ln z); any number to the power 0 is 1, and 0 to a power of positive real part
/// is 0.
pub fn pow(z: C, w: C) -> C {
    if w[0] == 0.0 && w[1] == 0.0 {
        return [1.0, 0.0];
    }
    if z[0] == 0.0 && z[1] == 0.0 && w[0] > 0.0 {
        return [0.0, 0.0];
    }
    exp(mul(w, log(z)))
}

/// `atan2(y, x)` = -i ln((x + iy) / sqrt(x² + y²)), StableHLO's definition on complex
/// numbers, each product by i and -i a complex product (so the zeros keep StableHLO's signs).
pub fn atan2(y: C, x: C) -> C {
    let num = add(x, mul([0.0, 1.0], y));
    let den = sqrt(add(mul(x, x), mul(y, y)));
    mul([-0.0, -1.0], log(div(num, den)))
}

/// The principal cube root: |z|^(1/3) (cos(θ / 3) + i sin(θ / 3)) with θ = arg(z) in
/// [-π, π], |z| without overflow; on the non-negative real axis, the real cube root with the
/// zero imaginary part kept (its sign too).
pub fn cbrt(z: C) -> C {
    let [a, b] = z;
    if b == 0.0 && a >= 0.0 {
        return [a.cbrt(), b];
    }
    if tiny(z) {
        return scale(cbrt(scale(z, 108)), -36);
    }
    let r = a.hypot(b).cbrt();
    let t = b.atan2(a) / 3.0;
    [r * t.cos(), r * t.sin()]
}

/// `logistic(z)` = 1 / (1 + e^-z), as e^z / (1 + e^z) when the real part is negative, so
/// that no exponential overflows.
pub fn logistic(z: C) -> C {
    const ONE: C = [1.0, 0.0];
    if z[0] < 0.0 {
        let e = exp(z);
        div(e, add(ONE, e))
    } else {
        div(ONE, add(ONE, exp([-z[0], -z[1]])))
    }
}

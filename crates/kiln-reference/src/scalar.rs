//! The reference's arithmetic on one element: floats in f64, integers in wrapping i64 (wrapped
//! back to the dtype's range, 0/1 for `pred`). The interpreter maps these over whole literals;
//! eager mode's native loops (`kiln-trace`) map the same functions over typed slices, so an
//! eager op computes each element exactly as the reference does.

use kiln_ir::literal::wrap_to;
use kiln_ir::{Combiner, ComparisonDirection, DType, Op};

/// StableHLO's `maximum` on floats: NaN if either is, and +0 above -0.
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        if a.is_sign_negative() { b } else { a }
    } else if a > b {
        a
    } else {
        b
    }
}

/// StableHLO's `minimum` on floats: NaN if either is, and -0 below +0.
pub fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == b {
        if a.is_sign_negative() { a } else { b }
    } else if a < b {
        a
    } else {
        b
    }
}

/// `base` to the power `exp` on u64s, wrapping.
fn uint_pow(base: u64, exp: u64) -> u64 {
    let (mut acc, mut b, mut e) = (1u64, base, exp);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    acc
}

/// `base` to the power `exp` on integers, wrapping; a negative exponent gives 0 unless the
/// base is 1 or -1.
fn int_pow(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    // Wrapping products of two's-complement bits are the same signed or unsigned.
    uint_pow(base as u64, exp as u64) as i64
}

/// One step of a float reduction or scatter: the accumulator `a` combined with `b`.
pub fn combine_f(kind: Combiner, a: f64, b: f64) -> f64 {
    match kind {
        Combiner::Replace => b,
        Combiner::Add => a + b,
        Combiner::Mul => a * b,
        Combiner::Max => nan_max(a, b),
        Combiner::Min => nan_min(a, b),
        Combiner::And | Combiner::Or => unreachable!("the verifier allows no float and/or"),
    }
}

/// The order of two integers of dtype `d` (values as i64: a `u64` as its bits, compared
/// unsigned; the other unsigned dtypes are zero-extended, so signed order is theirs).
pub fn int_cmp(d: DType, a: i64, b: i64) -> std::cmp::Ordering {
    if d == DType::U64 {
        (a as u64).cmp(&(b as u64))
    } else {
        a.cmp(&b)
    }
}

/// The larger of two integers of dtype `d`.
pub fn int_max(d: DType, a: i64, b: i64) -> i64 {
    if int_cmp(d, a, b).is_ge() { a } else { b }
}

/// The smaller of two integers of dtype `d`.
pub fn int_min(d: DType, a: i64, b: i64) -> i64 {
    if int_cmp(d, a, b).is_le() { a } else { b }
}

/// One step of an integer or `pred` reduction or scatter in dtype `d`, wrapped.
pub fn combine_i(kind: Combiner, d: DType, a: i64, b: i64) -> i64 {
    let r = match (kind, d) {
        (Combiner::Replace, _) => b,
        (Combiner::Add, DType::Pred) | (Combiner::Or, _) => a | b,
        (Combiner::Mul, DType::Pred) | (Combiner::And, _) => a & b,
        (Combiner::Add, _) => a.wrapping_add(b),
        (Combiner::Mul, _) => a.wrapping_mul(b),
        (Combiner::Max, _) => int_max(d, a, b),
        (Combiner::Min, _) => int_min(d, a, b),
    };
    wrap_to(d, r)
}

/// `compare` on floats (IEEE: every comparison with NaN is false but `NE`).
pub fn compare_f(dir: ComparisonDirection, a: f64, b: f64) -> bool {
    use ComparisonDirection::*;
    match dir {
        Eq => a == b,
        Ne => a != b,
        Lt => a < b,
        Le => a <= b,
        Gt => a > b,
        Ge => a >= b,
    }
}

/// `compare` on integers of dtype `d` (see [`int_cmp`]).
pub fn compare_i(dir: ComparisonDirection, d: DType, a: i64, b: i64) -> bool {
    use ComparisonDirection::*;
    let o = int_cmp(d, a, b);
    match dir {
        Eq => o.is_eq(),
        Ne => o.is_ne(),
        Lt => o.is_lt(),
        Le => o.is_le(),
        Gt => o.is_gt(),
        Ge => o.is_ge(),
    }
}

/// A binary elementwise float op as a function of f64s; `None` for the others.
pub fn float_binary(op: &Op) -> Option<fn(f64, f64) -> f64> {
    Some(match op {
        Op::Add {} => |a, b| a + b,
        Op::Subtract {} => |a, b| a - b,
        Op::Multiply {} => |a, b| a * b,
        Op::Divide {} => |a, b| a / b,
        Op::Remainder {} => |a, b| a % b,
        Op::Maximum {} => nan_max,
        Op::Minimum {} => nan_min,
        Op::Power {} => f64::powf,
        Op::Atan2 {} => f64::atan2,
        _ => return None,
    })
}

/// A unary elementwise float op as a function of an f64; `None` for the others.
pub fn float_unary(op: &Op) -> Option<fn(f64) -> f64> {
    Some(match op {
        Op::Negate {} => |x| -x,
        Op::Abs {} => f64::abs,
        Op::Sign {} => |x| {
            if x.is_nan() || x == 0.0 {
                x
            } else {
                x.signum()
            }
        },
        Op::Exponential {} => f64::exp,
        Op::Log {} => f64::ln,
        Op::LogPlusOne {} => f64::ln_1p,
        Op::ExponentialMinusOne {} => f64::exp_m1,
        Op::Sqrt {} => f64::sqrt,
        Op::Rsqrt {} => |x| 1.0 / x.sqrt(),
        Op::Tanh {} => f64::tanh,
        // e^x / (1 + e^x) below zero: 1 / (1 + e^-x) overflows there in f64.
        Op::Logistic {} => |x| {
            if x < 0.0 {
                x.exp() / (1.0 + x.exp())
            } else {
                1.0 / (1.0 + (-x).exp())
            }
        },
        Op::Sine {} => f64::sin,
        Op::Cosine {} => f64::cos,
        Op::Erf {} => libm::erf,
        Op::Floor {} => f64::floor,
        Op::Ceil {} => f64::ceil,
        Op::RoundNearestAfz {} => f64::round,
        Op::RoundNearestEven {} => f64::round_ties_even,
        Op::Tan {} => f64::tan,
        Op::Cbrt {} => f64::cbrt,
        _ => return None,
    })
}

/// Whether `op` is a binary elementwise op on integers or `pred` ([`int_binary`] computes it).
pub fn is_int_binary(op: &Op) -> bool {
    matches!(
        op,
        Op::Add {}
            | Op::Subtract {}
            | Op::Multiply {}
            | Op::Divide {}
            | Op::Remainder {}
            | Op::Maximum {}
            | Op::Minimum {}
            | Op::Power {}
            | Op::And {}
            | Op::Or {}
            | Op::Xor {}
            | Op::ShiftLeft {}
            | Op::ShiftRightLogical {}
            | Op::ShiftRightArithmetic {}
    )
}

/// A binary elementwise op on integers or `pred` of dtype `d` (values as i64: unsigned ones
/// zero-extended), wrapped to `d`. Division by zero gives -1 and a remainder by zero the
/// dividend, as XLA does; shifts by a negative amount or by the width or more give 0.
///
/// # Panics
///
/// When `op` is not one of [`is_int_binary`]'s.
pub fn int_binary(op: &Op, d: DType, x: i64, y: i64) -> i64 {
    let bits = d.bits() as i64;
    let r = match op {
        Op::Add {} if d.is_pred() => x | y,
        Op::Add {} => x.wrapping_add(y),
        Op::Subtract {} => x.wrapping_sub(y),
        Op::Multiply {} => x.wrapping_mul(y),
        Op::Divide {} if y == 0 => -1,
        Op::Divide {} if d == DType::U64 => (x as u64 / y as u64) as i64,
        Op::Divide {} => x.wrapping_div(y),
        Op::Remainder {} if y == 0 => x,
        Op::Remainder {} if d == DType::U64 => (x as u64 % y as u64) as i64,
        Op::Remainder {} => x.wrapping_rem(y),
        Op::Maximum {} => int_max(d, x, y),
        Op::Minimum {} => int_min(d, x, y),
        // An unsigned exponent is never negative: a u64's bits from 2^63 up are a large power.
        Op::Power {} if d == DType::U64 => uint_pow(x as u64, y as u64) as i64,
        Op::Power {} => int_pow(x, y),
        Op::And {} => x & y,
        Op::Or {} => x | y,
        Op::Xor {} => x ^ y,
        Op::ShiftLeft {} if y < 0 || y >= bits => 0,
        Op::ShiftLeft {} => x.wrapping_shl(y as u32),
        Op::ShiftRightLogical {} if y < 0 || y >= bits => 0,
        Op::ShiftRightLogical {} => {
            let mask: u64 = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            ((x as u64 & mask) >> y) as i64
        }
        Op::ShiftRightArithmetic {} => {
            // The bits as a signed number of the dtype's width, its top bit filling in.
            let signed = (x << (64 - bits)) >> (64 - bits);
            if y < 0 || y >= bits {
                if signed < 0 { -1 } else { 0 }
            } else {
                signed >> y
            }
        }
        _ => unreachable!("`{}` is not a binary integer op", op.mnemonic()),
    };
    wrap_to(d, r)
}

/// Whether `op` is a unary elementwise op on integers or `pred` ([`int_unary`] computes it).
pub fn is_int_unary(op: &Op) -> bool {
    matches!(
        op,
        Op::Negate {}
            | Op::Abs {}
            | Op::Sign {}
            | Op::Not {}
            | Op::Popcnt {}
            | Op::CountLeadingZeros {}
    )
}

/// A unary elementwise op on integers or `pred` of dtype `d`, wrapped to `d`.
///
/// # Panics
///
/// When `op` is not one of [`is_int_unary`]'s.
pub fn int_unary(op: &Op, d: DType, x: i64) -> i64 {
    let r = match op {
        Op::Negate {} => x.wrapping_neg(),
        // Unsigned values (zero-extended, or a u64's bits) are their own magnitude.
        Op::Abs {} if !d.is_signed() => x,
        Op::Abs {} => x.wrapping_abs(),
        Op::Sign {} if !d.is_signed() => (x != 0) as i64,
        Op::Sign {} => x.signum(),
        Op::Not {} if d.is_pred() => 1 - x,
        Op::Not {} => !x,
        Op::Popcnt {} => (x as u64 & width_mask(d)).count_ones() as i64,
        Op::CountLeadingZeros {} => {
            (x as u64 & width_mask(d)).leading_zeros() as i64 - (64 - d.bits() as i64)
        }
        _ => unreachable!("`{}` is not a unary integer op", op.mnemonic()),
    };
    wrap_to(d, r)
}

/// The mask of dtype `d`'s bits in a u64.
fn width_mask(d: DType) -> u64 {
    if d.bits() >= 64 {
        u64::MAX
    } else {
        (1u64 << d.bits()) - 1
    }
}

/// The exponent and mantissa (fraction) bits of a float dtype.
pub fn float_format(d: DType) -> (u32, u32) {
    match d {
        DType::F16 => (5, 10),
        DType::BF16 => (8, 7),
        DType::F32 => (8, 23),
        _ => (11, 52),
    }
}

/// `reduce_precision` of `x`, a value of float dtype `d`, to a format of `exponent_bits` and
/// `mantissa_bits`, computed on `d`'s own bits (`ir-specs/ops/reduce_precision.md`).
pub fn reduce_precision(d: DType, x: f64, exponent_bits: i64, mantissa_bits: i64) -> f64 {
    let bits = match d {
        DType::F16 => kiln_ir::half_round::f16_from_f64(x).to_bits() as u64,
        DType::BF16 => kiln_ir::half_round::bf16_from_f64(x).to_bits() as u64,
        DType::F32 => (x as f32).to_bits() as u64,
        _ => x.to_bits(),
    };
    let (src_e, src_m) = float_format(d);
    let r = reduce_precision_bits(bits, src_e, src_m, exponent_bits, mantissa_bits);
    match d {
        DType::F16 => half::f16::from_bits(r as u16).to_f64(),
        DType::BF16 => half::bf16::from_bits(r as u16).to_f64(),
        DType::F32 => f32::from_bits(r as u32) as f64,
        _ => f64::from_bits(r),
    }
}

/// `reduce_precision` on the bits of a float with `src_e` exponent and `src_m` mantissa bits:
/// the mantissa rounded to nearest even at `mantissa_bits` (a carry moves into the exponent,
/// up to infinity), then, when the exponent is narrower, magnitudes past the narrow format's
/// largest exponent become infinite and those below its smallest normal exponent zero, signs
/// kept. A NaN stays the same NaN, unless no mantissa bit is left: then it is an infinity of
/// its sign.
pub fn reduce_precision_bits(
    bits: u64,
    src_e: u32,
    src_m: u32,
    exponent_bits: i64,
    mantissa_bits: i64,
) -> u64 {
    let sign = bits & (1u64 << (src_e + src_m));
    let exp_mask = ((1u64 << src_e) - 1) << src_m;
    let frac_mask = (1u64 << src_m) - 1;
    let mut mag = bits & (exp_mask | frac_mask);
    if mag & exp_mask == exp_mask && mag & frac_mask != 0 {
        return if mantissa_bits > 0 {
            bits
        } else {
            sign | exp_mask
        };
    }
    if mantissa_bits < src_m as i64 {
        let drop = src_m - mantissa_bits as u32;
        let last = 1u64 << drop;
        let bias = (last >> 1) - 1 + ((mag & last) >> drop);
        mag = (mag + bias) & !(last - 1);
    }
    if exponent_bits < src_e as i64 {
        let src_bias = (1i64 << (src_e - 1)) - 1;
        let bias = (1i64 << (exponent_bits - 1)) - 1;
        let e = (mag >> src_m) as i64;
        if e > src_bias + bias {
            mag = exp_mask;
        } else if e <= src_bias - bias {
            mag = 0;
        }
    }
    sign | mag
}

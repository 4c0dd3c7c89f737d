//! `reduce_precision` as integer arithmetic on a float's bits, so that it becomes an ordinary
//! elementwise kernel (and fuses like one).
//!
//! f32 and f64 values are rounded on their own bits (`bitcast_convert` to i32 / i64, then adds,
//! masks and comparisons: `on_bits`). bf16 has f32's exponent and the top 7 of its mantissa
//! bits, so a bf16 value widened to f32 rounds the same way there, with at most 7 mantissa bits.
//! f16 is widened to f32 too: its normal values round there as on their own bits; its
//! subnormals, which f32 holds as normal numbers, are rounded at their own fixed spacing
//! (`2^(-14 - mantissa_bits)`), when the exponent is not narrowed (a narrower one flushes them to
//! zero anyway). The narrow result is exactly representable, so converting it back is exact.
//! `kiln_reference::scalar::reduce_precision_bits` states the rounding these reproduce.

use crate::canon::rebuild;
use kiln_ir::{Builder, ComparisonDirection, DType, Func, Op, ValueId, VerifyError};

/// `f` with every `reduce_precision` expanded into integer ops on the bits.
pub fn expand_reduce_precisions(f: &Func) -> Result<Func, VerifyError> {
    if !f
        .insts
        .iter()
        .any(|i| matches!(i.op, Op::ReducePrecision { .. }))
    {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        let Op::ReducePrecision {
            exponent_bits,
            mantissa_bits,
        } = inst.op
        else {
            return Ok(None);
        };
        let ty = f.values[inst.results[0].index()].clone();
        let x = ops[0];
        let r = match ty.dtype {
            DType::F32 | DType::F64 => {
                on_bits(b, x, &ty.shape, ty.dtype, exponent_bits, mantissa_bits)?
            }
            DType::BF16 => {
                let y = b.convert(x, DType::F32)?;
                let r = on_bits(
                    b,
                    y,
                    &ty.shape,
                    DType::F32,
                    exponent_bits,
                    mantissa_bits.min(7),
                )?;
                b.convert(r, DType::BF16)?
            }
            _ => f16(b, x, &ty.shape, exponent_bits, mantissa_bits)?,
        };
        Ok(Some(vec![r]))
    })
}

/// The bit layout of f32 and f64: (exponent bits, mantissa bits, the integer type of the bits).
fn layout(d: DType) -> (u32, u32, DType) {
    if d == DType::F64 {
        (11, 52, DType::I64)
    } else {
        (8, 23, DType::I32)
    }
}

/// A constant of integer type `it` broadcast to `shape`.
fn splat(b: &mut Builder, it: DType, v: i64, shape: &[usize]) -> Result<ValueId, VerifyError> {
    let c = b.scalar(it, v as f64)?;
    b.broadcast(c, &[], shape)
}

/// `reduce_precision` of `x` (f32 or f64 `d`) on its own bits.
fn on_bits(
    b: &mut Builder,
    x: ValueId,
    shape: &[usize],
    d: DType,
    exponent_bits: i64,
    mantissa_bits: i64,
) -> Result<ValueId, VerifyError> {
    let (src_e, src_m, it) = layout(d);
    if exponent_bits >= src_e as i64 && mantissa_bits >= src_m as i64 {
        return Ok(x);
    }
    let width = src_e + src_m + 1;
    let sign_bit = i64::MIN >> (64 - width);
    let exp_mask = ((1i64 << src_e) - 1) << src_m;
    let bits = b.inst_typed(
        Op::BitcastConvert {},
        &[x],
        kiln_ir::TensorType::new(it, shape),
    )?;
    let c_sign = splat(b, it, sign_bit, shape)?;
    let c_exp = splat(b, it, exp_mask, shape)?;
    let sign = b.binary(Op::And {}, bits, c_sign)?;
    let mut mag = b.binary(Op::Xor {}, bits, sign)?;
    // A NaN's magnitude is above the infinity's (magnitudes are non-negative as signed ints).
    let nan = b.compare(mag, c_exp, ComparisonDirection::Gt)?;
    if mantissa_bits < src_m as i64 {
        // Round to nearest even at the last kept bit: add half a step less one, plus the last
        // kept bit, then cut the dropped bits; a carry moves into the exponent.
        let drop = src_m as i64 - mantissa_bits;
        let c_drop = splat(b, it, drop, shape)?;
        let c_one = splat(b, it, 1, shape)?;
        let last = b.binary(Op::ShiftRightLogical {}, mag, c_drop)?;
        let last = b.binary(Op::And {}, last, c_one)?;
        let c_half = splat(b, it, (1i64 << (drop - 1)) - 1, shape)?;
        let bias = b.binary(Op::Add {}, last, c_half)?;
        let sum = b.binary(Op::Add {}, mag, bias)?;
        let c_cut = splat(b, it, -(1i64 << drop), shape)?;
        mag = b.binary(Op::And {}, sum, c_cut)?;
    }
    if exponent_bits < src_e as i64 {
        let src_bias = (1i64 << (src_e - 1)) - 1;
        let bias = (1i64 << (exponent_bits - 1)) - 1;
        // Past the narrow format's largest exponent: infinite; below its smallest normal one:
        // zero.
        let c_over = splat(b, it, (src_bias + bias + 1) << src_m, shape)?;
        let c_under = splat(b, it, (src_bias - bias + 1) << src_m, shape)?;
        let over = b.compare(mag, c_over, ComparisonDirection::Ge)?;
        let under = b.compare(mag, c_under, ComparisonDirection::Lt)?;
        let zero = splat(b, it, 0, shape)?;
        let flushed = b.select(under, zero, mag)?;
        mag = b.select(over, c_exp, flushed)?;
    }
    let rounded = b.binary(Op::Or {}, sign, mag)?;
    let nan_result = if mantissa_bits > 0 {
        bits
    } else {
        b.binary(Op::Or {}, sign, c_exp)?
    };
    let r = b.select(nan, nan_result, rounded)?;
    b.inst_typed(
        Op::BitcastConvert {},
        &[r],
        kiln_ir::TensorType::new(d, shape),
    )
}

/// `reduce_precision` of f16 `x`, computed in f32.
fn f16(
    b: &mut Builder,
    x: ValueId,
    shape: &[usize],
    exponent_bits: i64,
    mantissa_bits: i64,
) -> Result<ValueId, VerifyError> {
    let m = mantissa_bits.min(10);
    if exponent_bits >= 5 && m == 10 {
        return Ok(x);
    }
    let y = b.convert(x, DType::F32)?;
    let r = if exponent_bits < 5 {
        // The narrow format's smallest normal value is at least 2^-6: f16's subnormals
        // flush to zero whichever way they round.
        on_bits(b, y, shape, DType::F32, exponent_bits, m)?
    } else {
        let normal = on_bits(b, y, shape, DType::F32, 8, m)?;
        // Subnormals keep f16's spacing, 2^-24, rounded to 2^(-14 - m): exact scalings by
        // powers of two around a rounding to an integer.
        let f = |b: &mut Builder, v: f64| -> Result<ValueId, VerifyError> {
            let c = b.scalar(DType::F32, v)?;
            b.broadcast(c, &[], shape)
        };
        let up = f(b, 2f64.powi(14 + m as i32))?;
        let down = f(b, 2f64.powi(-14 - m as i32))?;
        let scaled = b.binary(Op::Multiply {}, y, up)?;
        let whole = b.unary(Op::RoundNearestEven {}, scaled)?;
        let sub = b.binary(Op::Multiply {}, whole, down)?;
        let a = b.unary(Op::Abs {}, y)?;
        let min_normal = f(b, 2f64.powi(-14))?;
        let is_sub = b.compare(a, min_normal, ComparisonDirection::Lt)?;
        b.select(is_sub, sub, normal)?
    };
    b.convert(r, DType::F16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::random::Rng;
    use kiln_ir::{Literal, TensorType, parse_func_text};

    /// Random values of `d` over its whole range: random bits, with zeros, infinities, NaN
    /// and subnormals among them.
    fn values(d: DType, n: usize, rng: &mut Rng) -> Literal {
        let ty = TensorType::new(d, [n]);
        let v: Vec<f64> = (0..n)
            .map(|i| match (d, i % 97) {
                (_, 0) => f64::NAN,
                (_, 1) => f64::INFINITY,
                (_, 2) => -0.0,
                (DType::F16, _) => half::f16::from_bits(rng.below(1 << 16) as u16).to_f64(),
                (DType::BF16, _) => half::bf16::from_bits(rng.below(1 << 16) as u16).to_f64(),
                (DType::F32, _) => f32::from_bits(rng.below(u32::MAX as usize) as u32) as f64,
                _ => f64::from_bits(
                    (rng.below(u32::MAX as usize) as u64) << 32
                        | rng.below(u32::MAX as usize) as u64,
                ),
            })
            .collect();
        Literal::from_f64s(ty, &v).unwrap()
    }

    /// The expansion, run on the reference interpreter as integer ops, gives the bits the
    /// reference's own `reduce_precision` gives, for every float dtype and formats narrower,
    /// as wide and wider than each.
    #[test]
    fn expanded_reduce_precision_matches_the_reference_bit_for_bit() {
        let mut rng = Rng::new(3);
        let n = 4000;
        for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for (e, m) in [
                (1, 0),
                (2, 1),
                (3, 0),
                (4, 3),
                (5, 2),
                (5, 10),
                (6, 4),
                (8, 7),
                (8, 23),
                (11, 52),
                (5, 0),
                (8, 0),
                (10, 30),
            ] {
                let text = format!(
                    "func @main(%0: {d}[{n}]) -> {d}[{n}] {{\n  %1 = reduce_precision %0 \
                     {{exponent_bits = {e}, mantissa_bits = {m}}} : {d}[{n}]\n  return %1\n}}"
                );
                let f = parse_func_text(&text).unwrap();
                let g = expand_reduce_precisions(&f).unwrap();
                assert!(
                    !g.insts
                        .iter()
                        .any(|i| matches!(i.op, Op::ReducePrecision { .. })),
                    "{g}"
                );
                let x = values(d, n, &mut rng);
                let want = kiln_reference::eval(&f, std::slice::from_ref(&x)).unwrap();
                let got = kiln_reference::eval(&g, std::slice::from_ref(&x)).unwrap();
                let (w, a) = (want[0].to_f64s(), got[0].to_f64s());
                let xs = x.to_f64s();
                for i in 0..n {
                    let same = if w[i].is_nan() {
                        a[i].is_nan()
                    } else {
                        w[i].to_bits() == a[i].to_bits()
                    };
                    assert!(
                        same,
                        "{d} e{e} m{m}: {:e} gives {:e}, expanded {:e}",
                        xs[i], w[i], a[i]
                    );
                }
            }
        }
    }
}

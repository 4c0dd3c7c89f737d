//! `chlo.next_after(x, y)`: the representable value next to `x` in the direction of `y`
//! (C's `nextafter`), exact for every float type.
//!
//! A float's bits, read as a signed integer, count its magnitude up from zero, so one more
//! (or fewer) in them is the next value away from (toward) zero: `x` moves away from zero
//! when `y > x` and `x > 0` agree. `f32` and `f64` step their own bits (as `i32`, `i64`);
//! `bf16`, the top half of an `f32`, steps the `f32` bits by `2^16`; `f16` steps the `f32`
//! bits by `2^13` where both values are normal `f16`, and by the subnormal spacing `2^-24`
//! (exact in `f32`) below `2^-14`, a zero reached keeping `x`'s sign. Then `x = y` gives `y`, `x = 0` the smallest subnormal
//! with `y`'s sign, an infinite `x` the largest finite value of its sign (`f16`; the other
//! types reach it by the bit step), and a NaN operand NaN.

use crate::ast::OpAst;
use crate::chlo::Expr;
use crate::error::{Error, Result};
use crate::import::{Body, value_type};
use kiln_ir::{ComparisonDirection as Dir, DType, Literal, Op, ValueId};

/// `next_after(x, y)`.
pub fn lower(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let [x, y] = args else {
        return Err(Error::invalid(op.pos, "`chlo.next_after` takes 2 operands"));
    };
    let ty = value_type(body, *x)?;
    if !ty.dtype.is_float() || value_type(body, *y)? != ty {
        return Err(Error::invalid(
            op.pos,
            "`chlo.next_after` takes two floats of one type",
        ));
    }
    // The type worked in, its bits' integer type, one step in those bits, the bits (in the
    // type worked in) of the operand type's smallest subnormal, the sign bit.
    let (work, int, unit, tiny, sign_bit) = match ty.dtype {
        DType::F64 => (DType::F64, DType::I64, 1i64, 1i64, i64::MIN),
        DType::F32 => (DType::F32, DType::I32, 1, 1, i32::MIN as i64),
        DType::BF16 => (DType::F32, DType::I32, 1 << 16, 1 << 16, i32::MIN as i64),
        _ => (
            DType::F32,
            DType::I32,
            1 << 13,
            2f32.powi(-24).to_bits() as i64,
            i32::MIN as i64,
        ),
    };
    let wt = ty.with_dtype(work);
    let it = ty.with_dtype(int);
    let mut e = Expr {
        body,
        op,
        ty: wt.clone(),
    };
    let (x, y) = if work == ty.dtype {
        (*x, *y)
    } else {
        (
            e.push(Op::Convert {}, &[*x], Some(&wt))?,
            e.push(Op::Convert {}, &[*y], Some(&wt))?,
        )
    };
    let bits = e.push(Op::BitcastConvert {}, &[x], Some(&it))?;
    let int_k = |e: &mut Expr, v: i64| -> Result<ValueId> {
        let lit = Literal::from_i64s(it.clone(), &vec![v; it.numel()])
            .map_err(|er| Error::invalid(op.pos, er.to_string()))?;
        e.push(Op::Constant { value: lit }, &[], Some(&it))
    };
    let step = int_k(&mut e, unit)?;
    let more = e.bin(Op::Add {}, bits, step)?;
    let less = e.bin(Op::Subtract {}, bits, step)?;
    let up = e.cmp(Dir::Gt, y, x)?;
    let zero = e.k(0.0)?;
    let pos = e.cmp(Dir::Gt, x, zero)?;
    let away = e.cmp(Dir::Eq, up, pos)?;
    let moved = e.select(away, more, less)?;
    let mut r = e.push(Op::BitcastConvert {}, &[moved], Some(&wt))?;
    if ty.dtype == DType::F16 {
        // Below the smallest normal f16 (or onto it from above), the spacing is 2^-24.
        let ax = e.un(Op::Abs {}, x)?;
        let min_normal = e.k(2f64.powi(-14))?;
        let below = e.cmp(Dir::Lt, ax, min_normal)?;
        let at = e.cmp(Dir::Eq, ax, min_normal)?;
        let toward_zero = e.push(Op::Not {}, &[away], None)?;
        let onto = e.push(Op::And {}, &[at, toward_zero], None)?;
        let sub = e.push(Op::Or {}, &[below, onto], None)?;
        let spacing = e.k(2f64.powi(-24))?;
        let neg = e.un(Op::Negate {}, spacing)?;
        let d = e.select(up, spacing, neg)?;
        let stepped = e.bin(Op::Add {}, x, d)?;
        // Onto zero from below keeps the sign: -2^-24 toward +inf is -0.
        let signed_zero = e.bin(Op::Multiply {}, x, zero)?;
        let at_zero = e.cmp(Dir::Eq, stepped, zero)?;
        let stepped = e.select(at_zero, signed_zero, stepped)?;
        r = e.select(sub, stepped, r)?;
        let inf = e.k(f64::INFINITY)?;
        let is_inf = e.cmp(Dir::Eq, ax, inf)?;
        let sign = e.un(Op::Sign {}, x)?;
        let max = e.k(65504.0)?;
        let signed_max = e.bin(Op::Multiply {}, sign, max)?;
        r = e.select(is_inf, signed_max, r)?;
    }
    // The smallest subnormal with y's sign, from bits (no arithmetic on subnormals, which
    // some backends flush to zero).
    let y_bits = e.push(Op::BitcastConvert {}, &[y], Some(&it))?;
    let sb = int_k(&mut e, sign_bit)?;
    let y_sign = e.bin(Op::And {}, y_bits, sb)?;
    let tb = int_k(&mut e, tiny)?;
    let smallest_bits = e.bin(Op::Or {}, y_sign, tb)?;
    let smallest = e.push(Op::BitcastConvert {}, &[smallest_bits], Some(&wt))?;
    let x0 = e.cmp(Dir::Eq, x, zero)?;
    r = e.select(x0, smallest, r)?;
    let same = e.cmp(Dir::Eq, x, y)?;
    r = e.select(same, y, r)?;
    let xn = e.cmp(Dir::Ne, x, x)?;
    let yn = e.cmp(Dir::Ne, y, y)?;
    let nan = e.push(Op::Or {}, &[xn, yn], None)?;
    let q = e.k(f64::NAN)?;
    r = e.select(nan, q, r)?;
    let out = if work == ty.dtype {
        r
    } else {
        e.push(Op::Convert {}, &[r], Some(&ty))?
    };
    Ok(vec![out])
}

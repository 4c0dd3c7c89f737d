//! StableHLO ops kiln has no op for, written as kiln ops.
//!
//! `chlo.mulhi` is a product at double width, shifted; `map` applies its body's elementwise
//! ops to whole tensors; `chlo.scan` runs its body once per position of the scanned
//! dimension, unrolled (at most [`MAX_SCAN_LENGTH`] steps).

use crate::ast::{AttrVal, OpAst};
use crate::error::{Error, Result};
use crate::import::{Body, loc, value_type};
use kiln_ir::{Op, TensorType, ValueId};

/// A boolean attribute (absent: false).
pub(crate) fn flag(op: &OpAst, name: &str) -> Result<bool> {
    match op.attr(name) {
        None => Ok(false),
        Some((AttrVal::Bool(b), _)) => Ok(*b),
        Some((_, p)) => Err(Error::invalid(
            p,
            format!("`{name}` of `{}` must be `true` or `false`", op.name),
        )),
    }
}

/// The operands of a product (convolution) whose declared result element type is wider than
/// theirs, converted to it where kiln's convolution would not widen them itself (operands of
/// two types, `i8` and `u8`, say): the products are then exact, as StableHLO computes them.
/// Other operands are returned as they are.
pub fn widen_to_result(
    body: &mut Body,
    op: &OpAst,
    args: &[ValueId],
    declared: Option<&[TensorType]>,
) -> Result<Vec<ValueId>> {
    let Some([out]) = declared else {
        return Ok(args.to_vec());
    };
    // Operands of one type that the result widens: kiln's convolution computes in the wider
    // type itself.
    let dtypes: Vec<_> = args
        .iter()
        .map(|&a| value_type(body, a).map(|t| t.dtype))
        .collect::<Result<_>>()?;
    if dtypes.windows(2).all(|w| w[0] == w[1])
        && dtypes
            .first()
            .is_some_and(|&d| kiln_ir::verify::widens(d, out.dtype))
    {
        return Ok(args.to_vec());
    }
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let mut res = Vec::new();
    for &a in args {
        let t = value_type(body, a)?;
        let widen = t.dtype != out.dtype
            && t.dtype.class() == out.dtype.class()
            && t.dtype.bits() < out.dtype.bits();
        res.push(if widen {
            let wt = t.with_dtype(out.dtype);
            body.b
                .push_at(Op::Convert {}, &[a], Some(std::slice::from_ref(&wt)), l)
                .map_err(err)?[0]
        } else {
            a
        });
    }
    Ok(res)
}

/// For `compare` with the TOTALORDER type: each float operand as a signed integer of its bits
/// whose order is the total order (-NaN < -inf < ... < -0 < +0 < ... < inf < NaN): the bits
/// with the magnitude flipped where the sign is set. `f16` and `bf16` are widened to `f32`
/// first (exactly); integer operands are returned as they are.
pub fn total_order_keys(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    use kiln_ir::DType;
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let mut keys = Vec::new();
    for &a in args {
        let t = value_type(body, a)?;
        if !t.dtype.is_float() {
            keys.push(a);
            continue;
        }
        let (x, int, bits) = match t.dtype {
            DType::F64 => (a, DType::I64, 64),
            DType::F32 => (a, DType::I32, 32),
            _ => {
                let wide = t.with_dtype(DType::F32);
                let w = body
                    .b
                    .push_at(Op::Convert {}, &[a], Some(std::slice::from_ref(&wide)), l)
                    .map_err(err)?[0];
                (w, DType::I32, 32)
            }
        };
        let it = t.with_dtype(int);
        let konst = |body: &mut Body, v: i64| -> Result<ValueId> {
            let lit = kiln_ir::Literal::from_i64s(it.clone(), &vec![v; it.numel()])
                .map_err(|e| Error::invalid(op.pos, e.to_string()))?;
            Ok(body
                .b
                .push_at(
                    Op::Constant { value: lit },
                    &[],
                    Some(std::slice::from_ref(&it)),
                    l,
                )
                .map_err(err)?[0])
        };
        let i = body
            .b
            .push_at(
                Op::BitcastConvert {},
                &[x],
                Some(std::slice::from_ref(&it)),
                l,
            )
            .map_err(err)?[0];
        let shift = konst(body, bits - 1)?;
        let magnitude = konst(
            body,
            if bits == 64 {
                i64::MAX
            } else {
                i32::MAX as i64
            },
        )?;
        let sign = body
            .b
            .push_at(Op::ShiftRightArithmetic {}, &[i, shift], None, l)
            .map_err(err)?[0];
        let flip = body
            .b
            .push_at(Op::And {}, &[sign, magnitude], None, l)
            .map_err(err)?[0];
        keys.push(
            body.b
                .push_at(Op::Xor {}, &[i, flip], None, l)
                .map_err(err)?[0],
        );
    }
    Ok(keys)
}

/// The longest dimension `chlo.scan` is unrolled over.
pub const MAX_SCAN_LENGTH: usize = 256;

/// `chlo.scan(inputs) inits(carries)`: for each position `k` along `dimension` (from the end
/// with `is_reverse`), the body takes the inputs' slices at `k` and the carries and returns
/// the outputs' slices at `k` and the next carries; the results are the outputs, then the
/// last carries.
pub fn scan(
    body: &mut Body,
    op: &OpAst,
    f: &kiln_ir::Func,
    args: &[ValueId],
) -> Result<Vec<ValueId>> {
    let n_in = match op.attr("inits_start") {
        Some((AttrVal::Int(i), _)) if (*i as usize) <= args.len() => *i as usize,
        _ => return Err(Error::invalid(op.pos, "`chlo.scan` needs `inits(...)`")),
    };
    let (inputs, inits) = args.split_at(n_in);
    let Some(&first) = inputs.first() else {
        return Err(Error::unsupported(op.pos, "`chlo.scan` without inputs"));
    };
    let dim = crate::ops::int_attr(op, &["dimension"])?
        .ok_or_else(|| Error::invalid(op.pos, "`chlo.scan` needs `dimension`"))?;
    let reverse = match op.attr("is_reverse") {
        Some((AttrVal::Bool(b), _)) => *b,
        _ => false,
    };
    let t0 = value_type(body, first)?;
    let d = usize::try_from(dim)
        .ok()
        .filter(|&d| d < t0.rank())
        .ok_or_else(|| {
            Error::invalid(
                op.pos,
                format!(
                    "scan dimension {dim} is out of range for rank {}",
                    t0.rank()
                ),
            )
        })?;
    let len = t0.shape[d];
    if len > MAX_SCAN_LENGTH {
        return Err(Error::unsupported(
            op.pos,
            format!("`chlo.scan` over more than {MAX_SCAN_LENGTH} positions"),
        ));
    }
    if f.params.len() != args.len() || f.outputs.len() < inits.len() {
        return Err(Error::invalid(
            op.pos,
            "the body of `chlo.scan` does not fit its inputs and carries",
        ));
    }
    let n_out = f.outputs.len() - inits.len();
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let mut carries = inits.to_vec();
    let mut ys: Vec<Vec<Option<ValueId>>> = vec![vec![None; len]; n_out];
    let order: Vec<usize> = if reverse {
        (0..len).rev().collect()
    } else {
        (0..len).collect()
    };
    for k in order {
        let mut step_args = Vec::new();
        for &x in inputs {
            let t = value_type(body, x)?;
            if t.rank() <= d || t.shape[d] != len {
                return Err(Error::invalid(
                    op.pos,
                    "the inputs of `chlo.scan` differ along the scanned dimension",
                ));
            }
            let mut start = vec![0i64; t.rank()];
            let mut limit: Vec<i64> = t.shape.iter().map(|&s| s as i64).collect();
            start[d] = k as i64;
            limit[d] = k as i64 + 1;
            let kop = Op::Slice {
                start_indices: start,
                limit_indices: limit,
                strides: vec![1; t.rank()],
            };
            let s = body.b.push_at(kop, &[x], None, l).map_err(err)?[0];
            let mut shape = t.shape.clone();
            shape.remove(d);
            let r = body
                .b
                .push_at(
                    Op::Reshape {},
                    &[s],
                    Some(&[TensorType::new(t.dtype, shape)]),
                    l,
                )
                .map_err(err)?[0];
            step_args.push(r);
        }
        step_args.extend(&carries);
        let outs = body.b.inline(f, &step_args).map_err(err)?;
        for (i, &y) in outs[..n_out].iter().enumerate() {
            let t = value_type(body, y)?;
            let mut shape = t.shape.clone();
            shape.insert(d.min(shape.len()), 1);
            ys[i][k] = Some(
                body.b
                    .push_at(
                        Op::Reshape {},
                        &[y],
                        Some(&[TensorType::new(t.dtype, shape)]),
                        l,
                    )
                    .map_err(err)?[0],
            );
        }
        carries = outs[n_out..].to_vec();
    }
    let mut results = Vec::new();
    for y in ys {
        let parts: Vec<ValueId> = y.into_iter().flatten().collect();
        if parts.is_empty() {
            return Err(Error::unsupported(
                op.pos,
                "`chlo.scan` over an empty dimension",
            ));
        }
        let kop = Op::Concatenate {
            dimension: d as i64,
        };
        results.push(body.b.push_at(kop, &parts, None, l).map_err(err)?[0]);
    }
    results.extend(carries);
    Ok(results)
}

/// `chlo.mulhi(a, b)`: the high half of the double-width product. For 2- to 32-bit
/// integers both are widened to `i64`, multiplied (exact, or for `ui32` exact modulo 2^64),
/// shifted right by the width (arithmetic for signed, logical for unsigned) and narrowed;
/// `i64` goes through 32-bit halves (`mulhi64`).
pub fn mulhi(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let [a, b] = args else {
        return Err(Error::invalid(op.pos, "`chlo.mulhi` takes 2 operands"));
    };
    let t = value_type(body, *a)?;
    use kiln_ir::DType;
    let bits = match t.dtype {
        DType::I2 | DType::U2 => 2,
        DType::I4 | DType::U4 => 4,
        DType::I8 | DType::U8 => 8,
        DType::I16 | DType::U16 => 16,
        DType::I32 | DType::U32 => 32,
        DType::I64 | DType::U64 => return mulhi64(body, op, *a, *b, &t),
        _ => return Err(Error::invalid(op.pos, "`chlo.mulhi` takes integers")),
    };
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let wide = t.with_dtype(DType::I64);
    let wa = body
        .b
        .push_at(Op::Convert {}, &[*a], Some(std::slice::from_ref(&wide)), l)
        .map_err(err)?[0];
    let wb = body
        .b
        .push_at(Op::Convert {}, &[*b], Some(std::slice::from_ref(&wide)), l)
        .map_err(err)?[0];
    let p = body
        .b
        .push_at(Op::Multiply {}, &[wa, wb], None, l)
        .map_err(err)?[0];
    let lit = kiln_ir::Literal::from_i64s(wide.clone(), &vec![bits; wide.numel()])
        .map_err(|e| Error::invalid(op.pos, e.to_string()))?;
    let s = body
        .b
        .push_at(
            Op::Constant { value: lit },
            &[],
            Some(std::slice::from_ref(&wide)),
            l,
        )
        .map_err(err)?[0];
    let shift = if t.dtype.is_signed() {
        Op::ShiftRightArithmetic {}
    } else {
        Op::ShiftRightLogical {}
    };
    let h = body.b.push_at(shift, &[p, s], None, l).map_err(err)?[0];
    body.b
        .push_at(Op::Convert {}, &[h], Some(std::slice::from_ref(&t)), l)
        .map_err(err)
}

/// The high half of the 128-bit product of two `i64` or `u64` tensors, from 32-bit halves (the
/// signed "mulhs" of Hacker's Delight, 8-2): with `a = ah * 2^32 + al` (`al` unsigned),
/// `t = ah*bl + (al*bl >>> 32)`, `w = al*bh + (t & 0xFFFFFFFF)`, the result is
/// `ah*bh + (t >> 32) + (w >> 32)`; no intermediate overflows.
fn mulhi64(
    body: &mut Body,
    op: &OpAst,
    a: ValueId,
    b: ValueId,
    t: &TensorType,
) -> Result<Vec<ValueId>> {
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let konst = |body: &mut Body, x: i64| -> Result<ValueId> {
        let lit = kiln_ir::Literal::from_i64s(t.clone(), &vec![x; t.numel()])
            .map_err(|e| Error::invalid(op.pos, e.to_string()))?;
        Ok(body
            .b
            .push_at(
                Op::Constant { value: lit },
                &[],
                Some(std::slice::from_ref(t)),
                l,
            )
            .map_err(err)?[0])
    };
    let bin = |body: &mut Body, kop: Op, x: ValueId, y: ValueId| -> Result<ValueId> {
        Ok(body.b.push_at(kop, &[x, y], None, l).map_err(err)?[0])
    };
    // Signed halves shift in the sign; a u64's ("mulhu") shift in zeros.
    let shr = || {
        if t.dtype.is_signed() {
            Op::ShiftRightArithmetic {}
        } else {
            Op::ShiftRightLogical {}
        }
    };
    let k32 = konst(body, 32)?;
    let mask = konst(body, 0xFFFF_FFFF)?;
    let al = bin(body, Op::And {}, a, mask)?;
    let ah = bin(body, shr(), a, k32)?;
    let bl = bin(body, Op::And {}, b, mask)?;
    let bh = bin(body, shr(), b, k32)?;
    let ll = bin(body, Op::Multiply {}, al, bl)?;
    let ll_hi = bin(body, Op::ShiftRightLogical {}, ll, k32)?;
    let hl = bin(body, Op::Multiply {}, ah, bl)?;
    let tt = bin(body, Op::Add {}, hl, ll_hi)?;
    let t_lo = bin(body, Op::And {}, tt, mask)?;
    let t_hi = bin(body, shr(), tt, k32)?;
    let lh = bin(body, Op::Multiply {}, al, bh)?;
    let w = bin(body, Op::Add {}, lh, t_lo)?;
    let w_hi = bin(body, shr(), w, k32)?;
    let hh = bin(body, Op::Multiply {}, ah, bh)?;
    let sum = bin(body, Op::Add {}, hh, t_hi)?;
    Ok(vec![bin(body, Op::Add {}, sum, w_hi)?])
}

//! `ui64` values, held as the bits of an `i64` (kiln has no `ui64`; see [`crate::types`]).
//!
//! Most ops mean the same on those bits as on the unsigned values: data movement, wrapping
//! `add`/`subtract`/`multiply`, bitwise ops, logical shifts, `EQ`/`NE`, conversions between
//! integers. Ordering (`compare LT`..., `maximum`, `minimum`) is the signed order of the
//! bits with the top bit flipped (`x ^ 2^63`), which is the unsigned order. The rest
//! (division, remainder, conversion to or from floats, ...) are located `unsupported`
//! errors.

use crate::ast::OpAst;
use crate::error::{Error, Result, quote};
use crate::import::{Body, loc, value_type};
use kiln_ir::{ComparisonDirection, DType, Literal, Op, TensorType, ValueId};

/// The ops whose meaning on `ui64` operands is their meaning on the same bits as `i64`: data
/// movement, wrapping arithmetic, bitwise ops, logical shifts, equality (the ordering
/// directions of `compare` go through flipped keys).
pub const UI64_SAFE: &[&str] = &[
    "stablehlo.constant",
    "stablehlo.iota",
    "stablehlo.broadcast_in_dim",
    "stablehlo.reshape",
    "stablehlo.transpose",
    "stablehlo.slice",
    "stablehlo.concatenate",
    "stablehlo.reverse",
    "stablehlo.add",
    "stablehlo.subtract",
    "stablehlo.multiply",
    "stablehlo.and",
    "stablehlo.or",
    "stablehlo.xor",
    "stablehlo.not",
    "stablehlo.shift_left",
    "stablehlo.shift_right_logical",
    "stablehlo.popcnt",
    "stablehlo.select",
    "stablehlo.convert",
    "stablehlo.bitcast_convert",
    "stablehlo.compare",
    "stablehlo.maximum",
    "stablehlo.minimum",
];

/// Lowers an op whose text names `ui64`: the ordering ops through flipped keys (their
/// results), the ops of [`UI64_SAFE`] as they are (`None`: map them as usual), and refuses
/// the others (a `convert` only between integers).
pub fn lower(
    body: &mut Body,
    op: &OpAst,
    args: &[ValueId],
    d: Option<&[TensorType]>,
) -> Result<Option<Vec<ValueId>>> {
    if let Some(r) = ordered(body, op, args, d)? {
        return Ok(Some(r));
    }
    let refuse = |why: &str| {
        Err(Error::unsupported(
            op.pos,
            format!(
                "{} on `ui64` values ({why}; kiln holds ui64 as the bits of an i64)",
                quote(&op.name)
            ),
        ))
    };
    if !UI64_SAFE.contains(&op.name.as_str()) {
        return refuse("its unsigned meaning differs from the signed one");
    }
    if op.name == "stablehlo.convert" {
        let mut dtypes: Vec<DType> = Vec::new();
        for &a in args {
            dtypes.push(value_type(body, a)?.dtype);
        }
        dtypes.extend(d.unwrap_or(&[]).iter().map(|t| t.dtype));
        if dtypes.iter().any(|t| t.is_float()) {
            return refuse("a conversion to or from floats reads the value, not the bits");
        }
    }
    Ok(None)
}

/// Whether every operand is an `i64` holding `ui64` bits (and not a `pred`, say).
fn all_i64(body: &Body, args: &[ValueId]) -> Result<bool> {
    for &a in args {
        if value_type(body, a)?.dtype != DType::I64 {
            return Ok(false);
        }
    }
    Ok(!args.is_empty())
}

/// `compare` with an ordering direction, `maximum`, `minimum` on `ui64` bits: through keys
/// `x ^ 2^63`, whose signed order is the unsigned order of `x`. `None` for other ops.
fn ordered(
    body: &mut Body,
    op: &OpAst,
    args: &[ValueId],
    d: Option<&[TensorType]>,
) -> Result<Option<Vec<ValueId>>> {
    let dir = match op.name.as_str() {
        "stablehlo.compare" => {
            let Some((v, p)) = crate::ops::find(op, &["comparison_direction"]) else {
                return Ok(None);
            };
            let dir = crate::ops::direction(v, p)?;
            if matches!(dir, ComparisonDirection::Eq | ComparisonDirection::Ne) {
                return Ok(None);
            }
            dir
        }
        "stablehlo.maximum" => ComparisonDirection::Gt,
        "stablehlo.minimum" => ComparisonDirection::Lt,
        _ => return Ok(None),
    };
    let [a, b] = args else {
        return Ok(None);
    };
    if !all_i64(body, args)? {
        return Ok(None);
    }
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let t = value_type(body, *a)?;
    let lit = Literal::from_i64s(t.clone(), &vec![i64::MIN; t.numel()])
        .map_err(|e| Error::invalid(op.pos, e.to_string()))?;
    let top = body
        .b
        .push_at(
            Op::Constant { value: lit },
            &[],
            Some(std::slice::from_ref(&t)),
            l,
        )
        .map_err(err)?[0];
    let mut keys = Vec::new();
    for &x in [a, b] {
        keys.push(
            body.b
                .push_at(Op::Xor {}, &[x, top], None, l)
                .map_err(err)?[0],
        );
    }
    let cmp = Op::Compare {
        comparison_direction: dir,
    };
    let p = body.b.push_at(cmp, &keys, None, l).map_err(err)?[0];
    if op.name == "stablehlo.compare" {
        if let Some([rt]) = d
            && rt.dtype != DType::Pred
        {
            return Err(Error::invalid(op.pos, "`stablehlo.compare` returns i1"));
        }
        return Ok(Some(vec![p]));
    }
    let r = body
        .b
        .push_at(Op::Select {}, &[p, *a, *b], d, l)
        .map_err(err)?[0];
    Ok(Some(vec![r]))
}

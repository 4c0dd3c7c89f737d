//! `chlo.top_k(x, k)`: the `k` largest elements of each row of `x` (along its last
//! dimension) in descending order, with their positions (`i32`), as kiln's `sort` and a
//! slice. The sort is stable and descending, so equal elements come lowest position first;
//! floats are ordered by their total order (`-NaN < -inf < ... < -0 < +0 < ... < inf <
//! NaN`, the keys of `compare ... TOTALORDER`), so a NaN counts largest, as XLA's `TopK`
//! orders them.

use crate::ast::OpAst;
use crate::error::{Error, Result};
use crate::import::{Body, loc, push, value_type};
use kiln_ir::{Builder, ComparisonDirection, DType, Op, TensorType, ValueId};

/// `top_k(x) {k}`.
pub fn lower(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let [x] = args else {
        return Err(Error::invalid(op.pos, "`chlo.top_k` takes one operand"));
    };
    let k = crate::ops::int_attr(op, &["k"])?
        .ok_or_else(|| Error::invalid(op.pos, "`chlo.top_k` needs the attribute `k`"))?;
    let t = value_type(body, *x)?;
    let Some(&n) = t.shape.last() else {
        return Err(Error::invalid(
            op.pos,
            "`chlo.top_k` takes a tensor of rank 1 or more",
        ));
    };
    if k < 0 || k as usize > n {
        return Err(Error::invalid(
            op.pos,
            format!("`chlo.top_k`: k = {k} is not in [0, {n}] (the last dimension)"),
        ));
    }
    if t.dtype == DType::Pred {
        return Err(Error::unsupported(op.pos, "`chlo.top_k` of i1"));
    }
    let last = t.rank() as i64 - 1;
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let it = t.with_dtype(DType::I32);
    let iota = body
        .b
        .push_at(
            Op::Iota {
                iota_dimension: last,
            },
            &[],
            Some(std::slice::from_ref(&it)),
            l,
        )
        .map_err(err)?[0];
    let mut operands = if t.dtype.is_float() {
        crate::decompose::total_order_keys(body, op, &[*x])?
    } else {
        Vec::new()
    };
    operands.push(*x);
    operands.push(iota);
    // The comparator: the first operand's left element is greater.
    let mut cb = Builder::new("top_k_greater");
    let mut params = Vec::new();
    for &v in &operands {
        let s = TensorType::scalar(value_type(body, v)?.dtype);
        params.push(cb.param(s.clone()));
        params.push(cb.param(s));
    }
    let gt = cb
        .push_at(
            Op::Compare {
                comparison_direction: ComparisonDirection::Gt,
            },
            &params[..2],
            None,
            l,
        )
        .map_err(err)?[0];
    let comparator = Box::new(cb.finish(&[gt]).map_err(err)?);
    let sorted = push(
        body,
        op,
        Op::Sort {
            dimension: last,
            is_stable: true,
            comparator,
        },
        &operands,
        None,
    )?;
    let m = sorted.len();
    let mut limit: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    limit[last as usize] = k;
    let slice = Op::Slice {
        start_indices: vec![0; t.rank()],
        limit_indices: limit,
        strides: vec![1; t.rank()],
    };
    let values = push(body, op, slice.clone(), &[sorted[m - 2]], None)?[0];
    let indices = push(body, op, slice, &[sorted[m - 1]], None)?[0];
    Ok(vec![values, indices])
}

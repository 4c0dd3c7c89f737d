//! `chlo.ragged_dot` with its ragged dimension among the lhs's non-contracting dimensions
//! (mode 1: each run of lhs rows, of the lengths `group_sizes` gives, multiplies its own rhs
//! group) as one `dot_general` per group on slices, joined along the ragged dimension. The
//! group sizes must be constants (kiln shapes are static); rows past the groups are zeros.

use crate::ast::OpAst;
use crate::error::{Error, Result};
use crate::import::{Body, loc, value_type};
use crate::ops::{const_ints, field_ints, struct_attr};
use kiln_ir::{Literal, Op, TensorType, ValueId};

/// `chlo.ragged_dot(lhs, rhs, group_sizes)`.
pub fn ragged_dot(
    body: &mut Body,
    op: &OpAst,
    args: &[ValueId],
    declared: Option<&[TensorType]>,
) -> Result<Vec<ValueId>> {
    let ([lhs, rhs, sizes], Some([out])) = (args, declared) else {
        return Err(Error::invalid(
            op.pos,
            "`chlo.ragged_dot` takes 3 operands and has a result type",
        ));
    };
    let (f, p) = struct_attr(op, "ragged_dot_dimension_numbers")?;
    let lb = field_ints(f, "lhs_batching_dimensions", p)?;
    let rb = field_ints(f, "rhs_batching_dimensions", p)?;
    let lc = field_ints(f, "lhs_contracting_dimensions", p)?;
    let rc = field_ints(f, "rhs_contracting_dimensions", p)?;
    let ragged = field_ints(f, "lhs_ragged_dimensions", p)?;
    let group = field_ints(f, "rhs_group_dimensions", p)?;
    let (lt, rt) = (value_type(body, *lhs)?, value_type(body, *rhs)?);
    let ([r], [g]) = (&ragged[..], &group[..]) else {
        return Err(Error::unsupported(
            op.pos,
            "`chlo.ragged_dot` other than one ragged lhs dimension and one rhs group dimension",
        ));
    };
    let (r, g) = (*r, *g);
    if lb.contains(&r)
        || lc.contains(&r)
        || r < 0
        || r as usize >= lt.rank()
        || g < 0
        || g as usize >= rt.rank()
    {
        return Err(Error::unsupported(
            op.pos,
            "`chlo.ragged_dot` whose ragged dimension is not a non-contracting lhs dimension",
        ));
    }
    let sizes = const_ints(body, *sizes, op, "group sizes")?;
    let (ru, gu) = (r as usize, g as usize);
    if sizes.len() != rt.shape[gu]
        || sizes.iter().any(|&s| s < 0)
        || sizes.iter().sum::<i64>() > lt.shape[ru] as i64
    {
        return Err(Error::invalid(
            op.pos,
            "the group sizes of `chlo.ragged_dot` do not fit its operands",
        ));
    }
    // Where the ragged dimension lands in the result: after the batch dimensions, among the
    // lhs's free dimensions in order.
    let at = lb.len()
        + (0..r)
            .filter(|d| !lb.contains(d) && !lc.contains(d))
            .count();
    let shift = |d: &i64| if *d > g { d - 1 } else { *d };
    let dot = Op::DotGeneral {
        lhs_batching_dimensions: lb.clone(),
        rhs_batching_dimensions: rb.iter().map(shift).collect(),
        lhs_contracting_dimensions: lc.clone(),
        rhs_contracting_dimensions: rc.iter().map(shift).collect(),
    };
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let slice = |body: &mut Body,
                 v: ValueId,
                 t: &TensorType,
                 dim: usize,
                 from: usize,
                 to: usize|
     -> Result<ValueId> {
        let mut start = vec![0i64; t.rank()];
        let mut limit: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        start[dim] = from as i64;
        limit[dim] = to as i64;
        let s = Op::Slice {
            start_indices: start,
            limit_indices: limit,
            strides: vec![1; t.rank()],
        };
        Ok(body.b.push_at(s, &[v], None, l).map_err(err)?[0])
    };
    let mut parts = Vec::new();
    let mut row = 0usize;
    for (k, &n) in sizes.iter().enumerate() {
        let n = n as usize;
        if n == 0 {
            continue;
        }
        let rows = slice(body, *lhs, &lt, ru, row, row + n)?;
        let grp = slice(body, *rhs, &rt, gu, k, k + 1)?;
        let mut gshape = rt.shape.clone();
        gshape.remove(gu);
        let gty = TensorType::new(rt.dtype, gshape);
        let grp = body
            .b
            .push_at(Op::Reshape {}, &[grp], Some(std::slice::from_ref(&gty)), l)
            .map_err(err)?[0];
        let mut pty = out.clone();
        pty.shape[at] = n;
        parts.push(
            body.b
                .push_at(
                    dot.clone(),
                    &[rows, grp],
                    Some(std::slice::from_ref(&pty)),
                    l,
                )
                .map_err(err)?[0],
        );
        row += n;
    }
    if row < lt.shape[ru] {
        let mut zty = out.clone();
        zty.shape[at] = lt.shape[ru] - row;
        let sty = TensorType::scalar(zty.dtype);
        let zero =
            Literal::try_zeros(sty.clone()).map_err(|e| Error::invalid(op.pos, e.to_string()))?;
        let z = body
            .b
            .push_at(
                Op::Constant { value: zero },
                &[],
                Some(std::slice::from_ref(&sty)),
                l,
            )
            .map_err(err)?;
        let bcast = Op::BroadcastInDim {
            broadcast_dimensions: vec![],
        };
        parts.push(
            body.b
                .push_at(bcast, &z, Some(std::slice::from_ref(&zty)), l)
                .map_err(err)?[0],
        );
    }
    let cat = Op::Concatenate {
        dimension: at as i64,
    };
    body.b
        .push_at(cat, &parts, Some(std::slice::from_ref(out)), l)
        .map_err(err)
}

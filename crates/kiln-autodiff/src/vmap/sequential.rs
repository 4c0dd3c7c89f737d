//! The batching rule of last resort: run the instruction once per example in a `while` loop.
//!
//! The loop carries the example index, one accumulator per result (the batched result, filled
//! slice by slice) and the operands. Each iteration slices the batched operands at the index,
//! runs the original instruction on one example's values, and writes its results into the
//! accumulators. Used where no rule runs the batch as one op.

use super::{BVal, Batcher, InstCtx, all_batched};
use crate::Result;
use crate::rules::loops::{count_to, row};
use kiln_ir::{DType, Func, Op, TensorType, ValueId};

/// The batched results of `cx`, computed example by example.
pub(crate) fn rule(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    let n = cx.result_types.len();
    let acc_types = cx.batched_results(bd);
    if bd.size == 0 {
        // No example: the (empty) results need no loop, and a slice of one would not fit.
        let mut outs = Vec::with_capacity(n);
        for t in &acc_types {
            outs.push(bd.b.full(t, 0.0)?);
        }
        return Ok(all_batched(outs));
    }
    let mut init = Vec::with_capacity(1 + n + cx.xs.len());
    init.push(bd.scalar(DType::I64, 0.0)?);
    for t in &acc_types {
        init.push(bd.b.full(t, 0.0)?);
    }
    init.extend(cx.xs.iter().map(|x| x.v));
    let carry_types: Vec<TensorType> = init.iter().map(|&v| bd.ty(v)).collect();
    let cond = count_to(&carry_types, bd.size, "vmap_cond")?;
    let body = loop_body(bd, cx, &carry_types)?;
    let outs = bd.push(
        Op::While {
            cond: Box::new(cond),
            body: Box::new(body),
        },
        &init,
        None,
    )?;
    Ok(all_batched(outs[1..1 + n].to_vec()))
}

/// One example: slice, run, write back, advance.
fn loop_body(bd: &Batcher, cx: &InstCtx, carries: &[TensorType]) -> Result<Func> {
    let mut inner = Batcher::new("vmap_body", bd.size);
    inner.loc = bd.loc;
    let ps: Vec<ValueId> = carries.iter().map(|t| inner.b.param(t.clone())).collect();
    let n = cx.result_types.len();
    let i = ps[0];
    let zero = inner.scalar(DType::I64, 0.0)?;
    let mut operands = Vec::with_capacity(cx.xs.len());
    for (k, x) in cx.xs.iter().enumerate() {
        let v = ps[1 + n + k];
        operands.push(if x.batched {
            row(&mut inner.b, v, i, &cx.x_types[k])?
        } else {
            v
        });
    }
    let rs = inner.push(cx.op.clone(), &operands, Some(&cx.result_types))?;
    let mut next = Vec::with_capacity(carries.len());
    let one = inner.scalar(DType::I64, 1.0)?;
    next.push(inner.push1(Op::Add {}, &[i, one], None)?);
    for (j, &r) in rs.iter().enumerate() {
        let t = &cx.result_types[j];
        let mut shape = vec![1];
        shape.extend(&t.shape);
        let upd = inner.push1(Op::Reshape {}, &[r], Some(TensorType::new(t.dtype, shape)))?;
        let mut idx = vec![ps[1 + j], upd, i];
        idx.extend(std::iter::repeat_n(zero, t.rank()));
        next.push(inner.push1(Op::DynamicUpdateSlice {}, &idx, None)?);
    }
    next.extend(&ps[1 + n..]);
    Ok(inner.b.finish(&next)?)
}

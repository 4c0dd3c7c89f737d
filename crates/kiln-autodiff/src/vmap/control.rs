//! Batching rules for the ops with regions: `while`, `case`, `sort`, `reduce_region`,
//! `reduce_window_region`, `map`.
//!
//! A region is batched as a function of its own, its parameters batched where the op's
//! operands are. A loop's carries are batched where the initial values or the body make them
//! so (found by iterating to a fixed point). When the loop's condition differs between
//! examples, the batched loop runs while any example's condition holds and keeps each
//! finished example's carries (a select per carry). A `case` whose index differs between
//! examples runs every branch and selects each example's results; with a shared index, the
//! branches are batched alike and one runs.

use super::{BVal, Batcher, InstCtx, all_batched, batch_func, batch_inline};
use crate::Result;
use kiln_ir::{Builder, Combiner, ComparisonDirection, DType, Func, Op, TensorType, ValueId};

/// The batched results of a `while`, `case`, `sort` or `reduce_region` (the batch dimension
/// joins the kept dimensions; per-example init values reduce example by example).
pub(crate) fn rule(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    match cx.op {
        Op::While { cond, body } => while_loop(bd, cx, cond, body),
        Op::Case { branches } => case(bd, cx, branches),
        // A call is its callee's instructions, batched in place.
        Op::Call { callee } => match &callee.func {
            Some(g) => super::batch_inline(bd, g, cx.xs),
            None => Err(crate::Error::BadRequest(format!(
                "`call`: callee @{} is not resolved",
                callee.name
            ))),
        },
        Op::Sort {
            dimension,
            is_stable,
            comparator,
        } => {
            let operands = cx
                .xs
                .iter()
                .map(|&x| bd.materialize(x))
                .collect::<Result<Vec<_>>>()?;
            let declared = cx.batched_results(bd);
            let op = Op::Sort {
                dimension: dimension + 1,
                is_stable: *is_stable,
                comparator: comparator.clone(),
            };
            Ok(all_batched(bd.push(op, &operands, Some(&declared))?))
        }
        Op::ReduceRegion { dimensions, body } => {
            let k = cx.xs.len() / 2;
            if cx.xs[k..].iter().any(|x| x.batched) {
                // An init value differs between examples: the body's identity is unknown, so
                // the examples reduce one by one.
                return super::sequential::rule(bd, cx);
            }
            let mut operands = cx.xs[..k]
                .iter()
                .map(|&x| bd.materialize(x))
                .collect::<Result<Vec<_>>>()?;
            operands.extend(cx.xs[k..].iter().map(|x| x.v));
            let declared = cx.batched_results(bd);
            let op = Op::ReduceRegion {
                dimensions: super::shifted(dimensions),
                body: body.clone(),
            };
            Ok(all_batched(bd.push(op, &operands, Some(&declared))?))
        }
        Op::ReduceWindowRegion {
            window_dimensions,
            window_strides,
            base_dilations,
            window_dilations,
            padding,
            body,
        } => {
            let k = cx.xs.len() / 2;
            if cx.xs[k..].iter().any(|x| x.batched) {
                return super::sequential::rule(bd, cx);
            }
            let mut operands = cx.xs[..k]
                .iter()
                .map(|&x| bd.materialize(x))
                .collect::<Result<Vec<_>>>()?;
            operands.extend(cx.xs[k..].iter().map(|x| x.v));
            let declared = cx.batched_results(bd);
            // The batch dimension is a window of one element, stride 1, no padding.
            let one =
                |v: &[i64]| -> Vec<i64> { std::iter::once(1).chain(v.iter().copied()).collect() };
            let op = Op::ReduceWindowRegion {
                window_dimensions: one(window_dimensions),
                window_strides: one(window_strides),
                base_dilations: one(base_dilations),
                window_dilations: one(window_dilations),
                padding: std::iter::once((0, 0))
                    .chain(padding.iter().copied())
                    .collect(),
                body: body.clone(),
            };
            Ok(all_batched(bd.push(op, &operands, Some(&declared))?))
        }
        Op::Map { computation, .. } => {
            let operands = cx
                .xs
                .iter()
                .map(|&x| bd.materialize(x))
                .collect::<Result<Vec<_>>>()?;
            let declared = cx.batched_results(bd);
            let op = Op::Map {
                dimensions: (0..declared[0].rank() as i64).collect(),
                computation: computation.clone(),
            };
            Ok(all_batched(bd.push(op, &operands, Some(&declared))?))
        }
        _ => unreachable!("dispatched on ops with regions"),
    }
}

fn materialize_where(bd: &mut Batcher, xs: &[BVal], flags: &[bool]) -> Result<Vec<ValueId>> {
    xs.iter()
        .zip(flags)
        .map(|(&x, &f)| if f { bd.materialize(x) } else { Ok(x.v) })
        .collect()
}

fn while_loop(bd: &mut Batcher, cx: &InstCtx, cond: &Func, body: &Func) -> Result<Vec<BVal>> {
    let size = bd.size;
    // The carries batched by the initial values or by the body, to a fixed point.
    let mut flags: Vec<bool> = cx.xs.iter().map(|x| x.batched).collect();
    loop {
        let (_, out) = batch_func(body, &flags, size, None, &body.name)?;
        let next: Vec<bool> = flags.iter().zip(&out).map(|(a, b)| *a || *b).collect();
        if next == flags {
            break;
        }
        flags = next;
    }
    let (_, pred) = batch_func(cond, &flags, size, None, &cond.name)?;
    if !pred[0] {
        // Every example runs the same number of iterations.
        let (body_b, _) = batch_func(body, &flags, size, Some(&flags), &body.name)?;
        let (cond_b, _) = batch_func(cond, &flags, size, Some(&[false]), &cond.name)?;
        let init = materialize_where(bd, cx.xs, &flags)?;
        let rs = bd.push(
            Op::While {
                cond: Box::new(cond_b),
                body: Box::new(body_b),
            },
            &init,
            None,
        )?;
        return Ok(rs
            .into_iter()
            .zip(&flags)
            .map(|(v, &batched)| BVal { v, batched })
            .collect());
    }
    // Examples finish at different iterations: every carry is per example; run while any
    // example's condition holds, and keep the carries of the examples whose condition fails.
    let all = vec![true; cx.xs.len()];
    let init = materialize_where(bd, cx.xs, &all)?;
    let carry_types: Vec<TensorType> = init.iter().map(|&v| bd.ty(v)).collect();
    let (cond_b, _) = batch_func(cond, &all, size, Some(&[true]), &cond.name)?;
    let (body_b, _) = batch_func(body, &all, size, Some(&all), &body.name)?;
    // cond: any example still running.
    let mut cb = Builder::new(&cond.name);
    let ps: Vec<ValueId> = carry_types.iter().map(|t| cb.param(t.clone())).collect();
    let running = cb.inline_values(&cond_b, &ps)?[cond_b.outputs[0].index()];
    let no = cb.scalar(DType::Pred, 0.0)?;
    let any = cb.push_at(
        Op::Reduce {
            dimensions: vec![0],
            kind: Combiner::Or,
        },
        &[running, no],
        None,
        bd.loc,
    )?[0];
    let any_cond = cb.finish(&[any])?;
    // body: step every example, keep the new carries where the example was still running.
    let mut inner = Batcher::new(&body.name, size);
    inner.loc = bd.loc;
    let ps: Vec<ValueId> = carry_types
        .iter()
        .map(|t| inner.b.param(t.clone()))
        .collect();
    let running = inner.b.inline(&cond_b, &ps)?[0];
    let stepped = inner.b.inline(&body_b, &ps)?;
    let mut next = Vec::with_capacity(ps.len());
    for (k, (&new, &old)) in stepped.iter().zip(&ps).enumerate() {
        let keep = per_example_mask(&mut inner, running, &carry_types[k])?;
        next.push(inner.push1(Op::Select {}, &[keep, new, old], None)?);
    }
    let body_sel = inner.b.finish(&next)?;
    let rs = bd.push(
        Op::While {
            cond: Box::new(any_cond),
            body: Box::new(body_sel),
        },
        &init,
        None,
    )?;
    Ok(all_batched(rs))
}

/// A `pred[size]` mask broadcast to the batched type `t` along its leading dimension.
fn per_example_mask(bd: &mut Batcher, mask: ValueId, t: &TensorType) -> Result<ValueId> {
    bd.push1(
        Op::BroadcastInDim {
            broadcast_dimensions: vec![0],
        },
        &[mask],
        Some(t.with_dtype(DType::Pred)),
    )
}

fn case(bd: &mut Batcher, cx: &InstCtx, branches: &[Func]) -> Result<Vec<BVal>> {
    let size = bd.size;
    let index = cx.xs[0];
    let args = &cx.xs[1..];
    let flags: Vec<bool> = args.iter().map(|x| x.batched).collect();
    if !index.batched {
        // One branch runs for every example: batch the branches alike, their outputs batched
        // where any branch's is.
        let mut out = vec![false; cx.result_types.len()];
        for b in branches {
            let (_, o) = batch_func(b, &flags, size, None, &b.name)?;
            out.iter_mut().zip(o).for_each(|(a, b)| *a |= b);
        }
        let batched = branches
            .iter()
            .map(|b| Ok(batch_func(b, &flags, size, Some(&out), &b.name)?.0))
            .collect::<Result<Vec<_>>>()?;
        let mut operands = vec![index.v];
        operands.extend(args.iter().map(|x| x.v));
        let rs = bd.push(Op::Case { branches: batched }, &operands, None)?;
        return Ok(rs
            .into_iter()
            .zip(out)
            .map(|(v, batched)| BVal { v, batched })
            .collect());
    }
    // Each example picks its own branch: run them all, then select per example. An index
    // out of range picks the last branch, as `case` does.
    let mut outs: Vec<Vec<ValueId>> = Vec::with_capacity(branches.len());
    for b in branches {
        let rs = batch_inline(bd, b, args)?;
        outs.push(
            rs.into_iter()
                .map(|r| bd.materialize(r))
                .collect::<Result<Vec<_>>>()?,
        );
    }
    let mut result = outs.pop().expect("a case has a branch");
    for (k, out) in outs.iter().enumerate().rev() {
        let kv = bd.scalar(DType::I32, k as f64)?;
        let ks = bd.push1(
            Op::BroadcastInDim {
                broadcast_dimensions: vec![],
            },
            &[kv],
            Some(TensorType::new(DType::I32, [size])),
        )?;
        let hit = bd.push1(
            Op::Compare {
                comparison_direction: ComparisonDirection::Eq,
            },
            &[index.v, ks],
            None,
        )?;
        for (r, &o) in result.iter_mut().zip(out) {
            let t = bd.ty(o);
            let mask = per_example_mask(bd, hit, &t)?;
            *r = bd.push1(Op::Select {}, &[mask, o, *r], None)?;
        }
    }
    Ok(all_batched(result))
}

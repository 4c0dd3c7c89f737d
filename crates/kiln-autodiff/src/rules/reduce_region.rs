//! The VJP of `reduce_region`: the reduction written again as a tree of `map`s of its body,
//! whose reverse mode is the `map` rule's.
//!
//! A body is any function of the accumulators and one element of each input, so its
//! derivative is only known elementwise, at the pairs it combines. The rule therefore
//! recomputes the reduction in a fixed order whose every step is elementwise: each input is
//! transposed so that the reduced dimensions come last and reshaped to one row of `len`
//! elements per kept position; then, while a row has more than one element, the body combines
//! each even-numbered element with the next one (`map`s of the body's projections, one per
//! result), an odd last element passing to the next level as it is. The body finally combines
//! each init, broadcast, with the element left (an empty row leaves the init). The backward
//! pass of that function (the `map` rule, slices, reshapes, concatenations, transposes) is
//! the gradient.
//!
//! Every combination's left operand stands for a run of elements just before its right
//! operand's run, so the tree is a bracketing of the sequential reduction: for an associative
//! body the two agree, including a body that keeps the first of equal candidates (an argmax
//! without an index tie-break), whose gradient then goes to the element it returned. The init
//! enters once, as in the sequential order, so its gradient is that of one combination.
//!
//! `reduce_window_region` is recomputed as the fold the backends expand it into
//! ([`kiln_ir::window_fold`]: the inputs padded with the inits, then per window element, in
//! row-major order, a strided slice combined into the accumulators), with `map`s of the body
//! as the combination: the reference interpreter's own order. The padding's cotangents flow
//! to the inits, which the padding is made of.

use crate::Result;
use kiln_ir::window_fold::{Window, fold_window};
use kiln_ir::{Builder, Func, Op, TensorType, ValueId};

/// The reduction of `types`' inputs (the first half; the inits are the second) over
/// `dimensions` with `body`, as a tree of `map`s: a function of the op's operands returning
/// its results.
pub(super) fn as_tree(body: &Func, dimensions: &[i64], types: &[TensorType]) -> Result<Func> {
    let n = types.len() / 2;
    let mut b = Builder::new(&format!("{}_tree", body.name));
    let params: Vec<ValueId> = types.iter().map(|t| b.param(t.clone())).collect();
    let (inputs, inits) = params.split_at(n);
    let shape = &types[0].shape;
    let reduced = |d: usize| dimensions.contains(&(d as i64));
    let kept: Vec<usize> = (0..shape.len()).filter(|&d| !reduced(d)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let len: usize = dimensions.iter().map(|&d| shape[d as usize]).product();
    let permutation: Vec<i64> = kept
        .iter()
        .map(|&d| d as i64)
        .chain(dimensions.iter().copied())
        .collect();
    let row = kept.len();
    let mut rows_shape = kept_shape.clone();
    rows_shape.push(len);
    let mut level = Vec::with_capacity(n);
    for &x in inputs {
        let t = b.transpose(x, &permutation)?;
        level.push(b.reshape(t, &rows_shape)?);
    }
    let projections = projections(body, n);
    let combine = |b: &mut Builder, operands: &[ValueId], rank: usize| {
        apply_as_maps(b, &projections, operands, rank)
    };
    let mut width = len;
    while width > 1 {
        let pairs = width / 2;
        // Elements 2i (left) and 2i + 1 (right) of each row, as rows of `pairs`.
        let mut paired_shape = kept_shape.clone();
        paired_shape.extend([pairs, 2]);
        let mut halves_shape = kept_shape.clone();
        halves_shape.push(pairs);
        let mut operands = Vec::with_capacity(2 * n);
        for side in 0..2 {
            for &v in &level {
                let even = slice_last(&mut b, v, row, 0, 2 * pairs)?;
                let p = b.reshape(even, &paired_shape)?;
                let s = slice_last(&mut b, p, row + 1, side, side + 1)?;
                operands.push(b.reshape(s, &halves_shape)?);
            }
        }
        let combined = combine(&mut b, &operands, row + 1)?;
        level = if width % 2 == 1 {
            let mut next = Vec::with_capacity(n);
            for (&c, &v) in combined.iter().zip(&level) {
                let last = slice_last(&mut b, v, row, width - 1, width)?;
                let op = Op::Concatenate {
                    dimension: row as i64,
                };
                next.push(b.inst(op, &[c, last])?);
            }
            next
        } else {
            combined
        };
        width = pairs + width % 2;
    }
    let mut inits_broadcast = Vec::with_capacity(n);
    for &init in inits {
        inits_broadcast.push(b.broadcast(init, &[], &kept_shape)?);
    }
    if len == 0 {
        return Ok(b.finish(&inits_broadcast)?);
    }
    let mut operands = inits_broadcast;
    for &v in &level {
        operands.push(b.reshape(v, &kept_shape)?);
    }
    let results = combine(&mut b, &operands, row)?;
    Ok(b.finish(&results)?)
}

/// Elements `start..limit` of `v`'s dimension `axis`, its last.
fn slice_last(
    b: &mut Builder,
    v: ValueId,
    axis: usize,
    start: usize,
    limit: usize,
) -> Result<ValueId> {
    let shape = b.ty(v).expect("a value of the tree").shape.clone();
    let mut start_indices = vec![0; axis + 1];
    let mut limit_indices: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
    start_indices[axis] = start as i64;
    limit_indices[axis] = limit as i64;
    Ok(b.inst(
        Op::Slice {
            start_indices,
            limit_indices,
            strides: vec![1; axis + 1],
        },
        &[v],
    )?)
}

/// `body`'s projections onto each of its `n` results.
fn projections(body: &Func, n: usize) -> Vec<Func> {
    (0..n)
        .map(|j| crate::select_outputs(body, &[j], &format!("{}_{j}", body.name)))
        .collect()
}

/// The body, given as its `projections`, applied elementwise to `operands` of rank `rank`: one
/// `map` per result.
fn apply_as_maps(
    b: &mut Builder,
    projections: &[Func],
    operands: &[ValueId],
    rank: usize,
) -> std::result::Result<Vec<ValueId>, kiln_ir::VerifyError> {
    projections
        .iter()
        .map(|p| {
            let op = Op::Map {
                dimensions: (0..rank as i64).collect(),
                computation: Box::new(p.clone()),
            };
            b.inst(op, operands)
        })
        .collect()
}

/// `op`, a `reduce_window_region` with `body` of operands `types` and results of shape
/// `out_shape`, as its fold over the window with `map`s of the body: a function of the op's
/// operands returning its results.
pub(super) fn as_window_fold(
    op: &Op,
    body: &Func,
    types: &[TensorType],
    out_shape: &[usize],
) -> Result<Func> {
    let window = Window::of(op).expect("a reduce_window_region");
    let n = types.len() / 2;
    let mut b = Builder::new(&format!("{}_fold", body.name));
    let params: Vec<ValueId> = types.iter().map(|t| b.param(t.clone())).collect();
    let projections = projections(body, n);
    let results = fold_window(
        &mut b,
        &params,
        &window,
        out_shape,
        None,
        &mut |b, operands| apply_as_maps(b, &projections, operands, out_shape.len()),
    )?;
    Ok(b.finish(&results)?)
}

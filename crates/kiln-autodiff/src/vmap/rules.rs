//! Batching rules for the ops without regions or indexing: elementwise ops (from the op
//! table's `ELEMENTWISE` property), layout ops, reductions and windows, matrix products and
//! convolutions (`conv`), linear algebra. Each runs the whole batch as one op; the cases that
//! cannot (a per-example start value of a reduction, a per-example generator state) go to the
//! sequential rule.

use super::{BVal, Batcher, InstCtx, all_batched, conv, prepend, sequential, shifted};
use crate::Result;
use kiln_ir::{Op, Props, TensorType, ValueId};

/// The batched results of `cx` (an op without regions, not a gather, scatter or dynamic
/// slice).
pub(crate) fn rule(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    let declared = cx.batched_results(bd);
    let one = |bd: &mut Batcher, op: Op, operands: &[ValueId]| -> Result<Vec<BVal>> {
        Ok(all_batched(bd.push(op, operands, Some(&declared))?))
    };
    let x0 = cx.xs[0];
    match cx.op {
        // A bitcast between widths adds or removes a last dimension (`f64[]` to `pred[64]`):
        // its operand is batched as it is, not broadcast to the result's shape as an
        // elementwise op's scalar operand is.
        Op::BitcastConvert {} => {
            let x = bd.materialize(x0)?;
            one(bd, Op::BitcastConvert {}, &[x])
        }
        op if op.props().contains(Props::ELEMENTWISE) => {
            let operands = elementwise_operands(bd, cx)?;
            one(bd, op.clone(), &operands)
        }
        Op::BroadcastInDim {
            broadcast_dimensions,
        } => one(
            bd,
            Op::BroadcastInDim {
                broadcast_dimensions: prepend(0, &shifted(broadcast_dimensions)),
            },
            &[x0.v],
        ),
        Op::Reshape {} => one(bd, Op::Reshape {}, &[x0.v]),
        Op::Transpose { permutation } => one(
            bd,
            Op::Transpose {
                permutation: prepend(0, &shifted(permutation)),
            },
            &[x0.v],
        ),
        Op::Slice {
            start_indices,
            limit_indices,
            strides,
        } => one(
            bd,
            Op::Slice {
                start_indices: prepend(0, start_indices),
                limit_indices: prepend(bd.size as i64, limit_indices),
                strides: prepend(1, strides),
            },
            &[x0.v],
        ),
        Op::Reverse { dimensions } => one(
            bd,
            Op::Reverse {
                dimensions: shifted(dimensions),
            },
            &[x0.v],
        ),
        Op::Concatenate { dimension } => {
            let operands = cx
                .xs
                .iter()
                .map(|&x| bd.materialize(x))
                .collect::<Result<Vec<_>>>()?;
            one(
                bd,
                Op::Concatenate {
                    dimension: dimension + 1,
                },
                &operands,
            )
        }
        Op::OptimizationBarrier {} => {
            // Each operand passes through as it is, batched or not.
            let operands: Vec<ValueId> = cx.xs.iter().map(|x| x.v).collect();
            let tys: Vec<TensorType> = operands.iter().map(|&v| bd.ty(v)).collect();
            let rs = bd.push(Op::OptimizationBarrier {}, &operands, Some(&tys))?;
            Ok(rs
                .into_iter()
                .zip(cx.xs)
                .map(|(v, x)| BVal {
                    v,
                    batched: x.batched,
                })
                .collect())
        }
        // The start or padding value is the same for every example: the batch dimension is
        // one more dimension the op leaves alone.
        Op::Pad {
            edge_padding_low,
            edge_padding_high,
            interior_padding,
        } if !cx.xs[1].batched => one(
            bd,
            Op::Pad {
                edge_padding_low: prepend(0, edge_padding_low),
                edge_padding_high: prepend(0, edge_padding_high),
                interior_padding: prepend(0, interior_padding),
            },
            &[x0.v, cx.xs[1].v],
        ),
        Op::Reduce { dimensions, kind } if !cx.xs[1].batched => one(
            bd,
            Op::Reduce {
                dimensions: shifted(dimensions),
                kind: *kind,
            },
            &[x0.v, cx.xs[1].v],
        ),
        Op::ReduceWindow {
            window_dimensions,
            window_strides,
            base_dilations,
            window_dilations,
            padding,
            kind,
        } if !cx.xs[1].batched => one(
            bd,
            Op::ReduceWindow {
                window_dimensions: prepend(1, window_dimensions),
                window_strides: prepend(1, window_strides),
                base_dilations: prepend(1, base_dilations),
                window_dilations: prepend(1, window_dilations),
                padding: prepend((0, 0), padding),
                kind: *kind,
            },
            &[x0.v, cx.xs[1].v],
        ),
        Op::SelectAndScatter {
            window_dimensions,
            window_strides,
            padding,
            select,
            kind,
        } if !cx.xs[2].batched => {
            let operand = bd.materialize(cx.xs[0])?;
            let source = bd.materialize(cx.xs[1])?;
            one(
                bd,
                Op::SelectAndScatter {
                    window_dimensions: prepend(1, window_dimensions),
                    window_strides: prepend(1, window_strides),
                    padding: prepend((0, 0), padding),
                    select: *select,
                    kind: *kind,
                },
                &[operand, source, cx.xs[2].v],
            )
        }
        Op::DotGeneral { .. } => dot_general(bd, cx),
        // The matrices are the last two dimensions and any leading ones a batch: the vmapped
        // batch is one more leading dimension (an unbatched operand broadcast along it).
        // So are `fft`'s: it transforms trailing dimensions only.
        Op::Cholesky { .. } | Op::Lu {} | Op::Fft { .. } => one(bd, cx.op.clone(), &[x0.v]),
        Op::TriangularSolve { .. } => {
            let a = bd.materialize(cx.xs[0])?;
            let b = bd.materialize(cx.xs[1])?;
            one(bd, cx.op.clone(), &[a, b])
        }
        Op::Convolution { .. } => conv::rule(bd, cx),
        _ => sequential::rule(bd, cx),
    }
}

/// The operands of a batched elementwise op, each with the batch dimension in front: a
/// per-example scalar operand of an op on larger shapes (`select`'s predicate, `clamp`'s
/// bounds) stays a scalar when unbatched and is broadcast to the batched shape when batched.
fn elementwise_operands(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<ValueId>> {
    let full_rank = cx.result_types[0].rank();
    let mut out = Vec::with_capacity(cx.xs.len());
    for (x, t) in cx.xs.iter().zip(&cx.x_types) {
        if t.rank() == 0 && full_rank > 0 {
            if x.batched {
                let mut shape = vec![bd.size];
                shape.extend(&cx.result_types[0].shape);
                let ty = TensorType::new(t.dtype, shape);
                out.push(bd.push1(
                    Op::BroadcastInDim {
                        broadcast_dimensions: vec![0],
                    },
                    &[x.v],
                    Some(ty),
                )?);
            } else {
                out.push(x.v);
            }
        } else {
            out.push(bd.materialize(*x)?);
        }
    }
    Ok(out)
}

/// `dot_general`: with both operands batched, the batch dimension becomes one more batching
/// dimension; with one, a free dimension of that operand, moved to the front of the result.
fn dot_general(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    let Op::DotGeneral {
        lhs_batching_dimensions: lb,
        rhs_batching_dimensions: rb,
        lhs_contracting_dimensions: lc,
        rhs_contracting_dimensions: rc,
    } = cx.op
    else {
        unreachable!("dispatched on dot_general")
    };
    let (l, r) = (cx.xs[0], cx.xs[1]);
    let res = &cx.result_types[0];
    let nb = lb.len();
    let (op, at) = match (l.batched, r.batched) {
        (true, true) => (
            Op::DotGeneral {
                lhs_batching_dimensions: prepend(0, &shifted(lb)),
                rhs_batching_dimensions: prepend(0, &shifted(rb)),
                lhs_contracting_dimensions: shifted(lc),
                rhs_contracting_dimensions: shifted(rc),
            },
            0,
        ),
        (true, false) => (
            Op::DotGeneral {
                lhs_batching_dimensions: shifted(lb),
                rhs_batching_dimensions: rb.clone(),
                lhs_contracting_dimensions: shifted(lc),
                rhs_contracting_dimensions: rc.clone(),
            },
            nb,
        ),
        _ => {
            let lhs_free = cx.x_types[0].rank() - nb - lc.len();
            (
                Op::DotGeneral {
                    lhs_batching_dimensions: lb.clone(),
                    rhs_batching_dimensions: shifted(rb),
                    lhs_contracting_dimensions: lc.clone(),
                    rhs_contracting_dimensions: shifted(rc),
                },
                nb + lhs_free,
            )
        }
    };
    let mut shape = res.shape.clone();
    shape.insert(at, bd.size);
    let v = bd.push1(op, &[l.v, r.v], Some(TensorType::new(res.dtype, shape)))?;
    Ok(all_batched(vec![bd.batch_first(v, at)?]))
}

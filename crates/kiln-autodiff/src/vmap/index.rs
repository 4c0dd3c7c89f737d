//! Batching rules for indexing: `gather`, `scatter`, `dynamic_slice`, `dynamic_update_slice`.
//!
//! Per-example indices into a shared operand need no change beyond a shifted dimension.
//! Otherwise each example indexes its own slice of the batched operand: the batch becomes a
//! batching dimension of the operand and of the indices (`operand_batching_dims` /
//! `start_indices_batching_dims`, `input_batching_dims` / `scatter_indices_batching_dims`).
//! Per-example starts of a dynamic (update) slice become index vectors whose first component
//! is the example's position (an `iota` along the batch).

use super::{BVal, Batcher, InstCtx, all_batched, prepend, shifted};
use crate::Result;
use kiln_ir::{Combiner, DType, Op, TensorType, ValueId};

/// The batched results of a gather, scatter or dynamic (update) slice.
pub(crate) fn rule(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    let declared = cx.batched_results(bd);
    match cx.op {
        Op::Gather {
            offset_dims,
            collapsed_slice_dims,
            start_index_map,
            index_vector_dim,
            slice_sizes,
            operand_batching_dims: obd,
            start_indices_batching_dims: sibd,
        } => {
            let (operand, indices) = (cx.xs[0], cx.xs[1]);
            if !operand.batched {
                // Per-example indices into a shared operand: the batch is one more index batch
                // dimension, placed first by shifting the offset dimensions.
                let op = Op::Gather {
                    offset_dims: shifted(offset_dims),
                    collapsed_slice_dims: collapsed_slice_dims.clone(),
                    start_index_map: start_index_map.clone(),
                    index_vector_dim: index_vector_dim + 1,
                    slice_sizes: slice_sizes.clone(),
                    operand_batching_dims: obd.clone(),
                    start_indices_batching_dims: shifted(sibd),
                };
                return Ok(all_batched(bd.push(
                    op,
                    &[operand.v, indices.v],
                    Some(&declared),
                )?));
            }
            // Each example indexes its own operand: the batch is a batching dimension of both.
            let operand = bd.materialize(operand)?;
            let idx = bd.materialize(indices)?;
            let op = Op::Gather {
                offset_dims: shifted(offset_dims),
                collapsed_slice_dims: shifted(collapsed_slice_dims),
                start_index_map: shifted(start_index_map),
                index_vector_dim: index_vector_dim + 1,
                slice_sizes: prepend(1, slice_sizes),
                operand_batching_dims: prepend(0, &shifted(obd)),
                start_indices_batching_dims: prepend(0, &shifted(sibd)),
            };
            Ok(all_batched(bd.push(
                op,
                &[operand, idx],
                Some(&declared),
            )?))
        }
        Op::Scatter {
            update_window_dims,
            inserted_window_dims,
            scatter_dims_to_operand_dims,
            index_vector_dim,
            kind,
            input_batching_dims: ibd,
            scatter_indices_batching_dims: sibd,
        } => {
            let operand = bd.materialize(cx.xs[0])?;
            let idx = bd.materialize(cx.xs[1])?;
            let updates = bd.materialize(cx.xs[2])?;
            let op = Op::Scatter {
                update_window_dims: shifted(update_window_dims),
                inserted_window_dims: shifted(inserted_window_dims),
                scatter_dims_to_operand_dims: shifted(scatter_dims_to_operand_dims),
                index_vector_dim: index_vector_dim + 1,
                kind: *kind,
                input_batching_dims: prepend(0, &shifted(ibd)),
                scatter_indices_batching_dims: prepend(0, &shifted(sibd)),
            };
            Ok(all_batched(bd.push(
                op,
                &[operand, idx, updates],
                Some(&declared),
            )?))
        }
        Op::DynamicSlice { slice_sizes } => {
            let starts = &cx.xs[1..];
            if starts.iter().all(|s| !s.batched) {
                let zero = bd.scalar(cx.x_types[1].dtype, 0.0)?;
                let mut operands = vec![cx.xs[0].v, zero];
                operands.extend(starts.iter().map(|s| s.v));
                let op = Op::DynamicSlice {
                    slice_sizes: prepend(bd.size as i64, slice_sizes),
                };
                return Ok(all_batched(bd.push(op, &operands, Some(&declared))?));
            }
            // Per-example starts: a gather of one window per example (gather clamps its
            // starts into bounds as dynamic_slice does).
            let operand = bd.materialize(cx.xs[0])?;
            let idx = start_vectors(bd, starts, None)?;
            let rank = slice_sizes.len() as i64;
            let op = Op::Gather {
                offset_dims: (1..=rank).collect(),
                collapsed_slice_dims: vec![0],
                start_index_map: (0..=rank).collect(),
                index_vector_dim: 1,
                slice_sizes: prepend(1, slice_sizes),
                operand_batching_dims: Vec::new(),
                start_indices_batching_dims: Vec::new(),
            };
            Ok(all_batched(bd.push(
                op,
                &[operand, idx],
                Some(&declared),
            )?))
        }
        Op::DynamicUpdateSlice {} => {
            let starts = &cx.xs[2..];
            if starts.iter().all(|s| !s.batched) {
                let operand = bd.materialize(cx.xs[0])?;
                let update = bd.materialize(cx.xs[1])?;
                let zero = bd.scalar(cx.x_types[2].dtype, 0.0)?;
                let mut operands = vec![operand, update, zero];
                operands.extend(starts.iter().map(|s| s.v));
                return Ok(all_batched(bd.push(
                    Op::DynamicUpdateSlice {},
                    &operands,
                    Some(&declared),
                )?));
            }
            // Per-example starts: a scatter replacing one window per example, with the starts
            // clamped first (dynamic_update_slice clamps them; scatter would skip the window).
            let (ot, ut) = (&cx.x_types[0], &cx.x_types[1]);
            let limits: Vec<i64> = ot
                .shape
                .iter()
                .zip(&ut.shape)
                .map(|(&d, &u)| d as i64 - u as i64)
                .collect();
            let operand = bd.materialize(cx.xs[0])?;
            let update = bd.materialize(cx.xs[1])?;
            let idx = start_vectors(bd, starts, Some(&limits))?;
            let rank = ot.rank() as i64;
            let op = Op::Scatter {
                update_window_dims: (1..=rank).collect(),
                inserted_window_dims: vec![0],
                scatter_dims_to_operand_dims: (0..=rank).collect(),
                index_vector_dim: 1,
                kind: Combiner::Replace,
                input_batching_dims: Vec::new(),
                scatter_indices_batching_dims: Vec::new(),
            };
            Ok(all_batched(bd.push(
                op,
                &[operand, idx, update],
                Some(&declared),
            )?))
        }
        _ => unreachable!("dispatched on indexing ops"),
    }
}

/// Integer indices `v` as i64: a u64 past `i64::MAX` first saturates to it (it clamps to the
/// top as the large number it is, `kiln_ir::literal::index_of`), the others convert exactly.
fn to_i64_index(bd: &mut Batcher, v: ValueId) -> Result<ValueId> {
    let t = bd.ty(v).clone();
    let mut v = v;
    if t.dtype == DType::U64 {
        let top = kiln_ir::Literal::from_i64s(TensorType::scalar(DType::U64), &[i64::MAX])
            .expect("a scalar");
        let top = bd.push1(
            Op::Constant { value: top },
            &[],
            Some(TensorType::scalar(DType::U64)),
        )?;
        let top = bd.push1(
            Op::BroadcastInDim {
                broadcast_dimensions: vec![],
            },
            &[top],
            Some(t.clone()),
        )?;
        v = bd.push1(Op::Minimum {}, &[v, top], None)?;
    }
    bd.push1(Op::Convert {}, &[v], Some(t.with_dtype(DType::I64)))
}

/// The scalar `starts` of each example as a `[size, 1 + n]` i64 index array: the example's
/// position, then its starts (each clamped into `[0, limits[k]]` when `limits` are given).
fn start_vectors(bd: &mut Batcher, starts: &[BVal], limits: Option<&[i64]>) -> Result<ValueId> {
    let size = bd.size;
    let column = TensorType::new(DType::I64, [size, 1]);
    let mut cols = vec![bd.push1(Op::Iota { iota_dimension: 0 }, &[], Some(column.clone()))?];
    for (k, s) in starts.iter().enumerate() {
        let mut v = to_i64_index(bd, s.v)?;
        if let Some(limits) = limits {
            let lo = bd.scalar(DType::I64, 0.0)?;
            let hi = bd.scalar(DType::I64, limits[k].max(0) as f64)?;
            v = bd.push1(Op::Clamp {}, &[lo, v, hi], None)?;
        }
        let dims = if s.batched { vec![0] } else { vec![] };
        cols.push(bd.push1(
            Op::BroadcastInDim {
                broadcast_dimensions: dims,
            },
            &[v],
            Some(column.clone()),
        )?);
    }
    let n = cols.len();
    bd.push1(
        Op::Concatenate { dimension: 1 },
        &cols,
        Some(TensorType::new(DType::I64, [size, n])),
    )
}

//! The batching rule of `convolution`: every combination of batched input and kernel runs as
//! one convolution, the vmapped batch folded into a dimension the op already keeps apart.
//!
//! - Input batched, kernel shared: the batch merges into the input's batch dimension (within
//!   each batch group, so each group keeps its run of input batch elements).
//! - Kernel batched (a per-example kernel: the weight gradient inside `vmap(grad(loss))`, an
//!   ensemble of models): example b's kernel becomes output features group of its own. The
//!   kernel's output features gain the batch as their major part, and
//!   - with the input batched too, the input's features gain it as well and
//!     `feature_group_count` is multiplied by the batch size (example b's input features only
//!     meet example b's kernel); when the convolution has batch groups (the kernel gradient of
//!     a grouped convolution), the batch goes into the input's batch dimension instead and
//!     `batch_group_count` is multiplied;
//!   - with a shared input and no groups, every example's kernel sees the whole input; with
//!     groups, the kernel's output features are ordered (group, example, feature) so that
//!     each group's run of output features holds every example's features of that group.
//!
//!   The result's output features are then split back into (example, feature).
//!
//! No case is left to the per-example loop: the folded counts satisfy the op's constraints
//! whenever the per-example convolution does (`feature_group_count` and `batch_group_count`
//! are never both above 1, and multiplying the divided sizes by the batch keeps them divided).

use super::{BVal, Batcher, InstCtx, all_batched};
use crate::Result;
use kiln_ir::{Op, TensorType, ValueId};

/// The batched result of a `convolution` with a batched input, kernel or both.
pub(crate) fn rule(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    if cx.xs[1].batched {
        batched_kernel(bd, cx)
    } else {
        batched_input(bd, cx)
    }
}

/// `x` with dimension `src` moved in front of dimension `dst` (numbered with `src` removed)
/// and merged into it, `src` the major part.
fn axis_into(bd: &mut Batcher, x: ValueId, src: usize, dst: usize) -> Result<ValueId> {
    let t = bd.ty(x);
    let mut perm: Vec<usize> = (0..t.rank()).filter(|&d| d != src).collect();
    perm.insert(dst, src);
    let moved = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        x
    } else {
        let permutation = perm.iter().map(|&p| p as i64).collect();
        bd.push1(Op::Transpose { permutation }, &[x], None)?
    };
    let mut shape: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
    let merged = shape[dst] * shape[dst + 1];
    shape.splice(dst..dst + 2, [merged]);
    bd.push1(
        Op::Reshape {},
        &[moved],
        Some(TensorType::new(t.dtype, shape)),
    )
}

/// `x` with dimension `at` split into `(major, rest)`.
fn axis_out_of(bd: &mut Batcher, x: ValueId, at: usize, major: usize) -> Result<ValueId> {
    let t = bd.ty(x);
    let mut shape = t.shape.clone();
    let rest = shape[at] / major;
    shape.splice(at..at + 1, [major, rest]);
    bd.push1(Op::Reshape {}, &[x], Some(TensorType::new(t.dtype, shape)))
}

/// A kernel that differs per example (and an input that may): the batch folds into the
/// feature or batch groups (see the module docs).
fn batched_kernel(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    let Op::Convolution {
        feature_group_count: fgc,
        batch_group_count: bgc,
        input_dims,
        kernel_dims,
        output_dims,
        ..
    } = cx.op
    else {
        unreachable!("dispatched on convolution")
    };
    let size = bd.size;
    let (lhs, rhs) = (cx.xs[0], cx.xs[1]);
    let k_out = kernel_dims[0] as usize;
    let o_feat = output_dims[1] as usize;
    let mut op = cx.op.clone();
    let Op::Convolution {
        feature_group_count: new_fgc,
        batch_group_count: new_bgc,
        ..
    } = &mut op
    else {
        unreachable!("a convolution")
    };
    let grouped = (*fgc).max(*bgc) as usize;
    let (new_lhs, new_rhs) = if lhs.batched {
        let l = if *bgc > 1 {
            *new_bgc *= size as i64;
            axis_into(bd, lhs.v, 0, input_dims[0] as usize)?
        } else {
            *new_fgc *= size as i64;
            axis_into(bd, lhs.v, 0, input_dims[1] as usize)?
        };
        (l, axis_into(bd, rhs.v, 0, k_out)?)
    } else if grouped == 1 {
        (lhs.v, axis_into(bd, rhs.v, 0, k_out)?)
    } else {
        // [size, .., out, ..] -> [size, .., groups, out / groups, ..]
        // -> [.., groups, size * out / groups, ..] -> [.., out * size, ..] (group major).
        let split = axis_out_of(bd, rhs.v, k_out + 1, grouped)?;
        let inner = axis_into(bd, split, 0, k_out + 1)?;
        (lhs.v, axis_into(bd, inner, k_out, k_out)?)
    };
    let res = &cx.result_types[0];
    let mut shape = res.shape.clone();
    shape[o_feat] *= size;
    let out = bd.push1(
        op,
        &[new_lhs, new_rhs],
        Some(TensorType::new(res.dtype, shape)),
    )?;
    let split = if lhs.batched || grouped == 1 {
        // Output features ordered (example, feature).
        axis_out_of(bd, out, o_feat, size)?
    } else {
        // Ordered (group, example, feature within the group): the example moves in front.
        let by_group = axis_out_of(bd, out, o_feat, grouped)?;
        let by_example = axis_out_of(bd, by_group, o_feat + 1, size)?;
        axis_into(bd, by_example, o_feat, o_feat + 1)?
    };
    Ok(all_batched(vec![bd.batch_first(split, o_feat)?]))
}

/// `convolution` of a batched input with a shared kernel: the batch dimension merges into the
/// input's batch dimension, and splits out of the output's. With batch groups it merges
/// within each group (the input's batch becomes [groups, batch, per group]), so each group
/// keeps its run of input batch elements.
fn batched_input(bd: &mut Batcher, cx: &InstCtx) -> Result<Vec<BVal>> {
    let Op::Convolution {
        input_dims,
        output_dims,
        batch_group_count,
        ..
    } = cx.op
    else {
        unreachable!("dispatched on convolution")
    };
    let lt = &cx.x_types[0];
    let res = &cx.result_types[0];
    let (nb_in, nb_out) = (input_dims[0] as usize, output_dims[0] as usize);
    // Move the batch dimension next to the input's batch dimension, then merge the two.
    let mut perm: Vec<i64> = (1..=lt.rank() as i64).collect();
    perm.insert(nb_in, 0);
    let mut moved = bd.push1(Op::Transpose { permutation: perm }, &[cx.xs[0].v], None)?;
    let groups = *batch_group_count as usize;
    if groups > 1 {
        // [.., size, groups * n, ..] -> [.., size, groups, n, ..] -> [.., groups, size, n, ..].
        let mut split = lt.shape.clone();
        split[nb_in] /= groups;
        split.insert(nb_in, groups);
        split.insert(nb_in, bd.size);
        let v = bd.push1(
            Op::Reshape {},
            &[moved],
            Some(TensorType::new(lt.dtype, split)),
        )?;
        let mut swap: Vec<i64> = (0..lt.rank() as i64 + 2).collect();
        swap.swap(nb_in, nb_in + 1);
        moved = bd.push1(Op::Transpose { permutation: swap }, &[v], None)?;
    }
    let mut merged_shape = lt.shape.clone();
    merged_shape[nb_in] *= bd.size;
    let merged = bd.push1(
        Op::Reshape {},
        &[moved],
        Some(TensorType::new(lt.dtype, merged_shape)),
    )?;
    let mut out_shape = res.shape.clone();
    out_shape[nb_out] *= bd.size;
    let out = bd.push1(
        cx.op.clone(),
        &[merged, cx.xs[1].v],
        Some(TensorType::new(res.dtype, out_shape)),
    )?;
    let mut split_shape = res.shape.clone();
    split_shape.insert(nb_out, bd.size);
    let split = bd.push1(
        Op::Reshape {},
        &[out],
        Some(TensorType::new(res.dtype, split_shape)),
    )?;
    Ok(all_batched(vec![bd.batch_first(split, nb_out)?]))
}

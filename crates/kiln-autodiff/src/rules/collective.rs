//! The VJPs of the collectives (see their specs): each is the collective that moves the
//! cotangents back along the same process groups. A sum's cotangent is summed back
//! (`all_reduce` of `add`), a gather's is reduce-scattered and the other way round, an
//! `all_to_all` is undone by the one with its dimensions swapped, a permutation by the inverse
//! pairs, a broadcast by a `collective_reduce` of `add` to its root, and that by a broadcast
//! from the root. Reductions with any other computation have no rule.

use crate::{Error, Result};
use kiln_ir::{Builder, Func, Op, TensorType, ValueId};

fn ty(b: &Builder, v: ValueId) -> TensorType {
    b.ty(v).expect("rules only see defined values").clone()
}

/// Whether `op` is a collective with a VJP rule here.
pub(crate) fn handles(op: &Op) -> bool {
    matches!(
        op,
        Op::AllGather { .. }
            | Op::AllReduce { .. }
            | Op::AllToAll { .. }
            | Op::ReduceScatter { .. }
            | Op::CollectivePermute { .. }
            | Op::CollectiveBroadcast { .. }
            | Op::CollectiveReduce { .. }
    )
}

/// Whether `f` is `add` of its two parameters, in order or not.
fn is_sum(f: &Func) -> bool {
    match &f.insts[..] {
        [inst] => {
            matches!(inst.op, Op::Add {})
                && f.params.len() == 2
                && (inst.operands == f.params || inst.operands == [f.params[1], f.params[0]])
                && f.outputs == inst.results
        }
        _ => false,
    }
}

/// `add` of two scalars of `t`'s element type: the computation of the summing collectives.
fn sum_of(t: &TensorType) -> Result<Box<Func>> {
    let s = TensorType::scalar(t.dtype);
    let mut b = Builder::new("sum");
    let x = b.param(s.clone());
    let y = b.param(s);
    let z = b.binary(Op::Add {}, x, y)?;
    Ok(Box::new(b.finish(&[z])?))
}

fn no_rule(op: &Op) -> Error {
    Error::Unsupported(format!(
        "`{}` is differentiable only with an `add` computation (a sum over the group)",
        op.mnemonic()
    ))
}

/// The operands' cotangents of the collective `op` with operands `x` and results' cotangents
/// `g` (a missing one is zero).
pub(crate) fn vjp(
    b: &mut Builder,
    op: &Op,
    x: &[ValueId],
    r: &[ValueId],
    g: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    let mut gs = Vec::with_capacity(g.len());
    for (gi, &ri) in g.iter().zip(r) {
        gs.push(match gi {
            Some(v) => *v,
            None => {
                let t = ty(b, ri);
                b.full(&t, 0.0)?
            }
        });
    }
    let xt: Vec<TensorType> = x.iter().map(|&v| ty(b, v)).collect();
    let back = match op {
        // A sum's cotangents are summed the same way.
        Op::AllReduce { computation, .. } => {
            if !is_sum(computation) {
                return Err(no_rule(op));
            }
            op.clone()
        }
        Op::AllGather {
            all_gather_dim,
            replica_groups,
            channel_id,
            use_global_device_ids,
        } => {
            // One reduce_scatter per operand (reduce_scatter takes one).
            let mut out = Vec::with_capacity(x.len());
            for (gi, t) in gs.iter().zip(&xt) {
                let rs = Op::ReduceScatter {
                    scatter_dimension: *all_gather_dim,
                    replica_groups: replica_groups.clone(),
                    channel_id: *channel_id,
                    use_global_device_ids: *use_global_device_ids,
                    computation: sum_of(t)?,
                };
                out.push(Some(
                    b.push_at(rs, &[*gi], Some(std::slice::from_ref(t)), None)?[0],
                ));
            }
            return Ok(out);
        }
        Op::ReduceScatter {
            scatter_dimension,
            replica_groups,
            channel_id,
            use_global_device_ids,
            computation,
        } => {
            if !is_sum(computation) {
                return Err(no_rule(op));
            }
            Op::AllGather {
                all_gather_dim: *scatter_dimension,
                replica_groups: replica_groups.clone(),
                channel_id: *channel_id,
                use_global_device_ids: *use_global_device_ids,
            }
        }
        Op::AllToAll {
            split_dimension,
            concat_dimension,
            split_count,
            replica_groups,
            channel_id,
        } => Op::AllToAll {
            split_dimension: *concat_dimension,
            concat_dimension: *split_dimension,
            split_count: *split_count,
            replica_groups: replica_groups.clone(),
            channel_id: *channel_id,
        },
        Op::CollectivePermute {
            source_target_pairs,
            channel_id,
        } => Op::CollectivePermute {
            source_target_pairs: source_target_pairs.iter().map(|&(s, t)| (t, s)).collect(),
            channel_id: *channel_id,
        },
        Op::CollectiveBroadcast {
            has_dynamic_root: true,
            ..
        } => {
            return Err(Error::Unsupported(
                "`collective_broadcast` with a dynamic root: its VJP would reduce to a root \
                 chosen at run time, which kiln's `collective_reduce` does not have"
                    .into(),
            ));
        }
        Op::CollectiveBroadcast {
            replica_groups,
            channel_id,
            ..
        } => {
            if xt.iter().any(|t| t.dtype != xt[0].dtype) {
                return Err(Error::Unsupported(
                    "`collective_broadcast` of operands of several element types: its VJP \
                     sums them with one computation"
                        .into(),
                ));
            }
            Op::CollectiveReduce {
                replica_groups: replica_groups.clone(),
                channel_id: *channel_id,
                computation: sum_of(&xt[0])?,
            }
        }
        Op::CollectiveReduce {
            replica_groups,
            channel_id,
            computation,
        } => {
            if !is_sum(computation) {
                return Err(no_rule(op));
            }
            Op::CollectiveBroadcast {
                replica_groups: replica_groups.clone(),
                channel_id: *channel_id,
                has_dynamic_root: false,
            }
        }
        _ => {
            return Err(Error::Unsupported(format!(
                "`{}` has no rule",
                op.mnemonic()
            )));
        }
    };
    let outs = b.push_at(back, &gs, Some(&xt), None)?;
    Ok(outs.into_iter().map(Some).collect())
}

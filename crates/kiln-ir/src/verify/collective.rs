//! The type rules of the collective ops (`all_gather`, `all_reduce`, `all_to_all`,
//! `reduce_scatter`, `collective_permute`, `collective_broadcast`, `collective_reduce`) and of
//! `replica_id` and `partition_id`.
//!
//! What the grid decides (how many processes a group spans, whether an index is in range) is
//! not known here: the SPMD runner checks it when the op runs, citing the same labels.

use super::{Inferred, Labels, R, diag, in_range, list, region};
use crate::{DType, Func, Op, TensorType};

/// The label `n` of `replica_groups`: every group non-empty, every index non-negative and
/// listed once; with `same_size`, every group as long as the first.
fn groups_ok(l: &Labels, n: u32, groups: &[Vec<i64>], same_size: bool) -> R<()> {
    l.ensure(n, groups.iter().all(|g| !g.is_empty()), || {
        format!("replica_groups {groups:?} has an empty group")
    })?;
    let mut all: Vec<i64> = groups.iter().flatten().copied().collect();
    l.ensure(n, all.iter().all(|&i| i >= 0), || {
        format!("replica_groups {groups:?} has a negative index")
    })?;
    all.sort_unstable();
    l.ensure(n, all.windows(2).all(|w| w[0] != w[1]), || {
        format!("replica_groups {groups:?} lists an index twice")
    })?;
    if same_size && let Some(first) = groups.first() {
        l.ensure(n, groups.iter().all(|g| g.len() == first.len()), || {
            format!("the groups of replica_groups {groups:?} must have one size")
        })?;
    }
    Ok(())
}

/// The label `n`: `use_global_device_ids` only with a positive `channel_id`.
fn global_ids_ok(l: &Labels, n: u32, use_global: bool, channel_id: i64) -> R<()> {
    l.ensure(n, !use_global || channel_id > 0, || {
        format!("use_global_device_ids needs channel_id > 0, got channel_id = {channel_id}")
    })
}

/// The label `n` of a reduction's `computation`: `(E[], E[]) -> E[]` for the element type of
/// every operand.
fn computation_ok(l: &Labels, n: u32, computation: &Func, x: &[&TensorType]) -> R<()> {
    region(computation)?;
    let e = x[0].dtype;
    l.ensure(n, x.iter().all(|t| t.dtype == e), || {
        format!(
            "the operands must share the element type of computation @{}, got {}",
            computation.name,
            list(&x.iter().map(|t| (*t).clone()).collect::<Vec<_>>())
        )
    })?;
    let s = TensorType::scalar(e);
    let params = computation.param_types();
    l.ensure(n, params == [s.clone(), s.clone()], || {
        format!(
            "computation @{} takes ({}) but the operands need ({s}, {s})",
            computation.name,
            list(&params)
        )
    })?;
    l.ensure(n, computation.output_types == [s.clone()], || {
        format!(
            "computation @{} returns ({}) but must return {s}",
            computation.name,
            list(&computation.output_types)
        )
    })
}

fn same_types(x: &[&TensorType], label: u32) -> R<Inferred> {
    Ok(Inferred {
        types: x.iter().map(|t| (*t).clone()).collect(),
        label,
    })
}

/// The result type of `op` (a collective, `replica_id` or `partition_id`) on `x`.
pub(super) fn collective_rule(
    l: &Labels,
    op: &Op,
    x: &[&TensorType],
    declared: Option<&[TensorType]>,
) -> R<Inferred> {
    match op {
        Op::ReplicaId {} | Op::PartitionId {} => Ok(Inferred {
            types: vec![TensorType::scalar(DType::U32)],
            label: 1,
        }),
        Op::AllGather {
            all_gather_dim: d,
            replica_groups,
            channel_id,
            use_global_device_ids,
        } => {
            for t in x {
                l.ensure(1, in_range(*d, t.rank()), || {
                    format!("all_gather_dim {d} is out of range for {t}")
                })?;
            }
            groups_ok(l, 2, replica_groups, true)?;
            global_ids_ok(l, 3, *use_global_device_ids, *channel_id)?;
            let d = *d as usize;
            // The factor is the process group's size: with `channel_id > 0` and no global ids,
            // a replica group spans every partition, so only the declared type tells it.
            let factor = match declared {
                Some(ds) => {
                    let k = gathered_factor(&ds[0], x[0], d);
                    l.ensure(4, k.is_some(), || {
                        format!(
                            "{} is not {} with dimension {d} a multiple of its size",
                            ds[0], x[0]
                        )
                    })?;
                    k.unwrap_or(1)
                }
                None => replica_groups.first().map_or(1, Vec::len),
            };
            Ok(Inferred {
                types: x
                    .iter()
                    .map(|t| {
                        let mut shape = t.shape.clone();
                        shape[d] *= factor;
                        TensorType::new(t.dtype, shape)
                    })
                    .collect(),
                label: 4,
            })
        }
        Op::AllReduce {
            replica_groups,
            channel_id,
            use_global_device_ids,
            computation,
        } => {
            groups_ok(l, 1, replica_groups, false)?;
            global_ids_ok(l, 2, *use_global_device_ids, *channel_id)?;
            computation_ok(l, 3, computation, x)?;
            same_types(x, 4)
        }
        Op::AllToAll {
            split_dimension: sd,
            concat_dimension: cd,
            split_count: n,
            replica_groups,
            ..
        } => {
            l.ensure(4, *n > 0, || {
                format!("split_count must be positive, got {n}")
            })?;
            for t in x {
                l.ensure(1, in_range(*sd, t.rank()), || {
                    format!("split_dimension {sd} is out of range for {t}")
                })?;
                l.ensure(2, t.shape[*sd as usize].is_multiple_of(*n as usize), || {
                    format!("split_count {n} does not divide dimension {sd} of {t}")
                })?;
                l.ensure(3, in_range(*cd, t.rank()), || {
                    format!("concat_dimension {cd} is out of range for {t}")
                })?;
            }
            groups_ok(l, 5, replica_groups, true)?;
            l.ensure(
                6,
                replica_groups.iter().all(|g| g.len() as i64 == *n),
                || format!("every group of replica_groups {replica_groups:?} must have split_count = {n} processes"),
            )?;
            let (sd, cd, n) = (*sd as usize, *cd as usize, *n as usize);
            Ok(Inferred {
                types: x
                    .iter()
                    .map(|t| {
                        let mut shape = t.shape.clone();
                        shape[sd] /= n;
                        shape[cd] *= n;
                        TensorType::new(t.dtype, shape)
                    })
                    .collect(),
                label: 7,
            })
        }
        Op::ReduceScatter {
            scatter_dimension: d,
            replica_groups,
            channel_id,
            use_global_device_ids,
            computation,
        } => {
            let a = x[0];
            l.ensure(1, in_range(*d, a.rank()), || {
                format!("scatter_dimension {d} is out of range for {a}")
            })?;
            groups_ok(l, 2, replica_groups, true)?;
            global_ids_ok(l, 3, *use_global_device_ids, *channel_id)?;
            computation_ok(l, 4, computation, x)?;
            let d = *d as usize;
            let mut shape = a.shape.clone();
            match declared {
                Some(ds) => {
                    let ok = gathered_factor(a, &ds[0], d).is_some();
                    l.ensure(5, ok, || {
                        format!(
                            "{} is not {a} with dimension {d} divided by the group size",
                            ds[0]
                        )
                    })?;
                    shape[d] = ds[0].shape.get(d).copied().unwrap_or(0);
                }
                None => {
                    let k = replica_groups.first().map_or(1, Vec::len);
                    l.ensure(5, shape[d].is_multiple_of(k), || {
                        format!("the group size {k} does not divide dimension {d} of {a}")
                    })?;
                    shape[d] /= k;
                }
            }
            Ok(Inferred {
                types: vec![TensorType::new(a.dtype, shape)],
                label: 5,
            })
        }
        Op::CollectivePermute {
            source_target_pairs: pairs,
            ..
        } => {
            let unique = |f: fn(&(i64, i64)) -> i64| {
                let mut v: Vec<i64> = pairs.iter().map(f).collect();
                v.sort_unstable();
                v.windows(2).all(|w| w[0] != w[1])
            };
            l.ensure(1, unique(|p| p.0), || {
                format!("source_target_pairs {pairs:?} names a source twice")
            })?;
            l.ensure(2, unique(|p| p.1), || {
                format!("source_target_pairs {pairs:?} names a target twice")
            })?;
            l.ensure(3, pairs.iter().all(|&(a, b)| a >= 0 && b >= 0), || {
                format!("source_target_pairs {pairs:?} has a negative index")
            })?;
            same_types(x, 4)
        }
        Op::CollectiveBroadcast {
            replica_groups,
            has_dynamic_root,
            ..
        } => {
            groups_ok(l, 1, replica_groups, false)?;
            if !*has_dynamic_root {
                return same_types(x, 2);
            }
            let (data, root) = x.split_at(x.len() - 1);
            let want = TensorType::new(DType::I32, [data.len()]);
            l.ensure(3, !data.is_empty() && *root[0] == want, || {
                format!(
                    "with has_dynamic_root the last operand must be {want}, one root per other \
                     operand, got {}",
                    root[0]
                )
            })?;
            same_types(data, 2)
        }
        Op::CollectiveReduce {
            replica_groups,
            computation,
            ..
        } => {
            groups_ok(l, 1, replica_groups, false)?;
            computation_ok(l, 2, computation, x)?;
            same_types(x, 3)
        }
        _ => Err(diag(
            l.c(1),
            format!("`{}` is not a collective", op.mnemonic()),
        )),
    }
}

/// `k` when `big` is `small` with dimension `d` multiplied by `k >= 1`.
fn gathered_factor(big: &TensorType, small: &TensorType, d: usize) -> Option<usize> {
    if big.dtype != small.dtype || big.rank() != small.rank() || d >= big.rank() {
        return None;
    }
    let same_elsewhere = (0..big.rank()).all(|i| i == d || big.shape[i] == small.shape[i]);
    let (b, s) = (big.shape[d], small.shape[d]);
    if !same_elsewhere {
        return None;
    }
    if s == 0 {
        return (b == 0).then_some(1);
    }
    (b.is_multiple_of(s) && b >= s).then_some(b / s)
}

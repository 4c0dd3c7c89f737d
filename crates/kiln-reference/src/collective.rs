//! The collective ops and `replica_id` / `partition_id`, on the process this thread runs as
//! (see [`crate::spmd`]): the process groups of StableHLO's spec (`cross_replica`,
//! `cross_partition`, `cross_replica_and_partition`, `flattened_ids`), one exchange of the
//! operands within the group, and the op's result computed from the group's values in group
//! order, so every process of a group computes the same reduction in the same order.
//!
//! [`eval`] is what both the reference interpreter and the compiled backends' host steps run.

use crate::spmd::{self, Grid, Process};
use kiln_ir::{DType, Func, Literal, Op, TensorType};

/// How `replica_groups` (or `source_target_pairs`) name the processes of a group.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Replica indices; one group per replica group and partition.
    CrossReplica,
    /// Partition indices; one group per partition group and replica.
    CrossPartition,
    /// Replica indices; one group per replica group, spanning every partition.
    CrossReplicaAndPartition,
    /// Flat process indices.
    Flattened,
}

impl Mode {
    /// The mode of `all_gather`, `all_reduce` and `reduce_scatter`.
    fn of(channel_id: i64, use_global_device_ids: bool) -> Mode {
        match (channel_id > 0, use_global_device_ids) {
            (false, _) => Mode::CrossReplica,
            (true, false) => Mode::CrossReplicaAndPartition,
            (true, true) => Mode::Flattened,
        }
    }

    /// The mode of `all_to_all`, `collective_permute`, `collective_broadcast` and
    /// `collective_reduce`.
    fn by_channel(channel_id: i64) -> Mode {
        if channel_id > 0 {
            Mode::CrossPartition
        } else {
            Mode::CrossReplica
        }
    }

    /// How many indices the groups may name, and what they are.
    fn bound(self, grid: Grid) -> (usize, &'static str) {
        match self {
            Mode::CrossReplica | Mode::CrossReplicaAndPartition => (grid.replicas, "replica"),
            Mode::CrossPartition => (grid.partitions, "partition"),
            Mode::Flattened => (grid.processes(), "process"),
        }
    }
}

/// The process groups (flat indices, in group order) of `groups` in `mode`; no groups means
/// one group of every index.
fn process_groups(
    label: &str,
    mode: Mode,
    groups: &[Vec<i64>],
    grid: Grid,
) -> Result<Vec<Vec<usize>>, String> {
    let (n, what) = mode.bound(grid);
    let all: Vec<Vec<i64>>;
    let groups = if groups.is_empty() {
        all = vec![(0..n as i64).collect()];
        &all
    } else {
        groups
    };
    for &i in groups.iter().flatten() {
        if i < 0 || i as usize >= n {
            return Err(format!(
                "{label}: replica_groups {groups:?} names {what} {i}, but the grid of {grid} has {n}"
            ));
        }
    }
    let flat = |r: usize, p: usize| r * grid.partitions + p;
    let mut out = Vec::new();
    for g in groups {
        let g: Vec<usize> = g.iter().map(|&i| i as usize).collect();
        match mode {
            Mode::CrossReplica => {
                for p in 0..grid.partitions {
                    out.push(g.iter().map(|&r| flat(r, p)).collect());
                }
            }
            Mode::CrossPartition => {
                for r in 0..grid.replicas {
                    out.push(g.iter().map(|&p| flat(r, p)).collect());
                }
            }
            Mode::CrossReplicaAndPartition => out.push(
                (0..grid.partitions)
                    .flat_map(|p| g.iter().map(move |&r| flat(r, p)))
                    .collect(),
            ),
            Mode::Flattened => out.push(g),
        }
    }
    Ok(out)
}

/// This process's group of `groups`, and its position in it.
fn my_group(groups: Vec<Vec<usize>>, me: usize) -> Option<(Vec<usize>, usize)> {
    groups
        .into_iter()
        .find_map(|g| g.iter().position(|&i| i == me).map(|pos| (g, pos)))
}

/// The group every process must be in (the spec's groups cover the grid).
fn required_group(
    label: &str,
    mode: Mode,
    groups: &[Vec<i64>],
) -> Result<(Vec<usize>, usize), String> {
    let (me, grid) = Process::current();
    let gs = process_groups(label, mode, groups, grid)?;
    my_group(gs, me.flat(grid))
        .ok_or_else(|| format!("{label}: process {me} is in no group of replica_groups {groups:?}"))
}

fn exchange(what: &str, group: &[usize], data: &[&Literal]) -> Result<Vec<Vec<Literal>>, String> {
    let own: Vec<Literal> = data.iter().map(|l| (*l).clone()).collect();
    spmd::exchange(what, group, own).map_err(|e| format!("{what}: {e}"))
}

/// `parts` joined along `d` into `ty`.
fn concat(parts: &[&Literal], d: usize, ty: &TensorType) -> Literal {
    crate::eval_op(
        &Op::Concatenate {
            dimension: d as i64,
        },
        parts,
        std::slice::from_ref(ty),
    )
    .remove(0)
}

/// Part `j` of `k` equal parts of `x` along `d`.
fn part(x: &Literal, d: usize, k: usize, j: usize) -> Literal {
    let shape = x.shape().to_vec();
    let size = shape[d] / k;
    let mut start = vec![0i64; shape.len()];
    let mut limit: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
    start[d] = (j * size) as i64;
    limit[d] = ((j + 1) * size) as i64;
    let mut out = shape.clone();
    out[d] = size;
    crate::eval_op(
        &Op::Slice {
            start_indices: start,
            limit_indices: limit,
            strides: vec![1; shape.len()],
        },
        &[x],
        &[TensorType::new(x.dtype(), out)],
    )
    .remove(0)
}

/// The values of operand `o` of every process, folded with `computation` in group order.
fn reduce(values: &[Vec<Literal>], o: usize, computation: &Func) -> Literal {
    let mut acc = values[0][o].clone();
    for v in &values[1..] {
        let ty = acc.ty().clone();
        acc = crate::reduce_region::map(&[&acc, &v[o]], computation, &ty);
    }
    acc
}

fn zeros(types: &[TensorType]) -> Vec<Literal> {
    types.iter().map(|t| Literal::zeros(t.clone())).collect()
}

fn id(i: usize) -> Literal {
    Literal::from_i64s(TensorType::scalar(DType::U32), &[i as i64])
        .expect("a scalar ui32 holds a grid index")
}

/// Whether `op` is a collective or reads the process (`replica_id`, `partition_id`).
pub fn is_collective(op: &Op) -> bool {
    matches!(
        op,
        Op::ReplicaId {}
            | Op::PartitionId {}
            | Op::AllGather { .. }
            | Op::AllReduce { .. }
            | Op::AllToAll { .. }
            | Op::ReduceScatter { .. }
            | Op::CollectivePermute { .. }
            | Op::CollectiveBroadcast { .. }
            | Op::CollectiveReduce { .. }
    )
}

/// Runs the collective `op` (see [`is_collective`]) on this thread's process with operands
/// `x` and result types `types`. The error names the op's constraint label, or the process
/// that failed or did not join.
pub fn eval(op: &Op, x: &[&Literal], types: &[TensorType]) -> Result<Vec<Literal>, String> {
    let (me, grid) = Process::current();
    let what = op.mnemonic();
    let label = |n: u32| format!("{what}_c{n}");
    match op {
        Op::ReplicaId {} => Ok(vec![id(me.replica)]),
        Op::PartitionId {} => Ok(vec![id(me.partition)]),
        Op::AllGather {
            all_gather_dim,
            replica_groups,
            channel_id,
            use_global_device_ids,
        } => {
            let mode = Mode::of(*channel_id, *use_global_device_ids);
            let (group, _) = required_group(&label(2), mode, replica_groups)?;
            let d = *all_gather_dim as usize;
            for (t, a) in types.iter().zip(x) {
                if t.shape[d] != a.shape()[d] * group.len() {
                    return Err(format!(
                        "{}: the result {t} must be the operand {} with dimension {d} times the \
                         {} processes of the group",
                        label(4),
                        a.ty(),
                        group.len()
                    ));
                }
            }
            let values = exchange(what, &group, x)?;
            Ok((0..x.len())
                .map(|o| {
                    let parts: Vec<&Literal> = values.iter().map(|v| &v[o]).collect();
                    concat(&parts, d, &types[o])
                })
                .collect())
        }
        Op::AllReduce {
            replica_groups,
            channel_id,
            use_global_device_ids,
            computation,
        } => {
            let mode = Mode::of(*channel_id, *use_global_device_ids);
            let (group, _) = required_group(&label(1), mode, replica_groups)?;
            let values = exchange(what, &group, x)?;
            Ok((0..x.len())
                .map(|o| reduce(&values, o, computation))
                .collect())
        }
        Op::AllToAll {
            split_dimension,
            concat_dimension,
            split_count,
            replica_groups,
            channel_id,
        } => {
            let mode = Mode::by_channel(*channel_id);
            let (group, pos) = required_group(&label(5), mode, replica_groups)?;
            let k = *split_count as usize;
            if group.len() != k {
                return Err(format!(
                    "{}: the group has {} processes, split_count is {k}",
                    label(6),
                    group.len()
                ));
            }
            let values = exchange(what, &group, x)?;
            let (sd, cd) = (*split_dimension as usize, *concat_dimension as usize);
            Ok((0..x.len())
                .map(|o| {
                    let parts: Vec<Literal> =
                        values.iter().map(|v| part(&v[o], sd, k, pos)).collect();
                    let refs: Vec<&Literal> = parts.iter().collect();
                    concat(&refs, cd, &types[o])
                })
                .collect())
        }
        Op::ReduceScatter {
            scatter_dimension,
            replica_groups,
            channel_id,
            use_global_device_ids,
            computation,
        } => {
            let mode = Mode::of(*channel_id, *use_global_device_ids);
            let (group, pos) = required_group(&label(2), mode, replica_groups)?;
            let d = *scatter_dimension as usize;
            let k = group.len();
            if types[0].shape[d] * k != x[0].shape()[d] {
                return Err(format!(
                    "{}: the result {} must be the operand {} with dimension {d} divided by the \
                     {k} processes of the group",
                    label(5),
                    types[0],
                    x[0].ty()
                ));
            }
            let values = exchange(what, &group, x)?;
            let reduced = reduce(&values, 0, computation);
            Ok(vec![part(&reduced, d, k, pos)])
        }
        Op::CollectivePermute {
            source_target_pairs,
            channel_id,
        } => {
            let mode = Mode::by_channel(*channel_id);
            let (n, name) = mode.bound(grid);
            if let Some(&(s, t)) = source_target_pairs
                .iter()
                .find(|&&(s, t)| s as usize >= n || t as usize >= n)
            {
                return Err(format!(
                    "{}: source_target_pairs names [{s}, {t}], but the grid of {grid} has {n} {name}(s)",
                    label(3)
                ));
            }
            // Every process exchanges with the processes it could receive from or send to:
            // the others of its partition (replica indices) or of its replica.
            let (group, mine): (Vec<usize>, usize) = match mode {
                Mode::CrossPartition => (
                    (0..grid.partitions)
                        .map(|p| me.replica * grid.partitions + p)
                        .collect(),
                    me.partition,
                ),
                _ => (
                    (0..grid.replicas)
                        .map(|r| r * grid.partitions + me.partition)
                        .collect(),
                    me.replica,
                ),
            };
            let values = exchange(what, &group, x)?;
            Ok(
                match source_target_pairs.iter().find(|p| p.1 as usize == mine) {
                    Some(&(s, _)) => vec![values[s as usize][0].clone()],
                    None => zeros(types),
                },
            )
        }
        Op::CollectiveBroadcast {
            replica_groups,
            channel_id,
            has_dynamic_root,
        } => {
            let mode = Mode::by_channel(*channel_id);
            let gs = process_groups(&label(1), mode, replica_groups, grid)?;
            match my_group(gs, me.flat(grid)) {
                Some((group, _)) if *has_dynamic_root => {
                    // Result j comes from the group's process at position root[j].
                    let (data, root) = x.split_at(x.len() - 1);
                    let roots = root[0].to_i64s();
                    if let Some(&r) = roots.iter().find(|&&r| r < 0 || r as usize >= group.len()) {
                        return Err(format!(
                            "{}: root {r} is outside the group of {} processes",
                            label(3),
                            group.len()
                        ));
                    }
                    let values = exchange(what, &group, data)?;
                    Ok(roots
                        .iter()
                        .enumerate()
                        .map(|(j, &r)| values[r as usize][j].clone())
                        .collect())
                }
                Some((group, _)) => Ok(exchange(what, &group, x)?.swap_remove(0)),
                None => {
                    spmd::skip();
                    Ok(zeros(types))
                }
            }
        }
        Op::CollectiveReduce {
            replica_groups,
            channel_id,
            computation,
        } => {
            let mode = Mode::by_channel(*channel_id);
            let gs = process_groups(&label(1), mode, replica_groups, grid)?;
            match my_group(gs, me.flat(grid)) {
                Some((group, pos)) => {
                    let values = exchange(what, &group, x)?;
                    if pos == 0 {
                        Ok((0..x.len())
                            .map(|o| reduce(&values, o, computation))
                            .collect())
                    } else {
                        Ok(zeros(types))
                    }
                }
                None => {
                    spmd::skip();
                    Ok(zeros(types))
                }
            }
        }
        _ => Err(format!("`{what}` is not a collective")),
    }
}

//! The collective ops (`all_gather`, `all_reduce`, `all_to_all`, `reduce_scatter`,
//! `collective_permute`, `collective_broadcast`, `collective_reduce`) and `replica_id` /
//! `partition_id`: their attributes read from either form. `replica_groups` is a 2-D
//! `dense<...>` whose `-1` entries pad short groups; `channel_handle`'s `handle` is kiln's
//! `channel_id` (0 without one); a unit attribute (`use_global_device_ids`) is true.

use crate::ast::{AttrVal, Elem, OpAst};
use crate::error::{Error, Result};
use crate::import::{Body, push, result_types};
use kiln_ir::{Func, Op, ValueId};

/// A flag written as a unit attribute or as `true` / `false` (absent: false).
fn unit_flag(op: &OpAst, name: &str) -> Result<bool> {
    match op.attr(name) {
        None => Ok(false),
        Some((AttrVal::Unit, _)) => Ok(true),
        Some((AttrVal::Bool(b), _)) => Ok(*b),
        Some((_, p)) => Err(Error::invalid(
            p,
            format!(
                "`{name}` of `{}` must be a unit attribute or a boolean",
                op.name
            ),
        )),
    }
}

/// The rows of a 2-D integer `dense<...>` attribute (`[n, m]` from its type or nesting).
fn rows(op: &OpAst, name: &str) -> Result<Option<Vec<Vec<i64>>>> {
    let Some((v, p)) = op.attr(name) else {
        return Ok(None);
    };
    let bad = || {
        Error::invalid(
            p,
            format!(
                "`{name}` of `{}` must be a 2-D integer `dense<...>`",
                op.name
            ),
        )
    };
    let AttrVal::Dense(d, ty) = v else {
        return Err(bad());
    };
    let ints: Vec<i64> = d
        .elems
        .iter()
        .map(|e| match e {
            Elem::Int(i) => i64::try_from(*i).map_err(|_| bad()),
            _ => Err(bad()),
        })
        .collect::<Result<_>>()?;
    let (n, m) = match (ty, &d.shape) {
        (Some(t), _) if t.rank() == 2 => (t.shape[0], t.shape[1]),
        (_, Some(s)) if s.len() == 2 => (s[0], s[1]),
        _ => return Err(bad()),
    };
    let all: Vec<i64> = match ints.len() {
        k if k == n * m => ints,
        1 => vec![ints[0]; n * m],
        _ if n * m == 0 => Vec::new(),
        _ => return Err(bad()),
    };
    Ok(Some(if m == 0 {
        Vec::new()
    } else {
        all.chunks(m).map(|r| r.to_vec()).collect()
    }))
}

/// `replica_groups`, each group without its `-1` padding.
fn replica_groups(op: &OpAst) -> Result<Vec<Vec<i64>>> {
    let groups = rows(op, "replica_groups")?.ok_or_else(|| {
        Error::invalid(
            op.pos,
            format!("`{}` needs the attribute `replica_groups`", op.name),
        )
    })?;
    Ok(groups
        .into_iter()
        .map(|g| g.into_iter().filter(|&i| i != -1).collect::<Vec<_>>())
        .filter(|g| !g.is_empty())
        .collect())
}

/// The `handle` of `channel_handle` (or a plain `channel_id`), 0 when absent.
pub(crate) fn channel_id(op: &OpAst) -> Result<i64> {
    match op.attr("channel_handle").or_else(|| op.attr("channel_id")) {
        None => Ok(0),
        Some((AttrVal::Int(i), _)) => Ok(*i),
        Some((AttrVal::Struct(_, fields), p)) => match fields.iter().find(|(k, _)| k == "handle") {
            Some((_, AttrVal::Int(i))) => Ok(*i),
            _ => Err(Error::invalid(
                p,
                "`channel_handle` needs an integer `handle`",
            )),
        },
        Some((_, p)) => Err(Error::invalid(
            p,
            format!("bad `channel_handle` of `{}`", op.name),
        )),
    }
}

fn need_int(op: &OpAst, name: &str) -> Result<i64> {
    crate::ops::int_attr(op, &[name])?.ok_or_else(|| {
        Error::invalid(
            op.pos,
            format!("`{}` needs the attribute `{name}`", op.name),
        )
    })
}

/// A dynamic root (`has_dynamic_root`), which kiln's `collective_reduce` does not have.
fn no_dynamic_root(op: &OpAst) -> Result<()> {
    if unit_flag(op, "has_dynamic_root")? {
        let p = op.attr("has_dynamic_root").map_or(op.pos, |(_, p)| p);
        return Err(Error::unsupported(
            p,
            format!(
                "`has_dynamic_root` of `{}` (a root chosen at run time)",
                op.name
            ),
        ));
    }
    Ok(())
}

/// Whether `name` is a collective op without a region (imported by [`lower`]).
pub fn handles(name: &str) -> bool {
    matches!(
        name,
        "stablehlo.all_gather"
            | "stablehlo.all_to_all"
            | "stablehlo.collective_permute"
            | "stablehlo.collective_broadcast"
            | "stablehlo.replica_id"
            | "stablehlo.partition_id"
    )
}

/// Imports a collective op without a region ([`handles`]).
pub fn lower(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let kop = match op.name.as_str() {
        "stablehlo.replica_id" => Op::ReplicaId {},
        "stablehlo.partition_id" => Op::PartitionId {},
        "stablehlo.all_gather" => Op::AllGather {
            all_gather_dim: need_int(op, "all_gather_dim")?,
            replica_groups: replica_groups(op)?,
            channel_id: channel_id(op)?,
            use_global_device_ids: unit_flag(op, "use_global_device_ids")?,
        },
        "stablehlo.all_to_all" => Op::AllToAll {
            split_dimension: need_int(op, "split_dimension")?,
            concat_dimension: need_int(op, "concat_dimension")?,
            split_count: need_int(op, "split_count")?,
            replica_groups: replica_groups(op)?,
            channel_id: channel_id(op)?,
        },
        "stablehlo.collective_permute" => Op::CollectivePermute {
            source_target_pairs: rows(op, "source_target_pairs")?
                .ok_or_else(|| {
                    Error::invalid(
                        op.pos,
                        "`stablehlo.collective_permute` needs `source_target_pairs`",
                    )
                })?
                .into_iter()
                .map(|r| match r[..] {
                    [s, t] => Ok((s, t)),
                    _ => Err(Error::invalid(
                        op.pos,
                        "`source_target_pairs` must be [source, target] pairs",
                    )),
                })
                .collect::<Result<_>>()?,
            channel_id: channel_id(op)?,
        },
        "stablehlo.collective_broadcast" => Op::CollectiveBroadcast {
            replica_groups: replica_groups(op)?,
            channel_id: channel_id(op)?,
            has_dynamic_root: unit_flag(op, "has_dynamic_root")?,
        },
        n => {
            return Err(Error::unsupported(
                op.pos,
                format!("the op `{n}` (kiln has no such op)"),
            ));
        }
    };
    let declared = result_types(op);
    push(body, op, kop, args, declared.as_deref())
}

/// Whether `name` is a collective op with a reduction region (imported by [`with_region`]).
pub fn has_region(name: &str) -> bool {
    matches!(
        name,
        "stablehlo.all_reduce" | "stablehlo.reduce_scatter" | "stablehlo.collective_reduce"
    )
}

/// Imports a collective op with a reduction region ([`has_region`]), `computation` being the
/// region as a function.
pub fn with_region(
    body: &mut Body,
    op: &OpAst,
    args: &[ValueId],
    computation: Func,
) -> Result<Vec<ValueId>> {
    let computation = Box::new(computation);
    let kop = match op.name.as_str() {
        "stablehlo.all_reduce" => Op::AllReduce {
            replica_groups: replica_groups(op)?,
            channel_id: channel_id(op)?,
            use_global_device_ids: unit_flag(op, "use_global_device_ids")?,
            computation,
        },
        "stablehlo.reduce_scatter" => Op::ReduceScatter {
            scatter_dimension: need_int(op, "scatter_dimension")?,
            replica_groups: replica_groups(op)?,
            channel_id: channel_id(op)?,
            use_global_device_ids: unit_flag(op, "use_global_device_ids")?,
            computation,
        },
        _ => {
            no_dynamic_root(op)?;
            Op::CollectiveReduce {
                replica_groups: replica_groups(op)?,
                channel_id: channel_id(op)?,
                computation,
            }
        }
    };
    let declared = result_types(op);
    push(body, op, kop, args, declared.as_deref())
}

/// A 2-D `dense<...>` of `rows` (each padded with `-1` to the longest, at least `width`).
pub fn dense_rows(rows: &[Vec<i64>], width: usize) -> String {
    let m = rows.iter().map(Vec::len).max().unwrap_or(0).max(width);
    let body: Vec<String> = rows
        .iter()
        .map(|r| {
            let cells: Vec<String> = (0..m)
                .map(|i| r.get(i).copied().unwrap_or(-1).to_string())
                .collect();
            format!("[{}]", cells.join(", "))
        })
        .collect();
    format!(
        "dense<[{}]> : tensor<{}x{m}xi64>",
        body.join(", "),
        rows.len()
    )
}

/// The generic attributes of a collective's groups: `replica_groups`, then
/// `channel_handle` when `channel_id` is not 0 and `use_global_device_ids` when set.
pub fn export_attrs(
    groups: &[Vec<i64>],
    channel_id: i64,
    use_global_device_ids: bool,
) -> Vec<String> {
    let mut out = vec![format!("replica_groups = {}", dense_rows(groups, 0))];
    if channel_id != 0 {
        out.push(format!(
            "channel_handle = #stablehlo.channel_handle<handle = {channel_id}, type = 0>"
        ));
    }
    if use_global_device_ids {
        out.push("use_global_device_ids".into());
    }
    out
}

//! Rewrites of kernel bodies: inputs renumbered, loop variables renamed, reads of an input
//! moved to other coefficients.

use crate::access::{affine_read, reads_input};
use crate::ir::{Cond, Expr, Idx};
use kiln_ir::DType;

/// How [`rebuild`] changes an expression: the leaves that name inputs and loop variables, and
/// the reductions it leaves alone.
struct Rewrite<'a> {
    /// A load's or gather's input.
    input: &'a dyn Fn(usize) -> usize,
    /// A load's coefficients.
    coef: &'a dyn Fn(&[i64]) -> Vec<i64>,
    /// A loop variable (in `Iota` and index expressions).
    var: &'a dyn Fn(usize) -> usize,
    /// Reductions kept as they are, children included.
    keep: &'a dyn Fn(&Expr) -> bool,
}

/// `e` with its inputs, load coefficients and loop variables rewritten by `r`.
fn rebuild(e: &Expr, r: &Rewrite<'_>) -> Expr {
    let idx = |i: &Idx| rebuild_idx(i, r);
    let sub = |x: &Expr| Box::new(rebuild(x, r));
    match e {
        Expr::Load {
            input,
            dtype,
            coef,
            off,
        } => Expr::Load {
            input: (r.input)(*input),
            dtype: *dtype,
            coef: (r.coef)(coef),
            off: *off,
        },
        Expr::Gather {
            input,
            dtype,
            index,
            strides,
        } => Expr::Gather {
            input: (r.input)(*input),
            dtype: *dtype,
            index: index.iter().map(idx).collect(),
            strides: strides.clone(),
        },
        Expr::Iota { var, dtype } => Expr::Iota {
            var: (r.var)(*var),
            dtype: *dtype,
        },
        Expr::Const { .. } => e.clone(),
        Expr::Index { idx: i, dtype } => Expr::Index {
            idx: idx(i),
            dtype: *dtype,
        },
        Expr::Op { op, dtype, args } => Expr::Op {
            op: op.clone(),
            dtype: *dtype,
            args: args.iter().map(|a| rebuild(a, r)).collect(),
        },
        Expr::Reduce { .. } if (r.keep)(e) => e.clone(),
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } => Expr::Reduce {
            kind: *kind,
            dtype: *dtype,
            init: sub(init),
            vars: vars.clone(),
            body: sub(body),
        },
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => Expr::Guard {
            conds: conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(i, lo, hi) => Cond::InRange(idx(i), *lo, *hi),
                    Cond::Divisible(i, m) => Cond::Divisible(idx(i), *m),
                })
                .collect(),
            then: sub(then),
            otherwise: sub(otherwise),
        },
    }
}

fn rebuild_idx(i: &Idx, r: &Rewrite<'_>) -> Idx {
    let sub = |x: &Idx| Box::new(rebuild_idx(x, r));
    match i {
        Idx::Var(v) => Idx::Var((r.var)(*v)),
        Idx::Const(_) => i.clone(),
        Idx::Add(xs) => Idx::Add(xs.iter().map(|x| rebuild_idx(x, r)).collect()),
        Idx::Mul(x, c) => Idx::Mul(sub(x), *c),
        Idx::Div(x, c) => Idx::Div(sub(x), *c),
        Idx::Clamp(x, lo, hi) => Idx::Clamp(sub(x), *lo, *hi),
        Idx::Value(e) => Idx::Value(Box::new(rebuild(e, r))),
    }
}

/// `e` with every input index `i` replaced by `map(i)`.
pub fn map_inputs(e: &Expr, map: &dyn Fn(usize) -> usize) -> Expr {
    rebuild(
        e,
        &Rewrite {
            input: map,
            coef: &|c| c.to_vec(),
            var: &|v| v,
            keep: &|_| false,
        },
    )
}

/// `e` with every read of input `j` at coefficients `from` (no offset; a load, or a gather at
/// that affine index) a load at coefficients `to` instead; `None` when `e` reads `j` any other
/// way (elsewhere, or in an index expression or a condition). Variable `v` runs over
/// `0..extents[v]`; the coefficients of those that run over one value do not matter.
pub fn reindex_input(
    e: &Expr,
    j: usize,
    (from, to): (&[i64], &[i64]),
    extents: &[usize],
) -> Option<Expr> {
    let matches = |coef: &[i64]| {
        let at = |c: &[i64], v: usize| c.get(v).copied().unwrap_or(0);
        (0..coef.len().max(from.len()))
            .all(|v| at(coef, v) == at(from, v) || extents.get(v) == Some(&1))
    };
    if !reads_input(e, j) {
        return Some(e.clone());
    }
    let sub = |x: &Expr| reindex_input(x, j, (from, to), extents).map(Box::new);
    match e {
        Expr::Load { dtype, .. } | Expr::Gather { dtype, .. } => {
            let (coef, off) = affine_read(e, j)?;
            (off == 0 && matches(&coef)).then(|| Expr::Load {
                input: j,
                dtype: *dtype,
                coef: to.to_vec(),
                off: 0,
            })
        }
        Expr::Op { op, dtype, args } => Some(Expr::Op {
            op: op.clone(),
            dtype: *dtype,
            args: args
                .iter()
                .map(|a| reindex_input(a, j, (from, to), extents))
                .collect::<Option<_>>()?,
        }),
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } => Some(Expr::Reduce {
            kind: *kind,
            dtype: *dtype,
            init: sub(init)?,
            vars: vars.clone(),
            body: sub(body)?,
        }),
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            let bare = Expr::Guard {
                conds: conds.clone(),
                then: Box::new(Expr::Const {
                    dtype: DType::F32,
                    value: 0.0,
                }),
                otherwise: Box::new(Expr::Const {
                    dtype: DType::F32,
                    value: 0.0,
                }),
            };
            if reads_input(&bare, j) {
                return None;
            }
            Some(Expr::Guard {
                conds: conds.clone(),
                then: sub(then)?,
                otherwise: sub(otherwise)?,
            })
        }
        _ => None,
    }
}

/// `e` with the free loop variable `from` replaced by `to`, which `e` must not use (loads'
/// coefficients move from one variable to the other; reductions binding `from` are kept).
pub fn rename_var(e: &Expr, from: usize, to: usize) -> Expr {
    rebuild(
        e,
        &Rewrite {
            input: &|i| i,
            coef: &|coef| {
                let mut coef = coef.to_vec();
                if let Some(c) = coef.get_mut(from).map(std::mem::take) {
                    if coef.len() <= to {
                        coef.resize(to + 1, 0);
                    }
                    coef[to] += c;
                }
                coef
            },
            var: &|v| if v == from { to } else { v },
            keep: &|x| matches!(x, Expr::Reduce { vars, .. } if vars.iter().any(|v| v.0 == from)),
        },
    )
}

//! How kernel bodies read their inputs: the loop variables an expression uses, affine reads
//! and their coefficients, reads at the kernel's own position or row, contiguity along a loop.

use crate::ir::{Expr, Idx, Visitor, visit};
use kiln_ir::{TensorType, strides};
use std::collections::BTreeSet;

/// The loop variables `e` reads, without those bound by its own reductions.
pub fn free_vars(e: &Expr) -> BTreeSet<usize> {
    /// The variables read outside reductions binding them (`bound`: those of the reductions
    /// around the node visited).
    struct Free {
        bound: Vec<usize>,
        out: BTreeSet<usize>,
    }
    impl Free {
        fn read(&mut self, v: usize) {
            if !self.bound.contains(&v) {
                self.out.insert(v);
            }
        }
    }
    impl Visitor<'_> for Free {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { coef, .. } => {
                    for (v, _) in coef.iter().enumerate().filter(|c| *c.1 != 0) {
                        self.read(v);
                    }
                }
                Expr::Iota { var, .. } => self.read(*var),
                Expr::Reduce {
                    init, vars, body, ..
                } => {
                    self.expr(init);
                    let mark = self.bound.len();
                    self.bound.extend(vars.iter().map(|v| v.0));
                    self.expr(body);
                    self.bound.truncate(mark);
                }
                Expr::Fold { fold, .. } => {
                    fold.inits.iter().for_each(|x| self.expr(x));
                    let mark = self.bound.len();
                    self.bound.extend(fold.vars.iter().map(|v| v.0));
                    fold.elems.iter().for_each(|x| self.expr(x));
                    self.bound.truncate(mark);
                }
                _ => e.for_each_child(self),
            }
        }

        fn idx(&mut self, i: &Idx) {
            match i {
                Idx::Var(v) => self.read(*v),
                _ => i.for_each_child(self),
            }
        }
    }
    let mut free = Free {
        bound: Vec::new(),
        out: BTreeSet::new(),
    };
    free.expr(e);
    free.out
}

/// Whether `e` may be computed where a guard around it does not hold, as cheaply and as safely
/// as where it does: it reads its inputs only at indices clamped into them (gathers whose every
/// index is a constant or a clamp) or at a fixed element (a load that reads no loop variable),
/// computes nothing that traps (an integer division or remainder) or is costly
/// ([`crate::loop_schedule::costly`]), and holds no reduction. Such a guard's two sides may
/// both be computed and one selected (a window's element in its padding: the init), which
/// keeps a loop over positions free of branches (and vectorizable).
pub fn speculatable(e: &Expr) -> bool {
    use crate::ir::Ew;
    use kiln_ir::OpKind;
    // (The expressions inside indices are visited too.)
    let clamped = |i: &Idx| matches!(i, Idx::Const(_) | Idx::Clamp(..));
    let mut ok = true;
    visit(e, &mut |x| match x {
        Expr::Gather { index, .. } => ok &= index.iter().all(clamped),
        Expr::Load { coef, .. } => ok &= coef.iter().all(|&c| c == 0),
        Expr::Op { op, dtype, .. } => {
            let traps =
                matches!(op, Ew::Kind(OpKind::Divide | OpKind::Remainder)) && !dtype.is_float();
            ok &= !traps && !crate::loop_schedule::costly_op(op);
        }
        Expr::Reduce { .. } | Expr::Fold { .. } => ok = false,
        _ => {}
    });
    ok
}

/// The flat affine index `(coef, off)` at which `e` reads input `j` when `e` is a load of it or
/// a gather of it at an affine index with strides; `None` for anything else.
pub(crate) fn affine_read(e: &Expr, j: usize) -> Option<(Vec<i64>, i64)> {
    match e {
        Expr::Load {
            input, coef, off, ..
        } if *input == j => Some((coef.clone(), *off)),
        Expr::Gather {
            input,
            index,
            strides: gs,
            ..
        } if *input == j => {
            let mut coef: Vec<i64> = Vec::new();
            let mut off = 0;
            for (i, &s) in index.iter().zip(gs) {
                let (terms, c) = affine(i)?;
                off += c * s;
                for (v, a) in terms {
                    if coef.len() <= v {
                        coef.resize(v + 1, 0);
                    }
                    coef[v] += a * s;
                }
            }
            Some((coef, off))
        }
        _ => None,
    }
}

/// The coefficients (per loop variable) of every read of an input at an affine index in `e`,
/// outside reductions: loads, and gathers whose index is affine.
pub fn affine_reads(e: &Expr) -> Vec<Vec<i64>> {
    struct Reads(Vec<Vec<i64>>);
    impl Visitor<'_> for Reads {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { input, .. } | Expr::Gather { input, .. } => {
                    if let Some((coef, _)) = affine_read(e, *input) {
                        self.0.push(coef);
                    }
                }
                Expr::Op { .. } => e.for_each_child(self),
                // The branches, not the conditions.
                Expr::Guard {
                    then, otherwise, ..
                } => {
                    self.expr(then);
                    self.expr(otherwise);
                }
                _ => {}
            }
        }
    }
    let mut reads = Reads(Vec::new());
    reads.expr(e);
    reads.0
}

/// Whether `e` reads input `j` (of `out`'s type, a `[rows, row]` matrix whose rows are the
/// dimensions before `split`) only at the position it writes, or inside reductions over the row
/// it writes: a reduction that depends on no variable from `split` on, whose every read of `j`
/// is at the written row (the row variables at their own strides, no offset) plus a
/// non-negative combination of the reduction's own variables staying below the row's length.
/// Such a body (a softmax, a layer norm) can run over a block of whole rows in place: each
/// row's reductions first, then its elements, each read just before it is overwritten.
pub fn reads_own_position_or_row(e: &Expr, j: usize, out: &TensorType, split: usize) -> bool {
    fn in_row(
        e: &Expr,
        j: usize,
        out: &TensorType,
        split: usize,
        extents: &mut Vec<(usize, usize)>,
    ) -> bool {
        let rank = out.rank();
        let st = strides(&out.shape);
        let row_len: i64 = out.shape[split..].iter().product::<usize>() as i64;
        if let Some((coef, off)) = affine_read(e, j) {
            let mut span = 0i64;
            for (v, &c) in coef.iter().enumerate() {
                if v < split {
                    if out.shape[v] != 1 && c != st[v] as i64 {
                        return false;
                    }
                } else if v < rank {
                    if c != 0 {
                        return false;
                    }
                } else if c != 0 {
                    let Some(&(_, ext)) = extents.iter().find(|x| x.0 == v) else {
                        return false;
                    };
                    if c < 0 {
                        return false;
                    }
                    span += c * (ext as i64 - 1);
                }
            }
            return off == 0 && span < row_len;
        }
        match e {
            Expr::Load { .. }
            | Expr::Iota { .. }
            | Expr::Const { .. }
            | Expr::Index { .. }
            | Expr::Gather { .. } => !reads_input(e, j),
            Expr::Op { args, .. } => args.iter().all(|a| in_row(a, j, out, split, extents)),
            Expr::Reduce {
                init, vars, body, ..
            } => {
                let mark = extents.len();
                extents.extend(vars.iter().copied());
                let ok =
                    in_row(init, j, out, split, extents) && in_row(body, j, out, split, extents);
                extents.truncate(mark);
                ok
            }
            // Conditions may hold run-time indices: only a guard not reading `j` at all.
            Expr::Guard { .. } | Expr::Fold { .. } | Expr::Arg { .. } => !reads_input(e, j),
        }
    }
    match e {
        Expr::Reduce { .. } if reads_input(e, j) => {
            free_vars(e).iter().all(|&v| v < split) && in_row(e, j, out, split, &mut Vec::new())
        }
        Expr::Op { args, .. } => args
            .iter()
            .all(|a| reads_own_position_or_row(a, j, out, split)),
        _ => reads_only_own_position(e, j, out),
    }
}

/// Whether every read of input `j` in `e` is a load of the element at the kernel's own output
/// position (`strides` are the output's row-major strides), outside reductions and guards: the
/// reads an in-place epilogue may make (`out` is the kernel's output type).
pub fn reads_only_own_position(e: &Expr, j: usize, out: &TensorType) -> bool {
    let st = strides(&out.shape);
    match e {
        Expr::Load {
            input, coef, off, ..
        } if *input == j => {
            *off == 0
                && coef
                    .iter()
                    .enumerate()
                    .all(|(v, &c)| match out.shape.get(v) {
                        Some(1) => true,
                        Some(_) => c == st[v] as i64,
                        None => c == 0,
                    })
        }
        // Fusion turns a producer's loads into gathers at the consumer's index; an affine one
        // may still be the own position.
        Expr::Gather { input, .. } if *input == j => match affine_read(e, j) {
            Some((coef, off)) => {
                let own = Expr::Load {
                    input: j,
                    dtype: out.dtype,
                    coef,
                    off,
                };
                reads_only_own_position(&own, j, out)
            }
            None => false,
        },
        Expr::Load { .. } | Expr::Iota { .. } | Expr::Const { .. } => true,
        Expr::Op { args, .. } => args.iter().all(|a| reads_only_own_position(a, j, out)),
        _ => !reads_input(e, j),
    }
}

/// Whether every buffer read in `e` moves by 0 or 1 element when loop variable `var` grows
/// by one, at least one by 1 (the reads are contiguous along `var`), and `e` has no reduction
/// or guard inside.
pub fn contiguous_along(e: &Expr, var: usize) -> bool {
    let mut ok = true;
    let mut unit = false;
    visit(e, &mut |x| match x {
        Expr::Load { coef, .. } => match coef.get(var).copied().unwrap_or(0) {
            0 => {}
            1 => unit = true,
            _ => ok = false,
        },
        Expr::Gather { index, strides, .. } => {
            let mut step = 0i64;
            for (i, s) in index.iter().zip(strides) {
                match affine(i) {
                    Some((terms, _)) => {
                        step += s * terms
                            .iter()
                            .filter(|t| t.0 == var)
                            .map(|t| t.1)
                            .sum::<i64>();
                    }
                    None => ok = false,
                }
            }
            match step {
                0 => {}
                1 => unit = true,
                _ => ok = false,
            }
        }
        Expr::Reduce { .. } | Expr::Guard { .. } | Expr::Fold { .. } => ok = false,
        _ => {}
    });
    ok && unit
}

/// Whether an index expression is a constant (uses no loop variable).
pub fn is_constant(i: &Idx) -> bool {
    affine(i).is_some_and(|(terms, _)| terms.iter().all(|&(_, c)| c == 0))
}

/// `(v, c)` when `i` is `v + c` for one loop variable `v` (terms of one variable merged).
pub fn var_plus_const(i: &Idx) -> Option<(usize, i64)> {
    let (terms, c) = affine(i)?;
    let mut merged: Vec<(usize, i64)> = Vec::new();
    for (v, a) in terms {
        match merged.iter_mut().find(|m| m.0 == v) {
            Some(m) => m.1 += a,
            None => merged.push((v, a)),
        }
    }
    merged.retain(|m| m.1 != 0);
    match merged.as_slice() {
        [(v, 1)] => Some((*v, c)),
        _ => None,
    }
}

/// `i` as `Σ coef * var + constant`, when it is affine in the loop variables.
pub(crate) fn affine(i: &Idx) -> Option<(Vec<(usize, i64)>, i64)> {
    match i {
        Idx::Var(v) => Some((vec![(*v, 1)], 0)),
        Idx::Const(c) => Some((vec![], *c)),
        Idx::Add(xs) => {
            let mut terms = Vec::new();
            let mut c = 0;
            for x in xs {
                let (t, k) = affine(x)?;
                terms.extend(t);
                c += k;
            }
            Some((terms, c))
        }
        Idx::Mul(x, m) => {
            let (t, k) = affine(x)?;
            Some((t.into_iter().map(|(v, a)| (v, a * m)).collect(), k * m))
        }
        Idx::Div(..) | Idx::Clamp(..) | Idx::Value(_) => None,
    }
}

/// Whether `e` reads input `j` anywhere.
pub fn reads_input(e: &Expr, j: usize) -> bool {
    let mut found = false;
    visit(
        e,
        &mut |x| {
            found |=
                matches!(x, Expr::Load { input, .. } | Expr::Gather { input, .. } if *input == j)
        },
    );
    found
}

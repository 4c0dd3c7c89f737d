//! Rewrites of kernel bodies: inputs renumbered, loop variables renamed, reads of an input
//! moved to other coefficients.

use crate::access::{affine_read, reads_input};
use crate::ir::{Expr, Idx, Rewriter};
use kiln_ir::DType;

/// A rewrite of the leaves that name inputs and loop variables, leaving some reductions alone.
struct Rename<'a> {
    /// A load's or gather's input.
    input: &'a dyn Fn(usize) -> usize,
    /// A load's coefficients.
    coef: &'a dyn Fn(&[i64]) -> Vec<i64>,
    /// A loop variable (in `Iota` and index expressions).
    var: &'a dyn Fn(usize) -> usize,
    /// Reductions kept as they are, children included.
    keep: &'a dyn Fn(&Expr) -> bool,
}

impl Rewriter for Rename<'_> {
    fn expr(&mut self, e: &Expr) -> Expr {
        match e {
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => Expr::Load {
                input: (self.input)(*input),
                dtype: *dtype,
                coef: (self.coef)(coef),
                off: *off,
            },
            Expr::Gather { input, .. } => {
                let mut g = e.map_children(self);
                if let Expr::Gather { input: i, .. } = &mut g {
                    *i = (self.input)(*input);
                }
                g
            }
            Expr::Iota { var, dtype } => Expr::Iota {
                var: (self.var)(*var),
                dtype: *dtype,
            },
            Expr::Reduce { .. } | Expr::Fold { .. } if (self.keep)(e) => e.clone(),
            _ => e.map_children(self),
        }
    }

    fn idx(&mut self, i: &Idx) -> Idx {
        match i {
            Idx::Var(v) => Idx::Var((self.var)(*v)),
            _ => i.map_children(self),
        }
    }
}

/// `e` with every input index `i` replaced by `map(i)`.
pub fn map_inputs(e: &Expr, map: &dyn Fn(usize) -> usize) -> Expr {
    Rename {
        input: map,
        coef: &|c| c.to_vec(),
        var: &|v| v,
        keep: &|_| false,
    }
    .expr(e)
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
    /// The rewrite, and whether it is still possible.
    struct Reindex<'a> {
        j: usize,
        from: &'a [i64],
        to: &'a [i64],
        extents: &'a [usize],
        ok: bool,
    }
    impl Reindex<'_> {
        fn matches(&self, coef: &[i64]) -> bool {
            let at = |c: &[i64], v: usize| c.get(v).copied().unwrap_or(0);
            (0..coef.len().max(self.from.len()))
                .all(|v| at(coef, v) == at(self.from, v) || self.extents.get(v) == Some(&1))
        }
    }
    impl Rewriter for Reindex<'_> {
        fn expr(&mut self, e: &Expr) -> Expr {
            if !self.ok || !reads_input(e, self.j) {
                return e.clone();
            }
            match e {
                Expr::Load { dtype, .. } | Expr::Gather { dtype, .. } => {
                    match affine_read(e, self.j) {
                        Some((coef, 0)) if self.matches(&coef) => Expr::Load {
                            input: self.j,
                            dtype: *dtype,
                            coef: self.to.to_vec(),
                            off: 0,
                        },
                        _ => {
                            self.ok = false;
                            e.clone()
                        }
                    }
                }
                Expr::Op { .. } | Expr::Reduce { .. } => e.map_children(self),
                // Not in a condition.
                Expr::Guard { conds, .. } if conds.iter().all(|c| !idx_reads(c.idx(), self.j)) => {
                    e.map_children(self)
                }
                _ => {
                    self.ok = false;
                    e.clone()
                }
            }
        }
    }
    let mut r = Reindex {
        j,
        from,
        to,
        extents,
        ok: true,
    };
    let e = r.expr(e);
    r.ok.then_some(e)
}

/// Whether index expression `i` reads input `j` (in a run-time index).
fn idx_reads(i: &Idx, j: usize) -> bool {
    let e = Expr::Index {
        idx: i.clone(),
        dtype: DType::I64,
    };
    reads_input(&e, j)
}

/// `e` with the free loop variable `from` replaced by `to`, which `e` must not use (loads'
/// coefficients move from one variable to the other; reductions binding `from` are kept).
pub fn rename_var(e: &Expr, from: usize, to: usize) -> Expr {
    Rename {
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
        keep: &|x| match x {
            Expr::Reduce { vars, .. } => vars.iter().any(|v| v.0 == from),
            Expr::Fold { fold, .. } => fold.vars.iter().any(|v| v.0 == from),
            _ => false,
        },
    }
    .expr(e)
}

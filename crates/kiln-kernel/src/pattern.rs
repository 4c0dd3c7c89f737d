//! Recognizers of expression shapes that fusion and the emitters treat specially: the
//! difference from a row's maximum of a softmax, the causal mask of attention's logits, the
//! reductions that can run ahead of the loops they sit in.

use crate::access::affine;
use crate::ir::{Ew, Expr, Idx, Visitor};
use kiln_ir::{Combiner, ComparisonDirection, DType, OpKind};

/// Where the logits `h` of an online softmax (see [`crate::ir::Chain::online`]) are -inf
/// whatever the product: when `h` is `select(a ⋚ b, x, -inf)` (`-inf` as `value` resolves it)
/// with `a` and `b` integer affine expressions of the column variable `col` and the row
/// variable `row`, the `(a, b, c)` of [`crate::ir::Chain::masked`].
pub fn masked_where(
    h: &Expr,
    (col, row): (usize, usize),
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<(i64, i64, i64)> {
    let args = select_args(h)?;
    if value(&args[2]) != Some(f64::NEG_INFINITY) {
        return None;
    }
    arm_unused_where(h, 1, (col, row), value)
}

/// Where a select `h`, `select(a ⋚ b, x, y)` with `a` and `b` as [`masked_where`] takes
/// them, takes an arm that does not depend on the position (`value` resolves it): `(a, b, c)`
/// with that arm taken wherever `col * a + row * b + c > 0` (a causal mask's zeros, of
/// attention's probabilities' gradient, or its -inf).
pub fn constant_arm_where(
    h: &Expr,
    (col, row): (usize, usize),
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<(i64, i64, i64)> {
    let args = select_args(h)?;
    // `y` is taken where `x` is unchosen, `x` where `y` is.
    if value(&args[2]).is_some() {
        return arm_unused_where(h, 1, (col, row), value);
    }
    value(&args[1])?;
    arm_unused_where(h, 2, (col, row), value)
}

/// Where a select `h`, `select(a ⋚ b, x, y)` with `a` and `b` as [`masked_where`] takes them,
/// leaves its arm `arm` (1 for `x`, 2 for `y`) unchosen: `(a, b, c)` with that arm's value
/// unused wherever `col * a + row * b + c > 0` (a causal mask's scores read inside `x`, unused
/// above the diagonal).
pub fn arm_unused_where(
    h: &Expr,
    arm: usize,
    (col, row): (usize, usize),
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<(i64, i64, i64)> {
    let args = select_args(h)?;
    let (a, b, c) = fails_where(&args[0], (col, row), value)?;
    match arm {
        // `x` is unchosen where the comparison fails.
        1 => Some((a, b, c)),
        // `y` where it holds: where `g > 0` fails, `-g + 1 > 0`.
        2 => Some((-a, -b, 1 - c)),
        _ => None,
    }
}

/// The condition and the two arms of `h` when it is a `select`.
fn select_args(h: &Expr) -> Option<&[Expr]> {
    match h {
        Expr::Op {
            op: Ew::Select,
            args,
            ..
        } => Some(args),
        _ => None,
    }
}

/// Where the comparison `cond` of integer affine expressions of `col` and `row` fails: `(a,
/// b, c)` with `col * a + row * b + c > 0` exactly there.
fn fails_where(
    cond: &Expr,
    (col, row): (usize, usize),
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<(i64, i64, i64)> {
    let Expr::Op {
        op: Ew::Cmp(dir),
        args: sides,
        ..
    } = cond
    else {
        return None;
    };
    let (a, b) = (
        affine_int(&sides[0], (col, row), value)?,
        affine_int(&sides[1], (col, row), value)?,
    );
    // f = a - b; kept where the comparison holds, masked where `g > 0`.
    let f = (a.0 - b.0, a.1 - b.1, a.2 - b.2);
    let neg = |f: (i64, i64, i64)| (-f.0, -f.1, -f.2);
    match dir {
        ComparisonDirection::Le => Some(f),
        ComparisonDirection::Lt => Some((f.0, f.1, f.2 + 1)),
        ComparisonDirection::Ge => Some(neg(f)),
        ComparisonDirection::Gt => {
            let g = neg(f);
            Some((g.0, g.1, g.2 + 1))
        }
        _ => None,
    }
}

// An integer expression as `col * a + row * b + c`.
fn affine_int(
    e: &Expr,
    (col, row): (usize, usize),
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<(i64, i64, i64)> {
    let of_idx = |i: &Idx| {
        let (terms, c) = affine(i)?;
        let mut f = (0, 0, c);
        for (v, k) in terms {
            match v {
                _ if v == col => f.0 += k,
                _ if v == row => f.1 += k,
                _ => return None,
            }
        }
        Some(f)
    };
    match e {
        Expr::Index { idx, .. } => of_idx(idx),
        Expr::Iota { var, .. } => of_idx(&Idx::Var(*var)),
        Expr::Const { .. } | Expr::Load { .. } | Expr::Gather { .. }
            if matches!(e.dtype(), DType::I32 | DType::I64) =>
        {
            let v = value(e)?;
            (v.fract() == 0.0 && v.abs() < (1u64 << 52) as f64).then_some((0, 0, v as i64))
        }
        // (Exact for the positions of `masked`'s caller, below 2^30.)
        Expr::Op {
            op: Ew::Convert,
            dtype: DType::I32 | DType::I64,
            args,
        } if matches!(args[0].dtype(), DType::I32 | DType::I64) => {
            affine_int(&args[0], (col, row), value)
        }
        Expr::Op {
            op: Ew::Kind(k @ (OpKind::Add | OpKind::Subtract)),
            dtype: DType::I32 | DType::I64,
            args,
        } => {
            let (x, y) = (
                affine_int(&args[0], (col, row), value)?,
                affine_int(&args[1], (col, row), value)?,
            );
            let s = if *k == OpKind::Add { 1 } else { -1 };
            Some((x.0 + s * y.0, x.1 + s * y.1, x.2 + s * y.2))
        }
        _ => None,
    }
}

/// The reductions in `e` that may be computed ahead of the loops they sit in (every one not
/// under a guard, whose condition may protect its loads), inner ones before outer ones.
pub fn hoistable_reduces(e: &Expr) -> Vec<&Expr> {
    struct Hoistable<'e>(Vec<&'e Expr>);
    impl<'e> Visitor<'e> for Hoistable<'e> {
        fn expr(&mut self, e: &'e Expr) {
            match e {
                Expr::Op { .. } => e.for_each_child(self),
                Expr::Reduce { .. } | Expr::Fold { .. } => {
                    e.for_each_child(self);
                    self.0.push(e);
                }
                // Not under guards, nor inside index expressions.
                _ => {}
            }
        }
    }
    let mut found = Hoistable(Vec::new());
    found.expr(e);
    found.0
}

/// `(a, m)` when `e` is `a - m` with `m` a maximum reduction, through round trips of bit
/// casts (a stop-gradient's).
pub fn minus_max(e: &Expr) -> Option<(&Expr, &Expr)> {
    let Expr::Op {
        op: Ew::Kind(OpKind::Subtract),
        args,
        ..
    } = e
    else {
        return None;
    };
    let (a, mut m) = (&args[0], &args[1]);
    while let Expr::Op {
        op: Ew::Bitcast,
        dtype,
        args: inner,
    } = m
        && let Expr::Op {
            op: Ew::Bitcast,
            args: innermost,
            ..
        } = &inner[0]
        && innermost[0].dtype() == *dtype
    {
        m = &innermost[0];
    }
    matches!(
        m,
        Expr::Reduce {
            kind: Combiner::Max,
            ..
        }
    )
    .then_some((a, m))
}

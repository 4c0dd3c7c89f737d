//! Where the readers of a product never use it: the elements of a GEMM's `[batch, m, n]`
//! product that every read of it leaves unused, because each read sits inside the arm of a
//! `select` that an affine comparison of the read's own row and column leaves unchosen there
//! (a causal mask's scores `S = Q Kᵀ`, which the softmax and its recomputation in the backward
//! pass read only as `select(col <= row, S * s, -inf)`). Such elements need not be computed:
//! whatever they hold, no reader's result changes (see [`crate::ir::Unread`]). Fusion decides
//! with [`unread_by_readers`] and [`unread_in`]; the verifier checks the same way.

use crate::access::affine_read;
use crate::fuse::Fused;
use crate::ir::{Expr, Kernel, Schedule, Visitor};
use kiln_ir::{Func, ValueId};
use std::collections::BTreeSet;

/// A region of a product's matrices: `(a, b, c)` for the elements where `col * a + row * b +
/// c > 0`.
pub type Region = (i64, i64, i64);

/// The regions where every read of input `input` in `body` (loop variables `0..outer.len()`
/// ranging over `outer`'s extents) leaves a `[batch, m, n]` product, read as a flat buffer,
/// unused: a region is in the set when each read lies in an arm of a select whose comparison
/// leaves that arm unchosen wherever the region holds, at the read's own row and column
/// (`value` resolves the comparisons' constants). `None` when some read is not protected so,
/// or does not read the product at a row and a column of two loop variables within `m` and
/// `n` (and a whole number of matrices from its start). `Some` of an empty set for a body that
/// does not read the input at all, `Some` of every region for one that reads it only so.
pub fn unread_in<'v>(
    body: &'v Expr,
    input: usize,
    outer: &[usize],
    (m, n): (usize, usize),
    value: &'v dyn Fn(&Expr) -> Option<f64>,
) -> Option<Reads> {
    let mut w = Walk {
        input,
        mn: (m as i64, n as i64),
        value,
        bound: outer.iter().enumerate().map(|(v, &e)| (v, e)).collect(),
        arms: Vec::new(),
        reads: Reads::None,
    };
    if m < 2 || n < 2 || m >= 1 << 30 || n >= 1 << 30 {
        return None;
    }
    w.expr(body);
    match w.reads {
        Reads::Unprotected => None,
        r => Some(r),
    }
}

/// What the reads of a product found so far leave unused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reads {
    /// No read yet: every region.
    None,
    /// The regions every read so far leaves unused.
    Regions(BTreeSet<Region>),
    /// A read that no select protects: no region.
    Unprotected,
}

impl Reads {
    /// The regions both leave unused.
    pub fn meet(self, other: Reads) -> Reads {
        match (self, other) {
            (Reads::Unprotected, _) | (_, Reads::Unprotected) => Reads::Unprotected,
            (Reads::None, r) | (r, Reads::None) => r,
            (Reads::Regions(a), Reads::Regions(b)) => {
                let both: BTreeSet<Region> = a.intersection(&b).copied().collect();
                if both.is_empty() {
                    Reads::Unprotected
                } else {
                    Reads::Regions(both)
                }
            }
        }
    }
}

/// The walk of [`unread_in`]: the variables bound around the node visited (outer ones first,
/// with their extents) and the select arms it lies in (each with how many variables were bound
/// at the select: a variable bound after it is not the one its comparison reads).
struct Walk<'v> {
    input: usize,
    mn: (i64, i64),
    value: &'v dyn Fn(&Expr) -> Option<f64>,
    bound: Vec<(usize, usize)>,
    arms: Vec<(&'v Expr, usize, usize)>,
    reads: Reads,
}

impl<'v> Walk<'v> {
    /// The regions a read of the product at flat coefficients `coef` (per variable) and
    /// offset `off` leaves unused, from the select arms around it.
    fn read(&mut self, coef: &[i64], off: i64) {
        let found = self.row_col(coef, off).map(|(row, col)| {
            let mut regions = BTreeSet::new();
            for &(sel, arm, at) in &self.arms {
                // Both variables bound when the select was reached.
                let outer = |v: usize| self.bound[..at].iter().any(|b| b.0 == v);
                if !outer(row) || !outer(col) {
                    continue;
                }
                if let Some(r) = crate::pattern::arm_unused_where(sel, arm, (col, row), self.value)
                {
                    regions.insert(r);
                }
            }
            regions
        });
        let here = match found {
            Some(r) if !r.is_empty() => Reads::Regions(r),
            _ => Reads::Unprotected,
        };
        self.reads = std::mem::replace(&mut self.reads, Reads::None).meet(here);
    }

    /// The row and column variables of a read at `coef` and `off`: one variable at
    /// coefficient 1 ranging within `n`, one at `n` ranging within `m`, and every other term
    /// (the offset too) a whole number of matrices.
    fn row_col(&self, coef: &[i64], off: i64) -> Option<(usize, usize)> {
        let (m, n) = self.mn;
        let extent = |v: usize| self.bound.iter().rev().find(|b| b.0 == v).map(|b| b.1);
        let (mut row, mut col) = (None, None);
        for (v, &k) in coef.iter().enumerate().filter(|c| *c.1 != 0) {
            match k {
                1 if col.is_none() && extent(v)? as i64 <= n => col = Some(v),
                _ if k == n && row.is_none() && extent(v)? as i64 <= m => row = Some(v),
                _ if k % (m * n) == 0 => {}
                _ => return None,
            }
        }
        (off % (m * n) == 0).then_some(())?;
        Some((row?, col?))
    }

    /// Visits `e` with `vars` bound around it.
    fn under(&mut self, vars: &[(usize, usize)], e: &'v Expr) {
        let mark = self.bound.len();
        self.bound.extend_from_slice(vars);
        self.expr(e);
        self.bound.truncate(mark);
    }
}

impl<'v> Visitor<'v> for Walk<'v> {
    fn expr(&mut self, e: &'v Expr) {
        match e {
            Expr::Load { input, .. } | Expr::Gather { input, .. } if *input == self.input => {
                match affine_read(e, self.input) {
                    Some((coef, off)) => self.read(&coef, off),
                    None => self.reads = Reads::Unprotected,
                }
                // A gather's indices may read it too.
                e.for_each_child(self);
            }
            Expr::Op {
                op: crate::ir::Ew::Select,
                args,
                ..
            } => {
                self.expr(&args[0]);
                for arm in [1, 2] {
                    self.arms.push((e, arm, self.bound.len()));
                    self.expr(&args[arm]);
                    self.arms.pop();
                }
            }
            Expr::Reduce {
                init, vars, body, ..
            } => {
                self.expr(init);
                self.under(vars, body);
            }
            Expr::Fold { fold, .. } => {
                fold.inits.iter().for_each(|x| self.expr(x));
                for x in &fold.elems {
                    self.under(&fold.vars, x);
                }
                fold.body.iter().for_each(|x| self.expr(x));
            }
            _ => e.for_each_child(self),
        }
    }
}

/// The regions of the `[batch, m, n]` product `v` (the result of a GEMM kernel, stored by
/// rows) that every reader leaves unused ([`unread_in`] over each reading kernel's body and
/// extra outputs): `None` when `v` is a function output, or is read by an instruction without
/// a kernel, as a GEMM's operand, by a kernel of another schedule than a loop nest or a
/// GEMM's epilogue (no chained product), or unprotected anywhere, or by no kernel at all.
pub fn unread_by_readers(
    f: &Func,
    fused: &Fused,
    v: ValueId,
    (m, n): (usize, usize),
) -> Option<BTreeSet<Region>> {
    if f.outputs.contains(&v) {
        return None;
    }
    let mut all = Reads::None;
    let mut readers = 0;
    for (i, inst) in f.insts.iter().enumerate() {
        let Some(k) = &fused.kernels[i] else {
            // Inlined and merged instructions read through their users' kernels; any other
            // instruction without a kernel (a view, control flow) reads the buffer itself.
            if !fused.inlined[i] && fused.merged_into[i].is_none() && inst.operands.contains(&v) {
                return None;
            }
            continue;
        };
        let ops = &fused.operands[i];
        if !ops.contains(&v) {
            continue;
        }
        readers += 1;
        let value = crate::fuse::constant_of(f, ops);
        for (input, _) in ops.iter().enumerate().filter(|o| *o.1 == v) {
            all = all.meet(kernel_reads(k, input, (m, n), &value)?);
        }
    }
    match all {
        Reads::Regions(r) if readers > 0 => Some(r),
        _ => None,
    }
}

/// What kernel `k`'s bodies leave unused of a product read as its input `input`.
fn kernel_reads(
    k: &Kernel,
    input: usize,
    mn: (usize, usize),
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<Reads> {
    match &k.schedule {
        Schedule::Nest => {}
        Schedule::Gemm {
            epilogue: Some(e),
            chain: None,
            conv: None,
            ..
        } if input > 1 && input != *e => {}
        _ => return None,
    }
    let outer = &k.out.shape;
    let mut reads = unread_in(&k.body, input, outer, mn, value)?;
    for x in &k.extra {
        reads = reads.meet(unread_in(&x.body, input, outer, mn, value)?);
    }
    Some(reads)
}

/// The regions of GEMM kernel `k`'s product that its own epilogue leaves unused, when the
/// product is read by nothing else (the kernel's result is the epilogue's).
pub fn unread_by_epilogue(f: &Func, operands: &[ValueId], k: &Kernel) -> Option<BTreeSet<Region>> {
    let Schedule::Gemm {
        epilogue: Some(e),
        m,
        n,
        chain: None,
        conv: None,
        ..
    } = &k.schedule
    else {
        return None;
    };
    if !k.extra.is_empty() {
        return None;
    }
    let value = crate::fuse::constant_of(f, operands);
    match unread_in(&k.body, *e, &k.out.shape, (*m, *n), &value)? {
        Reads::Regions(r) => Some(r),
        _ => None,
    }
}

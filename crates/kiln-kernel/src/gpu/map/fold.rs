//! Folds ([`Expr::Fold`]: a `reduce_region` whose body is elementwise, such as an argmax's
//! coupled value and index) over rows, as one launch: a warp per row, or a block per row from
//! `block_reduce_min` terms on ([`Mapper::row_team`], as row reductions choose).
//!
//! Thread `t` of a row's `T` threads starts its `k` accumulators at the row's term `t` and
//! applies the body to them and each of its terms `t + T`, `t + 2T`, ... in turn (a warp's
//! loads consecutive). The threads' accumulators then meet in a fixed order: at butterfly
//! level `off = 1, 2, 4, ...` the two lanes of a pair both compute `body(lower, upper)` from
//! the lower lane's accumulators and the upper lane's (all `k` values shuffled across), so
//! each aligned group of `2 off` threads ends with one value, the fold of its threads in
//! thread order; a group whose upper half took no terms (a row shorter than its threads)
//! keeps its lower half's. Past a warp, the warps' results go through shared memory to warp
//! 0, which combines them the same way. Finally the body combines the inits with the total,
//! `body(inits, total)`, once. The order is fixed by the geometry: results are deterministic,
//! with no atomics, and equal the reference's for any body whose result does not depend on
//! the order (an argmax with ties to the lower index, an xor, a maximum). Every thread ends
//! with the fold's results, which the row's outputs read (written once each).
//!
//! Long rows fewer than the multiprocessors (an argmax over a whole tensor) split over blocks
//! in two launches instead (`fold_split.rs`).
//!
//! A fold of fewer terms than `warp_reduce_min`, or down the columns of a kept dimension,
//! takes a thread per output row instead (consecutive threads reading consecutive columns),
//! which folds its terms in order and then combines the inits with the total the same way.
//! A fold the launch cannot compute ahead (under a guard, or in a row whose reductions the
//! row mappings compute) stays in the expressions: a thread computes it where it is read,
//! in the reference's order (`Expr::Fold` in a `Stmt::Eval`).

use super::*;
use crate::fold::fold_key;
use crate::ir::Fold;

/// The folds of `bodies` that depend on the first `rank` variables only (one per fold, as
/// its result 0), innermost first; not those under a guard (see [`unguarded`]).
pub(super) fn row_folds(bodies: &[&Expr], rank: usize) -> Vec<Expr> {
    unguarded(
        bodies,
        rank,
        |e| matches!(e, Expr::Fold { .. }),
        fold_key,
        |e| match e {
            Expr::Fold { fold, .. } => Expr::Fold {
                fold: fold.clone(),
                result: 0,
            },
            _ => e.clone(),
        },
    )
}

/// Whether `e` is a fold kept in the reference's order ([`Fold::in_order`]).
pub(super) fn in_order(e: &Expr) -> bool {
    matches!(e, Expr::Fold { fold, .. } if fold.in_order)
}

/// The terms fold `e` takes (0 for anything else).
pub(super) fn terms(e: &Expr) -> usize {
    match e {
        Expr::Fold { fold, .. } => extent(&fold.vars),
        _ => 0,
    }
}

/// `e` with each result `j` of the fold `folds[i]` replaced by a load of the scalar input
/// `first + starts[i] + j` (over `vars` loop variables).
fn folds_replaced(e: &Expr, folds: &[Expr], starts: &[usize], first: usize, vars: usize) -> Expr {
    struct Sub<'a> {
        keys: Vec<ValueKey>,
        starts: &'a [usize],
        first: usize,
        vars: usize,
    }
    impl Rewriter for Sub<'_> {
        fn expr(&mut self, e: &Expr) -> Expr {
            let Expr::Fold { result, .. } = e else {
                return e.map_children(self);
            };
            let key = fold_key(e);
            match self.keys.iter().position(|h| *h == key) {
                Some(i) => Expr::Load {
                    input: self.first + self.starts[i] + result,
                    dtype: e.dtype(),
                    coef: vec![0; self.vars],
                    off: 0,
                },
                None => e.map_children(self),
            }
        }
    }
    Sub {
        keys: folds.iter().take(starts.len()).map(fold_key).collect(),
        starts,
        first,
        vars,
    }
    .expr(e)
}

/// `e` with each [`Expr::Arg`] `slot` replaced by a load of the scalar input `base + slot`.
fn args_replaced(e: &Expr, base: usize, vars: usize) -> Expr {
    struct Sub {
        base: usize,
        vars: usize,
    }
    impl Rewriter for Sub {
        fn expr(&mut self, e: &Expr) -> Expr {
            match e {
                Expr::Arg { slot, dtype } => Expr::Load {
                    input: self.base + slot,
                    dtype: *dtype,
                    coef: vec![0; self.vars],
                    off: 0,
                },
                _ => e.map_children(self),
            }
        }
    }
    Sub { base, vars }.expr(e)
}

/// Where a fold's statements read and write: the launch's input count, its loop variables,
/// and the value registers its expressions read as scalars.
pub(super) struct At<'a> {
    pub first: usize,
    pub vars: usize,
    pub scalars: &'a [usize],
}

impl At<'_> {
    /// `expr` evaluated into `reg`, reading the scalars and then `extra` registers (as inputs
    /// `first + scalars.len() + i`).
    fn eval(&self, reg: usize, expr: Expr, extra: &[usize]) -> Stmt {
        let mut scalars = self.scalars.to_vec();
        scalars.extend(extra);
        Stmt::Eval { reg, expr, scalars }
    }

    /// `into[j] = from[j]` for each accumulator of `fold`.
    fn copy(&self, fold: &Fold, from: &[usize], into: &[usize]) -> Vec<Stmt> {
        (fold.body.iter().zip(from.iter().zip(into)))
            .map(|(b, (&f, &t))| Stmt::Eval {
                reg: t,
                expr: Expr::Load {
                    input: self.first,
                    dtype: b.dtype(),
                    coef: vec![0; self.vars],
                    off: 0,
                },
                scalars: vec![f],
            })
            .collect()
    }

    /// `into = body(a, b)`: every result into `tmp` first (the body reads `a` and `b` whole),
    /// then copied to `into`.
    fn apply(
        &self,
        fold: &Fold,
        (a, b): (&[usize], &[usize]),
        tmp: &[usize],
        into: &[usize],
    ) -> Vec<Stmt> {
        let base = self.first + self.scalars.len();
        let args: Vec<usize> = a.iter().chain(b).copied().collect();
        let mut out: Vec<Stmt> = (fold.body.iter().zip(tmp))
            .map(|(x, &t)| self.eval(t, args_replaced(x, base, self.vars), &args))
            .collect();
        out.extend(self.copy(fold, tmp, into));
        out
    }

    /// The elements of `fold` at its term `at`, into `into`.
    fn elems(&self, fold: &Fold, at: Sc, into: &[usize]) -> Vec<Stmt> {
        let mut out = set_vars(&fold.vars, at);
        for (x, &r) in fold.elems.iter().zip(into) {
            out.push(self.eval(r, x.clone(), &[]));
        }
        out
    }
}

/// A slice of a fold's terms: from term `base`, `len` of them at most, `count` (at least 1)
/// in fact.
pub(super) struct Slice {
    pub base: Sc,
    pub len: usize,
    pub count: Sc,
}

/// Registers of a fold's `k` accumulators: `acc` (the thread's), `x` (an element's or another
/// lane's), `tmp` (a body application's results).
struct FoldRegs {
    acc: Vec<usize>,
    x: Vec<usize>,
    tmp: Vec<usize>,
}

impl Mapper<'_> {
    /// One launch computing each of `folds` (hoisted from `outs`, see [`row_folds`]) once per
    /// row by the row's threads together, then `outs` at every position of the row from
    /// their results (in registers).
    pub(super) fn fold_rows(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: Vec<(Buf, TensorType)>,
        outs: Vec<(Buf, TensorType, Expr)>,
        folds: &[Expr],
    ) -> GpuKernel {
        let longest = folds.iter().map(terms).max().unwrap_or(0);
        let split = row_rank(folds);
        // Short folds, and folds down columns (consecutive outputs reading consecutive
        // elements), take a thread per output row.
        // A fold kept in order (a window's) is one thread's, in order, too.
        let alone = longest < self.gpu.warp_reduce_min
            || (split > 0 && folds.iter().all(|f| split::columnar(f, split - 1)))
            || folds.iter().any(in_order);
        let (kind, threads, per_block, lane, row0) = if alone {
            let per_block = self.gpu.elementwise_block;
            (
                MapKind::Elementwise,
                1,
                per_block,
                c(0),
                Sc::plus(
                    Sc::times(sp(Special::Block), c(per_block)),
                    sp(Special::Thread),
                ),
            )
        } else {
            self.row_team(longest)
        };
        let rows: usize = out.shape[..split].iter().product();
        let row_len: usize = out.shape[split..].iter().product();
        let first = inputs.len();
        let mut r = Regs::default();
        let row = r.next();
        let mut shared = Vec::new();
        let mut body = set_vars(&dims(&out.shape[..split], 0), Sc::Reg(row));
        let mut scalars: Vec<usize> = Vec::new();
        let mut starts = Vec::new();
        for f in folds {
            let f = folds_replaced(f, folds, &starts, first, vars);
            let Expr::Fold { fold, .. } = &f else {
                unreachable!("a fold stays a fold: only earlier ones are replaced")
            };
            let at = At {
                first,
                vars,
                scalars: &scalars,
            };
            let results = self.fold_together(
                fold,
                (threads, &lane),
                None,
                &at,
                (&mut r, &mut shared),
                &mut body,
            );
            starts.push(scalars.len());
            scalars.extend(results);
        }
        let e = r.next();
        let pos = r.next();
        let mut outputs = Vec::new();
        let mut each = set_vars(&dims(&out.shape, split), Sc::Reg(e));
        each.push(Stmt::Let {
            reg: pos,
            value: Sc::plus(Sc::times(Sc::Reg(row), c(row_len)), Sc::Reg(e)),
        });
        for (o, (buf, ty, x)) in outs.into_iter().enumerate() {
            let v = r.next();
            each.push(Stmt::Eval {
                reg: v,
                expr: folds_replaced(&x, folds, &starts, first, vars),
                scalars: scalars.clone(),
            });
            each.push(Stmt::Store {
                buf: Buf::Output(o),
                index: Sc::Reg(pos),
                value: v,
            });
            outputs.push((buf, ty));
        }
        body.push(Stmt::For {
            reg: e,
            start: lane,
            end: c(row_len),
            step: c(threads),
            body: each,
        });
        self.row_kernel(
            (name, kind),
            (inputs, outputs, shared),
            (r.0, vars),
            (rows, threads, per_block),
            (Vec::new(), (row, row0), body),
        )
    }

    /// Statements computing `fold` by a row's `threads` threads together (`lane` numbers
    /// them; see the module documentation for the order), leaving its results in the
    /// registers returned, the same in every thread: over all its terms, combined with the
    /// inits, or (`part`) over a slice of them, without the inits.
    pub(super) fn fold_together(
        &self,
        fold: &Fold,
        (threads, lane): (usize, &Sc),
        part: Option<&Slice>,
        at: &At,
        (r, shared): (&mut Regs, &mut Vec<SharedArray>),
        out: &mut Vec<Stmt>,
    ) -> Vec<usize> {
        let k = fold.body.len();
        let warp = self.gpu.warp_size;
        let n = extent(&fold.vars);
        let whole = Slice {
            base: c(0),
            len: n,
            count: c(n),
        };
        let slice = part.unwrap_or(&whole);
        let regs = |r: &mut Regs| (0..k).map(|_| r.next()).collect::<Vec<usize>>();
        let inits = regs(r);
        let fr = FoldRegs {
            acc: regs(r),
            x: regs(r),
            tmp: regs(r),
        };
        let q = r.next();
        let how = if fold.in_order && threads == 1 && part.is_none() {
            "in order".to_string()
        } else {
            format!("{threads} threads strided, then combined in thread order")
        };
        out.push(Stmt::Note(format!(
            "fold of {k} accumulators over {} terms: {how}",
            slice.len
        )));
        for (x, &i) in fold.inits.iter().zip(&inits) {
            out.push(at.eval(i, x.clone(), &[]));
        }
        if n == 0 {
            return inits;
        }
        if fold.in_order && threads == 1 && part.is_none() {
            // The reference's order: from the inits, each term in turn.
            out.extend(at.copy(fold, &inits, &fr.acc));
            let mut step = at.elems(fold, Sc::Reg(q), &fr.x);
            step.extend(at.apply(fold, (&fr.acc, &fr.x), &fr.tmp, &fr.acc));
            out.push(Stmt::For {
                reg: q,
                start: c(0),
                end: c(n),
                step: c(1),
                body: step,
            });
            return fr.acc;
        }
        // Threads past the slice's end keep the inits (never combined in).
        out.extend(at.copy(fold, &inits, &fr.acc));
        // Whether every thread takes a term (else those from `count` on take none).
        let all_busy = part.is_none() && n >= threads;
        let term = |q: Sc| Sc::plus(slice.base.clone(), q);
        let first = at.elems(fold, term(lane.clone()), &fr.acc);
        if all_busy {
            out.extend(first);
        } else {
            out.push(Stmt::If {
                cond: Sc::lt(lane.clone(), slice.count.clone()),
                body: first,
            });
        }
        if slice.len > threads {
            let mut step = at.elems(fold, term(Sc::Reg(q)), &fr.x);
            step.extend(at.apply(fold, (&fr.acc, &fr.x), &fr.tmp, &fr.acc));
            out.push(Stmt::For {
                reg: q,
                start: Sc::plus(lane.clone(), c(threads)),
                end: slice.count.clone(),
                step: c(threads),
                body: step,
            });
        }
        let busy = (!all_busy).then(|| (slice.count.clone(), 1));
        out.extend(self.fold_lanes(fold, at, &fr, (lane.clone(), busy, threads.min(warp))));
        if threads > warp {
            let warps = threads / warp;
            let arrays: Vec<(usize, usize)> = fold
                .body
                .iter()
                .map(|b| {
                    shared.push(SharedArray {
                        dtype: b.dtype(),
                        len: warps,
                        packed: false,
                        swizzle: None,
                    });
                    shared.push(SharedArray {
                        dtype: b.dtype(),
                        len: 1,
                        packed: false,
                        swizzle: None,
                    });
                    (shared.len() - 2, shared.len() - 1)
                })
                .collect();
            let lane0 = Sc::eq(sp(Special::Lane), c(0));
            out.push(Stmt::If {
                cond: lane0.clone(),
                body: (arrays.iter().zip(&fr.acc))
                    .map(|(&(partials, _), &a)| Stmt::SharedStore {
                        array: partials,
                        index: sp(Special::Warp),
                        value: a,
                    })
                    .collect(),
            });
            out.push(Stmt::Barrier);
            let mut first_warp = vec![Stmt::If {
                cond: Sc::lt(sp(Special::Lane), c(warps)),
                body: (arrays.iter().zip(&fr.acc))
                    .map(|(&(partials, _), &a)| Stmt::SharedLoad {
                        reg: a,
                        array: partials,
                        index: sp(Special::Lane),
                    })
                    .collect(),
            }];
            // Warp `w` took terms when its first thread did: `w · warp < count`.
            let busy_warps = (!all_busy).then(|| (slice.count.clone(), warp));
            first_warp.extend(self.fold_lanes(
                fold,
                at,
                &fr,
                (
                    sp(Special::Lane),
                    busy_warps,
                    warps.next_power_of_two().min(warp),
                ),
            ));
            first_warp.push(Stmt::If {
                cond: lane0,
                body: (arrays.iter().zip(&fr.acc))
                    .map(|(&(_, total), &a)| Stmt::SharedStore {
                        array: total,
                        index: c(0),
                        value: a,
                    })
                    .collect(),
            });
            out.push(Stmt::If {
                cond: Sc::eq(sp(Special::Warp), c(0)),
                body: first_warp,
            });
            out.push(Stmt::Barrier);
            out.extend(
                (arrays.iter().zip(&fr.acc)).map(|(&(_, total), &a)| Stmt::SharedLoad {
                    reg: a,
                    array: total,
                    index: c(0),
                }),
            );
        }
        if part.is_some() {
            return fr.acc;
        }
        let results = regs(r);
        out.extend(at.apply(fold, (&inits, &fr.acc), &fr.tmp, &results));
        results
    }

    /// The butterfly combining the accumulators `fr.acc` of `width` lanes of a warp in lane
    /// order (`lane` numbers them): at level `off`, both lanes of a pair compute
    /// `body(lower, upper)`, or keep the lower's when the upper half of their group of
    /// `2 off` holds no terms. With `busy` `(count, scale)`, lane `l` holds terms when
    /// `l · scale < count` (else every lane does).
    fn fold_lanes(
        &self,
        fold: &Fold,
        at: &At,
        fr: &FoldRegs,
        (lane, busy, width): (Sc, Option<(Sc, usize)>, usize),
    ) -> Vec<Stmt> {
        let mut out = Vec::new();
        let not = |x: Sc| Sc::eq(x, c(0));
        let mut off = 1;
        while off < width {
            for (&x, &a) in fr.x.iter().zip(&fr.acc) {
                out.push(Stmt::Shuffle {
                    reg: x,
                    src: a,
                    mode: Shuffle::Xor(off),
                });
            }
            let lower = Sc::lt(Sc::modulo(lane.clone(), c(2 * off)), c(off));
            // Whether the upper half of the group (from `lane - lane % 2off + off`) took terms.
            let upper_busy = busy.as_ref().map(|(count, scale)| {
                let upper = Sc::plus(
                    Sc::times(Sc::quot(lane.clone(), c(2 * off)), c(2 * off)),
                    c(off),
                );
                Sc::lt(Sc::times(upper, c(*scale)), count.clone())
            });
            let both = |cond: Sc| match &upper_busy {
                Some(u) => Sc::and(u.clone(), cond),
                None => cond,
            };
            out.push(Stmt::If {
                cond: both(lower.clone()),
                body: at.apply(fold, (&fr.acc, &fr.x), &fr.tmp, &fr.acc),
            });
            out.push(Stmt::If {
                cond: both(not(lower.clone())),
                body: at.apply(fold, (&fr.x, &fr.acc), &fr.tmp, &fr.acc),
            });
            if let Some(u) = &upper_busy {
                out.push(Stmt::If {
                    cond: Sc::and(not(u.clone()), not(lower)),
                    body: at.copy(fold, &fr.x, &fr.acc),
                });
            }
            off *= 2;
        }
        out
    }
}

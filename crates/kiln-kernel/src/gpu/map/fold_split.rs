//! A long fold over few rows (an argmax over a whole tensor: one row) split over many blocks
//! in two launches, deterministic, as `split.rs` splits full reductions.
//!
//! Where the row mapping of `fold.rs` would leave multiprocessors idle (fewer rows than the
//! GPU has multiprocessors, rows of `block_reduce_min` terms or more, one output element per
//! row), each row's `n` terms are cut into `K` consecutive slices of `⌈n / K⌉`,
//! `K = min(⌈sms · blocks_per_sm / rows⌉, ⌈n / block_reduce_min⌉)` (at least 2), and block
//! `(row, k)` of a partials block's threads folds slice `k` as a row's block does (threads
//! strided over the slice, combined in thread order), without the inits, into the `k`
//! accumulators' partials `row · K + k` (scratch buffers, one per accumulator). The second
//! launch is the loop nest itself with the fold replaced by a fold of its `K` partials kept in
//! order ([`crate::ir::Fold::in_order`]) from the inits: a thread per row. `K` and every
//! slice follow from the shape and the target, so results are the same bits on every run;
//! they equal the reference's for a body whose result does not depend on the order.

use super::fold::Slice;
use super::*;
use crate::fold::fold_key;
use crate::ir::Fold;

impl Mapper<'_> {
    /// The two launches of `outs` (over `out`, `vars` loop variables) whose one hoisted fold
    /// is `folds[0]`, when it splits (see the module documentation), else `None`.
    pub(super) fn fold_split(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: &[(Buf, TensorType)],
        outs: &[(Buf, TensorType, Expr)],
        folds: &[Expr],
    ) -> Option<GpuProgram> {
        let [f] = folds else {
            return None;
        };
        let Expr::Fold { fold, .. } = f else {
            return None;
        };
        let n = extent(&fold.vars);
        let split = row_rank(folds);
        if n < self.gpu.block_reduce_min.max(1)
            || out.shape[split..].iter().product::<usize>() != 1
            || (split > 0 && split::columnar(f, split - 1))
            || fold.in_order
        {
            return None;
        }
        let rows: usize = out.shape[..split].iter().product();
        // No rows (an empty output): no block would have anything to do.
        if rows == 0 || rows >= self.gpu.sms {
            return None;
        }
        let blocks = self.gpu.sms * self.gpu.blocks_per_sm;
        let k = blocks
            .div_ceil(rows.max(1))
            .min(n.div_ceil(self.gpu.block_reduce_min.max(1)));
        let len = n.div_ceil(k.max(1));
        let k = n.div_ceil(len);
        if k < 2 {
            return None;
        }
        let scratch: Vec<TensorType> = (fold.body.iter())
            .map(|b| TensorType::new(b.dtype(), vec![rows * k]))
            .collect();
        let first = self.fold_partials(name, (out, split, vars), inputs, fold, (rows, k, len));
        // The second launch: the fold of the partials `row · K + k` over `k`, in order.
        let mut ins = inputs.to_vec();
        let base = ins.len();
        ins.extend((scratch.iter().enumerate()).map(|(j, t)| (Buf::Scratch(j), t.clone())));
        let mut coef = vec![0i64; vars + 1];
        let mut at = k as i64;
        for d in (0..split).rev() {
            coef[d] = at;
            at *= out.shape[d] as i64;
        }
        coef[vars] = 1;
        let of_partials = Fold {
            inits: fold.inits.clone(),
            vars: vec![(vars, k)],
            elems: (fold.body.iter().enumerate())
                .map(|(j, b)| Expr::Load {
                    input: base + j,
                    dtype: b.dtype(),
                    coef: coef.clone(),
                    off: 0,
                })
                .collect(),
            body: fold.body.clone(),
            in_order: true,
        };
        let outs = (outs.iter())
            .map(|(b, t, e)| (*b, t.clone(), swapped(e, &fold_key(f), &of_partials)))
            .collect();
        let second = self.nest(name, out, vars + 1, ins, outs);
        Some(GpuProgram {
            scratch,
            zeroed: Vec::new(),
            launches: vec![first, second],
        })
    }

    /// The first launch: block `row · K + k` folds slice `k` of row `row`'s terms into
    /// partial `row · K + k` of each accumulator's scratch buffer.
    fn fold_partials(
        &self,
        name: &str,
        (out, split, vars): (&TensorType, usize, usize),
        inputs: &[(Buf, TensorType)],
        fold: &Fold,
        (rows, k, len): (usize, usize, usize),
    ) -> GpuKernel {
        let n = extent(&fold.vars);
        let block = self.partials_block();
        let grid = rows * k;
        let mut r = Regs::default();
        let [blk, row, slice] = r.array();
        let mut shared = Vec::new();
        let mut body = Self::row_and_slice(blk, (row, slice), k);
        body.extend(set_vars(&dims(&out.shape[..split], 0), Sc::Reg(row)));
        // Every slice holds `len` terms but the last, `n - (K - 1) · len`.
        let part = Slice {
            base: Sc::times(Sc::Reg(slice), c(len)),
            len,
            count: Sc::plus(
                c(len),
                Sc::times(
                    Sc::eq(Sc::Reg(slice), c(k - 1)),
                    Sc::Const(n as i64 - (k * len) as i64),
                ),
            ),
        };
        let at = fold::At {
            first: inputs.len(),
            vars,
            scalars: &[],
        };
        let results = self.fold_together(
            fold,
            (block, &sp(Special::Thread)),
            Some(&part),
            &at,
            (&mut r, &mut shared),
            &mut body,
        );
        // Every thread holds the block's partials; the first stores them.
        body.push(Stmt::If {
            cond: Sc::eq(sp(Special::Thread), c(0)),
            body: (results.iter().enumerate())
                .map(|(j, &v)| Stmt::Store {
                    buf: Buf::Output(j),
                    index: Sc::Reg(blk),
                    value: v,
                })
                .collect(),
        });
        let outputs = (fold.body.iter().enumerate())
            .map(|(j, b)| (Buf::Scratch(j), TensorType::new(b.dtype(), vec![grid])))
            .collect();
        self.partials_kernel(
            (name, MapKind::SplitPartials),
            (inputs.to_vec(), outputs, shared),
            (r.0, vars),
            (grid, block),
            (blk, body),
        )
    }
}

/// `e` with each result `j` of the fold keyed `key` replaced by result `j` of `by`.
fn swapped(e: &Expr, key: &ValueKey, by: &Fold) -> Expr {
    struct Sub<'a> {
        key: &'a ValueKey,
        by: &'a Fold,
    }
    impl Rewriter for Sub<'_> {
        fn expr(&mut self, e: &Expr) -> Expr {
            match e {
                Expr::Fold { result, .. } if fold_key(e) == *self.key => Expr::Fold {
                    fold: Box::new(self.by.clone()),
                    result: *result,
                },
                _ => e.map_children(self),
            }
        }
    }
    Sub { key, by }.expr(e)
}

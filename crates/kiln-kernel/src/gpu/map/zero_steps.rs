//! Contraction steps a causal mask makes zero, left out on the GPU.
//!
//! A GEMM kernel carrying a [`ZeroBlocks`] (attention's probabilities `P` or their gradient
//! `dS` as one operand of `P V`, `dS K`, `dSᵀ Q` or `dOᵀ P`: `fuse/zero_blocks.rs`) has an
//! operand expected to be zero where `step * a + x * b + c > 0` (`x` the operand's row, A's
//! row or B's column). The block-tile mappings (`tiled.rs`, `tensor.rs`, `warpgroup.rs`) give
//! each block the range of contraction steps its tile needs ([`ZeroSteps::range`]): from its
//! rows (or columns) alone, the whole stages (`step` indices each) where the operand is zero
//! for every row of the tile lie at the contraction's end (`a = 1`) or start (`a = -1`), and
//! the block leaves them out, but only after checking, on the operands as they are, that the
//! masked operand is zero there and the other operand finite there (`0 * inf` and `0 * NaN`
//! are NaN, which the full product carries into its result): each thread checks its share of
//! both tiles' elements in the steps left out, and the block agrees through shuffles and one
//! shared word per warp, in the ring's first array before it is staged (a value the whole
//! block then holds, so every thread takes the same
//! range and meets the ring's barriers together). Where the check fails the block runs every
//! step, as without the hint. A step left out would have added `0 * finite`, a zero, to each
//! accumulator.
//!
//! The sum tree's flushes (`tiled.rs`) count contraction indices from 0 whatever the range,
//! so a block that leaves a prefix out flushes where it would have; one that leaves a suffix
//! out does after its loop the flushes the steps left out would have done
//! ([`ZeroSteps::replayed_flushes`]), so the sums are added in the same order, and the result
//! is the full product's, bit for bit (up to the sign of a zero sum, as on the CPU).
//!
//! The TMA ring (`warpgroup_tma.rs`) and the thread-per-element product run every step;
//! their launches say so in a note.

use super::*;
use crate::ir::ZeroBlocks;
use kiln_ir::ComparisonDirection;

/// A product's zero hint and what checking it needs.
pub(super) struct ZeroSteps<'e> {
    /// The hint.
    pub zero: &'e ZeroBlocks,
    /// The product's rows, columns and contraction per matrix.
    pub mnk: (usize, usize, usize),
    /// A's and B's elements at the kernel variables (0: batch, 1: row, 2: column, 3:
    /// contraction), in the product's dtype.
    pub ops: (&'e Expr, &'e Expr),
}

/// One block of a block-tile mapping, as the zero steps' check sees it.
pub(super) struct Block {
    /// The registers holding the block's batch, first row and first column.
    pub origin: (usize, usize, usize),
    /// The block tile's rows and columns.
    pub tile: (usize, usize),
    /// Contraction indices per step of the ring.
    pub step: usize,
    /// The block's threads (whole warps).
    pub threads: usize,
    /// Threads per warp.
    pub warp: usize,
}

impl ZeroSteps<'_> {
    /// The note a launch that runs every step prints.
    pub(super) fn every_step(&self, mapping: &str) -> Stmt {
        Stmt::Note(format!(
            "{} zero where {} > 0: {mapping} runs every step",
            self.operand_name(),
            self.region()
        ))
    }

    fn operand_name(&self) -> &'static str {
        if self.zero.operand == 0 { "A" } else { "B" }
    }

    /// The hint's region as the plan prints it: `step - row`.
    fn region(&self) -> String {
        let (a, b, cc) = self.zero.at;
        let x = if self.zero.operand == 0 { "row" } else { "col" };
        let mut s = String::from(if a < 0 { "-step" } else { "step" });
        s += &format!(" {} {x}", if b < 0 { "-" } else { "+" });
        match cc {
            0 => {}
            k if k < 0 => s += &format!(" - {}", -k),
            k => s += &format!(" + {k}"),
        }
        s
    }

    /// The statements that set registers `(kb, ke)` to the block's range of contraction
    /// indices, `kb` a multiple of `b.step`: the steps left out where the check passes, every
    /// step where it fails (see the module documentation). The warps agree through shared
    /// array `words` (the ring's first operand array, before its first stage is staged: each
    /// warp's word at element `2 w`, apart even in a packed array, holding 0 or 1, exact in
    /// any float type).
    pub(super) fn range(
        &self,
        r: &mut Regs,
        b: &Block,
        words: usize,
    ) -> (Vec<Stmt>, (usize, usize)) {
        let (m, n, k) = self.mnk;
        let (batch, m0, n0) = b.origin;
        let (bm, bn) = b.tile;
        let reg = Sc::Reg;
        let [kb, ke, lo, hi, cnt, e] = r.array();
        let [bad, flag, other] = r.array();
        let (a, bb, cc) = self.zero.at;
        // The masked operand's first and last row (A) or column (B) of the tile.
        let (x0, extent, len) = if self.zero.operand == 0 {
            (reg(m0), bm, m)
        } else {
            (reg(n0), bn, n)
        };
        let x1 = Sc::plus(
            x0.clone(),
            min(c(extent - 1), Sc::minus(c(len - 1), x0.clone())),
        );
        let kk = c(k);
        let step = b.step;
        let (left_out, stages) = stages_left_out(self.zero, self.mnk, b.tile, step);
        let mut out = vec![Stmt::Note(format!(
            "{} zero where {} > 0: up to {left_out} of {stages} stages a matrix left out where checked at run time",
            self.operand_name(),
            self.region()
        ))];
        // The steps zero for every row of the tile, whole stages of them: `[lo, hi)`, and
        // the block's range were the check to pass, `[kb, ke)`.
        if a > 0 {
            // Zero where `step > -(x b + c)` for every x: from `max_x(-(x b + c)) + 1`.
            let from = if bb > 0 {
                Sc::minus(Sc::Const(1 - cc), x0)
            } else {
                Sc::plus(x1, Sc::Const(1 - cc))
            };
            let first = clamp(from, k);
            // Stages starting at or past it: from `first` rounded up to a stage.
            let up = Sc::times(Sc::quot(Sc::plus(first, c(step - 1)), c(step)), c(step));
            out.extend([
                Stmt::Let {
                    reg: lo,
                    value: min(up, kk.clone()),
                },
                Stmt::Let {
                    reg: hi,
                    value: kk.clone(),
                },
            ]);
        } else {
            // Zero where `step < x b + c` for every x: below `min_x(x b + c)`.
            let below = if bb > 0 {
                Sc::plus(x0, Sc::Const(cc))
            } else {
                Sc::minus(Sc::Const(cc), x1)
            };
            let last = clamp(below, k);
            out.extend([
                Stmt::Let {
                    reg: lo,
                    value: c(0),
                },
                Stmt::Let {
                    reg: hi,
                    value: Sc::times(Sc::quot(last, c(step)), c(step)),
                },
            ]);
        }
        out.push(Stmt::Let {
            reg: cnt,
            value: Sc::minus(reg(hi), reg(lo)),
        });
        // Each thread's share of both tiles' elements in the steps left out: 1 in `bad` where
        // the masked operand is not zero or the other operand not finite.
        let f32t = DType::F32;
        out.push(Stmt::Identity {
            reg: bad,
            kind: Combiner::Add,
            dtype: f32t,
        });
        let one = |v: f64| Expr::Const {
            dtype: f32t,
            value: v,
        };
        let flagged = |cond: Expr| Expr::Op {
            op: Ew::Select,
            dtype: f32t,
            args: vec![cond, one(1.0), one(0.0)],
        };
        let pred = |op: ComparisonDirection, x: Expr, y: Expr| Expr::Op {
            op: Ew::Cmp(op),
            dtype: DType::Pred,
            args: vec![x, y],
        };
        let dtype = self.ops.0.dtype();
        let zero_of = || Expr::Const { dtype, value: 0.0 };
        for o in [self.zero.operand, 1 - self.zero.operand] {
            let expr = if o == 0 { self.ops.0 } else { self.ops.1 };
            let (var, base, rows, len) = if o == 0 {
                (1, m0, bm, m)
            } else {
                (2, n0, bn, n)
            };
            let test = if o == self.zero.operand {
                // Not zero (NaN too).
                flagged(pred(ComparisonDirection::Ne, expr.clone(), zero_of()))
            } else {
                // `x * 0` is 0 for every finite x, NaN for infinities and NaN.
                let times0 = Expr::Op {
                    op: Ew::Kind(OpKind::Multiply),
                    dtype,
                    args: vec![expr.clone(), zero_of()],
                };
                flagged(pred(ComparisonDirection::Ne, times0, zero_of()))
            };
            let row = Sc::plus(reg(base), Sc::quot(reg(e), reg(cnt)));
            let at_k = Sc::plus(reg(lo), Sc::modulo(reg(e), reg(cnt)));
            out.push(Stmt::For {
                reg: e,
                start: sp(Special::Thread),
                end: Sc::times(reg(cnt), c(rows)),
                step: c(b.threads),
                body: vec![Stmt::If {
                    cond: Sc::lt(row.clone(), c(len)),
                    body: vec![
                        Stmt::SetVar {
                            var: 0,
                            value: reg(batch),
                        },
                        Stmt::SetVar { var, value: row },
                        Stmt::SetVar {
                            var: 3,
                            value: at_k,
                        },
                        Stmt::Eval {
                            reg: flag,
                            expr: test,
                            scalars: Vec::new(),
                        },
                        Stmt::Combine {
                            acc: bad,
                            value: flag,
                            kind: Combiner::Max,
                            dtype: f32t,
                        },
                    ],
                }],
            });
        }
        // The block agrees: the warp's maximum by shuffles, each warp's in a shared word, and
        // every thread the maximum of the words.
        let mut off = b.warp / 2;
        while off >= 1 {
            out.push(Stmt::Shuffle {
                reg: other,
                src: bad,
                mode: Shuffle::Xor(off),
            });
            out.push(Stmt::Combine {
                acc: bad,
                value: other,
                kind: Combiner::Max,
                dtype: f32t,
            });
            off /= 2;
        }
        let warps = b.threads.div_ceil(b.warp);
        out.push(Stmt::If {
            cond: Sc::eq(sp(Special::Lane), c(0)),
            body: vec![Stmt::SharedStore {
                array: words,
                index: Sc::times(sp(Special::Warp), c(2)),
                value: bad,
            }],
        });
        out.push(Stmt::Barrier);
        for w in 0..warps {
            out.push(Stmt::SharedLoad {
                reg: other,
                array: words,
                index: c(2 * w),
            });
            out.push(Stmt::Combine {
                acc: bad,
                value: other,
                kind: Combiner::Max,
                dtype: f32t,
            });
        }
        // Every word read before the ring's first stage overwrites them.
        out.push(Stmt::Barrier);
        // Checked: the steps outside `[lo, hi)`; else every step.
        let ok = Sc::is_zero(reg(bad));
        let (skip_kb, skip_ke) = if a > 0 {
            (c(0), reg(lo))
        } else {
            (reg(hi), kk.clone())
        };
        out.extend([
            Stmt::Let {
                reg: kb,
                value: Sc::times(ok.clone(), skip_kb),
            },
            Stmt::Let {
                reg: ke,
                value: Sc::plus(kk.clone(), Sc::times(ok, Sc::minus(skip_ke, kk))),
            },
        ]);
        (out, (kb, ke))
    }

    /// After the loop over `[kb, ke)` of a contraction of `self.mnk.2` by stages of `step`:
    /// the sum tree's flushes (see `tiled.rs`'s `flushes`) that the stages past `ke` would
    /// have done, lowest level first, each once (a level's first flush past `ke` carries
    /// everything below it; later ones would add zeros). `acc` the accumulators by level,
    /// `before` what each flush runs first.
    pub(super) fn replayed_flushes(
        &self,
        acc: &[Vec<usize>],
        (ke, step): (usize, usize),
        (sums, dtype): (SumTree, DType),
        before: &[Stmt],
    ) -> Vec<Stmt> {
        let step = step.max(1);
        let end = self.mnk.2.next_multiple_of(step);
        // The end of the last stage run.
        let ran = Sc::times(
            Sc::quot(Sc::plus(Sc::Reg(ke), c(step - 1)), c(step)),
            c(step),
        );
        // A multiple of the period among the ends of the stages not run.
        super::tiled::flushes_where(acc, (sums, dtype), before, &|period| {
            Sc::lt(Sc::quot(ran.clone(), c(period)), c(end / period))
        })
    }
}

/// How many of a matrix's stages (of `step` contraction indices, by blocks of `tile`) the
/// hint `z` lets its blocks leave out where every check passes, and how many there are: what
/// [`ZeroSteps::range`] decides at run time, counted here.
pub(super) fn stages_left_out(
    z: &ZeroBlocks,
    (m, n, k): (usize, usize, usize),
    (bm, bn): (usize, usize),
    step: usize,
) -> (usize, usize) {
    let step = step.max(1);
    let (gm, gn) = (m.div_ceil(bm), n.div_ceil(bn));
    let stages = k.div_ceil(step);
    let (a, b, cc) = z.at;
    let (blocks, extent, len, others) = if z.operand == 0 {
        (gm, bm, m, gn)
    } else {
        (gn, bn, n, gm)
    };
    let mut left_out = 0;
    for i in 0..blocks {
        let (x0, x1) = ((i * extent) as i64, ((i + 1) * extent).min(len) as i64 - 1);
        let k = k as i64;
        let skipped = if a > 0 {
            let from = if b > 0 { 1 - cc - x0 } else { x1 + 1 - cc };
            let lo = (from.clamp(0, k) as usize)
                .next_multiple_of(step)
                .min(k as usize);
            stages - lo.div_ceil(step)
        } else {
            let below = if b > 0 { x0 + cc } else { cc - x1 };
            below.clamp(0, k) as usize / step
        };
        left_out += skipped * others;
    }
    (left_out, stages * gm * gn)
}

/// The check and range of a block of `b` where the launch has zero steps `z` (see
/// [`ZeroSteps::range`]): the statements, and the registers of the range for the ring's
/// [`super::staging::Stepping::range`]; nothing without.
pub(super) fn checked_range(
    z: Option<&ZeroSteps>,
    r: &mut Regs,
    b: &Block,
    words: usize,
) -> (Vec<Stmt>, Option<(usize, usize)>) {
    match z {
        Some(z) => {
            let (stmts, range) = z.range(r, b, words);
            (stmts, Some(range))
        }
        None => (Vec::new(), None),
    }
}

/// [`ZeroSteps::replayed_flushes`] where the launch has zero steps and a range.
pub(super) fn replayed(
    z: Option<&ZeroSteps>,
    acc: &[Vec<usize>],
    (range, step): (Option<(usize, usize)>, usize),
    tree: (SumTree, DType),
    before: &[Stmt],
) -> Vec<Stmt> {
    match (z, range) {
        (Some(z), Some((_, ke))) => z.replayed_flushes(acc, (ke, step), tree, before),
        _ => Vec::new(),
    }
}

/// `min(x, y)`: `y + (x < y) · (x - y)`.
fn min(x: Sc, y: Sc) -> Sc {
    Sc::plus(
        y.clone(),
        Sc::times(Sc::lt(x.clone(), y.clone()), Sc::minus(x, y)),
    )
}

/// `x` clamped to `0..=k`.
fn clamp(x: Sc, k: usize) -> Sc {
    let nonneg = Sc::minus(x.clone(), Sc::times(Sc::lt(x.clone(), c(0)), x));
    min(nonneg, c(k))
}

//! A matrix product on the CUDA cores by block tiles ([`MapKind::GemmTiled`]): the block
//! computes a `tile.m x tile.n` tile of the result (one block per tile and batch), stepping
//! through the contraction `tile.k` at a time. Each step the block's threads stage A's
//! `tile.m x tile.k` and B's `tile.k x tile.n` tiles into shared memory (each element by one
//! thread, coalesced along the operand's contiguous dimension, converted to the result's
//! dtype, zero past the operands' edges), meet at a barrier, and each thread multiplies its
//! `thread_m` rows of A's tile by its `thread_n` columns of B's into a register tile, then
//! meets the others again before the next step overwrites the tiles. Finally each thread
//! stores the elements of its register tile that lie inside the result.
//!
//! # The order of the sums, and their error bound
//!
//! A thread adds each element's terms in order of the contraction into one accumulator per
//! *chunk* of `leaf` terms ([`SumTree::leaf`], a multiple of `tile.k`); a full chunk is added
//! into a level-1 accumulator and restarted, a level-1 accumulator that has taken `fanout`
//! chunks into level 2, and so on: a tree of `fanout` per node over chunks of `leaf`, with
//! `L = ⌈log_fanout ⌈K / leaf⌉⌉` levels. At the end the levels are added from the top down.
//! A term passes through at most `leaf + fanout · L + L` roundings, within the
//! `K(n, r) = leaf + fanout · ⌈log_fanout(n / leaf)⌉ + fanout · r` of `ir-specs/ops/reduce.md`
//! (`r >= 1` pays for the final `L` additions). Integers wrap, in any order.

use super::gemm::Product;
use super::*;
use crate::target::GemmTile;

/// The operands of one product launch and where its result goes.
pub(super) struct Operands<'e> {
    /// A's element at variables `(0: batch, 1: row, 3: contraction)`, in the result's dtype.
    pub a: &'e Expr,
    /// B's element at variables `(0: batch, 2: column, 3: contraction)`, in the result's
    /// dtype.
    pub b: &'e Expr,
    /// A's contraction varies slowest (it is stored transposed): staged along its rows.
    pub a_trans: bool,
    /// B's contraction varies fastest: staged along the contraction.
    pub b_trans: bool,
    /// The result is stored by feature planes (`(batch, column, row)`), not row-major.
    pub planes: bool,
}

impl Mapper<'_> {
    /// The tile a product of `m x n` per batch runs with: the target's first (largest) that
    /// fits the GPU and that the product fills at least half of in both directions. A product
    /// thinner than that (a matrix times a vector, a dot product) gets none: its blocks would
    /// idle, and it keeps one thread per element.
    pub(super) fn gemm_tile(&self, m: usize, n: usize, dtype: DType) -> Option<GemmTile> {
        let bytes = dtype.bits().div_ceil(8).max(4) as usize;
        let fits = |t: &GemmTile| {
            let threads = t.threads();
            t.k > 0
                && t.thread_m > 0
                && t.thread_n > 0
                && t.m.is_multiple_of(t.thread_m)
                && t.n.is_multiple_of(t.thread_n)
                && self.sums.leaf.is_multiple_of(t.k)
                && threads > 0
                && threads.is_multiple_of(self.gpu.warp_size)
                && threads <= self.gpu.max_threads_per_block
                && (t.m + t.n) * t.k * bytes <= self.gpu.shared_memory_per_block
        };
        self.gpu
            .gemm_tiles
            .iter()
            .copied()
            .filter(fits)
            .find(|t| 2 * m >= t.m && 2 * n >= t.n)
    }

    /// The product of `d` by block tiles of `tile`, stored into `out`.
    pub(super) fn tiled_product(
        &self,
        name: &str,
        (a, b): ((Buf, TensorType), (Buf, TensorType)),
        d: &Product,
        ops: &Operands,
        tile: GemmTile,
        out: (Buf, TensorType),
    ) -> GpuKernel {
        let dtype = out.1.dtype;
        let GemmTile {
            m: bm,
            n: bn,
            k: bk,
            thread_m: tm,
            thread_n: tn,
        } = tile;
        let (gm, gn) = (d.m.div_ceil(bm), d.n.div_ceil(bn));
        let threads = tile.threads();
        let mut r = Regs::default();
        let (batch, m0, n0, ty, tx) = (r.next(), r.next(), r.next(), r.next(), r.next());
        let (k0, e, kk, staged, prod) = (r.next(), r.next(), r.next(), r.next(), r.next());
        let af: Vec<usize> = (0..tm).map(|_| r.next()).collect();
        let bf: Vec<usize> = (0..tn).map(|_| r.next()).collect();
        // The accumulators: level 0 (the chunk) first, a `tm x tn` tile per level.
        let levels = sum_levels(d.k, self.sums);
        let acc: Vec<Vec<usize>> = (0..=levels)
            .map(|_| (0..tm * tn).map(|_| r.next()).collect())
            .collect();
        let reg = Sc::Reg;
        let mut body = vec![
            Stmt::Let {
                reg: batch,
                value: Sc::quot(sp(Special::Block), c(gm * gn)),
            },
            Stmt::Let {
                reg: m0,
                value: Sc::times(
                    Sc::modulo(Sc::quot(sp(Special::Block), c(gn)), c(gm)),
                    c(bm),
                ),
            },
            Stmt::Let {
                reg: n0,
                value: Sc::times(Sc::modulo(sp(Special::Block), c(gn)), c(bn)),
            },
            Stmt::Let {
                reg: ty,
                value: Sc::times(Sc::quot(sp(Special::Thread), c(bn / tn)), c(tm)),
            },
            Stmt::Let {
                reg: tx,
                value: Sc::times(Sc::modulo(sp(Special::Thread), c(bn / tn)), c(tn)),
            },
        ];
        for level in &acc {
            for &x in level {
                body.push(zero(x, dtype));
            }
        }
        // Staging: element `e` of a tile is `(row or column, contraction)`, the operand's
        // contiguous dimension fastest so that neighbouring threads read neighbouring elements.
        let (a_row, a_k) = if ops.a_trans {
            (Sc::modulo(reg(e), c(bm)), Sc::quot(reg(e), c(bm)))
        } else {
            (Sc::quot(reg(e), c(bk)), Sc::modulo(reg(e), c(bk)))
        };
        let (b_col, b_k) = if ops.b_trans {
            (Sc::quot(reg(e), c(bk)), Sc::modulo(reg(e), c(bk)))
        } else {
            (Sc::modulo(reg(e), c(bn)), Sc::quot(reg(e), c(bn)))
        };
        let staging = Staging {
            e,
            threads,
            batch,
            k0,
            staged,
            k: d.k,
            dtype,
        };
        let stage = |len: usize,
                     rows: (usize, Sc, usize, usize),
                     kc: Sc,
                     expr: &Expr,
                     array: usize,
                     width: usize| {
            let index = Sc::plus(Sc::times(kc.clone(), c(width)), rows.1.clone());
            staging.stage(len, rows, kc, expr, array, index)
        };
        let scalar = |i: usize| Expr::Load {
            input: 2 + i,
            dtype,
            coef: vec![0; 4],
            off: 0,
        };
        let product = Expr::Op {
            op: Ew::Kind(OpKind::Multiply),
            dtype,
            args: vec![scalar(0), scalar(1)],
        };
        let mut step = Vec::new();
        for (i, &x) in af.iter().enumerate() {
            step.push(Stmt::SharedLoad {
                reg: x,
                array: 0,
                index: Sc::plus(Sc::times(reg(kk), c(bm)), Sc::plus(reg(ty), c(i))),
            });
        }
        for (j, &x) in bf.iter().enumerate() {
            step.push(Stmt::SharedLoad {
                reg: x,
                array: 1,
                index: Sc::plus(Sc::times(reg(kk), c(bn)), Sc::plus(reg(tx), c(j))),
            });
        }
        for (i, &x) in af.iter().enumerate() {
            for (j, &y) in bf.iter().enumerate() {
                step.push(Stmt::Eval {
                    reg: prod,
                    expr: product.clone(),
                    scalars: vec![x, y],
                });
                step.push(Stmt::Combine {
                    acc: acc[0][i * tn + j],
                    value: prod,
                    kind: Combiner::Add,
                    dtype,
                });
            }
        }
        let mut k_step = vec![
            stage(bm * bk, (1, a_row, d.m, m0), a_k, ops.a, 0, bm),
            stage(bk * bn, (2, b_col, d.n, n0), b_k, ops.b, 1, bn),
            Stmt::Barrier,
            Stmt::For {
                reg: kk,
                start: c(0),
                end: c(bk),
                step: c(1),
                body: step,
            },
            Stmt::Barrier,
        ];
        // A full chunk (or node) goes up a level, lowest first, so a node filled by this step's
        // chunk goes up in the same step.
        let mut period = self.sums.leaf;
        for l in 1..=levels {
            let mut flush = Vec::new();
            for (&up, &below) in acc[l].iter().zip(&acc[l - 1]) {
                flush.push(Stmt::Combine {
                    acc: up,
                    value: below,
                    kind: Combiner::Add,
                    dtype,
                });
                flush.push(zero(below, dtype));
            }
            k_step.push(Stmt::If {
                cond: Sc::eq(Sc::modulo(Sc::plus(reg(k0), c(bk)), c(period)), c(0)),
                body: flush,
            });
            period *= self.sums.fanout.max(2);
        }
        body.push(Stmt::For {
            reg: k0,
            start: c(0),
            end: c(d.k),
            step: c(bk),
            body: k_step,
        });
        for (x, &top) in acc[levels].iter().enumerate() {
            for l in (0..levels).rev() {
                body.push(Stmt::Combine {
                    acc: top,
                    value: acc[l][x],
                    kind: Combiner::Add,
                    dtype,
                });
            }
        }
        for i in 0..tm {
            for j in 0..tn {
                let row = Sc::plus(reg(m0), Sc::plus(reg(ty), c(i)));
                let col = Sc::plus(reg(n0), Sc::plus(reg(tx), c(j)));
                let index = if ops.planes {
                    Sc::plus(
                        Sc::times(Sc::plus(Sc::times(reg(batch), c(d.n)), col.clone()), c(d.m)),
                        row.clone(),
                    )
                } else {
                    Sc::plus(
                        Sc::times(Sc::plus(Sc::times(reg(batch), c(d.m)), row.clone()), c(d.n)),
                        col.clone(),
                    )
                };
                body.push(Stmt::If {
                    cond: Sc::and(Sc::lt(row, c(d.m)), Sc::lt(col, c(d.n))),
                    body: vec![Stmt::Store {
                        buf: Buf::Output(0),
                        index,
                        value: acc[levels][i * tn + j],
                    }],
                });
            }
        }
        GpuKernel {
            name: name.to_string(),
            kind: MapKind::GemmTiled,
            grid: d.batch * gm * gn,
            block: threads,
            warp: self.gpu.warp_size,
            inputs: vec![a, b],
            outputs: vec![out],
            shared: vec![
                SharedArray {
                    dtype,
                    len: bk * bm,
                    packed: false,
                },
                SharedArray {
                    dtype,
                    len: bk * bn,
                    packed: false,
                },
            ],
            regs: r.0,
            vars: 4,
            sums: self.sums,
            body,
        }
    }
}

/// `reg = 0` in `dtype` (the sum's identity).
/// What a loop staging an operand tile into shared memory works with (see [`Staging::stage`]).
pub(super) struct Staging {
    /// The loop's register: the tile element a thread loads.
    pub e: usize,
    /// The block's threads, the loop's step.
    pub threads: usize,
    /// The register holding the batch index.
    pub batch: usize,
    /// The register holding the contraction step's first index.
    pub k0: usize,
    /// The register an element is loaded into.
    pub staged: usize,
    /// The contraction's length.
    pub k: usize,
    /// The dtype elements are staged in (zero past the operand's edges).
    pub dtype: DType,
}

impl Staging {
    /// The block's threads loading the `len` elements of an operand tile, element `e` at row
    /// `base + row` (kernel variable `row_var`, below `rows`) and contraction index `k0 + kc`
    /// (variable 3, below `k`), zero past the operand's edges, each stored into shared array
    /// `array` at `index`.
    pub(super) fn stage(
        &self,
        len: usize,
        (row_var, row, rows, base): (usize, Sc, usize, usize),
        kc: Sc,
        expr: &Expr,
        array: usize,
        index: Sc,
    ) -> Stmt {
        let at_row = Sc::plus(Sc::Reg(base), row);
        let at_k = Sc::plus(Sc::Reg(self.k0), kc);
        Stmt::For {
            reg: self.e,
            start: sp(Special::Thread),
            end: c(len),
            step: c(self.threads),
            body: vec![
                Stmt::SetVar {
                    var: 0,
                    value: Sc::Reg(self.batch),
                },
                Stmt::SetVar {
                    var: row_var,
                    value: at_row.clone(),
                },
                Stmt::SetVar {
                    var: 3,
                    value: at_k.clone(),
                },
                zero(self.staged, self.dtype),
                Stmt::If {
                    cond: Sc::and(Sc::lt(at_row, c(rows)), Sc::lt(at_k, c(self.k))),
                    body: vec![Stmt::Eval {
                        reg: self.staged,
                        expr: expr.clone(),
                        scalars: Vec::new(),
                    }],
                },
                Stmt::SharedStore {
                    array,
                    index,
                    value: self.staged,
                },
            ],
        }
    }
}

pub(super) fn zero(reg: usize, dtype: DType) -> Stmt {
    Stmt::Identity {
        reg,
        kind: Combiner::Add,
        dtype,
    }
}

/// The levels of the tree above the chunks of a sum of `k` terms: `⌈log_fanout ⌈k / leaf⌉⌉`.
pub(super) fn sum_levels(k: usize, sums: SumTree) -> usize {
    let fanout = sums.fanout.max(2);
    let mut nodes = k.div_ceil(sums.leaf.max(1));
    let mut levels = 0;
    while nodes > 1 {
        nodes = nodes.div_ceil(fanout);
        levels += 1;
    }
    levels
}

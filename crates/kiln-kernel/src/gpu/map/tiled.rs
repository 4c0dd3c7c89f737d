//! A matrix product on the CUDA cores by block tiles ([`MapKind::GemmTiled`]): the block
//! computes a `tile.m x tile.n` tile of the result (one block per tile and batch), stepping
//! through the contraction `tile.k` at a time. The block's threads stage A's `tile.m x tile.k`
//! and B's `tile.k x tile.n` tiles into shared memory in a ring of stages (`staging.rs`: the
//! next steps' tiles load, with `cp.async` where the operand allows, while this step's
//! multiply; converted to the result's dtype, zero past the operands' edges;
//! [`Mapper::tiled_stages`]: `Gpu::gemm_stages` where a tile is copied with `cp.async`, fewer
//! where they do not fit, two through registers), and each thread multiplies its `thread_m`
//! rows of A's tile by its `thread_n` columns of B's into a register tile.
//! Finally each thread stores the elements of its register tile that lie inside the result.
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
//! (`r >= 1` pays for the final `L` additions). In f32 and f64 each term is multiplied and
//! added in one fused multiply-add (one rounding for the product and the sum, as the CPU's
//! GEMM does). Integers wrap, in any order.

use super::gemm::{Launch, Product, tile_origin};
use super::skip::{choose, maybe_around};
use super::staging::{Staging, Stepping, Tile, pipelined, zero};
use super::zero_steps::{Block, checked_range, replayed};
use super::*;
use crate::target::GemmTile;

/// The operands of one product launch and where its result goes.
pub(super) struct Operands<'e> {
    /// A's element at variables `(0: batch, 1: row, 3: contraction)`, in the result's dtype.
    pub a: &'e Expr,
    /// B's element at variables `(0: batch, 2: column, 3: contraction)`, in the result's
    /// dtype.
    pub b: &'e Expr,
    /// The result is stored by feature planes (`(batch, column, row)`), not row-major.
    pub planes: bool,
}

impl Mapper<'_> {
    /// The tile a product of `m x n` per batch runs with: the target's first (largest) that
    /// fits the GPU and that the product fills at least half of in both directions (or a
    /// smaller one that leaves out work `leaves_out` says the first does not: see
    /// [`choose`]). A product thinner than that (a matrix times a vector, a dot product) gets
    /// none: its blocks would idle, and it keeps one thread per element.
    pub(super) fn gemm_tile(
        &self,
        (m, n): (usize, usize),
        dtype: DType,
        leaves_out: Option<&dyn Fn(&GemmTile) -> bool>,
    ) -> Option<GemmTile> {
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
                && 2 * (t.m + t.n) * t.k * bytes <= self.gpu.shared_limit()
        };
        let tiles = self.gpu.gemm_tiles.iter().copied().filter(fits);
        choose(tiles, (m, n), leaves_out)
    }

    /// The stages of a product of contraction `k` by tiles of `t` in `dtype`:
    /// `Gpu::gemm_stages`, at most one more than the steps there are, fewer while they do not
    /// fit the block's shared memory (two always fit a tile [`Mapper::gemm_tile`] chose).
    pub(super) fn tiled_stages(&self, t: &GemmTile, k: usize, dtype: DType) -> usize {
        let bytes = dtype.bits().div_ceil(8).max(4) as usize;
        let most = self.gpu.gemm_stages.min(k.div_ceil(t.k.max(1)) + 1).max(2);
        (2..=most)
            .rev()
            .find(|&s| s * (t.m + t.n) * t.k * bytes <= self.gpu.shared_limit())
            .unwrap_or(2)
    }

    /// The product of `d` by block tiles of `tile`, stored into `out`.
    pub(super) fn tiled_product(
        &self,
        launch: Launch,
        d: &Product,
        ops: &Operands,
        tile: GemmTile,
    ) -> GpuKernel {
        let dtype = launch.epilogue.map_or(launch.out.1.dtype, |e| e.product);
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
        let [batch, m0, n0, ty, tx] = r.array();
        let [k0, e, kk, staged, prod] = r.array();
        let [kn, next, cur] = r.array();
        let tmp = (r.next(), r.next());
        let af: Vec<usize> = (0..tm).map(|_| r.next()).collect();
        let bf: Vec<usize> = (0..tn).map(|_| r.next()).collect();
        // The accumulators: level 0 (the chunk) first, a `tm x tn` tile per level.
        let levels = sum_levels(d.k, self.sums);
        let acc = accumulators(&mut r, levels, tm * tn);
        let reg = Sc::Reg;
        let mut body = tile_origin((batch, m0, n0), (gm, gn), (bm, bn));
        body.extend([
            Stmt::Let {
                reg: ty,
                value: Sc::times(Sc::quot(sp(Special::Thread), c(bn / tn)), c(tm)),
            },
            Stmt::Let {
                reg: tx,
                value: Sc::times(Sc::modulo(sp(Special::Thread), c(bn / tn)), c(tn)),
            },
        ]);
        for level in &acc {
            for &x in level {
                body.push(zero(x, dtype));
            }
        }
        let staging = Staging {
            e,
            threads,
            batch,
            k0: kn,
            stage: next,
            staged,
            k: d.k,
            dtype,
        };
        let tiles = [
            Tile {
                row_var: 1,
                rows: d.m,
                base: m0,
                extent: bm,
                depth: bk,
                k_fastest: false,
                panel: 0,
                expr: ops.a,
                array: 0,
            },
            Tile {
                row_var: 2,
                rows: d.n,
                base: n0,
                extent: bn,
                depth: bk,
                k_fastest: false,
                panel: 0,
                expr: ops.b,
                array: 1,
            },
        ];
        let mut shared = vec![
            SharedArray {
                dtype,
                len: bk * bm,
                packed: false,
                swizzle: None,
            },
            SharedArray {
                dtype,
                len: bk * bn,
                packed: false,
                swizzle: None,
            },
        ];
        // A ring of stages where a tile is copied with `cp.async`; two (double buffering)
        // through registers, whose stores are done when the step's multiply starts.
        let copies = staging.any_async(&tiles, &shared);
        let stages = if copies {
            self.tiled_stages(&tile, d.k, dtype)
        } else {
            2
        };
        for a in &mut shared {
            a.len *= stages;
        }
        // The steps a causal mask makes zero, left out where checked (`zero_steps.rs`).
        let zero = d.zero_steps(ops);
        let block = Block {
            origin: (batch, m0, n0),
            tile: (bm, bn),
            step: bk,
            threads,
            warp: self.gpu.warp_size,
        };
        let (check, range) = checked_range(zero.as_ref(), &mut r, &block, 0);
        // The registers multiplied, read as extra inputs past the launch's.
        let scalar = |i: usize| Expr::Load {
            input: launch.inputs.len() + i,
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
                index: Sc::plus(
                    Sc::times(Sc::plus(reg(kk), Sc::times(reg(cur), c(bk))), c(bm)),
                    Sc::plus(reg(ty), c(i)),
                ),
            });
        }
        for (j, &x) in bf.iter().enumerate() {
            step.push(Stmt::SharedLoad {
                reg: x,
                array: 1,
                index: Sc::plus(
                    Sc::times(Sc::plus(reg(kk), Sc::times(reg(cur), c(bk))), c(bn)),
                    Sc::plus(reg(tx), c(j)),
                ),
            });
        }
        let fused = matches!(dtype, DType::F32 | DType::F64);
        for (i, &x) in af.iter().enumerate() {
            for (j, &y) in bf.iter().enumerate() {
                let acc = acc[0][i * tn + j];
                if fused {
                    step.push(Stmt::MulAdd {
                        acc,
                        a: x,
                        b: y,
                        dtype,
                    });
                    continue;
                }
                step.push(Stmt::Eval {
                    reg: prod,
                    expr: product.clone(),
                    scalars: vec![x, y],
                });
                step.push(Stmt::Combine {
                    acc,
                    value: prod,
                    kind: Combiner::Add,
                    dtype,
                });
            }
        }
        let mut k_step = vec![Stmt::For {
            reg: kk,
            start: c(0),
            end: c(bk),
            step: c(1),
            body: step,
        }];
        // A full chunk (or node) goes up a level, lowest first, so a node filled by this step's
        // chunk goes up in the same step.
        let done = Sc::plus(reg(k0), c(bk));
        k_step.extend(flushes(&acc, &done, self.sums, dtype, &[]));
        let stepping = Stepping {
            k0,
            cur,
            step: bk,
            stages,
            lag: 0,
            range,
        };
        let stage = staging.stage(&tiles, &shared);
        let mut steps = check;
        steps.extend(pipelined(&staging, stage, &stepping, k_step, copies));
        let tree = (self.sums, dtype);
        steps.extend(replayed(zero.as_ref(), &acc, (range, bk), tree, &[]));
        let origin = (reg(m0), reg(n0));
        body.extend(maybe_around(d.skip().as_ref(), origin, (bm, bn), steps));
        body.extend(sum_down(&acc, dtype));
        for i in 0..tm {
            for j in 0..tn {
                let row = Sc::plus(reg(m0), Sc::plus(reg(ty), c(i)));
                let col = Sc::plus(reg(n0), Sc::plus(reg(tx), c(j)));
                body.push(launch.store_element(
                    d,
                    ops.planes,
                    batch,
                    (row, col),
                    acc[levels][i * tn + j],
                    tmp,
                ));
            }
        }
        launch.kernel(
            MapKind::GemmTiled,
            (d.batch * gm * gn, threads, self.gpu.warp_size),
            shared,
            r.0,
            self.sums,
            body,
        )
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

/// The accumulators of a sum tree of `levels` levels above its chunks: `each` registers per
/// level, level 0 (the chunk) first.
pub(super) fn accumulators(r: &mut Regs, levels: usize, each: usize) -> Vec<Vec<usize>> {
    (0..=levels)
        .map(|_| (0..each).map(|_| r.next()).collect())
        .collect()
}

/// The sum tree's flushes after a step whose last term is contraction index `done - 1`: for
/// each level `l` above the chunks (`acc[l]` its accumulators) whose period, `leaf ·
/// fanout^(l-1)` terms, divides `done`, `before` and then each accumulator of level `l - 1`
/// added into its own of level `l` and restarted at zero; lowest level first, so a node
/// filled by this step's chunk goes up in the same step.
pub(super) fn flushes(
    acc: &[Vec<usize>],
    done: &Sc,
    sums: SumTree,
    dtype: DType,
    before: &[Stmt],
) -> Vec<Stmt> {
    flushes_where(acc, (sums, dtype), before, &|period| {
        Sc::eq(Sc::modulo(done.clone(), c(period)), c(0))
    })
}

/// Each level's flush of [`flushes`] (`before`, then each accumulator of level `l - 1` added
/// into its own of level `l` and restarted at zero), lowest level first, under the condition
/// `when` gives for the level's period (`leaf · fanout^(l-1)` terms).
pub(super) fn flushes_where(
    acc: &[Vec<usize>],
    (sums, dtype): (SumTree, DType),
    before: &[Stmt],
    when: &dyn Fn(usize) -> Sc,
) -> Vec<Stmt> {
    let mut out = Vec::new();
    let mut period = sums.leaf;
    for l in 1..acc.len() {
        let mut flush = before.to_vec();
        for (&up, &below) in acc[l].iter().zip(&acc[l - 1]) {
            flush.push(Stmt::Combine {
                acc: up,
                value: below,
                kind: Combiner::Add,
                dtype,
            });
            flush.push(zero(below, dtype));
        }
        out.push(Stmt::If {
            cond: when(period),
            body: flush,
        });
        period *= sums.fanout.max(2);
    }
    out
}

/// The statements adding each accumulator's lower levels into its top one (the last of
/// `acc`), from the top down.
pub(super) fn sum_down(acc: &[Vec<usize>], dtype: DType) -> Vec<Stmt> {
    let Some((top, below)) = acc.split_last() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (x, &t) in top.iter().enumerate() {
        for level in below.iter().rev() {
            out.push(Stmt::Combine {
                acc: t,
                value: level[x],
                kind: Combiner::Add,
                dtype,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_is_cut_back_to_fit_shared_memory_and_short_contractions() {
        let mut gpu = Gpu::h200();
        let tile = gpu.gemm_tiles[0];
        assert_eq!((tile.m, tile.n, tile.k), (128, 64, 8));
        let stages = |gpu: &Gpu, k: usize, dtype: DType| {
            let m = Mapper {
                gpu,
                sums: TargetInfo::h200().sums,
                precision: MatmulPrecision::Highest,
                float_atomics: false,
            };
            m.tiled_stages(&tile, k, dtype)
        };
        assert_eq!(stages(&gpu, 4096, DType::F32), 2);
        gpu.gemm_stages = 4;
        assert_eq!(stages(&gpu, 4096, DType::F32), 4);
        // No more stages than steps and one; two at least.
        assert_eq!(stages(&gpu, 16, DType::F32), 3);
        assert_eq!(stages(&gpu, 3, DType::F32), 2);
        // 192 x 8 f64 elements a stage: 12 KiB; 30 KiB hold two.
        gpu.shared_memory_per_block = 30 << 10;
        assert_eq!(stages(&gpu, 4096, DType::F64), 2);
        assert_eq!(stages(&gpu, 4096, DType::F32), 4);
        gpu.shared_memory_per_block = 20 << 10;
        assert_eq!(stages(&gpu, 4096, DType::F32), 3);
    }
}

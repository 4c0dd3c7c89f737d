//! A matrix product on the tensor cores ([`MapKind::GemmMma`]): bf16 or f16 operands, an f32
//! result. The block computes a `tile.m x tile.n` tile of the result, each warp a
//! `thread_m x thread_n` part of it as `mma.m16n8k16` tiles. Per step of 16 along the
//! contraction the block stages A's `tile.m x 16` and B's `16 x tile.n` into packed shared
//! arrays (each row of A and each column of B as 16 consecutive 16-bit elements, zeros past
//! the operands' edges; B stored by rows is staged by rows, `k * tile.n + column`), double
//! buffered (`staging.rs`: `cp.async` copies of the next step's tiles in flight while this
//! step multiplies, where the staged rows are contiguous in the operand and a multiple of 8
//! long; through registers otherwise), and each warp loads its fragments with `ldmatrix.x4`
//! (A's 16 x 16 tiles; B's columns two 8-column tiles at a time, `ldmatrix.x4.trans` for B
//! staged by rows) and accumulates one `mma` per 16 x 8 tile of its part.
//!
//! # The order of the sums, and their error bound
//!
//! Each `mma` adds 16 terms to its accumulator; the accumulators take chunks of `leaf` terms
//! and a tree of `fanout` above them exactly as `tiled.rs` describes (a chunk is `leaf / 16`
//! mma steps), so a term passes through at most `leaf + fanout · L + L` roundings plus those
//! inside one `mma` (whose order the PTX ISA leaves open). The reference interpreter
//! (`kiln-reference`) converts the operands to f32 exactly and accumulates the products
//! exactly, rounding once; the tests compare with `kiln_reference::accuracy`'s bound,
//! `K(n, r) · ε · Σ|terms|` plus an ulp, where `ε` is the largest unit roundoff of the cone's
//! dtypes (2⁻⁸ for bf16 operands, 2⁻¹¹ for f16): looser than the f32 accumulation needs, and
//! order-independent, as it must be when the hardware's order inside an `mma` is unknown. The
//! products of 16-bit operands are exact in f32. The emulator adds one `mma`'s exact products
//! and rounds once; the exactness tests use small integers, where every order gives the same
//! f32 sum.

use super::gemm::{InLaunch, Launch, Product};
use super::staging::{Staging, Stepping, Tile, double_buffered, zero};
use super::tiled::{Operands, sum_levels};
use super::*;
use crate::target::GemmTile;

impl Mapper<'_> {
    /// The tensor-core tile a product of `m x n` per batch with operands of `a` and `b` and a
    /// result of `out` runs with, if the target has tensor cores and a tile that fits.
    pub(super) fn mma_tile(
        &self,
        (m, n): (usize, usize),
        (a, b, out): (DType, DType, DType),
    ) -> Option<GemmTile> {
        let shape = self.gpu.tensor_core_shapes.contains(&(16, 8, 16));
        if !shape || a != b || !matches!(a, DType::BF16 | DType::F16) || out != DType::F32 {
            return None;
        }
        let fits = |t: &GemmTile| {
            let warps = (t.m / t.thread_m.max(1)) * (t.n / t.thread_n.max(1));
            t.k == 16
                && t.thread_m > 0
                && t.thread_n > 0
                && t.thread_m.is_multiple_of(16)
                && t.thread_n.is_multiple_of(16)
                && t.m.is_multiple_of(t.thread_m)
                && t.n.is_multiple_of(t.thread_n)
                && self.sums.leaf.is_multiple_of(16)
                && self.gpu.warp_size == 32
                && warps > 0
                && warps * 32 <= self.gpu.max_threads_per_block
                && 2 * (t.m + t.n) * 16 * 2 <= self.gpu.shared_memory_per_block
        };
        self.gpu
            .mma_tiles
            .iter()
            .copied()
            .filter(fits)
            .find(|t| 2 * m >= t.m && 2 * n >= t.n)
    }

    /// The product of `d` on the tensor cores by block tiles of `tile`, stored into `out`.
    pub(super) fn mma_product(
        &self,
        launch: Launch,
        d: &Product,
        ops: &Operands,
        tile: GemmTile,
    ) -> GpuKernel {
        let op_dtype = launch.inputs[0].1.dtype;
        let f32t = DType::F32;
        let GemmTile {
            m: bm,
            n: bn,
            thread_m: wm,
            thread_n: wn,
            ..
        } = tile;
        let (gm, gn) = (d.m.div_ceil(bm), d.n.div_ceil(bn));
        let warps_n = bn / wn;
        let threads = (bm / wm) * warps_n * 32;
        let (tm, tn) = (wm / 16, wn / 8);
        let mut r = Regs::default();
        let (batch, m0, n0, wm0, wn0) = (r.next(), r.next(), r.next(), r.next(), r.next());
        let (k0, e, staged) = (r.next(), r.next(), r.next());
        let (kn, next, cur) = (r.next(), r.next(), r.next());
        let tmp = (r.next(), r.next());
        let afr: Vec<[usize; 8]> = (0..tm).map(|_| std::array::from_fn(|_| r.next())).collect();
        let bfr: Vec<[usize; 8]> = (0..tn / 2)
            .map(|_| std::array::from_fn(|_| r.next()))
            .collect();
        let levels = sum_levels(d.k, self.sums);
        // Per level, per (i, j) tile, the 4 accumulator registers.
        let acc: Vec<Vec<[usize; 4]>> = (0..=levels)
            .map(|_| {
                (0..tm * tn)
                    .map(|_| std::array::from_fn(|_| r.next()))
                    .collect()
            })
            .collect();
        let reg = Sc::Reg;
        let lane = || sp(Special::Lane);
        let warp = || sp(Special::Warp);
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
                reg: wm0,
                value: Sc::times(Sc::quot(warp(), c(warps_n)), c(wm)),
            },
            Stmt::Let {
                reg: wn0,
                value: Sc::times(Sc::modulo(warp(), c(warps_n)), c(wn)),
            },
        ];
        for level in &acc {
            for t in level {
                for &x in t {
                    body.push(zero(x, f32t));
                }
            }
        }
        // Staging: tile element `(row or column, contraction)` lands at
        // `row * 16 + contraction` of its stage.
        let staging = Staging {
            e,
            threads,
            batch,
            k0: kn,
            stage: next,
            staged,
            k: d.k,
            dtype: f32t,
        };
        // B stored by rows (its columns contiguous) is staged by rows too, `k * bn + column`,
        // so `cp.async` can copy it, and its fragments load with `ldmatrix.trans`; B stored by
        // columns is staged `column * 16 + k`, as A is.
        let b_by_rows = !d.b_trans;
        let tiles = [
            Tile {
                row_var: 1,
                rows: d.m,
                base: m0,
                extent: bm,
                depth: 16,
                k_fastest: true,
                expr: ops.a,
                array: 0,
            },
            Tile {
                row_var: 2,
                rows: d.n,
                base: n0,
                extent: bn,
                depth: 16,
                k_fastest: !b_by_rows,
                expr: ops.b,
                array: 1,
            },
        ];
        let shared = vec![
            SharedArray {
                dtype: op_dtype,
                len: 2 * bm * 16,
                packed: true,
            },
            SharedArray {
                dtype: op_dtype,
                len: 2 * bn * 16,
                packed: true,
            },
        ];
        let mut step = Vec::new();
        for (i, regs) in afr.iter().enumerate() {
            // Matrix `lane / 8` of the 16 x 16 tile: rows `8 ((lane / 8) % 2)..`, columns
            // `8 (lane / 16)..`.
            let row = Sc::plus(
                Sc::plus(reg(wm0), c(16 * i)),
                Sc::plus(
                    Sc::modulo(lane(), c(8)),
                    Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
                ),
            );
            step.push(Stmt::LdMatrix {
                regs: *regs,
                array: 0,
                trans: false,
                row: Sc::plus(
                    Sc::plus(Sc::times(row, c(16)), Sc::times(reg(cur), c(bm * 16))),
                    Sc::times(Sc::quot(lane(), c(16)), c(8)),
                ),
            });
        }
        for (p, regs) in bfr.iter().enumerate() {
            // Matrix `lane / 8`: columns `8 (lane / 16)..` of this pair, contraction
            // `8 ((lane / 8) % 2)..`: registers 0-3 are the first 8 columns' B fragment,
            // 4-7 the next 8's. By rows, the lane names a contraction row's 8 columns and the
            // matrices load transposed.
            let stage = Sc::times(reg(cur), c(bn * 16));
            let row = if b_by_rows {
                let k = Sc::plus(
                    Sc::modulo(lane(), c(8)),
                    Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
                );
                let col = Sc::plus(
                    Sc::plus(reg(wn0), c(16 * p)),
                    Sc::times(Sc::quot(lane(), c(16)), c(8)),
                );
                Sc::plus(Sc::plus(Sc::times(k, c(bn)), col), stage)
            } else {
                let col = Sc::plus(
                    Sc::plus(reg(wn0), c(16 * p)),
                    Sc::plus(
                        Sc::modulo(lane(), c(8)),
                        Sc::times(Sc::quot(lane(), c(16)), c(8)),
                    ),
                );
                Sc::plus(
                    Sc::plus(Sc::times(col, c(16)), stage),
                    Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
                )
            };
            step.push(Stmt::LdMatrix {
                regs: *regs,
                array: 1,
                row,
                trans: b_by_rows,
            });
        }
        for (i, a_regs) in afr.iter().enumerate() {
            for j in 0..tn {
                let half = &bfr[j / 2][4 * (j % 2)..4 * (j % 2) + 4];
                let t = acc[0][i * tn + j];
                step.push(Stmt::Mma {
                    d: t,
                    a: *a_regs,
                    b: [half[0], half[1], half[2], half[3]],
                    c: t,
                    dtype: op_dtype,
                });
            }
        }
        let mut k_step = step;
        let mut period = self.sums.leaf;
        for l in 1..=levels {
            let mut flush = Vec::new();
            for (up, below) in acc[l].iter().zip(&acc[l - 1]) {
                for (&u, &b) in up.iter().zip(below) {
                    flush.push(Stmt::Combine {
                        acc: u,
                        value: b,
                        kind: Combiner::Add,
                        dtype: f32t,
                    });
                    flush.push(zero(b, f32t));
                }
            }
            k_step.push(Stmt::If {
                cond: Sc::eq(Sc::modulo(Sc::plus(reg(k0), c(16)), c(period)), c(0)),
                body: flush,
            });
            period *= self.sums.fanout.max(2);
        }
        let copies = staging.any_async(&tiles, &shared);
        let stepping = Stepping { k0, cur, step: 16 };
        let stage = staging.stage(&tiles, &shared);
        body.extend(double_buffered(&staging, stage, &stepping, k_step, copies));
        for (x, top) in acc[levels].iter().enumerate() {
            for l in (0..levels).rev() {
                for (q, &u) in top.iter().enumerate() {
                    body.push(Stmt::Combine {
                        acc: u,
                        value: acc[l][x][q],
                        kind: Combiner::Add,
                        dtype: f32t,
                    });
                }
            }
        }
        for i in 0..tm {
            for j in 0..tn {
                for (q, &v) in acc[levels][i * tn + j].iter().enumerate() {
                    // The accumulator fragment: row `g + 8 (q / 2)`, column `2t + q % 2`.
                    let row = Sc::plus(
                        Sc::plus(reg(m0), Sc::plus(reg(wm0), c(16 * i + 8 * (q / 2)))),
                        Sc::quot(lane(), c(4)),
                    );
                    let col = Sc::plus(
                        Sc::plus(reg(n0), Sc::plus(reg(wn0), c(8 * j + q % 2))),
                        Sc::times(Sc::modulo(lane(), c(4)), c(2)),
                    );
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
                        body: InLaunch::store(launch.epilogue, index, v, tmp),
                    });
                }
            }
        }
        GpuKernel {
            name: launch.name.to_string(),
            kind: MapKind::GemmMma,
            grid: d.batch * gm * gn,
            block: threads,
            warp: 32,
            inputs: launch.inputs,
            outputs: vec![launch.out],
            shared,
            regs: r.0,
            vars: launch.epilogue.map_or(4, |e| e.vars.max(4)),
            sums: self.sums,
            body,
        }
    }
}

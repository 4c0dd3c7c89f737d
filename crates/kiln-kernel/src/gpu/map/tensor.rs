//! A matrix product on the tensor cores ([`MapKind::GemmMma`]): bf16 or f16 operands, an f32
//! result. The block computes a `tile.m x tile.n` tile of the result, each warp a
//! `thread_m x thread_n` part of it as `mma.m16n8k16` tiles.
//!
//! # The pipeline
//!
//! The contraction runs in steps of `kt` (the tile's `k`, a multiple of 16; shorter for a
//! short contraction), each step's A (`tile.m x kt`) and B (`kt x tile.n`) staged into packed
//! shared arrays (each row of A and each column of B as `kt` consecutive 16-bit elements, zeros
//! past the operands' edges; B stored by rows is staged by rows, `k * tile.n + column`) in a
//! ring of `stages` ([`Mapper::mma_pipeline`]: `Gpu::mma_stages`, fewer when they do not fit
//! the block's shared memory). `staging.rs` runs the ring: `stages - 1` steps of `cp.async`
//! copies in flight while the block multiplies one (`cp.async.wait_group stages - 2` and one
//! barrier per step), where the staged rows are contiguous in the operand and a multiple of 8
//! long; operands staged through registers keep two stages. Each step is `kt / 16` k-steps:
//! each warp loads its fragments with `ldmatrix.x4` (A's 16 x 16 tiles; B's columns two
//! 8-column tiles at a time, `ldmatrix.x4.trans` for B staged by rows) and accumulates one
//! `mma` per 16 x 8 tile of its part; with more than one k-step per stage the fragments are
//! double buffered in registers, the next k-step's loaded before this one's `mma`s. Two stages
//! of 16 is the double buffering the products had before the ring (one k-step per stage, one
//! stage in flight). The printed kernel shows the choice: its shared arrays hold
//! `stages x tile.m x kt` and `stages x kt x tile.n` elements, and the loop waits with
//! `cp.async.wait stages - 2`.
//!
//! # The order of the sums, and their error bound
//!
//! Each `mma` adds 16 terms to its accumulator; the accumulators take chunks of `leaf` terms
//! and a tree of `fanout` above them exactly as `tiled.rs` describes (a chunk is `leaf / 16`
//! mma steps), so a term passes through at most `leaf + fanout · L + L` roundings plus those
//! inside one `mma` (whose order the PTX ISA leaves open); the flushes follow each k-step of
//! 16, whatever `kt` is, so the order of the sums does not depend on the pipeline. The
//! reference interpreter (`kiln-reference`) converts the operands to f32 exactly and
//! accumulates the products
//! exactly, rounding once; the tests compare with `kiln_reference::accuracy`'s bound,
//! `K(n, r) · ε · Σ|terms|` plus an ulp, where `ε` is the largest unit roundoff of the cone's
//! dtypes (2⁻⁸ for bf16 operands, 2⁻¹¹ for f16): looser than the f32 accumulation needs, and
//! order-independent, as it must be when the hardware's order inside an `mma` is unknown. The
//! products of 16-bit operands are exact in f32. The emulator adds one `mma`'s exact products
//! and rounds once; the exactness tests use small integers, where every order gives the same
//! f32 sum.

use super::gemm::{InLaunch, Launch, Product};
use super::staging::{Staging, Stepping, Tile, pipelined, zero};
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
            t.k >= 16
                && t.k.is_multiple_of(16)
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
                && 2 * (t.m + t.n) * 16 * 2 <= self.gpu.shared_limit()
        };
        self.gpu
            .mma_tiles
            .iter()
            .copied()
            .filter(fits)
            .find(|t| 2 * m >= t.m && 2 * n >= t.n)
    }

    /// The stages and the contraction per stage of a product of contraction `k` by tiles of
    /// `t`: `t.k` (at most `k` rounded up to 16) and `Gpu::mma_stages` (at most one more than
    /// the steps there are), fewer stages while they do not fit the block's shared memory,
    /// then a shorter stage (by 16) with as many as fit again. Two stages of 16 always fit a
    /// tile [`Mapper::mma_tile`] chose.
    pub(super) fn mma_pipeline(&self, t: &GemmTile, k: usize) -> (usize, usize) {
        let longest = t.k.min(k.next_multiple_of(16)).max(16);
        let bytes = |stages: usize, kt: usize| stages * (t.m + t.n) * kt * 2;
        for kt in (16..=longest).rev().step_by(16) {
            let most = self.gpu.mma_stages.min(k.div_ceil(kt) + 1).max(2);
            if let Some(s) = (2..=most)
                .rev()
                .find(|&s| bytes(s, kt) <= self.gpu.shared_limit())
            {
                return (s, kt);
            }
        }
        (2, 16)
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
        let (stages, kt) = self.mma_pipeline(&tile, d.k);
        let ksteps = kt / 16;
        let mut r = Regs::default();
        let (batch, m0, n0, wm0, wn0) = (r.next(), r.next(), r.next(), r.next(), r.next());
        let (k0, e, staged) = (r.next(), r.next(), r.next());
        let (kn, next, cur) = (r.next(), r.next(), r.next());
        let tmp = (r.next(), r.next());
        // A warp's fragments of one k-step: A's 16 x 16 tiles, B's 16 x 16 column pairs.
        let frags = |r: &mut Regs| -> (Vec<[usize; 8]>, Vec<[usize; 8]>) {
            (
                (0..tm).map(|_| std::array::from_fn(|_| r.next())).collect(),
                (0..tn / 2)
                    .map(|_| std::array::from_fn(|_| r.next()))
                    .collect(),
            )
        };
        let first = frags(&mut r);
        let levels = sum_levels(d.k, self.sums);
        // Per level, per (i, j) tile, the 4 accumulator registers.
        let acc: Vec<Vec<[usize; 4]>> = (0..=levels)
            .map(|_| {
                (0..tm * tn)
                    .map(|_| std::array::from_fn(|_| r.next()))
                    .collect()
            })
            .collect();
        // A second set of fragments when a stage holds more than one k-step: the next
        // k-step's load while this one's `mma`s run.
        let mut sets = vec![first];
        if ksteps > 1 {
            sets.push(frags(&mut r));
        }
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
        // `row * kt + contraction` of its stage.
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
        // columns is staged `column * kt + k`, as A is.
        let b_by_rows = !d.b_trans;
        let tiles = [
            Tile {
                row_var: 1,
                rows: d.m,
                base: m0,
                extent: bm,
                depth: kt,
                k_fastest: true,
                expr: ops.a,
                array: 0,
            },
            Tile {
                row_var: 2,
                rows: d.n,
                base: n0,
                extent: bn,
                depth: kt,
                k_fastest: !b_by_rows,
                expr: ops.b,
                array: 1,
            },
        ];
        // Swizzled (`Gpu::mma_swizzle`) by the rows an `ldmatrix` matrix reads: A's (and B's
        // staged by columns) `kt` long, B's staged by rows `bn` long.
        let swizzle = |row: usize| self.gpu.mma_swizzle.then(|| swizzle_shift(row));
        let mut shared = vec![
            SharedArray {
                dtype: op_dtype,
                len: bm * kt,
                packed: true,
                swizzle: swizzle(kt),
            },
            SharedArray {
                dtype: op_dtype,
                len: bn * kt,
                packed: true,
                swizzle: swizzle(if b_by_rows { bn } else { kt }),
            },
        ];
        // Operands staged through registers only gain nothing from more stages in flight
        // (their stores are done when the step's multiply starts): they keep two.
        let copies = staging.any_async(&tiles, &shared);
        let stages = if copies { stages } else { 2 };
        for a in &mut shared {
            a.len *= stages;
        }
        let at = Fragments {
            bm,
            bn,
            kt,
            b_by_rows,
            wm0,
            wn0,
            cur,
        };
        let mut k_step = Vec::new();
        for j in 0..ksteps {
            if j == 0 {
                k_step.extend(fragment_loads(&sets[0], &at, 0));
            }
            if j + 1 < ksteps {
                let set = &sets[(j + 1) % 2];
                k_step.extend(fragment_loads(set, &at, j + 1));
            }
            let (afr, bfr) = &sets[j % 2];
            for (i, a_regs) in afr.iter().enumerate() {
                for jj in 0..tn {
                    let half = &bfr[jj / 2][4 * (jj % 2)..4 * (jj % 2) + 4];
                    let t = acc[0][i * tn + jj];
                    k_step.push(Stmt::Mma {
                        d: t,
                        a: *a_regs,
                        b: [half[0], half[1], half[2], half[3]],
                        c: t,
                        dtype: op_dtype,
                    });
                }
            }
            // The sum tree's flushes after each k-step of 16 (`leaf` is a multiple of 16).
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
                    cond: Sc::eq(
                        Sc::modulo(Sc::plus(reg(k0), c(16 * j + 16)), c(period)),
                        c(0),
                    ),
                    body: flush,
                });
                period *= self.sums.fanout.max(2);
            }
        }
        let stepping = Stepping {
            k0,
            cur,
            step: kt,
            stages,
        };
        let stage = staging.stage(&tiles, &shared);
        body.extend(pipelined(&staging, stage, &stepping, k_step, copies));
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

/// The [`SharedArray::swizzle`] of a staged tile whose rows (8 of which one `ldmatrix` matrix
/// reads) are `row` 16-bit elements long: the log2 of a row's 16-byte chunks, rounded up to a
/// power of two and at least 8 of them.
fn swizzle_shift(row: usize) -> u32 {
    (row / 8).next_power_of_two().max(8).trailing_zeros()
}

/// Where a warp's fragments lie in the stage being multiplied.
struct Fragments {
    /// The block tile's rows and columns.
    bm: usize,
    bn: usize,
    /// The contraction per stage.
    kt: usize,
    /// B staged by rows (`k * bn + column`) rather than by columns (`column * kt + k`).
    b_by_rows: bool,
    /// The registers of the warp's first row and column in the block tile, and of the stage.
    wm0: usize,
    wn0: usize,
    cur: usize,
}

/// The `ldmatrix` loads of k-step `j` (contraction `16 j..16 j + 16` of the stage) into the
/// fragment registers `(a, b)`.
fn fragment_loads(
    (afr, bfr): &(Vec<[usize; 8]>, Vec<[usize; 8]>),
    f: &Fragments,
    j: usize,
) -> Vec<Stmt> {
    let reg = Sc::Reg;
    let lane = || sp(Special::Lane);
    // Contraction index `x` of the stage plus the k-step's offset.
    let kof = |x: Sc| if j == 0 { x } else { Sc::plus(x, c(16 * j)) };
    let mut out = Vec::new();
    for (i, regs) in afr.iter().enumerate() {
        // Matrix `lane / 8` of the 16 x 16 tile: rows `8 ((lane / 8) % 2)..`, columns
        // `8 (lane / 16)..`.
        let row = Sc::plus(
            Sc::plus(reg(f.wm0), c(16 * i)),
            Sc::plus(
                Sc::modulo(lane(), c(8)),
                Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
            ),
        );
        out.push(Stmt::LdMatrix {
            regs: *regs,
            array: 0,
            trans: false,
            row: kof(Sc::plus(
                Sc::plus(
                    Sc::times(row, c(f.kt)),
                    Sc::times(reg(f.cur), c(f.bm * f.kt)),
                ),
                Sc::times(Sc::quot(lane(), c(16)), c(8)),
            )),
        });
    }
    for (p, regs) in bfr.iter().enumerate() {
        // Matrix `lane / 8`: columns `8 (lane / 16)..` of this pair, contraction
        // `8 ((lane / 8) % 2)..`: registers 0-3 are the first 8 columns' B fragment,
        // 4-7 the next 8's. By rows, the lane names a contraction row's 8 columns and the
        // matrices load transposed.
        let stage = Sc::times(reg(f.cur), c(f.bn * f.kt));
        let row = if f.b_by_rows {
            let k = kof(Sc::plus(
                Sc::modulo(lane(), c(8)),
                Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
            ));
            let col = Sc::plus(
                Sc::plus(reg(f.wn0), c(16 * p)),
                Sc::times(Sc::quot(lane(), c(16)), c(8)),
            );
            Sc::plus(Sc::plus(Sc::times(k, c(f.bn)), col), stage)
        } else {
            let col = Sc::plus(
                Sc::plus(reg(f.wn0), c(16 * p)),
                Sc::plus(
                    Sc::modulo(lane(), c(8)),
                    Sc::times(Sc::quot(lane(), c(16)), c(8)),
                ),
            );
            kof(Sc::plus(
                Sc::plus(Sc::times(col, c(f.kt)), stage),
                Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
            ))
        };
        out.push(Stmt::LdMatrix {
            regs: *regs,
            array: 1,
            row,
            trans: f.b_by_rows,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pipeline of a product of contraction `k` by a 128 x 128 tensor-core tile with
    /// `stages` stages of `kt` asked for and `shared` bytes per block.
    fn pipeline(shared: usize, stages: usize, kt: usize, k: usize) -> (usize, usize) {
        let mut gpu = Gpu::h200();
        // As if kernels could declare all of it (dynamic shared memory).
        gpu.shared_memory_per_block = shared;
        gpu.static_shared_bytes = shared;
        gpu.mma_stages = stages;
        let tile = GemmTile {
            m: 128,
            n: 128,
            k: kt,
            thread_m: 64,
            thread_n: 32,
        };
        let m = Mapper {
            gpu: &gpu,
            sums: TargetInfo::h200().sums,
        };
        m.mma_pipeline(&tile, k)
    }

    #[test]
    fn the_pipeline_is_cut_back_to_fit_shared_memory_and_short_contractions() {
        let (big, static_) = (227 << 10, 48 << 10);
        // 3 stages of 32 (48 KiB at 128 x 128, which the 48 KiB a block gets without opting
        // in still holds).
        assert_eq!(pipeline(big, 3, 32, 8192), (3, 32));
        assert_eq!(pipeline(static_, 3, 32, 8192), (3, 32));
        assert_eq!(pipeline(big, 4, 64, 8192), (4, 64));
        // Fewer stages first, then shorter ones (by 16), with as many stages as fit again.
        assert_eq!(pipeline(static_, 4, 32, 8192), (3, 32));
        assert_eq!(pipeline(static_, 4, 64, 8192), (2, 48));
        assert_eq!(pipeline(24 << 10, 3, 32, 8192), (3, 16));
        // A short contraction: a stage no longer than it (rounded up to 16), no more stages
        // than it has steps and one.
        assert_eq!(pipeline(big, 4, 64, 40), (2, 48));
        assert_eq!(pipeline(big, 4, 32, 40), (3, 32));
        assert_eq!(pipeline(big, 3, 32, 1), (2, 16));
        // Fewer than two stages asked for: still two.
        assert_eq!(pipeline(big, 1, 32, 8192), (2, 32));
    }

    /// The bank groups (16-byte chunks mod 8) of the 8 rows of every `ldmatrix` matrix of a
    /// stage of `rows x len` (rows `len` 16-bit elements long), by the array's layout.
    fn ldmatrix_groups(a: &SharedArray, len: usize) -> Vec<Vec<usize>> {
        let mut out = Vec::new();
        for first in (0..a.len / len).step_by(8) {
            for col in (0..len).step_by(8) {
                out.push(
                    (first..first + 8)
                        .map(|r| a.physical(r * len + col, 8) / 8 % 8)
                        .collect(),
                );
            }
        }
        out
    }

    #[test]
    fn swizzled_tiles_meet_no_bank_conflicts_in_ldmatrix() {
        assert!(Gpu::h200().mma_swizzle);
        // Rows of A (`kt` long) and of B staged by rows (`bn` long), as `mma_product` swizzles
        // them.
        for len in [16usize, 32, 48, 64, 128, 256] {
            let s = swizzle_shift(len);
            let plain = SharedArray {
                dtype: DType::BF16,
                len: 128 * len,
                packed: true,
                swizzle: None,
            };
            let swizzled = SharedArray {
                swizzle: Some(s),
                ..plain.clone()
            };
            // A permutation of the array's elements, moving whole chunks.
            let mut seen = vec![false; swizzled.len];
            for i in 0..swizzled.len {
                let p = swizzled.physical(i, 8);
                assert_eq!(p % 8, i % 8);
                assert!(
                    !std::mem::replace(&mut seen[p], true),
                    "{len}: {i} -> {p} twice"
                );
            }
            let distinct = |g: &Vec<usize>| {
                let mut g = g.clone();
                g.sort();
                g.dedup();
                g.len()
            };
            let worst = |a: &SharedArray| ldmatrix_groups(a, len).iter().map(distinct).min();
            // Rows a power of two of chunks apart: 8 distinct groups swizzled; unswizzled,
            // rows of 2 chunks (32 bytes) share by 2, rows of 8 or more all share one.
            if len.is_power_of_two() {
                assert_eq!(worst(&swizzled), Some(8), "rows of {len}");
                assert!(worst(&plain) < Some(8), "rows of {len}");
            } else {
                assert!(worst(&swizzled) >= worst(&plain), "rows of {len}");
            }
        }
    }
}

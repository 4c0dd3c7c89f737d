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
//!
//! # TF32
//!
//! With [`MatmulPrecision::Tf32`] in the options and a GPU with TF32 tensor cores
//! (`Gpu::tf32`), an f32 x f32 -> f32 product (a convolution too: it runs as one) runs here,
//! on `mma.m16n8k8.row.col.f32.tf32.tf32.f32`: the same tiles, ring, `cp.async` copies and
//! swizzle, with f32 elements in the shared arrays (4 to a 16-byte chunk, so a stage takes
//! twice the bytes of a 16-bit one and the pipeline is cut back to fit accordingly; an `mma`
//! contracts 8, so a stage is a multiple of 8 long and the sum tree's flushes follow each
//! k-step of 8). A's fragments still load with `ldmatrix.x4`: an 8 x 8 matrix of 16-bit
//! elements is an 8 x 4 one of f32, and the four of a 16 x 8 tile are exactly the TF32 A
//! fragment; B's staged by columns load the same way (matrices over contraction 0-3 and 4-7
//! of each 8-column tile are its B fragment). `ldmatrix.trans` moves 16-bit elements, so B
//! staged by rows (B stored by rows, the usual `x @ w`, still copied with `cp.async`) loads
//! its fragments with one shared load per element, two per 8-column tile and k-step.
//!
//! The operands are rounded to TF32 (`cvt.rna.tf32.f32`, [`Stmt::RoundTf32`]: to nearest,
//! ties away from zero) when their fragments go from shared memory to registers, not when
//! they are staged: `cp.async` copies global memory into shared memory without passing
//! through registers, where nothing could round the elements, so rounding while staging
//! would give up the asynchronous copies; a fragment register is rounded once per load and
//! serves every `mma` of its row or column of the warp's tile. Every operand element reaches
//! an `mma` through exactly one such rounding, so the result is the product of the rounded
//! operands, however they were staged.
//!
//! The bound: the product of two TF32 values (11-bit significands) is exact in f32, so the
//! result is the f32 sum of the exact products of the rounded operands `ã`, `b̃`, in the order
//! above: within `kiln_reference::accuracy`'s bound for f32 of the same product computed by
//! the reference on the rounded operands, `K(n, r) · 2⁻²⁴ · Σ|ã·b̃|` plus an ulp. Against the
//! exact f32 product each operand adds a relative error of at most 2⁻¹¹, so
//! `|result - exact| ≤ (2⁻¹⁰ + 2⁻²² + K(n, r) · 2⁻²⁴ · (1 + 2⁻¹¹)²) · Σ|a·b|` plus an ulp.

use super::gemm::{Launch, Product, tile_origin};
use super::skip::{choose, maybe_around};
use super::staging::{Staging, Stepping, Tile, pipelined, zero};
use super::tiled::{Operands, flushes, sum_levels};
use super::zero_steps::{Block, checked_range, replayed};
use super::*;
use crate::target::GemmTile;

impl Mapper<'_> {
    /// The tensor-core tile a product of `m x n` per batch with operands of `a` and `b` and a
    /// result of `out` runs with, and its operands' type, if the target has tensor cores for
    /// them and a tile that fits: bf16 or f16 operands, or f32 ones as TF32 when the options
    /// allow it ([`MatmulPrecision::Tf32`]) and the GPU has TF32 tensor cores, an f32 result.
    pub(super) fn mma_tile(
        &self,
        (m, n): (usize, usize),
        (a, b, out): (DType, DType, DType),
        leaves_out: Option<&dyn Fn(&GemmTile) -> bool>,
    ) -> Option<(GemmTile, MmaOperand)> {
        if a != b || out != DType::F32 {
            return None;
        }
        let operand = match a {
            DType::BF16 | DType::F16 if self.gpu.tensor_core_shapes.contains(&(16, 8, 16)) => {
                MmaOperand::of_half(a)?
            }
            DType::F32 if self.precision == MatmulPrecision::Tf32 && self.gpu.tf32 => {
                MmaOperand::Tf32
            }
            _ => return None,
        };
        let (step, bytes) = (operand.k(), operand.dtype().bytes());
        let fits = |t: &GemmTile| {
            let warps = (t.m / t.thread_m.max(1)) * (t.n / t.thread_n.max(1));
            t.k >= step
                && t.k.is_multiple_of(step)
                && t.thread_m > 0
                && t.thread_n > 0
                && t.thread_m.is_multiple_of(16)
                && t.thread_n.is_multiple_of(16)
                && t.m.is_multiple_of(t.thread_m)
                && t.n.is_multiple_of(t.thread_n)
                && self.sums.leaf.is_multiple_of(step)
                && self.gpu.warp_size == 32
                && warps > 0
                && warps * 32 <= self.gpu.max_threads_per_block
                && 2 * (t.m + t.n) * step * bytes <= self.gpu.tile_limit()
        };
        let tiles = self.gpu.mma_tiles.iter().copied().filter(fits);
        choose(tiles, (m, n), leaves_out).map(|t| (t, operand))
    }

    /// The stages and the contraction per stage of a product of contraction `k` by tiles of
    /// `t` with operands of `operand`: `t.k` (at most `k` rounded up to a multiple of the
    /// `mma`'s contraction, 16 or 8 for TF32) and `Gpu::mma_stages` (at most one more than the
    /// steps there are), fewer stages while they do not fit `Gpu::tile_limit`, then a
    /// shorter stage (by one `mma` contraction) with as many as fit again. Two stages of one
    /// `mma` contraction always fit a tile [`Mapper::mma_tile`] chose.
    pub(super) fn mma_pipeline(
        &self,
        t: &GemmTile,
        k: usize,
        operand: MmaOperand,
    ) -> (usize, usize) {
        let step = operand.k();
        let longest = t.k.min(k.next_multiple_of(step)).max(step);
        let bytes = |stages: usize, kt: usize| stages * (t.m + t.n) * kt * operand.dtype().bytes();
        for kt in (step..=longest).rev().step_by(step) {
            let most = self.gpu.mma_stages.min(k.div_ceil(kt) + 1).max(2);
            if let Some(s) = (2..=most)
                .rev()
                .find(|&s| bytes(s, kt) <= self.gpu.tile_limit())
            {
                return (s, kt);
            }
        }
        (2, step)
    }

    /// The product of `d` on the tensor cores by block tiles of `tile`, stored into `out`.
    pub(super) fn mma_product(
        &self,
        launch: Launch,
        d: &Product,
        ops: &Operands,
        (tile, operand): (GemmTile, MmaOperand),
    ) -> GpuKernel {
        let op_dtype = operand.dtype();
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
        let (stages, kt) = self.mma_pipeline(&tile, d.k, operand);
        let kstep = operand.k();
        let ksteps = kt / kstep;
        let mut r = Regs::default();
        let [batch, m0, n0, wm0, wn0] = r.array();
        let [k0, e, staged] = r.array();
        let [kn, next, cur] = r.array();
        let tmp = (r.next(), r.next());
        // A warp's fragments of one k-step: A's 16 x k tiles, B's k x 16 column pairs (two
        // 8-column tiles' fragments each).
        let frags = |r: &mut Regs| -> Frags {
            (
                (0..tm)
                    .map(|_| (0..operand.a_regs()).map(|_| r.next()).collect())
                    .collect(),
                (0..tn / 2)
                    .map(|_| (0..2 * operand.b_regs()).map(|_| r.next()).collect())
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
        // The same accumulators as one list a level, for the sum tree's flushes.
        let flat: Vec<Vec<usize>> = acc.iter().map(|level| level.concat()).collect();
        // A second set of fragments when a stage holds more than one k-step: the next
        // k-step's load while this one's `mma`s run.
        let mut sets = vec![first];
        if ksteps > 1 {
            sets.push(frags(&mut r));
        }
        let reg = Sc::Reg;
        let lane = || sp(Special::Lane);
        let warp = || sp(Special::Warp);
        let mut body = tile_origin((batch, m0, n0), (gm, gn), (bm, bn));
        body.extend([
            Stmt::Let {
                reg: wm0,
                value: Sc::times(Sc::quot(warp(), c(warps_n)), c(wm)),
            },
            Stmt::Let {
                reg: wn0,
                value: Sc::times(Sc::modulo(warp(), c(warps_n)), c(wn)),
            },
        ]);
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
        // so `cp.async` can copy it, and its fragments load with `ldmatrix.trans` (16-bit
        // operands) or one shared load per element (TF32: `.trans` moves 16-bit elements); B
        // stored by columns is staged `column * kt + k`, as A is.
        let b_by_rows = !d.b_trans;
        let tiles = [
            Tile {
                row_var: 1,
                rows: d.m,
                base: m0,
                extent: bm,
                depth: kt,
                k_fastest: true,
                panel: 0,
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
                panel: 0,
                expr: ops.b,
                array: 1,
            },
        ];
        // Swizzled (`Gpu::mma_swizzle`) by the rows an `ldmatrix` matrix reads: A's (and B's
        // staged by columns) `kt` long, B's staged by rows `bn` long; 16-bit elements packed,
        // 8 a 16-byte chunk, TF32's f32 elements 4 a chunk.
        let packed = operand != MmaOperand::Tf32;
        let chunk = 16 / op_dtype.bytes();
        let swizzle = |row: usize| self.gpu.mma_swizzle.then(|| swizzle_shift(row / chunk));
        let mut shared = vec![
            SharedArray {
                dtype: op_dtype,
                len: bm * kt,
                packed,
                swizzle: swizzle(kt),
            },
            SharedArray {
                dtype: op_dtype,
                len: bn * kt,
                packed,
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
        // The steps a causal mask makes zero, left out where checked (`zero_steps.rs`).
        let zero = d.zero_steps(ops);
        let block = Block {
            origin: (batch, m0, n0),
            tile: (bm, bn),
            step: kt,
            threads,
            warp: 32,
        };
        let (check, range) = checked_range(zero.as_ref(), &mut r, &block, 0);
        let at = Fragments {
            bm,
            bn,
            kt,
            b_by_rows,
            wm0,
            wn0,
            cur,
            operand,
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
            let nb = operand.b_regs();
            for (i, a_regs) in afr.iter().enumerate() {
                for jj in 0..tn {
                    let t = acc[0][i * tn + jj];
                    k_step.push(Stmt::Mma {
                        d: t,
                        a: a_regs.clone(),
                        b: bfr[jj / 2][nb * (jj % 2)..nb * (jj % 2) + nb].to_vec(),
                        c: t,
                        shape: operand.shape(),
                        operand,
                    });
                }
            }
            // The sum tree's flushes after each k-step (`leaf` is a multiple of its length).
            let done = Sc::plus(reg(k0), c(kstep * (j + 1)));
            k_step.extend(flushes(&flat, &done, self.sums, f32t, &[]));
        }
        let stepping = Stepping {
            k0,
            cur,
            step: kt,
            stages,
            lag: 0,
            range,
        };
        let stage = staging.stage(&tiles, &shared);
        let mut steps = check;
        steps.extend(pipelined(&staging, stage, &stepping, k_step, copies));
        let tree = (self.sums, f32t);
        steps.extend(replayed(zero.as_ref(), &flat, (range, kt), tree, &[]));
        let origin = (reg(m0), reg(n0));
        body.extend(maybe_around(d.skip().as_ref(), origin, (bm, bn), steps));
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
                    body.push(launch.store_element(d, ops.planes, batch, (row, col), v, tmp));
                }
            }
        }
        launch.kernel(
            MapKind::GemmMma,
            (d.batch * gm * gn, threads, 32),
            shared,
            r.0,
            self.sums,
            body,
        )
    }
}

/// The [`SharedArray::swizzle`] of a staged tile whose rows (8 of which one `ldmatrix` matrix
/// reads) are `chunks` 16-byte chunks long: their log2, rounded up to a power of two and at
/// least 8 of them.
pub(super) fn swizzle_shift(chunks: usize) -> u32 {
    chunks.next_power_of_two().max(8).trailing_zeros()
}

/// A warp's fragment registers of one k-step: per 16-row tile of A its A fragment, per pair
/// of 8-column tiles of B their two B fragments, one after the other.
type Frags = (Vec<Vec<usize>>, Vec<Vec<usize>>);

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
    /// The operands' type.
    operand: MmaOperand,
}

/// The loads of k-step `j` (contraction `k j..k j + k` of the stage, `k` the `mma`'s) into
/// the fragment registers `(a, b)`: `ldmatrix.x4` for A, and for B staged by columns or
/// 16-bit B staged by rows (transposed); one shared load per element for TF32 B staged by
/// rows. TF32 fragments are then rounded to TF32 in their registers.
///
/// An `ldmatrix` matrix row is 16 bytes: 8 16-bit elements or 4 f32 ones, so the second half
/// of an `mma`'s contraction starts `k / 2` elements on (8, or 4 for TF32), and the same
/// lane addresses serve both (see [`Stmt::LdMatrix`]).
fn fragment_loads((afr, bfr): &Frags, f: &Fragments, j: usize) -> Vec<Stmt> {
    let reg = Sc::Reg;
    let lane = || sp(Special::Lane);
    let kstep = f.operand.k();
    let half = kstep / 2;
    // Contraction index `x` of the stage plus the k-step's offset.
    let kof = |x: Sc| if j == 0 { x } else { Sc::plus(x, c(kstep * j)) };
    let mut out = Vec::new();
    for (i, regs) in afr.iter().enumerate() {
        // Matrix `lane / 8` of the 16 x k tile: rows `8 ((lane / 8) % 2)..`, columns
        // `k/2 (lane / 16)..`.
        let row = Sc::plus(
            Sc::plus(reg(f.wm0), c(16 * i)),
            Sc::plus(
                Sc::modulo(lane(), c(8)),
                Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
            ),
        );
        out.push(Stmt::LdMatrix {
            regs: regs.clone(),
            array: 0,
            trans: false,
            row: kof(Sc::plus(
                Sc::plus(
                    Sc::times(row, c(f.kt)),
                    Sc::times(reg(f.cur), c(f.bm * f.kt)),
                ),
                Sc::times(Sc::quot(lane(), c(16)), c(half)),
            )),
        });
    }
    let stage = || Sc::times(reg(f.cur), c(f.bn * f.kt));
    for (p, regs) in bfr.iter().enumerate() {
        if f.b_by_rows && f.operand == MmaOperand::Tf32 {
            // B's fragment of column tile `2p + q`: `b[i]` at contraction `t + 4 i`, column
            // `g` (`g = lane / 4`, `t = lane % 4`).
            let nb = f.operand.b_regs();
            for (x, &r) in regs.iter().enumerate() {
                let (q, i) = (x / nb, x % nb);
                let k = kof(Sc::plus(Sc::modulo(lane(), c(4)), c(4 * i)));
                let col = Sc::plus(
                    Sc::plus(reg(f.wn0), c(16 * p + 8 * q)),
                    Sc::quot(lane(), c(4)),
                );
                out.push(Stmt::SharedLoad {
                    reg: r,
                    array: 1,
                    index: Sc::plus(Sc::plus(Sc::times(k, c(f.bn)), col), stage()),
                });
            }
            continue;
        }
        // Matrix `lane / 8`: columns `8 (lane / 16)..` of this pair, contraction
        // `k/2 ((lane / 8) % 2)..`: the first half of the registers is the first 8 columns'
        // B fragment, the second half the next 8's. By rows, the lane names a contraction
        // row's 8 columns and the matrices load transposed.
        let row = if f.b_by_rows {
            let k = kof(Sc::plus(
                Sc::modulo(lane(), c(8)),
                Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(8)),
            ));
            let col = Sc::plus(
                Sc::plus(reg(f.wn0), c(16 * p)),
                Sc::times(Sc::quot(lane(), c(16)), c(8)),
            );
            Sc::plus(Sc::plus(Sc::times(k, c(f.bn)), col), stage())
        } else {
            let col = Sc::plus(
                Sc::plus(reg(f.wn0), c(16 * p)),
                Sc::plus(
                    Sc::modulo(lane(), c(8)),
                    Sc::times(Sc::quot(lane(), c(16)), c(8)),
                ),
            );
            kof(Sc::plus(
                Sc::plus(Sc::times(col, c(f.kt)), stage()),
                Sc::times(Sc::modulo(Sc::quot(lane(), c(8)), c(2)), c(half)),
            ))
        };
        out.push(Stmt::LdMatrix {
            regs: regs.clone(),
            array: 1,
            row,
            trans: f.b_by_rows,
        });
    }
    if f.operand == MmaOperand::Tf32 {
        for &r in afr.iter().chain(bfr).flatten() {
            out.push(Stmt::RoundTf32 { reg: r });
        }
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
            precision: MatmulPrecision::Highest,
            float_atomics: false,
        };
        m.mma_pipeline(&tile, k, MmaOperand::Bf16)
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

    #[test]
    fn rings_take_dynamic_shared_memory_only_where_the_target_allows_it() {
        let mut gpu = Gpu::h200();
        let tile = gpu.mma_tiles[0];
        let ring = |gpu: &Gpu| {
            let m = Mapper {
                gpu,
                sums: TargetInfo::h200().sums,
                precision: MatmulPrecision::Highest,
                float_atomics: false,
            };
            m.mma_pipeline(&tile, 8192, MmaOperand::Bf16)
        };
        // The default: within the 48 KiB a kernel declares statically.
        assert_eq!(gpu.tile_limit(), 48 << 10);
        assert_eq!(ring(&gpu), (2, 64));
        // Allowed all an H200 block may opt into: the 4 stages of 64 asked for (96 KiB).
        gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
        assert_eq!(ring(&gpu), (4, 64));
        // Allowed 64 KiB: still 2 stages of 64 (3 take 72 KiB).
        gpu.tile_dynamic_bytes = 64 << 10;
        assert_eq!(ring(&gpu), (2, 64));
        // A device that opts into 80 KiB at most: 3 stages, whatever the allowance.
        (gpu.tile_dynamic_bytes, gpu.dynamic_shared_bytes) = (227 << 10, 80 << 10);
        assert_eq!(ring(&gpu), (3, 64));
        // A device whose blocks get less than 48 KiB keeps to it when nothing is allowed.
        (gpu.tile_dynamic_bytes, gpu.shared_memory_per_block) = (0, 24 << 10);
        assert_eq!(gpu.tile_limit(), 24 << 10);
    }

    #[test]
    fn f32_products_take_the_tensor_cores_only_as_tf32_where_allowed() {
        let f32s = (DType::F32, DType::F32, DType::F32);
        let mut gpu = Gpu::h200();
        let mapper = |gpu: &Gpu, precision| {
            let m = Mapper {
                gpu,
                sums: TargetInfo::h200().sums,
                precision,
                float_atomics: false,
            };
            m.mma_tile((256, 256), f32s, None)
                .map(|(t, op)| (t.m, t.n, op))
        };
        assert_eq!(mapper(&gpu, MatmulPrecision::Highest), None);
        assert_eq!(
            mapper(&gpu, MatmulPrecision::Tf32),
            Some((128, 64, MmaOperand::Tf32))
        );
        gpu.tf32 = false;
        assert_eq!(mapper(&gpu, MatmulPrecision::Tf32), None);
        // 16-bit operands take them whatever the precision.
        let m = Mapper {
            gpu: &gpu,
            sums: TargetInfo::h200().sums,
            precision: MatmulPrecision::Highest,
            float_atomics: false,
        };
        let bf16 = m.mma_tile((256, 256), (DType::BF16, DType::BF16, DType::F32), None);
        assert_eq!(bf16.map(|t| t.1), Some(MmaOperand::Bf16));
    }

    #[test]
    fn tf32_stages_hold_f32_elements_in_steps_of_eight() {
        let mut gpu = Gpu::h200();
        gpu.shared_memory_per_block = 48 << 10;
        let m = Mapper {
            gpu: &gpu,
            sums: TargetInfo::h200().sums,
            precision: MatmulPrecision::Tf32,
            float_atomics: false,
        };
        let tile = gpu.mma_tiles[0];
        assert_eq!((tile.m, tile.n, tile.k), (128, 64, 64));
        // f32 tiles take twice the bytes of bf16 ones: 2 stages of 32 fill the 48 KiB where
        // bf16 runs 2 of 64.
        assert_eq!(m.mma_pipeline(&tile, 8192, MmaOperand::Bf16), (2, 64));
        assert_eq!(m.mma_pipeline(&tile, 8192, MmaOperand::Tf32), (2, 32));
        // A short contraction: rounded up to 8, not 16.
        assert_eq!(m.mma_pipeline(&tile, 5, MmaOperand::Tf32), (2, 8));
        assert_eq!(m.mma_pipeline(&tile, 20, MmaOperand::Tf32), (2, 24));
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
            let s = swizzle_shift(len / 8);
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

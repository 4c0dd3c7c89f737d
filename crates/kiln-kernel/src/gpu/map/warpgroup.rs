//! A matrix product on sm_90a's warpgroup tensor cores ([`MapKind::GemmMma`] with
//! [`Stmt::Wgmma`]): bf16 or f16 operands, an f32 result, on a GPU with warpgroup products
//! (`Gpu::wgmma`) and a tile for them (`Gpu::wgmma_tiles`; none by default, so the `mma.sync`
//! mapping of `tensor.rs` runs until the GPU pack's sweep measures them).
//!
//! # The tiles and the ring
//!
//! A block of `tile.m / 64` warpgroups (one or two, 128 threads each) computes a `tile.m x
//! tile.n` tile of the result, warpgroup `w` rows `64w..64w + 64` of it with `wgmma.m64nNk16`
//! (`N = tile.n`, up to 256). The contraction runs in steps of 64 through the same ring of
//! stages as the `mma.sync` products (`staging.rs`: `cp.async` copies where the operand's rows
//! are contiguous, registers otherwise, zeros past the edges; `Gpu::mma_stages` stages, fewer
//! where they do not fit `Gpu::tile_limit`). An operand stored with its contraction
//! contiguous (A by rows, B by columns) is staged K-major, its row `r` as 64 consecutive
//! elements, `row * 64 + k`; one stored with its rows contiguous (A transposed, B by rows,
//! the usual `x @ w`) MN-major, in panels of 64 rows, each contraction index's 64 rows
//! consecutive, `(row / 64) * 4096 + k * 64 + row % 64` (B only when the tile's columns are
//! whole panels; else K-major through registers), so that `cp.async` copies both.
//!
//! # Why that is the layout the descriptors describe
//!
//! A row of 64 16-bit elements is 128 bytes, one row of a 128-byte swizzle atom, so each
//! K-major stage is `rows / 8` atoms of 8 rows, one after the other: exactly the K-major
//! layout of [`crate::gpu::desc::TileLayout`] with the 128-byte swizzle (SBO 1024 bytes
//! between row groups). An MN-major panel's contraction index is 128 bytes too, so a panel is
//! 8 atoms of 8 contraction indices one after the other (SBO 1024 bytes), and the panels
//! follow each other (LBO 8192 bytes): the MN-major layout of the same type (`imm-trans` 1).
//! The swizzle XORs a row's 16-byte chunk index with its row within the atom, `chunk ^ (row
//! % 8)`; the staged arrays are swizzled by chunks `>> 3` ([`SharedArray::swizzle`]), which
//! moves logical chunk `c = 8 row + chunk` to `c ^ ((c >> 3) & 7) = 8 row + (chunk ^ (row %
//! 8))`, the same place, as long as each stage starts at a multiple of 1024 bytes: the arrays
//! a descriptor names are aligned so ([`GpuKernel::shared_alignment`]) and a stage is `rows x
//! 128` bytes with `rows` a multiple of 8. The `cp.async` copies and register stores write
//! logical indices as everywhere else; the emulator reads what a `wgmma` reads through the
//! descriptor's address arithmetic and the hardware swizzle, then back through the array's
//! swizzle, so a layout that disagrees fails its tests. Contraction step `j` (16 elements)
//! of a stage starts its K-major descriptors `16 j` elements into the first row of the
//! warpgroup's rows (A) or of the tile's columns (B), within the first row of an atom where
//! the swizzle leaves it in place, and its MN-major ones at contraction index `16 j` of the
//! first panel, the first row of an atom.
//!
//! # The order of the sums
//!
//! Each `wgmma` adds 16 terms to its accumulators, as an `mma` k-step does; the accumulators
//! take chunks of `leaf` terms and a tree of `fanout` above them, flushed where the `mma.sync`
//! products flush them (after the k-step ending a chunk), so the results and the error bound
//! are `tensor.rs`'s. The stage's four `wgmma`s are committed as one group; with two stages
//! it is waited for at the step's end, before the next step's barrier after which its stage
//! is filled again; with three or more one group stays in flight (`wgmma.wait_group 1`) and
//! the ring stages one step less ahead ([`super::staging::Stepping::lag`]: step `s` fills
//! the stage of step `s - 2`, whose group the previous step's wait retired), so the tensor
//! cores run across the barrier. The flushes read the accumulators, so every group is
//! retired first (`leaf` is a multiple of 64, so a chunk ends at a stage's end); each step
//! starts with a `wgmma.fence`, after the flushes' writes. Every thread
//! fences its landed copies and stores to the async proxy (`fence.proxy.async`) before the
//! step's barrier. The epilogue runs on the accumulator fragments, as in `tensor.rs`.

use super::gemm::{Launch, Product, tile_origin};
use super::skip::{choose, maybe_around};
use super::staging::{Staging, Stepping, Tile, pipelined, zero};
use super::tiled::{Operands, accumulators, flushes, sum_down, sum_levels};
use super::zero_steps::{Block, checked_range, replayed};
use super::*;
use crate::gpu::desc::{TileLayout, WgSwizzle};
use crate::gpu::wgmma::{WARPGROUP, acc_col, acc_row};
use crate::target::GemmTile;

/// The contraction of one stage: a 128-byte swizzle row of 16-bit elements.
pub(super) const KT: usize = 64;

impl Mapper<'_> {
    /// The warpgroup tile a product of `m x n` per batch with operands of `a` and `b` and a
    /// result of `out` runs with, and its operands' type, if the GPU has warpgroup products
    /// and a tile that fits: bf16 or f16 operands, an f32 result, `tile.m` 64 or 128 (one or
    /// two warpgroups of `thread_m` 64 rows), `tile.n` (`thread_n`) a multiple of 8 up to
    /// 256, `tile.k` 64, two stages within
    /// `Gpu::tile_limit`, and a sum tree whose chunks are whole stages. Chosen as
    /// [`Mapper::mma_tile`] chooses.
    pub(super) fn wgmma_tile(
        &self,
        (m, n): (usize, usize),
        (a, b, out): (DType, DType, DType),
        leaves_out: Option<&dyn Fn(&GemmTile) -> bool>,
    ) -> Option<(GemmTile, MmaOperand)> {
        if !self.gpu.wgmma || a != b || out != DType::F32 || !self.sums.leaf.is_multiple_of(KT) {
            return None;
        }
        let operand = MmaOperand::of_half(a)?;
        let fits = |t: &GemmTile| {
            let threads = t.m / 64 * WARPGROUP;
            t.k == KT
                && t.thread_m == 64
                && t.thread_n == t.n
                && matches!(t.m, 64 | 128)
                && t.n.is_multiple_of(8)
                && (8..=256).contains(&t.n)
                && self.gpu.warp_size == 32
                && threads <= self.gpu.max_threads_per_block
                && 2 * (t.m + t.n) * KT * operand.dtype().bytes() <= self.gpu.tile_limit()
        };
        let tiles = self.gpu.wgmma_tiles.iter().copied().filter(fits);
        choose(tiles, (m, n), leaves_out).map(|t| (t, operand))
    }

    /// The product of `d` on warpgroups by block tiles of `tile`, stored into `out`.
    pub(super) fn wgmma_product(
        &self,
        launch: Launch,
        d: &Product,
        ops: &Operands,
        (tile, operand): (GemmTile, MmaOperand),
    ) -> GpuKernel {
        let f32t = DType::F32;
        let (bm, bn) = (tile.m, tile.n);
        let (gm, gn) = (d.m.div_ceil(bm), d.n.div_ceil(bn));
        let threads = bm / 64 * WARPGROUP;
        let bytes = |s: usize| s * (bm + bn) * KT * operand.dtype().bytes();
        let most = self.gpu.mma_stages.min(d.k.div_ceil(KT) + 1).max(2);
        let stages = (2..=most)
            .rev()
            .find(|&s| bytes(s) <= self.gpu.tile_limit())
            .unwrap_or(2);
        let mut r = Regs::default();
        let [batch, m0, n0] = r.array();
        let [k0, e, staged] = r.array();
        let [kn, next, cur] = r.array();
        let tmp = (r.next(), r.next());
        let levels = sum_levels(d.k, self.sums);
        // Per level, the warpgroup's `bn / 2` accumulators.
        let acc = accumulators(&mut r, levels, bn / 2);
        let reg = Sc::Reg;
        let mut body = tile_origin((batch, m0, n0), (gm, gn), (bm, bn));
        for level in &acc {
            body.extend(level.iter().map(|&x| zero(x, f32t)));
        }
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
        // An operand stored with its rows contiguous (A transposed, B by rows) is staged
        // MN-major in panels of 64 rows (128 bytes: an atom row), so `cp.async` copies it;
        // the other K-major (module docs).
        let a_mn = d.a_trans;
        let b_mn = !d.b_trans && bn.is_multiple_of(64);
        let tile = |row_var: usize, rows: usize, base: usize, extent: usize, mn: bool, expr| Tile {
            row_var,
            rows,
            base,
            extent,
            depth: KT,
            k_fastest: !mn,
            panel: if mn { 64 } else { 0 },
            expr,
            array: row_var - 1,
        };
        let tiles = [
            tile(1, d.m, m0, bm, a_mn, ops.a),
            tile(2, d.n, n0, bn, b_mn, ops.b),
        ];
        // Rows of 8 chunks swizzled by chunks >> 3: the 128-byte swizzle (module docs).
        let shared: Vec<SharedArray> = [bm, bn]
            .iter()
            .map(|&rows| SharedArray {
                dtype: operand.dtype(),
                len: stages * rows * KT,
                packed: true,
                swizzle: Some(3),
            })
            .collect();
        let copies = staging.any_async(&tiles, &shared);
        // The steps a causal mask makes zero, left out where checked (`zero_steps.rs`).
        let zero = d.zero_steps(ops);
        let block = Block {
            origin: (batch, m0, n0),
            tile: (bm, bn),
            step: KT,
            threads,
            warp: 32,
        };
        let (check, range) = checked_range(zero.as_ref(), &mut r, &block, 0);
        let (ta, tb) = (swizzled_tile(bm, a_mn), swizzled_tile(bn, b_mn));
        let warpgroup = Sc::quot(sp(Special::Thread), c(WARPGROUP));
        let mut multiply = vec![Stmt::WgmmaFence];
        multiply.extend(stage_wgmmas(
            &acc[0],
            (&ta, &tb),
            reg(cur),
            &warpgroup,
            (bn, operand),
        ));
        // With 3 stages or more, one step's group stays in flight while the next step's
        // copies are waited for and its stage is read (the ring stages one step less ahead).
        let lag = usize::from(stages >= 3);
        multiply.push(Stmt::WgmmaCommit);
        multiply.push(Stmt::WgmmaWait { pending: lag });
        // The sum tree's flushes after the stage's last k-step (`leaf` is a multiple of 64).
        // The flushes read the accumulators: every group retired first.
        let done = Sc::plus(reg(k0), c(KT));
        let retired = [Stmt::WgmmaWait { pending: 0 }];
        multiply.extend(flushes(&acc, &done, self.sums, f32t, &retired));
        let stepping = Stepping {
            k0,
            cur,
            step: KT,
            stages,
            lag,
            range,
        };
        let stage = staging.stage(&tiles, &shared);
        let mut ring = check;
        ring.extend(pipelined(&staging, stage, &stepping, multiply, copies));
        fence_before_barriers(&mut ring);
        if range.is_some() {
            // The flushes the steps left out would have done, every group retired first.
            ring.push(Stmt::WgmmaWait { pending: 0 });
            let tree = (self.sums, f32t);
            ring.extend(replayed(zero.as_ref(), &acc, (range, KT), tree, &retired));
        }
        let origin = (reg(m0), reg(n0));
        body.extend(maybe_around(d.skip().as_ref(), origin, (bm, bn), ring));
        body.push(Stmt::WgmmaWait { pending: 0 });
        body.extend(sum_down(&acc, f32t));
        for (i, &v) in acc[levels].iter().enumerate() {
            let at = acc_at((reg(m0), reg(n0)), &warpgroup, i);
            body.push(launch.store_element(d, ops.planes, batch, at, v, tmp));
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

/// A stage's tile of `rows` rows and the contraction [`KT`] in the 128-byte swizzle, `mn_major`
/// or K-major.
pub(super) fn swizzled_tile(rows: usize, mn_major: bool) -> TileLayout {
    TileLayout {
        rows,
        k: KT,
        swizzle: WgSwizzle::B128,
        mn_major,
    }
}

/// The `KT / 16` warpgroup products of the stage at `stage` (an index of the ring's stages)
/// into `acc`: A's rows of `warpgroup` (64 each: a whole number of atoms or panels, so their
/// start is linear in it) in shared array 0, B's `n` rows in array 1, contraction `16 j` each
/// (module docs).
pub(super) fn stage_wgmmas(
    acc: &[usize],
    (ta, tb): (&TileLayout, &TileLayout),
    stage: Sc,
    warpgroup: &Sc,
    (n, operand): (usize, MmaOperand),
) -> Vec<Stmt> {
    let desc = |array: usize, t: &TileLayout, group: Sc, j: usize| {
        let (lbo, sbo) = t.strides();
        let start = Sc::plus(
            Sc::times(stage.clone(), c(t.elems())),
            Sc::plus(
                Sc::times(group, c(t.desc_start(64, 0))),
                c(t.desc_start(0, 16 * j)),
            ),
        );
        MatrixDesc {
            array,
            start,
            lbo,
            sbo,
            swizzle: t.swizzle,
            mn_major: t.mn_major,
        }
    };
    (0..KT / 16)
        .map(|j| Stmt::Wgmma {
            acc: acc.to_vec(),
            a: desc(0, ta, warpgroup.clone(), j),
            b: desc(1, tb, c(0), j),
            n,
            operand,
        })
        .collect()
}

/// Where accumulator `i` of `warpgroup`'s rows of the tile at `(m0, n0)` lies: its row and
/// column in the result.
pub(super) fn acc_at((m0, n0): (Sc, Sc), warpgroup: &Sc, i: usize) -> (Sc, Sc) {
    let row = Sc::plus(
        Sc::plus(m0, Sc::times(warpgroup.clone(), c(64))),
        acc_row(i),
    );
    (row, Sc::plus(n0, acc_col(i)))
}

/// Puts a `fence.proxy.async` before every barrier of `body` (nested ones too): each thread's
/// landed copies and shared stores become visible to the `wgmma`s after the barrier.
fn fence_before_barriers(body: &mut Vec<Stmt>) {
    let mut out = Vec::with_capacity(body.len() + 1);
    for mut s in body.drain(..) {
        match &mut s {
            Stmt::For { body, .. } | Stmt::If { body, .. } => fence_before_barriers(body),
            Stmt::Barrier => out.push(Stmt::ProxyFence),
            _ => {}
        }
        out.push(s);
    }
    *body = out;
}

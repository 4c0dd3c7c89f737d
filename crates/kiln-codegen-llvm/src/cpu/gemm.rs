//! The GEMM schedule: `C[r, :] = A[r, :] · B[batch(r)]` for the rows `lo..hi` of a
//! `[batch, m, k] x [batch, k, n]` product, in the BLIS layering.
//!
//! - The columns are split into blocks of `nc`; the contraction into blocks of `kc`.
//! - For each (column block, contraction block) the block of B is packed into scratch memory as
//!   panels of `nr = nv * lanes` columns, each panel `kc` rows of `nr` contiguous, aligned
//!   elements (the tail panel is padded with zeros). B stored transposed is packed by
//!   transposing `lanes` x `lanes` blocks in registers.
//! - The rows are split into blocks of `mc`; each block of A is packed as slivers of `mr` rows,
//!   interleaved so that one contraction step of a sliver is `mr` consecutive elements (rows past
//!   the end are zeros): by vectors, transposing `mr` x `mr` blocks in registers when A is stored
//!   by rows. A product with a single panel of columns reads A unpacked.
//! - A product at most one vector wide uses a tile one vector wide and twice as tall.
//! - The micro-kernel keeps an `mr` x `nr` tile of C in vector registers while one sliver of A
//!   and one panel of B stream by: per contraction step, `nv` vector loads of B, `mr`
//!   broadcasts of A and `mr * nv` fused multiply-adds.
//!
//! The packed B block stays in the L2/L3 cache across the row blocks, the packed A block in L2
//! across the panels, and one panel in L1 across the slivers.

use super::{Emitter, Routines, Target, host_attributes, llvm};
use crate::Result;
use crate::kernel::ConvPatches;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, FloatType, VectorType};
use inkwell::values::FunctionValue;
use inkwell::values::{
    BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue, VectorValue,
};
use inkwell::{AddressSpace, IntPredicate};
use kiln_ir::DType;

mod chain;
mod macro_kernel;
mod packing;
mod registers;
mod routines;
mod tile;

pub(super) use chain::*;
pub(super) use macro_kernel::*;
use registers::*;
pub(super) use routines::*;
use tile::*;

/// Bytes of a packed block of A (kept in the L2 cache).
const MC_BYTES: i64 = 192 * 1024;
/// Contraction steps per iteration of a full-width tile's loop. Measured against 1 with
/// alternating A/B calls: matmul_1024 won 44 of 55 pairs (10.1 -> 9.4 ms), the MLP step 61 of
/// 75 (15.8 -> 15.0 ms), matmul_2048 13 of 15 (96.6 -> 89.2 ms, when all tiles were unrolled);
/// cold MLP compile about 10% longer. 8 was faster still on matmul_1024 but doubles the code.
const UNROLL: i64 = 4;
/// Bytes of a block of rows of a GEMM's epilogue result that a chained product reads (kept in
/// the L2 cache between the epilogue and the second product).
const CHAIN_BYTES: i64 = 64 * 1024;
/// Bytes of a packed block of B (kept in the L3 cache).
const NC_BYTES: i64 = 4 * 1024 * 1024;

/// The cache blocks and the register tile of one GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Blocking {
    /// Bytes per element.
    bytes: i64,
    /// Elements per vector.
    lanes: u32,
    /// Rows of a register tile.
    mr: i64,
    /// Vectors per row of a register tile.
    nv: i64,
    /// Contraction steps per block.
    kc: i64,
    /// Rows per packed block of A.
    mc: i64,
    /// Columns per packed block of B.
    nc: i64,
}

impl Blocking {
    /// The blocking for `d` with 512-bit vectors (`wide`, 32 vector registers) or 256-bit ones
    /// (16 registers): the tile uses 24 (8 x 3) or 12 (6 x 2) accumulators, enough independent
    /// chains to hide the FMA latency on two FMA ports, and leaves registers for the B vectors.
    ///
    /// A product with at most one vector of columns (`n`; a classifier's 10 logits) uses tiles
    /// one vector wide and twice as tall: the wide tile would multiply mostly the zeros padding
    /// its panel.
    pub(super) fn new(d: DType, wide: bool, n: usize) -> Blocking {
        let bytes = d.bytes() as i64;
        let lanes = ((if wide { 64 } else { 32 }) / bytes) as u32;
        // Measured on AVX-512 (matmul_1024/2048, two threads): 8 x 3 vectors with 512-step
        // contraction blocks beat 12 x 2, 6 x 4 and shorter blocks where the columns fill the
        // panels of all three.
        let (mut mr, mut nv, kc) = match (wide, n <= lanes as usize) {
            (true, false) => (8, 3, 512),
            (true, true) => (16, 1, 512),
            (false, false) => (6, 2, 256),
            (false, true) => (12, 1, 256),
        };
        // Where the 8 x 3 tile's panels pad the columns, take the 6 x 4 tile when it pads them
        // less, and when 8 x 3 would pad them by more than a tenth (64 output channels: 96
        // columns computed), the 12 x 2 one too if it pads least (ties to the earlier tile).
        // Measured with alternating calls in one process: conv 3x3 64 -> 64 and attention's
        // 64-wide product, 6 x 4 won 20 of 20 and 33 of 35 pairs, about 10% and 7% faster; on
        // Zen 4, with 6 x 4 wherever it pads less (1024 columns: 16 panels of 64 rather than
        // 21 of 48 and one of 16), the MLP step won 24 of 30 pairs (14.30 -> 14.09 ms) and 16
        // of 30, attention (512 keys) 18 and 16 of 20 (25.0 -> 24.0 ms), matmul_2048 11 of 16
        // (82.0 -> 80.0 ms), 1024 x 1024 x 1024 8 and 13 of 30 (10.06 -> 10.12 and 10.17 ->
        // 10.21 ms), and the MLP step's cold compile takes fewer routines (its LLVM phase
        // 69-75 ms against 77-102).
        if wide && n > lanes as usize {
            let waste = |nv: i64| {
                let nr = lanes as u64 * nv as u64;
                (n as u64).div_ceil(nr) * nr - n as u64
            };
            let wide_waste = waste(3) > n as u64 / 10;
            (mr, nv) = [(8, 3), (6, 4), (12, 2)]
                .into_iter()
                .filter(|&(_, v)| v != 2 || wide_waste)
                .min_by_key(|&(_, v)| waste(v))
                .unwrap_or((mr, nv));
        }
        let nr = lanes as i64 * nv;
        Blocking {
            bytes,
            lanes,
            mr,
            nv,
            kc,
            mc: (MC_BYTES / (kc * bytes) / mr).max(1) * mr,
            nc: (NC_BYTES / (kc * bytes) / nr).max(1) * nr,
        }
    }

    /// Rows per packed block of A.
    pub(super) fn rows_per_block(&self) -> i64 {
        self.mc
    }

    /// Columns per packed block of B.
    pub(super) fn columns_per_block(&self) -> i64 {
        self.nc
    }

    /// Columns per panel of packed B.
    pub(super) fn nr(&self) -> i64 {
        self.lanes as i64 * self.nv
    }

    /// Whether a GEMM's threads split its columns (in panels) rather than its rows: each thread
    /// packs the operand whose block it splits, so split the longer side (a wide product with
    /// few rows, like a training step's, would otherwise pack all of B once per row chunk).
    pub(super) fn split_columns(&self, batch: usize, m: usize, n: usize, k: usize) -> bool {
        batch == 1 && k > 0 && m < n && n as i64 > self.nr()
    }

    /// This blocking with packed B blocks of at least `n` columns, so every block of C holds
    /// whole rows (for an epilogue that reduces over rows).
    pub(super) fn whole_rows(self, n: usize) -> Blocking {
        let nr = self.nr();
        Blocking {
            nc: self.nc.max((n as i64 + nr - 1) / nr * nr),
            ..self
        }
    }

    /// This blocking for a GEMM of `n` columns and `k` contraction steps (one block) whose
    /// epilogue's result a chained product reads (see [`crate::kernel::Chain`]): blocks of rows
    /// of at most [`CHAIN_BYTES`] (at least one tile's rows, no more than before), and
    /// contraction blocks of `k` steps rounded up to 16, so that B's packed block of whole rows
    /// (up to the target's `FusionLimits::chain_row` columns) takes no more room than it needs.
    pub(super) fn chained(self, n: usize, k: usize) -> Blocking {
        let row = n as i64 * self.bytes;
        Blocking {
            mc: ((CHAIN_BYTES / row / self.mr).max(1) * self.mr).min(self.mc),
            kc: self.kc.min((k as i64 + 15) / 16 * 16),
            ..self
        }
    }

    /// This blocking for a GEMM of `k` contraction steps (one block) whose epilogue is a
    /// softmax computed online for a chained product with blocking `bl2` (see
    /// [`crate::kernel::Chain::online`]): blocks of columns (of keys) of whole panels, at most
    /// the chained product's contraction block, so that each block of its rows is one
    /// contraction block of the second product; blocks of rows of at most [`CHAIN_BYTES`] of
    /// such a block (at least one tile's rows, no more than before); contraction blocks as
    /// [`Self::chained`] cuts them.
    pub(super) fn online(self, k: usize, bl2: Blocking) -> Blocking {
        let nr = self.nr();
        let nc = (bl2.kc / nr).max(1) * nr;
        let row = nc * self.bytes;
        Blocking {
            nc,
            mc: ((CHAIN_BYTES / row / self.mr).max(1) * self.mr).min(self.mc),
            kc: self.kc.min((k as i64 + 15) / 16 * 16),
            ..self
        }
    }

    /// Columns of the packed B block for `n` columns: whole panels, at most `nc`.
    fn nc_for(&self, n: i64) -> i64 {
        let nr = self.nr();
        ((n + nr - 1) / nr * nr).min(self.nc)
    }

    /// Scratch bytes a kernel with `n` columns needs per call: one packed block of B and one of
    /// A, each a multiple of 64 bytes.
    pub(super) fn scratch_bytes(&self, n: i64) -> usize {
        ((self.kc * self.nc_for(n) + self.mc * self.kc) * self.bytes) as usize
    }

    /// Where a chained product's buffers lie in the scratch memory of this blocking's GEMM of
    /// `n` columns, after its own (see [`ChainScratch`]), for a second product of `n2` columns
    /// with blocking `bl2`.
    ///
    /// With `online` (a softmax computed online, [`Self::online`]; the value is the rows per
    /// batch), the block of the epilogue's result holds the block's `nc` columns only, B2 is
    /// packed one contraction block at a time, and each row of a batch has its running
    /// maximum and sum after the chained product's packed A.
    pub(super) fn chain_scratch(
        &self,
        n: i64,
        bl2: Blocking,
        n2: i64,
        online: Option<i64>,
    ) -> ChainScratch {
        let line = 64 / self.bytes;
        let up = |x: i64, to: i64| (x + to - 1) / to * to;
        let block = self.kc * self.nc_for(n) + self.mc * self.kc;
        let (p_cols, b2_rows) = match online {
            Some(_) => (self.nc, bl2.kc),
            None => (n, up(n, bl2.kc)),
        };
        let b2 = block + up(self.mc * p_cols, line);
        let cols2 = up(n2, bl2.nr());
        let a2 = b2 + b2_rows * cols2;
        let state = a2 + up(self.mc, bl2.mr) * bl2.kc;
        let rows = up(online.unwrap_or(0), line);
        let end = state + 2 * rows;
        ChainScratch {
            p: block,
            b2,
            cols2,
            a2,
            max: state,
            sum: state + rows,
            bytes: (end * self.bytes) as usize,
        }
    }
}

/// A chained product's buffers in a GEMM's scratch memory, as element offsets (each a multiple
/// of 64 bytes): the block of the epilogue's result (`mc` rows), the second product's B packed
/// whole (every contraction block of `kc2` steps, `cols2` columns each, packed once per batch
/// and read by every block of rows; one contraction block at a time for an online softmax),
/// its packed block of A, and for an online softmax each row's running maximum and sum.
#[derive(Clone, Copy, Debug)]
pub(super) struct ChainScratch {
    p: i64,
    b2: i64,
    /// Columns of each packed contraction block of B2: whole panels.
    cols2: i64,
    a2: i64,
    max: i64,
    sum: i64,
    /// The whole scratch memory's size.
    pub(super) bytes: usize,
}

/// A product chained to a GEMM (see [`crate::kernel::Chain`]), as [`emit`] takes it.
pub(super) struct Chain<'c> {
    /// Its blocking.
    pub(super) bl: Blocking,
    /// Its columns.
    pub(super) n: i64,
    /// The kernel input holding its B.
    pub(super) b: i64,
    /// Its B is stored transposed.
    pub(super) b_trans: bool,
    /// Its result, `[batch * m, n]`.
    pub(super) out: PointerValue<'c>,
    /// The first product's epilogue is a softmax computed online
    /// ([`crate::kernel::Chain::online`]).
    pub(super) online: bool,
    /// Where its logits are masked out ([`crate::kernel::Chain::masked`]), the position's
    /// row being the row within its batch.
    pub(super) masked: Option<(i64, i64, i64)>,
}

/// What a block of a softmax computed online ([`crate::kernel::Chain::online`]) works with,
/// besides its rows and columns and the block buffer: the buffer's rows are `ld` apart; each
/// row of the batch has its running maximum and sum at `max` and `sum`, at its row less `base`
/// (the batch's first row); `first` says whether the block holds the rows' first columns; and
/// the rows of the chained product's result (`out`, `n2` columns) are rescaled whenever the
/// maximum grows.
pub(super) struct OnlineBlock<'c> {
    pub(super) first: IntValue<'c>,
    pub(super) ld: i64,
    pub(super) max: PointerValue<'c>,
    pub(super) sum: PointerValue<'c>,
    pub(super) base: IntValue<'c>,
    pub(super) out: PointerValue<'c>,
    pub(super) n2: i64,
}

/// Integer and pointer arithmetic for the emitted code.
struct Arith<'a, 'c> {
    em: &'a Emitter<'c>,
}

impl<'c> Arith<'_, 'c> {
    fn c(&self, v: i64) -> IntValue<'c> {
        self.em.i64c(v)
    }
    fn add(&self, x: IntValue<'c>, y: IntValue<'c>) -> Result<IntValue<'c>> {
        self.em.b.build_int_add(x, y, "a").map_err(llvm)
    }
    fn addc(&self, x: IntValue<'c>, y: i64) -> Result<IntValue<'c>> {
        self.add(x, self.c(y))
    }
    fn sub(&self, x: IntValue<'c>, y: IntValue<'c>) -> Result<IntValue<'c>> {
        self.em.b.build_int_sub(x, y, "s").map_err(llvm)
    }
    fn mul(&self, x: IntValue<'c>, y: IntValue<'c>) -> Result<IntValue<'c>> {
        self.em.b.build_int_mul(x, y, "m").map_err(llvm)
    }
    fn mulc(&self, x: IntValue<'c>, y: i64) -> Result<IntValue<'c>> {
        self.em.b.build_int_mul(x, self.c(y), "m").map_err(llvm)
    }
    fn cmp(&self, p: IntPredicate, x: IntValue<'c>, y: IntValue<'c>) -> Result<IntValue<'c>> {
        self.em.b.build_int_compare(p, x, y, "c").map_err(llvm)
    }
    fn min(&self, x: IntValue<'c>, y: IntValue<'c>) -> Result<IntValue<'c>> {
        self.em.int_min(x, y)
    }
    fn max(&self, x: IntValue<'c>, y: IntValue<'c>) -> Result<IntValue<'c>> {
        self.em.int_max(x, y)
    }
    fn sdiv(&self, x: IntValue<'c>, y: i64) -> Result<IntValue<'c>> {
        self.em
            .b
            .build_int_signed_div(x, self.c(y), "d")
            .map_err(llvm)
    }
    /// The address of element `idx` of `ty`s at `p`.
    fn at<T: BasicType<'c>>(
        &self,
        ty: T,
        p: PointerValue<'c>,
        idx: IntValue<'c>,
    ) -> Result<PointerValue<'c>> {
        // SAFETY (of the emitted code): every index stays inside its buffer.
        unsafe { self.em.b.build_in_bounds_gep(ty, p, &[idx], "e") }.map_err(llvm)
    }
    fn slot(&self) -> Result<PointerValue<'c>> {
        self.em.entry_alloca(self.em.ctx.i64_type().into())
    }
    fn get(&self, slot: PointerValue<'c>) -> Result<IntValue<'c>> {
        Ok(self
            .em
            .b
            .build_load(self.em.ctx.i64_type(), slot, "v")
            .map_err(llvm)?
            .into_int_value())
    }
    /// Emits `if cond { then } else { otherwise }`.
    fn branch(
        &self,
        cond: IntValue<'c>,
        then: &mut dyn FnMut() -> Result<()>,
        otherwise: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let (em, b) = (self.em, &self.em.b);
        let t = em.ctx.append_basic_block(em.f, "then");
        let e = em.ctx.append_basic_block(em.f, "else");
        let j = em.ctx.append_basic_block(em.f, "join");
        b.build_conditional_branch(cond, t, e).map_err(llvm)?;
        b.position_at_end(t);
        then()?;
        b.build_unconditional_branch(j).map_err(llvm)?;
        b.position_at_end(e);
        otherwise()?;
        b.build_unconditional_branch(j).map_err(llvm)?;
        b.position_at_end(j);
        Ok(())
    }
}

/// Sets the alignment of a load or store.
fn align<'c, V: BasicValue<'c>>(v: V, a: u32) -> Result<V> {
    v.as_instruction_value()
        .ok_or_else(|| crate::Error::Llvm("loads and stores are instructions".into()))?
        .set_alignment(a)
        .map_err(llvm)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::{Blocking, grouped_store_lanes};
    use kiln_ir::DType;

    /// 512-bit products take the 8 x 3, 6 x 4 or 12 x 2 tile that pads the columns least, 12 x 2
    /// only where 8 x 3 would pad them by more than a tenth; 256-bit ones keep 6 x 2.
    #[test]
    fn products_take_the_tile_that_pads_least() {
        for (d, n, tile) in [
            (DType::F32, 1024, (6, 4)),
            (DType::F32, 2048, (6, 4)),
            (DType::F32, 512, (6, 4)),
            (DType::F32, 250, (6, 4)),
            (DType::F32, 96, (8, 3)),
            (DType::F32, 960, (8, 3)),
            (DType::F32, 1000, (8, 3)),
            (DType::F32, 600, (8, 3)),
            (DType::F32, 64, (6, 4)),
            (DType::F32, 160, (12, 2)),
            (DType::F32, 32, (12, 2)),
            (DType::F32, 10, (16, 1)),
            (DType::F64, 1024, (6, 4)),
            (DType::F64, 600, (8, 3)),
        ] {
            let bl = Blocking::new(d, true, n);
            assert_eq!((bl.mr, bl.nv), tile, "{d:?}, {n} columns");
            assert_eq!(bl.mc % bl.mr, 0);
            assert_eq!(bl.nc % bl.nr(), 0);
        }
        let bl = Blocking::new(DType::F32, false, 1000);
        assert_eq!((bl.mr, bl.nv), (6, 2));
    }

    /// A chained product's buffers lie after the GEMM's own, in order, 64-byte aligned, each as
    /// large as what is stored in it: the block of rows of the epilogue's result, the second
    /// product's B packed whole (every contraction block, whole panels) and its packed A (the
    /// block's rows in whole slivers of its own tile).
    #[test]
    fn chained_buffers_are_aligned_and_do_not_overlap() {
        for d in [DType::F32, DType::F64] {
            for wide in [false, true] {
                for (n, n2, k) in [
                    (4, 8, 8),
                    (512, 64, 64),
                    (600, 37, 40),
                    (97, 13, 256),
                    (2048, 200, 64),
                    (16384, 64, 128),
                ] {
                    let bl = Blocking::new(d, wide, n as usize)
                        .whole_rows(n as usize)
                        .chained(n as usize, k);
                    assert!(bl.kc >= k as i64 && bl.kc % 16 == 0);
                    let bl2 = Blocking::new(d, wide, n2 as usize);
                    let at = bl.chain_scratch(n, bl2, n2, None);
                    let up = |x: i64, to: i64| (x + to - 1) / to * to;
                    let line = 64 / bl.bytes;
                    let what = format!("{d:?} wide {wide}, {n} then {n2} columns, {k} steps");
                    for off in [at.p, at.b2, at.a2] {
                        assert_eq!(off % line, 0, "{what}");
                    }
                    assert!(
                        bl.mc * n * bl.bytes <= 64 * 1024 || bl.mc == bl.mr,
                        "{what}"
                    );
                    assert_eq!(at.p, bl.scratch_bytes(n) as i64 / bl.bytes, "{what}");
                    assert!(at.b2 >= at.p + bl.mc * n, "{what}");
                    assert_eq!(at.cols2, up(n2, bl2.nr()), "{what}");
                    assert!(at.a2 >= at.b2 + up(n, bl2.kc) * at.cols2, "{what}");
                    let end = at.a2 + up(bl.mc, bl2.mr) * bl2.kc;
                    assert!(at.bytes as i64 >= end * bl.bytes, "{what}");
                }
            }
        }
    }

    /// An online softmax's buffers: the block buffer holds a block of rows of one block of
    /// columns (whole panels, at most the second product's contraction block), B2 one packed
    /// contraction block, then the packed A and each row's maximum and sum, all 64-byte
    /// aligned and apart.
    #[test]
    fn online_buffers_are_aligned_and_do_not_overlap() {
        for d in [DType::F32, DType::F64] {
            for wide in [false, true] {
                for (n, n2, k, m) in [
                    (16385, 8, 8, 3),
                    (20000, 70, 16, 45),
                    (512, 64, 64, 512),
                    (100000, 13, 256, 1000),
                ] {
                    let bl2 = Blocking::new(d, wide, n2 as usize);
                    let bl = Blocking::new(d, wide, n as usize).online(k, bl2);
                    let what = format!("{d:?} wide {wide}, {n} then {n2} columns, {k} steps");
                    assert!(bl.nc % bl.nr() == 0 && bl.nc <= bl2.kc, "{what}");
                    assert!(bl.kc >= k as i64 && bl.kc % 16 == 0, "{what}");
                    assert!(
                        bl.mc * bl.nc * bl.bytes <= 64 * 1024 || bl.mc == bl.mr,
                        "{what}"
                    );
                    let at = bl.chain_scratch(n, bl2, n2, Some(m));
                    let up = |x: i64, to: i64| (x + to - 1) / to * to;
                    let line = 64 / bl.bytes;
                    for off in [at.p, at.b2, at.a2, at.max, at.sum] {
                        assert_eq!(off % line, 0, "{what}");
                    }
                    assert_eq!(at.p, bl.scratch_bytes(n) as i64 / bl.bytes, "{what}");
                    assert!(at.b2 >= at.p + bl.mc * bl.nc, "{what}");
                    assert!(at.a2 >= at.b2 + bl2.kc * at.cols2, "{what}");
                    assert!(at.max >= at.a2 + up(bl.mc, bl2.mr) * bl2.kc, "{what}");
                    assert!(at.sum >= at.max + m, "{what}");
                    assert!(at.bytes as i64 >= (at.sum + m) * bl.bytes, "{what}");
                }
            }
        }
    }

    /// The grouped packing's stores, replayed in order on a block with room after it: every
    /// element ends up with its row and step, and nothing is written past the block.
    #[test]
    fn grouped_packing_stores_stay_inside_their_block() {
        for lanes in [4, 8, 16] {
            for mr in [3, 5, 6, 10, 12, 24] {
                let len = (lanes * mr) as usize;
                let mut block = vec![None; len + lanes as usize];
                for u in 0..lanes {
                    for g in 0..(mr + lanes - 1) / lanes {
                        let n = grouped_store_lanes(mr, lanes, u, g);
                        for l in 0..n {
                            let at = (u * mr + g * lanes + l) as usize;
                            // Lanes past the group's rows hold padding.
                            let row = g * lanes + l;
                            block[at] = Some((row < mr).then_some((row, u)));
                        }
                    }
                }
                for (at, got) in block.iter().enumerate() {
                    let want = (at < len).then_some(Some(((at as i64) % mr, (at as i64) / mr)));
                    assert_eq!(*got, want, "mr {mr}, lanes {lanes}, element {at}");
                }
            }
        }
    }
}

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
    /// (up to `fuse::MAX_CHAIN_ROW` columns) takes no more room than it needs.
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

/// What a register tile's code works with: the element and vector types and, in update mode,
/// the scale.
struct Regs<'a, 'c> {
    x: Arith<'a, 'c>,
    bl: Blocking,
    ft: FloatType<'c>,
    vt: VectorType<'c>,
    /// In update mode, C already holds X and each contraction block's product `P` is folded in
    /// as `C - s P` (`true`) or `C + s P`: `s` splat across a vector.
    update: Option<(BasicValueEnum<'c>, bool)>,
    /// C is stored by columns, `ldc` apart: element `(i, j)` of a tile at `c[j * ldc + i]` (a
    /// convolution's NCHW output, [`ConvPatches::planes`]).
    planes: bool,
}

/// The loaded vector types and pointers of one emitted GEMM.
struct Gemm<'a, 'c> {
    r: Regs<'a, 'c>,
    /// Rows of A and C per batch.
    m: i64,
    /// A is stored `[batch, k, m]`.
    a_trans: bool,
    /// Contraction length (a constant, or a parameter of a kernel shared by products that
    /// differ only in it).
    k: IntValue<'c>,
    a: PointerValue<'c>,
    /// When A is a convolution's patch matrix: its shape and the table of column offsets.
    conv: Option<(&'a ConvPatches, PointerValue<'c>)>,
    b: PointerValue<'c>,
    packed_b: PointerValue<'c>,
    packed_a: PointerValue<'c>,
}

impl<'a, 'c> std::ops::Deref for Gemm<'a, 'c> {
    type Target = Regs<'a, 'c>;
    fn deref(&self) -> &Regs<'a, 'c> {
        &self.r
    }
}

impl<'c> Regs<'_, 'c> {
    /// Bytes of one vector (the alignment of packed vectors).
    fn vbytes(&self) -> u32 {
        self.bl.lanes * self.bl.bytes as u32
    }

    /// Transposes `lanes` vectors of `lanes` elements (row `t` in, column `t` out): at each
    /// level, rows `i` and `i + b` (bit `b` of `i` clear) swap their off-diagonal blocks of `b`
    /// elements, for `b` = lanes/2 down to 1; two two-source shuffles per pair and level.
    fn transpose(&self, r: Vec<VectorValue<'c>>) -> Result<Vec<VectorValue<'c>>> {
        transpose_vectors(self.x.em, r)
    }

    /// `width` consecutive elements at `p[idx..]` as a vector (zeros past `width`), by a masked
    /// load when `width` is short of a whole vector (the lanes past it are not read).
    fn load_cols(
        &self,
        p: PointerValue<'c>,
        idx: IntValue<'c>,
        width: i64,
    ) -> Result<BasicValueEnum<'c>> {
        let b = &self.x.em.b;
        let at = self.x.at(self.ft, p, idx)?;
        if width >= self.bl.lanes as i64 {
            let v = b.build_load(self.vt, at, "lv").map_err(llvm)?;
            return align(v, self.bl.bytes as u32);
        }
        if width <= 0 {
            return Ok(self.vt.const_zero().into());
        }
        let mask = self.lane_mask(width);
        self.masked(
            "llvm.masked.load",
            at,
            &[at.into(), mask.into(), self.vt.const_zero().into()],
        )
        .map(|v| v.expect("a masked load returns its vector"))
    }

    /// Stores the first `width` lanes of `v` at `p[idx..]` (a masked store when `width` is
    /// short of a whole vector).
    fn store_cols(
        &self,
        p: PointerValue<'c>,
        idx: IntValue<'c>,
        width: i64,
        v: BasicValueEnum<'c>,
    ) -> Result<()> {
        let b = &self.x.em.b;
        let at = self.x.at(self.ft, p, idx)?;
        if width >= self.bl.lanes as i64 {
            let s = b.build_store(at, v).map_err(llvm)?;
            s.set_alignment(self.bl.bytes as u32).map_err(llvm)?;
            return Ok(());
        }
        if width <= 0 {
            return Ok(());
        }
        let mask = self.lane_mask(width);
        self.masked("llvm.masked.store", at, &[v, at.into(), mask.into()])?;
        Ok(())
    }

    /// The mask of a vector's first `width` lanes.
    fn lane_mask(&self, width: i64) -> VectorValue<'c> {
        let i1 = self.x.em.ctx.bool_type();
        let lanes: Vec<IntValue<'c>> = (0..self.bl.lanes as i64)
            .map(|l| i1.const_int((l < width) as u64, false))
            .collect();
        VectorType::const_vector(&lanes)
    }

    /// A call of the masked load or store intrinsic `name` on this tile's vectors at `at`
    /// (element-aligned), with `args`; its result, for a load.
    fn masked(
        &self,
        name: &str,
        at: PointerValue<'c>,
        args: &[BasicValueEnum<'c>],
    ) -> Result<Option<BasicValueEnum<'c>>> {
        self.masked_as(self.vt, name, at, args)
    }

    /// [`Self::masked`] on vectors of type `vt`.
    fn masked_as(
        &self,
        vt: VectorType<'c>,
        name: &str,
        at: PointerValue<'c>,
        args: &[BasicValueEnum<'c>],
    ) -> Result<Option<BasicValueEnum<'c>>> {
        let em = self.x.em;
        let decl = inkwell::intrinsics::Intrinsic::find(name)
            .and_then(|i| i.get_declaration(em.m, &[vt.into(), at.get_type().into()]))
            .ok_or_else(|| crate::Error::Llvm(format!("cannot declare {name}")))?;
        let args: Vec<_> = args.iter().map(|a| (*a).into()).collect();
        let call = em.b.build_call(decl, &args, "m").map_err(llvm)?;
        let ptr_arg = args.iter().position(|a| a.is_pointer_value()).unwrap_or(0) as u32;
        let align_kind = Attribute::get_named_enum_kind_id("align");
        call.add_attribute(
            AttributeLoc::Param(ptr_arg),
            em.ctx
                .create_enum_attribute(align_kind, self.bl.bytes as u64),
        );
        Ok(call.try_as_basic_value().basic())
    }

    /// Rows per group of a tile stored by columns: `mr` rounded up to a power of two, at most
    /// a vector. Each group's column is one vector of this many lanes.
    fn plane_group(&self) -> i64 {
        (self.bl.mr as u64)
            .next_power_of_two()
            .min(self.bl.lanes as u64) as i64
    }

    /// Lanes `lo..lo + len` of `v`.
    fn lanes_of(&self, v: VectorValue<'c>, lo: i64, len: i64) -> Result<VectorValue<'c>> {
        let i32t = self.x.em.ctx.i32_type();
        let idx: Vec<IntValue<'c>> = (lo..lo + len)
            .map(|l| i32t.const_int(l as u64, false))
            .collect();
        self.x
            .em
            .b
            .build_shuffle_vector(
                v,
                v.get_type().get_undef(),
                VectorType::const_vector(&idx),
                "sub",
            )
            .map_err(llvm)
    }

    /// The vectors `parts` (of equal length) one after another in one vector.
    fn concat(&self, mut parts: Vec<VectorValue<'c>>) -> Result<VectorValue<'c>> {
        let i32t = self.x.em.ctx.i32_type();
        while parts.len() > 1 {
            let len = parts[0].get_type().get_size() as u64;
            let idx: Vec<IntValue<'c>> = (0..2 * len).map(|l| i32t.const_int(l, false)).collect();
            parts = parts
                .chunks(2)
                .map(|p| {
                    self.x
                        .em
                        .b
                        .build_shuffle_vector(p[0], p[1], VectorType::const_vector(&idx), "cat")
                        .map_err(llvm)
                })
                .collect::<Result<_>>()?;
        }
        Ok(parts[0])
    }

    /// The mask of the lanes of a group of `q` rows starting at tile row `g0` that are among
    /// the tile's first `live` rows.
    fn group_mask(&self, q: i64, g0: i64, live: IntValue<'c>) -> Result<VectorValue<'c>> {
        let em = self.x.em;
        let i64t = em.ctx.i64_type();
        let idx: Vec<IntValue<'c>> = (0..q).map(|l| i64t.const_int(l as u64, false)).collect();
        let left = self.x.sub(live, self.x.c(g0))?;
        let vt = i64t.vec_type(q as u32);
        let one =
            em.b.build_insert_element(vt.get_undef(), left, self.x.c(0), "l1")
                .map_err(llvm)?;
        let splat =
            em.b.build_shuffle_vector(
                one,
                vt.get_undef(),
                em.ctx.i32_type().vec_type(q as u32).const_zero(),
                "ls",
            )
            .map_err(llvm)?;
        em.b.build_int_compare(
            IntPredicate::SLT,
            VectorType::const_vector(&idx),
            splat,
            "gm",
        )
        .map_err(llvm)
    }

    /// Stores the tile `tile` (`mr` rows of `nv` vectors) by columns (see [`Regs::planes`]):
    /// its first `live` rows and `width` columns at `c`, columns `ldc` apart. Each group of
    /// rows ([`Self::plane_group`]) is transposed in registers a square block at a time, and
    /// each column of the group stored as one masked vector.
    fn store_planes(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        live: IntValue<'c>,
        width: i64,
        tile: &[Vec<VectorValue<'c>>],
    ) -> Result<()> {
        let (mr, lanes, q) = (self.bl.mr, self.bl.lanes as i64, self.plane_group());
        let qt = self.ft.vec_type(q as u32);
        for g0 in (0..mr).step_by(q as usize) {
            let mask = self.group_mask(q, g0, live)?;
            for (v, s0) in
                (0..self.bl.nv).flat_map(|v| (0..lanes).step_by(q as usize).map(move |s| (v, s)))
            {
                let col0 = v * lanes + s0;
                if col0 >= width {
                    continue;
                }
                let block: Vec<VectorValue<'c>> = (g0..g0 + q)
                    .map(|i| match tile.get(i as usize) {
                        Some(row) => self.lanes_of(row[v as usize], s0, q),
                        None => Ok(qt.get_undef()),
                    })
                    .collect::<Result<_>>()?;
                for (t, col) in transpose_vectors(self.x.em, block)?.into_iter().enumerate() {
                    let j = col0 + t as i64;
                    if j >= width {
                        break;
                    }
                    let at = self
                        .x
                        .at(self.ft, c, self.x.addc(self.x.mulc(ldc, j)?, g0)?)?;
                    self.masked_as(
                        qt,
                        "llvm.masked.store",
                        at,
                        &[col.into(), at.into(), mask.into()],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// The tile stored by columns at `c` ([`Self::store_planes`]), as `mr` rows of `nv`
    /// vectors: rows from `live` on and columns from `width` on are zeros.
    fn load_planes(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        live: IntValue<'c>,
        width: i64,
    ) -> Result<Vec<Vec<VectorValue<'c>>>> {
        let (mr, nv, lanes, q) = (
            self.bl.mr,
            self.bl.nv,
            self.bl.lanes as i64,
            self.plane_group(),
        );
        let qt = self.ft.vec_type(q as u32);
        // parts[i][v]: row i's vector v, as lanes / q pieces of q lanes.
        let mut parts = vec![vec![Vec::new(); nv as usize]; mr as usize];
        for g0 in (0..mr).step_by(q as usize) {
            let mask = self.group_mask(q, g0, live)?;
            for v in 0..nv {
                for s0 in (0..lanes).step_by(q as usize) {
                    let cols: Vec<VectorValue<'c>> = (0..q)
                        .map(|t| {
                            let j = v * lanes + s0 + t;
                            if j >= width {
                                return Ok(qt.const_zero());
                            }
                            let at =
                                self.x
                                    .at(self.ft, c, self.x.addc(self.x.mulc(ldc, j)?, g0)?)?;
                            let v = self.masked_as(
                                qt,
                                "llvm.masked.load",
                                at,
                                &[at.into(), mask.into(), qt.const_zero().into()],
                            )?;
                            Ok(v.expect("a masked load returns its vector")
                                .into_vector_value())
                        })
                        .collect::<Result<_>>()?;
                    for (i, row) in transpose_vectors(self.x.em, cols)?.into_iter().enumerate() {
                        if let Some(p) = parts.get_mut(g0 as usize + i) {
                            p[v as usize].push(row);
                        }
                    }
                }
            }
        }
        parts
            .into_iter()
            .map(|row| row.into_iter().map(|p| self.concat(p)).collect())
            .collect()
    }

    /// Packs `span` contraction steps of a panel of B into `panel` (`span` rows of
    /// `nr = lanes * nv` elements): column `t` at step `s` is `src[t * ld + s]` when B is stored
    /// transposed (`[n, k]`: `trans`), else `src[s * ld + t]`; columns from `width` on are
    /// zeros.
    fn pack_b(
        &self,
        src: PointerValue<'c>,
        ld: IntValue<'c>,
        span: IntValue<'c>,
        width: i64,
        trans: bool,
        panel: PointerValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let (lanes, nr) = (self.bl.lanes as i64, self.bl.nr());
        let dst = |s: IntValue<'c>, col: IntValue<'c>| -> Result<PointerValue<'c>> {
            x.at(self.ft, panel, x.add(x.mulc(s, nr)?, col)?)
        };
        if trans {
            // Whole panels: blocks of `lanes` columns by `lanes` contraction steps are loaded
            // as one vector per column, transposed in registers and stored as one vector per
            // step; the steps past the last whole block, and a tail panel, column by column.
            let from = if width == nr {
                let rem =
                    x.em.b
                        .build_int_signed_rem(span, x.c(lanes), "r")
                        .map_err(llvm)?;
                let whole = x.sub(span, rem)?;
                let (s_k, s_c) = (x.slot()?, x.slot()?);
                x.em.range_loop_ptr(s_k, x.c(0), whole, lanes, &mut |_| {
                    let k0 = x.get(s_k)?;
                    // The panel's vectors of columns in a loop, not unrolled: each is `lanes`
                    // loads, `lanes * log2(lanes)` shuffles and `lanes` stores, and unrolled
                    // `nv` times their code generation took 50-80 ms of the routine's compile.
                    x.em.range_loop_ptr(s_c, x.c(0), x.c(nr), lanes, &mut |_| {
                        let c0 = x.get(s_c)?;
                        let rows: Vec<VectorValue<'c>> = (0..lanes)
                            .map(|t| {
                                let at = x.add(x.mul(ld, x.addc(c0, t)?)?, k0)?;
                                let l =
                                    x.em.b
                                        .build_load(self.vt, x.at(self.ft, src, at)?, "bt")
                                        .map_err(llvm)?;
                                Ok(align(l, self.bl.bytes as u32)?.into_vector_value())
                            })
                            .collect::<Result<_>>()?;
                        for (u, c) in self.transpose(rows)?.into_iter().enumerate() {
                            let at = dst(x.addc(k0, u as i64)?, c0)?;
                            let st = x.em.b.build_store(at, c).map_err(llvm)?;
                            st.set_alignment(self.vbytes()).map_err(llvm)?;
                        }
                        Ok(())
                    })
                })?;
                whole
            } else {
                x.c(0)
            };
            let s_jj = x.slot()?;
            return x.em.range_loop_ptr(s_jj, x.c(0), x.c(nr), 1, &mut |_| {
                let jj = x.get(s_jj)?;
                let row = x.mul(jj, ld)?;
                self.strided_run(
                    x.cmp(IntPredicate::SLT, jj, x.c(width))?,
                    (from, span),
                    &|kk| x.at(self.ft, src, x.add(row, kk)?),
                    &|kk| dst(kk, jj),
                )
            });
        }
        let s_kk = x.slot()?;
        x.em.range_loop_ptr(s_kk, x.c(0), span, 1, &mut |em: &Emitter<'c>| {
            let kk = x.get(s_kk)?;
            let row = x.mul(kk, ld)?;
            for v in 0..self.bl.nv {
                let val = self.load_cols(src, x.addc(row, v * lanes)?, width - v * lanes)?;
                let s =
                    em.b.build_store(dst(kk, x.c(v * lanes))?, val)
                        .map_err(llvm)?;
                s.set_alignment(self.vbytes()).map_err(llvm)?;
            }
            Ok(())
        })
    }

    /// Packs the first `rows` rows of A by `span` contraction steps into slivers of `mr` rows
    /// at `dst`, `stride` elements apart (step `s` of a sliver's row `i` at `s * mr + i`; rows
    /// past `rows` are zeros). Row `i` at step `s` is `src[i + s * ld]` when A is stored
    /// transposed (`[k, m]`: `trans`), else `src[i * ld + s]`. Whole slivers go by vectors:
    /// stored transposed, each step of a sliver is `mr` consecutive elements already; stored by
    /// rows, blocks of `mr` rows by `mr` steps are transposed in registers, or, when `mr` is not
    /// a power of two, blocks of `lanes` steps (see [`Self::pack_a_grouped`]). The rest goes
    /// element by element: a contiguous read and a store every `mr` elements.
    #[allow(clippy::too_many_arguments)]
    fn pack_a(
        &self,
        src: PointerValue<'c>,
        ld: IntValue<'c>,
        rows: IntValue<'c>,
        span: IntValue<'c>,
        dst: PointerValue<'c>,
        stride: IntValue<'c>,
        trans: bool,
    ) -> Result<()> {
        let x = &self.x;
        let mr = self.bl.mr;
        let (s_r, s_i) = (x.slot()?, x.slot()?);
        let lanes = self.bl.lanes as i64;
        // Stored by rows with `mr` not a power of two (tiles of 6 and 12 rows):
        // blocks of `lanes` steps, transposed `lanes` rows at a time.
        let grouped = !trans && !(mr as u64).is_power_of_two();
        let mt = self.ft.vec_type(mr as u32);
        let at = |row: IntValue<'c>, kk: IntValue<'c>| -> Result<PointerValue<'c>> {
            let idx = if trans {
                x.add(row, x.mul(kk, ld)?)?
            } else {
                x.add(x.mul(row, ld)?, kk)?
            };
            x.at(self.ft, src, idx)
        };
        x.em.range_loop_ptr(s_r, x.c(0), rows, mr, &mut |_| {
            let r = x.get(s_r)?;
            let sliver = x.mul(r, stride)?;
            let whole = x.cmp(IntPredicate::SLE, x.addc(r, mr)?, rows)?;
            let step = match (trans, grouped) {
                (true, _) => 1,
                (false, true) => lanes,
                (false, false) => mr,
            };
            let rem =
                x.em.b
                    .build_int_signed_rem(span, x.c(step), "r")
                    .map_err(llvm)?;
            // Whole slivers: vectors up to the last whole block, the rest as below.
            let kfull =
                x.em.b
                    .build_select(whole, x.sub(span, rem)?, x.c(0), "kf")
                    .map_err(llvm)?
                    .into_int_value();
            let s_k = x.slot()?;
            x.em.range_loop_ptr(s_k, x.c(0), kfull, step, &mut |em| {
                let k0 = x.get(s_k)?;
                let store = |u: i64, v: VectorValue<'c>| -> Result<()> {
                    let idx = x.add(sliver, x.mulc(x.addc(k0, u)?, mr)?)?;
                    em.b.build_store(x.at(self.ft, dst, idx)?, v)
                        .map_err(llvm)?
                        .set_alignment(self.bl.bytes as u32)
                        .map_err(llvm)
                };
                let load = |p: PointerValue<'c>| -> Result<VectorValue<'c>> {
                    let l = em.b.build_load(mt, p, "av").map_err(llvm)?;
                    Ok(align(l, self.bl.bytes as u32)?.into_vector_value())
                };
                if trans {
                    return store(0, load(at(r, k0)?)?);
                }
                if grouped {
                    return self.pack_a_grouped(r, k0, sliver, &at, dst);
                }
                let block: Vec<VectorValue<'c>> = (0..mr)
                    .map(|i| load(at(x.addc(r, i)?, k0)?))
                    .collect::<Result<_>>()?;
                for (u, v) in self.transpose(block)?.into_iter().enumerate() {
                    store(u as i64, v)?;
                }
                Ok(())
            })?;
            x.em.range_loop_ptr(s_i, x.c(0), x.c(mr), 1, &mut |_| {
                let i = x.get(s_i)?;
                let row = x.add(r, i)?;
                self.strided_run(
                    x.cmp(IntPredicate::SLT, row, rows)?,
                    (kfull, span),
                    &|kk| at(row, kk),
                    &|kk| x.at(self.ft, dst, x.add(x.add(sliver, x.mulc(kk, mr)?)?, i)?),
                )
            })
        })
    }

    /// One block of `lanes` steps (from `k0`) of the whole sliver of rows `r..r + mr` at
    /// `sliver` in `dst`, when `mr` is not a power of two: each group of `lanes` rows (the last
    /// padded) is loaded by rows and transposed in registers, then step `u` of group `g` is
    /// stored at `(k0 + u) * mr + g * lanes`. A short last group is still stored a whole vector
    /// wide where that stays inside the block (all steps but the last one or two): its extra
    /// lanes land on the next steps' elements, which are stored after it.
    fn pack_a_grouped(
        &self,
        r: IntValue<'c>,
        k0: IntValue<'c>,
        sliver: IntValue<'c>,
        at: &dyn Fn(IntValue<'c>, IntValue<'c>) -> Result<PointerValue<'c>>,
        dst: PointerValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let b = &x.em.b;
        let (mr, lanes) = (self.bl.mr, self.bl.lanes as i64);
        let groups = (mr + lanes - 1) / lanes;
        let mut cols = Vec::new();
        for g in 0..groups {
            let rows: Vec<VectorValue<'c>> = (0..lanes)
                .map(|j| {
                    let i = g * lanes + j;
                    if i >= mr {
                        return Ok(self.vt.get_poison());
                    }
                    let l = b
                        .build_load(self.vt, at(x.addc(r, i)?, k0)?, "ar")
                        .map_err(llvm)?;
                    Ok(align(l, self.bl.bytes as u32)?.into_vector_value())
                })
                .collect::<Result<_>>()?;
            cols.push(self.transpose(rows)?);
        }
        let i32t = x.em.ctx.i32_type();
        for u in 0..lanes {
            for (g, col) in cols.iter().enumerate() {
                let g = g as i64;
                let n = grouped_store_lanes(mr, lanes, u, g);
                let v = if n == lanes {
                    col[u as usize]
                } else {
                    let first = VectorType::const_vector(
                        &(0..n)
                            .map(|k| i32t.const_int(k as u64, false))
                            .collect::<Vec<_>>(),
                    );
                    b.build_shuffle_vector(col[u as usize], self.vt.get_poison(), first, "aw")
                        .map_err(llvm)?
                };
                let idx = x.add(sliver, x.addc(x.mulc(x.addc(k0, u)?, mr)?, g * lanes)?)?;
                b.build_store(x.at(self.ft, dst, idx)?, v)
                    .map_err(llvm)?
                    .set_alignment(self.bl.bytes as u32)
                    .map_err(llvm)?;
            }
        }
        Ok(())
    }

    /// For kk in `kb..kend`: `*dst(kk) = *src(kk)` where `live`, else zeros. The stores are
    /// volatile: they land `mr` or `nr` elements apart, which the loop vectorizer would
    /// otherwise turn into (slow) scatters.
    fn strided_run(
        &self,
        live: IntValue<'c>,
        (kb, kend): (IntValue<'c>, IntValue<'c>),
        src: &dyn Fn(IntValue<'c>) -> Result<PointerValue<'c>>,
        dst: &dyn Fn(IntValue<'c>) -> Result<PointerValue<'c>>,
    ) -> Result<()> {
        let x = &self.x;
        let s_kk = x.slot()?;
        let store = |em: &Emitter<'c>, kk: IntValue<'c>, v: BasicValueEnum<'c>| -> Result<()> {
            em.b.build_store(dst(kk)?, v)
                .map_err(llvm)?
                .set_volatile(true)
                .map_err(llvm)
        };
        x.branch(
            live,
            &mut || {
                x.em.range_loop_ptr(s_kk, kb, kend, 1, &mut |em| {
                    let kk = x.get(s_kk)?;
                    let v = em.b.build_load(self.ft, src(kk)?, "v").map_err(llvm)?;
                    store(em, kk, v)
                })
            },
            &mut || {
                x.em.range_loop_ptr(s_kk, kb, kend, 1, &mut |em| {
                    store(em, x.get(s_kk)?, self.ft.const_zero().into())
                })
            },
        )
    }
}

impl<'c> Gemm<'_, 'c> {
    /// Where row `row` of A starts: `row * k` in a matrix, its window corner in a
    /// convolution's input.
    fn a_row(&self, row: IntValue<'c>) -> Result<IntValue<'c>> {
        let x = &self.x;
        let Some((p, _)) = self.conv else {
            if self.a_trans {
                // [batch, k, m]: row i of batch bt starts at bt * k * m + i.
                let bt = x.sdiv(row, self.m)?;
                let i = x.sub(row, x.mulc(bt, self.m)?)?;
                return x.add(x.mul(bt, x.mul(self.k, x.c(self.m))?)?, i);
            }
            return x.mul(row, self.k);
        };
        let (oh, ow) = (p.oh as i64, p.ow as i64);
        let n = x.sdiv(row, oh * ow)?;
        let rest = x.sub(row, x.mulc(n, oh * ow)?)?;
        let y = x.sdiv(rest, ow)?;
        let xx = x.sub(rest, x.mulc(y, ow)?)?;
        let (h, w, c) = (p.h as i64, p.w as i64, p.c as i64);
        let top = x.add(x.mulc(n, h)?, x.mulc(y, p.stride[0] as i64)?)?;
        let corner = x.add(x.mulc(top, w)?, x.mulc(xx, p.stride[1] as i64)?)?;
        x.mulc(corner, c)
    }

    /// The element of A at column `kk` of the row starting at `row_start` (from `a_row`).
    fn a_at(&self, row_start: IntValue<'c>, kk: IntValue<'c>) -> Result<IntValue<'c>> {
        let x = &self.x;
        match self.conv {
            None if self.a_trans => x.add(row_start, x.mulc(kk, self.m)?),
            None => x.add(row_start, kk),
            Some((_, table)) => {
                let i64t = x.em.ctx.i64_type();
                let off =
                    x.em.b
                        .build_load(i64t, x.at(i64t, table, kk)?, "off")
                        .map_err(llvm)?
                        .into_int_value();
                x.add(row_start, off)
            }
        }
    }

    /// Packs rows `ic..ic_end` (columns `kb..kend`) of A into slivers of `mr` rows (see
    /// [`Regs::pack_a`]): a matrix through its shared routine; a convolution's patches, read
    /// through the column offset table, here, row by row (a contiguous read and a store every
    /// `mr` elements; rows past the block are zeros).
    fn pack_a(
        &self,
        ic: IntValue<'c>,
        ic_end: IntValue<'c>,
        kb: IntValue<'c>,
        kend: IntValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let (mr, kc) = (self.bl.mr, self.bl.kc);
        if self.conv.is_none() {
            let f = Routine::pack_a(self.bl, self.a_trans).function(
                em.ctx,
                em.m,
                em.routines,
                em.target,
            )?;
            let (at, ld) = if self.a_trans {
                (x.add(self.a_row(ic)?, x.mulc(kb, self.m)?)?, x.c(self.m))
            } else {
                (x.add(self.a_row(ic)?, kb)?, self.k)
            };
            let args = [
                x.at(self.ft, self.a, at)?.into(),
                ld.into(),
                x.sub(ic_end, ic)?.into(),
                x.sub(kend, kb)?.into(),
                self.packed_a.into(),
                x.c(kc).into(),
            ];
            em.b.build_call(f, &args, "").map_err(llvm)?;
            return Ok(());
        }
        let (s_r, s_i) = (x.slot()?, x.slot()?);
        x.em.range_loop_ptr(s_r, ic, ic_end, mr, &mut |_| {
            let r = x.get(s_r)?;
            let sliver = x.mulc(x.sub(r, ic)?, kc)?;
            x.em.range_loop_ptr(s_i, x.c(0), x.c(mr), 1, &mut |_| {
                let i = x.get(s_i)?;
                let row = x.add(r, i)?;
                let dst = |kk: IntValue<'c>| -> Result<PointerValue<'c>> {
                    let at = x.add(x.add(sliver, x.mulc(x.sub(kk, kb)?, mr)?)?, i)?;
                    x.at(self.ft, self.packed_a, at)
                };
                let src = self.a_row(row)?;
                self.strided_run(
                    x.cmp(IntPredicate::SLT, row, ic_end)?,
                    (kb, kend),
                    &|kk| x.at(self.ft, self.a, self.a_at(src, kk)?),
                    &dst,
                )
            })
        })
    }
}

impl<'c> Regs<'_, 'c> {
    /// One register tile: the first `rows` of its `mr` rows (all when `rows >= mr`) by
    /// `width` columns of C, at `c` with rows `ldc` apart (columns, when C is stored by
    /// columns: [`Regs::planes`]), accumulate A times `panel` of packed B over `kc` steps, A's
    /// row `i` at step `kk` read at `a(i, kk)`; C is read first unless `first` (the first
    /// contraction block). In update mode the product starts from zero and is folded into C at
    /// the end.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        &self,
        c: PointerValue<'c>,
        ldc: IntValue<'c>,
        rows: IntValue<'c>,
        width: i64,
        a: &dyn Fn(i64, IntValue<'c>) -> Result<PointerValue<'c>>,
        panel: PointerValue<'c>,
        kc: IntValue<'c>,
        first: IntValue<'c>,
    ) -> Result<()> {
        let x = &self.x;
        let em = x.em;
        let (mr, nv, lanes) = (self.bl.mr, self.bl.nv, self.bl.lanes as i64);
        let accs: Vec<PointerValue<'c>> = (0..mr * nv)
            .map(|_| em.entry_alloca(self.vt.into()))
            .collect::<Result<_>>()?;
        let c_at = |i: i64| x.mulc(ldc, i);
        let live: Vec<IntValue<'c>> = (0..mr)
            .map(|i| x.cmp(IntPredicate::SLT, x.c(i), rows))
            .collect::<Result<_>>()?;
        // Rows stored, for a tile stored by columns.
        let n_live = if self.planes {
            Some(x.min(rows, x.c(mr))?)
        } else {
            None
        };
        if let Some(n_live) = n_live {
            if self.update.is_some() {
                return Err(crate::Error::Llvm(
                    "a GEMM storing C by columns has no update mode".into(),
                ));
            }
            let zero = |em: &Emitter<'c>| -> Result<()> {
                for &acc in &accs {
                    em.b.build_store(acc, self.vt.const_zero()).map_err(llvm)?;
                }
                Ok(())
            };
            x.branch(first, &mut || zero(em), &mut || {
                let t = self.load_planes(c, ldc, n_live, width)?;
                for (i, row) in t.iter().enumerate() {
                    for (v, &r) in row.iter().enumerate() {
                        em.b.build_store(accs[i * nv as usize + v], r)
                            .map_err(llvm)?;
                    }
                }
                Ok(())
            })?;
        }
        for i in (0..mr).filter(|_| n_live.is_none()) {
            let read = if self.update.is_some() {
                em.ctx.bool_type().const_zero()
            } else {
                em.b.build_and(
                    live[i as usize],
                    em.b.build_not(first, "nf").map_err(llvm)?,
                    "rd",
                )
                .map_err(llvm)?
            };
            let row = c_at(i)?;
            x.branch(
                read,
                &mut || {
                    for v in 0..nv {
                        let c = self.load_cols(c, x.addc(row, v * lanes)?, width - v * lanes)?;
                        em.b.build_store(accs[(i * nv + v) as usize], c)
                            .map_err(llvm)?;
                    }
                    Ok(())
                },
                &mut || {
                    for v in 0..nv {
                        em.b.build_store(accs[(i * nv + v) as usize], self.vt.const_zero())
                            .map_err(llvm)?;
                    }
                    Ok(())
                },
            )?;
        }
        let s_kk = x.slot()?;
        let step = |em: &Emitter<'c>, kk: IntValue<'c>| -> Result<()> {
            let prow = x.mulc(kk, self.bl.nr())?;
            let bvs: Vec<BasicValueEnum<'c>> = (0..nv)
                .map(|v| {
                    let p = x.at(self.ft, panel, x.addc(prow, v * lanes)?)?;
                    align(
                        em.b.build_load(self.vt, p, "bv").map_err(llvm)?,
                        self.vbytes(),
                    )
                })
                .collect::<Result<_>>()?;
            for i in 0..mr {
                let at = a(i, kk)?;
                let a = em.b.build_load(self.ft, at, "a").map_err(llvm)?;
                let one =
                    em.b.build_insert_element(self.vt.get_undef(), a, x.c(0), "a1")
                        .map_err(llvm)?;
                let splat =
                    em.b.build_shuffle_vector(
                        one,
                        self.vt.get_undef(),
                        em.ctx.i32_type().vec_type(self.bl.lanes).const_zero(),
                        "as",
                    )
                    .map_err(llvm)?;
                for (v, bv) in bvs.iter().enumerate() {
                    let slot = accs[(i * nv) as usize + v];
                    let acc = em.b.build_load(self.vt, slot, "acc").map_err(llvm)?;
                    let fma =
                        em.intrinsic("llvm.fmuladd", self.vt.into(), &[splat.into(), *bv, acc])?;
                    em.b.build_store(slot, fma).map_err(llvm)?;
                }
            }
            Ok(())
        };
        // Full-width tiles take UNROLL contraction steps per loop iteration (fewer loop and
        // pointer instructions between the FMAs); column tails, which run once per row block,
        // keep one, for compile time.
        let unroll = if width == self.bl.nr() { UNROLL } else { 1 };
        let main_end = if unroll > 1 {
            let rem =
                em.b.build_int_signed_rem(kc, x.c(unroll), "kr")
                    .map_err(llvm)?;
            let end = x.sub(kc, rem)?;
            em.range_loop_ptr(s_kk, x.c(0), end, unroll, &mut |em: &Emitter<'c>| {
                let kk = x.get(s_kk)?;
                for u in 0..unroll {
                    step(em, x.addc(kk, u)?)?;
                }
                Ok(())
            })?;
            end
        } else {
            x.c(0)
        };
        em.range_loop_ptr(s_kk, main_end, kc, 1, &mut |em: &Emitter<'c>| {
            let kk = x.get(s_kk)?;
            step(em, kk)
        })?;
        if let Some(n_live) = n_live {
            let tile: Vec<Vec<VectorValue<'c>>> = (0..mr)
                .map(|i| {
                    (0..nv)
                        .map(|v| {
                            Ok(em
                                .b
                                .build_load(self.vt, accs[(i * nv + v) as usize], "acc")
                                .map_err(llvm)?
                                .into_vector_value())
                        })
                        .collect()
                })
                .collect::<Result<_>>()?;
            return self.store_planes(c, ldc, n_live, width, &tile);
        }
        for i in 0..mr {
            let row = c_at(i)?;
            x.branch(
                live[i as usize],
                &mut || {
                    for v in 0..nv {
                        let mut acc =
                            em.b.build_load(self.vt, accs[(i * nv + v) as usize], "acc")
                                .map_err(llvm)?;
                        let at = x.addc(row, v * lanes)?;
                        if let Some((scale, subtract)) = self.update {
                            // C = X - s P (or + s P): the product scaled, then folded in, as the
                            // epilogue computes it.
                            let c = self.load_cols(c, at, width - v * lanes)?;
                            let sp =
                                em.b.build_float_mul(
                                    acc.into_vector_value(),
                                    scale.into_vector_value(),
                                    "sp",
                                )
                                .map_err(llvm)?;
                            acc = if subtract {
                                em.b.build_float_sub(c.into_vector_value(), sp, "upd")
                            } else {
                                em.b.build_float_add(c.into_vector_value(), sp, "upd")
                            }
                            .map_err(llvm)?
                            .into();
                        }
                        self.store_cols(c, at, width - v * lanes, acc)?;
                    }
                    Ok(())
                },
                &mut || Ok(()),
            )?;
        }
        Ok(())
    }
}

/// How many lanes [`Regs::pack_a_grouped`] stores for step `u` of group `g`: the group's rows,
/// or a whole vector where its extra lanes stay inside the block of `lanes` steps, so later
/// steps' stores overwrite them (with 6 rows of 16 lanes they reach over a whole step).
fn grouped_store_lanes(mr: i64, lanes: i64, u: i64, g: i64) -> i64 {
    let w = (mr - g * lanes).min(lanes);
    if u * mr + g * lanes + lanes <= lanes * mr {
        lanes
    } else {
        w
    }
}

/// `v` in every lane of a vector of `lanes` `ft`s.
fn splat<'c>(
    em: &Emitter<'c>,
    ft: FloatType<'c>,
    lanes: u32,
    v: BasicValueEnum<'c>,
) -> Result<VectorValue<'c>> {
    let vt = ft.vec_type(lanes);
    let one =
        em.b.build_insert_element(vt.get_undef(), v, em.i64c(0), "s1")
            .map_err(llvm)?;
    em.b.build_shuffle_vector(
        one,
        vt.get_undef(),
        em.ctx.i32_type().vec_type(lanes).const_zero(),
        "ss",
    )
    .map_err(llvm)
}

/// The name prefix of the GEMM routines compiled as functions of their own.
pub(super) const ROUTINE_PREFIX: &str = "kiln_gemm_";

/// A piece of GEMM code compiled as a function of its own and shared by every GEMM kernel (and,
/// through the kernel cache, every function) that uses it. It depends on the register tile and
/// the element type, never on the product's shape, and it is most of a GEMM kernel's code and
/// of its compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Routine {
    /// Register tiles down a panel, `void (ptr c, i64 ldc, i64 rows, ptr a, i64 lda,
    /// ptr panel, i64 kc, i1 first, float scale)`: the `rows` rows of C at `c` (`ldc` apart),
    /// `mr` at a time, get the product of A at `a` (read as [`ARead`] says) and packed B's
    /// `panel` over `kc` steps, each tile as [`Regs::tile`] describes (`scale` is the update
    /// mode's `s`). One call covers a block of rows, so short contractions (attention's 64
    /// steps) do not pay a call per tile.
    Tile {
        /// Bytes per element (4 or 8).
        bytes: i64,
        /// Elements per vector.
        lanes: u32,
        /// Rows of the tile.
        mr: i64,
        /// Vectors per row.
        nv: i64,
        /// Columns stored: a whole panel's, or the tail panel's.
        width: i64,
        /// Update mode: C - s P (`Some(true)`) or C + s P (`Some(false)`).
        update: Option<bool>,
        /// How A is read.
        a: ARead,
        /// C is stored by columns ([`Regs::planes`]): `ldc` is then the distance between
        /// columns, and the tiles' rows are consecutive elements.
        planes: bool,
    },
    /// A block of A packed into slivers, `void (ptr src, i64 ld, i64 rows, i64 span, ptr dst,
    /// i64 stride)`, as [`Regs::pack_a`] describes.
    PackA {
        bytes: i64,
        /// Elements per vector of the GEMM (the width of a block of steps when `mr` is not a
        /// power of two).
        lanes: u32,
        /// Rows per sliver.
        mr: i64,
        /// A stored `[k, m]`.
        trans: bool,
    },
    /// A panel of B packed, `void (ptr src, i64 ld, i64 span, ptr panel)`, as
    /// [`Regs::pack_b`] describes.
    PackB {
        bytes: i64,
        lanes: u32,
        nv: i64,
        /// Columns of the panel read from B (the others are zeros).
        width: i64,
        /// B stored `[n, k]`.
        trans: bool,
    },
}

/// How a register tile reads A: row `i` (of the tile) at contraction step `kk`, from `a`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum ARead {
    /// Packed slivers, `lda` elements apart: `a[kk * mr + i]` in each.
    Packed,
    /// A matrix stored by rows, read in place: `a[i * lda + kk]`.
    Rows,
    /// A matrix stored transposed (`[k, m]`), read in place: `a[i + kk * lda]`.
    Cols,
}

impl ARead {
    /// How the tile of a GEMM reads A: packed when the product has several panels of columns
    /// (`one_panel` false); with one, in place, by rows or by columns (`a_trans`), or, for a
    /// convolution (`conv`), through its column offset table inline (`None`: no routine).
    fn of(one_panel: bool, conv: bool, a_trans: bool) -> Option<ARead> {
        match (one_panel, conv, a_trans) {
            (false, _, _) => Some(ARead::Packed),
            (true, true, _) => None,
            (true, false, false) => Some(ARead::Rows),
            (true, false, true) => Some(ARead::Cols),
        }
    }
}

impl Routine {
    fn tile(bl: Blocking, width: i64, update: Option<bool>, a: ARead, planes: bool) -> Routine {
        Routine::Tile {
            bytes: bl.bytes,
            lanes: bl.lanes,
            mr: bl.mr,
            nv: bl.nv,
            width,
            update,
            a,
            planes,
        }
    }

    fn pack_a(bl: Blocking, trans: bool) -> Routine {
        Routine::PackA {
            bytes: bl.bytes,
            lanes: bl.lanes,
            mr: bl.mr,
            trans,
        }
    }

    fn pack_b(bl: Blocking, width: i64, trans: bool) -> Routine {
        Routine::PackB {
            bytes: bl.bytes,
            lanes: bl.lanes,
            nv: bl.nv,
            width,
            trans,
        }
    }

    /// The routines a GEMM of `n` columns calls: a pack of B for each panel width (whole
    /// panels and the tail's), and a tile for each, except for a convolution with a single
    /// panel of columns (its tile reads the input in place through the column offset table,
    /// emitted inline); and with several panels, unless it is a convolution's or the first
    /// product of a chain (`chained`, which reads A in place), the pack of A. A convolution's
    /// output stored by planes has tiles that store C by columns.
    pub(super) fn of_gemm(
        bl: Blocking,
        n: i64,
        (a_trans, b_trans): (bool, bool),
        conv: Option<&ConvPatches>,
        update: Option<bool>,
        chained: bool,
    ) -> Vec<Routine> {
        let planes = conv.is_some_and(|p| p.planes);
        let conv = conv.is_some();
        let nr = bl.nr();
        let widths: Vec<i64> = (n >= nr)
            .then_some(nr)
            .into_iter()
            .chain((n % nr != 0).then_some(n % nr))
            .collect();
        let packs = widths.iter().map(|&w| Routine::pack_b(bl, w, b_trans));
        let a = ARead::of(n <= nr || chained, conv, a_trans);
        let tiles = widths
            .iter()
            .filter_map(|&w| Some(Routine::tile(bl, w, update, a?, planes)));
        let pack_a = (n > nr && !conv && !chained).then(|| Routine::pack_a(bl, a_trans));
        packs.chain(tiles).chain(pack_a).collect()
    }

    /// The function's symbol, which names every field.
    pub(super) fn name(&self) -> String {
        match *self {
            Routine::Tile {
                bytes,
                lanes,
                mr,
                nv,
                width,
                update,
                a,
                planes,
            } => {
                let mode = match update {
                    None => "set",
                    Some(true) => "sub",
                    Some(false) => "add",
                };
                let a = match a {
                    ARead::Packed => "p",
                    ARead::Rows => "r",
                    ARead::Cols => "c",
                };
                format!(
                    "{ROUTINE_PREFIX}tile_f{}_{lanes}x{mr}x{nv}_w{width}_{mode}_{a}{}",
                    bytes * 8,
                    if planes { "_planes" } else { "" }
                )
            }
            Routine::PackA {
                bytes,
                lanes,
                mr,
                trans,
            } => format!(
                "{ROUTINE_PREFIX}packa_f{}_{mr}x{lanes}_{}",
                bytes * 8,
                if trans { "t" } else { "n" }
            ),
            Routine::PackB {
                bytes,
                lanes,
                nv,
                width,
                trans,
            } => format!(
                "{ROUTINE_PREFIX}packb_f{}_{lanes}x{nv}_w{width}_{}",
                bytes * 8,
                if trans { "t" } else { "n" }
            ),
        }
    }

    /// The register tile and element type this routine works with (only those fields of the
    /// blocking are read).
    fn regs_blocking(&self) -> Blocking {
        let (bytes, lanes, mr, nv) = match *self {
            Routine::Tile {
                bytes,
                lanes,
                mr,
                nv,
                ..
            } => (bytes, lanes, mr, nv),
            Routine::PackA {
                bytes, lanes, mr, ..
            } => (bytes, lanes, mr, 0),
            Routine::PackB {
                bytes, lanes, nv, ..
            } => (bytes, lanes, 0, nv),
        };
        Blocking {
            bytes,
            lanes,
            mr,
            nv,
            kc: 0,
            mc: 0,
            nc: 0,
        }
    }

    /// The function in module `m`: declared, or (with [`Routines::Here`]) defined there once.
    pub(super) fn function<'c>(
        &self,
        ctx: &'c Context,
        m: &'c Module<'c>,
        routines: Routines,
        target: Target,
    ) -> Result<FunctionValue<'c>> {
        let name = self.name();
        if let Some(f) = m.get_function(&name) {
            return Ok(f);
        }
        let bl = self.regs_blocking();
        let ptr = ctx.ptr_type(AddressSpace::default());
        let i64t = ctx.i64_type();
        let ft = if bl.bytes == 8 {
            ctx.f64_type()
        } else {
            ctx.f32_type()
        };
        // The parameters (see each variant): pointers (`p`, none aliasing another), 64-bit
        // integers (`i`), a flag (`b`) and a float (`f`).
        let sig = match self {
            Routine::Tile { .. } => "piipipibf",
            Routine::PackA { .. } => "piiipi",
            Routine::PackB { .. } => "piip",
        };
        let params: Vec<BasicMetadataTypeEnum<'c>> = sig
            .chars()
            .map(|c| match c {
                'p' => ptr.into(),
                'i' => i64t.into(),
                'b' => ctx.bool_type().into(),
                _ => ft.into(),
            })
            .collect();
        let ty = ctx.void_type().fn_type(&params, false);
        let f = m.add_function(&name, ty, None);
        // Hidden: a library's kernels call its own copy directly, not through the PLT.
        f.as_global_value()
            .set_visibility(inkwell::GlobalVisibility::Hidden);
        let attr =
            |name: &str| ctx.create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0);
        for (i, _) in sig.char_indices().filter(|&(_, c)| c == 'p') {
            f.add_attribute(AttributeLoc::Param(i as u32), attr("noalias"));
        }
        if routines == Routines::Apart {
            return Ok(f);
        }
        // Not inlined, so that a module that defines it compiles the same code as the kernel
        // cache, which links it in.
        f.add_attribute(AttributeLoc::Function, attr("noinline"));
        host_attributes(ctx, f, target);
        let b = ctx.create_builder();
        b.position_at_end(ctx.append_basic_block(f, "entry"));
        let param = |i: u32| f.get_nth_param(i).expect("declared");
        let first = param(0).into_pointer_value();
        let te = Emitter::new(ctx, m, b, f, first, target, routines);
        let update = match *self {
            Routine::Tile {
                update: Some(sub), ..
            } => Some((splat(&te, ft, bl.lanes, param(8))?.into(), sub)),
            _ => None,
        };
        let regs = Regs {
            x: Arith { em: &te },
            bl,
            ft,
            vt: ft.vec_type(bl.lanes),
            update,
            planes: matches!(*self, Routine::Tile { planes: true, .. }),
        };
        match *self {
            Routine::Tile {
                mr,
                width,
                a,
                planes,
                ..
            } => {
                let (base, lda) = (param(3).into_pointer_value(), param(4).into_int_value());
                let (ldc, rows) = (param(1).into_int_value(), param(2).into_int_value());
                let x = &regs.x;
                // One tile per `mr` rows: rows `r..` of C, and of A (a sliver `lda` elements
                // after the last when packed).
                let s_r = x.slot()?;
                te.range_loop_ptr(s_r, x.c(0), rows, mr, &mut |_| {
                    let r = x.get(s_r)?;
                    let left = x.sub(rows, r)?;
                    let base = x.at(ft, base, if a == ARead::Cols { r } else { x.mul(r, lda)? })?;
                    // Read in place, rows past the block read the last one (their results are
                    // not stored).
                    let starts: Vec<IntValue<'c>> = match a {
                        ARead::Packed => Vec::new(),
                        ARead::Rows | ARead::Cols => {
                            let last = x.sub(left, x.c(1))?;
                            (0..mr)
                                .map(|i| {
                                    let i = x.min(x.c(i), last)?;
                                    if a == ARead::Rows {
                                        x.mul(i, lda)
                                    } else {
                                        Ok(i)
                                    }
                                })
                                .collect::<Result<_>>()?
                        }
                    };
                    let at = |i: i64, kk: IntValue<'c>| -> Result<PointerValue<'c>> {
                        let idx = match a {
                            ARead::Packed => x.addc(x.mulc(kk, mr)?, i)?,
                            ARead::Rows => x.add(starts[i as usize], kk)?,
                            ARead::Cols => x.add(starts[i as usize], x.mul(kk, lda)?)?,
                        };
                        x.at(ft, base, idx)
                    };
                    regs.tile(
                        x.at(ft, first, if planes { r } else { x.mul(r, ldc)? })?,
                        ldc,
                        left,
                        width,
                        &at,
                        param(5).into_pointer_value(),
                        param(6).into_int_value(),
                        param(7).into_int_value(),
                    )
                })?;
            }
            Routine::PackA { trans, .. } => regs.pack_a(
                first,
                param(1).into_int_value(),
                param(2).into_int_value(),
                param(3).into_int_value(),
                param(4).into_pointer_value(),
                param(5).into_int_value(),
                trans,
            )?,
            Routine::PackB { width, trans, .. } => regs.pack_b(
                first,
                param(1).into_int_value(),
                param(2).into_int_value(),
                width,
                trans,
                param(3).into_pointer_value(),
            )?,
        }
        te.b.build_return(None).map_err(llvm)?;
        Ok(f)
    }
}

/// Code applied to a finished block of C: rows `.0`, columns `.1`, with C stored at `.2` from
/// row `.3` on (`out` from row 0, or a chained GEMM's block buffer from the block's first row);
/// `.4` for a block of a softmax computed online (whose buffer holds the block's columns
/// only).
pub(super) type Epilogue<'a, 'c> = &'a mut dyn FnMut(
    (IntValue<'c>, IntValue<'c>),
    (IntValue<'c>, IntValue<'c>),
    PointerValue<'c>,
    IntValue<'c>,
    Option<&OnlineBlock<'c>>,
) -> Result<()>;

/// Emits the GEMM over rows `lo..hi` of `[batch * m, n]` C, then `epilogue` over each block of
/// C as soon as its last contraction block is done (while the block is still in cache). `scratch` holds at least
/// [`Blocking::scratch_bytes`] bytes, 64-byte aligned.
///
/// With `update = Some((s, subtract))` (and no epilogue) C already holds a matrix X, and the
/// GEMM computes `X - s P` (or `X + s P`) in place: an SGD step written into the donated
/// parameter. With one contraction block that is bit for bit the epilogue's `X - P s`; with
/// several, each block's product is folded in on its own.
///
/// With `k_at_run`, the contraction length is that value (the kernel's parameter), not `k`:
/// one function then serves products that differ only in it (`k` is one of them, not 0).
///
/// With `chain` (a row epilogue, `k` at most one contraction block), each block of rows of C
/// lives in the scratch memory instead of `out`: after the epilogue the chained product
/// multiplies it by its B, packed once per batch, into the chain's `out` (see
/// [`crate::kernel::Chain`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn emit<'c>(
    em: &Emitter<'c>,
    d: DType,
    bl: Blocking,
    (m, n, k): (i64, i64, i64),
    k_at_run: Option<IntValue<'c>>,
    (a_trans, b_trans): (bool, bool),
    conv: Option<&ConvPatches>,
    out: PointerValue<'c>,
    scratch: PointerValue<'c>,
    (lo, hi): (IntValue<'c>, IntValue<'c>),
    split_columns: bool,
    epilogue: Option<Epilogue<'_, 'c>>,
    update: Option<(BasicValueEnum<'c>, bool)>,
    chain: Option<Chain<'c>>,
) -> Result<()> {
    let mut epilogue = epilogue;
    let x = Arith { em };
    let planes = conv.is_some_and(|p| p.planes);
    if planes && (update.is_some() || chain.is_some()) {
        return Err(crate::Error::Llvm(
            "a convolution's GEMM storing its output by planes takes no update or chained \
             product"
                .into(),
        ));
    }
    // lo..hi are rows, or with `split_columns` panels of columns (all rows).
    let (lo, hi, col_lo, col_hi) = if split_columns {
        let nr = bl.nr();
        let col_hi = x.min(x.mulc(hi, nr)?, x.c(n))?;
        (x.c(0), x.c(m), x.mulc(lo, nr)?, col_hi)
    } else {
        (lo, hi, x.c(0), x.c(n))
    };
    let ft = em.ftype(d);
    let ptr = em.ctx.ptr_type(AddressSpace::default());
    let base = |i: i64| -> Result<PointerValue<'c>> {
        let slot = x.at(ptr, em.inputs.get(), x.c(i))?;
        Ok(em
            .b
            .build_load(ptr, slot, "base")
            .map_err(llvm)?
            .into_pointer_value())
    };
    let nc = bl.nc_for(n);
    // A convolution's column offsets, as a constant table in the module.
    let conv = match conv {
        None => None,
        Some(p) => {
            let i64t = em.ctx.i64_type();
            let offsets: Vec<IntValue<'c>> = p
                .column_offsets()
                .iter()
                .map(|&o| i64t.const_int(o as u64, true))
                .collect();
            let table = i64t.const_array(&offsets);
            let name = format!("{}.patch_offsets", em.f.get_name().to_string_lossy());
            let global = em.m.add_global(table.get_type(), None, &name);
            global.set_initializer(&table);
            global.set_constant(true);
            global.set_linkage(inkwell::module::Linkage::Private);
            Some((p, global.as_pointer_value()))
        }
    };
    let g = Gemm {
        r: Regs {
            x: Arith { em },
            bl,
            ft,
            vt: ft.vec_type(bl.lanes),
            update: match update {
                None => None,
                Some((scale, subtract)) => Some((splat(em, ft, bl.lanes, scale)?.into(), subtract)),
            },
            planes,
        },
        m,
        a_trans,
        k: k_at_run.unwrap_or(x.c(k)),
        a: base(0)?,
        conv,
        b: base(1)?,
        packed_b: scratch,
        packed_a: x.at(ft, scratch, x.c(bl.kc * nc))?,
    };
    let (s_r, s_j) = (x.slot()?, x.slot()?);
    // Where element (r, j) of C lies in `out`: by rows, or, stored by planes, column j of
    // batch r / m's `[m, n]` product at `(r / m) * m * n + j * m + r % m`.
    let out_at = |r: IntValue<'c>, j: IntValue<'c>| -> Result<IntValue<'c>> {
        if planes {
            let bt = x.sdiv(r, m)?;
            x.add(x.add(r, x.mulc(bt, m * (n - 1))?)?, x.mulc(j, m)?)
        } else {
            x.add(x.mulc(r, n)?, j)
        }
    };
    // The distance between C's rows (its columns, by planes) that tiles are given.
    let ldc = x.c(if planes { m } else { n });
    if k == 0 && planes {
        // An empty contraction: the product is zero, then the epilogue, an image at a time.
        let s_bt = x.slot()?;
        let b_lo = x.sdiv(lo, m)?;
        let b_hi = x.addc(x.sdiv(x.sub(hi, x.c(1))?, m)?, 1)?;
        em.range_loop_ptr(s_bt, b_lo, b_hi, 1, &mut |em| {
            let bt = x.get(s_bt)?;
            let r_lo = x.max(lo, x.mulc(bt, m)?)?;
            let r_hi = x.min(hi, x.addc(x.mulc(bt, m)?, m)?)?;
            em.range_loop_ptr(s_r, r_lo, r_hi, 1, &mut |em| {
                let r = x.get(s_r)?;
                em.range_loop_ptr(s_j, x.c(0), x.c(n), 1, &mut |em| {
                    let p = x.at(ft, out, out_at(r, x.get(s_j)?)?)?;
                    em.b.build_store(p, ft.const_zero()).map_err(llvm)?;
                    Ok(())
                })
            })?;
            match epilogue.as_mut() {
                Some(e) => e((r_lo, r_hi), (x.c(0), x.c(n)), out, x.c(0), None),
                None => Ok(()),
            }
        })?;
        return Ok(());
    }
    if k == 0 {
        // An empty contraction: the product is zero.
        em.range_loop_ptr(s_r, x.mulc(lo, n)?, x.mulc(hi, n)?, 1, &mut |em| {
            let p = x.at(ft, out, x.get(s_r)?)?;
            let v = match update {
                None => ft.const_zero(),
                Some((scale, subtract)) => {
                    let old =
                        em.b.build_load(ft, p, "x")
                            .map_err(llvm)?
                            .into_float_value();
                    let sp =
                        em.b.build_float_mul(ft.const_zero(), scale.into_float_value(), "sp")
                            .map_err(llvm)?;
                    if subtract {
                        em.b.build_float_sub(old, sp, "upd")
                    } else {
                        em.b.build_float_add(old, sp, "upd")
                    }
                    .map_err(llvm)?
                }
            };
            em.b.build_store(p, v).map_err(llvm)?;
            Ok(())
        })?;
        if let Some(e) = epilogue.as_mut() {
            e((lo, hi), (col_lo, col_hi), out, x.c(0), None)?;
        }
        return Ok(());
    }
    // A chained product's buffers, and where the block of C starting at row `ic` lies.
    let chained = match &chain {
        None => None,
        Some(ch) => {
            let at = bl.chain_scratch(n, ch.bl, ch.n, ch.online.then_some(m));
            Some(Chained {
                ch,
                ft,
                k: n,
                cols2: at.cols2,
                p: x.at(ft, scratch, x.c(at.p))?,
                b2: x.at(ft, scratch, x.c(at.b2))?,
                a2: x.at(ft, scratch, x.c(at.a2))?,
                max: x.at(ft, scratch, x.c(at.max))?,
                sum: x.at(ft, scratch, x.c(at.sum))?,
                online_ld: bl.nc,
                b: base(ch.b)?,
            })
        }
    };
    let online = chain.as_ref().is_some_and(|c| c.online);
    let c_block = |ic: IntValue<'c>| -> (PointerValue<'c>, IntValue<'c>) {
        match &chained {
            None => (out, x.c(0)),
            Some(c) => (c.p, ic),
        }
    };
    // Element (r, j) of C, in the block of rows starting at row `ic` (and, for an online
    // softmax, of columns starting at `jc`: its buffer holds those only, `nc` to a row).
    let c_at = |ic: IntValue<'c>, jc: IntValue<'c>, r: IntValue<'c>, j: IntValue<'c>| {
        let at = match &chained {
            None => out_at(r, j)?,
            Some(_) if online => x.add(x.mulc(x.sub(r, ic)?, bl.nc)?, x.sub(j, jc)?)?,
            Some(_) => out_at(x.sub(r, ic)?, j)?,
        };
        x.at(ft, c_block(ic).0, at)
    };
    let ldc = if online { x.c(bl.nc) } else { ldc };
    let nr = bl.nr();
    let n_full = n - n % nr;
    let (s_bt, s_jc, s_kb, s_ic) = (x.slot()?, x.slot()?, x.slot()?, x.slot()?);
    // The batches that rows lo..hi touch.
    let b_lo = x.sdiv(lo, m)?;
    let b_hi = x.addc(x.sdiv(x.sub(hi, x.c(1))?, m)?, 1)?;
    em.range_loop_ptr(s_bt, b_lo, b_hi, 1, &mut |_| {
        let bt = x.get(s_bt)?;
        let r_lo = x.max(lo, x.mulc(bt, m)?)?;
        let r_hi = x.min(hi, x.addc(x.mulc(bt, m)?, m)?)?;
        // A convolution's kernel is the B of every batch.
        let b_base = if g.conv.is_some() {
            x.c(0)
        } else {
            x.mul(bt, x.mul(g.k, x.c(n))?)?
        };
        match &chained {
            Some(c) if !online => c.pack_b(em, bt)?,
            _ => {}
        }
        x.em.range_loop_ptr(s_jc, col_lo, col_hi, nc, &mut |_| {
            let jc = x.get(s_jc)?;
            let jc_end = x.min(x.addc(jc, nc)?, col_hi)?;
            // An online softmax's chained product takes this block's rows of its B.
            match &chained {
                Some(c) if online => c.pack_b_rows(em, bt, (jc, x.sub(jc_end, jc)?), c.b2)?,
                _ => {}
            }
            let full_end = x.min(jc_end, x.c(n_full))?;
            // The tail panel (fewer than nr columns) is the last one of the last block.
            let has_tail = x.cmp(IntPredicate::SGT, jc_end, x.c(n_full))?;
            let panel_of = |j: IntValue<'c>| -> Result<PointerValue<'c>> {
                x.at(ft, g.packed_b, x.mulc(x.sub(j, jc)?, bl.kc)?)
            };
            x.em.range_loop_ptr(s_kb, x.c(0), g.k, bl.kc, &mut |_| {
                let kb = x.get(s_kb)?;
                let kend = x.min(x.addc(kb, bl.kc)?, g.k)?;
                let kc = x.sub(kend, kb)?;
                let first = x.cmp(IntPredicate::EQ, kb, x.c(0))?;
                // Panel `j` of B (`width` columns) through its packing routine.
                let source = BSource {
                    b: g.b,
                    base: b_base,
                    k: g.k,
                    n,
                    trans: b_trans,
                };
                let pack = |j: IntValue<'c>, width: i64| -> Result<()> {
                    pack_b_panel(&x, ft, bl, &source, (j, width), (kb, kc), panel_of(j)?)
                };
                // (Whole panels only when there are any: no dead code calling routines the
                // kernel cache does not compile.)
                if n_full > 0 {
                    x.em.range_loop_ptr(s_j, jc, full_end, nr, &mut |_| pack(x.get(s_j)?, nr))?;
                }
                if n_full < n {
                    x.branch(
                        has_tail,
                        &mut || {
                            let j = x.c(n_full);
                            pack(j, n - n_full)
                        },
                        &mut || Ok(()),
                    )?;
                }
                x.em.range_loop_ptr(s_ic, r_lo, r_hi, bl.mc, &mut |_| {
                    let ic = x.get(s_ic)?;
                    let ic_end = x.min(x.addc(ic, bl.mc)?, r_hi)?;
                    // The block itself, unless a mask leaves nothing of it.
                    let mut block = || -> Result<()> {
                        // One panel: each sliver of A meets one panel, so the tile reads A where it
                        // is instead of packing it first. For a convolution that is its input
                        // through the column offset table (an implicit im2col with no patch matrix
                        // at all): measured on conv 3x3 64 -> 64 and conv 7x7/2 3 -> 64 (alternating
                        // A/B calls), 14 of 15 and 15 of 15 pairs won, about 20% and 11% faster.
                        // A chained product's first product (one short contraction block, attention's
                        // queries) reads A in place too: measured on attention_8x8x512x64 (one
                        // process, alternating calls), 17 of 20 pairs won, 23.40 -> 23.22 ms.
                        let direct = n <= nr || chain.is_some();
                        if !direct {
                            g.pack_a(ic, ic_end, kb, kend)?;
                        }
                        let slivers = |j: IntValue<'c>, width: i64| -> Result<()> {
                            let panel = panel_of(j)?;
                            // The tile's code is a function shared by every GEMM with the same
                            // tile (see [`Routine`]), except a convolution's reading its input in
                            // place, emitted here with the column offset table.
                            let shared = match ARead::of(direct, g.conv.is_some(), g.a_trans) {
                                None => None,
                                Some(a) => {
                                    let t =
                                        Routine::tile(bl, width, update.map(|u| u.1), a, planes);
                                    Some((t.function(em.ctx, em.m, em.routines, em.target)?, a))
                                }
                            };
                            if let Some((f, a)) = shared {
                                let (at, lda) = match a {
                                    ARead::Packed => (g.packed_a, x.c(bl.kc)),
                                    ARead::Rows => (x.at(ft, g.a, x.add(g.a_row(ic)?, kb)?)?, g.k),
                                    ARead::Cols => (
                                        x.at(ft, g.a, x.add(g.a_row(ic)?, x.mulc(kb, m)?)?)?,
                                        x.c(m),
                                    ),
                                };
                                let scale = update.map_or(ft.const_zero().into(), |u| u.0);
                                em.b.build_call(
                                    f,
                                    &[
                                        c_at(ic, jc, ic, j)?.into(),
                                        ldc.into(),
                                        x.sub(ic_end, ic)?.into(),
                                        at.into(),
                                        lda.into(),
                                        panel.into(),
                                        kc.into(),
                                        first.into(),
                                        scale.into(),
                                    ],
                                    "",
                                )
                                .map_err(llvm)?;
                                return Ok(());
                            }
                            x.em.range_loop_ptr(s_r, ic, ic_end, bl.mr, &mut |_| {
                                let r = x.get(s_r)?;
                                let c = c_at(ic, jc, r, j)?;
                                let rows = x.sub(ic_end, r)?;
                                // Where each row of the tile starts (rows past the block read the
                                // last one; their results are not stored).
                                let last = x.sub(ic_end, x.c(1))?;
                                let starts: Vec<IntValue<'c>> = (0..bl.mr)
                                    .map(|i| g.a_row(x.min(x.addc(r, i)?, last)?))
                                    .collect::<Result<_>>()?;
                                let a = |i: i64, kk: IntValue<'c>| {
                                    x.at(ft, g.a, g.a_at(starts[i as usize], x.add(kb, kk)?)?)
                                };
                                g.tile(c, ldc, rows, width, &a, panel, kc, first)
                            })
                        };
                        if n_full > 0 {
                            x.em.range_loop_ptr(s_j, jc, full_end, nr, &mut |_| {
                                slivers(x.get(s_j)?, nr)
                            })?;
                        }
                        if n_full < n {
                            x.branch(
                                has_tail,
                                &mut || slivers(x.c(n_full), n - n_full),
                                &mut || Ok(()),
                            )?;
                        }
                        if let Some(e) = epilogue.as_mut() {
                            let last = x.cmp(IntPredicate::SGE, kend, g.k)?;
                            let (c, row0) = c_block(ic);
                            x.branch(
                                last,
                                &mut || match &chained {
                                    Some(ch) if online => {
                                        let block = OnlineBlock {
                                            first: x.cmp(IntPredicate::EQ, jc, col_lo)?,
                                            ld: bl.nc,
                                            max: ch.max,
                                            sum: ch.sum,
                                            base: x.mulc(bt, m)?,
                                            out: ch.ch.out,
                                            n2: ch.ch.n,
                                        };
                                        e((ic, ic_end), (jc, jc_end), c, row0, Some(&block))?;
                                        ch.product_block(
                                            em,
                                            (ic, ic_end),
                                            x.sub(jc_end, jc)?,
                                            block.first,
                                        )
                                    }
                                    Some(ch) => {
                                        e((ic, ic_end), (jc, jc_end), c, row0, None)?;
                                        ch.product(em, ic, ic_end)
                                    }
                                    None => e((ic, ic_end), (jc, jc_end), c, row0, None),
                                },
                                &mut || Ok(()),
                            )?;
                        }
                        Ok(())
                    };
                    match (&chained, chain.as_ref().and_then(|c| c.masked)) {
                        (Some(ch), Some(mask)) if online => {
                            let base = x.mulc(bt, m)?;
                            let skip = all_masked(
                                &x,
                                mask,
                                (x.sub(ic, base)?, x.sub(ic_end, base)?),
                                (jc, jc_end),
                            )?;
                            let first = x.cmp(IntPredicate::EQ, jc, col_lo)?;
                            x.branch(
                                skip,
                                &mut || {
                                    x.branch(
                                        first,
                                        &mut || ch.clear_rows(em, (ic, ic_end), base),
                                        &mut || Ok(()),
                                    )
                                },
                                &mut block,
                            )
                        }
                        _ => block(),
                    }
                })
            })
        })?;
        // An online softmax's rows are divided by their sums once all their columns are in.
        match &chained {
            Some(ch) if online => ch.normalize(em, (r_lo, r_hi), x.mulc(bt, m)?),
            _ => Ok(()),
        }
    })
}

/// Whether every position of a block of rows `rows` (within their batch) and columns `cols`
/// (both half-open) is masked out by `(a, b, c)` (see [`crate::kernel::Chain::masked`]):
/// whether `col * a + row * b + c`, least at one of the block's corners, is positive there.
fn all_masked<'c>(
    x: &Arith<'_, 'c>,
    (a, b, c): (i64, i64, i64),
    (r0, r1): (IntValue<'c>, IntValue<'c>),
    (j0, j1): (IntValue<'c>, IntValue<'c>),
) -> Result<IntValue<'c>> {
    let j = if a >= 0 { j0 } else { x.addc(j1, -1)? };
    let r = if b >= 0 { r0 } else { x.addc(r1, -1)? };
    let least = x.addc(x.add(x.mulc(j, a)?, x.mulc(r, b)?)?, c)?;
    x.cmp(IntPredicate::SGT, least, x.c(0))
}

/// A batch of a GEMM's B, as its panels are packed: `[k, n]` from element `base` of `b`
/// (`[n, k]` with `trans`).
struct BSource<'c> {
    b: PointerValue<'c>,
    base: IntValue<'c>,
    k: IntValue<'c>,
    n: i64,
    trans: bool,
}

/// Packs panel `j` of `src` (`width` columns, the others zeros), contraction steps
/// `kb..kb + span`, at `dst` through its routine (see [`Regs::pack_b`]).
fn pack_b_panel<'c>(
    x: &Arith<'_, 'c>,
    ft: FloatType<'c>,
    bl: Blocking,
    src: &BSource<'c>,
    (j, width): (IntValue<'c>, i64),
    (kb, span): (IntValue<'c>, IntValue<'c>),
    dst: PointerValue<'c>,
) -> Result<()> {
    let em = x.em;
    let f = Routine::pack_b(bl, width, src.trans).function(em.ctx, em.m, em.routines, em.target)?;
    let (at, ld) = if src.trans {
        (x.add(x.add(src.base, x.mul(j, src.k)?)?, kb)?, src.k)
    } else {
        (x.add(x.add(src.base, x.mulc(kb, src.n)?)?, j)?, x.c(src.n))
    };
    let args = [
        x.at(ft, src.b, at)?.into(),
        ld.into(),
        span.into(),
        dst.into(),
    ];
    em.b.build_call(f, &args, "").map_err(llvm)?;
    Ok(())
}

/// A chained product (see [`Chain`]) as [`emit`] runs it, with its buffers: the block of the
/// first product's epilogue result at `p` (`k` columns), its B packed at `b2` and its block of
/// A packed at `a2` (see [`ChainScratch`]), and its B's kernel input at `b`.
struct Chained<'a, 'c> {
    ch: &'a Chain<'c>,
    ft: FloatType<'c>,
    /// The contraction length: the first product's columns.
    k: i64,
    /// Columns of each packed contraction block of B2.
    cols2: i64,
    p: PointerValue<'c>,
    b2: PointerValue<'c>,
    a2: PointerValue<'c>,
    /// An online softmax's running maximum and sum per row of a batch.
    max: PointerValue<'c>,
    sum: PointerValue<'c>,
    /// Columns per row of an online softmax's block buffer.
    online_ld: i64,
    b: PointerValue<'c>,
}

impl<'c> Chained<'_, 'c> {
    /// Packs batch `bt` of the chained product's B (`[batch, k, n]`, `[batch, n, k]`
    /// transposed) whole at `b2`: contraction block `kb` (of the chain's `kc` steps) at
    /// `kb * cols2`, each as [`Self::pack_b_rows`] packs it.
    fn pack_b(&self, em: &Emitter<'c>, bt: IntValue<'c>) -> Result<()> {
        let (bl, k) = (self.ch.bl, self.k);
        let x = Arith { em };
        let s_kb = x.slot()?;
        em.range_loop_ptr(s_kb, x.c(0), x.c(k), bl.kc, &mut |_| {
            let kb = x.get(s_kb)?;
            let span = x.sub(x.min(x.addc(kb, bl.kc)?, x.c(k))?, kb)?;
            self.pack_b_rows(
                em,
                bt,
                (kb, span),
                x.at(self.ft, self.b2, x.mulc(kb, self.cols2)?)?,
            )
        })
    }

    /// Packs contraction steps `kb..kb + span` (at most the chain's `kc`) of batch `bt` of the
    /// chained product's B at `to`, as [`emit`] packs B's panels: panel `j` (a column index)
    /// at `j * kc`.
    fn pack_b_rows(
        &self,
        em: &Emitter<'c>,
        bt: IntValue<'c>,
        (kb, span): (IntValue<'c>, IntValue<'c>),
        to: PointerValue<'c>,
    ) -> Result<()> {
        let (ch, ft, k) = (self.ch, self.ft, self.k);
        let x = Arith { em };
        let (bl, n) = (ch.bl, ch.n);
        let source = BSource {
            b: self.b,
            base: x.mulc(bt, k * n)?,
            k: x.c(k),
            n,
            trans: ch.b_trans,
        };
        self.panels(em, &|j, width| {
            let at = x.at(ft, to, x.mulc(j, bl.kc)?)?;
            pack_b_panel(&x, ft, bl, &source, (j, width), (kb, span), at)
        })
    }

    /// Runs `f` on each panel of the chained product's columns: its first column and its width
    /// (whole panels in a loop, then the tail panel's).
    fn panels(&self, em: &Emitter<'c>, f: &dyn Fn(IntValue<'c>, i64) -> Result<()>) -> Result<()> {
        let x = Arith { em };
        let (nr, n) = (self.ch.bl.nr(), self.ch.n);
        let n_full = n - n % nr;
        let s_j = x.slot()?;
        if n_full > 0 {
            em.range_loop_ptr(s_j, x.c(0), x.c(n_full), nr, &mut |_| f(x.get(s_j)?, nr))?;
        }
        if n_full < n {
            f(x.c(n_full), n - n_full)?;
        }
        Ok(())
    }

    /// The chained product of rows `ic..ic_end`: their block of the first product's epilogue
    /// result (at `p` from row `ic` on) times its B packed at `b2` (see [`Self::pack_b`]), into
    /// rows `ic..ic_end` of the chain's `out`, by contraction blocks (see [`Self::step`]).
    fn product(&self, em: &Emitter<'c>, ic: IntValue<'c>, ic_end: IntValue<'c>) -> Result<()> {
        let (ft, k, bl) = (self.ft, self.k, self.ch.bl);
        let x = Arith { em };
        let s_kb = x.slot()?;
        em.range_loop_ptr(s_kb, x.c(0), x.c(k), bl.kc, &mut |_| {
            let kb = x.get(s_kb)?;
            let kc = x.sub(x.min(x.addc(kb, bl.kc)?, x.c(k))?, kb)?;
            let first = x.cmp(IntPredicate::EQ, kb, x.c(0))?;
            let panels = x.at(ft, self.b2, x.mulc(kb, self.cols2)?)?;
            self.step(
                em,
                (ic, ic_end),
                (x.at(ft, self.p, kb)?, k),
                (kc, panels),
                first,
            )
        })
    }

    /// The chained product of rows `ic..ic_end` for one block of an online softmax: the
    /// block's `kc` columns of exponentials (at `p`, `nc` to a row) times its rows of B (packed
    /// at `b2` by [`Self::pack_b_rows`]), added into the rows of the chain's `out` (rescaled
    /// by the epilogue), or stored there for the rows' `first` block.
    fn product_block(
        &self,
        em: &Emitter<'c>,
        rows: (IntValue<'c>, IntValue<'c>),
        kc: IntValue<'c>,
        first: IntValue<'c>,
    ) -> Result<()> {
        self.step(em, rows, (self.p, self.online_ld), (kc, self.b2), first)
    }

    /// One contraction block of `kc` steps of the chained product of rows `ic..ic_end`: A at
    /// `a` (rows `lda` apart), B's panels packed at `panels`, into rows `ic..ic_end` of the
    /// chain's `out` (added to them unless `first`), through the shared routines: A packed at
    /// `a2` (or read in place when there is one panel of columns), then the tiles down each
    /// panel.
    fn step(
        &self,
        em: &Emitter<'c>,
        (ic, ic_end): (IntValue<'c>, IntValue<'c>),
        (a_in, lda_in): (PointerValue<'c>, i64),
        (kc, panels): (IntValue<'c>, PointerValue<'c>),
        first: IntValue<'c>,
    ) -> Result<()> {
        let (ch, ft, a2) = (self.ch, self.ft, self.a2);
        let x = Arith { em };
        let (bl, n) = (ch.bl, ch.n);
        let rows = x.sub(ic_end, ic)?;
        let direct = n <= bl.nr();
        let (a, lda, read) = if direct {
            (a_in, x.c(lda_in), ARead::Rows)
        } else {
            let f = Routine::pack_a(bl, false).function(em.ctx, em.m, em.routines, em.target)?;
            let args = [
                a_in.into(),
                x.c(lda_in).into(),
                rows.into(),
                kc.into(),
                a2.into(),
                x.c(bl.kc).into(),
            ];
            em.b.build_call(f, &args, "").map_err(llvm)?;
            (a2, x.c(bl.kc), ARead::Packed)
        };
        let tiles = |j: IntValue<'c>, width: i64| -> Result<()> {
            let f = Routine::tile(bl, width, None, read, false).function(
                em.ctx,
                em.m,
                em.routines,
                em.target,
            )?;
            let args = [
                x.at(ft, ch.out, x.add(x.mulc(ic, n)?, j)?)?.into(),
                x.c(n).into(),
                rows.into(),
                a.into(),
                lda.into(),
                x.at(ft, panels, x.mulc(j, bl.kc)?)?.into(),
                kc.into(),
                first.into(),
                ft.const_zero().into(),
            ];
            em.b.build_call(f, &args, "").map_err(llvm)?;
            Ok(())
        };
        self.panels(em, &tiles)
    }

    /// Starts rows `ic..ic_end` of an online softmax (the batch's first row `base`) as its
    /// first block would, for a first block that is skipped: a running maximum of -inf, a sum
    /// of 0 and rows of zeros in the chain's `out`.
    fn clear_rows(
        &self,
        em: &Emitter<'c>,
        (ic, ic_end): (IntValue<'c>, IntValue<'c>),
        base: IntValue<'c>,
    ) -> Result<()> {
        let ft = self.ft;
        let x = Arith { em };
        let s_r = x.slot()?;
        em.range_loop_ptr(s_r, ic, ic_end, 1, &mut |em| {
            let r = x.get(s_r)?;
            let rl = x.sub(r, base)?;
            let ninf = ft.const_float(f64::NEG_INFINITY);
            em.b.build_store(x.at(ft, self.max, rl)?, ninf)
                .map_err(llvm)?;
            em.b.build_store(x.at(ft, self.sum, rl)?, ft.const_zero())
                .map_err(llvm)?;
            map_row(em, ft, (self.ch.out, self.ch.n), r, &|_, _| {
                Ok(ft.const_zero())
            })
        })
    }

    /// Divides rows `r_lo..r_hi` of the chain's `out` (an online softmax's, the batch's first
    /// row `base`) by their sums.
    fn normalize(
        &self,
        em: &Emitter<'c>,
        (r_lo, r_hi): (IntValue<'c>, IntValue<'c>),
        base: IntValue<'c>,
    ) -> Result<()> {
        let ft = self.ft;
        let x = Arith { em };
        let s_r = x.slot()?;
        em.range_loop_ptr(s_r, r_lo, r_hi, 1, &mut |em| {
            let r = x.get(s_r)?;
            let sum =
                em.b.build_load(ft, x.at(ft, self.sum, x.sub(r, base)?)?, "s")
                    .map_err(llvm)?
                    .into_float_value();
            map_row(em, ft, (self.ch.out, self.ch.n), r, &|em, v| {
                em.b.build_float_div(v, sum, "on").map_err(llvm)
            })
        })
    }
}

/// Replaces each element `v` of row `r` of the `n`-column matrix at `out` by `f(v)`.
pub(super) fn map_row<'c>(
    em: &Emitter<'c>,
    ft: FloatType<'c>,
    (out, n): (PointerValue<'c>, i64),
    r: IntValue<'c>,
    f: &dyn Fn(&Emitter<'c>, FloatValue<'c>) -> Result<FloatValue<'c>>,
) -> Result<()> {
    let x = Arith { em };
    let row = x.mulc(r, n)?;
    let s_c = x.slot()?;
    em.range_loop_ptr(s_c, x.c(0), x.c(n), 1, &mut |em| {
        let p = x.at(ft, out, x.add(row, x.get(s_c)?)?)?;
        let v =
            em.b.build_load(ft, p, "o")
                .map_err(llvm)?
                .into_float_value();
        let y = f(em, v)?;
        em.b.build_store(p, y).map_err(llvm)?;
        Ok(())
    })
}

/// Transposes `n` vectors of `n` elements (row `t` in, column `t` out; `n` a power of two): at
/// each level, rows `i` and `i + b` (bit `b` of `i` clear) swap their off-diagonal blocks of
/// `b` elements, for `b` = n/2 down to 1; two two-source shuffles per pair and level.
pub(super) fn transpose_vectors<'c>(
    em: &Emitter<'c>,
    mut r: Vec<VectorValue<'c>>,
) -> Result<Vec<VectorValue<'c>>> {
    let n = r.len();
    let i32t = em.ctx.i32_type();
    let mask = |f: &dyn Fn(usize) -> usize| {
        VectorType::const_vector(
            &(0..n)
                .map(|k| i32t.const_int(f(k) as u64, false))
                .collect::<Vec<_>>(),
        )
    };
    let mut b = n / 2;
    while b >= 1 {
        for i in (0..n).filter(|i| i & b == 0) {
            let (a, c) = (r[i], r[i + b]);
            let lo = mask(&|k| if k & b == 0 { k } else { n + k - b });
            let hi = mask(&|k| if k & b == 0 { k + b } else { n + k });
            r[i] = em.b.build_shuffle_vector(a, c, lo, "tl").map_err(llvm)?;
            r[i + b] = em.b.build_shuffle_vector(a, c, hi, "th").map_err(llvm)?;
        }
        b /= 2;
    }
    Ok(r)
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

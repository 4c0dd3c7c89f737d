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
//! - A product of a few rows per matrix packs nothing: it streams B, reading its rows where
//!   they are stored (`streamed.rs`, [`Blocking::stream`]); with B stored transposed, by dot
//!   products of A's and B's rows (`dots.rs`).
//! - The micro-kernel keeps an `mr` x `nr` tile of C in vector registers while one sliver of A
//!   and one panel of B stream by: per contraction step, `nv` vector loads of B, `mr`
//!   broadcasts of A and `mr * nv` fused multiply-adds.
//!
//! The packed B block stays in the L2/L3 cache across the row blocks, the packed A block in L2
//! across the panels, and one panel across the slivers: in L2 where it is larger than L1 (a
//! panel of 512 steps is 64 KiB with 32 columns, 128 KiB with 64), which is why CPUs with two
//! 512-bit FMA ports take tiles two vectors wide (`GemmLimits::tall_512`).

use super::{Emitter, Routines, Target, host_attributes, llvm};
use crate::Result;
use crate::common::scalar::Scalar;
use crate::kernel::{ConvPatches, Strides, Unread, ZeroBlocks};
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
pub(super) use kiln_kernel::gemm_schedule::{Blocking, Stream};

mod chain;
mod dots;
mod macro_kernel;
mod packing;
mod registers;
mod routines;
mod streamed;
mod tile;
mod unread;
mod zero_steps;

pub(super) use chain::*;
pub(super) use macro_kernel::*;
use packing::batch_start;
use registers::*;
pub(super) use routines::*;
use tile::*;
use unread::*;
use zero_steps::*;

/// Contraction steps per iteration of a full-width tile's loop. Measured against 1 with
/// alternating A/B calls: matmul_1024 won 44 of 55 pairs (10.1 -> 9.4 ms), the MLP step 61 of
/// 75 (15.8 -> 15.0 ms), matmul_2048 13 of 15 (96.6 -> 89.2 ms, when all tiles were unrolled);
/// cold MLP compile about 10% longer. 8 was faster still on matmul_1024 but doubles the code.
const UNROLL: i64 = 4;

/// A product chained to a GEMM (see [`crate::kernel::Chain`]), as [`emit`] takes it.
pub(super) struct Chain<'a, 'c> {
    /// Its blocking.
    pub(super) bl: Blocking,
    /// Its columns.
    pub(super) n: i64,
    /// The kernel input holding its B.
    pub(super) b: i64,
    /// Its B is stored transposed.
    pub(super) b_trans: bool,
    /// Where its B's matrices lie when read in place through strides.
    pub(super) b_strides: Option<&'a Strides>,
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
    /// Emits `body(bt, r_lo, r_hi)` for each batch `bt` that rows `lo..hi` of a product of `m`
    /// rows a batch touch, `r_lo..r_hi` being its rows among them (`slot` counts the batches).
    fn batches(
        &self,
        slot: PointerValue<'c>,
        (lo, hi): (IntValue<'c>, IntValue<'c>),
        m: i64,
        body: &mut dyn FnMut(IntValue<'c>, IntValue<'c>, IntValue<'c>) -> Result<()>,
    ) -> Result<()> {
        let b_lo = self.sdiv(lo, m)?;
        let b_hi = self.addc(self.sdiv(self.sub(hi, self.c(1))?, m)?, 1)?;
        self.em.range_loop_ptr(slot, b_lo, b_hi, 1, &mut |_| {
            let bt = self.get(slot)?;
            let r_lo = self.max(lo, self.mulc(bt, m)?)?;
            let r_hi = self.min(hi, self.addc(self.mulc(bt, m)?, m)?)?;
            body(bt, r_lo, r_hi)
        })
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
    use super::grouped_store_lanes;

    /// The tall tile of a CPU with two 512-bit FMA ports asks for packed B 8 steps and A 16
    /// steps ahead (`TallTile::prefetch`): its routine says so in its name and its loop
    /// prefetches (in the unrolled loop and the last steps' loop); the same tile without them
    /// has none.
    #[test]
    fn the_tall_tile_prefetches_ahead_and_names_it() {
        use super::{ARead, Blocking, Routine};
        use kiln_kernel::target::{GemmLimits, TilePrefetch};
        let intel = kiln_kernel::TargetInfo {
            vector_bytes: 64,
            gemm: GemmLimits::two_fma512_ports(),
            ..kiln_kernel::TargetInfo::reference()
        };
        let bl = Blocking::new(kiln_ir::DType::F32, &intel, 2048, 2048);
        let plain = Blocking {
            prefetch: TilePrefetch::default(),
            ..bl
        };
        let whole = Blocking {
            tails: Default::default(),
            ..bl
        };
        let behind = Blocking {
            c_ahead: false,
            ..bl
        };
        // A target of 128-byte lines: one line of B's row of 32 elements a step.
        let wide = Blocking { line: 128, ..bl };
        let target = super::super::Target::any(&kiln_kernel::Options::default());
        for (bl, name, calls, tails, c_ahead) in [
            (
                wide,
                "kiln_gemm_tile_f32_16x14x2_w32_p_pf8x16_ca_l128_t4_8",
                2,
                2,
                1,
            ),
            (
                bl,
                "kiln_gemm_tile_f32_16x14x2_w32_p_pf8x16_ca_t4_8",
                3,
                2,
                1,
            ),
            (plain, "kiln_gemm_tile_f32_16x14x2_w32_p_ca_t4_8", 0, 2, 1),
            (whole, "kiln_gemm_tile_f32_16x14x2_w32_p_pf8x16_ca", 3, 0, 1),
            (
                behind,
                "kiln_gemm_tile_f32_16x14x2_w32_p_pf8x16_t4_8",
                3,
                2,
                0,
            ),
        ] {
            let r = Routine::tile(bl, bl.nr(), ARead::Packed, false);
            assert_eq!(r.name(), name);
            let ctx = inkwell::context::Context::create();
            let m = super::super::module::routine_module(&ctx, &r, target).unwrap();
            let ir = m.print_to_string().to_string();
            // Two lines of B (one of 128 bytes) and one of A a step, in both loops of the
            // whole tile and in the one loop (a step an iteration) of each tail tile, for
            // reading; a line of the next tile's C an iteration of the whole tile's unrolled
            // loop, for writing.
            let read = ir.matches("i32 0, i32 3, i32 1)").count();
            assert_eq!(read, calls * (super::UNROLL as usize + 1 + tails), "{name}");
            let write = ir.matches("i32 1, i32 3, i32 1)").count();
            assert_eq!(write, c_ahead, "{name}");
            assert_eq!(
                ir.matches("call void @llvm.prefetch.p0").count(),
                read + write,
                "{name}"
            );
        }
        // A tile storing C by columns (a convolution's, by planes) asks for none.
        let r = Routine::tile(bl, bl.nr(), ARead::Packed, true);
        assert!(!r.name().contains("_ca"), "{}", r.name());
    }

    /// The grouped packing's stores, replayed in order on a block with room after it: every
    /// element ends up with its row and step, and nothing is written past the block.
    #[test]
    fn grouped_packing_stores_stay_inside_their_block() {
        for lanes in [4, 8, 16] {
            for mr in [3, 5, 6, 10, 12, 14, 24] {
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

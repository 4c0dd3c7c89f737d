//! mbarriers and TMA tile loads (sm_90a): [`Stmt::MbarInit`], [`Stmt::MbarInval`] and a plain
//! [`Stmt::MbarArrive`] as `llvm.nvvm.mbarrier.{init,inval,arrive}.shared`; an arrive with
//! expected transaction bytes (`mbarrier.arrive.expect_tx`), [`Stmt::MbarWait`]
//! (`mbarrier.try_wait.parity`, its predicate returned and the loop around it the
//! emitter's own blocks) and [`Stmt::TmaLoad`]
//! (`cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes`) as inline
//! PTX, with every shared address a 64-bit register. The tensor maps are kernel parameters
//! after the buffers, each a `byval` `[128 x i8]` aligned to 64 and marked
//! `nvvm.grid_constant`, so that its own address (in the parameter space, through `cvta`) is
//! what the TMA reads.
//!
//! [`Stmt::MbarInit`]: kiln_kernel::gpu::ir::Stmt::MbarInit
//! [`Stmt::MbarInval`]: kiln_kernel::gpu::ir::Stmt::MbarInval
//! [`Stmt::MbarArrive`]: kiln_kernel::gpu::ir::Stmt::MbarArrive
//! [`Stmt::MbarWait`]: kiln_kernel::gpu::ir::Stmt::MbarWait
//! [`Stmt::TmaLoad`]: kiln_kernel::gpu::ir::Stmt::TmaLoad

use super::kernel::Emit;
use crate::Result;
use crate::common::llvm;
use inkwell::IntPredicate;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::context::Context;
use inkwell::types::{AnyType, BasicMetadataTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, FunctionValue, IntValue};
use kiln_kernel::gpu::ir::{Mbar, Sc};

/// Bytes of a tensor map (`CUtensorMap`), and its alignment.
const MAP_BYTES: u32 = 128;
const MAP_ALIGN: u64 = 64;

/// Marks parameters `first..first + n` of `f` as tensor maps: `byval([128 x i8])`, aligned
/// to 64, `nvvm.grid_constant`.
pub(super) fn tensor_map_params(ctx: &Context, f: FunctionValue, first: usize, n: usize) {
    let t = ctx.i8_type().array_type(MAP_BYTES);
    for i in first..first + n {
        let at = AttributeLoc::Param(i as u32);
        f.add_attribute(
            at,
            ctx.create_type_attribute(
                Attribute::get_named_enum_kind_id("byval"),
                t.as_any_type_enum(),
            ),
        );
        f.add_attribute(
            at,
            ctx.create_enum_attribute(Attribute::get_named_enum_kind_id("align"), MAP_ALIGN),
        );
        f.add_attribute(at, ctx.create_string_attribute("nvvm.grid_constant", ""));
    }
}

impl<'c> Emit<'_, 'c> {
    /// The shared address of `bar`, as a 64-bit integer.
    fn bar_address(&self, bar: &Mbar) -> Result<IntValue<'c>> {
        let p = self.shared_unswizzled(bar.array, &bar.index)?;
        self.b
            .build_ptr_to_int(p, self.ctx.i64_type(), "bar")
            .map_err(llvm)
    }

    /// Calls inline PTX `asm` (with side effects and a memory clobber) of the given operand
    /// constraints on `args`, returning an i32 when `returns` is set.
    pub(super) fn ptx(
        &self,
        asm: &str,
        constraints: &str,
        args: &[BasicMetadataValueEnum<'c>],
        returns: bool,
    ) -> Result<Option<IntValue<'c>>> {
        let params: Vec<BasicMetadataTypeEnum> = args
            .iter()
            .map(|a| match a {
                BasicMetadataValueEnum::IntValue(i) => i.get_type().into(),
                BasicMetadataValueEnum::FloatValue(x) => x.get_type().into(),
                _ => self.ctx.i64_type().into(),
            })
            .collect();
        let ty = if returns {
            self.ctx.i32_type().fn_type(&params, false)
        } else {
            self.ctx.void_type().fn_type(&params, false)
        };
        let callee = self.ctx.create_inline_asm(
            ty,
            asm.to_string(),
            format!("{constraints},~{{memory}}"),
            true,
            false,
            None,
            false,
        );
        let got = self
            .b
            .build_indirect_call(ty, callee, args, "ptx")
            .map_err(llvm)?;
        Ok(got.try_as_basic_value().basic().map(|v| v.into_int_value()))
    }

    /// `mbarrier.init.shared::cta.b64 [bar], count`.
    pub(super) fn mbar_init(&self, bar: &Mbar, count: usize) -> Result<()> {
        let p = self.shared_unswizzled(bar.array, &bar.index)?;
        let n = self.ctx.i32_type().const_int(count as u64, false);
        self.nvvm("llvm.nvvm.mbarrier.init.shared", &[p.into(), n.into()])?;
        Ok(())
    }

    /// `mbarrier.inval.shared::cta.b64 [bar]`.
    pub(super) fn mbar_inval(&self, bar: &Mbar) -> Result<()> {
        let p = self.shared_unswizzled(bar.array, &bar.index)?;
        self.nvvm("llvm.nvvm.mbarrier.inval.shared", &[p.into()])?;
        Ok(())
    }

    /// `mbarrier.arrive.shared::cta.b64`, or `mbarrier.arrive.expect_tx.shared::cta.b64`
    /// expecting `tx` bytes.
    pub(super) fn mbar_arrive(&self, bar: &Mbar, tx: usize) -> Result<()> {
        if tx == 0 {
            let p = self.shared_unswizzled(bar.array, &bar.index)?;
            self.nvvm("llvm.nvvm.mbarrier.arrive.shared", &[p.into()])?;
            return Ok(());
        }
        let at = self.bar_address(bar)?;
        let bytes = self.ctx.i32_type().const_int(tx as u64, false);
        self.ptx(
            "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [$0], $1;\n}",
            "l,r",
            &[at.into(), bytes.into()],
            false,
        )?;
        Ok(())
    }

    /// Waits until the phase of parity `parity` of `bar` has completed: `try_wait.parity`
    /// until it says so.
    pub(super) fn mbar_wait(&self, bar: &Mbar, parity: &Sc) -> Result<()> {
        let at = self.bar_address(bar)?;
        let i32t = self.ctx.i32_type();
        let parity = self
            .b
            .build_int_truncate(self.sc(parity)?, i32t, "parity")
            .map_err(llvm)?;
        let head = self.block("mbar_wait");
        let done = self.block("mbar_done");
        self.b.build_unconditional_branch(head).map_err(llvm)?;
        self.b.position_at_end(head);
        let ready = self
            .ptx(
                "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2;\nselp.u32 $0, 1, 0, p;\n}",
                "=r,l,r",
                &[at.into(), parity.into()],
                true,
            )?
            .ok_or_else(|| crate::Error::Llvm("try_wait returned nothing".into()))?;
        let ok = self
            .b
            .build_int_compare(IntPredicate::NE, ready, i32t.const_zero(), "ready")
            .map_err(llvm)?;
        self.b
            .build_conditional_branch(ok, done, head)
            .map_err(llvm)?;
        self.b.position_at_end(done);
        Ok(())
    }

    /// Starts the TMA load of tensor map `map`'s box at `coords` into shared `array` from
    /// element `index`, completing on `bar`.
    pub(super) fn tma_load(
        &self,
        map: usize,
        array: usize,
        index: &Sc,
        coords: &[Sc; 2],
        bar: &Mbar,
    ) -> Result<()> {
        let Some(&param) = self
            .params
            .get(self.k.inputs.len() + self.k.outputs.len() + map)
        else {
            return self.err(format!("no tensor map {map}"));
        };
        let i64t = self.ctx.i64_type();
        let i32t = self.ctx.i32_type();
        let to = self.shared_unswizzled(array, index)?;
        let to = self.b.build_ptr_to_int(to, i64t, "dst").map_err(llvm)?;
        let desc = self.b.build_ptr_to_int(param, i64t, "map").map_err(llvm)?;
        let mut args: Vec<BasicMetadataValueEnum> = vec![to.into(), desc.into()];
        for c in coords {
            let v = self
                .b
                .build_int_truncate(self.sc(c)?, i32t, "c")
                .map_err(llvm)?;
            args.push(v.into());
        }
        args.push(self.bar_address(bar)?.into());
        self.ptx(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1, {$2, $3}], [$4];",
            "l,l,r,r,l",
            &args,
            false,
        )?;
        Ok(())
    }
}

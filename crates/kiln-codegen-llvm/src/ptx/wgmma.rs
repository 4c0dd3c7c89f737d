//! The warpgroup statements (sm_90a): [`Stmt::WgmmaFence`], [`Stmt::WgmmaCommit`] and
//! [`Stmt::WgmmaWait`] as `llvm.nvvm.wgmma.{fence,commit_group,wait_group}.sync.aligned`,
//! [`Stmt::ProxyFence`] as `llvm.nvvm.fence.proxy.async.shared_cta`, and [`Stmt::Wgmma`] as
//! inline PTX (LLVM has no intrinsic for `wgmma.mma_async`): the accumulators as `=f`
//! outputs tied to the same registers as inputs, the two 64-bit matrix descriptors as `l`
//! operands, scale-d a predicate set from a register holding 1, imm-trans 1 for an MN-major
//! operand (0 for a K-major one), neither negated. A descriptor is built from the shared address of its array's element
//! `start` (the array's own address plus `start` elements, not through its swizzle): bits 4-17
//! of the address, with the strides and the swizzle mode as
//! [`kiln_kernel::gpu::desc::descriptor`] encodes them.
//!
//! [`Stmt::WgmmaFence`]: kiln_kernel::gpu::ir::Stmt::WgmmaFence
//! [`Stmt::WgmmaCommit`]: kiln_kernel::gpu::ir::Stmt::WgmmaCommit
//! [`Stmt::WgmmaWait`]: kiln_kernel::gpu::ir::Stmt::WgmmaWait
//! [`Stmt::ProxyFence`]: kiln_kernel::gpu::ir::Stmt::ProxyFence
//! [`Stmt::Wgmma`]: kiln_kernel::gpu::ir::Stmt::Wgmma

use super::kernel::Emit;
use crate::Result;
use crate::common::llvm;
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, IntValue};
use kiln_ir::DType;
use kiln_kernel::gpu::desc::descriptor;
use kiln_kernel::gpu::ir::{MatrixDesc, MmaOperand};

impl<'c> Emit<'_, 'c> {
    /// `wgmma.fence.sync.aligned`.
    pub(super) fn wgmma_fence(&self) -> Result<()> {
        self.nvvm("llvm.nvvm.wgmma.fence.sync.aligned", &[])?;
        Ok(())
    }

    /// `fence.proxy.async.shared::cta`.
    pub(super) fn proxy_fence(&self) -> Result<()> {
        self.nvvm("llvm.nvvm.fence.proxy.async.shared_cta", &[])?;
        Ok(())
    }

    /// `wgmma.commit_group.sync.aligned`.
    pub(super) fn wgmma_commit(&self) -> Result<()> {
        self.nvvm("llvm.nvvm.wgmma.commit_group.sync.aligned", &[])?;
        Ok(())
    }

    /// `wgmma.wait_group.sync.aligned pending`.
    pub(super) fn wgmma_wait(&self, pending: usize) -> Result<()> {
        let n = self.ctx.i64_type().const_int(pending as u64, false);
        self.nvvm("llvm.nvvm.wgmma.wait_group.sync.aligned", &[n.into()])?;
        Ok(())
    }

    /// The 64-bit matrix descriptor of `d`.
    fn matrix_descriptor(&self, d: &MatrixDesc) -> Result<IntValue<'c>> {
        let p = self.shared_unswizzled(d.array, &d.start)?;
        let i64t = self.ctx.i64_type();
        let addr = self.b.build_ptr_to_int(p, i64t, "addr").map_err(llvm)?;
        let bits = self
            .b
            .build_and(addr, i64t.const_int(0x3ffff, false), "a18")
            .map_err(llvm)?;
        let bits = self
            .b
            .build_right_shift(bits, i64t.const_int(4, false), false, "a14")
            .map_err(llvm)?;
        let fields = descriptor(0, d.lbo, d.sbo, d.swizzle);
        self.b
            .build_or(bits, i64t.const_int(fields, false), "desc")
            .map_err(llvm)
    }

    /// `acc += A x B` for `m64n{n}k16` of `operand`, A and B through descriptors.
    pub(super) fn wgmma(
        &self,
        acc: &[usize],
        (a, b): (&MatrixDesc, &MatrixDesc),
        n: usize,
        operand: MmaOperand,
    ) -> Result<()> {
        if operand == MmaOperand::Tf32 || acc.len() != n / 2 || !n.is_multiple_of(8) || n > 256 {
            return self.err(format!(
                "a wgmma m64n{n}k16 of {} with {} accumulators",
                operand.name(),
                acc.len()
            ));
        }
        let f32t = self.ctx.f32_type();
        let (i64t, i32t) = (self.ctx.i64_type(), self.ctx.i32_type());
        let count = acc.len();
        let regs: Vec<String> = (0..count).map(|i| format!("${i}")).collect();
        let t = operand.name();
        let asm = format!(
            "{{\n.reg .pred p;\nsetp.ne.b32 p, ${}, 0;\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{}}}, ${}, ${}, p, 1, 1, {}, {};\n}}",
            count + 2,
            regs.join(", "),
            count,
            count + 1,
            u8::from(a.mn_major),
            u8::from(b.mn_major)
        );
        let mut constraints: Vec<String> = vec!["=f".into(); count];
        constraints.extend(["l".into(), "l".into(), "r".into()]);
        constraints.extend((0..count).map(|i| i.to_string()));
        let mut params: Vec<BasicMetadataTypeEnum> = vec![i64t.into(), i64t.into(), i32t.into()];
        params.extend(std::iter::repeat_n(
            BasicMetadataTypeEnum::from(f32t),
            count,
        ));
        let fields = vec![f32t.into(); count];
        let ret = self.ctx.struct_type(&fields, false);
        let ty = ret.fn_type(&params, false);
        let callee =
            self.ctx
                .create_inline_asm(ty, asm, constraints.join(","), true, false, None, false);
        let mut args: Vec<BasicMetadataValueEnum> = vec![
            self.matrix_descriptor(a)?.into(),
            self.matrix_descriptor(b)?.into(),
            i32t.const_int(1, false).into(),
        ];
        for &r in acc {
            args.push(self.coerce(self.read(r)?, DType::F32)?.into());
        }
        let got = self
            .b
            .build_indirect_call(ty, callee, &args, "wgmma")
            .map_err(llvm)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| crate::Error::Llvm("wgmma returned nothing".into()))?
            .into_struct_value();
        for (i, &r) in acc.iter().enumerate() {
            let x = self
                .b
                .build_extract_value(got, i as u32, "d")
                .map_err(llvm)?;
            self.write(r, x)?;
        }
        Ok(())
    }
}

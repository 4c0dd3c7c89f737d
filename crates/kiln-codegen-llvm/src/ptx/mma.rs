//! The tensor-core statements: [`Stmt::LdMatrix`] as `llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16`
//! (`.x4.trans.b16` when transposed)
//! (four 32-bit registers, each two 16-bit elements, low half first, widened to the f32
//! registers the IR holds them in) and [`Stmt::Mma`] as
//! `llvm.nvvm.mma.m16n8k16.row.col.bf16` (bf16) or `llvm.nvvm.mma.m16n8k16.row.col.f32.f32`
//! (f16), the operands' f32 registers narrowed and packed two to a 32-bit register, element
//! `2j` in the low half.
//!
//! [`Stmt::LdMatrix`]: kiln_kernel::gpu::ir::Stmt::LdMatrix
//! [`Stmt::Mma`]: kiln_kernel::gpu::ir::Stmt::Mma

use super::kernel::Emit;
use crate::Result;
use crate::common::llvm;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FloatValue, IntValue};
use kiln_ir::DType;
use kiln_kernel::gpu::ir::Sc;

impl<'c> Emit<'_, 'c> {
    /// The 16-bit float type of `d` (bf16 or f16).
    fn half_type(&self, d: DType) -> Result<inkwell::types::FloatType<'c>> {
        match d {
            DType::BF16 => Ok(self.ctx.bf16_type()),
            DType::F16 => Ok(self.ctx.f16_type()),
            d => self.err(format!("a tensor-core operand of {d}")),
        }
    }

    /// `ldmatrix.x4` (`.trans` with `trans`) of this lane's row `row` of packed shared array
    /// `array` into `regs`.
    pub(super) fn ldmatrix(
        &self,
        regs: &[usize; 8],
        array: usize,
        row: &Sc,
        trans: bool,
    ) -> Result<()> {
        let (p, et, d) = self.shared_at(array, row)?;
        let BasicTypeEnum::FloatType(half) = et else {
            return self.err(format!("ldmatrix from shared{array} of {d}, not packed"));
        };
        let got = self
            .nvvm_of(
                if trans {
                    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.trans.b16"
                } else {
                    "llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16"
                },
                &[p.get_type().into()],
                &[BasicMetadataValueEnum::PointerValue(p)],
            )?
            .ok_or_else(|| crate::Error::Llvm("ldmatrix returned nothing".into()))?
            .into_struct_value();
        let b = &self.b;
        let i16t = self.ctx.i16_type();
        let f32t = self.ctx.f32_type();
        for j in 0..4 {
            let word = b
                .build_extract_value(got, j as u32, "m")
                .map_err(llvm)?
                .into_int_value();
            for h in 0..2 {
                let bits = b
                    .build_right_shift(word, word.get_type().const_int(16 * h, false), false, "h")
                    .map_err(llvm)?;
                let bits = b.build_int_truncate(bits, i16t, "h16").map_err(llvm)?;
                let x = b
                    .build_bit_cast(bits, half, "x")
                    .map_err(llvm)?
                    .into_float_value();
                let x = b.build_float_ext(x, f32t, "w").map_err(llvm)?;
                self.write(regs[2 * j + h as usize], x.into())?;
            }
        }
        Ok(())
    }

    /// Registers `pair` narrowed to `half` and packed into one 32-bit register, the first in
    /// the low half.
    fn pack(&self, pair: [usize; 2], d: DType) -> Result<IntValue<'c>> {
        let b = &self.b;
        let half = self.half_type(d)?;
        let i32t = self.ctx.i32_type();
        let mut word = i32t.const_zero();
        for (h, &r) in pair.iter().enumerate() {
            let x = self.coerce(self.read(r)?, DType::F32)?.into_float_value();
            let x = b.build_float_trunc(x, half, "n").map_err(llvm)?;
            let bits = b
                .build_bit_cast(x, self.ctx.i16_type(), "b")
                .map_err(llvm)?
                .into_int_value();
            let bits = b.build_int_z_extend(bits, i32t, "z").map_err(llvm)?;
            let bits = b
                .build_left_shift(bits, i32t.const_int(16 * h as u64, false), "s")
                .map_err(llvm)?;
            word = b.build_or(word, bits, "p").map_err(llvm)?;
        }
        Ok(word)
    }

    /// `d = a x b + c` on the tensor cores, operands of `dtype`.
    pub(super) fn mma(
        &self,
        d: &[usize; 4],
        a: &[usize; 8],
        b: &[usize; 4],
        c: &[usize; 4],
        dtype: DType,
    ) -> Result<()> {
        let vec2 = self.half_type(dtype)?.vec_type(2);
        let operand = |w: IntValue<'c>| -> Result<BasicMetadataValueEnum<'c>> {
            Ok(if dtype == DType::F16 {
                self.b.build_bit_cast(w, vec2, "v").map_err(llvm)?.into()
            } else {
                w.into()
            })
        };
        let mut args = Vec::with_capacity(10);
        for j in 0..4 {
            args.push(operand(self.pack([a[2 * j], a[2 * j + 1]], dtype)?)?);
        }
        for j in 0..2 {
            args.push(operand(self.pack([b[2 * j], b[2 * j + 1]], dtype)?)?);
        }
        for &r in c {
            let x: FloatValue = self.coerce(self.read(r)?, DType::F32)?.into_float_value();
            args.push(x.into());
        }
        let name = if dtype == DType::F16 {
            "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"
        } else {
            "llvm.nvvm.mma.m16n8k16.row.col.bf16"
        };
        let got = self
            .nvvm(name, &args)?
            .ok_or_else(|| crate::Error::Llvm("mma returned nothing".into()))?
            .into_struct_value();
        for (i, &r) in d.iter().enumerate() {
            let x: BasicValueEnum = self
                .b
                .build_extract_value(got, i as u32, "d")
                .map_err(llvm)?;
            self.write(r, x)?;
        }
        Ok(())
    }
}

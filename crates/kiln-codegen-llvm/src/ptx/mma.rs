//! The tensor-core statements: [`Stmt::LdMatrix`] as `llvm.nvvm.ldmatrix.sync.aligned.m8n8.x4.b16`
//! (`.x4.trans.b16` when transposed) (four 32-bit registers: from 16-bit elements each two of
//! them, low half first, widened to the f32 registers the IR holds them in; from f32 elements
//! each one, as its bits), [`Stmt::RoundTf32`] as `llvm.nvvm.f2tf32.rna` (`cvt.rna.tf32.f32`),
//! and [`Stmt::Mma`] as `llvm.nvvm.mma.m16n8k16.row.col.bf16` (bf16) or
//! `llvm.nvvm.mma.m16n8k16.row.col.f32.f32` (f16), the operands' f32 registers narrowed and
//! packed two to a 32-bit register, element `2j` in the low half, or as
//! `llvm.nvvm.mma.m16n8k8.row.col.tf32` (TF32), each operand register's bits as they are.
//!
//! [`Stmt::LdMatrix`]: kiln_kernel::gpu::ir::Stmt::LdMatrix
//! [`Stmt::RoundTf32`]: kiln_kernel::gpu::ir::Stmt::RoundTf32
//! [`Stmt::Mma`]: kiln_kernel::gpu::ir::Stmt::Mma

use super::kernel::Emit;
use crate::Result;
use crate::common::llvm;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, FloatValue, IntValue};
use kiln_ir::DType;
use kiln_kernel::gpu::ir::{MmaOperand, Sc};

impl<'c> Emit<'_, 'c> {
    /// The 16-bit float type of `d` (bf16 or f16).
    fn half_type(&self, d: DType) -> Result<inkwell::types::FloatType<'c>> {
        match d {
            DType::BF16 => Ok(self.ctx.bf16_type()),
            DType::F16 => Ok(self.ctx.f16_type()),
            d => self.err(format!("a tensor-core operand of {d}")),
        }
    }

    /// `ldmatrix.x4` (`.trans` with `trans`) of this lane's row `row` of shared array `array`
    /// (16-bit elements, packed, or f32 ones) into `regs`.
    pub(super) fn ldmatrix(
        &self,
        regs: &[usize],
        array: usize,
        row: &Sc,
        trans: bool,
    ) -> Result<()> {
        let (p, et, d) = self.shared_at(array, row)?;
        let BasicTypeEnum::FloatType(elem) = et else {
            return self.err(format!("ldmatrix from shared{array} of {d}"));
        };
        let words = d.bits() == 32;
        if regs.len() != if words { 4 } else { 8 } || (words && trans) {
            return self.err(format!(
                "ldmatrix of {} registers from shared{array} of {d}",
                regs.len()
            ));
        }
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
            if words {
                // One f32 element a word.
                let x = b.build_bit_cast(word, f32t, "x").map_err(llvm)?;
                self.write(regs[j], x)?;
                continue;
            }
            for h in 0..2 {
                let bits = b
                    .build_right_shift(word, word.get_type().const_int(16 * h, false), false, "h")
                    .map_err(llvm)?;
                let bits = b.build_int_truncate(bits, i16t, "h16").map_err(llvm)?;
                let x = b
                    .build_bit_cast(bits, elem, "x")
                    .map_err(llvm)?
                    .into_float_value();
                let x = b.build_float_ext(x, f32t, "w").map_err(llvm)?;
                self.write(regs[2 * j + h as usize], x.into())?;
            }
        }
        Ok(())
    }

    /// `reg = cvt.rna.tf32.f32 reg`: the f32 register rounded to TF32 (its bits, low 13 zero,
    /// read back as an f32).
    pub(super) fn round_tf32(&self, reg: usize) -> Result<()> {
        let x = self.coerce(self.read(reg)?, DType::F32)?;
        let bits = self
            .nvvm("llvm.nvvm.f2tf32.rna", &[x.into()])?
            .ok_or_else(|| crate::Error::Llvm("f2tf32 returned nothing".into()))?;
        let x = self
            .b
            .build_bit_cast(bits, self.ctx.f32_type(), "tf32")
            .map_err(llvm)?;
        self.write(reg, x)
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

    /// `d = a x b + c` on the tensor cores, of `shape` with operands of `operand`.
    pub(super) fn mma(
        &self,
        d: &[usize; 4],
        (a, b): (&[usize], &[usize]),
        c: &[usize; 4],
        shape: (usize, usize, usize),
        operand: MmaOperand,
    ) -> Result<()> {
        if shape != operand.shape() || a.len() != operand.a_regs() || b.len() != operand.b_regs() {
            return self.err(format!(
                "an mma {shape:?} of {} with {} A and {} B registers",
                operand.name(),
                a.len(),
                b.len()
            ));
        }
        let mut args: Vec<BasicMetadataValueEnum<'c>> = Vec::with_capacity(14);
        if operand == MmaOperand::Tf32 {
            // Each operand register's bits, a TF32 value already (`cvt.rna.tf32.f32`).
            for &r in a.iter().chain(b) {
                let x = self.coerce(self.read(r)?, DType::F32)?;
                let w = self
                    .b
                    .build_bit_cast(x, self.ctx.i32_type(), "w")
                    .map_err(llvm)?;
                args.push(w.into());
            }
        } else {
            let dtype = operand.dtype();
            let vec2 = self.half_type(dtype)?.vec_type(2);
            let packed = |w: IntValue<'c>| -> Result<BasicMetadataValueEnum<'c>> {
                Ok(if dtype == DType::F16 {
                    self.b.build_bit_cast(w, vec2, "v").map_err(llvm)?.into()
                } else {
                    w.into()
                })
            };
            for regs in [a, b] {
                for pair in regs.chunks(2) {
                    args.push(packed(self.pack([pair[0], pair[1]], dtype)?)?);
                }
            }
        }
        for &r in c {
            let x: FloatValue = self.coerce(self.read(r)?, DType::F32)?.into_float_value();
            args.push(x.into());
        }
        let name = match operand {
            MmaOperand::F16 => "llvm.nvvm.mma.m16n8k16.row.col.f32.f32",
            MmaOperand::Bf16 => "llvm.nvvm.mma.m16n8k16.row.col.bf16",
            MmaOperand::Tf32 => "llvm.nvvm.mma.m16n8k8.row.col.tf32",
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

//! Atomic additions into global memory ([`Stmt::AtomicAdd`], which the mapping emits only
//! where the options allow float atomics): `red.global.add.f32`, and
//! `red.global.add.noftz.f16` (both on sm_70 and newer), as inline PTX, since they return
//! nothing (a reduction, not an `atom` whose old value would be fetched).
//!
//! [`Stmt::AtomicAdd`]: kiln_kernel::gpu::ir::Stmt::AtomicAdd

use super::kernel::Emit;
use crate::Result;
use crate::common::llvm;
use crate::common::scalar::Scalar;
use inkwell::values::BasicMetadataValueEnum;
use kiln_ir::DType;
use kiln_kernel::gpu::ir::{Buf, Sc};

impl<'c> Emit<'_, 'c> {
    /// `buf[index] += value`, atomically, in the buffer's dtype (f32 or f16).
    pub(super) fn atomic_add(&self, buf: Buf, index: &Sc, value: usize) -> Result<()> {
        if !matches!(buf, Buf::Output(_)) {
            return self.err(format!("an atomic addition into {buf}"));
        }
        let (p, d) = self.buffer(buf)?;
        let v = self.coerce(self.read(value)?, d)?;
        let at = self.element(p, d, self.sc(index)?)?;
        let (asm, constraints, v): (&str, &str, BasicMetadataValueEnum) = match d {
            DType::F32 => ("red.global.add.f32 [$0], $1;", "l,f", v.into()),
            // The value's f16 bits in a 16-bit register.
            DType::F16 => (
                "red.global.add.noftz.f16 [$0], $1;",
                "l,h",
                self.store_value(d, v)?.into(),
            ),
            _ => return self.err(format!("an atomic addition into {buf} of {d}")),
        };
        let i64t = self.ctx.i64_type();
        let address = self.b.build_ptr_to_int(at, i64t, "at").map_err(llvm)?;
        if !matches!(
            v,
            BasicMetadataValueEnum::FloatValue(_) | BasicMetadataValueEnum::IntValue(_)
        ) {
            return self.err("an atomic addition of a value that is no number".into());
        }
        self.ptx(asm, constraints, &[address.into(), v], false)?;
        Ok(())
    }
}

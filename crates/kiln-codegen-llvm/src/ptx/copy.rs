//! Asynchronous copies from global to shared memory (sm_80 and newer): [`Stmt::CopyAsync`] as
//! `llvm.nvvm.cp.async.ca.shared.global.{4,8,16}`, [`Stmt::CopyCommit`] as
//! `llvm.nvvm.cp.async.commit.group` and [`Stmt::CopyWait`] as
//! `llvm.nvvm.cp.async.wait.group`.
//!
//! [`Stmt::CopyAsync`]: kiln_kernel::gpu::ir::Stmt::CopyAsync
//! [`Stmt::CopyCommit`]: kiln_kernel::gpu::ir::Stmt::CopyCommit
//! [`Stmt::CopyWait`]: kiln_kernel::gpu::ir::Stmt::CopyWait

use super::kernel::Emit;
use crate::Result;
use inkwell::values::BasicMetadataValueEnum;
use kiln_kernel::gpu::ir::{Buf, Sc};

impl<'c> Emit<'_, 'c> {
    /// Starts copying `elems` elements of `buf` from `src` into shared `array` at `index`.
    pub(super) fn copy_async(
        &self,
        array: usize,
        index: &Sc,
        buf: Buf,
        src: &Sc,
        elems: usize,
    ) -> Result<()> {
        let (to, _, _) = self.shared_at(array, index)?;
        let (p, d) = self.buffer(buf)?;
        let from = self.element(p, d, self.sc(src)?)?;
        let bytes = elems * d.bits().div_ceil(8) as usize;
        if ![4, 8, 16].contains(&bytes) {
            return self.err(format!("a cp.async of {bytes} bytes"));
        }
        self.nvvm(
            &format!("llvm.nvvm.cp.async.ca.shared.global.{bytes}"),
            &[
                BasicMetadataValueEnum::PointerValue(to),
                BasicMetadataValueEnum::PointerValue(from),
            ],
        )?;
        Ok(())
    }

    /// Closes this thread's group of copies.
    pub(super) fn copy_commit(&self) -> Result<()> {
        self.nvvm("llvm.nvvm.cp.async.commit.group", &[])?;
        Ok(())
    }

    /// Waits until at most `pending` groups are in flight.
    pub(super) fn copy_wait(&self, pending: usize) -> Result<()> {
        let n = self.ctx.i32_type().const_int(pending as u64, false);
        self.nvvm("llvm.nvvm.cp.async.wait.group", &[n.into()])?;
        Ok(())
    }
}

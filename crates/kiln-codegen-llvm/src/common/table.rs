//! Constant tables as module globals (in the target's constant address space, see
//! [`Base::constant_space`]), one per name and module, read by a computed index: what kiln's
//! f64 functions for the GPU look up (2/π's bits, atan, 2^(j/32) and log tables).

use super::{Base, llvm};
use crate::Result;
use inkwell::module::Linkage;
use inkwell::values::{FloatValue, GlobalValue, IntValue};

/// The table reads, on any [`Base`].
pub(crate) trait Tables<'c>: Base<'c> {
    /// The global `name` holding `init`, made on first use.
    fn table_global(
        &self,
        name: &str,
        init: impl FnOnce() -> inkwell::values::ArrayValue<'c>,
    ) -> GlobalValue<'c> {
        if let Some(g) = self.module().get_global(name) {
            return g;
        }
        let init = init();
        let g = self
            .module()
            .add_global(init.get_type(), Some(self.constant_space()), name);
        g.set_initializer(&init);
        g.set_constant(true);
        g.set_linkage(Linkage::Internal);
        g
    }

    /// `values[i]` for an integer `i` in range (the caller's guarantee).
    fn table_f64(&self, name: &str, values: &[f64], i: IntValue<'c>) -> Result<FloatValue<'c>> {
        let ft = self.ctx().f64_type();
        let g = self.table_global(name, || {
            let vs: Vec<_> = values.iter().map(|&v| ft.const_float(v)).collect();
            ft.const_array(&vs)
        });
        Ok(self
            .load(g, ft.array_type(values.len() as u32).into(), ft.into(), i)?
            .into_float_value())
    }

    /// `values[i]` for an integer `i` in range (the caller's guarantee).
    fn table_u64(&self, name: &str, values: &[u64], i: IntValue<'c>) -> Result<IntValue<'c>> {
        let it = self.ctx().i64_type();
        let g = self.table_global(name, || {
            let vs: Vec<_> = values.iter().map(|&v| it.const_int(v, false)).collect();
            it.const_array(&vs)
        });
        Ok(self
            .load(g, it.array_type(values.len() as u32).into(), it.into(), i)?
            .into_int_value())
    }

    /// Element `i` (of type `elem`) of the array global `g` (of type `array`).
    fn load(
        &self,
        g: GlobalValue<'c>,
        array: inkwell::types::BasicTypeEnum<'c>,
        elem: inkwell::types::BasicTypeEnum<'c>,
        i: IntValue<'c>,
    ) -> Result<inkwell::values::BasicValueEnum<'c>> {
        let b = self.builder();
        let i = b
            .build_int_z_extend_or_bit_cast(i, self.ctx().i64_type(), "i")
            .map_err(llvm)?;
        let zero = self.ctx().i64_type().const_zero();
        // Safety: `i` indexes within the array (the callers mask or bound it).
        let p = unsafe { b.build_in_bounds_gep(array, g.as_pointer_value(), &[zero, i], "tp") }
            .map_err(llvm)?;
        b.build_load(elem, p, "t").map_err(llvm)
    }
}

impl<'c, T: Base<'c> + ?Sized> Tables<'c> for T {}

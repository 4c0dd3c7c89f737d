//! The float remainder `x - trunc(x / y) * y` exactly (C's `fmod`, Rust's `%`), as
//! target-independent LLVM IR for targets without a library `fmod` (the GPU, where LLVM's own
//! `frem` lowering is `x - trunc(x / y) * y` in rounded arithmetic).
//!
//! Both magnitudes are taken apart into integer mantissas with their leading bit at the
//! mantissa width (subnormals normalized by counting leading zeros) and exponents; the
//! remainder is long division one exponent step at a time (subtract the divisor's mantissa
//! where it fits, shift left), which is exact; the result is normalized again and rebuilt,
//! as a subnormal where its exponent is below the normal range (exact too: a remainder is
//! representable). NaN for a NaN operand, an infinite `x` or a zero `y`; `x` itself where
//! `|x| < |y|` (an infinite `y` included); a zero result has `x`'s sign.

use super::math::Math;
use super::scalar::Scalar;
use super::{Base, llvm};
use crate::Result;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::DType;

/// The exact remainder, on any [`Base`].
pub(crate) trait Remainder<'c>: Base<'c> {
    /// `fmod(x, y)` in `d` (f32, or f64), exactly.
    fn fmod_exact(&self, d: DType, x: FloatValue<'c>, y: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        let b = self.builder();
        let it = f.it;
        let width = it.get_bit_width() as u64;
        let ci = |v: u64| it.const_int(v, false);
        let mant_mask = ci((1u64 << f.mant) - 1);
        let exp_mask = ci((1u64 << (width - 1 - f.mant)) - 1);
        let ax = self.fabs(x)?;
        let ay = self.fabs(y)?;
        // NaN operands, an infinite x, a zero y; and |x| < |y| (false for NaN).
        let nan_x = self.fcmp(FloatPredicate::UNO, x, x)?;
        let nan_y = self.fcmp(FloatPredicate::UNO, y, y)?;
        let inf_x = self.fcmp(FloatPredicate::OEQ, ax, f.ft.const_float(f64::INFINITY))?;
        let zero_y = self.fcmp(FloatPredicate::OEQ, ay, f.ft.const_zero())?;
        let invalid = b.build_or(nan_x, nan_y, "inv").map_err(llvm)?;
        let invalid = b.build_or(invalid, inf_x, "inv").map_err(llvm)?;
        let invalid = b.build_or(invalid, zero_y, "inv").map_err(llvm)?;
        let small = self.fcmp(FloatPredicate::OLT, ax, ay)?;
        let skip = b.build_or(invalid, small, "skip").map_err(llvm)?;

        let here = b.get_insert_block().expect("positioned");
        let func = here.get_parent().expect("in a function");
        let ctx = self.ctx();
        let start = ctx.append_basic_block(func, "fmod.start");
        let head = ctx.append_basic_block(func, "fmod.step");
        let body = ctx.append_basic_block(func, "fmod.sub");
        let tail = ctx.append_basic_block(func, "fmod.last");
        let done = ctx.append_basic_block(func, "fmod.done");
        let early = self.select_float(invalid, f.ft.const_float(f64::NAN), x)?;
        b.build_conditional_branch(skip, done, start)
            .map_err(llvm)?;

        // Mantissas with the leading bit at `mant`, and exponents (1 for the subnormals'
        // range, lower once normalized).
        b.position_at_end(start);
        let parts = |v: FloatValue<'c>| -> Result<(IntValue<'c>, IntValue<'c>)> {
            let bits = b
                .build_bit_cast(v, it, "bits")
                .map_err(llvm)?
                .into_int_value();
            let e = b
                .build_right_shift(bits, ci(f.mant), false, "e")
                .map_err(llvm)?;
            let e = b.build_and(e, exp_mask, "e").map_err(llvm)?;
            let m = b.build_and(bits, mant_mask, "m").map_err(llvm)?;
            let normal = b
                .build_int_compare(IntPredicate::NE, e, ci(0), "normal")
                .map_err(llvm)?;
            let implicit = b.build_or(m, ci(1 << f.mant), "mi").map_err(llvm)?;
            let (sm, se) = self.normalize(f.mant, m, ci(1))?;
            let m = b.build_select(normal, implicit, sm, "m").map_err(llvm)?;
            let e = b.build_select(normal, e, se, "e").map_err(llvm)?;
            Ok((m.into_int_value(), e.into_int_value()))
        };
        let (mx, ex) = parts(ax)?;
        let (my, ey) = parts(ay)?;
        b.build_unconditional_branch(head).map_err(llvm)?;

        // While ex > ey: subtract where it fits, shift left.
        b.position_at_end(head);
        let m_phi = b.build_phi(it, "mx").map_err(llvm)?;
        let e_phi = b.build_phi(it, "ex").map_err(llvm)?;
        let m = m_phi.as_basic_value().into_int_value();
        let e = e_phi.as_basic_value().into_int_value();
        let more = b
            .build_int_compare(IntPredicate::SGT, e, ey, "more")
            .map_err(llvm)?;
        b.build_conditional_branch(more, body, tail).map_err(llvm)?;
        b.position_at_end(body);
        let m1 = self.subtract_if_fits(m, my)?;
        let m2 = b.build_left_shift(m1, ci(1), "m2").map_err(llvm)?;
        let e2 = b.build_int_sub(e, ci(1), "e2").map_err(llvm)?;
        b.build_unconditional_branch(head).map_err(llvm)?;
        m_phi.add_incoming(&[(&mx, start), (&m2, body)]);
        e_phi.add_incoming(&[(&ex, start), (&e2, body)]);

        // The last step, then the result rebuilt.
        b.position_at_end(tail);
        let r = self.subtract_if_fits(m, my)?;
        let zero = b
            .build_int_compare(IntPredicate::EQ, r, ci(0), "zero")
            .map_err(llvm)?;
        let (rn, re) = self.normalize(f.mant, r, e)?;
        let normal = b
            .build_int_compare(IntPredicate::SGT, re, ci(0), "normal")
            .map_err(llvm)?;
        let field = b.build_left_shift(re, ci(f.mant), "field").map_err(llvm)?;
        let frac = b.build_and(rn, mant_mask, "frac").map_err(llvm)?;
        let normal_bits = b.build_or(frac, field, "nb").map_err(llvm)?;
        // A subnormal: shifted right by 1 - re (exact, the remainder being representable);
        // the shift stays below the width, as a zero result is taken apart below.
        let shift = b.build_int_sub(ci(1), re, "sh").map_err(llvm)?;
        let shift = b
            .build_select(
                b.build_int_compare(IntPredicate::ULT, shift, ci(width), "in")
                    .map_err(llvm)?,
                shift,
                ci(width - 1),
                "sh",
            )
            .map_err(llvm)?
            .into_int_value();
        let sub_bits = b.build_right_shift(rn, shift, false, "sb").map_err(llvm)?;
        let bits = b
            .build_select(normal, normal_bits, sub_bits, "rb")
            .map_err(llvm)?
            .into_int_value();
        let bits = b
            .build_select(zero, ci(0), bits, "rb")
            .map_err(llvm)?
            .into_int_value();
        let mag = b
            .build_bit_cast(bits, f.ft, "mag")
            .map_err(llvm)?
            .into_float_value();
        let general = self.copysign(mag, x)?;
        let tail_end = b.get_insert_block().expect("positioned");
        b.build_unconditional_branch(done).map_err(llvm)?;

        b.position_at_end(done);
        let phi = b.build_phi(f.ft, "fmod").map_err(llvm)?;
        phi.add_incoming(&[(&early, here), (&general, tail_end)]);
        Ok(phi.as_basic_value().into_float_value())
    }

    /// `m - my` where that is not negative, else `m`.
    fn subtract_if_fits(&self, m: IntValue<'c>, my: IntValue<'c>) -> Result<IntValue<'c>> {
        let b = self.builder();
        let fits = b
            .build_int_compare(IntPredicate::UGE, m, my, "fits")
            .map_err(llvm)?;
        let diff = b.build_int_sub(m, my, "diff").map_err(llvm)?;
        Ok(b.build_select(fits, diff, m, "m")
            .map_err(llvm)?
            .into_int_value())
    }

    /// `(m << s, e - s)` with `s` bringing `m`'s leading bit to `mant` (`m` below
    /// `2^(mant + 1)`; zero stays zero with `s` = 0).
    fn normalize(
        &self,
        mant: u64,
        m: IntValue<'c>,
        e: IntValue<'c>,
    ) -> Result<(IntValue<'c>, IntValue<'c>)> {
        let b = self.builder();
        let it = m.get_type();
        let width = it.get_bit_width() as u64;
        let lz = self
            .intrinsic(
                "llvm.ctlz",
                it.into(),
                &[m.into(), self.ctx().bool_type().const_zero().into()],
            )?
            .into_int_value();
        let s = b
            .build_int_sub(lz, it.const_int(width - 1 - mant, false), "s")
            .map_err(llvm)?;
        let nonzero = b
            .build_int_compare(IntPredicate::NE, m, it.const_zero(), "nz")
            .map_err(llvm)?;
        let s = b
            .build_select(nonzero, s, it.const_zero(), "s")
            .map_err(llvm)?
            .into_int_value();
        Ok((
            b.build_left_shift(m, s, "mn").map_err(llvm)?,
            b.build_int_sub(e, s, "en").map_err(llvm)?,
        ))
    }
}

impl<'c, T: Base<'c> + ?Sized> Remainder<'c> for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::OptimizationLevel;
    use inkwell::context::Context;
    use inkwell::targets::{InitializationConfig, Target};

    use crate::common::host::Host;

    #[test]
    fn fmod_is_exact_on_the_host() {
        Target::initialize_native(&InitializationConfig::default()).unwrap();
        let ctx = Context::create();
        let m = ctx.create_module("fmod");
        for (name, d) in [("f32", DType::F32), ("f64", DType::F64)] {
            let ft = if d == DType::F64 {
                ctx.f64_type()
            } else {
                ctx.f32_type()
            };
            let f = m.add_function(name, ft.fn_type(&[ft.into(), ft.into()], false), None);
            let b = ctx.create_builder();
            b.position_at_end(ctx.append_basic_block(f, "entry"));
            let h = Host {
                ctx: &ctx,
                m: &m,
                b,
            };
            let x = f.get_nth_param(0).unwrap().into_float_value();
            let y = f.get_nth_param(1).unwrap().into_float_value();
            let r = h.fmod_exact(d, x, y).unwrap();
            h.b.build_return(Some(&r)).unwrap();
        }
        m.verify().unwrap();
        let ee = m
            .create_jit_execution_engine(OptimizationLevel::None)
            .unwrap();
        let f32fn =
            unsafe { ee.get_function::<unsafe extern "C" fn(f32, f32) -> f32>("f32") }.unwrap();
        let f64fn =
            unsafe { ee.get_function::<unsafe extern "C" fn(f64, f64) -> f64>("f64") }.unwrap();
        // Zeros, subnormals, normals near 1 and at the ends of the range, infinities, NaN.
        let mut v32: Vec<u32> = vec![
            0,
            1,
            2,
            3,
            0x7f_ffff,
            0x80_0000,
            0x80_0001,
            0x3f80_0000,
            0x3f80_0001,
            0x4049_0fdb,
            0x7f7f_ffff,
            0x7f80_0000,
            0x7fc0_0000,
            0x0040_0000,
            0x3380_0000,
            0x5f00_0000,
        ];
        let mut v64: Vec<u64> = vec![
            0,
            1,
            3,
            0xf_ffff_ffff_ffff,
            0x10_0000_0000_0000,
            0x3ff0_0000_0000_0000,
            0x3ff0_0000_0000_0001,
            0x4009_21fb_5444_2d18,
            0x7fef_ffff_ffff_ffff,
            0x7ff0_0000_0000_0000,
            0x7ff8_0000_0000_0000,
            0x43e0_0000_0000_0000,
        ];
        // Pseudo-random bit patterns across the range.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..300 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            v32.push((s >> 32) as u32 & 0x7fff_ffff);
            v64.push(s & 0x7fff_ffff_ffff_ffff);
        }
        let n32 = v32.len();
        for i in 0..n32 {
            v32.push(v32[i] | 0x8000_0000);
        }
        let n64 = v64.len();
        for i in 0..n64 {
            v64.push(v64[i] | 0x8000_0000_0000_0000);
        }
        for &a in &v32 {
            for &c in &v32 {
                let (x, y) = (f32::from_bits(a), f32::from_bits(c));
                let got = unsafe { f32fn.call(x, y) };
                let want = x % y;
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "fmod({x:e}, {y:e}) = {got:e}, not {want:e}"
                );
            }
        }
        for &a in &v64 {
            for &c in v64.iter().step_by(3) {
                let (x, y) = (f64::from_bits(a), f64::from_bits(c));
                let got = unsafe { f64fn.call(x, y) };
                let want = x % y;
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "fmod({x:e}, {y:e}) = {got:e}, not {want:e}"
                );
            }
        }
    }
}

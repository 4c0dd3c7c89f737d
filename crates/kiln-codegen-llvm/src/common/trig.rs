//! `atan2` as target-independent LLVM IR for targets without a C math library (the GPU), for
//! f32, f16 and bf16 results, computed in f64: t = min(|y|, |x|) / max(|y|, |x|) in [0, 1],
//! reduced to |s| <= tan(π/8) by atan t = π/4 + atan((t - 1) / (t + 1)) above it, atan s by its
//! Taylor series to s^33 (truncation below 3e-14 relative), then the octant and quadrant put
//! back (π/2 - a where |y| > |x|, π - a where x's sign is set) and y's sign. Both infinite
//! gives t = 1, both zero t = 0, so C's special cases (±0 and ±π for y = ±0, ±π/4 and ±3π/4
//! for infinities) come out of the same steps. Within 1 ulp of Rust's `atan2` rounded to f32
//! (`atan2_is_accurate_on_the_host`); NaN for a NaN operand.

use super::math::Math;
use super::scalar::Scalar;
use super::{Base, llvm};
use crate::Result;
use inkwell::FloatPredicate;
use inkwell::values::FloatValue;
use kiln_ir::DType;

/// atan s for |s| <= tan(π/8): s (1 - s²/3 + s⁴/5 - ...), the Taylor coefficients of atan s / s
/// in s², lowest first.
fn atan_series() -> Vec<f64> {
    (0..17)
        .map(|k| {
            let c = 1.0 / (2 * k + 1) as f64;
            if k % 2 == 0 { c } else { -c }
        })
        .collect()
}

/// `atan2`, on any [`Base`].
pub(crate) trait Trig<'c>: Base<'c> {
    /// atan2(y, x) in `d` (f32, f16 or bf16); f64 is [`crate::Error::Unsupported`] (the series
    /// is not accurate enough for it).
    fn atan2_narrow(
        &self,
        d: DType,
        y: FloatValue<'c>,
        x: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        if d == DType::F64 {
            return Err(crate::Error::Unsupported(
                "`atan2` on f64 has no GPU implementation yet".into(),
            ));
        }
        let b = self.builder();
        let ft = self.ctx().f64_type();
        let c = |v: f64| ft.const_float(v);
        let y = b.build_float_ext(y, ft, "y").map_err(llvm)?;
        let x = b.build_float_ext(x, ft, "x").map_err(llvm)?;
        let ay = self.fabs(y)?;
        let ax = self.fabs(x)?;
        let steep = self.fcmp(FloatPredicate::OGT, ay, ax)?;
        let mn = self.select_float(steep, ax, ay)?;
        let mx = self.select_float(steep, ay, ax)?;
        let t = b.build_float_div(mn, mx, "t").map_err(llvm)?;
        // 0 / 0 and inf / inf.
        let inf = c(f64::INFINITY);
        let both_inf = b
            .build_and(
                self.fcmp(FloatPredicate::OEQ, ax, inf)?,
                self.fcmp(FloatPredicate::OEQ, ay, inf)?,
                "bi",
            )
            .map_err(llvm)?;
        let both_zero = b
            .build_and(
                self.fcmp(FloatPredicate::OEQ, ax, c(0.0))?,
                self.fcmp(FloatPredicate::OEQ, ay, c(0.0))?,
                "bz",
            )
            .map_err(llvm)?;
        let t = self.select_float(both_inf, c(1.0), t)?;
        let t = self.select_float(both_zero, c(0.0), t)?;
        // Above tan(π/8): π/4 + atan((t - 1) / (t + 1)).
        let high = self.fcmp(FloatPredicate::OGT, t, c(0.414_213_562_373_095_1))?;
        let num = b.build_float_sub(t, c(1.0), "n").map_err(llvm)?;
        let den = b.build_float_add(t, c(1.0), "d").map_err(llvm)?;
        let shifted = b.build_float_div(num, den, "sh").map_err(llvm)?;
        let s = self.select_float(high, shifted, t)?;
        let s2 = b.build_float_mul(s, s, "s2").map_err(llvm)?;
        let p = self.horner(s2, &atan_series())?;
        let a = b.build_float_mul(s, p, "a").map_err(llvm)?;
        let a_high = b
            .build_float_add(a, c(std::f64::consts::FRAC_PI_4), "ah")
            .map_err(llvm)?;
        let a = self.select_float(high, a_high, a)?;
        let a_steep = b
            .build_float_sub(c(std::f64::consts::FRAC_PI_2), a, "as")
            .map_err(llvm)?;
        let a = self.select_float(steep, a_steep, a)?;
        let bits = b
            .build_bit_cast(x, self.ctx().i64_type(), "xb")
            .map_err(llvm)?
            .into_int_value();
        let west = b
            .build_int_compare(
                inkwell::IntPredicate::SLT,
                bits,
                self.ctx().i64_type().const_zero(),
                "w",
            )
            .map_err(llvm)?;
        let a_west = b
            .build_float_sub(c(std::f64::consts::PI), a, "aw")
            .map_err(llvm)?;
        let a = self.select_float(west, a_west, a)?;
        let r = self.copysign(a, y)?;
        let nan = self.fcmp(FloatPredicate::UNO, x, y)?;
        let r = self.select_float(nan, c(f64::NAN), r)?;
        b.build_float_trunc(r, self.ftype(d), "r").map_err(llvm)
    }
}

impl<'c, T: Base<'c> + ?Sized> Trig<'c> for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::OptimizationLevel;
    use inkwell::builder::Builder;
    use inkwell::context::Context;
    use inkwell::module::Module;
    use inkwell::targets::{InitializationConfig, Target};

    struct Host<'a, 'c> {
        ctx: &'c Context,
        m: &'a Module<'c>,
        b: Builder<'c>,
    }

    impl<'c> Base<'c> for Host<'_, 'c> {
        fn ctx(&self) -> &'c Context {
            self.ctx
        }
        fn module(&self) -> &Module<'c> {
            self.m
        }
        fn builder(&self) -> &Builder<'c> {
            &self.b
        }
        fn libm_call(&self, _: &str, _: DType, _: FloatValue<'c>) -> Result<FloatValue<'c>> {
            unreachable!()
        }
    }

    fn ulps32(a: f32, b: f32) -> u64 {
        if a.is_nan() && b.is_nan() || a == b && a.is_sign_negative() == b.is_sign_negative() {
            return 0;
        }
        let key = |v: f32| {
            let i = v.to_bits() as i32 as i64;
            if i < 0 { i32::MIN as i64 - i } else { i }
        };
        key(a).abs_diff(key(b)).max(1)
    }

    #[test]
    fn atan2_is_accurate_on_the_host() {
        Target::initialize_native(&InitializationConfig::default()).unwrap();
        let ctx = Context::create();
        let m = ctx.create_module("trig");
        let ft = ctx.f32_type();
        let f = m.add_function("atan2", ft.fn_type(&[ft.into(), ft.into()], false), None);
        let b = ctx.create_builder();
        b.position_at_end(ctx.append_basic_block(f, "entry"));
        let h = Host {
            ctx: &ctx,
            m: &m,
            b,
        };
        let (y, x) = (f.get_nth_param(0).unwrap(), f.get_nth_param(1).unwrap());
        let r = h
            .atan2_narrow(DType::F32, y.into_float_value(), x.into_float_value())
            .unwrap();
        h.b.build_return(Some(&r)).unwrap();
        m.verify().unwrap();
        let ee = m
            .create_jit_execution_engine(OptimizationLevel::None)
            .unwrap();
        let atan2 =
            unsafe { ee.get_function::<unsafe extern "C" fn(f32, f32) -> f32>("atan2") }.unwrap();
        let mut vs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            1e-45,
            -1e-45,
            3e38,
            -3e38,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.41421357,
            2.4142137,
        ];
        let mut s = 0x853c_49e6_748f_ea9bu64;
        for i in 0..1500 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            vs.push(if i % 2 == 0 {
                f32::from_bits((s >> 32) as u32)
            } else {
                ((s >> 40) as f32 / (1u32 << 24) as f32 - 0.5) * 8.0
            });
        }
        let mut worst = 0;
        for &y in &vs {
            for &x in &vs {
                let got = unsafe { atan2.call(y, x) };
                let want = (y as f64).atan2(x as f64) as f32;
                let u = ulps32(got, want);
                assert!(
                    u <= 1,
                    "atan2({y:e}, {x:e}) = {got:e}, not {want:e} ({u} ulps)"
                );
                worst = worst.max(u);
            }
        }
        println!("atan2: at most {worst} ulps in f32");
    }
}

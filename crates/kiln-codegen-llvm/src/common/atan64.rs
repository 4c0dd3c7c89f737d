//! `atan2` on f64 as target-independent LLVM IR, for targets without a C math library (the
//! GPU). t = min(|y|, |x|) / max(|y|, |x|) in [0, 1] is carried with its division's exact
//! remainder as a double-double (both magnitudes scaled up by 2^600 first where the larger is
//! below 2^-600, so the remainder is not a rounded subnormal); with c = j/16 the nearest
//! sixteenth, atan t = atan c + atan s for s = (t - c) / (1 + t c), |s| <= 1/32, atan c from a
//! double-double table and atan s = s - s³/3 + ... to s^13 on s's double-double. The octant
//! and quadrant are put back in double-double (π/2 - a where |y| > |x|, π - a where x's sign
//! is set), then y's sign. Both infinite gives t = 1, both zero t = 0, so C's special cases
//! (±0 and ±π for y = ±0, ±π/4 and ±3π/4 for infinities) come out of the same steps. Within
//! 1 ulp of the correctly rounded value (`f64_atan2_is_accurate_on_the_host` checks it against
//! Rust's); NaN for a NaN operand.

use super::dd::DoubleDouble;
use super::math::Math;
use super::scalar::Scalar;
use super::table::Tables;
use super::tables64::{ATAN_HI, ATAN_LO, FRAC_PI_2, PI};
use super::{Base, llvm};
use crate::Result;
use inkwell::FloatPredicate;
use inkwell::values::FloatValue;

/// f64 atan2, on any [`Base`].
pub(crate) trait Atan64<'c>: Base<'c> {
    /// The ratio `t = min(|x|, |y|) / max(|x|, |y|)` of an atan2, where it is 0 / 0 (then 0)
    /// or inf / inf (then 1, the diagonal), in `t`'s type.
    fn ratio_cases(
        &self,
        ax: FloatValue<'c>,
        ay: FloatValue<'c>,
        t: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ft = t.get_type();
        let c = |v: f64| ft.const_float(v);
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
        self.select_float(both_zero, c(0.0), t)
    }

    /// atan2(y, x) for f64 `y` and `x`.
    fn atan2_f64(&self, y: FloatValue<'c>, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ctx = self.ctx();
        let ft = ctx.f64_type();
        let i64t = ctx.i64_type();
        let c = |v: f64| ft.const_float(v);
        let ay = self.fabs(y)?;
        let ax = self.fabs(x)?;
        let steep = self.fcmp(FloatPredicate::OGT, ay, ax)?;
        let mn = self.select_float(steep, ax, ay)?;
        let mx = self.select_float(steep, ay, ax)?;
        let tiny = self.fcmp(FloatPredicate::OLT, mx, c(2f64.powi(-600)))?;
        let up = self.select_float(tiny, c(2f64.powi(600)), c(1.0))?;
        let mn = b.build_float_mul(mn, up, "mn").map_err(llvm)?;
        let mx = b.build_float_mul(mx, up, "mx").map_err(llvm)?;
        let t = b.build_float_div(mn, mx, "t").map_err(llvm)?;
        let nt = b.build_float_neg(t, "nt").map_err(llvm)?;
        let rem = self.fma(nt, mx, mn)?;
        let tl = b.build_float_div(rem, mx, "tl").map_err(llvm)?;
        // 0 / 0 and inf / inf; and tl where mx is infinite (0 times inf).
        let t = self.ratio_cases(ax, ay, t)?;
        let tl_nan = self.fcmp(FloatPredicate::UNO, tl, tl)?;
        let tl = self.select_float(tl_nan, c(0.0), tl)?;
        // The nearest sixteenth (0 for NaN, so the conversion is defined).
        let j = self
            .intrinsic(
                "llvm.rint",
                ft.into(),
                &[b.build_float_mul(t, c(16.0), "t16").map_err(llvm)?.into()],
            )?
            .into_float_value();
        let t_nan = self.fcmp(FloatPredicate::UNO, t, t)?;
        let j = self.select_float(t_nan, c(0.0), j)?;
        let cj = b.build_float_mul(j, c(1.0 / 16.0), "cj").map_err(llvm)?;
        let ji = b.build_float_to_unsigned_int(j, i64t, "j").map_err(llvm)?;
        // s = (t - c) / (1 + t c), both double-doubles (t - c is exact: within a factor 2).
        let num = self.two_sum(b.build_float_sub(t, cj, "n").map_err(llvm)?, tl)?;
        let (p, pe) = self.two_prod(t, cj)?;
        let (dh, de) = self.fast_two_sum(c(1.0), p)?;
        let dl = b.build_float_add(de, pe, "dl").map_err(llvm)?;
        let dl = self.fma(tl, cj, dl)?;
        let (sh, sl) = self.dd_div(num, (dh, dl))?;
        // atan s = s + s z P(z), z = s².
        let z = b.build_float_mul(sh, sh, "z").map_err(llvm)?;
        let series: Vec<f64> = (1..=6)
            .map(|k| {
                let v = 1.0 / (2 * k + 1) as f64;
                if k % 2 == 1 { -v } else { v }
            })
            .collect();
        let sz = b.build_float_mul(sh, z, "sz").map_err(llvm)?;
        let tail = self.fma(sz, self.horner(z, &series)?, sl)?;
        let (ah, e) = self.two_sum(self.table_f64("kiln_atan_hi", &ATAN_HI, ji)?, sh)?;
        let al = b
            .build_float_add(
                b.build_float_add(e, self.table_f64("kiln_atan_lo", &ATAN_LO, ji)?, "al")
                    .map_err(llvm)?,
                tail,
                "al",
            )
            .map_err(llvm)?;
        let a = self.fast_two_sum(ah, al)?;
        // k - a for k = π/2 or π, in double-double.
        let from = |k: (f64, f64), a: (FloatValue<'c>, FloatValue<'c>)| {
            let (h, e) = self.two_sum(c(k.0), b.build_float_neg(a.0, "na").map_err(llvm)?)?;
            let l = b
                .build_float_sub(b.build_float_add(e, c(k.1), "l").map_err(llvm)?, a.1, "l")
                .map_err(llvm)?;
            self.fast_two_sum(h, l)
        };
        let a_steep = from(FRAC_PI_2, a)?;
        let a = (
            self.select_float(steep, a_steep.0, a.0)?,
            self.select_float(steep, a_steep.1, a.1)?,
        );
        let west = self.sign_set(x)?;
        let a_west = from(PI, a)?;
        let a = self.select_float(west, a_west.0, a.0)?;
        let r = self.copysign(a, y)?;
        let nan = self.fcmp(FloatPredicate::UNO, x, y)?;
        self.select_float(nan, c(f64::NAN), r)
    }
}

impl<'c, T: Base<'c> + ?Sized> Atan64<'c> for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::host::{Rng, define, ulps64};
    use inkwell::OptimizationLevel;
    use inkwell::context::Context;
    use inkwell::targets::{InitializationConfig, Target};

    #[test]
    fn f64_atan2_is_accurate_on_the_host() {
        Target::initialize_native(&InitializationConfig::default()).unwrap();
        let ctx = Context::create();
        let m = ctx.create_module("atan64");
        define(&ctx, &m, "kiln_atan2", 2, |h, a| h.atan2_f64(a[0], a[1]));
        m.verify().unwrap();
        let ee = m
            .create_jit_execution_engine(OptimizationLevel::None)
            .unwrap();
        let atan2 =
            unsafe { ee.get_function::<unsafe extern "C" fn(f64, f64) -> f64>("kiln_atan2") }
                .unwrap();
        let mut vs: Vec<f64> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            5e-324,
            -5e-324,
            1e-310,
            2.2e-308,
            1e-300,
            1e300,
            f64::MAX,
            -f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            0.41421356237309503,
            2.414213562373095,
            1.0 / 32.0,
            3.0 / 32.0,
            1.0f64.next_up(),
            1.0f64.next_down(),
        ];
        let mut rng = Rng(0x853c_49e6_748f_ea9b);
        for i in 0..1600 {
            vs.push(match i % 3 {
                0 => rng.bits(),
                1 => (rng.unit() - 0.5) * 8.0,
                _ => (rng.unit() - 0.5) * 2f64.powi((rng.next() % 200) as i32 - 100),
            });
        }
        let mut worst = 0;
        let mut pairs: Vec<(f64, f64)> = vs
            .iter()
            .flat_map(|&y| vs.iter().map(move |&x| (y, x)))
            .collect();
        // Ratios near each sixteenth, where the table's intervals meet.
        for j in 0..=16 {
            for _ in 0..2000 {
                let x = 1.0 + rng.unit();
                let t = j as f64 / 16.0 + (rng.unit() - 0.5) / 16.0;
                pairs.push((t * x, x));
                pairs.push((x, -t * x));
            }
        }
        for (y, x) in pairs {
            let got = unsafe { atan2.call(y, x) };
            let want = y.atan2(x);
            let u = ulps64(got, want);
            assert!(
                u <= 1,
                "atan2({y:e}, {x:e}) = {got:e}, not {want:e} ({u} ulps)"
            );
            worst = worst.max(u);
        }
        println!("atan2: at most {worst} ulps in f64");
    }
}

//! `power` on f64 as target-independent LLVM IR, for targets without a C math library (the
//! GPU): x^y = e^(y ln |x|) with ln |x| and the product in double-double, so the exponential's
//! argument is right to about 2^-58 absolutely over the whole finite range (|y ln |x|| < 746);
//! then C's special cases, as for the narrower types ([`super::libm::Library::pow_narrow`]).
//!
//! - ln: |x| = m' 2^e with m' in [1, 2) (subnormals scaled by 2^54 first); its top 8
//!   mantissa bits pick k/256 near 1/m' (a table), r = m' k/256 - 1 is exact and below 2^-7,
//!   and ln |x| = e ln 2 + (-ln(k/256)) + ln(1 + r), the middle term from a double-double table
//!   (where k/256 is below 1/√2 the table holds -ln(2k/256) and e counts one more, so ln |x|
//!   near 1 is summed without cancellation), ln(1 + r) = r - r²/2 + r³ Q(r) with r² exact.
//! - exp: z = n ln2/32 + r' with n rounded to nearest (ln 2/32 in two parts, n times the first
//!   exact), e^z = 2^(n/32) (1 + p(r')) 2^⌊n/32⌋, 2^(j/32) a double-double table, p the
//!   Taylor polynomial of e^r' - 1 to r'^7 (|r'| <= 0.011), scaled in two steps (one rounding
//!   in the subnormal range). Beyond the range, inf or 0.
//!
//! Within 1 ulp of the correctly rounded value (subnormal results within 1 ulp of theirs),
//! checked against Rust's `powf` by `f64_power_is_accurate_on_the_host`.

use super::dd::{Dd, DoubleDouble};
use super::math::Math;
use super::scalar::Scalar;
use super::table::Tables;
use super::tables64::{EXP2_HI, EXP2_LO, LN2, LN2_32, LOG_C_HI, LOG_C_LO, LOG_FOLD, LOG_INV};
use super::{Base, llvm};
use crate::Result;
use inkwell::values::FloatValue;
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::DType;

/// f64 power, on any [`Base`].
pub(crate) trait Pow64<'c>: Base<'c> {
    /// x^y for f64 `x` and `y`.
    fn pow_f64(&self, x: FloatValue<'c>, y: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ax = self.fabs(x)?;
        let (lh, ll) = self.ln_dd(ax)?;
        // z = y ln|x| in double-double (the low part 0 where the high one is not finite).
        let zh = b.build_float_mul(y, lh, "zh").map_err(llvm)?;
        let nzh = b.build_float_neg(zh, "nzh").map_err(llvm)?;
        let zl = self.fma(y, lh, nzh)?;
        let zl = self.fma(y, ll, zl)?;
        let r = self.exp_dd((zh, zl))?;
        self.pow_special_cases(x, y, r)
    }

    /// C's special cases of x^y (f64 `x` and `y`) applied to `r`, its value computed as
    /// e^(y ln |x|): the sign of x kept for odd integer powers (infinities count as even
    /// ones), a negative finite x (not -0) to a non-integer power NaN, x^0 = 1^y = 1 (NaNs
    /// included) and (-1)^±inf = 1.
    fn pow_special_cases(
        &self,
        x: FloatValue<'c>,
        y: FloatValue<'c>,
        r: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ft = self.ctx().f64_type();
        let c = |v: f64| ft.const_float(v);
        let ax = self.fabs(x)?;
        // y an integer (infinities count as even ones), and odd.
        let fl = self.intrinsic("llvm.floor", ft.into(), &[y.into()])?;
        let integer = self.fcmp(FloatPredicate::OEQ, fl.into_float_value(), y)?;
        let half = b.build_float_mul(y, c(0.5), "h").map_err(llvm)?;
        let fh = self
            .intrinsic("llvm.floor", ft.into(), &[half.into()])?
            .into_float_value();
        let not_even = self.fcmp(FloatPredicate::ONE, fh, half)?;
        let odd = b.build_and(integer, not_even, "odd").map_err(llvm)?;
        let negative = self.sign_set(x)?;
        let flip = b.build_and(negative, odd, "flip").map_err(llvm)?;
        let neg_r = b.build_float_neg(r, "nr").map_err(llvm)?;
        let r = self.select_float(flip, neg_r, r)?;
        // A negative finite x (not -0) to a non-integer power: NaN.
        let below = self.fcmp(FloatPredicate::OLT, x, c(0.0))?;
        let finite = self.fcmp(FloatPredicate::ONE, ax, c(f64::INFINITY))?;
        let not_integer = b.build_not(integer, "ni").map_err(llvm)?;
        let invalid = b.build_and(below, finite, "inv").map_err(llvm)?;
        let invalid = b.build_and(invalid, not_integer, "inv").map_err(llvm)?;
        let r = self.select_float(invalid, c(f64::NAN), r)?;
        // x^0 = 1 and 1^y = 1 (NaNs included); (-1)^±inf = 1.
        let y_zero = self.fcmp(FloatPredicate::OEQ, y, c(0.0))?;
        let x_one = self.fcmp(FloatPredicate::OEQ, x, c(1.0))?;
        let minus_one = self.fcmp(FloatPredicate::OEQ, x, c(-1.0))?;
        let y_inf = self.fcmp(FloatPredicate::OEQ, self.fabs(y)?, c(f64::INFINITY))?;
        let one = b.build_or(y_zero, x_one, "one").map_err(llvm)?;
        let m1 = b.build_and(minus_one, y_inf, "m1").map_err(llvm)?;
        let one = b.build_or(one, m1, "one").map_err(llvm)?;
        self.select_float(one, c(1.0), r)
    }

    /// ln of a nonnegative `ax` as a double-double: -inf for 0, +inf for +inf, NaN for NaN
    /// (low parts 0).
    fn ln_dd(&self, ax: FloatValue<'c>) -> Result<Dd<'c>> {
        let b = self.builder();
        let ft = self.ctx().f64_type();
        let i64t = self.ctx().i64_type();
        let c = |v: f64| ft.const_float(v);
        let ci = |v: u64| i64t.const_int(v, false);
        let tiny = self.fcmp(FloatPredicate::OLT, ax, c(f64::MIN_POSITIVE))?;
        let scaled = b
            .build_float_mul(ax, c(2f64.powi(54)), "xs")
            .map_err(llvm)?;
        let xs = self.select_float(tiny, scaled, ax)?;
        let bits = b
            .build_bit_cast(xs, i64t, "bits")
            .map_err(llvm)?
            .into_int_value();
        let e = b
            .build_right_shift(bits, ci(52), false, "eb")
            .map_err(llvm)?;
        // Below 2048 for every nonnegative double: the exponent stays a small integer.
        let e = b.build_and(e, ci(0x7ff), "eb").map_err(llvm)?;
        let mant = b.build_and(bits, ci((1 << 52) - 1), "mb").map_err(llvm)?;
        let m = b
            .build_bit_cast(
                b.build_or(mant, ci(1023 << 52), "m1").map_err(llvm)?,
                ft,
                "m",
            )
            .map_err(llvm)?
            .into_float_value();
        let i = b
            .build_right_shift(mant, ci(44), false, "i")
            .map_err(llvm)?;
        let inv: Vec<f64> = LOG_INV.iter().map(|&k| k as f64 / 256.0).collect();
        let k = self.table_f64("kiln_log_inv", &inv, i)?;
        let r = self.fma(m, k, c(-1.0))?;
        let fold = b
            .build_int_compare(IntPredicate::UGE, i, ci(LOG_FOLD), "fold")
            .map_err(llvm)?;
        // e - 1023 (+ 1 where folded, - 54 where scaled).
        let e = b.build_int_sub(e, ci(1023), "e").map_err(llvm)?;
        let e = b
            .build_int_add(e, b.build_int_z_extend(fold, i64t, "f").map_err(llvm)?, "e")
            .map_err(llvm)?;
        let e = b
            .build_int_sub(
                e,
                b.build_select(tiny, ci(54), ci(0), "adj")
                    .map_err(llvm)?
                    .into_int_value(),
                "e",
            )
            .map_err(llvm)?;
        let ef = b.build_signed_int_to_float(e, ft, "ef").map_err(llvm)?;
        // ln(1 + r) = r - r²/2 + r³ Q(r), r² exact.
        let (r2, r2l) = self.two_prod(r, r)?;
        let h2 = b.build_float_mul(r2, c(-0.5), "h2").map_err(llvm)?;
        let (ph, pe) = self.fast_two_sum(r, h2)?;
        let q: Vec<f64> = (3..=10)
            .map(|n| {
                let v = 1.0 / n as f64;
                if n % 2 == 1 { v } else { -v }
            })
            .collect();
        let r3 = b.build_float_mul(r2, r, "r3").map_err(llvm)?;
        let pl = self.fma(r3, self.horner(r, &q)?, pe)?;
        let pl = self.fma(r2l, c(-0.5), pl)?;
        // e ln 2 + c_i + ln(1 + r).
        let ch = self.table_f64("kiln_log_c_hi", &LOG_C_HI, i)?;
        let cl = self.table_f64("kiln_log_c_lo", &LOG_C_LO, i)?;
        let e_hi = b.build_float_mul(ef, c(LN2.0), "eh").map_err(llvm)?;
        let (t1, t1e) = self.two_sum(e_hi, ch)?;
        let (t2, t2e) = self.two_sum(t1, ph)?;
        let lo = b.build_float_add(t1e, t2e, "lo").map_err(llvm)?;
        let lo = self.fma(ef, c(LN2.1), lo)?;
        let lo = b.build_float_add(lo, cl, "lo").map_err(llvm)?;
        let lo = b.build_float_add(lo, pl, "lo").map_err(llvm)?;
        let (lh, ll) = self.fast_two_sum(t2, lo)?;
        // 0, +inf and NaN.
        let zero = self.fcmp(FloatPredicate::OEQ, ax, c(0.0))?;
        let special = self.fcmp(FloatPredicate::UEQ, ax, c(f64::INFINITY))?;
        let lh = self.select_float(special, ax, lh)?;
        let lh = self.select_float(zero, c(f64::NEG_INFINITY), lh)?;
        let not_finite = b.build_or(zero, special, "sp").map_err(llvm)?;
        let ll = self.select_float(not_finite, c(0.0), ll)?;
        Ok((lh, ll))
    }

    /// e^(zh + zl): inf above the largest finite result, 0 below half the smallest subnormal,
    /// NaN for NaN.
    fn exp_dd(&self, z: Dd<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ft = self.ctx().f64_type();
        let i64t = self.ctx().i64_type();
        let c = |v: f64| ft.const_float(v);
        let (zh, zl) = z;
        let over = self.fcmp(FloatPredicate::OGT, zh, c(709.8))?;
        let under = self.fcmp(FloatPredicate::OLT, zh, c(-745.2))?;
        let out = b.build_or(over, under, "out").map_err(llvm)?;
        let zh = self.select_float(out, c(0.0), zh)?;
        let zl = self.select_float(out, c(0.0), zl)?;
        // n = rint(z 32/ln 2) by the shifter 1.5 2^52 (its bits less the shifter's are n; no
        // conversion, which NaN would make poison).
        let shifter = 1.5 * 2f64.powi(52);
        let t = self.fma(zh, c(32.0 / std::f64::consts::LN_2), c(shifter))?;
        let n = b.build_float_sub(t, c(shifter), "n").map_err(llvm)?;
        let ni = b
            .build_int_sub(
                b.build_bit_cast(t, i64t, "tb")
                    .map_err(llvm)?
                    .into_int_value(),
                i64t.const_int(shifter.to_bits(), false),
                "ni",
            )
            .map_err(llvm)?;
        let nn = b.build_float_neg(n, "nn").map_err(llvm)?;
        let r = self.fma(nn, c(LN2_32.0), zh)?;
        let r = self.fma(nn, c(LN2_32.1), r)?;
        let r = b.build_float_add(r, zl, "r").map_err(llvm)?;
        // e^r - 1 = r + r² E(r).
        let mut e = Vec::new();
        let mut fact = 1.0f64;
        for k in 2..=7 {
            fact *= k as f64;
            e.push(1.0 / fact);
        }
        let r2 = b.build_float_mul(r, r, "r2").map_err(llvm)?;
        let p = self.fma(r2, self.horner(r, &e)?, r)?;
        let j = b
            .build_and(ni, i64t.const_int(31, false), "j")
            .map_err(llvm)?;
        let th = self.table_f64("kiln_exp2_hi", &EXP2_HI, j)?;
        let tl = self.table_f64("kiln_exp2_lo", &EXP2_LO, j)?;
        // 2^(j/32) (1 + p) = th + (th p + tl (1 + p)).
        let v = self.fma(tl, p, tl)?;
        let v = self.fma(th, p, v)?;
        let y = b.build_float_add(th, v, "y").map_err(llvm)?;
        let m = b
            .build_right_shift(ni, i64t.const_int(5, false), true, "m")
            .map_err(llvm)?;
        let y = self.scale_two_steps(y, m)?;
        let y = self.select_float(over, c(f64::INFINITY), y)?;
        self.select_float(under, c(0.0), y)
    }

    /// y 2^m for an integer m in [-1077, 1025]: two exact-or-final products by exponent bits
    /// (the first never leaves the normal range; the second rounds once, or overflows).
    fn scale_two_steps(
        &self,
        y: FloatValue<'c>,
        m: inkwell::values::IntValue<'c>,
    ) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let f = self.format(DType::F64);
        let m1 = b
            .build_right_shift(m, f.it.const_int(1, false), true, "m1")
            .map_err(llvm)?;
        let m2 = b.build_int_sub(m, m1, "m2").map_err(llvm)?;
        let y = b
            .build_float_mul(y, self.pow2(&f, m1)?, "y1")
            .map_err(llvm)?;
        b.build_float_mul(y, self.pow2(&f, m2)?, "y2").map_err(llvm)
    }
}

impl<'c, T: Base<'c> + ?Sized> Pow64<'c> for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::host::{Rng, define, ulps64};
    use inkwell::OptimizationLevel;
    use inkwell::context::Context;
    use inkwell::targets::{InitializationConfig, Target};

    #[test]
    fn f64_power_is_accurate_on_the_host() {
        Target::initialize_native(&InitializationConfig::default()).unwrap();
        let ctx = Context::create();
        let m = ctx.create_module("pow64");
        define(&ctx, &m, "kiln_pow", 2, |h, a| h.pow_f64(a[0], a[1]));
        m.verify().unwrap();
        let ee = m
            .create_jit_execution_engine(OptimizationLevel::None)
            .unwrap();
        let pow = unsafe { ee.get_function::<unsafe extern "C" fn(f64, f64) -> f64>("kiln_pow") }
            .unwrap();
        let mut ys: Vec<f64> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            2.0,
            -2.0,
            3.0,
            -3.0,
            0.5,
            -0.5,
            1.5,
            1e10,
            -1e10,
            25.0,
            1023.0,
            -1074.0,
            2f64.powi(53),
            2f64.powi(53) + 2.0,
            9007199254740991.0,
            1e300,
            5e-324,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let mut xs: Vec<f64> = ys.clone();
        xs.extend([
            5e-324,
            -5e-324,
            1e-310,
            1e-300,
            f64::MAX,
            -f64::MAX,
            0.999,
            1.001,
            -7.0,
            1.0f64.next_up(),
            1.0f64.next_down(),
            -1.0f64.next_up(),
            std::f64::consts::SQRT_2,
            std::f64::consts::FRAC_1_SQRT_2,
            10.0,
            -10.0,
        ]);
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for i in 0..1500 {
            xs.push(match i % 3 {
                0 => rng.bits(),
                1 => (rng.unit() - 0.5) * 8.0,
                _ => 1.0 + (rng.unit() - 0.5) * 2f64.powi(-((rng.next() % 50) as i32)),
            });
            if i % 2 == 0 {
                ys.push(match i % 4 {
                    0 => (rng.unit() - 0.5) * 600.0,
                    _ => ((rng.unit() - 0.5) * 200.0).round(),
                });
            }
        }
        let mut pairs: Vec<(f64, f64)> = xs
            .iter()
            .flat_map(|&x| ys.iter().map(move |&y| (x, y)))
            .collect();
        // Results across the whole range, subnormals and overflow included: y ln x from
        // -760 to 720.
        for _ in 0..200_000 {
            let x = f64::from_bits(rng.next() >> 1);
            let l = x.ln();
            if l == 0.0 || !l.is_finite() {
                continue;
            }
            let target = -760.0 + rng.unit() * 1480.0;
            pairs.push((x, target / l));
            pairs.push((-x, (target / l).round()));
        }
        let mut worst = 0;
        for (x, y) in pairs {
            let got = unsafe { pow.call(x, y) };
            let want = x.powf(y);
            let u = ulps64(got, want);
            assert!(
                u <= 1,
                "pow({x:e}, {y:e}) = {got:e}, not {want:e} ({u} ulps)"
            );
            worst = worst.max(u);
        }
        println!("pow: at most {worst} ulps in f64");
    }
}

//! `atan2` and the circular functions as target-independent LLVM IR for targets without a C
//! math library (the GPU), for f32, f16 and bf16 results (f64 ones are [`super::atan64`]'s and
//! [`super::circular64`]'s). atan2 is computed in f64: t = min(|y|, |x|) / max(|y|, |x|) in [0, 1],
//! reduced to |s| <= tan(π/8) by atan t = π/4 + atan((t - 1) / (t + 1)) above it, atan s by its
//! Taylor series to s^33 (truncation below 3e-14 relative), then the octant and quadrant put
//! back (π/2 - a where |y| > |x|, π - a where x's sign is set) and y's sign. Both infinite
//! gives t = 1, both zero t = 0, so C's special cases (±0 and ±π for y = ±0, ±π/4 and ±3π/4
//! for infinities) come out of the same steps. Within 1 ulp of Rust's `atan2` rounded to f32
//! (`atan2_is_accurate_on_the_host`); NaN for a NaN operand.

use super::atan64::Atan64;
use super::circular64::Circular64;
use super::math::Math;
use super::scalar::Scalar;
use super::{Base, llvm};
use crate::Result;
use inkwell::FloatPredicate;
use inkwell::values::{FloatValue, IntValue};
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

/// 2/π in 64-bit words, most significant first, after a word of zeros (the bits before the
/// binary point).
const TWO_OVER_PI: [u64; 5] = [
    0,
    0xA2F9_836E_4E44_1529,
    0xFC27_57D1_F534_DDC0,
    0xDB62_9599_3C43_9041,
    0xFE51_63AB_DEBB_C561,
];

/// The circular functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Circular {
    Sin,
    Cos,
    Tan,
}

/// `atan2` and the circular functions, on any [`Base`].
pub(crate) trait Trig<'c>: Base<'c> {
    /// atan2(y, x) in `d`: f32, f16 or bf16 as above; f64 by [`Atan64::atan2_f64`] (the
    /// series is not accurate enough for it).
    fn atan2_narrow(
        &self,
        d: DType,
        y: FloatValue<'c>,
        x: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        if d == DType::F64 {
            return self.atan2_f64(y, x);
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
        let t = self.ratio_cases(ax, ay, t)?;
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
        let west = self.sign_set(x)?;
        let a_west = b
            .build_float_sub(c(std::f64::consts::PI), a, "aw")
            .map_err(llvm)?;
        let a = self.select_float(west, a_west, a)?;
        let r = self.copysign(a, y)?;
        let nan = self.fcmp(FloatPredicate::UNO, x, y)?;
        let r = self.select_float(nan, c(f64::NAN), r)?;
        b.build_float_trunc(r, self.ftype(d), "r").map_err(llvm)
    }

    /// sin, cos or tan of `x` in `d`. f32, f16 and bf16 are computed in f64: |x| reduced by
    /// π/2 to k and r in [-π/4, π/4] (directly below π/4; by fdlibm's three-part π/2 below
    /// 2^20; above, by [`Trig::reduce_large`]), r's sine and cosine by their Taylor series to
    /// r^17 and r^16, the quadrant k mod 4 and x's sign put back. NaN for infinities and NaN.
    /// f64 is [`Circular64::circular_f64`]'s (double-double reduction and kernels).
    fn circular(&self, which: Circular, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        if d == DType::F64 {
            return self.circular_f64(which, x);
        }
        let b = self.builder();
        let ft = self.ctx().f64_type();
        let i64t = self.ctx().i64_type();
        let c = |v: f64| ft.const_float(v);
        let x32 = if x.get_type() == self.ctx().f32_type() {
            x
        } else {
            b.build_float_cast(x, self.ctx().f32_type(), "x32")
                .map_err(llvm)?
        };
        let wide = b.build_float_ext(x32, ft, "x").map_err(llvm)?;
        let ax = self.fabs(wide)?;
        // Below π/4: k = 0, r = |x|.
        let small = self.fcmp(FloatPredicate::OLT, ax, c(std::f64::consts::FRAC_PI_4))?;
        // Below 2^20: k = rint(|x| 2/π), r = |x| - k π/2 with π/2 in 33-bit parts (k times
        // each is exact).
        let kf = self
            .intrinsic(
                "llvm.rint",
                ft.into(),
                &[b.build_float_mul(ax, c(std::f64::consts::FRAC_2_PI), "q")
                    .map_err(llvm)?
                    .into()],
            )?
            .into_float_value();
        let mut r_mid = ax;
        for part in [
            0x3FF9_21FB_5440_0000u64,
            0x3DD0_B461_1A60_0000,
            0x3BA3_198A_2E00_0000,
            0x397B_839A_2520_49C1,
        ] {
            let t = b
                .build_float_mul(kf, c(f64::from_bits(part)), "kp")
                .map_err(llvm)?;
            r_mid = b.build_float_sub(r_mid, t, "r").map_err(llvm)?;
        }
        let k_mid = b.build_float_to_signed_int(kf, i64t, "k").map_err(llvm)?;
        let mid = self.fcmp(FloatPredicate::OLT, ax, c(1_048_576.0))?;
        let bits = b
            .build_bit_cast(x32, self.ctx().i32_type(), "b")
            .map_err(llvm)?
            .into_int_value();
        let (k_large, r_large) = self.reduce_large(bits)?;
        let k = b
            .build_select(mid, k_mid, k_large, "k")
            .map_err(llvm)?
            .into_int_value();
        let r = self.select_float(mid, r_mid, r_large)?;
        let k = b
            .build_select(small, i64t.const_zero(), k, "k")
            .map_err(llvm)?
            .into_int_value();
        let r = self.select_float(small, ax, r)?;
        // sin r and cos r.
        let r2 = b.build_float_mul(r, r, "r2").map_err(llvm)?;
        let mut fact = 1.0f64;
        let (mut sin_c, mut cos_c) = (Vec::new(), Vec::new());
        for n in 0..18u32 {
            if n > 0 {
                fact *= n as f64;
            }
            let term = if (n / 2) % 2 == 0 {
                1.0 / fact
            } else {
                -1.0 / fact
            };
            if n % 2 == 0 {
                cos_c.push(term);
            } else {
                sin_c.push(term);
            }
        }
        let sr = b
            .build_float_mul(r, self.horner(r2, &sin_c)?, "s")
            .map_err(llvm)?;
        let cr = self.horner(r2, &cos_c)?;
        let q = b
            .build_and(k, i64t.const_int(3, false), "q")
            .map_err(llvm)?;
        let is = |v: u64| {
            b.build_int_compare(inkwell::IntPredicate::EQ, q, i64t.const_int(v, false), "is")
                .map_err(llvm)
        };
        let neg = |v: FloatValue<'c>| b.build_float_neg(v, "n").map_err(llvm);
        let odd = b
            .build_int_compare(
                inkwell::IntPredicate::NE,
                b.build_and(q, i64t.const_int(1, false), "o")
                    .map_err(llvm)?,
                i64t.const_zero(),
                "odd",
            )
            .map_err(llvm)?;
        let pick = |v0: FloatValue<'c>, v1, v2, v3| -> Result<FloatValue<'c>> {
            let a = self.select_float(is(1)?, v1, v0)?;
            let a = self.select_float(is(2)?, v2, a)?;
            self.select_float(is(3)?, v3, a)
        };
        let (value, odd_fn) = match which {
            Circular::Sin => (pick(sr, cr, neg(sr)?, neg(cr)?)?, true),
            Circular::Cos => (pick(cr, neg(sr)?, neg(cr)?, sr)?, false),
            Circular::Tan => {
                let even = b.build_float_div(sr, cr, "t").map_err(llvm)?;
                let odd_t = neg(b.build_float_div(cr, sr, "t").map_err(llvm)?)?;
                (self.select_float(odd, odd_t, even)?, true)
            }
        };
        let value = if odd_fn {
            let negative = self.fcmp(FloatPredicate::OLT, wide, c(0.0))?;
            let negative_zero = b
                .build_int_compare(
                    inkwell::IntPredicate::SLT,
                    bits,
                    self.ctx().i32_type().const_zero(),
                    "nz",
                )
                .map_err(llvm)?;
            let flip = b.build_or(negative, negative_zero, "flip").map_err(llvm)?;
            self.select_float(flip, neg(value)?, value)?
        } else {
            value
        };
        let finite = self.fcmp(FloatPredicate::OLT, ax, c(f64::INFINITY))?;
        let value = self.select_float(finite, value, c(f64::NAN))?;
        b.build_float_trunc(value, self.ftype(d), "r").map_err(llvm)
    }

    /// Payne and Hanek's reduction of an f32 |x| >= 2^20 (its bits `bits`) by π/2: x = m 2^s
    /// (m of 24 bits) times 2/π is, modulo 4, m times the 96 bits of 2/π from bit s - 2 on
    /// (earlier bits give multiples of 8, later ones less than 2^-69), an integer product whose
    /// bits above 2^93 are k and the rest r / (π/2), rounded to the nearest k. Returns (k, r)
    /// with r in [-π/4, π/4].
    fn reduce_large(&self, bits: IntValue<'c>) -> Result<(IntValue<'c>, FloatValue<'c>)> {
        let b = self.builder();
        let ctx = self.ctx();
        let (i64t, i128t) = (ctx.i64_type(), ctx.i128_type());
        let c64 = |v: u64| i64t.const_int(v, false);
        let bits = b.build_int_z_extend(bits, i64t, "b").map_err(llvm)?;
        let e = b
            .build_right_shift(bits, c64(23), false, "e")
            .map_err(llvm)?;
        let e = b.build_and(e, c64(0xff), "e").map_err(llvm)?;
        let m = b.build_and(bits, c64(0x7f_ffff), "m").map_err(llvm)?;
        let m = b.build_or(m, c64(0x80_0000), "m").map_err(llvm)?;
        // The window starts at bit i0 = s - 2 = e - 152 of 2/π, at position i0 + 63 of the
        // words below (64 zero bits, then 2/π's), clamped for the |x| this does not serve.
        let pos = b.build_int_sub(e, c64(152 - 63), "pos").map_err(llvm)?;
        let pos = b
            .build_select(
                b.build_int_compare(inkwell::IntPredicate::UGT, pos, c64(165), "hi")
                    .map_err(llvm)?,
                c64(165),
                pos,
                "pos",
            )
            .map_err(llvm)?
            .into_int_value();
        let w = b.build_right_shift(pos, c64(6), false, "w").map_err(llvm)?;
        let o = b.build_and(pos, c64(63), "o").map_err(llvm)?;
        let word = |i: u64| -> Result<IntValue<'c>> {
            // Word w + i of the table, by selects on w (0, 1 or 2).
            let pick = |j: u64| c64(TWO_OVER_PI[(j + i) as usize]);
            let is = |j: u64| {
                b.build_int_compare(inkwell::IntPredicate::EQ, w, c64(j), "w")
                    .map_err(llvm)
            };
            let v = b
                .build_select(is(1)?, pick(1), pick(0), "t")
                .map_err(llvm)?;
            Ok(b.build_select(is(2)?, pick(2), v.into_int_value(), "t")
                .map_err(llvm)?
                .into_int_value())
        };
        let (wa, wb, wc) = (word(0)?, word(1)?, word(2)?);
        let join = |hi: IntValue<'c>, lo: IntValue<'c>| self.funnel_left(hi, lo, o);
        let top = join(wa, wb)?;
        let next = join(wb, wc)?;
        let next32 = b
            .build_right_shift(next, c64(32), false, "n32")
            .map_err(llvm)?;
        let c128 = |v: u128| i128t.const_int_arbitrary_precision(&[v as u64, (v >> 64) as u64]);
        let window = b
            .build_or(
                b.build_left_shift(
                    b.build_int_z_extend(top, i128t, "t").map_err(llvm)?,
                    c128(32),
                    "t",
                )
                .map_err(llvm)?,
                b.build_int_z_extend(next32, i128t, "n").map_err(llvm)?,
                "win",
            )
            .map_err(llvm)?;
        let p = b
            .build_int_mul(
                b.build_int_z_extend(m, i128t, "m").map_err(llvm)?,
                window,
                "p",
            )
            .map_err(llvm)?;
        let k = b.build_right_shift(p, c128(93), false, "k").map_err(llvm)?;
        let k = b.build_int_truncate(k, i64t, "k").map_err(llvm)?;
        let frac = b.build_and(p, c128((1 << 93) - 1), "f").map_err(llvm)?;
        // To the nearest k: a fraction of a half or more counts from the next k, negative.
        let up = b
            .build_int_compare(inkwell::IntPredicate::UGE, frac, c128(1 << 92), "up")
            .map_err(llvm)?;
        let k = b
            .build_select(up, b.build_int_add(k, c64(1), "k1").map_err(llvm)?, k, "k")
            .map_err(llvm)?
            .into_int_value();
        let below = b.build_int_sub(c128(1 << 93), frac, "nf").map_err(llvm)?;
        let mag = b
            .build_select(up, below, frac, "mag")
            .map_err(llvm)?
            .into_int_value();
        let hi = b
            .build_int_truncate(
                b.build_right_shift(mag, c128(64), false, "hi")
                    .map_err(llvm)?,
                i64t,
                "hi",
            )
            .map_err(llvm)?;
        let lo = b.build_int_truncate(mag, i64t, "lo").map_err(llvm)?;
        let ft = ctx.f64_type();
        let hf = b.build_unsigned_int_to_float(hi, ft, "hf").map_err(llvm)?;
        let lf = b.build_unsigned_int_to_float(lo, ft, "lf").map_err(llvm)?;
        let f = b
            .build_float_add(
                b.build_float_mul(hf, ft.const_float(2f64.powi(64)), "hs")
                    .map_err(llvm)?,
                lf,
                "f",
            )
            .map_err(llvm)?;
        let r = b
            .build_float_mul(
                f,
                ft.const_float(2f64.powi(-93) * std::f64::consts::FRAC_PI_2),
                "r",
            )
            .map_err(llvm)?;
        let r = self.select_float(up, b.build_float_neg(r, "nr").map_err(llvm)?, r)?;
        Ok((k, r))
    }
}

impl<'c, T: Base<'c> + ?Sized> Trig<'c> for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::OptimizationLevel;
    use inkwell::context::Context;
    use inkwell::targets::{InitializationConfig, Target};

    use crate::common::host::Host;

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

    #[test]
    fn circular_functions_are_accurate_on_the_host() {
        Target::initialize_native(&InitializationConfig::default()).unwrap();
        let ctx = Context::create();
        let m = ctx.create_module("circular");
        let ft = ctx.f32_type();
        for (name, which) in [
            ("sin", Circular::Sin),
            ("cos", Circular::Cos),
            ("tan", Circular::Tan),
        ] {
            let f = m.add_function(name, ft.fn_type(&[ft.into()], false), None);
            let b = ctx.create_builder();
            b.position_at_end(ctx.append_basic_block(f, "entry"));
            let h = Host {
                ctx: &ctx,
                m: &m,
                b,
            };
            let x = f.get_nth_param(0).unwrap().into_float_value();
            let r = h.circular(which, DType::F32, x).unwrap();
            h.b.build_return(Some(&r)).unwrap();
        }
        m.verify().unwrap();
        let ee = m
            .create_jit_execution_engine(OptimizationLevel::None)
            .unwrap();
        let mut xs: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            1e-45,
            1e-30,
            0.785,
            0.786,
            1_048_575.9,
            1_048_576.0,
            1_048_577.0,
            3e38,
            -3e38,
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        // The f32 values nearest multiples of π/2, small and large.
        for k in (1..2000).chain((1..60).map(|e| 1u64 << e)) {
            let x = (k as f64 * std::f64::consts::FRAC_PI_2) as f32;
            xs.extend([x, -x, f32::from_bits(x.to_bits() + 1)]);
        }
        let mut s = 0x1234_5678_9abc_def1u64;
        for i in 0..40000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            xs.push(if i % 2 == 0 {
                f32::from_bits((s >> 32) as u32)
            } else {
                ((s >> 40) as f32 / (1u32 << 24) as f32 - 0.5) * 40.0
            });
        }
        type F = unsafe extern "C" fn(f32) -> f32;
        type Reference = fn(f64) -> f64;
        let reference: [(&str, Reference); 3] =
            [("sin", f64::sin), ("cos", f64::cos), ("tan", f64::tan)];
        for (name, want) in reference {
            let f = unsafe { ee.get_function::<F>(name) }.unwrap();
            let mut worst = 0;
            for &x in &xs {
                let got = unsafe { f.call(x) };
                let w = want(x as f64) as f32;
                let u = ulps32(got, w);
                assert!(u <= 1, "{name}({x:e}) = {got:e}, not {w:e} ({u} ulps)");
                worst = worst.max(u);
            }
            println!("{name}: at most {worst} ulps in f32");
        }
    }
}

//! `sine`, `cosine` and `tan` on f64 as target-independent LLVM IR, for targets without a C
//! math library (the GPU). |x| is reduced by π/2 to a quadrant k and a remainder r in
//! [-π/4, π/4] carried as a double-double (about 100 good bits however close x lies to a
//! multiple of π/2):
//!
//! - below 2^20, Cody and Waite's way: k = rint(|x| 2/π), r = |x| - k π/2 with π/2 in three
//!   33-bit parts and a fourth for the rest (k times each of the first three is exact, and the
//!   differences are summed without rounding by two-sums);
//! - from 2^20 on (a branch of its own), Payne and Hanek's: |x| = m 2^E (m of 53 bits) times
//!   2/π is, modulo 4, m times the 192 bits of 2/π from bit E - 1 on (earlier bits give
//!   multiples of 4, later ones less than 2^-137 of a quadrant), an integer product whose bits
//!   from 190 up are k and the 128 below the fraction, rounded to the nearest k, normalized
//!   and turned into two doubles before the multiplication by π/2.
//!
//! sin r and cos r come from their Taylor series (to r^21 and r^20) with r's low part as
//! a first-order correction and cos's 1 - r²/2 summed exactly, as double-doubles; tan is their
//! double-double quotient (-cos/sin in odd quadrants). The quadrant k mod 4 and (for the odd
//! functions) x's sign are put back; infinities and NaN give NaN. Within 1 ulp for sine and
//! cosine and 2 for tan of the correctly rounded value (checked against Rust's by
//! `f64_circular_functions_are_accurate_on_the_host`).

use super::dd::{Dd, DoubleDouble};
use super::math::Math;
use super::scalar::Scalar;
use super::table::Tables;
use super::tables64::{FRAC_PI_2, TWO_OVER_PI_WORDS};
use super::trig::Circular;
use super::{Base, llvm};
use crate::Result;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::DType;

/// π/2 in three parts of 33 bits and the rest rounded (k < 2^20 times any of the first three
/// is exact).
const PIO2_PARTS: [u64; 4] = [
    0x3FF9_21FB_5440_0000,
    0x3DD0_B461_1A60_0000,
    0x3BA3_198A_2E00_0000,
    0x397B_839A_2520_49C1,
];

/// Where the reduction switches to Payne and Hanek's method.
const HUGE: f64 = 1_048_576.0;

/// The f64 circular functions, on any [`Base`].
pub(crate) trait Circular64<'c>: Base<'c> {
    /// sin, cos or tan of an f64 `x`.
    fn circular_f64(&self, which: Circular, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ctx = self.ctx();
        let ft = ctx.f64_type();
        let i64t = ctx.i64_type();
        let c = |v: f64| ft.const_float(v);
        let ax = self.fabs(x)?;
        let mid = self.fcmp(FloatPredicate::OLT, ax, c(HUGE))?;
        let (k_mid, r_mid) = self.reduce_medium(ax, mid)?;
        // Large |x|, infinities and NaN: Payne and Hanek's reduction, on a branch of its own.
        let here = b.get_insert_block().expect("positioned");
        let func = here.get_parent().expect("in a function");
        let huge = ctx.append_basic_block(func, "circ.huge");
        let join = ctx.append_basic_block(func, "circ.join");
        b.build_conditional_branch(mid, join, huge).map_err(llvm)?;
        b.position_at_end(huge);
        let (k_huge, r_huge) = self.reduce_huge(ax)?;
        let huge_end = b.get_insert_block().expect("positioned");
        b.build_unconditional_branch(join).map_err(llvm)?;
        b.position_at_end(join);
        let k = b.build_phi(i64t, "k").map_err(llvm)?;
        k.add_incoming(&[(&k_mid, here), (&k_huge, huge_end)]);
        let rh = b.build_phi(ft, "rh").map_err(llvm)?;
        rh.add_incoming(&[(&r_mid.0, here), (&r_huge.0, huge_end)]);
        let rl = b.build_phi(ft, "rl").map_err(llvm)?;
        rl.add_incoming(&[(&r_mid.1, here), (&r_huge.1, huge_end)]);
        let k = k.as_basic_value().into_int_value();
        let r = (
            rh.as_basic_value().into_float_value(),
            rl.as_basic_value().into_float_value(),
        );
        let (s, co) = self.sin_cos_dd(r)?;
        let q = b
            .build_and(k, i64t.const_int(3, false), "q")
            .map_err(llvm)?;
        let is = |v: u64| {
            b.build_int_compare(IntPredicate::EQ, q, i64t.const_int(v, false), "is")
                .map_err(llvm)
        };
        let neg = |v: FloatValue<'c>| b.build_float_neg(v, "n").map_err(llvm);
        let pick = |v0: FloatValue<'c>, v1, v2, v3| -> Result<FloatValue<'c>> {
            let a = self.select_float(is(1)?, v1, v0)?;
            let a = self.select_float(is(2)?, v2, a)?;
            self.select_float(is(3)?, v3, a)
        };
        let (value, odd_fn) = match which {
            Circular::Sin => (pick(s.0, co.0, neg(s.0)?, neg(co.0)?)?, true),
            Circular::Cos => (pick(co.0, neg(s.0)?, neg(co.0)?, s.0)?, false),
            Circular::Tan => {
                let odd = b
                    .build_int_compare(
                        IntPredicate::NE,
                        b.build_and(q, i64t.const_int(1, false), "o")
                            .map_err(llvm)?,
                        i64t.const_zero(),
                        "odd",
                    )
                    .map_err(llvm)?;
                // Even quadrants sin/cos, odd ones -cos/sin.
                let sel = |a: FloatValue<'c>, e: FloatValue<'c>| self.select_float(odd, a, e);
                let num = (sel(neg(co.0)?, s.0)?, sel(neg(co.1)?, s.1)?);
                let den = (sel(s.0, co.0)?, sel(s.1, co.1)?);
                (self.dd_div(num, den)?.0, true)
            }
        };
        let value = if odd_fn {
            let negative = self.sign_set(x)?;
            self.select_float(negative, neg(value)?, value)?
        } else {
            value
        };
        let finite = self.fcmp(FloatPredicate::OLT, ax, c(f64::INFINITY))?;
        self.select_float(finite, value, c(f64::NAN))
    }

    /// Cody and Waite's reduction of |x| below 2^20 (`mid`; elsewhere k is 0 and r garbage):
    /// (k, r) with r in [-π/4, π/4] as a double-double (|x| itself below π/4).
    fn reduce_medium(
        &self,
        ax: FloatValue<'c>,
        mid: IntValue<'c>,
    ) -> Result<(IntValue<'c>, Dd<'c>)> {
        let b = self.builder();
        let ft = ax.get_type();
        let c = |v: f64| ft.const_float(v);
        let q = b
            .build_float_mul(ax, c(std::f64::consts::FRAC_2_PI), "q")
            .map_err(llvm)?;
        let kf = self
            .intrinsic("llvm.rint", ft.into(), &[q.into()])?
            .into_float_value();
        // 0 outside the range, so the conversion below is defined.
        let kf = self.select_float(mid, kf, c(0.0))?;
        let nk = b.build_float_neg(kf, "nk").map_err(llvm)?;
        let part = |i: usize| c(f64::from_bits(PIO2_PARTS[i]));
        // |x| - k p1 is exact: k p1 is, and lies within a factor 2 of |x| (Sterbenz).
        let a = self.fma(nk, part(0), ax)?;
        let p2 = b.build_float_mul(nk, part(1), "p2").map_err(llvm)?;
        let (s, e1) = self.two_sum(a, p2)?;
        let p3 = b.build_float_mul(nk, part(2), "p3").map_err(llvm)?;
        let (s, e2) = self.two_sum(s, p3)?;
        let e = b.build_float_add(e1, e2, "e").map_err(llvm)?;
        let lo = self.fma(nk, part(3), e)?;
        let r = self.fast_two_sum(s, lo)?;
        let k = b
            .build_float_to_signed_int(kf, self.ctx().i64_type(), "k")
            .map_err(llvm)?;
        Ok((k, r))
    }

    /// Payne and Hanek's reduction of |x| >= 2^20 (garbage for infinities and NaN, which the
    /// caller replaces): (k mod 4, r) with r in [-π/4, π/4] as a double-double.
    fn reduce_huge(&self, ax: FloatValue<'c>) -> Result<(IntValue<'c>, Dd<'c>)> {
        let b = self.builder();
        let ctx = self.ctx();
        let (i64t, i128t) = (ctx.i64_type(), ctx.i128_type());
        let ft = ctx.f64_type();
        let c64 = |v: u64| i64t.const_int(v, false);
        let c128 = |v: u128| i128t.const_int_arbitrary_precision(&[v as u64, (v >> 64) as u64]);
        let bits = b
            .build_bit_cast(ax, i64t, "b")
            .map_err(llvm)?
            .into_int_value();
        let e = b
            .build_right_shift(bits, c64(52), false, "e")
            .map_err(llvm)?;
        let m = b.build_and(bits, c64((1 << 52) - 1), "m").map_err(llvm)?;
        let m = b.build_or(m, c64(1 << 52), "m").map_err(llvm)?;
        // |x| = m 2^E with E = e - 1075; the window starts at bit E - 1 of 2/π, at position
        // E + 62 = e - 1013 of the table (at least 30 here, at most 1034: words w to w + 3
        // stay inside its 21).
        let pos = b.build_int_sub(e, c64(1013), "pos").map_err(llvm)?;
        let w = b.build_right_shift(pos, c64(6), false, "w").map_err(llvm)?;
        let o = b.build_and(pos, c64(63), "o").map_err(llvm)?;
        let word = |i: u64| -> Result<IntValue<'c>> {
            let at = b.build_int_add(w, c64(i), "wi").map_err(llvm)?;
            self.table_u64("kiln_two_over_pi", &TWO_OVER_PI_WORDS, at)
        };
        let t = [word(0)?, word(1)?, word(2)?, word(3)?];
        let join = |hi: IntValue<'c>, lo: IntValue<'c>| self.funnel_left(hi, lo, o);
        let win = [join(t[0], t[1])?, join(t[1], t[2])?, join(t[2], t[3])?];
        // R = m times the 192-bit window, in 64-bit limbs: t0 2^128 + lo1 2^64 + lo0.
        let wide = |v: IntValue<'c>| b.build_int_z_extend(v, i128t, "x").map_err(llvm);
        let m128 = wide(m)?;
        let mul = |v: IntValue<'c>| -> Result<IntValue<'c>> {
            b.build_int_mul(m128, wide(v)?, "p").map_err(llvm)
        };
        let high = |v: IntValue<'c>| b.build_right_shift(v, c128(64), false, "hi").map_err(llvm);
        let low = |v: IntValue<'c>| b.build_int_truncate(v, i64t, "lo").map_err(llvm);
        let p2 = mul(win[2])?;
        let t1 = b
            .build_int_add(mul(win[1])?, high(p2)?, "t1")
            .map_err(llvm)?;
        let t0 = b
            .build_int_add(mul(win[0])?, high(t1)?, "t0")
            .map_err(llvm)?;
        let (lo1, lo0) = (low(t1)?, low(p2)?);
        // k mod 4: bits 190 and 191 of R; the fraction's top 128 bits: R's bits 62 to 189.
        let kq = b
            .build_and(
                low(b
                    .build_right_shift(t0, c128(62), false, "kq")
                    .map_err(llvm)?)?,
                c64(3),
                "kq",
            )
            .map_err(llvm)?;
        let a = b.build_left_shift(t0, c128(66), "a").map_err(llvm)?;
        let a = b
            .build_or(
                a,
                b.build_left_shift(wide(lo1)?, c128(2), "a1")
                    .map_err(llvm)?,
                "a",
            )
            .map_err(llvm)?;
        let a = b
            .build_or(
                a,
                wide(
                    b.build_right_shift(lo0, c64(62), false, "a0")
                        .map_err(llvm)?,
                )?,
                "a",
            )
            .map_err(llvm)?;
        // To the nearest k: a fraction of a half or more counts from the next k, negative.
        let up = b
            .build_int_compare(IntPredicate::UGE, a, c128(1 << 127), "up")
            .map_err(llvm)?;
        let k = b
            .build_int_add(kq, b.build_int_z_extend(up, i64t, "u").map_err(llvm)?, "k")
            .map_err(llvm)?;
        let mag = b
            .build_select(up, b.build_int_neg(a, "na").map_err(llvm)?, a, "mag")
            .map_err(llvm)?
            .into_int_value();
        // Normalized (the fraction is never below 2^-70 for a double, but 0 must not shift
        // by 128), its top 106 bits as two doubles: f = hi 2^(-53-lz) + next 2^(-106-lz).
        let lz = self
            .intrinsic(
                "llvm.ctlz",
                i128t.into(),
                &[mag.into(), ctx.bool_type().const_zero().into()],
            )?
            .into_int_value();
        let lz = b
            .build_select(
                b.build_int_compare(IntPredicate::UGT, lz, c128(127), "big")
                    .map_err(llvm)?,
                c128(127),
                lz,
                "lz",
            )
            .map_err(llvm)?
            .into_int_value();
        let n = b.build_left_shift(mag, lz, "n").map_err(llvm)?;
        let top = low(b
            .build_right_shift(n, c128(75), false, "top")
            .map_err(llvm)?)?;
        let next = low(b
            .build_right_shift(n, c128(22), false, "nx")
            .map_err(llvm)?)?;
        let next = b.build_and(next, c64((1 << 53) - 1), "nx").map_err(llvm)?;
        let lz = low(lz)?;
        let f = self.format(DType::F64);
        let scale = |v: IntValue<'c>, shift: u64| -> Result<FloatValue<'c>> {
            let e = b
                .build_int_sub(i64t.const_int((-(shift as i64)) as u64, true), lz, "se")
                .map_err(llvm)?;
            let v = b.build_unsigned_int_to_float(v, ft, "v").map_err(llvm)?;
            b.build_float_mul(v, self.pow2(&f, e)?, "sv").map_err(llvm)
        };
        let (fh, fl) = (scale(top, 53)?, scale(next, 106)?);
        // r = f π/2.
        let (ph, pe) = self.two_prod(fh, ft.const_float(FRAC_PI_2.0))?;
        let pl = self.fma(fh, ft.const_float(FRAC_PI_2.1), pe)?;
        let pl = self.fma(fl, ft.const_float(FRAC_PI_2.0), pl)?;
        let (rh, rl) = self.fast_two_sum(ph, pl)?;
        let neg = |v: FloatValue<'c>| b.build_float_neg(v, "n").map_err(llvm);
        let rh = self.select_float(up, neg(rh)?, rh)?;
        let rl = self.select_float(up, neg(rl)?, rl)?;
        Ok((k, (rh, rl)))
    }

    /// (sin r, cos r) as double-doubles for r = rh + rl in [-π/4, π/4].
    fn sin_cos_dd(&self, r: Dd<'c>) -> Result<(Dd<'c>, Dd<'c>)> {
        let b = self.builder();
        let ft = r.0.get_type();
        let c = |v: f64| ft.const_float(v);
        let (rh, rl) = r;
        let mut fact = 1.0f64;
        let (mut sin_c, mut cos_c) = (Vec::new(), Vec::new());
        for n in 1..=21u32 {
            fact *= n as f64;
            let term = if (n / 2) % 2 == 0 {
                1.0 / fact
            } else {
                -1.0 / fact
            };
            if n % 2 == 1 && n >= 3 {
                sin_c.push(term);
            } else if n % 2 == 0 && n >= 4 {
                cos_c.push(term);
            }
        }
        // z = r² exactly, as z + zl.
        let (z, zl) = self.two_prod(rh, rh)?;
        // sin r = rh + rh z S(z) + rl (1 - z/2).
        let rz = b.build_float_mul(rh, z, "rz").map_err(llvm)?;
        let cos_first = self.fma(z, c(-0.5), c(1.0))?;
        let corr = b.build_float_mul(rl, cos_first, "sc").map_err(llvm)?;
        let tail = self.fma(rz, self.horner(z, &sin_c)?, corr)?;
        let s = self.fast_two_sum(rh, tail)?;
        // cos r = (1 - z/2) + z² C(z) - rh rl, 1 - z/2 with its rounding error recovered.
        let hz = b.build_float_mul(z, c(0.5), "hz").map_err(llvm)?;
        let w = b.build_float_sub(c(1.0), hz, "w").map_err(llvm)?;
        let err = b
            .build_float_sub(b.build_float_sub(c(1.0), w, "1w").map_err(llvm)?, hz, "err")
            .map_err(llvm)?;
        let err = self.fma(zl, c(-0.5), err)?;
        let z2 = b.build_float_mul(z, z, "z2").map_err(llvm)?;
        let nrl = b.build_float_neg(rl, "nrl").map_err(llvm)?;
        let tail = self.fma(rh, nrl, err)?;
        let tail = self.fma(z2, self.horner(z, &cos_c)?, tail)?;
        let co = self.fast_two_sum(w, tail)?;
        Ok((s, co))
    }
}

impl<'c, T: Base<'c> + ?Sized> Circular64<'c> for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::host::{Rng, define, ulps64};
    use inkwell::OptimizationLevel;
    use inkwell::context::Context;
    use inkwell::targets::{InitializationConfig, Target};

    /// Arguments across the range: special values, the doubles nearest multiples of π/2 (and
    /// their neighbours), powers of two, the double closest to a multiple of π/2, random bit
    /// patterns and random moderate values.
    fn arguments() -> Vec<f64> {
        let mut xs = vec![
            0.0,
            -0.0,
            5e-324,
            -5e-324,
            2.2e-308,
            1e-300,
            1e-20,
            1e-8,
            0.5,
            1.0,
            -1.0,
            2.0,
            3.0,
            100.0,
            std::f64::consts::FRAC_PI_4,
            std::f64::consts::FRAC_PI_4.next_up(),
            std::f64::consts::FRAC_PI_4.next_down(),
            HUGE,
            HUGE.next_up(),
            HUGE.next_down(),
            1e22,
            1e300,
            f64::MAX,
            -f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for k in (1..5000u64).chain((1..100).map(|e| 1u64 << (e % 64))) {
            let x = k as f64 * std::f64::consts::FRAC_PI_2;
            xs.extend([x, -x, x.next_up(), x.next_down()]);
        }
        for e in -1074..=1023 {
            xs.push(2f64.powi(e));
        }
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for i in 0..60000 {
            xs.push(match i % 3 {
                0 => rng.bits(),
                1 => (rng.unit() - 0.5) * 80.0,
                _ => (rng.unit() - 0.5) * 2f64.powi((rng.next() % 60) as i32),
            });
        }
        xs
    }

    #[test]
    fn f64_circular_functions_are_accurate_on_the_host() {
        Target::initialize_native(&InitializationConfig::default()).unwrap();
        let ctx = Context::create();
        let m = ctx.create_module("circular64");
        for (name, which) in [
            ("sin", Circular::Sin),
            ("cos", Circular::Cos),
            ("tan", Circular::Tan),
        ] {
            define(&ctx, &m, &format!("kiln_{name}"), 1, |h, a| {
                h.circular_f64(which, a[0])
            });
        }
        m.verify().unwrap();
        let ee = m
            .create_jit_execution_engine(OptimizationLevel::None)
            .unwrap();
        let xs = arguments();
        type F = unsafe extern "C" fn(f64) -> f64;
        type Reference = fn(f64) -> f64;
        let reference: [(&str, Reference, u64); 3] = [
            ("sin", f64::sin, 1),
            ("cos", f64::cos, 1),
            ("tan", f64::tan, 2),
        ];
        for (name, want, bound) in reference {
            let f = unsafe { ee.get_function::<F>(&format!("kiln_{name}")) }.unwrap();
            let mut worst = 0;
            for &x in &xs {
                let got = unsafe { f.call(x) };
                let w = want(x);
                let u = ulps64(got, w);
                assert!(u <= bound, "{name}({x:e}) = {got:e}, not {w:e} ({u} ulps)");
                worst = worst.max(u);
            }
            println!(
                "{name}: at most {worst} ulps in f64 over {} arguments",
                xs.len()
            );
        }
        // The double nearest a multiple of π/2 relative to its size (r ≈ 2^-61), where the C
        // library's cosine is 8 ulps off: the values to 30 digits (Muller's, "Elementary
        // Functions", and `scripts/f64_tables.py`'s π).
        let x = 6381956970095103.0 * 2f64.powi(797);
        for (name, want) in [
            ("sin", "1.0"),
            ("cos", "-4.68716592425462761112258280196e-19"),
            ("tan", "-2133485385753703843.67485266334"),
        ] {
            let want: f64 = want.parse().unwrap();
            let f = unsafe { ee.get_function::<F>(&format!("kiln_{name}")) }.unwrap();
            for (x, want) in [(x, want), (-x, if name == "cos" { want } else { -want })] {
                let got = unsafe { f.call(x) };
                assert_eq!(got, want, "{name}({x:e})");
            }
        }
    }
}

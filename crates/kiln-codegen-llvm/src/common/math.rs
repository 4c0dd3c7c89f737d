//! exp, log, tanh, logistic and erf as straight-line LLVM IR for f32 (also used by f16 and
//! bf16, which compute in f32) and f64: no library calls, so loops over them vectorize. The
//! error bounds are checked against the reference interpreter (which rounds a correctly
//! computed f64 or higher result once) by `vectorized_transcendentals_are_accurate`.

use super::scalar::Scalar;
use super::{Base, llvm};
use crate::Result;
use inkwell::types::{FloatType, IntType};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_ir::DType;

/// One binary float format: its types and the constants the functions below depend on.
pub(crate) struct Format<'c> {
    pub(crate) ft: FloatType<'c>,
    /// The integer type of the same width.
    pub(crate) it: IntType<'c>,
    /// Mantissa bits.
    pub(crate) mant: u64,
    /// Exponent bias.
    pub(crate) bias: u64,
    /// The smallest normal value, and the power of two that scales subnormals above it.
    pub(crate) min_normal: f64,
    pub(crate) tiny_shift: u64,
    /// ln 2 = ln2_hi + ln2_lo, ln2_hi with enough trailing zeros that n * ln2_hi is exact.
    pub(crate) ln2_hi: f64,
    pub(crate) ln2_lo: f64,
    /// Whether this is f64 (longer polynomials).
    pub(crate) double: bool,
}

impl Format<'_> {
    /// exp's clamp `(top, bottom)`. Past `top` (where e^x is beyond the largest finite value),
    /// n is the largest exponent plus one and e^r >= 1, so scaling overflows to inf. `bottom`
    /// lies just below where e^x is half the smallest subnormal: n is the exponent of that
    /// half, e^r < 1, and p 2^n rounds to 0.
    fn exp_range(&self) -> (f64, f64) {
        if self.double {
            (710.0, -745.14)
        } else {
            (89.0, -103.98)
        }
    }
}

/// e^r on |r| <= ln 2 / 2 in f32: degree 6, fitted offline for relative error (at most 2e-9
/// before rounding, 0.9 ulp evaluated in f32 with fused multiply-adds); one multiply-add fewer
/// than the degree-7 Taylor polynomial it replaced.
const EXP_F32: [f64; 7] = [
    1.0,
    1.0000000321669242,
    0.49999994208701115,
    0.16666431255563277,
    0.041668002080552664,
    0.008374155833485207,
    0.0013843652700743295,
];

/// f64 coefficient tables (lowest degree first), fitted offline at 50 digits.
mod tables {
    include!("math_tables.rs");
}
use tables::*;

/// The functions, on any [`Base`].
pub(crate) trait Math<'c>: Base<'c> {
    fn format(&self, d: DType) -> Format<'c> {
        if d == DType::F64 {
            Format {
                ft: self.ctx().f64_type(),
                it: self.ctx().i64_type(),
                mant: 52,
                bias: 1023,
                min_normal: f64::MIN_POSITIVE,
                tiny_shift: 54,
                ln2_hi: 6.931_471_803_691_238e-1,
                ln2_lo: 1.908_214_929_270_587_7e-10,
                double: true,
            }
        } else {
            Format {
                ft: self.ctx().f32_type(),
                it: self.ctx().i32_type(),
                mant: 23,
                bias: 127,
                min_normal: 1.1754943508222875e-38,
                tiny_shift: 24,
                ln2_hi: 0.693359375,
                ln2_lo: -2.1219444005469057e-4,
                double: false,
            }
        }
    }

    /// `a * m + add`, fused where the target allows.
    fn fmuladd(
        &self,
        a: FloatValue<'c>,
        m: FloatValue<'c>,
        add: FloatValue<'c>,
    ) -> Result<FloatValue<'c>> {
        Ok(self
            .intrinsic(
                "llvm.fmuladd",
                a.get_type().into(),
                &[a.into(), m.into(), add.into()],
            )?
            .into_float_value())
    }

    /// The polynomial with coefficients `coefs` (lowest degree first) at `t`, by Horner's rule.
    fn horner(&self, t: FloatValue<'c>, coefs: &[f64]) -> Result<FloatValue<'c>> {
        let ft = t.get_type();
        let mut p = ft.const_float(coefs[coefs.len() - 1]);
        for &k in coefs.iter().rev().skip(1) {
            p = self.fmuladd(p, t, ft.const_float(k))?;
        }
        Ok(p)
    }

    fn fcmp(
        &self,
        p: FloatPredicate,
        x: FloatValue<'c>,
        y: FloatValue<'c>,
    ) -> Result<IntValue<'c>> {
        self.builder()
            .build_float_compare(p, x, y, "c")
            .map_err(llvm)
    }

    fn fabs(&self, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        Ok(self
            .intrinsic("llvm.fabs", x.get_type().into(), &[x.into()])?
            .into_float_value())
    }

    /// Whether the sign bit of the f64 `x` is set (-0 and negative NaNs included).
    fn sign_set(&self, x: FloatValue<'c>) -> Result<IntValue<'c>> {
        let b = self.builder();
        let i64t = self.ctx().i64_type();
        let bits = b
            .build_bit_cast(x, i64t, "xb")
            .map_err(llvm)?
            .into_int_value();
        b.build_int_compare(IntPredicate::SLT, bits, i64t.const_zero(), "neg")
            .map_err(llvm)
    }

    /// `v` with the sign of `s`.
    fn copysign(&self, v: FloatValue<'c>, s: FloatValue<'c>) -> Result<FloatValue<'c>> {
        Ok(self
            .intrinsic("llvm.copysign", v.get_type().into(), &[v.into(), s.into()])?
            .into_float_value())
    }

    /// e^x: x = n ln 2 + r with n rounded to nearest (by a shifter constant) and ln 2 split in
    /// two, e^r by a polynomial (degree 6 in f32, the degree-13 Taylor polynomial in f64;
    /// |r| <= ln 2 / 2), then scaled by 2^n (see [`Self::scale`]). Within 2 ulps.
    ///
    /// The clamp keeps NaN (each comparison is false for it, so the select passes `x` on), and
    /// NaN's `r` makes the result NaN whatever its `n` became; the scaling itself overflows to
    /// inf past the top and rounds to 0 past the bottom (see [`Format::exp_range`]).
    fn exp_fast(&self, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        let c = |v: f64| f.ft.const_float(v);
        let (top, bottom) = f.exp_range();
        let hi = self.fcmp(FloatPredicate::OGT, x, c(top))?;
        let lo = self.fcmp(FloatPredicate::OLT, x, c(bottom))?;
        let xc = self.select_float(hi, c(top), self.select_float(lo, c(bottom), x)?)?;
        let (n, p) = self.exp_reduced(&f, xc, 1.0)?;
        self.scale(&f, p, n)
    }

    /// e^x for x <= 0 (NaN gives NaN), as [`Self::exp_fast`] with a one-step scaling: 2^n never
    /// overflows here, so where the target has no `ldexp` instruction, the polynomial's
    /// coefficients are scaled by 2^-64 (exactly: its values stay far above the subnormals) and
    /// p 2^n is that times 2^(n + 64), a normal number: one product, which rounds a subnormal
    /// result once, as the two-step scaling does. Within 2 ulps.
    fn exp_nonpositive(&self, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        let (_, bottom) = f.exp_range();
        let below = self.fcmp(FloatPredicate::OLT, x, f.ft.const_float(bottom))?;
        let xc = self.select_float(below, f.ft.const_float(bottom), x)?;
        self.exp_clamped(d, xc)
    }

    /// e^x by what is known of `x` ([`super::ExpArg`]).
    fn exp_known(&self, arg: super::ExpArg, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        match arg {
            super::ExpArg::Any => self.exp_fast(d, x),
            super::ExpArg::Nonpositive => self.exp_nonpositive(d, x),
            super::ExpArg::Masked => self.exp_masked(d, x),
        }
    }

    /// e^(x - max) of a softmax whose logits may be masked out (`-inf`, a causal mask's):
    /// [`Self::exp_nonpositive`]'s value. Where an underflow costs an assist
    /// ([`super::Base::underflow_assists`]: x86), arguments past the bottom (`-inf - max`)
    /// scale `e^0` instead, and the result there is a selected 0, the value the scaling would
    /// round to. Only where the kernel masks (the select costs unmasked softmaxes about 3%).
    fn exp_masked(&self, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        if !self.underflow_assists() {
            return self.exp_nonpositive(d, x);
        }
        let f = self.format(d);
        let zero = f.ft.const_float(0.0);
        let (_, bottom) = f.exp_range();
        let below = self.fcmp(FloatPredicate::OLT, x, f.ft.const_float(bottom))?;
        let xc = self.select_float(below, zero, x)?;
        let y = self.exp_clamped(d, xc)?;
        self.select_float(below, zero, y)
    }

    /// e^x for x in `[bottom, 0]` (or NaN): [`Self::exp_nonpositive`] past its clamp.
    fn exp_clamped(&self, d: DType, xc: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        if self.scalef() {
            let (n, p) = self.exp_reduced(&f, xc, 1.0)?;
            return self.scale(&f, p, n);
        }
        let (n, p) = self.exp_reduced(&f, xc, 2f64.powi(-64))?;
        let b = self.builder();
        let shifted = b
            .build_int_add(n, f.it.const_int(64, false), "n64")
            .map_err(llvm)?;
        b.build_float_mul(p, self.pow2(&f, shifted)?, "y")
            .map_err(llvm)
    }

    /// p 2^n for an integer `n` in exp's clamped range (or any, with `p` NaN): by `ldexp`
    /// where the target does that in one instruction (which rounds subnormal results once and
    /// overflows to inf by itself); elsewhere in two steps by exponent bits, which reach the
    /// subnormal range (rounding once: the first step is exact) and overflow to inf at the top
    /// of the range (2^n = 2^(max exponent + 1) times p >= 1).
    fn scale(&self, f: &Format<'c>, p: FloatValue<'c>, ni: IntValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        if self.scalef() {
            let i32t = self.ctx().i32_type();
            let ni = if f.double {
                b.build_int_truncate(ni, i32t, "n32").map_err(llvm)?
            } else {
                ni
            };
            let ldexp = inkwell::intrinsics::Intrinsic::find("llvm.ldexp")
                .ok_or_else(|| crate::Error::Llvm("no intrinsic llvm.ldexp".into()))?;
            let decl = ldexp
                .get_declaration(self.module(), &[f.ft.into(), i32t.into()])
                .ok_or_else(|| crate::Error::Llvm("cannot declare llvm.ldexp".into()))?;
            return Ok(b
                .build_call(decl, &[p.into(), ni.into()], "y")
                .map_err(llvm)?
                .try_as_basic_value()
                .basic()
                .ok_or_else(|| crate::Error::Llvm("llvm.ldexp returned nothing".into()))?
                .into_float_value());
        }
        let n1 = b
            .build_right_shift(ni, f.it.const_int(1, false), true, "n1")
            .map_err(llvm)?;
        let n2 = b.build_int_sub(ni, n1, "n2").map_err(llvm)?;
        b.build_float_mul(
            b.build_float_mul(p, self.pow2(f, n1)?, "y1")
                .map_err(llvm)?,
            self.pow2(f, n2)?,
            "y",
        )
        .map_err(llvm)
    }

    /// For `x` in exp's clamped range (or NaN): `(n, s e^r)` with x = n ln 2 + r, n rounded to
    /// nearest (see [`Self::exp_fast`]), `n` as an integer of the format's width, and `s` a
    /// power of two that scales the polynomial's coefficients.
    fn exp_reduced(
        &self,
        f: &Format<'c>,
        x: FloatValue<'c>,
        s: f64,
    ) -> Result<(IntValue<'c>, FloatValue<'c>)> {
        let b = self.builder();
        let c = |v: f64| f.ft.const_float(v);
        // n = x log2(e) rounded to nearest, by adding and subtracting 1.5 2^p (p the mantissa
        // bits): the sum's last place is 1, so it rounds there (|x log2(e)| <= 1076 here), and
        // its bits less the shifter's are n as an integer (no conversion, which would be
        // poison for NaN).
        let shifter = 1.5 * 2f64.powi(f.mant as i32);
        let t = self.fmuladd(x, c(std::f64::consts::LOG2_E), c(shifter))?;
        let n = b.build_float_sub(t, c(shifter), "n").map_err(llvm)?;
        let shifter_bits = if f.double {
            shifter.to_bits()
        } else {
            u64::from((shifter as f32).to_bits())
        };
        let ni = b
            .build_int_sub(
                b.build_bit_cast(t, f.it, "tb")
                    .map_err(llvm)?
                    .into_int_value(),
                f.it.const_int(shifter_bits, false),
                "ni",
            )
            .map_err(llvm)?;
        let r = self.fmuladd(n, c(-f.ln2_hi), x)?;
        let r = self.fmuladd(n, c(-f.ln2_lo), r)?;
        let coefs: Vec<f64> = if f.double {
            let mut taylor = vec![1.0f64];
            for k in 1..=13 {
                taylor.push(taylor[k - 1] / k as f64);
            }
            taylor
        } else {
            EXP_F32.to_vec()
        };
        let scaled: Vec<f64> = coefs.iter().map(|k| k * s).collect();
        Ok((ni, self.horner(r, &scaled)?))
    }

    /// 2^e for an integer `e` in the normal exponent range, from its exponent bits.
    fn pow2(&self, f: &Format<'c>, e: IntValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let biased = b
            .build_int_add(e, f.it.const_int(f.bias, false), "eb")
            .map_err(llvm)?;
        let bits = b
            .build_left_shift(biased, f.it.const_int(f.mant, false), "bits")
            .map_err(llvm)?;
        Ok(b.build_bit_cast(bits, f.ft, "p2")
            .map_err(llvm)?
            .into_float_value())
    }

    /// ln x: subnormals are scaled into the normal range, x = m 2^e with m in
    /// [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with s = (m - 1) / (m + 1) as an odd series (to
    /// s^11 in f32, s^25 in f64), plus e ln 2 in two parts. Zero gives -inf, negatives NaN, +inf
    /// and NaN themselves. Within 2 ulps.
    fn log_fast(&self, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        let b = self.builder();
        let c = |v: f64| f.ft.const_float(v);
        let ci = |v: u64| f.it.const_int(v, false);
        let tiny = self.fcmp(FloatPredicate::OLT, x, c(f.min_normal))?;
        let scaled = b
            .build_float_mul(x, c(2f64.powi(f.tiny_shift as i32)), "xs")
            .map_err(llvm)?;
        let xs = self.select_float(tiny, scaled, x)?;
        let bits = b
            .build_bit_cast(xs, f.it, "bits")
            .map_err(llvm)?
            .into_int_value();
        let exp_mask = (1u64 << (f.it.get_bit_width() as u64 - 1 - f.mant)) - 1;
        let exp_bits = b
            .build_and(
                b.build_right_shift(bits, ci(f.mant), false, "eb")
                    .map_err(llvm)?,
                ci(exp_mask),
                "e8",
            )
            .map_err(llvm)?;
        let mbits = b
            .build_or(
                b.build_and(bits, ci((1u64 << f.mant) - 1), "mb")
                    .map_err(llvm)?,
                ci(f.bias << f.mant),
                "m1",
            )
            .map_err(llvm)?;
        let m = b
            .build_bit_cast(mbits, f.ft, "m")
            .map_err(llvm)?
            .into_float_value();
        // m in [1, 2): fold the top half down so m is in [sqrt(1/2), sqrt(2)).
        let big = self.fcmp(FloatPredicate::OGT, m, c(std::f64::consts::SQRT_2))?;
        let m = self.select_float(big, b.build_float_mul(m, c(0.5), "mh").map_err(llvm)?, m)?;
        let e_i = b.build_int_sub(exp_bits, ci(f.bias), "e").map_err(llvm)?;
        let e_i = b
            .build_int_add(
                e_i,
                b.build_int_z_extend(big, f.it, "bz").map_err(llvm)?,
                "e1",
            )
            .map_err(llvm)?;
        let e_i = b
            .build_int_sub(
                e_i,
                b.build_select(tiny, ci(f.tiny_shift), ci(0), "adj")
                    .map_err(llvm)?
                    .into_int_value(),
                "e2",
            )
            .map_err(llvm)?;
        let e = b.build_signed_int_to_float(e_i, f.ft, "ef").map_err(llvm)?;
        let s = b
            .build_float_div(
                b.build_float_sub(m, c(1.0), "mm").map_err(llvm)?,
                b.build_float_add(m, c(1.0), "mp").map_err(llvm)?,
                "s",
            )
            .map_err(llvm)?;
        let z = b.build_float_mul(s, s, "z").map_err(llvm)?;
        let terms = if f.double { 12 } else { 5 };
        let series: Vec<f64> = (1..=terms).map(|k| 2.0 / (2 * k + 1) as f64).collect();
        let p = self.horner(z, &series)?;
        // ln m = 2 s + s z p.
        let sz = b.build_float_mul(s, z, "sz").map_err(llvm)?;
        let lnm = self.fmuladd(sz, p, b.build_float_add(s, s, "2s").map_err(llvm)?)?;
        let lo = self.fmuladd(e, c(f.ln2_lo), lnm)?;
        let y = self.fmuladd(e, c(f.ln2_hi), lo)?;
        let zero = self.fcmp(FloatPredicate::OEQ, x, c(0.0))?;
        let neg = self.fcmp(FloatPredicate::OLT, x, c(0.0))?;
        let special = self.fcmp(FloatPredicate::UEQ, x, c(f64::INFINITY))?;
        let y = self.select_float(special, b.build_float_add(x, x, "xx").map_err(llvm)?, y)?;
        let y = self.select_float(neg, c(f64::NAN), y)?;
        self.select_float(zero, c(f64::NEG_INFINITY), y)
    }

    /// tanh: x + x^3 P(x^2) for |x| < 0.625 (P fitted for relative error), 1 - 2 / (e^(2|x|) +
    /// 1) with x's sign above. Within 4 ulps.
    fn tanh_fast(&self, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        let b = self.builder();
        let c = |v: f64| f.ft.const_float(v);
        let ax = self.fabs(x)?;
        let z = b.build_float_mul(x, x, "z").map_err(llvm)?;
        let p = if f.double {
            self.horner(
                self.fmuladd(z, c(1.0 / 0.1953125), c(-1.0))?,
                &TANH_SMALL_F64,
            )?
        } else {
            self.horner(
                z,
                &[
                    -0.333332852188943,
                    0.13331512644825047,
                    -0.05374465608119191,
                    0.020653118198681084,
                    -0.00571895512510833,
                ],
            )?
        };
        let x3 = b.build_float_mul(x, z, "x3").map_err(llvm)?;
        let small = self.fmuladd(x3, p, x)?;
        // e^(2|x|) with 2|x| clamped to where tanh has rounded to 1 (|x| = 9.25 in f32, 19.25
        // in f64): 2^n stays normal, so exp's range checks and two-step scaling are not
        // needed. NaN is clamped too; it takes the small branch below, which returns it.
        let y = b.build_float_add(ax, ax, "2x").map_err(llvm)?;
        let top = c(if f.double { 38.5 } else { 18.5 });
        let inside = self.fcmp(FloatPredicate::OLT, y, top)?;
        let (ni, p) = self.exp_reduced(&f, self.select_float(inside, y, top)?, 1.0)?;
        let e = b
            .build_float_mul(p, self.pow2(&f, ni)?, "e")
            .map_err(llvm)?;
        let q = b
            .build_float_div(
                c(2.0),
                b.build_float_add(e, c(1.0), "e1").map_err(llvm)?,
                "q",
            )
            .map_err(llvm)?;
        let big = b.build_float_sub(c(1.0), q, "big").map_err(llvm)?;
        let signed = self.copysign(big, x)?;
        let is_big = self.fcmp(FloatPredicate::OGE, ax, c(0.625))?;
        self.select_float(is_big, signed, small)
    }

    /// logistic: 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below, from e = e^-|x|, so
    /// neither side overflows (large negative x gives subnormals, not 0). Within 4 ulps.
    fn logistic_fast(&self, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        let b = self.builder();
        let one = f.ft.const_float(1.0);
        let a = self.fabs(x)?;
        let e = self.exp_nonpositive(d, b.build_float_neg(a, "na").map_err(llvm)?)?;
        let den = b.build_float_add(one, e, "d").map_err(llvm)?;
        let pos = b.build_float_div(one, den, "p").map_err(llvm)?;
        // e / (1 + e) as e times 1 / (1 + e): one division for both sides.
        let neg = b.build_float_mul(e, pos, "n").map_err(llvm)?;
        // By x's sign bit (-0 gives 1/2 either way; for NaN, e and so both sides are NaN): one
        // blend on x86, which selects by that bit, with no comparison.
        let bits = b
            .build_bit_cast(x, f.it, "xb")
            .map_err(llvm)?
            .into_int_value();
        let negative = b
            .build_int_compare(IntPredicate::SLT, bits, f.it.const_zero(), "neg")
            .map_err(llvm)?;
        self.select_float(negative, neg, pos)
    }

    /// erf. Small |x| (below 0.921875): x P(x^2) with P the Taylor series of erf(x) / x (to
    /// x^20 in f32, x^34 in f64). Up to the point where erf rounds to 1 (4 in f32, 6 in f64):
    /// 1 - e^(-x^2) G(|x|), G a Chebyshev interpolant of erfc(x) e^(x^2) (one piece in f32, two
    /// in f64, split at 2.5), with x's sign. Beyond: +-1. Within 4 ulps.
    fn erf_fast(&self, d: DType, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let f = self.format(d);
        let b = self.builder();
        let c = |v: f64| f.ft.const_float(v);
        let ax = self.fabs(x)?;
        let z = b.build_float_mul(x, x, "z").map_err(llvm)?;
        // G on [lo, hi], written in powers of (|x| - mid) / half.
        let piece = |lo: f64, hi: f64, coefs: &[f64]| -> Result<FloatValue<'c>> {
            let (mid, half) = ((lo + hi) / 2.0, (hi - lo) / 2.0);
            let u = b
                .build_float_mul(
                    b.build_float_sub(ax, c(mid), "u0").map_err(llvm)?,
                    c(1.0 / half),
                    "u",
                )
                .map_err(llvm)?;
            self.horner(u, coefs)
        };
        let (taylor, g, one_from): (&[f64], FloatValue<'c>, f64) = if f.double {
            let near = piece(0.921875, 2.5, &ERFC_NEAR_F64)?;
            let far = piece(2.5, 6.0, &ERFC_FAR_F64)?;
            let is_far = self.fcmp(FloatPredicate::OGE, ax, c(2.5))?;
            (&ERF_TAYLOR_F64, self.select_float(is_far, far, near)?, 6.0)
        } else {
            (&ERF_TAYLOR_F32, piece(0.921875, 4.0, &ERFC_F32)?, 4.0)
        };
        let small = b
            .build_float_mul(x, self.horner(z, taylor)?, "small")
            .map_err(llvm)?;
        let e = self.exp_fast(d, b.build_float_neg(z, "nz").map_err(llvm)?)?;
        let erfc = b.build_float_mul(e, g, "erfc").map_err(llvm)?;
        let mid = b.build_float_sub(c(1.0), erfc, "mid").map_err(llvm)?;
        let far = self.fcmp(FloatPredicate::OGE, ax, c(one_from))?;
        let big = self.copysign(self.select_float(far, c(1.0), mid)?, x)?;
        // NaN compares false and takes the small branch, which returns it.
        let is_big = self.fcmp(FloatPredicate::OGE, ax, c(0.921875))?;
        self.select_float(is_big, big, small)
    }
}

impl<'c, T: Base<'c> + ?Sized> Math<'c> for T {}

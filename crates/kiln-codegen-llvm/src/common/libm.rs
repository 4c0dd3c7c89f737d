//! `log_plus_one`, `exponential_minus_one`, `cbrt` and `power` as
//! target-independent LLVM IR, for targets without a C math library (the GPU). They compute in
//! f64 (an f32, f16 or bf16 value is widened, and the result rounded once to f32) from
//! [`Math`]'s exp and log:
//!
//! - log1p(x) = log(u) · x / (u - 1) with u = 1 + x rounded (x itself where u is 1): the
//!   quotient corrects the rounding of u (Goldberg's formula).
//! - expm1(x) = (u - 1) · x / log(u) with u = e^x (x itself where u is 1, -1 where u - 1 is):
//!   the same correction (Kahan's).
//! - cbrt(x): a first guess from the exponent bits divided by 3, five Newton steps
//!   y - (y³ - a) / 3y², the sign put back; subnormal f64 scaled by 2^54 first.
//! - x^y = e^(y log |x|) for f32, f16 and bf16 results (see [`Library::pow_narrow`]; f64
//!   results are [`super::pow64`]'s).
//!
//! Within 1 ulp for f32 results and 4 ulps for f64 (checked against Rust's functions on the
//! host by `library_functions_are_accurate_on_the_host`).

use super::math::Math;
use super::pow64::Pow64;
use super::scalar::Scalar;
use super::{Base, llvm};
use crate::Result;
use inkwell::FloatPredicate;
use inkwell::values::FloatValue;
use kiln_ir::DType;

/// The library functions, on any [`Base`].
pub(crate) trait Library<'c>: Base<'c> {
    /// The C math function `name` (`log1p`, `expm1`, `cbrt`) of `x` in `d`; `None` for
    /// another name.
    fn library(&self, name: &str, d: DType, x: FloatValue<'c>) -> Result<Option<FloatValue<'c>>> {
        let b = self.builder();
        let f64t = self.ctx().f64_type();
        let wide = if d == DType::F64 {
            x
        } else {
            b.build_float_ext(x, f64t, "w").map_err(llvm)?
        };
        let r = match name {
            "log1p" => self.log1p_f64(wide)?,
            "expm1" => self.expm1_f64(wide)?,
            "cbrt" => self.cbrt_f64(wide)?,
            _ => return Ok(None),
        };
        Ok(Some(if d == DType::F64 {
            r
        } else {
            b.build_float_trunc(r, self.ftype(d), "n").map_err(llvm)?
        }))
    }

    /// x^y in `d`. For f32, f16 and bf16 as e^(y log |x|) in f64, which is within a fraction
    /// of an f32 ulp before the one rounding (|y log |x|| < 104 wherever the f32 result is
    /// finite and nonzero), with C's special cases: x^0 = 1^y = 1, a negative finite x to a
    /// finite non-integer power is NaN, and the sign of x is kept for odd integer powers. f64
    /// needs a more accurate log and exp: [`Pow64::pow_f64`]'s.
    fn pow_narrow(&self, d: DType, x: FloatValue<'c>, y: FloatValue<'c>) -> Result<FloatValue<'c>> {
        if d == DType::F64 {
            return self.pow_f64(x, y);
        }
        let b = self.builder();
        let f64t = self.ctx().f64_type();
        let x = b.build_float_ext(x, f64t, "x").map_err(llvm)?;
        let y = b.build_float_ext(y, f64t, "y").map_err(llvm)?;
        let ax = self.fabs(x)?;
        let l = self.log_fast(DType::F64, ax)?;
        let t = b.build_float_mul(y, l, "t").map_err(llvm)?;
        let r = self.exp_fast(DType::F64, t)?;
        let r = self.pow_special_cases(x, y, r)?;
        b.build_float_trunc(r, self.ftype(d), "p").map_err(llvm)
    }

    /// log(1 + x) in f64.
    fn log1p_f64(&self, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ft = x.get_type();
        let one = ft.const_float(1.0);
        let u = b.build_float_add(one, x, "u").map_err(llvm)?;
        let um1 = b.build_float_sub(u, one, "um1").map_err(llvm)?;
        let l = self.log_fast(DType::F64, u)?;
        let q = b.build_float_div(x, um1, "q").map_err(llvm)?;
        let r = b.build_float_mul(l, q, "r").map_err(llvm)?;
        // u = 1: x is below half an ulp of 1, and log1p(x) = x to the precision; u = +inf:
        // the quotient would be inf / inf.
        let exact = self.fcmp(FloatPredicate::OEQ, u, one)?;
        let inf = self.fcmp(FloatPredicate::OEQ, u, ft.const_float(f64::INFINITY))?;
        let r = self.select_float(inf, u, r)?;
        self.select_float(exact, x, r)
    }

    /// e^x - 1 in f64.
    fn expm1_f64(&self, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ft = x.get_type();
        let one = ft.const_float(1.0);
        let u = self.exp_fast(DType::F64, x)?;
        let um1 = b.build_float_sub(u, one, "um1").map_err(llvm)?;
        let l = self.log_fast(DType::F64, u)?;
        let q = b.build_float_div(x, l, "q").map_err(llvm)?;
        let r = b.build_float_mul(um1, q, "r").map_err(llvm)?;
        // u = 1: e^x - 1 = x to the precision; u - 1 = -1: e^x is below half an ulp of 1
        // (and -inf gives -1); u = +inf: the quotient would be inf / inf.
        let exact = self.fcmp(FloatPredicate::OEQ, u, one)?;
        let minus_one = self.fcmp(FloatPredicate::OEQ, um1, ft.const_float(-1.0))?;
        let inf = self.fcmp(FloatPredicate::OEQ, u, ft.const_float(f64::INFINITY))?;
        let r = self.select_float(inf, u, r)?;
        let r = self.select_float(minus_one, um1, r)?;
        self.select_float(exact, x, r)
    }

    /// The cube root in f64.
    fn cbrt_f64(&self, x: FloatValue<'c>) -> Result<FloatValue<'c>> {
        let b = self.builder();
        let ft = x.get_type();
        let i64t = self.ctx().i64_type();
        let c = |v: f64| ft.const_float(v);
        let a = self.fabs(x)?;
        // Subnormals scaled into the normal range (cbrt(2^54) = 2^18).
        let tiny = self.fcmp(FloatPredicate::OLT, a, c(f64::MIN_POSITIVE))?;
        let scaled = b.build_float_mul(a, c(2f64.powi(54)), "as").map_err(llvm)?;
        let a = self.select_float(tiny, scaled, a)?;
        // The first guess: the exponent divided by 3 (the bits over 3, rebiased).
        let bits = b
            .build_bit_cast(a, i64t, "bits")
            .map_err(llvm)?
            .into_int_value();
        let third = b
            .build_int_unsigned_div(bits, i64t.const_int(3, false), "third")
            .map_err(llvm)?;
        let guess = b
            .build_int_add(third, i64t.const_int(0x2a9f_7893_782d_a1ce, false), "g")
            .map_err(llvm)?;
        let mut y = b
            .build_bit_cast(guess, ft, "y")
            .map_err(llvm)?
            .into_float_value();
        for _ in 0..5 {
            let y2 = b.build_float_mul(y, y, "y2").map_err(llvm)?;
            let y3 = b.build_float_mul(y2, y, "y3").map_err(llvm)?;
            let num = b.build_float_sub(y3, a, "num").map_err(llvm)?;
            let den = b.build_float_mul(y2, c(3.0), "den").map_err(llvm)?;
            let step = b.build_float_div(num, den, "st").map_err(llvm)?;
            y = b.build_float_sub(y, step, "y").map_err(llvm)?;
        }
        let unscaled = b
            .build_float_mul(y, c(2f64.powi(-18)), "yu")
            .map_err(llvm)?;
        let y = self.select_float(tiny, unscaled, y)?;
        // Zeros, infinities and NaN are their own cube roots.
        let zero = self.fcmp(FloatPredicate::OEQ, x, c(0.0))?;
        let inf = self.fcmp(FloatPredicate::OEQ, self.fabs(x)?, c(f64::INFINITY))?;
        let nan = self.fcmp(FloatPredicate::UNO, x, x)?;
        let special = b.build_or(zero, inf, "sp").map_err(llvm)?;
        let special = b.build_or(special, nan, "sp").map_err(llvm)?;
        let signed = self.copysign(y, x)?;
        self.select_float(special, x, signed)
    }
}

impl<'c, T: Base<'c> + ?Sized> Library<'c> for T {}

#[cfg(test)]
mod tests {
    use super::*;
    use inkwell::OptimizationLevel;
    use inkwell::context::Context;
    use inkwell::targets::{InitializationConfig, Target};

    use crate::common::host::Host;

    /// Ulps between `a` and `b` in f64 (0 for two NaNs or equal values).
    fn ulps64(a: f64, b: f64) -> u64 {
        if a.is_nan() && b.is_nan() || a == b {
            return 0;
        }
        let key = |v: f64| {
            let i = v.to_bits() as i64;
            if i < 0 { i64::MIN - i } else { i }
        };
        key(a).abs_diff(key(b))
    }

    fn ulps32(a: f32, b: f32) -> u64 {
        if a.is_nan() && b.is_nan() || a == b {
            return 0;
        }
        let key = |v: f32| {
            let i = v.to_bits() as i32 as i64;
            if i < 0 { i32::MIN as i64 - i } else { i }
        };
        key(a).abs_diff(key(b))
    }

    #[test]
    fn library_functions_are_accurate_on_the_host() {
        Target::initialize_native(&InitializationConfig::default()).unwrap();
        let ctx = Context::create();
        let m = ctx.create_module("libm");
        let names = ["log1p", "expm1", "cbrt"];
        for name in names {
            for (suffix, d) in [("f32", DType::F32), ("f64", DType::F64)] {
                let ft = if d == DType::F64 {
                    ctx.f64_type()
                } else {
                    ctx.f32_type()
                };
                let f = m.add_function(
                    &format!("{name}_{suffix}"),
                    ft.fn_type(&[ft.into()], false),
                    None,
                );
                let b = ctx.create_builder();
                b.position_at_end(ctx.append_basic_block(f, "entry"));
                let h = Host {
                    ctx: &ctx,
                    m: &m,
                    b,
                };
                let x = f.get_nth_param(0).unwrap().into_float_value();
                let r = h.library(name, d, x).unwrap().unwrap();
                h.b.build_return(Some(&r)).unwrap();
            }
        }
        let ft = ctx.f32_type();
        let f = m.add_function("pow_f32", ft.fn_type(&[ft.into(), ft.into()], false), None);
        let b = ctx.create_builder();
        b.position_at_end(ctx.append_basic_block(f, "entry"));
        let h = Host {
            ctx: &ctx,
            m: &m,
            b,
        };
        let (x, y) = (f.get_nth_param(0).unwrap(), f.get_nth_param(1).unwrap());
        let r = h
            .pow_narrow(DType::F32, x.into_float_value(), y.into_float_value())
            .unwrap();
        h.b.build_return(Some(&r)).unwrap();
        m.verify().unwrap();
        let ee = m
            .create_jit_execution_engine(OptimizationLevel::None)
            .unwrap();
        // Values across the range: random bit patterns, and the special ones.
        let mut v64: Vec<f64> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            -0.5,
            1e-300,
            5e-324,
            -5e-324,
            1e-20,
            -1e-20,
            1e-8,
            700.0,
            709.0,
            710.0,
            -745.0,
            -800.0,
            1e308,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -0.9999999,
            -2.0,
        ];
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for i in 0..20000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Exponents spread over the whole range, and more of them near 1.
            let x = if i % 2 == 0 {
                f64::from_bits(s)
            } else {
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 2f64.powi((s % 40) as i32 - 30)
            };
            v64.push(x);
        }
        type F64 = unsafe extern "C" fn(f64) -> f64;
        type F32 = unsafe extern "C" fn(f32) -> f32;
        type Reference = fn(f64) -> f64;
        let reference: [(&str, Reference); 3] = [
            ("log1p", f64::ln_1p),
            ("expm1", f64::exp_m1),
            ("cbrt", f64::cbrt),
        ];
        for (name, want) in reference {
            let f64fn = unsafe { ee.get_function::<F64>(&format!("{name}_f64")) }.unwrap();
            let f32fn = unsafe { ee.get_function::<F32>(&format!("{name}_f32")) }.unwrap();
            let (mut worst64, mut worst32) = (0, 0);
            for &x in &v64 {
                let got = unsafe { f64fn.call(x) };
                let u = ulps64(got, want(x));
                assert!(
                    u <= 4,
                    "{name}({x:e}) = {got:e}, not {:e} ({u} ulps)",
                    want(x)
                );
                worst64 = worst64.max(u);
                let x32 = x as f32;
                let got = unsafe { f32fn.call(x32) };
                let w = want(x32 as f64) as f32;
                let u = ulps32(got, w);
                assert!(u <= 1, "{name}({x32:e}) = {got:e}, not {w:e} ({u} ulps)");
                worst32 = worst32.max(u);
            }
            println!("{name}: at most {worst64} ulps in f64, {worst32} in f32");
        }
        let pow =
            unsafe { ee.get_function::<unsafe extern "C" fn(f32, f32) -> f32>("pow_f32") }.unwrap();
        let mut ys: Vec<f32> = vec![
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
            127.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let mut xs: Vec<f32> = ys.clone();
        xs.extend([1e-40, -1e-40, 1e38, -1e38, 0.999, 1.001, -7.0]);
        for (i, &x) in v64.iter().enumerate().take(3000) {
            if i % 2 == 1 {
                ys.push((x as f32).clamp(-300.0, 300.0));
            }
            xs.push(x as f32);
        }
        let mut worst = 0;
        for &x in &xs {
            for &y in &ys {
                let got = unsafe { pow.call(x, y) };
                let w = (x as f64).powf(y as f64) as f32;
                let u = ulps32(got, w);
                assert!(u <= 1, "pow({x:e}, {y:e}) = {got:e}, not {w:e} ({u} ulps)");
                worst = worst.max(u);
            }
        }
        println!("pow: at most {worst} ulps in f32");
    }
}

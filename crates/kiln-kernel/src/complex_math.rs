//! The complex elementary functions of [`crate::complex::split_complex`] as real ops on the
//! parts: `sqrt`, `rsqrt`, `cbrt`, `exponential`, `exponential_minus_one`, `log_plus_one`,
//! `tan`, `tanh`, `sign`, `logistic`, `power`, `atan2`, and `reduce` with `multiply`.
//!
//! Each follows the reference interpreter's formula (`kiln_reference::complex`) element for
//! element: the general formula is computed everywhere, and the special values the reference
//! treats apart (zeros, infinities, NaN, a zero imaginary part, large parts) are put in place by
//! selects, the last select the reference's first case. The reference computes in f64 and
//! rounds once; these compute in the part type, within the differential tests' bounds.

use crate::complex::{cosh_sinh, div, hypot, mul, pow2_where, scale_tiny};
use kiln_ir::{Builder, ComparisonDirection, Op, TensorType, ValueId, VerifyError};

type R<T> = Result<T, VerifyError>;

/// The parts (real, imaginary) of a complex value.
pub(crate) type P = (ValueId, ValueId);

/// The builder, the part type, and shorthands for the real ops the formulas use.
pub(crate) struct Math<'a> {
    pub b: &'a mut Builder,
    pub ty: TensorType,
}

impl Math<'_> {
    fn k(&mut self, x: f64) -> R<ValueId> {
        self.b.full(&self.ty, x)
    }
    fn un(&mut self, op: Op, x: ValueId) -> R<ValueId> {
        self.b.unary(op, x)
    }
    fn bin(&mut self, op: Op, x: ValueId, y: ValueId) -> R<ValueId> {
        self.b.binary(op, x, y)
    }
    fn add(&mut self, x: ValueId, y: ValueId) -> R<ValueId> {
        self.bin(Op::Add {}, x, y)
    }
    fn sub(&mut self, x: ValueId, y: ValueId) -> R<ValueId> {
        self.bin(Op::Subtract {}, x, y)
    }
    fn mul(&mut self, x: ValueId, y: ValueId) -> R<ValueId> {
        self.bin(Op::Multiply {}, x, y)
    }
    fn div(&mut self, x: ValueId, y: ValueId) -> R<ValueId> {
        self.bin(Op::Divide {}, x, y)
    }
    fn cmp(&mut self, x: ValueId, y: ValueId, d: ComparisonDirection) -> R<ValueId> {
        self.b.compare(x, y, d)
    }
    /// `x` compared with the constant `c`.
    fn cmpk(&mut self, x: ValueId, c: f64, d: ComparisonDirection) -> R<ValueId> {
        let c = self.k(c)?;
        self.cmp(x, c, d)
    }
    fn and(&mut self, x: ValueId, y: ValueId) -> R<ValueId> {
        self.bin(Op::And {}, x, y)
    }
    fn or(&mut self, x: ValueId, y: ValueId) -> R<ValueId> {
        self.bin(Op::Or {}, x, y)
    }
    fn sel(&mut self, p: ValueId, x: ValueId, y: ValueId) -> R<ValueId> {
        self.b.select(p, x, y)
    }
    /// Both parts selected by `p`.
    fn sel2(&mut self, p: ValueId, x: P, y: P) -> R<P> {
        Ok((self.sel(p, x.0, y.0)?, self.sel(p, x.1, y.1)?))
    }
    fn is_nan(&mut self, x: ValueId) -> R<ValueId> {
        self.cmp(x, x, ComparisonDirection::Ne)
    }
    fn is_inf(&mut self, x: ValueId) -> R<ValueId> {
        let m = self.un(Op::Abs {}, x)?;
        self.cmpk(m, f64::INFINITY, ComparisonDirection::Eq)
    }
    /// Whether the sign bit of `x` is set (-0 included; false for NaN): x < 0, or 1 / x < 0.
    fn negative(&mut self, x: ValueId) -> R<ValueId> {
        let lt = self.cmpk(x, 0.0, ComparisonDirection::Lt)?;
        let one = self.k(1.0)?;
        let inv = self.div(one, x)?;
        let inv_lt = self.cmpk(inv, 0.0, ComparisonDirection::Lt)?;
        self.or(lt, inv_lt)
    }
    /// |m| with the sign of `s` (`s` not NaN).
    fn copysign(&mut self, m: ValueId, s: ValueId) -> R<ValueId> {
        let m = self.un(Op::Abs {}, m)?;
        let nm = self.un(Op::Negate {}, m)?;
        let neg = self.negative(s)?;
        self.sel(neg, nm, m)
    }
    fn cmul(&mut self, x: P, y: P) -> R<P> {
        mul(self.b, x, y)
    }
    fn cdiv(&mut self, x: P, y: P) -> R<P> {
        let ty = self.ty.clone();
        div(self.b, x, y, &ty)
    }
    fn cadd(&mut self, x: P, y: P) -> R<P> {
        Ok((self.add(x.0, y.0)?, self.add(x.1, y.1)?))
    }
    fn hypot(&mut self, a: ValueId, c: ValueId) -> R<ValueId> {
        let ty = self.ty.clone();
        hypot(self.b, a, c, &ty)
    }
    /// The constant complex number `re + i im`.
    fn ck(&mut self, re: f64, im: f64) -> R<P> {
        Ok((self.k(re)?, self.k(im)?))
    }

    /// e^z = e^a (cos b + i sin b); e^a itself (the zero kept) when b is 0.
    pub fn exp(&mut self, (a, c): P) -> R<P> {
        let e = self.un(Op::Exponential {}, a)?;
        let cos = self.un(Op::Cosine {}, c)?;
        let sin = self.un(Op::Sine {}, c)?;
        let re = self.mul(e, cos)?;
        let im = self.mul(e, sin)?;
        let real_axis = self.cmpk(c, 0.0, ComparisonDirection::Eq)?;
        self.sel2(real_axis, (e, c), (re, im))
    }

    /// `z` scaled up where both parts are tiny ([`scale_tiny`]): where, the parts, and the
    /// exponent.
    fn scaled(&mut self, z: P) -> R<(ValueId, P, i32)> {
        let ty = self.ty.clone();
        scale_tiny(self.b, z, &ty)
    }

    /// Both parts of `z` times 2^e where `p`.
    fn unscale(&mut self, p: ValueId, z: P, e: i32) -> R<P> {
        let ty = self.ty.clone();
        let s = pow2_where(self.b, p, e, &ty)?;
        Ok((self.mul(z.0, s)?, self.mul(z.1, s)?))
    }

    /// ln z = ln|z| + i atan2(b, a); |z| of tiny parts scaled by 2^k, and k ln 2 taken off.
    pub fn log(&mut self, (a, c): P) -> R<P> {
        let (tiny, (sa, sc), k) = self.scaled((a, c))?;
        let m = self.hypot(sa, sc)?;
        let l = self.un(Op::Log {}, m)?;
        let back = self.k(f64::from(k) * std::f64::consts::LN_2)?;
        let zero = self.k(0.0)?;
        let back = self.sel(tiny, back, zero)?;
        Ok((self.sub(l, back)?, self.bin(Op::Atan2 {}, c, a)?))
    }

    /// e^z - 1: expm1(a) cos b - 2 sin²(b / 2) + i e^a sin b; expm1(a) (the zero kept) when b
    /// is 0.
    pub fn expm1(&mut self, (a, c): P) -> R<P> {
        let em1 = self.un(Op::ExponentialMinusOne {}, a)?;
        let half = self.k(0.5)?;
        let hb = self.mul(c, half)?;
        let h = self.un(Op::Sine {}, hb)?;
        let hh = self.mul(h, h)?;
        let two = self.k(2.0)?;
        let hh2 = self.mul(two, hh)?;
        let cos = self.un(Op::Cosine {}, c)?;
        let t = self.mul(em1, cos)?;
        let re = self.sub(t, hh2)?;
        let e = self.un(Op::Exponential {}, a)?;
        let sin = self.un(Op::Sine {}, c)?;
        let im = self.mul(e, sin)?;
        let real_axis = self.cmpk(c, 0.0, ComparisonDirection::Eq)?;
        self.sel2(real_axis, (em1, c), (re, im))
    }

    /// ln(1 + z): the real part ln1p(a (2 + a) + b²) / 2 when both parts are under 1/2 in
    /// magnitude, else ln|1 + z|; the imaginary part atan2(b, 1 + a).
    pub fn log1p(&mut self, (a, c): P) -> R<P> {
        let one = self.k(1.0)?;
        let two = self.k(2.0)?;
        let half = self.k(0.5)?;
        let a1 = self.add(one, a)?;
        let a2 = self.add(two, a)?;
        let t = self.mul(a, a2)?;
        let cc = self.mul(c, c)?;
        let s = self.add(t, cc)?;
        let l = self.un(Op::LogPlusOne {}, s)?;
        let small_re = self.mul(l, half)?;
        let m = self.hypot(a1, c)?;
        let big_re = self.un(Op::Log {}, m)?;
        let aa = self.un(Op::Abs {}, a)?;
        let ac = self.un(Op::Abs {}, c)?;
        let sa = self.cmpk(aa, 0.5, ComparisonDirection::Lt)?;
        let sc = self.cmpk(ac, 0.5, ComparisonDirection::Lt)?;
        let small = self.and(sa, sc)?;
        let re = self.sel(small, small_re, big_re)?;
        Ok((re, self.bin(Op::Atan2 {}, c, a1)?))
    }

    /// The principal square root, as the reference computes it: t = sqrt(|a| / 2 + |z / 2|)
    /// (halved first, so no sum overflows), (t, b / 2t) for a >= 0 and (|b| / 2t, ±t) else;
    /// √0 = (0, b), an infinite b gives (inf, b), NaN gives NaN, an infinite a (inf, ±0) or
    /// (0, ±inf).
    pub fn sqrt(&mut self, (a, c): P) -> R<P> {
        let half = self.k(0.5)?;
        let two = self.k(2.0)?;
        let zero = self.k(0.0)?;
        let inf = self.k(f64::INFINITY)?;
        let nan = self.k(f64::NAN)?;
        // Tiny parts scaled by 2^k (whose halves would round), the root by 2^(-k/2) back.
        let (tiny, (sa, sc), k) = self.scaled((a, c))?;
        let aa = self.un(Op::Abs {}, sa)?;
        let ah = self.mul(sa, half)?;
        let ch = self.mul(sc, half)?;
        let m = self.hypot(ah, ch)?;
        let aah = self.mul(aa, half)?;
        let s = self.add(aah, m)?;
        let t = self.un(Op::Sqrt {}, s)?;
        let t2 = self.mul(two, t)?;
        let pos_im = self.div(sc, t2)?;
        let ac = self.un(Op::Abs {}, sc)?;
        let neg_re = self.div(ac, t2)?;
        let neg_im = self.copysign(t, sc)?;
        let a_pos = self.cmpk(a, 0.0, ComparisonDirection::Ge)?;
        let z = self.sel2(a_pos, (t, pos_im), (neg_re, neg_im))?;
        let mut z = self.unscale(tiny, z, -k / 2)?;
        // An infinite real part.
        let zs = self.copysign(zero, c)?;
        let is = self.copysign(inf, c)?;
        let a_gt = self.cmpk(a, 0.0, ComparisonDirection::Gt)?;
        let inf_a = self.sel2(a_gt, (a, zs), (zero, is))?;
        let a_inf = self.is_inf(a)?;
        z = self.sel2(a_inf, inf_a, z)?;
        let an = self.is_nan(a)?;
        let cn = self.is_nan(c)?;
        let any_nan = self.or(an, cn)?;
        z = self.sel2(any_nan, (nan, nan), z)?;
        let c_inf = self.is_inf(c)?;
        z = self.sel2(c_inf, (inf, c), z)?;
        let a0 = self.cmpk(a, 0.0, ComparisonDirection::Eq)?;
        let c0 = self.cmpk(c, 0.0, ComparisonDirection::Eq)?;
        let at_zero = self.and(a0, c0)?;
        self.sel2(at_zero, (zero, c), z)
    }

    /// 1 / sqrt(z), by Smith's division.
    pub fn rsqrt(&mut self, z: P) -> R<P> {
        let s = self.sqrt(z)?;
        let one = self.ck(1.0, 0.0)?;
        self.cdiv(one, s)
    }

    /// The principal cube root |z|^(1/3) (cos(θ / 3) + i sin(θ / 3)); the real cube root, the
    /// zero imaginary part kept, on the non-negative real axis.
    pub fn cbrt(&mut self, (a, c): P) -> R<P> {
        // |z| of tiny parts scaled by 2^k, the root by 2^(-k/3) back.
        let (tiny, (sa, sc), k) = self.scaled((a, c))?;
        let m = self.hypot(sa, sc)?;
        let r = self.un(Op::Cbrt {}, m)?;
        let th = self.bin(Op::Atan2 {}, c, a)?;
        let third = self.k(1.0 / 3.0)?;
        let th = self.mul(th, third)?;
        let cos = self.un(Op::Cosine {}, th)?;
        let sin = self.un(Op::Sine {}, th)?;
        let re = self.mul(r, cos)?;
        let im = self.mul(r, sin)?;
        let (re, im) = self.unscale(tiny, (re, im), -k / 3)?;
        let ra = self.un(Op::Cbrt {}, a)?;
        let c0 = self.cmpk(c, 0.0, ComparisonDirection::Eq)?;
        let a_pos = self.cmpk(a, 0.0, ComparisonDirection::Ge)?;
        let real_axis = self.and(c0, a_pos)?;
        self.sel2(real_axis, (ra, c), (re, im))
    }

    /// tan z = (sin 2a + i sinh 2b) / (cos 2a + cosh 2b), computed as
    /// (sin a cos a + i sinh b cosh b) / (cos² a + sinh² b) (the same quotient halved, without
    /// the cancellation of cos 2a + 1 near a pole); for |b| > 20, where cosh 2b would
    /// overflow, its limit (2 sin 2a e^(-2|b|), ±1).
    pub fn tan(&mut self, (a, c): P) -> R<P> {
        let two = self.k(2.0)?;
        let ty = self.ty.clone();
        let (cosh, sinh) = cosh_sinh(self.b, c, &ty)?;
        let sin = self.un(Op::Sine {}, a)?;
        let cos = self.un(Op::Cosine {}, a)?;
        let cc = self.mul(cos, cos)?;
        let ss = self.mul(sinh, sinh)?;
        let d = self.add(cc, ss)?;
        let sc = self.mul(sin, cos)?;
        let re = self.div(sc, d)?;
        let sh = self.mul(sinh, cosh)?;
        let im = self.div(sh, d)?;
        // |b| > 20.
        let ac = self.un(Op::Abs {}, c)?;
        let nc2 = self.mul(two, ac)?;
        let nc2 = self.un(Op::Negate {}, nc2)?;
        let e = self.un(Op::Exponential {}, nc2)?;
        let a2 = self.mul(two, a)?;
        let sin2 = self.un(Op::Sine {}, a2)?;
        let s2 = self.mul(two, sin2)?;
        let far_re = self.mul(s2, e)?;
        let one = self.k(1.0)?;
        let far_im = self.copysign(one, c)?;
        let far = self.cmpk(ac, 20.0, ComparisonDirection::Gt)?;
        self.sel2(far, (far_re, far_im), (re, im))
    }

    /// tanh z = -i tan(iz).
    pub fn tanh(&mut self, (a, c): P) -> R<P> {
        let nc = self.un(Op::Negate {}, c)?;
        let (t0, t1) = self.tan((nc, a))?;
        Ok((t1, self.un(Op::Negate {}, t0)?))
    }

    /// sign z = z / |z|: 0 at 0, NaN when a part is NaN, an infinite part counting as the unit
    /// in its direction (the other part a zero of its sign).
    pub fn sign(&mut self, (a, c): P) -> R<P> {
        let zero = self.k(0.0)?;
        let nan = self.k(f64::NAN)?;
        let one = self.k(1.0)?;
        let ai = self.is_inf(a)?;
        let ci = self.is_inf(c)?;
        let any_inf = self.or(ai, ci)?;
        let unit = |m: &mut Self, x: ValueId, inf: ValueId| -> R<ValueId> {
            let s1 = m.copysign(one, x)?;
            let s0 = m.copysign(zero, x)?;
            m.sel(inf, s1, s0)
        };
        let ua = unit(self, a, ai)?;
        let uc = unit(self, c, ci)?;
        // Tiny parts scaled up: the quotient is the same, and |z| keeps its bits.
        let (_, (sa, sc), _) = self.scaled((a, c))?;
        let za = self.sel(any_inf, ua, sa)?;
        let zc = self.sel(any_inf, uc, sc)?;
        let m = self.hypot(za, zc)?;
        let mut z = (self.div(za, m)?, self.div(zc, m)?);
        let a0 = self.cmpk(a, 0.0, ComparisonDirection::Eq)?;
        let c0 = self.cmpk(c, 0.0, ComparisonDirection::Eq)?;
        let at_zero = self.and(a0, c0)?;
        z = self.sel2(at_zero, (zero, zero), z)?;
        let an = self.is_nan(a)?;
        let cn = self.is_nan(c)?;
        let any_nan = self.or(an, cn)?;
        self.sel2(any_nan, (nan, nan), z)
    }

    /// logistic z = 1 / (1 + e^-z), as e^z / (1 + e^z) for a negative real part (no
    /// exponential overflows).
    pub fn logistic(&mut self, (a, c): P) -> R<P> {
        let one = self.ck(1.0, 0.0)?;
        let e = self.exp((a, c))?;
        let ope = self.cadd(one, e)?;
        let left = self.cdiv(e, ope)?;
        let na = self.un(Op::Negate {}, a)?;
        let nc = self.un(Op::Negate {}, c)?;
        let en = self.exp((na, nc))?;
        let open = self.cadd(one, en)?;
        let right = self.cdiv(one, open)?;
        let neg = self.cmpk(a, 0.0, ComparisonDirection::Lt)?;
        self.sel2(neg, left, right)
    }

    /// z^w = e^(w ln z); 1 for w = 0, 0 for z = 0 and a positive real part of w.
    pub fn power(&mut self, z: P, w: P) -> R<P> {
        let l = self.log(z)?;
        let p = self.cmul(w, l)?;
        let mut r = self.exp(p)?;
        let zero = self.k(0.0)?;
        let one = self.k(1.0)?;
        let z0 = self.cmpk(z.0, 0.0, ComparisonDirection::Eq)?;
        let z1 = self.cmpk(z.1, 0.0, ComparisonDirection::Eq)?;
        let z_zero = self.and(z0, z1)?;
        let w_pos = self.cmpk(w.0, 0.0, ComparisonDirection::Gt)?;
        let to_zero = self.and(z_zero, w_pos)?;
        r = self.sel2(to_zero, (zero, zero), r)?;
        let w0 = self.cmpk(w.0, 0.0, ComparisonDirection::Eq)?;
        let w1 = self.cmpk(w.1, 0.0, ComparisonDirection::Eq)?;
        let w_zero = self.and(w0, w1)?;
        self.sel2(w_zero, (one, zero), r)
    }

    /// atan2(y, x) = -i ln((x + iy) / sqrt(x² + y²)), each product by i and -i a complex
    /// product, as the reference computes it.
    pub fn atan2(&mut self, y: P, x: P) -> R<P> {
        let i = self.ck(0.0, 1.0)?;
        let iy = self.cmul(i, y)?;
        let num = self.cadd(x, iy)?;
        let xx = self.cmul(x, x)?;
        let yy = self.cmul(y, y)?;
        let s = self.cadd(xx, yy)?;
        let den = self.sqrt(s)?;
        let q = self.cdiv(num, den)?;
        let l = self.log(q)?;
        let ni = self.ck(-0.0, -1.0)?;
        self.cmul(ni, l)
    }

    /// The product of `v`'s elements along `dims`, times `init` (a scalar): the dimensions
    /// moved last and flattened into one, then halved by products of its two halves (an odd
    /// last element carried) until one element is left. Empty dimensions give `init`.
    pub fn reduce_mul(&mut self, v: P, init: P, dims: &[i64], shape: &[usize]) -> R<P> {
        let keep: Vec<usize> = (0..shape.len())
            .filter(|d| !dims.contains(&(*d as i64)))
            .collect();
        let out_shape: Vec<usize> = keep.iter().map(|&d| shape[d]).collect();
        let n: usize = dims.iter().map(|&d| shape[d as usize]).product();
        let mut perm: Vec<i64> = keep.iter().map(|&d| d as i64).collect();
        perm.extend(dims.iter().copied());
        let mut flat = out_shape.clone();
        flat.push(n);
        let mut parts = [v.0, v.1];
        for p in &mut parts {
            let t = self.b.inst(
                Op::Transpose {
                    permutation: perm.clone(),
                },
                &[*p],
            )?;
            *p = self.b.reshape(t, &flat)?;
        }
        let r = out_shape.len();
        let out_ty = TensorType::new(self.ty.dtype, out_shape.clone());
        let bcast = |m: &mut Self, s: ValueId| m.b.broadcast(s, &[], &out_shape);
        let init = (bcast(self, init.0)?, bcast(self, init.1)?);
        if n == 0 {
            return Ok(init);
        }
        let slice = |m: &mut Self, x: ValueId, lo: usize, hi: usize| -> R<ValueId> {
            let mut start = vec![0; r + 1];
            let mut limit: Vec<i64> = out_shape.iter().map(|&d| d as i64).collect();
            limit.push(hi as i64);
            start[r] = lo as i64;
            m.b.inst(
                Op::Slice {
                    start_indices: start,
                    limit_indices: limit,
                    strides: vec![1; r + 1],
                },
                &[x],
            )
        };
        let mut len = n;
        let mut cur = (parts[0], parts[1]);
        while len > 1 {
            let h = len / 2;
            let lo = (slice(self, cur.0, 0, h)?, slice(self, cur.1, 0, h)?);
            let hi = (slice(self, cur.0, h, 2 * h)?, slice(self, cur.1, h, 2 * h)?);
            let mut prod = self.cmul(lo, hi)?;
            if len % 2 == 1 {
                let last = (
                    slice(self, cur.0, 2 * h, len)?,
                    slice(self, cur.1, 2 * h, len)?,
                );
                let cat = |m: &mut Self, x: ValueId, y: ValueId| {
                    m.b.inst(
                        Op::Concatenate {
                            dimension: r as i64,
                        },
                        &[x, y],
                    )
                };
                prod = (cat(self, prod.0, last.0)?, cat(self, prod.1, last.1)?);
            }
            cur = prod;
            len = h + len % 2;
        }
        let one = (
            self.b.reshape(cur.0, &out_ty.shape)?,
            self.b.reshape(cur.1, &out_ty.shape)?,
        );
        self.cmul(init, one)
    }
}

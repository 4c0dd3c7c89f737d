//! The special functions of `chlo` (`erfc`, `lgamma`, `digamma`, `polygamma`, `zeta`,
//! `bessel_i1e`), written with kiln's elementwise ops. Every one is computed in `f64` (its
//! operands converted, the result rounded back), so the f32, f16 and bf16 results are the
//! `f64` values rounded once; the errors below are those of the `f64` formulas.
//!
//! | op | method | accuracy (f64 formula) |
//! |---|---|---|
//! | `erfc(x)` | `1 - erf(x)` below 1.5; above, the continued fraction `e^-x² / (√π (x + ½/(x + 1/(x + 3/2/(x + ...)))))` to 80 levels | relative 1e-14 |
//! | `lgamma(x)` | `x ≥ 0.5`: Stirling's series to `1/z¹³` at `z = x + 10` less `ln Π(x + k)` (below 10), else at `x`; `x < 0.5`: `ln π - ln|sin πx| - lgamma(1 - x)`; `+inf` at poles and `±inf` | relative 1e-13; absolute 1e-12 near its zeros (1, 2, ...) |
//! | `digamma(x)` | the asymptotic series to `1/z¹⁴` at `z = x + 10` less `Σ 1/(x + k)`; `x < 0.5`: `digamma(1 - x) - π / tan(πx)`; NaN at non-positive integers | relative 1e-13; absolute 1e-12 near its zeros |
//! | `zeta(s, q)` | Hurwitz ζ by Euler–Maclaurin: `Σ_{k<10} (q + k)^-s` plus the tail at `a = q + 10` with 12 Bernoulli terms | relative 1e-13 for `q > -1` |
//! | `polygamma(n, x)` | `digamma` for `n = 0`, else `(-1)^(n+1) n! ζ(n + 1, x)` | relative 1e-12 |
//! | `bessel_i1e(x)` | `e^-|x| I₁(x)`: the power series (46 terms) below 30, the asymptotic series (26 terms) above | relative 1e-13 |
//!
//! The bounds are what `tests/chlo_special.rs` checks against SciPy, on both backends, over
//! the inputs of `tests/data/jax/special_functions`.
//!
//! Domains follow StableHLO's legalization: `zeta(1, q) = inf`, `zeta(s < 1, q) = NaN`;
//! for `q ≤ 0` a non-integer `s` gives NaN and an integer `q` a pole (`inf` for even `s`, NaN
//! for odd); `polygamma(n, x)` is NaN unless `n` is a non-negative integer. Where the
//! expansion does not hold (`zeta` at a non-integer `q ≤ -1`) the result is NaN.

use crate::ast::OpAst;
use crate::chlo::Expr;
use crate::error::{Error, Result};
use crate::import::{Body, value_type};
use kiln_ir::{ComparisonDirection as Dir, DType, Op, ValueId};
use std::f64::consts::PI;

/// Whether `name` is an op this file writes.
pub fn handles(name: &str) -> bool {
    matches!(
        name,
        "chlo.erfc"
            | "chlo.lgamma"
            | "chlo.digamma"
            | "chlo.polygamma"
            | "chlo.zeta"
            | "chlo.bessel_i1e"
    )
}

/// Writes the op `op` (one of [`handles`]) on `args`.
pub fn lower(body: &mut Body, op: &OpAst, args: &[ValueId]) -> Result<Vec<ValueId>> {
    let arity = if matches!(op.name.as_str(), "chlo.polygamma" | "chlo.zeta") {
        2
    } else {
        1
    };
    if args.len() != arity {
        return Err(Error::invalid(
            op.pos,
            format!(
                "`{}` takes {arity} operand{}",
                op.name,
                if arity == 1 { "" } else { "s" }
            ),
        ));
    }
    let ty = value_type(body, args[0])?;
    if !ty.dtype.is_float() {
        return Err(Error::invalid(
            op.pos,
            format!("`{}` takes floats", op.name),
        ));
    }
    for &a in &args[1..] {
        if value_type(body, a)? != ty {
            return Err(Error::invalid(
                op.pos,
                format!("the operands of `{}` must have one type", op.name),
            ));
        }
    }
    let wide = ty.with_dtype(DType::F64);
    let mut e = Expr {
        body,
        op,
        ty: wide.clone(),
    };
    let mut xs = Vec::new();
    for &a in args {
        xs.push(if ty.dtype == DType::F64 {
            a
        } else {
            e.push(Op::Convert {}, &[a], Some(&wide))?
        });
    }
    let v = match op.name.as_str() {
        "chlo.erfc" => erfc(&mut e, xs[0])?,
        "chlo.lgamma" => lgamma(&mut e, xs[0])?,
        "chlo.digamma" => digamma(&mut e, xs[0])?,
        "chlo.polygamma" => polygamma(&mut e, xs[0], xs[1])?,
        "chlo.zeta" => zeta(&mut e, xs[0], xs[1])?,
        "chlo.bessel_i1e" => bessel_i1e(&mut e, xs[0])?,
        _ => return Err(Error::unsupported(op.pos, format!("the op `{}`", op.name))),
    };
    let out = if ty.dtype == DType::F64 {
        v
    } else {
        e.push(Op::Convert {}, &[v], Some(&ty))?
    };
    Ok(vec![out])
}

/// Shorthands for the arithmetic of the formulas.
impl Expr<'_, '_> {
    fn add(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bin(Op::Add {}, a, b)
    }
    fn sub(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bin(Op::Subtract {}, a, b)
    }
    fn mul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bin(Op::Multiply {}, a, b)
    }
    fn div(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.bin(Op::Divide {}, a, b)
    }
    /// `a + c`.
    fn addk(&mut self, a: ValueId, c: f64) -> Result<ValueId> {
        let k = self.k(c)?;
        self.add(a, k)
    }
    /// `c * a`.
    fn mulk(&mut self, a: ValueId, c: f64) -> Result<ValueId> {
        let k = self.k(c)?;
        self.mul(k, a)
    }
    /// `a <dir> c`.
    fn cmpk(&mut self, d: Dir, a: ValueId, c: f64) -> Result<ValueId> {
        let k = self.k(c)?;
        self.cmp(d, a, k)
    }
    /// `c` where `p` holds, else `a`.
    fn selk(&mut self, p: ValueId, c: f64, a: ValueId) -> Result<ValueId> {
        let k = self.k(c)?;
        self.select(p, k, a)
    }
    fn and(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.push(Op::And {}, &[a, b], None)
    }
    fn or(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.push(Op::Or {}, &[a, b], None)
    }
    /// Whether `x` is an integer (false for NaN and true for ±inf).
    fn is_int(&mut self, x: ValueId) -> Result<ValueId> {
        let f = self.un(Op::Floor {}, x)?;
        self.cmp(Dir::Eq, x, f)
    }
}

/// `erfc(x)`.
fn erfc(e: &mut Expr, x: ValueId) -> Result<ValueId> {
    /// The levels of the continued fraction.
    const LEVELS: usize = 80;
    let one = e.k(1.0)?;
    let erf = e.un(Op::Erf {}, x)?;
    let near = e.sub(one, erf)?;
    let mut t = x;
    for k in (1..=LEVELS).rev() {
        let q = e.k(k as f64 / 2.0)?;
        let d = e.div(q, t)?;
        t = e.add(x, d)?;
    }
    let xx = e.mul(x, x)?;
    let nxx = e.un(Op::Negate {}, xx)?;
    let ex = e.un(Op::Exponential {}, nxx)?;
    let den = e.mulk(t, PI.sqrt())?;
    let far = e.div(ex, den)?;
    let is_near = e.cmpk(Dir::Lt, x, 1.5)?;
    e.select(is_near, near, far)
}

/// `erf_inv(y)` in f64 from the single-precision estimate `r0`: four steps of Halley's method
/// on `erf(r) = |y|` where `|y| ≤ ½`, of Newton's method on `ln erfc(r) = ln(1 - |y|)` above
/// (`1 - |y|` is exact there, and the logarithm is nearly quadratic in `r`, so the steps
/// converge from the estimate's 10% error in the far tail, where `1 - |y|` nears 1e-16).
/// The result is within 1e-14 of erf_inv's value, relative (`tests/chlo_special.rs`).
pub(crate) fn refine_erf_inv(e: &mut Expr, y: ValueId, r0: ValueId) -> Result<ValueId> {
    let ay = e.un(Op::Abs {}, y)?;
    let tail = e.cmpk(Dir::Gt, ay, 0.5)?;
    let one = e.k(1.0)?;
    let q = e.sub(one, ay)?;
    let lq = e.un(Op::Log {}, q)?;
    let mut r = e.un(Op::Abs {}, r0)?;
    for _ in 0..4 {
        // e^(r²) √π / 2 = 1 / erf'(r).
        let rr = e.mul(r, r)?;
        let er2 = e.un(Op::Exponential {}, rr)?;
        let inv_d = e.mulk(er2, PI.sqrt() / 2.0)?;
        // Halley on erf: r - u / (1 + r u), u = (erf(r) - |y|) / erf'(r).
        let erf = e.un(Op::Erf {}, r)?;
        let f = e.sub(erf, ay)?;
        let u = e.mul(f, inv_d)?;
        let ru = e.mul(r, u)?;
        let den = e.add(one, ru)?;
        let hs = e.div(u, den)?;
        let near = e.sub(r, hs)?;
        // Newton on ln erfc: r + (ln erfc(r) - ln q) erfc(r) / erf'(r).
        let ec = erfc(e, r)?;
        let lec = e.un(Op::Log {}, ec)?;
        let g = e.sub(lec, lq)?;
        let gc = e.mul(g, ec)?;
        let ns = e.mul(gc, inv_d)?;
        let far = e.add(r, ns)?;
        r = e.select(tail, far, near)?;
    }
    let s = e.un(Op::Sign {}, y)?;
    e.mul(s, r)
}

/// `|sin(πx)|`, with the argument reduced to `[0, ½]` first (exact).
fn abs_sin_pi(e: &mut Expr, x: ValueId) -> Result<ValueId> {
    let fl = e.un(Op::Floor {}, x)?;
    let f = e.sub(x, fl)?;
    let one = e.k(1.0)?;
    let g = e.sub(one, f)?;
    let r = e.bin(Op::Minimum {}, f, g)?;
    let pr = e.mulk(r, PI)?;
    e.un(Op::Sine {}, pr)
}

/// `x + 10` where `x < 10`, else `x`; with whether it moved.
fn shifted(e: &mut Expr, x: ValueId) -> Result<(ValueId, ValueId)> {
    let small = e.cmpk(Dir::Lt, x, 10.0)?;
    let x10 = e.addk(x, 10.0)?;
    Ok((e.select(small, x10, x)?, small))
}

/// `lgamma(x)` for `x ≥ 0.5`.
fn lgamma_right(e: &mut Expr, x: ValueId) -> Result<ValueId> {
    let (z, small) = shifted(e, x)?;
    // ln Π_{k<10} (x + k): at most ln(19!/9!), no overflow where it is used.
    let mut p = x;
    for k in 1..10 {
        let xk = e.addk(x, k as f64)?;
        p = e.mul(p, xk)?;
    }
    let lp = e.un(Op::Log {}, p)?;
    // Stirling: (z - ½) ln z - z + ½ ln 2π + Σ B_2j / (2j (2j-1) z^(2j-1)).
    let lz = e.un(Op::Log {}, z)?;
    let zh = e.addk(z, -0.5)?;
    let a = e.mul(zh, lz)?;
    let b = e.sub(a, z)?;
    let c = e.addk(b, 0.5 * (2.0 * PI).ln())?;
    let one = e.k(1.0)?;
    let w = e.div(one, z)?;
    let w2 = e.mul(w, w)?;
    let s = e.poly(
        w2,
        &[
            1.0 / 156.0,
            -691.0 / 360360.0,
            1.0 / 1188.0,
            -1.0 / 1680.0,
            1.0 / 1260.0,
            -1.0 / 360.0,
            1.0 / 12.0,
        ],
    )?;
    let sw = e.mul(s, w)?;
    let st = e.add(c, sw)?;
    let back = e.sub(st, lp)?;
    e.select(small, back, st)
}

/// `lgamma(x)`.
fn lgamma(e: &mut Expr, x: ValueId) -> Result<ValueId> {
    let reflect = e.cmpk(Dir::Lt, x, 0.5)?;
    let one = e.k(1.0)?;
    let mx = e.sub(one, x)?;
    let xr = e.select(reflect, mx, x)?;
    let lg = lgamma_right(e, xr)?;
    let s = abs_sin_pi(e, x)?;
    let ls = e.un(Op::Log {}, s)?;
    let lpi = e.k(PI.ln())?;
    let a = e.sub(lpi, ls)?;
    let refl = e.sub(a, lg)?;
    let r = e.select(reflect, refl, lg)?;
    let ax = e.un(Op::Abs {}, x)?;
    let inf = e.cmpk(Dir::Eq, ax, f64::INFINITY)?;
    e.selk(inf, f64::INFINITY, r)
}

/// `digamma(x)` for `x ≥ 0.5`.
fn digamma_right(e: &mut Expr, x: ValueId) -> Result<ValueId> {
    let (z, small) = shifted(e, x)?;
    let one = e.k(1.0)?;
    let mut h = e.div(one, x)?;
    for k in 1..10 {
        let xk = e.addk(x, k as f64)?;
        let r = e.div(one, xk)?;
        h = e.add(h, r)?;
    }
    // ln z - 1/(2z) - Σ B_2j / (2j z^2j).
    let lz = e.un(Op::Log {}, z)?;
    let w = e.div(one, z)?;
    let hw = e.mulk(w, 0.5)?;
    let a = e.sub(lz, hw)?;
    let w2 = e.mul(w, w)?;
    let s = e.poly(
        w2,
        &[
            1.0 / 12.0,
            -691.0 / 32760.0,
            1.0 / 132.0,
            -1.0 / 240.0,
            1.0 / 252.0,
            -1.0 / 120.0,
            1.0 / 12.0,
        ],
    )?;
    let sw = e.mul(s, w2)?;
    let asym = e.sub(a, sw)?;
    let back = e.sub(asym, h)?;
    e.select(small, back, asym)
}

/// `digamma(x)`.
fn digamma(e: &mut Expr, x: ValueId) -> Result<ValueId> {
    let reflect = e.cmpk(Dir::Lt, x, 0.5)?;
    let one = e.k(1.0)?;
    let mx = e.sub(one, x)?;
    let xr = e.select(reflect, mx, x)?;
    let d = digamma_right(e, xr)?;
    // π / tan(πx), the argument reduced to (-½, ½].
    let fl = e.un(Op::Floor {}, x)?;
    let f = e.sub(x, fl)?;
    let over = e.cmpk(Dir::Gt, f, 0.5)?;
    let f1 = e.addk(f, -1.0)?;
    let g = e.select(over, f1, f)?;
    let pg = e.mulk(g, PI)?;
    let t = e.un(Op::Tan {}, pg)?;
    let pi = e.k(PI)?;
    let c = e.div(pi, t)?;
    let refl = e.sub(d, c)?;
    let r = e.select(reflect, refl, d)?;
    let le0 = e.cmpk(Dir::Le, x, 0.0)?;
    let int = e.is_int(x)?;
    let pole = e.and(le0, int)?;
    e.selk(pole, f64::NAN, r)
}

/// `B_2j / (2j)!` for `j = 1..=12`.
fn bernoulli_over_factorial() -> [f64; 12] {
    let b = [
        (1.0, 6.0),
        (-1.0, 30.0),
        (1.0, 42.0),
        (-1.0, 30.0),
        (5.0, 66.0),
        (-691.0, 2730.0),
        (7.0, 6.0),
        (-3617.0, 510.0),
        (43867.0, 798.0),
        (-174611.0, 330.0),
        (854513.0, 138.0),
        (-236364091.0, 2730.0),
    ];
    let mut out = [0.0; 12];
    let mut fact = 1.0f64;
    for (j, (n, d)) in b.iter().enumerate() {
        let m = 2 * (j + 1);
        fact *= (m - 1) as f64 * m as f64;
        out[j] = n / d / fact;
    }
    out
}

/// Hurwitz `zeta(s, q)`.
fn zeta(e: &mut Expr, s: ValueId, q: ValueId) -> Result<ValueId> {
    let ns = e.un(Op::Negate {}, s)?;
    let mut sum = e.bin(Op::Power {}, q, ns)?;
    for k in 1..10 {
        let qk = e.addk(q, k as f64)?;
        let p = e.bin(Op::Power {}, qk, ns)?;
        sum = e.add(sum, p)?;
    }
    let a = e.addk(q, 10.0)?;
    let pa = e.bin(Op::Power {}, a, ns)?;
    // a^(1-s) / (s - 1) + a^-s (½ + (s/a) Σ_j B_2j/(2j)! (s+1)...(s+2j-2) / a^(2j-2)).
    let sm1 = e.addk(s, -1.0)?;
    let paa = e.mul(pa, a)?;
    let t1 = e.div(paa, sm1)?;
    let one = e.k(1.0)?;
    let w = e.div(one, a)?;
    let w2 = e.mul(w, w)?;
    let c = bernoulli_over_factorial();
    let mut h = e.k(c[11])?;
    for j in (1..12).rev() {
        // Term j+1 over term j: (s + 2j - 1)(s + 2j) / a².
        let u = e.addk(s, (2 * j - 1) as f64)?;
        let v = e.addk(s, (2 * j) as f64)?;
        let uv = e.mul(u, v)?;
        let f = e.mul(uv, w2)?;
        let fh = e.mul(f, h)?;
        h = e.addk(fh, c[j - 1])?;
    }
    let sw = e.mul(s, w)?;
    let swh = e.mul(sw, h)?;
    let inner = e.addk(swh, 0.5)?;
    let t2 = e.mul(pa, inner)?;
    let tail = e.add(t1, t2)?;
    let full = e.add(sum, tail)?;
    // A tail below the sum's last bit is left out (its factors may overflow for large s).
    let apa = e.un(Op::Abs {}, pa)?;
    let asum = e.un(Op::Abs {}, sum)?;
    let tiny = e.mulk(asum, f64::EPSILON)?;
    let negligible = e.cmp(Dir::Lt, apa, tiny)?;
    let mut r = e.select(negligible, sum, full)?;
    let at1 = e.cmpk(Dir::Eq, s, 1.0)?;
    r = e.selk(at1, f64::INFINITY, r)?;
    let below1 = e.cmpk(Dir::Lt, s, 1.0)?;
    r = e.selk(below1, f64::NAN, r)?;
    let q_le0 = e.cmpk(Dir::Le, q, 0.0)?;
    let s_int = e.is_int(s)?;
    let s_frac = e.un(Op::Not {}, s_int)?;
    let domain = e.and(q_le0, s_frac)?;
    r = e.selk(domain, f64::NAN, r)?;
    // Outside the expansion: a non-integer q at or below -1.
    let q_int = e.is_int(q)?;
    let q_frac = e.un(Op::Not {}, q_int)?;
    let q_low = e.cmpk(Dir::Le, q, -1.0)?;
    let outside = e.and(q_low, q_frac)?;
    r = e.selk(outside, f64::NAN, r)?;
    // Poles at integer q ≤ 0: inf for even s, NaN otherwise.
    let pole = e.and(q_le0, q_int)?;
    let two = e.k(2.0)?;
    let rem = e.bin(Op::Remainder {}, s, two)?;
    let even = e.cmpk(Dir::Eq, rem, 0.0)?;
    let even_int = e.and(even, s_int)?;
    let inf = e.k(f64::INFINITY)?;
    let nan = e.k(f64::NAN)?;
    let at_pole = e.select(even_int, inf, nan)?;
    e.select(pole, at_pole, r)
}

/// `polygamma(n, x)`.
fn polygamma(e: &mut Expr, n: ValueId, x: ValueId) -> Result<ValueId> {
    let n1 = e.addk(n, 1.0)?;
    let lf = lgamma(e, n1)?;
    let fact = e.un(Op::Exponential {}, lf)?;
    let z = zeta(e, n1, x)?;
    let two = e.k(2.0)?;
    let rem = e.bin(Op::Remainder {}, n, two)?;
    let r2 = e.mul(two, rem)?;
    let sign = e.addk(r2, -1.0)?;
    let sf = e.mul(sign, fact)?;
    let higher = e.mul(sf, z)?;
    let d = digamma(e, x)?;
    let n0 = e.cmpk(Dir::Eq, n, 0.0)?;
    let r = e.select(n0, d, higher)?;
    let int = e.is_int(n)?;
    let not_int = e.un(Op::Not {}, int)?;
    let neg = e.cmpk(Dir::Lt, n, 0.0)?;
    let inf = e.cmpk(Dir::Eq, n, f64::INFINITY)?;
    let bad = e.or(not_int, neg)?;
    let bad = e.or(bad, inf)?;
    e.selk(bad, f64::NAN, r)
}

/// `bessel_i1e(x) = e^-|x| I₁(x)`.
fn bessel_i1e(e: &mut Expr, x: ValueId) -> Result<ValueId> {
    /// Where the asymptotic series takes over.
    const FAR: f64 = 30.0;
    let ax = e.un(Op::Abs {}, x)?;
    // I₁(x) = (x/2) Σ_k (x²/4)^k / (k! (k+1)!), Horner in t = x²/4.
    let hx = e.mulk(ax, 0.5)?;
    let t = e.mul(hx, hx)?;
    let mut coef = Vec::new();
    let mut c = 1.0f64;
    for k in 0..46 {
        if k > 0 {
            c /= k as f64 * (k + 1) as f64;
        }
        coef.push(c);
    }
    coef.reverse();
    let series = e.poly(t, &coef)?;
    let i1 = e.mul(hx, series)?;
    let nax = e.un(Op::Negate {}, ax)?;
    let ex = e.un(Op::Exponential {}, nax)?;
    let near = e.mul(i1, ex)?;
    // e^-x I₁(x) ~ (2πx)^-½ Σ_k (-1)^k a_k / x^k, a_k = Π_{j≤k} (4 - (2j-1)²) / (k! 8^k).
    let mut a = vec![1.0f64];
    for k in 1..26 {
        let j = (2 * k - 1) as f64;
        let prev = a[k - 1];
        a.push(-prev * (4.0 - j * j) / (8.0 * k as f64));
    }
    a.reverse();
    let one = e.k(1.0)?;
    let safe = e.bin(Op::Maximum {}, ax, one)?;
    let w = e.div(one, safe)?;
    let p = e.poly(w, &a)?;
    let tpx = e.mulk(safe, 2.0 * PI)?;
    let rs = e.un(Op::Rsqrt {}, tpx)?;
    let far = e.mul(rs, p)?;
    let is_near = e.cmpk(Dir::Lt, ax, FAR)?;
    let v = e.select(is_near, near, far)?;
    let sign = e.un(Op::Sign {}, x)?;
    e.mul(sign, v)
}

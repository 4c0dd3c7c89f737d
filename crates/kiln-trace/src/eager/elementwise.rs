//! Elementwise ops: arithmetic, functions, comparisons, `select`, `clamp`, conversions and
//! `iota`, on every dtype. Each element is the reference's: its per-element function
//! (`kiln_reference::scalar`) on the operands widened to f64 (floats) or i64 (integers, `pred`),
//! converted back as the reference converts. Float addition, subtraction, multiplication,
//! division, maximum, minimum, negation and absolute value on f32 and f64 are computed in the
//! dtype itself, which gives the same bits: rounding the exact result once (here) or the f64
//! result again (the reference) agree for these operations, as 53 >= 2 * 24 + 2.

use super::{Elem, par_chunks, par_collect, vectorized, with_elem, with_float};
use kiln_ir::literal::convert_f64;
use kiln_ir::{ComparisonDirection, DType, Data, Literal, Op, TensorType};
use kiln_reference::scalar;

/// The cost (about nanoseconds per element) of a loop calling a function of the C library
/// (`exp`, `tanh`, ... in f64), and of one doing a few instructions.
const LIBM: usize = 20;
const CHEAP: usize = 1;

/// `op` on `lits` elementwise, with result type `ty`; `None` when it is not an elementwise op
/// this module computes.
pub(super) fn run(op: &Op, lits: &[&Literal], ty: &TensorType) -> Option<Data> {
    let n = ty.numel();
    // Operands of the result's length, or single values (at least one of the result's length
    // when the result has more than one element).
    if lits.iter().any(|l| l.numel() != n && l.numel() != 1)
        || (n > 1 && !lits.is_empty() && lits.iter().all(|l| l.numel() != n))
    {
        return None;
    }
    let d = lits.first().map(|l| l.dtype());
    match (op, lits) {
        (Op::Iota { iota_dimension }, []) => iota(ty, usize::try_from(*iota_dimension).ok()?),
        (
            Op::Compare {
                comparison_direction,
            },
            [a, b],
        ) => compare(*comparison_direction, a, b),
        (Op::Select {}, [p, a, b]) => select(p, a, b),
        (Op::Clamp {}, [lo, x, hi]) => clamp(lo, x, hi),
        (Op::Convert {}, [a]) => Some(with_elem!(ty.dtype, R => R::data(convert::<R>(a)?))),
        (Op::IsFinite {}, [a]) => {
            with_elem!(a.dtype(), T => Some(Data::Pred(map1(T::slice(a.data())?, CHEAP, |x: T| x.f64().is_finite())?)))
        }
        (_, [a, b]) if a.numel() == n && b.numel() == n && Some(b.dtype()) == d => binary(op, a, b),
        // One operand a single value for every element (`x * 2.0`, `x.gt(&zero)`): read as it
        // is, never broadcast into a buffer of the result's size first.
        (_, [a, b]) if Some(b.dtype()) == d && (a.numel() == 1 || b.numel() == 1) => {
            binary(op, a, b)
        }
        (_, [a]) if a.numel() == n => unary(op, a),
        _ => None,
    }
}

/// `p - g * s` elementwise, `p` and `g` of one float dtype and length and `s` a value of
/// that dtype, in one pass: each element the two ops' (the product rounded to the dtype, then
/// the difference), so the same bits as `subtract(p, multiply(g, s))`.
pub(super) fn sub_scaled(p: &Literal, g: &Literal, s: f64) -> Option<Data> {
    if p.dtype() != g.dtype() || p.numel() != g.numel() {
        return None;
    }
    // Two ops' work per element.
    let c = 2 * CHEAP;
    match (p.data(), g.data()) {
        (Data::F32(x), Data::F32(y)) => {
            let s = s as f32;
            map2(x, y, c, |a: f32, b: f32| a - b * s).map(Data::F32)
        }
        (Data::F64(x), Data::F64(y)) => map2(x, y, c, |a: f64, b: f64| a - b * s).map(Data::F64),
        _ => {
            with_float!(p.dtype(), T => T::data(map2(T::slice(p.data())?, T::slice(g.data())?, c, |a: T, b: T| {
            T::from_f64(a.f64() - T::from_f64(b.f64() * s).f64())
        })?))
        }
    }
}

/// [`sub_scaled`] written into `p` (`f32` and `f64` only): whether it was.
pub(super) fn sub_scaled_in_place(p: &mut Literal, g: &Literal, s: f64) -> bool {
    if p.dtype() != g.dtype() || p.numel() != g.numel() {
        return false;
    }
    let c = 2 * CHEAP;
    match (g.data(), p.dtype()) {
        (Data::F32(y), DType::F32) => {
            let s = s as f32;
            p.f32s_mut()
                .is_some_and(|x| update2(x, y, c, |a: f32, b: f32| a - b * s))
        }
        (Data::F64(y), DType::F64) => p
            .f64s_mut()
            .is_some_and(|x| update2(x, y, c, |a: f64, b: f64| a - b * s)),
        _ => false,
    }
}

/// Each element `x` of `a` replaced by `f(x, y)`, `y` the element of `b` at its index (of one
/// length): whether they were.
fn update2<A: Elem, B: Elem>(
    a: &mut [A],
    b: &[B],
    cost: usize,
    f: impl Fn(A, B) -> A + Sync,
) -> bool {
    if b.len() != a.len() {
        return false;
    }
    let work = a.len() * cost;
    par_chunks(a, 1, work, |s, chunk| {
        vectorized(|| {
            for (x, &y) in chunk.iter_mut().zip(&b[s..]) {
                *x = f(*x, y);
            }
        })
    });
    true
}

/// `f` on each element of `a`.
fn map1<A: Elem, R: Elem>(a: &[A], cost: usize, f: impl Fn(A) -> R + Sync) -> Option<Vec<R>> {
    par_collect(a.len(), 1, a.len() * cost, |s, chunk| {
        vectorized(|| {
            for (o, &x) in chunk.iter_mut().zip(&a[s..]) {
                o.write(f(x));
            }
        })
    })
}

/// `f` on each pair of elements of `a` and `b` (of one length).
fn map2<A: Elem, B: Elem, R: Elem>(
    a: &[A],
    b: &[B],
    cost: usize,
    f: impl Fn(A, B) -> R + Sync,
) -> Option<Vec<R>> {
    // Every output element must be written (`par_collect`).
    if b.len() != a.len() {
        return None;
    }
    par_collect(a.len(), 1, a.len() * cost, |s, chunk| {
        vectorized(|| {
            for ((o, &x), &y) in chunk.iter_mut().zip(&a[s..]).zip(&b[s..]) {
                o.write(f(x, y));
            }
        })
    })
}

/// `f(i, x)` on each element `x` of `a` at index `i`.
fn map_indexed<A: Elem, R: Elem>(
    a: &[A],
    cost: usize,
    f: impl Fn(usize, A) -> R + Sync,
) -> Option<Vec<R>> {
    par_collect(a.len(), 1, a.len() * cost, |s, chunk| {
        vectorized(|| {
            for (i, (o, &x)) in chunk.iter_mut().zip(&a[s..]).enumerate() {
                o.write(f(s + i, x));
            }
        })
    })
}

/// An operand of a binary loop: the elements of a tensor of the result's length, or one value
/// that every element of the result reads.
#[derive(Clone, Copy)]
enum Arg<'a, T> {
    All(&'a [T]),
    One(T),
}

impl<'a, T: Copy> Arg<'a, T> {
    /// The operand's elements: one value, or all of them.
    fn of(v: &'a [T]) -> Arg<'a, T> {
        match v {
            [x] => Arg::One(*x),
            _ => Arg::All(v),
        }
    }
}

/// `f` on each pair of elements of `a` and `b` (of one length, or one value each side's
/// elements are paired with). A result of one element is two single values.
fn zip2<A: Elem, B: Elem, R: Elem>(
    a: Arg<'_, A>,
    b: Arg<'_, B>,
    cost: usize,
    f: impl Fn(A, B) -> R + Sync,
) -> Option<Vec<R>> {
    match (a, b) {
        (Arg::All(x), Arg::All(y)) => map2(x, y, cost, f),
        (Arg::All(x), Arg::One(y)) => map1(x, cost, |v| f(v, y)),
        (Arg::One(x), Arg::All(y)) => map1(y, cost, |v| f(x, v)),
        (Arg::One(x), Arg::One(y)) => Some(vec![f(x, y)]),
    }
}

/// Element `i` of `v`, a scalar or a tensor of the result's shape.
fn at<T: Copy>(v: &[T], i: usize) -> T {
    if v.len() == 1 { v[0] } else { v[i] }
}

/// The cost per element of an op, by whether it calls the C library.
fn cost(op: &Op) -> usize {
    if super::compiles_when_reused(op) {
        LIBM
    } else {
        CHEAP
    }
}

/// `op` on `a` and `b` of one dtype: each of the result's length, or one of them a single
/// value.
fn binary(op: &Op, a: &Literal, b: &Literal) -> Option<Data> {
    let d = a.dtype();
    if let Some(data) = match (a.data(), b.data()) {
        (Data::F32(x), Data::F32(y)) => binary_f32(op, Arg::of(x), Arg::of(y)).map(Data::F32),
        (Data::F64(x), Data::F64(y)) => binary_f64(op, Arg::of(x), Arg::of(y)).map(Data::F64),
        _ => None,
    } {
        return Some(data);
    }
    if d.is_float() {
        let f = scalar::float_binary(op)?;
        let c = cost(op);
        return with_float!(d, T => T::data(zip2(Arg::of(T::slice(a.data())?), Arg::of(T::slice(b.data())?), c, |x: T, y: T| T::from_f64(f(x.f64(), y.f64())))?));
    }
    if !scalar::is_int_binary(op) {
        return None;
    }
    Some(
        with_elem!(d, T => T::data(zip2(Arg::of(T::slice(a.data())?), Arg::of(T::slice(b.data())?), CHEAP, |x: T, y: T| T::from_i64(scalar::int_binary(op, d, x.i64(), y.i64())))?)),
    )
}

fn unary(op: &Op, a: &Literal) -> Option<Data> {
    let d = a.dtype();
    if let Some(data) = match a.data() {
        Data::F32(x) => unary_f32(op, x).map(Data::F32),
        Data::F64(x) => unary_f64(op, x).map(Data::F64),
        _ => None,
    } {
        return Some(data);
    }
    if d.is_float() {
        let c = cost(op);
        return with_float!(d, T => {
            let x = T::slice(a.data())?;
            // The reference's functions; the cheap ones inlined (vectorized), the others
            // called.
            T::data(match op {
                Op::Sqrt {} => map1(x, c, |v: T| T::from_f64(v.f64().sqrt()))?,
                Op::Rsqrt {} => map1(x, c, |v: T| T::from_f64(1.0 / v.f64().sqrt()))?,
                Op::Floor {} => map1(x, c, |v: T| T::from_f64(v.f64().floor()))?,
                Op::Ceil {} => map1(x, c, |v: T| T::from_f64(v.f64().ceil()))?,
                Op::RoundNearestAfz {} => map1(x, c, |v: T| T::from_f64(v.f64().round()))?,
                _ => {
                    let f = scalar::float_unary(op)?;
                    map1(x, c, |v: T| T::from_f64(f(v.f64())))?
                }
            })
        });
    }
    if !scalar::is_int_unary(op) {
        return None;
    }
    Some(
        with_elem!(d, T => T::data(map1(T::slice(a.data())?, CHEAP, |x: T| T::from_i64(scalar::int_unary(op, d, x.i64())))?)),
    )
}

/// `compare` of `a` and `b` of one dtype: each of the result's length, or one of them a
/// single value.
fn compare(dir: ComparisonDirection, a: &Literal, b: &Literal) -> Option<Data> {
    if a.dtype() != b.dtype() || (a.numel() != b.numel() && a.numel() != 1 && b.numel() != 1) {
        return None;
    }
    let float = a.dtype().is_float();
    // A u64 travels as its bits in an i64: compared widened to i128 from its unsigned value.
    let u64 = a.dtype() == DType::U64;
    let out = with_elem!(a.dtype(), T => {
        let (x, y) = (Arg::of(T::slice(a.data())?), Arg::of(T::slice(b.data())?));
        if float {
            compare_as(dir, x, y, T::f64)?
        } else if u64 {
            compare_as(dir, x, y, |v: T| v.i64() as u64 as i128)?
        } else {
            compare_as(dir, x, y, T::i64)?
        }
    });
    Some(Data::Pred(out))
}

/// `compare` of the elements of `x` and `y` as `w` widens them (as the reference's
/// `scalar::compare_f` and `compare_i` compare f64 and i64), one loop per direction.
fn compare_as<T: Elem, W: PartialOrd>(
    dir: ComparisonDirection,
    x: Arg<'_, T>,
    y: Arg<'_, T>,
    w: impl Fn(T) -> W + Sync,
) -> Option<Vec<bool>> {
    use ComparisonDirection::*;
    match dir {
        Eq => zip2(x, y, CHEAP, |p, q| w(p) == w(q)),
        Ne => zip2(x, y, CHEAP, |p, q| w(p) != w(q)),
        Lt => zip2(x, y, CHEAP, |p, q| w(p) < w(q)),
        Le => zip2(x, y, CHEAP, |p, q| w(p) <= w(q)),
        Gt => zip2(x, y, CHEAP, |p, q| w(p) > w(q)),
        Ge => zip2(x, y, CHEAP, |p, q| w(p) >= w(q)),
    }
}

fn select(p: &Literal, a: &Literal, b: &Literal) -> Option<Data> {
    let Data::Pred(p) = p.data() else { return None };
    // The values of the result's length (a single value of either is broadcast by the caller).
    if a.dtype() != b.dtype() || a.numel() != b.numel() || (p.len() != 1 && p.len() != a.numel()) {
        return None;
    }
    if let [p] = p[..] {
        return Some(if p { a } else { b }.data().clone());
    }
    Some(with_elem!(a.dtype(), T => {
        let (x, y) = (T::slice(a.data())?, T::slice(b.data())?);
        T::data(map_indexed(x, CHEAP, |i, x: T| if p[i] { x } else { y[i] })?)
    }))
}

fn clamp(lo: &Literal, x: &Literal, hi: &Literal) -> Option<Data> {
    let d = x.dtype();
    // `x` of the result's length (the bounds may be single values).
    if lo.dtype() != d || hi.dtype() != d || x.numel() < lo.numel().max(hi.numel()) {
        return None;
    }
    Some(with_elem!(d, T => {
        let (l, v, h) = (T::slice(lo.data())?, T::slice(x.data())?, T::slice(hi.data())?);
        let out = if d.is_float() {
            map_indexed(v, CHEAP, |i, x: T| {
                T::from_f64(scalar::nan_min(scalar::nan_max(x.f64(), at(l, i).f64()), at(h, i).f64()))
            })?
        } else {
            map_indexed(v, CHEAP, |i, x: T| {
                T::from_i64(scalar::int_min(d, scalar::int_max(d, x.i64(), at(l, i).i64()), at(h, i).i64()))
            })?
        };
        T::data(out)
    }))
}

/// `a` converted to `R`: floats to floats rounded to nearest, floats to integers truncated
/// (saturating, NaN to 0), integers wrapped, `pred` as `x != 0`.
fn convert<R: Elem>(a: &Literal) -> Option<Vec<R>> {
    let (from, to) = (a.dtype(), R::DTYPE);
    if let (Data::F32(x), true) = (a.data(), to.is_float()) {
        // Rounding an f32 once: as from its exact f64 value, and faster for f16 and bf16.
        return map1(x, CHEAP, R::from_f32);
    }
    with_elem!(from, T => {
        let x = T::slice(a.data())?;
        if from.is_float() && to.is_float() {
            map1(x, CHEAP, |x: T| R::from_f64(x.f64()))
        } else if from.is_float() {
            map1(x, CHEAP, |x: T| R::from_i64(convert_f64(to, x.f64())))
        } else if to.is_float() {
            // Through the integer's f64 value, as the reference converts (a u64's unsigned).
            map1(x, CHEAP, |x: T| R::from_f64(x.f64()))
        } else {
            map1(x, CHEAP, |x: T| R::from_i64(x.i64()))
        }
    })
}

/// `iota` along dimension `dim` of `ty`.
fn iota(ty: &TensorType, dim: usize) -> Option<Data> {
    let size = *ty.shape.get(dim)?;
    let stride: usize = ty.shape[dim + 1..].iter().product();
    let n = ty.numel();
    Some(
        with_elem!(ty.dtype, T => T::data(par_collect(n, 1, n, |s, chunk| {
        for (i, o) in chunk.iter_mut().enumerate() {
            o.write(T::from_i64(((s + i) / stride % size) as i64));
        }
    })?)),
    )
}

macro_rules! float_kernels {
    ($t:ty, $binary:ident, $unary:ident) => {
        /// The binary ops computed in the dtype itself; `None` for the others.
        fn $binary(op: &Op, x: Arg<'_, $t>, y: Arg<'_, $t>) -> Option<Vec<$t>> {
            match op {
                Op::Add {} => zip2(x, y, CHEAP, |a: $t, b: $t| a + b),
                Op::Subtract {} => zip2(x, y, CHEAP, |a: $t, b: $t| a - b),
                Op::Multiply {} => zip2(x, y, CHEAP, |a: $t, b: $t| a * b),
                Op::Divide {} => zip2(x, y, CHEAP, |a: $t, b: $t| a / b),
                // StableHLO's maximum and minimum: NaN if either is, and +0 above -0.
                Op::Maximum {} => zip2(x, y, CHEAP, |a: $t, b: $t| {
                    if a.is_nan() || b.is_nan() {
                        <$t>::NAN
                    } else if a == b {
                        if a.is_sign_negative() { b } else { a }
                    } else if a > b {
                        a
                    } else {
                        b
                    }
                }),
                Op::Minimum {} => zip2(x, y, CHEAP, |a: $t, b: $t| {
                    if a.is_nan() || b.is_nan() {
                        <$t>::NAN
                    } else if a == b {
                        if a.is_sign_negative() { a } else { b }
                    } else if a < b {
                        a
                    } else {
                        b
                    }
                }),
                _ => None,
            }
        }

        /// The unary ops computed in the dtype itself; `None` for the others.
        fn $unary(op: &Op, x: &[$t]) -> Option<Vec<$t>> {
            match op {
                Op::Negate {} => map1(x, CHEAP, |a: $t| -a),
                Op::Abs {} => map1(x, CHEAP, |a: $t| a.abs()),
                _ => None,
            }
        }
    };
}
float_kernels!(f32, binary_f32, unary_f32);
float_kernels!(f64, binary_f64, unary_f64);

//! Type promotion: the dtype a binary operation on two dtypes computes in.
//!
//! kiln follows JAX's promotion lattice (with 64-bit types enabled), restricted to kiln's
//! dtypes, and treats Rust scalars as *weakly typed*, as JAX treats Python scalars:
//!
//! ```text
//! pred ─> i2 ──> i4 ──> i8 ──> i16 ──> i32 ──> i64 ─┐
//!   └───> u2 ─┴> u4 ─┴> u8 ─┴> u16 ─┴> u32 ─┴> u64  ├─> f16 ─┐
//!                                                   └─> bf16 ┴─> f32 ─> f64
//!                                                                  │      │
//!                                                                  └> c64 ┴> c128
//! ```
//!
//! (The sub-byte integers `i2`, `i4`, `u2`, `u4` are leaves in JAX's lattice, reached only from
//! `pred` and weak scalars: JAX refuses `int4 + int8` for want of an implicit promotion path.
//! kiln, whose promotion never fails, puts them below the byte types by the same rules as the
//! other widths: `i4 + i8` is `i8`, `u4 + i4` is `i8`, `u2 + i2` is `i4`, `i4 + f16` is `f16`.)
//!
//! (Each unsigned type also lies below the signed type twice its width: `u8 + i8` is `i16`,
//! `u32 + i32` is `i64`. No integer holds both `u64` and a signed type: that pair is `f64`, as
//! in NumPy and in JAX with 64-bit types on. It is the one pair whose result is not the least
//! upper bound in the lattice: `(u64 + i8) + f16` is `f64` but `u64 + (i8 + f16)` is `f16`.)
//!
//! - Two dtypes promote to their least upper bound in this lattice: `i8 + i32` is `i32`,
//!   `u32 + i32` is `i64`, any integer with any float is that float, `f16 + bf16` is `f32`,
//!   a complex type with a real one is the complex type of their parts' join (`c64 + f64` is
//!   `c128`, `c64 + i64` is `c64`).
//! - An `f64` Rust scalar (`&x * 1.5`) is a weak float: it takes a float tensor's dtype
//!   (`bf16 * 1.5` stays bf16) and makes an integer or `pred` tensor `f32` (`i32 + 1.5` is
//!   `f32`, 2.5 for 1, never the truncated 2).
//! - An `i32` Rust scalar (`&x + 1`) is a weak integer: it takes the tensor's dtype, except that
//!   `pred` becomes `i32`.
//! - True division (`/`, [`Tensor::div`](crate::Tensor::div)), `mean` and the transcendental
//!   functions compute in floats: integer and `pred` operands become `f32` (JAX's and PyTorch's
//!   default float), so `mean` of integers is never truncated.
//! - Nothing narrows silently: a lossy conversion is an explicit
//!   [`Tensor::cast`](crate::Tensor::cast).
//!
//! (The small floats `f8e4m3fn` ... `f4e2m1fn` are reached from `pred`, the integers and weak
//! scalars, as in JAX: `i8 + f8e4m3fn` is `f8e4m3fn`. JAX has no promotion from them to other
//! floats; kiln, whose promotion never fails, puts them beside `f16` and `bf16`: two different
//! floats of that rank meet in `f32`, which holds every small float's values, so
//! `f8e4m3fn + f8e5m2` and `f8e4m3fn + bf16` are `f32`.)
//!
//! `docs/dtype-promotion.md` has the whole table; `tests` check every pair.

use kiln_ir::DType;

/// The dtype that `a` and `b` promote to (their least upper bound in the lattice above).
///
/// # Examples
///
/// ```
/// use kiln_trace::promote::promote_types;
/// use kiln_ir::DType;
/// assert_eq!(promote_types(DType::I8, DType::I32), DType::I32);
/// assert_eq!(promote_types(DType::U32, DType::I32), DType::I64);
/// assert_eq!(promote_types(DType::F16, DType::BF16), DType::F32);
/// assert_eq!(promote_types(DType::I64, DType::F16), DType::F16);
/// ```
pub fn promote_types(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    match (a, b) {
        (Pred, x) | (x, Pred) => x,
        (x, y) if x.is_complex() || y.is_complex() => {
            // The complex type whose parts hold both (a complex one's parts, a real one).
            if promote_types(x.part(), y.part()) == F64 {
                C128
            } else {
                C64
            }
        }
        // Two different floats below f32 (f16, bf16, the small floats) meet in f32.
        (x, y) if x.is_float() && y.is_float() && float_rank(x).0 == 0 && float_rank(y).0 == 0 => {
            F32
        }
        (x, y) if x.is_float() && y.is_float() => float_rank(x).max(float_rank(y)).1,
        (x, y) if x.is_float() || y.is_float() => {
            if x.is_float() {
                x
            } else {
                y
            }
        }
        (x, y) => int_join(x, y),
    }
}

/// The join of two integer dtypes: the wider of two of one signedness; a signed and an unsigned
/// one meet in the signed type that holds both (the signed one if it is wider, else the signed
/// type twice the unsigned one's width), and `u64` with a signed type in `f64`.
fn int_join(a: DType, b: DType) -> DType {
    let wider = |x: DType, y: DType| if x.bits() >= y.bits() { x } else { y };
    if a.is_signed() == b.is_signed() {
        return wider(a, b);
    }
    let (s, u) = if a.is_signed() { (a, b) } else { (b, a) };
    if s.bits() > u.bits() {
        return s;
    }
    match u.bits() {
        2 => DType::I4,
        4 => DType::I8,
        8 => DType::I16,
        16 => DType::I32,
        32 => DType::I64,
        _ => DType::F64,
    }
}

/// Floats in lattice order (f16, bf16 and the small floats share a rank below f32; their
/// join is handled apart).
fn float_rank(d: DType) -> (u8, DType) {
    match d {
        DType::F16 | DType::BF16 | DType::Mini(_) => (0, d),
        DType::F32 => (1, d),
        _ => (2, d),
    }
}

/// The dtype a weakly typed float scalar takes next to a tensor of dtype `d`.
///
/// # Examples
///
/// ```
/// use kiln_trace::promote::weak_float;
/// use kiln_ir::DType;
/// assert_eq!(weak_float(DType::BF16), DType::BF16);
/// assert_eq!(weak_float(DType::I32), DType::F32);
/// ```
pub fn weak_float(d: DType) -> DType {
    if d.is_float() || d.is_complex() {
        d
    } else {
        DType::F32
    }
}

/// The dtype a weakly typed integer scalar takes next to a tensor of dtype `d`.
///
/// # Examples
///
/// ```
/// use kiln_trace::promote::weak_int;
/// use kiln_ir::DType;
/// assert_eq!(weak_int(DType::U8), DType::U8);
/// assert_eq!(weak_int(DType::Pred), DType::I32);
/// ```
pub fn weak_int(d: DType) -> DType {
    if d == DType::Pred { DType::I32 } else { d }
}

/// The float dtype that floating-point functions of `d` compute in: `d` itself for floats and
/// complex types, `f32` for integers and `pred`.
///
/// # Examples
///
/// ```
/// use kiln_trace::promote::inexact;
/// use kiln_ir::DType;
/// assert_eq!((inexact(DType::F64), inexact(DType::I64)), (DType::F64, DType::F32));
/// ```
pub fn inexact(d: DType) -> DType {
    weak_float(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promotion_is_a_join() {
        for a in DType::ALL {
            for b in DType::ALL {
                let j = promote_types(a, b);
                assert_eq!(j, promote_types(b, a), "commutative: {a} {b}");
                assert_eq!(promote_types(a, j), j, "an upper bound: {a} {b} -> {j}");
                assert_eq!(promote_types(b, j), j, "an upper bound: {a} {b} -> {j}");
                for c in DType::ALL {
                    if u64_with_signed(a, b, c) {
                        continue;
                    }
                    assert_eq!(
                        promote_types(promote_types(a, b), c),
                        promote_types(a, promote_types(b, c)),
                        "associative: {a} {b} {c}"
                    );
                }
            }
        }
    }

    /// Whether `u64` and a signed integer are among three dtypes together with a float below
    /// `f64`: the one place where promotion is not associative (the module's docs).
    fn u64_with_signed(a: DType, b: DType, c: DType) -> bool {
        let ds = [a, b, c];
        ds.contains(&U64)
            && ds.iter().any(|d| d.is_int() && d.is_signed())
            && ds.iter().any(|&d| d.is_float() && d != F64 || d == C64)
    }

    #[test]
    fn the_table_of_jax() {
        let cases = [
            (Pred, I32, I32),
            (I8, I32, I32),
            (I8, I64, I64),
            (U32, I8, I64),
            (U8, I8, I16),
            (U8, I16, I16),
            (U16, I8, I32),
            (U16, I16, I32),
            (U16, U32, U32),
            (I16, I32, I32),
            (U64, U8, U64),
            (U64, U32, U64),
            (U64, I8, F64),
            (U64, I64, F64),
            (U64, F16, F16),
            (C64, F64, C128),
            (C64, I64, C64),
            (F16, C64, C64),
            (C128, F32, C128),
            (U64, C64, C64),
            (Pred, C128, C128),
            (I16, BF16, BF16),
            (U8, U32, U32),
            (U8, I64, I64),
            (U8, F16, F16),
            (Pred, U8, U8),
            (U32, I32, I64),
            (U32, I64, I64),
            (I64, F16, F16),
            (U32, BF16, BF16),
            (F16, BF16, F32),
            (BF16, F32, F32),
            (F32, F64, F64),
            (Pred, F16, F16),
            (Pred, I4, I4),
            (I2, I4, I4),
            (I4, I8, I8),
            (U4, U8, U8),
            (U2, U4, U4),
            (U4, I4, I8),
            (U2, I2, I4),
            (U2, I8, I8),
            (U4, I16, I16),
            (I4, U8, I16),
            (I4, U64, F64),
            (I4, F16, F16),
            (U2, BF16, BF16),
        ];
        for (a, b, j) in cases {
            assert_eq!(promote_types(a, b), j, "{a} + {b}");
        }
        assert_eq!(weak_float(I32), F32);
        assert_eq!(weak_float(BF16), BF16);
        assert_eq!(weak_int(Pred), I32);
        assert_eq!(weak_int(U32), U32);
        assert_eq!(weak_int(I4), I4);
        assert_eq!(weak_float(U2), F32);
    }
}

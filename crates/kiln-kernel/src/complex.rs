//! Complex numbers as pairs of real values, so that the real kernels compute them.
//!
//! [`split_complex`] runs before lowering and fusion. Every complex value `z` of the program
//! becomes two values of its part type, `re(z)` and `im(z)`, and every op on complex values
//! that has a rewrite below becomes real ops on the parts:
//!
//! - `add`, `subtract`, `negate`, `select`, the layout ops (`broadcast_in_dim`, `reshape`,
//!   `transpose`, `slice`, `reverse`, `pad`, `concatenate`, `dynamic_slice`,
//!   `dynamic_update_slice`, `gather`), `reduce` and `reduce_window` with `add`, and `scatter`
//!   with `add` or `replace`: the same op on each part;
//! - `multiply`: (ac - bd) + i(ad + bc); `dot_general`: four real products, the same sums;
//! - `divide`: Smith's scaled division (the larger part of the divisor divides first, so no
//!   square of it overflows), and a division by 0 as each part divided by |0|, as the
//!   reference does;
//! - `abs`: |z| = m sqrt(1 + (n / m)²) with m and n the larger and smaller magnitude of the
//!   parts (no overflow), 0 at 0 and infinite when a part is;
//! - `log`: ln|z| + i atan2(b, a); `sine` and `cosine`: sin a cosh b + i cos a sinh b and
//!   cos a cosh b - i sin a sinh b, with cosh and sinh from `exponential_minus_one` (accurate
//!   for small b);
//! - `exponential`, `exponential_minus_one`, `log_plus_one`, `sqrt`, `rsqrt`, `cbrt`, `tan`,
//!   `tanh`, `sign`, `logistic`, `power`, `atan2`, and `reduce` with `multiply` (a tree of
//!   complex products): the reference's formulas with its special values, in
//!   `complex_math.rs`;
//! - `real`, `imag`, `complex`, `compare` (`EQ`: both parts equal; `NE`: either differs),
//!   `convert` (to a real type: the real part; from one: imaginary part 0), constants, `iota`
//!   (the count in the part type, imaginary parts 0).
//!
//! The program's parameters and results keep their interleaved layout (real part, then
//! imaginary part, as StableHLO and NumPy store complex numbers): a complex parameter is
//! bitcast to its part type with a last dimension of 2 and sliced into its parts; a complex
//! result is joined back the same way. `while`, `case` and `sort` with complex carries,
//! operands or results take and give the parts instead, their regions rewritten to match
//! (`complex_regions.rs`); a `map` or a reduction's region of elementwise ops was expanded
//! before the split. Those bitcasts keep their complex operand or result, and compile to byte
//! copies (`lower.rs`): a complex tensor in memory is its part type with a trailing dimension
//! of 2, so nothing complex is computed. Every op without a rewrite here (`reduce_window` and
//! `scatter` with `multiply`, a region that is not expanded, ...) keeps its complex operands
//! and results too: the parts are joined before it and split after it, and lowering runs it
//! on the reference interpreter. `triangular_solve` on complex operands
//! also keeps them: it runs as the runtime's host step, which solves complex systems with the
//! reference's substitution (there is no compiled complex solve).

use crate::complex_math::Math;
use kiln_ir::{
    Builder, Combiner, ComparisonDirection, DType, Func, Inst, Literal, Op, TensorType, ValueId,
    VerifyError,
};
use std::collections::HashMap;

type R<T> = Result<T, VerifyError>;

/// A value of the rewritten program: a real one, or the parts of a complex one.
#[derive(Clone, Copy, Debug)]
pub(crate) enum V {
    Real(ValueId),
    Pair(ValueId, ValueId),
}

/// `f` with its complex values computed as pairs of real ones (see the module docs); `f` itself
/// when it has no complex value and no `real`, `imag` or `complex` (which on real operands are
/// rewritten too: `real` is its operand, `imag` zeros).
pub fn split_complex(f: &Func) -> R<Func> {
    let parts_op = |i: &Inst| matches!(i.op, Op::Real {} | Op::Imag {} | Op::Complex {});
    if !f.values.iter().any(|t| t.dtype.is_complex()) && !f.insts.iter().any(parts_op) {
        return Ok(f.clone());
    }
    let mut b = Builder::new(&f.name);
    let mut map: Vec<Option<V>> = vec![None; f.values.len()];
    let mut whole = Whole::new();
    for &p in &f.params {
        let ty = &f.values[p.index()];
        let v = b.param(ty.clone());
        map[p.index()] = Some(if ty.dtype.is_complex() {
            unpack(&mut b, &mut whole, v, ty)?
        } else {
            V::Real(v)
        });
    }
    // What is built for one instruction has its location (or none); the parameters' split and
    // the results' join belong to no instruction and have none.
    b.locate_from(0, None);
    for inst in &f.insts {
        let first = b.inst_count();
        let ops: Vec<V> = inst
            .operands
            .iter()
            .map(|o| map[o.index()].expect("verified SSA"))
            .collect();
        let tys: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let involved = inst
            .operands
            .iter()
            .map(|o| &f.values[o.index()])
            .chain(&tys)
            .any(|t| t.dtype.is_complex())
            || matches!(inst.op, Op::Real {} | Op::Imag {} | Op::Complex {});
        let rewritten = if involved {
            let xs: Vec<TensorType> = inst
                .operands
                .iter()
                .map(|o| f.values[o.index()].clone())
                .collect();
            match crate::complex_regions::rewrite_region_op(&mut b, inst, &ops, &xs, &tys)? {
                Some(vs) => Some(vs),
                None => rewrite(&mut b, inst, &ops, &xs, &tys[0])?.map(|v| vec![v]),
            }
        } else {
            None
        };
        let results = match rewritten {
            Some(vs) => vs,
            None => {
                // Kept as it is: complex operands joined, complex results split.
                let mut args = Vec::with_capacity(ops.len());
                for (&v, o) in ops.iter().zip(&inst.operands) {
                    args.push(join(&mut b, &mut whole, v, &f.values[o.index()])?);
                }
                let outs = b.push_at(inst.op.clone(), &args, Some(&tys), inst.loc)?;
                let mut vs = Vec::with_capacity(outs.len());
                for (o, t) in outs.into_iter().zip(&tys) {
                    vs.push(if t.dtype.is_complex() {
                        unpack(&mut b, &mut whole, o, t)?
                    } else {
                        V::Real(o)
                    });
                }
                vs
            }
        };
        for (&r, v) in inst.results.iter().zip(results) {
            map[r.index()] = Some(v);
        }
        b.locate_from(first, inst.loc);
    }
    let first = b.inst_count();
    let mut outs = Vec::with_capacity(f.outputs.len());
    for &o in &f.outputs {
        let v = map[o.index()].expect("verified SSA");
        outs.push(join(&mut b, &mut whole, v, &f.values[o.index()])?);
    }
    b.locate_from(first, None);
    // Parts split and never used (a parameter's imaginary part when only its real part is
    // read) go.
    Ok(kiln_ir::eliminate_dead_code(&b.finish(&outs)?))
}

/// The complex value each pair of parts was split from, so that joining them again reuses it.
type Whole = HashMap<(ValueId, ValueId), ValueId>;

/// The parts of the complex value `v` of type `ty`: its bitcast to the part type with a last
/// dimension of 2, sliced.
fn unpack(b: &mut Builder, whole: &mut Whole, v: ValueId, ty: &TensorType) -> R<V> {
    let part = ty.dtype.part();
    let mut shape2 = ty.shape.clone();
    shape2.push(2);
    let bits = b.inst_typed(
        Op::BitcastConvert {},
        &[v],
        TensorType::new(part, shape2.clone()),
    )?;
    let r = ty.rank();
    let mut take = |k: i64| -> R<ValueId> {
        let mut start = vec![0; r + 1];
        let mut limit: Vec<i64> = shape2.iter().map(|&d| d as i64).collect();
        start[r] = k;
        limit[r] = k + 1;
        let s = b.inst(
            Op::Slice {
                start_indices: start,
                limit_indices: limit,
                strides: vec![1; r + 1],
            },
            &[bits],
        )?;
        b.reshape(s, &ty.shape)
    };
    let (re, im) = (take(0)?, take(1)?);
    whole.insert((re, im), v);
    Ok(V::Pair(re, im))
}

/// The value `v` as a value of type `ty`: a pair joined into a complex value (its parts
/// side by side in a last dimension of 2, bitcast), a real value itself.
fn join(b: &mut Builder, whole: &mut Whole, v: V, ty: &TensorType) -> R<ValueId> {
    let V::Pair(re, im) = v else {
        return Ok(real(v));
    };
    if let Some(&z) = whole.get(&(re, im)) {
        return Ok(z);
    }
    let mut shape1 = ty.shape.clone();
    shape1.push(1);
    let re = b.reshape(re, &shape1)?;
    let im = b.reshape(im, &shape1)?;
    let both = b.inst(
        Op::Concatenate {
            dimension: ty.rank() as i64,
        },
        &[re, im],
    )?;
    let z = b.inst_typed(Op::BitcastConvert {}, &[both], ty.clone())?;
    whole.insert((re, im), z);
    Ok(z)
}

fn real(v: V) -> ValueId {
    match v {
        V::Real(x) => x,
        V::Pair(..) => unreachable!("a complex value where a real one is expected"),
    }
}

/// The parts of `v`: a real value's imaginary part is 0 of its type.
pub(crate) fn parts(b: &mut Builder, v: V) -> R<(ValueId, ValueId)> {
    match v {
        V::Pair(re, im) => Ok((re, im)),
        V::Real(x) => {
            let ty = b.ty(x).expect("defined").clone();
            let zero = b.full(&ty, 0.0)?;
            Ok((x, zero))
        }
    }
}

/// The rewrite of one instruction with a complex operand or result into real ops, or `None`
/// when it has none (the instruction is then kept, on complex values).
fn rewrite(
    b: &mut Builder,
    inst: &Inst,
    ops: &[V],
    xs: &[TensorType],
    out: &TensorType,
) -> R<Option<V>> {
    let part_ty = out.with_dtype(out.dtype.part());
    let bin = |b: &mut Builder, op: Op, x: ValueId, y: ValueId| b.binary(op, x, y);
    let same_on_parts = |b: &mut Builder, ops: &[V]| -> R<Option<V>> {
        // The op on the real parts, then on the imaginary parts; real operands (indices) as
        // they are.
        let pick = |k: usize| -> Vec<ValueId> {
            ops.iter()
                .map(|v| match *v {
                    V::Pair(re, im) => [re, im][k],
                    V::Real(x) => x,
                })
                .collect()
        };
        let tys = [part_ty.clone()];
        let re = b.push_at(inst.op.clone(), &pick(0), Some(&tys), inst.loc)?[0];
        let im = b.push_at(inst.op.clone(), &pick(1), Some(&tys), inst.loc)?[0];
        Ok(Some(V::Pair(re, im)))
    };
    Ok(Some(match &inst.op {
        Op::Real {} => V::Real(parts(b, ops[0])?.0),
        Op::Imag {} => V::Real(parts(b, ops[0])?.1),
        Op::Complex {} => V::Pair(real(ops[0]), real(ops[1])),
        Op::Constant { value } => {
            let z = value.to_complex_f64s();
            let lit = |k: usize| {
                let v: Vec<f64> = z.iter().map(|c| c[k]).collect();
                Literal::from_f64s(part_ty.clone(), &v).expect("the parts have the part type")
            };
            let re = b.inst(Op::Constant { value: lit(0) }, &[])?;
            let im = b.inst(Op::Constant { value: lit(1) }, &[])?;
            V::Pair(re, im)
        }
        Op::Add {} | Op::Subtract {} => {
            let ((a, c), (p, q)) = (parts(b, ops[0])?, parts(b, ops[1])?);
            V::Pair(
                bin(b, inst.op.clone(), a, p)?,
                bin(b, inst.op.clone(), c, q)?,
            )
        }
        Op::Negate {} => {
            let (a, c) = parts(b, ops[0])?;
            V::Pair(b.unary(Op::Negate {}, a)?, b.unary(Op::Negate {}, c)?)
        }
        Op::Multiply {} => {
            let (x, y) = (parts(b, ops[0])?, parts(b, ops[1])?);
            let (re, im) = mul(b, x, y)?;
            V::Pair(re, im)
        }
        Op::Divide {} => {
            let (x, y) = (parts(b, ops[0])?, parts(b, ops[1])?);
            let (re, im) = div(b, x, y, &part_ty)?;
            V::Pair(re, im)
        }
        Op::Abs {} => {
            let (a, c) = parts(b, ops[0])?;
            V::Real(hypot(b, a, c, &part_ty)?)
        }
        Op::Exponential {}
        | Op::ExponentialMinusOne {}
        | Op::LogPlusOne {}
        | Op::Sqrt {}
        | Op::Rsqrt {}
        | Op::Cbrt {}
        | Op::Tan {}
        | Op::Tanh {}
        | Op::Sign {}
        | Op::Logistic {} => {
            let z = parts(b, ops[0])?;
            let mut m = Math {
                b,
                ty: part_ty.clone(),
            };
            let (re, im) = match &inst.op {
                Op::Exponential {} => m.exp(z)?,
                Op::ExponentialMinusOne {} => m.expm1(z)?,
                Op::LogPlusOne {} => m.log1p(z)?,
                Op::Sqrt {} => m.sqrt(z)?,
                Op::Rsqrt {} => m.rsqrt(z)?,
                Op::Cbrt {} => m.cbrt(z)?,
                Op::Tan {} => m.tan(z)?,
                Op::Tanh {} => m.tanh(z)?,
                Op::Sign {} => m.sign(z)?,
                _ => m.logistic(z)?,
            };
            V::Pair(re, im)
        }
        Op::Power {} | Op::Atan2 {} => {
            // Both amplify their operands' rounding (a power by |w ln z|, atan2 near its
            // branch points), so a `c64` one computes on f64 parts and rounds once at the end,
            // as the reference does.
            let wide = if part_ty.dtype == DType::F32 {
                DType::F64
            } else {
                part_ty.dtype
            };
            let widen = |b: &mut Builder, v: V| -> R<(ValueId, ValueId)> {
                let (re, im) = parts(b, v)?;
                if wide == part_ty.dtype {
                    return Ok((re, im));
                }
                Ok((b.convert(re, wide)?, b.convert(im, wide)?))
            };
            let (x, y) = (widen(b, ops[0])?, widen(b, ops[1])?);
            let mut m = Math {
                b,
                ty: part_ty.with_dtype(wide),
            };
            let (re, im) = if matches!(inst.op, Op::Power {}) {
                m.power(x, y)?
            } else {
                m.atan2(x, y)?
            };
            if wide == part_ty.dtype {
                V::Pair(re, im)
            } else {
                V::Pair(b.convert(re, part_ty.dtype)?, b.convert(im, part_ty.dtype)?)
            }
        }
        Op::Reduce {
            kind: Combiner::Mul,
            dimensions,
        } if out.dtype.is_complex() => {
            let (v, init) = (parts(b, ops[0])?, parts(b, ops[1])?);
            let mut m = Math {
                b,
                ty: part_ty.clone(),
            };
            let (re, im) = m.reduce_mul(v, init, dimensions, &xs[0].shape)?;
            V::Pair(re, im)
        }
        Op::Sine {} | Op::Cosine {} => {
            // sin(a + ib) = sin a cosh b + i cos a sinh b;
            // cos(a + ib) = cos a cosh b - i sin a sinh b.
            let (a, c) = parts(b, ops[0])?;
            let (cosh, sinh) = cosh_sinh(b, c, &part_ty)?;
            let sin = b.unary(Op::Sine {}, a)?;
            let cos = b.unary(Op::Cosine {}, a)?;
            if matches!(inst.op, Op::Sine {}) {
                V::Pair(
                    bin(b, Op::Multiply {}, sin, cosh)?,
                    bin(b, Op::Multiply {}, cos, sinh)?,
                )
            } else {
                let im = bin(b, Op::Multiply {}, sin, sinh)?;
                V::Pair(
                    bin(b, Op::Multiply {}, cos, cosh)?,
                    b.unary(Op::Negate {}, im)?,
                )
            }
        }
        Op::Log {} => {
            let z = parts(b, ops[0])?;
            let (re, im) = Math {
                b,
                ty: part_ty.clone(),
            }
            .log(z)?;
            V::Pair(re, im)
        }
        Op::Compare {
            comparison_direction: dir,
        } => {
            let ((a, c), (p, q)) = (parts(b, ops[0])?, parts(b, ops[1])?);
            let re = b.compare(a, p, *dir)?;
            let im = b.compare(c, q, *dir)?;
            let both = if *dir == ComparisonDirection::Eq {
                Op::And {}
            } else {
                Op::Or {}
            };
            V::Real(bin(b, both, re, im)?)
        }
        Op::Maximum {} | Op::Minimum {} => {
            // StableHLO's lexicographic order of (real, imaginary): lhs when it comes after
            // (maximum) or before (minimum) rhs, else rhs.
            let ((a, c), (p, q)) = (parts(b, ops[0])?, parts(b, ops[1])?);
            let ((a1, c1), (a2, c2)) = if matches!(inst.op, Op::Maximum {}) {
                ((a, c), (p, q))
            } else {
                ((p, q), (a, c))
            };
            let re_gt = b.compare(a1, a2, ComparisonDirection::Gt)?;
            let re_eq = b.compare(a1, a2, ComparisonDirection::Eq)?;
            let im_gt = b.compare(c1, c2, ComparisonDirection::Gt)?;
            let tie_im = bin(b, Op::And {}, re_eq, im_gt)?;
            let first = bin(b, Op::Or {}, re_gt, tie_im)?;
            V::Pair(b.select(first, a, p)?, b.select(first, c, q)?)
        }
        // Counting up the real axis: the count in the part type, and zeros.
        Op::Iota { .. } if out.dtype.is_complex() => {
            let re = b.inst_typed(inst.op.clone(), &[], part_ty.clone())?;
            V::Pair(re, b.full(&part_ty, 0.0)?)
        }
        Op::Select {} => {
            let p = real(ops[0]);
            let ((a, c), (x, y)) = (parts(b, ops[1])?, parts(b, ops[2])?);
            V::Pair(b.select(p, a, x)?, b.select(p, c, y)?)
        }
        Op::Convert {} => {
            let (a, c) = parts(b, ops[0])?;
            let from = xs[0].dtype;
            let conv = |b: &mut Builder, v: ValueId, to: DType| {
                if b.ty(v).is_some_and(|t| t.dtype == to) {
                    Ok(v)
                } else {
                    b.convert(v, to)
                }
            };
            if !out.dtype.is_complex() {
                V::Real(conv(b, a, out.dtype)?)
            } else if from.is_complex() {
                V::Pair(conv(b, a, part_ty.dtype)?, conv(b, c, part_ty.dtype)?)
            } else {
                let re = conv(b, a, part_ty.dtype)?;
                V::Pair(re, b.full(&part_ty, 0.0)?)
            }
        }
        Op::DotGeneral { .. } => {
            let ((a, c), (p, q)) = (parts(b, ops[0])?, parts(b, ops[1])?);
            let dot = |b: &mut Builder, x: ValueId, y: ValueId| {
                b.inst_typed(inst.op.clone(), &[x, y], part_ty.clone())
            };
            let (ap, cq, aq, cp) = (dot(b, a, p)?, dot(b, c, q)?, dot(b, a, q)?, dot(b, c, p)?);
            V::Pair(
                bin(b, Op::Subtract {}, ap, cq)?,
                bin(b, Op::Add {}, aq, cp)?,
            )
        }
        Op::BroadcastInDim { .. }
        | Op::Reshape {}
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Reverse { .. }
        | Op::Pad { .. }
        | Op::Concatenate { .. }
        | Op::DynamicSlice { .. }
        | Op::DynamicUpdateSlice {}
        | Op::Gather { .. }
            if out.dtype.is_complex() =>
        {
            return same_on_parts(b, ops);
        }
        Op::Reduce {
            kind: Combiner::Add,
            ..
        }
        | Op::ReduceWindow {
            kind: Combiner::Add,
            ..
        }
        | Op::Scatter {
            kind: Combiner::Add | Combiner::Replace,
            ..
        } if out.dtype.is_complex() => return same_on_parts(b, ops),
        _ => return Ok(None),
    }))
}

/// cosh b and sinh b from e^b - 1 and e^-b - 1: cosh b = 1 + (u + v) / 2, sinh b = (u - v) / 2
/// with u = expm1(b), v = expm1(-b), so that sinh keeps its relative accuracy near 0.
pub(crate) fn cosh_sinh(b: &mut Builder, x: ValueId, ty: &TensorType) -> R<(ValueId, ValueId)> {
    let u = b.unary(Op::ExponentialMinusOne {}, x)?;
    let nx = b.unary(Op::Negate {}, x)?;
    let v = b.unary(Op::ExponentialMinusOne {}, nx)?;
    let half = b.full(ty, 0.5)?;
    let one = b.full(ty, 1.0)?;
    let sum = b.binary(Op::Add {}, u, v)?;
    let sum = b.binary(Op::Multiply {}, sum, half)?;
    let cosh = b.binary(Op::Add {}, one, sum)?;
    let diff = b.binary(Op::Subtract {}, u, v)?;
    let sinh = b.binary(Op::Multiply {}, diff, half)?;
    Ok((cosh, sinh))
}

/// (a + ib)(c + id) = (ac - bd) + i(ad + bc).
pub(crate) fn mul(
    b: &mut Builder,
    (a, c): (ValueId, ValueId),
    (p, q): (ValueId, ValueId),
) -> R<(ValueId, ValueId)> {
    let ap = b.binary(Op::Multiply {}, a, p)?;
    let cq = b.binary(Op::Multiply {}, c, q)?;
    let aq = b.binary(Op::Multiply {}, a, q)?;
    let cp = b.binary(Op::Multiply {}, c, p)?;
    Ok((
        b.binary(Op::Subtract {}, ap, cq)?,
        b.binary(Op::Add {}, aq, cp)?,
    ))
}

/// The exponent `k` by which [`scale_tiny`] scales parts of dtype `d`, and the bound below
/// which it does, 2^(emin + p) (`p` the significand's bits): 48 and 2^-102 for f32 parts, 108
/// and 2^-969 for f64 (`k` even and a multiple of 3, so a square or cube root scales back
/// exactly).
pub(crate) fn tiny_exponent(d: DType) -> (i32, f64) {
    if d == DType::F64 {
        (108, 2f64.powi(-969))
    } else {
        (48, 2f64.powi(-102))
    }
}

/// `(a, c)` scaled by 2^k (exactly, [`tiny_exponent`]) where both parts are below the bound:
/// subnormal or near it, where halving, hypot's product or Smith's quotients would round in
/// the subnormal range and lose the significand's bits (√ of 2^-149 + 0i came out NaN, the
/// logarithm at 2^-149 (1 + i) off by 0.35). Returns where, the scaled parts and `k`.
pub(crate) fn scale_tiny(
    b: &mut Builder,
    (a, c): (ValueId, ValueId),
    ty: &TensorType,
) -> R<(ValueId, (ValueId, ValueId), i32)> {
    let (k, bound) = tiny_exponent(ty.dtype);
    let x = b.unary(Op::Abs {}, a)?;
    let y = b.unary(Op::Abs {}, c)?;
    let m = b.binary(Op::Maximum {}, x, y)?;
    let lim = b.full(ty, bound)?;
    let tiny = b.compare(m, lim, ComparisonDirection::Lt)?;
    let s = pow2_where(b, tiny, k, ty)?;
    let a = b.binary(Op::Multiply {}, a, s)?;
    let c = b.binary(Op::Multiply {}, c, s)?;
    Ok((tiny, (a, c), k))
}

/// 2^e where `p`, else 1.
pub(crate) fn pow2_where(b: &mut Builder, p: ValueId, e: i32, ty: &TensorType) -> R<ValueId> {
    let s = b.full(ty, 2f64.powi(e))?;
    let one = b.full(ty, 1.0)?;
    b.select(p, s, one)
}

/// Smith's division (p + iq) / (c + id), as the reference's `complex::div` computes it: a
/// numerator or divisor with both parts tiny ([`scale_tiny`]) scaled up first, and the
/// quotient by the ratio of the scales.
pub(crate) fn div(
    b: &mut Builder,
    num: (ValueId, ValueId),
    den: (ValueId, ValueId),
    ty: &TensorType,
) -> R<(ValueId, ValueId)> {
    let (num_tiny, (p, q), k) = scale_tiny(b, num, ty)?;
    let (den_tiny, (c, d), _) = scale_tiny(b, den, ty)?;
    let (re, im) = smith(b, (p, q), (c, d))?;
    let up = pow2_where(b, den_tiny, k, ty)?;
    let down = pow2_where(b, num_tiny, -k, ty)?;
    let f = b.binary(Op::Multiply {}, up, down)?;
    let re = b.binary(Op::Multiply {}, re, f)?;
    let im = b.binary(Op::Multiply {}, im, f)?;
    // A zero divisor: each part divided by |c| (+0).
    let ((p, q), (c, d)) = (num, den);
    let zero = b.full(ty, 0.0)?;
    let c0 = b.compare(c, zero, ComparisonDirection::Eq)?;
    let d0 = b.compare(d, zero, ComparisonDirection::Eq)?;
    let by_zero = b.binary(Op::And {}, c0, d0)?;
    let ac = b.unary(Op::Abs {}, c)?;
    let pz = b.binary(Op::Divide {}, p, ac)?;
    let qz = b.binary(Op::Divide {}, q, ac)?;
    Ok((b.select(by_zero, pz, re)?, b.select(by_zero, qz, im)?))
}

/// Smith's quotient (p + iq) / (c + id) of a divisor not zero: the larger part of the
/// divisor divides first.
fn smith(
    b: &mut Builder,
    (p, q): (ValueId, ValueId),
    (c, d): (ValueId, ValueId),
) -> R<(ValueId, ValueId)> {
    let (mul_, add, sub, divide) = (
        |b: &mut Builder, x, y| b.binary(Op::Multiply {}, x, y),
        |b: &mut Builder, x, y| b.binary(Op::Add {}, x, y),
        |b: &mut Builder, x, y| b.binary(Op::Subtract {}, x, y),
        |b: &mut Builder, x, y| b.binary(Op::Divide {}, x, y),
    );
    let ac = b.unary(Op::Abs {}, c)?;
    let ad = b.unary(Op::Abs {}, d)?;
    let c_first = b.compare(ac, ad, ComparisonDirection::Ge)?;
    // |c| >= |d|: r = d / c, t = c + d r, ((p + q r) / t, (q - p r) / t).
    let r1 = divide(b, d, c)?;
    let dr = mul_(b, d, r1)?;
    let t1 = add(b, c, dr)?;
    let qr = mul_(b, q, r1)?;
    let pr = mul_(b, p, r1)?;
    let n1 = add(b, p, qr)?;
    let m1 = sub(b, q, pr)?;
    let re1 = divide(b, n1, t1)?;
    let im1 = divide(b, m1, t1)?;
    // |c| < |d|: r = c / d, t = c r + d, ((p r + q) / t, (q r - p) / t).
    let r2 = divide(b, c, d)?;
    let cr = mul_(b, c, r2)?;
    let t2 = add(b, cr, d)?;
    let pr2 = mul_(b, p, r2)?;
    let qr2 = mul_(b, q, r2)?;
    let n2 = add(b, pr2, q)?;
    let m2 = sub(b, qr2, p)?;
    let re2 = divide(b, n2, t2)?;
    let im2 = divide(b, m2, t2)?;
    Ok((b.select(c_first, re1, re2)?, b.select(c_first, im1, im2)?))
}

/// |a + ib| without overflow: m sqrt(1 + (n / m)²), m and n the larger and smaller of |a|
/// and |b|; 0 when both are 0, infinite when either is (even with a NaN beside it).
pub(crate) fn hypot(b: &mut Builder, a: ValueId, c: ValueId, ty: &TensorType) -> R<ValueId> {
    let x = b.unary(Op::Abs {}, a)?;
    let y = b.unary(Op::Abs {}, c)?;
    let m = b.binary(Op::Maximum {}, x, y)?;
    let n = b.binary(Op::Minimum {}, x, y)?;
    let r = b.binary(Op::Divide {}, n, m)?;
    let rr = b.binary(Op::Multiply {}, r, r)?;
    let one = b.full(ty, 1.0)?;
    let s = b.binary(Op::Add {}, one, rr)?;
    let s = b.unary(Op::Sqrt {}, s)?;
    let h = b.binary(Op::Multiply {}, m, s)?;
    let zero = b.full(ty, 0.0)?;
    let at_zero = b.compare(m, zero, ComparisonDirection::Eq)?;
    let h = b.select(at_zero, zero, h)?;
    let inf = b.full(ty, f64::INFINITY)?;
    let xi = b.compare(x, inf, ComparisonDirection::Eq)?;
    let yi = b.compare(y, inf, ComparisonDirection::Eq)?;
    let any_inf = b.binary(Op::Or {}, xi, yi)?;
    b.select(any_inf, inf, h)
}

//! The VJP rule of every op, in one exhaustive `match`. Each arm states the rule from the op's
//! spec (`ir-specs/ops/<op>.md`) and builds it from other ops of the IR, so the result can be
//! differentiated again.

use crate::{Error, Result};
use kiln_ir::verify::window_output_size;
use kiln_ir::{
    Builder, Combiner, ComparisonDirection as Cmp, DType, Literal, Op, TensorType, ValueId,
};

fn ty(b: &Builder, v: ValueId) -> TensorType {
    b.ty(v).expect("rules only see defined values").clone()
}

fn zeros_like(b: &mut Builder, v: ValueId) -> Result<ValueId> {
    let t = ty(b, v);
    Ok(b.full(&t, 0.0)?)
}

fn bin(b: &mut Builder, op: Op, x: ValueId, y: ValueId) -> Result<ValueId> {
    Ok(b.binary(op, x, y)?)
}

fn un(b: &mut Builder, op: Op, x: ValueId) -> Result<ValueId> {
    Ok(b.unary(op, x)?)
}

fn mul(b: &mut Builder, x: ValueId, y: ValueId) -> Result<ValueId> {
    bin(b, Op::Multiply {}, x, y)
}

/// `x * c` for a constant `c`.
fn scale(b: &mut Builder, x: ValueId, c: f64) -> Result<ValueId> {
    let t = ty(b, x);
    let k = b.full(&t, c)?;
    mul(b, x, k)
}

/// `select(p, g, 0)`.
fn mask(b: &mut Builder, p: ValueId, g: ValueId) -> Result<ValueId> {
    let z = zeros_like(b, g)?;
    Ok(b.select(p, g, z)?)
}

/// Sums `g` (of `shape`) down to a scalar when `target` is a scalar, for scalar operands of
/// select-like ops.
fn sum_to(b: &mut Builder, g: ValueId, target: &TensorType) -> Result<ValueId> {
    let t = ty(b, g);
    if target.rank() == 0 && t.rank() > 0 {
        Ok(b.sum(g, &(0..t.rank() as i64).collect::<Vec<_>>())?)
    } else {
        Ok(g)
    }
}

fn int_list_const(b: &mut Builder, dtype: DType, values: &[i64]) -> Result<ValueId> {
    let value =
        Literal::from_i64s(TensorType::new(dtype, [values.len()]), values).expect("sizes match");
    Ok(b.inst(Op::Constant { value }, &[])?)
}

/// Clamps each index vector component k of `idx` into [lo[k], hi[k]], then adds `shift[k]`.
fn clamp_indices(
    b: &mut Builder,
    idx: ValueId,
    ivd: usize,
    lo: &[i64],
    hi: &[i64],
    shift: &[i64],
) -> Result<ValueId> {
    let t = ty(b, idx);
    let along = |b: &mut Builder, v: &[i64]| -> Result<ValueId> {
        let c = int_list_const(b, t.dtype, v)?;
        if ivd == t.rank() {
            let s = b.reshape(c, &[])?;
            Ok(b.broadcast(s, &[], &t.shape)?)
        } else {
            Ok(b.broadcast(c, &[ivd as i64], &t.shape)?)
        }
    };
    let (l, h, s) = (along(b, lo)?, along(b, hi)?, along(b, shift)?);
    let c = b.inst(Op::Clamp {}, &[l, idx, h])?;
    bin(b, Op::Add {}, c, s)
}

/// The gradient flowing to each operand of `op`, given its operands `x`, results `r` and the
/// cotangents `g` of its results (`None`: zero). Non-float operands get `None`.
pub fn vjp_rule(
    b: &mut Builder,
    op: &Op,
    x: &[ValueId],
    r: &[ValueId],
    g: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    let unsupported = |why: &str| Err(Error::Unsupported(format!("`{}`: {why}", op.mnemonic())));
    if matches!(op, Op::OptimizationBarrier {}) {
        // operands_bar = optimization_barrier(results_bar); missing cotangents are zeros.
        let gs: Vec<ValueId> = g
            .iter()
            .zip(r)
            .map(|(gi, &ri)| gi.map_or_else(|| zeros_like(b, ri), Ok))
            .collect::<Result<_>>()?;
        return Ok(b
            .push(Op::OptimizationBarrier {}, &gs)?
            .into_iter()
            .map(Some)
            .collect());
    }
    if let Op::While { cond, body } = op {
        return loops::while_vjp(b, cond, body, x, r, g);
    }
    if let Op::Case { branches } = op {
        return case_vjp(b, branches, x, r, g);
    }
    if let Op::Call { callee } = op {
        // The callee's forward instructions again, then its backward pass.
        let Some(f) = &callee.func else {
            return unsupported(&format!("callee @{} is not resolved", callee.name));
        };
        let wrt: Vec<usize> = (0..x.len())
            .filter(|&k| ty(b, x[k]).dtype.is_float())
            .collect();
        let (_, grads) = crate::vjp_into(b, f, x, g, &wrt)?;
        let mut out = vec![None; x.len()];
        for (&k, gk) in wrt.iter().zip(grads) {
            out[k] = Some(gk);
        }
        return Ok(out);
    }
    if let Op::Sort {
        dimension,
        is_stable,
        comparator,
    } = op
    {
        return sort::sort_vjp(b, *dimension, *is_stable, comparator, x, g);
    }
    if let Op::Map {
        dimensions,
        computation,
    } = op
    {
        return map_vjp(b, dimensions, computation, x, g[0]);
    }
    if let Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } = op {
        // Results with no cotangent (an argmax's indices, values nobody differentiates) need
        // no rule.
        if g.iter()
            .zip(r)
            .all(|(gi, &ri)| gi.is_none() || !ty(b, ri).dtype.is_float())
        {
            return Ok(vec![None; x.len()]);
        }
        // The reduction again as maps of the body (a tree, or the window's fold), then its
        // backward pass.
        let types: Vec<TensorType> = x.iter().map(|&v| ty(b, v)).collect();
        let again = match op {
            Op::ReduceRegion { dimensions, .. } => {
                reduce_region::as_tree(body, dimensions, &types)?
            }
            _ => reduce_region::as_window_fold(op, body, &types, &ty(b, r[0]).shape)?,
        };
        let wrt: Vec<usize> = (0..x.len())
            .filter(|&k| types[k].dtype.is_float())
            .collect();
        let (_, grads) = crate::vjp_into(b, &again, x, g, &wrt)?;
        let mut out = vec![None; x.len()];
        for (&k, gk) in wrt.iter().zip(grads) {
            out[k] = Some(gk);
        }
        return Ok(out);
    }
    if let Op::Lu {} = op {
        return Ok(vec![linalg::lu_vjp(b, r, g[0])?]);
    }
    if collective::handles(op) {
        return collective::vjp(b, op, x, r, g);
    }
    let g = g[0].expect("single-result ops are only visited with a cotangent");
    let r = r[0];
    let one = |v| Ok(vec![Some(v)]);
    match op {
        // lhs_bar = g; rhs_bar = g.
        Op::Add {} => Ok(vec![Some(g), Some(g)]),
        // a_bar = Φ(s + sᵀ), s = l⁻ᵀ Φ(lᵀ g) l⁻¹ (see `linalg`).
        Op::Cholesky { lower } => one(linalg::cholesky_vjp(b, *lower, r, g)?),
        // b_bar solves the transposed system; a_bar = -b_bar xᵀ on a's triangle.
        Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        } => {
            let attrs = (*left_side, *lower, *unit_diagonal, *transpose_a);
            let (ga, gb) = linalg::triangular_solve_vjp(b, attrs, x[0], r, g)?;
            Ok(vec![Some(ga), Some(gb)])
        }
        // lhs_bar = g; rhs_bar = -g.
        Op::Subtract {} => Ok(vec![Some(g), Some(un(b, Op::Negate {}, g)?)]),
        // lhs_bar = g * rhs; rhs_bar = g * lhs.
        Op::Multiply {} => Ok(vec![Some(mul(b, g, x[1])?), Some(mul(b, g, x[0])?)]),
        // lhs_bar = g / rhs; rhs_bar = -(g * result) / rhs.
        Op::Divide {} => {
            let gx = bin(b, Op::Divide {}, g, x[1])?;
            let gr = mul(b, g, r)?;
            let q = bin(b, Op::Divide {}, gr, x[1])?;
            Ok(vec![Some(gx), Some(un(b, Op::Negate {}, q)?)])
        }
        // lhs_bar = g; rhs_bar = -g * trunc(lhs / rhs).
        Op::Remainder {} => {
            let q = bin(b, Op::Divide {}, x[0], x[1])?;
            let s = un(b, Op::Sign {}, q)?;
            let a = un(b, Op::Abs {}, q)?;
            let fl = un(b, Op::Floor {}, a)?;
            let t = mul(b, s, fl)?;
            let gt = mul(b, g, t)?;
            Ok(vec![Some(g), Some(un(b, Op::Negate {}, gt)?)])
        }
        // lhs_bar = g where lhs wins, rhs_bar = g elsewhere; ties send the gradient to rhs, so
        // relu = maximum(x, 0) has gradient 0 at 0. "lhs wins" is read off the result
        // (maximum(x, y) > y exactly when x > y, NaN included), so the backward pass needs the
        // result, which it keeps anyway, and not lhs: a product feeding a ReLU then has one
        // reader and the ReLU runs as its epilogue.
        Op::Maximum {} | Op::Minimum {} => {
            let dir = if matches!(op, Op::Maximum {}) {
                Cmp::Gt
            } else {
                Cmp::Lt
            };
            let p = b.compare(r, x[1], dir)?;
            let z = zeros_like(b, g)?;
            Ok(vec![Some(b.select(p, g, z)?), Some(b.select(p, z, g)?)])
        }
        // lhs_bar = g * rhs * lhs^(rhs-1); rhs_bar = g * result * log(lhs) where lhs > 0.
        Op::Power {} => {
            let t = ty(b, x[1]);
            let onev = b.full(&t, 1.0)?;
            let ym1 = bin(b, Op::Subtract {}, x[1], onev)?;
            let p = bin(b, Op::Power {}, x[0], ym1)?;
            let yp = mul(b, x[1], p)?;
            let gx = mul(b, g, yp)?;
            let zero = zeros_like(b, x[0])?;
            let pos = b.compare(x[0], zero, Cmp::Gt)?;
            let safe = b.select(pos, x[0], onev)?;
            let l = un(b, Op::Log {}, safe)?;
            let rl = mul(b, r, l)?;
            let grl = mul(b, g, rl)?;
            Ok(vec![Some(gx), Some(mask(b, pos, grl)?)])
        }
        Op::Negate {} => one(un(b, Op::Negate {}, g)?),
        Op::Abs {} => {
            let s = un(b, Op::Sign {}, x[0])?;
            one(mul(b, g, s)?)
        }
        // Piecewise constant: zero almost everywhere.
        Op::Sign {}
        | Op::Floor {}
        | Op::Ceil {}
        | Op::RoundNearestAfz {}
        | Op::RoundNearestEven {} => one(zeros_like(b, x[0])?),
        // A straight-through estimator, as in JAX (which also rounds the cotangent): the
        // rounding is treated as the identity, so gradients reach what it rounds.
        Op::ReducePrecision { .. } => one(g),
        // lhs_bar = g * rhs / (lhs² + rhs²); rhs_bar = -g * lhs / (lhs² + rhs²).
        Op::Atan2 {} => {
            let yy = mul(b, x[0], x[0])?;
            let xx = mul(b, x[1], x[1])?;
            let d = bin(b, Op::Add {}, yy, xx)?;
            let gd = bin(b, Op::Divide {}, g, d)?;
            let gy = mul(b, gd, x[1])?;
            let gx = mul(b, gd, x[0])?;
            Ok(vec![Some(gy), Some(un(b, Op::Negate {}, gx)?)])
        }
        // g * (1 + result²).
        Op::Tan {} => {
            let rr = mul(b, r, r)?;
            let t = ty(b, r);
            let onev = b.full(&t, 1.0)?;
            let d = bin(b, Op::Add {}, onev, rr)?;
            one(mul(b, g, d)?)
        }
        // g / (3 result²).
        Op::Cbrt {} => {
            let rr = mul(b, r, r)?;
            let d = scale(b, rr, 3.0)?;
            one(bin(b, Op::Divide {}, g, d)?)
        }
        Op::Exponential {} => one(mul(b, g, r)?),
        Op::Log {} => one(bin(b, Op::Divide {}, g, x[0])?),
        Op::LogPlusOne {} => {
            let t = ty(b, x[0]);
            let onev = b.full(&t, 1.0)?;
            let d = bin(b, Op::Add {}, x[0], onev)?;
            one(bin(b, Op::Divide {}, g, d)?)
        }
        Op::ExponentialMinusOne {} => {
            let t = ty(b, r);
            let onev = b.full(&t, 1.0)?;
            let e = bin(b, Op::Add {}, r, onev)?;
            one(mul(b, g, e)?)
        }
        // g / (2 sqrt(x)).
        Op::Sqrt {} => {
            let gh = scale(b, g, 0.5)?;
            one(bin(b, Op::Divide {}, gh, r)?)
        }
        // g * (-0.5) * result / x.
        Op::Rsqrt {} => {
            let q = bin(b, Op::Divide {}, r, x[0])?;
            let gq = mul(b, g, q)?;
            one(scale(b, gq, -0.5)?)
        }
        // g * (1 - result^2).
        Op::Tanh {} => {
            let rr = mul(b, r, r)?;
            let t = ty(b, r);
            let onev = b.full(&t, 1.0)?;
            let d = bin(b, Op::Subtract {}, onev, rr)?;
            one(mul(b, g, d)?)
        }
        // g * result * (1 - result).
        Op::Logistic {} => {
            let t = ty(b, r);
            let onev = b.full(&t, 1.0)?;
            let d = bin(b, Op::Subtract {}, onev, r)?;
            let rd = mul(b, r, d)?;
            one(mul(b, g, rd)?)
        }
        Op::Sine {} => {
            let c = un(b, Op::Cosine {}, x[0])?;
            one(mul(b, g, c)?)
        }
        Op::Cosine {} => {
            let s = un(b, Op::Sine {}, x[0])?;
            let gs = mul(b, g, s)?;
            one(un(b, Op::Negate {}, gs)?)
        }
        // g * 2/sqrt(pi) * exp(-x^2).
        Op::Erf {} => {
            let xx = mul(b, x[0], x[0])?;
            let n = un(b, Op::Negate {}, xx)?;
            let e = un(b, Op::Exponential {}, n)?;
            let ge = mul(b, g, e)?;
            one(scale(b, ge, std::f64::consts::FRAC_2_SQRT_PI)?)
        }
        Op::Select {} => {
            let z = zeros_like(b, g)?;
            Ok(vec![
                None,
                Some(b.select(x[0], g, z)?),
                Some(b.select(x[0], z, g)?),
            ])
        }
        // result = minimum(maximum(operand, min), max); the gradient goes to max where
        // maximum(operand, min) > max, else to operand where operand >= min, else to min
        // (ties go to the operand).
        Op::Clamp {} => {
            let vt = ty(b, x[1]);
            let full = |b: &mut Builder, v: ValueId| -> Result<ValueId> {
                if ty(b, v).rank() == 0 && vt.rank() > 0 {
                    Ok(b.broadcast(v, &[], &vt.shape)?)
                } else {
                    Ok(v)
                }
            };
            let (lo, hi) = (full(b, x[0])?, full(b, x[2])?);
            let m = bin(b, Op::Maximum {}, x[1], lo)?;
            let to_hi = b.compare(m, hi, Cmp::Gt)?;
            let z = zeros_like(b, g)?;
            let gm = b.select(to_hi, z, g)?;
            let ghi = mask(b, to_hi, g)?;
            let to_x = b.compare(x[1], lo, Cmp::Ge)?;
            let gx = mask(b, to_x, gm)?;
            let glo = b.select(to_x, z, gm)?;
            let (lt, ht) = (ty(b, x[0]), ty(b, x[2]));
            Ok(vec![
                Some(sum_to(b, glo, &lt)?),
                Some(gx),
                Some(sum_to(b, ghi, &ht)?),
            ])
        }
        Op::Convert {} => {
            let src = ty(b, x[0]).dtype;
            if src.is_float() && ty(b, r).dtype.is_float() {
                one(b.convert(g, src)?)
            } else {
                Ok(vec![None])
            }
        }
        // Reduce over the new dimensions and the broadcast size-1 dimensions, then reshape.
        Op::BroadcastInDim {
            broadcast_dimensions: dims,
        } => {
            let (xt, rt) = (ty(b, x[0]), ty(b, r));
            let mut summed = Vec::new();
            for d in 0..rt.rank() as i64 {
                match dims.iter().position(|&e| e == d) {
                    None => summed.push(d),
                    Some(i) if xt.shape[i] == 1 && rt.shape[d as usize] != 1 => summed.push(d),
                    Some(_) => {}
                }
            }
            let s = if summed.is_empty() {
                g
            } else {
                b.sum(g, &summed)?
            };
            if ty(b, s).shape == xt.shape {
                one(s)
            } else {
                one(b.reshape(s, &xt.shape)?)
            }
        }
        Op::Reshape {} => {
            let xt = ty(b, x[0]);
            one(b.reshape(g, &xt.shape)?)
        }
        Op::Transpose { permutation } => {
            let mut inv = vec![0i64; permutation.len()];
            for (i, &p) in permutation.iter().enumerate() {
                inv[p as usize] = i as i64;
            }
            one(b.transpose(g, &inv)?)
        }
        // Pad the cotangent back into place: low = start, interior = stride - 1.
        Op::Slice {
            start_indices,
            strides,
            ..
        } => {
            let (xt, rt) = (ty(b, x[0]), ty(b, r));
            let (mut lo, mut hi, mut int) = (Vec::new(), Vec::new(), Vec::new());
            for d in 0..xt.rank() {
                let (dim, n) = (xt.shape[d] as i64, rt.shape[d] as i64);
                if n == 0 {
                    lo.push(dim);
                    hi.push(0);
                    int.push(0);
                } else {
                    let last = start_indices[d] + (n - 1) * strides[d];
                    lo.push(start_indices[d]);
                    hi.push(dim - last - 1);
                    int.push(strides[d] - 1);
                }
            }
            let zero = b.scalar(xt.dtype, 0.0)?;
            one(b.inst(
                Op::Pad {
                    edge_padding_low: lo,
                    edge_padding_high: hi,
                    interior_padding: int,
                },
                &[g, zero],
            )?)
        }
        Op::DynamicSlice { .. } => {
            let z = zeros_like(b, x[0])?;
            let mut ops = vec![z, g];
            ops.extend(&x[1..]);
            let mut out = vec![Some(b.inst(Op::DynamicUpdateSlice {}, &ops)?)];
            out.extend(std::iter::repeat_n(None, x.len() - 1));
            Ok(out)
        }
        Op::DynamicUpdateSlice {} => {
            let ut = ty(b, x[1]);
            let zu = zeros_like(b, x[1])?;
            let mut ops = vec![g, zu];
            ops.extend(&x[2..]);
            let gx = b.inst(Op::DynamicUpdateSlice {}, &ops)?;
            let mut sops = vec![g];
            sops.extend(&x[2..]);
            let gu = b.inst(
                Op::DynamicSlice {
                    slice_sizes: ut.shape.iter().map(|&s| s as i64).collect(),
                },
                &sops,
            )?;
            let mut out = vec![Some(gx), Some(gu)];
            out.extend(std::iter::repeat_n(None, x.len() - 2));
            Ok(out)
        }
        // Restore cropped edges with zeros, then take every (interior + 1)-th element.
        Op::Pad {
            edge_padding_low: lo,
            edge_padding_high: hi,
            interior_padding: int,
        } => {
            let xt = ty(b, x[0]);
            let zero = b.scalar(xt.dtype, 0.0)?;
            let n = xt.rank();
            let grow = b.inst(
                Op::Pad {
                    edge_padding_low: lo.iter().map(|&l| (-l).max(0)).collect(),
                    edge_padding_high: hi.iter().map(|&h| (-h).max(0)).collect(),
                    interior_padding: vec![0; n],
                },
                &[g, zero],
            )?;
            let (mut s, mut l, mut st) = (Vec::new(), Vec::new(), Vec::new());
            for d in 0..n {
                let dim = xt.shape[d] as i64;
                let start = lo[d].max(0);
                if dim == 0 {
                    s.push(0);
                    l.push(0);
                } else {
                    s.push(start);
                    l.push(start + (dim - 1) * (int[d] + 1) + 1);
                }
                st.push(int[d] + 1);
            }
            let gx = b.inst(
                Op::Slice {
                    start_indices: s,
                    limit_indices: l,
                    strides: st,
                },
                &[grow],
            )?;
            let all: Vec<i64> = (0..n as i64).collect();
            let total = b.sum(g, &all)?;
            let inner = b.sum(gx, &all)?;
            Ok(vec![Some(gx), Some(bin(b, Op::Subtract {}, total, inner)?)])
        }
        Op::Concatenate { dimension } => {
            let rt = ty(b, r);
            let d = *dimension as usize;
            let mut offset = 0i64;
            let mut out = Vec::new();
            for &xi in x {
                let size = ty(b, xi).shape[d] as i64;
                let mut start = vec![0i64; rt.rank()];
                let mut limit: Vec<i64> = rt.shape.iter().map(|&s| s as i64).collect();
                start[d] = offset;
                limit[d] = offset + size;
                out.push(Some(b.inst(
                    Op::Slice {
                        start_indices: start,
                        limit_indices: limit,
                        strides: vec![1; rt.rank()],
                    },
                    &[g],
                )?));
                offset += size;
            }
            Ok(out)
        }
        Op::Reverse { dimensions } => one(b.inst(
            Op::Reverse {
                dimensions: dimensions.clone(),
            },
            &[g],
        )?),
        Op::Reduce { dimensions, kind } => {
            let xt = ty(b, x[0]);
            let kept: Vec<i64> = (0..xt.rank() as i64)
                .filter(|d| !dimensions.contains(d))
                .collect();
            let gb = b.broadcast(g, &kept, &xt.shape)?;
            let all: Vec<i64> = (0..ty(b, g).rank() as i64).collect();
            match kind {
                Combiner::Add => Ok(vec![Some(gb), Some(b.sum(g, &all)?)]),
                // Ties (init_value included) share the gradient equally.
                Combiner::Max | Combiner::Min => {
                    let rt = ty(b, r);
                    let rb = b.broadcast(r, &kept, &xt.shape)?;
                    let hit = b.compare(x[0], rb, Cmp::Eq)?;
                    let hitf = b.convert(hit, xt.dtype)?;
                    let count_x = b.sum(hitf, dimensions)?;
                    let init_b = b.broadcast(x[1], &[], &rt.shape)?;
                    let init_hit = b.compare(init_b, r, Cmp::Eq)?;
                    let init_hitf = b.convert(init_hit, xt.dtype)?;
                    let count = bin(b, Op::Add {}, count_x, init_hitf)?;
                    let gc = bin(b, Op::Divide {}, g, count)?;
                    let gcb = b.broadcast(gc, &kept, &xt.shape)?;
                    let gi = mask(b, init_hit, gc)?;
                    let all: Vec<i64> = (0..rt.rank() as i64).collect();
                    Ok(vec![Some(mask(b, hit, gcb)?), Some(b.sum(gi, &all)?)])
                }
                // x_bar = broadcast(g * result) / x (the operand must have no zeros).
                Combiner::Mul => {
                    let gr = mul(b, g, r)?;
                    let grb = b.broadcast(gr, &kept, &xt.shape)?;
                    let z = b.full(&ty(b, x[1]), 0.0)?;
                    Ok(vec![Some(bin(b, Op::Divide {}, grb, x[0])?), Some(z)])
                }
                Combiner::And | Combiner::Or | Combiner::Replace => Ok(vec![None, None]),
            }
        }
        Op::DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } => {
            // A product computed in a wider type than its operands' (`preferred_element_type`)
            // is differentiated as the product of the converted operands; the conversions'
            // VJPs convert the gradients back.
            let (wide, narrow) = (ty(b, r).dtype, ty(b, x[0]).dtype);
            let (x0, x1) = if wide != narrow {
                (b.convert(x[0], wide)?, b.convert(x[1], wide)?)
            } else {
                (x[0], x[1])
            };
            let x = [x0, x1];
            let (lt, rt) = (ty(b, x[0]), ty(b, x[1]));
            let free = |rank: usize, a: &[i64], c: &[i64]| -> Vec<i64> {
                (0..rank as i64)
                    .filter(|d| !a.contains(d) && !c.contains(d))
                    .collect()
            };
            let (lf, rf) = (free(lt.rank(), lb, lc), free(rt.rank(), rb, rc));
            let nb = lb.len() as i64;
            let gbatch: Vec<i64> = (0..nb).collect();
            // lhs_bar: contract g's rhs-free dims with rhs's free dims; the leftover rhs dims are
            // rc (ascending), which pair with lc.
            let g_rf: Vec<i64> = (0..rf.len() as i64)
                .map(|i| nb + lf.len() as i64 + i)
                .collect();
            let dl = b.inst(
                Op::DotGeneral {
                    lhs_batching_dimensions: gbatch.clone(),
                    rhs_batching_dimensions: rb.clone(),
                    lhs_contracting_dimensions: g_rf,
                    rhs_contracting_dimensions: rf.clone(),
                },
                &[g, x[1]],
            )?;
            let mut rc_sorted = rc.clone();
            rc_sorted.sort_unstable();
            let mut perm = vec![0i64; lt.rank()];
            for (i, &d) in lb.iter().enumerate() {
                perm[d as usize] = i as i64;
            }
            for (j, &d) in lf.iter().enumerate() {
                perm[d as usize] = nb + j as i64;
            }
            for (k, &d) in lc.iter().enumerate() {
                let pos = rc_sorted
                    .iter()
                    .position(|&e| e == rc[k])
                    .expect("rc_sorted holds rc") as i64;
                perm[d as usize] = nb + lf.len() as i64 + pos;
            }
            let gl = b.transpose(dl, &perm)?;
            // rhs_bar: contract g's lhs-free dims with lhs's free dims.
            let g_lf: Vec<i64> = (0..lf.len() as i64).map(|i| nb + i).collect();
            let dr = b.inst(
                Op::DotGeneral {
                    lhs_batching_dimensions: gbatch,
                    rhs_batching_dimensions: lb.clone(),
                    lhs_contracting_dimensions: g_lf,
                    rhs_contracting_dimensions: lf.clone(),
                },
                &[g, x[0]],
            )?;
            let mut lc_sorted = lc.clone();
            lc_sorted.sort_unstable();
            let mut perm = vec![0i64; rt.rank()];
            for (i, &d) in rb.iter().enumerate() {
                perm[d as usize] = i as i64;
            }
            for (j, &d) in rf.iter().enumerate() {
                perm[d as usize] = nb + j as i64;
            }
            for (k, &d) in rc.iter().enumerate() {
                let pos = lc_sorted
                    .iter()
                    .position(|&e| e == lc[k])
                    .expect("lc_sorted holds lc") as i64;
                perm[d as usize] = nb + rf.len() as i64 + pos;
            }
            let gr = b.transpose(dr, &perm)?;
            if wide != narrow {
                return Ok(vec![
                    Some(b.convert(gl, narrow)?),
                    Some(b.convert(gr, narrow)?),
                ]);
            }
            Ok(vec![Some(gl), Some(gr)])
        }
        Op::Convolution { .. } => crate::rules::conv::vjp(b, op, x, g),
        Op::Gather {
            offset_dims,
            collapsed_slice_dims,
            start_index_map,
            index_vector_dim,
            slice_sizes,
            operand_batching_dims,
            start_indices_batching_dims,
        } => {
            let xt = ty(b, x[0]);
            // Gather clamps its starts; scatter would skip them, so clamp first.
            let lo = vec![0i64; start_index_map.len()];
            let hi: Vec<i64> = start_index_map
                .iter()
                .map(|&d| xt.shape[d as usize] as i64 - slice_sizes[d as usize])
                .collect();
            let idx = clamp_indices(
                b,
                x[1],
                *index_vector_dim as usize,
                &lo,
                &hi,
                &vec![0; lo.len()],
            )?;
            let z = zeros_like(b, x[0])?;
            let gx = b.inst(
                Op::Scatter {
                    update_window_dims: offset_dims.clone(),
                    inserted_window_dims: collapsed_slice_dims.clone(),
                    scatter_dims_to_operand_dims: start_index_map.clone(),
                    index_vector_dim: *index_vector_dim,
                    kind: Combiner::Add,
                    input_batching_dims: operand_batching_dims.clone(),
                    scatter_indices_batching_dims: start_indices_batching_dims.clone(),
                },
                &[z, idx, g],
            )?;
            Ok(vec![Some(gx), None])
        }
        Op::Scatter {
            update_window_dims: uwd,
            inserted_window_dims: iwd,
            scatter_dims_to_operand_dims: sdod,
            index_vector_dim,
            kind,
            input_batching_dims: ibd,
            scatter_indices_batching_dims: sibd,
        } => {
            let (xt, ut) = (ty(b, x[0]), ty(b, x[2]));
            if ut.numel() == 0 {
                // No update: the result is the operand. (The gathers below would need a slice
                // of an empty batching dimension, which no gather has.)
                return Ok(vec![Some(g), None, Some(zeros_like(b, x[2])?)]);
            }
            let ivd = *index_vector_dim as usize;
            // Window size per operand dimension (1 for inserted and batching dimensions).
            let window_dims: Vec<usize> = (0..xt.rank())
                .filter(|d| !iwd.contains(&(*d as i64)) && !ibd.contains(&(*d as i64)))
                .collect();
            let mut wsize = vec![1i64; xt.rank()];
            for (j, &d) in window_dims.iter().enumerate() {
                wsize[d] = ut.shape[uwd[j] as usize] as i64;
            }
            // Gather the cotangent at each update's target; out-of-bounds targets (skipped by
            // scatter) read zeros from a border as wide as the window.
            let gather_at = |b: &mut Builder, src: ValueId, fill: f64| -> Result<ValueId> {
                let st = ty(b, src);
                let pv = b.scalar(st.dtype, fill)?;
                // Only dimensions addressed by the indices get a border (their starts shift).
                let border: Vec<i64> = (0..xt.rank())
                    .map(|d| {
                        if sdod.contains(&(d as i64)) {
                            wsize[d]
                        } else {
                            0
                        }
                    })
                    .collect();
                let padded = b.inst(
                    Op::Pad {
                        edge_padding_low: border.clone(),
                        edge_padding_high: border,
                        interior_padding: vec![0; xt.rank()],
                    },
                    &[src, pv],
                )?;
                let lo: Vec<i64> = sdod.iter().map(|&d| -wsize[d as usize]).collect();
                let hi: Vec<i64> = sdod.iter().map(|&d| xt.shape[d as usize] as i64).collect();
                let shift: Vec<i64> = sdod.iter().map(|&d| wsize[d as usize]).collect();
                let idx = clamp_indices(b, x[1], ivd, &lo, &hi, &shift)?;
                Ok(b.inst(
                    Op::Gather {
                        offset_dims: uwd.clone(),
                        collapsed_slice_dims: iwd.clone(),
                        start_index_map: sdod.clone(),
                        index_vector_dim: *index_vector_dim,
                        slice_sizes: wsize.clone(),
                        operand_batching_dims: ibd.clone(),
                        start_indices_batching_dims: sibd.clone(),
                    },
                    &[padded, idx],
                )?)
            };
            match kind {
                Combiner::Add => {
                    let gu = gather_at(b, g, 0.0)?;
                    Ok(vec![Some(g), None, Some(gu)])
                }
                // The last writer of each position gets its gradient; overwritten positions get none.
                Combiner::Replace => {
                    let zu = zeros_like(b, x[2])?;
                    let gx = b.inst(op.clone(), &[g, x[1], zu])?;
                    let n = ut.numel();
                    let ids_flat = b.inst_typed(
                        Op::Iota { iota_dimension: 0 },
                        &[],
                        TensorType::new(DType::I32, [n]),
                    )?;
                    let ids = b.reshape(ids_flat, &ut.shape)?;
                    let none = b.full(&TensorType::new(DType::I32, xt.shape.clone()), -1.0)?;
                    let owner = b.inst(op.clone(), &[none, x[1], ids])?;
                    let winner = gather_at(b, owner, -1.0)?;
                    let mine = b.compare(winner, ids, Cmp::Eq)?;
                    let gg = gather_at(b, g, 0.0)?;
                    Ok(vec![Some(gx), None, Some(mask(b, mine, gg)?)])
                }
                _ => unsupported("only add and replace scatters are differentiable"),
            }
        }
        Op::ReduceWindow {
            window_dimensions: wd,
            window_strides: ws,
            base_dilations: bd,
            window_dilations: wdl,
            padding,
            kind,
        } => {
            let xt = ty(b, x[0]);
            let n = xt.rank();
            match kind {
                Combiner::Add => {
                    // Transpose of a windowed sum: pad the strided cotangent and sum windows again.
                    let gt = ty(b, g);
                    let dil = |s: i64, d: i64| if s == 0 { 0 } else { 1 + d * (s - 1) };
                    let mut cfg = (Vec::new(), Vec::new(), Vec::new());
                    for d in 0..n {
                        let lhs = dil(xt.shape[d] as i64, bd[d]);
                        let rhs = dil(wd[d], wdl[d]);
                        let out = dil(gt.shape[d] as i64, ws[d]);
                        let before = rhs - padding[d].0 - 1;
                        let after = lhs + rhs - 1 - out - before;
                        cfg.0.push(before);
                        cfg.1.push(after);
                        cfg.2.push(ws[d] - 1);
                    }
                    let zero = b.scalar(xt.dtype, 0.0)?;
                    let pg = b.inst(
                        Op::Pad {
                            edge_padding_low: cfg.0,
                            edge_padding_high: cfg.1,
                            interior_padding: cfg.2,
                        },
                        &[g, zero],
                    )?;
                    let gx = b.inst(
                        Op::ReduceWindow {
                            window_dimensions: wd.clone(),
                            window_strides: bd.clone(),
                            base_dilations: vec![1; n],
                            window_dilations: wdl.clone(),
                            padding: vec![(0, 0); n],
                            kind: Combiner::Add,
                        },
                        &[pg, zero],
                    )?;
                    // init_value enters once per result element and once per padding or hole
                    // position of its window.
                    let ones = b.full(&xt, 1.0)?;
                    let counts = b.inst(op.clone(), &[ones, zero])?;
                    let w: i64 = wd.iter().product();
                    let wv = b.full(&gt, (1 + w) as f64)?;
                    let uses = bin(b, Op::Subtract {}, wv, counts)?;
                    let gu = mul(b, g, uses)?;
                    let all: Vec<i64> = (0..n as i64).collect();
                    Ok(vec![Some(gx), Some(b.sum(gu, &all)?)])
                }
                Combiner::Max | Combiner::Min => {
                    if bd.iter().chain(wdl).any(|&d| d != 1) {
                        return unsupported(
                            "max/min windows with dilation are not differentiable yet",
                        );
                    }
                    // init_value enters first and wins ties;
                    // elsewhere the first selected element of each window gets the gradient.
                    let zero = b.scalar(xt.dtype, 0.0)?;
                    let rt = ty(b, r);
                    let init_b = b.broadcast(x[1], &[], &rt.shape)?;
                    let init_won = b.compare(init_b, r, Cmp::Eq)?;
                    let z = zeros_like(b, g)?;
                    let g_elems = b.select(init_won, z, g)?;
                    let select = if *kind == Combiner::Max {
                        Cmp::Ge
                    } else {
                        Cmp::Le
                    };
                    let gx = b.inst(
                        Op::SelectAndScatter {
                            window_dimensions: wd.clone(),
                            window_strides: ws.clone(),
                            padding: padding.clone(),
                            select,
                            kind: Combiner::Add,
                        },
                        &[x[0], g_elems, zero],
                    )?;
                    let g_init = mask(b, init_won, g)?;
                    let all: Vec<i64> = (0..n as i64).collect();
                    Ok(vec![Some(gx), Some(b.sum(g_init, &all)?)])
                }
                _ => unsupported("only add, max and min windows are differentiable"),
            }
        }
        Op::SelectAndScatter {
            window_dimensions: wd,
            window_strides: ws,
            padding,
            select,
            kind,
        } => {
            if *kind != Combiner::Add {
                return unsupported("only add select_and_scatter is differentiable");
            }
            let xt = ty(b, x[0]);
            let n = xt.rank();
            // source_bar[o] = g at the position each window selected: scan the window offsets in
            // row-major order with the op's own tie rule; padding is never selected.
            let grid: Vec<usize> = (0..n)
                .map(|d| window_output_size(xt.shape[d], 1, padding[d], wd[d], 1, ws[d]))
                .collect();
            let all: Vec<i64> = (0..n as i64).collect();
            let ginit = b.sum(g, &all)?;
            let grid_ty = TensorType::new(xt.dtype, grid.clone());
            if grid.contains(&0) {
                // No window: no source element, and the window offsets may lie past the
                // padded operand, so no slice of it is taken.
                return Ok(vec![None, Some(b.full(&grid_ty, 0.0)?), Some(ginit)]);
            }
            let lo: Vec<i64> = padding.iter().map(|p| p.0).collect();
            let hi: Vec<i64> = padding.iter().map(|p| p.1).collect();
            let zero = b.scalar(xt.dtype, 0.0)?;
            let pad = |b: &mut Builder, v: ValueId, fill: ValueId| -> Result<ValueId> {
                Ok(b.inst(
                    Op::Pad {
                        edge_padding_low: lo.clone(),
                        edge_padding_high: hi.clone(),
                        interior_padding: vec![0; n],
                    },
                    &[v, fill],
                )?)
            };
            let px = pad(b, x[0], zero)?;
            let pg = pad(b, g, zero)?;
            let t = b.scalar(DType::Pred, 1.0)?;
            let f = b.scalar(DType::Pred, 0.0)?;
            let valid_src = b.broadcast(t, &[], &xt.shape)?;
            let pvalid = pad(b, valid_src, f)?;
            let mut best_x = b.full(&grid_ty, 0.0)?;
            let mut best_g = b.full(&grid_ty, 0.0)?;
            let mut have = b.full(&TensorType::new(DType::Pred, grid.clone()), 0.0)?;
            let wshape: Vec<usize> = wd.iter().map(|&w| w as usize).collect();
            let total: usize = wshape.iter().product();
            for k in 0..total {
                let mut rem = k;
                let mut off = vec![0i64; n];
                for d in (0..n).rev() {
                    off[d] = (rem % wshape[d]) as i64;
                    rem /= wshape[d];
                }
                let start: Vec<i64> = off.clone();
                let limit: Vec<i64> = (0..n)
                    .map(|d| off[d] + (grid[d] as i64 - 1) * ws[d] + 1)
                    .collect();
                let sl = |b: &mut Builder, v: ValueId| -> Result<ValueId> {
                    Ok(b.inst(
                        Op::Slice {
                            start_indices: start.clone(),
                            limit_indices: limit.clone(),
                            strides: ws.clone(),
                        },
                        &[v],
                    )?)
                };
                let (cx, cg, cv) = (sl(b, px)?, sl(b, pg)?, sl(b, pvalid)?);
                // Take the candidate when valid and (nothing chosen yet or not select(best, cand)).
                let keep = b.compare(best_x, cx, *select)?;
                let not_keep = un(b, Op::Not {}, keep)?;
                let none_yet = un(b, Op::Not {}, have)?;
                let better = bin(b, Op::Or {}, none_yet, not_keep)?;
                let take = bin(b, Op::And {}, cv, better)?;
                best_x = b.select(take, cx, best_x)?;
                best_g = b.select(take, cg, best_g)?;
                have = bin(b, Op::Or {}, have, cv)?;
            }
            let gsrc = mask(b, have, best_g)?;
            Ok(vec![None, Some(gsrc), Some(ginit)])
        }
        Op::Real {} | Op::Imag {} | Op::Complex {} => {
            unsupported("gradients of complex numbers are not defined in kiln yet")
        }
        Op::And {}
        | Op::Or {}
        | Op::Xor {}
        | Op::ShiftLeft {}
        | Op::ShiftRightLogical {}
        | Op::ShiftRightArithmetic {}
        | Op::Popcnt {}
        | Op::CountLeadingZeros {}
        | Op::Not {}
        | Op::IsFinite {}
        | Op::Compare { .. }
        | Op::BitcastConvert {}
        | Op::Constant { .. }
        | Op::Iota { .. }
        | Op::RngBitGenerator { .. }
        | Op::Fft { .. }
        | Op::ReplicaId {}
        | Op::PartitionId {}
        | Op::OptimizationBarrier {} => Ok(vec![None; x.len()]),
        // Handled above, before a single cotangent is taken.
        Op::While { .. }
        | Op::Call { .. }
        | Op::Case { .. }
        | Op::Sort { .. }
        | Op::ReduceRegion { .. }
        | Op::ReduceWindowRegion { .. }
        | Op::Map { .. }
        | Op::AllGather { .. }
        | Op::AllReduce { .. }
        | Op::AllToAll { .. }
        | Op::ReduceScatter { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveBroadcast { .. }
        | Op::CollectiveReduce { .. }
        | Op::Lu {} => Ok(vec![None; x.len()]),
    }
}

/// The cotangents of a `map`'s operands `x` given its result's cotangent `g`: for each float
/// operand k, `map(x..., g)` whose computation is the computation's own VJP for parameter k
/// (the chain rule at every position, since the map is elementwise).
fn map_vjp(
    b: &mut Builder,
    dimensions: &[i64],
    computation: &kiln_ir::Func,
    x: &[ValueId],
    g: Option<ValueId>,
) -> Result<Vec<Option<ValueId>>> {
    let mut out = vec![None; x.len()];
    let Some(g) = g else {
        return Ok(out);
    };
    let wrt: Vec<usize> = (0..x.len())
        .filter(|&k| ty(b, x[k]).dtype.is_float())
        .collect();
    if wrt.is_empty() {
        return Ok(out);
    }
    let back = crate::vjp(computation, &wrt)?;
    let mut operands = x.to_vec();
    operands.push(g);
    for (j, &k) in wrt.iter().enumerate() {
        let name = format!("{}_bar{k}", computation.name);
        let one = crate::eliminate_dead_code(&crate::select_outputs(&back, &[1 + j], &name));
        let op = Op::Map {
            dimensions: dimensions.to_vec(),
            computation: Box::new(one),
        };
        out[k] = Some(b.inst(op, &operands)?);
    }
    Ok(out)
}

/// The cotangents of a `case`'s operands: `case(index, args..., results_bar...)` over the
/// branches' VJPs, each returning the cotangents of the float arguments (the index and the
/// other arguments get none).
fn case_vjp(
    b: &mut Builder,
    branches: &[kiln_ir::Func],
    x: &[ValueId],
    r: &[ValueId],
    g: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    let args = &x[1..];
    let wrt: Vec<usize> = (0..args.len())
        .filter(|&k| ty(b, args[k]).dtype.is_float())
        .collect();
    let mut out = vec![None; x.len()];
    if wrt.is_empty() {
        return Ok(out);
    }
    let cts: Vec<ValueId> = g
        .iter()
        .zip(r)
        .map(|(gi, &ri)| gi.map_or_else(|| zeros_like(b, ri), Ok))
        .collect::<Result<_>>()?;
    let vjps: Vec<kiln_ir::Func> = branches
        .iter()
        .map(|br| {
            let v = crate::vjp(br, &wrt)?;
            let grads: Vec<usize> = (br.outputs.len()..v.outputs.len()).collect();
            Ok(crate::select_outputs(
                &v,
                &grads,
                &format!("{}_vjp", br.name),
            ))
        })
        .collect::<Result<_>>()?;
    let operands: Vec<ValueId> = x.iter().chain(&cts).copied().collect();
    let grads = b.push(Op::Case { branches: vjps }, &operands)?;
    for (&k, gk) in wrt.iter().zip(grads) {
        out[1 + k] = Some(gk);
    }
    Ok(out)
}

mod collective;
mod conv;
mod linalg;
pub(crate) mod loops;
mod reduce_region;
mod sort;

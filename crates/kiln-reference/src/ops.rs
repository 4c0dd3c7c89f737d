//! One function per op family. Inputs are verified, so shapes and dtypes are consistent.

use crate::complex::combine_c;
use crate::products::{ConvAttrs, DotDims, convolution, dot_general};
use crate::scalar::{
    combine_f, combine_i, compare_f, compare_i, float_binary, float_unary, int_binary, int_max,
    int_min, int_unary, nan_max, nan_min,
};
use kiln_ir::literal::index_of;
use kiln_ir::verify::window_output_size;
use kiln_ir::{Combiner, DType, Data, Literal, Op, TensorType};

const VERIFIED: &str = "the verifier guarantees consistent types";

/// Calls `f` with every multi-index of `shape`, row-major.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn lin(idx: &[usize], st: &[usize]) -> usize {
    idx.iter().zip(st).map(|(i, s)| i * s).sum()
}

macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::Pred($v) => Data::Pred($body),
            Data::I8($v) => Data::I8($body),
            Data::I4($v) => Data::I4($body),
            Data::U4($v) => Data::U4($body),
            Data::I2($v) => Data::I2($body),
            Data::U2($v) => Data::U2($body),
            Data::I32($v) => Data::I32($body),
            Data::I64($v) => Data::I64($body),
            Data::U32($v) => Data::U32($body),
            Data::U8($v) => Data::U8($body),
            Data::I16($v) => Data::I16($body),
            Data::U16($v) => Data::U16($body),
            Data::U64($v) => Data::U64($body),
            Data::F16($v) => Data::F16($body),
            Data::BF16($v) => Data::BF16($body),
            Data::F32($v) => Data::F32($body),
            Data::F64($v) => Data::F64($body),
            Data::Mini(m, $v) => Data::Mini(*m, $body),
            Data::C64($v) => Data::C64($body),
            Data::C128($v) => Data::C128($body),
        }
    };
}

/// Elements of `src` at linear positions `idx`, as a literal of type `ty`.
pub fn take(src: &Literal, ty: &TensorType, idx: &[usize]) -> Literal {
    Literal::new(
        ty.clone(),
        map_data!(src.data(), v => idx.iter().map(|&i| v[i]).collect()),
    )
    .expect(VERIFIED)
}

/// `bitcast_convert` of `a` to `ty`: the little-endian bytes reread, or, to or from `pred`
/// (one bit each), each element's bits, the least significant first.
fn bitcast(a: &Literal, ty: &TensorType) -> Literal {
    match (a.dtype().is_pred(), ty.dtype.is_pred()) {
        (false, true) => {
            let bytes = a.to_le_bytes();
            let bits = (0..ty.numel()).map(|i| bytes[i / 8] >> (i % 8) & 1 != 0);
            Literal::new(ty.clone(), Data::Pred(bits.collect())).expect(VERIFIED)
        }
        (true, false) => {
            let Data::Pred(bits) = a.data() else {
                unreachable!("{VERIFIED}")
            };
            let mut bytes = vec![0u8; bits.len() / 8];
            for (i, &b) in bits.iter().enumerate() {
                bytes[i / 8] |= u8::from(b) << (i % 8);
            }
            Literal::from_le_bytes(ty.clone(), &bytes).expect(VERIFIED)
        }
        _ => Literal::from_le_bytes(ty.clone(), &a.to_le_bytes()).expect(VERIFIED),
    }
}

/// The elements of several literals of one dtype, concatenated.
pub(crate) fn concat(srcs: &[&Literal]) -> Literal {
    let mut data = srcs[0].data().clone();
    for s in &srcs[1..] {
        match (&mut data, s.data()) {
            (Data::Pred(a), Data::Pred(b)) => a.extend(b),
            (Data::I8(a), Data::I8(b)) => a.extend(b),
            (Data::I4(a), Data::I4(b)) => a.extend(b),
            (Data::U4(a), Data::U4(b)) => a.extend(b),
            (Data::I2(a), Data::I2(b)) => a.extend(b),
            (Data::U2(a), Data::U2(b)) => a.extend(b),
            (Data::I32(a), Data::I32(b)) => a.extend(b),
            (Data::I64(a), Data::I64(b)) => a.extend(b),
            (Data::U32(a), Data::U32(b)) => a.extend(b),
            (Data::U8(a), Data::U8(b)) => a.extend(b),
            (Data::I16(a), Data::I16(b)) => a.extend(b),
            (Data::U16(a), Data::U16(b)) => a.extend(b),
            (Data::U64(a), Data::U64(b)) => a.extend(b),
            (Data::F16(a), Data::F16(b)) => a.extend(b),
            (Data::BF16(a), Data::BF16(b)) => a.extend(b),
            (Data::F32(a), Data::F32(b)) => a.extend(b),
            (Data::F64(a), Data::F64(b)) => a.extend(b),
            (Data::Mini(_, a), Data::Mini(_, b)) => a.extend(b),
            (Data::C64(a), Data::C64(b)) => a.extend(b),
            (Data::C128(a), Data::C128(b)) => a.extend(b),
            _ => unreachable!("{VERIFIED}"),
        }
    }
    let n = data.len();
    Literal::new(TensorType::new(srcs[0].dtype(), [n]), data).expect(VERIFIED)
}

/// Computes in f64 for floats or wrapping i64 otherwise, then rounds or wraps to `ty`.
fn from_lane(ty: &TensorType, lane: Lane) -> Literal {
    match lane {
        Lane::F(v) => Literal::from_f64s(ty.clone(), &v),
        Lane::I(v) => Literal::from_i64s(ty.clone(), &v),
    }
    .expect(VERIFIED)
}

enum Lane {
    F(Vec<f64>),
    I(Vec<i64>),
}

fn binary(op: &Op, a: &Literal, b: &Literal, ty: &TensorType) -> Literal {
    let d = a.dtype();
    if d.is_float() {
        let f = float_binary(op).expect(VERIFIED);
        let v = a
            .to_f64s()
            .into_iter()
            .zip(b.to_f64s())
            .map(|(x, y)| f(x, y))
            .collect();
        return from_lane(ty, Lane::F(v));
    }
    let v = a
        .to_i64s()
        .into_iter()
        .zip(b.to_i64s())
        .map(|(x, y)| int_binary(op, d, x, y))
        .collect();
    from_lane(ty, Lane::I(v))
}

fn unary(op: &Op, a: &Literal, ty: &TensorType) -> Literal {
    let d = a.dtype();
    if d.is_float() {
        let f = float_unary(op).expect(VERIFIED);
        return from_lane(ty, Lane::F(a.to_f64s().into_iter().map(f).collect()));
    }
    let v = a
        .to_i64s()
        .into_iter()
        .map(|x| int_unary(op, d, x))
        .collect();
    from_lane(ty, Lane::I(v))
}

/// Broadcasts a scalar or same-shaped operand to `n` elements.
fn expand<T: Copy>(v: Vec<T>, n: usize) -> Vec<T> {
    if v.len() == n { v } else { vec![v[0]; n] }
}

/// Whether a `while` with condition region `cond` takes another trip on `carries`.
pub(crate) fn loop_goes_on(cond: &kiln_ir::Func, carries: &[&Literal]) -> bool {
    let go = crate::run(cond, carries);
    go[0].to_i64s().first().is_some_and(|&b| b != 0)
}

/// Runs one op on concrete operands; `types` are the instruction's result types.
///
/// The op and operands must be verified (see [`kiln_ir::type_rule`]): this function trusts
/// that shapes and dtypes are consistent.
pub fn eval_op(op: &Op, x: &[&Literal], types: &[TensorType]) -> Vec<Literal> {
    let ty = &types[0];
    let single = |l: Literal| vec![l];
    if let Some(l) = crate::complex::eval(op, x, ty) {
        return single(l);
    }
    match op {
        Op::Add {}
        | Op::Subtract {}
        | Op::Multiply {}
        | Op::Divide {}
        | Op::Remainder {}
        | Op::Maximum {}
        | Op::Minimum {}
        | Op::Power {}
        | Op::And {}
        | Op::Or {}
        | Op::Xor {}
        | Op::ShiftLeft {}
        | Op::ShiftRightLogical {}
        | Op::ShiftRightArithmetic {}
        | Op::Atan2 {} => single(binary(op, x[0], x[1], ty)),
        Op::Negate {}
        | Op::Abs {}
        | Op::Sign {}
        | Op::Exponential {}
        | Op::Log {}
        | Op::LogPlusOne {}
        | Op::ExponentialMinusOne {}
        | Op::Sqrt {}
        | Op::Rsqrt {}
        | Op::Tanh {}
        | Op::Logistic {}
        | Op::Sine {}
        | Op::Cosine {}
        | Op::Erf {}
        | Op::Floor {}
        | Op::Ceil {}
        | Op::RoundNearestAfz {}
        | Op::RoundNearestEven {}
        | Op::Tan {}
        | Op::Cbrt {}
        | Op::Popcnt {}
        | Op::CountLeadingZeros {}
        | Op::Not {} => single(unary(op, x[0], ty)),
        Op::ReducePrecision {
            exponent_bits,
            mantissa_bits,
        } => single(from_lane(
            ty,
            Lane::F(
                x[0].to_f64s()
                    .into_iter()
                    .map(|v| {
                        crate::scalar::reduce_precision(ty.dtype, v, *exponent_bits, *mantissa_bits)
                    })
                    .collect(),
            ),
        )),
        Op::IsFinite {} => single(from_lane(
            ty,
            Lane::I(
                x[0].to_f64s()
                    .iter()
                    .map(|v| v.is_finite() as i64)
                    .collect(),
            ),
        )),
        Op::Compare {
            comparison_direction: dir,
        } => {
            let v = if x[0].dtype().is_float() {
                x[0].to_f64s()
                    .into_iter()
                    .zip(x[1].to_f64s())
                    .map(|(a, b)| compare_f(*dir, a, b) as i64)
                    .collect()
            } else {
                x[0].to_i64s()
                    .into_iter()
                    .zip(x[1].to_i64s())
                    .map(|(a, b)| compare_i(*dir, x[0].dtype(), a, b) as i64)
                    .collect()
            };
            single(from_lane(ty, Lane::I(v)))
        }
        Op::Select {} => {
            let n = ty.numel();
            let p = expand(x[0].to_i64s(), n);
            let both = concat(&[x[1], x[2]]);
            let idx: Vec<usize> = (0..n).map(|i| if p[i] != 0 { i } else { n + i }).collect();
            single(take(&both, ty, &idx))
        }
        Op::Clamp {} => {
            let n = ty.numel();
            if ty.dtype.is_float() {
                let (lo, v, hi) = (
                    expand(x[0].to_f64s(), n),
                    x[1].to_f64s(),
                    expand(x[2].to_f64s(), n),
                );
                single(from_lane(
                    ty,
                    Lane::F(
                        (0..n)
                            .map(|i| nan_min(nan_max(v[i], lo[i]), hi[i]))
                            .collect(),
                    ),
                ))
            } else {
                let (lo, v, hi) = (
                    expand(x[0].to_i64s(), n),
                    x[1].to_i64s(),
                    expand(x[2].to_i64s(), n),
                );
                let d = ty.dtype;
                single(from_lane(
                    ty,
                    Lane::I(
                        (0..n)
                            .map(|i| int_min(d, int_max(d, v[i], lo[i]), hi[i]))
                            .collect(),
                    ),
                ))
            }
        }
        Op::Convert {} => {
            let src = x[0];
            if src.dtype().is_float() && !ty.dtype.is_float() {
                // Truncation toward zero, saturating, NaN to 0; pred is `x != 0`.
                let v = src
                    .to_f64s()
                    .into_iter()
                    .map(|f| kiln_ir::literal::convert_f64(ty.dtype, f))
                    .collect();
                single(from_lane(ty, Lane::I(v)))
            } else if src.dtype().is_float() || ty.dtype.is_float() {
                // Integers to floats through f64 (`to_f64s` reads a u64's bits unsigned).
                single(from_lane(ty, Lane::F(src.to_f64s())))
            } else if ty.dtype == DType::Pred {
                single(from_lane(
                    ty,
                    Lane::I(src.to_i64s().into_iter().map(|v| (v != 0) as i64).collect()),
                ))
            } else {
                single(from_lane(ty, Lane::I(src.to_i64s())))
            }
        }
        Op::Real {} | Op::Imag {} | Op::Complex {} => {
            unreachable!("crate::complex::eval computes these")
        }
        Op::BitcastConvert {} => single(bitcast(x[0], ty)),
        Op::Constant { value } => single(value.clone()),
        Op::Iota { iota_dimension } => {
            let mut v = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |i| v.push(i[*iota_dimension as usize] as i64));
            single(from_lane(ty, Lane::I(v)))
        }
        Op::BroadcastInDim {
            broadcast_dimensions: dims,
        } => {
            let a = x[0];
            let st = a.ty().strides();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                idx.push(
                    dims.iter()
                        .enumerate()
                        .map(|(i, &d)| {
                            if a.shape()[i] == 1 {
                                0
                            } else {
                                o[d as usize] * st[i]
                            }
                        })
                        .sum(),
                );
            });
            single(take(a, ty, &idx))
        }
        Op::Reshape {} => single(x[0].reshaped(ty.shape.clone()).expect(VERIFIED)),
        Op::Transpose { permutation } => {
            let st = x[0].ty().strides();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                idx.push(
                    permutation
                        .iter()
                        .enumerate()
                        .map(|(i, &p)| o[i] * st[p as usize])
                        .sum(),
                )
            });
            single(take(x[0], ty, &idx))
        }
        Op::Slice {
            start_indices,
            strides: step,
            ..
        } => {
            let st = x[0].ty().strides();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                idx.push(
                    (0..o.len())
                        .map(|d| (start_indices[d] as usize + o[d] * step[d] as usize) * st[d])
                        .sum(),
                );
            });
            single(take(x[0], ty, &idx))
        }
        Op::DynamicSlice { slice_sizes } => {
            let a = x[0];
            let st = a.ty().strides();
            let start: Vec<usize> = (0..a.ty().rank())
                .map(|d| {
                    index_of(x[1 + d].dtype(), x[1 + d].to_i64s()[0])
                        .clamp(0, a.shape()[d] as i64 - slice_sizes[d]) as usize
                })
                .collect();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                idx.push((0..o.len()).map(|d| (start[d] + o[d]) * st[d]).sum())
            });
            single(take(a, ty, &idx))
        }
        Op::DynamicUpdateSlice {} => {
            let (a, u) = (x[0], x[1]);
            let st = a.ty().strides();
            let start: Vec<usize> = (0..a.ty().rank())
                .map(|d| {
                    index_of(x[2 + d].dtype(), x[2 + d].to_i64s()[0])
                        .clamp(0, (a.shape()[d] - u.shape()[d]) as i64) as usize
                })
                .collect();
            let n = a.numel();
            let mut idx: Vec<usize> = (0..n).collect();
            let mut k = 0;
            for_each_index(u.shape(), |o| {
                idx[(0..o.len())
                    .map(|d| (start[d] + o[d]) * st[d])
                    .sum::<usize>()] = n + k;
                k += 1;
            });
            single(take(&concat(&[a, u]), ty, &idx))
        }
        Op::Pad {
            edge_padding_low: lo,
            interior_padding: int,
            ..
        } => {
            let a = x[0];
            let st = a.ty().strides();
            let fill = a.numel();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                let mut src = 0;
                for d in 0..o.len() {
                    let p = o[d] as i64 - lo[d];
                    let step = int[d] + 1;
                    if p < 0 || p % step != 0 || p / step >= a.shape()[d] as i64 {
                        idx.push(fill);
                        return;
                    }
                    src += (p / step) as usize * st[d];
                }
                idx.push(src);
            });
            single(take(&concat(&[a, x[1]]), ty, &idx))
        }
        Op::Concatenate { dimension } => {
            let d = *dimension as usize;
            let mut offsets = Vec::new();
            let mut base = 0;
            for s in x {
                offsets.push(base);
                base += s.numel();
            }
            let sts: Vec<Vec<usize>> = x.iter().map(|s| s.ty().strides()).collect();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                let mut pos = o[d];
                let mut k = 0;
                while pos >= x[k].shape()[d] {
                    pos -= x[k].shape()[d];
                    k += 1;
                }
                let mut i = o.to_vec();
                i[d] = pos;
                idx.push(offsets[k] + lin(&i, &sts[k]));
            });
            single(take(&concat(x), ty, &idx))
        }
        Op::Reverse { dimensions } => {
            let a = x[0];
            let st = a.ty().strides();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                idx.push((0..o.len()).map(|d| if dimensions.contains(&(d as i64)) { a.shape()[d] - 1 - o[d] } else { o[d] } * st[d]).sum());
            });
            single(take(a, ty, &idx))
        }
        Op::Reduce { dimensions, kind } => {
            let a = x[0];
            let keep: Vec<usize> = (0..a.ty().rank())
                .filter(|d| !dimensions.contains(&(*d as i64)))
                .collect();
            let ost = ty.strides();
            let out_pos =
                |i: &[usize]| keep.iter().zip(&ost).map(|(&d, s)| i[d] * s).sum::<usize>();
            single(reduce_into(a, x[1], ty, *kind, |f| {
                for_each_index(a.shape(), |i| f(out_pos(i), lin(i, &a.ty().strides())))
            }))
        }
        Op::DotGeneral {
            lhs_batching_dimensions: lb,
            rhs_batching_dimensions: rb,
            lhs_contracting_dimensions: lc,
            rhs_contracting_dimensions: rc,
        } => single(dot_general(x[0], x[1], ty, &DotDims { lb, rb, lc, rc })),
        Op::Convolution {
            window_strides,
            padding,
            lhs_dilation,
            rhs_dilation,
            feature_group_count,
            input_dims,
            kernel_dims,
            output_dims,
            batch_group_count,
        } => single(convolution(
            x[0],
            x[1],
            ty,
            &ConvAttrs {
                window_strides,
                padding,
                lhs_dilation,
                rhs_dilation,
                feature_group_count: *feature_group_count,
                input_dims,
                kernel_dims,
                output_dims,
                batch_group_count: *batch_group_count,
            },
        )),
        Op::Gather {
            offset_dims,
            collapsed_slice_dims,
            start_index_map,
            index_vector_dim,
            slice_sizes,
            operand_batching_dims: obd,
            start_indices_batching_dims: sibd,
        } => {
            let (a, si) = (x[0], x[1]);
            let st = a.ty().strides();
            let ivals: Vec<i64> = si
                .to_i64s()
                .into_iter()
                .map(|v| index_of(si.dtype(), v))
                .collect();
            let sst = si.ty().strides();
            let ivd = *index_vector_dim as usize;
            let window_dims: Vec<usize> = (0..a.ty().rank())
                .filter(|d| {
                    !collapsed_slice_dims.contains(&(*d as i64)) && !obd.contains(&(*d as i64))
                })
                .collect();
            let mut idx = Vec::with_capacity(ty.numel());
            for_each_index(&ty.shape, |o| {
                let batch: Vec<usize> = (0..o.len())
                    .filter(|d| !offset_dims.contains(&(*d as i64)))
                    .map(|d| o[d])
                    .collect();
                let mut start = vec![0i64; a.ty().rank()];
                for (k, &od) in start_index_map.iter().enumerate() {
                    let mut pos = batch.clone();
                    if ivd < si.ty().rank() {
                        pos.insert(ivd, k);
                    }
                    start[od as usize] = ivals[lin(&pos, &sst)];
                }
                for (&od, &id) in obd.iter().zip(sibd) {
                    start[od as usize] = batch[batch_position(id, ivd)] as i64;
                }
                let mut src = 0;
                for d in 0..a.ty().rank() {
                    let s = start[d].clamp(0, a.shape()[d] as i64 - slice_sizes[d]) as usize;
                    let off = window_dims
                        .iter()
                        .position(|&w| w == d)
                        .map(|j| o[offset_dims[j] as usize])
                        .unwrap_or(0);
                    src += (s + off) * st[d];
                }
                idx.push(src);
            });
            single(take(a, ty, &idx))
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
            let (a, si, u) = (x[0], x[1], x[2]);
            let st = a.ty().strides();
            let ivals: Vec<i64> = si
                .to_i64s()
                .into_iter()
                .map(|v| index_of(si.dtype(), v))
                .collect();
            let sst = si.ty().strides();
            let ivd = *index_vector_dim as usize;
            let window_dims: Vec<usize> = (0..a.ty().rank())
                .filter(|d| !iwd.contains(&(*d as i64)) && !ibd.contains(&(*d as i64)))
                .collect();
            let mut writes = Vec::new();
            let mut k = 0;
            for_each_index(u.shape(), |o| {
                let batch: Vec<usize> = (0..o.len())
                    .filter(|d| !uwd.contains(&(*d as i64)))
                    .map(|d| o[d])
                    .collect();
                let mut pos = vec![0i64; a.ty().rank()];
                for (j, &od) in sdod.iter().enumerate() {
                    let mut p = batch.clone();
                    if ivd < si.ty().rank() {
                        p.insert(ivd, j);
                    }
                    pos[od as usize] = ivals[lin(&p, &sst)];
                }
                for (&od, &id) in ibd.iter().zip(sibd) {
                    pos[od as usize] = batch[batch_position(id, ivd)] as i64;
                }
                for (j, &wd) in window_dims.iter().enumerate() {
                    pos[wd] += o[uwd[j] as usize] as i64;
                }
                if pos
                    .iter()
                    .zip(a.shape())
                    .all(|(&p, &s)| p >= 0 && (p as usize) < s)
                {
                    writes.push((
                        pos.iter()
                            .zip(&st)
                            .map(|(&p, s)| p as usize * s)
                            .sum::<usize>(),
                        k,
                    ));
                }
                k += 1;
            });
            single(apply_updates(a, u, *kind, &writes))
        }
        Op::ReduceWindow {
            window_dimensions: wd,
            window_strides: ws,
            base_dilations: bd,
            window_dilations: wdl,
            padding,
            kind,
        } => {
            let a = x[0];
            let st = a.ty().strides();
            let ost = ty.strides();
            let init_pos = a.numel();
            let both = concat(&[a, x[1]]);
            single(reduce_into(&both, x[1], ty, *kind, |f| {
                for_each_index(&ty.shape, |o| {
                    let out = lin(o, &ost);
                    let wshape: Vec<usize> = wd.iter().map(|&w| w as usize).collect();
                    for_each_index(&wshape, |w| {
                        let mut src = 0;
                        for d in 0..o.len() {
                            let p = o[d] as i64 * ws[d] - padding[d].0 + w[d] as i64 * wdl[d];
                            if p < 0 || p % bd[d] != 0 || p / bd[d] >= a.shape()[d] as i64 {
                                f(out, init_pos);
                                return;
                            }
                            src += (p / bd[d]) as usize * st[d];
                        }
                        f(out, src);
                    });
                });
            }))
        }
        Op::SelectAndScatter {
            window_dimensions: wd,
            window_strides: ws,
            padding,
            select,
            kind,
        } => {
            let (a, src) = (x[0], x[1]);
            let st = a.ty().strides();
            let vals_f = a.to_f64s();
            let vals_i = a.to_i64s();
            let better = |cur: usize, cand: usize| -> bool {
                // `select(current, candidate)` true keeps the current element.
                if a.dtype().is_float() {
                    !compare_f(*select, vals_f[cur], vals_f[cand])
                } else {
                    !compare_i(*select, a.dtype(), vals_i[cur], vals_i[cand])
                }
            };
            let grid: Vec<usize> = (0..a.ty().rank())
                .map(|d| window_output_size(a.shape()[d], 1, padding[d], wd[d], 1, ws[d]))
                .collect();
            let wshape: Vec<usize> = wd.iter().map(|&w| w as usize).collect();
            let mut writes = Vec::new();
            let mut k = 0;
            for_each_index(&grid, |o| {
                let mut chosen: Option<usize> = None;
                for_each_index(&wshape, |w| {
                    let mut pos = 0;
                    for d in 0..o.len() {
                        let p = o[d] as i64 * ws[d] - padding[d].0 + w[d] as i64;
                        if p < 0 || p >= a.shape()[d] as i64 {
                            return;
                        }
                        pos += p as usize * st[d];
                    }
                    chosen = match chosen {
                        Some(c) if !better(c, pos) => Some(c),
                        _ => Some(pos),
                    };
                });
                if let Some(c) = chosen {
                    writes.push((c, k));
                }
                k += 1;
            });
            let init = take(x[2], ty, &vec![0; ty.numel()]);
            single(apply_updates(&init, src, *kind, &writes))
        }
        Op::RngBitGenerator { .. } => {
            // A u32[4] state is the four words; a u64[2] state the same bits as two u64s.
            let s = x[0].to_i64s();
            let words = if x[0].dtype() == DType::U64 {
                crate::rng::words_of([s[0] as u64, s[1] as u64])
            } else {
                [s[0] as u32, s[1] as u32, s[2] as u32, s[3] as u32]
            };
            let out = &types[1];
            // A u64 output takes one block each, its first word the low half; a u32 output
            // lays its blocks out as XLA's THREE_FRY does.
            let (data, next) = if out.dtype == DType::U64 {
                let (bits, next) = crate::rng::bits(words, 2 * out.numel());
                let wide = bits.chunks_exact(2);
                let data = wide.map(|w| w[0] as u64 | (w[1] as u64) << 32).collect();
                (Data::U64(data), next)
            } else {
                let (w, next) = crate::rng::u32_words(words, &out.shape);
                (Data::U32(w), next)
            };
            let state = if x[0].dtype() == DType::U64 {
                Data::U64(crate::rng::state_of(next).to_vec())
            } else {
                Data::U32(next.to_vec())
            };
            vec![
                Literal::new(types[0].clone(), state).expect(VERIFIED),
                Literal::new(out.clone(), data).expect(VERIFIED),
            ]
        }
        Op::OptimizationBarrier {} => x.iter().map(|l| (*l).clone()).collect(),
        // The loop runs until `cond` says stop; one that never does is the program's own.
        Op::While { cond, body } => {
            let mut carries: Vec<Literal> = x.iter().map(|l| (*l).clone()).collect();
            loop {
                let refs: Vec<&Literal> = carries.iter().collect();
                if !loop_goes_on(cond, &refs) {
                    return carries;
                }
                carries = crate::run(body, &refs);
            }
        }
        Op::Call { callee } => crate::run(
            callee
                .func
                .as_ref()
                .expect("a verified call holds its callee"),
            x,
        ),
        Op::Case { branches } => {
            let chosen = case_branch(x[0], branches.len());
            crate::run(&branches[chosen], &x[1..])
        }
        Op::Sort {
            dimension,
            comparator,
            ..
        } => crate::sort::sort(x, *dimension as usize, comparator),
        Op::ReduceRegion { dimensions, body } => {
            crate::reduce_region::reduce_region(x, dimensions, body, types)
        }
        Op::Map { computation, .. } => {
            vec![crate::reduce_region::map(x, computation, &types[0])]
        }
        // A failed collective leaves the interpreter (see `spmd::catch_abort`).
        Op::ReplicaId {}
        | Op::PartitionId {}
        | Op::AllGather { .. }
        | Op::AllReduce { .. }
        | Op::AllToAll { .. }
        | Op::ReduceScatter { .. }
        | Op::CollectivePermute { .. }
        | Op::CollectiveBroadcast { .. }
        | Op::CollectiveReduce { .. } => {
            crate::collective::eval(op, x, types).unwrap_or_else(|e| crate::spmd::abort(e))
        }
        Op::ReduceWindowRegion { body, .. } => {
            let w = kiln_ir::window_fold::Window::of(op).expect("a reduce_window_region");
            crate::reduce_region::reduce_window_region(x, &w, body, types)
        }
        Op::Cholesky { lower } => vec![crate::linalg::cholesky(x[0], *lower, &types[0])],
        Op::Fft {
            fft_type,
            fft_length,
        } => vec![crate::fft::fft(x[0], *fft_type, fft_length, &types[0])],
        Op::Lu {} => crate::linalg::lu(x[0], types),
        Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        } => vec![crate::linalg::triangular_solve(
            x[0],
            x[1],
            crate::linalg::Solve {
                left_side: *left_side,
                lower: *lower,
                unit_diagonal: *unit_diagonal,
                transpose_a: *transpose_a,
            },
            &types[0],
        )],
    }
}

/// The branch a `case` with `n` branches runs for the index `index` (an `i32[]`): the index
/// itself when it is in `0..n`, else the last branch.
pub fn case_branch(index: &Literal, n: usize) -> usize {
    match index.to_i64s().first() {
        Some(&i) if i >= 0 && (i as usize) < n => i as usize,
        _ => n.saturating_sub(1),
    }
}

/// Reduces elements of `src` into a result of type `ty` filled with `init`: `visit` calls its
/// argument with (result position, source position) pairs. Floats accumulate in f64 and round
/// once at the end.
fn reduce_into(
    src: &Literal,
    init: &Literal,
    ty: &TensorType,
    kind: Combiner,
    visit: impl FnOnce(&mut dyn FnMut(usize, usize)),
) -> Literal {
    let n = ty.numel();
    if ty.dtype.is_complex() {
        let s = src.to_complex_f64s();
        let mut acc = vec![init.to_complex_f64s()[0]; n];
        visit(&mut |o, i| acc[o] = combine_c(kind, acc[o], s[i]));
        Literal::from_complex_f64s(ty.clone(), &acc).expect(VERIFIED)
    } else if ty.dtype.is_float() {
        let s = src.to_f64s();
        let mut acc = vec![init.to_f64s()[0]; n];
        visit(&mut |o, i| acc[o] = combine_f(kind, acc[o], s[i]));
        from_lane(ty, Lane::F(acc))
    } else {
        let s = src.to_i64s();
        let mut acc = vec![init.to_i64s()[0]; n];
        visit(&mut |o, i| acc[o] = combine_i(kind, ty.dtype, acc[o], s[i]));
        from_lane(ty, Lane::I(acc))
    }
}

/// Combines `updates[k]` into `base[pos]` for each (pos, k), in order, rounding after each step
/// (as the kernels store each combination); for a small float, in f64 with the result rounded
/// once to the type, as every op on the small floats computes (`kiln_ir::minifloat`: the
/// compiled backends hold them in f32 and round an op's result once).
fn apply_updates(
    base: &Literal,
    updates: &Literal,
    kind: Combiner,
    writes: &[(usize, usize)],
) -> Literal {
    let ty = base.ty();
    if ty.dtype.is_complex() {
        let mut v = base.to_complex_f64s();
        let u = updates.to_complex_f64s();
        let round = |z: [f64; 2]| z.map(|p| kiln_ir::literal::round_to(ty.dtype, p));
        for &(p, k) in writes {
            v[p] = round(combine_c(kind, v[p], u[k]));
        }
        Literal::from_complex_f64s(ty.clone(), &v).expect(VERIFIED)
    } else if ty.dtype.is_float() {
        let mut v = base.to_f64s();
        let u = updates.to_f64s();
        let once = ty.dtype.mini().is_some();
        for &(p, k) in writes {
            let c = combine_f(kind, v[p], u[k]);
            v[p] = if once {
                c
            } else {
                kiln_ir::literal::round_to(ty.dtype, c)
            };
        }
        from_lane(ty, Lane::F(v))
    } else {
        let mut v = base.to_i64s();
        let u = updates.to_i64s();
        for &(p, k) in writes {
            v[p] = combine_i(kind, ty.dtype, v[p], u[k]);
        }
        from_lane(ty, Lane::I(v))
    }
}

/// Where dimension `d` of a gather's or scatter's indices sits among its batch dimensions
/// (the indices' dimensions without `index_vector_dim`).
fn batch_position(d: i64, ivd: usize) -> usize {
    let d = d as usize;
    if d < ivd { d } else { d - 1 }
}

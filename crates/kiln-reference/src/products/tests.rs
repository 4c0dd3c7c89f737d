//! The row-at-a-time sums against their plain per-element definitions, bit for bit, on small
//! random shapes and on 1, 2, 3 and 8 threads.

use super::*;
use kiln_ir::random::Rng;
use kiln_ir::{DType, Op, type_rule};

/// The linear position of multi-index `idx` under `strides`.
fn at(idx: &[usize], strides: &[usize]) -> usize {
    idx.iter().zip(strides).map(|(i, s)| i * s).sum()
}

/// A literal of `ty` from a sum computed both ways: `f` for floats, `i` for integers.
fn result(ty: &TensorType, f: &[f64], i: &[i64]) -> Literal {
    if ty.dtype.is_float() {
        Literal::from_f64s(ty.clone(), f).unwrap()
    } else {
        let i: Vec<i64> = i.iter().map(|&x| wrap_to(ty.dtype, x)).collect();
        Literal::from_i64s(ty.clone(), &i).unwrap()
    }
}

/// `dot_general` by its definition: result element (batch, lhs free, rhs free) is the sum,
/// from +0, over the contracting positions in row-major order, of lhs times rhs at the indices
/// those positions make.
fn naive_dot(a: &Literal, b: &Literal, ty: &TensorType, d: &DotDims) -> Literal {
    let (sa, sb) = (a.ty().strides(), b.ty().strides());
    let free = |rank: usize, x: &[i64], y: &[i64]| -> Vec<usize> {
        (0..rank)
            .filter(|&i| !x.contains(&(i as i64)) && !y.contains(&(i as i64)))
            .collect()
    };
    let lfree = free(a.ty().rank(), d.lb, d.lc);
    let rfree = free(b.ty().rank(), d.rb, d.rc);
    let cshape: Vec<usize> = d.lc.iter().map(|&i| a.shape()[i as usize]).collect();
    let (fa, fb, ia, ib) = (a.to_f64s(), b.to_f64s(), a.to_i64s(), b.to_i64s());
    let (nb, nl) = (d.lb.len(), lfree.len());
    let (mut fv, mut iv) = (Vec::new(), Vec::new());
    for_each_index(&ty.shape, |o| {
        let (mut f, mut i) = (0.0f64, 0i64);
        for_each_index(&cshape, |c| {
            let mut ai = vec![0; a.ty().rank()];
            let mut bi = vec![0; b.ty().rank()];
            for ((&l, &r), &i) in d.lb.iter().zip(d.rb).zip(o) {
                ai[l as usize] = i;
                bi[r as usize] = i;
            }
            for (k, &l) in lfree.iter().enumerate() {
                ai[l] = o[nb + k];
            }
            for (k, &r) in rfree.iter().enumerate() {
                bi[r] = o[nb + nl + k];
            }
            for ((&l, &r), &i) in d.lc.iter().zip(d.rc).zip(c) {
                ai[l as usize] = i;
                bi[r as usize] = i;
            }
            let (p, q) = (at(&ai, &sa), at(&bi, &sb));
            f += fa[p] * fb[q];
            i = i.wrapping_add(ia[p].wrapping_mul(ib[q]));
        });
        fv.push(f);
        iv.push(i);
    });
    result(ty, &fv, &iv)
}

/// `convolution` by its definition: result element (batch, output feature oc, spatial o) is
/// the sum, from +0, over the input features ic of oc's group and the kernel positions k in
/// row-major order, of the padded, dilated input at (batch, group's ic, o * stride + k *
/// rhs_dilation) times the kernel at (oc, ic, k); padding and dilation holes are zeros.
fn naive_conv(a: &Literal, w: &Literal, ty: &TensorType, c: &ConvAttrs) -> Literal {
    let sp = a.ty().rank() - 2;
    let (sa, sw) = (a.ty().strides(), w.ty().strides());
    let (id, kd, od) = (
        |i: usize| c.input_dims[i] as usize,
        |i: usize| c.kernel_dims[i] as usize,
        |i: usize| c.output_dims[i] as usize,
    );
    let k_in = w.shape()[kd(1)];
    let per_group = w.shape()[kd(0)] / c.feature_group_count as usize;
    let per_batch_group = w.shape()[kd(0)] / c.batch_group_count as usize;
    let out_batch = ty.shape[od(0)];
    let k_spatial: Vec<usize> = (0..sp).map(|i| w.shape()[kd(2 + i)]).collect();
    let (fa, fw, ia, iw) = (a.to_f64s(), w.to_f64s(), a.to_i64s(), w.to_i64s());
    let (mut fv, mut iv) = (Vec::new(), Vec::new());
    for_each_index(&ty.shape, |o| {
        let oc = o[od(1)];
        let (mut f, mut i) = (0.0f64, 0i64);
        for ic in 0..k_in {
            for_each_index(&k_spatial, |k| {
                let mut ai = vec![0; sp + 2];
                let mut wi = vec![0; sp + 2];
                ai[id(0)] = oc / per_batch_group * out_batch + o[od(0)];
                ai[id(1)] = oc / per_group * k_in + ic;
                wi[kd(0)] = oc;
                wi[kd(1)] = ic;
                let mut inside = true;
                for s in 0..sp {
                    wi[kd(2 + s)] = k[s];
                    let pos = o[od(2 + s)] as i64 * c.window_strides[s] - c.padding[s].0
                        + k[s] as i64 * c.rhs_dilation[s];
                    let dil = c.lhs_dilation[s];
                    if pos < 0 || pos % dil != 0 || pos / dil >= a.shape()[id(2 + s)] as i64 {
                        inside = false;
                    } else {
                        ai[id(2 + s)] = (pos / dil) as usize;
                    }
                }
                let q = at(&wi, &sw);
                let (x, xi) = if inside {
                    (fa[at(&ai, &sa)], ia[at(&ai, &sa)])
                } else {
                    (0.0, 0)
                };
                f += x * fw[q];
                i = i.wrapping_add(xi.wrapping_mul(iw[q]));
            });
        }
        fv.push(f);
        iv.push(i);
    });
    result(ty, &fv, &iv)
}

/// Equal types and elements bit for bit, except that any NaN matches any NaN (the payload an
/// addition keeps of two NaNs depends on its operands' order, which the compiler may swap).
fn assert_same(got: &Literal, want: &Literal, what: &str) {
    assert_eq!(got.ty(), want.ty(), "{what}");
    if want.dtype().is_float() {
        for (k, (x, y)) in got.to_f64s().iter().zip(want.to_f64s()).enumerate() {
            assert!(
                (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits(),
                "{what}: element {k} is {x:?}, the definition gives {y:?}"
            );
        }
    } else {
        assert_eq!(got.to_i64s(), want.to_i64s(), "{what}");
    }
}

/// A random permutation of 0..n.
fn permutation(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i + 1));
    }
    v
}

/// Random elements of `ty`: floats of mixed sizes with, in half the cases, -0, +0, infinities
/// and NaNs among them; integers over their whole range, so that products and sums wrap.
fn values(rng: &mut Rng, ty: &TensorType) -> Literal {
    let n = ty.numel();
    if ty.dtype.is_float() {
        let special = rng.chance(0.5);
        let v: Vec<f64> = (0..n)
            .map(|_| match rng.below(if special { 40 } else { 5 }) {
                0 => -0.0,
                1 => 0.0,
                5 => f64::INFINITY,
                6 => f64::NEG_INFINITY,
                7 => f64::NAN,
                _ => rng.uniform(-4.0, 4.0) * if rng.chance(0.1) { 1e30 } else { 1.0 },
            })
            .collect();
        Literal::from_f64s(ty.clone(), &v).unwrap()
    } else {
        let v: Vec<i64> = (0..n).map(|_| rng.next_u64() as i64).collect();
        Literal::from_i64s(ty.clone(), &v).unwrap()
    }
}

/// A dimension size: mostly 1-3, sometimes 0.
fn size(rng: &mut Rng) -> usize {
    if rng.chance(0.04) {
        0
    } else {
        1 + rng.below(3)
    }
}

/// The result type of `op` on `operands`, with the dtype `wide` declared when it is given.
fn result_type(op: &Op, operands: &[&TensorType], wide: Option<DType>) -> TensorType {
    let ty = type_rule(op, operands, None).unwrap().remove(0);
    match wide {
        Some(d) => {
            let declared = [ty.with_dtype(d)];
            type_rule(op, operands, Some(&declared[..]))
                .unwrap()
                .remove(0)
        }
        None => ty,
    }
}

/// Checks the row-at-a-time sums of `op` on `a` and `b` against `naive`, on several threads
/// and through [`crate::eval_op`].
fn check_case(
    op: &Op,
    a: &Literal,
    b: &Literal,
    ty: &TensorType,
    on: impl Fn(usize) -> Literal,
    naive: &Literal,
) {
    let what = format!("{op:?} on {} and {} into {ty}", a.ty(), b.ty());
    assert_same(
        &crate::eval_op(op, &[a, b], std::slice::from_ref(ty))[0],
        naive,
        &what,
    );
    for threads in [1, 2, 3, 8] {
        assert_same(&on(threads), naive, &format!("{what}, {threads} threads"));
    }
}

/// Random dot products: batching dimensions, several contracting dimensions, each role's
/// dimensions at random positions of each operand, widened results, every dtype.
#[test]
fn dot_general_is_its_definition() {
    let mut rng = Rng::new(30);
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
    ];
    for _ in 0..300 {
        let dtype = *rng.pick(&dtypes);
        let (nb, nc, nl, nr) = (rng.below(3), rng.below(4), rng.below(3), rng.below(3));
        let batch: Vec<usize> = (0..nb).map(|_| size(&mut rng)).collect();
        let contract: Vec<usize> = (0..nc).map(|_| size(&mut rng)).collect();
        // Each operand: its batch, contracting and free dimensions (in that order of roles)
        // placed at the positions of a random permutation.
        let mut operand = |free: usize| {
            let roles: Vec<usize> = [&batch[..], &contract[..]]
                .concat()
                .into_iter()
                .chain((0..free).map(|_| size(&mut rng)))
                .collect();
            let pos = permutation(&mut rng, roles.len());
            let mut shape = vec![0; roles.len()];
            for (k, &p) in pos.iter().enumerate() {
                shape[p] = roles[k];
            }
            let dims = |r: std::ops::Range<usize>| -> Vec<i64> {
                pos[r].iter().map(|&p| p as i64).collect()
            };
            (
                TensorType::new(dtype, shape),
                dims(0..nb),
                dims(nb..nb + nc),
            )
        };
        let ((ta, lb, lc), (tb, rb, rc)) = (operand(nl), operand(nr));
        let op = Op::DotGeneral {
            lhs_batching_dimensions: lb.clone(),
            rhs_batching_dimensions: rb.clone(),
            lhs_contracting_dimensions: lc.clone(),
            rhs_contracting_dimensions: rc.clone(),
        };
        let wide = match dtype {
            DType::F16 | DType::BF16 => Some(DType::F32),
            DType::I8 => Some(DType::I32),
            DType::I32 => Some(DType::I64),
            _ => None,
        }
        .filter(|_| rng.chance(0.3));
        let ty = result_type(&op, &[&ta, &tb], wide);
        let (a, b) = (values(&mut rng, &ta), values(&mut rng, &tb));
        let d = DotDims {
            lb: &lb,
            rb: &rb,
            lc: &lc,
            rc: &rc,
        };
        let naive = naive_dot(&a, &b, &ty, &d);
        check_case(
            &op,
            &a,
            &b,
            &ty,
            |t| dot_general_on(&a, &b, &ty, &d, t),
            &naive,
        );
    }
}

/// Random convolutions: 0 to 3 spatial dimensions, strides, padding (negative too), lhs and
/// rhs dilation, feature groups, random dimension orders of input, kernel and result, float
/// and integer dtypes.
#[test]
fn convolution_is_its_definition() {
    let mut rng = Rng::new(31);
    let dtypes = [DType::F32, DType::F64, DType::BF16, DType::I8, DType::I32];
    for _ in 0..300 {
        let dtype = *rng.pick(&dtypes);
        let sp = rng.below(4);
        let (groups, k_in, per_group) = (1 + rng.below(3), 1 + rng.below(2), 1 + rng.below(3));
        // The groups split the features, or else the batch.
        let by_batch = rng.below(2) == 1;
        let (feature_groups, batch_groups) = if by_batch { (1, groups) } else { (groups, 1) };
        let batch = batch_groups * size(&mut rng);
        let largest = if sp == 3 { 3 } else { 5 };
        let in_spatial: Vec<usize> = (0..sp).map(|_| 1 + rng.below(largest)).collect();
        let k_spatial: Vec<usize> = (0..sp).map(|_| size(&mut rng)).collect();
        // Canonical sizes [batch or output feature, feature, spatial...] placed by a random
        // permutation: `dims[i]` is the operand dimension of role i.
        let mut placed = |canonical: Vec<usize>| -> (TensorType, Vec<i64>) {
            let dims = permutation(&mut rng, canonical.len());
            let mut shape = vec![0; canonical.len()];
            for (i, &d) in dims.iter().enumerate() {
                shape[d] = canonical[i];
            }
            (
                TensorType::new(dtype, shape),
                dims.iter().map(|&d| d as i64).collect(),
            )
        };
        let (ta, input_dims) =
            placed([&[batch, feature_groups * k_in][..], &in_spatial[..]].concat());
        let (tw, kernel_dims) = placed([&[groups * per_group, k_in][..], &k_spatial[..]].concat());
        let output_dims: Vec<i64> = permutation(&mut rng, sp + 2)
            .into_iter()
            .map(|d| d as i64)
            .collect();
        let window_strides: Vec<i64> = (0..sp).map(|_| 1 + rng.below(3) as i64).collect();
        let padding: Vec<(i64, i64)> = (0..sp)
            .map(|_| (rng.below(4) as i64 - 1, rng.below(4) as i64 - 1))
            .collect();
        let lhs_dilation: Vec<i64> = (0..sp).map(|_| 1 + rng.below(3) as i64).collect();
        let rhs_dilation: Vec<i64> = (0..sp).map(|_| 1 + rng.below(2) as i64).collect();
        let op = Op::Convolution {
            window_strides: window_strides.clone(),
            padding: padding.clone(),
            lhs_dilation: lhs_dilation.clone(),
            rhs_dilation: rhs_dilation.clone(),
            feature_group_count: feature_groups as i64,
            input_dims: input_dims.clone(),
            kernel_dims: kernel_dims.clone(),
            output_dims: output_dims.clone(),
            batch_group_count: batch_groups as i64,
        };
        let c = ConvAttrs {
            window_strides: &window_strides,
            padding: &padding,
            lhs_dilation: &lhs_dilation,
            rhs_dilation: &rhs_dilation,
            feature_group_count: feature_groups as i64,
            input_dims: &input_dims,
            kernel_dims: &kernel_dims,
            output_dims: &output_dims,
            batch_group_count: batch_groups as i64,
        };
        let ty = result_type(&op, &[&ta, &tw], None);
        let (a, w) = (values(&mut rng, &ta), values(&mut rng, &tw));
        let naive = naive_conv(&a, &w, &ty, &c);
        check_case(
            &op,
            &a,
            &w,
            &ty,
            |t| convolution_on(&a, &w, &ty, &c, t),
            &naive,
        );
    }
}

/// Products that are all -0, and empty sums, are +0: the sums start from +0.
#[test]
fn sums_start_from_positive_zero() {
    let f32s = |shape: &[usize], v: &[f32]| Literal::f32(shape.to_vec(), v.to_vec()).unwrap();
    let dot = |a: &Literal, b: &Literal, ty: &TensorType| {
        let op = Op::DotGeneral {
            lhs_batching_dimensions: vec![],
            rhs_batching_dimensions: vec![],
            lhs_contracting_dimensions: vec![0],
            rhs_contracting_dimensions: vec![0],
        };
        crate::eval_op(&op, &[a, b], std::slice::from_ref(ty)).remove(0)
    };
    let scalar = TensorType::new(DType::F32, Vec::new());
    let negative = dot(
        &f32s(&[2], &[-0.0, 1.0]),
        &f32s(&[2], &[1.0, -0.0]),
        &scalar,
    );
    assert_eq!(negative.as_f32s().unwrap()[0].to_bits(), 0.0f32.to_bits());
    let empty = dot(&f32s(&[0], &[]), &f32s(&[0], &[]), &scalar);
    assert_eq!(empty.as_f32s().unwrap()[0].to_bits(), 0.0f32.to_bits());
}

/// A zero of padding still multiplies its weight: an infinite weight over the padding makes
/// NaN, over the input an infinity (to which the padding's `0 * 1` adds nothing).
#[test]
fn padding_times_an_infinite_weight_is_nan() {
    let op = Op::Convolution {
        window_strides: vec![1],
        padding: vec![(1, 1)],
        lhs_dilation: vec![1],
        rhs_dilation: vec![1],
        feature_group_count: 1,
        input_dims: vec![0, 1, 2],
        kernel_dims: vec![0, 1, 2],
        output_dims: vec![0, 1, 2],
        batch_group_count: 1,
    };
    let x = Literal::f32([1, 1, 2], vec![1.0, 1.0]).unwrap();
    let w = Literal::f32([1, 1, 2], vec![f32::INFINITY, 1.0]).unwrap();
    let ty = TensorType::new(DType::F32, [1, 1, 3]);
    let out = crate::eval_op(&op, &[&x, &w], &[ty]).remove(0);
    let v = out.as_f32s().unwrap();
    assert!(v[0].is_nan(), "{v:?}");
    assert_eq!(&v[1..], &[f32::INFINITY, f32::INFINITY]);
}

/// A product large enough to run on every core (past `PARALLEL_WORK`) is the definition's.
#[test]
fn a_product_split_across_threads_is_its_definition() {
    let mut rng = Rng::new(32);
    let (ta, tb) = (
        TensorType::new(DType::F32, [96, 112]),
        TensorType::new(DType::F32, [112, 100]),
    );
    let op = Op::DotGeneral {
        lhs_batching_dimensions: vec![],
        rhs_batching_dimensions: vec![],
        lhs_contracting_dimensions: vec![1],
        rhs_contracting_dimensions: vec![0],
    };
    let ty = result_type(&op, &[&ta, &tb], None);
    assert!(ty.numel() * 112 >= PARALLEL_WORK);
    let (a, b) = (values(&mut rng, &ta), values(&mut rng, &tb));
    let d = DotDims {
        lb: &[],
        rb: &[],
        lc: &[1],
        rc: &[0],
    };
    let naive = naive_dot(&a, &b, &ty, &d);
    check_case(
        &op,
        &a,
        &b,
        &ty,
        |t| dot_general_on(&a, &b, &ty, &d, t),
        &naive,
    );
}

//! `nn::scaled_dot_product_attention`: values against a direct computation in f64 (eager and
//! compiled), gradients against finite differences, and one fused kernel on the CPU.

use kiln::nn::scaled_dot_product_attention as sdpa;
use kiln::random::{key, normal, split};
use kiln::{DType, Tensor, jit};

/// The offset of batch index `i` of `out` (row-major) in an operand of batch shape `own`,
/// broadcast to `out` (NumPy rules: `own` aligned at the right, size-1 dimensions repeated).
fn batch_offset(i: usize, out: &[usize], own: &[usize]) -> usize {
    let (mut rest, mut off, mut stride) = (i, 0, 1);
    for (d, &n) in out.iter().enumerate().rev() {
        let idx = rest % n;
        rest /= n;
        let od = d as isize - (out.len() - own.len()) as isize;
        if od >= 0 {
            let m = own[od as usize];
            if m != 1 {
                off += idx * stride;
            }
            stride *= m;
        }
    }
    off
}

/// NumPy broadcasting of two shapes that broadcast.
fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| (i + s.len()).checked_sub(n).map_or(1, |j| s[j]);
    (0..n).map(|i| at(a, i).max(at(b, i))).collect()
}

/// How a case masks its scores.
#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    /// A `pred` mask of this shape: key `j` of query `i` at batch `b` is kept unless
    /// `(i + 2 j + b) % 5 == 0` (always when `i == j`, so that a causal mask leaves a key).
    Pred(&'static [usize]),
    /// A mask of the inputs' dtype of this shape, added to the scores.
    Add(&'static [usize]),
}

/// The mask's values, `[..mask shape]`, as f64 (1/0 for a pred mask).
fn mask_values(shape: &[usize], pred: bool, seed: u64) -> Vec<f64> {
    let n: usize = shape.iter().product();
    if pred {
        let (l, s) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        (0..n)
            .map(|f| {
                let (b, i, j) = (f / (l * s), f / s % l, f % s);
                f64::from((i + 2 * j + b) % 5 != 0 || i == j)
            })
            .collect()
    } else {
        normal(&key(seed), shape, DType::F64)
            .to_vec::<f64>()
            .unwrap()
    }
}

/// softmax(q kᵀ · scale + mask) v, directly, with broadcasting over the batch dimensions.
#[allow(clippy::too_many_arguments)]
fn direct(
    (q, sq): (&[f64], &[usize]),
    (k, sk): (&[f64], &[usize]),
    (v, sv): (&[f64], &[usize]),
    mask: Option<(&[f64], &[usize], bool)>,
    causal: bool,
    scale: f64,
    batch: &[usize],
) -> Vec<f64> {
    let (l, e) = (sq[sq.len() - 2], sq[sq.len() - 1]);
    let s = sk[sk.len() - 2];
    let ev = sv[sv.len() - 1];
    let nb: usize = batch.iter().product();
    let mut out = vec![0.0; nb * l * ev];
    for b in 0..nb {
        let qo = batch_offset(b, batch, &sq[..sq.len() - 2]) * l * e;
        let ko = batch_offset(b, batch, &sk[..sk.len() - 2]) * s * e;
        let vo = batch_offset(b, batch, &sv[..sv.len() - 2]) * s * ev;
        for i in 0..l {
            let mut w: Vec<f64> = (0..s)
                .map(|j| {
                    let mut x = (0..e)
                        .map(|t| q[qo + i * e + t] * k[ko + j * e + t])
                        .sum::<f64>()
                        * scale;
                    if let Some((m, ms, pred)) = mask {
                        // The mask broadcast to [..batch, l, s].
                        let mut full = batch.to_vec();
                        full.extend([l, s]);
                        let flat = (b * l + i) * s + j;
                        let mo = batch_offset(flat, &full, ms);
                        if pred {
                            if m[mo] == 0.0 {
                                x = f64::NEG_INFINITY;
                            }
                        } else {
                            x += m[mo];
                        }
                    }
                    if causal && j > i {
                        x = f64::NEG_INFINITY;
                    }
                    x
                })
                .collect();
            let max = w.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            w.iter_mut().for_each(|x| *x = (*x - max).exp());
            let sum: f64 = w.iter().sum();
            for c in 0..ev {
                out[(b * l + i) * ev + c] =
                    (0..s).map(|j| w[j] * v[vo + j * ev + c]).sum::<f64>() / sum;
            }
        }
    }
    out
}

/// Eager and compiled attention agree with the direct computation: L = S and L != S (both
/// ways, with a causal mask aligned at the top left), k and v broadcast over q's batch, pred
/// masks and additive masks broadcast from fewer dimensions, a causal mask combined with a
/// pred one, a given scale, and values wider than the keys.
#[test]
fn attention_matches_a_direct_computation() {
    type Case = (
        &'static [usize],
        &'static [usize],
        &'static [usize],
        Mask,
        bool,
        Option<f64>,
    );
    #[rustfmt::skip]
    let cases: &[Case] = &[
        (&[2, 3, 5, 4], &[2, 3, 5, 4], &[2, 3, 5, 4], Mask::None, false, None),
        (&[2, 3, 5, 4], &[2, 3, 7, 4], &[2, 3, 7, 6], Mask::None, true, None),
        (&[2, 7, 4], &[2, 5, 4], &[2, 5, 3], Mask::None, true, Some(0.3)),
        (&[2, 3, 5, 4], &[3, 7, 4], &[1, 3, 7, 6], Mask::Pred(&[5, 7]), false, None),
        (&[2, 3, 6, 4], &[2, 3, 6, 4], &[2, 3, 6, 2], Mask::Pred(&[2, 1, 6, 6]), true, None),
        (&[4, 6, 8], &[4, 9, 8], &[4, 9, 5], Mask::Add(&[4, 6, 9]), false, None),
        (&[6, 8], &[9, 8], &[9, 5], Mask::Add(&[9]), true, Some(2.0)),
    ];
    let ks = split(&key(20), 3);
    for (n, &(sq, sk, sv, mask, causal, scale)) in cases.iter().enumerate() {
        let [q, k, v] = [sq, sk, sv].map(|s| s.to_vec());
        let (tq, tk, tv) = (
            normal(&ks[0], &q, DType::F64),
            normal(&ks[1], &k, DType::F64),
            normal(&ks[2], &v, DType::F64),
        );
        let (mvals, mshape, pred) = match mask {
            Mask::None => (Vec::new(), &[][..], false),
            Mask::Pred(s) => (mask_values(s, true, 0), s, true),
            Mask::Add(s) => (mask_values(s, false, 30 + n as u64), s, false),
        };
        let tm = match mask {
            Mask::None => None,
            Mask::Pred(s) => Some(
                Tensor::from_vec(
                    mvals.iter().map(|&x| x != 0.0).collect::<Vec<_>>(),
                    s.to_vec(),
                )
                .unwrap(),
            ),
            Mask::Add(s) => Some(Tensor::from_vec(mvals.clone(), s.to_vec()).unwrap()),
        };
        let e = q[q.len() - 1];
        let batch = broadcast(
            &broadcast(&q[..q.len() - 2], &k[..k.len() - 2]),
            &v[..v.len() - 2],
        );
        let want = direct(
            (&tq.to_vec::<f64>().unwrap(), &q),
            (&tk.to_vec::<f64>().unwrap(), &k),
            (&tv.to_vec::<f64>().unwrap(), &v),
            tm.as_ref().map(|_| (&mvals[..], mshape, pred)),
            causal,
            scale.unwrap_or(1.0 / (e as f64).sqrt()),
            &batch,
        );
        let eager = sdpa(&tq, &tk, &tv, tm.as_ref(), causal, scale);
        let f = |(q, k, v, m): &(Tensor, Tensor, Tensor, Option<Tensor>)| {
            sdpa(q, k, v, m.as_ref(), causal, scale)
        };
        let compiled = jit(f)
            .call(&(tq.clone(), tk.clone(), tv.clone(), tm.clone()))
            .unwrap();
        let mut out_shape = batch.clone();
        out_shape.extend([q[q.len() - 2], v[v.len() - 1]]);
        for (how, got) in [("eager", eager), ("compiled", compiled)] {
            assert_eq!(got.shape(), out_shape, "case {n} ({how})");
            let got = got.to_vec::<f64>().unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
                    "case {n} ({how}), element {i}: {g} but directly {w}"
                );
            }
        }
    }
}

/// A query whose keys are all masked out gets NaN, as in PyTorch; the others are unaffected.
#[test]
fn a_query_with_every_key_masked_out_gets_nan() {
    let ks = split(&key(21), 3);
    let q = normal(&ks[0], &[3, 4], DType::F32);
    let [k, v] = [1, 2].map(|i| normal(&ks[i], &[4, 4], DType::F32));
    let keep = Tensor::from_vec(
        vec![
            true, true, false, true, //
            false, false, false, false, //
            true, false, false, false,
        ],
        [3, 4],
    )
    .unwrap();
    let out =
        jit(|(q, k, v, m): &(Tensor, Tensor, Tensor, Tensor)| sdpa(q, k, v, Some(m), false, None))
            .call(&(q, k, v.clone(), keep))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
    assert!(out[4..8].iter().all(|x| x.is_nan()), "{out:?}");
    assert!(out[..4].iter().chain(&out[8..]).all(|x| x.is_finite()));
    // The last query sees only key 0: its result is v's first row.
    assert_eq!(out[8..], v.to_vec::<f32>().unwrap()[..4]);
}

/// Gradients with respect to q, k, v and an additive mask, under a causal mask, match finite
/// differences.
#[test]
fn attention_gradients_match_finite_differences() {
    let ks = split(&key(22), 4);
    let x = (
        normal(&ks[0], &[2, 4, 3], DType::F64),
        normal(&ks[1], &[2, 5, 3], DType::F64),
        normal(&ks[2], &[2, 5, 2], DType::F64),
        normal(&ks[3], &[4, 5], DType::F64),
    );
    let w = normal(&key(23), &[2, 4, 2], DType::F64);
    let loss = |(q, k, v, m): &(Tensor, Tensor, Tensor, Tensor)| {
        (&sdpa(q, k, v, Some(m), true, Some(0.7)) * &w).sum_all()
    };
    let n = kiln::testing::check_grads(loss, &x, 1e-6, 1e-6).unwrap();
    assert_eq!(n, 24 + 30 + 20 + 20);
}

/// On the CPU, attention with or without a causal or pred mask compiles into one kernel: the
/// mask is computed (or read) in the softmax, and the product with v runs on each block of rows
/// as soon as its softmax is done.
#[test]
fn attention_compiles_to_one_chained_kernel() {
    let ks = split(&key(24), 3);
    let [q, k, v] = [0, 1, 2].map(|i| normal(&ks[i], &[2, 4, 40, 16], DType::F32));
    let keep = Tensor::iota(DType::I32, &[40, 40], 1).lt(&Tensor::scalar(30i32));
    for (mask, causal) in [(None, false), (None, true), (Some(keep), false)] {
        let f = |(q, k, v): &(Tensor, Tensor, Tensor)| sdpa(q, k, v, mask.as_ref(), causal, None);
        let func = kiln::lower::trace_ir(f, &(q.clone(), k.clone(), v.clone())).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&func, &Default::default()).unwrap();
        assert!(fusion.contains("// 1 kernels"), "{fusion}");
        assert!(fusion.contains("chained:"), "{fusion}");
        // The keys past each query (j > i, i.e. j - i > 0): blocks of them are skipped.
        assert_eq!(
            fusion.contains("masked: blocks where column * 1 + row * -1 + 0 > 0"),
            causal,
            "{fusion}"
        );
        let text = func.to_string();
        let stored = text
            .lines()
            .any(|l| l.contains("= constant") && l.contains("pred["));
        assert_eq!(stored, mask.is_some(), "{text}");
    }
}

/// `Tensor::iota` counts along its dimension: small (interpreted) and large (compiled) eager
/// tensors, and inside a trace, where it is recorded as an op rather than a constant.
#[test]
fn iota_counts_along_its_dimension_eagerly_and_traced() {
    for (shape, dim) in [(vec![3, 4], 0), (vec![3, 4], 1), (vec![300, 301], 1)] {
        let want: Vec<i64> = (0..shape[0] * shape[1])
            .map(|f| if dim == 0 { f / shape[1] } else { f % shape[1] } as i64)
            .collect();
        let eager = Tensor::iota(DType::I64, &shape, dim);
        assert_eq!(eager.to_vec::<i64>().unwrap(), want);
        let s = shape.clone();
        let traced = jit(move |x: &Tensor| &Tensor::iota(DType::F32, &s, dim) + x)
            .call(&Tensor::zeros(DType::F32, []))
            .unwrap();
        let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        assert_eq!(traced.to_vec::<f32>().unwrap(), want);
        let ir = kiln::lower::trace_ir(
            |x: &Tensor| &Tensor::iota(DType::F32, &shape, dim) + x,
            &Tensor::zeros(DType::F32, []),
        )
        .unwrap()
        .to_string();
        assert!(
            ir.contains(&format!("iota {{iota_dimension = {dim}}}")),
            "{ir}"
        );
    }
}

/// Attention over more keys than a block of rows can hold whole (20000) runs as one kernel
/// whose softmax is computed online, over blocks of keys, and matches the direct computation:
/// without a mask, causal (every key block after the first masked out), with a pred mask that
/// leaves each query only keys far along (its first blocks masked out, its running maximum -inf
/// until then) and one query none (NaN), and with values wider than one panel.
#[test]
fn long_attention_runs_online_in_one_kernel_and_matches_a_direct_computation() {
    let (l, s, e) = (37, 20000, 8);
    let ks = split(&key(25), 3);
    let q = normal(&ks[0], &[2, l, e], DType::F64);
    let k = normal(&ks[1], &[2, s, e], DType::F64);
    let far: Vec<bool> = (0..l * s)
        .map(|f| {
            let (i, j) = (f / s, f % s);
            i != 5 && j >= 17000 + 50 * i
        })
        .collect();
    let far_f: Vec<f64> = far.iter().map(|&x| f64::from(x)).collect();
    let mask_shape = [l, s];
    for (n, (mask, causal, ev)) in [(false, false, 5), (false, true, 5), (true, false, 70)]
        .into_iter()
        .enumerate()
    {
        let v = normal(&ks[2], &[2, s, ev], DType::F64);
        let tm = mask.then(|| Tensor::from_vec(far.clone(), [l, s]).unwrap());
        let f = |(q, k, v, m): &(Tensor, Tensor, Tensor, Option<Tensor>)| {
            sdpa(q, k, v, m.as_ref(), causal, None)
        };
        let x = (q.clone(), k.clone(), v.clone(), tm.clone());
        let func = kiln::lower::trace_ir(f, &x).unwrap();
        let fusion = kiln_codegen_llvm::cpu::describe_fusion(&func, &Default::default()).unwrap();
        assert!(
            fusion.contains("// 1 kernels") && fusion.contains("online:"),
            "{fusion}"
        );
        let want = direct(
            (&q.to_vec::<f64>().unwrap(), &[2, l, e]),
            (&k.to_vec::<f64>().unwrap(), &[2, s, e]),
            (&v.to_vec::<f64>().unwrap(), &[2, s, ev]),
            tm.as_ref().map(|_| (&far_f[..], &mask_shape[..], true)),
            causal,
            1.0 / (e as f64).sqrt(),
            &[2],
        );
        let got = jit(f).call(&x).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-12 * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()),
                "case {n}, element {i}: {g} but directly {w}"
            );
        }
        if mask {
            let row = |b: usize, i: usize| &got[(b * l + i) * ev..(b * l + i + 1) * ev];
            assert!(row(1, 5).iter().all(|x| x.is_nan()));
            assert!(row(1, 6).iter().all(|x| x.is_finite()));
        }
    }
}

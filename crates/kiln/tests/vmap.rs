//! `kiln::vmap`: batching over parameter trees, with `in_axes`/`out_axes`, nested, composed
//! with `grad` and `jit` both ways, through loops whose trip count differs per example, and
//! the errors of a wrong request.

use kiln::control::while_loop;
use kiln::{Tensor, Vmap, grad, jit, vmap};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

fn t(values: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(values, shape.to_vec()).unwrap()
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// Squared error of a one-neuron model on one example.
fn loss(w: &Tensor, x: &Tensor, y: &Tensor) -> Tensor {
    let p = x.mul(w).sum_all().tanh();
    let e = p.sub(y);
    e.mul(&e)
}

#[test]
fn per_example_gradients_agree_with_a_loop_both_ways() {
    let (n, d) = (5, 3);
    let w = t(data(d, 1), &[d]);
    let xs = t(data(n * d, 2), &[n, d]);
    let ys = t(data(n, 3), &[n]);
    // vmap(grad(loss)): one gradient per example.
    let per_example =
        vmap(|(w, x, y): &(Tensor, Tensor, Tensor)| grad(|w: &Tensor| loss(w, x, y))(w))
            .in_axes(&[None, Some(0), Some(0)])
            .call(&(w.clone(), xs.clone(), ys.clone()))
            .unwrap();
    assert_eq!(per_example.shape(), vec![n, d]);
    let mut looped = Vec::new();
    for i in 0..n {
        let (x, y) = (xs.index(i as isize), ys.index(i as isize));
        looped.extend(f32s(&grad(|w: &Tensor| loss(w, &x, &y))(&w)));
    }
    close(&f32s(&per_example), &looped);
    // grad(vmap(loss)) of the summed losses: the sum of the per-example gradients.
    let total = grad(|w: &Tensor| {
        vmap(|(w, x, y): &(Tensor, Tensor, Tensor)| loss(w, x, y))
            .in_axes(&[None, Some(0), Some(0)])
            .call(&(w.clone(), xs.clone(), ys.clone()))
            .unwrap()
            .sum_all()
    })(&w);
    let summed: Vec<f32> = (0..d)
        .map(|j| (0..n).map(|i| looped[i * d + j]).sum())
        .collect();
    close(&f32s(&total), &summed);
    // And under jit, both ways.
    let jitted = jit(|(w, xs, ys): &(Tensor, Tensor, Tensor)| {
        vmap(|(w, x, y): &(Tensor, Tensor, Tensor)| grad(|w: &Tensor| loss(w, x, y))(w))
            .in_axes(&[None, Some(0), Some(0)])
            .call(&(w.clone(), xs.clone(), ys.clone()))
            .unwrap()
    })
    .call(&(w.clone(), xs.clone(), ys.clone()))
    .unwrap();
    close(&f32s(&jitted), &looped);
    let inner_jit = jit(|(w, x, y): &(Tensor, Tensor, Tensor)| grad(|w: &Tensor| loss(w, x, y))(w));
    let mapped_jit = vmap(|args: &(Tensor, Tensor, Tensor)| inner_jit.call(args).unwrap())
        .in_axes(&[None, Some(0), Some(0)])
        .call(&(w.clone(), xs.clone(), ys.clone()))
        .unwrap();
    close(&f32s(&mapped_jit), &looped);
}

/// A small CNN on one NCHW example ([1, 2, 5, 5]): a 3x3 convolution to 4 channels, tanh, a
/// grouped (2 groups) stride-2 convolution, and the squared error against `y`.
fn cnn_loss((w1, w2): &(Tensor, Tensor), x: &Tensor, y: &Tensor) -> Tensor {
    let h = x.conv2d(w1, (1, 1), (1, 1), (1, 1), 1).tanh();
    let o = h.conv2d(w2, (2, 2), (0, 0), (1, 1), 2);
    let e = o.sub(y);
    e.mul(&e).sum_all()
}

#[test]
fn per_example_cnn_gradients_fold_the_batch_into_the_convolutions() {
    let n = 3;
    let w = (
        t(
            data(4 * 2 * 9, 21).iter().map(|v| v * 0.3).collect(),
            &[4, 2, 3, 3],
        ),
        t(
            data(4 * 2 * 9, 22).iter().map(|v| v * 0.3).collect(),
            &[4, 2, 3, 3],
        ),
    );
    let xs = t(data(n * 2 * 25, 23), &[n, 1, 2, 5, 5]);
    let ys = t(data(n * 4 * 4, 24), &[n, 1, 4, 2, 2]);
    let per_example_grad = |(w1, w2, x, y): &(Tensor, Tensor, Tensor, Tensor)| {
        grad(|w: &(Tensor, Tensor)| cnn_loss(w, x, y))(&(w1.clone(), w2.clone()))
    };
    let args = (w.0.clone(), w.1.clone(), xs.clone(), ys.clone());
    let axes = [None, None, Some(0), Some(0)];
    // vmap(grad(loss)): the weight gradients' convolutions have the batch in both operands.
    let (g1, g2) = vmap(per_example_grad).in_axes(&axes).call(&args).unwrap();
    assert_eq!(
        (g1.shape(), g2.shape()),
        (vec![n, 4, 2, 3, 3], vec![n, 4, 2, 3, 3])
    );
    let (mut l1, mut l2) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (x, y) = (xs.index(i as isize), ys.index(i as isize));
        let (a, b) = grad(|w: &(Tensor, Tensor)| cnn_loss(w, &x, &y))(&w);
        l1.extend(f32s(&a));
        l2.extend(f32s(&b));
    }
    close(&f32s(&g1), &l1);
    close(&f32s(&g2), &l2);
    let (j1, j2) = jit(|args: &(Tensor, Tensor, Tensor, Tensor)| {
        vmap(per_example_grad).in_axes(&axes).call(args).unwrap()
    })
    .call(&args)
    .unwrap();
    close(&f32s(&j1), &l1);
    close(&f32s(&j2), &l2);
    // An ensemble: a kernel per member, the input shared (only the kernel batched), and the
    // gradient of the members' summed losses through it.
    let w1s = t(
        data(n * 4 * 2 * 9, 25).iter().map(|v| v * 0.3).collect(),
        &[n, 4, 2, 3, 3],
    );
    let w2s = t(
        data(n * 4 * 2 * 9, 26).iter().map(|v| v * 0.3).collect(),
        &[n, 4, 2, 3, 3],
    );
    let (x, y) = (xs.index(0), ys.index(0));
    let members = |(w1s, w2s): &(Tensor, Tensor)| {
        vmap(|(w1, w2, x, y): &(Tensor, Tensor, Tensor, Tensor)| {
            cnn_loss(&(w1.clone(), w2.clone()), x, y)
        })
        .in_axes(&[Some(0), Some(0), None, None])
        .call(&(w1s.clone(), w2s.clone(), x.clone(), y.clone()))
        .unwrap()
    };
    let losses = members(&(w1s.clone(), w2s.clone()));
    let looped: Vec<f32> = (0..n)
        .map(|i| {
            let wi = (w1s.index(i as isize), w2s.index(i as isize));
            f32s(&cnn_loss(&wi, &x, &y))[0]
        })
        .collect();
    close(&f32s(&losses), &looped);
    let (e1, e2) = grad(|ws: &(Tensor, Tensor)| members(ws).sum_all())(&(w1s.clone(), w2s.clone()));
    for i in 0..n {
        let wi = (w1s.index(i as isize), w2s.index(i as isize));
        let (a, b) = grad(|w: &(Tensor, Tensor)| cnn_loss(w, &x, &y))(&wi);
        close(&f32s(&e1.index(i as isize)), &f32s(&a));
        close(&f32s(&e2.index(i as isize)), &f32s(&b));
    }
}

#[test]
fn in_axes_and_out_axes_move_the_batch() {
    // A matrix-vector product of each column of `m` (batched along dimension 1) with `v`.
    let m = t(data(12, 4), &[3, 4]);
    let v = t(data(3, 5), &[3]);
    let out = vmap(|(c, v): &(Tensor, Tensor)| c.mul(v).sum_all())
        .in_axes(&[Some(1), None])
        .call(&(m.clone(), v.clone()))
        .unwrap();
    let want: Vec<f32> = (0..4)
        .map(|j| (0..3).map(|i| f32s(&m)[i * 4 + j] * f32s(&v)[i]).sum())
        .collect();
    close(&f32s(&out), &want);
    // Each row scaled, the batch placed last: the transpose of the row-major result.
    let scaled = vmap(|r: &Tensor| r.mul(&Tensor::scalar(2.0f32)))
        .out_axes(&[Some(1)])
        .call(&m)
        .unwrap();
    assert_eq!(scaled.shape(), vec![4, 3]);
    let mt = f32s(&m.permute(&[1, 0]));
    close(
        &f32s(&scaled),
        &mt.iter().map(|x| 2.0 * x).collect::<Vec<_>>(),
    );
}

#[test]
fn nested_vmap_is_an_outer_product() {
    let a = t(vec![1.0, 2.0, 3.0], &[3]);
    let b = t(vec![10.0, 20.0], &[2]);
    let outer = vmap(|a: &Tensor| {
        vmap(|(a, b): &(Tensor, Tensor)| a.mul(b))
            .in_axes(&[None, Some(0)])
            .call(&(a.clone(), b.clone()))
            .unwrap()
    })
    .call(&a)
    .unwrap();
    assert_eq!(outer.shape(), vec![3, 2]);
    close(&f32s(&outer), &[10.0, 20.0, 20.0, 40.0, 30.0, 60.0]);
}

/// Newton's iteration for sqrt(a), until two iterates agree to a relative 1e-6: the number of
/// iterations depends on `a`.
fn newton_sqrt(a: &Tensor) -> Tensor {
    let half = Tensor::scalar(0.5f32);
    let (x, _) = while_loop(
        |(x, prev): &(Tensor, Tensor)| x.sub(prev).abs().gt(&x.mul(&Tensor::scalar(1e-6f32))),
        |(x, _): &(Tensor, Tensor)| (x.add(&a.div(x)).mul(&half), x.clone()),
        (Tensor::scalar(1.0f32), Tensor::scalar(0.0f32)),
    );
    x
}

#[test]
fn a_loop_whose_trip_count_differs_per_example() {
    let a = [2.0f32, 9.0, 0.25, 1e4];
    let batched = vmap(newton_sqrt).call(&t(a.to_vec(), &[4])).unwrap();
    let looped: Vec<f32> = a
        .iter()
        .map(|&x| f32s(&newton_sqrt(&Tensor::scalar(x)))[0])
        .collect();
    assert_eq!(
        f32s(&batched),
        looped,
        "each example stops at its own iteration"
    );
    let compiled = jit(|a: &Tensor| vmap(newton_sqrt).call(a).unwrap())
        .call(&t(a.to_vec(), &[4]))
        .unwrap();
    assert_eq!(f32s(&compiled), looped);
}

fn message(e: kiln::Error) -> String {
    let s = e.to_string();
    assert!(s.contains("vmap"), "{s}");
    assert!(
        s.contains("vmap.rs"),
        "the error names the caller's line: {s}"
    );
    s
}

#[test]
fn bad_requests_are_errors_naming_the_call() {
    let m = t(data(6, 6), &[2, 3]);
    let v = t(data(4, 7), &[4]);
    let f = |(a, b): &(Tensor, Tensor)| a.sum_all().add(&b.sum_all());
    let s = message(vmap(f).call(&(m.clone(), v.clone())).unwrap_err());
    assert!(
        s.contains("batch sizes differ") && s.contains('2') && s.contains('4'),
        "{s}"
    );
    let s = message(
        vmap(f)
            .in_axes(&[Some(2), None])
            .call(&(m.clone(), v.clone()))
            .unwrap_err(),
    );
    assert!(s.contains("in_axes[0] = 2 is out of range"), "{s}");
    let s = message(
        vmap(f)
            .in_axes(&[Some(0)])
            .call(&(m.clone(), v.clone()))
            .unwrap_err(),
    );
    assert!(s.contains("in_axes has 1 entries"), "{s}");
    let s = message(
        vmap(f)
            .in_axes(&[None, None])
            .call(&(m.clone(), v.clone()))
            .unwrap_err(),
    );
    assert!(s.contains("no leaf"), "{s}");
    let s = message(
        vmap(|a: &Tensor| a.sum_all())
            .out_axes(&[Some(1)])
            .call(&m)
            .unwrap_err(),
    );
    assert!(s.contains("out_axes[0] = 1 is out of range"), "{s}");
    let s = message(
        vmap(|a: &Tensor| a.sum_all())
            .out_axes(&[Some(0), Some(0)])
            .call(&m)
            .unwrap_err(),
    );
    assert!(s.contains("out_axes has 2 entries"), "{s}");
    let s = message(
        vmap(|a: &Tensor| a.sum_all())
            .out_axes(&[None])
            .call(&m)
            .unwrap_err(),
    );
    assert!(
        s.contains("out_axes[0] is None") && s.contains("depends on the batch"),
        "{s}"
    );
}

#[test]
fn out_axes_none_returns_what_does_not_depend_on_the_batch_once() {
    let w = t(data(3, 8), &[3]);
    let xs = t(data(12, 9), &[4, 3]);
    // A per-example product and the shared weights' squared norm, returned once.
    let f = |(w, x): &(Tensor, Tensor)| (w.mul(x), w.mul(w).sum_all());
    let axes = |v: Vmap<_>| v.in_axes(&[None, Some(0)]);
    let (ys, norm): (Tensor, Tensor) = axes(vmap(f))
        .out_axes(&[Some(1), None])
        .call(&(w.clone(), xs.clone()))
        .unwrap();
    assert_eq!((ys.shape(), norm.shape()), (vec![3, 4], vec![]));
    let wv = f32s(&w);
    close(&f32s(&norm), &[wv.iter().map(|x| x * x).sum()]);
    let xv = f32s(&xs);
    let want: Vec<f32> = (0..3)
        .flat_map(|j| (0..4).map(move |i| (i, j)))
        .map(|(i, j)| wv[j] * xv[i * 3 + j])
        .collect();
    close(&f32s(&ys), &want);
    // The same under jit, and with an output that does not depend on the batch but is asked
    // for batched: it is repeated per example.
    let (ys_j, norm_j): (Tensor, Tensor) = jit(|(w, xs): &(Tensor, Tensor)| {
        axes(vmap(f))
            .out_axes(&[Some(1), None])
            .call(&(w.clone(), xs.clone()))
            .unwrap()
    })
    .call(&(w.clone(), xs.clone()))
    .unwrap();
    close(&f32s(&ys_j), &want);
    close(&f32s(&norm_j), &f32s(&norm));
    let (_, repeated): (Tensor, Tensor) = axes(vmap(f))
        .out_axes(&[Some(0), Some(0)])
        .call(&(w.clone(), xs.clone()))
        .unwrap();
    assert_eq!(repeated.shape(), vec![4]);
    close(&f32s(&repeated), &[f32s(&norm)[0]; 4]);
    // An empty batch: the batched output is empty, the unbatched one still computed.
    let none = t(Vec::new(), &[0, 3]);
    let (ys0, norm0): (Tensor, Tensor) = axes(vmap(f))
        .out_axes(&[Some(0), None])
        .call(&(w.clone(), none))
        .unwrap();
    assert_eq!(ys0.shape(), vec![0, 3]);
    close(&f32s(&norm0), &f32s(&norm));
    // The gradient of the unbatched output flows to the shared weights once (2w), not per
    // example.
    let g = grad(|w: &Tensor| {
        let (_, n): (Tensor, Tensor) = axes(vmap(f))
            .out_axes(&[Some(0), None])
            .call(&(w.clone(), xs.clone()))
            .unwrap();
        n
    })(&w);
    close(&f32s(&g), &wv.iter().map(|x| 2.0 * x).collect::<Vec<_>>());
}

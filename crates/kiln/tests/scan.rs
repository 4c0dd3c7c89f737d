//! `kiln::control::scan`: outputs against a hand-written loop (forward, reverse, every
//! unrolling), gradients through it against the unrolled program and finite differences,
//! under `jit` and `vmap`, and the errors of a wrong request.

use kiln::control::{ScanOptions, scan, scan_with};
use kiln::testing::check_grads;
use kiln::{DType, Tensor, grad, jit, vmap};

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

fn m(values: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(values, shape.to_vec()).unwrap()
}

fn seq(n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 37 % 11) as f64 - 5.0) * scale)
        .collect()
}

/// An Elman RNN cell: h' = tanh(h W + x U); y = h' . v.
fn cell(p: &(Tensor, Tensor, Tensor), h: &Tensor, x: &Tensor) -> (Tensor, Tensor) {
    let (w, u, v) = p;
    let h2 = h.matmul(w).add(&x.matmul(u)).tanh();
    let y = h2.mul(v).sum_all();
    (h2, y)
}

fn params() -> (Tensor, Tensor, Tensor) {
    (
        m(seq(9, 0.1), &[3, 3]),
        m(seq(6, 0.2), &[2, 3]),
        m(seq(3, 0.3), &[3]),
    )
}

fn rnn(p: &(Tensor, Tensor, Tensor), xs: &Tensor, options: ScanOptions) -> (Tensor, Tensor) {
    scan_with(
        |h: &Tensor, x: &Tensor| cell(p, h, x),
        Tensor::zeros(DType::F64, [3]),
        xs,
        options,
    )
    .unwrap()
}

fn rnn_unrolled(p: &(Tensor, Tensor, Tensor), xs: &Tensor, reverse: bool) -> (Tensor, Vec<Tensor>) {
    let n = xs.shape()[0];
    let mut h = Tensor::zeros(DType::F64, [3]);
    let mut ys = vec![Tensor::scalar(0.0f64); n];
    for s in 0..n {
        let t = if reverse { n - 1 - s } else { s };
        let (h2, y) = cell(p, &h, &xs.index(t as isize));
        h = h2;
        ys[t] = y;
    }
    (h, ys)
}

#[test]
fn scan_matches_a_loop_forward_reverse_and_unrolled() {
    let p = params();
    let xs = m(seq(14, 0.25), &[7, 2]);
    for reverse in [false, true] {
        let (h_want, ys_want) = rnn_unrolled(&p, &xs, reverse);
        let ys_want: Vec<f64> = ys_want.iter().map(|y| f64s(y)[0]).collect();
        for unroll in [1, 2, 3, 7, 9] {
            let options = ScanOptions {
                reverse,
                unroll,
                ..ScanOptions::default()
            };
            let (h, ys) = rnn(&p, &xs, options);
            close(&f64s(&h), &f64s(&h_want));
            close(&f64s(&ys), &ys_want);
            let (hj, ysj) = jit(|(p, xs): &((Tensor, Tensor, Tensor), Tensor)| rnn(p, xs, options))
                .call(&(p.clone(), xs.clone()))
                .unwrap();
            close(&f64s(&hj), &f64s(&h_want));
            close(&f64s(&ysj), &ys_want);
        }
    }
}

#[test]
fn gradients_through_scan_match_the_unrolled_program() {
    let p = params();
    let xs = m(seq(10, 0.25), &[5, 2]);
    let loss = |p: &(Tensor, Tensor, Tensor)| {
        let (h, ys) = rnn(p, &xs, ScanOptions::default());
        ys.mul(&ys).sum_all().add(&h.sum_all())
    };
    let loss_unrolled = |p: &(Tensor, Tensor, Tensor)| {
        let (h, ys) = rnn_unrolled(p, &xs, false);
        let mut l = h.sum_all();
        for y in &ys {
            l = l.add(&y.mul(y));
        }
        l
    };
    let g = grad(loss)(&p);
    let want = grad(loss_unrolled)(&p);
    for (a, b) in [(&g.0, &want.0), (&g.1, &want.1), (&g.2, &want.2)] {
        close(&f64s(a), &f64s(b));
    }
    assert_eq!(check_grads(loss, &p, 1e-6, 1e-6).unwrap(), 9 + 6 + 3);
    // Reverse and unrolled scans differentiate too.
    let loss_rev = |p: &(Tensor, Tensor, Tensor)| {
        let options = ScanOptions {
            reverse: true,
            unroll: 2,
            ..ScanOptions::default()
        };
        rnn(p, &xs, options).1.sum_all()
    };
    assert_eq!(check_grads(loss_rev, &p, 1e-6, 1e-6).unwrap(), 18);
}

#[test]
fn scan_under_vmap_is_a_batch_of_scans() {
    let p = params();
    let batch = m(seq(3 * 4 * 2, 0.2), &[3, 4, 2]);
    let batched = vmap(|xs: &Tensor| rnn(&p, xs, ScanOptions::default()).1)
        .call(&batch)
        .unwrap();
    assert_eq!(batched.shape(), vec![3, 4]);
    let mut want = Vec::new();
    for b in 0..3 {
        want.extend(f64s(&rnn(&p, &batch.index(b), ScanOptions::default()).1));
    }
    close(&f64s(&batched), &want);
}

#[test]
fn a_scan_without_inputs_takes_a_length() {
    // Powers of two: the carry doubles; the outputs are the carries before each step.
    let (last, ys) = scan_with(
        |c: &Tensor, _: &()| (c.mul(&Tensor::scalar(2.0f64)), c.clone()),
        Tensor::scalar(1.0f64),
        &(),
        ScanOptions {
            length: Some(5),
            ..ScanOptions::default()
        },
    )
    .unwrap();
    assert_eq!(f64s(&last), vec![32.0]);
    assert_eq!(f64s(&ys), vec![1.0, 2.0, 4.0, 8.0, 16.0]);
}

#[test]
fn bad_scans_are_errors_naming_the_call() {
    let xs = m(seq(6, 1.0), &[3, 2]);
    let short = m(seq(4, 1.0), &[2, 2]);
    let msg = |e: kiln::Error| {
        let s = e.to_string();
        assert!(s.contains("scan") && s.contains("scan.rs"), "{s}");
        s
    };
    let changes_type = scan(
        |c: &Tensor, x: &Tensor| (x.clone(), c.clone()),
        Tensor::scalar(0.0f64),
        &xs,
    );
    let s = msg(changes_type.unwrap_err());
    assert!(s.contains("f64[2]") && s.contains("f64[]"), "{s}");
    let uneven = scan(
        |c: &Tensor, (a, b): &(Tensor, Tensor)| (c.clone(), a.add(b)),
        Tensor::scalar(0.0f64),
        &(xs.clone(), short.clone()),
    );
    let s = msg(uneven.unwrap_err());
    assert!(s.contains("2 steps") && s.contains("expects 3"), "{s}");
    let scalar_input = scan(
        |c: &Tensor, x: &Tensor| (c.add(x), c.clone()),
        Tensor::scalar(0.0f64),
        &Tensor::scalar(1.0f64),
    );
    assert!(msg(scalar_input.unwrap_err()).contains("is a scalar"));
    let nothing = scan(
        |c: &Tensor, _: &()| (c.clone(), c.clone()),
        Tensor::scalar(0.0f64),
        &(),
    );
    assert!(msg(nothing.unwrap_err()).contains("needs inputs"));
    let zero_unroll = scan_with(
        |c: &Tensor, x: &Tensor| (c.clone(), x.clone()),
        Tensor::scalar(0.0f64),
        &xs,
        ScanOptions {
            unroll: 0,
            ..ScanOptions::default()
        },
    );
    assert!(msg(zero_unroll.unwrap_err()).contains("unroll"));
    let wrong_length = scan_with(
        |c: &Tensor, x: &Tensor| (c.clone(), x.clone()),
        Tensor::scalar(0.0f64),
        &xs,
        ScanOptions {
            length: Some(4),
            ..ScanOptions::default()
        },
    );
    assert!(msg(wrong_length.unwrap_err()).contains("the length"));
}

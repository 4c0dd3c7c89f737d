//! `kiln::control`: loops and branches over parameter trees, eager and under `jit`, their
//! gradients, and the errors of mismatched types.

use kiln::control::{cond, fori_loop, map, switch, while_loop};
use kiln::testing::check_grads;
use kiln::{Tensor, grad, jit, jvp, value_and_grad};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// Newton's iteration for sqrt(a): x <- (x + a / x) / 2 until two iterates agree to a
/// relative 1e-6 (an absolute tolerance below the spacing of f32s near sqrt(a) might never be met).
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
fn while_loop_runs_newton_for_sqrt_eagerly_and_compiled() {
    for a in [2.0f32, 9.0, 0.25, 1e4] {
        let want = a.sqrt();
        let eager = newton_sqrt(&Tensor::scalar(a));
        assert!(
            (f32s(&eager)[0] - want).abs() <= 1e-6 * want,
            "{a}: {eager:?}"
        );
        let compiled = jit(newton_sqrt).call(&Tensor::scalar(a)).unwrap();
        assert!(
            (f32s(&compiled)[0] - want).abs() <= 1e-6 * want,
            "{a}: {compiled:?}"
        );
    }
}

#[test]
fn fori_loop_sums_its_indices_and_a_captured_tensor() {
    // sum_{i=0}^{9} (i + v) with v = [1, 2]: 45 + 10 v.
    let v = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let run = |v: &Tensor| {
        fori_loop(
            0,
            10,
            |i: &Tensor, acc: &Tensor| acc.add(&i.cast(kiln::DType::F32)).add(v),
            Tensor::zeros(kiln::DType::F32, [2]),
        )
    };
    assert_eq!(f32s(&run(&v)), vec![55.0, 65.0]);
    assert_eq!(f32s(&jit(run).call(&v).unwrap()), vec![55.0, 65.0]);
    // No trip at all: the initial carries come back.
    let none = fori_loop(
        3,
        3,
        |_: &Tensor, acc: &Tensor| acc.add(&v),
        Tensor::zeros(kiln::DType::F32, [2]),
    );
    assert_eq!(f32s(&none), vec![0.0, 0.0]);
}

#[test]
fn cond_picks_a_branch_and_switch_clamps_its_index() {
    let x = Tensor::from_vec(vec![1.5f32, -2.0], [2]).unwrap();
    let pick = |p: bool| {
        cond(
            &Tensor::scalar(p),
            |x: &Tensor| x.mul(x),
            |x: &Tensor| x.neg(),
            x.clone(),
        )
    };
    assert_eq!(f32s(&pick(true)), vec![2.25, 4.0]);
    assert_eq!(f32s(&pick(false)), vec![-1.5, 2.0]);
    let traced = jit(|(p, x): &(Tensor, Tensor)| {
        cond(p, |x: &Tensor| x.mul(x), |x: &Tensor| x.neg(), x.clone())
    });
    let got = traced.call(&(Tensor::scalar(true), x.clone())).unwrap();
    assert_eq!(f32s(&got), vec![2.25, 4.0]);
    let branches: [&dyn Fn(&Tensor) -> Tensor; 3] = [
        &|x: &Tensor| x.add(x),
        &|x: &Tensor| x.mul(x),
        &|x: &Tensor| x.sub(x),
    ];
    for (k, want) in [
        (-5, vec![3.0, -4.0]),
        (1, vec![2.25, 4.0]),
        (9, vec![0.0, 0.0]),
    ] {
        let got = switch(&Tensor::scalar(k), &branches, x.clone()).unwrap();
        assert_eq!(f32s(&got), want, "index {k}");
    }
}

#[test]
fn the_gradient_of_cond_matches_finite_differences() {
    let x = Tensor::from_vec(vec![0.3f64, -0.7, 1.1], [3]).unwrap();
    for p in [true, false] {
        let f = move |x: &Tensor| {
            cond(
                &Tensor::scalar(p),
                |x: &Tensor| x.mul(x).sin().sum_all(),
                |x: &Tensor| x.exp().mul(x).sum_all(),
                x.clone(),
            )
        };
        let n = kiln::testing::check_grads(f, &x, 1e-6, 1e-6).unwrap();
        assert!(n > 0);
        // d/dx sum(sin(x^2)) = 2 x cos(x^2); d/dx sum(x e^x) = (1 + x) e^x.
        let g = grad(f)(&x).to_vec::<f64>().unwrap();
        for (i, &xi) in [0.3f64, -0.7, 1.1].iter().enumerate() {
            let want = if p {
                2.0 * xi * (xi * xi).cos()
            } else {
                (1.0 + xi) * xi.exp()
            };
            assert!((g[i] - want).abs() < 1e-12, "{p} {i}: {} vs {want}", g[i]);
        }
    }
}

#[test]
fn a_body_that_changes_a_carry_s_type_names_both_types_and_the_line() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let line = line!() + 1;
    let out = while_loop(
        |_: &Tensor| Tensor::scalar(false),
        |x: &Tensor| x.cast(kiln::DType::F64),
        x,
    );
    let e = out.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("(f64[2])") && e.contains("(f32[2])"), "{e}");
    assert!(e.contains(&format!("control.rs:{line}")), "{e}");
}

#[test]
fn branches_of_different_types_name_both_types_and_the_line() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let line = line!() + 1;
    let out = cond(
        &Tensor::scalar(true),
        |x: &Tensor| x.sum_all(),
        |x: &Tensor| x.clone(),
        x,
    );
    let e = out.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("(f32[])") && e.contains("(f32[2])"), "{e}");
    assert!(e.contains(&format!("control.rs:{line}")), "{e}");
    let bad = cond(
        &Tensor::scalar(1.0f32),
        |x: &Tensor| x.clone(),
        |x: &Tensor| x.clone(),
        Tensor::scalar(1.0f32),
    );
    let e = bad.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("pred[] scalar, got f32[]"), "{e}");
}

/// Newton's iteration for the square root in f64, run until it stops moving.
fn newton_sqrt64(a: &Tensor) -> Tensor {
    let half = Tensor::scalar(0.5f64);
    let (x, _) = while_loop(
        |(x, prev): &(Tensor, Tensor)| x.sub(prev).abs().gt(&x.mul(&Tensor::scalar(1e-13f64))),
        |(x, _): &(Tensor, Tensor)| (x.add(&a.div(x)).mul(&half), x.clone()),
        (Tensor::scalar(1.0f64), Tensor::scalar(0.0f64)),
    );
    x
}

#[test]
fn forward_mode_through_while_loop_differentiates_newton() {
    for a in [2.0f64, 9.0, 0.25, 1e4] {
        let (y, dy) = jvp(newton_sqrt64, &Tensor::scalar(a), &Tensor::scalar(3.0f64)).unwrap();
        let (y, dy) = (
            y.to_vec::<f64>().unwrap()[0],
            dy.to_vec::<f64>().unwrap()[0],
        );
        assert!((y - a.sqrt()).abs() <= 1e-12 * a.sqrt(), "{a}: {y}");
        let want = 3.0 * 0.5 / a.sqrt();
        assert!((dy - want).abs() <= 1e-9 * want, "{a}: {dy} vs {want}");
    }
    // In a branch: sqrt above 1, the square below.
    let f = |a: &Tensor| {
        cond(
            &a.gt(&Tensor::scalar(1.0f64)),
            newton_sqrt64,
            |a: &Tensor| a.mul(a),
            a.clone(),
        )
    };
    for (a, want) in [(16.0f64, 0.125), (0.5, 1.0)] {
        let (_, dy) = jvp(f, &Tensor::scalar(a), &Tensor::scalar(1.0f64)).unwrap();
        let dy = dy.to_vec::<f64>().unwrap()[0];
        assert!((dy - want).abs() <= 1e-9, "{a}: {dy} vs {want}");
    }
}

#[test]
fn reverse_mode_through_while_loop_says_to_use_fori_loop() {
    let x = Tensor::scalar(2.0f64);
    let r = value_and_grad(
        |x: &Tensor| newton_sqrt(&x.cast(kiln::DType::F32)).cast(kiln::DType::F64),
        &x,
    );
    let Err(e) = r else {
        panic!("reverse mode through a while_loop was accepted");
    };
    let e = e.to_string();
    assert!(e.contains("fori_loop"), "{e}");
}

/// A function of one slice that a loop and `map` both run: a small layer on a row and a
/// scalar, returning a vector and a scalar.
fn layer((x, s): &(Tensor, Tensor), w: &Tensor) -> (Tensor, Tensor) {
    let h = x.matmul(w).mul(s).tanh();
    let n = h.mul(&h).sum_all();
    (h, n)
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close64(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

fn vals(n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 29 % 13) as f64 - 6.0) * scale)
        .collect()
}

#[test]
fn map_agrees_with_a_loop_eagerly_and_under_jit() {
    let w = Tensor::from_vec(vals(12, 0.1), [4, 3]).unwrap();
    let xs = Tensor::from_vec(vals(20, 0.2), [5, 4]).unwrap();
    let ss = Tensor::from_vec(vals(5, 0.3), [5]).unwrap();
    // The loop: f on each slice, stacked.
    let (mut hs, mut ns) = (Vec::new(), Vec::new());
    for i in 0..5 {
        let (h, n) = layer(&(xs.index(i), ss.index(i)), &w);
        hs.extend(f64s(&h));
        ns.extend(f64s(&n));
    }
    let (h, n) = map(
        |p: &(Tensor, Tensor)| layer(p, &w),
        &(xs.clone(), ss.clone()),
    )
    .unwrap();
    assert_eq!((h.shape(), n.shape()), (vec![5, 3], vec![5]));
    close64(&f64s(&h), &hs);
    close64(&f64s(&n), &ns);
    let compiled = jit(|(w, xs, ss): &(Tensor, Tensor, Tensor)| {
        map(
            |p: &(Tensor, Tensor)| layer(p, w),
            &(xs.clone(), ss.clone()),
        )
        .unwrap()
    });
    let (hj, nj) = compiled.call(&(w.clone(), xs.clone(), ss.clone())).unwrap();
    close64(&f64s(&hj), &hs);
    close64(&f64s(&nj), &ns);
    // No slice at all: empty results of the stacked shapes.
    let none = Tensor::from_vec(Vec::<f64>::new(), [0, 4]).unwrap();
    let (h0, n0) = map(
        |x: &Tensor| layer(&(x.clone(), Tensor::scalar(1.0f64)), &w),
        &none,
    )
    .unwrap();
    assert_eq!((h0.shape(), n0.shape()), (vec![0, 3], vec![0]));
}

#[test]
fn map_differentiates_like_the_loop_and_under_jit() {
    let w = Tensor::from_vec(vals(12, 0.1), [4, 3]).unwrap();
    let xs = Tensor::from_vec(vals(20, 0.2), [5, 4]).unwrap();
    let ss = Tensor::from_vec(vals(5, 0.3), [5]).unwrap();
    let loss = |w: &Tensor| {
        let (h, n) = map(
            |p: &(Tensor, Tensor)| layer(p, w),
            &(xs.clone(), ss.clone()),
        )
        .unwrap();
        h.sum_all().add(&n.mul(&n).sum_all())
    };
    let loss_loop = |w: &Tensor| {
        let mut l = Tensor::scalar(0.0f64);
        for i in 0..5 {
            let (h, n) = layer(&(xs.index(i), ss.index(i)), w);
            l = l.add(&h.sum_all()).add(&n.mul(&n));
        }
        l
    };
    let want = f64s(&grad(loss_loop)(&w));
    close64(&f64s(&grad(loss)(&w)), &want);
    close64(&f64s(&jit(grad(loss)).call(&w).unwrap()), &want);
    assert_eq!(check_grads(loss, &w, 1e-6, 1e-6).unwrap(), 12);
    // With respect to the mapped inputs too: each slice's gradient lands in its row.
    let gx = grad(|xs: &Tensor| {
        map(|x: &Tensor| x.mul(x).mul(x).sum_all(), xs)
            .unwrap()
            .sum_all()
    })(&xs);
    let want: Vec<f64> = f64s(&xs).iter().map(|x| 3.0 * x * x).collect();
    close64(&f64s(&gx), &want);
}

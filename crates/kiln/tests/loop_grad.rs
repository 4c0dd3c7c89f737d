//! Reverse and forward mode through loops with a static trip count (`fori_loop`): gradients
//! against the same computation unrolled and against finite differences, second order, under
//! `jit`, with captured tensors, with no trip, and with an output collected window by window.

use kiln::control::fori_loop;
use kiln::testing::check_grads;
use kiln::{DType, Tensor, grad, jit, jvp};

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

fn v(values: &[f64]) -> Tensor {
    Tensor::from_vec(values.to_vec(), [values.len()]).unwrap()
}

/// One step of a small recurrence: v <- sin(v * w) + v * i / 10.
fn step(i: &Tensor, h: &Tensor, w: &Tensor) -> Tensor {
    h.mul(w)
        .sin()
        .add(&h.mul(&i.cast(DType::F64).mul(&Tensor::scalar(0.1f64))))
}

fn looped(w: &Tensor, n: i32) -> Tensor {
    let h0 = Tensor::from_vec(vec![0.3f64, -0.7, 1.1], [3]).unwrap();
    fori_loop(0, n, |i: &Tensor, h: &Tensor| step(i, h, w), h0).sum_all()
}

fn unrolled(w: &Tensor, n: i32) -> Tensor {
    let mut h = Tensor::from_vec(vec![0.3f64, -0.7, 1.1], [3]).unwrap();
    for i in 0..n {
        h = step(&Tensor::scalar(i), &h, w);
    }
    h.sum_all()
}

#[test]
fn the_gradient_through_a_fori_loop_is_the_unrolled_gradient() {
    let w = v(&[0.9, 1.3, -0.4]);
    for n in [0, 1, 2, 7] {
        let g = grad(|w: &Tensor| looped(w, n))(&w);
        let want = grad(|w: &Tensor| unrolled(w, n))(&w);
        close(&f64s(&g), &f64s(&want));
        // Under jit, compiled by the CPU backend.
        let gj = jit(|w: &Tensor| grad(|w: &Tensor| looped(w, n))(w))
            .call(&w)
            .unwrap();
        close(&f64s(&gj), &f64s(&want));
    }
    let checked = check_grads(|w: &Tensor| looped(w, 5), &w, 1e-6, 1e-6).unwrap();
    assert_eq!(checked, 3);
}

#[test]
fn second_order_and_forward_mode_through_a_fori_loop() {
    let w = v(&[0.9, 1.3, -0.4]);
    // The gradient of a component of the gradient: a loop differentiated twice.
    let hess_row = grad(|w: &Tensor| grad(|w: &Tensor| looped(w, 4))(w).index(1))(&w);
    let want = grad(|w: &Tensor| grad(|w: &Tensor| unrolled(w, 4))(w).index(1))(&w);
    close(&f64s(&hess_row), &f64s(&want));
    // Forward mode (the loop carrying its tangents).
    let t = v(&[1.0, -2.0, 0.5]);
    let (y, dy) = jvp(|w: &Tensor| looped(w, 4), &w, &t).unwrap();
    let (y2, dy2) = jvp(|w: &Tensor| unrolled(w, 4), &w, &t).unwrap();
    close(&f64s(&y), &f64s(&y2));
    close(&f64s(&dy), &f64s(&dy2));
}

#[test]
fn a_loop_collecting_an_output_per_step_differentiates_without_storing_it() {
    // ys[i] = h_i * w, collected by dynamic_update_slice into a [n, 3] buffer, as scan does.
    let w = v(&[0.9, 1.3, -0.4]);
    let n = 6;
    let collect = |w: &Tensor| {
        let h0 = Tensor::from_vec(vec![0.3f64, -0.7, 1.1], [3]).unwrap();
        let ys0 = Tensor::zeros(DType::F64, [n as usize, 3]);
        let (_, ys) = fori_loop(
            0,
            n,
            |i: &Tensor, (h, ys): &(Tensor, Tensor)| {
                let y = h.mul(w).reshape(&[1, 3]);
                let zero = Tensor::scalar(0i32);
                (step(i, h, w), ys.dynamic_update_slice(&y, &[i, &zero]))
            },
            (h0, ys0),
        );
        ys.mul(&ys).sum_all()
    };
    let checked = check_grads(collect, &w, 1e-6, 1e-6).unwrap();
    assert_eq!(checked, 3);
}

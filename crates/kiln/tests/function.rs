//! `Function`: a closure traced once and called many times, as the IR's `call`, eagerly, under
//! `jit`, `grad` and `vmap`; bad calls are errors naming the caller's line.

use kiln::{Function, Tensor, grad, jit, vmap};

fn v(values: &[f64]) -> Tensor {
    Tensor::from_vec(values.to_vec(), [values.len()]).unwrap()
}

fn close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(want) {
        assert!(
            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

/// `sin(x) * w + x`, with `w` captured from outside.
fn layer(w: &Tensor, x: &Tensor) -> Tensor {
    x.sin() * w + x
}

#[test]
fn calls_compute_what_the_closure_does_eagerly_and_compiled() {
    let w = v(&[0.5, -1.5, 2.0]);
    let x = v(&[0.25, 1.0, -2.0]);
    let f = Function::trace("layer", |x: &Tensor| layer(&w, x), &x).unwrap();
    let want = layer(&w, &layer(&w, &x)).to_vec::<f64>().unwrap();
    // Eagerly.
    close(&f.call(&f.call(&x)).to_vec::<f64>().unwrap(), &want);
    // Compiled: one function, called twice (the second time on the first's result).
    let j = jit(|x: &Tensor| f.call(&f.call(x)));
    close(&j.call(&x).unwrap().to_vec::<f64>().unwrap(), &want);
    let text = j.lower(&x).unwrap().to_string();
    assert_eq!(text.matches("{callee = @layer}").count(), 2, "{text}");
    assert_eq!(text.matches("func @layer(").count(), 1, "{text}");
}

#[test]
fn gradients_and_batches_flow_through_calls() {
    let w = v(&[0.5, -1.5, 2.0]);
    let x = v(&[0.25, 1.0, -2.0]);
    let f = Function::trace("layer", |x: &Tensor| layer(&w, x), &x).unwrap();
    let via_call = grad(|x: &Tensor| f.call(&f.call(x)).sum_all())(&x);
    let direct = grad(|x: &Tensor| layer(&w, &layer(&w, x)).sum_all())(&x);
    close(
        &via_call.to_vec::<f64>().unwrap(),
        &direct.to_vec::<f64>().unwrap(),
    );
    let xs = Tensor::from_vec(vec![0.25, 1.0, -2.0, 3.0, 0.0, 1.5], [2, 3]).unwrap();
    let batched: Tensor = vmap(|x: &Tensor| f.call(x)).call(&xs).unwrap();
    let rows: Vec<f64> = [v(&[0.25, 1.0, -2.0]), v(&[3.0, 0.0, 1.5])]
        .iter()
        .flat_map(|r| layer(&w, r).to_vec::<f64>().unwrap())
        .collect();
    close(&batched.to_vec::<f64>().unwrap(), &rows);
}

#[test]
fn a_call_on_other_types_is_an_error_naming_the_line() {
    let x = v(&[0.25, 1.0, -2.0]);
    let f = Function::trace("neg", |x: &Tensor| -x, &x).unwrap();
    let e = f
        .call(&v(&[1.0, 2.0]))
        .to_vec::<f64>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("Function::call"), "{e}");
    assert!(
        e.contains("@neg was traced for (f64[3]) but is called on (f64[2])"),
        "{e}"
    );
    assert!(e.contains("function.rs"), "{e}");
}

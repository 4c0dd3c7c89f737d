//! Eager transforms over data closed over by the function: the data are passed to the compiled
//! gradient, not printed into it, so each new batch of the same shape reuses the compiled
//! function (it used to compile once per batch, and print every value into the program's text
//! on every step).
//!
//! `set_backend` is process-wide, so this test has a binary of its own.

use kiln::backend::{Backend, Cpu, Executable, set_backend};
use kiln::ir::{Func, Op};
use kiln::random::{key, normal};
use kiln::{DType, Result, Tensor, value_and_grad, vjp};
use std::sync::{Arc, Mutex};

/// The CPU backend, keeping every function it compiles.
struct Recording(Mutex<Vec<Func>>);

impl Backend for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        self.0.lock().unwrap().push(f.clone());
        Cpu.compile(f)
    }
}

#[test]
fn batches_of_one_shape_compile_the_gradient_once() {
    let rec = Arc::new(Recording(Mutex::new(Vec::new())));
    set_backend(rec.clone());
    let w = normal(&key(1), &[64, 8], DType::F32);
    let mut losses = Vec::new();
    for step in 0..4 {
        // A new batch every step, closed over by the loss.
        let x = normal(&key(10 + step), &[128, 64], DType::F32);
        let loss = |w: &Tensor| (&x.matmul(w) * &x.matmul(w)).mean_all();
        let (l, g) = value_and_grad(loss, &w).unwrap();
        // The gradient is right: d/dw mean((xw)^2) = 2 x^T (x w) / numel.
        let want = &x.t().matmul(&x.matmul(&w)) * (2.0 / (128.0 * 8.0));
        let err = (&g - &want).abs().max(&[0, 1], false).item().unwrap();
        assert!(err < 1e-5, "step {step}: gradient off by {err}");
        losses.push(l.item().unwrap());
        // The pullback of a vjp takes the same path.
        let (_, pb) = vjp(|w: &Tensor| x.matmul(w), &w).unwrap();
        pb.call(&Tensor::ones(DType::F32, [128, 8])).unwrap();
    }
    assert!(losses.windows(2).all(|p| p[0] != p[1]), "{losses:?}");
    let compiled = rec.0.lock().unwrap();
    let named = |n: &str| compiled.iter().filter(|f| f.name == n).count();
    // The gradient and the vjp compile once each, whatever the batch.
    assert_eq!(named("f_value_and_grad"), 1);
    assert_eq!(named("f_vjp"), 1);
    let big: Vec<&Func> = compiled
        .iter()
        .filter(|f| f.name == "f_value_and_grad" || f.name == "f_vjp")
        .collect();
    // No batch is a constant of the program: it is a parameter.
    for f in &big {
        for i in &f.insts {
            if let Op::Constant { value } = &i.op {
                assert!(
                    value.numel() <= 1024,
                    "a {} constant in @{}",
                    value.ty(),
                    f.name
                );
            }
        }
        assert!(f.params.len() >= 2, "@{} takes the batch", f.name);
    }
}

//! Eager transforms over data closed over by the function: the data are passed to the compiled
//! gradient, not printed into it, so each new batch of the same shape reuses the compiled
//! function (it used to compile once per batch, and print every value into the program's text
//! on every step).
//!
//! Large eager arithmetic runs without a compiler, bit for bit as the reference computes it.
//!
//! `set_backend` is process-wide, so these tests have a binary of their own and share one
//! recording backend.

use kiln::backend::{Backend, Cpu, Executable, set_backend};
use kiln::ir::{Func, Op};
use kiln::random::{key, normal};
use kiln::{DType, Result, Tensor, value_and_grad, vjp};
use std::sync::{Arc, Mutex, OnceLock};

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

/// The one recording backend of this test binary (tests run side by side), installed once.
fn recording() -> Arc<Recording> {
    static REC: OnceLock<Arc<Recording>> = OnceLock::new();
    REC.get_or_init(|| {
        let rec = Arc::new(Recording(Mutex::new(Vec::new())));
        set_backend(rec.clone());
        rec
    })
    .clone()
}

#[test]
fn batches_of_one_shape_compile_the_gradient_once() {
    let rec = recording();
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

/// Large eager arithmetic (an optimizer's update) runs without compiling, and gives the
/// reference interpreter's bits, special values included.
#[test]
fn large_eager_arithmetic_compiles_nothing_and_matches_the_reference() {
    let rec = recording();
    let n = 70_000;
    let specials = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-310,
        -1.5,
    ];
    let values = |seed: u64| -> Vec<f64> {
        let u = kiln::random::uniform(&key(seed), &[n], DType::F64, -3.0, 3.0);
        let mut v = u.to_vec::<f64>().unwrap();
        for (i, x) in v.iter_mut().enumerate() {
            if i % 5 == 0 {
                *x = specials[(i / 5 + seed as usize) % specials.len()];
            }
        }
        v
    };
    for dtype in [DType::F32, DType::F64] {
        let a = Tensor::from_vec(values(1), [n]).unwrap().cast(dtype);
        let b = Tensor::from_vec(values(2), [n]).unwrap().cast(dtype);
        let before = rec.0.lock().unwrap().len();
        let ops: [(&str, Tensor, Op); 8] = [
            ("add", &a + &b, Op::Add {}),
            ("sub", &a - &b, Op::Subtract {}),
            ("mul", &a * &b, Op::Multiply {}),
            ("div", &a / &b, Op::Divide {}),
            ("maximum", a.maximum(&b), Op::Maximum {}),
            ("minimum", a.minimum(&b), Op::Minimum {}),
            ("neg", -&a, Op::Negate {}),
            ("abs", a.abs(), Op::Abs {}),
        ];
        for (name, got, op) in ops {
            let operands: Vec<&kiln::ir::Literal> = if matches!(op, Op::Negate {} | Op::Abs {}) {
                vec![a.literal().unwrap()]
            } else {
                vec![a.literal().unwrap(), b.literal().unwrap()]
            };
            let ty = kiln::ir::TensorType::new(dtype, [n]);
            let want = kiln::reference::eval_op(&op, &operands, std::slice::from_ref(&ty));
            let bits = |l: &kiln::ir::Literal| -> Vec<u64> {
                l.to_f64s()
                    .iter()
                    .map(|x| {
                        if x.is_nan() {
                            0x7FF8 << 48
                        } else {
                            x.to_bits()
                        }
                    })
                    .collect()
            };
            assert_eq!(
                bits(got.literal().unwrap()),
                bits(&want[0]),
                "{dtype} {name}"
            );
        }
        // Nothing compiled for them (the inputs' random bits and casts may have compiled).
        let compiled = rec.0.lock().unwrap();
        let eager: Vec<&String> = compiled[before..]
            .iter()
            .map(|f| &f.name)
            .filter(|n| n.starts_with("eager_"))
            .collect();
        assert!(eager.is_empty(), "{dtype}: compiled {eager:?}");
    }
}

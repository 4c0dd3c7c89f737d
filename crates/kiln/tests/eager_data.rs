//! Eager transforms over data closed over by the function: the data are passed to the compiled
//! gradient, not printed into it, so each new batch of the same shape reuses the compiled
//! function (it used to compile once per batch, and print every value into the program's text
//! on every step).
//!
//! Large eager ops run without a compiler, bit for bit as the reference computes them: an eager
//! training step compiles nothing the first time (and, but for its dot products and
//! transcendental functions, never).
//!
//! `set_backend` is process-wide, so these tests have a binary of their own and share one
//! recording backend; they run one at a time, so each sees only its own compiles.

use kiln::backend::{Backend, Cpu, Executable, set_backend};
use kiln::ir::{Func, Op};
use kiln::nn::{Mlp, cross_entropy};
use kiln::optim::Sgd;
use kiln::random::{key, normal};
use kiln::{DType, Result, Tensor, value_and_grad, vjp};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

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

/// Holds the other tests of this binary off while one runs.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The names of the functions compiled since the first `before` ones.
fn compiled_since(rec: &Recording, before: usize) -> Vec<String> {
    rec.0.lock().unwrap_or_else(|e| e.into_inner())[before..]
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

#[test]
fn batches_of_one_shape_compile_the_gradient_once() {
    let _serial = serial();
    let rec = recording();
    let start = rec.0.lock().unwrap_or_else(|e| e.into_inner()).len();
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
    let all = rec.0.lock().unwrap_or_else(|e| e.into_inner());
    let compiled = &all[start..];
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

/// A large eager `top_k` (a short prefix of long rows) runs as one compiled program whose sort
/// the kernel layer makes a top-k (one pass over each row's keys), where it used to compile
/// the sort alone and sort every row whole; a longer prefix still sorts whole. Its results
/// against a stable sort: `tests/sort.rs`.
#[test]
fn large_eager_top_k_runs_as_a_top_k() {
    let _serial = serial();
    let rec = recording();
    let x = normal(&key(3), &[8, 4096], DType::F32);
    let is_top_k = |f: &Func| {
        f.insts.iter().enumerate().any(|(i, inst)| {
            matches!(inst.op, Op::Sort { .. }) && kiln_kernel::sort::top_k(f, i).is_some()
        })
    };
    let compiled = |k: usize| {
        let before = rec.0.lock().unwrap_or_else(|e| e.into_inner()).len();
        let (v, p) = x.top_k(k, 1);
        assert_eq!(v.shape(), [8, k]);
        assert_eq!(p.to_vec::<i32>().unwrap().len(), 8 * k);
        rec.0.lock().unwrap_or_else(|e| e.into_inner())[before..].to_vec()
    };
    let five = compiled(5);
    assert!(
        five.iter().any(is_top_k),
        "{:?}",
        five.iter().map(|f| f.to_string()).collect::<Vec<_>>()
    );
    let whole = compiled(4096 / 8 + 1);
    assert!(!whole.iter().any(is_top_k), "{whole:?}");
}

/// Large eager arithmetic (an optimizer's update) runs without compiling, and gives the
/// reference interpreter's bits, special values included.
#[test]
fn large_eager_arithmetic_compiles_nothing_and_matches_the_reference() {
    let _serial = serial();
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
        let before = rec.0.lock().unwrap_or_else(|e| e.into_inner()).len();
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
        let compiled = rec.0.lock().unwrap_or_else(|e| e.into_inner());
        let eager: Vec<&String> = compiled[before..]
            .iter()
            .map(|f| &f.name)
            .filter(|n| n.starts_with("eager_"))
            .collect();
        assert!(eager.is_empty(), "{dtype}: compiled {eager:?}");
    }
}

/// An MLP of the benchmark's kind (one hidden layer, large enough that every weight and most
/// activations are eager ops of 65,536 elements or more), a batch and its labels.
fn mlp_case() -> (Mlp, Tensor, Tensor) {
    let m = Mlp::new(&key(3), &[300, 256, 10], DType::F32);
    let x = normal(&key(4), &[128, 300], DType::F32);
    let y = Tensor::from_vec((0..128i32).map(|i| i * 7 % 10).collect::<Vec<_>>(), [128]).unwrap();
    (m, x, y)
}

/// One SGD step with the gradient written out by hand, so that every op (the forward pass,
/// softmax cross-entropy, the backward pass's products and sums, the update) runs eagerly.
fn step_by_hand(m: &Mlp, x: &Tensor, y: &Tensor, lr: f64) -> (Mlp, f64) {
    let mut hs = vec![x.clone()];
    let mut zs = Vec::new();
    for (i, l) in m.layers.iter().enumerate() {
        let z = l.forward(hs.last().unwrap());
        if i + 1 < m.layers.len() {
            hs.push(z.relu());
        }
        zs.push(z);
    }
    let logits = zs.last().unwrap();
    let loss = cross_entropy(logits, y).item().unwrap();
    let batch = x.shape()[0] as f64;
    let onehot = y.one_hot(logits.shape()[1], DType::F32);
    let mut dz = &(&logits.softmax(-1) - &onehot) * (1.0 / batch);
    let mut layers = m.layers.clone();
    for i in (0..layers.len()).rev() {
        let dw = hs[i].t().matmul(&dz);
        let db = dz.sum(&[0], false);
        if i > 0 {
            let dh = dz.matmul(&layers[i].weight.t());
            let zero = Tensor::zeros(DType::F32, []);
            dz = zs[i - 1]
                .gt(&zero)
                .where_(&dh, &Tensor::zeros(DType::F32, dh.shape()));
        }
        let l = &mut layers[i];
        l.weight = &l.weight - &(&dw * lr);
        let b = l.bias.as_ref().unwrap();
        l.bias = Some(b - &(&db * lr));
    }
    (Mlp { layers }, loss)
}

/// The benchmark's eager step (`value_and_grad` compiles the gradient function; the update
/// runs op by op) compiles no eager op: not the first time, not later.
#[test]
fn an_eager_training_step_compiles_no_eager_op() {
    let _serial = serial();
    let rec = recording();
    let (mut m, x, y) = mlp_case();
    let opt = Sgd::new(0.01);
    let s = opt.init(&m);
    let before = rec.0.lock().unwrap_or_else(|e| e.into_inner()).len();
    for step in 0..3 {
        let (_, g) = value_and_grad(|m: &Mlp| cross_entropy(&m.forward(&x), &y), &m).unwrap();
        m = opt.update(&m, &g, &s).unwrap().0;
        let eager: Vec<String> = compiled_since(&rec, before)
            .into_iter()
            .filter(|n| n.starts_with("eager_"))
            .collect();
        assert!(eager.is_empty(), "step {step} compiled {eager:?}");
    }
}

/// A training step written op by op compiles nothing the first time; used again, only its
/// large dot products are compiled (their kernels are much faster than the native loop), once.
#[test]
fn a_training_step_written_op_by_op_compiles_nothing_the_first_time() {
    let _serial = serial();
    let rec = recording();
    let (m0, x, y) = mlp_case();
    let before = rec.0.lock().unwrap_or_else(|e| e.into_inner()).len();
    let (m1, l1) = step_by_hand(&m0, &x, &y, 0.01);
    assert_eq!(compiled_since(&rec, before), Vec::<String>::new(), "step 1");
    let (m2, l2) = step_by_hand(&m1, &x, &y, 0.01);
    let second = compiled_since(&rec, before);
    assert!(
        !second.is_empty() && second.iter().all(|n| n == "eager_dot_general"),
        "step 2 compiled {second:?}"
    );
    let (_, l3) = step_by_hand(&m2, &x, &y, 0.01);
    assert_eq!(compiled_since(&rec, before), second, "step 3");
    assert!(l1 > l2 && l2 > l3, "the loss falls: {l1}, {l2}, {l3}");
    // The same step through `value_and_grad`: the same parameters.
    let opt = Sgd::new(0.01);
    let (_, g) = value_and_grad(|m: &Mlp| cross_entropy(&m.forward(&x), &y), &m0).unwrap();
    let want = opt.update(&m0, &g, &opt.init(&m0)).unwrap().0;
    for (a, b) in m1.layers.iter().zip(&want.layers) {
        let err = (&a.weight - &b.weight)
            .abs()
            .max(&[0, 1], false)
            .item()
            .unwrap();
        assert!(err < 1e-6, "weights off by {err}");
    }
}

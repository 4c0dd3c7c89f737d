//! The user API: tracing, transforms, errors with source lines.

use kiln::{DType, Tensor, grad, jit, jvp, value_and_grad, vjp};

fn t64(v: Vec<f64>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape.to_vec()).unwrap()
}

#[test]
fn autograd_tutorial_values() {
    // x = [2, 3], w = [1.5, -0.5], b = 0.1: z = (x*w).sum() + b = 1.6.
    let x = Tensor::from_vec(vec![2.0f32, 3.0], [2]).unwrap();
    let w = Tensor::from_vec(vec![1.5f32, -0.5], [2]).unwrap();
    let b = Tensor::scalar(0.1f32);
    let z = |(x, w, b): &(Tensor, Tensor, Tensor)| (x * w).sum_all() + b;
    let args = (x.clone(), w.clone(), b);
    assert!((z(&args).item().unwrap() - 1.6).abs() < 1e-6);
    let (dx, dw, db) = grad(z)(&args);
    assert_eq!(dx.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
    assert_eq!(dw.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    assert_eq!(db.to_vec::<f32>().unwrap(), vec![1.0]);
}

/// Checks the second derivative of `f` along `v`: grad of x -> <grad f(x), v> against finite
/// differences of grad f.
fn check_second_order(name: &str, f: impl Fn(&Tensor) -> Tensor + Copy, x: &Tensor) {
    let v = t64(
        (0..x.shape().iter().product::<usize>())
            .map(|i| 0.3 + 0.1 * i as f64)
            .collect(),
        &x.shape(),
    );
    let h = |x: &Tensor| (grad(f)(x) * &v).sum_all();
    let n = kiln::testing::check_grads(h, x, 1e-5, 1e-5).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(n > 0);
}

#[test]
fn grad_of_grad() {
    let x = t64(vec![0.3, -0.7, 1.1, 0.5], &[4]);
    check_second_order("tanh", |x| x.tanh().sum_all(), &x);
    check_second_order("exp", |x| x.exp().sum_all(), &x);
    check_second_order("log", |x| (x * x + 1.0).log().sum_all(), &x);
    check_second_order("multiply", |x| (x * x * x).sum_all(), &x);
    check_second_order("softmax", |x| (x.softmax(-1) * x).sum_all(), &x);
    let m = t64(vec![0.3, -0.7, 1.1, 0.5, 0.2, -0.1], &[2, 3]);
    check_second_order("dot_general", |m| m.matmul(&m.t()).tanh().sum_all(), &m);
    // And the third order, to show transforms nest arbitrarily.
    let s = Tensor::scalar(0.4f64);
    let d3 = grad(|x: &Tensor| grad(|x: &Tensor| grad(|x: &Tensor| x.tanh())(x))(x))(&s)
        .item()
        .unwrap();
    let t = 0.4f64.tanh();
    let want = -2.0 * (1.0 - t * t) * (1.0 - 3.0 * t * t);
    assert!((d3 - want).abs() < 1e-12, "{d3} vs {want}");
}

#[test]
fn check_grads_on_cubic() {
    let x = t64(vec![0.5, -1.5, 2.0], &[3]);
    assert_eq!(
        kiln::testing::check_grads(|x: &Tensor| x.powf(3.0).sum_all(), &x, 1e-6, 1e-6).unwrap(),
        3
    );
}

#[test]
fn jit_caches_by_signature_and_reports_misses() {
    let f = jit(|(a, b): &(Tensor, Tensor)| a.matmul(b).relu());
    let a = t64(vec![1.0, -2.0, 3.0, 4.0], &[2, 2]);
    let r1 = f.call(&(a.clone(), a.clone())).unwrap();
    let r2 = f.call(&(a.clone(), a.clone())).unwrap();
    assert_eq!(r1.to_vec::<f64>().unwrap(), r2.to_vec::<f64>().unwrap());
    assert_eq!(r1.to_vec::<f64>().unwrap(), vec![0.0, 0.0, 15.0, 10.0]);
    assert_eq!(f.compiles(), 1);
    let b = t64(vec![1.0; 6], &[2, 3]);
    f.call(&(a.clone(), b)).unwrap();
    assert_eq!(f.compiles(), 2);
    let log = f.compile_log();
    assert!(log[1].contains("f64[2,3]"), "{log:?}");
    let ir = f.lower(&(a.clone(), a)).unwrap();
    assert!(ir.to_string().contains("dot_general"), "{ir}");
}

#[test]
fn jit_of_grad_and_grad_inside_jit() {
    let loss = |p: &Tensor| (p * p).sum_all();
    let step = jit(move |p: &Tensor| p - &(grad(loss)(p) * 0.25));
    let p = t64(vec![1.0, -2.0], &[2]);
    assert_eq!(
        step.call(&p).unwrap().to_vec::<f64>().unwrap(),
        vec![0.5, -1.0]
    );
    let traced = step.lower(&p).unwrap().to_string();
    assert!(traced.contains("multiply"), "{traced}");
}

#[test]
fn grad_inside_jit_captures_the_outer_trace() {
    // The inner grad's function uses `x` and `y` of the jit trace: they become captured
    // parameters of the gradient function, fed by the outer trace and not differentiated.
    let step = jit(|(w, x, y): &(Tensor, Tensor, Tensor)| {
        grad(|w: &Tensor| ((w * x) - y).powf(2.0).sum_all())(w)
    });
    let (w, x, y) = (
        t64(vec![1.0, 2.0], &[2]),
        t64(vec![3.0, 4.0], &[2]),
        t64(vec![0.0, 1.0], &[2]),
    );
    // d/dw sum((w x - y)^2) = 2 (w x - y) x = [18, 56].
    assert_eq!(
        step.call(&(w, x, y)).unwrap().to_vec::<f64>().unwrap(),
        vec![18.0, 56.0]
    );
}

#[test]
fn value_and_grad_aux_vjp_jvp() {
    let x = t64(vec![1.0, 2.0], &[2]);
    let (v, g) = value_and_grad(|x: &Tensor| (x * x).sum_all(), &x).unwrap();
    assert_eq!(v.item().unwrap(), 5.0);
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![2.0, 4.0]);
    let ((v, aux), g) =
        kiln::value_and_grad_with_aux(|x: &Tensor| ((x * 3.0).sum_all(), x.exp()), &x).unwrap();
    assert_eq!(v.item().unwrap(), 9.0);
    assert_eq!(aux.shape(), vec![2]);
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![3.0, 3.0]);
    let (y, pullback) = vjp(|x: &Tensor| x * x, &x).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![1.0, 4.0]);
    let ct = t64(vec![1.0, 10.0], &[2]);
    assert_eq!(
        pullback.call(&ct).unwrap().to_vec::<f64>().unwrap(),
        vec![2.0, 40.0]
    );
    let (y, ydot) = jvp(|x: &Tensor| x.sin(), &x, &t64(vec![1.0, 0.0], &[2])).unwrap();
    assert_eq!(y.to_vec::<f64>().unwrap(), vec![1f64.sin(), 2f64.sin()]);
    let d = ydot.to_vec::<f64>().unwrap();
    assert!((d[0] - 1f64.cos()).abs() < 1e-15 && d[1] == 0.0, "{d:?}");
}

#[test]
fn stop_gradient_blocks_the_gradient() {
    let x = t64(vec![3.0], &[1]);
    let g = grad(|x: &Tensor| (x * &kiln::stop_gradient(x)).sum_all())(&x);
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![3.0]);
}

#[test]
fn broadcasting_follows_numpy() {
    let a = t64(vec![1.0, 2.0, 3.0], &[3]);
    let b = t64(vec![10.0, 20.0], &[2, 1]);
    let c = &a + &b;
    assert_eq!(c.shape(), vec![2, 3]);
    assert_eq!(
        c.to_vec::<f64>().unwrap(),
        vec![11.0, 12.0, 13.0, 21.0, 22.0, 23.0]
    );
    let g = grad(|(a, b): &(Tensor, Tensor)| (a + b).sum_all())(&(a, b));
    assert_eq!(g.0.to_vec::<f64>().unwrap(), vec![2.0, 2.0, 2.0]);
    assert_eq!(g.1.to_vec::<f64>().unwrap(), vec![3.0, 3.0]);
}

#[test]
fn display_shows_values_or_types() {
    let x = Tensor::from_vec(vec![1.5f32, 2.0], [2]).unwrap();
    assert_eq!(x.to_string(), "[1.5, 2.0] : f32[2]");
    let f = jit(|x: &Tensor| {
        let s = format!("{x}");
        assert!(s.starts_with("traced %0 : f32[2]"), "{s}");
        x * 2.0
    });
    f.call(&x).unwrap();
}

/// Every bad input gives an error that names the op and this file's line, never a panic.
#[test]
#[rustfmt::skip]
fn bad_inputs_name_the_source_line() {
    let a = Tensor::from_vec(vec![1.0f32; 6], [2, 3]).unwrap();
    let v3 = Tensor::from_vec(vec![1.0f32; 3], [3]).unwrap();
    let v4 = Tensor::from_vec(vec![1.0f32; 4], [4]).unwrap();
    let i3 = Tensor::from_vec(vec![0i32, 1, 2], [3]).unwrap();
    let img = Tensor::zeros(DType::F32, [1, 3, 8, 8]);
    let ker = Tensor::zeros(DType::F32, [4, 2, 3, 3]);
    let mut cases: Vec<(u32, &str, kiln::Error)> = Vec::new();
    macro_rules! case {
        ($op:expr, $e:expr) => {{
            let line = line!();
            let r: kiln::Result<()> = (|| {
                let _ = $e?;
                Ok(())
            })();
            match r {
                Err(e) => cases.push((line, $op, e)),
                Ok(()) => panic!("line {line}: accepted, but should fail"),
            }
        }};
    }
    case!("add", (&a + &v4).to_literal());
    case!("add", (&v3 + &v4).to_literal());
    case!("mul", (&a * &Tensor::from_vec(vec![1.0f32; 4], [4, 1]).unwrap()).to_literal());
    case!("mean", a.mean(&[2], false).to_literal());
    case!("softmax", a.softmax(3).to_literal());
    case!("log_softmax", a.log_softmax(-3).to_literal());
    case!("matmul", a.matmul(&a).to_literal());
    case!("matmul", a.matmul(&v4).to_literal());
    case!("matmul", Tensor::scalar(1.0f32).matmul(&a).to_literal());
    case!("reshape", a.reshape(&[4, -1]).to_literal());
    case!("reshape", a.reshape(&[-1, -1]).to_literal());
    case!("squeeze", a.squeeze(0).to_literal());
    case!("sum", a.sum(&[2], false).to_literal());
    case!("sum", a.sum(&[1, -1], false).to_literal());
    case!("permute", a.permute(&[0, 0]).to_literal());
    case!("concat", Tensor::concat(&[&a, &v3], 0).to_literal());
    case!("concat", Tensor::concat(&[&v3, &a], 1).to_literal());
    case!("where", v3.where_(&v3, &v3).to_literal());
    case!("where", v3.gt(&v3).where_(&v3, &v4).to_literal());
    case!("take", a.take(&v3, 0).to_literal());
    case!("one_hot", v3.one_hot(3, DType::F32).to_literal());
    case!("conv2d", a.conv2d(&ker, (1, 1), (0, 0), (1, 1), 1).to_literal());
    case!("conv2d", img.conv2d(&ker, (1, 1), (0, 0), (1, 1), 1).to_literal());
    case!("max_pool2d", a.max_pool2d((2, 2), (2, 2), (0, 0)).to_literal());
    case!("slice", a.slice(0, 0, 1, 0).to_literal());
    case!("index", a.index(5).to_literal());
    case!("t", v3.t().to_literal());
    case!("pad", a.pad(&[(1, 1)], 0.0).to_literal());
    case!("to_vec", a.to_vec::<i32>());
    case!("item", a.item());
    case!("to", a.to(kiln::Device::Cuda(1000)).to_literal());
    case!("from_vec", Tensor::from_vec(vec![1.0f32; 5], [2, 3]));
    case!("grad", grad(|x: &Tensor| x * 2.0)(&v3).to_literal());
    case!("grad", kiln::value_and_grad(|x: &Tensor| x.sum_all(), &i3).map(|_| ()));
    case!("tree", kiln::tree::zip_map(&(a.clone(), v3.clone()), &(v3.clone(), a.clone()), |x, y| x + y ));
    case!("optimizer", kiln::optim::Sgd::new(0.1).update(&vec![a.clone()], &vec![a.clone(), a.clone()], &kiln::optim::Sgd::new(0.1).init(&vec![a.clone()])).map(|_| ()));
    case!("jvp", jvp(|x: &Tensor| x.exp(), &v3, &v4).map(|_| ()));
    let sdpa = kiln::nn::scaled_dot_product_attention;
    let k54 = Tensor::zeros(DType::F32, [5, 4]);
    case!("scaled_dot_product_attention", sdpa(&a, &k54, &k54, None, false, None).to_literal());
    case!("scaled_dot_product_attention", sdpa(&a, &a, &k54, None, true, None).to_literal());
    case!("scaled_dot_product_attention", sdpa(&v3, &a, &a, None, false, None).to_literal());
    case!("scaled_dot_product_attention", sdpa(&a, &a, &a, Some(&v4.gt(&v4)), false, None).to_literal());
    case!("scaled_dot_product_attention", sdpa(&a, &a, &a, Some(&i3), false, None).to_literal());
    case!("iota", Tensor::iota(DType::F32, &[2], 1).to_literal());
    case!("add", jit(|x: &Tensor| x + &Tensor::zeros(DType::F32, [7])) .call(&v3) .map(|_| ()));
    let (_, pullback) = vjp(|x: &Tensor| x * x, &v3).unwrap();
    case!("pullback", pullback.call(&v4));
    case!("pullback", pullback.call(&i3));
    let bad_key = kiln::random::Key(v3.clone());
    case!("uniform", kiln::random::uniform(&bad_key, &[2], DType::F32, 0.0, 1.0).to_literal());
    case!("normal", kiln::random::normal(&bad_key, &[2], DType::F32).to_literal());
    case!("split", kiln::random::split(&bad_key, 2)[0].0.to_literal());
    case!("bits", kiln::random::bits(&kiln::random::key(1), &[usize::MAX, 2]).to_literal());
    assert!(cases.len() >= 25, "{} cases", cases.len());
    for (line, op, e) in &cases {
        let text = e.to_string();
        let loc = e
            .loc
            .unwrap_or_else(|| panic!("line {line}: no location in {text}"));
        assert!(
            loc.file.ends_with("api.rs"),
            "line {line}: located in {loc}, not this file: {text}"
        );
        assert_eq!(loc.line, *line, "located at {loc}: {text}");
        assert!(
            text.contains(op),
            "line {line}: `{op}` missing from: {text}"
        );
        // Messages speak the user's language: no Rust module paths, no doubled prefixes.
        assert!(!text.contains("::"), "line {line}: a Rust path in: {text}");
        assert!(!text.contains("bad arguments: bad arguments"), "line {line}: {text}");
    }
}

#[test]
fn custom_vjp_replaces_the_rule_but_not_the_value() {
    // f(x) = x^2 with a deliberately different rule: 10 * (2 x g).
    let f = kiln::custom_vjp(
        |x: &Tensor| x * x,
        |x: &Tensor, _y: &Tensor, g: &Tensor| &(x * g) * 20.0,
    );
    let x = t64(vec![1.5, -2.0], &[2]);
    assert_eq!(f(&x).to_vec::<f64>().unwrap(), vec![2.25, 4.0]);
    let g = grad(|x: &Tensor| f(x).sum_all())(&x);
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![30.0, -40.0]);
    // Gradient clipping, a rule that is not linear in the cotangent; inside jit too.
    let clip = kiln::custom_vjp(
        |x: &Tensor| x.clone(),
        |_x: &Tensor, _y: &Tensor, g: &Tensor| {
            g.maximum(&Tensor::scalar(-1.0f64))
                .minimum(&Tensor::scalar(1.0f64))
        },
    );
    let step = jit(|x: &Tensor| grad(|x: &Tensor| (clip(x) * 5.0).sum_all())(x));
    assert_eq!(
        step.call(&x).unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 1.0]
    );
    // Higher order: the rule's own ops are differentiated. d/dx of sum(20 x * 1) is 20.
    let second = grad(|x: &Tensor| grad(|x: &Tensor| f(x).sum_all())(x).sum_all())(&x);
    assert_eq!(second.to_vec::<f64>().unwrap(), vec![20.0, 20.0]);
    // The straight-through estimator: round forward, identity backward.
    let ste = kiln::custom_vjp(
        |x: &Tensor| x.round(),
        |_x: &Tensor, _y: &Tensor, g: &Tensor| g.clone(),
    );
    let step = jit(|x: &Tensor| grad(|x: &Tensor| (ste(x) * 5.0).sum_all())(x));
    assert_eq!(
        step.call(&x).unwrap().to_vec::<f64>().unwrap(),
        vec![5.0, 5.0]
    );
    assert_eq!(ste(&x).to_vec::<f64>().unwrap(), vec![2.0, -2.0]);
}

#[test]
fn call_donating_writes_results_into_donated_leaves_only() {
    let step = jit(|(w, g): &(Tensor, Tensor)| w - &(g * 0.5));
    let n = 64 * 64;
    let w = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), [64, 64]).unwrap();
    let g = Tensor::from_vec(vec![2.0f32; n], [64, 64]).unwrap();
    let want: Vec<f32> = (0..n).map(|i| i as f32 - 1.0).collect();
    let addr = w.literal().unwrap().as_ptr();
    // `w` is given up; `g` is still held here (a clone), so it is only read.
    let w1 = step.call_donating((w, g.clone())).unwrap();
    assert_eq!(w1.to_vec::<f32>().unwrap(), want);
    assert_eq!(w1.literal().unwrap().as_ptr(), addr, "updated in place");
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![2.0f32; n]);
    // A leaf the caller keeps a handle to is not overwritten.
    let kept = w1.clone();
    let w2 = step.call_donating((w1, g.clone())).unwrap();
    assert_eq!(kept.to_vec::<f32>().unwrap(), want);
    let want2: Vec<f32> = want.iter().map(|x| x - 1.0).collect();
    assert_eq!(w2.to_vec::<f32>().unwrap(), want2);
    assert_ne!(w2.literal().unwrap().as_ptr(), addr);
    // Same results as `call`.
    assert_eq!(
        step.call(&(kept, g)).unwrap().to_vec::<f32>().unwrap(),
        want2
    );
}

#[test]
fn matmul_in_computes_in_the_wider_type() {
    // bf16 operands, f32 products and sums: 256 + 1 + 2^-8 is exact in f32; a bf16 result
    // rounds it to 258.
    let a = Tensor::from_vec(vec![256.0f32, 1.0, 0.00390625], [1, 3])
        .unwrap()
        .cast(DType::BF16);
    let b = Tensor::from_vec(vec![1.0f32; 3], [3, 1])
        .unwrap()
        .cast(DType::BF16);
    let c = a.matmul_in(&b, DType::F32);
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![257.0 + 1.0 / 256.0]);
    let narrow = a.matmul(&b);
    assert_eq!(narrow.dtype(), DType::BF16);
    assert_eq!(
        narrow.cast(DType::F32).to_vec::<f32>().unwrap(),
        vec![258.0]
    );
    // Compiled, and differentiated: the gradients come back in bf16.
    let f = jit(|(a, b): &(Tensor, Tensor)| a.matmul_in(b, DType::F32));
    assert_eq!(
        f.call(&(a.clone(), b.clone()))
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![257.0 + 1.0 / 256.0]
    );
    let g = grad(|a: &Tensor| a.matmul_in(&b, DType::F32).sum_all())(&a);
    assert_eq!(g.dtype(), DType::BF16);
    assert_eq!(g.cast(DType::F32).to_vec::<f32>().unwrap(), vec![1.0; 3]);
    // i8 @ i8 in i32: no wrapping at i8's range.
    let x = Tensor::from_vec(vec![127i32, 127, -128, 1], [2, 2])
        .unwrap()
        .cast(DType::I8);
    let y = x.matmul_in(&x, DType::I32);
    assert_eq!(
        y.to_vec::<i32>().unwrap(),
        vec![16129 - 16256, 16129 + 127, -16256 - 128, -16256 + 1]
    );
    // A narrower type is refused, naming the operation.
    let bad = Tensor::from_vec(vec![1.0f32; 4], [2, 2]).unwrap();
    let e = bad
        .matmul_in(&bad, DType::BF16)
        .to_vec::<f32>()
        .unwrap_err();
    assert!(e.to_string().contains("matmul_in"), "{e}");
}

/// A traced program run one op at a time gives what `jit` gives, and arguments of the wrong
/// number or type are an error naming `run_op_by_op`, the program and the types.
#[test]
fn run_op_by_op_agrees_with_jit_and_checks_its_arguments() {
    let f = |(w, x): &(Tensor, Tensor)| x.matmul(w).tanh().sum(&[1], false).softmax(-1);
    let w = t64((0..12).map(|i| i as f64 * 0.1 - 0.5).collect(), &[4, 3]);
    let x = t64((0..8).map(|i| i as f64 * 0.2).collect(), &[2, 4]);
    let args = (w, x);
    let program = kiln::lower::trace_ir(f, &args).unwrap();
    let eager = kiln::lower::run_op_by_op(&program, &[&args.0, &args.1]).unwrap();
    let compiled = jit(f).call(&args).unwrap();
    let (e, c) = (
        eager[0].to_vec::<f64>().unwrap(),
        compiled.to_vec::<f64>().unwrap(),
    );
    assert_eq!(e.len(), 2);
    for (a, b) in e.iter().zip(&c) {
        assert!((a - b).abs() < 1e-12, "{e:?} vs {c:?}");
    }
    let err = kiln::lower::run_op_by_op(&program, &[&args.1])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("run_op_by_op")
            && err.contains("@main takes (f64[4,3], f64[2,4]), got (f64[2,4])"),
        "{err}"
    );
    assert!(err.contains("api.rs"), "{err}");
}

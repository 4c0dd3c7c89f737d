//! `kiln::remat`: rematerialized functions differentiate exactly like the originals under
//! every policy (eagerly traced and compiled, nested in a loop, twice; bit for bit but for
//! saving nothing in f32 attention blocks, a few ulps off), and save
//! memory: the compiled gradient's planned peak falls when each layer is rematerialized, no
//! policy peaks above the plain gradient, and a memory budget only moves the peak between
//! saving nothing and the plain gradient, never down as it grows.

use kiln::random::{key, normal, split};
use kiln::{DType, Remat, Tensor, grad, jit, remat, tag};

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// One layer: two products with a tanh between and after, one of them tagged.
fn layer(h: &Tensor, w: &(Tensor, Tensor)) -> Tensor {
    let a = tag(&h.matmul(&w.0).tanh(), "hidden");
    a.matmul(&w.1).tanh()
}

/// An MLP block with a residual: `h + gelu(h W1) W2`, the product before the gelu tagged (the
/// gelu's derivative reads its input, unlike tanh's).
fn gelu_layer(h: &Tensor, w: &(Tensor, Tensor)) -> Tensor {
    let z = tag(&h.matmul(&w.0), "hidden");
    h + &z.gelu(true).matmul(&w.1)
}

/// A single-head attention block with a residual: `h + softmax(h W1 (h W2)^T / 16) h`, the
/// scores tagged.
fn attention_layer(h: &Tensor, w: &(Tensor, Tensor)) -> Tensor {
    let scores = tag(
        &(&h.matmul(&w.0).matmul(&h.matmul(&w.1).t()) * (1.0 / 16.0)),
        "hidden",
    );
    h + &scores.softmax(-1).matmul(h)
}

type Layer = fn(&Tensor, &(Tensor, Tensor)) -> Tensor;

fn weights(n: usize, d: usize, dtype: DType) -> Vec<(Tensor, Tensor)> {
    let ks = split(&key(4), 2 * n);
    (0..n)
        .map(|i| {
            (
                &normal(&ks[2 * i], &[d, d], dtype) * (1.0 / d as f64).sqrt(),
                &normal(&ks[2 * i + 1], &[d, d], dtype) * (1.0 / d as f64).sqrt(),
            )
        })
        .collect()
}

fn loss(ws: &Vec<(Tensor, Tensor)>, x: &Tensor, layer: Layer, policy: Option<&Remat>) -> Tensor {
    let mut h = x.clone();
    for w in ws {
        h = match policy {
            Some(p) => {
                remat(|(h, w): &(Tensor, (Tensor, Tensor))| layer(h, w), p.clone())(&(h, w.clone()))
            }
            None => layer(&h, w),
        };
    }
    h.mul(&h).sum_all()
}

fn policies() -> Vec<Remat> {
    vec![
        Remat::SaveNothing,
        Remat::SaveMatrixProducts,
        Remat::SaveNamed(vec!["hidden".into()]),
        Remat::Budget(0),
        Remat::Budget(4 * 5 * 8),
        Remat::Budget(usize::MAX),
    ]
}

#[test]
fn every_policy_gives_the_original_gradients() {
    let ws = weights(3, 5, DType::F64);
    let x = normal(&key(5), &[4, 5], DType::F64);
    for layer in [layer as Layer, gelu_layer, attention_layer] {
        let want = grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, &x, layer, None))(&ws);
        let want_jit = jit(|ws: &Vec<(Tensor, Tensor)>| {
            grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, &x, layer, None))(ws)
        })
        .call(&ws)
        .unwrap();
        for p in policies() {
            let g = grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, &x, layer, Some(&p)))(&ws);
            let gj = jit(|ws: &Vec<(Tensor, Tensor)>| {
                grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, &x, layer, Some(&p)))(ws)
            })
            .call(&ws)
            .unwrap();
            for (((a, b), c), d) in g.iter().zip(&want).zip(&gj).zip(&want_jit) {
                assert_eq!(f64s(&a.0), f64s(&b.0), "{p:?}");
                assert_eq!(f64s(&a.1), f64s(&b.1), "{p:?}");
                assert_eq!(f64s(&c.0), f64s(&d.0), "{p:?}");
                assert_eq!(f64s(&c.1), f64s(&d.1), "{p:?}");
            }
        }
    }
    // Second order: the gradient of a gradient component through remat.
    let x1 = normal(&key(6), &[5], DType::F64);
    let f = |x: &Tensor| x.sin().mul(x).sum_all();
    let h = grad(|x: &Tensor| grad(|x: &Tensor| remat(f, Remat::SaveNothing)(x))(x).index(2))(&x1);
    let want = grad(|x: &Tensor| grad(f)(x).index(2))(&x1);
    assert_eq!(f64s(&h), f64s(&want));
    // Eagerly (nothing traced), remat is the function itself.
    let v = remat(f, Remat::SaveNothing)(&x1);
    assert_eq!(f64s(&v), f64s(&f(&x1)));
}

/// The planned peaks of the compiled gradient of six `layer`s on `[512, 256]` f32 (one
/// activation: 512 KiB), without remat and under each policy, checked: saving nothing peaks
/// below the plain gradient, no policy above it, and budgets move the peak between the two,
/// never down as they grow. Gradients agree with the plain ones bit for bit where `bitwise`,
/// else within 1e-5 of the largest gradient.
fn check_peaks(name: &str, layer: Layer, bitwise: bool) {
    let ws = weights(6, 256, DType::F32);
    let x = normal(&key(7), &[512, 256], DType::F32);
    let compiled = |policy: Option<Remat>| {
        jit(move |(ws, x): &(Vec<(Tensor, Tensor)>, Tensor)| {
            grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, x, layer, policy.as_ref()))(ws)
        })
    };
    let args = (ws.clone(), x.clone());
    let want = compiled(None).call(&args).unwrap();
    let peak = |policy: Option<Remat>| {
        let f = compiled(policy.clone());
        let g = f.call(&args).unwrap();
        let pairs = g
            .iter()
            .zip(&want)
            .flat_map(|(a, b)| [(&a.0, &b.0), (&a.1, &b.1)]);
        for (a, b) in pairs {
            let (a, b) = (f32s(a), f32s(b));
            if bitwise {
                assert_eq!(a, b, "{name}: {policy:?}");
            }
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            println!("{name}: {policy:?}: max |difference| {worst} of max |gradient| {scale}");
            assert!(
                worst <= 1e-5 * scale,
                "{name}: {policy:?}: {worst} of {scale}"
            );
        }
        f.peak_bytes(&args)
            .unwrap()
            .expect("the CPU backend plans memory")
    };
    let plain = peak(None);
    let nothing = peak(Some(Remat::SaveNothing));
    let products = peak(Some(Remat::SaveMatrixProducts));
    let named = peak(Some(Remat::SaveNamed(vec!["hidden".into()])));
    // Budgets of the whole program's peak: none fits 0; saving nothing fits `nothing`; the
    // plain gradient's keeping fits `plain`.
    let budgets = [0, nothing, (nothing + plain) / 2, plain, usize::MAX];
    let by_budget: Vec<usize> = budgets
        .iter()
        .map(|&b| peak(Some(Remat::Budget(b))))
        .collect();
    println!(
        "{name}: planned peak {plain} B without remat, {nothing} B saving nothing, {products} B \
         saving products, {named} B saving the tagged value; budgets {budgets:?} B: \
         {by_budget:?} B"
    );
    assert!(nothing < plain, "{name}: {nothing} >= {plain}");
    assert!(products <= plain, "{name}: {products} > {plain}");
    assert!(named <= plain, "{name}: {named} > {plain}");
    // The planned peak is within the budget, or the lowest there is (a budget below it); a
    // larger budget never peaks lower (it keeps at least as much); the plain gradient's peak
    // as the budget keeps no more than it.
    let lowest = by_budget[0];
    assert!(lowest <= nothing, "{name}: {lowest} > {nothing}");
    for (&p, &b) in by_budget.iter().zip(&budgets) {
        assert!(p <= b.max(lowest), "{name}: budget {b} peaks at {p}");
    }
    for (w, b) in by_budget.windows(2).zip(budgets.windows(2)) {
        assert!(w[0] <= w[1], "{name}: budgets {b:?} peak at {w:?}");
    }
    assert!(
        by_budget[3] <= plain && by_budget[4] <= plain,
        "{name}: {by_budget:?}"
    );
}

#[test]
fn rematerialized_layers_lower_the_planned_peak() {
    check_peaks("tanh layers", layer, true);
}

#[test]
fn rematerialized_gelu_blocks_lower_the_planned_peak() {
    check_peaks("gelu blocks", gelu_layer, true);
}

#[test]
fn rematerialized_attention_blocks_lower_the_planned_peak() {
    check_peaks("attention blocks", attention_layer, false);
}

//! `kiln::remat`: rematerialized functions differentiate exactly like the originals under
//! every policy (eagerly traced and compiled, nested in a loop, twice), and save memory: the
//! compiled gradient's planned peak falls when each layer is rematerialized, and a memory
//! budget bounds what is kept.

use kiln::random::{key, normal, split};
use kiln::{DType, Remat, Tensor, grad, jit, remat, tag};

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec::<f64>().unwrap()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
    }
}

/// One layer: two products with a tanh between and after, one of them tagged.
fn layer(h: &Tensor, w: &(Tensor, Tensor)) -> Tensor {
    let a = tag(&h.matmul(&w.0).tanh(), "hidden");
    a.matmul(&w.1).tanh()
}

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

fn loss(ws: &Vec<(Tensor, Tensor)>, x: &Tensor, policy: Option<&Remat>) -> Tensor {
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
        Remat::Budget(5 * 5 * 8),
        Remat::Budget(usize::MAX),
    ]
}

#[test]
fn every_policy_gives_the_original_gradients() {
    let ws = weights(3, 5, DType::F64);
    let x = normal(&key(5), &[4, 5], DType::F64);
    let want = grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, &x, None))(&ws);
    for p in policies() {
        let g = grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, &x, Some(&p)))(&ws);
        let gj = jit(|ws: &Vec<(Tensor, Tensor)>| {
            grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, &x, Some(&p)))(ws)
        })
        .call(&ws)
        .unwrap();
        for ((a, b), c) in g.iter().zip(&want).zip(&gj) {
            close(&f64s(&a.0), &f64s(&b.0));
            close(&f64s(&a.1), &f64s(&b.1));
            close(&f64s(&c.0), &f64s(&b.0));
        }
    }
    // Second order: the gradient of a gradient component through remat.
    let x1 = normal(&key(6), &[5], DType::F64);
    let f = |x: &Tensor| x.sin().mul(x).sum_all();
    let h = grad(|x: &Tensor| grad(|x: &Tensor| remat(f, Remat::SaveNothing)(x))(x).index(2))(&x1);
    let want = grad(|x: &Tensor| grad(f)(x).index(2))(&x1);
    close(&f64s(&h), &f64s(&want));
    // Eagerly (nothing traced), remat is the function itself.
    let v = remat(f, Remat::SaveNothing)(&x1);
    close(&f64s(&v), &f64s(&f(&x1)));
}

#[test]
fn rematerialized_layers_lower_the_planned_peak() {
    let ws = weights(6, 256, DType::F32);
    let x = normal(&key(7), &[512, 256], DType::F32);
    let peak = |policy: Option<Remat>| {
        jit(move |(ws, x): &(Vec<(Tensor, Tensor)>, Tensor)| {
            grad(|ws: &Vec<(Tensor, Tensor)>| loss(ws, x, policy.as_ref()))(ws)
        })
        .peak_bytes(&(ws.clone(), x.clone()))
        .unwrap()
        .expect("the CPU backend plans memory")
    };
    let plain = peak(None);
    let nothing = peak(Some(Remat::SaveNothing));
    let products = peak(Some(Remat::SaveMatrixProducts));
    // One [512, 256] f32 activation per layer: 512 KiB.
    let one = 512 * 256 * 4;
    let budget = |b: usize| peak(Some(Remat::Budget(b)));
    let (zero, single, all) = (budget(0), budget(one), budget(usize::MAX));
    println!(
        "planned peak: {plain} B without remat, {nothing} B saving nothing, {products} B saving \
         products, {zero} / {single} / {all} B with a budget of 0 / 512 KiB / unlimited per layer"
    );
    assert!(nothing < plain, "{nothing} >= {plain}");
    // A budget of nothing saves nothing; a budget of one activation per layer keeps at most
    // one more per layer than saving nothing; a larger budget keeps at least as much. (Each
    // layer's backward pass reads one intermediate, its first tanh, so the unlimited budget
    // saves just that one: far less than saving the products.)
    assert_eq!(zero, nothing);
    assert!(
        single > nothing && single <= nothing + 6 * one,
        "{single} vs {nothing}"
    );
    assert!(
        all >= single && all < products,
        "{all} vs {single}, {products}"
    );
}

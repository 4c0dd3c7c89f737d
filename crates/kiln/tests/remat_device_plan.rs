//! `Remat::Budget` is measured on the installed backend's own memory plan: under the GPU
//! emulator (an H200's lowering and device arena, not the CPU's plan) the compiled gradient's
//! arena falls when layers are rematerialized, and budgets of that arena keep the peak within
//! them, never lower as they grow. Its own test binary: it installs a backend for the process.

use kiln::backend::{PtxEmulator, set_backend};
use kiln::random::{key, normal, split};
use kiln::{DType, Remat, Tensor, grad, jit, remat};
use std::sync::Arc;

type Weights = Vec<(Tensor, Tensor)>;

fn layer(h: &Tensor, w: &(Tensor, Tensor)) -> Tensor {
    h.matmul(&w.0).tanh().matmul(&w.1).tanh()
}

fn loss(ws: &Weights, x: &Tensor, policy: Option<&Remat>) -> Tensor {
    let mut h = x.clone();
    for w in ws {
        h = match policy {
            Some(p) => {
                remat(|(h, w): &(Tensor, (Tensor, Tensor))| layer(h, w), p.clone())(&(h, w.clone()))
            }
            None => layer(&h, w),
        };
    }
    (&h * &h).sum_all()
}

#[test]
fn budgets_are_measured_on_the_device_arena() {
    // Made on the CPU before the emulator is installed (eager ops run on the backend).
    let ks = split(&key(11), 12);
    let ws: Weights = (0..6)
        .map(|i| {
            (
                &normal(&ks[2 * i], &[128, 128], DType::F32) * 0.09,
                &normal(&ks[2 * i + 1], &[128, 128], DType::F32) * 0.09,
            )
        })
        .collect();
    let x = normal(&key(12), &[256, 128], DType::F32);
    set_backend(Arc::new(PtxEmulator));
    let args = (ws, x);
    let arena = |policy: Option<Remat>| {
        jit(move |(ws, x): &(Weights, Tensor)| {
            grad(|ws: &Weights| loss(ws, x, policy.as_ref()))(ws)
        })
        .peak_bytes(&args)
        .unwrap()
        .expect("the emulator's executables report their arena")
    };
    let plain = arena(None);
    let nothing = arena(Some(Remat::SaveNothing));
    let budgets = [0, nothing, (nothing + plain) / 2, plain, usize::MAX];
    let by_budget: Vec<usize> = budgets
        .iter()
        .map(|&b| arena(Some(Remat::Budget(b))))
        .collect();
    println!(
        "arena {plain} B plain, {nothing} B saving nothing; budgets {budgets:?}: {by_budget:?}"
    );
    assert!(nothing < plain, "{nothing} >= {plain}");
    let lowest = by_budget[0];
    assert!(lowest <= nothing, "{lowest} > {nothing}");
    for (&p, &b) in by_budget.iter().zip(&budgets) {
        assert!(p <= b.max(lowest), "budget {b} peaks at {p}");
    }
    for (w, b) in by_budget.windows(2).zip(budgets.windows(2)) {
        assert!(w[0] <= w[1], "budgets {b:?} peak at {w:?}");
    }
}

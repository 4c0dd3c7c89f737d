//! An iterative solver written with `while_loop`, and its gradient by implicit
//! differentiation.
//!
//! Conjugate gradients solve `A x = b` for a symmetric positive definite `A`, iterating until
//! the residual is small: the number of iterations depends on the data, so reverse mode cannot
//! differentiate the loop itself (kiln says so, as JAX does). The solution's derivative does
//! not need the iterations, though: from `A x = b`, the cotangent `g` of `x` gives
//! `b_bar = A^-T g` (one more solve) and `A_bar = -b_bar x^T`. `custom_vjp` attaches that rule,
//! and `grad` of anything computed from the solution is exact to the solver's tolerance.
//!
//! `cargo run --release -p kiln --example cg_solver`

use kiln::control::while_loop;
use kiln::random::{key, normal, split};
use kiln::{DType, Result, Tensor, custom_vjp, grad};

/// Conjugate gradients for `a x = b` from `x = 0`, until `|r| <= 1e-10 |b|` or `4 n`
/// iterations; returns the solution and the number of iterations.
pub fn cg(a: &Tensor, b: &Tensor) -> (Tensor, Tensor) {
    let n = b.shape()[0];
    let tol2 = b.mul(b).sum_all().mul(&Tensor::scalar(1e-20f64));
    let x0 = Tensor::zeros(DType::F64, [n]);
    let rs0 = b.mul(b).sum_all();
    let (x, _, _, _, k) = while_loop(
        |(_, _, _, rs, k): &(Tensor, Tensor, Tensor, Tensor, Tensor)| {
            rs.gt(&tol2)
                .bitwise_and(&k.lt(&Tensor::scalar(4 * n as i32)))
        },
        |(x, r, p, rs, k): &(Tensor, Tensor, Tensor, Tensor, Tensor)| {
            let ap = a.matmul(p);
            let alpha = rs.div(&p.mul(&ap).sum_all());
            let x = x.add(&p.mul(&alpha));
            let r = r.sub(&ap.mul(&alpha));
            let rs_new = r.mul(&r).sum_all();
            let p = r.add(&p.mul(&rs_new.div(rs)));
            (x, r, p, rs_new, k.add(&Tensor::scalar(1i32)))
        },
        (x0, b.clone(), b.clone(), rs0, Tensor::scalar(0i32)),
    );
    (x, k)
}

/// The solution of `a x = b`, differentiable in `a` and `b` by the implicit rule.
pub fn solve(a: &Tensor, b: &Tensor) -> Tensor {
    let f = custom_vjp(
        |(a, b): &(Tensor, Tensor)| cg(a, b).0,
        |(a, _): &(Tensor, Tensor), x: &Tensor, g: &Tensor| {
            let b_bar = cg(&a.permute(&[1, 0]), g).0;
            let n = x.shape()[0] as isize;
            let a_bar = b_bar.reshape(&[n, 1]).matmul(&x.reshape(&[1, n])).neg();
            (a_bar, b_bar)
        },
    );
    f(&(a.clone(), b.clone()))
}

/// A seeded symmetric positive definite matrix `m m^T + n I` and a right-hand side.
pub fn problem(n: usize) -> (Tensor, Tensor) {
    let ks = split(&key(3), 2);
    let m = normal(&ks[0], &[n, n], DType::F64);
    let a = m
        .matmul(&m.permute(&[1, 0]))
        .add(&Tensor::eye(n, DType::F64).mul(&Tensor::scalar(n as f64)));
    (a, normal(&ks[1], &[n], DType::F64))
}

/// A loss of the solution: its squared distance to a target.
pub fn loss(a: &Tensor, b: &Tensor, target: &Tensor) -> Tensor {
    let d = solve(a, b).sub(target);
    d.mul(&d).sum_all()
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let n = 64;
    let (a, b) = problem(n);
    let (x, k) = cg(&a, &b);
    let residual = a.matmul(&x).sub(&b);
    let rel = (residual.mul(&residual).sum_all().item()? / b.mul(&b).sum_all().item()?).sqrt();
    println!(
        "kiln: conjugate gradients on a {n}x{n} system: {} iterations, relative residual {rel:.2e}",
        k.item()?
    );
    let target = Tensor::ones(DType::F64, [n]);
    let gb = grad(|b: &Tensor| loss(&a, b, &target))(&b);
    // Check one direction of the gradient against a finite difference.
    let e = Tensor::from_vec((0..n).map(|i| ((i % 7) as f64 - 3.0) / 7.0).collect(), [n])?;
    let h = 1e-6;
    let fd = (loss(&a, &b.add(&e.mul(&Tensor::scalar(h))), &target).item()?
        - loss(&a, &b.sub(&e.mul(&Tensor::scalar(h))), &target).item()?)
        / (2.0 * h);
    let an = gb.mul(&e).sum_all().item()?;
    println!("d loss / d b along a direction: {an:.8} (finite difference {fd:.8})");
    if rel > 1e-8 || (an - fd).abs() > 1e-5 * (1.0 + fd.abs()) {
        eprintln!("the solve or its gradient is off");
        std::process::exit(1);
    }
    Ok(())
}

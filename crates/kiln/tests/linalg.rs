//! `kiln::linalg`: values against the reference interpreter and against the identities they
//! must satisfy (`l lᵀ = a`, `op(t) x = b`), eagerly and under `jit` (the CPU backend's
//! blocked routines, up to 512 x 512 and batched, f32 and f64); gradients against finite
//! differences; `vmap` against a loop.

use kiln::linalg::{self, Assume, SolveTriangular};
use kiln::{Tensor, grad, jit, vmap};

/// A deterministic pseudo-random value in [-1, 1).
fn noise(i: usize, seed: u64) -> f64 {
    let x = (i as u64 + 1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seed.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    let x = (x ^ (x >> 31)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
}

/// A batch of well-conditioned symmetric positive definite matrices: `g gᵀ / n + I`.
fn spd(batch: usize, n: usize, seed: u64) -> Vec<f64> {
    let mut out = Vec::with_capacity(batch * n * n);
    for k in 0..batch {
        let g: Vec<f64> = (0..n * n).map(|i| noise(k * n * n + i, seed)).collect();
        for i in 0..n {
            for j in 0..n {
                let dot: f64 = (0..n).map(|q| g[i * n + q] * g[j * n + q]).sum();
                out.push(dot / n as f64 + if i == j { 1.0 } else { 0.0 });
            }
        }
    }
    out
}

fn tensor(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape.to_vec()).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_literal().unwrap().to_f64s()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// `x yᵀ` (`transpose_y`) or `x y` for `n x n` row-major matrices, in f64.
fn product(x: &[f64], y: &[f64], n: usize, transpose_y: bool) -> Vec<f64> {
    let mut out = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..n {
            out[i * n + j] = (0..n)
                .map(|q| {
                    x[i * n + q]
                        * if transpose_y {
                            y[j * n + q]
                        } else {
                            y[q * n + j]
                        }
                })
                .sum();
        }
    }
    out
}

#[test]
fn cholesky_factors_reconstruct_and_match_the_reference() {
    for (batch, n) in [(1, 3), (4, 17), (2, 64), (1, 130), (1, 512)] {
        let a = spd(batch, n, n as u64);
        for dtype in [kiln::DType::F64, kiln::DType::F32] {
            let x = tensor(&a, &[batch, n, n]).cast(dtype);
            for lower in [true, false] {
                let eager = linalg::cholesky(&x, lower);
                let compiled = jit(move |x: &Tensor| linalg::cholesky(x, lower))
                    .call(&x)
                    .unwrap();
                let op = kiln::ir::Op::Cholesky { lower };
                let lit = x.to_literal().unwrap();
                let want = kiln::reference::eval_op(&op, &[&lit], std::slice::from_ref(lit.ty()))
                    .remove(0)
                    .to_f64s();
                let tol = if dtype == kiln::DType::F64 {
                    1e-12
                } else {
                    3e-5
                };
                for (how, got) in [("eager", &eager), ("jit", &compiled)] {
                    let got = values(got);
                    let e = max_diff(&got, &want);
                    assert!(e < tol, "{how} {dtype} {batch}x{n} lower={lower}: {e}");
                    // l lᵀ = a (or uᵀ u = a), matrix by matrix.
                    for k in 0..batch {
                        let f = &got[k * n * n..(k + 1) * n * n];
                        let back = if lower {
                            product(f, f, n, true)
                        } else {
                            let ft: Vec<f64> = (0..n * n).map(|p| f[(p % n) * n + p / n]).collect();
                            product(&ft, &ft, n, true)
                        };
                        let e = max_diff(&back, &a[k * n * n..(k + 1) * n * n]);
                        assert!(e < 10.0 * tol, "{how} {dtype} reconstruction {n}: {e}");
                    }
                }
            }
        }
    }
}

#[test]
fn triangular_solves_satisfy_their_systems_eagerly_and_compiled() {
    for (batch, n, m) in [(1, 4, 3), (3, 33, 5), (1, 200, 17), (1, 512, 8)] {
        let a: Vec<f64> = (0..batch * n * n)
            .map(|i| {
                if (i / n) % n == i % n {
                    2.0 + noise(i, 1).abs()
                } else {
                    noise(i, 2) / n as f64
                }
            })
            .collect();
        for how in [
            SolveTriangular::lower(),
            SolveTriangular::upper(),
            SolveTriangular::lower().transposed(),
            SolveTriangular::upper().right(),
            SolveTriangular::lower()
                .right()
                .transposed()
                .unit_diagonal(),
        ] {
            let bshape = if how.left_side {
                [batch, n, m]
            } else {
                [batch, m, n]
            };
            let b: Vec<f64> = (0..batch * n * m).map(|i| noise(i, 3)).collect();
            let (at, bt) = (tensor(&a, &[batch, n, n]), tensor(&b, &bshape));
            let eager = values(&linalg::solve_triangular(&at, &bt, how));
            let compiled = values(
                &jit(move |(a, b): &(Tensor, Tensor)| linalg::solve_triangular(a, b, how))
                    .call(&(at.clone(), bt.clone()))
                    .unwrap(),
            );
            let e = max_diff(&eager, &compiled);
            assert!(e < 1e-11, "{how:?} {n}: eager vs jit {e}");
            // op(t) x = b, or x op(t) = b, with t dense.
            for k in 0..batch {
                let am = &a[k * n * n..(k + 1) * n * n];
                let op = |i: usize, j: usize| {
                    let (r, c) = if how.transpose != kiln::ir::TransposeA::NoTranspose {
                        (j, i)
                    } else {
                        (i, j)
                    };
                    if r == c && how.unit_diagonal {
                        1.0
                    } else if (how.lower && r >= c) || (!how.lower && r <= c) {
                        am[r * n + c]
                    } else {
                        0.0
                    }
                };
                let x = &compiled[k * n * m..(k + 1) * n * m];
                let bm = &b[k * n * m..(k + 1) * n * m];
                for i in 0..if how.left_side { n } else { m } {
                    for j in 0..if how.left_side { m } else { n } {
                        let got: f64 = (0..n)
                            .map(|q| {
                                if how.left_side {
                                    op(i, q) * x[q * m + j]
                                } else {
                                    x[i * n + q] * op(q, j)
                                }
                            })
                            .sum();
                        let want = if how.left_side {
                            bm[i * m + j]
                        } else {
                            bm[i * n + j]
                        };
                        assert!((got - want).abs() < 1e-10, "{how:?} n={n}: {got} vs {want}");
                    }
                }
            }
        }
    }
}

#[test]
fn solve_and_cho_solve_solve_positive_definite_systems() {
    let n = 70;
    let a = spd(2, n, 9);
    let b: Vec<f64> = (0..2 * n).map(|i| noise(i, 4)).collect();
    let (at, bv) = (tensor(&a, &[2, n, n]), tensor(&b, &[2, n]));
    let x = values(&linalg::solve(&at, &bv, Assume::Pos));
    let l = linalg::cholesky(&at, false);
    let y = values(&linalg::cho_solve(&l, false, &bv));
    assert!(max_diff(&x, &y) < 1e-12);
    for k in 0..2 {
        for i in 0..n {
            let got: f64 = (0..n)
                .map(|q| a[k * n * n + i * n + q] * x[k * n + q])
                .sum();
            assert!(
                (got - b[k * n + i]).abs() < 1e-10,
                "{got} vs {}",
                b[k * n + i]
            );
        }
    }
    // A matrix of right-hand sides, under jit.
    let bm = tensor(&b, &[2, n, 1]);
    let xm = jit(|(a, b): &(Tensor, Tensor)| linalg::solve(a, b, Assume::Pos))
        .call(&(at.clone(), bm))
        .unwrap();
    assert_eq!(xm.shape(), vec![2, n, 1]);
    assert!(max_diff(&values(&xm), &x) < 1e-11);
}

#[test]
fn a_matrix_that_is_not_positive_definite_gives_nan() {
    let a = tensor(&[1.0, 2.0, 2.0, 1.0, 4.0, 0.0, 0.0, 9.0], &[2, 2, 2]);
    for l in [
        linalg::cholesky(&a, true),
        jit(|a: &Tensor| linalg::cholesky(a, true))
            .call(&a)
            .unwrap(),
    ] {
        let v = values(&l);
        assert!(v[..4].iter().all(|x| x.is_nan()), "{v:?}");
        assert_eq!(&v[4..], &[2.0, 0.0, 0.0, 3.0]);
    }
}

#[test]
fn gradients_match_finite_differences() {
    let n = 4;
    let a = tensor(&spd(2, n, 5), &[2, n, n]);
    let w = tensor(
        &(0..2 * n * n).map(|i| noise(i, 6)).collect::<Vec<_>>(),
        &[2, n, n],
    );
    // A weighted sum of the factor, lower and upper.
    for lower in [true, false] {
        let f = |a: &Tensor| (linalg::cholesky(a, lower) * &w).sum_all();
        let checked = kiln::testing::check_grads(f, &a, 1e-6, 1e-6).unwrap();
        assert_eq!(checked, 2 * n * n);
    }
    // Solves in every form, with respect to both operands.
    let t = tensor(
        &(0..2 * n * n)
            .map(|i| {
                if (i / n) % n == i % n {
                    2.0 + noise(i, 7).abs()
                } else {
                    noise(i, 8)
                }
            })
            .collect::<Vec<_>>(),
        &[2, n, n],
    );
    let b = tensor(
        &(0..2 * n * 3).map(|i| noise(i, 9)).collect::<Vec<_>>(),
        &[2, n, 3],
    );
    let wb = tensor(
        &(0..2 * n * 3).map(|i| noise(i, 10)).collect::<Vec<_>>(),
        &[2, n, 3],
    );
    for how in [
        SolveTriangular::lower(),
        SolveTriangular::upper().transposed(),
        SolveTriangular::lower().unit_diagonal(),
    ] {
        let f = |(t, b): &(Tensor, Tensor)| (linalg::solve_triangular(t, b, how) * &wb).sum_all();
        kiln::testing::check_grads(f, &(t.clone(), b.clone()), 1e-6, 1e-6).unwrap();
    }
    let bt = tensor(
        &(0..2 * 3 * n).map(|i| noise(i, 11)).collect::<Vec<_>>(),
        &[2, 3, n],
    );
    let wt = tensor(
        &(0..2 * 3 * n).map(|i| noise(i, 12)).collect::<Vec<_>>(),
        &[2, 3, n],
    );
    for how in [
        SolveTriangular::lower().right(),
        SolveTriangular::upper().right().transposed(),
    ] {
        let f = |(t, b): &(Tensor, Tensor)| (linalg::solve_triangular(t, b, how) * &wt).sum_all();
        kiln::testing::check_grads(f, &(t.clone(), bt.clone()), 1e-6, 1e-6).unwrap();
    }
    // solve through the factor, and the same gradient under jit.
    let bv = tensor(
        &(0..2 * n).map(|i| noise(i, 13)).collect::<Vec<_>>(),
        &[2, n],
    );
    let f = |(a, b): &(Tensor, Tensor)| linalg::solve(a, b, Assume::Pos).powf(2.0).sum_all();
    kiln::testing::check_grads(f, &(a.clone(), bv.clone()), 1e-6, 1e-6).unwrap();
    let eager = grad(f)(&(a.clone(), bv.clone()));
    let jitted = jit(move |x: &(Tensor, Tensor)| grad(f)(x))
        .call(&(a.clone(), bv.clone()))
        .unwrap();
    assert!(max_diff(&values(&eager.0), &values(&jitted.0)) < 1e-10);
    assert!(max_diff(&values(&eager.1), &values(&jitted.1)) < 1e-10);
}

#[test]
fn vmap_matches_a_loop() {
    let n = 5;
    let batch = 3;
    let a = tensor(&spd(batch, n, 14), &[batch, n, n]);
    let b = tensor(
        &(0..batch * n * 2).map(|i| noise(i, 15)).collect::<Vec<_>>(),
        &[batch, n, 2],
    );
    let shared = tensor(&spd(1, n, 16), &[n, n]);
    let f = |(a, b): &(Tensor, Tensor)| {
        let l = linalg::cholesky(a, true);
        linalg::solve_triangular(&l, b, SolveTriangular::lower())
    };
    let batched = vmap(f).call(&(a.clone(), b.clone())).unwrap();
    // The matrix shared by every example (not batched), the right-hand sides batched.
    let half = vmap(f)
        .in_axes(&[None, Some(0)])
        .call(&(shared.clone(), b.clone()))
        .unwrap();
    let (mut looped, mut looped_half) = (Vec::new(), Vec::new());
    for i in 0..batch as isize {
        looped.extend(values(&f(&(a.index(i), b.index(i)))));
        looped_half.extend(values(&f(&(shared.clone(), b.index(i)))));
    }
    assert!(max_diff(&values(&batched), &looped) < 1e-12);
    assert!(max_diff(&values(&half), &looped_half) < 1e-12);
    // Under jit too.
    let jitted = jit(move |x: &(Tensor, Tensor)| vmap(f).call(x).unwrap())
        .call(&(a, b))
        .unwrap();
    assert!(max_diff(&values(&jitted), &looped) < 1e-11);
}

#[test]
fn lu_and_general_solve() {
    // Random (non-symmetric) matrices: a[p] = l u, and a x = b, eagerly and under jit.
    for (batch, n) in [(1, 3), (2, 40), (1, 150)] {
        let a: Vec<f64> = (0..batch * n * n)
            .map(|i| noise(i, 20 + n as u64))
            .collect();
        let b: Vec<f64> = (0..batch * n * 2).map(|i| noise(i, 21)).collect();
        let (at, bt) = (tensor(&a, &[batch, n, n]), tensor(&b, &[batch, n, 2]));
        let (packed, _, perm) = linalg::lu(&at);
        let (f, p) = (values(&packed), values(&perm));
        for k in 0..batch {
            for i in 0..n {
                for j in 0..n {
                    let m = &f[k * n * n..(k + 1) * n * n];
                    let lu: f64 = (0..=i.min(j))
                        .map(|q| if q == i { 1.0 } else { m[i * n + q] } * m[q * n + j])
                        .sum();
                    let want = a[k * n * n + p[k * n + i] as usize * n + j];
                    assert!((lu - want).abs() < 1e-10, "n={n}: {lu} vs {want}");
                }
            }
        }
        let eager = values(&linalg::solve(&at, &bt, Assume::General));
        let compiled = values(
            &jit(|(a, b): &(Tensor, Tensor)| linalg::solve(a, b, Assume::General))
                .call(&(at.clone(), bt.clone()))
                .unwrap(),
        );
        assert!(max_diff(&eager, &compiled) < 1e-9, "n={n}");
        for k in 0..batch {
            for i in 0..n {
                for c in 0..2 {
                    let got: f64 = (0..n)
                        .map(|q| a[k * n * n + i * n + q] * eager[k * n * 2 + q * 2 + c])
                        .sum();
                    let want = b[k * n * 2 + i * 2 + c];
                    assert!((got - want).abs() < 1e-9, "n={n}: {got} vs {want}");
                }
            }
        }
    }
    // Gradients through the factorization, for both operands.
    let n = 4;
    let a = tensor(
        &(0..2 * n * n).map(|i| noise(i, 22)).collect::<Vec<_>>(),
        &[2, n, n],
    );
    let b = tensor(
        &(0..2 * n).map(|i| noise(i, 23)).collect::<Vec<_>>(),
        &[2, n],
    );
    let f = |(a, b): &(Tensor, Tensor)| linalg::solve(a, b, Assume::General).powf(2.0).sum_all();
    kiln::testing::check_grads(f, &(a.clone(), b.clone()), 1e-6, 1e-5).unwrap();
    let w = tensor(
        &(0..2 * n * n).map(|i| noise(i, 24)).collect::<Vec<_>>(),
        &[2, n, n],
    );
    let g = |a: &Tensor| (linalg::lu(a).0 * &w).sum_all();
    kiln::testing::check_grads(g, &a, 1e-6, 1e-5).unwrap();
    // vmap against a loop.
    let batched = vmap(f).call(&(a.clone(), b.clone())).unwrap();
    let looped: Vec<f64> = (0..2)
        .flat_map(|i| values(&f(&(a.index(i), b.index(i)))))
        .collect();
    assert!(max_diff(&values(&batched), &looped) < 1e-10);
}

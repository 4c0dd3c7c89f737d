//! The host routines of `cholesky` and `triangular_solve` ([`Step::Host`]): blocked algorithms
//! in the operands' precision (f32 for f32, f16 and bf16, rounded once at the end for the
//! narrow types; f64 for f64).
//!
//! - Cholesky: right-looking by blocks of [`BLOCK`] columns. Each step factors the diagonal
//!   block (unblocked), solves the panel below it against that block's transpose, and takes the
//!   panel's product with its own transpose off the trailing lower triangle; that update, a
//!   matrix product, is nearly all of the work.
//! - Triangular solve: the system is first brought to `t y = c` (`t` lower or upper, see
//!   `kiln_reference::Solve`), then solved by blocks of [`BLOCK`] rows: a substitution within
//!   the diagonal block, and a matrix product of the block's solution taken off the rows still
//!   to solve. Complex operands (`c64`, `c128`) are solved by the reference's substitution
//!   (`kiln_reference::triangular_solve`, in complex f64): there is no blocked complex solve.
//!
//! The rows of an update, and the matrices of a batch, are split across threads; each element
//! is computed by one thread in a fixed order, so results do not depend on the thread count.
//! Their accuracy against the reference is the bound of the ops' specs (`ir-specs/ops/`).
//!
//! [`Step::Host`]: kiln_kernel::Step::Host

use half::{bf16, f16};
use kiln_ir::{Data, Literal, Op, TensorType};
use kiln_reference::Solve;
use rayon::prelude::*;
use std::ops::{Add, Div, Mul, Sub};

/// The rows (or columns) of one block.
pub const BLOCK: usize = 64;

/// An element type the routines compute in.
trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NAN: Self;
    fn sqrt(self) -> Self;
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NAN: Self = f32::NAN;
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NAN: Self = f64::NAN;
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

/// Runs `op` (a `cholesky`, `triangular_solve` or `lu`, verified) on `x`, with result types
/// `types`.
pub fn run(op: &Op, x: &[&Literal], types: &[TensorType]) -> Result<Vec<Literal>, String> {
    if let Op::Lu {} = op {
        return lu_literal(x[0], types);
    }
    let ty = &types[0];
    let data = match op {
        Op::Cholesky { lower } => {
            let shape = &x[0].ty().shape;
            match x[0].data() {
                Data::F64(v) => Some(Data::F64(cholesky(v, shape, *lower))),
                Data::F32(v) => Some(Data::F32(cholesky(v, shape, *lower))),
                d @ (Data::F16(_) | Data::BF16(_)) => narrow(d, cholesky(&widen(d), shape, *lower)),
                _ => None,
            }
        }
        Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        } => {
            let s = Solve {
                left_side: *left_side,
                lower: *lower,
                unit_diagonal: *unit_diagonal,
                transpose_a: *transpose_a,
            };
            let (a, b) = (x[0], x[1]);
            if ty.dtype.is_complex() {
                // No blocked complex routine: the reference's substitution, in complex f64.
                return Ok(vec![kiln_reference::triangular_solve(a, b, s, ty)]);
            }
            match (a.data(), b.data()) {
                (Data::F64(a), Data::F64(bv)) => Some(Data::F64(solve(a, bv, &b.ty().shape, s))),
                (Data::F32(a), Data::F32(bv)) => Some(Data::F32(solve(a, bv, &b.ty().shape, s))),
                (Data::F16(_) | Data::BF16(_), _) => {
                    let (a32, b32) = (widen(a.data()), widen(b.data()));
                    narrow(b.data(), solve(&a32, &b32, &b.ty().shape, s))
                }
                _ => None,
            }
        }
        _ => None,
    };
    let data = data.ok_or_else(|| {
        format!(
            "{}: no host routine for operands {}",
            op.mnemonic(),
            x.iter()
                .map(|l| l.ty().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    Literal::new(ty.clone(), data)
        .map(|l| vec![l])
        .map_err(|e| format!("{}: {e}", op.mnemonic()))
}

/// `lu` of the literal `a` into `types` (factors, pivots, permutation).
fn lu_literal(a: &Literal, types: &[TensorType]) -> Result<Vec<Literal>, String> {
    let shape = &a.ty().shape;
    let (factors, pivots, perm) = match a.data() {
        Data::F64(v) => {
            let (f, p, q) = lu(v, shape);
            (Some(Data::F64(f)), p, q)
        }
        Data::F32(v) => {
            let (f, p, q) = lu(v, shape);
            (Some(Data::F32(f)), p, q)
        }
        d @ (Data::F16(_) | Data::BF16(_)) => {
            let (f, p, q) = lu(&widen(d), shape);
            (narrow(d, f), p, q)
        }
        _ => (None, Vec::new(), Vec::new()),
    };
    let err = |e: kiln_ir::LiteralError| format!("lu: {e}");
    let factors = factors.ok_or_else(|| format!("lu: no host routine for {}", a.ty()))?;
    Ok(vec![
        Literal::new(types[0].clone(), factors).map_err(err)?,
        Literal::new(types[1].clone(), Data::I32(pivots)).map_err(err)?,
        Literal::new(types[2].clone(), Data::I32(perm)).map_err(err)?,
    ])
}

/// The LU factorization with partial pivoting of every matrix of `a` (shape `shape`), blocked
/// right-looking: each block of [`BLOCK`] columns is factored with its row swaps (applied to
/// whole rows), the block rows to its right solved against its unit lower triangle, and the
/// trailing matrix updated by a matrix product. Pivots are chosen as the reference chooses
/// them (`kiln_reference::better_pivot`). Returns the packed factors, the pivots and the
/// permutation.
fn lu<T: Real + Into<f64>>(a: &[T], shape: &[usize]) -> (Vec<T>, Vec<i32>, Vec<i32>) {
    let (batch, n, _) = dims(shape);
    let mut w = a.to_vec();
    let mut pivots = vec![0i32; batch * n];
    let mut perm = vec![0i32; batch * n];
    if n == 0 {
        return (w, pivots, perm);
    }
    w.par_chunks_mut(n * n)
        .zip(pivots.par_chunks_mut(n).zip(perm.par_chunks_mut(n)))
        .for_each(|(m, (piv, p))| {
            p.iter_mut().enumerate().for_each(|(i, x)| *x = i as i32);
            for k0 in (0..n).step_by(BLOCK) {
                let k1 = (k0 + BLOCK).min(n);
                // The panel: columns k0..k1, every row from k0 down.
                for j in k0..k1 {
                    let mut best = j;
                    for i in j + 1..n {
                        if kiln_reference::better_pivot(m[i * n + j].into(), m[best * n + j].into())
                        {
                            best = i;
                        }
                    }
                    piv[j] = best as i32;
                    if best != j {
                        for c in 0..n {
                            m.swap(j * n + c, best * n + c);
                        }
                        p.swap(j, best);
                    }
                    let d = m[j * n + j];
                    let (top, below) = m.split_at_mut((j + 1) * n);
                    let pivot_row = &top[j * n..];
                    for row in below.chunks_mut(n) {
                        if d != T::ZERO {
                            row[j] = row[j] / d;
                        }
                        let f = row[j];
                        for c in j + 1..k1 {
                            row[c] = row[c] - f * pivot_row[c];
                        }
                    }
                }
                if k1 == n {
                    break;
                }
                // The block rows right of the panel: solved against its unit lower triangle.
                for i in k0..k1 {
                    let (done, rest) = m.split_at_mut(i * n);
                    let row = &mut rest[..n];
                    for q in k0..i {
                        let f = row[q];
                        let src = &done[q * n + k1..q * n + n];
                        for (x, &s) in row[k1..].iter_mut().zip(src) {
                            *x = *x - f * s;
                        }
                    }
                }
                // The trailing update a22 -= l21 u12, a matrix product, rows on threads.
                let (top, below) = m.split_at_mut(k1 * n);
                let u12 = &top[k0 * n..];
                below.par_chunks_mut(n).for_each(|row| {
                    for q in k0..k1 {
                        let f = row[q];
                        let src = &u12[(q - k0) * n + k1..(q - k0) * n + n];
                        for (x, &s) in row[k1..].iter_mut().zip(src) {
                            *x = *x - f * s;
                        }
                    }
                });
            }
        });
    (w, pivots, perm)
}

fn widen(data: &Data) -> Vec<f32> {
    match data {
        Data::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        Data::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
        _ => Vec::new(),
    }
}

/// `v` rounded to the narrow float type of `like`.
fn narrow(like: &Data, v: Vec<f32>) -> Option<Data> {
    match like {
        Data::F16(_) => Some(Data::F16(v.into_iter().map(f16::from_f32).collect())),
        Data::BF16(_) => Some(Data::BF16(v.into_iter().map(bf16::from_f32).collect())),
        _ => None,
    }
}

/// The matrix count and the two matrix dimensions of `shape` (rank >= 2).
fn dims(shape: &[usize]) -> (usize, usize, usize) {
    let r = shape.len();
    (shape[..r - 2].iter().product(), shape[r - 2], shape[r - 1])
}

/// `cholesky` of every matrix of `a` (shape `shape`).
fn cholesky<T: Real>(a: &[T], shape: &[usize], lower: bool) -> Vec<T> {
    let (_, n, _) = dims(shape);
    let mut out = vec![T::ZERO; a.len()];
    if n == 0 {
        return out;
    }
    out.par_chunks_mut(n * n)
        .zip(a.par_chunks(n * n))
        .for_each(|(o, m)| {
            // The lower triangle of the matrix to factor: `a`'s own, or its upper one mirrored.
            let mut w = vec![T::ZERO; n * n];
            for i in 0..n {
                for j in 0..=i {
                    w[i * n + j] = if lower { m[i * n + j] } else { m[j * n + i] };
                }
            }
            let ok = factor(&mut w, n);
            for i in 0..n {
                for j in 0..=i {
                    let x = if ok { w[i * n + j] } else { T::NAN };
                    if lower {
                        o[i * n + j] = x;
                    } else {
                        o[j * n + i] = x;
                    }
                }
            }
            if !ok {
                o.iter_mut().for_each(|x| *x = T::NAN);
            }
        });
    out
}

/// Factors the `n x n` row-major `w` in place: its lower triangle becomes the lower Cholesky
/// factor (blocked, right-looking). False when a pivot is not positive (or NaN).
fn factor<T: Real>(w: &mut [T], n: usize) -> bool {
    for k0 in (0..n).step_by(BLOCK) {
        let k1 = (k0 + BLOCK).min(n);
        // The diagonal block, unblocked: the earlier blocks' updates are already in it.
        for j in k0..k1 {
            let mut s = w[j * n + j];
            for q in k0..j {
                s = s - w[j * n + q] * w[j * n + q];
            }
            // Not positive, or NaN (which compares as unordered).
            if s.partial_cmp(&T::ZERO) != Some(std::cmp::Ordering::Greater) {
                return false;
            }
            let d = s.sqrt();
            w[j * n + j] = d;
            for i in j + 1..k1 {
                let mut s = w[i * n + j];
                for q in k0..j {
                    s = s - w[i * n + q] * w[j * n + q];
                }
                w[i * n + j] = s / d;
            }
        }
        if k1 == n {
            break;
        }
        let (top, below) = w.split_at_mut(k1 * n);
        let diag = &top[k0 * n..];
        // The panel: each row below solves x lᵀ = row against the diagonal block's factor.
        below.par_chunks_mut(n).for_each(|row| {
            for j in k0..k1 {
                let mut s = row[j];
                for q in k0..j {
                    s = s - row[q] * diag[(j - k0) * n + q];
                }
                row[j] = s / diag[(j - k0) * n + j];
            }
        });
        // The trailing update w22 -= p pᵀ (lower triangle), with p's transpose packed so that
        // the innermost loop runs along rows of both.
        let rows = n - k1;
        let kb = k1 - k0;
        let mut pt = vec![T::ZERO; kb * rows];
        for (i, row) in below.chunks(n).enumerate() {
            for q in 0..kb {
                pt[q * rows + i] = row[k0 + q];
            }
        }
        below.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            let (panel, rest) = row.split_at_mut(k1);
            let rest = &mut rest[..=i];
            for q in 0..kb {
                let p = panel[k0 + q];
                let col = &pt[q * rows..q * rows + i + 1];
                for (r, &c) in rest.iter_mut().zip(col) {
                    *r = *r - p * c;
                }
            }
        });
    }
    true
}

/// `triangular_solve` of every matrix of `a` with the matching one of `b` (shape `shape`).
fn solve<T: Real>(a: &[T], b: &[T], shape: &[usize], s: Solve) -> Vec<T> {
    let (_, rows, cols) = dims(shape);
    let n = if s.left_side { rows } else { cols };
    let m = if s.left_side { cols } else { rows };
    let mut out = vec![T::ZERO; b.len()];
    if n == 0 || m == 0 {
        return out;
    }
    // The swap `Solve::system` makes (t is op(a), or op(a)ᵀ for a right-side solve).
    let swapped = (s.transpose_a != kiln_ir::TransposeA::NoTranspose) ^ !s.left_side;
    let lower = s.lower_system();
    out.par_chunks_mut(rows * cols)
        .zip(a.par_chunks(n * n).zip(b.par_chunks(rows * cols)))
        .for_each(|(o, (am, bm))| {
            let mut t = vec![T::ZERO; n * n];
            for i in 0..n {
                for j in 0..n {
                    let (r, c) = if swapped { (j, i) } else { (i, j) };
                    t[i * n + j] = if r == c && s.unit_diagonal {
                        T::ONE
                    } else if (s.lower && r >= c) || (!s.lower && r <= c) {
                        am[r * n + c]
                    } else {
                        T::ZERO
                    };
                }
            }
            let mut y = vec![T::ZERO; n * m];
            for i in 0..n {
                for j in 0..m {
                    y[i * m + j] = if s.left_side {
                        bm[i * cols + j]
                    } else {
                        bm[j * cols + i]
                    };
                }
            }
            substitute(&t, &mut y, n, m, lower);
            for i in 0..n {
                for j in 0..m {
                    if s.left_side {
                        o[i * cols + j] = y[i * m + j];
                    } else {
                        o[j * cols + i] = y[i * m + j];
                    }
                }
            }
        });
    out
}

/// Solves `t y = c` in place (`y` holds `c`, `n x m`) for the `n x n` triangular `t`, by blocks.
fn substitute<T: Real>(t: &[T], y: &mut [T], n: usize, m: usize, lower: bool) {
    let blocks: Vec<usize> = (0..n).step_by(BLOCK).collect();
    let order: Vec<usize> = if lower {
        blocks
    } else {
        blocks.into_iter().rev().collect()
    };
    for k0 in order {
        let k1 = (k0 + BLOCK).min(n);
        // Within the diagonal block: row by row, each an update by the rows solved before it.
        let inner: Vec<usize> = if lower {
            (k0..k1).collect()
        } else {
            (k0..k1).rev().collect()
        };
        for &i in &inner {
            let (solved, row) = if lower {
                let (a, b) = y.split_at_mut(i * m);
                (&a[k0 * m..], &mut b[..m])
            } else {
                let (a, b) = y.split_at_mut((i + 1) * m);
                (&b[..(k1 - i - 1) * m], &mut a[i * m..])
            };
            let first = if lower { k0 } else { i + 1 };
            for (qi, r) in solved.chunks(m).enumerate() {
                let f = t[i * n + first + qi];
                for (x, &v) in row.iter_mut().zip(r) {
                    *x = *x - f * v;
                }
            }
            let d = t[i * n + i];
            row.iter_mut().for_each(|x| *x = *x / d);
        }
        // The rows still to solve lose the product of their block of t with the block's y.
        let (done, todo, base) = if lower {
            let (a, b) = y.split_at_mut(k1 * m);
            (&a[k0 * m..], b, k1)
        } else {
            let (a, b) = y.split_at_mut(k0 * m);
            (&b[..(k1 - k0) * m], a, 0)
        };
        let done: &[T] = done;
        todo.par_chunks_mut(m).enumerate().for_each(|(ri, row)| {
            let i = base + ri;
            for (qi, r) in done.chunks(m).enumerate() {
                let f = t[i * n + k0 + qi];
                for (x, &v) in row.iter_mut().zip(r) {
                    *x = *x - f * v;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, TransposeA};

    /// A deterministic pseudo-random value in [-1, 1).
    fn noise(i: usize) -> f64 {
        let x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((x >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    /// A well-conditioned symmetric positive definite batch: m mᵀ / n + I per matrix.
    fn spd(batch: usize, n: usize) -> Vec<f64> {
        let mut out = Vec::new();
        for k in 0..batch {
            let g: Vec<f64> = (0..n * n).map(|i| noise(k * n * n + i)).collect();
            for i in 0..n {
                for j in 0..n {
                    let dot: f64 = (0..n).map(|q| g[i * n + q] * g[j * n + q]).sum();
                    out.push(dot / n as f64 + if i == j { 1.0 } else { 0.0 });
                }
            }
        }
        out
    }

    fn max_err(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    fn lit(dtype: DType, shape: &[usize], v: &[f64]) -> Literal {
        Literal::from_f64s(TensorType::new(dtype, shape.to_vec()), v).unwrap()
    }

    #[test]
    fn blocked_cholesky_matches_the_reference() {
        for (batch, n) in [(1, 1), (3, 5), (2, 64), (1, 65), (2, 130), (1, 512)] {
            let shape = [batch, n, n];
            let a = spd(batch, n);
            for lower in [true, false] {
                for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
                    let x = lit(dtype, &shape, &a);
                    let op = Op::Cholesky { lower };
                    let got = run(&op, &[&x], std::slice::from_ref(x.ty()))
                        .unwrap()
                        .remove(0)
                        .to_f64s();
                    let want = kiln_reference::cholesky(&x, lower, x.ty()).to_f64s();
                    let e = max_err(&got, &want);
                    assert!(e < tol, "{dtype} n={n} lower={lower}: {e}");
                }
            }
        }
    }

    #[test]
    fn blocked_solve_matches_the_reference() {
        for (batch, n, m) in [(1, 1, 1), (2, 5, 3), (1, 70, 9), (2, 129, 33), (1, 512, 40)] {
            // A triangular matrix with a dominant diagonal: well conditioned.
            let a: Vec<f64> = (0..batch * n * n)
                .map(|i| {
                    let (r, c) = ((i / n) % n, i % n);
                    if r == c {
                        2.0 + noise(i).abs()
                    } else {
                        noise(i) / n as f64
                    }
                })
                .collect();
            for left_side in [true, false] {
                let bshape = if left_side {
                    [batch, n, m]
                } else {
                    [batch, m, n]
                };
                let b: Vec<f64> = (0..batch * n * m).map(|i| noise(i + 7)).collect();
                for lower in [true, false] {
                    for transpose_a in [TransposeA::NoTranspose, TransposeA::Transpose] {
                        for unit_diagonal in [false, true] {
                            for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
                                let ax = lit(dtype, &[batch, n, n], &a);
                                let bx = lit(dtype, &bshape, &b);
                                let op = Op::TriangularSolve {
                                    left_side,
                                    lower,
                                    unit_diagonal,
                                    transpose_a,
                                };
                                let got = run(&op, &[&ax, &bx], std::slice::from_ref(bx.ty()))
                                    .unwrap()
                                    .remove(0)
                                    .to_f64s();
                                let s = Solve {
                                    left_side,
                                    lower,
                                    unit_diagonal,
                                    transpose_a,
                                };
                                let want = kiln_reference::triangular_solve(&ax, &bx, s, bx.ty())
                                    .to_f64s();
                                let e = max_err(&got, &want);
                                assert!(e < tol, "{dtype} {s:?} n={n} m={m}: {e}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn narrow_floats_compute_in_f32_and_round_once() {
        let a = spd(2, 20);
        let b: Vec<f64> = (0..2 * 20 * 3).map(|i| noise(i + 3)).collect();
        for dtype in [DType::F16, DType::BF16] {
            let x = lit(dtype, &[2, 20, 20], &a);
            let op = Op::Cholesky { lower: true };
            let l = run(&op, &[&x], std::slice::from_ref(x.ty()))
                .unwrap()
                .remove(0);
            let want = kiln_reference::cholesky(&x, true, x.ty()).to_f64s();
            // Within a unit in the last place or two of the narrow type.
            let tol = if dtype == DType::F16 { 4e-3 } else { 3e-2 };
            assert!(max_err(&l.to_f64s(), &want) < tol, "{dtype}");
            let bx = lit(dtype, &[2, 20, 3], &b);
            let op = Op::TriangularSolve {
                left_side: true,
                lower: true,
                unit_diagonal: false,
                transpose_a: TransposeA::Transpose,
            };
            let got = run(&op, &[&l, &bx], std::slice::from_ref(bx.ty()))
                .unwrap()
                .remove(0)
                .to_f64s();
            let s = Solve {
                left_side: true,
                lower: true,
                unit_diagonal: false,
                transpose_a: TransposeA::Transpose,
            };
            let want = kiln_reference::triangular_solve(&l, &bx, s, bx.ty()).to_f64s();
            assert!(max_err(&got, &want) < tol, "{dtype}");
        }
    }

    #[test]
    fn not_positive_definite_is_nan_and_other_matrices_are_not() {
        let mut a = spd(2, 70);
        // The second matrix gets a negative pivot in its second block.
        a[70 * 70 + 69 * 70 + 69] = -5.0;
        let x = lit(DType::F32, &[2, 70, 70], &a);
        let l = run(
            &Op::Cholesky { lower: true },
            &[&x],
            std::slice::from_ref(x.ty()),
        )
        .unwrap()
        .remove(0)
        .to_f64s();
        assert!(l[..70 * 70].iter().all(|v| v.is_finite()));
        assert!(l[70 * 70..].iter().all(|v| v.is_nan()));
    }

    #[test]
    fn blocked_lu_matches_the_reference() {
        for (batch, n) in [(1, 1), (2, 5), (1, 64), (2, 100), (1, 300)] {
            // Random matrices: in f64 the pivots are the reference's (no two candidates within
            // rounding of each other); in f32 they may differ where two nearly tie.
            let a: Vec<f64> = (0..batch * n * n).map(|i| noise(i * 7 + n)).collect();
            for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 1e-3)] {
                let x = lit(dtype, &[batch, n, n], &a);
                let rows = TensorType::new(DType::I32, vec![batch, n]);
                let types = [x.ty().clone(), rows.clone(), rows];
                let got = run(&Op::Lu {}, &[&x], &types).unwrap();
                let want = kiln_reference::lu(&x, &types);
                if dtype == DType::F64 {
                    assert_eq!(got[1].to_i64s(), want[1].to_i64s(), "pivots n={n}");
                    assert_eq!(got[2].to_i64s(), want[2].to_i64s(), "permutation n={n}");
                }
                if got[2].to_i64s() == want[2].to_i64s() {
                    let e = max_err(&got[0].to_f64s(), &want[0].to_f64s());
                    assert!(e < tol, "{dtype} n={n}: {e}");
                }
                // a[p] = l u, matrix by matrix, from the blocked factors.
                let f = got[0].to_f64s();
                let p = got[2].to_i64s();
                for k in 0..batch {
                    let m = &f[k * n * n..(k + 1) * n * n];
                    for i in 0..n {
                        for j in 0..n {
                            let lu: f64 = (0..=i.min(j))
                                .map(|q| if q == i { 1.0 } else { m[i * n + q] } * m[q * n + j])
                                .sum();
                            let want = a[k * n * n + p[k * n + i] as usize * n + j];
                            assert!(
                                (lu - want).abs() < 1e3 * tol,
                                "{dtype} n={n}: {lu} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn same_bits_on_any_thread_count() {
        let a = spd(4, 100);
        let x = lit(DType::F32, &[4, 100, 100], &a);
        let op = Op::Cholesky { lower: true };
        let many = run(&op, &[&x], std::slice::from_ref(x.ty())).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let one = pool.install(|| run(&op, &[&x], std::slice::from_ref(x.ty())).unwrap());
        assert_eq!(many[0].to_le_bytes(), one[0].to_le_bytes());
    }
}

//! `cholesky` and `triangular_solve`: the textbook unblocked algorithms, one matrix at a time,
//! every value in f64 and each result element rounded once to the result dtype. They are the
//! oracle the blocked CPU routines (`kiln_runtime::linalg`) are compared with.

use crate::complex::C;
use kiln_ir::{Literal, TensorType, TransposeA};

/// The matrices of a `[..., n, n]`-shaped batch: how many, and their size.
fn batch_of(ty: &TensorType) -> (usize, usize, usize) {
    let r = ty.shape.len();
    let (rows, cols) = (ty.shape[r - 2], ty.shape[r - 1]);
    (ty.shape[..r - 2].iter().product(), rows, cols)
}

fn literal(ty: &TensorType, values: &[f64]) -> Literal {
    Literal::from_f64s(ty.clone(), values).expect("the verifier guarantees consistent types")
}

/// The lower Cholesky factor of the `n x n` row-major matrix whose lower triangle element
/// `(i, j)` (`i >= j`) is `at(i, j)`, written into `l`; false (and `l` unspecified) when a
/// pivot is not positive (or NaN): the matrix is not positive definite.
fn factor_lower(n: usize, at: impl Fn(usize, usize) -> f64, l: &mut [f64]) -> bool {
    for j in 0..n {
        let mut s = at(j, j);
        for k in 0..j {
            s -= l[j * n + k] * l[j * n + k];
        }
        // `!(s > 0)` also catches NaN.
        if s.is_nan() || s <= 0.0 {
            return false;
        }
        let d = s.sqrt();
        l[j * n + j] = d;
        for i in j + 1..n {
            let mut s = at(i, j);
            for k in 0..j {
                s -= l[i * n + k] * l[j * n + k];
            }
            l[i * n + j] = s / d;
        }
    }
    true
}

/// `cholesky` of `a` (verified: rank >= 2, square float matrices) into result type `ty`.
pub fn cholesky(a: &Literal, lower: bool, ty: &TensorType) -> Literal {
    let (batch, n, _) = batch_of(a.ty());
    let v = a.to_f64s();
    let mut out = vec![0.0; v.len()];
    if n == 0 {
        return literal(ty, &out);
    }
    let mut l = vec![0.0; n * n];
    for (m, o) in v.chunks(n * n).zip(out.chunks_mut(n * n)).take(batch) {
        l.iter_mut().for_each(|x| *x = 0.0);
        // The upper factor is the transpose of the lower one of the matrix mirrored from the
        // upper triangle.
        let ok = if lower {
            factor_lower(n, |i, j| m[i * n + j], &mut l)
        } else {
            factor_lower(n, |i, j| m[j * n + i], &mut l)
        };
        for i in 0..n {
            for j in 0..=i {
                let x = if ok { l[i * n + j] } else { f64::NAN };
                if lower {
                    o[i * n + j] = x;
                } else {
                    o[j * n + i] = x;
                }
            }
        }
        if !ok {
            o.iter_mut().for_each(|x| *x = f64::NAN);
        }
    }
    literal(ty, &out)
}

/// The attributes of a `triangular_solve`.
#[derive(Clone, Copy, Debug)]
pub struct Solve {
    /// `op(a) x = b` when true, `x op(a) = b` when false.
    pub left_side: bool,
    /// Whether `a`'s lower triangle is read (else its upper one).
    pub lower: bool,
    /// Whether `a`'s diagonal is taken to be ones (and not read).
    pub unit_diagonal: bool,
    /// `op`.
    pub transpose_a: TransposeA,
}

impl Solve {
    /// Whether `t`, the matrix of the left-side system `t y = c` this solve comes to, is lower
    /// triangular: `t` is `op(a)` for a left-side solve, and `op(a)ᵀ` for a right-side one
    /// (`x op(a) = b` is `op(a)ᵀ xᵀ = bᵀ`); every transposition swaps the triangle.
    pub fn lower_system(&self) -> bool {
        self.lower ^ (self.transpose_a != TransposeA::NoTranspose) ^ !self.left_side
    }

    /// Element `(i, j)` of `t` (see [`Solve::lower_system`]) from the `n x n` matrix `a`: the
    /// triangle `a` is read in (zero outside it, one on the diagonal when `unit_diagonal`).
    pub fn system(&self, a: &[f64], n: usize, i: usize, j: usize) -> f64 {
        self.system_at(a, n, i, j, 0.0, 1.0)
    }

    /// [`Solve::system`] on elements of any type, `zero` and `one` its 0 and 1 (`ADJOINT`'s
    /// conjugation left to the caller).
    fn system_at<T: Copy>(&self, a: &[T], n: usize, i: usize, j: usize, zero: T, one: T) -> T {
        // t = op(a) (left) or op(a)ᵀ (right): whether t(i, j) is a(j, i).
        let swapped = (self.transpose_a != TransposeA::NoTranspose) ^ !self.left_side;
        let (r, c) = if swapped { (j, i) } else { (i, j) };
        if r == c && self.unit_diagonal {
            one
        } else if (self.lower && r >= c) || (!self.lower && r <= c) {
            a[r * n + c]
        } else {
            zero
        }
    }
}

/// The numbers a substitution computes on: reals, and complex numbers (whose adjoint
/// conjugates).
trait Field: Copy {
    const ZERO: Self;
    const ONE: Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn conj(self) -> Self;
}

impl Field for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
    fn div(self, o: Self) -> Self {
        self / o
    }
    fn conj(self) -> Self {
        self
    }
}

impl Field for C {
    const ZERO: Self = [0.0, 0.0];
    const ONE: Self = [1.0, 0.0];
    fn sub(self, o: Self) -> Self {
        [self[0] - o[0], self[1] - o[1]]
    }
    fn mul(self, o: Self) -> Self {
        crate::complex::mul(self, o)
    }
    fn div(self, o: Self) -> Self {
        crate::complex::div(self, o)
    }
    fn conj(self) -> Self {
        [self[0], -self[1]]
    }
}

/// `triangular_solve` of `a` and `b` (verified) into result type `ty`: forward or back
/// substitution in f64 (complex numbers as pairs of f64, `ADJOINT` conjugating the elements
/// of `a` it transposes), the terms of each row summed in order of their column.
pub fn triangular_solve(a: &Literal, b: &Literal, s: Solve, ty: &TensorType) -> Literal {
    if ty.dtype.is_complex() {
        let out = substitute(
            a.ty(),
            &a.to_complex_f64s(),
            b.ty(),
            &b.to_complex_f64s(),
            s,
        );
        return Literal::from_complex_f64s(ty.clone(), &out)
            .expect("the verifier guarantees consistent types");
    }
    literal(
        ty,
        &substitute(a.ty(), &a.to_f64s(), b.ty(), &b.to_f64s(), s),
    )
}

/// The substitution of [`triangular_solve`] on the elements `av` of `a` and `bv` of `b`.
fn substitute<T: Field>(at: &TensorType, av: &[T], bt: &TensorType, bv: &[T], s: Solve) -> Vec<T> {
    let (batch, n, _) = batch_of(at);
    let (_, rows, cols) = batch_of(bt);
    let mut out = vec![T::ZERO; bv.len()];
    // The system t y = c has n rows and m right-hand sides; c is b (left) or bᵀ (right).
    let m = if s.left_side { cols } else { rows };
    let lower = s.lower_system();
    let adjoint = s.transpose_a == TransposeA::Adjoint;
    let mut t = vec![T::ZERO; n * n];
    let mut y = vec![T::ZERO; n * m];
    for k in 0..batch {
        let am = &av[k * n * n..(k + 1) * n * n];
        let bm = &bv[k * rows * cols..(k + 1) * rows * cols];
        for i in 0..n {
            for j in 0..n {
                let e = s.system_at(am, n, i, j, T::ZERO, T::ONE);
                t[i * n + j] = if adjoint { e.conj() } else { e };
            }
        }
        let c = |i: usize, j: usize| {
            if s.left_side {
                bm[i * cols + j]
            } else {
                bm[j * cols + i]
            }
        };
        let order: Vec<usize> = if lower {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        for &i in &order {
            for j in 0..m {
                let mut acc = c(i, j);
                let known = if lower { 0..i } else { i + 1..n };
                for q in known {
                    acc = acc.sub(t[i * n + q].mul(y[q * m + j]));
                }
                y[i * m + j] = acc.div(t[i * n + i]);
            }
        }
        let o = &mut out[k * rows * cols..(k + 1) * rows * cols];
        for i in 0..n {
            for j in 0..m {
                if s.left_side {
                    o[i * cols + j] = y[i * m + j];
                } else {
                    o[j * cols + i] = y[i * m + j];
                }
            }
        }
    }
    out
}

/// Whether `x` is a better pivot than `best`: a larger absolute value, NaN counting as larger
/// than every number (so a NaN is found, and the first of equals is kept).
pub fn better_pivot(x: f64, best: f64) -> bool {
    if best.is_nan() {
        false
    } else {
        x.is_nan() || x.abs() > best.abs()
    }
}

/// `lu` of `a` (verified: square float matrices) into result types `types`: the packed
/// factors, the pivots and the permutation, by Gaussian elimination with partial pivoting in
/// f64 (a zero pivot leaves its column below undivided).
pub fn lu(a: &Literal, types: &[TensorType]) -> Vec<Literal> {
    let (batch, n, _) = batch_of(a.ty());
    let mut v = a.to_f64s();
    let mut pivots = vec![0i64; batch * n];
    let mut perm = vec![0i64; batch * n];
    for k in 0..batch {
        let m = &mut v[k * n * n..(k + 1) * n * n];
        let p = &mut perm[k * n..(k + 1) * n];
        p.iter_mut().enumerate().for_each(|(i, x)| *x = i as i64);
        for j in 0..n {
            let mut best = j;
            for i in j + 1..n {
                if better_pivot(m[i * n + j], m[best * n + j]) {
                    best = i;
                }
            }
            pivots[k * n + j] = best as i64;
            if best != j {
                for c in 0..n {
                    m.swap(j * n + c, best * n + c);
                }
                p.swap(j, best);
            }
            let d = m[j * n + j];
            for i in j + 1..n {
                if d != 0.0 {
                    m[i * n + j] /= d;
                }
                let f = m[i * n + j];
                for c in j + 1..n {
                    m[i * n + c] -= f * m[j * n + c];
                }
            }
        }
    }
    vec![
        literal(&types[0], &v),
        Literal::from_i64s(types[1].clone(), &pivots).expect("the verifier's types"),
        Literal::from_i64s(types[2].clone(), &perm).expect("the verifier's types"),
    ]
}

/// The magnitudes of `lu`'s packed factors: `|l| |u|` (the backward error bound of the
/// elimination, up to a factor of the unit roundoff) at each element of `u`, and divided by
/// the pivot `|u_jj|` at each element of `l` below it.
pub(crate) fn lu_magnitude(packed: &Literal) -> Vec<f64> {
    let (batch, n, _) = batch_of(packed.ty());
    let v = packed.to_f64s();
    let mut out = vec![0.0; v.len()];
    for k in 0..batch {
        let m = &v[k * n * n..(k + 1) * n * n];
        let l = |i: usize, q: usize| match i.cmp(&q) {
            std::cmp::Ordering::Greater => m[i * n + q].abs(),
            std::cmp::Ordering::Equal => 1.0,
            std::cmp::Ordering::Less => 0.0,
        };
        let u = |q: usize, j: usize| if q <= j { m[q * n + j].abs() } else { 0.0 };
        for i in 0..n {
            for j in 0..n {
                let lu: f64 = (0..n).map(|q| l(i, q) * u(q, j)).sum();
                out[k * n * n + i * n + j] = if i > j { lu / u(j, j) } else { lu };
            }
        }
    }
    out
}

/// Solves `cmp(t) z = r` for the comparison matrix of the `n x n` triangular `t` (`|t_ii|` on
/// the diagonal, `-|t_ij|` off it), whose inverse bounds `|t⁻¹|` element by element; `r` is
/// `n x m` and non-negative, and so is `z` (infinite where a diagonal element is zero).
fn comparison_solve(t: &[f64], n: usize, lower: bool, r: &[f64], m: usize) -> Vec<f64> {
    let mut z = vec![0.0; n * m];
    let order: Vec<usize> = if lower {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    };
    for &i in &order {
        for j in 0..m {
            let mut acc = r[i * m + j];
            for q in 0..n {
                if (lower && q < i) || (!lower && q > i) {
                    acc += t[i * n + q].abs() * z[q * m + j];
                }
            }
            z[i * m + j] = acc / t[i * n + i].abs();
        }
    }
    z
}

/// The magnitudes (see `crate::accuracy`) of `triangular_solve`'s result `x`: the first-order
/// bound of a substitution's forward error, `|t⁻¹| ((|t| + m_t) |y| + m_c)` for the system
/// `t y = c` it solves, where `m_t` and `m_c` are the operands' own magnitudes (the errors
/// they bring) and `|t⁻¹|` is bounded by the comparison matrix's inverse.
pub(crate) fn triangular_solve_magnitude(
    a: &Literal,
    x: &Literal,
    s: Solve,
    ma: &Literal,
    mb: &Literal,
) -> Vec<f64> {
    let (batch, n, _) = batch_of(a.ty());
    let (_, rows, cols) = batch_of(x.ty());
    let m = if s.left_side { cols } else { rows };
    let av = a.to_f64s();
    let xv = x.to_f64s();
    let (mav, mbv) = (ma.to_f64s(), mb.to_f64s());
    let mut out = vec![0.0; xv.len()];
    let lower = s.lower_system();
    for k in 0..batch {
        let am = &av[k * n * n..(k + 1) * n * n];
        let mam = &mav[k * n * n..(k + 1) * n * n];
        let xm = &xv[k * rows * cols..(k + 1) * rows * cols];
        let mbm = &mbv[k * rows * cols..(k + 1) * rows * cols];
        let t: Vec<f64> = (0..n * n).map(|p| s.system(am, n, p / n, p % n)).collect();
        let mt: Vec<f64> = (0..n * n)
            .map(|p| s.system(mam, n, p / n, p % n).abs())
            .collect();
        let at = |v: &[f64], i: usize, j: usize| {
            if s.left_side {
                v[i * cols + j]
            } else {
                v[j * cols + i]
            }
        };
        let mut r = vec![0.0; n * m];
        for i in 0..n {
            for j in 0..m {
                let tx: f64 = (0..n)
                    .map(|q| (t[i * n + q].abs() + mt[i * n + q]) * at(xm, q, j).abs())
                    .sum();
                r[i * m + j] = tx + at(mbm, i, j).abs();
            }
        }
        let z = comparison_solve(&t, n, lower, &r, m);
        let o = &mut out[k * rows * cols..(k + 1) * rows * cols];
        for i in 0..n {
            for j in 0..m {
                if s.left_side {
                    o[i * cols + j] = z[i * m + j];
                } else {
                    o[j * cols + i] = z[i * m + j];
                }
            }
        }
    }
    out
}

/// The magnitudes of `cholesky`'s result: the first-order bound of the factor's forward error
/// for a backward error `|Δa| <= g`, `g = max(|l| |l|ᵀ, m_a)` (what the algorithm commits, up
/// to a factor of the unit roundoff, and the error the operand brings, its magnitude `m_a`
/// mirrored from the triangle read), `|l| Φ(|l⁻¹| g |l⁻ᵀ|)`, where `Φ` keeps the lower
/// triangle and half the diagonal (`Δl = l Φ(l⁻¹ Δa l⁻ᵀ)`); transposed for the upper factor.
/// A matrix that is not positive definite has NaN results, which bound themselves.
pub(crate) fn cholesky_magnitude(l: &Literal, lower: bool, ma: &Literal) -> Vec<f64> {
    let (batch, n, _) = batch_of(l.ty());
    let v = l.to_f64s();
    let mav = ma.to_f64s();
    let mut out = vec![0.0; v.len()];
    for k in 0..batch {
        let lm = &v[k * n * n..(k + 1) * n * n];
        let mam = &mav[k * n * n..(k + 1) * n * n];
        // The operand's magnitude, element (i, j) of the lower triangle read (and mirrored).
        let m_a = |i: usize, j: usize| {
            let (i, j) = if i >= j { (i, j) } else { (j, i) };
            if lower {
                mam[i * n + j]
            } else {
                mam[j * n + i]
            }
            .abs()
        };
        // The lower factor, whichever was computed.
        let f: Vec<f64> = (0..n * n)
            .map(|p| {
                let (i, j) = (p / n, p % n);
                if lower { lm[i * n + j] } else { lm[j * n + i] }
            })
            .collect();
        // g = |l| |l|ᵀ, then w = cmp(l)⁻¹ g cmp(l)⁻ᵀ (g and w are symmetric).
        let mut g = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                let ll: f64 = (0..n)
                    .map(|q| f[i * n + q].abs() * f[j * n + q].abs())
                    .sum();
                g[i * n + j] = ll.max(m_a(i, j));
            }
        }
        let h = comparison_solve(&f, n, true, &g, n);
        let mut ht = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                ht[i * n + j] = h[j * n + i];
            }
        }
        let w = comparison_solve(&f, n, true, &ht, n);
        let o = &mut out[k * n * n..(k + 1) * n * n];
        for i in 0..n {
            for j in 0..=i {
                let phi = |q: usize| {
                    if q < j {
                        0.0
                    } else if q == j {
                        w[q * n + j] / 2.0
                    } else {
                        w[q * n + j]
                    }
                };
                let e: f64 = (0..n).map(|q| f[i * n + q].abs() * phi(q)).sum();
                if lower {
                    o[i * n + j] = e;
                } else {
                    o[j * n + i] = e;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::DType;

    fn lit(shape: &[usize], v: &[f64]) -> Literal {
        Literal::from_f64s(TensorType::new(DType::F64, shape.to_vec()), v).unwrap()
    }

    #[test]
    fn cholesky_of_a_known_matrix() {
        // [[4, 12, -16], [12, 37, -43], [-16, -43, 98]] = L Lᵀ with L = [[2,0,0],[6,1,0],[-8,5,3]].
        let a = lit(&[3, 3], &[4., 12., -16., 12., 37., -43., -16., -43., 98.]);
        let l = cholesky(&a, true, a.ty());
        assert_eq!(l.to_f64s(), [2., 0., 0., 6., 1., 0., -8., 5., 3.]);
        let u = cholesky(&a, false, a.ty());
        assert_eq!(u.to_f64s(), [2., 6., -8., 0., 1., 5., 0., 0., 3.]);
        let bad = lit(&[2, 2], &[1., 2., 2., 1.]);
        assert!(
            cholesky(&bad, true, bad.ty())
                .to_f64s()
                .iter()
                .all(|x| x.is_nan())
        );
    }

    #[test]
    fn complex_systems_solve_on_every_side_with_the_adjoint_conjugated() {
        use crate::complex::{C, add, mul};
        use kiln_ir::DType;
        let clit =
            |v: &[C]| Literal::from_complex_f64s(TensorType::new(DType::C128, [3, 3]), v).unwrap();
        let av: Vec<C> = (0..9)
            .map(|k| [2.0 + (k % 4) as f64, (k % 3) as f64 - 1.0])
            .collect();
        let bv: Vec<C> = (0..9)
            .map(|k| [k as f64 - 4.0, 1.0 - (k % 2) as f64])
            .collect();
        let (a, b) = (clit(&av), clit(&bv));
        for left_side in [true, false] {
            for lower in [true, false] {
                for unit_diagonal in [true, false] {
                    for transpose_a in TransposeA::ALL.iter().copied() {
                        let s = Solve {
                            left_side,
                            lower,
                            unit_diagonal,
                            transpose_a,
                        };
                        let x = triangular_solve(&a, &b, s, b.ty()).to_complex_f64s();
                        // op(a) as a dense matrix, then the product with x on the given side.
                        let opa = |i: usize, j: usize| -> C {
                            let t = transpose_a != TransposeA::NoTranspose;
                            let (r, c) = if t { (j, i) } else { (i, j) };
                            let e = if r == c && unit_diagonal {
                                [1.0, 0.0]
                            } else if (lower && r >= c) || (!lower && r <= c) {
                                av[r * 3 + c]
                            } else {
                                [0.0, 0.0]
                            };
                            if transpose_a == TransposeA::Adjoint {
                                [e[0], -e[1]]
                            } else {
                                e
                            }
                        };
                        for i in 0..3 {
                            for j in 0..3 {
                                let got = (0..3).fold([0.0, 0.0], |acc, k| {
                                    add(
                                        acc,
                                        if left_side {
                                            mul(opa(i, k), x[k * 3 + j])
                                        } else {
                                            mul(x[i * 3 + k], opa(k, j))
                                        },
                                    )
                                });
                                let want = bv[i * 3 + j];
                                let err = (got[0] - want[0]).abs() + (got[1] - want[1]).abs();
                                assert!(err < 1e-12, "{s:?}: {got:?} vs {want:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_side_and_transpose_solves_its_system() {
        let a = lit(&[3, 3], &[2., 9., 9., 1., 3., 9., -1., 2., 4.]);
        let b = lit(&[3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
        for left_side in [true, false] {
            for lower in [true, false] {
                for unit_diagonal in [true, false] {
                    for transpose_a in [TransposeA::NoTranspose, TransposeA::Transpose] {
                        let s = Solve {
                            left_side,
                            lower,
                            unit_diagonal,
                            transpose_a,
                        };
                        let x = triangular_solve(&a, &b, s, b.ty()).to_f64s();
                        // op(a) as a dense matrix, then the product with x on the given side.
                        let opa = |i: usize, j: usize| {
                            let t = transpose_a != TransposeA::NoTranspose;
                            let (r, c) = if t { (j, i) } else { (i, j) };
                            if r == c && unit_diagonal {
                                1.0
                            } else if (lower && r >= c) || (!lower && r <= c) {
                                a.to_f64s()[r * 3 + c]
                            } else {
                                0.0
                            }
                        };
                        for i in 0..3 {
                            for j in 0..3 {
                                let got: f64 = (0..3)
                                    .map(|k| {
                                        if left_side {
                                            opa(i, k) * x[k * 3 + j]
                                        } else {
                                            x[i * 3 + k] * opa(k, j)
                                        }
                                    })
                                    .sum();
                                let want = b.to_f64s()[i * 3 + j];
                                assert!((got - want).abs() < 1e-12, "{s:?}: {got} vs {want}");
                            }
                        }
                    }
                }
            }
        }
    }
}

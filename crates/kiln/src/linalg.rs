//! Linear algebra on matrices and batches of matrices (the last two dimensions are the matrix,
//! any leading ones a batch): [`cholesky`], [`lu`], [`solve_triangular`], [`cho_solve`] and
//! [`solve`] (positive definite or general).
//! Each is differentiable, runs eagerly or under `jit`, and batches under `vmap`.
//!
//! ```
//! use kiln::Tensor;
//! use kiln::linalg::{self, Assume, SolveTriangular};
//! let a = Tensor::from_vec(vec![4.0f64, 2.0, 2.0, 3.0], [2, 2]).unwrap();
//! let l = linalg::cholesky(&a, true);
//! assert_eq!(l.to_vec::<f64>().unwrap(), vec![2.0, 0.0, 1.0, 2f64.sqrt()]);
//! let b = Tensor::from_vec(vec![6.0f64, 5.0], [2, 1]).unwrap();
//! // l y = b, then lᵀ x = y: x solves a x = b.
//! let y = linalg::solve_triangular(&l, &b, SolveTriangular::lower());
//! let x = linalg::solve_triangular(&l, &y, SolveTriangular::lower().transposed());
//! let near = |t: &Tensor| t.to_vec::<f64>().unwrap().iter().all(|v| (v - 1.0).abs() < 1e-15);
//! assert!(near(&x));
//! assert!(near(&linalg::solve(&a, &b, Assume::Pos)));
//! assert!(near(&linalg::solve(&a, &b, Assume::General)));
//! ```
//!
//! Errors (a matrix that is not square, integer elements, a rank below 2, a right-hand side
//! whose batch dimensions or size do not match) name the function and the caller's line.
//! A matrix that is not positive definite gives NaN in its whole Cholesky factor (and so in
//! what `cho_solve` and `solve` with [`Assume::Pos`] compute from it).

use kiln_ir::{Loc, TransposeA};
use kiln_trace::linalg::{check_rhs, check_square};
use kiln_trace::{Tensor, composite};

/// How [`solve_triangular`] reads its matrix and which side it solves on; built from
/// [`SolveTriangular::lower`] or [`SolveTriangular::upper`].
///
/// # Examples
///
/// ```
/// use kiln::linalg::SolveTriangular;
/// use kiln::ir::TransposeA;
/// let how = SolveTriangular::upper().transposed().unit_diagonal();
/// assert!(!how.lower && how.left_side && how.unit_diagonal);
/// assert_eq!(how.transpose, TransposeA::Transpose);
/// assert_eq!(SolveTriangular::lower().right().left_side, false);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SolveTriangular {
    /// Read the lower triangle of `a` (else the upper one).
    pub lower: bool,
    /// Solve `op(a) x = b` (else `x op(a) = b`).
    pub left_side: bool,
    /// Take the diagonal of `a` to be ones (it is not read).
    pub unit_diagonal: bool,
    /// `op(a)`: `a` itself, or its transpose.
    pub transpose: TransposeA,
}

impl SolveTriangular {
    /// `a x = b` with `a`'s lower triangle.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, linalg::{self, SolveTriangular}};
    /// // [[2, 0], [1, 4]] x = [2, 9]; the 7 above the diagonal is not read.
    /// let a = Tensor::from_vec(vec![2.0f64, 7.0, 1.0, 4.0], [2, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![2.0f64, 9.0], [2, 1]).unwrap();
    /// let x = linalg::solve_triangular(&a, &b, SolveTriangular::lower());
    /// assert_eq!(x.to_vec::<f64>().unwrap(), [1.0, 2.0]);
    /// ```
    pub fn lower() -> SolveTriangular {
        SolveTriangular {
            lower: true,
            left_side: true,
            unit_diagonal: false,
            transpose: TransposeA::NoTranspose,
        }
    }

    /// `a x = b` with `a`'s upper triangle.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, linalg::{self, SolveTriangular}};
    /// // [[2, 1], [0, 4]] x = [4, 8]; the 7 below the diagonal is not read.
    /// let a = Tensor::from_vec(vec![2.0f64, 1.0, 7.0, 4.0], [2, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![4.0f64, 8.0], [2, 1]).unwrap();
    /// let x = linalg::solve_triangular(&a, &b, SolveTriangular::upper());
    /// assert_eq!(x.to_vec::<f64>().unwrap(), [1.0, 2.0]);
    /// ```
    pub fn upper() -> SolveTriangular {
        SolveTriangular {
            lower: false,
            ..SolveTriangular::lower()
        }
    }

    /// Solves `x op(a) = b` instead (the unknown on the left of the matrix).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, linalg::{self, SolveTriangular}};
    /// // x [[2, 1], [0, 4]] = [2, 9], with x a row.
    /// let a = Tensor::from_vec(vec![2.0f64, 1.0, 0.0, 4.0], [2, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![2.0f64, 9.0], [1, 2]).unwrap();
    /// let x = linalg::solve_triangular(&a, &b, SolveTriangular::upper().right());
    /// assert_eq!(x.to_vec::<f64>().unwrap(), [1.0, 2.0]);
    /// ```
    pub fn right(self) -> SolveTriangular {
        SolveTriangular {
            left_side: false,
            ..self
        }
    }

    /// Takes `a`'s diagonal to be ones.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, linalg::{self, SolveTriangular}};
    /// // [[1, 0], [3, 1]] x = [1, 5]: the stored diagonal (5s) is not read.
    /// let a = Tensor::from_vec(vec![5.0f64, 0.0, 3.0, 5.0], [2, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![1.0f64, 5.0], [2, 1]).unwrap();
    /// let x = linalg::solve_triangular(&a, &b, SolveTriangular::lower().unit_diagonal());
    /// assert_eq!(x.to_vec::<f64>().unwrap(), [1.0, 2.0]);
    /// ```
    pub fn unit_diagonal(self) -> SolveTriangular {
        SolveTriangular {
            unit_diagonal: true,
            ..self
        }
    }

    /// Uses `aᵀ` in place of `a`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, linalg::{self, SolveTriangular}};
    /// // a = [[2, 0], [1, 4]]; aᵀ x = [4, 8] with aᵀ = [[2, 1], [0, 4]].
    /// let a = Tensor::from_vec(vec![2.0f64, 0.0, 1.0, 4.0], [2, 2]).unwrap();
    /// let b = Tensor::from_vec(vec![4.0f64, 8.0], [2, 1]).unwrap();
    /// let x = linalg::solve_triangular(&a, &b, SolveTriangular::lower().transposed());
    /// assert_eq!(x.to_vec::<f64>().unwrap(), [1.0, 2.0]);
    /// ```
    pub fn transposed(self) -> SolveTriangular {
        SolveTriangular {
            transpose: TransposeA::Transpose,
            ..self
        }
    }
}

/// The Cholesky factor of each symmetric positive definite matrix of `a`: lower (`l lᵀ = a`)
/// or upper (`uᵀ u = a`); only that triangle of `a` is read, the other triangle of the result
/// is zero.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, linalg};
/// let a = Tensor::from_vec(vec![4.0f64, 2.0, 2.0, 3.0], [2, 2]).unwrap();
/// let u = linalg::cholesky(&a, false);
/// assert_eq!(u.to_vec::<f64>().unwrap(), [2.0, 1.0, 0.0, 2f64.sqrt()]);
/// let back = u.permute(&[1, 0]).matmul(&u).to_vec::<f64>().unwrap(); // uᵀ u = a
/// assert!(back.iter().zip([4.0, 2.0, 2.0, 3.0]).all(|(x, y)| (x - y).abs() < 1e-12));
/// // Not positive definite: NaN throughout.
/// let bad = Tensor::from_vec(vec![1.0f64, 2.0, 2.0, 1.0], [2, 2]).unwrap();
/// assert!(linalg::cholesky(&bad, true).to_vec::<f64>().unwrap().iter().all(|v| v.is_nan()));
/// ```
#[track_caller]
pub fn cholesky(a: &Tensor, lower: bool) -> Tensor {
    let loc = Loc::caller();
    composite("cholesky", loc, || kiln_trace::linalg::cholesky(a, lower))
}

/// The solution `x` of `op(a) x = b` (or `x op(a) = b`, see [`SolveTriangular::right`]) for
/// each triangular matrix of `a` and the matching matrix of `b`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, linalg::{self, SolveTriangular}};
/// // A batch of two: diag(2, 4) and [[1, 0], [1, 1]].
/// let a = Tensor::from_vec(vec![2.0f64, 0.0, 0.0, 4.0, 1.0, 0.0, 1.0, 1.0], [2, 2, 2]).unwrap();
/// let b = Tensor::from_vec(vec![2.0f64, 8.0, 1.0, 3.0], [2, 2, 1]).unwrap();
/// let x = linalg::solve_triangular(&a, &b, SolveTriangular::lower());
/// assert_eq!(x.to_vec::<f64>().unwrap(), [1.0, 2.0, 1.0, 2.0]);
/// // A matrix that is not square is an error.
/// let wide = Tensor::ones(kiln::DType::F64, [2, 3]);
/// let err = linalg::solve_triangular(&wide, &b, SolveTriangular::lower());
/// assert_eq!(err.error().unwrap().op, "solve_triangular");
/// ```
#[track_caller]
pub fn solve_triangular(a: &Tensor, b: &Tensor, how: SolveTriangular) -> Tensor {
    let loc = Loc::caller();
    composite("solve_triangular", loc, || {
        kiln_trace::linalg::triangular_solve(
            a,
            b,
            how.left_side,
            how.lower,
            how.unit_diagonal,
            how.transpose,
        )
    })
}

/// The solution `x` of `a x = b` from `a`'s Cholesky factor `c` (lower when `lower`, as
/// [`cholesky`] gives it): two triangular solves. `b` holds one right-hand side per column, or
/// is a vector (one rank below `c`).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, linalg};
/// let a = Tensor::from_vec(vec![4.0f64, 2.0, 2.0, 3.0], [2, 2]).unwrap();
/// let b = Tensor::from_vec(vec![6.0f64, 5.0], [2]).unwrap();
/// let l = linalg::cholesky(&a, true);
/// let x = linalg::cho_solve(&l, true, &b).to_vec::<f64>().unwrap();
/// assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 1.0).abs() < 1e-12, "{x:?}");
/// // The upper factor gives the same solution.
/// let xu = linalg::cho_solve(&linalg::cholesky(&a, false), false, &b).to_vec::<f64>().unwrap();
/// assert!((xu[0] - 1.0).abs() < 1e-12 && (xu[1] - 1.0).abs() < 1e-12, "{xu:?}");
/// ```
#[track_caller]
pub fn cho_solve(c: &Tensor, lower: bool, b: &Tensor) -> Tensor {
    let loc = Loc::caller();
    composite("cho_solve", loc, || {
        with_columns(c, b, "cho_solve", loc, |b| {
            let first = if lower {
                SolveTriangular::lower()
            } else {
                SolveTriangular::upper().transposed()
            };
            let second = if lower {
                SolveTriangular::lower().transposed()
            } else {
                SolveTriangular::upper()
            };
            let y = solve_triangular(c, b, first);
            solve_triangular(c, &y, second)
        })
    })
}

/// What [`solve`] may assume of its matrices.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, linalg::{self, Assume}};
/// // Assume::Pos reads only the lower triangle: the 99 is ignored.
/// let a = Tensor::from_vec(vec![4.0f64, 99.0, 2.0, 3.0], [2, 2]).unwrap();
/// let b = Tensor::from_vec(vec![6.0f64, 5.0], [2]).unwrap();
/// let x = linalg::solve(&a, &b, Assume::Pos).to_vec::<f64>().unwrap();
/// assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 1.0).abs() < 1e-12, "{x:?}");
/// // Assume::General uses all of it: [[4, 99], [2, 3]] x = [6, 5] has another solution.
/// let y = linalg::solve(&a, &b, Assume::General).to_vec::<f64>().unwrap();
/// assert!((4.0 * y[0] + 99.0 * y[1] - 6.0).abs() < 1e-12 && (x[0] - y[0]).abs() > 0.1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assume {
    /// Symmetric positive definite: solved through the Cholesky factor of the lower triangle
    /// (the upper one is not read).
    Pos,
    /// Any square matrix: solved through its LU factorization with partial pivoting ([`lu`]).
    /// A singular matrix gives infinities or NaNs.
    General,
}

/// The LU factorization with partial pivoting of each square matrix of `a`: the packed factors
/// (`l`'s strict lower triangle, its unit diagonal not stored, and `u` on and above the
/// diagonal), the `i32` pivots (the row swapped with row `j` at step `j`) and the `i32`
/// permutation `p` with `a[p] = l u` (XLA's `LuDecomposition`, a kiln op).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, linalg};
/// // Partial pivoting takes row 1 (|3| > |1|) first.
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]).unwrap();
/// let (packed, pivots, perm) = linalg::lu(&a);
/// assert_eq!(pivots.to_vec::<i32>().unwrap(), [1, 1]);
/// assert_eq!(perm.to_vec::<i32>().unwrap(), [1, 0]);
/// // l = [[1, 0], [1/3, 1]], u = [[3, 4], [0, 2/3]]: l u = [[3, 4], [1, 2]] = a[p].
/// let want = [3.0, 4.0, 1.0 / 3.0, 2.0 / 3.0];
/// let got = packed.to_vec::<f64>().unwrap();
/// assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-12), "{got:?}");
/// ```
#[track_caller]
pub fn lu(a: &Tensor) -> (Tensor, Tensor, Tensor) {
    let loc = Loc::caller();
    composite("lu", loc, || kiln_trace::linalg::lu(a))
}

/// The solution `x` of `a x = b` for each square matrix of `a`, under `assume`. `b` holds one
/// right-hand side per column, or is a vector (one rank below `a`).
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, linalg::{self, Assume}};
/// let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]).unwrap();
/// // Two right-hand sides, one per column: [5, 11] and [1, 3].
/// let b = Tensor::from_vec(vec![5.0f64, 1.0, 11.0, 3.0], [2, 2]).unwrap();
/// let x = linalg::solve(&a, &b, Assume::General).to_vec::<f64>().unwrap();
/// assert!(x.iter().zip([1.0, 1.0, 2.0, 0.0]).all(|(g, w)| (g - w).abs() < 1e-12), "{x:?}");
/// // A right-hand side of the wrong size is an error naming `solve`.
/// let bad = linalg::solve(&a, &Tensor::ones(DType::F64, [3]), Assume::General);
/// assert_eq!(bad.error().unwrap().op, "solve");
/// ```
#[track_caller]
pub fn solve(a: &Tensor, b: &Tensor, assume: Assume) -> Tensor {
    let loc = Loc::caller();
    composite("solve", loc, || match assume {
        Assume::Pos => {
            if let Err(t) = check_square(a, "solve", loc) {
                return t;
            }
            let l = cholesky(a, true);
            cho_solve(&l, true, b)
        }
        Assume::General => with_columns(a, b, "solve", loc, |b| {
            let (packed, _, perm) = lu(a);
            // The rows of b in the factorization's order: l u x = b[p].
            let idx = perm.unsqueeze(-1).broadcast_to(&b.shape());
            let pb = b.take_along_axis(&idx, -2);
            let y = solve_triangular(&packed, &pb, SolveTriangular::lower().unit_diagonal());
            solve_triangular(&packed, &y, SolveTriangular::upper())
        }),
    })
}

/// `f` on `b` as a batch of column matrices (a vector `b`, one rank below `a`, as one column,
/// and its result back as a vector), after checking both.
fn with_columns(
    a: &Tensor,
    b: &Tensor,
    name: &str,
    loc: Loc,
    f: impl FnOnce(&Tensor) -> Tensor,
) -> Tensor {
    if let Err(t) = check_square(a, name, loc) {
        return t;
    }
    if b.error().is_none() && b.rank() + 1 == a.rank() {
        let col = b.unsqueeze(-1);
        if let Err(t) = check_rhs(a, &col, true, name, loc) {
            return t;
        }
        return f(&col).squeeze(-1);
    }
    if let Err(t) = check_rhs(a, b, true, name, loc) {
        return t;
    }
    f(b)
}

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
    pub fn lower() -> SolveTriangular {
        SolveTriangular {
            lower: true,
            left_side: true,
            unit_diagonal: false,
            transpose: TransposeA::NoTranspose,
        }
    }

    /// `a x = b` with `a`'s upper triangle.
    pub fn upper() -> SolveTriangular {
        SolveTriangular {
            lower: false,
            ..SolveTriangular::lower()
        }
    }

    /// Solves `x op(a) = b` instead (the unknown on the left of the matrix).
    pub fn right(self) -> SolveTriangular {
        SolveTriangular {
            left_side: false,
            ..self
        }
    }

    /// Takes `a`'s diagonal to be ones.
    pub fn unit_diagonal(self) -> SolveTriangular {
        SolveTriangular {
            unit_diagonal: true,
            ..self
        }
    }

    /// Uses `aᵀ` in place of `a`.
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
#[track_caller]
pub fn cholesky(a: &Tensor, lower: bool) -> Tensor {
    let loc = Loc::caller();
    composite("cholesky", loc, || kiln_trace::linalg::cholesky(a, lower))
}

/// The solution `x` of `op(a) x = b` (or `x op(a) = b`, see [`SolveTriangular::right`]) for
/// each triangular matrix of `a` and the matching matrix of `b`.
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
#[track_caller]
pub fn lu(a: &Tensor) -> (Tensor, Tensor, Tensor) {
    let loc = Loc::caller();
    composite("lu", loc, || kiln_trace::linalg::lu(a))
}

/// The solution `x` of `a x = b` for each square matrix of `a`, under `assume`. `b` holds one
/// right-hand side per column, or is a vector (one rank below `a`).
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

//! The IR's linear algebra ops on tensors: [`cholesky`], [`triangular_solve`] and [`lu`], each checked
//! first with an error that names the user's operation and says what is wrong with the shapes
//! or the element type (a batch of matrices: rank at least 2, square, float, with matching
//! leading dimensions).
//!
//! Eagerly, a small op runs on the reference interpreter and a large one is compiled (the
//! backend's blocked host routines), as every op without a native loop does
//! (`crate::trace::EAGER_COMPILE_THRESHOLD`).

use crate::composite::failure;
use crate::ops::ty_str;
use crate::tensor::Tensor;
use crate::trace::apply;
use kiln_ir::{Loc, Op, TransposeA};

/// Checks that `a` is a batch of square float matrices, for the user operation `name`.
pub fn check_square(a: &Tensor, name: &str, loc: Loc) -> Result<(), Tensor> {
    if let Some(e) = a.error() {
        return Err(Tensor::failed(e.clone()));
    }
    let s = a.shape();
    if s.len() < 2 {
        return Err(failure(
            name,
            format!(
                "needs a matrix or a batch of matrices (rank at least 2), got {}",
                ty_str(a)
            ),
            loc,
        ));
    }
    if s[s.len() - 1] != s[s.len() - 2] {
        return Err(failure(
            name,
            format!("needs square matrices, got {}", ty_str(a)),
            loc,
        ));
    }
    if !a.dtype().is_float() {
        return Err(failure(
            name,
            format!(
                "needs a float element type, got {} (convert it with `cast`)",
                ty_str(a)
            ),
            loc,
        ));
    }
    Ok(())
}

/// Checks that `b` is a right-hand side for the square matrices `a` (checked): a float of
/// `a`'s element type and rank, the same leading (batch) dimensions, and `a`'s size along
/// the dimension the solve pairs with it (rows on the left, columns on the right).
pub fn check_rhs(
    a: &Tensor,
    b: &Tensor,
    left_side: bool,
    name: &str,
    loc: Loc,
) -> Result<(), Tensor> {
    if let Some(e) = b.error() {
        return Err(Tensor::failed(e.clone()));
    }
    let (sa, sb) = (a.shape(), b.shape());
    let r = sa.len();
    if b.dtype() != a.dtype() {
        return Err(failure(
            name,
            format!(
                "the matrices {} and the right-hand side {} must have one element type",
                ty_str(a),
                ty_str(b)
            ),
            loc,
        ));
    }
    if sb.len() != r || sb[..r - 2] != sa[..r - 2] {
        return Err(failure(
            name,
            format!(
                "the right-hand side {} must have the batch dimensions {:?} of the matrices {} and two more",
                ty_str(b),
                &sa[..r - 2],
                ty_str(a)
            ),
            loc,
        ));
    }
    let (d, what) = if left_side {
        (r - 2, "rows")
    } else {
        (r - 1, "columns")
    };
    if sb[d] != sa[r - 1] {
        return Err(failure(
            name,
            format!(
                "the right-hand side {} must have {} {what} to match the matrices {}",
                ty_str(b),
                sa[r - 1],
                ty_str(a)
            ),
            loc,
        ));
    }
    Ok(())
}

/// The Cholesky factor of each symmetric positive definite matrix of `a` (the last two
/// dimensions; the leading ones are a batch): lower (`l lᵀ = a`) or upper (`uᵀ u = a`). Only
/// that triangle of `a` is read. A matrix that is not positive definite gives NaN everywhere in
/// its factor. Differentiable.
///
/// # Examples
///
/// ```
/// use kiln_trace::{Tensor, linalg::cholesky};
/// let a = Tensor::from_vec(vec![4.0f32, 2.0, 2.0, 3.0], [2, 2]).unwrap();
/// let l = cholesky(&a, true).to_vec::<f32>().unwrap();
/// let want = [2.0f32, 0.0, 1.0, 2f32.sqrt()]; // l lᵀ = a
/// assert!(l.iter().zip(want).all(|(x, y)| (x - y).abs() < 1e-6), "{l:?}");
/// ```
#[track_caller]
pub fn cholesky(a: &Tensor, lower: bool) -> Tensor {
    let loc = Loc::caller();
    if let Err(t) = check_square(a, "cholesky", loc) {
        return t;
    }
    apply(Op::Cholesky { lower }, &[a], None, "cholesky", loc).remove(0)
}

/// Solves `op(a) x = b` (`left_side`) or `x op(a) = b` for each triangular matrix of `a` (its
/// `lower` or upper triangle; ones on the diagonal when `unit_diagonal`) and the matching
/// matrix of `b`. Differentiable in both.
///
/// # Examples
///
/// ```
/// use kiln_trace::{Tensor, linalg::triangular_solve};
/// use kiln_ir::TransposeA;
/// let a = Tensor::from_vec(vec![2.0f32, 0.0, 1.0, 1.0], [2, 2]).unwrap();
/// let b = Tensor::from_vec(vec![2.0f32, 3.0], [2, 1]).unwrap();
/// let x = triangular_solve(&a, &b, true, true, false, TransposeA::NoTranspose);
/// assert_eq!(x.to_vec::<f32>().unwrap(), [1.0, 2.0]); // 2·1 = 2, 1·1 + 1·2 = 3
/// ```
#[track_caller]
pub fn triangular_solve(
    a: &Tensor,
    b: &Tensor,
    left_side: bool,
    lower: bool,
    unit_diagonal: bool,
    transpose_a: TransposeA,
) -> Tensor {
    let loc = Loc::caller();
    let name = "triangular_solve";
    if let Err(t) = check_square(a, name, loc).and_then(|_| check_rhs(a, b, left_side, name, loc)) {
        return t;
    }
    apply(
        Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal,
            transpose_a,
        },
        &[a, b],
        None,
        name,
        loc,
    )
    .remove(0)
}

/// The LU factorization with partial pivoting of each square matrix of `a`: the packed factors
/// (`l`'s strict lower triangle, its unit diagonal not stored, and `u`), the `i32` pivots (the
/// row swapped with row `j` at step `j`) and the `i32` permutation `p` with `a[p] = l u`.
/// Differentiable in the factors.
///
/// # Examples
///
/// ```
/// use kiln_trace::{Tensor, linalg::lu};
/// let a = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], [2, 2]).unwrap();
/// let (factors, pivots, perm) = lu(&a);
/// // Row 1 is the pivot: a[p] = [[2, 3], [0, 1]] = l u with l the identity.
/// assert_eq!(perm.to_vec::<i32>().unwrap(), [1, 0]);
/// assert_eq!(pivots.to_vec::<i32>().unwrap(), [1, 1]);
/// assert_eq!(factors.to_vec::<f32>().unwrap(), [2.0, 3.0, 0.0, 1.0]);
/// ```
#[track_caller]
pub fn lu(a: &Tensor) -> (Tensor, Tensor, Tensor) {
    let loc = Loc::caller();
    if let Err(t) = check_square(a, "lu", loc) {
        return (t.clone(), t.clone(), t);
    }
    let mut rs = apply(Op::Lu {}, &[a], None, "lu", loc);
    let perm = rs.pop().expect("lu has three results");
    let pivots = rs.pop().expect("lu has three results");
    (rs.pop().expect("lu has three results"), pivots, perm)
}

//! `map`: a function applied to each slice along the leading dimension of a parameter tree,
//! the results stacked (JAX's `lax.map`).
//!
//! It is a [`scan`](crate::control::scan) without a carry: one `while` with a static trip
//! count whose body slices the inputs at the step, runs the function and writes its results
//! into buffers of the stacked shape. It is not the IR's `map` op: that op applies a *scalar*
//! computation at every element (StableHLO's `map`), so it cannot run a function that sees a
//! whole slice (a matrix product, a reduction, a result of another shape). Being a loop, it
//! keeps one step's intermediates alive at a time (where [`vmap`](crate::vmap) would hold the
//! whole batch's), differentiates in reverse and forward mode like `scan`, and on the CPU runs
//! the compiled body once per trip.

use crate::scan::{ScanOptions, scan_at};
use crate::{Result, Tree};
use kiln_ir::Loc;

/// `f` applied to each slice of `xs` along the leading dimension of every leaf (all leaves
/// share its size), the results stacked along a new leading dimension (JAX's `lax.map`):
/// `map(f, xs)[i] == f(xs[i])`. The slices run one after another in a loop traced once (see
/// the module docs for why it is a loop and not the IR's `map` op). Errors of the inputs, of
/// `f` and of the request (a scalar leaf, leaves of different leading sizes, no leaf at all)
/// are returned, naming the caller's line.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, control, grad};
/// // Each row's sum of squares, as a function of one row.
/// let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]).unwrap();
/// let sq = control::map(|row: &Tensor| (row * row).sum_all(), &xs).unwrap();
/// assert_eq!(sq.to_vec::<f32>().unwrap(), [5.0, 25.0, 61.0]);
/// // Over a tree: pairs of slices in, pairs of results out.
/// let ys = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], [3]).unwrap();
/// let (a, b) = control::map(|(x, y): &(Tensor, Tensor)| (x * y, -y), &(xs.clone(), ys))
///     .unwrap();
/// assert_eq!(a.shape(), [3, 2]);
/// assert_eq!(b.to_vec::<f32>().unwrap(), [-10.0, -20.0, -30.0]);
/// // It differentiates: d/dx sum(map(x -> x²)) = 2x.
/// let g = grad(|x: &Tensor| control::map(|r: &Tensor| r * r, x).unwrap().sum_all())(&xs);
/// assert_eq!(g.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
/// // A scalar has no leading dimension to map over.
/// let bad = control::map(|x: &Tensor| x.clone(), &Tensor::scalar(1.0f32));
/// assert!(bad.unwrap_err().to_string().contains("scalar"));
/// ```
#[track_caller]
pub fn map<X: Tree, Y: Tree>(f: impl Fn(&X) -> Y, xs: &X) -> Result<Y> {
    let loc = Loc::caller();
    let (_, ys) = scan_at(
        |_: &(), x: &X| ((), f(x)),
        (),
        xs,
        ScanOptions::default(),
        "map",
        loc,
    )?;
    Ok(ys)
}

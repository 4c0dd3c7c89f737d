//! [`reduce`]: StableHLO's `reduce` with a body traced from a Rust closure (JAX's
//! `lax.reduce`), over several inputs at once: argmax and argmin, exclusive or, a sum and a
//! count together, any combiner.
//!
//! ```
//! use kiln::{Tensor, control};
//! // The argmax of each row: values and positions reduced together, ties to the first.
//! let x = Tensor::from_vec(vec![1.0f32, 5.0, 5.0, 2.0, -1.0, 0.0, 3.0, 3.0], [2, 4]).unwrap();
//! let pos = Tensor::iota(kiln::DType::I32, &[2, 4], 1);
//! let out = control::reduce(
//!     &[&x, &pos],
//!     &[&Tensor::scalar(f32::NEG_INFINITY), &Tensor::scalar(0i32)],
//!     &[1],
//!     |acc, x| {
//!         let first = x[0].eq(&acc[0]).bitwise_and(&x[1].lt(&acc[1]));
//!         let better = x[0].gt(&acc[0]).bitwise_or(&first);
//!         vec![better.where_(&x[0], &acc[0]), better.where_(&x[1], &acc[1])]
//!     },
//! );
//! assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![5.0, 3.0]);
//! assert_eq!(out[1].to_vec::<i32>().unwrap(), vec![1, 2]);
//! ```

use crate::{Error, Tensor};
use kiln_ir::{Loc, Op, TensorType};
use kiln_trace::trace::{apply, trace};

/// Reduces `dims` of the `inputs` together (one shape, any element types), starting from the
/// `inits` (one scalar of each input's element type), with `body(acc, x)`: it gets the
/// accumulators and one element of every input as scalar tensors and returns the next
/// accumulators. Returns one tensor per input: its element type, the dimensions not reduced.
/// Negative dimensions count from the end.
///
/// The body is traced once, into the op's region, and must use only its arguments and
/// constants (a tensor of the enclosing trace is an error). Elements may be combined in any
/// order (the compiled backends use a tree), so the body should be associative and
/// commutative, with the inits its identity. A body that is one `add`, `mul`, `max`, `min`,
/// `and` or `or` of one input is the IR's `reduce` with that combiner; any other is a
/// `reduce_region` (see `ir-specs/ops/reduce_region.md`). Its gradient is the body's, taken
/// along a tree that keeps the elements' order (an argmax sends it to the element it selects).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, control};
/// // The sum and the maximum of each row, in one pass.
/// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -1.0, -1.0, 4.0], [2, 3]).unwrap();
/// let zero = Tensor::scalar(0.0f32);
/// let low = Tensor::scalar(f32::NEG_INFINITY);
/// let out = control::reduce(&[&x, &x], &[&zero, &low], &[-1], |acc, x| {
///     vec![&acc[0] + &x[0], acc[1].maximum(&x[1])]
/// });
/// assert_eq!(out[0].to_vec::<f32>().unwrap(), [2.0, 2.0]);
/// assert_eq!(out[1].to_vec::<f32>().unwrap(), [3.0, 4.0]);
/// // A dimension out of range fails the results.
/// let bad = control::reduce(&[&x], &[&zero], &[2], |acc, x| vec![&acc[0] + &x[0]]);
/// assert!(bad[0].error().unwrap().message.contains("out of range"));
/// ```
#[track_caller]
pub fn reduce(
    inputs: &[&Tensor],
    inits: &[&Tensor],
    dims: &[isize],
    body: impl FnOnce(&[Tensor], &[Tensor]) -> Vec<Tensor>,
) -> Vec<Tensor> {
    let loc = Loc::caller();
    let k = inputs.len();
    let fail = |e: Error| vec![Tensor::failed(e); k];
    let err = |m: String| Error::at("reduce", m, loc);
    if k == 0 || inits.len() != k {
        return vec![
            Tensor::failed(err(format!(
                "needs one init value per input and at least one input, got {k} inputs and {} \
                 init values",
                inits.len()
            )));
            k.max(1)
        ];
    }
    if let Some(e) = inputs.iter().chain(inits).find_map(|t| t.error()) {
        return fail(e.clone());
    }
    let rank = inputs[0].rank() as isize;
    let mut dimensions = Vec::with_capacity(dims.len());
    for &d in dims {
        let n = if d < 0 { d + rank } else { d };
        if !(0..rank).contains(&n) {
            return fail(err(format!(
                "dimension {d} is out of range for rank {rank}"
            )));
        }
        dimensions.push(n as i64);
    }
    let scalars: Vec<TensorType> = inits
        .iter()
        .map(|t| TensorType::scalar(t.dtype()))
        .collect();
    let params: Vec<TensorType> = scalars.iter().chain(&scalars).cloned().collect();
    let traced = match trace("body", &params, |ps| body(&ps[..k], &ps[k..])) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if !traced.captures.is_empty() {
        return fail(err(
            "the body uses a tensor of the enclosing trace; a reduction body sees only its \
             accumulators, its elements and constants"
                .into(),
        ));
    }
    let mut operands: Vec<&Tensor> = inputs.to_vec();
    operands.extend_from_slice(inits);
    let op = match (k, traced.func.as_combiner()) {
        (1, Some(kind)) if traced.func.output_types == scalars => Op::Reduce { dimensions, kind },
        _ => Op::ReduceRegion {
            dimensions,
            body: Box::new(traced.func),
        },
    };
    apply(op, &operands, None, "reduce", loc)
}

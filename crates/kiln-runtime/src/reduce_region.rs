//! `reduce_region` whose body canonicalization could not expand into elementwise ops: the host
//! folds the body's compiled program over the elements of each result position, in row-major
//! order (the reference interpreter's order).

use crate::{Error, Region};
use kiln_ir::{Literal, TensorType};

/// Runs `reduce_region` on `x` (k inputs, then k init values) over `dimensions`, calling
/// `body` once per element; `types` are the result types.
pub(crate) fn fold(
    x: &[&Literal],
    dimensions: &[i64],
    body: &dyn Region,
    types: &[TensorType],
) -> Result<Vec<Literal>, Error> {
    let k = x.len() / 2;
    let (inputs, inits) = x.split_at(k);
    let shape = inputs[0].shape();
    let rank = shape.len();
    let reduced: Vec<usize> = (0..rank)
        .filter(|d| dimensions.contains(&(*d as i64)))
        .collect();
    let kept: Vec<usize> = (0..rank).filter(|d| !reduced.contains(d)).collect();
    let strides = inputs[0].ty().strides();
    let scalars: Vec<TensorType> = inputs
        .iter()
        .map(|l| TensorType::new(l.dtype(), []))
        .collect();
    let positions = |dims: &[usize]| -> Vec<usize> {
        // The linear offsets of every index over `dims` (the others at 0), row-major.
        let mut out = vec![0usize];
        for &d in dims {
            let mut next = Vec::with_capacity(out.len() * shape[d]);
            for &o in &out {
                for i in 0..shape[d] {
                    next.push(o + i * strides[d]);
                }
            }
            out = next;
        }
        out
    };
    let outer = positions(&kept);
    let inner = positions(&reduced);
    // Each result's elements as bytes (exact, NaN payloads included; `pred` one bit each).
    let mut outs: Vec<Vec<Literal>> = vec![Vec::with_capacity(outer.len()); k];
    for &o in &outer {
        let mut acc: Vec<Literal> = inits.iter().map(|l| (*l).clone()).collect();
        for &r in &inner {
            let elems: Vec<Literal> = inputs
                .iter()
                .zip(&scalars)
                .map(|(l, t)| kiln_reference::take_positions(l, t, &[o + r]))
                .collect();
            let args: Vec<&Literal> = acc.iter().chain(&elems).collect();
            acc = body.run_region(&args)?;
            if acc.len() != k {
                return Err(Error(format!(
                    "reduce_region: the body returned {} values, not {k}",
                    acc.len()
                )));
            }
        }
        for (out, a) in outs.iter_mut().zip(acc) {
            out.push(a);
        }
    }
    types
        .iter()
        .zip(&outs)
        .map(|(ty, scalars)| {
            let ints: Vec<i64> = scalars.iter().flat_map(|s| s.to_i64s()).collect();
            let bytes: Vec<u8> = scalars.iter().flat_map(|s| s.to_le_bytes()).collect();
            if ty.dtype.is_pred() {
                Literal::from_i64s(ty.clone(), &ints)
            } else {
                Literal::from_le_bytes(ty.clone(), &bytes)
            }
            .map_err(|e| Error(format!("reduce_region: {e}")))
        })
        .collect()
}

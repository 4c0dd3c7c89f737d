//! `reduce_region`: every result position folds the body over its elements in order.
//!
//! The direct semantics: for each position of the kept dimensions the accumulators start at the
//! init values, and the body runs once per element of the reduced dimensions, row-major, on the
//! accumulators and that element of every input. Compiled backends may combine in another order
//! (a tree); for the associative and commutative bodies the spec asks for, both agree.

use crate::ops::{concat, for_each_index, take};
use kiln_ir::{Func, Literal, TensorType};

/// Evaluates `reduce_region` on `x` (k inputs, then k init values) over `dimensions` with
/// `body` run by the interpreter; `types` are the result types.
pub(crate) fn reduce_region(
    x: &[&Literal],
    dimensions: &[i64],
    body: &Func,
    types: &[TensorType],
) -> Vec<Literal> {
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
    let kept_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let reduced_shape: Vec<usize> = reduced.iter().map(|&d| shape[d]).collect();
    let mut outs: Vec<Vec<Literal>> = vec![Vec::new(); k];
    let mut pos = vec![0usize; rank];
    let mut each_kept = |o: &[usize]| {
        for (&d, &i) in kept.iter().zip(o) {
            pos[d] = i;
        }
        let mut acc: Vec<Literal> = inits.iter().map(|l| (*l).clone()).collect();
        for_each_index(&reduced_shape, |r| {
            for (&d, &i) in reduced.iter().zip(r) {
                pos[d] = i;
            }
            let at: usize = pos.iter().zip(&strides).map(|(i, s)| i * s).sum();
            let elems: Vec<Literal> = inputs
                .iter()
                .zip(&scalars)
                .map(|(l, t)| take(l, t, &[at]))
                .collect();
            let args: Vec<&Literal> = acc.iter().chain(&elems).collect();
            acc = crate::run(body, &args);
        });
        for (out, a) in outs.iter_mut().zip(acc) {
            out.push(a);
        }
    };
    for_each_index(&kept_shape, &mut each_kept);
    outs.iter()
        .zip(types)
        .map(|(scalars, ty)| {
            if scalars.is_empty() {
                return Literal::zeros(ty.clone());
            }
            let refs: Vec<&Literal> = scalars.iter().collect();
            let all: Vec<usize> = (0..ty.numel()).collect();
            take(&concat(&refs), ty, &all)
        })
        .collect()
}

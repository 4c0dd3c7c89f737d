//! `reduce_region` and `reduce_window_region`: every result position folds the body over its
//! elements in order; and `map`, the computation run at every position.
//!
//! The direct semantics: for each result position the accumulators start at the init values,
//! and the body runs once per element the position reduces (row-major over the reduced
//! dimensions or the window), on the accumulators and that element of every input; a window
//! element in padding or a dilation hole is the init values. Compiled backends may combine in
//! another order (a tree); for the associative and commutative bodies the specs ask for, both
//! agree.

use crate::ops::{concat, for_each_index, take};
use kiln_ir::window_fold::Window;
use kiln_ir::{Func, Literal, TensorType};

/// Folds `body` over the elements of every result position: `elements(o, push)` calls `push`
/// with each linear input position result `o` reduces, `None` for the init values.
fn fold(
    x: &[&Literal],
    body: &Func,
    types: &[TensorType],
    mut elements: impl FnMut(&[usize], &mut dyn FnMut(Option<usize>)),
) -> Vec<Literal> {
    let k = x.len() / 2;
    let (inputs, inits) = x.split_at(k);
    let scalars: Vec<TensorType> = inputs
        .iter()
        .map(|l| TensorType::new(l.dtype(), []))
        .collect();
    let mut outs: Vec<Vec<Literal>> = vec![Vec::new(); k];
    for_each_index(&types[0].shape, |o| {
        let mut acc: Vec<Literal> = inits.iter().map(|l| (*l).clone()).collect();
        elements(o, &mut |at| {
            let elems: Vec<Literal> = match at {
                Some(at) => inputs
                    .iter()
                    .zip(&scalars)
                    .map(|(l, t)| take(l, t, &[at]))
                    .collect(),
                None => inits.iter().map(|l| (*l).clone()).collect(),
            };
            let args: Vec<&Literal> = acc.iter().chain(&elems).collect();
            acc = crate::run(body, &args);
        });
        for (out, a) in outs.iter_mut().zip(acc) {
            out.push(a);
        }
    });
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

/// Evaluates `reduce_region` on `x` (k inputs, then k init values) over `dimensions` with
/// `body` run by the interpreter; `types` are the result types.
pub(crate) fn reduce_region(
    x: &[&Literal],
    dimensions: &[i64],
    body: &Func,
    types: &[TensorType],
) -> Vec<Literal> {
    let shape = x[0].shape();
    let rank = shape.len();
    let reduced: Vec<usize> = (0..rank)
        .filter(|d| dimensions.contains(&(*d as i64)))
        .collect();
    let kept: Vec<usize> = (0..rank).filter(|d| !reduced.contains(d)).collect();
    let strides = x[0].ty().strides();
    let reduced_shape: Vec<usize> = reduced.iter().map(|&d| shape[d]).collect();
    fold(x, body, types, |o, push| {
        let base: usize = kept.iter().zip(o).map(|(&d, &i)| i * strides[d]).sum();
        for_each_index(&reduced_shape, |r| {
            let at: usize = reduced.iter().zip(r).map(|(&d, &i)| i * strides[d]).sum();
            push(Some(base + at));
        });
    })
}

/// Evaluates `reduce_window_region` on `x` (k inputs, then k init values) with `body` run by
/// the interpreter; `types` are the result types.
pub(crate) fn reduce_window_region(
    x: &[&Literal],
    w: &Window<'_>,
    body: &Func,
    types: &[TensorType],
) -> Vec<Literal> {
    let shape = x[0].shape();
    let st = x[0].ty().strides();
    let wshape: Vec<usize> = w.dims.iter().map(|&d| d as usize).collect();
    fold(x, body, types, |o, push| {
        for_each_index(&wshape, |e| {
            let mut src = 0;
            for d in 0..o.len() {
                let p = o[d] as i64 * w.strides[d] - w.padding[d].0
                    + e[d] as i64 * w.window_dilations[d];
                let bd = w.base_dilations[d];
                if p < 0 || p % bd != 0 || p / bd >= shape[d] as i64 {
                    push(None);
                    return;
                }
                src += (p / bd) as usize * st[d];
            }
            push(Some(src));
        });
    })
}

/// Element `i` of each of `x`, as scalars: the arguments of a `map`'s computation there.
pub(crate) fn elements_at(x: &[&Literal], i: usize) -> Vec<Literal> {
    x.iter()
        .map(|l| take(l, &TensorType::new(l.dtype(), []), &[i]))
        .collect()
}

/// Evaluates `map` on `x` with `computation` run by the interpreter at every position; `ty` is
/// the result type.
pub(crate) fn map(x: &[&Literal], computation: &Func, ty: &TensorType) -> Literal {
    let outs: Vec<Literal> = (0..ty.numel())
        .map(|i| {
            let args = elements_at(x, i);
            let refs: Vec<&Literal> = args.iter().collect();
            crate::run(computation, &refs).remove(0)
        })
        .collect();
    if outs.is_empty() {
        return Literal::zeros(ty.clone());
    }
    let refs: Vec<&Literal> = outs.iter().collect();
    let all: Vec<usize> = (0..ty.numel()).collect();
    take(&concat(&refs), ty, &all)
}

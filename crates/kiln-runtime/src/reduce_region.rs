//! `reduce_region` and `reduce_window_region` whose body neither canonicalization could expand
//! into elementwise ops nor a fold kernel express (`kiln_kernel::fold`): the host folds the body's compiled program over the elements of each result
//! position, in row-major order (the reference interpreter's order); a window element in
//! padding or a dilation hole is the init values. A `map` likewise calls its computation once
//! per element.

use crate::{Error, Region};
use kiln_ir::{Literal, Op, TensorType};

/// Calls `f` with every multi-index of `shape`, row-major (once for a scalar, never for an
/// empty shape).
fn each_index(
    shape: &[usize],
    mut f: impl FnMut(&[usize]) -> Result<(), Error>,
) -> Result<(), Error> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx)?;
        let mut d = shape.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Runs `op` (a `reduce_region` or `reduce_window_region`) on `x` (k inputs, then k init
/// values), calling `body` once per element; `types` are the result types.
pub(crate) fn fold(
    op: &Op,
    x: &[&Literal],
    body: &dyn Region,
    types: &[TensorType],
) -> Result<Vec<Literal>, Error> {
    let k = x.len() / 2;
    let (inputs, inits) = x.split_at(k);
    let shape = inputs[0].shape();
    let strides = inputs[0].ty().strides();
    let scalars: Vec<TensorType> = inputs
        .iter()
        .map(|l| TensorType::new(l.dtype(), []))
        .collect();
    // The input positions result `o` reduces, `None` for the init values.
    let elements = |o: &[usize]| -> Vec<Option<usize>> {
        let mut out = Vec::new();
        match op {
            Op::ReduceRegion { dimensions, .. } => {
                let reduced: Vec<usize> = (0..shape.len())
                    .filter(|d| dimensions.contains(&(*d as i64)))
                    .collect();
                let kept: Vec<usize> = (0..shape.len()).filter(|d| !reduced.contains(d)).collect();
                let base: usize = kept.iter().zip(o).map(|(&d, &i)| i * strides[d]).sum();
                let rshape: Vec<usize> = reduced.iter().map(|&d| shape[d]).collect();
                let _ = each_index(&rshape, |r| {
                    let at: usize = reduced.iter().zip(r).map(|(&d, &i)| i * strides[d]).sum();
                    out.push(Some(base + at));
                    Ok(())
                });
            }
            Op::ReduceWindowRegion {
                window_dimensions: wd,
                window_strides: ws,
                base_dilations: bd,
                window_dilations: wdl,
                padding,
                ..
            } => {
                let wshape: Vec<usize> = wd.iter().map(|&d| d as usize).collect();
                let _ = each_index(&wshape, |e| {
                    let mut src = Some(0);
                    for d in 0..o.len() {
                        let p = o[d] as i64 * ws[d] - padding[d].0 + e[d] as i64 * wdl[d];
                        if p < 0 || p % bd[d] != 0 || p / bd[d] >= shape[d] as i64 {
                            src = None;
                            break;
                        }
                        src = src.map(|s| s + (p / bd[d]) as usize * strides[d]);
                    }
                    out.push(src);
                    Ok(())
                });
            }
            _ => {}
        }
        out
    };
    let mut outs: Vec<Vec<Literal>> = vec![Vec::new(); k];
    each_index(&types[0].shape, |o| {
        let mut acc: Vec<Literal> = inits.iter().map(|l| (*l).clone()).collect();
        for at in elements(o) {
            let elems: Vec<Literal> = match at {
                Some(at) => inputs
                    .iter()
                    .zip(&scalars)
                    .map(|(l, t)| kiln_reference::take_positions(l, t, &[at]))
                    .collect(),
                None => inits.iter().map(|l| (*l).clone()).collect(),
            };
            let args: Vec<&Literal> = acc.iter().chain(&elems).collect();
            acc = body.run_region(&args)?;
            if acc.len() != k {
                return Err(Error(format!(
                    "{}: the body returned {} values, not {k}",
                    op.mnemonic(),
                    acc.len()
                )));
            }
        }
        for (out, a) in outs.iter_mut().zip(acc) {
            out.push(a);
        }
        Ok(())
    })?;
    // Each result's elements as bytes (exact, NaN payloads included; `pred` one bit each).
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
            .map_err(|e| Error(format!("{}: {e}", op.mnemonic())))
        })
        .collect()
}

/// Runs `map` on `x`, calling `computation` once per element; `ty` is the result type.
pub(crate) fn map(
    x: &[&Literal],
    computation: &dyn Region,
    ty: &TensorType,
) -> Result<Literal, Error> {
    let scalars: Vec<TensorType> = x.iter().map(|l| TensorType::new(l.dtype(), [])).collect();
    let mut ints = Vec::new();
    let mut bytes = Vec::new();
    for i in 0..ty.numel() {
        let args: Vec<Literal> = x
            .iter()
            .zip(&scalars)
            .map(|(l, t)| kiln_reference::take_positions(l, t, &[i]))
            .collect();
        let refs: Vec<&Literal> = args.iter().collect();
        let out = computation.run_region(&refs)?;
        let [s] = &out[..] else {
            return Err(Error(format!(
                "map: the computation returned {} values, not 1",
                out.len()
            )));
        };
        ints.extend(s.to_i64s());
        bytes.extend(s.to_le_bytes());
    }
    if ty.dtype.is_pred() {
        Literal::from_i64s(ty.clone(), &ints)
    } else {
        Literal::from_le_bytes(ty.clone(), &bytes)
    }
    .map_err(|e| Error(format!("map: {e}")))
}

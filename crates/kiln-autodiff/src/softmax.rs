//! The softmax's derivative in terms of its result.
//!
//! A softmax `p = e / Σe` with `e = exp(d)` (summed over some axes, the sum broadcast back,
//! directly or through the `reshape` that `keepdims` adds) differentiated op by op gives
//! `d̄ = e·(ḡ / s) − e·Σ(ḡ·e / s²)`: terms of `e` and `s`, so the backward pass recomputes the
//! exponentials and their sum from the softmax's input, and that input (attention's scores,
//! say) is read again after the forward pass. The same derivative in terms of `p`,
//! `d̄ = p·(ḡ − Σ(ḡ·p))`, reads only the result, which the forward pass keeps anyway (the next
//! product reads it); the input then has one reader, the softmax, which fusion can run as its
//! producer's epilogue.
//!
//! [`find`] recognizes the pattern in a function; `vjp_from_values` then gives the division's
//! cotangent to `d` through [`vjp`] instead of to `e` and the broadcast sum. Cotangents that
//! reach `e` or `s` through other readers still take the ordinary rules; the derivative is the
//! same by linearity.

use crate::Result;
use kiln_ir::{Builder, Combiner, Func, Op, ValueId};
use std::collections::HashMap;

/// A softmax found in a function: the exponential's operand and the summed axes.
pub(crate) struct Softmax {
    /// The value the exponentials are taken of (`d` above), a value of the function.
    pub input: ValueId,
    /// The axes summed over.
    pub dims: Vec<i64>,
}

/// The softmaxes of `f`, by the index of the `divide` instruction that ends each.
pub(crate) fn find(f: &Func) -> HashMap<usize, Softmax> {
    let mut def: Vec<Option<usize>> = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            def[r.index()] = Some(i);
        }
    }
    let op_of = |v: ValueId| def[v.index()].map(|i| &f.insts[i]);
    let mut found = HashMap::new();
    for (i, inst) in f.insts.iter().enumerate() {
        let (Op::Divide {}, [e, q]) = (&inst.op, &inst.operands[..]) else {
            continue;
        };
        let et = &f.values[e.index()];
        if !et.dtype.is_float() {
            continue;
        }
        let Some(exp) = op_of(*e).filter(|x| matches!(x.op, Op::Exponential {})) else {
            continue;
        };
        let Some(bq) = op_of(*q) else { continue };
        let Op::BroadcastInDim {
            broadcast_dimensions: bdims,
        } = &bq.op
        else {
            continue;
        };
        let q1 = bq.operands[0];
        // The sum, and the broadcast dimensions that put it back along its axes.
        let s = match op_of(q1) {
            Some(x) if matches!(x.op, Op::Reshape {}) => x.operands[0],
            _ => q1,
        };
        let Some(sum) = op_of(s) else { continue };
        let Op::Reduce {
            dimensions,
            kind: Combiner::Add,
        } = &sum.op
        else {
            continue;
        };
        let zero_init = op_of(sum.operands[1]).is_some_and(|c| {
            matches!(&c.op, Op::Constant { value } if value.to_f64s().iter().all(|&x| x == 0.0))
        });
        if sum.operands[0] != *e || !zero_init {
            continue;
        }
        let kept: Vec<i64> = (0..et.rank() as i64)
            .filter(|d| !dimensions.contains(d))
            .collect();
        let fits = if s == q1 {
            *bdims == kept
        } else {
            // `keepdims`: the reshape puts a 1 where each summed axis was.
            let keepdims: Vec<usize> = (0..et.rank())
                .map(|a| {
                    if dimensions.contains(&(a as i64)) {
                        1
                    } else {
                        et.shape[a]
                    }
                })
                .collect();
            *bdims == (0..et.rank() as i64).collect::<Vec<_>>()
                && f.values[q1.index()].shape[..] == keepdims[..]
        };
        if fits {
            found.insert(
                i,
                Softmax {
                    input: exp.operands[0],
                    dims: dimensions.clone(),
                },
            );
        }
    }
    found
}

/// `p·(g − Σ(g·p))`, the sum over `dims` broadcast back: the cotangent of the softmax's input
/// given its result `p` and the result's cotangent `g`.
pub(crate) fn vjp(b: &mut Builder, p: ValueId, g: ValueId, dims: &[i64]) -> Result<ValueId> {
    let t = b.ty(p).expect("defined").clone();
    let gp = b.binary(Op::Multiply {}, g, p)?;
    let r = b.sum(gp, dims)?;
    let kept: Vec<i64> = (0..t.rank() as i64).filter(|d| !dims.contains(d)).collect();
    let rb = b.broadcast(r, &kept, &t.shape)?;
    let centered = b.binary(Op::Subtract {}, g, rb)?;
    Ok(b.binary(Op::Multiply {}, p, centered)?)
}

//! `reduce` with a body kiln has no combiner for, or of several operands (an argmax reduces
//! values and indices together): a tree of body applications at tensor shape.
//!
//! The reduced dimensions move last and flatten into one of size `n`; each level applies the
//! body, elementwise, to the first and second halves (an odd last element waits for the next
//! level), until one position is left; the body then combines the init values with it.
//! StableHLO leaves the order of a reduction to the implementation, for bodies that are
//! associative; this is one such order. The body must be elementwise ops and scalar constants.

use crate::ast::OpAst;
use crate::decompose::apply_elementwise;
use crate::error::{Error, Result};
use crate::import::{Body, loc, value_type};
use kiln_ir::{Func, Op, TensorType, ValueId};

/// `reduce(inputs..., inits...)` with the body `f` of `2 * inputs` scalars.
pub fn reduce_tree(
    body: &mut Body,
    op: &OpAst,
    f: &Func,
    args: &[ValueId],
    dims: &[i64],
) -> Result<Vec<ValueId>> {
    let k = args.len() / 2;
    if k == 0 || args.len() != 2 * k {
        return Err(Error::invalid(
            op.pos,
            "`stablehlo.reduce` takes inputs and as many init values",
        ));
    }
    if f.params.len() != 2 * k || f.outputs.len() != k {
        return Err(Error::invalid(
            op.pos,
            format!(
                "the body of `stablehlo.reduce` takes {} and returns {} values, for {k} inputs",
                f.params.len(),
                f.outputs.len()
            ),
        ));
    }
    let (inputs, inits) = args.split_at(k);
    let t0 = value_type(body, inputs[0])?;
    let rank = t0.rank();
    let mut reduced: Vec<usize> = Vec::new();
    for &d in dims {
        match usize::try_from(d) {
            Ok(d) if d < rank && !reduced.contains(&d) => reduced.push(d),
            _ => {
                return Err(Error::invalid(
                    op.pos,
                    format!("bad reduced dimension {d} for rank {rank}"),
                ));
            }
        }
    }
    reduced.sort();
    let kept: Vec<usize> = (0..rank).filter(|d| !reduced.contains(d)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| t0.shape[d]).collect();
    let n: usize = reduced.iter().map(|&d| t0.shape[d]).product();
    let l = loc(op.pos);
    let err = |e: kiln_ir::VerifyError| {
        Error::invalid(op.pos, format!("`{}`: {}", op.name, e.diag.message))
    };
    let with_last = |len: usize, dt| {
        let mut s = kept_shape.clone();
        s.push(len);
        TensorType::new(dt, s)
    };
    // Each input as [kept..., n].
    let permutation: Vec<i64> = kept.iter().chain(&reduced).map(|&d| d as i64).collect();
    let mut cur = Vec::new();
    for &x in inputs {
        let t = value_type(body, x)?;
        if t.shape != t0.shape {
            return Err(Error::invalid(
                op.pos,
                "the inputs of `stablehlo.reduce` differ in shape",
            ));
        }
        let tr = body
            .b
            .push_at(
                Op::Transpose {
                    permutation: permutation.clone(),
                },
                &[x],
                None,
                l,
            )
            .map_err(err)?[0];
        let flat = with_last(n, t.dtype);
        cur.push(
            body.b
                .push_at(Op::Reshape {}, &[tr], Some(std::slice::from_ref(&flat)), l)
                .map_err(err)?[0],
        );
    }
    let slice = |body: &mut Body, v: ValueId, from: usize, to: usize| -> Result<ValueId> {
        let t = value_type(body, v)?;
        let r = t.rank();
        let mut start = vec![0i64; r];
        let mut limit: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        start[r - 1] = from as i64;
        limit[r - 1] = to as i64;
        let kop = Op::Slice {
            start_indices: start,
            limit_indices: limit,
            strides: vec![1; r],
        };
        Ok(body.b.push_at(kop, &[v], None, l).map_err(err)?[0])
    };
    let mut m = n;
    while m > 1 {
        let h = m / 2;
        let mut halves = Vec::new();
        for &v in &cur {
            halves.push(slice(body, v, 0, h)?);
        }
        for &v in &cur {
            halves.push(slice(body, v, h, 2 * h)?);
        }
        let mut shape = kept_shape.clone();
        shape.push(h);
        let mut next = apply_elementwise(body, op, f, &halves, &shape)?;
        if m % 2 == 1 {
            for (i, &v) in cur.iter().enumerate() {
                let last = slice(body, v, m - 1, m)?;
                next[i] = body
                    .b
                    .push_at(
                        Op::Concatenate {
                            dimension: kept.len() as i64,
                        },
                        &[next[i], last],
                        None,
                        l,
                    )
                    .map_err(err)?[0];
            }
        }
        cur = next;
        m = h + m % 2;
    }
    // The inits, broadcast to the kept shape, combined with what is left.
    let mut acc = Vec::new();
    for &i in inits {
        let t = value_type(body, i)?;
        let kop = Op::BroadcastInDim {
            broadcast_dimensions: vec![],
        };
        let ty = TensorType::new(t.dtype, kept_shape.clone());
        acc.push(
            body.b
                .push_at(kop, &[i], Some(std::slice::from_ref(&ty)), l)
                .map_err(err)?[0],
        );
    }
    if n == 0 {
        return Ok(acc);
    }
    for &v in &cur {
        let t = value_type(body, v)?;
        let ty = TensorType::new(t.dtype, kept_shape.clone());
        acc.push(
            body.b
                .push_at(Op::Reshape {}, &[v], Some(std::slice::from_ref(&ty)), l)
                .map_err(err)?[0],
        );
    }
    apply_elementwise(body, op, f, &acc, &kept_shape)
}

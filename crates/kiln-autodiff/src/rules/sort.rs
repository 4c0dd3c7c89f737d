//! The VJP of `sort`: a sort only moves elements, so each cotangent moves back.
//!
//! The rule sorts again with each element's position along the dimension as one more operand
//! (the comparator ignores it), which gives the permutation: where each result element came
//! from. Sorting a cotangent by those positions (ascending, on integer keys) puts every value
//! back where its element was. Both sorts are stable, so equal keys move as in the forward
//! sort. Integer operands get no cotangent.

use crate::Result;
use kiln_ir::{Builder, ComparisonDirection, DType, Func, Op, TensorType, ValueId};

/// `comparator` with two more parameters, `i32[]` lhs and rhs, that it does not read.
fn ignoring_positions(comparator: &Func) -> Result<Func> {
    let mut c = Builder::new(&comparator.name);
    let args: Vec<ValueId> = comparator
        .param_types()
        .into_iter()
        .map(|t| c.param(t))
        .collect();
    let pos = TensorType::new(DType::I32, []);
    c.param(pos.clone());
    c.param(pos);
    let outs = c.inline(comparator, &args)?;
    Ok(c.finish(&outs)?)
}

/// The comparator ordering by the first operand, an `i32` position, ascending; the second
/// operand (of `dtype`) is carried.
fn by_position(dtype: DType) -> Result<Func> {
    let mut c = Builder::new("by_position");
    let pos = TensorType::new(DType::I32, []);
    let l = c.param(pos.clone());
    let r = c.param(pos);
    let v = TensorType::new(dtype, []);
    c.param(v.clone());
    c.param(v);
    let lt = c.compare(l, r, ComparisonDirection::Lt)?;
    Ok(c.finish(&[lt])?)
}

/// The cotangents of a `sort`'s operands `x` from its results' cotangents `g`.
pub(super) fn sort_vjp(
    b: &mut Builder,
    dimension: i64,
    is_stable: bool,
    comparator: &Func,
    x: &[ValueId],
    g: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    let mut out = vec![None; x.len()];
    let wrt: Vec<usize> = (0..x.len())
        .filter(|&k| g[k].is_some() && super::ty(b, x[k]).dtype.is_float())
        .collect();
    if wrt.is_empty() {
        return Ok(out);
    }
    let shape = super::ty(b, x[0]).shape;
    let positions = b.inst_typed(
        Op::Iota {
            iota_dimension: dimension,
        },
        &[],
        TensorType::new(DType::I32, shape),
    )?;
    let operands: Vec<ValueId> = x.iter().copied().chain([positions]).collect();
    let sorted = b.push(
        Op::Sort {
            dimension,
            is_stable,
            comparator: Box::new(ignoring_positions(comparator)?),
        },
        &operands,
    )?;
    let from = sorted[x.len()];
    for k in wrt {
        let gk = g[k].expect("chosen for having one");
        let back = b.push(
            Op::Sort {
                dimension,
                is_stable: true,
                comparator: Box::new(by_position(super::ty(b, gk).dtype)?),
            },
            &[from, gk],
        )?;
        out[k] = Some(back[1]);
    }
    Ok(out)
}

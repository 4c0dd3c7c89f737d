//! `reduce_window_region` written with other ops: each input padded with its init value
//! (edges, and holes for the base dilation), then, for every window element in row-major
//! order, a strided slice of it combined into the accumulators, which start at the inits. This
//! is the reference interpreter's order, so any body agrees with it bit for bit.
//!
//! The combination is the caller's: the backends apply a body of elementwise ops at tensor
//! shape (`kiln-kernel`'s `reduce_tree`), reverse-mode autodiff applies any body as `map`s
//! (whose backward pass is known). The reference interpreter reads the same [`Window`] and
//! folds element by element.

use crate::{Builder, Loc, Op, TensorType, ValueId, VerifyError};

/// The window attributes of a `reduce_window_region`.
pub struct Window<'a> {
    /// The window's size per dimension.
    pub dims: &'a [i64],
    /// Where consecutive windows start, per dimension.
    pub strides: &'a [i64],
    /// The operand's dilation.
    pub base_dilations: &'a [i64],
    /// The window's dilation.
    pub window_dilations: &'a [i64],
    /// `[low, high]` padding per dimension.
    pub padding: &'a [(i64, i64)],
}

impl<'a> Window<'a> {
    /// The window of a `reduce_window_region`; `None` for any other op.
    pub fn of(op: &'a Op) -> Option<Window<'a>> {
        match op {
            Op::ReduceWindowRegion {
                window_dimensions,
                window_strides,
                base_dilations,
                window_dilations,
                padding,
                ..
            } => Some(Window {
                dims: window_dimensions,
                strides: window_strides,
                base_dilations,
                window_dilations,
                padding,
            }),
            _ => None,
        }
    }
}

/// How a fold combines: the next accumulators from `[acc..., x...]`.
pub type Combine<'c> =
    dyn FnMut(&mut Builder, &[ValueId]) -> Result<Vec<ValueId>, VerifyError> + 'c;

/// `reduce_window_region(inputs..., inits...)` (`args`) with result shape `out_shape`, as a
/// fold: `combine(b, [acc..., x...])` returns the next accumulators for one window element's
/// strided slices `x` (all of `out_shape`). Returns the results; every instruction it adds is at `loc` (none for none).
pub fn fold_window(
    b: &mut Builder,
    args: &[ValueId],
    w: &Window<'_>,
    out_shape: &[usize],
    loc: Option<Loc>,
    combine: &mut Combine<'_>,
) -> Result<Vec<ValueId>, VerifyError> {
    let k = args.len() / 2;
    let (inputs, inits) = args.split_at(k);
    let mut acc = Vec::with_capacity(2 * k);
    for &i in inits {
        let dt = b.ty(i).expect("defined").dtype;
        let op = Op::BroadcastInDim {
            broadcast_dimensions: vec![],
        };
        let ty = TensorType::new(dt, out_shape.to_vec());
        acc.push(b.push_at(op, &[i], Some(std::slice::from_ref(&ty)), loc)?[0]);
    }
    if out_shape.contains(&0) {
        return Ok(acc);
    }
    let mut padded = Vec::with_capacity(k);
    for (&x, &i) in inputs.iter().zip(inits) {
        let op = Op::Pad {
            edge_padding_low: w.padding.iter().map(|p| p.0).collect(),
            edge_padding_high: w.padding.iter().map(|p| p.1).collect(),
            interior_padding: w.base_dilations.iter().map(|d| d - 1).collect(),
        };
        padded.push(b.push_at(op, &[x, i], None, loc)?[0]);
    }
    let rank = out_shape.len();
    let wshape: Vec<usize> = w.dims.iter().map(|&d| d as usize).collect();
    let count: usize = wshape.iter().product();
    for flat in 0..count {
        // The window element's coordinates, row-major.
        let mut e = vec![0usize; rank];
        let mut rest = flat;
        for d in (0..rank).rev() {
            e[d] = rest % wshape[d];
            rest /= wshape[d];
        }
        let start: Vec<i64> = (0..rank)
            .map(|d| e[d] as i64 * w.window_dilations[d])
            .collect();
        let limit: Vec<i64> = (0..rank)
            .map(|d| start[d] + (out_shape[d] as i64 - 1) * w.strides[d] + 1)
            .collect();
        let mut args = acc.clone();
        for &p in &padded {
            let op = Op::Slice {
                start_indices: start.clone(),
                limit_indices: limit.clone(),
                strides: w.strides.to_vec(),
            };
            args.push(b.push_at(op, &[p], None, loc)?[0]);
        }
        acc = combine(b, &args)?;
    }
    Ok(acc)
}

//! `reduce_region`, `reduce_window_region` and `map` expanded into elementwise ops before
//! fusion: a balanced tree of body applications at tensor shape, a fold over the window's
//! elements, and the computation applied once at the operands' shape.
//!
//! The reduced dimensions move last and flatten into one of size `n`; each level applies the
//! body, elementwise, to the first and second halves of what is left (the first half as the
//! accumulators; an odd last element waits for the next level), until one position is left;
//! the body then combines the init values (as accumulators) with it. The op's spec leaves the
//! order of a reduction open, for bodies that are associative; this is one such order, with
//! `⌈log2 n⌉` levels, each a few fusible kernels.
//!
//! On a target that takes fold kernels ([`crate::fold`]), a `reduce_region` or
//! `reduce_window_region` whose body the fold expresses is not expanded: it becomes one kernel
//! of coupled accumulators (a window's folded in the reference's order).
//!
//! Only bodies of elementwise ops and scalar constants expand; any other body keeps the op,
//! which the host then runs as a control step, its body compiled as a region and called per
//! element (see [`crate::lower`]).

use crate::canon::rebuild;
use crate::target::TargetInfo;
use kiln_ir::window_fold::{Window, fold_window};
use kiln_ir::{Builder, Func, Loc, Op, Props, TensorType, ValueId, VerifyError};

/// Whether `body` is made of elementwise ops and scalar constants only, so that it applies at
/// any shape.
pub fn expandable(body: &Func) -> bool {
    body.insts.iter().all(|i| match &i.op {
        Op::Constant { value } => value.ty().rank() == 0,
        op => op.props().contains(Props::ELEMENTWISE),
    })
}

/// Whether the instruction is a `reduce_region`, `reduce_window_region` or `map` this module
/// expands: a body of elementwise ops and scalar constants (and a window of at most
/// [`MAX_EXPANDED_WINDOW`] elements).
fn expands(op: &Op, target: &TargetInfo) -> bool {
    match op {
        Op::ReduceRegion { body, .. } => expandable(body) && !crate::fold::folds(op, target),
        Op::ReduceWindowRegion {
            window_dimensions,
            body,
            ..
        } => {
            expandable(body)
                && !crate::fold::folds(op, target)
                && window_dimensions
                    .iter()
                    .try_fold(1i64, |n, &d| n.checked_mul(d))
                    .is_some_and(|n| n <= MAX_EXPANDED_WINDOW)
        }
        Op::Map { computation, .. } => expandable(computation),
        _ => false,
    }
}

/// The function with every `reduce_region`, `reduce_window_region` and `map` whose body is
/// elementwise ops and scalar constants (and whose window has at most
/// [`MAX_EXPANDED_WINDOW`] elements) expanded into elementwise ops; the others stay, and so do
/// the `reduce_region`s and `reduce_window_region`s that become one fold kernel on `target`
/// ([`crate::fold::folds`]).
pub fn expand_region_reduces(f: &Func, target: &TargetInfo) -> Result<Func, VerifyError> {
    if !f.insts.iter().any(|i| expands(&i.op, target)) {
        return Ok(f.clone());
    }
    rebuild(f, |b, inst, ops| {
        if !expands(&inst.op, target) {
            return Ok(None);
        }
        let loc = inst.loc;
        match &inst.op {
            Op::ReduceRegion { dimensions, body } => {
                reduce_tree(b, body, ops, dimensions, loc).map(Some)
            }
            op @ Op::ReduceWindowRegion { body, .. } => {
                let w = Window::of(op).expect("a reduce_window_region");
                let out = &f.values[inst.results[0].index()].shape;
                reduce_window_fold(b, body, ops, &w, out, loc).map(Some)
            }
            Op::Map { computation, .. } => {
                let shape = &f.values[inst.results[0].index()].shape;
                apply_elementwise(b, computation, ops, shape, loc).map(Some)
            }
            _ => Ok(None),
        }
    })
}

/// `body`, made of elementwise ops and scalar constants, applied elementwise to `args` (all of
/// shape `shape`); returns its outputs at that shape.
pub fn apply_elementwise(
    b: &mut Builder,
    body: &Func,
    args: &[ValueId],
    shape: &[usize],
    loc: Option<Loc>,
) -> Result<Vec<ValueId>, VerifyError> {
    let mut vals: Vec<Option<ValueId>> = vec![None; body.values.len()];
    for (&p, &a) in body.params.iter().zip(args) {
        vals[p.index()] = Some(a);
    }
    let get = |vals: &[Option<ValueId>], v: ValueId| vals[v.index()].expect("verified SSA");
    for inst in &body.insts {
        let full: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| TensorType::new(body.values[r.index()].dtype, shape.to_vec()))
            .collect();
        let results = match &inst.op {
            Op::Constant { value } => {
                let c = b.push_at(
                    inst.op.clone(),
                    &[],
                    Some(std::slice::from_ref(value.ty())),
                    loc,
                )?;
                let op = Op::BroadcastInDim {
                    broadcast_dimensions: vec![],
                };
                b.push_at(op, &c, Some(&full), loc)?
            }
            op => {
                let operands: Vec<ValueId> = inst.operands.iter().map(|&o| get(&vals, o)).collect();
                b.push_at(op.clone(), &operands, Some(&full), loc)?
            }
        };
        for (r, v) in inst.results.iter().zip(results) {
            vals[r.index()] = Some(v);
        }
    }
    Ok(body.outputs.iter().map(|&o| get(&vals, o)).collect())
}

/// `v` (of shape `[kept..., m]`) sliced to `[from, to)` along its last dimension.
fn last_slice(
    b: &mut Builder,
    v: ValueId,
    from: usize,
    to: usize,
    loc: Option<Loc>,
) -> Result<ValueId, VerifyError> {
    let t = b.ty(v).expect("defined").clone();
    let r = t.rank();
    let mut start = vec![0i64; r];
    let mut limit: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    start[r - 1] = from as i64;
    limit[r - 1] = to as i64;
    let op = Op::Slice {
        start_indices: start,
        limit_indices: limit,
        strides: vec![1; r],
    };
    Ok(b.push_at(op, &[v], None, loc)?[0])
}

/// `reduce_region(inputs..., inits...)` over `dims` with the [`expandable`] `body`, as the tree
/// of elementwise ops this module describes.
pub fn reduce_tree(
    b: &mut Builder,
    body: &Func,
    args: &[ValueId],
    dims: &[i64],
    loc: Option<Loc>,
) -> Result<Vec<ValueId>, VerifyError> {
    let k = args.len() / 2;
    let (inputs, inits) = args.split_at(k);
    let t0 = b.ty(inputs[0]).expect("defined").clone();
    let rank = t0.rank();
    let reduced: Vec<usize> = (0..rank).filter(|d| dims.contains(&(*d as i64))).collect();
    let kept: Vec<usize> = (0..rank).filter(|d| !reduced.contains(d)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&d| t0.shape[d]).collect();
    let n: usize = reduced.iter().map(|&d| t0.shape[d]).product();
    // The inits, broadcast to the kept shape: the first accumulators.
    let mut acc = Vec::with_capacity(2 * k);
    for &i in inits {
        let dt = b.ty(i).expect("defined").dtype;
        let op = Op::BroadcastInDim {
            broadcast_dimensions: vec![],
        };
        let ty = TensorType::new(dt, kept_shape.clone());
        acc.push(b.push_at(op, &[i], Some(std::slice::from_ref(&ty)), loc)?[0]);
    }
    if n == 0 {
        return Ok(acc);
    }
    // Each input as [kept..., n].
    let permutation: Vec<i64> = kept.iter().chain(&reduced).map(|&d| d as i64).collect();
    let identity = permutation.iter().enumerate().all(|(i, &p)| p == i as i64);
    let mut with_n = kept_shape.clone();
    with_n.push(n);
    let mut cur = Vec::with_capacity(k);
    for &x in inputs {
        let dt = b.ty(x).expect("defined").dtype;
        let moved = if identity {
            x
        } else {
            let op = Op::Transpose {
                permutation: permutation.clone(),
            };
            b.push_at(op, &[x], None, loc)?[0]
        };
        let ty = TensorType::new(dt, with_n.clone());
        cur.push(
            b.push_at(
                Op::Reshape {},
                &[moved],
                Some(std::slice::from_ref(&ty)),
                loc,
            )?[0],
        );
    }
    let mut m = n;
    while m > 1 {
        let h = m / 2;
        let mut halves = Vec::with_capacity(2 * k);
        for &v in &cur {
            halves.push(last_slice(b, v, 0, h, loc)?);
        }
        for &v in &cur {
            halves.push(last_slice(b, v, h, 2 * h, loc)?);
        }
        let mut shape = kept_shape.clone();
        shape.push(h);
        let mut next = apply_elementwise(b, body, &halves, &shape, loc)?;
        if m % 2 == 1 {
            for (i, &v) in cur.iter().enumerate() {
                let last = last_slice(b, v, m - 1, m, loc)?;
                let op = Op::Concatenate {
                    dimension: kept.len() as i64,
                };
                next[i] = b.push_at(op, &[next[i], last], None, loc)?[0];
            }
        }
        cur = next;
        m = h + m % 2;
    }
    // What is left, combined into the inits.
    for &v in &cur {
        let dt = b.ty(v).expect("defined").dtype;
        let ty = TensorType::new(dt, kept_shape.clone());
        acc.push(b.push_at(Op::Reshape {}, &[v], Some(std::slice::from_ref(&ty)), loc)?[0]);
    }
    apply_elementwise(b, body, &acc, &kept_shape, loc)
}

/// The most window elements a `reduce_window_region` whose body the fold kernels do not
/// express (small floats, complex values; see [`crate::fold::folds`]) is expanded for (one
/// body application per element); a larger window keeps the op, which the host folds per
/// element. Bodies the fold expresses never expand, whatever the window
/// ([`crate::fold::lower_reduce_window_region`]).
pub const MAX_EXPANDED_WINDOW: i64 = 256;

/// `reduce_window_region(inputs..., inits...)` with the [`expandable`] `body`: the fold of
/// [`fold_window`] (the reference interpreter's order, so any body agrees bit for bit), each
/// window element's slices combined into the accumulators by the body at tensor shape.
pub fn reduce_window_fold(
    b: &mut Builder,
    body: &Func,
    args: &[ValueId],
    w: &Window<'_>,
    out_shape: &[usize],
    loc: Option<Loc>,
) -> Result<Vec<ValueId>, VerifyError> {
    fold_window(b, args, w, out_shape, loc, &mut |b, args| {
        apply_elementwise(b, body, args, out_shape, loc)
    })
}

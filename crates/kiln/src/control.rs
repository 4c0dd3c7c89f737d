//! Control flow over parameter trees, traced into the IR's `while` and `case`: [`while_loop`],
//! [`fori_loop`], [`scan`], [`map`] (a `scan` without a carry), [`cond`] and [`switch`], after
//! JAX's `lax` functions of the same names; and [`reduce`], a reduction whose body is a traced
//! closure (the IR's `reduce_region`).
//!
//! Each function traces its closures once, into regions (functions the op runs), and applies
//! the op: inside `jit` it is recorded, outside it runs at once. Tensors the closures use from
//! outside (captured) become extra operands of the op, passed through unchanged. A loop body
//! that changes a carry's type, or branches that return different types, is an error naming
//! both types and the caller's line.
//!
//! ```
//! use kiln::{Tensor, control};
//! // Newton's iteration for sqrt(2), until two iterates agree to a relative 1e-6.
//! let two = Tensor::scalar(2.0f32);
//! let tol = Tensor::scalar(1e-6f32);
//! let (x, _) = control::while_loop(
//!     |(x, prev): &(Tensor, Tensor)| x.sub(prev).abs().gt(&x.mul(&tol)),
//!     |(x, _): &(Tensor, Tensor)| (x.add(&two.div(x)).mul(&Tensor::scalar(0.5f32)), x.clone()),
//!     (Tensor::scalar(1.0f32), Tensor::scalar(0.0f32)),
//! );
//! let got = x.to_vec::<f32>().unwrap()[0];
//! assert!((got - 2f32.sqrt()).abs() < 1e-6);
//! ```

pub use crate::map::map;
pub use crate::reduce::reduce;
pub use crate::scan::{ScanOptions, scan, scan_with};
use crate::{Error, Tensor, Tree};
use kiln_ir::{Builder, DType, Func, Loc, Op, TensorType, ValueId};
use kiln_trace::trace::{Traced, apply, trace};

/// `(a, b, c)`: types for messages.
fn types_text(tys: &[TensorType]) -> String {
    let v: Vec<String> = tys.iter().map(|t| t.to_string()).collect();
    format!("({})", v.join(", "))
}

/// The types of `leaves`, or the first leaf's error.
fn leaf_types(leaves: &[Tensor]) -> Result<Vec<TensorType>, Error> {
    leaves
        .iter()
        .map(|t| match t.error() {
            Some(e) => Err(e.clone()),
            None => Ok(t.ty().expect("a tensor that did not fail has a type")),
        })
        .collect()
}

/// `tree` with every leaf failed with `e`.
fn failed<T: Tree>(tree: &T, e: &Error) -> T {
    tree.map_leaves(&mut |_| Tensor::failed(e.clone()))
}

/// The types of a traced function's captures.
fn capture_types(t: &Traced) -> Vec<TensorType> {
    t.func.param_types()[t.func.params.len() - t.captures.len()..].to_vec()
}

/// A region named `name` of parameters `params`, whose outputs `emit` builds from them.
fn region(
    name: &str,
    params: &[TensorType],
    emit: impl FnOnce(&mut Builder, &[ValueId]) -> Result<Vec<ValueId>, kiln_ir::VerifyError>,
    op: &str,
    loc: Loc,
) -> Result<Func, Error> {
    let mut b = Builder::new(name);
    let ps: Vec<ValueId> = params.iter().map(|t| b.param(t.clone())).collect();
    emit(&mut b, &ps)
        .and_then(|outs| b.finish(&outs))
        .map_err(|e| Error::at(op, e.to_string(), loc))
}

/// Runs `body` on the carries, starting from `init`, as long as `cond` returns true on them,
/// and returns the last carries (JAX's `lax.while_loop`). `cond` returns a `pred[]` scalar;
/// `body` returns carries of the same structure and types as `init`.
///
/// Reverse-mode differentiation through a `while_loop` is an error (its trip count depends on
/// the data); write a loop with a fixed trip count with [`fori_loop`]. Forward mode
/// ([`crate::jvp`]) works: the loop carries the tangents alongside.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, control, grad};
/// // Doubling until past 100, counting the steps.
/// let (x, steps) = control::while_loop(
///     |(x, _): &(Tensor, Tensor)| x.lt(&Tensor::scalar(100.0f32)),
///     |(x, n): &(Tensor, Tensor)| (x * 2.0, n + 1),
///     (Tensor::scalar(1.0f32), Tensor::scalar(0i32)),
/// );
/// assert_eq!(x.item().unwrap(), 128.0);
/// assert_eq!(steps.to_vec::<i32>().unwrap(), [7]);
/// // Its trip count depends on the data, so reverse mode is an error.
/// let double_past_100 = |x: &Tensor| {
///     let below = |x: &Tensor| x.lt(&Tensor::scalar(100.0f32));
///     control::while_loop(below, |x: &Tensor| x * 2.0, x.clone())
/// };
/// assert!(grad(double_past_100)(&Tensor::scalar(1.0f32)).error().is_some());
/// ```
#[track_caller]
pub fn while_loop<T: Tree>(
    cond: impl FnOnce(&T) -> Tensor,
    body: impl FnOnce(&T) -> T,
    init: T,
) -> T {
    let loc = Loc::caller();
    while_at(cond, body, init, "while_loop", loc)
}

fn while_at<T: Tree>(
    cond: impl FnOnce(&T) -> Tensor,
    body: impl FnOnce(&T) -> T,
    init: T,
    op: &str,
    loc: Loc,
) -> T {
    let leaves: Vec<Tensor> = init.leaf_vec().into_iter().cloned().collect();
    let n = leaves.len();
    let carries = match leaf_types(&leaves) {
        Ok(t) => t,
        Err(e) => return failed(&init, &e),
    };
    if n == 0 {
        let e = Error::at(
            op,
            "the carries hold no tensor: a loop needs at least one",
            loc,
        );
        return failed(&init, &e);
    }
    let c = match trace("cond", &carries, |xs| vec![cond(&init.with_leaves(xs))]) {
        Ok(c) => c,
        Err(e) => return failed(&init, &e),
    };
    let b = match trace("body", &carries, |xs| {
        body(&init.with_leaves(xs))
            .leaf_vec()
            .into_iter()
            .cloned()
            .collect()
    }) {
        Ok(b) => b,
        Err(e) => return failed(&init, &e),
    };
    let pred = TensorType::scalar(DType::Pred);
    if c.func.output_types != [pred] {
        let e = Error::at(
            op,
            format!(
                "the condition returns {}; it must return one pred[] scalar",
                types_text(&c.func.output_types)
            ),
            loc,
        );
        return failed(&init, &e);
    }
    if b.func.output_types != carries {
        let e = Error::at(
            op,
            format!(
                "the body returns {} but the carries are {}: a loop keeps its carries' types",
                types_text(&b.func.output_types),
                types_text(&carries)
            ),
            loc,
        );
        return failed(&init, &e);
    }
    // Captures ride along as extra carries that neither region changes.
    let (nc, nb) = (c.captures.len(), b.captures.len());
    let all: Vec<TensorType> = carries
        .iter()
        .cloned()
        .chain(capture_types(&c))
        .chain(capture_types(&b))
        .collect();
    let cond_f = region(
        "cond",
        &all,
        |bl, ps| {
            let args: Vec<ValueId> = ps[..n + nc].to_vec();
            bl.inline(&c.func, &args)
        },
        op,
        loc,
    );
    let body_f = region(
        "body",
        &all,
        |bl, ps| {
            let args: Vec<ValueId> = ps[..n].iter().chain(&ps[n + nc..]).copied().collect();
            let mut outs = bl.inline(&b.func, &args)?;
            outs.extend_from_slice(&ps[n..]);
            Ok(outs)
        },
        op,
        loc,
    );
    let (cond_f, body_f) = match (cond_f, body_f) {
        (Ok(c), Ok(b)) => (c, b),
        (Err(e), _) | (_, Err(e)) => return failed(&init, &e),
    };
    let operands: Vec<&Tensor> = leaves
        .iter()
        .chain(&c.captures)
        .chain(&b.captures)
        .collect();
    debug_assert_eq!(operands.len(), n + nc + nb);
    let op_ = Op::While {
        cond: Box::new(cond_f),
        body: Box::new(body_f),
    };
    let outs = apply(op_, &operands, None, op, loc);
    init.with_leaves(&outs[..n])
}

/// Runs `body(i, carries)` for `i` from `lower` up to `upper - 1` (none when `upper <= lower`),
/// starting from `init`, and returns the last carries (JAX's `lax.fori_loop`). `i` is an `i32[]`
/// tensor. The trip count is fixed by the bounds, so the loop differentiates in reverse and
/// forward mode, to any order (see `ir-specs/ops/while.md`).
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, control, grad};
/// // 5! as the product of i for i in 1..6.
/// let times_i = |i: &Tensor, acc: &Tensor| acc * &i.cast(DType::F32);
/// let fact = control::fori_loop(1, 6, times_i, Tensor::scalar(1.0f32));
/// assert_eq!(fact.item().unwrap(), 120.0);
/// // x³ as a loop, differentiated in reverse mode: 3x² = 12 at x = 2.
/// let cube =
///     |x: &Tensor| control::fori_loop(0, 3, |_, acc: &Tensor| acc * x, Tensor::scalar(1.0f64));
/// assert_eq!(grad(cube)(&Tensor::scalar(2.0f64)).item().unwrap(), 12.0);
/// ```
#[track_caller]
pub fn fori_loop<T: Tree>(
    lower: i32,
    upper: i32,
    body: impl FnOnce(&Tensor, &T) -> T,
    init: T,
) -> T {
    let loc = Loc::caller();
    let stop = Tensor::scalar(upper);
    let one = Tensor::scalar(1i32);
    let (_, out) = while_at(
        |(i, _): &(Tensor, T)| i.lt(&stop),
        |(i, v): &(Tensor, T)| (i.add(&one), body(i, v)),
        (Tensor::scalar(lower), init),
        "fori_loop",
        loc,
    );
    out
}

/// `on_true(operands)` where `pred` (a `pred[]` scalar) holds, else `on_false(operands)`
/// (JAX's `lax.cond`). Both branches return the same structure and types.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, control};
/// let (double, negate) = (|x: &Tensor| x * 2.0, |x: &Tensor| -x);
/// let f = |p: bool| control::cond(&Tensor::scalar(p), double, negate, Tensor::scalar(3.0f32));
/// assert_eq!(f(true).item().unwrap(), 6.0);
/// assert_eq!(f(false).item().unwrap(), -3.0);
/// // The predicate must be a pred[] scalar.
/// let bad = control::cond(&Tensor::scalar(1i32), double, negate, Tensor::scalar(3.0f32));
/// assert!(bad.error().unwrap().message.contains("pred[] scalar"));
/// ```
#[track_caller]
pub fn cond<A: Tree, R: Tree>(
    pred: &Tensor,
    on_true: impl Fn(&A) -> R,
    on_false: impl Fn(&A) -> R,
    operands: A,
) -> R {
    let loc = Loc::caller();
    let index = match pred.ty() {
        Some(t) if t == TensorType::scalar(DType::Pred) => pred.cast(DType::I32),
        Some(t) => Tensor::failed(Error::at(
            "cond",
            format!("the predicate must be a pred[] scalar, got {t}"),
            loc,
        )),
        None => pred.clone(),
    };
    let branches: [&dyn Fn(&A) -> R; 2] = [&on_false, &on_true];
    match branches_at(&index, &branches, operands, "cond", loc) {
        Some(r) => r,
        None => unreachable!("two branches give a result"),
    }
}

/// `branches[index](operands)`, with `index` (an integer scalar) clamped into the branches'
/// range (JAX's `lax.switch`). Every branch returns the same structure and types. `None` when
/// there are no branches.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, control};
/// let branches: [&dyn Fn(&Tensor) -> Tensor; 3] = [&|x| x + 1.0, &|x| x * 10.0, &|x| -x];
/// let at = |i: i32| control::switch(&Tensor::scalar(i), &branches, Tensor::scalar(2.0f32));
/// let pick = |i| at(i).unwrap().item().unwrap();
/// assert_eq!([pick(0), pick(1), pick(2)], [3.0, 20.0, -2.0]);
/// assert_eq!((pick(-4), pick(9)), (3.0, -2.0)); // clamped into range
/// let none: [&dyn Fn(&Tensor) -> Tensor; 0] = [];
/// assert!(control::switch(&Tensor::scalar(0i32), &none, Tensor::scalar(1.0f32)).is_none());
/// ```
#[track_caller]
pub fn switch<A: Tree, R: Tree>(
    index: &Tensor,
    branches: &[&dyn Fn(&A) -> R],
    operands: A,
) -> Option<R> {
    let loc = Loc::caller();
    let n = branches.len() as i32;
    let index = match index.ty() {
        Some(t) if t.rank() == 0 && t.dtype.is_int() => {
            let i = index.cast(DType::I32);
            let lo = Tensor::scalar(0i32);
            let hi = Tensor::scalar((n - 1).max(0));
            apply(Op::Clamp {}, &[&lo, &i, &hi], None, "switch", loc).remove(0)
        }
        Some(t) => Tensor::failed(Error::at(
            "switch",
            format!("the index must be an integer scalar, got {t}"),
            loc,
        )),
        None => index.clone(),
    };
    branches_at(&index, branches, operands, "switch", loc)
}

/// `case(index, operands..., captures...)` over the traced branches.
fn branches_at<A: Tree, R: Tree>(
    index: &Tensor,
    branches: &[&dyn Fn(&A) -> R],
    operands: A,
    op: &str,
    loc: Loc,
) -> Option<R> {
    let leaves: Vec<Tensor> = operands.leaf_vec().into_iter().cloned().collect();
    let n = leaves.len();
    // Each branch traced, with the tree it returned (its structure rebuilds the results).
    let mut traced: Vec<(Traced, R)> = Vec::new();
    let arg_types = leaf_types(&leaves);
    for (k, br) in branches.iter().enumerate() {
        let types = match &arg_types {
            Ok(t) => t,
            Err(e) => {
                // Run one branch on the operands as they are, for the structure only.
                return Some(failed(&br(&operands), e));
            }
        };
        let mut out: Option<R> = None;
        let t = trace(&format!("branch{k}"), types, |xs| {
            let r = br(&operands.with_leaves(xs));
            let ls = r.leaf_vec().into_iter().cloned().collect();
            out = Some(r);
            ls
        });
        let r = out.expect("the branch ran");
        match t {
            Ok(t) => traced.push((t, r)),
            Err(e) => return Some(failed(&r, &e)),
        }
    }
    let (first, like) = traced.first()?;
    if let Some(e) = index.error() {
        return Some(failed(like, e));
    }
    for (k, (t, _)) in traced.iter().enumerate().skip(1) {
        if t.func.output_types != first.func.output_types {
            let e = Error::at(
                op,
                format!(
                    "branch {k} returns {} but branch 0 returns {}: every branch returns the same types",
                    types_text(&t.func.output_types),
                    types_text(&first.func.output_types)
                ),
                loc,
            );
            return Some(failed(like, &e));
        }
    }
    if first.func.output_types.is_empty() {
        let e = Error::at(op, "the branches return no tensor", loc);
        return Some(failed(like, &e));
    }
    // Every branch takes the operands, then every branch's captures, and uses its own.
    let caps: Vec<TensorType> = traced.iter().flat_map(|(t, _)| capture_types(t)).collect();
    let params: Vec<TensorType> = match arg_types {
        Ok(t) => t.into_iter().chain(caps).collect(),
        Err(e) => return Some(failed(like, &e)),
    };
    let mut regions = Vec::new();
    let mut at = n;
    for (k, (t, _)) in traced.iter().enumerate() {
        let nk = t.captures.len();
        let r = region(
            &format!("branch{k}"),
            &params,
            |bl, ps| {
                let args: Vec<ValueId> = ps[..n].iter().chain(&ps[at..at + nk]).copied().collect();
                bl.inline(&t.func, &args)
            },
            op,
            loc,
        );
        match r {
            Ok(r) => regions.push(r),
            Err(e) => return Some(failed(like, &e)),
        }
        at += nk;
    }
    let xs: Vec<&Tensor> = std::iter::once(index)
        .chain(&leaves)
        .chain(traced.iter().flat_map(|(t, _)| &t.captures))
        .collect();
    let outs = apply(Op::Case { branches: regions }, &xs, None, op, loc);
    Some(like.with_leaves(&outs))
}

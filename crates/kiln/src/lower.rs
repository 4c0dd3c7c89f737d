//! The IR behind the transforms, for dumps and snapshot tests.

use crate::{Error, Result, Tensor, Tree};
use kiln_ir::{Func, Loc};

/// The traced IR of `f` at `x`'s signature.
#[track_caller]
pub fn trace_ir<I: Tree, O: Tree>(f: impl FnOnce(&I) -> O, x: &I) -> Result<Func> {
    let loc = Loc::caller();
    let leaves: Vec<Tensor> = x.leaf_vec().into_iter().cloned().collect();
    let types: Vec<_> = leaves
        .iter()
        .map(|t| t.ty().ok_or_else(|| t.error().cloned().expect("failed")))
        .collect::<Result<_>>()?;
    let traced = kiln_trace::trace::trace("main", &types, |p| {
        f(&x.with_leaves(p))
            .leaf_vec()
            .into_iter()
            .cloned()
            .collect()
    })?;
    if !traced.captures.is_empty() {
        return Err(Error::at(
            "trace_ir",
            "the function captured traced tensors",
            loc,
        ));
    }
    Ok(traced.func)
}

/// The IR of `value_and_grad(f)` at `x`'s signature: (value, gradients...).
#[track_caller]
pub fn grad_ir<I: Tree>(f: impl FnOnce(&I) -> Tensor, x: &I) -> Result<Func> {
    let loc = Loc::caller();
    let leaves: Vec<Tensor> = x.leaf_vec().into_iter().cloned().collect();
    let types: Vec<_> = leaves
        .iter()
        .map(|t| t.ty().ok_or_else(|| t.error().cloned().expect("failed")))
        .collect::<Result<_>>()?;
    let traced = kiln_trace::trace::trace("main", &types, |p| vec![f(&x.with_leaves(p))])?;
    if !traced.captures.is_empty() {
        return Err(Error::at(
            "grad_ir",
            "the function captured traced tensors",
            loc,
        ));
    }
    let wrt: Vec<usize> = (0..traced.func.params.len()).collect();
    kiln_autodiff::value_and_grad_with_rules(&traced.func, &wrt, false, &traced.custom)
        .map_err(|e| Error::at("grad_ir", e.to_string(), loc))
}

//! Rematerialization (JAX's `jax.checkpoint`/`jax.remat`): a function whose intermediates the
//! backward pass recomputes instead of keeping them from the forward pass, trading compute
//! for memory.
//!
//! [`remat`] traces the function, and records it with a custom reverse-mode rule: the forward
//! pass computes its outputs and the values the [`Remat`] policy saves; the backward pass
//! recomputes everything else from the inputs (behind an `optimization_barrier`, so the
//! optimizer cannot merge the recomputation back into the forward pass) and differentiates
//! it, with the saved values standing in for their instructions
//! ([`kiln_autodiff::vjp_into_saving`]). Gradients are those of the function itself.

use crate::{Error, Result, Tensor, Tree};
use kiln_ir::{Builder, Func, Loc, Op, OpKind, ValueId};
use kiln_trace::trace::{call, custom_rule, trace, tracing};

/// What a rematerialized function keeps from its forward pass for the backward pass.
///
/// # Examples
///
/// ```
/// use kiln::{Remat, Tensor, grad, remat};
/// let f = |w: &Tensor| w.matmul(w).tanh().sum_all();
/// let w = Tensor::from_vec(vec![0.1f64, 0.2, 0.3, 0.4], [2, 2]).unwrap();
/// let want = grad(f)(&w).to_vec::<f64>().unwrap();
/// // Every policy gives the same gradient; they differ in what they keep.
/// for policy in [Remat::SaveNothing, Remat::SaveMatrixProducts, Remat::Budget(64)] {
///     let g = grad(|w: &Tensor| remat(f, policy.clone())(w))(&w).to_vec::<f64>().unwrap();
///     assert!(g.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "{policy:?}");
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remat {
    /// Nothing but its inputs: every intermediate is recomputed.
    SaveNothing,
    /// The outputs of matrix products and convolutions (the expensive ops): elementwise ops
    /// and reductions between them are recomputed.
    SaveMatrixProducts,
    /// The values tagged with one of these names by [`tag`] inside the function.
    SaveNamed(Vec<String>),
    /// At most this many bytes of intermediates, chosen by what recomputing them would cost:
    /// repeatedly, of the values that still fit, the one whose recomputation (its own
    /// instruction and those before it that are neither inputs nor saved, at the cost model's
    /// estimates) costs most per byte. `Budget(0)` is [`Remat::SaveNothing`]; a budget as large
    /// as every intermediate saves those worth anything to keep.
    Budget(usize),
}

/// `t` unchanged, tagged `name` for a [`Remat::SaveNamed`] policy (JAX's `checkpoint_name`).
/// Outside a trace it does nothing.
///
/// # Examples
///
/// ```
/// use kiln::{Remat, Tensor, grad, remat, tag};
/// // Keep e^x from the forward pass; recompute the rest.
/// let f = |x: &Tensor| tag(&x.exp(), "e").sin().sum_all();
/// let x = Tensor::from_vec(vec![0.0f64, 1.0], [2]).unwrap();
/// assert_eq!(tag(&x, "x").to_vec::<f64>().unwrap(), [0.0, 1.0]);
/// let g = grad(|x: &Tensor| remat(f, Remat::SaveNamed(vec!["e".into()]))(x))(&x);
/// for (g, x) in g.to_vec::<f64>().unwrap().iter().zip([0.0f64, 1.0]) {
///     assert!((g - x.exp().cos() * x.exp()).abs() < 1e-12); // d/dx sin(e^x)
/// }
/// ```
pub fn tag(t: &Tensor, name: &str) -> Tensor {
    kiln_trace::trace::tag(t, name);
    t.clone()
}

/// `f` rematerialized under `policy`: see the module documentation. Outside a trace (an eager
/// call, where nothing is differentiated) it is `f`.
///
/// ```
/// use kiln::{Tensor, grad, remat, Remat};
/// let f = |x: &Tensor| x.sin().sin().sum_all();
/// let x = Tensor::from_vec(vec![0.5f64, 1.0], [2]).unwrap();
/// let g = grad(|x: &Tensor| remat(f, Remat::SaveNothing)(x))(&x);
/// let want = grad(f)(&x);
/// assert_eq!(g.to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
/// ```
#[track_caller]
pub fn remat<I: Tree, O: Tree>(f: impl Fn(&I) -> O, policy: Remat) -> impl Fn(&I) -> O {
    let loc = Loc::caller();
    move |x: &I| {
        let leaves: Vec<Tensor> = x.leaf_vec().into_iter().cloned().collect();
        if !tracing() || !leaves.iter().any(|t| t.is_traced()) {
            return f(x);
        }
        match remat_traced(&f, x, &leaves, &policy, loc) {
            Ok(o) => o,
            // No template without a trace: the function's own outputs, each failed.
            Err(e) => f(x).map_leaves(&mut |_| Tensor::failed(e.clone())),
        }
    }
}

fn remat_traced<I: Tree, O: Tree>(
    f: &impl Fn(&I) -> O,
    x: &I,
    leaves: &[Tensor],
    policy: &Remat,
    loc: Loc,
) -> Result<O> {
    let types = leaves
        .iter()
        .map(|t| t.ty().ok_or_else(|| t.error().cloned().expect("failed")))
        .collect::<Result<Vec<_>>>()?;
    let mut template = None;
    let traced = trace("remat", &types, |ps| {
        let o = f(&x.with_leaves(ps));
        let outs = o.leaf_vec().into_iter().cloned().collect();
        template = Some(o);
        outs
    })?;
    let template = template.expect("the function ran");
    let func = &traced.func;
    let saved = saved_values(func, policy, &traced.tags, &traced.custom);
    // The forward pass: the outputs, then the saved values.
    let mut forward = func.clone();
    for &v in &saved {
        forward.outputs.push(v);
        forward.output_types.push(func.values[v.index()].clone());
    }
    let bwd =
        backward(func, &forward, &saved, &traced.custom).map_err(|e| Error::at("remat", e, loc))?;
    let xs: Vec<Tensor> = leaves.iter().chain(&traced.captures).cloned().collect();
    let refs: Vec<&Tensor> = xs.iter().collect();
    let ys = call(&forward, &refs, "remat", loc);
    if let Some(e) = ys.iter().find_map(|t| t.error()) {
        return Err(e.clone());
    }
    let out = custom_rule(&xs, &ys, bwd, loc);
    Ok(template.with_leaves(&out[..func.outputs.len()]))
}

/// The values of `f` the policy keeps.
fn saved_values(
    f: &Func,
    policy: &Remat,
    tags: &[(ValueId, String)],
    custom: &[(usize, Func)],
) -> Vec<ValueId> {
    match policy {
        Remat::SaveNothing => Vec::new(),
        Remat::SaveMatrixProducts => f
            .insts
            .iter()
            .filter(|i| matches!(i.op.kind(), OpKind::DotGeneral | OpKind::Convolution))
            .flat_map(|i| i.results.iter().copied())
            .filter(|r| f.values[r.index()].dtype.is_float())
            .collect(),
        Remat::Budget(bytes) => budgeted(f, *bytes, custom),
        Remat::SaveNamed(names) => {
            // Tags of parameters save nothing (the inputs are kept anyway).
            let mut out: Vec<ValueId> = tags
                .iter()
                .filter(|(_, n)| names.contains(n))
                .map(|(v, _)| *v)
                .filter(|v| f.insts.iter().any(|i| i.results.contains(v)))
                .collect();
            out.sort();
            out.dedup();
            out
        }
    }
}

/// The values [`Remat::Budget`] saves in `f` within `budget` bytes (sorted): of the values the
/// backward pass reads ([`read_by_backward`]), greedy by recomputation cost per byte, the costs
/// re-estimated after each choice (a saved value cuts the recomputation of the values after
/// it).
fn budgeted(f: &Func, budget: usize, custom: &[(usize, Func)]) -> Vec<ValueId> {
    let read = read_by_backward(f, custom);
    let machine = kiln_opt::cost::Machine::REFERENCE;
    let mut def = vec![None; f.values.len()];
    for (k, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            def[r.index()] = Some(k);
        }
    }
    let own: Vec<f64> = f
        .insts
        .iter()
        .map(|inst| {
            let types: Vec<_> = inst
                .results
                .iter()
                .map(|r| f.values[r.index()].clone())
                .collect();
            let operand = |k: usize| inst.operands.get(k).map(|o| f.values[o.index()].clone());
            kiln_opt::cost::op_cost(&machine, &inst.op, inst.op.kind(), &types, operand)
        })
        .collect();
    let bytes = |v: ValueId| {
        let t = &f.values[v.index()];
        t.numel().saturating_mul(t.dtype.bytes())
    };
    let candidates: Vec<ValueId> = f
        .insts
        .iter()
        .filter(|i| !matches!(i.op.kind(), OpKind::Constant))
        .flat_map(|i| i.results.iter().copied())
        .filter(|&v| read[v.index()] && !f.outputs.contains(&v))
        .filter(|&v| bytes(v) > 0)
        .collect();
    let mut saved = vec![false; f.values.len()];
    let mut chosen = Vec::new();
    let mut left = budget;
    loop {
        let mut best: Option<(f64, ValueId)> = None;
        for &v in &candidates {
            if saved[v.index()] || bytes(v) > left {
                continue;
            }
            let per_byte = recompute_cost(f, &def, &own, &saved, v) / bytes(v) as f64;
            if per_byte > 0.0 && best.is_none_or(|(b, _)| per_byte > b) {
                best = Some((per_byte, v));
            }
        }
        let Some((_, v)) = best else { break };
        saved[v.index()] = true;
        left -= bytes(v);
        chosen.push(v);
    }
    chosen.sort();
    chosen
}

/// Which of `f`'s values its backward pass reads (all of them if it has none): the backward
/// pass built with every instruction's results given as parameters, then the parameters its
/// live instructions read.
fn read_by_backward(f: &Func, custom: &[(usize, Func)]) -> Vec<bool> {
    let all = vec![true; f.values.len()];
    let mut b = Builder::new("reads");
    let args: Vec<ValueId> = f.param_types().into_iter().map(|t| b.param(t)).collect();
    let given: Vec<(ValueId, ValueId)> = f
        .insts
        .iter()
        .flat_map(|i| i.results.iter().copied())
        .map(|r| (r, b.param(f.values[r.index()].clone())))
        .collect();
    let cts: Vec<Option<ValueId>> = f
        .output_types
        .iter()
        .map(|t| t.dtype.is_float().then(|| b.param(t.clone())))
        .collect();
    let wrt: Vec<usize> = (0..f.params.len())
        .filter(|&i| f.values[f.params[i].index()].dtype.is_float())
        .collect();
    let Ok((_, grads)) =
        kiln_autodiff::vjp_into_saving(&mut b, f, &args, &cts, &wrt, &given, custom)
    else {
        return all;
    };
    let Ok(g) = b.finish(&grads) else {
        return all;
    };
    // Eliminating dead code keeps the parameters' numbering.
    let g = kiln_autodiff::eliminate_dead_code(&g);
    let used = g.used_values();
    let mut read = vec![false; f.values.len()];
    for (v, p) in given {
        read[v.index()] = used[p.index()];
    }
    read
}

/// The estimated cost of recomputing `v` in `f`: its instruction's and those of the values it
/// needs, back to the parameters and the values `saved`.
fn recompute_cost(f: &Func, def: &[Option<usize>], own: &[f64], saved: &[bool], v: ValueId) -> f64 {
    let mut seen = vec![false; f.insts.len()];
    let mut stack = vec![v];
    let mut cost = 0.0;
    while let Some(u) = stack.pop() {
        let Some(k) = def[u.index()] else { continue };
        if (u != v && saved[u.index()]) || seen[k] {
            continue;
        }
        seen[k] = true;
        cost += own[k];
        stack.extend(f.insts[k].operands.iter().copied());
    }
    cost
}

/// The custom rule: `(xs..., ys..., saved..., ys_bar..., saved_bar...) -> xs_bar...`, which
/// recomputes `f` from `xs` behind a barrier, with the saved values given, and differentiates
/// it.
fn backward(
    f: &Func,
    forward: &Func,
    saved: &[ValueId],
    custom: &[(usize, Func)],
) -> std::result::Result<Func, String> {
    let mut b = Builder::new("remat_bwd");
    let xs: Vec<ValueId> = f.param_types().into_iter().map(|t| b.param(t)).collect();
    let ys: Vec<ValueId> = forward
        .output_types
        .iter()
        .map(|t| b.param(t.clone()))
        .collect();
    let cts: Vec<ValueId> = forward
        .output_types
        .iter()
        .map(|t| b.param(t.clone()))
        .collect();
    let fenced = if xs.is_empty() {
        Vec::new()
    } else {
        b.push(Op::OptimizationBarrier {}, &xs)
            .map_err(|e| e.to_string())?
    };
    let n_out = f.outputs.len();
    let pairs: Vec<(ValueId, ValueId)> = saved
        .iter()
        .zip(&ys[n_out..])
        .map(|(&v, &s)| (v, s))
        .collect();
    let out_cts: Vec<Option<ValueId>> = f
        .output_types
        .iter()
        .zip(&cts)
        .map(|(t, &c)| t.dtype.is_float().then_some(c))
        .collect();
    let wrt: Vec<usize> = (0..xs.len())
        .filter(|&i| f.values[f.params[i].index()].dtype.is_float())
        .collect();
    let (_, grads) =
        kiln_autodiff::vjp_into_saving(&mut b, f, &fenced, &out_cts, &wrt, &pairs, custom)
            .map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(xs.len());
    for (i, &x) in xs.iter().enumerate() {
        out.push(match wrt.iter().position(|&w| w == i) {
            Some(k) => grads[k],
            None => {
                let t = b.ty(x).cloned().expect("a parameter");
                b.full(&t, 0.0).map_err(|e| e.to_string())?
            }
        });
    }
    b.finish(&out).map_err(|e| e.to_string())
}

//! Rematerialization (JAX's `jax.checkpoint`/`jax.remat`): a function whose intermediates the
//! backward pass recomputes instead of keeping them from the forward pass, trading compute
//! for memory.
//!
//! [`remat`] traces the function, and records it with a custom reverse-mode rule: the forward
//! pass computes its outputs and the values the [`Remat`] policy saves; the backward pass
//! recomputes everything else from the inputs (behind an `optimization_barrier`, so the
//! optimizer cannot merge the recomputation back into the forward pass) and differentiates
//! it, with the saved values and the function's own outputs standing in for their
//! instructions ([`kiln_autodiff::vjp_into_saving`]). Gradients are those of the function
//! itself.
//!
//! A value is saved only where the backward pass reads it: kiln differentiates `tanh`, `exp`,
//! `logistic` and the like from their outputs, so a matrix product followed by such an
//! activation is kept as the activation (what the backward pass reads), not as the product.
//! The backward pass's recomputation starts from a barrier over the inputs and everything the
//! forward pass kept, so it is not merged with the forward pass's own computation (which
//! would keep the forward pass's intermediates alive until the backward pass).

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
    /// and reductions between them are recomputed. A product the backward pass does not read
    /// is kept as what it reads of the values computed from the product elementwise (the
    /// activation after it), or not at all.
    SaveMatrixProducts,
    /// The values tagged with one of these names by [`tag`] inside the function, each kept as
    /// [`Remat::SaveMatrixProducts`] keeps a product.
    SaveNamed(Vec<String>),
    /// At most this many bytes at the peak of the compiled program's memory plan (the
    /// installed backend's: the CPU's plan, a GPU's device arena; the CPU's for a backend
    /// that plans no memory), where the planner's numbers choose what such functions keep.
    /// [`crate::jit`] first plans the plain gradient (nothing rematerialized, nothing
    /// recomputed) and compiles it if it fits; else it caps the bytes each such function
    /// keeps, of the values its backward pass reads taken in order of what recomputing them
    /// would cost per byte (the cost model's estimate of its instruction and those before it
    /// that are neither inputs nor saved, re-estimated after each choice), and compiles the
    /// program under the largest cap whose plan fits (found by bisection; a smaller cap is
    /// taken to peak no higher), or under the cap that peaked lowest when none fits. The
    /// smallest budget of a program's functions is its budget. Traced outside a `jit`
    /// compile (no program to plan), a function keeps at most this many bytes itself.
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
        if matches!(policy, Remat::Budget(_)) && searching_plain() {
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
    let (forward, bwd) =
        passes(func, &saved, &traced.custom).map_err(|e| Error::at("remat", e, loc))?;
    let xs: Vec<Tensor> = leaves.iter().chain(&traced.captures).cloned().collect();
    let refs: Vec<&Tensor> = xs.iter().collect();
    let ys = call(&forward, &refs, "remat", loc);
    if let Some(e) = ys.iter().find_map(|t| t.error()) {
        return Err(e.clone());
    }
    let out = custom_rule(&xs, &ys, bwd, loc);
    Ok(template.with_leaves(&out[..func.outputs.len()]))
}

/// The forward pass of `f` keeping `saved` (its outputs, then the saved values) and the custom
/// rule of its backward pass.
fn passes(
    f: &Func,
    saved: &[ValueId],
    custom: &[(usize, Func)],
) -> std::result::Result<(Func, Func), String> {
    let mut forward = f.clone();
    for &v in saved {
        forward.outputs.push(v);
        forward.output_types.push(f.values[v.index()].clone());
    }
    let bwd = backward(f, &forward, saved, custom)?;
    Ok((forward, bwd))
}

/// The values of `f` the policy keeps (sorted, none of them an output of `f`, which the
/// backward pass has anyway).
fn saved_values(
    f: &Func,
    policy: &Remat,
    tags: &[(ValueId, String)],
    custom: &[(usize, Func)],
) -> Vec<ValueId> {
    let named: Vec<ValueId> = match policy {
        Remat::SaveNothing => return Vec::new(),
        Remat::Budget(bytes) => return budgeted(f, *bytes, custom),
        Remat::SaveMatrixProducts => f
            .insts
            .iter()
            .filter(|i| matches!(i.op.kind(), OpKind::DotGeneral | OpKind::Convolution))
            .flat_map(|i| i.results.iter().copied())
            .filter(|r| f.values[r.index()].dtype.is_float())
            .collect(),
        // Tags of parameters save nothing (the inputs are kept anyway).
        Remat::SaveNamed(names) => tags
            .iter()
            .filter(|(_, n)| names.contains(n))
            .map(|(v, _)| *v)
            .filter(|v| f.insts.iter().any(|i| i.results.contains(v)))
            .collect(),
    };
    let read = read_by_backward(f, custom);
    let mut out: Vec<ValueId> = named
        .into_iter()
        .flat_map(|v| read_in_place_of(f, &read, v))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What keeping `v` keeps: `v` when the backward pass reads it (`read`), else the values it
/// reads among those computed from `v` by elementwise ops (not past one it reads), such as
/// the activation after a product; none of them an output of `f`.
fn read_in_place_of(f: &Func, read: &[bool], v: ValueId) -> Vec<ValueId> {
    let mut out = Vec::new();
    let mut seen = vec![false; f.values.len()];
    let mut stack = vec![v];
    while let Some(u) = stack.pop() {
        if std::mem::replace(&mut seen[u.index()], true) || f.outputs.contains(&u) {
            continue;
        }
        if read[u.index()] {
            out.push(u);
            continue;
        }
        for inst in &f.insts {
            if inst.operands.contains(&u) && inst.op.props().contains(kiln_ir::Props::ELEMENTWISE) {
                stack.extend(inst.results.iter().copied());
            }
        }
    }
    out
}

/// The values [`Remat::Budget`] saves in `f` (sorted): the longest prefix of [`cost_order`]
/// whose bytes are within the cap of the budget search under way ([`within_budget`], which
/// hears of the budget and of the prefixes' bytes), else within `budget`.
fn budgeted(f: &Func, budget: usize, custom: &[(usize, Func)]) -> Vec<ValueId> {
    let order = cost_order(f, custom);
    let bytes = |v: &ValueId| {
        let t = &f.values[v.index()];
        t.numel().saturating_mul(t.dtype.bytes())
    };
    let prefixes: Vec<usize> = std::iter::once(0)
        .chain(order.iter().scan(0usize, |sum, v| {
            *sum = sum.saturating_add(bytes(v));
            Some(*sum)
        }))
        .collect();
    let cap = SEARCH.with_borrow_mut(|s| match s {
        Some(s) => {
            s.budget = s.budget.min(budget);
            s.prefixes.extend(&prefixes);
            s.cap.unwrap_or(usize::MAX)
        }
        None => budget,
    });
    let n = prefixes.iter().rposition(|&b| b <= cap).unwrap_or(0);
    let mut saved = order[..n].to_vec();
    saved.sort();
    saved
}

/// A budget search under way on this thread ([`within_budget`]).
struct Search {
    /// The most bytes each [`Remat::Budget`] function keeps; `None`: they are not
    /// rematerialized at all (the plain gradient).
    cap: Option<usize>,
    /// The smallest budget of those traced.
    budget: usize,
    /// The bytes of each prefix each of them could keep.
    prefixes: Vec<usize>,
}

thread_local! {
    static SEARCH: std::cell::RefCell<Option<Search>> = const { std::cell::RefCell::new(None) };
}

/// Whether the budget search under way traces the plain gradient ([`Remat::Budget`]
/// functions not rematerialized).
fn searching_plain() -> bool {
    SEARCH.with_borrow(|s| s.as_ref().is_some_and(|s| s.cap.is_none()))
}

/// A program traced by `trace` whose [`Remat::Budget`] functions keep what fits their budget
/// on the program's memory plan (`peak` of `func` of the trace), the smallest budget of those
/// traced. First the plain gradient (no rematerialization: nothing recomputed), if it fits;
/// else the largest cap on the bytes one function keeps (of the bytes of the prefixes they
/// could keep) whose program fits, found by bisection on the caps (a smaller cap keeps less
/// and is taken to peak no higher); when none fits, the trace that peaked lowest of those
/// planned. A program with no such function is traced once.
pub(crate) fn within_budget<T>(
    trace: impl Fn() -> Result<T>,
    func: impl Fn(&T) -> &Func,
    peak: impl Fn(&Func) -> Result<usize>,
) -> Result<T> {
    /// Puts back the search around this one when dropped (a trace that panics included).
    struct Outer(Option<Search>);
    impl Drop for Outer {
        fn drop(&mut self) {
            SEARCH.set(self.0.take());
        }
    }
    let traced_with = |cap: Option<usize>| -> Result<(T, Search)> {
        let outer = Outer(SEARCH.replace(Some(Search {
            cap,
            budget: usize::MAX,
            prefixes: Vec::new(),
        })));
        let t = trace();
        let search = SEARCH.take().expect("set above");
        drop(outer);
        Ok((t?, search))
    };
    let (first, search) = traced_with(Some(usize::MAX))?;
    if search.prefixes.is_empty() {
        return Ok(first);
    }
    let budget = search.budget;
    let mut caps = search.prefixes;
    caps.sort_unstable_by(|a, b| b.cmp(a));
    caps.dedup();
    // Each trace planned, by cap: its peak; the latest kept.
    let mut peaks: Vec<(Option<usize>, usize)> = Vec::new();
    let mut kept = (Some(usize::MAX), first);
    let mut plan = |cap: Option<usize>| -> Result<usize> {
        if kept.0 != cap {
            kept = (cap, traced_with(cap)?.0);
        }
        let p = peak(func(&kept.1))?;
        peaks.push((cap, p));
        Ok(p)
    };
    let chosen = if plan(None)? <= budget {
        Some(None)
    } else if plan(caps.last().copied())? > budget {
        None
    } else {
        // caps[lo] may not fit, caps[hi] fits.
        let (mut lo, mut hi) = (0, caps.len() - 1);
        if plan(Some(caps[0]))? <= budget {
            hi = 0;
        }
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            if plan(Some(caps[mid]))? <= budget {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(Some(caps[hi]))
    };
    let cap = chosen.unwrap_or_else(|| {
        let lowest = peaks.iter().min_by_key(|(_, p)| *p).expect("planned");
        lowest.0
    });
    if kept.0 == cap {
        Ok(kept.1)
    } else {
        Ok(traced_with(cap)?.0)
    }
}

/// The values of `f` the backward pass reads (none of them an output or a constant), in the
/// order [`Remat::Budget`] takes them: repeatedly, the one whose recomputation costs most per
/// byte, the costs re-estimated after each choice (a saved value cuts the recomputation of
/// the values after it). Values whose recomputation costs nothing are left out.
fn cost_order(f: &Func, custom: &[(usize, Func)]) -> Vec<ValueId> {
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
    loop {
        let mut best: Option<(f64, ValueId)> = None;
        for &v in &candidates {
            if saved[v.index()] {
                continue;
            }
            let per_byte = recompute_cost(f, &def, &own, &saved, v) / bytes(v) as f64;
            if per_byte > 0.0 && best.is_none_or(|(b, _)| per_byte > b) {
                best = Some((per_byte, v));
            }
        }
        let Some((_, v)) = best else { break };
        saved[v.index()] = true;
        chosen.push(v);
    }
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
/// recomputes `f` from `xs` with the saved values and the outputs given, all of them behind
/// one barrier, and differentiates it.
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
    // The inputs and what the forward pass kept, behind one barrier: what is recomputed from
    // them is not merged with the forward pass's own computation (which would keep its values
    // alive until the backward pass).
    let held: Vec<ValueId> = xs.iter().chain(&ys).copied().collect();
    let held = if held.is_empty() {
        Vec::new()
    } else {
        b.push(Op::OptimizationBarrier {}, &held)
            .map_err(|e| e.to_string())?
    };
    let (fenced, ys) = held.split_at(xs.len());
    let n_out = f.outputs.len();
    // The saved values, and the outputs computed by instructions (the forward pass's own, not
    // recomputed).
    let mut pairs: Vec<(ValueId, ValueId)> = saved
        .iter()
        .zip(&ys[n_out..])
        .map(|(&v, &s)| (v, s))
        .collect();
    for (&o, &y) in f.outputs.iter().zip(ys) {
        if !f.params.contains(&o) && pairs.iter().all(|p| p.0 != o) {
            pairs.push((o, y));
        }
    }
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
        kiln_autodiff::vjp_into_saving(&mut b, f, fenced, &out_cts, &wrt, &pairs, custom)
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

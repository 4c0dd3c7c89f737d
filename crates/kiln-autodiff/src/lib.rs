//! Differentiation as a graph transform: every function here takes a [`Func`] and returns
//! another [`Func`] in the same IR, which prints, verifies and runs like any other, and can be
//! differentiated again.
//!
//! - [`vjp`]: `(x..., ct...) -> (y..., x_bar...)`, the reverse mode.
//! - [`grad`] and [`value_and_grad`]: the reverse mode of a scalar function.
//! - [`jvp`]: `(x..., t...) -> (y..., y_dot...)`, the forward mode, obtained as the reverse mode
//!   of the reverse mode (the VJP is linear in its cotangent, so transposing it gives the JVP);
//!   for a function with a `while` loop, instruction by instruction ([`forward`]), the loops
//!   carrying their tangents.
//!
//! The per-op rules are one exhaustive `match` in [`rules`], mirroring the VJP section of each
//! `ir-specs/ops/*.md`.
//!
//! ```
//! use kiln_ir::{parse_func_text, Literal};
//! let f = parse_func_text("func @main(%0: f64[]) -> f64[] {\n  %1 = multiply %0, %0 : f64[]\n  return %1\n}\n").unwrap();
//! let df = kiln_autodiff::grad(&f, &[0]).unwrap();
//! let x = Literal::f64([], vec![3.0]).unwrap();
//! let g = kiln_reference::eval(&df, &[x]).unwrap();
//! assert_eq!(g[0].to_f64s(), vec![6.0]);
//! ```
#![warn(missing_docs)]

pub mod forward;
mod locations;
pub mod rules;
mod softmax;
pub mod vmap;

/// Dead code elimination, kept under this path for the transforms' users.
pub use kiln_ir::eliminate_dead_code;
pub use vmap::vmap;

use crate::locations::UserLines;
use kiln_ir::{Builder, DType, Func, Op, ValueId, VerifyError};
use std::fmt;

/// An error of the autodiff transforms.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// The request does not fit the function (wrong parameter index, non-float parameter,
    /// non-scalar output for `grad`).
    BadRequest(String),
    /// An op on the differentiated path has no rule for this case.
    Unsupported(String),
    /// The transform built an ill-typed instruction: a bug in a rule.
    Verify(VerifyError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadRequest(m) => write!(f, "cannot differentiate: {m}"),
            Error::Unsupported(m) => write!(f, "no derivative rule: {m}"),
            Error::Verify(e) => write!(f, "autodiff built an ill-typed instruction (a bug): {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<VerifyError> for Error {
    fn from(e: VerifyError) -> Error {
        Error::Verify(e)
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn check_wrt(f: &Func, wrt: &[usize]) -> Result<()> {
    for &i in wrt {
        let Some(&p) = f.params.get(i) else {
            return Err(Error::BadRequest(format!(
                "@{} has {} parameter(s); cannot differentiate with respect to parameter {i}",
                f.name,
                f.params.len()
            )));
        };
        if !f.values[p.index()].dtype.is_float() {
            return Err(Error::BadRequest(format!(
                "parameter {i} of @{} is {}; gradients need float parameters",
                f.name,
                f.values[p.index()]
            )));
        }
    }
    kiln_ir::verify(f).map_err(Error::Verify)
}

/// Adds `f`'s forward computation and its backward pass to `b`. `args` stand for `f`'s
/// parameters and `cts` for the cotangents of its outputs (`None`: zero). Returns the forward
/// outputs and the cotangent of each parameter in `wrt` (zeros where none flows).
pub fn vjp_into(
    b: &mut Builder,
    f: &Func,
    args: &[ValueId],
    cts: &[Option<ValueId>],
    wrt: &[usize],
) -> Result<(Vec<ValueId>, Vec<ValueId>)> {
    vjp_into_with_rules(b, f, args, cts, wrt, &[])
}

/// [`vjp_into`] with custom rules: for each `(index, bwd)`, the instruction at `index` of `f`
/// is an `optimization_barrier(xs..., ys...)` whose `ys` are the outputs of a function with a
/// user-defined VJP; its cotangents come from inlining `bwd(xs..., ys..., ys_bar...)`, which
/// returns the `xs`' cotangents, instead of from differentiating the function's own ops.
pub fn vjp_into_with_rules(
    b: &mut Builder,
    f: &Func,
    args: &[ValueId],
    cts: &[Option<ValueId>],
    wrt: &[usize],
    custom: &[(usize, Func)],
) -> Result<(Vec<ValueId>, Vec<ValueId>)> {
    let values = b.inline_values_given_at(f, args, &[], None)?;
    vjp_from_values(b, f, &values, cts, wrt, custom)
}

/// [`vjp_into`] that keeps what was saved: for each `(v, s)` of `saved`, `f`'s value `v` is
/// `b`'s value `s` (computed earlier, say by a forward pass that kept it) and the instruction
/// defining `v` is not run again; every other instruction is recomputed from `args`. The rules
/// still see the saved instructions, so cotangents flow through them as through any other
/// (rematerialization that keeps matrix products' outputs, say). An instruction with several
/// results is skipped only when all of them are saved. `custom` as for
/// [`vjp_into_with_rules`].
pub fn vjp_into_saving(
    b: &mut Builder,
    f: &Func,
    args: &[ValueId],
    cts: &[Option<ValueId>],
    wrt: &[usize],
    saved: &[(ValueId, ValueId)],
    custom: &[(usize, Func)],
) -> Result<(Vec<ValueId>, Vec<ValueId>)> {
    let values = b.inline_values_given_at(f, args, saved, None)?;
    vjp_from_values(b, f, &values, cts, wrt, custom)
}

/// The backward pass of `f` given the value standing for each of `f`'s values in `b`.
fn vjp_from_values(
    b: &mut Builder,
    f: &Func,
    values: &[ValueId],
    cts: &[Option<ValueId>],
    wrt: &[usize],
    custom: &[(usize, Func)],
) -> Result<(Vec<ValueId>, Vec<ValueId>)> {
    let val = |v: ValueId| values[v.index()];
    let user = UserLines::of(f);
    let start = b.inst_count();
    // The values that depend on a differentiated parameter.
    let mut depends = vec![false; f.values.len()];
    for &k in wrt {
        depends[f.params[k].index()] = true;
    }
    for inst in &f.insts {
        if inst.operands.iter().any(|o| depends[o.index()]) {
            for r in &inst.results {
                depends[r.index()] = true;
            }
        }
    }
    let mut adj: Vec<Option<ValueId>> = vec![None; f.values.len()];
    let softmaxes = softmax::find(f);
    // Integer and `pred` values carry no cotangent: one given for such an output (say, the
    // zero `vjp` takes for every output) has nowhere to go, and the rules of the ops computing
    // it are not defined for it. (A complex output's goes on, to the error of its path.)
    for (&o, ct) in f.outputs.iter().zip(cts) {
        let d = f.values[o.index()].dtype;
        if let Some(ct) = ct
            && (d.is_float() || d.is_complex())
        {
            accumulate(b, &mut adj, o, *ct)?;
        }
    }
    for (index, inst) in f.insts.iter().enumerate().rev() {
        let gs: Vec<Option<ValueId>> = inst.results.iter().map(|r| adj[r.index()]).collect();
        // Control flow always reaches the rules, which differentiate it or say why not (a
        // loop's zero gradient would be wrong, not merely missing).
        if gs.iter().all(Option::is_none) {
            continue;
        }
        // Cotangents are real: one reaching a complex operand that depends on a parameter
        // (through `real`, `abs` or a conversion of a complex number, an `fft`) has nowhere to
        // go, and dropping it would make the gradient silently wrong.
        if inst
            .operands
            .iter()
            .any(|o| f.values[o.index()].dtype.is_complex() && depends[o.index()])
        {
            return Err(complex_path(&inst.op, inst.loc, "reverse"));
        }
        if !inst.op.props().contains(kiln_ir::Props::DIFFERENTIABLE)
            && !inst.op.props().contains(kiln_ir::Props::CONTROL)
        {
            continue;
        }
        let xs: Vec<ValueId> = inst.operands.iter().map(|&o| val(o)).collect();
        let rs: Vec<ValueId> = inst.results.iter().map(|&r| val(r)).collect();
        let first = b.inst_count();
        if let (Some(sm), [Some(g)]) = (softmaxes.get(&index), &gs[..]) {
            // The softmax's cotangent in terms of its result (see `softmax`).
            let ct = softmax::vjp(b, rs[0], *g, &sm.dims)?;
            accumulate(b, &mut adj, sm.input, ct)?;
            user.locate_from(b, first, inst.loc);
            continue;
        }
        let cts = match custom.iter().find(|(i, _)| *i == index) {
            Some((_, bwd)) => custom_cotangents(b, bwd, &xs, &rs, &gs)?,
            None => {
                rules::vjp_rule(b, &inst.op, &xs, &rs, &gs).map_err(|e| match (e, inst.loc) {
                    // Where the op came from, so that the user finds the line to change.
                    (Error::Unsupported(m), Some(loc)) => {
                        Error::Unsupported(format!("{m} (at {loc})"))
                    }
                    (e, _) => e,
                })?
            }
        };
        for (&o, ct) in inst.operands.iter().zip(cts) {
            if let Some(ct) = ct
                && f.values[o.index()].dtype.is_float()
            {
                accumulate(b, &mut adj, o, ct)?;
            }
        }
        // The derivative of the user's instruction is at the user's line.
        user.locate_from(b, first, inst.loc);
    }
    let outs = f.outputs.iter().map(|&o| val(o)).collect();
    let mut grads = Vec::with_capacity(wrt.len());
    for &i in wrt {
        let p = f.params[i];
        grads.push(match adj[p.index()] {
            Some(g) => g,
            None => b.full(&f.values[p.index()], 0.0)?,
        });
    }
    // What belongs to no instruction (the outputs' cotangents summed, zero gradients) is at
    // no line.
    user.locate_from(b, start, None);
    Ok((outs, grads))
}

/// The cotangents of a custom-rule barrier's operands: `bwd(xs, ys, ys_bar)` for the `xs`,
/// nothing for the `ys` (the function's own ops are not differentiated).
fn custom_cotangents(
    b: &mut Builder,
    bwd: &Func,
    xs: &[ValueId],
    rs: &[ValueId],
    gs: &[Option<ValueId>],
) -> Result<Vec<Option<ValueId>>> {
    let nx = bwd.outputs.len();
    let ny = xs.len() - nx;
    let mut args: Vec<ValueId> = xs.to_vec();
    for k in 0..ny {
        args.push(match gs[nx + k] {
            Some(g) => g,
            None => {
                let t = b.ty(rs[nx + k]).expect("defined").clone();
                b.full(&t, 0.0)?
            }
        });
    }
    let x_bar = b.inline(bwd, &args)?;
    Ok(x_bar
        .into_iter()
        .map(Some)
        .chain(std::iter::repeat_n(None, ny))
        .collect())
}

fn accumulate(b: &mut Builder, adj: &mut [Option<ValueId>], v: ValueId, ct: ValueId) -> Result<()> {
    adj[v.index()] = Some(match adj[v.index()] {
        None => ct,
        Some(prev) => b.binary(Op::Add {}, prev, ct)?,
    });
    Ok(())
}

/// The reverse mode of `f`: a function of `f`'s parameters followed by one cotangent per output
/// (same types as the outputs) that returns `f`'s outputs followed by the gradient of
/// `<cotangents, outputs>` with respect to each parameter listed in `wrt`.
pub fn vjp(f: &Func, wrt: &[usize]) -> Result<Func> {
    vjp_with_rules(f, wrt, &[])
}

/// [`vjp`] with custom rules (see [`vjp_into_with_rules`]).
pub fn vjp_with_rules(f: &Func, wrt: &[usize], rules: &[(usize, Func)]) -> Result<Func> {
    check_wrt(f, wrt)?;
    let mut b = Builder::new(&format!("{}_vjp", f.name));
    let args: Vec<ValueId> = f.param_types().into_iter().map(|t| b.param(t)).collect();
    let cts: Vec<Option<ValueId>> = f
        .output_types
        .iter()
        .map(|t| Some(b.param(t.clone())))
        .collect();
    let (outs, grads) = vjp_into_with_rules(&mut b, f, &args, &cts, wrt, rules)?;
    let all: Vec<ValueId> = outs.into_iter().chain(grads).collect();
    Ok(UserLines::of(f).keep_only(eliminate_dead_code(&b.finish(&all)?)))
}

fn scalar_output(f: &Func) -> Result<()> {
    match f.output_types.first() {
        Some(t) if t.rank() == 0 && t.dtype.is_float() => Ok(()),
        Some(t) => Err(Error::BadRequest(format!(
            "grad needs a float scalar first output, @{} returns {t}",
            f.name
        ))),
        None => Err(Error::BadRequest(format!(
            "grad needs a float scalar first output, @{} returns nothing",
            f.name
        ))),
    }
}

/// The gradient of `f`'s first output (a float scalar) with respect to the parameters in `wrt`:
/// a function of `f`'s parameters returning one gradient per entry of `wrt`.
pub fn grad(f: &Func, wrt: &[usize]) -> Result<Func> {
    let vg = value_and_grad(f, wrt, false)?;
    let n = 1;
    let outs: Vec<usize> = (n..vg.outputs.len()).collect();
    Ok(select_outputs(&vg, &outs, &format!("{}_grad", f.name)))
}

/// `f`'s first output (a float scalar) and its gradient with respect to the parameters in
/// `wrt`. With `has_aux`, `f`'s other outputs are auxiliary values returned after the value and
/// not differentiated; without it, `f` must have exactly one output.
/// Returns `(value, aux..., grads...)`.
pub fn value_and_grad(f: &Func, wrt: &[usize], has_aux: bool) -> Result<Func> {
    value_and_grad_with_rules(f, wrt, has_aux, &[])
}

/// [`value_and_grad`] with custom rules (see [`vjp_into_with_rules`]).
pub fn value_and_grad_with_rules(
    f: &Func,
    wrt: &[usize],
    has_aux: bool,
    rules: &[(usize, Func)],
) -> Result<Func> {
    check_wrt(f, wrt)?;
    scalar_output(f)?;
    if !has_aux && f.outputs.len() != 1 {
        return Err(Error::BadRequest(format!(
            "@{} has {} outputs; pass has_aux to return the others as auxiliary values",
            f.name,
            f.outputs.len()
        )));
    }
    let mut b = Builder::new(&format!("{}_value_and_grad", f.name));
    let args: Vec<ValueId> = f.param_types().into_iter().map(|t| b.param(t)).collect();
    let one = b.scalar(f.output_types[0].dtype, 1.0)?;
    let mut cts = vec![Some(one)];
    cts.extend(std::iter::repeat_n(None, f.outputs.len() - 1));
    let (outs, grads) = vjp_into_with_rules(&mut b, f, &args, &cts, wrt, rules)?;
    let all: Vec<ValueId> = outs.into_iter().chain(grads).collect();
    Ok(UserLines::of(f).keep_only(eliminate_dead_code(&b.finish(&all)?)))
}

/// The forward mode of `f`: a function of `f`'s parameters followed by one tangent per entry
/// of `wrt` that returns `f`'s outputs followed by their tangents (zeros for non-float outputs
/// are not returned: only float outputs get a tangent).
///
/// A function with a `while` loop or a `reduce_region`/`reduce_window_region` (at any depth)
/// is differentiated instruction by instruction (see [`forward`]): a loop carries its tangents
/// alongside, so its trip count may depend on the data, and a reduction reduces values and
/// tangents together through its body's forward mode. Any other is the reverse mode
/// transposed.
pub fn jvp(f: &Func, wrt: &[usize]) -> Result<Func> {
    check_wrt(f, wrt)?;
    if forward::differentiated_forward(f) {
        return forward::jvp(f, wrt);
    }
    jvp_transposed(f, wrt)
}

/// The forward mode as the reverse mode of the reverse mode.
fn jvp_transposed(f: &Func, wrt: &[usize]) -> Result<Func> {
    // V(x, u) = J(x)^T u is linear in u, so the VJP of V with respect to u, at any u, with
    // cotangent t, is J(x) t.
    let float_outs: Vec<usize> = (0..f.outputs.len())
        .filter(|&i| f.output_types[i].dtype.is_float())
        .collect();
    let f_float = select_outputs(f, &float_outs, &f.name);
    let v = vjp(&f_float, wrt)?;
    let v_grads = select_outputs(
        &v,
        &(f_float.outputs.len()..v.outputs.len()).collect::<Vec<_>>(),
        &format!("{}_vjp", f.name),
    );
    let u_params: Vec<usize> = (f.params.len()..v_grads.params.len()).collect();
    let mut b = Builder::new(&format!("{}_jvp", f.name));
    let args: Vec<ValueId> = f.param_types().into_iter().map(|t| b.param(t)).collect();
    let tangents: Vec<Option<ValueId>> = wrt
        .iter()
        .map(|&i| Some(b.param(f.values[f.params[i].index()].clone())))
        .collect();
    let outs = b.inline_at(f, &args, None)?;
    let mut v_args = args.clone();
    for &i in &float_outs {
        v_args.push(b.full(&f.output_types[i], 0.0)?);
    }
    let (_, dots) = vjp_into(&mut b, &v_grads, &v_args, &tangents, &u_params)?;
    let all: Vec<ValueId> = outs.into_iter().chain(dots).collect();
    Ok(UserLines::of(f).keep_only(eliminate_dead_code(&b.finish(&all)?)))
}

/// The same function returning only the outputs at `indices`.
pub fn select_outputs(f: &Func, indices: &[usize], name: &str) -> Func {
    let mut g = f.clone();
    g.name = name.to_string();
    g.outputs = indices.iter().map(|&i| f.outputs[i]).collect();
    g.output_types = indices.iter().map(|&i| f.output_types[i].clone()).collect();
    eliminate_dead_code(&g)
}

/// The error for a derivative whose path passes through complex numbers at `op` (`mode`:
/// "reverse" or "forward"): kiln's derivatives are real.
pub(crate) fn complex_path(op: &kiln_ir::Op, loc: Option<kiln_ir::Loc>, mode: &str) -> Error {
    let at = loc.map(|l| format!(" (at {l})")).unwrap_or_default();
    Error::Unsupported(format!(
        "`{}`{at}: the {mode}-mode derivative passes through complex numbers, which kiln's \
         derivatives do not carry yet (they are real); keep the differentiated path real, or \
         stop the gradient before the complex values",
        op.mnemonic()
    ))
}

/// Whether a dtype carries gradients.
pub fn is_differentiable_dtype(d: DType) -> bool {
    d.is_float()
}

/// How completely the reverse mode handles an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Every attribute combination the op allows.
    Full,
    /// Some combinations return [`Error::Unsupported`]; the text says which work.
    Partial(&'static str),
    /// The op is not differentiable.
    NotDifferentiable,
}

/// What the rule table covers for `k` (reported in `ir-specs/status.md`).
pub fn coverage(k: kiln_ir::OpKind) -> Coverage {
    use kiln_ir::OpKind;
    if k == OpKind::While {
        return Coverage::Partial(
            "a static trip count: a counter from a constant, stepped by a constant, compared `<` with a constant",
        );
    }
    if !k.props().contains(kiln_ir::Props::DIFFERENTIABLE) {
        return Coverage::NotDifferentiable;
    }
    match k {
        OpKind::Scatter => Coverage::Partial("kind add or replace"),
        OpKind::ReduceWindow => Coverage::Partial("kind add; max and min without dilation"),
        OpKind::SelectAndScatter => Coverage::Partial("kind add"),
        OpKind::AllReduce | OpKind::ReduceScatter | OpKind::CollectiveReduce => {
            Coverage::Partial("computation add")
        }
        _ => Coverage::Full,
    }
}

//! The IR behind the transforms, for dumps and snapshot tests, and a traced program run one op
//! at a time.

use crate::{Error, Result, Tensor, Tree};
use kiln_ir::{Func, Loc};

/// The traced IR of `f` at `x`'s signature.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, lower};
/// let ir = lower::trace_ir(|x: &Tensor| x.exp() * 2.0, &Tensor::ones(DType::F32, [3])).unwrap();
/// assert_eq!(ir.name, "main");
/// assert_eq!(ir.params.len(), 1);
/// assert_eq!(ir.output_types[0].to_string(), "f32[3]");
/// assert!(ir.to_string().contains("exponential"), "{ir}");
/// ```
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
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, lower};
/// let w = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let b = Tensor::from_vec(vec![3.0f32, 4.0], [2]).unwrap();
/// let ir = lower::grad_ir(|(w, b): &(Tensor, Tensor)| (w * b).sum_all(), &(w.clone(), b.clone()))
///     .unwrap();
/// let types: Vec<String> = ir.output_types.iter().map(|t| t.to_string()).collect();
/// assert_eq!(types, ["f32[]", "f32[2]", "f32[2]"]);
/// // Run it: the value 11, then d/dw = b and d/db = w.
/// let out = lower::run_op_by_op(&ir, &[&w, &b]).unwrap();
/// assert_eq!(out[0].item().unwrap(), 11.0);
/// assert_eq!(out[1].to_vec::<f32>().unwrap(), [3.0, 4.0]);
/// assert_eq!(out[2].to_vec::<f32>().unwrap(), [1.0, 2.0]);
/// ```
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

/// Runs `f` on `args` one instruction at a time, each as an eager op: what the same tensor
/// code does outside `jit`, with no whole-program compile, no fusion across ops and every
/// intermediate result written out. Its results are `f`'s, up to the rounding that fusion
/// changes; timing it against `jit` shows what compiling the whole program buys.
///
/// Arguments of the wrong number or types, and an op that fails, are errors naming
/// `run_op_by_op` and the caller's line.
///
/// ```
/// use kiln::{Tensor, jit, lower};
/// let f = |x: &Tensor| (&x.exp() * x).sum_all();
/// let x = Tensor::from_vec(vec![0.5f32, 1.0, 2.0], [3]).unwrap();
/// let program = lower::trace_ir(f, &x).unwrap();
/// let eager = lower::run_op_by_op(&program, &[&x]).unwrap();
/// let compiled = jit(f).call(&x).unwrap();
/// assert!((eager[0].item().unwrap() - compiled.item().unwrap()).abs() < 1e-5);
/// ```
#[track_caller]
pub fn run_op_by_op(f: &Func, args: &[&Tensor]) -> Result<Vec<Tensor>> {
    let loc = Loc::caller();
    let fail = |message: String| Error::at("run_op_by_op", message, loc);
    if let Some(e) = args.iter().find_map(|t| t.error()) {
        return Err(e.clone());
    }
    let want: Vec<_> = f
        .params
        .iter()
        .map(|p| f.values[p.index()].clone())
        .collect();
    let got: Vec<_> = args.iter().filter_map(|t| t.ty()).collect();
    if want != got {
        let show = |ts: &[kiln_ir::TensorType]| {
            ts.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(fail(format!(
            "@{} takes ({}), got ({})",
            f.name,
            show(&want),
            show(&got)
        )));
    }
    let mut values: Vec<Option<Tensor>> = vec![None; f.values.len()];
    for (p, a) in f.params.iter().zip(args) {
        values[p.index()] = Some((*a).clone());
    }
    let get = |values: &[Option<Tensor>], v: kiln_ir::ValueId| {
        values[v.index()]
            .clone()
            .ok_or_else(|| fail(format!("@{}: {v:?} is used before it is defined", f.name)))
    };
    for inst in &f.insts {
        let xs = inst
            .operands
            .iter()
            .map(|&v| get(&values, v))
            .collect::<Result<Vec<Tensor>>>()?;
        let refs: Vec<&Tensor> = xs.iter().collect();
        let declared = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let outs =
            kiln_trace::trace::apply(inst.op.clone(), &refs, Some(declared), "run_op_by_op", loc);
        if let Some(e) = outs.iter().find_map(|t| t.error()) {
            return Err(e.clone());
        }
        for (r, o) in inst.results.iter().zip(outs) {
            values[r.index()] = Some(o);
        }
    }
    f.outputs.iter().map(|&v| get(&values, v)).collect()
}

//! Trace frames: while a function is traced, operations on its tensors record instructions.
//!
//! Frames nest (a function traced inside another's trace). A tensor of an outer frame used in
//! an inner one becomes a capture: an extra parameter of the inner function, fed the outer
//! value when the inner function is applied. An eager tensor used in a trace becomes a constant,
//! except that in a frame traced by [`trace_hoisting`] one of more than [`HOIST_ELEMENTS`]
//! element (a batch of data or labels, say) becomes a capture too: the program's text stays
//! small and shape-keyed, so the next batch of the same shape reuses the compiled function.

use crate::tensor::{Device, Repr, Tensor};
use crate::{Error, Result};
use kiln_ir::{Builder, Func, Inst, Loc, Op, TensorType, ValueId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

struct Frame {
    id: u64,
    b: Builder,
    error: Option<Error>,
    captures: Vec<Tensor>,
    /// Custom differentiation rules: instruction index -> backward function.
    custom: Vec<(usize, Func)>,
    /// Names given to values by [`tag`], with the values' ids in this frame's builder.
    tags: Vec<(ValueId, String)>,
    /// Values already made for eager constants and captures, by tensor identity; the tensor is
    /// kept so its identity cannot be reused while the frame lives.
    known: HashMap<usize, (Tensor, ValueId)>,
    /// Whether large eager tensors become captures rather than constants.
    hoist: bool,
}

/// Eager tensors with more elements than this become captures in a hoisting frame: every
/// tensor but a scalar. A batch's labels (a few hundred integers) closed over by a gradient
/// taken outside `jit` are data like any other: as constants, each new batch would be a new
/// program, compiled again. Scalars stay constants, which the optimizer folds.
pub const HOIST_ELEMENTS: usize = 1;

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

static NEXT_FRAME: AtomicU64 = AtomicU64::new(1);

/// Pops the frame even if the traced function panics.
struct FrameGuard;

impl Drop for FrameGuard {
    fn drop(&mut self) {
        FRAMES.with(|f| f.borrow_mut().pop());
    }
}

/// A traced function: the IR, and the outer tensors its trailing capture parameters stand for.
pub struct Traced {
    /// The function: the declared parameters, then one parameter per capture.
    pub func: Func,
    /// The tensors to pass for the capture parameters.
    pub captures: Vec<Tensor>,
    /// Custom VJP rules recorded by [`custom_rule`]: for the `optimization_barrier`
    /// instruction at each index, the backward function to use instead of differentiating.
    pub custom: Vec<(usize, Func)>,
    /// Names given to values of the function by [`tag`] while it was traced.
    pub tags: Vec<(ValueId, String)>,
}

/// Traces `f` on fresh symbolic parameters of the given types. Returns the function with
/// `f`'s results as outputs, or the first error any traced operation reported.
///
/// # Examples
///
/// ```
/// use kiln_trace::trace::trace;
/// use kiln_ir::{DType, TensorType};
/// let t = trace("double", &[TensorType::new(DType::F32, [2])], |p| vec![&p[0] * 2.0]).unwrap();
/// assert_eq!((t.func.params.len(), t.func.outputs.len()), (1, 1));
/// assert!(t.captures.is_empty());
/// // An error inside the traced function is the trace's error.
/// let bad = trace("bad", &[TensorType::new(DType::F32, [2])], |p| vec![p[0].squeeze(0)]);
/// assert!(bad.is_err());
/// ```
pub fn trace(
    name: &str,
    params: &[TensorType],
    f: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> Result<Traced> {
    trace_frame(name, params, false, f)
}

/// [`trace`], where eager tensors of more than [`HOIST_ELEMENTS`] elements that `f` uses
/// become captures (parameters fed their values when the function is applied) instead of
/// constants: what `jit` and the transforms use, so data closed over by the traced function is
/// neither printed into the program nor compiled into it.
pub fn trace_hoisting(
    name: &str,
    params: &[TensorType],
    f: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> Result<Traced> {
    trace_frame(name, params, true, f)
}

fn trace_frame(
    name: &str,
    params: &[TensorType],
    hoist: bool,
    f: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> Result<Traced> {
    let id = NEXT_FRAME.fetch_add(1, Ordering::Relaxed);
    let mut b = Builder::new(name);
    let args: Vec<Tensor> = params
        .iter()
        .map(|t| {
            let v = b.param(t.clone());
            Tensor::from_repr(Repr::Traced {
                frame: id,
                value: v,
                ty: t.clone(),
            })
        })
        .collect();
    FRAMES.with(|fr| {
        fr.borrow_mut().push(Frame {
            id,
            b,
            error: None,
            captures: Vec::new(),
            custom: Vec::new(),
            known: HashMap::new(),
            hoist,
            tags: Vec::new(),
        })
    });
    let guard = FrameGuard;
    let outs = f(&args);
    // Outputs: lift each into this frame, as any operand would be.
    let out_vals: Vec<Result<ValueId>> = outs
        .iter()
        .map(|t| with_frame(|fr, live| value_in(fr, live, t)))
        .collect();
    let frame = FRAMES
        .with(|fr| fr.borrow_mut().pop())
        .expect("the frame pushed above");
    std::mem::forget(guard);
    if let Some(e) = frame.error {
        return Err(e);
    }
    let out_vals = out_vals.into_iter().collect::<Result<Vec<_>>>()?;
    // The function's values are renumbered in definition order (parameters, captures among
    // them, first): map the tags' ids the same way.
    let tags = {
        let built = frame.b.func();
        let mut order = vec![None; built.values.len()];
        let defined = built
            .params
            .iter()
            .chain(built.insts.iter().flat_map(|i| i.results.iter()));
        for (k, &v) in defined.enumerate() {
            order[v.index()] = Some(ValueId(k as u32));
        }
        frame
            .tags
            .iter()
            .filter_map(|(v, n)| order[v.index()].map(|v| (v, n.clone())))
            .collect()
    };
    let func = frame
        .b
        .finish(&out_vals)
        .map_err(|e| Error::internal("trace", e.to_string()))?;
    Ok(Traced {
        func,
        captures: frame.captures,
        custom: frame.custom,
        tags,
    })
}

/// Runs `f` on the innermost frame, with the ids of every live frame.
fn with_frame<T>(f: impl FnOnce(&mut Frame, &[u64]) -> T) -> T {
    FRAMES.with(|fr| {
        let live: Vec<u64> = fr.borrow().iter().map(|f| f.id).collect();
        f(
            fr.borrow_mut().last_mut().expect("called inside a trace"),
            &live,
        )
    })
}

/// Inside a trace, the traced form of an eager tensor (a constant of the innermost frame), so
/// that what follows (a broadcast, say) is recorded rather than computed on the constant.
/// Other tensors are returned unchanged.
pub fn lift(t: &Tensor) -> Tensor {
    if !matches!(t.repr(), Repr::Eager(_) | Repr::View(_) | Repr::Device(_)) || !tracing() {
        return t.clone();
    }
    let ty = t.ty().expect("a value");
    with_frame(|fr, live| match value_in(fr, live, t) {
        Ok(value) => Tensor::from_repr(Repr::Traced {
            frame: fr.id,
            value,
            ty,
        }),
        Err(e) => Tensor::failed(e),
    })
}

/// Lifts every operand when any of them is traced (see [`lift`]). Outside a trace, when one
/// operand is on a device, the one-element host operands (a scalar like `2.0` in `&x * 2.0`)
/// are moved to that device, so that what follows (their broadcast) runs there.
#[track_caller]
pub fn lift_all(xs: &[&Tensor]) -> Vec<Tensor> {
    if xs.iter().any(|t| t.is_traced()) {
        xs.iter().map(|t| lift(t)).collect()
    } else if let Some(d) = xs.iter().map(|t| t.device()).find(|&d| d != Device::Cpu) {
        xs.iter()
            .map(|t| match t.ty() {
                Some(ty) if t.device() == Device::Cpu && ty.numel() == 1 => {
                    crate::device::move_to(t, d, Loc::caller())
                }
                _ => (*t).clone(),
            })
            .collect()
    } else {
        xs.iter().map(|t| (*t).clone()).collect()
    }
}

/// Names `t`'s value `name` in the innermost trace (see [`Traced::tags`]); outside a trace,
/// or for a tensor that is not traced, does nothing.
pub fn tag(t: &Tensor, name: &str) {
    if !tracing() || !t.is_traced() {
        return;
    }
    with_frame(|fr, live| {
        if let Ok(v) = value_in(fr, live, t) {
            fr.tags.push((v, name.to_string()));
        }
    });
}

/// Whether any trace is active on this thread.
///
/// # Examples
///
/// ```
/// use kiln_trace::trace::{trace, tracing};
/// use kiln_ir::{DType, TensorType};
/// assert!(!tracing());
/// trace("f", &[TensorType::new(DType::F32, [])], |p| {
///     assert!(tracing());
///     vec![p[0].clone()]
/// })
/// .unwrap();
/// ```
pub fn tracing() -> bool {
    FRAMES.with(|fr| !fr.borrow().is_empty())
}

/// The value standing for `t` in frame `fr`: its own value, a new constant for an eager
/// tensor, or a capture parameter for a tensor of an outer frame.
fn value_in(fr: &mut Frame, live: &[u64], t: &Tensor) -> Result<ValueId> {
    let key = t.identity();
    match t.repr() {
        Repr::Failed(e) => Err(e.clone()),
        Repr::Traced { frame, value, .. } if *frame == fr.id => Ok(*value),
        Repr::Traced { frame, ty, .. } => {
            if let Some((_, v)) = fr.known.get(&key) {
                return Ok(*v);
            }
            if !live.contains(frame) {
                return Err(Error::internal(
                    "trace",
                    format!(
                        "a traced {ty} tensor was used after its trace ended (it escaped the traced function)"
                    ),
                ));
            }
            let v = fr.b.param(ty.clone());
            fr.captures.push(t.clone());
            fr.known.insert(key, (t.clone(), v));
            Ok(v)
        }
        Repr::Eager(_) | Repr::View(_) | Repr::Device(_) => {
            if let Some((_, v)) = fr.known.get(&key) {
                return Ok(*v);
            }
            let ty = t.ty().expect("a value");
            if fr.hoist && ty.numel() > HOIST_ELEMENTS {
                let v = fr.b.param(ty);
                fr.captures.push(t.clone());
                fr.known.insert(key, (t.clone(), v));
                return Ok(v);
            }
            // A device tensor closed over by a traced function becomes a constant: its value
            // is read back once, when the function is traced.
            let lit = t.to_literal()?;
            let v =
                fr.b.push(Op::Constant { value: lit }, &[])
                    .map_err(|e| Error::internal("constant", e.to_string()))?[0];
            fr.known.insert(key, (t.clone(), v));
            Ok(v)
        }
    }
}

/// Adds instructions to the innermost trace: `emit` receives the builder and the values standing
/// for `xs`, and returns new values, which become traced tensors. On an error every one of the
/// `n` results is a failed tensor, and the trace keeps the first error.
fn record(
    xs: &[&Tensor],
    n: usize,
    emit: impl FnOnce(&mut Builder, &[ValueId]) -> Result<Vec<ValueId>>,
) -> Vec<Tensor> {
    with_frame(|fr, live| {
        let res = xs
            .iter()
            .map(|t| value_in(fr, live, t))
            .collect::<Result<Vec<_>>>()
            .and_then(|vals| emit(&mut fr.b, &vals));
        match res {
            Ok(rs) => rs
                .into_iter()
                .map(|v| {
                    let ty = fr.b.ty(v).expect("just defined").clone();
                    Tensor::from_repr(Repr::Traced {
                        frame: fr.id,
                        value: v,
                        ty,
                    })
                })
                .collect(),
            Err(e) => {
                fr.error.get_or_insert(e.clone());
                vec![Tensor::failed(e); n]
            }
        }
    })
}

/// Applies `op` to tensors: records it when tracing, runs it otherwise. `declared` gives the
/// result types of ops that need them. Errors become failed tensors carrying `user_op` and
/// `loc`; in a trace the first error is also kept for the trace's result.
pub fn apply(
    op: Op,
    xs: &[&Tensor],
    declared: Option<Vec<TensorType>>,
    user_op: &str,
    loc: Loc,
) -> Vec<Tensor> {
    let n = op.result_count(xs.len());
    if let Some(e) = xs.iter().find_map(|t| t.error()) {
        return vec![Tensor::failed(e.clone()); n];
    }
    let (user_op, loc) = crate::composite::naming(user_op, loc);
    let fail = |message: String| Error {
        op: user_op.clone(),
        message,
        loc: Some(loc),
    };
    // An op without operands (an iota) belongs to the innermost trace, if any.
    let traced = (xs.is_empty() || xs.iter().any(|t| t.is_traced())) && tracing();
    if xs.iter().any(|t| t.is_traced()) && !traced {
        return vec![
            Tensor::failed(fail(
                "a traced tensor was used after its trace ended (it escaped the traced function)"
                    .into()
            ));
            n
        ];
    }
    if traced {
        return record(xs, n, |b, vals| {
            b.push_at(op, vals, declared.as_deref(), loc)
                .map_err(|e| fail(format!("{}: {}", e.diag.label, e.diag.message)))
        });
    }
    // Eager: type-check with the user's location, then make a view of the operand's storage
    // (a data movement), or run the one-op function.
    let owned: Vec<TensorType> = xs
        .iter()
        .map(|t| t.ty().expect("eager and not failed"))
        .collect();
    let tys: Vec<&TensorType> = owned.iter().collect();
    let types = match kiln_ir::type_rule(&op, &tys, declared.as_deref()) {
        Ok(t) => t,
        Err(d) => return vec![Tensor::failed(fail(format!("{}: {}", d.label, d.message))); n],
    };
    // On a device: the op as the backend's one-op program, run there.
    if xs.iter().any(|t| t.device() != Device::Cpu) {
        let device = match crate::device::common_device(xs, true, &user_op, "operand", loc) {
            Ok(d) => d,
            Err(e) => return vec![Tensor::failed(e); n],
        };
        let f = one_op_func(op, &tys, types);
        if let Err(e) = kiln_ir::verify(&f) {
            return vec![Tensor::failed(fail(e.to_string())); n];
        }
        return crate::device::run_on_device(&f, xs, device, &user_op, loc);
    }
    if let ([x], [ty]) = (xs, &types[..])
        && let Some(v) = crate::view::view_op(&op, x, ty)
    {
        return vec![v];
    }
    // An elementwise op reads the operands that are one value broadcast (`x * 2.0`) as that
    // value, never gathering them into buffers of the result's size.
    if let Some(l) = crate::eager::with_single_values(&op, xs, &types) {
        return vec![Tensor::new(l)];
    }
    let lits: Vec<&kiln_ir::Literal> = xs
        .iter()
        .map(|t| t.literal().expect("eager and not failed"))
        .collect();
    match run_op(op, &lits, types) {
        Ok(outs) => outs.into_iter().map(Tensor::new).collect(),
        Err(e) => vec![
            Tensor::failed(Error {
                loc: Some(loc),
                ..e
            });
            n
        ],
    }
}

/// The one-op function `eager_<op>` an eager op runs as: parameters of `operands`' types,
/// results of `types`.
pub(crate) fn one_op_func(op: Op, operands: &[&TensorType], types: Vec<TensorType>) -> Func {
    let values: Vec<TensorType> = operands
        .iter()
        .map(|&t| t.clone())
        .chain(types.iter().cloned())
        .collect();
    let n = operands.len();
    let results: Vec<ValueId> = (n..n + types.len()).map(|i| ValueId(i as u32)).collect();
    Func {
        name: format!("eager_{}", op.mnemonic()),
        params: (0..n).map(|i| ValueId(i as u32)).collect(),
        insts: vec![Inst {
            op,
            operands: (0..n).map(|i| ValueId(i as u32)).collect(),
            results: results.clone(),
            loc: None,
        }],
        outputs: results,
        output_types: types,
        values,
    }
}

fn run_op(
    op: Op,
    lits: &[&kiln_ir::Literal],
    types: Vec<TensorType>,
) -> Result<Vec<kiln_ir::Literal>> {
    let tys: Vec<&TensorType> = lits.iter().map(|l| l.ty()).collect();
    let f = one_op_func(op, &tys, types);
    kiln_ir::verify(&f).map_err(|e| Error::internal("run", e.to_string()))?;
    // Most ops run as native loops, with the reference's bits (`eager`), whatever their size.
    // A large op whose compiled kernel is much faster runs natively the first time only; used
    // again, it is compiled (once). Other small ops run faster interpreted than compiled (an
    // LLVM compile costs milliseconds); both agree, as the differential tests check.
    let elements: usize = f.values.iter().map(|t| t.numel()).sum();
    let large = elements >= EAGER_COMPILE_THRESHOLD;
    let op = &f.insts[0].op;
    // A sort by keys runs natively; a large one is compiled (a radix sort), used again or not.
    if !large && let Some(ls) = crate::eager::sort(op, lits) {
        return Ok(ls);
    }
    if (!large || !crate::eager::compiles_when_reused(op) || crate::eager::first_use(&f))
        && let Some(l) = crate::eager::native(op, lits, &f.output_types)
    {
        return Ok(vec![l]);
    }
    if !large {
        return Ok(kiln_reference::eval_op(op, lits, &f.output_types));
    }
    let exe = crate::backend::compile_cached(&f)?;
    exe.run(lits)
}

/// Eager ops touching fewer elements than this are interpreted instead of compiled when they
/// have no native loop.
pub const EAGER_COMPILE_THRESHOLD: usize = 1 << 16;

/// Marks `ys = f(xs)` as having the custom backward function `bwd` (parameters `xs`, `ys`, then
/// one cotangent per `y`; results: one cotangent per `x`). Records
/// `optimization_barrier(xs..., ys...)` in the innermost trace and returns the barrier's `ys`,
/// which the caller uses in place of `ys`; autodiff applies `bwd` at that instruction instead of
/// differentiating `f`. Outside a trace the `ys` are returned unchanged.
pub fn custom_rule(xs: &[Tensor], ys: &[Tensor], bwd: Func, loc: Loc) -> Vec<Tensor> {
    if !tracing() || !xs.iter().chain(ys).any(|t| t.is_traced()) {
        return ys.to_vec();
    }
    with_frame(|fr, live| {
        let vals: Result<Vec<ValueId>> =
            xs.iter().chain(ys).map(|t| value_in(fr, live, t)).collect();
        let res = vals.and_then(|vals| {
            fr.b.push_at(Op::OptimizationBarrier {}, &vals, None, loc)
                .map_err(|e| Error {
                    op: "custom_vjp".into(),
                    message: e.to_string(),
                    loc: Some(loc),
                })
        });
        match res {
            Ok(rs) => {
                fr.custom.push((fr.b.func().insts.len() - 1, bwd));
                rs[xs.len()..]
                    .iter()
                    .map(|&v| {
                        let ty = fr.b.ty(v).expect("just defined").clone();
                        Tensor::from_repr(Repr::Traced {
                            frame: fr.id,
                            value: v,
                            ty,
                        })
                    })
                    .collect()
            }
            Err(e) => {
                fr.error.get_or_insert(e.clone());
                vec![Tensor::failed(e); ys.len()]
            }
        }
    })
}

/// Applies a function to tensors: inlines it when tracing, compiles and runs it otherwise.
pub fn call(f: &Func, args: &[&Tensor], user_op: &str, loc: Loc) -> Vec<Tensor> {
    call_text(f, None, args, user_op, loc)
}

/// [`call`] for `f` whose text ([`kiln_ir::print_func`]) is `text`: run on values, it is
/// compiled (or found compiled) under that text, not printed again (see
/// [`crate::backend::compile_cached_text`]).
pub fn call_printed(
    f: &Func,
    text: &str,
    args: &[&Tensor],
    user_op: &str,
    loc: Loc,
) -> Vec<Tensor> {
    call_text(f, Some(text), args, user_op, loc)
}

fn call_text(
    f: &Func,
    text: Option<&str>,
    args: &[&Tensor],
    user_op: &str,
    loc: Loc,
) -> Vec<Tensor> {
    let n = f.outputs.len();
    if let Some(e) = args.iter().find_map(|t| t.error()) {
        return vec![Tensor::failed(e.clone()); n];
    }
    let fail = |message: String| Error {
        op: user_op.to_string(),
        message,
        loc: Some(loc),
    };
    if args.iter().any(|t| t.is_traced()) && tracing() {
        return record(args, n, |b, vals| {
            b.inline(f, vals).map_err(|e| fail(e.to_string()))
        });
    }
    if args.iter().any(|t| t.device() != Device::Cpu) {
        return match crate::device::common_device(args, true, user_op, "argument", loc) {
            Ok(device) => crate::device::run_on_device(f, args, device, user_op, loc),
            Err(e) => vec![Tensor::failed(e); n],
        };
    }
    let lits: Vec<&kiln_ir::Literal> = match args
        .iter()
        .map(|t| {
            t.literal()
                .ok_or_else(|| fail("a traced tensor was used after its trace ended".into()))
        })
        .collect()
    {
        Ok(l) => l,
        Err(e) => return vec![Tensor::failed(e); n],
    };
    let exe = match text {
        Some(t) => crate::backend::compile_cached_text(f, t, &[], &crate::backend::options()),
        None => crate::backend::compile_cached(f),
    };
    let run = exe.and_then(|exe| exe.run(&lits));
    match run {
        Ok(outs) => outs.into_iter().map(Tensor::new).collect(),
        Err(e) => vec![
            Tensor::failed(Error {
                loc: Some(loc),
                ..e
            });
            n
        ],
    }
}

pub(crate) fn arc_identity<T>(a: &Arc<T>) -> usize {
    Arc::as_ptr(a) as *const u8 as usize
}

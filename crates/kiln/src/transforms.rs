//! `jit`, `grad`, `value_and_grad`, `vjp` and `jvp` over functions of parameter trees.
//!
//! Each transform traces the user's function to IR, transforms the IR (autodiff is an
//! IR-to-IR transform), and applies the result: it runs when the arguments hold values and is
//! inlined when they are themselves traced, so transforms compose (`grad(grad(f))`,
//! `jit(|p| grad(loss)(p))`).

use crate::backend::{Executable, Options, compile_cached_with, compile_uncached, options};
use crate::transformed::Derived;
use crate::{Device, Error, Result, Tensor, Tree};
use kiln_ir::{Func, Loc};
use kiln_trace::DeviceArg;
use kiln_trace::trace::{call, trace};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn leaves_of<T: Tree>(x: &T, op: &str, loc: Loc) -> Result<Vec<Tensor>> {
    let leaves: Vec<Tensor> = x.leaf_vec().into_iter().cloned().collect();
    if let Some(e) = leaves.iter().find_map(|t| t.error()) {
        return Err(e.clone());
    }
    if leaves.is_empty() {
        return Err(Error {
            op: op.into(),
            message: "the argument has no tensor leaves".into(),
            loc: Some(loc),
        });
    }
    Ok(leaves)
}

/// Traces `f` on symbolic copies of `x`'s leaves; returns the function, its captures and the
/// output template `f` returned. With `hoist`, large eager tensors `f` closes over (its data)
/// become captures, passed when the function is applied, instead of constants: the
/// transforms apply their function at once, and a program keyed by its text then compiles
/// once per shape, not once per batch of data.
fn trace_tree<I: Tree, O: Tree>(
    name: &str,
    x: &I,
    f: impl FnOnce(&I) -> O,
    loc: Loc,
    hoist: bool,
) -> Result<(kiln_trace::trace::Traced, O)> {
    crate::backend::install();
    let leaves = leaves_of(x, name, loc)?;
    let types: Vec<_> = leaves.iter().map(|t| t.ty().expect("not failed")).collect();
    let mut template = None;
    let body = |params: &[Tensor]| {
        let out = f(&x.with_leaves(params));
        let outs = out.leaf_vec().into_iter().cloned().collect();
        template = Some(out);
        outs
    };
    let traced = if hoist {
        kiln_trace::trace::trace_hoisting(name, &types, body)?
    } else {
        trace(name, &types, body)?
    };
    Ok((traced, template.expect("the traced closure ran")))
}

fn ad_error(op: &str, e: kiln_autodiff::Error, loc: Loc) -> Error {
    Error {
        op: op.into(),
        message: e.to_string(),
        loc: Some(loc),
    }
}

/// Applies a function (`run`: a derived one, or the traced one itself) to `x`'s leaves and
/// the captures.
fn apply_transformed(
    run: impl FnOnce(&[&Tensor]) -> Vec<Tensor>,
    leaves: &[Tensor],
    captures: &[Tensor],
) -> Result<Vec<Tensor>> {
    let args: Vec<&Tensor> = leaves.iter().chain(captures).collect();
    let outs = run(&args);
    if let Some(e) = outs.iter().find_map(|t| t.error()) {
        return Err(e.clone());
    }
    Ok(outs)
}

/// `f`'s value and its gradient with respect to every leaf of `x` (which must be floats);
/// `f` returns a scalar and auxiliary outputs.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, value_and_grad_with_aux};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// // The loss x·x, with 2x kept aside as an auxiliary output.
/// let ((loss, twice), g) =
///     value_and_grad_with_aux(|x: &Tensor| ((x * x).sum_all(), x * 2.0), &x).unwrap();
/// assert_eq!(loss.item().unwrap(), 5.0);
/// assert_eq!(twice.to_vec::<f32>().unwrap(), [2.0, 4.0]);
/// assert_eq!(g.to_vec::<f32>().unwrap(), [2.0, 4.0]);
/// ```
#[track_caller]
pub fn value_and_grad_with_aux<I: Tree, A: Tree>(
    f: impl Fn(&I) -> (Tensor, A),
    x: &I,
) -> Result<((Tensor, A), I)> {
    value_and_grad_at(f, x, Loc::caller())
}

fn value_and_grad_at<I: Tree, A: Tree>(
    f: impl Fn(&I) -> (Tensor, A),
    x: &I,
    loc: Loc,
) -> Result<((Tensor, A), I)> {
    let leaves = leaves_of(x, "grad", loc)?;
    let (traced, (_, aux_t)) = trace_tree(
        "f",
        x,
        |i| {
            let (v, a) = f(i);
            (v, a)
        },
        loc,
        true,
    )?;
    let wrt: Vec<usize> = (0..leaves.len()).collect();
    let key = crate::transformed::key(
        &format!("value_and_grad of {wrt:?}"),
        &traced.func,
        &traced.custom,
    );
    let g = crate::transformed::derived(key, || {
        kiln_autodiff::value_and_grad_with_rules(&traced.func, &wrt, true, &traced.custom)
    })
    .map_err(|e| ad_error("grad", e, loc))?;
    let outs = apply_transformed(|a| g.call(a, "grad", loc), &leaves, &traced.captures)?;
    let n_aux = aux_t.leaf_vec().len();
    let value = outs[0].clone();
    let aux = aux_t.with_leaves(&outs[1..1 + n_aux]);
    let grads = x.with_leaves(&outs[1 + n_aux..]);
    Ok(((value, aux), grads))
}

/// `f`'s value (a float scalar) and its gradient with respect to every leaf of `x`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, value_and_grad};
/// let p = (Tensor::scalar(3.0f32), Tensor::scalar(2.0f32));
/// // d(a b²)/da = b², d(a b²)/db = 2 a b
/// let (v, (da, db)) = value_and_grad(|(a, b): &(Tensor, Tensor)| a * b * b, &p).unwrap();
/// assert_eq!(v.item().unwrap(), 12.0);
/// assert_eq!((da.item().unwrap(), db.item().unwrap()), (4.0, 12.0));
/// ```
#[track_caller]
pub fn value_and_grad<I: Tree>(f: impl Fn(&I) -> Tensor, x: &I) -> Result<(Tensor, I)> {
    let ((v, ()), g) = value_and_grad_with_aux(|i| (f(i), ()), x)?;
    Ok((v, g))
}

/// The gradient of `f` (returning a float scalar) at `x`, as a tree like `x`. When `x` is
/// traced (inside `jit` or another `grad`), the gradient computation is recorded instead, so
/// `grad` composes with itself and with `jit`. Errors become failed leaves.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, grad};
/// let f = |x: &Tensor| (x * x * x).sum_all(); // d/dx x³ = 3x²
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// assert_eq!(grad(f)(&x).to_vec::<f32>().unwrap(), [3.0, 12.0]);
/// // Second derivative: 6x.
/// let d2 = grad(|x: &Tensor| grad(f)(x).sum_all())(&x);
/// assert_eq!(d2.to_vec::<f32>().unwrap(), [6.0, 12.0]);
/// ```
#[track_caller]
pub fn grad<I: Tree>(f: impl Fn(&I) -> Tensor) -> impl Fn(&I) -> I {
    let loc = Loc::caller();
    move |x: &I| match value_and_grad_at(|i| (f(i), ()), x, loc) {
        Ok((_, g)) => g,
        Err(e) => x.map_leaves(&mut |_| {
            Tensor::failed(Error {
                loc: e.loc.or(Some(loc)),
                ..e.clone()
            })
        }),
    }
}

/// Reverse mode: `f`'s outputs at `x` and a [`Pullback`] mapping output cotangents (a tree
/// like the outputs) to input cotangents (a tree like `x`), as JAX's `vjp`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, vjp};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let (y, pullback) = vjp(|x: &Tensor| x * x, &x).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 4.0]);
/// let ct = Tensor::from_vec(vec![1.0f32, 10.0], [2]).unwrap();
/// assert_eq!(pullback.call(&ct).unwrap().to_vec::<f32>().unwrap(), [2.0, 40.0]);
/// ```
#[track_caller]
pub fn vjp<I: Tree, O: Tree>(f: impl Fn(&I) -> O, x: &I) -> Result<(O, Pullback<I, O>)> {
    let loc = Loc::caller();
    let leaves = leaves_of(x, "vjp", loc)?;
    let (traced, out_t) = trace_tree("f", x, f, loc, true)?;
    let wrt: Vec<usize> = (0..leaves.len()).collect();
    let key = crate::transformed::key(&format!("vjp of {wrt:?}"), &traced.func, &traced.custom);
    let v = crate::transformed::derived(key, || {
        kiln_autodiff::vjp_with_rules(&traced.func, &wrt, &traced.custom)
    })
    .map_err(|e| ad_error("vjp", e, loc))?;
    let run = |a: &[&Tensor]| call(&traced.func, a, "vjp", loc);
    let outs = apply_transformed(run, &leaves, &traced.captures)?;
    let primal = out_t.with_leaves(&outs);
    let pullback = Pullback {
        func: v,
        leaves: leaves.clone(),
        captures: traced.captures.clone(),
        x: x.with_leaves(&leaves),
        out: out_t.with_leaves(&outs),
    };
    Ok((primal, pullback))
}

/// The pullback [`vjp`] returns: [`Pullback::call`] maps output cotangents to input
/// cotangents, as often as wanted.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, vjp};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// let (y, pullback) = vjp(|x: &Tensor| (x * x).sum_all(), &x).unwrap();
/// assert_eq!(y.item().unwrap(), 14.0);
/// // The same pullback for two output cotangents: 2 x times each.
/// let g1 = pullback.call(&Tensor::scalar(1.0f32)).unwrap();
/// let g2 = pullback.call(&Tensor::scalar(0.5f32)).unwrap();
/// assert_eq!(g1.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
/// assert_eq!(g2.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
/// ```
pub struct Pullback<I, O> {
    /// The VJP function: the traced function's parameters (leaves, captures), then one
    /// cotangent per output; its results: the outputs, then one cotangent per leaf.
    func: Arc<Derived>,
    leaves: Vec<Tensor>,
    captures: Vec<Tensor>,
    x: I,
    out: O,
}

impl<I: Tree, O: Tree> Pullback<I, O> {
    /// The input cotangents (a tree like `x`) for output cotangents `ct` (a tree like the
    /// outputs, each leaf of its output's type). A mismatched cotangent is an error naming
    /// this call's line.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, vjp};
    /// let x = (Tensor::scalar(3.0f32), Tensor::scalar(4.0f32));
    /// let (_, pullback) = vjp(|(a, b): &(Tensor, Tensor)| a * b, &x).unwrap();
    /// let (da, db) = pullback.call(&Tensor::scalar(2.0f32)).unwrap();
    /// assert_eq!((da.item().unwrap(), db.item().unwrap()), (8.0, 6.0));
    /// // A cotangent of another type than the output's (f32[]) is an error.
    /// let err = pullback.call(&Tensor::scalar(2.0f64)).unwrap_err();
    /// assert_eq!(err.op, "pullback");
    /// assert!(err.message.contains("does not match"), "{err}");
    /// ```
    #[track_caller]
    pub fn call(&self, ct: &O) -> Result<I> {
        let loc = Loc::caller();
        let cts: Vec<Tensor> = ct.leaf_vec().into_iter().cloned().collect();
        let outs = self.out.leaf_vec();
        let matches =
            cts.len() == outs.len() && cts.iter().zip(&outs).all(|(c, o)| c.ty() == o.ty());
        if let Some(e) = cts.iter().find_map(|t| t.error()) {
            return Err(e.clone());
        }
        if !matches {
            return Err(Error {
                op: "pullback".into(),
                message: format!(
                    "the cotangent {} does not match the output {}",
                    ct.describe(),
                    self.out.describe()
                ),
                loc: Some(loc),
            });
        }
        let mut args: Vec<Tensor> = self.leaves.clone();
        args.extend(self.captures.iter().cloned());
        args.extend(cts);
        let refs: Vec<&Tensor> = args.iter().collect();
        let res = self.func.call(&refs, "pullback", loc);
        if let Some(e) = res.iter().find_map(|t| t.error()) {
            return Err(e.clone());
        }
        Ok(self.x.with_leaves(&res[outs.len()..]))
    }
}

/// Forward mode: `f`'s outputs at `x` and their derivative in the direction `t` (a tree like
/// `x`). Outputs must be float tensors.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, jvp};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let t = Tensor::from_vec(vec![1.0f32, 0.5], [2]).unwrap();
/// let (y, dy) = jvp(|x: &Tensor| x * x, &x, &t).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), [1.0, 4.0]);
/// assert_eq!(dy.to_vec::<f32>().unwrap(), [2.0, 2.0]); // 2 x t
/// ```
#[track_caller]
pub fn jvp<I: Tree, O: Tree>(f: impl Fn(&I) -> O, x: &I, t: &I) -> Result<(O, O)> {
    let loc = Loc::caller();
    let leaves = leaves_of(x, "jvp", loc)?;
    let tangents: Vec<Tensor> = t.leaf_vec().into_iter().cloned().collect();
    if tangents.len() != leaves.len() || tangents.iter().zip(&leaves).any(|(a, b)| a.ty() != b.ty())
    {
        return Err(Error {
            op: "jvp".into(),
            message: format!(
                "the tangent {} does not match the primal {}",
                t.describe(),
                x.describe()
            ),
            loc: Some(loc),
        });
    }
    let (traced, out_t) = trace_tree("f", x, f, loc, true)?;
    if let Some(bad) = out_t.leaf_vec().iter().find(|o| !o.dtype().is_float()) {
        return Err(Error {
            op: "jvp".into(),
            message: format!("outputs must be floats, got {bad}"),
            loc: Some(loc),
        });
    }
    let wrt: Vec<usize> = (0..leaves.len()).collect();
    let key = crate::transformed::key(&format!("jvp of {wrt:?}"), &traced.func, &traced.custom);
    let j = crate::transformed::derived(key, || kiln_autodiff::jvp(&traced.func, &wrt))
        .map_err(|e| ad_error("jvp", e, loc))?;
    // jvp's parameters: the traced function's (leaves, captures), then the tangents.
    let mut args: Vec<Tensor> = leaves;
    args.extend(traced.captures.iter().cloned());
    args.extend(tangents);
    let refs: Vec<&Tensor> = args.iter().collect();
    let res = j.call(&refs, "jvp", loc);
    if let Some(e) = res.iter().find_map(|t| t.error()) {
        return Err(e.clone());
    }
    let n = res.len() / 2;
    Ok((out_t.with_leaves(&res[..n]), out_t.with_leaves(&res[n..])))
}

struct Compiled<O> {
    exe: Arc<dyn Executable>,
    func: Func,
    template: O,
}

/// A compiled function: see [`jit`]. It keeps one compiled program per input signature.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, jit};
/// let scale = jit(|x: &Tensor| x * 3.0);
/// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let b = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// assert_eq!(scale.call(&a).unwrap().to_vec::<f32>().unwrap(), [3.0, 6.0]);
/// assert_eq!(scale.call(&b).unwrap().to_vec::<f32>().unwrap(), [3.0, 6.0, 9.0]);
/// assert_eq!(scale.compiles(), 2); // one program per shape
/// ```
pub struct Jit<I, O, F> {
    f: F,
    cache: Mutex<HashMap<String, Arc<Compiled<O>>>>,
    misses: Mutex<Vec<String>>,
    loc: Loc,
    /// Whether compiles bypass the process-wide compile cache (see [`Jit::bypassing_caches`]).
    bypass: bool,
    /// The options this function compiles under (`None`: the process's, [`options`]).
    options: Option<Options>,
    _in: std::marker::PhantomData<fn(&I)>,
}

/// Compiles `f` for each new input signature (tree structure, shapes, dtypes) on first call
/// and runs the compiled program afterwards. Called with traced inputs (inside another `jit`
/// or `grad`), it records `f` into the enclosing trace instead.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, jit};
/// let f = jit(|(a, b): &(Tensor, Tensor)| a.matmul(b).relu());
/// let a = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, 4.0], [2, 2]).unwrap();
/// let b = Tensor::from_vec(vec![1.0f32, 1.0], [2, 1]).unwrap();
/// assert_eq!(f.call(&(a.clone(), b.clone())).unwrap().to_vec::<f32>().unwrap(), [0.0, 7.0]);
/// f.call(&(a, b)).unwrap();
/// assert_eq!(f.compiles(), 1); // the second call reuses the compiled program
/// ```
#[track_caller]
pub fn jit<I: Tree, O: Tree + Clone, F: Fn(&I) -> O>(f: F) -> Jit<I, O, F> {
    Jit {
        f,
        cache: Mutex::new(HashMap::new()),
        misses: Mutex::new(Vec::new()),
        loc: Loc::caller(),
        bypass: false,
        options: None,
        _in: std::marker::PhantomData,
    }
}

impl<I: Tree, O: Tree + Clone, F: Fn(&I) -> O> Jit<I, O, F> {
    /// This function compiled without reusing any earlier compile: each new signature is traced
    /// and compiled by the backend itself, bypassing the process-wide cache of executables (and
    /// not adding to it), with the on-disk kernel cache in `kernel_cache` (`None`: none; a new
    /// empty directory: compiled from scratch, as on a machine that never compiled it). For
    /// measuring cold first calls; this object still reuses its own compiles.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, jit};
    /// let f = jit(|x: &Tensor| x.exp().sum_all()).bypassing_caches(None);
    /// let x = Tensor::zeros(kiln::DType::F32, [4]);
    /// assert_eq!(f.call(&x).unwrap().item().unwrap(), 4.0);
    /// assert_eq!(f.call(&x).unwrap().item().unwrap(), 4.0);
    /// assert_eq!(f.compiles(), 1); // its own compile is still reused
    /// ```
    pub fn bypassing_caches(mut self, kernel_cache: Option<std::path::PathBuf>) -> Self {
        self.bypass = true;
        let opts = self.options.take().unwrap_or_else(options);
        self.options = Some(Options {
            kernel_cache,
            ..opts
        });
        self
    }

    /// This function compiled under `opts` instead of the process's options ([`options`],
    /// read from the environment: see `kiln::ir`'s `SWITCHES` in `kiln_kernel::options`), e.g.
    /// without fusion, or with a kernel cache of its own. Set it before the first call.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Options, Tensor, jit};
    /// // One kernel per instruction: the same results as the fused program.
    /// let opts = Options { fusion: false, ..kiln::options() };
    /// let f = |x: &Tensor| (x * 2.0 + 1.0).relu();
    /// let x = Tensor::from_vec(vec![-1.0f32, 0.0, 1.5], [3]).unwrap();
    /// let unfused = jit(f).options(opts).call(&x).unwrap();
    /// assert_eq!(unfused.to_vec::<f32>().unwrap(), [0.0, 1.0, 4.0]);
    /// let fused = jit(f).call(&x).unwrap();
    /// assert_eq!(unfused.to_vec::<f32>().unwrap(), fused.to_vec::<f32>().unwrap());
    /// ```
    ///
    /// f32 matrix products on a GPU's tensor cores with their operands rounded to TF32, as
    /// PyTorch's `allow_tf32` and JAX's `jax_default_matmul_precision="tensorfloat32"` allow
    /// (`KILN_MATMUL_PRECISION=tf32` for every compile); the CPU backend stays exact:
    ///
    /// ```
    /// use kiln::{MatmulPrecision, Options, Tensor, jit};
    /// let opts = Options { matmul_precision: MatmulPrecision::Tf32, ..kiln::options() };
    /// // 1 + 2^-11 lies halfway between two TF32 values: it rounds (away from zero) to 1 + 2^-10.
    /// let a = Tensor::from_vec(vec![1.0f32 + 2f32.powi(-11); 64], [16, 4]).unwrap();
    /// let b = Tensor::ones(kiln::DType::F32, [4, 8]);
    /// let y = jit(|(a, b): &(Tensor, Tensor)| a.matmul(b)).options(opts).call(&(a, b)).unwrap();
    /// // On the CPU (and the reference) 4 (1 + 2^-11) exactly; on TF32 tensor cores 4 (1 + 2^-10).
    /// let exact = ["cpu", "reference"].contains(&kiln::backend::backend().unwrap().name());
    /// let each = if exact { 4.0 + 2f32.powi(-9) } else { 4.0 + 2f32.powi(-8) };
    /// assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == each));
    /// ```
    ///
    /// f32 sums over whole tensors and columns, and f32 and f16 scatter-adds, on a GPU by
    /// atomic additions (`KILN_FLOAT_ATOMICS=1` for every compile): one launch where the
    /// deterministic split takes two, no sort of a scatter's updates, but the order of the
    /// additions is the hardware's, so results are no longer bit-reproducible from run to run
    /// (`docs/gpu.md`, "Float atomics"); the CPU backend is unchanged:
    ///
    /// ```
    /// use kiln::{Options, Tensor, jit};
    /// let opts = Options { float_atomics: true, ..kiln::options() };
    /// let x = Tensor::ones(kiln::DType::F32, [100_000]);
    /// let s = jit(|x: &Tensor| x.sum_all()).options(opts).call(&x).unwrap();
    /// // Sums of ones are exact in any order.
    /// assert_eq!(s.item().unwrap(), 100_000.0);
    /// ```
    pub fn options(mut self, opts: Options) -> Self {
        self.options = Some(opts);
        self
    }

    /// Runs the function on `x`, compiling it first if `x`'s signature is new. With `x`'s
    /// leaves all on one device (moved there with `Tensor::to`), the program runs there and
    /// its results stay there ([`crate::device`]); host and device leaves mixed, or leaves on
    /// two devices, are an error naming the call's line and where this function was made.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, jit};
    /// // A tree in, a tree out.
    /// let f = jit(|(a, b): &(Tensor, Tensor)| (a + b, a * b));
    /// let x = (Tensor::scalar(3.0f32), Tensor::scalar(4.0f32));
    /// let (sum, product) = f.call(&x).unwrap();
    /// assert_eq!((sum.item().unwrap(), product.item().unwrap()), (7.0, 12.0));
    /// // Inputs that fail the trace are errors, not panics.
    /// let (two, three) = (Tensor::zeros(DType::F32, [2]), Tensor::zeros(DType::F32, [3]));
    /// assert!(f.call(&(two, three)).is_err());
    /// ```
    #[track_caller]
    pub fn call(&self, x: &I) -> Result<O> {
        let loc = Loc::caller();
        let leaves = leaves_of(x, "jit", loc)?;
        if leaves.iter().any(|t| t.is_traced()) {
            return Ok((self.f)(x));
        }
        if self.device_of(&leaves, loc)? != Device::Cpu {
            let c = self.compiled(x, &[], loc)?;
            let args = leaves
                .into_iter()
                .map(|t| DeviceArg {
                    buffer: t.device_buffer().expect("on the device").clone(),
                    donated: false,
                })
                .collect();
            return self.run_device(&c, args, loc);
        }
        let c = self.compiled(x, &[], loc)?;
        let args: Vec<&kiln_ir::Literal> = leaves
            .iter()
            .map(|t| t.literal().expect("eager leaves"))
            .collect();
        let outs = c.exe.run(&args).map_err(|e| Error {
            loc: Some(loc),
            ..e
        })?;
        Ok(c.template
            .with_leaves(&outs.into_iter().map(Tensor::new).collect::<Vec<_>>()))
    }

    /// Runs like [`Jit::call`], but takes `x` by value and donates its leaves' buffers, like
    /// `jax.jit(f, donate_argnums=...)`: an output may be written in place into the buffer of
    /// an input leaf that no other tensor handle shares (a training step's parameters, updated
    /// in place). Leaves the caller still holds elsewhere (a clone) are only read, so donation
    /// never changes a value the caller can see. Programs compiled for a donation pattern are
    /// cached apart from those of [`Jit::call`].
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, jit};
    /// let step = jit(|p: &Tensor| p - 1.0);
    /// let p = Tensor::from_vec(vec![3.0f32, 4.0], [2]).unwrap();
    /// let kept = p.clone(); // shared, so only read
    /// let p = step.call_donating(p).unwrap();
    /// assert_eq!(kept.to_vec::<f32>().unwrap(), [3.0, 4.0]);
    /// let p = step.call_donating(p).unwrap(); // held only here: its buffer may be reused
    /// assert_eq!(p.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    /// assert_eq!(step.compiles(), 2); // one program per donation pattern
    /// ```
    #[track_caller]
    pub fn call_donating(&self, x: I) -> Result<O> {
        let loc = Loc::caller();
        if leaves_of(&x, "jit", loc)?.iter().any(|t| t.is_traced()) {
            return Ok((self.f)(&x));
        }
        // A leaf only `x` holds, in one slot (a tensor in two slots has two handles).
        let refs = x.leaf_vec();
        let donated: Vec<bool> = refs.iter().map(|t| t.handles() == 1).collect();
        let leaves: Vec<Tensor> = refs.into_iter().cloned().collect();
        if self.device_of(&leaves, loc)? != Device::Cpu {
            let c = self.compiled(&x, &donated, loc)?;
            drop(x);
            let args = leaves
                .into_iter()
                .zip(&donated)
                .map(|(t, &d)| {
                    let held = if d {
                        t.try_into_device_buffer()
                    } else {
                        Err(t)
                    };
                    match held {
                        Ok(buffer) => DeviceArg {
                            buffer,
                            donated: true,
                        },
                        Err(t) => DeviceArg {
                            buffer: t.device_buffer().expect("on the device").clone(),
                            donated: false,
                        },
                    }
                })
                .collect();
            return self.run_device(&c, args, loc);
        }
        let c = self.compiled(&x, &donated, loc)?;
        drop(x);
        let mut owned: Vec<Option<kiln_ir::Literal>> = Vec::with_capacity(leaves.len());
        let mut kept: Vec<Option<Tensor>> = Vec::with_capacity(leaves.len());
        for (t, &d) in leaves.into_iter().zip(&donated) {
            match if d { t.try_into_literal() } else { Err(t) } {
                Ok(l) => {
                    owned.push(Some(l));
                    kept.push(None);
                }
                Err(t) => {
                    owned.push(None);
                    kept.push(Some(t));
                }
            }
        }
        let args: Vec<std::borrow::Cow<'_, kiln_ir::Literal>> = owned
            .into_iter()
            .zip(&kept)
            .map(|(l, t)| match (l, t) {
                (Some(l), _) => std::borrow::Cow::Owned(l),
                (None, t) => std::borrow::Cow::Borrowed(
                    t.as_ref().and_then(Tensor::literal).expect("eager leaves"),
                ),
            })
            .collect();
        let outs = c.exe.run_donating(args).map_err(|e| Error {
            loc: Some(loc),
            ..e
        })?;
        Ok(c.template
            .with_leaves(&outs.into_iter().map(Tensor::new).collect::<Vec<_>>()))
    }

    /// Where the leaves of one call live: the host, or one device; host and device leaves
    /// mixed, or leaves on two devices, are an error naming this function and the call.
    fn device_of(&self, leaves: &[Tensor], loc: Loc) -> Result<Device> {
        let refs: Vec<&Tensor> = leaves.iter().collect();
        kiln_trace::device::common_device(&refs, false, "jit", "argument", loc).map_err(|e| Error {
            message: format!(
                "{} (calling the function jitted at {})",
                e.message, self.loc
            ),
            ..e
        })
    }

    /// Runs `c` on device buffers: its results stay on the device.
    fn run_device(&self, c: &Compiled<O>, args: Vec<DeviceArg>, loc: Loc) -> Result<O> {
        let at = |e: Error| Error {
            loc: Some(loc),
            message: format!(
                "{} (calling the function jitted at {})",
                e.message, self.loc
            ),
            op: "jit".into(),
        };
        let bufs = c.exe.run_device(args).map_err(at)?;
        let outs = kiln_trace::device::wrap_results(bufs, &c.func.output_types).map_err(at)?;
        Ok(c.template.with_leaves(&outs))
    }

    /// The program compiled for `x`'s signature and the donation pattern `donated` (empty:
    /// none), tracing and compiling it first if it is new.
    fn compiled(&self, x: &I, donated: &[bool], loc: Loc) -> Result<Arc<Compiled<O>>> {
        let mut key = x.signature();
        if donated.iter().any(|&d| d) {
            key.push_str(" donating ");
            key.extend(donated.iter().map(|&d| if d { 'd' } else { '-' }));
        }
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(c) = cached {
            return Ok(c);
        }
        let opts = self.options.clone().unwrap_or_else(options);
        let (traced, template) = self.traced(x, &opts, loc)?;
        if !traced.captures.is_empty() {
            return Err(Error {
                op: "jit".into(),
                message: "the function captured traced tensors of an enclosing trace".into(),
                loc: Some(self.loc),
            });
        }
        let exe = if self.bypass {
            compile_uncached(&traced.func, donated, &opts)?
        } else {
            compile_cached_with(&traced.func, donated, &opts)?
        };
        let c = Arc::new(Compiled {
            exe,
            func: traced.func,
            template,
        });
        self.misses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(key.clone());
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, c.clone());
        Ok(c)
    }

    /// How many times the function was traced and compiled.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, jit};
    /// let f = jit(|x: &Tensor| x.sum_all());
    /// assert_eq!(f.compiles(), 0); // nothing compiles before the first call
    /// f.call(&Tensor::ones(DType::F32, [2])).unwrap();
    /// f.call(&Tensor::zeros(DType::F32, [2])).unwrap(); // same signature: reused
    /// f.call(&Tensor::ones(DType::F64, [2])).unwrap(); // new dtype: compiled
    /// assert_eq!(f.compiles(), 2);
    /// ```
    pub fn compiles(&self) -> usize {
        self.misses.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The input signatures that missed the cache and caused a compile, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, jit};
    /// let f = jit(|x: &Tensor| x.sum_all());
    /// for n in [2, 3, 2] {
    ///     f.call(&Tensor::ones(DType::F32, [n])).unwrap();
    /// }
    /// let log = f.compile_log();
    /// assert_eq!(log.len(), 2);
    /// assert!(log[0].contains("f32[2]") && log[1].contains("f32[3]"), "{log:?}");
    /// ```
    pub fn compile_log(&self) -> Vec<String> {
        self.misses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Peak bytes of the buffers one call on `x`'s signature writes (its intermediates and
    /// results, as the compiled program's memory plan lays them out), compiling it first if
    /// needed; `None` when the backend does not plan memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, jit};
    /// let f = jit(|x: &Tensor| x.exp() + 1.0);
    /// let x = Tensor::ones(DType::F32, [1024]);
    /// // The CPU backend plans memory: at least the 4 KiB result is written.
    /// let peak = f.peak_bytes(&x).unwrap().unwrap();
    /// assert!(peak >= 1024 * 4, "{peak}");
    /// assert_eq!(f.compiles(), 1); // compiled for x's signature, ready to call
    /// ```
    #[track_caller]
    pub fn peak_bytes(&self, x: &I) -> Result<Option<usize>> {
        let c = self.compiled(x, &[], Loc::caller())?;
        Ok(c.exe.peak_bytes())
    }

    /// The IR compiled for `x`'s signature (tracing it if needed), for inspection and dumps.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, jit};
    /// let f = jit(|x: &Tensor| (x * x).sum_all());
    /// let ir = f.lower(&Tensor::ones(DType::F32, [3])).unwrap();
    /// assert_eq!(ir.params.len(), 1);
    /// assert_eq!(ir.output_types[0].to_string(), "f32[]");
    /// let text = ir.to_string();
    /// assert!(text.contains("multiply") && text.contains("reduce"), "{text}");
    /// ```
    #[track_caller]
    pub fn lower(&self, x: &I) -> Result<Func> {
        let loc = Loc::caller();
        if let Some(c) = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&x.signature())
        {
            return Ok(c.func.clone());
        }
        let opts = self.options.clone().unwrap_or_else(options);
        Ok(self.traced(x, &opts, loc)?.0.func)
    }

    /// The function traced on `x`'s signature, its rematerialized functions with a memory
    /// budget keeping what fits it on the program's memory plan under `opts`
    /// ([`crate::Remat::Budget`]).
    fn traced(&self, x: &I, opts: &Options, loc: Loc) -> Result<(kiln_trace::trace::Traced, O)> {
        crate::remat::within_budget(
            || trace_tree("jit", x, &self.f, loc, false),
            |t| &t.0.func,
            |f| {
                // The installed backend's own plan (a GPU's arena is not the CPU's plan); a
                // backend that plans no memory (the reference interpreter runs on the host)
                // is measured on the CPU's.
                let planned = crate::backend::backend()?.planned_peak(f, opts)?;
                match planned {
                    Some(p) => Ok(p),
                    None => kiln_codegen_llvm::cpu::planned_peak(f, opts)
                        .map_err(|e| Error::internal("jit", e.to_string())),
                }
            },
        )
    }
}

/// A function with a user-defined reverse-mode rule, like `jax.custom_vjp`: the returned
/// function computes `f(x)`, and differentiating it with respect to `x` with output cotangent
/// `g` gives `bwd(x, f(x), g)` instead of differentiating `f`'s own ops. `bwd` receives the
/// actual cotangent, so rules need not be linear in it (gradient clipping, say), and it is
/// differentiated like any code for higher-order derivatives. `bwd` may not capture traced
/// tensors of an enclosing trace; pass what it needs through `x`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, custom_vjp, grad};
/// // Forward: the identity. Backward: the cotangent clipped to [-1, 1].
/// let clip_grad = custom_vjp(
///     |x: &Tensor| x.clone(),
///     |_x: &Tensor, _y: &Tensor, g: &Tensor| g.clip(-1.0, 1.0),
/// );
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// assert_eq!(clip_grad(&x).to_vec::<f32>().unwrap(), [1.0, 2.0]);
/// let g = grad(|x: &Tensor| (clip_grad(x) * 5.0).sum_all())(&x);
/// assert_eq!(g.to_vec::<f32>().unwrap(), [1.0, 1.0]); // 5 clipped
/// ```
#[track_caller]
pub fn custom_vjp<I: Tree, O: Tree>(
    f: impl Fn(&I) -> O,
    bwd: impl Fn(&I, &O, &O) -> I,
) -> impl Fn(&I) -> O {
    let loc = Loc::caller();
    move |x: &I| {
        let y = f(x);
        let xs: Vec<Tensor> = x.leaf_vec().into_iter().cloned().collect();
        let ys: Vec<Tensor> = y.leaf_vec().into_iter().cloned().collect();
        if !kiln_trace::trace::tracing() || !xs.iter().chain(&ys).any(|t| t.is_traced()) {
            return y;
        }
        match trace_bwd(&bwd, x, &y, &xs, &ys, loc) {
            Ok(func) => y.with_leaves(&kiln_trace::trace::custom_rule(&xs, &ys, func, loc)),
            Err(e) => y.map_leaves(&mut |_| Tensor::failed(e.clone())),
        }
    }
}

/// `bwd` traced as a function of (x leaves, y leaves, cotangent leaves) returning x cotangents.
fn trace_bwd<I: Tree, O: Tree>(
    bwd: &impl Fn(&I, &O, &O) -> I,
    x: &I,
    y: &O,
    xs: &[Tensor],
    ys: &[Tensor],
    loc: Loc,
) -> Result<Func> {
    let fail = |m: String| Error {
        op: "custom_vjp".into(),
        message: m,
        loc: Some(loc),
    };
    let types: Vec<_> = xs
        .iter()
        .chain(ys)
        .chain(ys)
        .map(|t| t.ty().ok_or_else(|| t.error().cloned().expect("failed")))
        .collect::<Result<_>>()?;
    let (nx, ny) = (xs.len(), ys.len());
    let traced = trace("custom_vjp_bwd", &types, |p| {
        bwd(
            &x.with_leaves(&p[..nx]),
            &y.with_leaves(&p[nx..nx + ny]),
            &y.with_leaves(&p[nx + ny..]),
        )
        .leaf_vec()
        .into_iter()
        .cloned()
        .collect()
    })?;
    if !traced.captures.is_empty() {
        return Err(fail(
            "bwd captured traced tensors of an enclosing trace; pass them through x".into(),
        ));
    }
    let want: Vec<_> = xs.iter().map(|t| t.ty()).collect();
    let got: Vec<_> = traced.func.output_types.iter().cloned().map(Some).collect();
    if want != got {
        return Err(fail(format!(
            "bwd must return one cotangent per leaf of x, with x's types; it returned {} value(s)",
            got.len()
        )));
    }
    Ok(traced.func)
}

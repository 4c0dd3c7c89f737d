//! `scan`: a loop over the leading dimension of its inputs that carries a state and stacks an
//! output per step (JAX's `lax.scan`), traced into one `while` with a static trip count, so it
//! differentiates in reverse and forward mode (see `ir-specs/ops/while.md`).

use crate::control::fori_loop;
use crate::{Error, Result, Tensor, Tree};
use kiln_ir::{Loc, TensorType};

/// How [`scan_with`] runs: see its fields. The default is [`scan`]'s: the length from the
/// inputs, first step to last, one step per loop iteration.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, control::{ScanOptions, scan_with}};
/// // Suffix sums: run from the last step, outputs still in step order.
/// let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// let reverse = ScanOptions { reverse: true, ..ScanOptions::default() };
/// let step = |c: &Tensor, x: &Tensor| (c + x, c + x);
/// let (total, sums) = scan_with(step, Tensor::scalar(0.0f32), &xs, reverse).unwrap();
/// assert_eq!(total.item().unwrap(), 6.0);
/// assert_eq!(sums.to_vec::<f32>().unwrap(), [6.0, 5.0, 3.0]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanOptions {
    /// The number of steps; required when `xs` has no leaves, checked against their leading
    /// dimension otherwise.
    pub length: Option<usize>,
    /// Run from the last step to the first (outputs still stacked by step index).
    pub reverse: bool,
    /// Steps per loop iteration (at least 1): larger values trade program size for loop
    /// overhead; the leftover steps run unrolled after the loop.
    pub unroll: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            length: None,
            reverse: false,
            unroll: 1,
        }
    }
}

/// Runs `f(carry, x)` for each `x` along the leading dimension of every leaf of `xs`,
/// threading `carry` from `init`; returns the last carry and the per-step outputs `y` stacked
/// along a new leading dimension (JAX's `lax.scan`). The carry keeps its structure and types
/// (an error names both otherwise). Errors (of the inputs, the step or the request) are
/// returned.
///
/// ```
/// use kiln::{Tensor, control::scan};
/// // Running sum and the sum before each step.
/// let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// let (total, before) =
///     scan(|c: &Tensor, x: &Tensor| (c.add(x), c.clone()), Tensor::scalar(0.0f32), &xs).unwrap();
/// assert_eq!(total.to_vec::<f32>().unwrap(), vec![6.0]);
/// assert_eq!(before.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 3.0]);
/// ```
#[track_caller]
pub fn scan<C: Tree, X: Tree, Y: Tree>(
    f: impl Fn(&C, &X) -> (C, Y),
    init: C,
    xs: &X,
) -> Result<(C, Y)> {
    scan_at(f, init, xs, ScanOptions::default(), "scan", Loc::caller())
}

/// [`scan`] with a length, direction and unrolling: see [`ScanOptions`].
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, control::{ScanOptions, scan_with}};
/// // No inputs, 5 steps, two per loop iteration: powers of two.
/// let opts = ScanOptions { length: Some(5), unroll: 2, ..ScanOptions::default() };
/// let double = |c: &Tensor, _: &()| (c * 2.0, c.clone());
/// let (last, powers) = scan_with(double, Tensor::scalar(1.0f32), &(), opts).unwrap();
/// assert_eq!(last.item().unwrap(), 32.0);
/// assert_eq!(powers.to_vec::<f32>().unwrap(), [1.0, 2.0, 4.0, 8.0, 16.0]);
/// let bad = ScanOptions { unroll: 0, ..opts };
/// assert!(scan_with(double, Tensor::scalar(1.0f32), &(), bad).is_err());
/// ```
#[track_caller]
pub fn scan_with<C: Tree, X: Tree, Y: Tree>(
    f: impl Fn(&C, &X) -> (C, Y),
    init: C,
    xs: &X,
    options: ScanOptions,
) -> Result<(C, Y)> {
    scan_at(f, init, xs, options, "scan", Loc::caller())
}

/// [`scan_with`] at the caller's `loc`, its errors naming `op` (`scan`, or `map`, which is a
/// scan without a carry).
pub(crate) fn scan_at<C: Tree, X: Tree, Y: Tree>(
    f: impl Fn(&C, &X) -> (C, Y),
    init: C,
    xs: &X,
    options: ScanOptions,
    op: &str,
    loc: Loc,
) -> Result<(C, Y)> {
    let x_leaves: Vec<Tensor> = xs.leaf_vec().into_iter().cloned().collect();
    let c_leaves: Vec<Tensor> = init.leaf_vec().into_iter().cloned().collect();
    if let Some(e) = x_leaves.iter().chain(&c_leaves).find_map(|t| t.error()) {
        return Err(e.clone());
    }
    if options.unroll == 0 {
        return Err(Error::at(op, "unroll must be at least 1", loc));
    }
    // The number of steps: every input's leading dimension, and the length if given.
    let mut n = options.length;
    for (k, x) in x_leaves.iter().enumerate() {
        let shape = x.shape();
        let Some(&len) = shape.first() else {
            let e = Error::at(
                op,
                format!(
                    "input leaf {k} is a scalar; {op} steps along each input's leading dimension"
                ),
                loc,
            );
            return Err(e);
        };
        match n {
            Some(m) if m != len => {
                let e = Error::at(
                    op,
                    format!(
                        "input leaf {k} has {len} steps along its leading dimension but {} \
                         expects {m}",
                        if options.length.is_some() {
                            "the length"
                        } else {
                            "input leaf 0"
                        }
                    ),
                    loc,
                );
                return Err(e);
            }
            _ => n = Some(len),
        }
    }
    let Some(n) = n else {
        let what = if op == "scan" {
            "inputs with a leading dimension or a length"
        } else {
            "at least one input with a leading dimension (a tree with no tensor has no steps)"
        };
        let e = Error::at(op, format!("{op} needs {what}"), loc);
        return Err(e);
    };
    let slice_types: Vec<TensorType> = x_leaves
        .iter()
        .map(|x| {
            let t = x.ty().expect("not failed");
            TensorType::new(t.dtype, t.shape[1..].to_vec())
        })
        .collect();
    let slice_types = &slice_types;
    let c_types: Vec<TensorType> = c_leaves
        .iter()
        .map(|t| t.ty().expect("not failed"))
        .collect();
    // One step traced on its own first, for the outputs' types and structure.
    let mut template = None;
    let probe = kiln_trace::trace::trace(
        "scan_step",
        &[c_types.clone(), slice_types.clone()].concat(),
        |ps| {
            let (c, y) = f(
                &init.with_leaves(&ps[..c_types.len()]),
                &xs.with_leaves(&ps[c_types.len()..]),
            );
            let mut outs: Vec<Tensor> = c.leaf_vec().into_iter().cloned().collect();
            outs.extend(y.leaf_vec().into_iter().cloned());
            template = Some(y);
            outs
        },
    );
    let probe = probe?;
    let y_template = template.expect("the step ran");
    let nc = c_types.len();
    if probe.func.output_types[..nc] != c_types[..] {
        let e = Error::at(
            op,
            format!(
                "the step returns a carry of types ({}) but the carry is ({}): scan keeps its carry's types",
                types(&probe.func.output_types[..nc]),
                types(&c_types)
            ),
            loc,
        );
        return Err(e);
    }
    let y_types = probe.func.output_types[nc..].to_vec();
    let ys0: Vec<Tensor> = y_types
        .iter()
        .map(|t| {
            let mut shape = vec![n];
            shape.extend(&t.shape);
            Tensor::zeros(t.dtype, shape)
        })
        .collect();
    if n == 0 {
        // No step: the carry as it came and empty outputs (a slice of an empty input would
        // not fit the loop's one-step window).
        return Ok((init, y_template.with_leaves(&ys0)));
    }
    let step = |t: &Tensor, c: &C, ys: &[Tensor]| -> (C, Vec<Tensor>) {
        let idx = if options.reverse {
            Tensor::scalar(n as i32 - 1).sub(t)
        } else {
            t.clone()
        };
        let zero = Tensor::scalar(0i32);
        let x: Vec<Tensor> = x_leaves
            .iter()
            .zip(slice_types)
            .map(|(x, st)| {
                let mut starts = vec![&idx];
                starts.extend(std::iter::repeat_n(&zero, st.rank()));
                let mut sizes = vec![1];
                sizes.extend(&st.shape);
                let shape: Vec<isize> = st.shape.iter().map(|&d| d as isize).collect();
                x.dynamic_slice(&starts, &sizes).reshape(&shape)
            })
            .collect();
        let (c, y) = f(c, &xs.with_leaves(&x));
        let ys = ys
            .iter()
            .zip(y.leaf_vec())
            .map(|(buf, y)| {
                let mut shape = vec![1isize];
                shape.extend(y.shape().iter().map(|&d| d as isize));
                let mut starts = vec![&idx];
                starts.extend(std::iter::repeat_n(&zero, y.rank()));
                buf.dynamic_update_slice(&y.reshape(&shape), &starts)
            })
            .collect();
        (c, ys)
    };
    let u = options.unroll;
    let (loops, tail) = (n / u, n % u);
    let (mut c, mut ys) = fori_loop(
        0,
        loops as i32,
        |k: &Tensor, (c, ys): &(C, Vec<Tensor>)| {
            let mut c = c.map_leaves(&mut |t| t.clone());
            let mut ys = ys.clone();
            for s in 0..u {
                let t = k
                    .mul(&Tensor::scalar(u as i32))
                    .add(&Tensor::scalar(s as i32));
                (c, ys) = step(&t, &c, &ys);
            }
            (c, ys)
        },
        (init, ys0),
    );
    for s in 0..tail {
        let t = Tensor::scalar((loops * u + s) as i32);
        (c, ys) = step(&t, &c, &ys);
    }
    let failed = c
        .leaf_vec()
        .into_iter()
        .chain(&ys)
        .find_map(|t| t.error().cloned());
    match failed {
        Some(e) => Err(e),
        None => Ok((c, y_template.with_leaves(&ys))),
    }
}

fn types(tys: &[TensorType]) -> String {
    tys.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

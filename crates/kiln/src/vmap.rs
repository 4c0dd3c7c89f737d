//! `vmap`: a function of one example applied to a batch, as JAX's `jax.vmap`.
//!
//! The function is traced on one example's shapes, batched by the IR transform
//! [`kiln_autodiff::vmap`] (a batching rule per op, the whole batch as one program; see that
//! module), and applied to the batch: it runs when the arguments hold values and is inlined
//! when they are traced, so `vmap` composes with `jit`, `grad` and itself in any order.

use crate::{Error, Result, Tensor, Tree};
use kiln_ir::{Loc, TensorType};
use kiln_trace::trace::trace_hoisting;

/// A batched function: see [`vmap`]. It traces the function on every call; the batched
/// function is derived once per traced function (kept by the `transformed` module).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, vmap};
/// // The norm of one vector, mapped over the rows of a matrix.
/// let norms = vmap(|v: &Tensor| (v * v).sum_all().sqrt());
/// let m = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 2.0], [2, 2]).unwrap();
/// let n: Tensor = norms.call(&m).unwrap();
/// assert_eq!(n.to_vec::<f32>().unwrap(), [5.0, 2.0]);
/// ```
pub struct Vmap<F> {
    f: F,
    in_axes: Option<Vec<Option<usize>>>,
    out_axes: Option<Vec<Option<usize>>>,
    loc: Loc,
}

/// `f` mapped over a batch: by default every leaf of the argument tree is batched along its
/// dimension 0 and every output leaf gets the batch as its dimension 0; [`Vmap::in_axes`]
/// and [`Vmap::out_axes`] choose other dimensions, `None` in `in_axes` shares a leaf across
/// the batch (JAX's `in_axes=None`), and `None` in `out_axes` returns an output that does not
/// depend on the batch once, without a batch dimension (JAX's `out_axes=None`).
///
/// ```
/// use kiln::{Tensor, vmap};
/// // A dot product of one pair of vectors, mapped over 3 pairs.
/// let dot = |(a, b): &(Tensor, Tensor)| (a * b).sum_all();
/// let a = Tensor::from_vec((0..6).map(|i| i as f32).collect(), [3, 2]).unwrap();
/// let b = Tensor::from_vec(vec![1.0f32; 6], [3, 2]).unwrap();
/// let d = vmap(dot).call(&(a, b)).unwrap();
/// assert_eq!(d.to_vec::<f32>().unwrap(), vec![1.0, 5.0, 9.0]);
/// ```
#[track_caller]
pub fn vmap<F>(f: F) -> Vmap<F> {
    Vmap {
        f,
        in_axes: None,
        out_axes: None,
        loc: Loc::caller(),
    }
}

fn err(message: String, loc: Loc) -> Error {
    Error {
        op: "vmap".into(),
        message,
        loc: Some(loc),
    }
}

impl<F> Vmap<F> {
    /// The batch dimension of each leaf of the argument, in the tree's leaf order (`None`:
    /// the leaf is the same for every example).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, vmap};
    /// // Weights times each column of `xs` (batched along dimension 1); the weights are shared.
    /// let scale = vmap(|(w, x): &(Tensor, Tensor)| w * x).in_axes(&[None, Some(1)]);
    /// let w = Tensor::from_vec(vec![10.0f32, 100.0], [2]).unwrap();
    /// let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]).unwrap();
    /// let ys: Tensor = scale.call(&(w.clone(), xs.clone())).unwrap();
    /// assert_eq!(ys.shape(), [3, 2]); // one row per column of xs
    /// assert_eq!(ys.to_vec::<f32>().unwrap(), [10.0, 400.0, 20.0, 500.0, 30.0, 600.0]);
    /// // One entry per leaf of the argument.
    /// let bad = vmap(|(w, x): &(Tensor, Tensor)| w * x).in_axes(&[Some(1)]);
    /// assert!(bad.call::<_, Tensor>(&(w, xs)).unwrap_err().message.contains("in_axes has 1"));
    /// ```
    pub fn in_axes(mut self, axes: &[Option<usize>]) -> Self {
        self.in_axes = Some(axes.to_vec());
        self
    }

    /// Where the batch dimension goes in each output leaf, in the output tree's leaf order;
    /// `None` leaves an output that does not depend on the batch without one (JAX's
    /// `out_axes=None`: the value is the same for every example, returned once). `None` for an
    /// output that does depend on the batch is an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, vmap};
    /// // Each example's result becomes a column instead of a row.
    /// let double = vmap(|x: &Tensor| x * 2.0).out_axes(&[Some(1)]);
    /// let xs = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]).unwrap();
    /// let ys: Tensor = double.call(&xs).unwrap();
    /// assert_eq!(ys.shape(), [2, 3]);
    /// assert_eq!(ys.to_vec::<f32>().unwrap(), [2.0, 6.0, 10.0, 4.0, 8.0, 12.0]);
    /// // The shared weights' norm is the same for every example: returned once.
    /// let w = Tensor::from_vec(vec![3.0f32, 4.0], [2]).unwrap();
    /// let f = vmap(|(w, x): &(Tensor, Tensor)| (w * x, (w * w).sum_all().sqrt()))
    ///     .in_axes(&[None, Some(0)])
    ///     .out_axes(&[Some(0), None]);
    /// let (ys, norm): (Tensor, Tensor) = f.call(&(w.clone(), xs.clone())).unwrap();
    /// assert_eq!((ys.shape(), norm.shape()), (vec![3, 2], vec![]));
    /// assert_eq!(norm.item().unwrap(), 5.0);
    /// // An output that depends on the example cannot drop the batch dimension.
    /// let bad = vmap(|x: &Tensor| x * 2.0).out_axes(&[None]);
    /// assert!(bad.call::<_, Tensor>(&xs).unwrap_err().message.contains("depends on the batch"));
    /// ```
    pub fn out_axes(mut self, axes: &[Option<usize>]) -> Self {
        self.out_axes = Some(axes.to_vec());
        self
    }

    /// Applies the batched function to `x`. Leaves with different batch sizes are an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, vmap};
    /// let add = vmap(|(a, b): &(Tensor, Tensor)| a + b);
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// let b = Tensor::from_vec(vec![10.0f32, 20.0], [2]).unwrap();
    /// let sum: Tensor = add.call(&(a.clone(), b)).unwrap();
    /// assert_eq!(sum.to_vec::<f32>().unwrap(), [11.0, 22.0]);
    /// let three = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    /// let err = add.call::<_, Tensor>(&(a, three)).unwrap_err();
    /// assert!(err.message.contains("batch sizes differ"), "{err}");
    /// ```
    pub fn call<I: Tree, O: Tree>(&self, x: &I) -> Result<O>
    where
        F: Fn(&I) -> O,
    {
        let loc = self.loc;
        let leaves: Vec<Tensor> = x.leaf_vec().into_iter().cloned().collect();
        if let Some(e) = leaves.iter().find_map(|t| t.error()) {
            return Err(e.clone());
        }
        let axes = match &self.in_axes {
            Some(a) if a.len() != leaves.len() => {
                return Err(err(
                    format!(
                        "in_axes has {} entries but the argument {} has {} leaves",
                        a.len(),
                        x.describe(),
                        leaves.len()
                    ),
                    loc,
                ));
            }
            Some(a) => a.clone(),
            None => vec![Some(0); leaves.len()],
        };
        // The batch size, and each leaf's type for one example.
        let mut size: Option<(usize, usize)> = None;
        let mut example_types: Vec<TensorType> = Vec::with_capacity(leaves.len());
        let mut moved: Vec<Tensor> = Vec::with_capacity(leaves.len());
        for (i, (t, axis)) in leaves.iter().zip(&axes).enumerate() {
            let ty = t.ty().expect("not failed");
            let Some(axis) = *axis else {
                example_types.push(ty);
                moved.push(t.clone());
                continue;
            };
            if axis >= ty.rank() {
                return Err(err(
                    format!("in_axes[{i}] = {axis} is out of range for leaf {i} of type {ty}"),
                    loc,
                ));
            }
            let n = ty.shape[axis];
            match size {
                Some((m, j)) if m != n => {
                    return Err(err(
                        format!(
                            "batch sizes differ: leaf {j} has {m} examples along its in_axes \
                             dimension, leaf {i} ({ty}) has {n} along dimension {axis}"
                        ),
                        loc,
                    ));
                }
                _ => size = Some((n, i)),
            }
            let mut shape = ty.shape.clone();
            shape.remove(axis);
            example_types.push(TensorType::new(ty.dtype, shape));
            let mut perm = vec![axis];
            perm.extend((0..ty.rank()).filter(|&d| d != axis));
            moved.push(if axis == 0 {
                t.clone()
            } else {
                t.permute(&perm)
            });
        }
        let Some((size, _)) = size else {
            return Err(err(
                format!(
                    "no leaf of {} is batched (every in_axes entry is None)",
                    x.describe()
                ),
                loc,
            ));
        };
        crate::backend::install();
        let mut template = None;
        let traced = trace_hoisting("f", &example_types, |params| {
            let out = (self.f)(&x.with_leaves(params));
            let outs = out.leaf_vec().into_iter().cloned().collect();
            template = Some(out);
            outs
        })?;
        let template = template.expect("the traced closure ran");
        let mut flags: Vec<bool> = axes.iter().map(Option::is_some).collect();
        flags.extend(std::iter::repeat_n(false, traced.captures.len()));
        let n_out = traced.func.outputs.len();
        let out_axes = match &self.out_axes {
            Some(a) if a.len() != n_out => {
                return Err(err(
                    format!(
                        "out_axes has {} entries but the function returns {n_out} leaves",
                        a.len(),
                    ),
                    loc,
                ));
            }
            Some(a) => a.clone(),
            None => vec![Some(0); n_out],
        };
        // Every output batched (broadcast where it does not depend on the batch), unless
        // some are asked to stay unbatched: then batched only where they depend on it.
        let all = out_axes.iter().all(Option::is_some);
        let key = crate::transformed::key(
            &format!("vmap of {flags:?}, {size} examples, all batched: {all}"),
            &traced.func,
            &traced.custom,
        );
        let g = crate::transformed::derived_with(key, || {
            if all {
                let g = kiln_autodiff::vmap(&traced.func, &flags, size);
                g.map(|g| (g, vec![true; n_out]))
            } else {
                kiln_autodiff::vmap::vmap_as_needed(&traced.func, &flags, size)
            }
        })
        .map_err(|e| err(e.to_string(), loc))?;
        let batched = &g.outputs;
        for (i, (axis, &b)) in out_axes.iter().zip(batched).enumerate() {
            if axis.is_none() && b {
                let t = &traced.func.output_types[i];
                return Err(err(
                    format!(
                        "out_axes[{i}] is None but output {i} ({t} for one example) depends on \
                         the batch: only an output that is the same for every example can be \
                         returned unbatched"
                    ),
                    loc,
                ));
            }
        }
        let args: Vec<&Tensor> = moved.iter().chain(&traced.captures).collect();
        let outs = g.call(&args, "vmap", loc);
        if let Some(e) = outs.iter().find_map(|t| t.error()) {
            return Err(e.clone());
        }
        let mut placed = Vec::with_capacity(outs.len());
        for (i, ((o, axis), &b)) in outs.iter().zip(&out_axes).zip(batched).enumerate() {
            let o = if axis.is_some() && !b {
                // The same for every example: repeated along a new batch dimension.
                let mut shape = vec![size];
                shape.extend(o.shape());
                o.broadcast_to(&shape)
            } else {
                o.clone()
            };
            let rank = o.rank();
            let axis = match *axis {
                None => {
                    placed.push(o);
                    continue;
                }
                Some(a) if a >= rank => {
                    return Err(err(
                        format!(
                            "out_axes[{i}] = {a} is out of range for output {i}, which has \
                             rank {rank} with the batch"
                        ),
                        loc,
                    ));
                }
                Some(a) => a,
            };
            // Batch dimension 0 moves to `axis`.
            let mut perm: Vec<usize> = (1..rank).collect();
            perm.insert(axis, 0);
            placed.push(if axis == 0 { o } else { o.permute(&perm) });
        }
        Ok(template.with_leaves(&placed))
    }
}

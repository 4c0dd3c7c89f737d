//! Optimizers as pure functions over parameter trees: `init` makes the state, `update` maps
//! (params, grads, state) to (new params, new state). Everything is tensor code, so the whole
//! training step (forward, backward, update) compiles into one `jit`.

use crate::{Error, Result, Tensor, Tree};

/// Applies `f` to the corresponding leaves of several trees of one structure.
#[track_caller]
fn zip_leaves<P: Tree>(
    trees: &[&P],
    mut f: impl FnMut(&[&Tensor]) -> Vec<Tensor>,
) -> Result<Vec<P>> {
    let leaves: Vec<Vec<&Tensor>> = trees.iter().map(|t| t.leaf_vec()).collect();
    let first = &leaves[0];
    for (i, l) in leaves.iter().enumerate().skip(1) {
        if l.len() != first.len() || l.iter().zip(first).any(|(a, b)| a.ty() != b.ty()) {
            return Err(Error::new(
                "optimizer",
                format!(
                    "tree {i} does not match the parameters: {} vs {}",
                    trees[i].describe(),
                    trees[0].describe()
                ),
            ));
        }
    }
    let mut outs: Vec<Vec<Tensor>> = Vec::new();
    for j in 0..first.len() {
        let args: Vec<&Tensor> = leaves.iter().map(|l| l[j]).collect();
        let r = f(&args);
        if outs.is_empty() {
            outs = vec![Vec::new(); r.len()];
        }
        for (k, t) in r.into_iter().enumerate() {
            outs[k].push(t);
        }
    }
    Ok(outs.iter().map(|o| trees[0].with_leaves(o)).collect())
}

fn zeros_like<P: Tree>(p: &P) -> P {
    p.map_leaves(&mut |t| Tensor::zeros(t.dtype(), t.shape()))
}

/// Stochastic gradient descent with optional momentum (heavy ball or Nesterov) and L2 weight
/// decay, as `torch.optim.SGD`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, optim::Sgd};
/// let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let g = Tensor::from_vec(vec![1.0f32, -2.0], [2]).unwrap();
/// let opt = Sgd { momentum: 0.5, ..Sgd::new(0.5) };
/// let s = opt.init(&p);
/// let (p, s) = opt.update(&p, &g, &s).unwrap(); // p - 0.5 g
/// assert_eq!(p.to_vec::<f32>().unwrap(), [0.5, 3.0]);
/// let (p, _) = opt.update(&p, &g, &s).unwrap(); // velocity 0.5 g + g
/// assert_eq!(p.to_vec::<f32>().unwrap(), [-0.25, 4.5]);
/// ```
#[derive(Clone, Debug)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 for plain SGD).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
}

/// The state of [`Sgd`]: the velocity of each parameter (unchanged by plain SGD, which has no
/// momentum).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, optim::Sgd};
/// let v = |t: &Tensor| t.to_vec::<f32>().unwrap();
/// let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let g = Tensor::from_vec(vec![4.0f32, -2.0], [2]).unwrap();
/// let opt = Sgd { momentum: 0.5, ..Sgd::new(0.1) };
/// let (_, s) = opt.update(&p, &g, &opt.init(&p)).unwrap();
/// assert_eq!(v(&s.velocity), [4.0, -2.0]); // 0.5 * 0 + g
/// let (_, s) = opt.update(&p, &g, &s).unwrap();
/// assert_eq!(v(&s.velocity), [6.0, -3.0]); // 0.5 * g + g
/// ```
#[derive(Clone, Debug, crate::Tree)]
pub struct SgdState<P> {
    /// Momentum buffers, like the parameters.
    pub velocity: P,
}

impl Sgd {
    /// Plain SGD.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, optim::Sgd};
    /// let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// let g = Tensor::from_vec(vec![1.0f32, -1.0], [2]).unwrap();
    /// let opt = Sgd::new(0.5);
    /// let (p, s) = opt.update(&p, &g, &opt.init(&p)).unwrap();
    /// assert_eq!(p.to_vec::<f32>().unwrap(), [0.5, 2.5]); // p - lr g
    /// assert_eq!(s.velocity.to_vec::<f32>().unwrap(), [0.0, 0.0]); // no momentum: no velocity
    /// ```
    pub fn new(lr: f64) -> Sgd {
        Sgd {
            lr,
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }

    /// Zero velocities.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, optim::Sgd};
    /// let params = (Tensor::ones(DType::F32, [2, 3]), Tensor::ones(DType::F64, [4]));
    /// let s = Sgd::new(0.1).init(&params);
    /// assert_eq!((s.velocity.0.shape(), s.velocity.1.dtype()), (vec![2, 3], DType::F64));
    /// assert_eq!(s.velocity.1.to_vec::<f64>().unwrap(), [0.0; 4]);
    /// ```
    pub fn init<P: Tree>(&self, params: &P) -> SgdState<P> {
        SgdState {
            velocity: zeros_like(params),
        }
    }

    /// One step.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, optim::Sgd};
    /// let p = Tensor::from_vec(vec![2.0f32], [1]).unwrap();
    /// let zero = Tensor::from_vec(vec![0.0f32], [1]).unwrap();
    /// // Weight decay alone: p - lr (wd p) = 2 - 1 * (0.25 * 2).
    /// let opt = Sgd { weight_decay: 0.25, ..Sgd::new(1.0) };
    /// let (p2, _) = opt.update(&p, &zero, &opt.init(&p)).unwrap();
    /// assert_eq!(p2.to_vec::<f32>().unwrap(), [1.5]);
    /// // Gradients of another type than the parameters are an error.
    /// let wrong = Tensor::from_vec(vec![0.0f64], [1]).unwrap();
    /// let err = opt.update(&p, &wrong, &opt.init(&p)).unwrap_err();
    /// assert!(err.message.contains("does not match the parameters"), "{err}");
    /// ```
    #[track_caller]
    pub fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &SgdState<P>,
    ) -> Result<(P, SgdState<P>)> {
        let mut out = zip_leaves(&[params, grads, &state.velocity], |x| {
            let (p, g, v) = (x[0], x[1], x[2]);
            let (step, v) = self.step_of(p, g, v);
            // `p - step * lr`: one pass over eager tensors (as PyTorch's `p.add_(g, alpha=-lr)`),
            // the two ops in a trace.
            vec![p.sub_scaled(&step, self.lr), v]
        })?;
        let v = out.pop().expect("two outputs");
        Ok((out.pop().expect("two outputs"), SgdState { velocity: v }))
    }

    /// [`Sgd::update`] taking the parameters by value, as PyTorch's in-place `optimizer.step()`
    /// works: where a parameter is an eager `f32` or `f64` tensor that nothing else holds (no
    /// clone or view of it alive), its step is written into its own storage, so that an eager
    /// training loop keeps one copy of its parameters instead of two and takes no buffer for
    /// the new ones. Elsewhere (shared, other dtypes, traced) the step is `update`'s; the
    /// values are `update`'s either way.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, optim::Sgd};
    /// let opt = Sgd::new(0.5);
    /// let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// let g = Tensor::from_vec(vec![1.0f32, -1.0], [2]).unwrap();
    /// let s = opt.init(&p);
    /// let (want, _) = opt.update(&p, &g, &s).unwrap();
    /// let (p, s) = opt.step(p, &g, s).unwrap();
    /// assert_eq!(p.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap()); // [0.5, 2.5]
    /// ```
    #[track_caller]
    pub fn step<P: Tree>(
        &self,
        params: P,
        grads: &P,
        state: SgdState<P>,
    ) -> Result<(P, SgdState<P>)> {
        // Each parameter's step (`update`'s, but for the last subtraction) and new velocity.
        let mut out = zip_leaves(&[&params, grads, &state.velocity], |x| {
            let (p, g, v) = (x[0], x[1], x[2]);
            let (step, v) = self.step_of(p, g, v);
            vec![step, v]
        })?;
        let v = out.pop().expect("two outputs");
        let steps = out.pop().expect("two outputs");
        drop(state);
        Ok((
            step_owned(params, &steps, self.lr),
            SgdState { velocity: v },
        ))
    }

    /// The step a parameter `p` with gradient `g` and velocity `v` takes (to be multiplied by
    /// the learning rate and subtracted), and its new velocity.
    fn step_of(&self, p: &Tensor, g: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let g = if self.weight_decay != 0.0 {
            g + &(p * self.weight_decay)
        } else {
            g.clone()
        };
        // Plain SGD (no momentum) has no velocity: the state passes through unchanged, so
        // a compiled step does not have to write the gradients out.
        if self.momentum == 0.0 {
            return (g, v.clone());
        }
        let v = &(v * self.momentum) + &g;
        let step = if self.nesterov {
            &g + &(&v * self.momentum)
        } else {
            v.clone()
        };
        (step, v)
    }
}

/// Adam (L2 weight decay added to the gradient), or AdamW (decoupled weight decay) with
/// `decoupled`, as `torch.optim.Adam` / `AdamW`.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, optim::Adam};
/// let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let g = Tensor::from_vec(vec![0.5f32, -3.0], [2]).unwrap();
/// let opt = Adam::new(0.1);
/// let (p, s) = opt.update(&p, &g, &opt.init(&p)).unwrap();
/// // Adam's first step moves each parameter by lr against its gradient's sign.
/// let p = p.to_vec::<f32>().unwrap();
/// assert!((p[0] - 0.9).abs() < 1e-5 && (p[1] - 2.1).abs() < 1e-5, "{p:?}");
/// assert_eq!(s.step.item().unwrap(), 1.0);
/// ```
#[derive(Clone, Debug)]
pub struct Adam {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// Decoupled (AdamW) rather than L2 (Adam) weight decay.
    pub decoupled: bool,
}

/// The state of [`Adam`].
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, optim::Adam};
/// let p = Tensor::from_vec(vec![1.0f32, 1.0], [2]).unwrap();
/// let g = Tensor::from_vec(vec![2.0f32, -10.0], [2]).unwrap();
/// let opt = Adam::new(0.1);
/// let (_, s) = opt.update(&p, &g, &opt.init(&p)).unwrap();
/// let (m, v) = (s.m.to_vec::<f32>().unwrap(), s.v.to_vec::<f32>().unwrap());
/// assert!((m[0] - 0.2).abs() < 1e-6 && (m[1] + 1.0).abs() < 1e-6, "{m:?}"); // (1 - β1) g
/// assert!((v[0] - 0.004).abs() < 1e-6 && (v[1] - 0.1).abs() < 1e-6, "{v:?}"); // (1 - β2) g²
/// assert_eq!(s.step.item().unwrap(), 1.0);
/// ```
#[derive(Clone, Debug, crate::Tree)]
pub struct AdamState<P> {
    /// First moments.
    pub m: P,
    /// Second moments.
    pub v: P,
    /// Steps taken, as an f32 scalar.
    pub step: Tensor,
}

impl Adam {
    /// Adam with betas (0.9, 0.999), eps 1e-8, no weight decay.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, optim::Adam};
    /// let opt = Adam::new(0.01);
    /// assert_eq!((opt.beta1, opt.beta2, opt.eps, opt.weight_decay), (0.9, 0.999, 1e-8, 0.0));
    /// // The first step has size lr whatever the gradient's scale.
    /// let p = Tensor::from_vec(vec![0.0f32, 0.0], [2]).unwrap();
    /// let g = Tensor::from_vec(vec![1e-3f32, 1e3], [2]).unwrap();
    /// let (p, _) = opt.update(&p, &g, &opt.init(&p)).unwrap();
    /// assert!(p.to_vec::<f32>().unwrap().iter().all(|x| (x + 0.01).abs() < 1e-6));
    /// ```
    pub fn new(lr: f64) -> Adam {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
        }
    }

    /// AdamW with betas (0.9, 0.999), eps 1e-8 and decoupled weight decay.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, optim::Adam};
    /// let opt = Adam::adamw(0.1, 0.5);
    /// assert!(opt.decoupled);
    /// // A zero gradient: only the decay moves p, by lr * wd * p = 0.1 * 0.5 * 2.
    /// let p = Tensor::from_vec(vec![2.0f32], [1]).unwrap();
    /// let zero = Tensor::from_vec(vec![0.0f32], [1]).unwrap();
    /// let (p, _) = opt.update(&p, &zero, &opt.init(&p)).unwrap();
    /// assert!((p.item().unwrap() - 1.9).abs() < 1e-6);
    /// ```
    pub fn adamw(lr: f64, weight_decay: f64) -> Adam {
        Adam {
            weight_decay,
            decoupled: true,
            ..Adam::new(lr)
        }
    }

    /// Zero moments, step 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, optim::Adam};
    /// let params = vec![Tensor::ones(DType::F32, [3]), Tensor::ones(DType::F32, [2, 2])];
    /// let s = Adam::new(1e-3).init(&params);
    /// assert_eq!((s.m[1].shape(), s.v[0].to_vec::<f32>().unwrap()), (vec![2, 2], vec![0.0; 3]));
    /// assert_eq!(s.step.item().unwrap(), 0.0);
    /// ```
    pub fn init<P: Tree>(&self, params: &P) -> AdamState<P> {
        AdamState {
            m: zeros_like(params),
            v: zeros_like(params),
            step: Tensor::scalar(0.0f32),
        }
    }

    /// One step.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, grad, optim::Adam};
    /// // Minimize (x - 3)²: each step moves x by about lr toward 3.
    /// let loss = |x: &Tensor| (x - 3.0).powf(2.0).sum_all();
    /// let opt = Adam::new(0.5);
    /// let mut x = Tensor::from_vec(vec![0.0f32], [1]).unwrap();
    /// let mut s = opt.init(&x);
    /// for _ in 0..20 {
    ///     (x, s) = opt.update(&x, &grad(loss)(&x), &s).unwrap();
    /// }
    /// assert!((x.item().unwrap() - 3.0).abs() < 0.5, "{x}");
    /// assert_eq!(s.step.item().unwrap(), 20.0);
    /// ```
    #[track_caller]
    pub fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamState<P>,
    ) -> Result<(P, AdamState<P>)> {
        let step = &state.step + 1.0;
        let mut out = zip_leaves(&[params, grads, &state.m, &state.v], |x| {
            let (upd, m, v) = self.step_of(x, &step);
            vec![x[0].sub_scaled(&upd, self.lr), m, v]
        })?;
        let v = out.pop().expect("three outputs");
        let m = out.pop().expect("three outputs");
        Ok((out.pop().expect("three outputs"), AdamState { m, v, step }))
    }

    /// [`Adam::update`] taking the parameters by value: the step is written into each parameter
    /// that nothing else holds (see [`Sgd::step`]); the values are `update`'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, optim::Adam};
    /// let opt = Adam::new(0.1);
    /// let p = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// let g = Tensor::from_vec(vec![0.5f32, -3.0], [2]).unwrap();
    /// let s = opt.init(&p);
    /// let (want, _) = opt.update(&p, &g, &s).unwrap();
    /// let (p, s) = opt.step(p, &g, s).unwrap();
    /// assert_eq!(p.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    /// ```
    #[track_caller]
    pub fn step<P: Tree>(
        &self,
        params: P,
        grads: &P,
        state: AdamState<P>,
    ) -> Result<(P, AdamState<P>)> {
        let step = &state.step + 1.0;
        let mut out = zip_leaves(&[&params, grads, &state.m, &state.v], |x| {
            let (upd, m, v) = self.step_of(x, &step);
            vec![upd, m, v]
        })?;
        let v = out.pop().expect("three outputs");
        let m = out.pop().expect("three outputs");
        let upd = out.pop().expect("three outputs");
        drop(state);
        Ok((step_owned(params, &upd, self.lr), AdamState { m, v, step }))
    }

    /// The update of a parameter (to be scaled by the learning rate and subtracted) and its new
    /// moments, from `x` = the parameter, its gradient and moments, at step `step`.
    fn step_of(&self, x: &[&Tensor], step: &Tensor) -> (Tensor, Tensor, Tensor) {
        let (p, g, m, v) = (x[0], x[1], x[2], x[3]);
        let g = if self.weight_decay != 0.0 && !self.decoupled {
            g + &(p * self.weight_decay)
        } else {
            g.clone()
        };
        let m = &(m * self.beta1) + &(&g * (1.0 - self.beta1));
        let v = &(v * self.beta2) + &(&(&g * &g) * (1.0 - self.beta2));
        let t = step.cast(p.dtype());
        let c1 = 1.0 - &Tensor::full(p.dtype(), [], self.beta1).pow(&t);
        let c2 = 1.0 - &Tensor::full(p.dtype(), [], self.beta2).pow(&t);
        let mhat = &m / &c1;
        let vhat = &v / &c2;
        let mut upd = &mhat / &(&vhat.sqrt() + self.eps);
        if self.decoupled && self.weight_decay != 0.0 {
            upd = &upd + &(p * self.weight_decay);
        }
        (upd, m, v)
    }
}

/// `params - steps * lr`, leaf by leaf, written into each parameter that nothing else holds
/// ([`Tensor::sub_scaled_owned`]): the parameters' leaves are taken out of their tree (its
/// other fields kept in a shell) so that the tree no longer holds them.
fn step_owned<P: Tree>(params: P, steps: &P, lr: f64) -> P {
    let leaves: Vec<Tensor> = params.leaf_vec().into_iter().cloned().collect();
    let shell = params.map_leaves(&mut |_| Tensor::scalar(0.0f32));
    drop(params);
    let new: Vec<Tensor> = leaves
        .into_iter()
        .zip(steps.leaf_vec())
        .map(|(p, step)| p.sub_scaled_owned(step, lr))
        .collect();
    shell.with_leaves(&new)
}

/// Checks that every leaf of a tree is a float tensor (what optimizers update).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, optim::check_float};
/// assert!(check_float(&Tensor::scalar(1.0f32)).is_ok());
/// assert!(check_float(&(Tensor::scalar(1.0f32), Tensor::scalar(1i32))).is_err());
/// ```
#[track_caller]
pub fn check_float<P: Tree>(p: &P) -> Result<()> {
    match p.leaf_vec().iter().find(|t| !t.dtype().is_float()) {
        Some(t) => Err(Error::new(
            "optimizer",
            format!("parameters must be floats, found {t}"),
        )),
        None => Ok(()),
    }
}

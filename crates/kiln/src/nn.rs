//! Layers, initializers and losses. Layers are parameter trees (`#[derive(Tree)]`) with a
//! `forward` method, so a model is a tree, `grad` differentiates with respect to all of it, and
//! a training step compiles into one `jit`.

use crate::random::{Key, normal, split, uniform};
use crate::{DType, Tensor, Tree};

mod losses;
pub use losses::{binary_cross_entropy_with_logits, cross_entropy, cross_entropy_probs, mse};

/// Weight initializers, seeded by keys.
pub mod init {
    use super::*;

    /// U(-b, b) with b = sqrt(6 / fan_in): He/Kaiming uniform for ReLU layers.
    pub fn kaiming_uniform(k: &Key, shape: &[usize], fan_in: usize, dtype: DType) -> Tensor {
        let b = (6.0 / fan_in as f64).sqrt();
        uniform(k, shape, dtype, -b, b)
    }

    /// N(0, 2 / fan_in): He/Kaiming normal.
    pub fn kaiming_normal(k: &Key, shape: &[usize], fan_in: usize, dtype: DType) -> Tensor {
        &normal(k, shape, dtype) * (2.0 / fan_in as f64).sqrt()
    }

    /// U(-b, b) with b = sqrt(6 / (fan_in + fan_out)): Glorot/Xavier uniform.
    pub fn xavier_uniform(
        k: &Key,
        shape: &[usize],
        fan_in: usize,
        fan_out: usize,
        dtype: DType,
    ) -> Tensor {
        let b = (6.0 / (fan_in + fan_out) as f64).sqrt();
        uniform(k, shape, dtype, -b, b)
    }

    /// N(0, 2 / (fan_in + fan_out)): Glorot/Xavier normal.
    pub fn xavier_normal(
        k: &Key,
        shape: &[usize],
        fan_in: usize,
        fan_out: usize,
        dtype: DType,
    ) -> Tensor {
        &normal(k, shape, dtype) * (2.0 / (fan_in + fan_out) as f64).sqrt()
    }
}

/// `y = x W + b`, with `W` of shape `[in, out]`.
#[derive(Clone, Debug, crate::Tree)]
pub struct Linear {
    /// `[in, out]`.
    pub weight: Tensor,
    /// `[out]`, if present.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// PyTorch's default initialization: weight and bias uniform in ±1/sqrt(in).
    pub fn new(k: &Key, input: usize, output: usize, dtype: DType) -> Linear {
        let ks = split(k, 2);
        let b = 1.0 / (input as f64).sqrt();
        Linear {
            weight: uniform(&ks[0], &[input, output], dtype, -b, b),
            bias: Some(uniform(&ks[1], &[output], dtype, -b, b)),
        }
    }

    /// Applies the layer to the last axis of `x`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.matmul(&self.weight);
        match &self.bias {
            Some(b) => &y + b,
            None => y,
        }
    }
}

/// A stack of linear layers with an activation between them.
#[derive(Clone, Debug, crate::Tree)]
pub struct Mlp {
    /// The layers, input first.
    pub layers: Vec<Linear>,
}

impl Mlp {
    /// Layers of widths `dims[0] -> dims[1] -> ...`.
    pub fn new(k: &Key, dims: &[usize], dtype: DType) -> Mlp {
        let ks = split(k, dims.len().max(2) - 1);
        Mlp {
            layers: dims
                .windows(2)
                .zip(&ks)
                .map(|(w, k)| Linear::new(k, w[0], w[1], dtype))
                .collect(),
        }
    }

    /// ReLU between layers, none after the last.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mut h = x.clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h);
            if i + 1 < self.layers.len() {
                h = h.relu();
            }
        }
        h
    }
}

/// Layer normalization over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.
#[derive(Clone, Debug, crate::Tree)]
pub struct LayerNorm {
    /// Scale, `[dim]`.
    pub gamma: Tensor,
    /// Shift, `[dim]`.
    pub beta: Tensor,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// Ones and zeros, eps 1e-5.
    pub fn new(dim: usize, dtype: DType) -> LayerNorm {
        LayerNorm {
            gamma: Tensor::ones(dtype, [dim]),
            beta: Tensor::zeros(dtype, [dim]),
            eps: 1e-5,
        }
    }

    /// Normalizes the last axis.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mean = x.mean(&[-1], true);
        let c = x - &mean;
        let var = (&c * &c).mean(&[-1], true);
        &(&(&c * &(&var + self.eps).rsqrt()) * &self.gamma) + &self.beta
    }
}

/// A lookup table of vectors.
#[derive(Clone, Debug, crate::Tree)]
pub struct Embedding {
    /// `[vocab, dim]`.
    pub table: Tensor,
}

impl Embedding {
    /// N(0, 1) entries, as PyTorch.
    pub fn new(k: &Key, vocab: usize, dim: usize, dtype: DType) -> Embedding {
        Embedding {
            table: normal(k, &[vocab, dim], dtype),
        }
    }

    /// The vectors of integer `ids` (any shape), in a new last axis.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        self.table.take(ids, 0)
    }
}

/// 2-D convolution over NCHW inputs.
#[derive(Clone, Debug, crate::Tree)]
pub struct Conv2d {
    /// `[out, in / groups, kh, kw]`.
    pub weight: Tensor,
    /// `[out]`, if present.
    pub bias: Option<Tensor>,
    /// Stride (rows, columns).
    pub stride: (usize, usize),
    /// Zero padding (rows, columns).
    pub padding: (usize, usize),
    /// Kernel dilation (rows, columns).
    pub dilation: (usize, usize),
    /// Feature groups.
    pub groups: usize,
}

impl Conv2d {
    /// PyTorch's default initialization (uniform in ±1/sqrt(fan_in)).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        k: &Key,
        input: usize,
        output: usize,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        groups: usize,
        dtype: DType,
    ) -> Conv2d {
        let ks = split(k, 2);
        let fan_in = input / groups.max(1) * kernel.0 * kernel.1;
        let b = 1.0 / (fan_in as f64).sqrt();
        Conv2d {
            weight: uniform(
                &ks[0],
                &[output, input / groups.max(1), kernel.0, kernel.1],
                dtype,
                -b,
                b,
            ),
            bias: Some(uniform(&ks[1], &[output], dtype, -b, b)),
            stride,
            padding,
            dilation: (1, 1),
            groups,
        }
    }

    /// Convolves `x` (NCHW).
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.conv2d(
            &self.weight,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
        );
        match &self.bias {
            Some(b) => &y + &b.reshape(&[1, -1, 1, 1]),
            None => y,
        }
    }
}

/// Multi-head self-attention over `[batch, time, dim]`, optionally causal.
#[derive(Clone, Debug, crate::Tree)]
pub struct MultiHeadAttention {
    /// Query projection.
    pub q: Linear,
    /// Key projection.
    pub k: Linear,
    /// Value projection.
    pub v: Linear,
    /// Output projection.
    pub o: Linear,
    /// Number of heads (dividing the model width).
    pub heads: usize,
    /// Whether each position attends only to itself and earlier positions.
    pub causal: bool,
}

impl MultiHeadAttention {
    /// Four `dim x dim` projections.
    pub fn new(
        k: &Key,
        dim: usize,
        heads: usize,
        causal: bool,
        dtype: DType,
    ) -> MultiHeadAttention {
        let ks = split(k, 4);
        let l = |i: usize| Linear::new(&ks[i], dim, dim, dtype);
        MultiHeadAttention {
            q: l(0),
            k: l(1),
            v: l(2),
            o: l(3),
            heads,
            causal,
        }
    }

    /// Attends over the time axis of `x` (`[batch, time, dim]`).
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.shape();
        if s.len() != 3 || !s[2].is_multiple_of(self.heads.max(1)) {
            return Tensor::failed(crate::Error::new(
                "attention",
                format!(
                    "expected [batch, time, dim] with dim divisible by {} heads, got {x}",
                    self.heads
                ),
            ));
        }
        let (b, t, d) = (s[0] as isize, s[1] as isize, s[2]);
        let h = self.heads as isize;
        let dh = (d / self.heads) as isize;
        let split_heads = |y: Tensor| y.reshape(&[b, t, h, dh]).permute(&[0, 2, 1, 3]);
        let (q, k, v) = (
            split_heads(self.q.forward(x)),
            split_heads(self.k.forward(x)),
            split_heads(self.v.forward(x)),
        );
        let att = scaled_dot_product_attention(&q, &k, &v, None, self.causal, None);
        self.o
            .forward(&att.permute(&[0, 2, 1, 3]).reshape(&[b, t, d as isize]))
    }
}

/// Scaled dot-product attention, `softmax(q kᵀ · scale + mask) v`, as PyTorch's
/// `F.scaled_dot_product_attention` and JAX's `jax.nn.dot_product_attention` compute it.
///
/// `q` is `[..., L, E]`, `k` `[..., S, E]` and `v` `[..., S, Ev]`, all of one float dtype; their
/// leading (batch and head) dimensions broadcast as in [`Tensor::matmul`]. The result is
/// `[..., L, Ev]`.
/// - `mask` broadcasts to the scores, `[..., L, S]`: a `pred` mask says which keys each query
///   attends to (the others get no weight); a mask of `q`'s dtype is added to the scores.
/// - `causal`: query `i` attends only to keys `j <= i`, aligned at the top left as in both
///   peers; combined with `mask` when both are given. The mask is computed from indices
///   (`iota`) where it is used, never stored.
/// - `scale` defaults to `1 / sqrt(E)`.
///
/// A query whose keys are all masked out has no defined weights: its row of the result is NaN,
/// as in PyTorch. On the CPU, both products and the softmax compile into one kernel for up to
/// 16384 keys and 256-wide heads (`docs/performance.md`).
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> Tensor {
    let loc = kiln_ir::Loc::caller();
    let fail = |message: String| {
        Tensor::failed(crate::Error::at(
            "scaled_dot_product_attention",
            message,
            loc,
        ))
    };
    let given = [Some(q), Some(k), Some(v), mask];
    if let Some(e) = given.iter().flatten().find_map(|t| t.error()) {
        return Tensor::failed(e.clone());
    }
    let ty = |t: &Tensor| t.ty().map(|t| t.to_string()).unwrap_or_default();
    let got = format!("q {}, k {}, v {}", ty(q), ty(k), ty(v));
    let (sq, sk, sv) = (q.shape(), k.shape(), v.shape());
    let dt = q.dtype();
    if sq.len() < 2 || sk.len() < 2 || sv.len() < 2 || !dt.is_float() {
        return fail(format!(
            "expected float q [..., L, E], k [..., S, E] and v [..., S, Ev], got {got}"
        ));
    }
    if k.dtype() != dt || v.dtype() != dt {
        return fail(format!("q, k and v must have one dtype, got {got}"));
    }
    let last2 = |s: &[usize]| (s[s.len() - 2], s[s.len() - 1]);
    let ((l, e), (s, e_k), (s_v, _)) = (last2(&sq), last2(&sk), last2(&sv));
    if e != e_k {
        return fail(format!(
            "q and k differ in their last dimension (E): q {}, k {}",
            ty(q),
            ty(k)
        ));
    }
    if s != s_v {
        return fail(format!(
            "k and v differ in their number of keys (S): k {}, v {}",
            ty(k),
            ty(v)
        ));
    }
    let batch = [&sq, &sk, &sv].iter().try_fold(Vec::new(), |b, x| {
        kiln_trace::ops::broadcast_shapes(&b, &x[..x.len() - 2])
    });
    let Some(mut scores_shape) = batch else {
        return fail(format!("the batch dimensions do not broadcast: {got}"));
    };
    scores_shape.extend([l, s]);
    let neg_inf = Tensor::full(dt, [], f64::NEG_INFINITY);
    let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
    let mut scores = &q.matmul(&k.t()) * scale;
    if let Some(m) = mask {
        let fits = kiln_trace::ops::broadcast_shapes(&m.shape(), &scores_shape)
            .is_some_and(|b| b == scores_shape);
        if !fits || !(m.dtype() == DType::Pred || m.dtype() == dt) {
            return fail(format!(
                "the mask must be pred or {dt} and broadcast to the scores' shape {}, got {}",
                kiln_ir::ShapeDisplay(&scores_shape),
                ty(m)
            ));
        }
        scores = if m.dtype() == DType::Pred {
            m.where_(&scores, &neg_inf)
        } else {
            &scores + m
        };
    }
    if causal {
        let query = Tensor::iota(DType::I32, &[l, s], 0);
        let key = Tensor::iota(DType::I32, &[l, s], 1);
        scores = key.le(&query).where_(&scores, &neg_inf);
    }
    scores.softmax(-1).matmul(v)
}

/// Dropout: during training, zeroes each element with probability `rate` and scales the rest
/// by 1 / (1 - rate); the identity otherwise.
#[track_caller]
pub fn dropout(x: &Tensor, rate: f64, k: &Key, training: bool) -> Tensor {
    if !training || rate == 0.0 {
        return x.clone();
    }
    let keep = crate::random::bernoulli(k, 1.0 - rate, &x.shape());
    keep.where_(&(x * (1.0 / (1.0 - rate))), &Tensor::zeros(x.dtype(), []))
}

/// The number of scalar parameters in a tree.
pub fn parameter_count<T: Tree>(t: &T) -> usize {
    t.leaf_vec()
        .iter()
        .map(|l| l.shape().iter().product::<usize>())
        .sum()
}

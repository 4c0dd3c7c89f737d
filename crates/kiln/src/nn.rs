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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::init, random};
    /// let w = init::kaiming_uniform(&random::key(0), &[64, 32], 64, DType::F32);
    /// assert_eq!(w.shape(), [64, 32]);
    /// let bound = (6.0f32 / 64.0).sqrt();
    /// assert!(w.to_vec::<f32>().unwrap().iter().all(|v| v.abs() < bound));
    /// ```
    pub fn kaiming_uniform(k: &Key, shape: &[usize], fan_in: usize, dtype: DType) -> Tensor {
        let b = (6.0 / fan_in as f64).sqrt();
        uniform(k, shape, dtype, -b, b)
    }

    /// N(0, 2 / fan_in): He/Kaiming normal.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::init, random};
    /// let w = init::kaiming_normal(&random::key(0), &[100, 50], 8, DType::F32);
    /// let std = w.powf(2.0).mean_all().item().unwrap().sqrt();
    /// assert!((std - 0.5).abs() < 0.03, "{std}"); // sqrt(2 / 8)
    /// ```
    pub fn kaiming_normal(k: &Key, shape: &[usize], fan_in: usize, dtype: DType) -> Tensor {
        &normal(k, shape, dtype) * (2.0 / fan_in as f64).sqrt()
    }

    /// U(-b, b) with b = sqrt(6 / (fan_in + fan_out)): Glorot/Xavier uniform.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::init, random};
    /// let w = init::xavier_uniform(&random::key(0), &[16, 8], 16, 8, DType::F32);
    /// let bound = (6.0f32 / 24.0).sqrt();
    /// assert!(w.to_vec::<f32>().unwrap().iter().all(|v| v.abs() < bound));
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::init, random};
    /// let w = init::xavier_normal(&random::key(0), &[100, 50], 4, 4, DType::F32);
    /// let std = w.powf(2.0).mean_all().item().unwrap().sqrt();
    /// assert!((std - 0.5).abs() < 0.03, "{std}"); // sqrt(2 / (4 + 4))
    /// ```
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
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::Linear, random};
/// let layer = Linear {
///     weight: Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [3, 2]).unwrap(),
///     bias: Some(Tensor::from_vec(vec![0.5f32, -0.5], [2]).unwrap()),
/// };
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [1, 3]).unwrap();
/// assert_eq!(layer.forward(&x).to_vec::<f32>().unwrap(), [4.5, 4.5]);
/// let init = Linear::new(&random::key(0), 3, 2, DType::F32);
/// assert_eq!(init.forward(&Tensor::ones(DType::F32, [5, 3])).shape(), [5, 2]);
/// ```
#[derive(Clone, Debug, crate::Tree)]
pub struct Linear {
    /// `[in, out]`.
    pub weight: Tensor,
    /// `[out]`, if present.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// PyTorch's default initialization: weight and bias uniform in ±1/sqrt(in).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::Linear, random};
    /// let l = Linear::new(&random::key(3), 16, 4, DType::F32);
    /// assert_eq!((l.weight.shape(), l.bias.as_ref().unwrap().shape()), (vec![16, 4], vec![4]));
    /// let w = l.weight.to_vec::<f32>().unwrap();
    /// assert!(w.iter().all(|v| v.abs() <= 0.25)); // 1 / sqrt(16)
    /// let again = Linear::new(&random::key(3), 16, 4, DType::F32); // the same key: the same layer
    /// assert_eq!(again.weight.to_vec::<f32>().unwrap(), w);
    /// ```
    pub fn new(k: &Key, input: usize, output: usize, dtype: DType) -> Linear {
        let ks = split(k, 2);
        let b = 1.0 / (input as f64).sqrt();
        Linear {
            weight: uniform(&ks[0], &[input, output], dtype, -b, b),
            bias: Some(uniform(&ks[1], &[output], dtype, -b, b)),
        }
    }

    /// Applies the layer to the last axis of `x`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, nn::Linear};
    /// // Sums the 3 features, no bias; leading axes are kept.
    /// let l = Linear { weight: Tensor::ones(DType::F32, [3, 1]), bias: None };
    /// let x = Tensor::from_vec((0..12).map(|i| i as f32).collect::<Vec<_>>(), [2, 2, 3]).unwrap();
    /// let y = l.forward(&x);
    /// assert_eq!(y.shape(), [2, 2, 1]);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), [3.0, 12.0, 21.0, 30.0]);
    /// ```
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
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn, random};
/// let mlp = nn::Mlp::new(&random::key(0), &[4, 8, 2], DType::F32);
/// assert_eq!(mlp.layers.len(), 2);
/// assert_eq!(nn::parameter_count(&mlp), 4 * 8 + 8 + 8 * 2 + 2);
/// assert_eq!(mlp.forward(&Tensor::ones(DType::F32, [5, 4])).shape(), [5, 2]);
/// ```
#[derive(Clone, Debug, crate::Tree)]
pub struct Mlp {
    /// The layers, input first.
    pub layers: Vec<Linear>,
}

impl Mlp {
    /// Layers of widths `dims[0] -> dims[1] -> ...`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::Mlp, random};
    /// let mlp = Mlp::new(&random::key(0), &[3, 5, 7, 2], DType::F64);
    /// let shapes: Vec<Vec<usize>> = mlp.layers.iter().map(|l| l.weight.shape()).collect();
    /// assert_eq!(shapes, [vec![3, 5], vec![5, 7], vec![7, 2]]);
    /// assert_eq!(mlp.layers[2].weight.dtype(), DType::F64);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, nn::{Linear, Mlp}};
    /// // x -> (x, -x) -> relu -> sum: |x|, which needs the ReLU in between.
    /// let layer = |w: Vec<f32>, shape: [usize; 2]| Linear {
    ///     weight: Tensor::from_vec(w, shape).unwrap(),
    ///     bias: None,
    /// };
    /// let layers = vec![layer(vec![1.0, -1.0], [1, 2]), layer(vec![1.0, 1.0], [2, 1])];
    /// let mlp = Mlp { layers };
    /// let x = Tensor::from_vec(vec![3.0f32, -2.0], [2, 1]).unwrap();
    /// assert_eq!(mlp.forward(&x).to_vec::<f32>().unwrap(), [3.0, 2.0]);
    /// ```
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
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::LayerNorm};
/// let ln = LayerNorm::new(4, DType::F32);
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 4]).unwrap();
/// let y = ln.forward(&x).to_vec::<f32>().unwrap();
/// // Mean 2.5 and variance 1.25 normalized away.
/// let want = [-1.5f32, -0.5, 0.5, 1.5].map(|c| c / (1.25f32 + 1e-5).sqrt());
/// assert!(y.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-5), "{y:?}");
/// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::LayerNorm};
    /// let ln = LayerNorm::new(3, DType::F32);
    /// assert_eq!(ln.gamma.to_vec::<f32>().unwrap(), [1.0; 3]);
    /// assert_eq!(ln.beta.to_vec::<f32>().unwrap(), [0.0; 3]);
    /// assert_eq!(ln.eps, 1e-5);
    /// ```
    pub fn new(dim: usize, dtype: DType) -> LayerNorm {
        LayerNorm {
            gamma: Tensor::ones(dtype, [dim]),
            beta: Tensor::zeros(dtype, [dim]),
            eps: 1e-5,
        }
    }

    /// Normalizes the last axis.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, nn::LayerNorm};
    /// // Each row of 2 becomes (-1, 1), then scaled by gamma 2 and shifted by beta 1.
    /// let full = |v| Tensor::full(DType::F32, [2], v);
    /// let ln = LayerNorm { gamma: full(2.0), beta: full(1.0), eps: 0.0 };
    /// let x = Tensor::from_vec(vec![1.0f32, 3.0, -5.0, 5.0], [2, 2]).unwrap();
    /// let y = ln.forward(&x).to_vec::<f32>().unwrap();
    /// assert!(y.iter().zip([-1.0, 3.0, -1.0, 3.0]).all(|(a, b)| (a - b).abs() < 1e-5), "{y:?}");
    /// ```
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mean = x.mean(&[-1], true);
        let c = x - &mean;
        let var = (&c * &c).mean(&[-1], true);
        &(&(&c * &(&var + self.eps).rsqrt()) * &self.gamma) + &self.beta
    }
}

/// A lookup table of vectors.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::Embedding, random};
/// let e = Embedding::new(&random::key(0), 10, 3, DType::F32);
/// let ids = Tensor::from_vec(vec![2i32, 0, 2], [3]).unwrap();
/// let v = e.forward(&ids);
/// assert_eq!(v.shape(), [3, 3]);
/// assert_eq!(v.index(0).to_vec::<f32>().unwrap(), e.table.index(2).to_vec::<f32>().unwrap());
/// ```
#[derive(Clone, Debug, crate::Tree)]
pub struct Embedding {
    /// `[vocab, dim]`.
    pub table: Tensor,
}

impl Embedding {
    /// N(0, 1) entries, as PyTorch.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::Embedding, random};
    /// let e = Embedding::new(&random::key(0), 1000, 16, DType::F32);
    /// assert_eq!(e.table.shape(), [1000, 16]);
    /// let var = e.table.powf(2.0).mean_all().item().unwrap();
    /// assert!((var - 1.0).abs() < 0.05, "{var}");
    /// ```
    pub fn new(k: &Key, vocab: usize, dim: usize, dtype: DType) -> Embedding {
        Embedding {
            table: normal(k, &[vocab, dim], dtype),
        }
    }

    /// The vectors of integer `ids` (any shape), in a new last axis.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, nn::Embedding};
    /// let table = Tensor::from_vec(vec![0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], [3, 2]).unwrap();
    /// let e = Embedding { table };
    /// let ids = Tensor::from_vec(vec![2i32, 0, 1, 2], [2, 2]).unwrap();
    /// let v = e.forward(&ids);
    /// assert_eq!(v.shape(), [2, 2, 2]);
    /// assert_eq!(v.to_vec::<f32>().unwrap(), [2.0, 2.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    /// ```
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        self.table.take(ids, 0)
    }
}

/// 2-D convolution over NCHW inputs.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::Conv2d, random};
/// let conv = Conv2d::new(&random::key(0), 3, 8, (3, 3), (1, 1), (1, 1), 1, DType::F32);
/// let y = conv.forward(&Tensor::zeros(DType::F32, [2, 3, 5, 5]));
/// assert_eq!(y.shape(), [2, 8, 5, 5]);
/// // A zero input gives the bias of each output channel everywhere.
/// let bias = conv.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
/// assert_eq!(y.max(&[0, 2, 3], false).to_vec::<f32>().unwrap(), bias);
/// assert_eq!(y.min(&[0, 2, 3], false).to_vec::<f32>().unwrap(), bias);
/// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::Conv2d, random};
    /// // 4 channels in 2 groups: each output channel sees 2 input channels.
    /// let conv = Conv2d::new(&random::key(0), 4, 6, (3, 3), (2, 2), (0, 0), 2, DType::F32);
    /// assert_eq!(conv.weight.shape(), [6, 2, 3, 3]);
    /// let bound = 1.0 / (2.0f32 * 9.0).sqrt();
    /// assert!(conv.weight.to_vec::<f32>().unwrap().iter().all(|w| w.abs() <= bound));
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, nn::Conv2d};
    /// // A 2 x 2 window of ones, stride 2: the sum of each block.
    /// let conv = Conv2d {
    ///     weight: Tensor::ones(DType::F32, [1, 1, 2, 2]),
    ///     bias: Some(Tensor::from_vec(vec![0.5f32], [1]).unwrap()),
    ///     stride: (2, 2), padding: (0, 0), dilation: (1, 1), groups: 1,
    /// };
    /// let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    /// let x = Tensor::from_vec(x, [1, 1, 4, 4]).unwrap();
    /// assert_eq!(conv.forward(&x).to_vec::<f32>().unwrap(), [10.5, 18.5, 42.5, 50.5]);
    /// ```
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
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::MultiHeadAttention, random};
/// let mha = MultiHeadAttention::new(&random::key(0), 8, 2, true, DType::F32);
/// let x = random::normal(&random::key(1), &[1, 4, 8], DType::F32);
/// let y = mha.forward(&x);
/// assert_eq!(y.shape(), [1, 4, 8]);
/// // Causal: changing the last position leaves the first one's output alone.
/// let x2 = Tensor::concat(&[&x.slice(1, 0, 3, 1), &Tensor::zeros(DType::F32, [1, 1, 8])], 1);
/// let (a, b) = (y.slice(1, 0, 1, 1), mha.forward(&x2).slice(1, 0, 1, 1));
/// assert!((&a - &b).abs().max(&[0, 1, 2], false).item().unwrap() < 1e-6);
/// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, nn::{self, MultiHeadAttention}, random};
    /// let mha = MultiHeadAttention::new(&random::key(0), 8, 4, false, DType::F32);
    /// assert_eq!((mha.heads, mha.causal, mha.o.weight.shape()), (4, false, vec![8, 8]));
    /// assert_eq!(nn::parameter_count(&mha), 4 * (8 * 8 + 8));
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, nn::MultiHeadAttention, random};
    /// let mha = MultiHeadAttention::new(&random::key(0), 6, 3, false, DType::F32);
    /// assert_eq!(mha.forward(&Tensor::ones(DType::F32, [2, 5, 6])).shape(), [2, 5, 6]);
    /// // The width must divide among the heads.
    /// let bad = MultiHeadAttention::new(&random::key(0), 6, 4, false, DType::F32);
    /// let err = bad.forward(&Tensor::ones(DType::F32, [2, 5, 6]));
    /// assert!(err.error().unwrap().message.contains("divisible by 4 heads"));
    /// ```
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
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::scaled_dot_product_attention};
/// let q = Tensor::zeros(DType::F32, [2, 2]);
/// let k = Tensor::zeros(DType::F32, [2, 2]);
/// let v = Tensor::from_vec(vec![1.0f32, 3.0], [2, 1]).unwrap();
/// // Equal scores: the mean of the values each query may see.
/// let full = scaled_dot_product_attention(&q, &k, &v, None, false, None);
/// assert_eq!(full.to_vec::<f32>().unwrap(), [2.0, 2.0]);
/// let causal = scaled_dot_product_attention(&q, &k, &v, None, true, None);
/// assert_eq!(causal.to_vec::<f32>().unwrap(), [1.0, 2.0]);
/// ```
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
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, nn::dropout, random};
/// let x = Tensor::ones(DType::F32, [1000]);
/// let y = dropout(&x, 0.5, &random::key(0), true).to_vec::<f32>().unwrap();
/// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0)); // kept ones scaled by 1 / (1 - 0.5)
/// assert!(y.contains(&0.0) && y.contains(&2.0));
/// assert_eq!(dropout(&x, 0.5, &random::key(0), false).to_vec::<f32>().unwrap(), vec![1.0; 1000]);
/// ```
#[track_caller]
pub fn dropout(x: &Tensor, rate: f64, k: &Key, training: bool) -> Tensor {
    if !training || rate == 0.0 {
        return x.clone();
    }
    let keep = crate::random::bernoulli(k, 1.0 - rate, &x.shape());
    keep.where_(&(x * (1.0 / (1.0 - rate))), &Tensor::zeros(x.dtype(), []))
}

/// The number of scalar parameters in a tree.
///
/// # Examples
///
/// ```
/// use kiln::{DType, nn, random};
/// let layer = nn::Linear::new(&random::key(0), 3, 2, DType::F32);
/// assert_eq!(nn::parameter_count(&layer), 3 * 2 + 2);
/// ```
pub fn parameter_count<T: Tree>(t: &T) -> usize {
    t.leaf_vec()
        .iter()
        .map(|l| l.shape().iter().product::<usize>())
        .sum()
}

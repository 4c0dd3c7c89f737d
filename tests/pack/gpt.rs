//! The pack's `transformer_train_step` (`shared/bench/README.md`): one AdamW step of the
//! GPT-style decoder, forward, backward and update in one program over a flat list of tensors,
//! so that `check.py` can compute the same step with PyTorch from the same `.npy` files.
//!
//! Arguments: the parameters ([`param_shapes`]: the token and position embeddings, per layer
//! LayerNorm 1's scale and shift, W_qkv, b_qkv, W_o, b_o, LayerNorm 2's scale and shift, W_fc,
//! b_fc, W_proj, b_proj, then the final LayerNorm's scale and shift and W_head; weights stored
//! `[in, out]`), their first moments in the same order, their second moments, the step count
//! (an f32 scalar, the steps taken before this one) and the tokens (i32 `[batch, seq + 1]`).
//! Results: the new parameters, first and second moments and step count, then the loss (the
//! mean next-token cross-entropy before the step).

use kiln::nn::{cross_entropy, scaled_dot_product_attention};
use kiln::optim::{Adam, AdamState};
use kiln::{DType, Tensor};
use kiln_ir::random::Rng;
use kiln_ir::{Literal, TensorType};

/// The model's sizes.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Vocabulary.
    pub vocab: usize,
    /// Width.
    pub d: usize,
    /// Attention heads.
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
    /// Sequence (the tokens hold one more position: the last target).
    pub seq: usize,
    /// Batch.
    pub batch: usize,
}

/// The benchmark's configuration (batch 16, as the contract's).
pub const FULL: Config = Config {
    vocab: 256,
    d: 256,
    heads: 4,
    layers: 4,
    seq: 128,
    batch: 16,
};

/// The tiny size the emulator runs against the reference interpreter: every kind of kernel of
/// the full step (two blocks, so the carried residual runs through a block's backward).
pub const TINY: Config = Config {
    vocab: 24,
    d: 16,
    heads: 2,
    layers: 2,
    seq: 8,
    batch: 2,
};

/// Tensors per block.
const PER_BLOCK: usize = 12;

/// The parameters' shapes, in the order the program takes them.
pub fn param_shapes(c: Config) -> Vec<Vec<usize>> {
    let d = c.d;
    let mut s = vec![vec![c.vocab, d], vec![c.seq, d]];
    for _ in 0..c.layers {
        s.extend([
            vec![d],
            vec![d],
            vec![d, 3 * d],
            vec![3 * d],
            vec![d, d],
            vec![d],
            vec![d],
            vec![d],
            vec![d, 4 * d],
            vec![4 * d],
            vec![4 * d, d],
            vec![d],
        ]);
    }
    s.extend([vec![d], vec![d], vec![d, c.vocab]]);
    s
}

/// The program's argument types.
pub fn types(c: Config) -> Vec<TensorType> {
    let params = param_shapes(c);
    let f32s = |s: &Vec<usize>| TensorType::new(DType::F32, s.clone());
    let mut t: Vec<TensorType> = params.iter().map(f32s).collect();
    t.extend(params.iter().map(f32s));
    t.extend(params.iter().map(f32s));
    t.push(TensorType::new(DType::F32, vec![]));
    t.push(TensorType::new(DType::I32, vec![c.batch, c.seq + 1]));
    t
}

fn layer_norm(x: &Tensor, g: &Tensor, b: &Tensor) -> Tensor {
    let mean = x.mean(&[-1], true);
    let c = x - &mean;
    let var = (&c * &c).mean(&[-1], true);
    &(&(&c * &(&var + 1e-5).rsqrt()) * g) + b
}

/// A pre-LayerNorm block over `x` `[batch, seq, d]` with its 12 parameters `p`.
fn block(x: &Tensor, p: &[Tensor], heads: usize) -> Tensor {
    let s = x.shape();
    let (b, t, d) = (s[0] as isize, s[1] as isize, s[2] as isize);
    let h = heads as isize;
    let qkv = &layer_norm(x, &p[0], &p[1]).matmul(&p[2]) + &p[3];
    let head = |i: isize| {
        qkv.slice(-1, i * d, (i + 1) * d, 1)
            .reshape(&[b, t, h, d / h])
            .permute(&[0, 2, 1, 3])
    };
    let att = scaled_dot_product_attention(&head(0), &head(1), &head(2), None, true, Some(0.125));
    let att = att.permute(&[0, 2, 1, 3]).reshape(&[b, t, d]);
    let x = &(x + &att.matmul(&p[4])) + &p[5];
    let hidden = (&layer_norm(&x, &p[6], &p[7]).matmul(&p[8]) + &p[9]).gelu(true);
    &(&x + &hidden.matmul(&p[10])) + &p[11]
}

/// The mean next-token cross-entropy of `tokens` under the parameters `p`.
fn loss(p: &[Tensor], tokens: &Tensor, c: Config) -> Tensor {
    let seq = c.seq as isize;
    let inputs = tokens.slice(1, 0, seq, 1);
    let targets = tokens.slice(1, 1, seq + 1, 1);
    let mut x = &p[0].take(&inputs, 0) + &p[1];
    for l in 0..c.layers {
        x = block(&x, &p[2 + PER_BLOCK * l..2 + PER_BLOCK * (l + 1)], c.heads);
    }
    let n = p.len();
    let logits = layer_norm(&x, &p[n - 3], &p[n - 2]).matmul(&p[n - 1]);
    cross_entropy(&logits, &targets)
}

/// The step (see the module's doc) at configuration `c`.
pub fn step(c: Config, a: &[Tensor]) -> Vec<Tensor> {
    let n = param_shapes(c).len();
    let params: Vec<Tensor> = a[..n].to_vec();
    let state = AdamState {
        m: a[n..2 * n].to_vec(),
        v: a[2 * n..3 * n].to_vec(),
        step: a[3 * n].clone(),
    };
    let tokens = &a[3 * n + 1];
    let opt = Adam::adamw(1e-3, 0.01);
    match kiln::value_and_grad(|p: &Vec<Tensor>| loss(p, tokens, c), &params)
        .and_then(|(l, g)| opt.update(&params, &g, &state).map(|(p, s)| (p, s, l)))
    {
        Ok((p, s, l)) => {
            let mut out = p;
            out.extend(s.m);
            out.extend(s.v);
            out.push(s.step);
            out.push(l);
            out
        }
        Err(e) => vec![Tensor::failed(e)],
    }
}

/// Arguments a training run meets at step `steps + 1`, drawn from `seed` (`check.py` makes
/// the GPU size's alike with PyTorch, its weights N(0, 0.02²), biases and shifts 0, scales 1):
/// weights uniform in ±0.035, biases and shifts ±0.01, scales 1 ± 0.1, first moments ±1e-3,
/// second moments in [1e-8, 1e-6), the step count, tokens uniform in the vocabulary.
pub fn inputs(types: &[TensorType], c: Config, steps: f64, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    let n = param_shapes(c).len();
    let scale = |i: usize| {
        // The LayerNorm scales: per block its 1st and 7th tensor, then the final one.
        let in_block = i >= 2 && i < n - 3 && matches!((i - 2) % PER_BLOCK, 0 | 6);
        in_block || i == n - 3
    };
    types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let numel = t.numel();
            if i == 3 * n + 1 {
                let v: Vec<i64> = (0..numel).map(|_| rng.below(c.vocab) as i64).collect();
                return Literal::from_i64s(t.clone(), &v).expect("sizes match");
            }
            let mut draw = |lo: f64, hi: f64, shift: f64| -> Vec<f64> {
                (0..numel).map(|_| shift + rng.uniform(lo, hi)).collect()
            };
            let v = match i {
                _ if i == 3 * n => vec![steps],
                _ if i >= 2 * n => draw(1e-8, 1e-6, 0.0),
                _ if i >= n => draw(-1e-3, 1e-3, 0.0),
                _ if scale(i) => draw(-0.1, 0.1, 1.0),
                _ if t.shape.len() == 1 => draw(-0.01, 0.01, 0.0),
                _ => draw(-0.035, 0.035, 0.0),
            };
            Literal::from_f64s(t.clone(), &v).expect("sizes match")
        })
        .collect()
}

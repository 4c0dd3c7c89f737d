//! `transformer_train_step` (`shared/bench/README.md`): one training step of a GPT-style
//! decoder (vocabulary 256, width 256, 4 heads of 64, 4 layers, sequence 128, batch 16;
//! pre-LayerNorm blocks with a fused QKV projection, causal attention scaled by 1/8 and a
//! tanh-GELU MLP of 1024; untied output projection; mean next-token cross-entropy) with AdamW
//! (lr 1e-3, betas 0.9/0.999, eps 1e-8, decoupled weight decay 0.01), written with kiln's
//! layers and compiled, forward, backward and update, into one function whose parameters and
//! moments are donated from call to call.
//!
//! The weights are drawn from kiln's generator (N(0, 0.02²), as the contract draws them from
//! NumPy's), so the first loss is the contract's to within the logits' spread: ln 256 = 5.545
//! plus a little. The check runs the same step at a smaller configuration (one layer, width
//! 64, sequence 16, batch 2) on the reference interpreter under its ulp bounds, and checks the
//! full-size losses: the first near ln 256, and falling over the timed steps.

use crate::{Timing, agrees, time};
use kiln::nn::{LayerNorm, cross_entropy, scaled_dot_product_attention};
use kiln::optim::{Adam, AdamState};
use kiln::random::{key, normal, split, uniform};
use kiln::{DType, Tensor, jit, value_and_grad};
use std::time::Instant;

/// The model's sizes.
#[derive(Clone, Copy)]
struct Config {
    vocab: usize,
    d: usize,
    heads: usize,
    layers: usize,
    seq: usize,
    batch: usize,
}

/// The contract's configuration.
const FULL: Config = Config {
    vocab: 256,
    d: 256,
    heads: 4,
    layers: 4,
    seq: 128,
    batch: 16,
};

/// The configuration checked on the reference interpreter.
const SMALL: Config = Config {
    vocab: 32,
    d: 64,
    heads: 4,
    layers: 1,
    seq: 16,
    batch: 2,
};

/// One pre-LayerNorm block; weights stored `[in, out]`.
#[derive(Clone, Debug, kiln::Tree)]
struct Block {
    ln1: LayerNorm,
    w_qkv: Tensor,
    b_qkv: Tensor,
    w_o: Tensor,
    b_o: Tensor,
    ln2: LayerNorm,
    w_fc: Tensor,
    b_fc: Tensor,
    w_proj: Tensor,
    b_proj: Tensor,
    /// Attention heads (a static leaf, not a parameter).
    heads: usize,
}

impl Block {
    fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.shape();
        let (b, t, d) = (s[0] as isize, s[1] as isize, s[2] as isize);
        let h = self.heads as isize;
        let qkv = &self.ln1.forward(x).matmul(&self.w_qkv) + &self.b_qkv;
        let head = |i: isize| {
            qkv.slice(-1, i * d, (i + 1) * d, 1)
                .reshape(&[b, t, h, d / h])
                .permute(&[0, 2, 1, 3])
        };
        let att =
            scaled_dot_product_attention(&head(0), &head(1), &head(2), None, true, Some(0.125));
        let att = att.permute(&[0, 2, 1, 3]).reshape(&[b, t, d]);
        let x = &(x + &att.matmul(&self.w_o)) + &self.b_o;
        let hidden = (&self.ln2.forward(&x).matmul(&self.w_fc) + &self.b_fc).gelu(true);
        &(&x + &hidden.matmul(&self.w_proj)) + &self.b_proj
    }
}

/// The decoder.
#[derive(Clone, Debug, kiln::Tree)]
struct Gpt {
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    lnf: LayerNorm,
    w_head: Tensor,
}

impl Gpt {
    /// Weights N(0, 0.02²) drawn in the contract's order, biases 0, LayerNorms 1 and 0.
    fn new(c: Config, seed: u64) -> Gpt {
        let ks = split(&key(seed), 3 + 4 * c.layers);
        let n = |i: usize, shape: &[usize]| &normal(&ks[i], shape, DType::F32) * 0.02;
        let zeros = |n: usize| Tensor::zeros(DType::F32, [n]);
        let blocks = (0..c.layers)
            .map(|l| {
                let k = 2 + 4 * l;
                Block {
                    ln1: LayerNorm::new(c.d, DType::F32),
                    w_qkv: n(k, &[c.d, 3 * c.d]),
                    b_qkv: zeros(3 * c.d),
                    w_o: n(k + 1, &[c.d, c.d]),
                    b_o: zeros(c.d),
                    ln2: LayerNorm::new(c.d, DType::F32),
                    w_fc: n(k + 2, &[c.d, 4 * c.d]),
                    b_fc: zeros(4 * c.d),
                    w_proj: n(k + 3, &[4 * c.d, c.d]),
                    b_proj: zeros(c.d),
                    heads: c.heads,
                }
            })
            .collect();
        Gpt {
            wte: n(0, &[c.vocab, c.d]),
            wpe: n(1, &[c.seq, c.d]),
            blocks,
            lnf: LayerNorm::new(c.d, DType::F32),
            w_head: n(2 + 4 * c.layers, &[c.d, c.vocab]),
        }
    }

    /// Mean next-token cross-entropy of `tokens` (`[batch, seq + 1]` i32).
    fn loss(&self, tokens: &Tensor) -> Tensor {
        let s = tokens.shape();
        let seq = s[1] as isize - 1;
        let inputs = tokens.slice(1, 0, seq, 1);
        let targets = tokens.slice(1, 1, seq + 1, 1);
        let mut x = &self.wte.take(&inputs, 0) + &self.wpe;
        for b in &self.blocks {
            x = b.forward(&x);
        }
        let logits = self.lnf.forward(&x).matmul(&self.w_head);
        cross_entropy(&logits, &targets)
    }
}

type Args = (Gpt, AdamState<Gpt>, Tensor);

/// One AdamW step: (model, moments, tokens) -> (model, moments, loss).
fn step((m, s, tokens): &Args) -> (Gpt, AdamState<Gpt>, Tensor) {
    let opt = Adam::adamw(1e-3, 0.01);
    match value_and_grad(|m: &Gpt| m.loss(tokens), m)
        .and_then(|(l, g)| opt.update(m, &g, s).map(|(m, s)| (m, s, l)))
    {
        Ok(r) => r,
        Err(e) => (m.clone(), s.clone(), Tensor::failed(e)),
    }
}

/// The model, zero moments and a batch of uniformly drawn tokens.
fn args(c: Config) -> Args {
    let m = Gpt::new(c, 5);
    let s = Adam::adamw(1e-3, 0.01).init(&m);
    let tokens = uniform(
        &key(6),
        &[c.batch, c.seq + 1],
        DType::F32,
        0.0,
        c.vocab as f64,
    )
    .floor()
    .cast(DType::I32);
    (m, s, tokens)
}

/// Times the full-size step (carrying parameters and moments, donated) after checking it.
pub fn transformer_train_step(_: usize) -> Result<Timing, String> {
    let e = |e: kiln::Error| e.to_string();
    let (m, s, tokens) = args(FULL);
    let j = jit(step);
    let t = Instant::now();
    let (m, s, first_loss) = j.call_donating((m, s, tokens.clone())).map_err(e)?;
    let first = t.elapsed().as_secs_f64();
    let first_loss = first_loss.item().map_err(e)?;
    let mut state = Some((m, s));
    let mut last_loss = first_loss;
    let t = time(|| {
        let (m, s) = state.take().expect("carried");
        let (m, s, l) = j.call_donating((m, s, tokens.clone())).map_err(e)?;
        state = Some((m, s));
        Ok(l)
    })?;
    if let Some((m, _)) = &state {
        last_loss = m.loss(&tokens).item().map_err(e)?;
    }
    let ln_v = (FULL.vocab as f64).ln();
    if !(first_loss > ln_v - 0.05 && first_loss < ln_v + 0.2) {
        return Err(format!(
            "transformer_train_step: the first loss is {first_loss}, not near ln 256 = {ln_v:.3}"
        ));
    }
    if last_loss.is_nan() || last_loss >= first_loss {
        return Err(format!(
            "transformer_train_step: the loss went from {first_loss} to {last_loss} over the timed steps"
        ));
    }
    // The same step, smaller, against the reference interpreter.
    let small = args(SMALL);
    let got = jit(step).call(&small).map_err(e)?;
    let check_s = agrees("transformer_train_step", step, &small, &got)?;
    Ok(Timing {
        first,
        check_s,
        ..t
    })
}

//! A one-block causal transformer learning a toy sequence task: each sequence repeats a random
//! pattern of 4 tokens, so after the first period the next token is the one 4 positions back,
//! which only attention can find. The step (forward, backward, AdamW) is one `jit`.
//!
//! `cargo run --release -p kiln --example transformer [-- --dump trace|grad]`

use kiln::nn::{Embedding, LayerNorm, Linear, MultiHeadAttention, cross_entropy};
use kiln::optim::{Adam, AdamState};
use kiln::random::{Key, bits, key, split};
use kiln::{DType, Result, Tensor, jit, value_and_grad};

/// Vocabulary size.
pub const VOCAB: usize = 8;
/// Sequence length.
pub const T: usize = 12;
/// Pattern period.
pub const PERIOD: usize = 4;
/// Model width.
pub const D: usize = 32;
/// Sequences per batch.
pub const BATCH: usize = 16;

/// Embeddings, one pre-norm block (attention and a GELU MLP, each with a residual), and a
/// readout.
#[derive(Clone, Debug, kiln::Tree)]
pub struct Model {
    /// Token embeddings.
    pub tok: Embedding,
    /// Position embeddings.
    pub pos: Embedding,
    /// Norm before attention.
    pub ln1: LayerNorm,
    /// Causal self-attention.
    pub attn: MultiHeadAttention,
    /// Norm before the MLP.
    pub ln2: LayerNorm,
    /// MLP up-projection.
    pub up: Linear,
    /// MLP down-projection.
    pub down: Linear,
    /// Final norm.
    pub ln_f: LayerNorm,
    /// Logits.
    pub head: Linear,
}

impl Model {
    /// A seeded model.
    pub fn new(k: &Key) -> Model {
        let ks = split(k, 6);
        let tok = Embedding {
            table: &Embedding::new(&ks[0], VOCAB, D, DType::F32).table * 0.5,
        };
        let pos = Embedding {
            table: &Embedding::new(&ks[1], T, D, DType::F32).table * 0.5,
        };
        Model {
            tok,
            pos,
            ln1: LayerNorm::new(D, DType::F32),
            attn: MultiHeadAttention::new(&ks[2], D, 2, true, DType::F32),
            ln2: LayerNorm::new(D, DType::F32),
            up: Linear::new(&ks[3], D, 4 * D, DType::F32),
            down: Linear::new(&ks[4], 4 * D, D, DType::F32),
            ln_f: LayerNorm::new(D, DType::F32),
            head: Linear::new(&ks[5], D, VOCAB, DType::F32),
        }
    }

    /// Logits `[batch, time, vocab]` for integer tokens `[batch, time]`.
    pub fn forward(&self, tokens: &Tensor) -> Tensor {
        let positions = Tensor::arange(tokens.shape()[1], DType::I32);
        let x = &self.tok.forward(tokens) + &self.pos.forward(&positions);
        let x = &x + &self.attn.forward(&self.ln1.forward(&x));
        let h = self
            .down
            .forward(&self.up.forward(&self.ln2.forward(&x)).gelu(true));
        let x = &x + &h;
        self.head.forward(&self.ln_f.forward(&x))
    }
}

/// A batch of sequences, each repeating a random pattern: (inputs, next-token targets), both
/// `[batch, T - 1]`.
pub fn batch(k: &Key) -> (Tensor, Tensor) {
    let pattern = bits(k, &[BATCH, PERIOD])
        .to_vec::<u32>()
        .unwrap_or_default();
    let seq: Vec<i32> = (0..BATCH)
        .flat_map(|b| (0..T).map(move |t| (b, t)))
        .map(|(b, t)| (pattern[b * PERIOD + t % PERIOD] % VOCAB as u32) as i32)
        .collect();
    let s = Tensor::from_vec(seq, [BATCH, T]).expect("BATCH x T tokens");
    (
        s.slice(1, 0, T as isize - 1, 1),
        s.slice(1, 1, T as isize, 1),
    )
}

/// Mean next-token cross-entropy.
pub fn loss(m: &Model, x: &Tensor, y: &Tensor) -> Tensor {
    let logits = m.forward(x).reshape(&[-1, VOCAB as isize]);
    cross_entropy(&logits, &y.reshape(&[-1]))
}

/// Trains for `steps` steps on fresh batches; returns (first loss, last loss, compiles).
pub fn run(steps: usize, verbose: bool) -> Result<(f64, f64, usize)> {
    let opt = Adam::adamw(3e-3, 0.01);
    let mut m = Model::new(&key(11));
    let mut s = opt.init(&m);
    let train =
        jit(|(m, s, x, y): &(Model, AdamState<Model>, Tensor, Tensor)| {
            match value_and_grad(|m: &Model| loss(m, x, y), m)
                .and_then(|(l, g)| opt.update(m, &g, s).map(|(m, s)| (m, s, l)))
            {
                Ok(r) => r,
                Err(e) => (m.clone(), s.clone(), Tensor::failed(e)),
            }
        });
    let keys = split(&key(12), steps);
    let (mut first, mut last) = (None, 0.0);
    for (i, k) in keys.iter().enumerate() {
        let (x, y) = batch(k);
        let (m2, s2, l) = train.call(&(m, s, x, y))?;
        (m, s) = (m2, s2);
        last = l.item()?;
        first.get_or_insert(last);
        if verbose && (i % 25 == 0 || i + 1 == steps) {
            println!("step {i:4}  loss {last:.4}");
        }
    }
    Ok((first.unwrap_or(last), last, train.compiles()))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--dump") {
        let (x, y) = batch(&key(0));
        let m = Model::new(&key(11));
        let ir = match args.get(i + 1).map(String::as_str) {
            Some("grad") => kiln::lower::grad_ir(|m: &Model| loss(m, &x, &y), &m)?,
            _ => kiln::lower::trace_ir(|m: &Model| loss(m, &x, &y), &m)?,
        };
        print!("{ir}");
        return Ok(());
    }
    println!(
        "kiln: a one-block transformer ({} parameters) on repeating sequences",
        kiln::nn::parameter_count(&Model::new(&key(11)))
    );
    let (first, last, compiles) = run(150, true)?;
    println!("loss {first:.4} -> {last:.4} ({compiles} compile)");
    if last > 0.5 * first {
        eprintln!("the loss did not fall by half");
        std::process::exit(1);
    }
    Ok(())
}

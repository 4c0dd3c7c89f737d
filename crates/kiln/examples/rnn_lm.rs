//! A character-level recurrent language model trained with `scan`: each training step runs the
//! recurrence over a window of the text (`kiln::control::scan`, one `while` loop in the
//! compiled program), differentiates through it (the loop's reverse mode), and updates with
//! AdamW, all in one `jit`. Then it writes text from a prompt, one character at a time.
//!
//! The text is `examples/data/firing.txt` (written for kiln).
//!
//! `cargo run --release -p kiln --example rnn_lm`

use kiln::control::scan;
use kiln::nn::{Embedding, Linear, cross_entropy};
use kiln::optim::{Adam, AdamState};
use kiln::random::{Key, bits, key, split};
use kiln::train::{LossCurve, Progress};
use kiln::{DType, Result, Tensor, jit, value_and_grad};

/// The training text.
pub const TEXT: &str = include_str!("data/firing.txt");
/// Characters per training window.
pub const T: usize = 24;
/// Windows per batch.
pub const BATCH: usize = 16;
/// Embedding width.
pub const E: usize = 16;
/// Hidden state width.
pub const H: usize = 96;

/// The text's characters, sorted: token `i` is `vocab()[i]`.
pub fn vocab() -> Vec<char> {
    let mut v: Vec<char> = TEXT.chars().collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn encode(s: &str, vocab: &[char]) -> Vec<i32> {
    s.chars()
        .map(|c| vocab.iter().position(|&v| v == c).unwrap_or(0) as i32)
        .collect()
}

/// An Elman RNN: embedding, `h' = tanh(x Wx + h Wh + b)`, and a readout.
#[derive(Clone, Debug, kiln::Tree)]
pub struct Rnn {
    /// Character embeddings.
    pub embed: Embedding,
    /// Input to hidden (with the bias).
    pub wx: Linear,
    /// Hidden to hidden.
    pub wh: Tensor,
    /// Hidden to logits.
    pub head: Linear,
}

impl Rnn {
    /// A seeded model over `vocab` characters, in `dtype`.
    pub fn new(k: &Key, vocab: usize, dtype: DType) -> Rnn {
        Rnn::sized(k, vocab, E, H, dtype)
    }

    /// A seeded model with embedding width `e` and state width `h`.
    pub fn sized(k: &Key, vocab: usize, e: usize, h: usize, dtype: DType) -> Rnn {
        let ks = split(k, 4);
        Rnn {
            embed: Embedding::new(&ks[0], vocab, e, dtype),
            wx: Linear::new(&ks[1], e, h, dtype),
            wh: &Linear::new(&ks[2], h, h, dtype).weight * 0.5,
            head: Linear::new(&ks[3], h, vocab, dtype),
        }
    }

    /// One step of the recurrence.
    pub fn cell(&self, h: &Tensor, x: &Tensor) -> Tensor {
        self.wx.forward(x).add(&h.matmul(&self.wh)).tanh()
    }

    /// Logits `[T, batch, vocab]` for tokens `[T, batch]`, from a zero state.
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let batch = tokens.shape()[1];
        let xs = self.embed.forward(tokens);
        let h0 = Tensor::zeros(self.wh.dtype(), [batch, self.wh.shape()[0]]);
        let step = |h: &Tensor, x: &Tensor| {
            let h2 = self.cell(h, x);
            (h2.clone(), h2)
        };
        let (_, hs) = scan(step, h0, &xs)?;
        Ok(self.head.forward(&hs))
    }
}

/// Mean next-character cross-entropy over a batch of windows `[T + 1, batch]`.
pub fn loss(m: &Rnn, windows: &Tensor) -> Tensor {
    let x = windows.slice(0, 0, T as isize, 1);
    let y = windows.slice(0, 1, T as isize + 1, 1);
    match m.forward(&x) {
        Ok(logits) => {
            let v = logits.shape()[2] as isize;
            cross_entropy(&logits.reshape(&[-1, v]), &y.reshape(&[-1]))
        }
        Err(e) => Tensor::failed(e),
    }
}

/// The text as tokens.
pub fn tokens() -> Vec<i32> {
    encode(TEXT, &vocab())
}

/// `BATCH` random windows of `T + 1` characters, as tokens `[T + 1, BATCH]`.
pub fn batch(k: &Key, tokens: &[i32]) -> Tensor {
    windows(k, tokens, BATCH)
}

/// `n` random windows of `T + 1` characters, as tokens `[T + 1, n]`.
pub fn windows(k: &Key, tokens: &[i32], n: usize) -> Tensor {
    let starts = bits(k, &[n]).to_vec::<u32>().unwrap_or_default();
    let span = tokens.len() - T - 1;
    let mut w = vec![0i32; (T + 1) * n];
    for (b, s) in starts.iter().enumerate() {
        let s = *s as usize % span;
        for t in 0..=T {
            w[t * n + b] = tokens[s + t];
        }
    }
    Tensor::from_vec(w, [T + 1, n]).expect("(T + 1) x n tokens")
}

/// Trains for `steps` steps; returns the model, the first and last losses and the number of
/// compiles. When `verbose`, shows progress (stderr) and writes the loss curve, with the loss
/// on a fixed held-out batch every 40 steps, as `kiln-rnn_lm-loss.png` and `.csv` in the
/// temporary directory.
pub fn run(steps: usize, verbose: bool) -> Result<(Rnn, f64, f64, usize)> {
    let vocab = vocab();
    let tokens = tokens();
    let opt = Adam::adamw(1e-2, 0.0);
    let mut m = Rnn::new(&key(5), vocab.len(), DType::F32);
    let mut s = opt.init(&m);
    let train = jit(|(m, s, w): &(Rnn, AdamState<Rnn>, Tensor)| {
        match value_and_grad(|m: &Rnn| loss(m, w), m)
            .and_then(|(l, g)| opt.update(m, &g, s).map(|(m, s)| (m, s, l)))
        {
            Ok(r) => r,
            Err(e) => (m.clone(), s.clone(), Tensor::failed(e)),
        }
    });
    let keys = split(&key(6), steps);
    let (mut first, mut last) = (None, 0.0);
    let mut progress = if verbose {
        Progress::new(steps, BATCH)
    } else {
        Progress::quiet(steps, BATCH)
    };
    let mut curve = LossCurve::new();
    // The windows of another key, never trained on as a batch of their own.
    let heldout = batch(&key(99), &tokens);
    let eval = jit(|(m, w): &(Rnn, Tensor)| loss(m, w));
    for (i, k) in keys.iter().enumerate() {
        let (m2, s2, l) = train.call(&(m, s, batch(k, &tokens)))?;
        (m, s) = (m2, s2);
        last = l.item()?;
        first.get_or_insert(last);
        progress.step(last as f32);
        curve.push(i, last as f32);
        if verbose && (i % 40 == 0 || i + 1 == steps) {
            let h = eval.call(&(m.clone(), heldout.clone()))?.item()?;
            curve.push_heldout(i, h as f32);
        }
    }
    progress.finish();
    if verbose {
        let out = std::env::temp_dir().join("kiln-rnn_lm-loss");
        curve.save_png(out.with_extension("png"), 800, 500)?;
        curve.save_csv(out.with_extension("csv"))?;
        println!("loss curve: {}", out.with_extension("png").display());
    }
    Ok((m, first.unwrap_or(last), last, train.compiles()))
}

/// `n` characters after `prompt`, each the most likely next one.
pub fn generate(m: &Rnn, prompt: &str, n: usize) -> Result<String> {
    let vocab = vocab();
    let step = jit(|(m, h, c): &(Rnn, Tensor, Tensor)| {
        let h2 = m.cell(h, &m.embed.forward(c));
        let next = m.head.forward(&h2).argmax(-1, false);
        (h2, next)
    });
    let mut h = Tensor::zeros(DType::F32, [1, H]);
    let mut next = 0;
    for t in encode(prompt, &vocab) {
        let (h2, n2) = step.call(&(m.clone(), h, Tensor::from_vec(vec![t], [1])?))?;
        h = h2;
        next = token(&n2)?;
    }
    let mut out = String::new();
    for _ in 0..n {
        out.push(vocab[next as usize]);
        let (h2, n2) = step.call(&(m.clone(), h, Tensor::from_vec(vec![next], [1])?))?;
        h = h2;
        next = token(&n2)?;
    }
    Ok(out)
}

fn token(t: &Tensor) -> Result<i32> {
    Ok(t.cast(DType::I32).to_vec::<i32>()?[0])
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let vocab = vocab();
    println!(
        "kiln: a character RNN ({} parameters, {} characters) trained with scan on {} characters of text",
        kiln::nn::parameter_count(&Rnn::new(&key(5), vocab.len(), DType::F32)),
        vocab.len(),
        TEXT.len()
    );
    let (m, first, last, compiles) = run(400, true)?;
    println!("loss {first:.4} -> {last:.4} ({compiles} compile)");
    let prompt = "the potter ";
    println!("{prompt}{}", generate(&m, prompt, 120)?);
    if last > 0.6 * first {
        eprintln!("the loss did not fall by 40%");
        std::process::exit(1);
    }
    Ok(())
}

//! A GPT-style character-level transformer trained on Shakespeare (`examples/data/shakespeare.txt`,
//! public domain): token and position embeddings, pre-norm blocks of causal self-attention and a
//! GELU MLP, and a readout. The whole training step (forward, backward, AdamW) is one `jit`.
//!
//! The run shows a progress bar, evaluates the loss on held-out text (the last tenth of the
//! file, never trained on), writes the loss curve (PNG and CSV) and a checkpoint (read back to
//! check it), writes text from a prompt, and times the compiled step against the same step run
//! eagerly, op by op, without compiling it as a whole.
//!
//! `cargo run --release -p kiln --example char_transformer [-- --steps N] [--out DIR] [--small]`
//! (`cargo xtask demo` runs it; `--small` runs the tests' scaled-down model; `--dump trace|grad`
//! prints the loss's IR instead).

use kiln::checkpoint::{Metadata, TrainState};
use kiln::ir::Loc;
use kiln::nn::{Embedding, LayerNorm, Linear, MultiHeadAttention, cross_entropy, parameter_count};
use kiln::optim::{Adam, AdamState};
use kiln::random::{Key, bits, key, split, uniform};
use kiln::train::{LossCurve, Progress};
use kiln::{DType, Error, Result, Tensor, Tree, jit, value_and_grad};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The text: the first 300 KB of a collection of Shakespeare's plays.
pub const TEXT: &str = include_str!("data/shakespeare.txt");

/// Sizes and lengths of a run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Transformer blocks.
    pub layers: usize,
    /// Model width.
    pub d: usize,
    /// Attention heads.
    pub heads: usize,
    /// Characters of context.
    pub ctx: usize,
    /// Windows per batch.
    pub batch: usize,
    /// Training steps.
    pub steps: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// Steps between held-out evaluations.
    pub eval_every: usize,
    /// Batches of held-out windows per evaluation.
    pub eval_batches: usize,
    /// Steps run eagerly to time them, after two untimed ones (0: none).
    pub eager_steps: usize,
}

impl Config {
    /// The demo's run: about three minutes on two cores.
    pub fn demo() -> Config {
        Config {
            layers: 4,
            d: 128,
            heads: 4,
            ctx: 64,
            batch: 16,
            steps: 2000,
            lr: 3e-3,
            eval_every: 100,
            eval_batches: 8,
            eager_steps: 3,
        }
    }

    /// A run of seconds, for tests.
    pub fn small() -> Config {
        Config {
            layers: 2,
            d: 64,
            heads: 4,
            ctx: 32,
            batch: 16,
            steps: 300,
            lr: 5e-3,
            eval_every: 100,
            eval_batches: 4,
            eager_steps: 0,
        }
    }
}

/// The text's characters, sorted: token `i` is `vocab()[i]`.
pub fn vocab() -> Vec<char> {
    let mut v: Vec<char> = TEXT.chars().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The tokens of `s`; a character outside the vocabulary is an error naming the caller's line.
#[track_caller]
pub fn encode(s: &str, vocab: &[char]) -> Result<Vec<i32>> {
    let loc = Loc::caller();
    s.chars()
        .map(|c| match vocab.binary_search(&c) {
            Ok(i) => Ok(i as i32),
            Err(_) => Err(Error::at(
                "encode",
                format!("{c:?} is not one of the text's {} characters", vocab.len()),
                loc,
            )),
        })
        .collect()
}

/// The text as tokens, split into training text (the first nine tenths) and held-out text.
pub fn split_text() -> (Vec<i32>, Vec<i32>) {
    let mut train = encode(TEXT, &vocab()).expect("the text's own characters");
    let heldout = train.split_off(train.len() * 9 / 10);
    (train, heldout)
}

/// One pre-norm block: causal self-attention and a GELU MLP, each with a residual.
#[derive(Clone, Debug, kiln::Tree)]
pub struct Block {
    /// Norm before attention.
    pub ln1: LayerNorm,
    /// Causal self-attention.
    pub attn: MultiHeadAttention,
    /// Norm before the MLP.
    pub ln2: LayerNorm,
    /// MLP up-projection (4x wide).
    pub up: Linear,
    /// MLP down-projection.
    pub down: Linear,
}

/// Embeddings, blocks, a final norm and a readout.
#[derive(Clone, Debug, kiln::Tree)]
pub struct Gpt {
    /// Token embeddings.
    pub tok: Embedding,
    /// Position embeddings.
    pub pos: Embedding,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// Final norm.
    pub ln_f: LayerNorm,
    /// Logits.
    pub head: Linear,
}

impl Gpt {
    /// A seeded model over `vocab` characters.
    pub fn new(k: &Key, vocab: usize, c: &Config) -> Gpt {
        let ks = split(k, 3 + c.layers);
        let ds = split(&ks[2], 2);
        let small = |t: Tensor| &t * 0.1;
        let blocks = (0..c.layers)
            .map(|i| {
                let bk = split(&ks[3 + i], 3);
                Block {
                    ln1: LayerNorm::new(c.d, DType::F32),
                    attn: MultiHeadAttention::new(&bk[0], c.d, c.heads, true, DType::F32),
                    ln2: LayerNorm::new(c.d, DType::F32),
                    up: Linear::new(&bk[1], c.d, 4 * c.d, DType::F32),
                    down: Linear::new(&bk[2], 4 * c.d, c.d, DType::F32),
                }
            })
            .collect();
        Gpt {
            tok: Embedding {
                table: small(Embedding::new(&ks[0], vocab, c.d, DType::F32).table),
            },
            pos: Embedding {
                table: small(Embedding::new(&ks[1], c.ctx, c.d, DType::F32).table),
            },
            blocks,
            ln_f: LayerNorm::new(c.d, DType::F32),
            head: Linear::new(&ds[0], c.d, vocab, DType::F32),
        }
    }

    /// Logits `[batch, time, vocab]` for tokens `[batch, time]` (time at most the context).
    pub fn forward(&self, tokens: &Tensor) -> Tensor {
        let positions = Tensor::arange(tokens.shape()[1], DType::I32);
        let mut x = &self.tok.forward(tokens) + &self.pos.forward(&positions);
        for b in &self.blocks {
            x = &x + &b.attn.forward(&b.ln1.forward(&x));
            x = &x + &b.down.forward(&b.up.forward(&b.ln2.forward(&x)).gelu(true));
        }
        self.head.forward(&self.ln_f.forward(&x))
    }
}

/// Mean next-character cross-entropy over windows `[batch, ctx + 1]`.
pub fn loss(m: &Gpt, windows: &Tensor) -> Tensor {
    let n = windows.shape()[1] as isize;
    let x = windows.slice(1, 0, n - 1, 1);
    let y = windows.slice(1, 1, n, 1);
    let logits = m.forward(&x);
    let v = logits.shape()[2] as isize;
    cross_entropy(&logits.reshape(&[-1, v]), &y.reshape(&[-1]))
}

/// `batch` windows of `ctx + 1` tokens starting where `starts` say (modulo the room left).
fn windows(tokens: &[i32], starts: &[usize], ctx: usize) -> Tensor {
    let span = tokens.len() - ctx - 1;
    let w: Vec<i32> = starts
        .iter()
        .flat_map(|s| tokens[s % span..][..=ctx].iter().copied())
        .collect();
    Tensor::from_vec(w, [starts.len(), ctx + 1]).expect("batch x (ctx + 1) tokens")
}

/// A batch of random windows of the training text.
pub fn batch(k: &Key, tokens: &[i32], c: &Config) -> Tensor {
    let starts: Vec<usize> = bits(k, &[c.batch])
        .to_vec::<u32>()
        .unwrap_or_default()
        .into_iter()
        .map(|s| s as usize)
        .collect();
    windows(tokens, &starts, c.ctx)
}

/// The held-out batches: windows spread evenly over the held-out text.
pub fn heldout_batches(tokens: &[i32], c: &Config) -> Vec<Tensor> {
    let n = c.eval_batches * c.batch;
    let span = tokens.len() - c.ctx - 1;
    let starts: Vec<usize> = (0..n).map(|i| i * span / n).collect();
    starts
        .chunks(c.batch)
        .map(|s| windows(tokens, s, c.ctx))
        .collect()
}

/// The state a step carries: parameters, optimizer state, a batch.
pub type StepArgs = (Gpt, AdamState<Gpt>, Tensor);

/// One training step: loss and gradients, then an AdamW update.
pub fn train_step(opt: &Adam, (m, s, w): &StepArgs) -> (Gpt, AdamState<Gpt>, Tensor) {
    match value_and_grad(|m: &Gpt| loss(m, w), m)
        .and_then(|(l, g)| opt.update(m, &g, s).map(|(m, s)| (m, s, l)))
    {
        Ok(r) => r,
        Err(e) => (m.clone(), s.clone(), Tensor::failed(e)),
    }
}

/// What a run leaves.
pub struct Report {
    /// The trained model.
    pub model: Gpt,
    /// Its optimizer state.
    pub state: AdamState<Gpt>,
    /// The first step's training loss (nats per character).
    pub first_loss: f64,
    /// The last step's training loss.
    pub last_loss: f64,
    /// The loss on the held-out text after the last step.
    pub heldout_loss: f64,
    /// Compiles of the training step.
    pub compiles: usize,
    /// The first compiled step's time (compiling included), in milliseconds.
    pub first_step_ms: f64,
    /// The median compiled step's time after the first, in milliseconds.
    pub step_ms: f64,
    /// The median time of the same step run op by op (`kiln::lower::run_op_by_op`) after the
    /// first two, in milliseconds (if timed).
    pub eager_ms: Option<f64>,
    /// The loss curve.
    pub curve: LossCurve,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Trains a model as `c` says, showing progress on stderr when `verbose`.
pub fn run(c: &Config, verbose: bool) -> Result<Report> {
    let (train_tokens, heldout_tokens) = split_text();
    let opt = Adam::adamw(c.lr, 0.01);
    let mut m = Gpt::new(&key(1), vocab().len(), c);
    let mut s = opt.init(&m);
    let train = jit(|a: &StepArgs| train_step(&opt, a));
    let eval = jit(|(m, w): &(Gpt, Tensor)| loss(m, w));
    let heldout = heldout_batches(&heldout_tokens, c);
    let eval_all = |m: &Gpt| -> Result<f64> {
        let mut sum = 0.0;
        for w in &heldout {
            sum += eval.call(&(m.clone(), w.clone()))?.item()?;
        }
        Ok(sum / heldout.len() as f64)
    };
    let mut progress = if verbose {
        Progress::new(c.steps, c.batch)
    } else {
        Progress::quiet(c.steps, c.batch)
    };
    let mut curve = LossCurve::new();
    let keys = split(&key(2), c.steps);
    let (mut first, mut last, mut heldout_loss) = (None, f64::NAN, f64::NAN);
    let mut times = Vec::with_capacity(c.steps);
    for (i, k) in keys.iter().enumerate() {
        let w = batch(k, &train_tokens, c);
        let t0 = Instant::now();
        // Donated: the update writes the parameters and moments in place.
        let (m2, s2, l) = train.call_donating((m, s, w))?;
        last = l.item()?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        (m, s) = (m2, s2);
        first.get_or_insert(last);
        progress.step(last as f32);
        curve.push(i, last as f32);
        if i % c.eval_every == 0 || i + 1 == c.steps {
            heldout_loss = eval_all(&m)?;
            curve.push_heldout(i, heldout_loss as f32);
        }
    }
    progress.finish();
    // The same step without kiln's compiler: the step's program (forward, backward and
    // update, as `jit` traces it) run one op at a time as eager ops. An eager op of a new
    // signature runs natively the first time and is compiled by itself the second (for the
    // ops whose kernels are much faster: products, exponentials), so the first two steps are
    // not timed.
    let eager_ms = if c.eager_steps > 0 {
        let mut t = Vec::new();
        let (mut em, mut es) = (m.clone(), s.clone());
        for k in split(&key(3), c.eager_steps + 2) {
            let args = (em, es, batch(&k, &train_tokens, c));
            let program = kiln::lower::trace_ir(|a: &StepArgs| train_step(&opt, a), &args)?;
            let t0 = Instant::now();
            let outs = kiln::lower::run_op_by_op(&program, &args.leaf_vec())?;
            let (m2, s2, l) =
                (args.0.clone(), args.1.clone(), Tensor::scalar(0.0f32)).with_leaves(&outs);
            l.item()?;
            t.push(t0.elapsed().as_secs_f64() * 1e3);
            (em, es) = (m2, s2);
        }
        Some(median(t[2..].to_vec()))
    } else {
        None
    };
    Ok(Report {
        model: m,
        state: s,
        first_loss: first.unwrap_or(last),
        last_loss: last,
        heldout_loss,
        compiles: train.compiles(),
        first_step_ms: times.first().copied().unwrap_or(f64::NAN),
        step_ms: median(times.get(1..).unwrap_or_default().to_vec()),
        eager_ms,
        curve,
    })
}

/// `n` characters after `prompt`, each drawn from the model's next-character distribution at
/// `temperature` (Gumbel-max sampling with noise from `k`; the same key gives the same text).
#[track_caller]
pub fn generate(m: &Gpt, prompt: &str, n: usize, temperature: f64, k: &Key) -> Result<String> {
    let vocab = vocab();
    let ctx = m.pos.table.shape()[0];
    let mut text = encode(prompt, &vocab)?;
    if text.is_empty() || temperature.is_nan() || temperature <= 0.0 {
        return Err(Error::at(
            "generate",
            format!("needs a prompt and a positive temperature, got {prompt:?} at {temperature}"),
            Loc::caller(),
        ));
    }
    let next = jit(|(m, w, at, u): &(Gpt, Tensor, Tensor, Tensor)| {
        let logits = m.forward(w).reshape(&[ctx as isize, -1]).take(at, 0);
        let gumbel = -&(-&u.log()).log();
        (&(&logits / temperature) + &gumbel).argmax(-1, false)
    });
    let noise = uniform(k, &[n, vocab.len()], DType::F32, 1e-7, 1.0).to_vec::<f32>()?;
    let mut out = String::new();
    for u in noise.chunks(vocab.len()) {
        let window = &text[text.len().saturating_sub(ctx)..];
        let mut w = window.to_vec();
        w.resize(ctx, 0);
        let at = Tensor::from_vec(vec![window.len() as i32 - 1], [1])?;
        let args = (
            m.clone(),
            Tensor::from_vec(w, [1, ctx])?,
            at,
            Tensor::from_vec(u.to_vec(), [1, vocab.len()])?,
        );
        let t = next.call(&args)?.cast(DType::I32).to_vec::<i32>()?[0];
        text.push(t);
        out.push(vocab[t as usize]);
    }
    Ok(out)
}

/// Saves the model and its optimizer state to `path`, reads it back and checks that every
/// tensor came back bit for bit; returns the loaded model.
pub fn save_and_reload(
    path: &Path,
    m: &Gpt,
    s: &AdamState<Gpt>,
    step: u64,
    k: &Key,
) -> Result<Gpt> {
    let state = TrainState {
        params: m.clone(),
        opt_state: s.clone(),
        key: k.clone(),
        step,
    };
    let mut user = Metadata::new(step).user;
    user.insert("example".into(), "char_transformer".into());
    user.insert("vocab".into(), vocab().into_iter().collect());
    state.save(path, &user)?;
    let (back, meta) = TrainState::load(path, &state)?;
    let same = |a: &Tensor, b: &Tensor| -> Result<bool> {
        Ok(a.to_literal()?.to_f64s() == b.to_literal()?.to_f64s())
    };
    let (want, got) = (state.leaf_vec(), back.leaf_vec());
    let mut equal = want.len() == got.len() && meta.step == step;
    for (a, b) in want.iter().zip(&got) {
        equal &= same(a, b)?;
    }
    if !equal {
        return Err(Error::new(
            "checkpoint",
            format!("{} did not read back as written", path.display()),
        ));
    }
    Ok(back.params)
}

/// The output directory: `--out DIR`, else `char_transformer` in the temporary directory.
fn out_dir(args: &[String]) -> PathBuf {
    match args.iter().position(|a| a == "--out") {
        Some(i) if i + 1 < args.len() => PathBuf::from(&args[i + 1]),
        _ => std::env::temp_dir().join("kiln-char_transformer"),
    }
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mut c = if args.iter().any(|a| a == "--small") {
        Config::small()
    } else {
        Config::demo()
    };
    if let Some(i) = args.iter().position(|a| a == "--dump") {
        // The loss's traced or gradient IR (`cargo xtask dump --example char_transformer`).
        let (train_tokens, _) = split_text();
        let w = batch(&key(0), &train_tokens, &c);
        let m = Gpt::new(&key(1), vocab().len(), &c);
        let ir = match args.get(i + 1).map(String::as_str) {
            Some("grad") => kiln::lower::grad_ir(|m: &Gpt| loss(m, &w), &m)?,
            _ => kiln::lower::trace_ir(|m: &Gpt| loss(m, &w), &m)?,
        };
        print!("{ir}");
        return Ok(());
    }
    if let Some(i) = args.iter().position(|a| a == "--steps") {
        c.steps = match args.get(i + 1).and_then(|s| s.parse().ok()) {
            Some(n) if n > 0 => n,
            _ => {
                return Err(Error::new(
                    "char_transformer",
                    "--steps needs a positive count",
                ));
            }
        };
    }
    let out = out_dir(&args);
    std::fs::create_dir_all(&out)
        .map_err(|e| Error::new("char_transformer", format!("{}: {e}", out.display())))?;
    let (_, heldout_tokens) = split_text();
    println!(
        "kiln: a character transformer ({} layers, width {}, {} heads, {} characters of context, \
         {} parameters) on {} KB of Shakespeare ({} characters, {} held out)",
        c.layers,
        c.d,
        c.heads,
        c.ctx,
        parameter_count(&Gpt::new(&key(1), vocab().len(), &c)),
        TEXT.len() / 1000,
        vocab().len(),
        heldout_tokens.len(),
    );
    println!(
        "training {} steps of {} windows of {} characters, each step one compiled function",
        c.steps, c.batch, c.ctx
    );
    let r = run(&c, true)?;
    println!(
        "loss {:.3} -> {:.3} nats/char (train), {:.3} held out ({} compile)",
        r.first_loss, r.last_loss, r.heldout_loss, r.compiles
    );
    let png = out.join("loss.png");
    r.curve.save_png(&png, 800, 500)?;
    r.curve.save_csv(out.join("loss.csv"))?;
    let ckpt = out.join("char_transformer.safetensors");
    let loaded = save_and_reload(&ckpt, &r.model, &r.state, c.steps as u64, &key(2))?;
    let prompt = "ROMEO:\n";
    let sample = generate(&loaded, prompt, 400, 0.8, &key(4))?;
    println!("\n{prompt}{sample}\n");
    println!(
        "step time, compiled: {:.1} ms (median; the first, compiling, {:.0} ms)",
        r.step_ms, r.first_step_ms
    );
    if let Some(e) = r.eager_ms {
        println!(
            "step time, eager (op by op, no whole-step compile): {e:.1} ms: compiled is {:.1}x faster",
            e / r.step_ms
        );
    }
    println!(
        "{} characters trained on in {:.0} s; wrote {}, loss.csv and {}",
        c.steps * c.batch * c.ctx,
        r.step_ms * c.steps as f64 / 1e3,
        png.display(),
        ckpt.display()
    );
    Ok(())
}

//! Training from files with `kiln::data`: a dataset written as `.npy` files is memory-mapped
//! (`NpyDataset`), shuffled per epoch, batched and loaded ahead on worker threads
//! (`DataLoader`) while a `jit`-compiled MLP step trains on it. Prints the loss, the accuracy
//! on held-out samples, the step time and how long the training loop waited for data.
//!
//! `cargo run --release -p kiln --example data_pipeline [-- SAMPLES EPOCHS]`

use kiln::data::{DataLoader, Dataset, NpyDataset};
use kiln::nn::{Mlp, cross_entropy};
use kiln::npy::NpyExt;
use kiln::optim::{Adam, AdamState};
use kiln::random::{key, normal, split};
use kiln::{DType, Result, Tensor, jit, value_and_grad};
use std::path::Path;
use std::time::{Duration, Instant};

/// Features per sample.
pub const FEATURES: usize = 64;
/// Classes.
pub const CLASSES: usize = 10;

/// Writes `n` samples of a learnable task to `dir`: `x.npy` (standard normal `[n, FEATURES]`)
/// and `y.npy` (`[n]`, the class a fixed random linear teacher scores highest).
pub fn write_dataset(dir: &Path, n: usize) -> Result<()> {
    let ks = split(&key(11), 2);
    let x = normal(&ks[0], &[n, FEATURES], DType::F32);
    let teacher = normal(&ks[1], &[FEATURES, CLASSES], DType::F32);
    let scores = x.matmul(&teacher).to_literal()?.to_f64s();
    let y: Vec<i32> = scores
        .chunks(CLASSES)
        .map(|row| {
            (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(0) as i32
        })
        .collect();
    x.save_npy(dir.join("x.npy"))?;
    Tensor::from_vec(y, [n])?.save_npy(dir.join("y.npy"))
}

/// What a run measured.
pub struct Report {
    /// Mean loss of the first and of the last epoch.
    pub first_loss: f64,
    /// See `first_loss`.
    pub last_loss: f64,
    /// Accuracy on the held-out samples after training.
    pub accuracy: f64,
    /// Steps run.
    pub steps: usize,
    /// Time in the training steps (compile excluded: the first step is not counted).
    pub stepping: Duration,
    /// Time the loop waited for the loader (first batch excluded).
    pub waited: Duration,
}

type Args = (Mlp, AdamState<Mlp>, Tensor, Tensor);

/// Trains on the first 90% of the samples in `dir` for `epochs` epochs (batches of 128,
/// shuffled, 2 workers) and tests on the rest.
pub fn run(dir: &Path, epochs: u64, verbose: bool) -> Result<Report> {
    let data = NpyDataset::open(&[dir.join("x.npy"), dir.join("y.npy")])?;
    let n = data.len();
    let held = n / 10;
    let train_len = n - held;
    // The held-out samples are the last 10%: read them whole for the test.
    let x_all = Tensor::load_npy(dir.join("x.npy"))?;
    let y_all = Tensor::load_npy(dir.join("y.npy"))?;
    let x_test = x_all.slice(0, train_len as isize, n as isize, 1);
    let y_test = y_all.slice(0, train_len as isize, n as isize, 1);

    let loader = DataLoader::new(
        Prefix {
            data,
            len: train_len,
        },
        128,
    )?
    .shuffle(5)
    .drop_last(true)
    .workers(2);
    let opt = Adam::new(3e-3);
    let mut m = Mlp::new(&key(3), &[FEATURES, 128, CLASSES], DType::F32);
    let mut s = opt.init(&m);
    let train = jit(|(m, s, x, y): &Args| -> Result<_> {
        let (l, g) = value_and_grad(|m: &Mlp| cross_entropy(&m.forward(x), y), m)?;
        let (m, s) = opt.update(m, &g, s)?;
        Ok((m, s, l))
    });
    let (mut first_loss, mut last_loss) = (None, 0.0);
    let (mut steps, mut stepping, mut waited) = (0, Duration::ZERO, Duration::ZERO);
    for epoch in 0..epochs {
        let (mut sum, mut count) = (0.0, 0);
        let mut batches = loader.epoch(epoch);
        loop {
            let t = Instant::now();
            let Some(batch) = batches.next() else { break };
            let w = t.elapsed();
            let batch = batch?;
            let (x, y) = (batch[0].clone(), batch[1].clone());
            let t = Instant::now();
            let (m2, s2, l) = train.call_donating((m, s, x, y))??;
            (m, s) = (m2, s2);
            sum += l.item()?;
            count += 1;
            if steps > 0 {
                stepping += t.elapsed();
                waited += w;
            }
            steps += 1;
        }
        last_loss = sum / count.max(1) as f64;
        first_loss.get_or_insert(last_loss);
        if verbose {
            println!("epoch {epoch}  mean loss {last_loss:.4}");
        }
    }
    let predicted = m.forward(&x_test).to_literal()?.to_f64s();
    let labels = y_test.to_vec::<i32>()?;
    let right = labels
        .iter()
        .enumerate()
        .filter(|(i, l)| {
            let row = &predicted[i * CLASSES..(i + 1) * CLASSES];
            (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(0) as i32
                == **l
        })
        .count();
    Ok(Report {
        first_loss: first_loss.unwrap_or(last_loss),
        last_loss,
        accuracy: right as f64 / labels.len().max(1) as f64,
        steps,
        stepping,
        waited,
    })
}

/// The first `len` samples of a dataset (the training split).
struct Prefix<D> {
    data: D,
    len: usize,
}

impl<D: Dataset> Dataset for Prefix<D> {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        self.data.get(index)
    }
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(50_000);
    let epochs = args.get(1).copied().unwrap_or(3) as u64;
    let dir = std::env::temp_dir().join(format!("kiln-data-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| kiln::Error::new("data_pipeline", e.to_string()))?;
    println!(
        "kiln: {n} samples of {FEATURES} features as .npy files, memory-mapped, shuffled, \
         batched on 2 workers; a {FEATURES}-128-{CLASSES} MLP trained with Adam in one jit"
    );
    write_dataset(&dir, n)?;
    let r = run(&dir, epochs, true);
    let _ = std::fs::remove_dir_all(&dir);
    let r = r?;
    let per_step = r.stepping.as_secs_f64() * 1e3 / (r.steps.max(2) - 1) as f64;
    println!(
        "held-out accuracy {:.1}%; {} steps, {per_step:.2} ms a step; the loop waited {:.1} ms \
         for data in all ({:.1}% of the time in steps)",
        100.0 * r.accuracy,
        r.steps,
        r.waited.as_secs_f64() * 1e3,
        100.0 * r.waited.as_secs_f64() / r.stepping.as_secs_f64().max(1e-9)
    );
    if r.accuracy < 0.8 || r.last_loss >= r.first_loss {
        eprintln!(
            "training did not converge: loss {:.4} -> {:.4}, accuracy {:.1}%",
            r.first_loss,
            r.last_loss,
            100.0 * r.accuracy
        );
        std::process::exit(1);
    }
    Ok(())
}

//! A classifier trained on real tabular data that the `linfa-datasets` crate ships: the iris
//! flowers (150 samples, 4 measurements, 3 species) or the red wine quality table (1,599
//! wines, 11 chemical measurements, quality scores 3 to 8 as 6 classes).
//!
//! The samples are split into training and held-out sets by a seeded shuffle, the features
//! standardized with the training set's mean and deviation, and an MLP trained with Adam on
//! shuffled batches from a `kiln::data::DataLoader` (the whole step, forward, backward and
//! update, one `jit`-compiled function). Progress goes to stderr (`kiln::train::Progress`);
//! the training and held-out accuracies are printed at the end.
//!
//! `cargo run --release -p kiln --example tabular [-- iris|wine [EPOCHS]]`

use kiln::data::{DataLoader, Sampler, Shuffled, TensorDataset};
use kiln::nn::{Mlp, cross_entropy};
use kiln::optim::{Adam, AdamState};
use kiln::random::key;
use kiln::train::Progress;
use kiln::{DType, Result, Tensor, jit, value_and_grad};

/// The seed of the train/held-out split and of the batches' order.
pub const SEED: u64 = 29;
/// The share of samples held out for testing.
pub const HELD_OUT: f64 = 0.2;

/// A table: `rows` samples of `features` measurements (row-major) and a class each.
pub struct Table {
    /// Its name, for printing.
    pub name: &'static str,
    /// Measurements, `rows * features` values, row after row.
    pub x: Vec<f32>,
    /// Class of each row, `0..classes`.
    pub y: Vec<i32>,
    /// Measurements per row.
    pub features: usize,
    /// Number of classes.
    pub classes: usize,
}

impl Table {
    /// Number of samples.
    pub fn rows(&self) -> usize {
        self.y.len()
    }
}

/// A table from row-major `records` with `features` columns and a target per row; targets are
/// shifted so that the smallest is class 0.
fn table(
    name: &'static str,
    features: usize,
    records: impl Iterator<Item = f64>,
    targets: Vec<usize>,
) -> Table {
    let x = records.map(|v| v as f32).collect();
    let lowest = targets.iter().copied().min().unwrap_or(0);
    let highest = targets.iter().copied().max().unwrap_or(0);
    let y = targets.iter().map(|&t| (t - lowest) as i32).collect();
    Table {
        name,
        x,
        y,
        features,
        classes: highest - lowest + 1,
    }
}

/// Fisher's iris flowers: 150 samples, 4 features, 3 classes.
pub fn iris() -> Table {
    let d = linfa_datasets::iris();
    let targets = d.targets.iter().copied().collect();
    table(
        "iris",
        d.records.ncols(),
        d.records.iter().copied(),
        targets,
    )
}

/// Red wine quality: 1,599 samples, 11 features, quality 3 to 8 as classes 0 to 5.
pub fn wine() -> Table {
    let d = linfa_datasets::winequality();
    let targets = d.targets.iter().copied().collect();
    table(
        "wine quality",
        d.records.ncols(),
        d.records.iter().copied(),
        targets,
    )
}

/// Rows `which` of the table, with each feature standardized by `mean` and `scale`: (x
/// `[rows, features]`, y `[rows]`).
fn rows(t: &Table, which: &[usize], mean: &[f32], scale: &[f32]) -> Result<(Tensor, Tensor)> {
    let f = t.features;
    let mut x = Vec::with_capacity(which.len() * f);
    for &r in which {
        let row = &t.x[r * f..(r + 1) * f];
        x.extend(
            row.iter()
                .zip(mean)
                .zip(scale)
                .map(|((v, m), s)| (v - m) / s),
        );
    }
    let y = which.iter().map(|&r| t.y[r]).collect::<Vec<_>>();
    Ok((
        Tensor::from_vec(x, [which.len(), f])?,
        Tensor::from_vec(y, [which.len()])?,
    ))
}

/// Mean and standard deviation of each feature over rows `which` (a deviation of 0, a
/// constant feature, becomes 1).
fn moments(t: &Table, which: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let f = t.features;
    let n = which.len().max(1) as f64;
    let row = |r: usize| t.x[r * f..(r + 1) * f].iter().map(|&v| v as f64);
    let mut mean = vec![0.0f64; f];
    for &r in which {
        for (m, v) in mean.iter_mut().zip(row(r)) {
            *m += v / n;
        }
    }
    let mut var = vec![0.0f64; f];
    for &r in which {
        for ((s, v), m) in var.iter_mut().zip(row(r)).zip(&mean) {
            *s += (v - m).powi(2) / n;
        }
    }
    let scale = var
        .iter()
        .map(|v| if *v > 0.0 { v.sqrt() as f32 } else { 1.0 })
        .collect();
    (mean.iter().map(|m| *m as f32).collect(), scale)
}

/// The share of rows whose highest score is their class.
fn accuracy(m: &Mlp, x: &Tensor, y: &Tensor, classes: usize) -> Result<f64> {
    let scores = m.forward(x).to_literal()?.to_f64s();
    let labels = y.to_vec::<i32>()?;
    let right = labels
        .iter()
        .enumerate()
        .filter(|(i, l)| {
            let row = &scores[i * classes..(i + 1) * classes];
            (0..classes)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(0) as i32
                == **l
        })
        .count();
    Ok(right as f64 / labels.len().max(1) as f64)
}

/// What a run measured.
pub struct Report {
    /// Samples trained on and held out.
    pub train_rows: usize,
    /// See `train_rows`.
    pub test_rows: usize,
    /// Accuracy on the training samples after training.
    pub train_accuracy: f64,
    /// Accuracy on the held-out samples after training.
    pub test_accuracy: f64,
    /// Steps run.
    pub steps: usize,
    /// Mean loss of the last epoch.
    pub last_loss: f64,
    /// Times the step was compiled.
    pub compiles: usize,
}

type Args = (Mlp, AdamState<Mlp>, Tensor, Tensor);

/// Splits `t` (a seeded shuffle, [`HELD_OUT`] held out), standardizes it, and trains an MLP
/// with one hidden layer of `hidden` units for `epochs` epochs of batches of `batch`.
/// `verbose`: progress on stderr.
pub fn run(t: &Table, hidden: usize, epochs: usize, batch: usize, verbose: bool) -> Result<Report> {
    let order = Shuffled { seed: SEED }.indices(t.rows(), 0);
    let held = ((t.rows() as f64 * HELD_OUT).round() as usize).clamp(1, t.rows() - 1);
    let (test_rows, train_rows) = order.split_at(held);
    let (mean, scale) = moments(t, train_rows);
    let (x_train, y_train) = rows(t, train_rows, &mean, &scale)?;
    let (x_test, y_test) = rows(t, test_rows, &mean, &scale)?;
    // Full batches only, so that the step keeps one shape and compiles once.
    let loader = DataLoader::new(
        TensorDataset::new(vec![x_train.clone(), y_train.clone()])?,
        batch,
    )?
    .shuffle(SEED)
    .drop_last(true);
    let opt = Adam::new(0.01);
    let mut m = Mlp::new(&key(5), &[t.features, hidden, t.classes], DType::F32);
    let mut s = opt.init(&m);
    let step = jit(|(m, s, x, y): &Args| -> Result<_> {
        let (l, g) = value_and_grad(|m: &Mlp| cross_entropy(&m.forward(x), y), m)?;
        let (m, s) = opt.update(m, &g, s)?;
        Ok((m, s, l))
    });
    let steps = epochs * loader.len();
    let mut progress = if verbose {
        Progress::new(steps, batch)
    } else {
        Progress::quiet(steps, batch)
    };
    let mut last_loss = 0.0;
    for epoch in 0..epochs {
        let (mut sum, mut count) = (0.0, 0);
        for b in loader.epoch(epoch as u64) {
            let b = b?;
            let (m2, s2, l) = step.call_donating((m, s, b[0].clone(), b[1].clone()))??;
            (m, s) = (m2, s2);
            let l = l.item()?;
            progress.step(l as f32);
            sum += l;
            count += 1;
        }
        last_loss = sum / count.max(1) as f64;
    }
    progress.finish();
    Ok(Report {
        train_rows: train_rows.len(),
        test_rows: test_rows.len(),
        train_accuracy: accuracy(&m, &x_train, &y_train, t.classes)?,
        test_accuracy: accuracy(&m, &x_test, &y_test, t.classes)?,
        steps,
        last_loss,
        compiles: step.compiles(),
    })
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (t, epochs) = match args.first().map(String::as_str) {
        None | Some("wine") => (wine(), 60),
        Some("iris") => (iris(), 100),
        Some(other) => {
            eprintln!("unknown data set `{other}`; usage: tabular [iris|wine [EPOCHS]]");
            std::process::exit(2);
        }
    };
    let epochs = match args.get(1).map(|e| e.parse::<usize>()) {
        None => epochs,
        Some(Ok(e)) if e > 0 => e,
        Some(_) => {
            eprintln!("EPOCHS must be a positive count; usage: tabular [iris|wine [EPOCHS]]");
            std::process::exit(2);
        }
    };
    println!(
        "kiln: {} ({} samples, {} features, {} classes), a {}-64-{} MLP, Adam, batches of 16",
        t.name,
        t.rows(),
        t.features,
        t.classes,
        t.features,
        t.classes
    );
    let r = run(&t, 64, epochs, 16, true)?;
    println!(
        "{} epochs ({} steps, {} compile): train accuracy {:.1}% ({} samples), held-out accuracy {:.1}% ({} samples), last loss {:.4}",
        epochs,
        r.steps,
        r.compiles,
        100.0 * r.train_accuracy,
        r.train_rows,
        100.0 * r.test_accuracy,
        r.test_rows,
        r.last_loss
    );
    Ok(())
}

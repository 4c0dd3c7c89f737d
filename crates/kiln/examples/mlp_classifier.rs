//! An MLP classifier on a seeded synthetic dataset (three interleaved spirals), trained with
//! Adam; the whole step (forward, backward, update) is one `jit`-compiled function.
//!
//! Progress goes to stderr (a bar on a terminal, about ten plain lines elsewhere); the loss
//! curve is written as `kiln-mlp_classifier-loss.png` and `.csv` in the temporary directory.
//!
//! `cargo run --release -p kiln --example mlp_classifier [-- --dump trace|grad]`

use kiln::nn::{Mlp, cross_entropy};
use kiln::optim::{Adam, AdamState};
use kiln::random::{key, normal, split};
use kiln::train::{LossCurve, Progress};
use kiln::{DType, Result, Tensor, jit, value_and_grad};

/// Points per class.
pub const PER_CLASS: usize = 100;
/// Classes.
pub const CLASSES: usize = 3;

/// Three spirals in the plane with a little noise: (points [n, 2], labels [n]).
pub fn spirals() -> (Tensor, Tensor) {
    let n = PER_CLASS * CLASSES;
    let ks = split(&key(7), 2);
    let i = Tensor::arange(n, DType::F32);
    let class = (&i * (1.0 / PER_CLASS as f64)).floor();
    let t = &(&i - &(&class * PER_CLASS as f64)) * (1.0 / PER_CLASS as f64);
    let theta = &(&(&class * (2.0 * std::f64::consts::PI / CLASSES as f64)) + &(&t * 4.0))
        + &(&normal(&ks[0], &[n], DType::F32) * 0.15);
    let r = &t + 0.05;
    let x = Tensor::concat(
        &[
            &(&r * &theta.sin()).reshape(&[-1, 1]),
            &(&r * &theta.cos()).reshape(&[-1, 1]),
        ],
        1,
    );
    (x, class.cast(DType::I32))
}

/// Mean cross-entropy of the model on the data.
pub fn loss(m: &Mlp, x: &Tensor, y: &Tensor) -> Tensor {
    cross_entropy(&m.forward(x), y)
}

/// One training step: (model, optimizer state, x, y) -> (model, state, loss).
pub fn step(
    opt: &Adam,
    (m, s, x, y): &(Mlp, AdamState<Mlp>, Tensor, Tensor),
) -> Result<(Mlp, AdamState<Mlp>, Tensor)> {
    let (l, g) = value_and_grad(|m: &Mlp| loss(m, x, y), m)?;
    let (m, s) = opt.update(m, &g, s)?;
    Ok((m, s, l))
}

/// The model before training.
pub fn model() -> Mlp {
    Mlp::new(&key(3), &[2, 64, 64, CLASSES], DType::F32)
}

/// Trains for `steps` steps; returns (first loss, last loss, training error rate, compiles).
/// When `verbose`, shows progress and writes the loss curve (PNG and CSV) to the temporary
/// directory.
pub fn run(steps: usize, verbose: bool) -> Result<(f64, f64, f64, usize)> {
    let (x, y) = spirals();
    let opt = Adam::new(0.01);
    let mut m = model();
    let mut s = opt.init(&m);
    let train = jit(|args: &(Mlp, AdamState<Mlp>, Tensor, Tensor)| step(&opt, args));
    let (mut first, mut last) = (None, 0.0);
    let n = PER_CLASS * CLASSES;
    let mut progress = if verbose {
        Progress::new(steps, n)
    } else {
        Progress::quiet(steps, n)
    };
    let mut curve = LossCurve::new();
    for i in 0..steps {
        // The model and optimizer state are donated (updated in place); x and y are lent.
        // The outer `?`: compiling and running; the inner: the step's own errors.
        let (m2, s2, l) = train.call_donating((m, s, x.clone(), y.clone()))??;
        (m, s) = (m2, s2);
        last = l.item()?;
        first.get_or_insert(last);
        progress.step(last as f32);
        curve.push(i, last as f32);
    }
    progress.finish();
    let predicted = m.forward(&x).to_literal()?.to_f64s();
    let labels = y.to_vec::<i32>()?;
    let wrong = labels
        .iter()
        .enumerate()
        .filter(|(i, l)| {
            let row = &predicted[i * CLASSES..(i + 1) * CLASSES];
            let best = (0..CLASSES)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(0);
            best as i32 != **l
        })
        .count();
    let error = wrong as f64 / labels.len() as f64;
    if verbose {
        println!(
            "training error {:.1}% after {steps} steps ({} compile)",
            100.0 * error,
            train.compiles()
        );
        let out = std::env::temp_dir().join("kiln-mlp_classifier-loss");
        curve.save_png(out.with_extension("png"), 800, 500)?;
        curve.save_csv(out.with_extension("csv"))?;
        println!("loss curve: {}", out.with_extension("png").display());
    }
    Ok((first.unwrap_or(last), last, error, train.compiles()))
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--dump") {
        let (x, y) = spirals();
        let ir = match args.get(i + 1).map(String::as_str) {
            Some("grad") => kiln::lower::grad_ir(|m: &Mlp| loss(m, &x, &y), &model())?,
            _ => kiln::lower::trace_ir(|m: &Mlp| loss(m, &x, &y), &model())?,
        };
        print!("{ir}");
        return Ok(());
    }
    println!(
        "kiln: a 2-64-64-3 MLP on {} spiral points, Adam, the whole step in one jit",
        PER_CLASS * CLASSES
    );
    let (first, last, error, _) = run(400, true)?;
    if error >= 0.05 || last >= first {
        eprintln!(
            "training did not converge: loss {first:.4} -> {last:.4}, error {:.1}%",
            100.0 * error
        );
        std::process::exit(1);
    }
    Ok(())
}

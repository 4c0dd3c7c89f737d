//! The classic autograd tutorial programs, reproduced exactly.
//!
//! `cargo run -p kiln --example autograd_tutorial [-- --dump trace|grad]`

use kiln::nn::{Linear, mse};
use kiln::optim::Sgd;
use kiln::random::{key, normal};
use kiln::{DType, Result, Tensor, grad, value_and_grad};

/// z = (x * w).sum() + b.
pub fn z(args: &(Tensor, Tensor, Tensor)) -> Tensor {
    let (x, w, b) = args;
    &(x * w).sum_all() + b
}

/// The inputs of the first program.
pub fn inputs() -> (Tensor, Tensor, Tensor) {
    (
        Tensor::from_vec(vec![2.0f32, 3.0], [2]).expect("2 values"),
        Tensor::from_vec(vec![1.5f32, -0.5], [2]).expect("2 values"),
        Tensor::scalar(0.1f32),
    )
}

/// What the tutorial prints.
pub struct Report {
    /// z.
    pub z: f64,
    /// (dz/dx, dz/dw, dz/db).
    pub grads: (Vec<f32>, Vec<f32>, Vec<f32>),
    /// Entries of grad((x^3).sum()) checked against finite differences.
    pub checked: usize,
    /// The loss of Linear(4, 1) + MSE before each of three SGD steps.
    pub losses: Vec<f64>,
}

/// Runs the three programs.
pub fn run(verbose: bool) -> Result<Report> {
    // 1. z = (x*w).sum() + b = 1.6, dz/dx = w, dz/dw = x, dz/db = 1.
    let args = inputs();
    let zv = z(&args).item()?;
    let (gx, gw, gb) = grad(z)(&args);
    let grads = (
        gx.to_vec::<f32>()?,
        gw.to_vec::<f32>()?,
        gb.to_vec::<f32>()?,
    );
    if verbose {
        println!(
            "z = {zv:.4}; dz/dx = {:?}; dz/dw = {:?}; dz/db = {:?}",
            grads.0, grads.1, grads.2
        );
    }
    // 2. A gradient check of (x**3).sum() on random f64 inputs.
    let x = normal(&key(0), &[5], DType::F32).cast(DType::F64);
    let checked = kiln::testing::check_grads(|x: &Tensor| x.powf(3.0).sum_all(), &x, 1e-6, 1e-6)?;
    if verbose {
        println!("grad of (x**3).sum() matches finite differences on {checked} entries");
    }
    // 3. Three steps of Linear(4, 1) + MSE + SGD(lr 0.01).
    let k = key(1);
    let ks = kiln::random::split(&k, 3);
    let mut model = Linear::new(&ks[0], 4, 1, DType::F32);
    let data = normal(&ks[1], &[8, 4], DType::F32);
    let target = normal(&ks[2], &[8, 1], DType::F32);
    let opt = Sgd::new(0.01);
    let mut state = opt.init(&model);
    let mut losses = Vec::new();
    for step in 0..3 {
        let (loss, g) = value_and_grad(|m: &Linear| mse(&m.forward(&data), &target), &model)?;
        losses.push(loss.item()?);
        if verbose {
            println!("step {step}: loss {:.6}", losses[step]);
        }
        (model, state) = opt.update(&model, &g, &state)?;
    }
    Ok(Report {
        z: zv,
        grads,
        checked,
        losses,
    })
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--dump") {
        let ir = match args.get(i + 1).map(String::as_str) {
            Some("grad") => kiln::lower::grad_ir(z, &inputs())?,
            _ => kiln::lower::trace_ir(z, &inputs())?,
        };
        print!("{ir}");
        return Ok(());
    }
    run(true).map(|_| ())
}

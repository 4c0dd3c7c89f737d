//! The MLP of `mlp_classifier` trained on an NVIDIA GPU: the parameters, the optimizer state
//! and the data moved to the device once (`Tensor::to(Device::Cuda(n))`), then the whole step
//! (forward, backward, Adam) compiled by kiln for the device (its kernels mapped to the GPU,
//! rendered as PTX by LLVM's NVPTX target) and run through the CUDA driver on device-resident
//! tensors, the model and state donated to each step; its loss compared with the same steps on
//! the CPU. Without an NVIDIA driver or that GPU it says what was looked for and exits
//! successfully, having changed nothing.
//!
//! `cargo run --release -p kiln --example mlp_cuda [-- cuda:N]`

#[allow(dead_code)]
#[path = "mlp_classifier.rs"]
mod mlp_classifier;

use kiln::backend::{Backend, Cpu, Cuda};
use kiln::optim::Adam;
use kiln::{DType, Device, Result, Tensor, Tree, jit};
use std::sync::Arc;

/// What a run found.
pub enum Outcome {
    /// No GPU to train on: the reason, as the driver or the device check gave it.
    NoGpu(String),
    /// Trained on the GPU: (first loss, last loss) on the GPU and the last loss of the same
    /// steps on the CPU.
    Trained {
        /// The GPU's losses, first and last.
        gpu: (f64, f64),
        /// The CPU's last loss.
        cpu_last: f64,
    },
}

/// The losses of `steps` of `mlp_classifier`'s training on the backend installed now:
/// (first, last).
pub fn train(steps: usize) -> Result<(f64, f64)> {
    let (first, last, _, _) = mlp_classifier::run(steps, false)?;
    Ok((first, last))
}

/// The losses of `steps` of `mlp_classifier`'s training with everything on `device`, moved
/// there once: (first, last). The model and optimizer state are donated to each step, so
/// their device buffers are reused; the data stays where it is.
pub fn train_on(device: Device, steps: usize) -> Result<(f64, f64)> {
    let (x, y) = mlp_classifier::spirals();
    let opt = Adam::new(0.01);
    let m = mlp_classifier::model();
    let s = opt.init(&m);
    let mut moved = (m, s, x, y).map_leaves(&mut |t| t.to(device));
    if let Some(e) = moved.leaf_vec().iter().find_map(|t| t.error()) {
        return Err(e.clone());
    }
    let train = jit(
        |args: &(
            kiln::nn::Mlp,
            kiln::optim::AdamState<kiln::nn::Mlp>,
            Tensor,
            Tensor,
        )| { mlp_classifier::step(&opt, args) },
    );
    let (mut first, mut last) = (None, 0.0);
    for _ in 0..steps {
        let (m, s, x, y) = moved;
        let (m2, s2, l) = train.call_donating((m, s, x.clone(), y.clone()))??;
        moved = (m2, s2, x, y);
        last = l.item()?; // the loss, read back
        first.get_or_insert(last);
    }
    Ok((first.unwrap_or(last), last))
}

/// Trains `steps` steps on GPU `device` (`cuda:N`) if there is one, else says why not.
pub fn run(device: &str, steps: usize) -> Result<Outcome> {
    let gpu = Cuda::named(device);
    // A first compile opens the driver and the device: its error is the clearest reason.
    let probe = kiln::lower::trace_ir(|x: &Tensor| x * 2.0, &Tensor::ones(DType::F32, [4]))?;
    if let Err(e) = gpu.compile(&probe) {
        return Ok(Outcome::NoGpu(e.message));
    }
    let index = device
        .strip_prefix("cuda:")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    kiln::backend::set_backend(Arc::new(gpu));
    let on_gpu = train_on(Device::Cuda(index), steps)?;
    kiln::backend::set_backend(Arc::new(Cpu));
    let (_, cpu_last) = train(steps)?;
    Ok(Outcome::Trained {
        gpu: on_gpu,
        cpu_last,
    })
}

#[allow(dead_code)]
fn main() -> Result<()> {
    let device = std::env::args().nth(1).unwrap_or_else(|| "cuda:0".into());
    let steps = 200;
    match run(&device, steps)? {
        Outcome::NoGpu(why) => {
            println!("kiln: not training on {device}: {why}");
            println!(
                "(the same model trains on the CPU: cargo run --release -p kiln --example mlp_classifier)"
            );
        }
        Outcome::Trained { gpu, cpu_last } => {
            println!(
                "kiln: a 2-64-64-3 MLP on {device}, {steps} Adam steps in one compiled step: loss {:.4} -> {:.4} (the CPU: {:.4})",
                gpu.0, gpu.1, cpu_last
            );
            if gpu.1 >= gpu.0 || (gpu.1 - cpu_last).abs() > 1e-3 * (1.0 + cpu_last.abs()) {
                eprintln!("the GPU's training differs from the CPU's");
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

//! The `mlp_cuda` example: on a machine with an NVIDIA GPU it trains the MLP there and agrees
//! with the CPU; without one it says what was looked for, without panicking. (A process of its
//! own: the example installs the GPU backend for the whole process.)

#[path = "../examples/mlp_cuda.rs"]
mod mlp_cuda;

use mlp_cuda::Outcome;

#[test]
fn the_mlp_trains_on_a_gpu_or_says_why_it_cannot() {
    match mlp_cuda::run("cuda:0", 60).unwrap() {
        Outcome::NoGpu(why) => {
            // No driver: the libraries looked for are named; a driver without the device:
            // the device and the count are.
            assert!(why.contains("libcuda") || why.contains("cuda:0"), "{why}");
        }
        Outcome::Trained { gpu, cpu_last } => {
            assert!(gpu.1 < 0.5 * gpu.0, "loss {} -> {}", gpu.0, gpu.1);
            assert!(
                (gpu.1 - cpu_last).abs() <= 1e-3 * (1.0 + cpu_last.abs()),
                "{gpu:?} vs {cpu_last}"
            );
        }
    }
    // A name that is no GPU is refused the same way, never a panic.
    match mlp_cuda::run("cuda:many", 1).unwrap() {
        Outcome::NoGpu(why) => assert!(why.contains("cuda:N"), "{why}"),
        Outcome::Trained { .. } => panic!("`cuda:many` names no GPU"),
    }
    // The device-resident training on the emulated GPU: the same losses as the same steps
    // run there from host tensors.
    kiln::backend::set_backend(std::sync::Arc::new(kiln::backend::PtxEmulator));
    let on_device = mlp_cuda::train_on(kiln::Device::Cuda(0), 3).unwrap();
    let from_host = mlp_cuda::train(3).unwrap();
    assert_eq!(on_device, from_host);
    assert!(on_device.1 < on_device.0, "{on_device:?}");
}

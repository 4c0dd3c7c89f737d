//! `KILN_BACKEND=ptx-emulator`: compiled functions and eager ops run through the GPU mapping
//! on the GPU emulator. The test has a binary of its own, so the options it sets are the
//! process's first.

use kiln::Tensor;

#[test]
fn the_ptx_emulator_backend_runs_functions_through_the_gpu_mapping() {
    kiln::set_options(kiln::Options {
        backend: Some("ptx-emulator".into()),
        ..kiln::Options::default()
    });
    assert_eq!(kiln::backend::backend().unwrap().name(), "ptx-emulator");
    // A softmax over rows long enough for a warp each, then a matrix product.
    let f = kiln::ir::parse_func_text(
        "func @main(%0: f32[3,200], %1: f32[200,5]) -> f32[3,5] {
  %2 = constant {value = -inf} : f32[]
  %3 = reduce %0, %2 {dimensions = [1], kind = max} : f32[3]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = [0]} : f32[3,200]
  %5 = subtract %0, %4 : f32[3,200]
  %6 = exponential %5 : f32[3,200]
  %7 = constant {value = 0.0} : f32[]
  %8 = reduce %6, %7 {dimensions = [1], kind = add} : f32[3]
  %9 = broadcast_in_dim %8 {broadcast_dimensions = [0]} : f32[3,200]
  %10 = divide %6, %9 : f32[3,200]
  %11 = dot_general %10, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[3,5]
  return %11
}
",
    )
    .unwrap();
    let mut rng = kiln::ir::random::Rng::new(7);
    let args: Vec<kiln::ir::Literal> = f
        .param_types()
        .iter()
        .map(|t| kiln::ir::random::random_literal(&mut rng, t))
        .collect();
    let exe = kiln::backend::compile_cached(&f).unwrap();
    let got = exe.run(&args.iter().collect::<Vec<_>>()).unwrap();
    kiln::reference::accuracy::check_outputs(&f, &args, &got).unwrap();
    // Eager ops that compile run there too.
    let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.0], [2, 2]).unwrap();
    let y = x.tanh().matmul(&x);
    let got = y.to_vec::<f32>().unwrap();
    let t = |v: f32| v.tanh();
    let want = [t(0.5) * 0.5 + t(-1.0) * 2.0, -t(0.5), t(2.0) * 0.5, -t(2.0)];
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

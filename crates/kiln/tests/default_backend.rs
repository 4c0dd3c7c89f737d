//! A program that uses only `kiln::Tensor` (no `jit`, no transforms, nothing installed by
//! hand) runs its eager ops on the CPU backend: the facade installs it when the program loads.
//! The test has a binary of its own, so nothing else in the process installs anything first.

use kiln::Tensor;

#[test]
fn eager_ops_run_on_the_cpu_backend_with_nothing_installed_by_hand() {
    // kiln-trace's compile (re-exported, it installs nothing): it finds a backend only if the
    // facade's load-time constructor ran.
    let f = kiln::ir::parse_func_text(
        "func @main(%0: f32[2]) -> f32[2] {\n  %1 = tanh %0 : f32[2]\n  return %1\n}\n",
    )
    .unwrap();
    let exe = kiln::backend::compile_cached(&f).unwrap();
    let half = kiln::ir::Literal::f32([2], vec![0.5, -1.0]).unwrap();
    let got = exe.run(&[&half]).unwrap()[0].to_f64s();
    assert!((got[0] - 0.5f64.tanh()).abs() < 1e-6, "{got:?}");
    // tanh and dot products compile (other eager ops run as native loops): without a backend
    // they would fail with "no backend is installed".
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
    let b = kiln::backend::backend().unwrap();
    match kiln::options().backend.as_deref() {
        Some(chosen @ ("reference" | "ptx-emulator")) => assert_eq!(b.name(), chosen),
        _ => assert_eq!(b.name(), "cpu"),
    }
}

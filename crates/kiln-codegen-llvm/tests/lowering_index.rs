//! The kernel cache's index of input programs (`cpu::lowering`): a function compiled again with
//! the cache warm takes its lowered program from the cache, without running the optimizer, and
//! computes the same results.

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{Literal, TensorType};

/// A chain of `n` elementwise steps on f32[64], like the compile_chain benchmarks' forward pass.
fn chain(n: usize) -> kiln_ir::Func {
    let mut s = String::from("func @chain(%0: f32[64]) -> f32[64] {\n");
    let mut v = 0;
    for i in 0..n {
        let op = if i % 2 == 0 { "sine" } else { "tanh" };
        s.push_str(&format!("  %{} = {op} %{v} : f32[64]\n", v + 1));
        s.push_str(&format!("  %{} = add %{}, %{v} : f32[64]\n", v + 2, v + 1));
        v += 2;
    }
    s.push_str(&format!("  return %{v}\n}}\n"));
    kiln_ir::parse_func_text(&s).unwrap()
}

#[test]
fn a_warm_cache_skips_the_optimizer_and_gives_the_same_results() {
    let dir = std::env::temp_dir().join(format!("kiln-lowering-index-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let f = chain(40);
    let ty = TensorType::new(kiln_ir::DType::F32, [64]);
    let x = kiln_ir::random::random_literal(&mut kiln_ir::random::Rng::new(7), &ty);
    let run = |e: &CpuExecutable| -> Vec<Literal> { e.run(std::slice::from_ref(&x)).unwrap() };

    let before = kiln_opt::runs_on_this_thread();
    let cold = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
    assert!(!cold.lowered_from_cache());
    assert_eq!(kiln_opt::runs_on_this_thread(), before + 1);

    let before = kiln_opt::runs_on_this_thread();
    let warm = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
    assert!(warm.lowered_from_cache());
    assert_eq!(
        kiln_opt::runs_on_this_thread(),
        before,
        "the optimizer ran on a warm cache"
    );
    assert_eq!(warm.plan(), cold.plan());
    assert_eq!(run(&warm), run(&cold));

    // Another donation pattern is another entry; without a cache the optimizer runs again.
    let donating = CpuExecutable::compile_donating(&f, &[true], Some(&dir)).unwrap();
    assert!(!donating.lowered_from_cache());
    let before = kiln_opt::runs_on_this_thread();
    let uncached = CpuExecutable::compile_with_cache(&f, None).unwrap();
    assert!(!uncached.lowered_from_cache());
    assert_eq!(kiln_opt::runs_on_this_thread(), before + 1);
    assert_eq!(run(&uncached), run(&cold));

    // A damaged entry is ignored: the program is lowered again and the entry rewritten.
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "kir") {
            std::fs::write(&p, b"func @broken(").unwrap();
        }
    }
    let again = CpuExecutable::compile_with_cache(&f, Some(&dir)).unwrap();
    assert!(!again.lowered_from_cache());
    assert_eq!(run(&again), run(&cold));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The backend renders what the kernel layer lowered: `lower_program`, then `render`, runs
/// like `compile`, and the lowered program's decisions are the ones the executable runs.
#[test]
fn the_backend_renders_a_lowered_program() {
    use kiln_codegen_llvm::cpu::{CpuExecutable, host_target_info};
    use kiln_kernel::Options;
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[4,3], %1: f32[3]) -> f32[4,3] {\n  %2 = broadcast_in_dim %1 {broadcast_dimensions = [1]} : f32[4,3]\n  %3 = add %0, %2 : f32[4,3]\n  %4 = exponential %3 : f32[4,3]\n  return %4\n}\n",
    )
    .unwrap();
    let opts = Options::default();
    let lowered = kiln_kernel::pipeline::lower_program(
        &f,
        &[],
        &opts,
        &host_target_info(),
        None,
        &mut |_| {},
    )
    .unwrap();
    assert!(!lowered.from_index);
    let steps = lowered.steps.clone();
    let exe = CpuExecutable::render(lowered, &opts).unwrap();
    assert_eq!(exe.plan(), &steps[..]);
    let a = kiln_ir::Literal::from_f64s(
        kiln_ir::TensorType::new(kiln_ir::DType::F32, vec![4, 3]),
        &[
            0.5, -1.0, 2.0, 0.0, 1.5, -2.5, 3.0, 0.25, -0.75, 1.0, 1.0, -1.0,
        ],
    )
    .unwrap();
    let b = kiln_ir::Literal::from_f64s(
        kiln_ir::TensorType::new(kiln_ir::DType::F32, vec![3]),
        &[0.1, 0.2, -0.3],
    )
    .unwrap();
    let got = exe.run(&[a.clone(), b.clone()]).unwrap();
    kiln_reference::accuracy::check_outputs(&f, &[a, b], &got).unwrap();
}

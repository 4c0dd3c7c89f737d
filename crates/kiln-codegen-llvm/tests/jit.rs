//! The LLVM backend against the reference interpreter, and PTX validity.

use kiln_codegen_llvm::{ElementwiseKernel, cpu_llvm_ir, ptx, run_cpu};
use kiln_ir::random::{Rng, random_literal};
use kiln_ir::{DType, TensorType, parse_func_text};
use kiln_reference::compare::{Tolerance, check_close};

fn kernel(dtype: &str, body: &str) -> (kiln_ir::Func, ElementwiseKernel) {
    let src = format!(
        "func @main(%0: {dtype}[1000], %1: {dtype}[1000], %2: {dtype}[1000]) -> {dtype}[1000] {{\n{body}  return %5\n}}\n"
    );
    let f = parse_func_text(&src).unwrap();
    let k = ElementwiseKernel::from_func(&f).unwrap();
    (f, k)
}

#[test]
fn jit_matches_reference_on_every_supported_dtype() {
    let mut rng = Rng::new(7);
    let mut runs = 0;
    for dtype in ["f32", "f64", "i32", "i64"] {
        let d = DType::from_name(dtype).unwrap();
        let div = if d.is_float() { "divide" } else { "multiply" };
        let body = format!(
            "  %3 = add %0, %1 : {dtype}[1000]\n  %4 = {div} %3, %2 : {dtype}[1000]\n  %5 = subtract %4, %0 : {dtype}[1000]\n"
        );
        let (f, k) = kernel(dtype, &body);
        let args: Vec<_> = (0..3)
            .map(|_| random_literal(&mut rng, &TensorType::new(d, [1000])))
            .collect();
        let want = kiln_reference::eval(&f, &args).unwrap();
        let got = run_cpu(&k, &args.iter().collect::<Vec<_>>()).unwrap();
        // The reference rounds once per op from exact f64 values; the JIT rounds per op in the
        // dtype, so they agree to within a few ulps (exactly for integers).
        check_close(&got, &want[0], Tolerance::ulps(d, 8.0)).unwrap();
        runs += 1;
    }
    assert_eq!(runs, 4);
}

#[test]
fn jit_rejects_bad_arguments_without_panicking() {
    let (_, k) = kernel(
        "f32",
        "  %3 = add %0, %1 : f32[1000]\n  %4 = add %3, %2 : f32[1000]\n  %5 = add %4, %4 : f32[1000]\n",
    );
    let wrong = random_literal(&mut Rng::new(1), &TensorType::new(DType::F32, [3]));
    assert!(run_cpu(&k, &[&wrong, &wrong, &wrong]).is_err());
    assert!(run_cpu(&k, &[&wrong]).is_err());
}

#[test]
fn unsupported_ops_are_reported() {
    let f = parse_func_text(
        "func @main(%0: f32[2]) -> f32[2] {\n  %1 = tanh %0 : f32[2]\n  return %1\n}\n",
    )
    .unwrap();
    let e = ElementwiseKernel::from_func(&f).unwrap_err();
    assert!(e.to_string().contains("tanh"), "{e}");
}

#[test]
fn host_ir_is_vectorized_and_deterministic() {
    let (_, k) = kernel(
        "f32",
        "  %3 = add %0, %1 : f32[1000]\n  %4 = multiply %3, %2 : f32[1000]\n  %5 = add %4, %0 : f32[1000]\n",
    );
    let a = cpu_llvm_ir(&k, true).unwrap();
    assert_eq!(a, cpu_llvm_ir(&k, true).unwrap());
    assert!(
        a.contains("x float>"),
        "the loop vectorizer should emit vector code:\n{a}"
    );
    assert_eq!(
        cpu_llvm_ir(&k, false).unwrap(),
        cpu_llvm_ir(&k, false).unwrap()
    );
}

/// Where `cargo xtask test` installs ptxas (or `KILN_PTXAS`).
fn ptxas() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("KILN_PTXAS") {
        return Some(p.into());
    }
    let home = std::env::var("HOME").ok()?;
    let p = std::path::Path::new(&home).join(".cache/kiln/ptxas/nvidia/cuda_nvcc/bin/ptxas");
    p.exists().then_some(p)
}

#[test]
fn ptx_has_an_entry_and_assembles_for_sm90() {
    let (_, k) = kernel(
        "f32",
        "  %3 = add %0, %1 : f32[1000]\n  %4 = multiply %3, %2 : f32[1000]\n  %5 = add %4, %0 : f32[1000]\n",
    );
    let text = ptx(&k).unwrap();
    assert_eq!(text, ptx(&k).unwrap(), "PTX must be deterministic");
    assert!(text.contains(".visible .entry kiln_kernel("), "{text}");
    assert!(text.contains(".target sm_90"), "{text}");
    match ptxas() {
        Some(ptxas) => {
            let dir = std::env::temp_dir().join(format!("kiln-ptx-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let src = dir.join("k.ptx");
            std::fs::write(&src, &text).unwrap();
            let out = std::process::Command::new(&ptxas)
                .arg("-arch=sm_90")
                .arg(&src)
                .arg("-o")
                .arg(dir.join("k.cubin"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ptxas rejected the PTX: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            println!("ptxas assembled the kernel for sm_90");
        }
        None => {
            println!("ptxas not found (cargo xtask test installs it); checked the PTX text only")
        }
    }
}

/// The backend renders what the kernel layer lowered: `lower_program`, then `render`, runs
/// like `compile`, and the lowered program's decisions are the ones the executable runs.
#[test]
fn the_backend_renders_a_lowered_program() {
    use kiln_codegen_llvm::cpu::{CpuExecutable, host_target_info};
    use kiln_kernel::Options;
    let f = parse_func_text(
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

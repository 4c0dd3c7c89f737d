//! PTX validity: a kernel-IR elementwise kernel, as kiln-kernel lowers and fuses it, rendered
//! through LLVM's NVPTX target and assembled by ptxas.

use kiln_codegen_llvm::ptx::{KERNEL_NAME, ptx};
use kiln_ir::parse_func_text;
use kiln_kernel::Options;
use kiln_kernel::kernel::Kernel;
use kiln_kernel::pipeline::fused_kernels;

/// The one kernel kiln-kernel fuses `body` (over three `dtype[10,100]` parameters, result
/// `%5`) into.
fn kernel(dtype: &str, body: &str) -> Kernel {
    let src = format!(
        "func @main(%0: {dtype}[10,100], %1: {dtype}[10,100], %2: {dtype}[10,100]) -> {dtype}[10,100] {{\n{body}  return %5\n}}\n"
    );
    let f = parse_func_text(&src).unwrap();
    let fused = fused_kernels(
        &f,
        &Options::default(),
        &kiln_kernel::target::TargetInfo::reference(),
    );
    let ks: Vec<&Kernel> = fused.kernels.iter().flatten().collect();
    assert_eq!(ks.len(), 1, "{src} fuses into one kernel");
    ks[0].clone()
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
    for dtype in ["f32", "f64", "i32", "i64"] {
        let last = if dtype.starts_with('f') {
            "divide"
        } else {
            "subtract"
        };
        let k = kernel(
            dtype,
            &format!(
                "  %3 = add %0, %1 : {dtype}[10,100]\n  %4 = multiply %3, %2 : {dtype}[10,100]\n  %5 = {last} %4, %0 : {dtype}[10,100]\n"
            ),
        );
        let text = ptx(&k).unwrap_or_else(|e| panic!("{e}: {k:?}"));
        assert_eq!(text, ptx(&k).unwrap(), "PTX must be deterministic");
        assert!(
            text.contains(&format!(".visible .entry {KERNEL_NAME}(")),
            "{text}"
        );
        assert!(text.contains(".target sm_90"), "{text}");
        match ptxas() {
            Some(ptxas) => {
                let dir = std::env::temp_dir().join(format!("kiln-ptx-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let src = dir.join(format!("{dtype}.ptx"));
                std::fs::write(&src, &text).unwrap();
                let out = std::process::Command::new(&ptxas)
                    .arg("-arch=sm_90")
                    .arg(&src)
                    .arg("-o")
                    .arg(dir.join(format!("{dtype}.cubin")))
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "ptxas rejected the {dtype} PTX: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                println!("ptxas assembled the {dtype} kernel for sm_90");
            }
            None => println!(
                "ptxas not found (cargo xtask test installs it); checked the PTX text only"
            ),
        }
    }
}

#[test]
fn kernels_ptx_does_not_render_are_reported() {
    let f = parse_func_text(
        "func @main(%0: f32[2]) -> f32[2] {\n  %1 = tanh %0 : f32[2]\n  return %1\n}\n",
    )
    .unwrap();
    let fused = fused_kernels(
        &f,
        &Options::default(),
        &kiln_kernel::target::TargetInfo::reference(),
    );
    let k = fused.kernels.iter().flatten().next().unwrap();
    let e = ptx(k).unwrap_err();
    assert!(e.to_string().contains("Tanh"), "{e}");
    let t = parse_func_text(
        "func @main(%0: f32[2,3]) -> f32[3,2] {\n  %1 = transpose %0 {permutation = [1, 0]} : f32[3,2]\n  return %1\n}\n",
    )
    .unwrap();
    let fused = fused_kernels(
        &t,
        &Options::default(),
        &kiln_kernel::target::TargetInfo::reference(),
    );
    let k = fused.kernels.iter().flatten().next().unwrap();
    let e = ptx(k).unwrap_err();
    assert!(e.to_string().contains("own position"), "{e}");
}

//! `KILN_COMPILE_TIMES=1`: a traced function prints one line per compile phase, while eager
//! ops (one-op functions named `eager_<op>`, compiled by the hundreds) are tallied into summary
//! lines instead of a line per phase of each.
//!
//! A function that goes through the kernel cache prints a line per module it compiles, with
//! the compile thread's CPU time beside the wall times.
//!
//! The environment variable is read per compile and the summary at exit, so the compiles run
//! in a child process (this test binary, running `child` with `KILN_COMPILE_TIMES_CHILD=1`).

use kiln_codegen_llvm::cpu::CpuExecutable;

fn func(name: &str, op: &str) -> kiln_ir::Func {
    kiln_ir::parse_func_text(&format!(
        "func @{name}(%0: f32[64], %1: f32[64]) -> f32[64] {{\n  %2 = {op} %0, %1 : f32[64]\n  return %2\n}}\n"
    ))
    .unwrap()
}

/// Compiles three eager ops (two multiplies, an add) and one traced function, without the
/// kernel cache, then a matrix product through the kernel cache in `KILN_COMPILE_TIMES_DIR`.
/// Does nothing unless run as the child.
#[test]
fn child() {
    if std::env::var_os("KILN_COMPILE_TIMES_CHILD").is_none() {
        return;
    }
    for (name, op) in [
        ("eager_multiply", "multiply"),
        ("eager_add", "add"),
        ("eager_multiply", "multiply"),
        ("step", "subtract"),
    ] {
        CpuExecutable::compile_with_options(
            &func(name, op),
            &[],
            &kiln_kernel::Options::from_vars(&|n| std::env::var(n).ok()),
        )
        .unwrap();
    }
    let gemm = kiln_ir::parse_func_text(
        "func @gemm(%0: f32[24,16], %1: f32[16,20]) -> f32[24,20] {
  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[24,20]
  %3 = tanh %2 : f32[24,20]
  return %3
}
",
    )
    .unwrap();
    let opts = kiln_kernel::Options {
        kernel_cache: std::env::var_os("KILN_COMPILE_TIMES_DIR").map(Into::into),
        ..kiln_kernel::Options::from_vars(&|n| std::env::var(n).ok())
    };
    let e = CpuExecutable::compile_with_options(&gemm, &[], &opts).unwrap();
    assert!(e.in_kernel_cache() && !e.loaded_from_cache());
}

#[test]
fn eager_ops_are_summarized_and_functions_keep_their_lines() {
    let dir = std::env::temp_dir().join(format!("kiln-compile-times-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("KILN_COMPILE_TIMES_CHILD", "1")
        .env("KILN_COMPILE_TIMES", "1")
        .env("KILN_NO_CACHE", "1")
        .env("KILN_COMPILE_TIMES_DIR", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("@eager_"),
        "no per-phase line for an eager op:\n{err}"
    );
    assert!(err.contains("kiln compile @step: fuse: "), "{err}");
    assert!(err.contains("kiln compile @step: LLVM O2: "), "{err}");
    // The first eager compile prints a summary, and the exit one counts all three.
    let summaries: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("kiln compile: eager ops: "))
        .collect();
    assert!(
        summaries
            .first()
            .is_some_and(|l| l.contains(": 1 compile (multiply x1)")),
        "{err}"
    );
    assert!(
        summaries
            .last()
            .is_some_and(|l| l.contains(": 3 compiles (multiply x2, add x1)")),
        "{err}"
    );
    // Each module the kernel cache compiles: its phases' wall times, then the thread's CPU.
    let modules: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("kiln compile @gemm: module ["))
        .collect();
    assert!(!modules.is_empty(), "{err}");
    for l in modules {
        let cpu = l
            .split(", cpu ")
            .nth(1)
            .and_then(|c| c.strip_suffix(" ms"))
            .and_then(|c| c.parse::<f64>().ok());
        assert!(
            l.contains(": build ") && cpu.is_some_and(|c| c > 0.0),
            "a module line with its CPU time: {l}"
        );
    }
}

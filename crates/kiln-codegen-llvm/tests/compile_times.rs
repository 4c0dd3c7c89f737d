//! `KILN_COMPILE_TIMES=1`: a traced function prints one line per compile phase, while eager
//! ops (one-op functions named `eager_<op>`, compiled by the hundreds) are tallied into summary
//! lines instead of a line per phase of each.
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
/// kernel cache. Does nothing unless run as the child.
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
}

#[test]
fn eager_ops_are_summarized_and_functions_keep_their_lines() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("KILN_COMPILE_TIMES_CHILD", "1")
        .env("KILN_COMPILE_TIMES", "1")
        .env("KILN_NO_CACHE", "1")
        .output()
        .unwrap();
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
}

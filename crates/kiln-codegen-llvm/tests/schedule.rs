//! Scheduling for memory: programs whose steps run in another order than they were written
//! compute the same values (against the reference) and plan less memory.

mod common;

use common::{close, random_args};
use kiln_codegen_llvm::cpu::{CpuExecutable, describe_memory};

/// `n` branches, each a product reduced to its column sums, written products first.
fn branches(n: usize) -> kiln_ir::Func {
    use std::fmt::Write as _;
    let widths: Vec<usize> = (0..n).map(|b| 128 + 32 * b).collect();
    let params: Vec<String> = widths.iter().map(|w| format!("f32[64,{w}]")).collect();
    let outs: Vec<String> = widths.iter().map(|w| format!("f32[{w}]")).collect();
    let mut s = format!(
        "func @main(%0: f32[256,64], {}) -> ({}) {{\n",
        params
            .iter()
            .enumerate()
            .map(|(b, t)| format!("%{}: {t}", b + 1))
            .collect::<Vec<_>>()
            .join(", "),
        outs.join(", ")
    );
    let first = n + 1;
    for (b, w) in widths.iter().enumerate() {
        let _ = writeln!(
            s,
            "  %{} = dot_general %0, %{} {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[256,{w}]",
            first + b,
            b + 1
        );
    }
    let zero = first + n;
    let _ = writeln!(s, "  %{zero} = constant {{value = 0.0}} : f32[]");
    for (b, w) in widths.iter().enumerate() {
        let _ = writeln!(
            s,
            "  %{} = reduce %{}, %{zero} {{dimensions = [0], kind = add}} : f32[{w}]",
            zero + 1 + b,
            first + b
        );
    }
    let rets: Vec<String> = (0..n).map(|b| format!("%{}", zero + 1 + b)).collect();
    let _ = writeln!(s, "  return {}\n}}", rets.join(", "));
    kiln_ir::parse_func_text(&s).unwrap()
}

/// The peak in a plan's schedule line; when the schedule moved steps, checks that it lowered
/// the peak.
fn peak(plan: &str) -> usize {
    let line = plan
        .lines()
        .find(|l| l.starts_with("schedule:"))
        .expect("a schedule line");
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    if line.contains("moved earlier") {
        let (before, after) = (nums[nums.len() - 2], nums[nums.len() - 1]);
        assert!(after < before, "{plan}");
        after
    } else {
        nums[0]
    }
}

#[test]
fn independent_branches_run_one_at_a_time_and_agree_with_the_reference() {
    for n in [2, 3, 5] {
        let f = branches(n);
        let plan = describe_memory(&f, &common::env_options()).unwrap();
        // The optimizer's extraction may already emit each reduction after its product; either
        // way, at most two products (up to 256 x 256 f32 each) are live at once, not all n.
        let after = peak(&plan);
        assert!(after <= 2 * 256 * 256 * 4 + 64 * 1024, "n = {n}:\n{plan}");
        let args = random_args(&f, n as u64);
        let want = kiln_reference::eval(&f, &args).unwrap();
        let e = CpuExecutable::compile_with_cache(&f, None).unwrap();
        let got = e.run(&args).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            close(g, w).unwrap_or_else(|m| panic!("n = {n}, output {i}: {m}"));
        }
        assert_eq!(e.memory_plan().peak_bytes(), after, "n = {n}");
    }
}

#[test]
fn schedules_are_deterministic() {
    let f = branches(4);
    let a = describe_memory(&f, &common::env_options()).unwrap();
    for _ in 0..3 {
        assert_eq!(describe_memory(&f, &common::env_options()).unwrap(), a);
    }
}

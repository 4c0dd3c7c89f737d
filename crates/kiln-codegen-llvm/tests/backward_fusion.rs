//! How many kernels the backward passes of softmax and layernorm take (the optimizer issue asks
//! for at most 2 each), and that they agree with the reference.

mod common;

use kiln_codegen_llvm::cpu::{CpuExecutable, Step};

const SOFTMAX: &str = include_str!("../../../tests/filetests/opt/softmax.kir");
const LAYERNORM: &str = include_str!("../../../tests/filetests/opt/layernorm.kir");

fn backward_kernels(src: &str, wrt: &[usize]) -> (usize, String) {
    let f = kiln_ir::parse_func_text(src).unwrap();
    let b = kiln_autodiff::vjp(&f, wrt).unwrap();
    common::agrees_on_random_inputs(&b.to_string(), 11);
    let e = CpuExecutable::compile_with_options(&b, &[], &common::env_options()).unwrap();
    let n = e.plan().iter().filter(|s| **s == Step::Kernel).count();
    (
        n,
        kiln_codegen_llvm::cpu::describe_fusion(&b, &common::env_options()).unwrap(),
    )
}

/// The vjp functions return the forward output too: softmax's forward and backward take 2
/// kernels, and so do layernorm's: one row kernel writes the output, the input gradient and
/// `g * x_hat` (multi-output fusion: the row's mean and variance are computed once for all
/// three), and one column kernel writes the gamma and beta gradients (it reads `g * x_hat`
/// rather than recomputing each row's variance at every step down a column).
#[test]
fn softmax_and_layernorm_backward_kernel_counts() {
    let (s, sd) = backward_kernels(SOFTMAX, &[0]);
    assert!(s <= 2, "softmax forward + backward: {s} kernels\n{sd}");
    let (l, ld) = backward_kernels(LAYERNORM, &[0, 1, 2]);
    assert!(l <= 2, "layernorm forward + backward: {l} kernels\n{ld}");
    println!("softmax forward + backward: {s} kernels; layernorm: {l}");
}

#[test]
fn layernorm_backward_column_kernel_does_not_recompute_row_statistics() {
    // The gamma gradient sums g * x_hat down each column; x_hat holds the row's variance, which
    // must not be recomputed for every column at every row.
    let (_, d) = backward_kernels(LAYERNORM, &[0, 1, 2]);
    let column = d
        .lines()
        .find(|l| l.starts_with("kernel") && l.contains("-> f32[8]"))
        .unwrap_or_else(|| panic!("a column kernel\n{d}"));
    assert!(column.contains("work 64"), "linear work: {column}\n{d}");
}

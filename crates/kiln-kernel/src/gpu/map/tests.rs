//! The mapping's decisions on an H200.

use super::*;
use crate::gpu::print::{program_text, verify};
use crate::options::Options;

/// The launches of the first kernel of `src` lowered for an H200.
fn mapped(src: &str) -> GpuProgram {
    let f = kiln_ir::parse_func_text(src).expect("valid IR");
    let target = TargetInfo::h200();
    let l =
        crate::pipeline::lower_program(&f, &[], &Options::default(), &target, None, &mut |_| {})
            .expect("lowers");
    let i = l
        .fused
        .kernels
        .iter()
        .position(Option::is_some)
        .expect("a kernel");
    let ins: Vec<TensorType> = l.fused.operands[i]
        .iter()
        .map(|v| l.func.values[v.index()].clone())
        .collect();
    let p = map(l.fused.kernels[i].as_ref().unwrap(), &ins, &target, "k").expect("maps");
    for k in &p.launches {
        verify(k, target.gpu.as_ref().unwrap()).expect("verifies");
    }
    p
}

fn row_sum(shape: &str, out: &str) -> String {
    format!(
        "func @main(%0: f32[{shape}]) -> f32[{out}] {{\n  %1 = constant {{value = 0.0}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = add}} : f32[{out}]\n  return %2\n}}\n"
    )
}

#[test]
fn elementwise_kernels_fill_every_multiprocessor_with_grid_stride_loops() {
    let p = mapped(
        "func @main(%0: f32[8000000], %1: f32[8000000]) -> f32[8000000] {\n  %2 = add %0, %1 : f32[8000000]\n  return %2\n}\n",
    );
    let k = &p.launches[0];
    assert_eq!(
        (k.kind, k.grid, k.block),
        (MapKind::Elementwise, 132 * 16, 256)
    );
    // Four consecutive f32 elements per thread and iteration (16 bytes): 75 groups of 300.
    let small = mapped(
        "func @main(%0: f32[300]) -> f32[300] {\n  %1 = exponential %0 : f32[300]\n  return %1\n}\n",
    );
    assert_eq!(small.launches[0].grid, 1);
    let text = program_text(&small);
    assert!(
        text.contains("< 75;") && text.matches("out0[").count() == 4,
        "{text}"
    );
    // A size that does not divide into groups: one element per thread.
    let odd = mapped(
        "func @main(%0: f32[301]) -> f32[301] {\n  %1 = exponential %0 : f32[301]\n  return %1\n}\n",
    );
    let text = program_text(&odd);
    assert!(
        text.contains("< 301;") && text.matches("out0[").count() == 1,
        "{text}"
    );
}

#[test]
fn long_rows_get_a_warp_or_a_block_and_short_ones_a_thread() {
    let short = mapped(&row_sum("64,100", "64"));
    assert_eq!(short.launches[0].kind, MapKind::Elementwise);
    let warp = mapped(&row_sum("64,1000", "64"));
    let k = &warp.launches[0];
    assert_eq!((k.kind, k.grid, k.block), (MapKind::WarpRows, 8, 256));
    let text = program_text(&warp);
    assert!(
        text.contains("shfl.bfly r") && !text.contains("barrier"),
        "{text}"
    );
    let block = mapped(&row_sum("3,100000", "3"));
    let k = &block.launches[0];
    assert_eq!((k.kind, k.grid, k.block), (MapKind::BlockRows, 3, 1024));
    let text = program_text(&block);
    assert_eq!(text.matches("barrier").count(), 2, "{text}");
    assert!(text.contains("shared0: f32[32]"), "{text}");
}

#[test]
fn a_target_without_a_gpu_maps_nothing() {
    let f = kiln_ir::parse_func_text(&row_sum("2,3", "2")).unwrap();
    let ks = crate::pipeline::kernels(&f);
    let k = ks.iter().flatten().next().unwrap();
    let e = map(k, &[f.values[0].clone()], &TargetInfo::reference(), "k").unwrap_err();
    assert!(e.contains("no GPU"), "{e}");
}

#[test]
fn a_softmax_computes_each_row_reduction_once() {
    // The maximum appears twice in the fused body (in the numerator and, with variables of its
    // own, inside the denominator's sum): one value, one cooperative reduction.
    let src = "func @main(%0: f32[4,300]) -> f32[4,300] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[4]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[4,300]\n  %4 = subtract %0, %3 : f32[4,300]\n  %5 = exponential %4 : f32[4,300]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[4]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[4,300]\n  %9 = divide %5, %8 : f32[4,300]\n  return %9\n}\n";
    let p = mapped(src);
    assert_eq!(p.launches[0].kind, MapKind::WarpRows);
    let text = program_text(&p);
    // Two reductions of five shuffle levels each (warps of 32), and no reduction left inside
    // the elements' expression.
    assert_eq!(text.matches("shfl.bfly").count(), 10, "{text}");
    let last = text.lines().rev().find(|l| l.contains("= eval")).unwrap();
    assert!(!last.contains("reduce"), "{text}");
}

//! How the reference rounds a scatter's combinations: after each step for the wide floats (as
//! the kernels store each one), once for the small floats (held in f32 by the compiled
//! backends, every op's result rounded once: `kiln_ir::minifloat`). Random seed 21261 summed
//! 943 `f8e4m3b11fnuz` updates into one element: rounded after each step, a partial sum past
//! 30 (the format's largest) became NaN where the backends' once-rounded sum was 28.

use kiln_ir::{Literal, TensorType, parse_func_text};

/// `scatter` (`kind`) of three updates into element 0 of a one-element `dtype` operand.
fn scatter_into_one(dtype: &str, kind: &str, operand: f64, updates: [f64; 3]) -> f64 {
    let text = format!(
        "func @main(%0: {dtype}[1], %1: {dtype}[3]) -> {dtype}[1] {{
  %2 = constant {{value = [[0], [0], [0]]}} : i32[3,1]
  %3 = scatter %0, %2, %1 {{update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = {kind}}} : {dtype}[1]
  return %3
}}
"
    );
    let f = parse_func_text(&text).unwrap();
    let t = f.param_types();
    let args = [
        Literal::from_f64s(t[0].clone(), &[operand]).unwrap(),
        Literal::from_f64s(t[1].clone(), &updates).unwrap(),
    ];
    let out = kiln_reference::eval(&f, &args).unwrap();
    assert_eq!(out[0].ty(), &TensorType::new(t[0].dtype, [1]));
    out[0].to_f64s()[0]
}

#[test]
fn small_float_scatters_round_once() {
    // 20 + 20 = 40 overflows f8e4m3b11fnuz (largest 30) to NaN if rounded there; the sum
    // 20 + 20 - 20 + 4 = 24 is exact.
    assert_eq!(
        scatter_into_one("f8e4m3b11fnuz", "add", 20.0, [20.0, -20.0, 4.0]),
        24.0
    );
    // f8e4m3fn (3 mantissa bits) holds every second integer at 16: 16 + 1 alone would round
    // to 16 (a tie, to even) at each step; the sum 18 is held.
    assert_eq!(
        scatter_into_one("f8e4m3fn", "add", 16.0, [1.0, 1.0, 0.0]),
        18.0
    );
}

#[test]
fn wide_float_scatters_round_after_each_step() {
    // bf16 (8 significant bits) at 256 holds every second integer: 256 + 1 rounds to 256
    // (a tie, to even) each time, where the sum 258 would be held.
    assert_eq!(
        scatter_into_one("bf16", "add", 256.0, [1.0, 1.0, 0.0]),
        256.0
    );
    assert_eq!(
        scatter_into_one("f16", "add", 2048.0, [1.0, 1.0, 0.0]),
        2048.0
    );
    assert_eq!(
        scatter_into_one("f32", "add", 16_777_216.0, [1.0, 1.0, 0.0]),
        16_777_216.0
    );
}

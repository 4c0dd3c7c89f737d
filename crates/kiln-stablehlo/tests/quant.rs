//! Quantized types: each decomposition computes the values worked out by hand from the spec's
//! `quantize` and `dequantize` (on the reference interpreter), a decomposed module round-trips,
//! and unsupported or invalid quantized forms are located errors.

use kiln_ir::{Literal, parse_module, print_module};
use kiln_reference::eval;
use kiln_stablehlo::{ErrorKind, parse, to_text};

mod located;
use located::fails;

/// Imports `text` and runs its entry on `args`.
#[track_caller]
fn run(text: &str, args: &[Literal]) -> Vec<Literal> {
    let m = parse(text).unwrap_or_else(|e| panic!("import failed: {e}"));
    kiln_ir::verify_module(&m).expect("the import verifies");
    eval(m.entry().expect("an entry"), args).expect("it runs")
}

fn f32s(shape: &[usize], v: &[f32]) -> Literal {
    Literal::f32(shape.to_vec(), v.to_vec()).unwrap()
}

/// A function quantizing its `f32` argument of `shape` to `qtype` and returning the storage.
fn quantize_fn(shape: &str, qtype: &str, storage: &str) -> String {
    format!(
        "func.func @main(%x: tensor<{shape}xf32>) -> tensor<{shape}x{storage}> {{
  %q = \"stablehlo.uniform_quantize\"(%x) : (tensor<{shape}xf32>) -> tensor<{shape}x{qtype}>
  %s = \"stablehlo.bitcast_convert\"(%q) : (tensor<{shape}x{qtype}>) -> tensor<{shape}x{storage}>
  func.return %s : tensor<{shape}x{storage}>
}}"
    )
}

/// A function dequantizing its storage argument of `shape` from `qtype`.
fn dequantize_fn(shape: &str, qtype: &str, storage: &str) -> String {
    format!(
        "func.func @main(%s: tensor<{shape}x{storage}>) -> tensor<{shape}xf32> {{
  %q = \"stablehlo.bitcast_convert\"(%s) : (tensor<{shape}x{storage}>) -> tensor<{shape}x{qtype}>
  %x = \"stablehlo.uniform_dequantize\"(%q) : (tensor<{shape}x{qtype}>) -> tensor<{shape}xf32>
  func.return %x : tensor<{shape}xf32>
}}"
    )
}

#[test]
fn quantize_rounds_ties_to_even() {
    // x / 0.5 = 0.5, 1.5, -0.5, 2.5, -2.5, 3.5: ties go to the even neighbour.
    let f = quantize_fn("6", "!quant.uniform<i8:f32, 0.5>", "i8");
    let out = run(&f, &[f32s(&[6], &[0.25, 0.75, -0.25, 1.25, -1.25, 1.75])]);
    assert_eq!(out[0].to_i64s(), [0, 2, 0, 2, -2, 4]);
}

#[test]
fn quantize_adds_the_zero_point_before_rounding() {
    // x / 1 + 3 for x = 0.5, 1.5, -0.5 is 3.5, 4.5, 2.5: the ties are broken after the zero
    // point is added (4, 4, 2), not before (which would give 3, 5, 3).
    let f = quantize_fn("3", "!quant.uniform<i8:f32, 1.0:3>", "i8");
    let out = run(&f, &[f32s(&[3], &[0.5, 1.5, -0.5])]);
    assert_eq!(out[0].to_i64s(), [4, 4, 2]);
}

#[test]
fn quantize_clamps_to_the_storage_range() {
    // A declared range: values beyond it, and ones that round to beyond it, stop at its ends.
    let f = quantize_fn("4", "!quant.uniform<i8<-100:100>:f32, 1.0>", "i8");
    let out = run(&f, &[f32s(&[4], &[200.0, -300.0, 99.6, -100.4])]);
    assert_eq!(out[0].to_i64s(), [100, -100, 100, -100]);
    // The storage type's own range, unsigned (`u8`) with a zero point.
    let f = quantize_fn("3", "!quant.uniform<u8:f32, 2.0:10>", "ui8");
    let out = run(&f, &[f32s(&[3], &[-100.0, 1000.0, 3.0])]);
    assert_eq!(out[0].to_i64s(), [0, 255, 12]);
}

#[test]
fn quantize_per_axis_uses_each_slice_s_parameters() {
    // Dimension 1: column 0 scale 1 zero point 0, column 1 scale 0.5 zero point 10, column 2
    // scale 2 zero point -5 (3 / 2 - 5 = -3.5 → -4, to even).
    let q = "!quant.uniform<i8:f32:1, {1.0:0, 0.5:10, 2.0:-5}>";
    let f = quantize_fn("2x3", q, "i8");
    let out = run(&f, &[f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]);
    assert_eq!(out[0].to_i64s(), [1, 14, -4, 4, 20, -2]);
    // Dimension 0 of the same values: row 0 scale 1, row 1 scale 0.5 zero point 10.
    let q = "!quant.uniform<i8:f32:0, {1.0, 0.5:10}>";
    let f = quantize_fn("2x3", q, "i8");
    let out = run(&f, &[f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]);
    assert_eq!(out[0].to_i64s(), [1, 2, 3, 18, 20, 22]);
}

#[test]
fn dequantize_subtracts_the_zero_point_without_wrapping() {
    // (127 - -128) * 0.5 = 127.5: the difference 255 is beyond i8, and does not wrap.
    let f = dequantize_fn("3", "!quant.uniform<i8:f32, 0.5:-128>", "i8");
    let s = Literal::from_i64s(
        kiln_ir::TensorType::new(kiln_ir::DType::I8, vec![3]),
        &[127, -128, 0],
    )
    .unwrap();
    let out = run(&f, &[s]);
    assert_eq!(out[0].as_f32s().unwrap(), &[127.5, 0.0, 64.0]);
}

#[test]
fn dequantize_per_axis() {
    let q = "!quant.uniform<i8:f32:0, {0.1:-30, 0.5:-20}>";
    let f = dequantize_fn("2x2", q, "i8");
    let s = Literal::from_i64s(
        kiln_ir::TensorType::new(kiln_ir::DType::I8, vec![2, 2]),
        &[10, -30, 10, -20],
    )
    .unwrap();
    let out = run(&f, &[s]);
    let got = out[0].as_f32s().unwrap();
    let want = [4.0f32, 0.0, 15.0, 0.0];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?}");
    }
}

#[test]
fn requantize_goes_through_the_expressed_value() {
    // 10 at (0.1, -30) is 4.0, which at (0.3, 5) is 4 / 0.3 + 5 = 18.33 → 18.
    let text = "func.func @main(%s: tensor<i8>) -> tensor<i8> {
  %q = \"stablehlo.bitcast_convert\"(%s) : (tensor<i8>) -> tensor<!quant.uniform<i8:f32, 0.1:-30>>
  %r = \"stablehlo.uniform_quantize\"(%q) : (tensor<!quant.uniform<i8:f32, 0.1:-30>>) -> tensor<!quant.uniform<i8:f32, 0.3:5>>
  %t = \"stablehlo.bitcast_convert\"(%r) : (tensor<!quant.uniform<i8:f32, 0.3:5>>) -> tensor<i8>
  func.return %t : tensor<i8>
}";
    let s = Literal::from_i64s(kiln_ir::TensorType::scalar(kiln_ir::DType::I8), &[10]).unwrap();
    assert_eq!(run(text, &[s])[0].to_i64s(), [18]);
}

/// `%a * %b` on quantized tensors, compared, and selected: the ops run on the dequantized
/// values and quantized results are quantized again.
const OPS: &str = "func.func @main(%x: tensor<3xf32>, %y: tensor<3xf32>) -> (tensor<3xi8>, tensor<3xi1>, tensor<3xi8>) {
  %a = \"stablehlo.uniform_quantize\"(%x) : (tensor<3xf32>) -> tensor<3x!quant.uniform<i8:f32, 0.5>>
  %b = \"stablehlo.uniform_quantize\"(%y) : (tensor<3xf32>) -> tensor<3x!quant.uniform<i8:f32, 0.25:4>>
  %m = \"stablehlo.multiply\"(%a, %b) : (tensor<3x!quant.uniform<i8:f32, 0.5>>, tensor<3x!quant.uniform<i8:f32, 0.25:4>>) -> tensor<3x!quant.uniform<i8:f32, 1.0:-1>>
  %ms = \"stablehlo.bitcast_convert\"(%m) : (tensor<3x!quant.uniform<i8:f32, 1.0:-1>>) -> tensor<3xi8>
  %c = \"stablehlo.compare\"(%a, %b) {comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<3x!quant.uniform<i8:f32, 0.5>>, tensor<3x!quant.uniform<i8:f32, 0.25:4>>) -> tensor<3xi1>
  %s = \"stablehlo.select\"(%c, %a, %b) : (tensor<3xi1>, tensor<3x!quant.uniform<i8:f32, 0.5>>, tensor<3x!quant.uniform<i8:f32, 0.25:4>>) -> tensor<3x!quant.uniform<i8:f32, 0.5>>
  %ss = \"stablehlo.bitcast_convert\"(%s) : (tensor<3x!quant.uniform<i8:f32, 0.5>>) -> tensor<3xi8>
  func.return %ms, %c, %ss : tensor<3xi8>, tensor<3xi1>, tensor<3xi8>
}";

#[test]
fn other_ops_dequantize_compute_and_quantize() {
    // a = [3, 1.5, -2] exactly; b = [0.5, 2, 1.25] exactly.
    // a * b = [1.5, 3, -2.5]; at (1, -1): [0.5, 2, -3.5] → [0, 2, -4].
    // a > b = [true, false, false]; select: [a0, b1, b2] at (0.5, 0) = [6, 4, 2.5 → 2].
    let out = run(
        OPS,
        &[f32s(&[3], &[3.0, 1.5, -2.0]), f32s(&[3], &[0.5, 2.0, 1.25])],
    );
    assert_eq!(out[0].to_i64s(), [0, 2, -4]);
    assert_eq!(out[1].to_i64s(), [1, 0, 0]);
    assert_eq!(out[2].to_i64s(), [6, 4, 2]);
}

#[test]
fn a_quantized_constant_holds_stored_values() {
    // The elements of a quantized constant are its stored integers: 6 at (0.5, 2) is 2.0.
    let text = "func.func @main() -> tensor<2xf32> {
  %c = stablehlo.constant() {value = dense<[6, -2]> : tensor<2xi8>} : () -> tensor<2x!quant.uniform<i8:f32, 0.5:2>>
  %x = \"stablehlo.uniform_dequantize\"(%c) : (tensor<2x!quant.uniform<i8:f32, 0.5:2>>) -> tensor<2xf32>
  func.return %x : tensor<2xf32>
}";
    assert_eq!(run(text, &[])[0].as_f32s().unwrap(), &[2.0, -2.0]);
}

#[test]
fn the_generic_form_refuses_quantized_types() {
    let ast = kiln_stablehlo::parse_ast(kiln_stablehlo::Piece {
        text: OPS,
        first_line: 1,
    })
    .unwrap();
    let e = kiln_stablehlo::generic::print_generic(&ast).unwrap_err();
    assert_eq!(
        (e.kind, e.pos.to_string()),
        (ErrorKind::Unsupported, "2:8".into()),
        "{e}"
    );
}

#[test]
fn a_decomposed_module_round_trips() {
    let m = parse(OPS).unwrap();
    let text = print_module(&m);
    assert!(!text.contains("quant"), "{text}");
    let back = print_module(&parse_module(&text).unwrap());
    assert!(back == text, "kiln text:\n{text}\nread back:\n{back}");
    let shlo = to_text(&m).unwrap();
    let back = print_module(&parse(&shlo).unwrap());
    assert!(back == text, "StableHLO:\n{shlo}\nread back:\n{back}");
}

/// A function quantizing a `tensor<2xf32>` constant to `qtype` (its `!` is at 3:71).
fn quantize_const(qtype: &str) -> String {
    format!(
        "func.func @main() {{
  %x = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %q = \"stablehlo.uniform_quantize\"(%x) : (tensor<2xf32>) -> tensor<2x{qtype}>
  func.return
}}"
    )
}

#[test]
fn unsupported_quantized_forms_are_located() {
    fails(
        &quantize_const("!quant.any<i8:f32>"),
        ErrorKind::Unsupported,
        "3:71",
        "element type `!quant.any`",
    );
    fails(
        &quantize_const("!quant.uniform<i8:tf32, 1.0>"),
        ErrorKind::Unsupported,
        "3:89",
        "element type `tf32`",
    );
    // An op with regions other than control flow on quantized types.
    fails(
        "func.func @main(%x: tensor<2xi8>) -> tensor<i8> {
  %q = \"stablehlo.bitcast_convert\"(%x) : (tensor<2xi8>) -> tensor<2x!quant.uniform<i8:f32, 1.0>>
  %z = stablehlo.constant dense<0> : tensor<!quant.uniform<i8:f32, 1.0>>
  %r = \"stablehlo.reduce\"(%q, %z) ({
  ^bb0(%a: tensor<!quant.uniform<i8:f32, 1.0>>, %b: tensor<!quant.uniform<i8:f32, 1.0>>):
    %s = stablehlo.add %a, %b : tensor<!quant.uniform<i8:f32, 1.0>>
    stablehlo.return %s : tensor<!quant.uniform<i8:f32, 1.0>>
  }) {dimensions = array<i64: 0>} : (tensor<2x!quant.uniform<i8:f32, 1.0>>, tensor<!quant.uniform<i8:f32, 1.0>>) -> tensor<!quant.uniform<i8:f32, 1.0>>
  %y = \"stablehlo.bitcast_convert\"(%r) : (tensor<!quant.uniform<i8:f32, 1.0>>) -> tensor<i8>
  func.return %y : tensor<i8>
}",
        ErrorKind::Unsupported,
        "4:8",
        "quantized types in `stablehlo.reduce`",
    );
}

/// `!quant.uniform<i8:f32, 0.5>` with `shape` (`2x`, or empty for a scalar).
fn q(shape: &str) -> String {
    format!("tensor<{shape}!quant.uniform<i8:f32, 0.5>>")
}

#[test]
fn quantized_parameters_and_results_of_functions_are_their_storage() {
    // @double takes and returns a quantized tensor: kiln's @double takes and returns `i8`.
    let (q2, f2) = (q("2x"), "tensor<2xf32>");
    let text = format!(
        "func.func @main(%x: {f2}) -> {f2} {{
  %q = stablehlo.uniform_quantize %x : ({f2}) -> {q2}
  %r = func.call @double(%q) : ({q2}) -> {q2}
  %y = stablehlo.uniform_dequantize %r : ({q2}) -> {f2}
  func.return %y : {f2}
}}
func.func private @double(%a: {q2}) -> {q2} {{
  %s = stablehlo.add %a, %a : {q2}
  func.return %s : {q2}
}}"
    );
    let m = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let double = m.func("double").unwrap();
    assert_eq!(
        double.param_types(),
        [kiln_ir::TensorType::new(kiln_ir::DType::I8, vec![2])]
    );
    assert_eq!(
        run(&text, &[f32s(&[2], &[1.0, -2.5])])[0]
            .as_f32s()
            .unwrap(),
        &[2.0, -5.0]
    );
}

#[test]
fn quantized_loop_carries_are_their_storage() {
    // A quantized value doubled three times in a loop: 1.0 (stored 2) becomes 8.0 (16).
    let q0 = q("");
    let text = format!(
        "func.func @main(%x: tensor<f32>) -> tensor<f32> {{
  %q = stablehlo.uniform_quantize %x : (tensor<f32>) -> {q0}
  %i0 = stablehlo.constant dense<0> : tensor<i64>
  %r:2 = \"stablehlo.while\"(%q, %i0) ({{
  ^bb0(%a: {q0}, %i: tensor<i64>):
    %n = stablehlo.constant dense<3> : tensor<i64>
    %c = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  }}, {{
  ^bb0(%a: {q0}, %i: tensor<i64>):
    %s = stablehlo.add %a, %a : {q0}
    %one = stablehlo.constant dense<1> : tensor<i64>
    %j = stablehlo.add %i, %one : tensor<i64>
    stablehlo.return %s, %j : {q0}, tensor<i64>
  }}) : ({q0}, tensor<i64>) -> ({q0}, tensor<i64>)
  %y = stablehlo.uniform_dequantize %r#0 : ({q0}) -> tensor<f32>
  func.return %y : tensor<f32>
}}"
    );
    let x = Literal::f32(vec![], vec![1.0]).unwrap();
    assert_eq!(run(&text, &[x])[0].as_f32s().unwrap(), &[8.0]);
}

#[test]
fn invalid_quantization_parameters_cite_the_spec() {
    fails(
        &quantize_const("!quant.uniform<i8:f32, 1.0:200>"),
        ErrorKind::Invalid,
        "3:98",
        "zero point 200 is outside the storage range -128:127 (C7)",
    );
    fails(
        &quantize_const("!quant.uniform<i8:f32, -1.0>"),
        ErrorKind::Invalid,
        "3:94",
        "(C5, C6)",
    );
    fails(
        &quantize_const("!quant.uniform<i8:f32, {1.0, 2.0}>"),
        ErrorKind::Invalid,
        "3:94",
        "2 scales without a quantization dimension (C10)",
    );
    fails(
        &quantize_const("!quant.uniform<i8:f32:0, {1.0, 2.0, 3.0}>"),
        ErrorKind::Invalid,
        "3:71",
        "quantization dimension 0 has size 2, but there are 3 scales (C13)",
    );
    fails(
        &quantize_const("!quant.uniform<i8:f32:1, {1.0, 2.0}>"),
        ErrorKind::Invalid,
        "3:71",
        "quantization dimension 1 of a tensor of rank 1 (C12)",
    );
    fails(
        &quantize_const("!quant.uniform<i8<5:-5>:f32, 1.0>"),
        ErrorKind::Invalid,
        "3:89",
        "(C3)",
    );
    fails(
        &quantize_const("!quant.uniform<f32:f32, 1.0>"),
        ErrorKind::Invalid,
        "3:86",
        "the storage type of a quantized type is an integer type",
    );
}

//! kiln's derivatives are real: a gradient or a tangent whose path passes through complex
//! numbers is an error naming the op, never a derivative with the complex part silently
//! dropped (zero); complex values off the differentiated path (a sort's complex keys that no
//! parameter reaches) leave the real derivatives as they are.

use kiln_autodiff::{grad, jvp};
use kiln_ir::{Literal, parse_func_text};

/// A real loss of a real parameter through complex numbers: `sum(|rfft(x)|)`, and
/// `sum(real(convert(x)))`.
const THROUGH_FFT: &str = "func @main(%0: f32[8]) -> f32[] {\n  %1 = fft %0 {fft_type = RFFT, fft_length = [8]} : c64[5]\n  %2 = abs %1 : f32[5]\n  %3 = constant {value = 0.0} : f32[]\n  %4 = reduce %2, %3 {dimensions = [0], kind = add} : f32[]\n  return %4\n}\n";
const THROUGH_CONVERT: &str = "func @main(%0: f64[3]) -> f64[] {\n  %1 = convert %0 : c128[3]\n  %2 = multiply %1, %1 : c128[3]\n  %3 = real %2 : f64[3]\n  %4 = constant {value = 0.0} : f64[]\n  %5 = reduce %3, %4 {dimensions = [0], kind = add} : f64[]\n  return %5\n}\n";

#[test]
fn gradients_through_complex_numbers_are_errors() {
    for (src, op) in [(THROUGH_FFT, "`abs`"), (THROUGH_CONVERT, "`real`")] {
        let f = parse_func_text(src).unwrap();
        let e = grad(&f, &[0])
            .expect_err("a gradient through complex numbers")
            .to_string();
        assert!(e.contains(op) && e.contains("complex"), "{e}");
    }
}

/// The forward mode as the reverse mode transposed (these programs), and instruction by
/// instruction (a program with a loop, `LOOP_THEN_CONVERT`).
#[test]
fn tangents_through_complex_numbers_are_errors() {
    for (src, op) in [
        (THROUGH_FFT, "`abs`"),
        (THROUGH_CONVERT, "`real`"),
        (LOOP_THEN_CONVERT, "`convert`"),
    ] {
        let f = parse_func_text(src).unwrap();
        let e = jvp(&f, &[0])
            .expect_err("a tangent through complex numbers")
            .to_string();
        assert!(e.contains(op) && e.contains("complex numbers"), "{e}");
    }
}

/// A loop (so the forward mode runs instruction by instruction), then a conversion to complex.
const LOOP_THEN_CONVERT: &str = "func @main(%0: f64[3]) -> f64[] {\n  %1 = constant {value = 0} : i32[]\n  %2, %3 = while %1, %0 {cond = func @cond(%0: i32[], %1: f64[3]) -> pred[] {\n      %2 = constant {value = 2} : i32[]\n      %3 = compare %0, %2 {comparison_direction = LT} : pred[]\n      return %3\n    }, body = func @body(%0: i32[], %1: f64[3]) -> (i32[], f64[3]) {\n      %2 = constant {value = 1} : i32[]\n      %3 = add %0, %2 : i32[]\n      %4 = multiply %1, %1 : f64[3]\n      return %3, %4\n    }} : i32[], f64[3]\n  %4 = convert %3 : c128[3]\n  %5 = exponential %4 : c128[3]\n  %6 = real %5 : f64[3]\n  %7 = constant {value = 0.0} : f64[]\n  %8 = reduce %6, %7 {dimensions = [0], kind = add} : f64[]\n  return %8\n}\n";

/// Complex keys no parameter reaches order a real payload: its gradient is the sorted
/// positions' cotangents moved back (here each element's weight in the loss).
#[test]
fn complex_values_off_the_path_leave_gradients_alone() {
    let f = parse_func_text(
        "func @main(%0: c64[4], %1: f32[4]) -> f32[] {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @cmp(%0: c64[], %1: c64[], %2: f32[], %3: f32[]) -> pred[] {\n      %4 = real %0 : f32[]\n      %5 = real %1 : f32[]\n      %6 = compare %4, %5 {comparison_direction = LT} : pred[]\n      return %6\n    }} : c64[4], f32[4]\n  %4 = iota {iota_dimension = 0} : f32[4]\n  %5 = multiply %3, %4 : f32[4]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [0], kind = add} : f32[]\n  return %7\n}\n",
    )
    .unwrap();
    let g = grad(&f, &[1]).unwrap_or_else(|e| panic!("{e}"));
    let keys = Literal::from_complex_f64s(
        kiln_ir::TensorType::new(kiln_ir::DType::C64, [4]),
        &[[3.0, 0.0], [1.0, 5.0], [2.0, -1.0], [0.0, 0.0]],
    )
    .unwrap();
    let x = Literal::f32([4], vec![10.0, 20.0, 30.0, 40.0]).unwrap();
    let out = kiln_reference::eval(&g, &[keys, x]).unwrap();
    // Sorted by real part: positions 3, 1, 2, 0 get weights 0, 1, 2, 3.
    assert_eq!(out.last().unwrap().to_f64s(), vec![3.0, 1.0, 2.0, 0.0]);
}

//! Deeply nested text is rejected with a parse error, never by overflowing the stack.

use kiln_ir::parse::MAX_NESTING;
use kiln_ir::{DType, ParseError, TensorType, parse_func_text, parse_literal, parse_module};

/// Runs `f` on a thread with a small stack (256 KiB), so that a parser recursing once per
/// bracket would overflow it long before 100,000 levels.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn assert_depth_error(e: &ParseError, line: usize, column: usize) {
    assert_eq!((e.line, e.column), (line, column), "{e}");
    assert!(e.message.contains("nested"), "{e}");
    assert!(e.message.contains(&MAX_NESTING.to_string()), "{e}");
}

const DEEP: usize = 100_000;

#[test]
fn deep_constant_literal_is_a_parse_error() {
    let e = on_small_stack(|| {
        let src = format!(
            "func @main() -> f32[] {{\n  %0 = constant {{value = {}}} : f32[]\n  return %0\n}}\n",
            "[".repeat(DEEP)
        );
        parse_module(&src).unwrap_err()
    });
    // `%0 = constant {value = ` is 25 columns; the first bracket past the limit is the error.
    assert_depth_error(&e, 2, 26 + MAX_NESTING);
}

#[test]
fn deep_attribute_is_a_parse_error() {
    let e = on_small_stack(|| {
        let src = format!(
            "func @main(%0: f32[2]) -> f32[2] {{\n  %1 = transpose %0 {{permutation = {}{}}} : f32[2]\n  return %1\n}}\n",
            "[".repeat(DEEP),
            "]".repeat(DEEP)
        );
        parse_func_text(&src).unwrap_err()
    });
    let col = "  %1 = transpose %0 {permutation = ".len() + 1;
    assert_depth_error(&e, 2, col + MAX_NESTING);
}

#[test]
fn deep_argument_value_is_a_parse_error() {
    let e = on_small_stack(|| {
        let src = "[".repeat(DEEP) + &"]".repeat(DEEP);
        parse_literal(&src, &TensorType::new(DType::F32, [1])).unwrap_err()
    });
    assert_depth_error(&e, 1, 1 + MAX_NESTING);
}

#[test]
fn deep_type_is_a_parse_error() {
    let e = on_small_stack(|| {
        let src = format!(
            "func @main(%0: f32{}) -> f32[] {{\n  return %0\n}}\n",
            "[".repeat(DEEP)
        );
        parse_module(&src).unwrap_err()
    });
    assert_eq!((e.line, e.column), (1, 20), "{e}");
}

#[test]
fn nesting_up_to_the_limit_parses() {
    let value = on_small_stack(|| {
        let shape = vec![1usize; MAX_NESTING];
        let src = format!("{}2.5{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        parse_literal(&src, &TensorType::new(DType::F32, shape)).map(|l| l.to_f64s())
    });
    assert_eq!(value.unwrap(), vec![2.5]);
    let e = on_small_stack(|| {
        let n = MAX_NESTING + 1;
        let src = format!("{}2.5{}", "[".repeat(n), "]".repeat(n));
        parse_literal(&src, &TensorType::new(DType::F32, vec![1usize; n])).unwrap_err()
    });
    assert_depth_error(&e, 1, 1 + MAX_NESTING);
}

//! Error messages quote at most a short excerpt of the input, however long the input is.

use kiln_ir::{DType, TensorType, parse_literal, parse_module, verify_module};

/// The most an error message may take, whatever it quotes.
const SHORT: usize = 300;

/// Runs `f` on a thread with a large stack, so that the old recursive parser gets far enough
/// to show what it quotes.
fn on_big_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

fn assert_short(msg: &str, line: usize, column: usize) {
    assert!(msg.len() < SHORT, "{} bytes: {msg}", msg.len());
    assert!(msg.starts_with(&format!("{line}:{column}: ")), "{msg}");
}

#[test]
fn deep_attribute_error_is_short() {
    let e = on_big_stack(|| {
        let n = 20_000;
        let src = format!(
            "func @main(%0: f32[2]) -> f32[2] {{\n  %1 = transpose %0 {{permutation = {}{}}} : f32[2]\n  return %1\n}}\n",
            "[".repeat(n),
            "]".repeat(n)
        );
        parse_module(&src).unwrap_err().to_string()
    });
    assert!(
        e.len() < SHORT,
        "{} bytes: {}",
        e.len(),
        &e[..SHORT.min(e.len())]
    );
    assert!(e.starts_with("2:"), "{e}");
}

#[test]
fn wide_attribute_is_cut_with_a_note() {
    // `[[0], [0], ...]` with 10,000 entries: 50,000 characters, of which the first 80 are quoted.
    let list = vec!["[0]"; 10_000].join(", ");
    let src = format!(
        "func @main(%0: f32[2]) -> pred[2] {{\n  %1 = compare %0, %0 {{comparison_direction = [{list}]}} : pred[2]\n  return %1\n}}\n"
    );
    let e = parse_module(&src).unwrap_err().to_string();
    assert_short(&e, 2, 23);
    assert!(e.contains("attribute `comparison_direction`"), "{e}");
    let quoted = format!("`[{}…` (49920 more characters)", &list[..79]);
    assert!(e.ends_with(&quoted), "{e}");
}

#[test]
fn ragged_constant_is_cut() {
    let row = format!("[{}]", vec!["1.0"; 5_000].join(", "));
    let src = format!(
        "func @main() -> f32[2,5000] {{\n  %0 = constant {{value = [{row}, [1.0]]}} : f32[2,5000]\n  return %0\n}}\n"
    );
    let e = parse_module(&src).unwrap_err().to_string();
    assert_short(&e, 2, 17);
    assert!(e.contains("ragged constant"), "{e}");
    // A deep ragged constant prints a long shape: it is cut too.
    let n = 200;
    let src = format!(
        "func @main() -> f32[] {{\n  %0 = constant {{value = [{}1.0{}, 2.0]}} : f32[]\n  return %0\n}}\n",
        "[".repeat(n),
        "]".repeat(n)
    );
    let e = parse_module(&src).unwrap_err().to_string();
    assert_short(&e, 2, 17);
}

#[test]
fn long_tokens_are_cut() {
    let long = "x".repeat(50_000);
    let digits = "9".repeat(50_000);
    let cases = [
        // An unknown op, an unknown element type, a bad dimension, an undefined value.
        format!(
            "func @main(%0: f32[2]) -> f32[2] {{\n  %1 = {long} %0 : f32[2]\n  return %1\n}}\n"
        ),
        format!("func @main(%0: {long}[2]) -> f32[2] {{\n  return %0\n}}\n"),
        format!("func @main(%0: f32[{digits}]) -> f32[2] {{\n  return %0\n}}\n"),
        format!("func @main(%0: f32[2]) -> f32[2] {{\n  return %{long}\n}}\n"),
        // Expected X, found a long word.
        format!("func @main(%0: f32[2]) -> f32[2] {{\n  %1 = add %0, %0 {long}\n  return %1\n}}\n"),
        // An unknown attribute name, and a value that is not a valid element.
        format!(
            "func @main(%0: f32[2]) -> f32[2] {{\n  %1 = transpose %0 {{{long} = [0]}} : f32[2]\n  return %1\n}}\n"
        ),
        format!(
            "func @main() -> f32[1] {{\n  %0 = constant {{value = [{long}]}} : f32[1]\n  return %0\n}}\n"
        ),
        format!(
            "func @main(%0: f32[2]) -> f32[2] {{\n  %1 = compare %0, %0 {{comparison_direction = {long}}} : pred[2]\n  return %0\n}}\n"
        ),
        format!("func @{long}(%0: f32[2]) -> f32[2] {{\n  return %0\n}} {long}"),
    ];
    for src in &cases {
        let e = parse_module(src).unwrap_err().to_string();
        assert!(e.len() < SHORT, "{} bytes: {e}", e.len());
        assert!(e.contains('…'), "{e}");
    }
    let e = parse_literal(&format!("[{long}]"), &TensorType::new(DType::F32, [1]))
        .unwrap_err()
        .to_string();
    assert!(e.len() < SHORT, "{} bytes: {e}", e.len());
}

#[test]
fn duplicate_long_value_name_is_cut() {
    let long = "v".repeat(10_000);
    let src = format!(
        "func @main(%{long}: f32[2], %{long}: f32[2]) -> f32[2] {{\n  return %{long}\n}}\n"
    );
    let e = parse_module(&src).unwrap_err().to_string();
    assert!(e.len() < SHORT, "{} bytes: {e}", e.len());
    assert!(e.contains("defined twice"), "{e}");
}

#[test]
fn literal_type_mismatch_is_cut() {
    let n = 200;
    let src = format!("{}1.0{}", "[".repeat(n), "]".repeat(n));
    let e = parse_literal(&src, &TensorType::new(DType::F32, vec![2usize; 200]))
        .unwrap_err()
        .to_string();
    assert!(e.len() < SHORT, "{} bytes: {e}", e.len());
}

#[test]
fn verifier_errors_quoting_a_long_instruction_are_bounded() {
    let values = vec!["1.0"; 10_000].join(", ");
    let src = format!(
        "func @main() -> f32[10000] {{\n  %0 = constant {{value = [{values}]}} : f32[10001]\n  return %0\n}}\n"
    );
    let e = verify_module(&parse_module(&src).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.len() < 1_000, "{} bytes: {e}", e.len());
    assert!(e.contains("constant_c1"), "{e}");
    // A very high rank prints long types; the message stays bounded.
    let shape = vec!["1"; 10_000].join(",");
    let src = format!(
        "func @main(%0: f32[{shape}], %1: f32[2]) -> f32[2] {{\n  %2 = add %0, %1 : f32[2]\n  return %2\n}}\n"
    );
    let e = verify_module(&parse_module(&src).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.len() < 1_500, "{} bytes: {e}", e.len());
    assert!(e.contains("add_c1"), "{e}");
}

#[test]
fn short_quotes_are_unchanged() {
    let src = "func @main(%0: f32[2]) -> f32[2] {\n  %1 = compare %0, %0 {comparison_direction = lt} : pred[2]\n  return %1\n}\n";
    assert_eq!(
        parse_module(src).unwrap_err().to_string(),
        "2:23: attribute `comparison_direction`: expected one of EQ, NE, LT, LE, GT, GE, found `lt`"
    );
}

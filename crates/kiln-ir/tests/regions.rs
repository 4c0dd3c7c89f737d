//! Regions (`while`, `case`): their text form round-trips, the verifier checks their
//! signatures against the carries and operands, and malformed ones are errors naming both types.

use kiln_ir::parse::MAX_REGION_NESTING;
use kiln_ir::{Builder, DType, Op, TensorType, parse_func_text, parse_module, verify};

const LOOP: &str = "func @main(%0: i32[], %1: f32[3]) -> (i32[], f32[3]) {
  %2, %3 = while %0, %1 {cond = func @cond(%0: i32[], %1: f32[3]) -> pred[] {
      %2 = constant {value = 3} : i32[]
      %3 = compare %0, %2 {comparison_direction = LT} : pred[]
      return %3
    }, body = func @body(%0: i32[], %1: f32[3]) -> (i32[], f32[3]) {
      %2 = constant {value = 1} : i32[]
      %3 = add %0, %2 : i32[]
      %4 = multiply %1, %1 : f32[3]
      return %3, %4
    }} : i32[], f32[3]
  return %2, %3
}
";

/// A case whose second branch holds a loop: regions nest.
const NESTED: &str = "func @main(%0: i32[], %1: f32[]) -> f32[] {
  %2 = case %0, %1 {branches = [func @branch0(%0: f32[]) -> f32[] {
      %1 = negate %0 : f32[]
      return %1
    }, func @branch1(%0: f32[]) -> f32[] {
      %1 = while %0 {cond = func @cond(%0: f32[]) -> pred[] {
          %1 = constant {value = 1.0} : f32[]
          %2 = compare %0, %1 {comparison_direction = GT} : pred[]
          return %2
        }, body = func @body(%0: f32[]) -> f32[] {
          %1 = constant {value = 0.5} : f32[]
          %2 = multiply %0, %1 : f32[]
          return %2
        }} : f32[]
      return %1
    }]} : f32[]
  return %2
}
";

#[test]
fn regions_round_trip_through_text() {
    for src in [LOOP, NESTED] {
        let f = parse_func_text(src).unwrap();
        verify(&f).unwrap();
        assert_eq!(f.to_string(), src);
        let g = parse_func_text(&f.to_string()).unwrap();
        assert_eq!(f, g);
    }
}

#[test]
fn a_region_names_its_values_apart_from_the_enclosing_function() {
    let f = parse_func_text(LOOP).unwrap();
    let Op::While { cond, body } = &f.insts[0].op else {
        panic!("a while");
    };
    assert_eq!(cond.params.len(), 2);
    assert_eq!(body.output_types, f.param_types());
    // The enclosing function has its own four values; each region its own.
    assert_eq!(f.values.len(), 4);
    assert_eq!(body.values.len(), 5);
    assert_eq!(f.insts[0].op.regions().len(), 2);
}

#[test]
fn errors_name_the_region_instead_of_printing_it() {
    let bad = LOOP.replace(
        "(i32[], f32[3]) {\n      %2 = constant {value = 1}",
        "(i32[], f64[3]) {\n      %2 = constant {value = 1}",
    );
    let bad = bad.replace(
        "      return %3, %4\n",
        "      %5 = convert %4 : f64[3]\n      return %3, %5\n",
    );
    let f = parse_func_text(&bad).unwrap();
    let e = verify(&f).unwrap_err();
    assert_eq!(e.diag.label, "while_c4");
    let text = e.to_string();
    assert!(
        text.contains("while %0, %1 {cond = @cond, body = @body}"),
        "{text}"
    );
    assert!(
        text.contains("(i32[], f64[3])") && text.contains("(i32[], f32[3])"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
}

#[test]
fn a_region_cannot_use_a_value_of_the_enclosing_function() {
    let src = "func @main(%k: i32[], %x: f32[2]) -> f32[2] {
  %r = case %k {branches = [func @b0() -> f32[2] {
      return %x
    }]} : f32[2]
  return %r
}
";
    let e = parse_module(src).unwrap_err();
    assert!(e.message.contains("undefined value `%x`"), "{e}");
    assert_eq!(e.line, 3);
}

#[test]
fn regions_nested_too_deep_are_a_parse_error() {
    let depth = MAX_REGION_NESTING + 1;
    let mut src = String::new();
    for _ in 0..depth {
        src.push_str("func @main(%0: i32[]) -> i32[] {\n  %1 = case %0 {branches = [");
    }
    src.push_str("func @main(%0: i32[]) -> i32[] {\n  return %0\n}");
    for _ in 0..depth {
        src.push_str("]} : i32[]\n  return %1\n}");
    }
    let e = parse_module(&src).unwrap_err();
    assert!(
        e.message.contains("regions are nested more than 64 deep"),
        "{e}"
    );
}

#[test]
fn the_builder_infers_a_case_s_results_from_its_branches() {
    let mut r = Builder::new("b0");
    let x = r.param(TensorType::new(DType::F32, [2]));
    let y = r.unary(Op::Negate {}, x).unwrap();
    let b0 = r.finish(&[y, x]).unwrap();
    let mut b = Builder::new("main");
    let k = b.param(TensorType::scalar(DType::I32));
    let x = b.param(TensorType::new(DType::F32, [2]));
    let outs = b.push(Op::Case { branches: vec![b0] }, &[k, x]).unwrap();
    assert_eq!(outs.len(), 2);
    let f = b.finish(&outs).unwrap();
    assert_eq!(f.output_types, vec![TensorType::new(DType::F32, [2]); 2]);
}

/// At least eight malformed loops and branches, each rejected with the constraint it breaks
/// and both types in the message (the verify filetests hold more).
#[test]
fn malformed_regions_are_rejected_naming_both_types() {
    let x2 = "f32[2]";
    let cases: Vec<(String, &str, Vec<&str>)> = vec![
        (
            format!(
                "func @main(%a: {x2}) -> {x2} {{\n  %r = while %a {{cond = func @c(%x: f32[3]) -> pred[] {{\n      %p = constant {{value = true}} : pred[]\n      return %p\n    }}, body = func @b(%x: {x2}) -> {x2} {{\n      return %x\n    }}}} : {x2}\n  return %r\n}}\n"
            ),
            "while_c1",
            vec!["(f32[3])", "(f32[2])"],
        ),
        (
            format!(
                "func @main(%a: {x2}) -> {x2} {{\n  %r = while %a {{cond = func @c(%x: {x2}) -> f32[2] {{\n      return %x\n    }}, body = func @b(%x: {x2}) -> {x2} {{\n      return %x\n    }}}} : {x2}\n  return %r\n}}\n"
            ),
            "while_c2",
            vec!["pred[]", "(f32[2])"],
        ),
        (
            format!(
                "func @main(%a: {x2}) -> {x2} {{\n  %r = while %a {{cond = func @c(%x: {x2}) -> pred[] {{\n      %p = constant {{value = true}} : pred[]\n      return %p\n    }}, body = func @b(%x: f64[2]) -> {x2} {{\n      %y = convert %x : {x2}\n      return %y\n    }}}} : {x2}\n  return %r\n}}\n"
            ),
            "while_c3",
            vec!["(f64[2])", "(f32[2])"],
        ),
        (
            format!(
                "func @main(%a: {x2}) -> {x2} {{\n  %r = while %a {{cond = func @c(%x: {x2}) -> pred[] {{\n      %p = constant {{value = true}} : pred[]\n      return %p\n    }}, body = func @b(%x: {x2}) -> i32[2] {{\n      %y = convert %x : i32[2]\n      return %y\n    }}}} : {x2}\n  return %r\n}}\n"
            ),
            "while_c4",
            vec!["(i32[2])", "(f32[2])"],
        ),
        (
            format!(
                "func @main(%k: i32[], %a: {x2}) -> {x2} {{\n  %r = case %k, %a {{branches = [func @b0(%x: {x2}) -> {x2} {{\n      return %x\n    }}]}} : f64[2]\n  return %r\n}}\n"
            ),
            "case_c4",
            vec!["f64[2]", "f32[2]"],
        ),
        (
            format!(
                "func @main(%k: i64[], %a: {x2}) -> {x2} {{\n  %r = case %k, %a {{branches = [func @b0(%x: {x2}) -> {x2} {{\n      return %x\n    }}]}} : {x2}\n  return %r\n}}\n"
            ),
            "case_c1",
            vec!["i32[]", "i64[]"],
        ),
        (
            format!(
                "func @main(%k: i32[], %a: {x2}) -> {x2} {{\n  %r = case %k, %a {{branches = [func @b0(%x: f32[4]) -> {x2} {{\n      %y = slice %x {{start_indices = [0], limit_indices = [2], strides = [1]}} : {x2}\n      return %y\n    }}]}} : {x2}\n  return %r\n}}\n"
            ),
            "case_c3",
            vec!["(f32[4])", "(f32[2])"],
        ),
        (
            format!(
                "func @main(%k: i32[], %a: {x2}) -> {x2} {{\n  %r = case %k, %a {{branches = [func @b0(%x: {x2}) -> {x2} {{\n      return %x\n    }}, func @b1(%x: {x2}) -> pred[2] {{\n      %y = compare %x, %x {{comparison_direction = EQ}} : pred[2]\n      return %y\n    }}]}} : {x2}\n  return %r\n}}\n"
            ),
            "case_c4",
            vec!["(pred[2])", "(f32[2])"],
        ),
        (
            format!(
                "func @main(%k: i32[], %a: {x2}) -> {x2} {{\n  %r = case %k, %a {{branches = []}} : {x2}\n  return %r\n}}\n"
            ),
            "case_c2",
            vec!["at least one branch"],
        ),
        (
            format!(
                "func @main(%a: {x2}) -> {x2} {{\n  %r = while %a {{cond = func @c(%x: {x2}) -> pred[] {{\n      %p = constant {{value = true}} : pred[]\n      return %p\n    }}, body = func @b(%x: {x2}) -> {x2} {{\n      %y = add %x, %p : {x2}\n      return %y\n    }}}} : {x2}\n  return %r\n}}\n"
            ),
            "parse",
            vec!["undefined value `%p`"],
        ),
    ];
    for (src, label, words) in cases {
        let text = match parse_module(&src) {
            Err(e) => {
                assert_eq!(label, "parse", "{e}\n{src}");
                e.to_string()
            }
            Ok(m) => {
                let e = kiln_ir::verify_module(&m).expect_err(&src);
                assert_eq!(e.diag.label, label, "{e}");
                e.to_string()
            }
        };
        for w in words {
            assert!(text.contains(w), "`{w}` not in: {text}");
        }
    }
}

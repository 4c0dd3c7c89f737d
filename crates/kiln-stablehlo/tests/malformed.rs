//! Malformed and unsupported input: every case is an error that names the problem and its
//! line and column, never a panic.

use kiln_stablehlo::{ErrorKind, parse, parse_bytes};

/// A function around `body` (its first op is on line 2, column 3).
fn wrap(body: &str) -> String {
    format!("func.func @main() {{\n  {body}\n  func.return\n}}\n")
}

/// Asserts that `text` fails at `at` (`line:column`) with a message containing `what`.
#[track_caller]
fn fails(text: &str, at: &str, what: &str) {
    let line = std::panic::Location::caller().line();
    let shown = match parse(text) {
        Ok(_) => format!("accepted: {text}"),
        Err(e) => e.to_string(),
    };
    assert!(
        shown.starts_with(&format!("{at}: ")) && shown.contains(what),
        "line {line}: expected {at}: …{what}…, got: {shown}"
    );
}

/// As [`fails`], and the error is of `kind`.
#[track_caller]
fn fails_as(text: &str, kind: ErrorKind, at: &str, what: &str) {
    fails(text, at, what);
    assert_eq!(parse(text).unwrap_err().kind, kind);
}

const C2: &str = "%c = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>";

#[test]
fn truncated_text() {
    fails("func.func @main(", "1:17", "expected a value");
    fails(
        "func.func @main() {\n  %0 = stablehlo.constant dense<[1, 2",
        "2:38",
        "expected `,`",
    );
    fails(
        "func.func @main() {\n  %0 = stablehlo.add %a,",
        "2:25",
        "expected `}`",
    );
    fails(
        "func.func @main() {\n  func.return\n",
        "3:1",
        "expected `}`",
    );
    fails("func.func @main() -> tensor<2x", "1:31", "an element type");
    fails(
        "func.func @main() {\n  %0 = \"stablehlo.abs\"(",
        "2:24",
        "expected a value",
    );
    fails(
        "module {\n  func.func @main() {\n    func.return\n  }\n",
        "5:1",
        "expected `func.func`",
    );
}

#[test]
fn unknown_ops_and_types() {
    fails_as(
        &wrap("%0 = stablehlo.frobnicate : tensor<f32>"),
        ErrorKind::Unsupported,
        "2:8",
        "`stablehlo.frobnicate` (kiln has no such op)",
    );
    fails_as(
        &wrap("%0 = \"stablehlo.uniform_quantize\"() : () -> tensor<f32>"),
        ErrorKind::Unsupported,
        "2:8",
        "stablehlo.uniform_quantize",
    );
    fails_as(
        &wrap("%0 = stablehlo.constant dense<1.0> : tensor<tf32>"),
        ErrorKind::Unsupported,
        "2:47",
        "element type `tf32`",
    );
    fails_as(
        &wrap("%0 = stablehlo.constant dense<1> : tensor<2xi3>"),
        ErrorKind::Unsupported,
        "2:45",
        "element type `i3`",
    );
    // A bit pattern wider than a 4-bit float.
    fails_as(
        &wrap("%0 = stablehlo.constant dense<0x1F> : tensor<f4E2M1FN>"),
        ErrorKind::Invalid,
        "2:27",
        "the bit pattern 0x1f does not fit f4E2M1FN",
    );
    fails_as(
        &wrap("%0 = stablehlo.constant dense<(1.0, 2.0)> : tensor<complex<f16>>"),
        ErrorKind::Unsupported,
        "2:62",
        "element type complex<f16> (kiln has complex<f32> and complex<f64>)",
    );
    fails_as(
        &wrap("%0 = stablehlo.constant dense<1.0> : tensor<complex<f32>>"),
        ErrorKind::Invalid,
        "2:27",
        "complex<f32> values are written `(re, im)`",
    );
    fails_as(
        "func.func @main(%t: tensor<!stablehlo.token>) {\n  func.return\n}",
        ErrorKind::Unsupported,
        "1:28",
        "!stablehlo.token",
    );
    fails_as(
        "func.func @main(%t: tensor<2xtuple<tensor<f32>>>) {\n  func.return\n}",
        ErrorKind::Unsupported,
        "1:28",
        "element type tuple<...>",
    );
    fails_as(
        "func.func @main(%t: tensor<?x2xf32>) {\n  func.return\n}",
        ErrorKind::Unsupported,
        "1:28",
        "dynamic dimensions",
    );
    // A quantized type in an attribute (a signature's is read as its storage type).
    fails_as(
        "func.func @main() {\n  %0 = \"stablehlo.constant\"() {value = dense<1> : tensor<!quant.uniform<i8:f32, 1.0>>} : () -> tensor<i8>\n  func.return\n}",
        ErrorKind::Unsupported,
        "2:58",
        "!quant.uniform",
    );
    fails_as(
        "func.func @main(%t: tensor<2xfoo>) {\n  func.return\n}",
        ErrorKind::Syntax,
        "1:28",
        "unknown element type `foo`",
    );
    fails_as(
        &wrap("%0 = stablehlo.custom_call @foo() {call_target_name = \"foo\"} : () -> tensor<f32>"),
        ErrorKind::Unsupported,
        "2:8",
        "custom_call",
    );
}

#[test]
fn wrong_attributes() {
    fails(
        &wrap(&format!(
            "{C2}\n  %1 = stablehlo.transpose %c, dims = 0 : (tensor<2xf32>) -> tensor<2xf32>"
        )),
        "3:32",
        "`permutation` must be a list of integers",
    );
    fails(
        &wrap(&format!(
            "{C2}\n  %1 = stablehlo.iota dim = [0] : tensor<2xf32>"
        )),
        "3:23",
        "`iota_dimension` of `stablehlo.iota` must be an integer",
    );
    fails(
        &wrap(&format!(
            "{C2}\n  %1 = stablehlo.compare XX, %c, %c : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xi1>"
        )),
        "3:26",
        "bad comparison direction `XX`",
    );
    fails(
        &wrap(&format!(
            "{C2}\n  %1 = stablehlo.compare LT, %c, %c, WEIRD : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xi1>"
        )),
        "3:38",
        "bad comparison type `WEIRD`",
    );
    fails(
        &wrap(&format!(
            "{C2}\n  %1 = stablehlo.reduce_precision %c, format = e5 : tensor<2xf32>"
        )),
        "3:39",
        "bad float format `e5`",
    );
    fails(
        &wrap(&format!(
            "{C2}\n  %1 = stablehlo.slice %c [0:1:2:3] : (tensor<2xf32>) -> tensor<1xf32>"
        )),
        "3:35",
        "`start:limit`",
    );
    fails(
        &wrap(
            "%0 = \"stablehlo.constant\"() {value = dense<1.0> : tensor<f32>, value = dense<2.0> : tensor<f32>} : () -> tensor<f32>",
        ),
        "2:66",
        "given twice",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<[1, 2, 3]> : tensor<2xi32>"),
        "2:27",
        "does not fit the type tensor<2xi32>",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<[[1, 2], [3]]> : tensor<2x2xi32>"),
        "2:42",
        "ragged dense literal",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<300> : tensor<i8>"),
        "2:27",
        "300 is out of range for i8",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<1.5> : tensor<i32>"),
        "2:27",
        "1.5 is not a i32 value",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<0x1FF> : tensor<i8>"),
        "2:27",
        "bit pattern 0x1ff does not fit i8",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<\"0xDEADBEEF\"> : tensor<i32>"),
        "2:33",
        "hex-string",
    );
    fails(
        &wrap(
            "%0 = \"stablehlo.reduce\"(%x, %y) ({\n  ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n    %s = stablehlo.subtract %a, %b : tensor<f32>\n    stablehlo.return %s : tensor<f32>\n  }) {dimensions = array<i64: 0>} : (tensor<2xf32>, tensor<f32>) -> tensor<f32>",
        ),
        "2:27",
        "value %x is not defined",
    );
}

#[test]
fn regions_and_arity() {
    let reduce = |body: &str| {
        wrap(&format!(
            "{C2}\n  %z = stablehlo.constant dense<0.0> : tensor<f32>\n  %r = \"stablehlo.reduce\"(%c, %z) ({{\n  ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n{body}\n  }}) {{dimensions = array<i64: 0>}} : (tensor<2xf32>, tensor<f32>) -> tensor<f32>"
        ))
    };
    // A body of any ops is a `reduce_region` (the backends run it as a compiled region).
    let any = parse(&reduce(
        "    %s = stablehlo.reshape %a : (tensor<f32>) -> tensor<1xf32>\n    %t = stablehlo.reshape %s : (tensor<1xf32>) -> tensor<f32>\n    stablehlo.return %t : tensor<f32>",
    ))
    .unwrap();
    assert!(
        any.funcs[0]
            .insts
            .iter()
            .any(|i| i.op.kind() == kiln_ir::OpKind::ReduceRegion),
        "{any:?}"
    );
    fails(
        &reduce("    %s = stablehlo.add %a, %b : tensor<f32>"),
        "6:10",
        "must end with `stablehlo.return`",
    );
    fails(
        &reduce("    stablehlo.return %a, %b : tensor<f32>, tensor<f32>"),
        "4:8",
        "returns (f32[], f32[]) but the accumulators are (f32[]) (reduce_region_c6)",
    );
    let w = "%i = stablehlo.constant dense<0> : tensor<i64>\n  %r = stablehlo.while(%a = %i) : tensor<i64>\n  cond {\n    stablehlo.return %a : tensor<i64>\n  }";
    fails(&wrap(w), "7:3", "expected `do`");
    let two = "%i = stablehlo.constant dense<0> : tensor<i64>\n  %r = stablehlo.while(%a = %i) : tensor<i64>, tensor<i64>\n  cond {\n  } do {\n  }";
    fails(&wrap(two), "3:8", "1 carries and 2 types");
    let case = "%i = stablehlo.constant dense<0> : tensor<i32>\n  %r = \"stablehlo.case\"(%i) ({\n    ^bb0(%x: tensor<f32>):\n    stablehlo.return %x : tensor<f32>\n  }) : (tensor<i32>) -> tensor<f32>";
    fails(
        &wrap(case),
        "3:8",
        "a `stablehlo.case` branch takes no arguments",
    );
    let sort = format!(
        "{C2}\n  %r = \"stablehlo.sort\"(%c) ({{\n  ^bb0(%a: tensor<f32>):\n    %p = stablehlo.compare LT, %a, %a : (tensor<f32>, tensor<f32>) -> tensor<i1>\n    stablehlo.return %p : tensor<i1>\n  }}) {{dimension = 0 : i64}} : (tensor<2xf32>) -> tensor<2xf32>"
    );
    fails(&wrap(&sort), "3:8", "takes 1 arguments for 1 operands");
    fails(
        &wrap("%0 = stablehlo.add %c, %c : tensor<2xf32>"),
        "2:22",
        "value %c is not defined",
    );
    fails(
        &wrap(&format!("{C2}\n  %1 = stablehlo.add %c : tensor<2xf32>")),
        "3:8",
        "`stablehlo.add`",
    );
    fails(
        &wrap(&format!(
            "{C2}\n  %1, %2 = stablehlo.add %c, %c : tensor<2xf32>"
        )),
        "3:12",
        "defines 1 values, but 2 are named",
    );
}

#[test]
fn names_types_and_signatures() {
    fails(
        &wrap(&format!(
            "{C2}\n  %c = stablehlo.add %c, %c : tensor<2xf32>"
        )),
        "3:3",
        "value %c is defined twice",
    );
    fails(
        "func.func @f() {\n  func.return\n}\nfunc.func @f() {\n  func.return\n}",
        "4:1",
        "function @f is defined twice",
    );
    fails(
        &wrap(&format!(
            "{C2}\n  %1 = stablehlo.add %c, %c : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>"
        )),
        "3:8",
        "value #0 has type tensor<2xf32>, the signature says tensor<3xf32>",
    );
    fails(
        "func.func @main() -> tensor<f32> {\n  func.return\n}",
        "2:3",
        "0 values where the signature has 1 types",
    );
    fails(
        &wrap("%0 = func.call @nowhere() : () -> tensor<f32>"),
        "2:8",
        "calls @nowhere, which is not defined",
    );
    fails(
        "func.func @f() {\n  func.call @f() : () -> ()\n  func.return\n}",
        "2:3",
        "@f calls itself (through @f): kiln's call graph is acyclic",
    );
    fails(
        &wrap("func.return\n  %0 = stablehlo.constant dense<1.0> : tensor<f32>"),
        "2:3",
        "`func.return` before the end of its block",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<1.0> : tensor<99999999999999999999xf32>"),
        "2:47",
        "bad dimension size",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<1.0> : tensor<4294967296x4294967296x4294967296xf32>"),
        "2:40",
        "overflows i64",
    );
    fails(
        &wrap("%0 = stablehlo.constant dense<1.0> : tensor<1000000x1000000xf32>"),
        "2:27",
        "too large",
    );
    fails(
        &wrap("%0 = stablehlo.iota dim = 0 : (tensor<2xf32>) -> tensor<2xf32>"),
        "2:8",
        "`stablehlo.iota`",
    );
}

#[test]
fn module_structure() {
    fails_as(
        "module {\n  ml_program.global private @g(dense<0> : tensor<i32>) : tensor<i32>\n}",
        ErrorKind::Unsupported,
        "2:3",
        "the top-level op `ml_program.global`",
    );
    fails_as(
        "func.func private @f(%x: tensor<f32>) -> tensor<f32>\n",
        ErrorKind::Unsupported,
        "1:1",
        "the declaration of @f without a body",
    );
    fails(
        "func.func @main(%x: tensor<f32>) {\n  ^bb0(%y: tensor<f32>):\n  func.return\n}",
        "1:1",
        "a function body has no block label",
    );
    fails(
        "func.func @main() {\n  func.return\n  ^bb1:\n  func.return\n}",
        "3:3",
        "regions of more than one block",
    );
    fails(
        "#map = affine_map<(d0) -> (d0)>\nfunc.func @main() {\n  func.return\n}",
        "1:1",
        "attribute aliases other than locations",
    );
}

#[test]
fn lexical_errors() {
    fails(
        "func.func @main() {\n  %0 = stablehlo.constant dense<1.0> : tensor<f32> ~\n}",
        "2:52",
        "unexpected character `~`",
    );
    fails(
        "func.func @main() {\n  % = stablehlo.abs\n}",
        "2:3",
        "expected a name after `%`",
    );
    fails(
        "func.func @main() {\n  %0 = \"stablehlo.abs\n}",
        "2:8",
        "unterminated string literal",
    );
    fails(&"[".repeat(5000), "1:1", "expected `func.func`");
    fails(
        &wrap(&format!(
            "%0 = stablehlo.constant dense<{}1{}> : tensor<f32>",
            "[".repeat(500),
            "]".repeat(500)
        )),
        "2:232",
        "nests more than 200 deep",
    );
    let e = parse_bytes(b"func.func @main() {\n  // caf\xe9\n}").unwrap_err();
    assert_eq!(e.to_string(), "2:9: the input is not valid UTF-8");
    // Columns count characters: the error after a non-ASCII comment on the same line is
    // still at the right column.
    fails(
        "func.func @main() { \"é\" ~\n}",
        "1:25",
        "unexpected character `~`",
    );
}

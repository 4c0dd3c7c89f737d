//! Tuples flatten at import: `tuple`, `get_tuple_element`, tuple parameters and results of
//! functions and `func.call` compute what StableHLO says (on the reference interpreter), and a
//! tuple anywhere kiln cannot flatten it is a located error.

use kiln_ir::Literal;
use kiln_reference::eval;
use kiln_stablehlo::{ErrorKind, Piece, parse, parse_with_checks};

mod located;
use located::fails;

/// Imports `text` and runs its entry on `args`.
#[track_caller]
fn run(text: &str, args: &[Literal]) -> Vec<Literal> {
    let m = parse(text).unwrap_or_else(|e| panic!("import failed: {e}"));
    kiln_ir::verify_module(&m).expect("the import verifies");
    eval(m.entry().expect("an entry"), args).expect("it runs")
}

fn f32s(v: &[f32]) -> Literal {
    Literal::f32(vec![v.len()], v.to_vec()).unwrap()
}

#[test]
fn nested_tuples_pick_their_elements() {
    let text = "func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %inner = stablehlo.tuple %b : tuple<tensor<2xf32>>
  %t = \"stablehlo.tuple\"(%a, %inner) : (tensor<2xf32>, tuple<tensor<2xf32>>) -> tuple<tensor<2xf32>, tuple<tensor<2xf32>>>
  %x = stablehlo.get_tuple_element %t[0] : (tuple<tensor<2xf32>, tuple<tensor<2xf32>>>) -> tensor<2xf32>
  %i = \"stablehlo.get_tuple_element\"(%t) {index = 1 : i32} : (tuple<tensor<2xf32>, tuple<tensor<2xf32>>>) -> tuple<tensor<2xf32>>
  %y = stablehlo.get_tuple_element %i[0] : (tuple<tensor<2xf32>>) -> tensor<2xf32>
  func.return %y, %x : tensor<2xf32>, tensor<2xf32>
}";
    let out = run(text, &[f32s(&[1.0, 2.0]), f32s(&[3.0, 4.0])]);
    assert_eq!(out[0].as_f32s().unwrap(), &[3.0, 4.0]);
    assert_eq!(out[1].as_f32s().unwrap(), &[1.0, 2.0]);
}

#[test]
fn tuples_pass_through_calls_as_their_tensors() {
    // @swap takes a tuple and returns a tuple; kiln's @swap takes and returns two tensors.
    let text = "func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tuple<tensor<2xf32>, tensor<2xf32>> {
  %t = stablehlo.tuple %a, %b : tuple<tensor<2xf32>, tensor<2xf32>>
  %s = func.call @swap(%t) : (tuple<tensor<2xf32>, tensor<2xf32>>) -> tuple<tensor<2xf32>, tensor<2xf32>>
  %u = func.call @swap(%s) : (tuple<tensor<2xf32>, tensor<2xf32>>) -> tuple<tensor<2xf32>, tensor<2xf32>>
  %x = stablehlo.get_tuple_element %u[0] : (tuple<tensor<2xf32>, tensor<2xf32>>) -> tensor<2xf32>
  %y = stablehlo.get_tuple_element %s[1] : (tuple<tensor<2xf32>, tensor<2xf32>>) -> tensor<2xf32>
  %z = stablehlo.subtract %x, %y : tensor<2xf32>
  %r = stablehlo.tuple %z, %x : tuple<tensor<2xf32>, tensor<2xf32>>
  func.return %r : tuple<tensor<2xf32>, tensor<2xf32>>
}
func.func private @swap(%p: tuple<tensor<2xf32>, tensor<2xf32>>) -> tuple<tensor<2xf32>, tensor<2xf32>> {
  %x = stablehlo.get_tuple_element %p[0] : (tuple<tensor<2xf32>, tensor<2xf32>>) -> tensor<2xf32>
  %y = stablehlo.get_tuple_element %p[1] : (tuple<tensor<2xf32>, tensor<2xf32>>) -> tensor<2xf32>
  %r = stablehlo.tuple %y, %x : tuple<tensor<2xf32>, tensor<2xf32>>
  func.return %r : tuple<tensor<2xf32>, tensor<2xf32>>
}";
    let m = parse(text).unwrap();
    let swap = m.func("swap").unwrap();
    assert_eq!((swap.params.len(), swap.outputs.len()), (2, 2));
    let out = run(text, &[f32s(&[5.0, 7.0]), f32s(&[1.0, 2.0])]);
    // x = u[0] = a, y = s[1] = a: z = 0; the tuple result is its two tensors.
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].as_f32s().unwrap(), &[0.0, 0.0]);
    assert_eq!(out[1].as_f32s().unwrap(), &[5.0, 7.0]);
}

#[test]
fn tuples_where_kiln_cannot_flatten_them_are_located() {
    let head = "func.func @main(%a: tensor<f32>) {
  %t = stablehlo.tuple %a, %a : tuple<tensor<f32>, tensor<f32>>\n";
    fails(
        &format!("{head}  %s = stablehlo.add %t, %t : tensor<f32>\n  func.return\n}}"),
        ErrorKind::Unsupported,
        "3:8",
        "tuple or token operands or results of `stablehlo.add`",
    );
    fails(
        &format!(
            "{head}  %s = stablehlo.get_tuple_element %t[2] : (tuple<tensor<f32>, tensor<f32>>) -> tensor<f32>\n  func.return\n}}"
        ),
        ErrorKind::Invalid,
        "3:8",
        "index 2 of a tuple of 2 elements (get_tuple_element_c1)",
    );
    fails(
        &format!(
            "{head}  %s = stablehlo.get_tuple_element %t[0] : (tuple<tensor<f32>, tensor<f32>>) -> tensor<i32>\n  func.return\n}}"
        ),
        ErrorKind::Invalid,
        "3:8",
        "has type tensor<f32>, the signature says tensor<i32>",
    );
    // A tuple captured by a region, and a tuple block argument.
    fails(
        &format!(
            "{head}  %r = \"stablehlo.case\"(%i) ({{\n    %x = stablehlo.get_tuple_element %t[0] : (tuple<tensor<f32>, tensor<f32>>) -> tensor<f32>\n    stablehlo.return %x : tensor<f32>\n  }}) : (tensor<i32>) -> tensor<f32>\n  func.return\n}}"
        )
        .replace("%a: tensor<f32>", "%a: tensor<f32>, %i: tensor<i32>"),
        ErrorKind::Unsupported,
        "4:38",
        "the tuple %t here",
    );
    fails(
        "func.func @main(%a: tensor<f32>) {
  %r = \"stablehlo.while\"(%a) ({
  ^bb0(%x: tuple<tensor<f32>>):
    %c = stablehlo.constant dense<false> : tensor<i1>
    stablehlo.return %c : tensor<i1>
  }, {
  ^bb0(%x: tensor<f32>):
    stablehlo.return %x : tensor<f32>
  }) : (tensor<f32>) -> tensor<f32>
  func.return
}",
        ErrorKind::Invalid,
        "2:8",
        "the arguments of a `stablehlo.while` region are not its operands' tuples, tokens and tensors",
    );
}

#[test]
fn tuples_and_tokens_are_carried_by_while_and_returned_by_case() {
    // A loop carrying a tuple (a counter and a running sum), a token and a tensor; then a
    // case returning a tuple. kiln's loop carries the tuple's two tensors.
    let t = "tuple<tensor<i64>, tensor<2xf32>>";
    let text = format!(
        "func.func @main(%x: tensor<2xf32>, %k: tensor<i32>) -> (tensor<i64>, tensor<2xf32>, tensor<2xf32>) {{
  %z = stablehlo.constant dense<0> : tensor<i64>
  %tok = stablehlo.after_all : !stablehlo.token
  %t0 = stablehlo.tuple %z, %x : {t}
  %w:3 = stablehlo.while(%s = %t0, %u = %tok, %y = %x) : {t}, !stablehlo.token, tensor<2xf32>
  cond {{
    %i = stablehlo.get_tuple_element %s[0] : ({t}) -> tensor<i64>
    %n = stablehlo.constant dense<3> : tensor<i64>
    %c = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  }} do {{
    %i = stablehlo.get_tuple_element %s[0] : ({t}) -> tensor<i64>
    %a = stablehlo.get_tuple_element %s[1] : ({t}) -> tensor<2xf32>
    %one = stablehlo.constant dense<1> : tensor<i64>
    %j = stablehlo.add %i, %one : tensor<i64>
    %b = stablehlo.add %a, %y : tensor<2xf32>
    %n = stablehlo.tuple %j, %b : {t}
    stablehlo.return %n, %u, %y : {t}, !stablehlo.token, tensor<2xf32>
  }}
  %cnt = stablehlo.get_tuple_element %w#0[0] : ({t}) -> tensor<i64>
  %sum = stablehlo.get_tuple_element %w#0[1] : ({t}) -> tensor<2xf32>
  %r = \"stablehlo.case\"(%k) ({{
    %e = stablehlo.tuple %cnt, %sum : {t}
    stablehlo.return %e : {t}
  }}, {{
    %e = stablehlo.tuple %z, %x : {t}
    stablehlo.return %e : {t}
  }}) : (tensor<i32>) -> {t}
  %i = stablehlo.get_tuple_element %r[0] : ({t}) -> tensor<i64>
  %a = stablehlo.get_tuple_element %r[1] : ({t}) -> tensor<2xf32>
  func.return %i, %a, %sum : tensor<i64>, tensor<2xf32>, tensor<2xf32>
}}"
    );
    let i32s = |v: i32| Literal::i32(vec![], vec![v]).unwrap();
    let out = run(&text, &[f32s(&[1.0, 2.0]), i32s(0)]);
    assert_eq!(out[0].to_i64s(), [3]);
    assert_eq!(out[1].as_f32s().unwrap(), &[4.0, 8.0]);
    assert_eq!(out[2].as_f32s().unwrap(), &[4.0, 8.0]);
    // The other branch: the tuple it builds.
    let out = run(&text, &[f32s(&[1.0, 2.0]), i32s(1)]);
    assert_eq!(out[0].to_i64s(), [0]);
    assert_eq!(out[1].as_f32s().unwrap(), &[1.0, 2.0]);
    assert_eq!(out[2].as_f32s().unwrap(), &[4.0, 8.0]);
}

#[test]
fn tokens_hold_nothing() {
    // A token parameter, tokens joined by `after_all` and returned: kiln's function takes and
    // returns only the tensor.
    let text = "func.func @main(%x: tensor<2xf32>, %t: !stablehlo.token) -> (tensor<2xf32>, !stablehlo.token) {
  %a = stablehlo.after_all : !stablehlo.token
  %b = stablehlo.after_all %a, %t : !stablehlo.token
  %y, %u = func.call @f(%x, %b) : (tensor<2xf32>, !stablehlo.token) -> (tensor<2xf32>, !stablehlo.token)
  func.return %y, %u : tensor<2xf32>, !stablehlo.token
}
func.func private @f(%x: tensor<2xf32>, %t: !stablehlo.token) -> (tensor<2xf32>, !stablehlo.token) {
  %y = stablehlo.add %x, %x : tensor<2xf32>
  func.return %y, %t : tensor<2xf32>, !stablehlo.token
}";
    let m = parse(text).unwrap();
    let main = m.entry().unwrap();
    assert_eq!((main.params.len(), main.outputs.len()), (1, 1));
    let out = run(text, &[f32s(&[1.0, 2.0])]);
    assert_eq!(out[0].as_f32s().unwrap(), &[2.0, 4.0]);
    fails(
        "func.func @main(%t: !stablehlo.token) {
  %u = \"stablehlo.outfeed\"(%t) : (!stablehlo.token) -> !stablehlo.token
  func.return
}",
        ErrorKind::Unsupported,
        "2:8",
        "`stablehlo.outfeed` here (read by `parse_with_checks`, in a function's own body only)",
    );
    fails(
        "func.func @main(%x: tensor<f32>) {
  %u = stablehlo.after_all %x : !stablehlo.token
  func.return
}",
        ErrorKind::Invalid,
        "2:28",
        "the operand %x of `stablehlo.after_all` is not a token",
    );
}

#[test]
fn infeed_reads_parameters_and_outfeed_writes_outputs() {
    // In an interpreter test's function, what infeed reads is a parameter (after the
    // function's own) and what outfeed writes an output (after its own).
    let text = "func.func @f(%x: tensor<2xf32>, %t: !stablehlo.token) -> (tensor<2xf32>, !stablehlo.token) {
  %a:2 = \"stablehlo.infeed\"(%t) : (!stablehlo.token) -> (tensor<2xf32>, !stablehlo.token)
  %b:3 = \"stablehlo.infeed\"(%a#1) : (!stablehlo.token) -> (tensor<i32>, tensor<i32>, !stablehlo.token)
  %s = stablehlo.add %x, %a#0 : tensor<2xf32>
  %u = \"stablehlo.outfeed\"(%s, %b#1, %b#2) : (tensor<2xf32>, tensor<i32>, !stablehlo.token) -> !stablehlo.token
  func.return %s, %u : tensor<2xf32>, !stablehlo.token
}";
    let m = parse_with_checks(Piece {
        text,
        first_line: 1,
    })
    .unwrap();
    let (f, c) = (&m.module.funcs[0], &m.checks[0]);
    assert_eq!((f.params.len(), c.infeed.clone()), (4, vec![1, 2, 3]));
    assert_eq!(
        (f.outputs.len(), c.outputs, c.outfeed.clone()),
        (3, 1, 1..3)
    );
    let i32s = |v: i32| Literal::i32(vec![], vec![v]).unwrap();
    let out = eval(
        f,
        &[f32s(&[1.0, 2.0]), f32s(&[10.0, 20.0]), i32s(7), i32s(8)],
    )
    .unwrap();
    assert_eq!(out[0].as_f32s().unwrap(), &[11.0, 22.0]);
    assert_eq!(out[1].as_f32s().unwrap(), &[11.0, 22.0]);
    assert_eq!(out[2].to_i64s(), [8]);
}

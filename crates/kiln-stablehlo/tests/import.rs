//! Well-formed StableHLO in both syntaxes imports into kiln IR that computes what StableHLO
//! says (checked on the reference interpreter).

use kiln_ir::{Literal, print_module};
use kiln_reference::eval;
use kiln_stablehlo::{Piece, parse, parse_split, parse_with_checks};

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

/// What `jax.jit(f).lower(x).as_text()` prints: a module with attributes, argument and result
/// attributes, `loc` annotations and aliases, pretty ops.
const JAX: &str = r#"#loc1 = loc("x")
module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32> {mhlo.layout_mode = "default"} loc("x")) -> (tensor<2xf32> {jax.result_info = "", mhlo.layout_mode = "default"}) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32> loc(#loc)
    %0 = stablehlo.multiply %arg0, %arg0 : tensor<2x3xf32> loc(#loc2)
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32> loc(#loc3)
    %2 = call @helper(%1) : (tensor<2xf32>) -> tensor<2xf32> loc(#loc4)
    return %2 : tensor<2xf32> loc(#loc)
  } loc(#loc)
  func.func private @helper(%arg0: tensor<2xf32> loc("y")) -> tensor<2xf32> {
    %0 = stablehlo.sqrt %arg0 : tensor<2xf32> loc(#loc5)
    return %0 : tensor<2xf32> loc(#loc)
  } loc(#loc)
} loc(#loc)
#loc = loc(unknown)
#loc2 = loc("f.py":3:10)
"#;

#[test]
fn a_jax_style_module_imports_and_runs() {
    let out = run(JAX, &[f32s(&[2, 3], &[3.0, 4.0, 0.0, 0.0, 0.0, 5.0])]);
    assert_eq!(out[0].as_f32s().unwrap(), &[5.0, 5.0]);
}

#[test]
fn func_call_imports_as_a_call_of_the_private_function_and_exports_back() {
    let m = parse(JAX).unwrap();
    kiln_ir::verify_module(&m).unwrap();
    let names: Vec<&str> = m.funcs.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["main", "helper"]);
    let text = print_module(&m);
    assert!(
        text.contains("= call %3 {callee = @helper} : f32[2]"),
        "{text}"
    );
    let out = kiln_stablehlo::to_text(&m).unwrap();
    assert!(
        out.contains("\"func.call\"(%v") && out.contains("func.func private @helper("),
        "{out}"
    );
    assert_eq!(print_module(&parse(&out).unwrap()), text);
    // A function called from two places, one of them a callee itself, is imported once.
    let nested = "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = func.call @twice(%x) : (tensor<2xf32>) -> tensor<2xf32>
  %1 = func.call @neg(%0) : (tensor<2xf32>) -> tensor<2xf32>
  func.return %1 : tensor<2xf32>
}
func.func private @twice(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = func.call @neg(%x) : (tensor<2xf32>) -> tensor<2xf32>
  %1 = func.call @neg(%0) : (tensor<2xf32>) -> tensor<2xf32>
  %2 = stablehlo.multiply %0, %1 : tensor<2xf32>
  func.return %2 : tensor<2xf32>
}
func.func private @neg(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.negate %x : tensor<2xf32>
  func.return %0 : tensor<2xf32>
}";
    let m = parse(nested).unwrap();
    kiln_ir::verify_module(&m).unwrap();
    assert_eq!(m.funcs.len(), 3);
    let back = parse(&kiln_stablehlo::to_text(&m).unwrap()).unwrap();
    assert_eq!(print_module(&back), print_module(&m));
    // -((-x) * x) = x^2.
    let out = run(nested, &[f32s(&[2], &[1.5, -2.0])]);
    assert_eq!(out[0].as_f32s().unwrap(), &[2.25, 4.0]);
}

#[test]
fn pretty_and_generic_forms_import_to_the_same_kiln_ir() {
    let pretty = "func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<4x2xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<2x4xf32>) -> tensor<4x2xf32>
  %2 = stablehlo.compare GT, %1, %1, FLOAT : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xi1>
  %3 = stablehlo.select %2, %1, %1 : tensor<4x2xi1>, tensor<4x2xf32>
  func.return %3 : tensor<4x2xf32>
}";
    let generic = r#"func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> tensor<4x2xf32> {
  %0 = "stablehlo.dot_general"(%a, %b) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]} : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
  %1 = "stablehlo.transpose"(%0) {permutation = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
  %2 = "stablehlo.compare"(%1, %1) {comparison_direction = #stablehlo<comparison_direction GT>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xi1>
  %3 = "stablehlo.select"(%2, %1, %1) : (tensor<4x2xi1>, tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<4x2xf32>
  "func.return"(%3) : (tensor<4x2xf32>) -> ()
}"#;
    let (p, g) = (parse(pretty).unwrap(), parse(generic).unwrap());
    assert_eq!(print_module(&p), print_module(&g));
}

#[test]
fn regions_see_the_values_around_them() {
    // The loop bound `%n` and the step `%k`, and the branch's `%x`, come from outside.
    let text = "func.func @main(%x: tensor<f32>, %p: tensor<i1>) -> (tensor<i64>, tensor<f32>) {
  %i0 = stablehlo.constant dense<0> : tensor<i64>
  %n = stablehlo.constant dense<7> : tensor<i64>
  %k = stablehlo.constant dense<2> : tensor<i64>
  %r = stablehlo.while(%i = %i0) : tensor<i64>
  cond {
    %c = stablehlo.compare LT, %i, %n : (tensor<i64>, tensor<i64>) -> tensor<i1>
    stablehlo.return %c : tensor<i1>
  } do {
    %j = stablehlo.add %i, %k : tensor<i64>
    stablehlo.return %j : tensor<i64>
  }
  %y = \"stablehlo.if\"(%p) ({
    %t = stablehlo.negate %x : tensor<f32>
    stablehlo.return %t : tensor<f32>
  }, {
    stablehlo.return %x : tensor<f32>
  }) : (tensor<i1>) -> tensor<f32>
  func.return %r, %y : tensor<i64>, tensor<f32>
}";
    let x = Literal::f32([], vec![1.5]).unwrap();
    let yes = Literal::new(
        kiln_ir::TensorType::scalar(kiln_ir::DType::Pred),
        kiln_ir::Data::Pred(vec![true]),
    )
    .unwrap();
    let no = Literal::new(
        kiln_ir::TensorType::scalar(kiln_ir::DType::Pred),
        kiln_ir::Data::Pred(vec![false]),
    )
    .unwrap();
    let out = run(text, &[x.clone(), yes]);
    assert_eq!(out[0].to_i64s(), vec![8]);
    assert_eq!(out[1].as_f32s().unwrap(), &[-1.5]);
    assert_eq!(run(text, &[x, no])[1].as_f32s().unwrap(), &[1.5]);
}

#[test]
fn dense_literals_in_every_form() {
    let text = "func.func @main() -> (tensor<2x2xf32>, tensor<3xf32>, tensor<2xi1>, tensor<f64>, tensor<2xbf16>, tensor<2xui32>) {
  %0 = stablehlo.constant dense<1.5> : tensor<2x2xf32>
  %1 = stablehlo.constant dense<[0x7F800000, -2.5e-1, 0xFF800000]> : tensor<3xf32>
  %2 = stablehlo.constant dense<[true, false]> : tensor<2xi1>
  %3 = stablehlo.constant dense<0xFFF0000000000000> : tensor<f64>
  %4 = stablehlo.constant dense<[1.0, 0x7FC0]> : tensor<2xbf16>
  %5 = stablehlo.constant dense<[4294967295, 0]> : tensor<2xui32>
  func.return %0, %1, %2, %3, %4, %5 : tensor<2x2xf32>, tensor<3xf32>, tensor<2xi1>, tensor<f64>, tensor<2xbf16>, tensor<2xui32>
}";
    let out = run(text, &[]);
    assert_eq!(out[0].as_f32s().unwrap(), &[1.5; 4]);
    assert_eq!(
        out[1].as_f32s().unwrap(),
        &[f32::INFINITY, -0.25, f32::NEG_INFINITY]
    );
    assert_eq!(out[2].to_i64s(), vec![1, 0]);
    assert_eq!(out[3].to_f64s(), vec![f64::NEG_INFINITY]);
    let bf = out[4].to_f64s();
    assert!(bf[0] == 1.0 && bf[1].is_nan(), "{bf:?}");
    assert_eq!(out[5].to_i64s(), vec![4294967295, 0]);
}

#[test]
fn split_files_keep_their_line_numbers() {
    let text = "func.func @a() {\n  func.return\n}\n// -----\nfunc.func @b() {\n  %0 = stablehlo.nope : tensor<f32>\n  func.return\n}\n";
    let r = parse_split(text);
    assert_eq!(r.len(), 2);
    assert!(r[0].is_ok());
    assert_eq!(
        r[1].as_ref().unwrap_err().to_string().split(": ").next(),
        Some("6:8")
    );
}

#[test]
fn checks_become_outputs_compared_on_the_host() {
    let text = "func.func @t() {
  %0 = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %1 = stablehlo.add %0, %0 : tensor<2xf32>
  check.expect_almost_eq_const %1, dense<[2.0, 4.05]> : tensor<2xf32> {tolerance = 0.1 : f64}
  check.expect_eq_const %1, dense<[2.0, 4.0]> : tensor<2xf32>
  check.expect_eq_const %1, dense<[2.0, 4.5]> : tensor<2xf32>
  func.return
}";
    let imp = parse_with_checks(Piece {
        text,
        first_line: 1,
    })
    .unwrap();
    let outs = eval(&imp.module.funcs[0], &[]).unwrap();
    let checks = &imp.checks[0].checks;
    assert_eq!(checks.len(), 3);
    assert!(checks[0].verify(&outs).is_ok());
    assert!(checks[1].verify(&outs).is_ok());
    let e = checks[2].verify(&outs).unwrap_err();
    assert!(e.starts_with("6:3 check.expect_eq_const: element 1"), "{e}");
    // Without checks allowed, the test op is a located error.
    assert!(
        parse(text)
            .unwrap_err()
            .to_string()
            .starts_with("4:3: unsupported: the test op")
    );
}

#[test]
fn pretty_forms_of_layout_and_reduction_ops() {
    let text = "func.func @main(%x: tensor<2x3xf32>) -> (tensor<3xf32>, tensor<2x2xf32>, tensor<3x2xf32>, tensor<4x3xf32>, tensor<2x3xi32>, tensor<2x2x3xf32>, tensor<2xf32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %z) across dimensions = [0] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>
   reducer(%a: tensor<f32>, %b: tensor<f32>) {
    %m = stablehlo.maximum %a, %b : tensor<f32>
    stablehlo.return %m : tensor<f32>
  }
  %1 = stablehlo.slice %x [0:2, 1:3] : (tensor<2x3xf32>) -> tensor<2x2xf32>
  %2 = stablehlo.transpose %x, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
  %3 = stablehlo.concatenate %x, %x, dim = 0 : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
  %4 = stablehlo.iota dim = 1 : tensor<2x3xi32>
  %5 = stablehlo.broadcast_in_dim %x, dims = [1, 2] : (tensor<2x3xf32>) -> tensor<2x2x3xf32>
  %i = stablehlo.constant dense<1> : tensor<i32>
  %r = stablehlo.reshape %x : (tensor<2x3xf32>) -> tensor<6xf32>
  %6 = stablehlo.dynamic_slice %r, %i, sizes = [2] : (tensor<6xf32>, tensor<i32>) -> tensor<2xf32>
  func.return %0, %1, %2, %3, %4, %5, %6 : tensor<3xf32>, tensor<2x2xf32>, tensor<3x2xf32>, tensor<4x3xf32>, tensor<2x3xi32>, tensor<2x2x3xf32>, tensor<2xf32>
}";
    let x = f32s(&[2, 3], &[1.0, 5.0, 2.0, 4.0, 0.0, 6.0]);
    let out = run(text, &[x]);
    assert_eq!(out[0].as_f32s().unwrap(), &[4.0, 5.0, 6.0]);
    assert_eq!(out[1].as_f32s().unwrap(), &[5.0, 2.0, 0.0, 6.0]);
    assert_eq!(out[2].as_f32s().unwrap(), &[1.0, 4.0, 5.0, 0.0, 2.0, 6.0]);
    assert_eq!(out[3].shape(), &[4, 3]);
    assert_eq!(out[4].to_i64s(), vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(out[5].shape(), &[2, 2, 3]);
    assert_eq!(out[6].as_f32s().unwrap(), &[5.0, 2.0]);
}

#[test]
fn generic_reductions_with_regions() {
    let text = r#"func.func @main(%x: tensor<4x2xf32>) -> (tensor<2x2xf32>, tensor<4x2xf32>) {
  %z = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
  %0 = "stablehlo.reduce_window"(%x, %z) ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %s = "stablehlo.add"(%b, %a) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    "stablehlo.return"(%s) : (tensor<f32>) -> ()
  }) {window_dimensions = array<i64: 2, 1>, window_strides = array<i64: 2, 1>} : (tensor<4x2xf32>, tensor<f32>) -> tensor<2x2xf32>
  %1 = "stablehlo.sort"(%x) <{dimension = 0 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %p = stablehlo.compare GT, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  }) : (tensor<4x2xf32>) -> tensor<4x2xf32>
  return %0, %1 : tensor<2x2xf32>, tensor<4x2xf32>
}"#;
    let x = f32s(&[4, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let out = run(text, &[x]);
    assert_eq!(out[0].as_f32s().unwrap(), &[4.0, 6.0, 12.0, 14.0]);
    assert_eq!(
        out[1].as_f32s().unwrap(),
        &[7.0, 8.0, 5.0, 6.0, 3.0, 4.0, 1.0, 2.0]
    );
}

/// An argmax as JAX writes it: values and indices reduced together by one body.
const ARGMAX: &str = "func.func @main(%x: tensor<2x5xf32>) -> (tensor<2xf32>, tensor<2xi32>) {
  %i = stablehlo.iota dim = 1 : tensor<2x5xi32>
  %m = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %z = stablehlo.constant dense<0> : tensor<i32>
  %0:2 = stablehlo.reduce(%x init: %m), (%i init: %z) across dimensions = [1] : (tensor<2x5xf32>, tensor<2x5xi32>, tensor<f32>, tensor<i32>) -> (tensor<2xf32>, tensor<2xi32>)
   reducer(%a: tensor<f32>, %c: tensor<f32>) (%b: tensor<i32>, %d: tensor<i32>)  {
    %gt = stablehlo.compare GT, %a, %c, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %eq = stablehlo.compare EQ, %a, %c, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %lt = stablehlo.compare LT, %b, %d, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %tie = stablehlo.and %eq, %lt : tensor<i1>
    %take = stablehlo.or %gt, %tie : tensor<i1>
    %v = stablehlo.select %take, %a, %c : tensor<i1>, tensor<f32>
    %k = stablehlo.select %take, %b, %d : tensor<i1>, tensor<i32>
    stablehlo.return %v, %k : tensor<f32>, tensor<i32>
  }
  func.return %0#0, %0#1 : tensor<2xf32>, tensor<2xi32>
}";

#[test]
fn reductions_of_several_inputs_and_any_elementwise_body() {
    let x = f32s(
        &[2, 5],
        &[1.0, 7.0, 3.0, 7.0, 2.0, -1.0, -4.0, -0.5, -9.0, -0.5],
    );
    let out = run(ARGMAX, std::slice::from_ref(&x));
    assert_eq!(out[0].as_f32s().unwrap(), &[7.0, -0.5]);
    assert_eq!(out[1].to_i64s(), vec![1, 2]);
    // The CPU backend computes the same.
    let m = parse(ARGMAX).unwrap();
    let exe = kiln_codegen_llvm::cpu::CpuExecutable::compile_with_cache(&m.funcs[0], None).unwrap();
    assert_eq!(exe.run(&[x]).unwrap(), out);
    // A body that is no named combiner: the sum of squares' halves, over two dimensions.
    let text = "func.func @main(%x: tensor<3x1x3xf32>) -> tensor<1xf32> {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%x init: %z) across dimensions = [0, 2] : (tensor<3x1x3xf32>, tensor<f32>) -> tensor<1xf32>
   reducer(%a: tensor<f32>, %b: tensor<f32>) {
    %s = stablehlo.add %a, %b : tensor<f32>
    %one = stablehlo.constant dense<1.0> : tensor<f32>
    %t = stablehlo.multiply %s, %one : tensor<f32>
    stablehlo.return %t : tensor<f32>
  }
  func.return %0 : tensor<1xf32>
}";
    let x = f32s(&[3, 1, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    assert_eq!(run(text, &[x])[0].as_f32s().unwrap(), &[45.0]);
}

/// An argmax pooling as JAX writes it: a `reduce_window` of values and positions together.
const ARGMAX_POOL: &str = r#"func.func @main(%x: tensor<4x4xf32>, %i: tensor<4x4xi32>) -> (tensor<2x2xf32>, tensor<2x2xi32>) {
  %m = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %z = stablehlo.constant dense<0> : tensor<i32>
  %0:2 = "stablehlo.reduce_window"(%x, %i, %m, %z) ({
  ^bb0(%a: tensor<f32>, %b: tensor<i32>, %c: tensor<f32>, %d: tensor<i32>):
    %gt = stablehlo.compare GT, %c, %a, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %v = stablehlo.select %gt, %c, %a : tensor<i1>, tensor<f32>
    %k = stablehlo.select %gt, %d, %b : tensor<i1>, tensor<i32>
    stablehlo.return %v, %k : tensor<f32>, tensor<i32>
  }) {window_dimensions = array<i64: 2, 2>, window_strides = array<i64: 2, 2>} : (tensor<4x4xf32>, tensor<4x4xi32>, tensor<f32>, tensor<i32>) -> (tensor<2x2xf32>, tensor<2x2xi32>)
  func.return %0#0, %0#1 : tensor<2x2xf32>, tensor<2x2xi32>
}"#;

#[test]
fn reduce_windows_of_several_inputs_import_as_reduce_window_region() {
    let x = f32s(
        &[4, 4],
        &[
            1.0, 3.0, 2.0, 0.0, 4.0, 2.0, 9.0, 8.0, 0.0, 0.0, -1.0, -2.0, 5.0, 0.0, -3.0, -1.0,
        ],
    );
    let i = Literal::i32([4, 4], (0..16).collect()).unwrap();
    let m = parse(ARGMAX_POOL).unwrap();
    assert!(
        print_module(&m).contains("reduce_window_region"),
        "{}",
        print_module(&m)
    );
    let out = run(ARGMAX_POOL, &[x.clone(), i.clone()]);
    assert_eq!(out[0].as_f32s().unwrap(), &[4.0, 9.0, 5.0, -1.0]);
    assert_eq!(out[1].to_i64s(), vec![4, 6, 12, 10]);
    let exe = kiln_codegen_llvm::cpu::CpuExecutable::compile_with_cache(&m.funcs[0], None).unwrap();
    assert_eq!(exe.run(&[x, i]).unwrap(), out);
    // Written back out and read again: the same program.
    let text = kiln_stablehlo::to_text(&m).unwrap();
    assert!(text.contains("\"stablehlo.reduce_window\""), "{text}");
    let back = parse(&text).unwrap();
    assert_eq!(
        print_module(&back).replace("@reducer", "@r"),
        print_module(&m).replace("@reducer", "@r")
    );
}

#[test]
fn mulhi_of_64_bit_integers_is_the_high_half_of_the_exact_product() {
    let vals: Vec<i64> = vec![
        i64::MIN,
        i64::MAX,
        -1,
        0,
        1,
        3,
        -7,
        0x1234_5678_9ABC_DEF0,
        -0x0FED_CBA9_8765_4321,
        1 << 32,
        (1 << 32) - 1,
        -(1 << 31),
    ];
    let n = vals.len();
    let a: Vec<i64> = (0..n * n).map(|k| vals[k / n]).collect();
    let b: Vec<i64> = (0..n * n).map(|k| vals[k % n]).collect();
    let text = format!(
        "func.func @main(%a: tensor<{0}xi64>, %b: tensor<{0}xi64>) -> tensor<{0}xi64> {{
  %0 = \"chlo.mulhi\"(%a, %b) : (tensor<{0}xi64>, tensor<{0}xi64>) -> tensor<{0}xi64>
  func.return %0 : tensor<{0}xi64>
}}",
        n * n
    );
    let ty = kiln_ir::TensorType::new(kiln_ir::DType::I64, [n * n]);
    let args = [
        Literal::from_i64s(ty.clone(), &a).unwrap(),
        Literal::from_i64s(ty, &b).unwrap(),
    ];
    let got = run(&text, &args)[0].to_i64s();
    let want: Vec<i64> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| ((x as i128 * y as i128) >> 64) as i64)
        .collect();
    assert_eq!(got, want);
}

#[test]
fn total_order_comparisons_sort_nans_and_signed_zeros() {
    // As `jnp.sort` lowers: a comparator with the TOTALORDER comparison type.
    let text =
        "func.func @main(%x: tensor<6xf32>, %h: tensor<3xbf16>) -> (tensor<6xf32>, tensor<3xi1>) {
  %0 = \"stablehlo.sort\"(%x) <{dimension = 0 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %p = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  }) : (tensor<6xf32>) -> tensor<6xf32>
  %z = stablehlo.constant dense<[0.0, -0.0, 1.0]> : tensor<3xbf16>
  %1 = stablehlo.compare GT, %h, %z, TOTALORDER : (tensor<3xbf16>, tensor<3xbf16>) -> tensor<3xi1>
  func.return %0, %1 : tensor<6xf32>, tensor<3xi1>
}";
    let x = f32s(
        &[6],
        &[f32::NAN, 1.0, -0.0, 0.0, -f32::NAN, f32::NEG_INFINITY],
    );
    let h = Literal::from_f64s(
        kiln_ir::TensorType::new(kiln_ir::DType::BF16, [3]),
        &[-0.0, 0.0, f64::NAN],
    )
    .unwrap();
    let out = run(text, &[x.clone(), h.clone()]);
    let m = parse(text).unwrap();
    let exe = kiln_codegen_llvm::cpu::CpuExecutable::compile_with_cache(&m.funcs[0], None).unwrap();
    let cpu = exe.run(&[x, h]).unwrap();
    assert_eq!(cpu[0].to_le_bytes(), out[0].to_le_bytes());
    assert_eq!(cpu[1], out[1]);
    let bits: Vec<u32> = out[0]
        .as_f32s()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    let want: Vec<u32> = [-f32::NAN, f32::NEG_INFINITY, -0.0, 0.0, 1.0, f32::NAN]
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(bits, want);
    assert_eq!(out[1].to_i64s(), vec![0, 1, 1]);
}

/// Runs `chlo.<name>` on `xs` (f64) and returns the results.
fn chlo_f64(name: &str, xs: &[f64]) -> Vec<f64> {
    let n = xs.len();
    let text = format!(
        "func.func @main(%x: tensor<{n}xf64>) -> tensor<{n}xf64> {{
  %0 = \"chlo.{name}\"(%x) : (tensor<{n}xf64>) -> tensor<{n}xf64>
  func.return %0 : tensor<{n}xf64>
}}"
    );
    let x = Literal::f64([n], xs.to_vec()).unwrap();
    run(&text, &[x])[0].to_f64s()
}

/// A `chlo` op, its inputs and the standard library's function.
type Case<'a> = (&'a str, &'a [f64], fn(f64) -> f64);

#[test]
fn chlo_elementary_functions_match_the_standard_library() {
    let xs = [-0.99, -0.5, -1e-9, 0.0, 1e-9, 0.3, 0.75, 0.999];
    let big = [
        -1e200, -30.0, -2.0, -1e-12, 0.0, 1e-12, 0.5, 2.0, 30.0, 1e200,
    ];
    let cases: [Case; 8] = [
        ("asin", &xs, f64::asin),
        ("acos", &xs, f64::acos),
        ("atan", &big, f64::atan),
        ("atanh", &xs, f64::atanh),
        (
            "sinh",
            &[-30.0, -2.0, -0.5, -1e-12, 0.0, 1e-12, 0.5, 2.0, 30.0],
            f64::sinh,
        ),
        ("cosh", &[-30.0, -2.0, -0.5, 0.0, 0.5, 2.0, 30.0], f64::cosh),
        ("asinh", &big, f64::asinh),
        (
            "acosh",
            &[1.0, 1.0 + 1e-9, 1.5, 10.0, 1e10, 1e200],
            f64::acosh,
        ),
    ];
    for (name, xs, f) in cases {
        for (x, got) in xs.iter().zip(chlo_f64(name, xs)) {
            let want = f(*x);
            let ok =
                got == want || ((got - want) / want).abs() < 1e-13 || (got - want).abs() < 1e-300;
            assert!(ok, "chlo.{name}({x}) = {got}, expected {want}");
        }
    }
    assert_eq!(chlo_f64("acos", &[-1.0])[0], std::f64::consts::PI);
}

#[test]
fn chlo_erf_inv_inverts_erf() {
    let text = "func.func @main(%x: tensor<9xf32>) -> (tensor<9xf32>, tensor<9xf32>) {
  %0 = chlo.erf_inv %x : tensor<9xf32> -> tensor<9xf32>
  %1 = \"chlo.erf\"(%0) : (tensor<9xf32>) -> tensor<9xf32>
  func.return %0, %1 : tensor<9xf32>, tensor<9xf32>
}";
    let xs = [-1.0, -0.999, -0.7, -0.1, 0.0, 0.2, 0.5, 0.99, 1.0];
    let out = run(text, &[f32s(&[9], &xs)]);
    let (y, back) = (out[0].as_f32s().unwrap(), out[1].as_f32s().unwrap());
    assert_eq!((y[0], y[8]), (f32::NEG_INFINITY, f32::INFINITY));
    for k in 1..8 {
        assert!(
            (back[k] - xs[k]).abs() < 2e-6,
            "erf(erf_inv({})) = {}",
            xs[k],
            back[k]
        );
    }
}

#[test]
fn cholesky_and_triangular_solve_import_in_both_forms() {
    let pretty = "func.func @main(%a: tensor<2x2xf32>, %b: tensor<2x1xf32>) -> tensor<2x1xf32> {
  %l = stablehlo.cholesky %a, lower = true : tensor<2x2xf32>
  %y = \"stablehlo.triangular_solve\"(%l, %b) {left_side = true, lower = true, unit_diagonal = false, transpose_a = #stablehlo<transpose NO_TRANSPOSE>} : (tensor<2x2xf32>, tensor<2x1xf32>) -> tensor<2x1xf32>
  %x = \"stablehlo.triangular_solve\"(%l, %y) {left_side = true, lower = true, unit_diagonal = false, transpose_a = #stablehlo<transpose TRANSPOSE>} : (tensor<2x2xf32>, tensor<2x1xf32>) -> tensor<2x1xf32>
  func.return %x : tensor<2x1xf32>
}";
    let generic = r#"func.func @main(%a: tensor<2x2xf32>, %b: tensor<2x1xf32>) -> tensor<2x1xf32> {
  %l = "stablehlo.cholesky"(%a) {lower = true} : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %y = "stablehlo.triangular_solve"(%l, %b) {left_side = true, lower = true, unit_diagonal = false, transpose_a = #stablehlo<transpose NO_TRANSPOSE>} : (tensor<2x2xf32>, tensor<2x1xf32>) -> tensor<2x1xf32>
  %x = "stablehlo.triangular_solve"(%l, %y) {left_side = true, lower = true, unit_diagonal = false, transpose_a = #stablehlo<transpose TRANSPOSE>} : (tensor<2x2xf32>, tensor<2x1xf32>) -> tensor<2x1xf32>
  "func.return"(%x) : (tensor<2x1xf32>) -> ()
}"#;
    let p = parse(pretty).unwrap_or_else(|e| panic!("{e}"));
    let g = parse(generic).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_module(&p), print_module(&g));
    let text = print_module(&p);
    assert!(text.contains("cholesky %0 {lower = true}"), "{text}");
    assert!(text.contains("transpose_a = TRANSPOSE"), "{text}");
    // a = [[4, 2], [2, 5]], b = [2.5, 3.25]: x = [0.375, 0.5].
    let a = f32s(&[2, 2], &[4.0, 2.0, 2.0, 5.0]);
    let b = f32s(&[2, 1], &[2.5, 3.25]);
    let out = run(generic, &[a, b]);
    assert_eq!(out[0].as_f32s().unwrap(), &[0.375, 0.5]);
    // Export prints both ops in the generic form, which reads back to the same program.
    let back = parse(&kiln_stablehlo::to_text(&p).unwrap()).unwrap();
    assert_eq!(print_module(&back), text);
}

#[test]
fn fft_imports_in_both_forms() {
    let pretty = "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %s = stablehlo.fft %x, type = RFFT, length = [4] : (tensor<4xf32>) -> tensor<3xcomplex<f32>>
  %y = stablehlo.fft %s, type = IRFFT, length = [4] : (tensor<3xcomplex<f32>>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}";
    let generic = r#"func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %s = "stablehlo.fft"(%x) {fft_type = #stablehlo<fft_type RFFT>, fft_length = array<i64: 4>} : (tensor<4xf32>) -> tensor<3xcomplex<f32>>
  %y = "stablehlo.fft"(%s) {fft_type = #stablehlo<fft_type IRFFT>, fft_length = array<i64: 4>} : (tensor<3xcomplex<f32>>) -> tensor<4xf32>
  "func.return"(%y) : (tensor<4xf32>) -> ()
}"#;
    let p = parse(pretty).unwrap_or_else(|e| panic!("{e}"));
    let g = parse(generic).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_module(&p), print_module(&g));
    let text = print_module(&p);
    assert!(
        text.contains("fft %0 {fft_type = RFFT, fft_length = [4]} : c64[3]"),
        "{text}"
    );
    // The real transform and its inverse give the operand back.
    let out = run(generic, &[f32s(&[4], &[1.0, 2.0, 3.0, 4.0])]);
    assert_eq!(out[0].as_f32s().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    let back = parse(&kiln_stablehlo::to_text(&p).unwrap()).unwrap();
    assert_eq!(print_module(&back), text);
    // A transform type StableHLO does not have is an error at its position.
    let bad = pretty.replace("type = RFFT", "type = DCT");
    let e = parse(&bad).expect_err("DCT is no fft_type");
    assert!(e.to_string().contains("fft_type"), "{e}");
}

/// The syntax tree written in the generic op form imports to the same module as the text it
/// came from: a JAX module (pretty ops, `reduce ... applies`, `call`) and every JAX program
/// of the test data (dot_general dimension pairs, slices, convolutions, large literals).
#[test]
fn the_generic_form_of_the_syntax_tree_imports_alike() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jax");
    let mut texts = vec![JAX.to_string()];
    let mut dirs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path().join("module.mlir"))
        .filter(|p| p.exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 6, "{dirs:?}");
    texts.extend(dirs.iter().map(|p| std::fs::read_to_string(p).unwrap()));
    for text in &texts {
        let ast = kiln_stablehlo::parse_ast(Piece {
            text,
            first_line: 1,
        })
        .unwrap();
        let generic = kiln_stablehlo::generic::print_generic(&ast).unwrap();
        assert!(!generic.contains(" = stablehlo."), "{generic}");
        let a = print_module(&parse(text).unwrap());
        let b = print_module(&parse(&generic).unwrap_or_else(|e| panic!("{e}\n{generic}")));
        assert_eq!(a, b);
    }
}

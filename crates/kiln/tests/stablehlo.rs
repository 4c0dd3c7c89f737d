//! StableHLO text through the facade: `kiln::stablehlo` imports a module, which compiles and
//! runs on the default backend like any traced function.

use kiln::ir::Literal;

#[test]
fn an_imported_module_runs_on_the_default_backend() {
    let text = "func.func @main(%x: tensor<3xf32>) -> tensor<f32> {
  %0 = stablehlo.multiply %x, %x : tensor<3xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  func.return %1 : tensor<f32>
}";
    let m = kiln::stablehlo::parse(text).unwrap();
    let exe = kiln::backend::compile_cached(m.entry().unwrap()).unwrap();
    let x = Literal::f32([3], vec![1.0, 2.0, 3.0]).unwrap();
    assert_eq!(exe.run(&[&x]).unwrap()[0].as_f32s().unwrap(), &[14.0]);
}

#[test]
fn an_unsupported_op_is_an_error_with_its_position() {
    let e = kiln::stablehlo::parse(
        "func.func @main() {\n  %0 = stablehlo.frobnicate : tensor<f32>\n  func.return\n}",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "2:8: unsupported: the op `stablehlo.frobnicate` (kiln has no such op)"
    );
}

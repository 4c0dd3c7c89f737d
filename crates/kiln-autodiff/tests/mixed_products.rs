//! The VJP of a matrix product computed in a wider type than its operands
//! (`preferred_element_type`): the gradients are those of the product of the converted operands,
//! converted back to the operands' type.

use kiln_ir::{Literal, parse_func_text};

const DOT: &str = "{lhs_batching_dimensions = [], rhs_batching_dimensions = [], \
                   lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}";

#[test]
fn a_widened_products_gradients_are_the_wide_products_converted_back() {
    let mixed = parse_func_text(&format!(
        "func @main(%0: bf16[2,3], %1: bf16[3,2]) -> f32[2,2] {{\n  \
         %2 = dot_general %0, %1 {DOT} : f32[2,2]\n  return %2\n}}"
    ))
    .unwrap();
    let wide = parse_func_text(&format!(
        "func @main(%0: bf16[2,3], %1: bf16[3,2]) -> f32[2,2] {{\n  \
         %2 = convert %0 : f32[2,3]\n  %3 = convert %1 : f32[3,2]\n  \
         %4 = dot_general %2, %3 {DOT} : f32[2,2]\n  return %4\n}}"
    ))
    .unwrap();
    let a = Literal::from_f64s(
        kiln_ir::TensorType::new(kiln_ir::DType::BF16, [2, 3]),
        &[1.5, -2.0, 0.25, 3.0, 0.125, -1.0],
    )
    .unwrap();
    let b = Literal::from_f64s(
        kiln_ir::TensorType::new(kiln_ir::DType::BF16, [3, 2]),
        &[0.5, 1.0, -1.5, 2.0, 4.0, -0.75],
    )
    .unwrap();
    let g = Literal::from_f64s(
        kiln_ir::TensorType::new(kiln_ir::DType::F32, [2, 2]),
        &[1.0, -3.0, 0.0078125, 2.5],
    )
    .unwrap();
    let run = |f| {
        let v = kiln_autodiff::vjp(f, &[0, 1]).unwrap();
        kiln_ir::verify(&v).unwrap();
        kiln_reference::eval(&v, &[a.clone(), b.clone(), g.clone()]).unwrap()
    };
    let (m, w) = (run(&mixed), run(&wide));
    assert_eq!(m.len(), 3);
    for (x, y) in m.iter().zip(&w) {
        assert_eq!(x.ty(), y.ty());
        assert_eq!(x.to_f64s(), y.to_f64s());
    }
    assert_eq!(m[1].dtype(), kiln_ir::DType::BF16);
}

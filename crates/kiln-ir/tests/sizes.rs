//! Tensor types whose element count or byte size overflows i64 are rejected by the verifier,
//! and no size computation of the IR crate panics or aborts on them.

use kiln_ir::{
    Builder, DType, Literal, Op, TensorType, parse_literal, parse_module, verify, verify_module,
};

/// 2^40: two such dimensions make 2^80 elements.
const BIG: usize = 1 << 40;

fn verify_text(src: &str) -> Result<(), kiln_ir::VerifyError> {
    verify_module(&parse_module(src).expect("parses"))
}

#[test]
fn parameter_type_whose_element_count_overflows_is_rejected() {
    let src = format!("func @main(%0: f32[{BIG},{BIG}]) -> f32[{BIG},{BIG}] {{\n  return %0\n}}\n");
    let e = verify_text(&src).unwrap_err();
    assert_eq!(e.diag.label, "ir_size", "{e}");
    let msg = e.to_string();
    assert!(msg.contains("f32[1099511627776,1099511627776]"), "{msg}");
    assert!(msg.contains("overflows"), "{msg}");
}

#[test]
fn instruction_result_type_whose_size_overflows_is_rejected() {
    let src = format!(
        "func @main(%0: f32[2]) -> f32[2] {{\n  %1 = iota {{iota_dimension = 0}} : f32[{BIG},{BIG}]\n  return %0\n}}\n"
    );
    let e = verify_text(&src).unwrap_err();
    assert_eq!(e.diag.label, "ir_size", "{e}");
    assert!(e.inst.as_deref().unwrap_or("").starts_with("iota"), "{e}");
    assert!(e.to_string().contains("overflows"), "{e}");
}

#[test]
fn declared_output_type_whose_size_overflows_is_rejected() {
    let src = format!("func @main(%0: f32[2]) -> f32[{BIG},{BIG}] {{\n  return %0\n}}\n");
    let e = verify_text(&src).unwrap_err();
    assert_eq!(e.diag.label, "ir_size", "{e}");
}

#[test]
fn constant_declared_with_a_type_whose_size_overflows_is_rejected() {
    let src = format!(
        "func @main() -> f32[2] {{\n  %0 = constant {{value = [1.0, 2.0]}} : f32[2]\n  %1 = constant {{value = [1.0]}} : f32[{BIG},{BIG}]\n  return %0\n}}\n"
    );
    let e = verify_text(&src).unwrap_err();
    assert_eq!(e.diag.label, "ir_size", "{e}");
    assert!(e.to_string().contains("overflows"), "{e}");
}

#[test]
fn byte_size_overflow_alone_is_rejected() {
    // 2^62 elements fit in i64, 2^65 bytes of f64 do not.
    let d = 1usize << 31;
    let src = format!("func @main(%0: f64[{d},{d}]) -> f64[{d},{d}] {{\n  return %0\n}}\n");
    let e = verify_text(&src).unwrap_err();
    assert_eq!(e.diag.label, "ir_size", "{e}");
    assert!(e.to_string().contains("byte size"), "{e}");
    // The same count of bytes is fine.
    let n = 1usize << 62;
    let ok = format!("func @main(%0: i8[{n}]) -> i8[{n}] {{\n  return %0\n}}\n");
    verify_text(&ok).unwrap();
}

#[test]
fn a_dimension_beyond_i64_is_rejected_even_in_an_empty_tensor() {
    let d = 1usize << 63;
    let src = format!("func @main(%0: f32[0,{d}]) -> f32[0,{d}] {{\n  return %0\n}}\n");
    let e = verify_text(&src).unwrap_err();
    assert_eq!(e.diag.label, "ir_size", "{e}");
}

#[test]
fn size_helpers_do_not_overflow() {
    let huge = TensorType::new(DType::F32, [BIG, BIG]);
    assert_eq!(huge.checked_numel(), None);
    assert_eq!(huge.byte_size(), None);
    assert_eq!(huge.numel(), usize::MAX, "numel saturates");
    assert!(huge.check_size().is_err());
    let _ = huge.strides();
    let _ = kiln_ir::strides(&[BIG, BIG, BIG]);

    let valid = TensorType::new(DType::F32, [1 << 30, 1 << 20]);
    assert_eq!(valid.checked_numel(), Some(1 << 50));
    assert_eq!(valid.byte_size(), Some(1 << 52));
    assert_eq!(valid.numel(), 1 << 50);
    assert!(valid.check_size().is_ok());

    let empty = TensorType::new(DType::F32, [0, BIG, BIG]);
    assert_eq!(empty.checked_numel(), Some(0));
    assert_eq!(empty.byte_size(), Some(0));
    assert_eq!(empty.numel(), 0);
    // Its strides (products of the nonzero dimensions) would overflow: not a kiln type.
    assert!(empty.check_size().is_err());

    assert_eq!(TensorType::scalar(DType::F64).byte_size(), Some(8));
}

#[test]
fn attribute_arithmetic_in_type_rules_does_not_overflow() {
    let max = i64::MAX;
    let cases = [
        format!(
            "func @main(%0: f32[2], %1: f32[]) -> f32[2] {{\n  %2 = pad %0, %1 {{edge_padding_low = [{max}], edge_padding_high = [{max}], interior_padding = [0]}} : f32[2]\n  return %0\n}}\n"
        ),
        format!(
            "func @main(%0: f32[2], %1: f32[]) -> f32[2] {{\n  %2 = pad %0, %1 {{edge_padding_low = [0], edge_padding_high = [0], interior_padding = [{max}]}} : f32[2]\n  return %0\n}}\n"
        ),
        format!(
            "func @main(%0: f32[3], %1: f32[]) -> f32[3] {{\n  %2 = reduce_window %0, %1 {{window_dimensions = [1], window_strides = [1], base_dilations = [{max}], window_dilations = [1], padding = [[0, 0]], kind = add}} : f32[3]\n  return %0\n}}\n"
        ),
        format!(
            "func @main(%0: f32[3], %1: f32[]) -> f32[3] {{\n  %2 = reduce_window %0, %1 {{window_dimensions = [{max}], window_strides = [1], base_dilations = [1], window_dilations = [{max}], padding = [[{max}, {max}]], kind = add}} : f32[3]\n  return %0\n}}\n"
        ),
        format!(
            "func @main(%0: f32[1,2,3,3], %1: f32[2,2,1,1]) -> f32[1,2,3,3] {{\n  %2 = convolution %0, %1 {{window_strides = [1, 1], padding = [[0, 0], [0, 0]], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = {max}, input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]}} : f32[1,2,3,3]\n  return %0\n}}\n"
        ),
        format!(
            "func @main(%0: i8[{n}]) -> i8[{n}] {{\n  %1 = concatenate %0, %0, %0, %0 {{dimension = 0}} : i8[1]\n  return %0\n}}\n",
            n = 1usize << 62
        ),
    ];
    for src in &cases {
        let e = verify_text(src).unwrap_err();
        assert!(
            e.diag.label == "ir_size" || e.diag.label.contains("_c"),
            "{src}: {e}"
        );
    }
    // A stride far past the dimension takes one element.
    let slice = format!(
        "func @main(%0: f32[2]) -> f32[1] {{\n  %1 = slice %0 {{start_indices = [0], limit_indices = [2], strides = [{max}]}} : f32[1]\n  return %1\n}}\n"
    );
    verify_text(&slice).unwrap();
}

#[test]
fn builder_rejects_inferred_types_whose_size_overflows() {
    let n = 1usize << 62;
    let mut b = Builder::new("main");
    let x = b.param(TensorType::new(DType::I8, [n]));
    let e = b
        .push(Op::Concatenate { dimension: 0 }, &[x, x])
        .unwrap_err();
    assert_eq!(e.diag.label, "ir_size", "{e}");
}

#[test]
fn verify_of_an_unchecked_function_does_not_panic() {
    let mut b = Builder::new("main");
    let x = b.param(TensorType::new(DType::F32, [BIG, BIG]));
    let f = b.finish(&[x]).unwrap();
    assert_eq!(verify(&f).unwrap_err().diag.label, "ir_size");
}

#[test]
fn literal_storage_of_a_huge_type_is_an_error_not_an_abort() {
    for ty in [
        TensorType::new(DType::F32, [BIG, BIG]),
        TensorType::new(DType::F32, [1 << 30, 1 << 20]),
        TensorType::new(DType::Pred, [usize::MAX]),
    ] {
        assert!(Literal::try_zeros(ty.clone()).is_err(), "{ty}");
        // SAFETY: `init` is never called when the storage cannot be allocated.
        let r = unsafe { Literal::try_new_uninit(ty.clone(), |_| unreachable!()) };
        assert!(r.is_err(), "{ty}");
        assert!(Literal::from_le_bytes(ty.clone(), &[]).is_err(), "{ty}");
        assert!(Literal::from_f64s(ty.clone(), &[0.0]).is_err(), "{ty}");
        assert!(parse_literal("0.0", &ty).is_err(), "{ty}");
        assert!(parse_literal("[[0.0]]", &ty).is_err(), "{ty}");
    }
    let small = Literal::try_zeros(TensorType::new(DType::F32, [2, 3])).unwrap();
    assert_eq!(small.to_f64s(), vec![0.0; 6]);
    assert_eq!(small, Literal::zeros(TensorType::new(DType::F32, [2, 3])));
}

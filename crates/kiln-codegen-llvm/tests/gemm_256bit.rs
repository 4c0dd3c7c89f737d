//! The GEMM with 256-bit vectors (the AVX2 blocking) on any x86-64 host with AVX2, so that path
//! is tested here even on an AVX-512 machine, which otherwise uses 512-bit vectors; also the
//! math functions' scaling without AVX-512's `vscalef`, and streaming stores with 256-bit loops.

mod common;

#[test]
fn gemm_with_256_bit_vectors_agrees_with_the_reference() {
    // SAFETY: this binary's only test sets the variable before anything reads it.
    unsafe { std::env::set_var("KILN_VECTOR_BITS", "256") };
    let f = kiln_ir::parse_func_text(
        "func @main(%0: f32[64,64], %1: f32[64,64]) -> f32[64,64] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[64,64]\n  return %2\n}\n",
    )
    .unwrap();
    let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, true, &common::env_options()).unwrap();
    assert!(ir.contains("<8 x float>") && !ir.contains("<16 x float>"));
    common::gemm_shapes();
    common::dimension_orders();
    common::convolutions();
    common::row_epilogues();
    common::chained_products();
    common::transposed_folds();
    common::transcendentals();
    common::softmax_special_values();
    common::streaming_stores();
    common::row_caches();
}

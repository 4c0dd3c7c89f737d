//! `vmap` of `bitcast_convert` between types of different widths, whose result has a last
//! dimension more or less than its operand (to and from `pred`, to and from bytes), batched
//! like a loop over the examples. A scalar operand was broadcast to the result's shape as an
//! elementwise op's would be, which the verifier refused (random program 6315 of the vmap
//! tests: `f64[]` to `pred[64]`).

use kiln_autodiff::vmap;
use kiln_ir::random::{Rng, random_literal};
use kiln_ir::{Literal, parse_func_text};

/// `text`'s program batched over its one parameter (3 examples) gives, for each example, what
/// the program gives on it alone, on the reference interpreter.
fn batches_like_a_loop(text: &str) {
    let f = parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let b = vmap(&f, &[true], 3).unwrap_or_else(|e| panic!("{e}\n{f}"));
    let t = f.param_types()[0].clone();
    let mut rng = Rng::new(7);
    let examples: Vec<Literal> = (0..3).map(|_| random_literal(&mut rng, &t)).collect();
    let mut bytes = Vec::new();
    for x in &examples {
        bytes.extend(x.to_le_bytes());
    }
    let mut shape = vec![3];
    shape.extend(&t.shape);
    let xs = Literal::from_le_bytes(kiln_ir::TensorType::new(t.dtype, shape), &bytes).unwrap();
    let got = kiln_reference::eval(&b, &[xs]).unwrap();
    let mut want = Vec::new();
    for x in &examples {
        want.extend(kiln_reference::eval(&f, std::slice::from_ref(x)).unwrap()[0].to_le_bytes());
    }
    assert_eq!(got[0].to_le_bytes(), want, "{text}\nbatched:\n{b}");
}

#[test]
fn bitcasts_between_widths_batch_like_a_loop() {
    for text in [
        "func @main(%0: f64[]) -> pred[64] {\n  %1 = bitcast_convert %0 : pred[64]\n  return %1\n}",
        "func @main(%0: u8[]) -> pred[8] {\n  %1 = bitcast_convert %0 : pred[8]\n  return %1\n}",
        "func @main(%0: u32[]) -> u8[4] {\n  %1 = bitcast_convert %0 : u8[4]\n  return %1\n}",
        "func @main(%0: f32[2]) -> pred[2,32] {\n  %1 = bitcast_convert %0 : pred[2,32]\n  return %1\n}",
        "func @main(%0: pred[16]) -> i16[] {\n  %1 = bitcast_convert %0 : i16[]\n  return %1\n}",
        "func @main(%0: u8[2,4]) -> f32[2] {\n  %1 = bitcast_convert %0 : f32[2]\n  return %1\n}",
    ] {
        batches_like_a_loop(text);
    }
}

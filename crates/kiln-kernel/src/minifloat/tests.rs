use super::*;
use kiln_ir::parse_func_text;

/// Every bit pattern of `m`, repeated to `n` elements, in a scrambled order.
fn patterns(m: MiniFloat, n: usize, seed: usize) -> Literal {
    let count = 1usize << m.bits();
    let codes: Vec<u8> = (0..n)
        .map(|i| ((i * 37 + seed * 11) % count) as u8)
        .collect();
    Literal::new(
        TensorType::new(DType::Mini(m), [n]),
        kiln_ir::Data::Mini(m, codes),
    )
    .unwrap()
}

/// The same bits, or both NaN.
fn same(a: &Literal, b: &Literal) -> bool {
    if a.ty() != b.ty() {
        return false;
    }
    let (x, y) = (a.to_f64s(), b.to_f64s());
    let bits_equal = a.to_le_bytes() == b.to_le_bytes();
    bits_equal
        || x.iter()
            .zip(&y)
            .all(|(p, q)| (p.is_nan() && q.is_nan()) || p.to_bits() == q.to_bits())
}

/// The rewritten program, run on the reference interpreter (its `convert`s between f32 and
/// the small floats are the exact conversions), gives the original's results.
#[test]
fn held_in_f32_the_programs_compute_what_the_reference_computes() {
    let n = 512;
    for m in MiniFloat::ALL {
        let t = m.name();
        let programs = [
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> {t}[{n}] {{\n  %2 = add %0, %1 : {t}[{n}]\n  return %2\n}}"
            ),
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> {t}[{n}] {{\n  %2 = multiply %0, %1 : {t}[{n}]\n  %3 = divide %2, %1 : {t}[{n}]\n  return %3\n}}"
            ),
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> (pred[{n}], {t}[{n}]) {{\n  %2 = compare %0, %1 {{comparison_direction = LT}} : pred[{n}]\n  %3 = select %2, %0, %1 : {t}[{n}]\n  return %2, %3\n}}"
            ),
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> (f32[{n}], f64[{n}], i32[{n}], bf16[{n}]) {{\n  %2 = convert %0 : f32[{n}]\n  %3 = convert %1 : f64[{n}]\n  %4 = convert %0 : i32[{n}]\n  %5 = convert %1 : bf16[{n}]\n  return %2, %3, %4, %5\n}}"
            ),
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> (f8e4m3fn[{n}], f4e2m1fn[{n}], f8e8m0fnu[{n}]) {{\n  %2 = convert %0 : f8e4m3fn[{n}]\n  %3 = convert %1 : f4e2m1fn[{n}]\n  %4 = convert %0 : f8e8m0fnu[{n}]\n  return %2, %3, %4\n}}"
            ),
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> {t}[] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]}} : {t}[]\n  return %2\n}}"
            ),
            // Into a wider type: computed in it (f32 though `f8e8m0fnu` is held in f64).
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> (f32[], f64[], f32[1,1,1]) {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]}} : f32[]\n  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]}} : f64[]\n  %4 = reshape %0 : {t}[1,1,{n}]\n  %5 = reshape %1 : {t}[1,1,{n}]\n  %6 = convolution %4, %5 {{window_strides = [1], padding = [[0, 0]], lhs_dilation = [1], rhs_dilation = [1], feature_group_count = 1, input_dims = [0, 1, 2], kernel_dims = [0, 1, 2], output_dims = [0, 1, 2]}} : f32[1,1,1]\n  return %2, %3, %6\n}}"
            ),
            format!(
                "func @main(%0: {t}[{n}], %1: {t}[{n}]) -> ({t}[{n}], {t}[{n}]) {{\n  %2 = exponential %0 : {t}[{n}]\n  %3 = sqrt %1 : {t}[{n}]\n  return %2, %3\n}}"
            ),
        ];
        for (k, text) in programs.iter().enumerate() {
            let f = match parse_func_text(text) {
                Ok(f) => f,
                Err(e) => panic!("{e}\n{text}"),
            };
            let g = expand_minifloats(&f).unwrap();
            kiln_ir::verify(&g).unwrap();
            let args = [patterns(m, n, k), patterns(m, n, k + 5)];
            let want = kiln_reference::eval(&f, &args).unwrap();
            let got = kiln_reference::eval(&g, &args).unwrap();
            for (w, a) in want.iter().zip(&got) {
                assert!(same(w, a), "{t}, program {k}:\n{text}\nwant {w}\ngot  {a}");
            }
        }
    }
}

/// Conversions into the small floats from every wider type, and bitcasts to and from bytes.
#[test]
fn conversions_and_bitcasts_round_once() {
    let n = 256;
    let f32s: Vec<f32> = (0..n)
        .map(|i| {
            let x = (i as f32 - 128.0) * 0.37;
            x * x.abs().powf(1.7) / 3.0
        })
        .chain([
            f32::NAN,
            f32::INFINITY,
            -0.0,
            1e-30,
            464.0,
            57344.0 + 4096.0,
        ])
        .collect();
    let len = f32s.len();
    for m in MiniFloat::ALL {
        let t = m.name();
        let text = format!(
            "func @main(%0: f32[{len}], %1: i32[{len}]) -> ({t}[{len}], {t}[{len}], {t}[{len}]) {{\n  %2 = convert %0 : {t}[{len}]\n  %3 = convert %1 : {t}[{len}]\n  %4 = convert %0 : f64[{len}]\n  %5 = convert %4 : {t}[{len}]\n  return %2, %3, %5\n}}"
        );
        let f = parse_func_text(&text).unwrap();
        let g = expand_minifloats(&f).unwrap();
        let ints: Vec<i32> = f32s
            .iter()
            .map(|&x| if x.is_finite() { x as i32 } else { 7 })
            .collect();
        let args = [
            Literal::f32([len], f32s.clone()).unwrap(),
            Literal::i32([len], ints).unwrap(),
        ];
        let want = kiln_reference::eval(&f, &args).unwrap();
        let got = kiln_reference::eval(&g, &args).unwrap();
        for (w, a) in want.iter().zip(&got) {
            assert!(same(w, a), "{t}: want {w}\ngot {a}");
        }
        if m.bits() == 8 {
            let text = format!(
                "func @main(%0: {t}[{n}]) -> (u8[{n}], {t}[{n}]) {{\n  %1 = bitcast_convert %0 : u8[{n}]\n  %2 = bitcast_convert %1 : {t}[{n}]\n  return %1, %2\n}}"
            );
            // Every pattern, the NaNs with their payloads (held in f32 below the quiet bit).
            let codes: Vec<u8> = (0..=255u8).collect();
            let n = codes.len();
            let text = text.replace("[256]", &format!("[{n}]"));
            let f = parse_func_text(&text).unwrap();
            let g = expand_minifloats(&f).unwrap();
            let args = [Literal::new(
                TensorType::new(DType::Mini(m), [n]),
                kiln_ir::Data::Mini(m, codes),
            )
            .unwrap()];
            let want = kiln_reference::eval(&f, &args).unwrap();
            let got = kiln_reference::eval(&g, &args).unwrap();
            for (w, a) in want.iter().zip(&got) {
                assert_eq!(w.to_le_bytes(), a.to_le_bytes(), "{t}: want {w}\ngot {a}");
            }
            assert_eq!(got[1].to_le_bytes(), args[0].to_le_bytes(), "{t}");
        }
    }
}

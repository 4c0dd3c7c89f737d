//! Float sums on the CPU backend against exact (f64) sums: the error bound of
//! `ir-specs/ops/reduce.md` (a summation tree: leaves of `TargetInfo::sums` values, pairwise
//! above), at sizes up to 2^30, on plain, row, column (strip-mined), multi-dimension and fused
//! sums, with benign and adversarial inputs.

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{DType, Literal, TensorType};

fn run(src: &str, args: &[Literal]) -> Vec<f64> {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let out = CpuExecutable::compile(&f)
        .and_then(|e| e.run(args))
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    out[0].to_f64s()
}

fn f32s(shape: &[usize], v: impl Fn(usize) -> f64) -> Literal {
    let n: usize = shape.iter().product();
    let xs: Vec<f64> = (0..n).map(|i| (v(i) as f32) as f64).collect();
    Literal::from_f64s(TensorType::new(DType::F32, shape), &xs).unwrap()
}

/// The relative bound the tests hold a sum to: `|got - exact| <= BOUND · ε(f32) · Σ|x|`. A
/// plain loop over a million values exceeds it a thousand times over.
const BOUND: f64 = 40.0;
const EPS: f64 = f32::EPSILON as f64;

fn check(what: &str, got: f64, exact: f64, abs_sum: f64) {
    let err = (got - exact).abs();
    assert!(
        err <= BOUND * EPS * abs_sum,
        "{what}: got {got}, exact {exact}, error {err:e} is {:.1} eps of Σ|x| (bound {BOUND})",
        err / (EPS * abs_sum)
    );
}

fn full_sum(n: usize) -> String {
    format!(
        "func @f(%x: f32[{n}]) -> f32[] {{
  %z = constant {{value = 0.0}} : f32[]
  %s = reduce %x, %z {{dimensions = [0], kind = add}} : f32[]
  return %s
}}"
    )
}

#[test]
fn mean_of_ten_million_tenths_is_a_tenth() {
    let n = 10_000_000;
    let src = format!(
        "func @f(%x: f32[{n}]) -> f32[] {{
  %z = constant {{value = 0.0}} : f32[]
  %s = reduce %x, %z {{dimensions = [0], kind = add}} : f32[]
  %c = constant {{value = {n}.0}} : f32[]
  %m = divide %s, %c : f32[]
  return %m
}}"
    );
    let got = run(&src, &[f32s(&[n], |_| 0.1)])[0];
    let tenth = 0.1f32 as f64;
    assert!(
        ((got - tenth) / tenth).abs() < 1e-6,
        "mean of {n} x 0.1f32 is {got}"
    );
}

#[test]
fn adversarial_inputs_stay_within_the_bound() {
    type Gen = fn(usize) -> f64;
    let cases: [(&str, Gen); 4] = [
        // A large constant with a small ripple: every partial sum is large.
        ("large constant", |i| 1.0e4 + (i % 7) as f64 * 1e-3),
        // Alternating magnitudes: big values cancel, small ones must survive.
        ("alternating", |i| match i % 4 {
            0 => 1.0e8,
            1 => 1.0,
            2 => -1.0e8,
            _ => 3.0,
        }),
        // Growing values: the last ones dwarf the first.
        ("ramp", |i| i as f64),
        // Pseudo-random signs and magnitudes.
        ("random", |i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            (h as f64 / (1u64 << 24) as f64 - 0.5) * 2.0f64.powi((h % 20) as i32)
        }),
    ];
    for n in [1000, 65_537, 3_000_001] {
        for (what, g) in cases {
            let x = f32s(&[n], g);
            let xs = x.to_f64s();
            let exact: f64 = xs.iter().sum();
            let abs: f64 = xs.iter().map(|v| v.abs()).sum();
            check(
                &format!("{what}, n = {n}"),
                run(&full_sum(n), &[x])[0],
                exact,
                abs,
            );
        }
    }
}

#[test]
fn row_column_and_multi_dimension_sums_stay_within_the_bound() {
    let (rows, cols) = (300, 70_001);
    let x = f32s(&[rows, cols], |i| 1.0 + (i % 13) as f64 * 0.37);
    let xs = x.to_f64s();
    // Rows (the inner dimension), columns (the strip-mined path) and both at once.
    let cases = [
        ("[1]", rows, vec![1]),
        ("[0]", cols, vec![0]),
        ("[0, 1]", 1, vec![0, 1]),
    ];
    for (dims, outs, reduced) in cases {
        let ty = if outs == 1 {
            "f32[]".to_string()
        } else {
            format!("f32[{outs}]")
        };
        let src = format!(
            "func @f(%x: f32[{rows},{cols}]) -> {ty} {{
  %z = constant {{value = 0.0}} : f32[]
  %s = reduce %x, %z {{dimensions = {dims}, kind = add}} : {ty}
  return %s
}}"
        );
        let got = run(&src, std::slice::from_ref(&x));
        let (mut exact, mut abs) = (vec![0.0; outs], vec![0.0; outs]);
        for r in 0..rows {
            for c in 0..cols {
                let o = match reduced.as_slice() {
                    [1] => r,
                    [0] => c,
                    _ => 0,
                };
                exact[o] += xs[r * cols + c];
                abs[o] += xs[r * cols + c].abs();
            }
        }
        for (o, g) in got.iter().enumerate() {
            let (exact, abs) = (exact[o], abs[o]);
            check(&format!("sum over {dims}, output {o}"), *g, exact, abs);
        }
    }
}

#[test]
fn a_sum_of_two_to_the_thirty_values_computed_in_the_kernel() {
    // 2^30 values made by the kernel itself (an iota fused into the sum): 32768 rows of
    // 0..32768, whose exact sum is 2^15 * 2^15 (2^15 - 1) / 2.
    let n = 1usize << 15;
    let src = format!(
        "func @f() -> f32[] {{
  %i = iota {{iota_dimension = 1}} : f32[{n},{n}]
  %z = constant {{value = 0.0}} : f32[]
  %s = reduce %i, %z {{dimensions = [0, 1], kind = add}} : f32[]
  return %s
}}"
    );
    let exact = (n * n * (n - 1) / 2) as f64;
    check("iota 2^30", run(&src, &[])[0], exact, exact);
    // And 2^30 ones (a broadcast fused into the sum): exact in any tree.
    let src = format!(
        "func @f() -> f32[] {{
  %one = constant {{value = 1.0}} : f32[]
  %b = broadcast_in_dim %one {{broadcast_dimensions = []}} : f32[{n},{n}]
  %z = constant {{value = 0.0}} : f32[]
  %s = reduce %b, %z {{dimensions = [0, 1], kind = add}} : f32[]
  return %s
}}"
    );
    assert_eq!(run(&src, &[])[0], (n * n) as f64);
}

#[test]
fn a_sum_of_negative_zeros_keeps_its_init() {
    // init + (-0) + (-0) + ...: +0 from a +0 init, -0 from a -0 init.
    for (init, sign) in [("0.0", false), ("-0.0", true)] {
        let src = format!(
            "func @f(%x: f32[1000]) -> f32[] {{
  %z = constant {{value = {init}}} : f32[]
  %s = reduce %x, %z {{dimensions = [0], kind = add}} : f32[]
  return %s
}}"
        );
        let got = run(&src, &[f32s(&[1000], |_| -0.0)])[0];
        assert!(
            got == 0.0 && got.is_sign_negative() == sign,
            "init {init}: {got}"
        );
    }
}

/// A column sum of 8 MiB, past a core's level 2 cache: summed in bands of rows, then the
/// bands' partial sums (`kiln_kernel::band_sums`), within the bound for adversarial columns,
/// and a column of negative zeros still keeps the sign of its init.
#[test]
fn column_sums_in_bands_of_rows_stay_within_the_bound() {
    let (rows, cols) = (8192, 256);
    let x = f32s(&[rows, cols], |i| {
        let (r, c) = (i / cols, i % cols);
        match c % 4 {
            // Alternating magnitudes down the column.
            0 => [1.0e8, 1.0, -1.0e8, 3.0][r % 4],
            // A large constant with a ripple.
            1 => 1.0e4 + (r % 7) as f64 * 1e-3,
            // A ramp.
            2 => r as f64,
            // Pseudo-random signs and magnitudes.
            _ => {
                let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                (h as f64 / (1u64 << 24) as f64 - 0.5) * 2.0f64.powi((h % 20) as i32)
            }
        }
    });
    let xs = x.to_f64s();
    let src = format!(
        "func @f(%x: f32[{rows},{cols}]) -> f32[{cols}] {{
  %z = constant {{value = 0.0}} : f32[]
  %s = reduce %x, %z {{dimensions = [0], kind = add}} : f32[{cols}]
  return %s
}}"
    );
    let got = run(&src, std::slice::from_ref(&x));
    for (c, g) in got.iter().enumerate() {
        let exact: f64 = (0..rows).map(|r| xs[r * cols + c]).sum();
        let abs: f64 = (0..rows).map(|r| xs[r * cols + c].abs()).sum();
        check(&format!("column {c} of [{rows},{cols}]"), *g, exact, abs);
    }
    for (init, sign) in [("0.0", false), ("-0.0", true)] {
        let src = format!(
            "func @f(%x: f32[{rows},{cols}]) -> f32[{cols}] {{
  %z = constant {{value = {init}}} : f32[]
  %s = reduce %x, %z {{dimensions = [0], kind = add}} : f32[{cols}]
  return %s
}}"
        );
        let got = run(&src, &[f32s(&[rows, cols], |_| -0.0)]);
        assert!(
            got.iter()
                .all(|&g| g == 0.0 && g.is_sign_negative() == sign),
            "init {init}: {:?}",
            &got[..4]
        );
    }
}

//! Products whose readers never use a triangle of them (a causal mask's scores, which every
//! reader selects away: `kiln_kernel::ir::Unread`) leave the tiles wholly inside it
//! uncomputed. The results are the reference's bit for bit (exactly representable operands,
//! so that no order of summation matters), NaN for NaN, with infinities and NaNs placed both
//! where the mask hides the scores and where it shows them; a reader that uses the triangle
//! (unmasked, or through the other triangle's mask) gives the product no such hint, and the
//! verifier rejects a hint that a reader contradicts.

mod common;

use common::{agrees_cached_and_jit, check, compiled_whole, env_options};
use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::Literal;
use kiln_kernel::ir::{Schedule, Unread};

/// How the scores' readers read them.
#[derive(Clone, Copy, Debug)]
enum Readers {
    /// Both through the causal mask `col <= row`.
    Masked,
    /// The row sums through the other triangle's mask `col >= row`.
    Upper,
    /// The row sums of every score, masked or not.
    Unmasked,
}

/// Scores `S = Q Kᵀ` of queries and keys `[b, h, s, d]` read by two kernels, so that `S` is
/// stored: `select(col <= row, S * 0.5, 0)` and the row sums of `S` as `readers` says.
fn two_readers(b: usize, h: usize, s: usize, d: usize, readers: Readers) -> String {
    let sd = format!("f32[{b},{h},{s},{d}]");
    let ss = format!("f32[{b},{h},{s},{s}]");
    let rows = format!("f32[{b},{h},{s}]");
    let (dir, summed) = match readers {
        Readers::Masked => ("LE", "%12"),
        Readers::Upper => ("GE", "%12"),
        Readers::Unmasked => ("LE", "%2"),
    };
    format!(
        "func @main(%0: {sd}, %1: {sd}) -> ({ss}, {rows}) {{
  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]}} : {ss}
  %3 = iota {{iota_dimension = 3}} : i32[{b},{h},{s},{s}]
  %4 = iota {{iota_dimension = 2}} : i32[{b},{h},{s},{s}]
  %5 = compare %3, %4 {{comparison_direction = LE}} : pred[{b},{h},{s},{s}]
  %6 = constant {{value = 0.5}} : f32[]
  %7 = broadcast_in_dim %6 {{broadcast_dimensions = []}} : {ss}
  %8 = multiply %2, %7 : {ss}
  %9 = constant {{value = 0.0}} : f32[]
  %10 = broadcast_in_dim %9 {{broadcast_dimensions = []}} : {ss}
  %11 = compare %3, %4 {{comparison_direction = {dir}}} : pred[{b},{h},{s},{s}]
  %12 = select %11, %2, %10 : {ss}
  %13 = select %5, %8, %10 : {ss}
  %14 = reduce {summed}, %9 {{dimensions = [3], kind = add}} : {rows}
  return %13, %14
}}
"
    )
}

/// Causal attention's probabilities, `softmax(select(col <= row, S * 0.125, -inf))` of `S = Q
/// Kᵀ`: the product's own epilogue is its only reader.
fn probabilities(b: usize, h: usize, s: usize, d: usize) -> String {
    let sd = format!("f32[{b},{h},{s},{d}]");
    let ss = format!("f32[{b},{h},{s},{s}]");
    format!(
        "func @main(%0: {sd}, %1: {sd}) -> {ss} {{
  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [3]}} : {ss}
  %3 = iota {{iota_dimension = 3}} : i32[{b},{h},{s},{s}]
  %4 = iota {{iota_dimension = 2}} : i32[{b},{h},{s},{s}]
  %5 = compare %3, %4 {{comparison_direction = LE}} : pred[{b},{h},{s},{s}]
  %6 = constant {{value = 0.125}} : f32[]
  %7 = broadcast_in_dim %6 {{broadcast_dimensions = []}} : {ss}
  %8 = multiply %2, %7 : {ss}
  %9 = constant {{value = -inf}} : f32[]
  %10 = broadcast_in_dim %9 {{broadcast_dimensions = []}} : {ss}
  %11 = select %5, %8, %10 : {ss}
  %12 = reduce %11, %9 {{dimensions = [3], kind = max}} : f32[{b},{h},{s}]
  %13 = broadcast_in_dim %12 {{broadcast_dimensions = [0, 1, 2]}} : {ss}
  %14 = subtract %11, %13 : {ss}
  %15 = exponential %14 : {ss}
  %16 = constant {{value = 0.0}} : f32[]
  %17 = reduce %15, %16 {{dimensions = [3], kind = add}} : f32[{b},{h},{s}]
  %18 = broadcast_in_dim %17 {{broadcast_dimensions = [0, 1, 2]}} : {ss}
  %19 = divide %15, %18 : {ss}
  return %19
}}
"
    )
}

/// The prepared function and fused kernels of `src`, as the dumps print them.
fn fused(src: &str) -> (kiln_ir::Func, kiln_kernel::fuse::Fused) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    kiln_kernel::pipeline::lowered_for_printing(&f, &env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"))
}

/// The unread region of every GEMM kernel of `src` that has one.
fn unread(src: &str) -> Vec<(i64, i64, i64)> {
    let (_, fz) = fused(src);
    let mut found = Vec::new();
    for k in fz.kernels.iter().flatten() {
        if let Schedule::Gemm {
            unread: Some(u), ..
        } = &k.schedule
        {
            found.push(u.at);
        }
    }
    found
}

/// Arguments of `f` holding small nonzero integers (whose products' sums are exact in any
/// order), from `seed`.
fn integer_args(f: &kiln_ir::Func, seed: u64) -> Vec<Literal> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    f.param_types()
        .iter()
        .map(|t| {
            let xs: Vec<f64> = (0..t.numel())
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let v = ((state >> 33) % 8) as f64 - 4.0;
                    if v >= 0.0 { v + 1.0 } else { v }
                })
                .collect();
            Literal::from_f64s(t.clone(), &xs).unwrap()
        })
        .collect()
}

/// `args[p]` with `value` at the elements `at` picks (by flat index).
fn with(args: &[Literal], p: usize, value: f64, at: &dyn Fn(usize) -> bool) -> Vec<Literal> {
    let mut out = args.to_vec();
    let mut xs = out[p].to_f64s();
    for (i, x) in xs.iter_mut().enumerate() {
        if at(i) {
            *x = value;
        }
    }
    out[p] = Literal::from_f64s(out[p].ty().clone(), &xs).unwrap();
    out
}

/// Runs `src` on `args` and panics unless every output is the reference's bit for bit (NaN
/// where it is NaN).
fn bit_for_bit(src: &str, args: &[Literal], what: &str) {
    let f = kiln_ir::parse_func_text(src).unwrap();
    let exe = CpuExecutable::compile_with_options(&f, &[], &env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    compiled_whole(&exe).unwrap();
    let got = exe.run(args).unwrap();
    let want = kiln_reference::eval(&f, args).unwrap();
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        for (i, (x, y)) in g.to_f64s().iter().zip(&w.to_f64s()).enumerate() {
            let same = if y.is_nan() {
                x.is_nan()
            } else {
                x.to_bits() == y.to_bits()
            };
            assert!(
                same,
                "{what}: output {o}, element {i}: {x} against the reference's {y}\n{src}"
            );
        }
    }
}

/// Infinities and NaNs where the mask hides the scores and where it shows them: a query's row
/// (every score of it, hidden or shown), the last key (hidden from every query but the last)
/// and the first key (shown to every query).
fn special_values(src: &str, (s, d): (usize, usize), seed: u64) {
    let f = kiln_ir::parse_func_text(src).unwrap();
    let args = integer_args(&f, seed);
    bit_for_bit(src, &args, "integers");
    let rc = |i: usize| ((i / d) % s, i % d);
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let q = with(&args, 0, value, &|i| rc(i) == (s / 2, 1));
        bit_for_bit(src, &q, &format!("{value} in query {}", s / 2));
        let k = with(&args, 1, value, &|i| rc(i) == (s - 1, 0));
        bit_for_bit(src, &k, &format!("{value} in the last key"));
        let k = with(&args, 1, value, &|i| rc(i) == (0, 2));
        bit_for_bit(src, &k, &format!("{value} in the first key"));
        let all = with(&args, 1, value, &|i| rc(i).0 > s / 3 && i % 3 == 0);
        bit_for_bit(src, &all, &format!("{value} in many keys"));
    }
}

#[test]
fn scores_read_through_the_mask_leave_their_triangle_out() {
    // One panel of columns (no row wholly unread on AVX-512's 48 columns) and several, rows
    // past a register tile and a block of rows, and a contraction past one block.
    for (b, h, s, d) in [
        (1, 2, 40, 64),
        (2, 1, 150, 80),
        (1, 1, 300, 24),
        (1, 1, 100, 300),
    ] {
        let src = two_readers(b, h, s, d, Readers::Masked);
        assert_eq!(unread(&src), vec![(1, -1, 0)], "{src}");
        agrees_cached_and_jit(&src, 1);
        special_values(&src, (s, d), 7);
    }
}

#[test]
fn readers_that_use_the_triangle_keep_it() {
    for (b, h, s, d) in [(1, 2, 130, 64), (1, 1, 200, 16)] {
        for readers in [Readers::Upper, Readers::Unmasked] {
            let src = two_readers(b, h, s, d, readers);
            assert_eq!(unread(&src), vec![], "{readers:?}\n{src}");
            special_values(&src, (s, d), 11);
        }
    }
}

#[test]
fn an_epilogue_reading_through_the_mask_leaves_the_triangle_out() {
    for (b, h, s, d) in [(1, 2, 40, 64), (2, 1, 160, 80)] {
        let src = probabilities(b, h, s, d);
        assert_eq!(unread(&src), vec![(1, -1, 0)], "{src}");
        agrees_cached_and_jit(&src, 3);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        let args = integer_args(&f, 5);
        let rc = |i: usize| ((i / d) % s, i % d);
        for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for (p, at) in [(0, (s / 2, 1)), (1, (s - 1, 0)), (1, (0, 2))] {
                let v = with(&args, p, value, &|i| rc(i) == at);
                let exe = CpuExecutable::compile_with_options(&f, &[], &env_options()).unwrap();
                let got = exe.run(&v).unwrap();
                let want = kiln_reference::eval(&f, &v).unwrap();
                for (x, y) in got[0].to_f64s().iter().zip(&want[0].to_f64s()) {
                    assert_eq!(x.is_nan(), y.is_nan(), "{value} at {p} {at:?}: {x} {y}");
                }
                check(&f, &v, &got).unwrap_or_else(|e| panic!("{value} at {p} {at:?}: {e}"));
            }
        }
    }
}

#[test]
fn the_verifier_rejects_a_triangle_a_reader_uses() {
    let hinted = |src: &str, at: (i64, i64, i64)| {
        let (g, mut fz) = fused(src);
        let mut set = 0;
        for k in fz.kernels.iter_mut().flatten() {
            if let Schedule::Gemm { unread, .. } = &mut k.schedule {
                *unread = Some(Box::new(Unread { at }));
                set += 1;
            }
        }
        assert_eq!(set, 1, "{src}");
        kiln_kernel::verify::verify_fused(&g, &fz)
    };
    let masked = two_readers(1, 2, 40, 64, Readers::Masked);
    hinted(&masked, (1, -1, 0)).unwrap_or_else(|e| panic!("{e}\n{masked}"));
    // The lower triangle, and the upper one with the diagonal, are read.
    for at in [(-1, 1, 0), (1, -1, 1)] {
        assert!(hinted(&masked, at).is_err(), "{at:?}\n{masked}");
    }
    for readers in [Readers::Upper, Readers::Unmasked] {
        let src = two_readers(1, 2, 40, 64, readers);
        assert!(hinted(&src, (1, -1, 0)).is_err(), "{readers:?}\n{src}");
    }
    let p = probabilities(1, 2, 40, 64);
    hinted(&p, (1, -1, 0)).unwrap_or_else(|e| panic!("{e}\n{p}"));
    assert!(hinted(&p, (-1, 1, 1)).is_err(), "{p}");
}

//! Products whose operand is zero over a causal mask's triangle (attention's probabilities kept
//! for the backward pass, and their gradient) leave those contraction steps out
//! (`kiln_kernel::ir::ZeroBlocks`) only where the zeros and the other operand's finiteness are
//! checked at run time: the results agree with the reference, NaN for NaN, with infinities and
//! NaNs placed where the mask hides them.

mod common;

use common::{agrees_cached_and_jit, check, compiled_whole, env_options, random_args};
use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::Literal;
use kiln_kernel::ir::Schedule;

/// Causal attention's probabilities `P` from queries and keys `[b, h, s, d]`, kept and read by
/// three products: `P V`, `Pᵀ dO` (P as A, transposed) and `dOᵀ P` (P as B).
fn probabilities(b: usize, h: usize, s: usize, d: usize) -> String {
    let t = |dims: &str| format!("f32[{b},{h},{dims}]");
    let (sd, ss, ds) = (
        t(&format!("{s},{d}")),
        t(&format!("{s},{s}")),
        t(&format!("{d},{s}")),
    );
    let dot = |i: usize, x: usize, y: usize, cx: usize, cy: usize, ty: &str| {
        format!(
            "  %{i} = dot_general %{x}, %{y} {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [{cx}], rhs_contracting_dimensions = [{cy}]}} : {ty}\n"
        )
    };
    let mut p =
        format!("func @main(%0: {sd}, %1: {sd}, %2: {sd}, %3: {sd}) -> ({sd}, {sd}, {ds}) {{\n");
    p += &dot(4, 0, 1, 3, 3, &ss);
    p += &format!("  %5 = iota {{iota_dimension = 3}} : i32[{b},{h},{s},{s}]\n");
    p += &format!("  %6 = iota {{iota_dimension = 2}} : i32[{b},{h},{s},{s}]\n");
    p += &format!("  %7 = compare %5, %6 {{comparison_direction = LE}} : pred[{b},{h},{s},{s}]\n");
    p += "  %8 = constant {value = 0.125} : f32[]\n";
    p += &format!("  %9 = broadcast_in_dim %8 {{broadcast_dimensions = []}} : {ss}\n");
    p += &format!("  %10 = multiply %4, %9 : {ss}\n");
    p += "  %11 = constant {value = -inf} : f32[]\n";
    p += &format!("  %12 = broadcast_in_dim %11 {{broadcast_dimensions = []}} : {ss}\n");
    p += &format!("  %13 = select %7, %10, %12 : {ss}\n");
    p += &format!("  %14 = reduce %13, %11 {{dimensions = [3], kind = max}} : f32[{b},{h},{s}]\n");
    p += &format!("  %15 = broadcast_in_dim %14 {{broadcast_dimensions = [0, 1, 2]}} : {ss}\n");
    p += &format!("  %16 = subtract %13, %15 : {ss}\n");
    p += &format!("  %17 = exponential %16 : {ss}\n");
    p += "  %18 = constant {value = 0.0} : f32[]\n";
    p += &format!("  %19 = reduce %17, %18 {{dimensions = [3], kind = add}} : f32[{b},{h},{s}]\n");
    p += &format!("  %20 = broadcast_in_dim %19 {{broadcast_dimensions = [0, 1, 2]}} : {ss}\n");
    p += &format!("  %21 = divide %17, %20 : {ss}\n");
    p += &dot(22, 21, 2, 3, 2, &sd);
    p += &dot(23, 21, 3, 2, 2, &sd);
    p += &dot(24, 3, 21, 2, 2, &ds);
    p += "  return %22, %23, %24\n}\n";
    p
}

/// The scores' gradient `dS = select(col <= row, G, 0) * 0.125` of `G` `[b, h, s, s]`, times
/// the keys (`dS K`) and, transposed, the queries (`dSᵀ Q`).
fn score_gradient(b: usize, h: usize, s: usize, d: usize) -> String {
    let sd = format!("f32[{b},{h},{s},{d}]");
    let ss = format!("f32[{b},{h},{s},{s}]");
    format!(
        "func @main(%0: {ss}, %1: {sd}, %2: {sd}) -> ({sd}, {sd}) {{
  %3 = iota {{iota_dimension = 3}} : i32[{b},{h},{s},{s}]
  %4 = iota {{iota_dimension = 2}} : i32[{b},{h},{s},{s}]
  %5 = compare %3, %4 {{comparison_direction = LE}} : pred[{b},{h},{s},{s}]
  %6 = constant {{value = 0.0}} : f32[]
  %7 = broadcast_in_dim %6 {{broadcast_dimensions = []}} : {ss}
  %8 = select %5, %0, %7 : {ss}
  %9 = constant {{value = 0.125}} : f32[]
  %10 = broadcast_in_dim %9 {{broadcast_dimensions = []}} : {ss}
  %11 = multiply %8, %10 : {ss}
  %12 = dot_general %11, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : {sd}
  %13 = dot_general %11, %2 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {sd}
  return %12, %13
}}
"
    )
}

/// The `(operand, (a, b, c))` of every GEMM kernel of `src` that leaves zero steps out.
fn zero_steps(src: &str) -> Vec<(usize, (i64, i64, i64))> {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let (_, fused) = kiln_kernel::pipeline::lowered_for_printing(&f, &env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    let mut found = Vec::new();
    for k in fused.kernels.iter().flatten() {
        if let Schedule::Gemm { zero: Some(z), .. } = &k.schedule {
            found.push((z.operand, z.at));
        }
    }
    found
}

/// Runs `src` on `args` and panics unless every output agrees with the reference under its
/// accuracy bounds and is NaN exactly where the reference's is.
fn agrees_nan_for_nan(src: &str, args: &[Literal], what: &str) {
    let f = kiln_ir::parse_func_text(src).unwrap();
    let exe = CpuExecutable::compile_with_options(&f, &[], &env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    compiled_whole(&exe).unwrap();
    let got = exe.run(args).unwrap();
    let want = kiln_reference::eval(&f, args).unwrap();
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        let (g, w) = (g.to_f64s(), w.to_f64s());
        for (i, (x, y)) in g.iter().zip(&w).enumerate() {
            assert_eq!(
                x.is_nan(),
                y.is_nan(),
                "{what}: output {o}, element {i}: {x} against the reference's {y}\n{src}"
            );
        }
    }
    check(&f, args, &got).unwrap_or_else(|e| panic!("{what}: {e}\n{src}"));
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

#[test]
fn masked_products_leave_zero_steps_out() {
    // One panel of columns (A read where it is stored), two (on AVX-512 A read there too:
    // `Blocking::a_in_place`) and more (A packed), rows past a register tile and a block of
    // rows, two contraction blocks.
    for (b, h, s, d) in [
        (1, 2, 40, 64),
        (2, 1, 21, 80),
        (1, 1, 300, 72),
        (1, 1, 40, 200),
    ] {
        let p = probabilities(b, h, s, d);
        agrees_cached_and_jit(&p, 1);
        // P V: zeros in A where the step passes the row; Pᵀ dO: A is P transposed, zeros
        // before its row; dOᵀ P: zeros in B where the column passes the step.
        assert_eq!(
            zero_steps(&p),
            vec![(0, (1, -1, 0)), (0, (-1, 1, 0)), (1, (-1, 1, 0))],
            "{p}"
        );
        let g = score_gradient(b, h, s, d);
        agrees_cached_and_jit(&g, 2);
        // dS K: zeros in A past the row; dSᵀ Q: A is dS transposed, zeros before its row.
        assert_eq!(
            zero_steps(&g),
            vec![(0, (1, -1, 0)), (0, (-1, 1, 0))],
            "{g}"
        );
    }
}

/// `P V` with its heads merged back into `[b, s, h * d]` (a transpose and a reshape): the
/// product both stores through strides (`kiln_kernel::ir::Store`) and leaves zero steps out,
/// and a NaN or an infinity where the mask hides it still comes out where the reference's does.
#[test]
fn merged_heads_store_through_strides_and_leave_zero_steps_out() {
    for (b, h, s, d) in [(1, 2, 40, 64), (2, 2, 27, 16)] {
        let p = probabilities(b, h, s, d);
        let merged = format!("f32[{b},{s},{}]", h * d);
        let p = p
            .replacen(
                &format!(") -> (f32[{b},{h},{s},{d}],"),
                &format!(") -> ({merged},"),
                1,
            )
            .replacen(
                "  return %22, %23, %24\n",
                &format!(
                    "  %25 = transpose %22 {{permutation = [0, 2, 1, 3]}} : f32[{b},{s},{h},{d}]\n  %26 = reshape %25 : {merged}\n  return %26, %23, %24\n"
                ),
                1,
            );
        let f = kiln_ir::parse_func_text(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
        let (_, fused) = kiln_kernel::pipeline::lowered_for_printing(&f, &env_options())
            .unwrap_or_else(|e| panic!("{p}: {e}"));
        let both = fused.kernels.iter().flatten().any(|k| {
            matches!(
                &k.schedule,
                Schedule::Gemm {
                    store: Some(_),
                    zero: Some(_),
                    ..
                }
            )
        });
        assert!(
            both,
            "no product both stores through strides and leaves steps out\n{p}"
        );
        let args = random_args(&f, 5);
        agrees_nan_for_nan(&p, &args, "merged heads");
        let rc = |i: usize| ((i / d) % s, i % d);
        for value in [f64::NAN, f64::INFINITY] {
            let v = with(&args, 2, value, &|i| rc(i) == (s - 1, 3));
            agrees_nan_for_nan(&p, &v, &format!("merged heads, {value} in V's last row"));
        }
    }
}

#[test]
fn infinities_and_nans_where_the_mask_hides_them_stay_exact() {
    for (b, h, s, d) in [(1, 2, 40, 64), (1, 1, 27, 80)] {
        special_values(b, h, s, d);
    }
}

/// Infinities and NaNs in attention's products' operands where the mask hides them (and
/// where it does not), for heads of `[s, d]`.
fn special_values(b: usize, h: usize, s: usize, d: usize) {
    let p = probabilities(b, h, s, d);
    let g = score_gradient(b, h, s, d);
    let (pf, gf) = (
        kiln_ir::parse_func_text(&p).unwrap(),
        kiln_ir::parse_func_text(&g).unwrap(),
    );
    let (pa, ga) = (random_args(&pf, 3), random_args(&gf, 4));
    // Element (row, column) of a `[.., rows, cols]` operand at flat index `i`.
    let rc = |i: usize, rows: usize, cols: usize| ((i / cols) % rows, i % cols);
    for value in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        // The last key's value, which only the last query sees: every other row of P V
        // multiplies it by a masked zero.
        let v = with(&pa, 2, value, &|i| rc(i, s, d) == (s - 1, 3));
        agrees_nan_for_nan(&p, &v, &format!("{value} in V's last row"));
        // The output's gradient's first row, which Pᵀ dO multiplies by the first query's
        // probabilities only (zero for every key but the first).
        let o = with(&pa, 3, value, &|i| rc(i, s, d).0 == 0 && i % d == 5);
        agrees_nan_for_nan(&p, &o, &format!("{value} in dO's first row"));
        // A key late in the sequence: its scores reach the masked triangle of the earlier
        // queries only.
        let k = with(&pa, 1, value, &|i| rc(i, s, d) == (s - 2, 1));
        agrees_nan_for_nan(&p, &k, &format!("{value} in K's row {}", s - 2));
        // A query: its row of P is NaN, masked part included.
        let q = with(&pa, 0, value, &|i| rc(i, s, d) == (7, 0));
        agrees_nan_for_nan(&p, &q, &format!("{value} in Q's row 7"));
        // The keys and queries the scores' gradient multiplies: the last key only by masked
        // zeros of the rows before it, the first query only by the first row's.
        let k = with(&ga, 1, value, &|i| rc(i, s, d) == (s - 1, 2));
        agrees_nan_for_nan(&g, &k, &format!("{value} in K's last row (dS K)"));
        let q = with(&ga, 2, value, &|i| rc(i, s, d) == (0, 4));
        agrees_nan_for_nan(&g, &q, &format!("{value} in Q's first row (dSᵀ Q)"));
        // The masked part of the gradient itself: selected away, zeros all the same.
        let m = with(&ga, 0, value, &|i| {
            let (r, c) = rc(i, s, s);
            c > r
        });
        agrees_nan_for_nan(&g, &m, &format!("{value} above the diagonal of G"));
    }
}

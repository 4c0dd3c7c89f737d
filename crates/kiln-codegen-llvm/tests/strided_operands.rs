//! Matrix products reading their operands in place through strides (`kiln_kernel::ir::Strides`),
//! and storing their results through strides (`kiln_kernel::ir::Store`): transposes, reshapes
//! and slices that only lay an operand or a result out take no kernel, and the products agree
//! with the reference, through the kernel cache and the JIT alike.

mod common;

use common::agrees_cached_and_jit;
use kiln_ir::Op;
use kiln_kernel::ir::Schedule;

/// How many kernels the CPU gives `src`, and how many of them are layouts (transposes,
/// reshapes, slices) of their own: loop nests (a layout's instruction may hold the GEMM that
/// stores a product through strides into its buffer).
fn kernels(src: &str) -> (usize, usize) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let (g, fused) = kiln_kernel::pipeline::lowered_for_printing(&f, &common::env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    let own = |i: &usize| fused.kernels[*i].is_some();
    let all = (0..g.insts.len()).filter(own).count();
    let layouts = (0..g.insts.len())
        .filter(|&i| {
            fused.kernels[i]
                .as_ref()
                .is_some_and(|k| k.schedule == Schedule::Nest)
        })
        .filter(|&i| {
            matches!(
                g.insts[i].op,
                Op::Transpose { .. } | Op::Reshape {} | Op::Slice { .. }
            )
        })
        .count();
    (all, layouts)
}

/// Attention's heads split out of one projection `[b, s, 3 h d]` (queries, keys, values side
/// by side), scores `q kᵀ` scaled and softmaxed, times the values, merged back to `[b, s, h d]`.
fn heads(b: usize, s: usize, h: usize, d: usize) -> String {
    let w = h * d;
    let slice = |i: usize, v: usize, start: usize| {
        format!(
            "  %{i} = slice %{v} {{start_indices = [0, 0, {start}], limit_indices = [{b}, {s}, {}], strides = [1, 1, 1]}} : f32[{b},{s},{w}]\n",
            start + w
        )
    };
    let split = |i: usize, v: usize| format!("  %{i} = reshape %{v} : f32[{b},{s},{h},{d}]\n");
    let mut t = format!(
        "func @main(%0: f32[{b},{s},{}]) -> f32[{b},{s},{w}] {{\n",
        3 * w
    );
    t += &slice(1, 0, 0);
    t += &split(2, 1);
    t += &format!("  %3 = transpose %2 {{permutation = [0, 2, 1, 3]}} : f32[{b},{h},{s},{d}]\n");
    t += &slice(4, 0, w);
    t += &split(5, 4);
    t += &format!("  %6 = transpose %5 {{permutation = [0, 2, 3, 1]}} : f32[{b},{h},{d},{s}]\n");
    t += &format!(
        "  %7 = dot_general %3, %6 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : f32[{b},{h},{s},{s}]\n"
    );
    t += "  %8 = constant {value = -inf} : f32[]\n";
    t += &format!("  %9 = reduce %7, %8 {{dimensions = [3], kind = max}} : f32[{b},{h},{s}]\n");
    t += &format!(
        "  %10 = broadcast_in_dim %9 {{broadcast_dimensions = [0, 1, 2]}} : f32[{b},{h},{s},{s}]\n"
    );
    t += &format!("  %11 = subtract %7, %10 : f32[{b},{h},{s},{s}]\n");
    t += &format!("  %12 = exponential %11 : f32[{b},{h},{s},{s}]\n");
    t += "  %13 = constant {value = 0.0} : f32[]\n";
    t += &format!("  %14 = reduce %12, %13 {{dimensions = [3], kind = add}} : f32[{b},{h},{s}]\n");
    t += &format!(
        "  %15 = broadcast_in_dim %14 {{broadcast_dimensions = [0, 1, 2]}} : f32[{b},{h},{s},{s}]\n"
    );
    t += &format!("  %16 = divide %12, %15 : f32[{b},{h},{s},{s}]\n");
    t += &slice(17, 0, 2 * w);
    t += &split(18, 17);
    t += &format!("  %19 = transpose %18 {{permutation = [0, 2, 1, 3]}} : f32[{b},{h},{s},{d}]\n");
    t += &format!(
        "  %20 = dot_general %16, %19 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : f32[{b},{h},{s},{d}]\n"
    );
    t += &format!("  %21 = transpose %20 {{permutation = [0, 2, 1, 3]}} : f32[{b},{s},{h},{d}]\n");
    t += &format!("  %22 = reshape %21 : f32[{b},{s},{w}]\n  return %22\n}}\n");
    t
}

/// The products of attention's backward pass, their operands laid out by transposes: the
/// output's gradient `[b, s, h d]` split into heads and transposed as A (`dOᵀ P`, A stored
/// by columns), the scores' gradient transposed within each head as A (`dSᵀ Q`), and the heads
/// permuted across the batch (`[h, b, s, d]` read as `[b, h, s, d]`) as B.
fn backward(b: usize, s: usize, h: usize, d: usize) -> String {
    let w = h * d;
    format!(
        "func @main(%0: f32[{b},{s},{w}], %1: f32[{b},{h},{s},{s}], %2: f32[{h},{b},{s},{d}]) -> (f32[{b},{h},{d},{s}], f32[{b},{h},{s},{d}]) {{
  %3 = reshape %0 : f32[{b},{s},{h},{d}]
  %4 = transpose %3 {{permutation = [0, 2, 3, 1]}} : f32[{b},{h},{d},{s}]
  %5 = dot_general %4, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : f32[{b},{h},{d},{s}]
  %6 = transpose %1 {{permutation = [0, 1, 3, 2]}} : f32[{b},{h},{s},{s}]
  %7 = transpose %2 {{permutation = [1, 0, 2, 3]}} : f32[{b},{h},{s},{d}]
  %8 = dot_general %6, %7 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : f32[{b},{h},{s},{d}]
  return %5, %8
}}
"
    )
}

/// A product of strided slices: every other row of A (rows twice as far apart) from row 1,
/// and B's columns from column 3 of a wider matrix; and one whose slice steps along A's rows'
/// elements, which no stride of the GEMM describes (its slice keeps a kernel).
fn slices(m: usize, k: usize, n: usize) -> String {
    format!(
        "func @main(%0: f32[{},{k}], %1: f32[{k},{}], %2: f32[{m},{}]) -> (f32[{m},{n}], f32[{m},{n}]) {{
  %3 = slice %0 {{start_indices = [1, 0], limit_indices = [{}, {k}], strides = [2, 1]}} : f32[{m},{k}]
  %4 = slice %1 {{start_indices = [0, 3], limit_indices = [{k}, {}], strides = [1, 1]}} : f32[{k},{n}]
  %5 = dot_general %3, %4 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[{m},{n}]
  %6 = slice %2 {{start_indices = [0, 0], limit_indices = [{m}, {}], strides = [1, 2]}} : f32[{m},{k}]
  %7 = dot_general %6, %4 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[{m},{n}]
  return %5, %7
}}
",
        2 * m + 1,
        n + 5,
        2 * k,
        2 * m + 1,
        n + 3,
        2 * k,
    )
}

/// Heads' outputs `[b, h, s, d]` (probabilities times values) merged back into `[b, s, h d]`
/// and projected; with `layout` another layout of the product than the merge (returned as
/// well), which no strides of its rows describe or which leaves the product a second reader.
fn merged(b: usize, s: usize, h: usize, d: usize, layout: Option<&str>) -> String {
    let w = h * d;
    let (extra_ty, extra) = match layout {
        None => (String::new(), String::new()),
        Some(l) => (
            format!(", {}", l.rsplit(": ").next().unwrap_or_default()),
            format!("  {l}\n"),
        ),
    };
    let ret = if layout.is_some() { "%6, %7" } else { "%6" };
    format!(
        "func @main(%0: f32[{b},{h},{s},{s}], %1: f32[{b},{h},{s},{d}], %2: f32[{w},{w}]) -> (f32[{b},{s},{w}]{extra_ty}) {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : f32[{b},{h},{s},{d}]
  %4 = transpose %3 {{permutation = [0, 2, 1, 3]}} : f32[{b},{s},{h},{d}]
  %5 = reshape %4 : f32[{b},{s},{w}]
  %6 = dot_general %5, %2 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [0]}} : f32[{b},{s},{w}]
{extra}  return {ret}
}}
"
    )
}

#[test]
fn merged_heads_are_stored_in_place() {
    // Widths of a whole vector, of a compact tile and odd ones; one head and several; rows
    // past a register tile; one batch.
    for (b, s, h, d) in [(2, 8, 2, 8), (3, 5, 3, 7), (2, 40, 4, 16), (1, 33, 2, 3)] {
        let src = merged(b, s, h, d, None);
        agrees_cached_and_jit(&src, 4);
        // The heads' product stores its result where the merge puts it: no layout kernel.
        assert_eq!(kernels(&src), (2, 0), "{src}");
    }
}

#[test]
fn results_no_strides_describe_keep_their_layout() {
    let (b, s, h, d) = (2, 9, 2, 5);
    // The product also read by a second layout, its transpose within each head: the merge
    // and the transpose keep their kernels.
    let transposed =
        format!("%7 = transpose %3 {{permutation = [0, 1, 3, 2]}} : f32[{b},{h},{d},{s}]");
    let src = merged(b, s, h, d, Some(&transposed));
    agrees_cached_and_jit(&src, 5);
    assert_eq!(kernels(&src), (4, 2), "{src}");
    // A transpose alone that puts each head's columns along the last dimension: they would
    // not be consecutive in its buffer.
    let src = format!(
        "func @main(%0: f32[{b},{h},{s},{s}], %1: f32[{b},{h},{s},{d}]) -> f32[{b},{s},{d},{h}] {{
  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : f32[{b},{h},{s},{d}]
  %3 = transpose %2 {{permutation = [0, 2, 3, 1]}} : f32[{b},{s},{d},{h}]
  return %3
}}
"
    );
    agrees_cached_and_jit(&src, 6);
    assert_eq!(kernels(&src), (2, 1), "{src}");
}

#[test]
fn attention_heads_are_read_in_place() {
    // Widths of a whole vector, of a compact tile and odd ones; one head and several; rows
    // past a register tile.
    for (b, s, h, d) in [(2, 8, 2, 8), (3, 5, 3, 7), (2, 40, 4, 16), (1, 33, 2, 3)] {
        let src = heads(b, s, h, d);
        agrees_cached_and_jit(&src, 1);
        let (all, layouts) = kernels(&src);
        // The projection's heads split for the queries, the keys and the values take no
        // kernel: only the merge back (a layout of the last product's result) does.
        assert_eq!(layouts, 1, "{src}");
        assert!(all <= 3, "{all} kernels:\n{src}");
    }
}

#[test]
fn backward_layouts_are_read_in_place() {
    for (b, s, h, d) in [(2, 8, 2, 8), (3, 5, 3, 7), (2, 24, 2, 16)] {
        let src = backward(b, s, h, d);
        agrees_cached_and_jit(&src, 2);
        assert_eq!(kernels(&src), (2, 0), "{src}");
    }
}

#[test]
fn strided_slices_are_read_in_place_where_strides_say() {
    for (m, k, n) in [(4, 8, 16), (7, 5, 3), (40, 33, 20)] {
        let src = slices(m, k, n);
        agrees_cached_and_jit(&src, 3);
        // The slice stepping along A's rows keeps its kernel.
        assert_eq!(kernels(&src), (3, 1), "{src}");
    }
}

/// Two heads' scores `q kᵀ` of `s` positions (width 16), their queries and keys read in
/// place from one projection `[1, s, 64]`, with no epilogue (which could make them a chain).
fn scores(s: usize) -> String {
    let head = |i: usize, v: usize, start: usize, perm: &str, shape: &str| {
        format!(
            "  %{i} = slice %0 {{start_indices = [0, 0, {start}], limit_indices = [1, {s}, {}], strides = [1, 1, 1]}} : f32[1,{s},32]\n  %{} = reshape %{i} : f32[1,{s},2,16]\n  %{v} = transpose %{} {{permutation = {perm}}} : f32[1,2,{shape}]\n",
            start + 32,
            i + 1,
            i + 1
        )
    };
    let mut t = format!("func @main(%0: f32[1,{s},64]) -> f32[1,2,{s},{s}] {{\n");
    t += &head(1, 3, 0, "[0, 2, 1, 3]", &format!("{s},16"));
    t += &head(4, 6, 32, "[0, 2, 3, 1]", &format!("16,{s}"));
    t += &format!(
        "  %7 = dot_general %3, %6 {{lhs_batching_dimensions = [0, 1], rhs_batching_dimensions = [0, 1], lhs_contracting_dimensions = [3], rhs_contracting_dimensions = [2]}} : f32[1,2,{s},{s}]\n  return %7\n}}\n"
    );
    t
}

/// Products of two panels of columns read A where it is stored rather than packing it
/// (`Blocking::a_in_place`): the heads' scores `q kᵀ` (queries by rows, through strides) and
/// the backward's `dOᵀ P` (A by columns, 40 rows: fewer would stream B instead), their
/// kernels calling no packing routine of A, and agreeing with the reference; three panels
/// still pack A.
#[test]
fn products_of_two_panels_read_a_in_place() {
    let host = kiln_codegen_llvm::cpu::host_target_info();
    let nr = if host.vector_bytes >= 64 { 64 } else { 16 };
    let panels = |n: usize| {
        let bl = kiln_kernel::gemm_schedule::Blocking::new(kiln_ir::DType::F32, &host, n, 512);
        n.div_ceil(bl.nr() as usize)
    };
    for (s, packs) in [(2 * nr, false), (3 * nr, true)] {
        assert_eq!(panels(s) > 2, packs, "{s} columns");
        for src in [scores(s), backward(2, s, 2, 40)] {
            let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
            // As the host compiles them (the unoptimized text is the portable target's).
            let ir = kiln_codegen_llvm::cpu::function_llvm_ir(&f, true, &common::env_options())
                .unwrap_or_else(|e| panic!("{src}: {e}"));
            assert!(ir.contains("@kiln_gemm_tile_"), "{src}");
            assert_eq!(
                ir.contains("@kiln_gemm_packa_"),
                packs,
                "{s} columns\n{src}"
            );
            agrees_cached_and_jit(&src, 4);
        }
    }
}

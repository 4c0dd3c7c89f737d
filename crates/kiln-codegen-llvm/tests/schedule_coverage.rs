//! Schedule coverage: one test per code path of the CPU backend. Each builds an input large
//! enough to take its path, asserts through the compiled executable's
//! [`CpuExecutable::kernel_paths`] that the path was taken, and compares every output with the
//! reference interpreter under `kiln_reference::accuracy`'s bounds. A change of a threshold
//! that moves the input off its path fails the test rather than quietly testing another path.
//! The table in `docs/reliability.md` maps each path to its test here and to the broader tests
//! elsewhere.

mod common;

use common::{attention_text, compiled_whole, env_options, random_args, softmax_of_product};
use kiln_codegen_llvm::cpu::{CpuExecutable, GemmBlocking, KernelPath};

/// Compiles `src` for this CPU, asserts that some kernel satisfies `took` (the path under test,
/// named `path`), runs it on random arguments from `seed` and compares with the reference.
/// Returns the paths of all kernels.
fn covers(path: &str, src: &str, seed: u64, took: impl Fn(&KernelPath) -> bool) -> Vec<KernelPath> {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let exe = CpuExecutable::compile_with_options(&f, &[], &env_options())
        .unwrap_or_else(|e| panic!("{src}: {e}"));
    compiled_whole(&exe).unwrap_or_else(|e| panic!("{src}: {e}"));
    let paths = exe.kernel_paths().to_vec();
    let listed: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
    assert!(
        paths.iter().any(&took),
        "{path}: no kernel took the path; the kernels:\n{}\n{src}",
        listed.join("\n")
    );
    let args = random_args(&f, seed);
    let got = exe.run(&args).unwrap_or_else(|e| panic!("{path}: {e}"));
    common::check(&f, &args, &got).unwrap_or_else(|e| panic!("{path}: {e}\n{src}"));
    println!("{path}: {}", listed.join(" | "));
    paths
}

/// `[b, m, k] x [b, k, n]` in `dt`.
fn product(dt: &str, (b, m, k, n): (usize, usize, usize, usize)) -> String {
    format!(
        "func @main(%0: {dt}[{b},{m},{k}], %1: {dt}[{b},{k},{n}]) -> {dt}[{b},{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : {dt}[{b},{m},{n}]\n  return %2\n}}\n"
    )
}

fn gemm(p: &KernelPath, g: GemmBlocking) -> bool {
    p.gemm == Some(g)
}

#[test]
fn gemm_plain_blocking() {
    // More rows than columns, batched or with more panels than a product reading A in place
    // has: blocks of rows split across threads.
    for (dt, shape) in [("f32", (2, 300, 200, 150)), ("f64", (1, 150, 70, 130))] {
        covers("GEMM, plain blocking", &product(dt, shape), 1, |p| {
            gemm(p, GemmBlocking::Plain) && p.threads
        });
    }
}

#[test]
fn gemm_split_columns() {
    // One batch, few rows, many columns: threads split the columns in panels.
    for (dt, shape) in [("f32", (1, 40, 300, 1000)), ("f64", (1, 36, 70, 250))] {
        covers("GEMM, split columns", &product(dt, shape), 2, |p| {
            gemm(p, GemmBlocking::SplitColumns) && p.threads
        });
    }
}

#[test]
fn gemm_split_columns_reading_a_in_place() {
    // As many rows as columns, A read in place over a few panels and small enough to stay in
    // the level 2 cache: the threads split the panels, so that each packs only its part of B
    // (4 panels of 64 columns with 512-bit vectors; 4 of 16 with 256-bit ones).
    let took: Vec<bool> = [(1, 256, 256, 256), (1, 64, 256, 64)]
        .into_iter()
        .map(|shape| {
            let paths = covers("GEMM", &product("f32", shape), 3, |p| p.gemm.is_some());
            paths
                .iter()
                .any(|p| gemm(p, GemmBlocking::SplitColumns) && p.threads)
        })
        .collect();
    assert!(
        took.contains(&true),
        "no product split its columns: {took:?}"
    );
}

#[test]
fn gemm_tail_tiles() {
    // A block's last rows, fewer than a tile's, on the shorter tail tiles: one matrix of every
    // row count from 33 to 47 (past the streaming products' 32, so that each count mod the
    // 14-row, 8-row and 6-row tiles comes up), A by rows, by columns and in place (a few
    // panels), batched rows split mid-batch, and f64.
    let product_at = |m: usize, a_trans: bool, n: usize| {
        let (a, contract) = if a_trans {
            (format!("f32[260,{m}]"), 0)
        } else {
            (format!("f32[{m},260]"), 1)
        };
        format!(
            "func @main(%0: {a}, %1: f32[260,{n}]) -> f32[{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [{contract}], rhs_contracting_dimensions = [0]}} : f32[{m},{n}]\n  return %2\n}}\n"
        )
    };
    for m in 33..48 {
        covers("GEMM, tail tiles", &product_at(m, false, 300), 12, |p| {
            p.gemm.is_some() && p.tail_tiles
        });
    }
    for (m, n) in [(37, 300), (45, 100), (43, 1000)] {
        covers(
            "GEMM, tail tiles (A by columns)",
            &product_at(m, true, n),
            13,
            |p| p.gemm.is_some() && p.tail_tiles,
        );
    }
    for (dt, shape) in [("f32", (3, 37, 260, 300)), ("f64", (2, 41, 70, 90))] {
        covers("GEMM, tail tiles (batched)", &product(dt, shape), 14, |p| {
            gemm(p, GemmBlocking::Plain) && p.tail_tiles && p.threads
        });
    }
}

#[test]
fn gemm_streaming_b() {
    // A few rows per matrix: B read where it is stored, nothing packed. One row by many
    // columns (threads split them; a column tail narrower than a vector), batched rows split
    // mid-batch, A stored transposed, a bias and a ReLU in the epilogue, and a softmax over the
    // rows (one block of whole rows); f32 and f64.
    for (dt, shape) in [("f32", (1, 1, 700, 1003)), ("f64", (3, 5, 70, 250))] {
        covers("GEMM, streaming B", &product(dt, shape), 6, |p| {
            gemm(p, GemmBlocking::Streamed) && p.threads
        });
    }
    let by_columns = "func @main(%0: f32[300,7], %1: f32[300,500], %2: f32[500]) -> f32[7,500] {
  %3 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [0]} : f32[7,500]
  %4 = broadcast_in_dim %2 {broadcast_dimensions = [1]} : f32[7,500]
  %5 = add %3, %4 : f32[7,500]
  %6 = constant {value = 0.0} : f32[]
  %7 = broadcast_in_dim %6 {broadcast_dimensions = []} : f32[7,500]
  %8 = maximum %5, %7 : f32[7,500]
  return %8
}
";
    let paths = covers(
        "GEMM, streaming B (A by columns, epilogue)",
        by_columns,
        7,
        |p| gemm(p, GemmBlocking::Streamed),
    );
    assert_eq!(paths.len(), 1, "one kernel: {paths:?}");
    let src = softmax_of_product(2, 3, 40, 300, true);
    covers("GEMM, streaming B (row epilogue)", &src, 8, |p| {
        gemm(p, GemmBlocking::Streamed)
    });
    // Rows in groups (two tiles of 6 rows, f32 on AVX-512, past the 8 of a tile), with a
    // partial group where threads split the rows mid-batch; 33 rows pack B.
    covers(
        "GEMM, streaming B in groups",
        &product("f32", (1, 12, 300, 700)),
        9,
        |p| gemm(p, GemmBlocking::Streamed),
    );
    covers(
        "GEMM, streaming B in groups",
        &product("f64", (5, 19, 40, 70)),
        11,
        |p| gemm(p, GemmBlocking::Streamed) && p.threads,
    );
    covers(
        "GEMM, 33 rows pack",
        &product("f32", (1, 33, 700, 1003)),
        9,
        |p| gemm(p, GemmBlocking::SplitColumns),
    );
    // B stored transposed (`x wᵀ`, a linear layer's weights by output): dot products, with
    // contractions that leave steps past the last whole vector, and none that does.
    for (dt, shape) in [
        ("f32", (1, 1, 700, 1003)),
        ("f64", (3, 5, 70, 250)),
        ("f32", (2, 8, 64, 40)),
    ] {
        covers(
            "GEMM, streaming B by dot products",
            &product_bt(dt, shape),
            10,
            |p| gemm(p, GemmBlocking::Streamed),
        );
    }
}

/// `[b, m, k] x [b, n, k]ᵀ` in `dt`: B stored transposed.
fn product_bt(dt: &str, (b, m, k, n): (usize, usize, usize, usize)) -> String {
    format!(
        "func @main(%0: {dt}[{b},{m},{k}], %1: {dt}[{b},{n},{k}]) -> {dt}[{b},{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {dt}[{b},{m},{n}]\n  return %2\n}}\n"
    )
}

#[test]
fn gemm_whole_rows_for_a_row_epilogue() {
    // A softmax over the product's rows, in the GEMM's epilogue: blocks of whole rows (with
    // the softmax's row cache).
    let src = softmax_of_product(3, 37, 20, 50, true);
    let paths = covers("GEMM, whole rows (row epilogue)", &src, 3, |p| {
        gemm(p, GemmBlocking::WholeRows)
    });
    assert_eq!(paths.len(), 1, "one kernel: {paths:?}");
}

#[test]
fn gemm_chained_products() {
    // A row epilogue that is not a softmax (a logistic): the second product multiplies each
    // block of the first's rows while it is in cache, over whole rows.
    let src = attention_text("f32", (2, 130, 600, 16, 24), false, false)
        .replace("exponential", "logistic");
    let paths = covers("GEMM, chained", &src, 4, |p| gemm(p, GemmBlocking::Chained));
    assert_eq!(paths.len(), 1, "one kernel: {paths:?}");
}

#[test]
fn gemm_online_softmax_chain() {
    // Attention: the softmax runs online over blocks of keys, chained to the product with V;
    // f32 and f64, V stored transposed.
    for (dt, shape, v_trans) in [
        ("f32", (1, 50, 512, 64, 64), false),
        ("f64", (2, 9, 700, 8, 20), true),
    ] {
        let src = attention_text(dt, shape, v_trans, false);
        let paths = covers("GEMM, online softmax chain", &src, 5, |p| {
            gemm(p, GemmBlocking::Online)
        });
        assert_eq!(paths.len(), 1, "one kernel: {paths:?}");
    }
}

#[test]
fn winograd_convolution() {
    // 3 x 3, 32 input and output features or more: Winograd's F(4x4, 3x3), whose transforms
    // and product replace the convolution (no convolution kernel is left).
    let src = common::convolution(
        "f32[2,64,13,11]",
        "f32[40,64,3,3]",
        "f32[2,40,13,11]",
        "window_strides = [1, 1], lhs_dilation = [1, 1], rhs_dilation = [1, 1], feature_group_count = 1, padding = [[1, 1], [1, 1]], input_dims = [0, 1, 2, 3], kernel_dims = [0, 1, 2, 3], output_dims = [0, 1, 2, 3]",
    );
    let paths = covers("Winograd convolution", &src, 6, |p| p.gemm.is_some());
    assert!(
        paths.iter().all(|p| p.op != "convolution"),
        "a convolution kernel is left: {paths:?}"
    );
    // 16 input features: the direct convolution (the implicit GEMM) instead, whose tile (40
    // output features: one panel) reads the input inline and takes no tail tiles.
    let direct = src
        .replace("f32[2,64,13,11]", "f32[2,16,13,11]")
        .replace("f32[40,64,3,3]", "f32[40,16,3,3]");
    covers("direct convolution", &direct, 6, |p| {
        p.op == "convolution" && p.gemm.is_some() && !p.tail_tiles
    });
}

#[test]
fn streaming_stores() {
    // Past this host's streaming size (32 MiB of output or more) written once, rows not a
    // multiple of a cache line: streaming stores, split across threads.
    let n = common::past_streaming(4, 17);
    let src = format!(
        "func @main(%0: f32[{n}]) -> f32[{n}] {{\n  %1 = constant {{value = 1.5}} : f32[]\n  %2 = broadcast_in_dim %1 {{broadcast_dimensions = []}} : f32[{n}]\n  %3 = multiply %0, %2 : f32[{n}]\n  %4 = tanh %3 : f32[{n}]\n  return %4\n}}\n"
    );
    covers("streaming stores", &src, 7, |p| p.stream && p.threads);
    // Below the threshold: ordinary stores.
    let small = src.replace(&n.to_string(), "1000003");
    let paths = covers("no streaming stores", &small, 7, |p| !p.stream);
    assert!(paths.iter().all(|p| !p.stream), "{paths:?}");
}

#[test]
fn row_caches() {
    // A softmax's sum keeps each exp(x - max) for the outputs; rows up to 16 KiB.
    for (dt, shape) in [("f32", [5, 17]), ("f64", [3, 2048]), ("f32", [2, 4096])] {
        let src = common::softmax_text(dt, &shape);
        covers("row caches", &src, 8, |p| p.row_caches > 0);
    }
    // Longer rows recompute the exponential.
    let src = common::softmax_text("f32", &[2, 4097]);
    let paths = covers("no row cache", &src, 8, |_| true);
    assert!(paths.iter().all(|p| p.row_caches == 0), "{paths:?}");
}

#[test]
fn column_strips() {
    // Sums down columns: the innermost loop runs in strips with an accumulator per column, a
    // remainder past the last strip, split across threads.
    for (ty, kind, init) in [("f32", "add", "0.0"), ("f64", "max", "-inf")] {
        let src = format!(
            "func @main(%0: {ty}[300,530], %1: {ty}[530]) -> {ty}[530] {{\n  %2 = constant {{value = {init}}} : {ty}[]\n  %3 = reduce %0, %2 {{dimensions = [0], kind = {kind}}} : {ty}[530]\n  %4 = add %3, %1 : {ty}[530]\n  return %4\n}}\n"
        );
        covers("column strips", &src, 9, |p| p.strips);
    }
}

#[test]
fn transposing_tiles() {
    for src in [
        "func @main(%0: f32[370,500]) -> f32[500,370] {\n  %1 = transpose %0 {permutation = [1, 0]} : f32[500,370]\n  return %1\n}\n",
        "func @main(%0: f64[33,16,20]) -> f64[16,20,33] {\n  %1 = transpose %0 {permutation = [1, 2, 0]} : f64[16,20,33]\n  %2 = exponential %1 : f64[16,20,33]\n  return %2\n}\n",
    ] {
        covers("transposing tiles", src, 10, |p| p.tile);
    }
}

#[test]
fn guard_cuts() {
    // A pad of H and W (NHWC) and a concatenation along the rows: the loops run in segments
    // where each guard is decided.
    for src in [
        "func @main(%0: f32[2,9,11,16]) -> f32[2,11,16,16] {\n  %1 = constant {value = 0.5} : f32[]\n  %2 = pad %0, %1 {edge_padding_low = [0, 1, 2, 0], edge_padding_high = [0, 1, 3, 0], interior_padding = [0, 0, 0, 0]} : f32[2,11,16,16]\n  return %2\n}\n",
        "func @main(%0: f32[7,300], %1: f32[40,300]) -> f32[47,300] {\n  %2 = exponential %0 : f32[7,300]\n  %3 = tanh %1 : f32[40,300]\n  %4 = concatenate %2, %3 {dimension = 0} : f32[47,300]\n  return %4\n}\n",
    ] {
        covers("guard cuts", src, 11, |p| p.guard_cuts);
    }
}

#[test]
fn concurrent_kernels() {
    // Four independent kernels, each too small to split across threads but large enough to
    // run beside the others (between kiln_runtime's CONCURRENT_WORK and PARALLEL_WORK), of
    // different lengths so that fusion does not merge them into one multi-output kernel.
    let ns = [58_000, 59_000, 60_000, 61_000];
    let ops = ["tanh", "exponential", "logistic", "negate"];
    let params: Vec<String> = ns
        .iter()
        .enumerate()
        .map(|(i, n)| format!("%{i}: f32[{n}]"))
        .collect();
    let outs: Vec<String> = ns.iter().map(|n| format!("f32[{n}]")).collect();
    let mut body = String::new();
    for (i, (op, n)) in ops.iter().zip(ns).enumerate() {
        body.push_str(&format!("  %{} = {op} %{i} : f32[{n}]\n", 4 + i));
    }
    let src = format!(
        "func @main({}) -> ({}) {{\n{body}  return %4, %5, %6, %7\n}}\n",
        params.join(", "),
        outs.join(", ")
    );
    let paths = covers("concurrent kernels", &src, 12, |p| p.concurrent);
    assert!(
        paths.iter().filter(|p| p.concurrent).count() >= 2,
        "{paths:?}"
    );
    assert!(paths.iter().all(|p| !p.threads), "{paths:?}");
}

#[test]
fn thread_splits() {
    // An elementwise kernel and a row reduction with enough work: rows split across threads.
    for src in [
        "func @main(%0: f32[512,1024]) -> f32[512,1024] {\n  %1 = tanh %0 : f32[512,1024]\n  return %1\n}\n",
        "func @main(%0: f64[2000,100]) -> f64[2000] {\n  %1 = constant {value = 0.0} : f64[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f64[2000]\n  return %2\n}\n",
    ] {
        covers("thread splits", src, 13, |p| p.threads && p.gemm.is_none());
    }
    // Too little work: one thread.
    let src =
        "func @main(%0: f32[64,64]) -> f32[64,64] {\n  %1 = tanh %0 : f32[64,64]\n  return %1\n}\n";
    let paths = covers("one thread", src, 13, |p| !p.threads);
    assert!(paths.iter().all(|p| !p.threads), "{paths:?}");
}

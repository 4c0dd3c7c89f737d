//! Scatters on the emulator: one whose update dimensions address whole output dimensions by
//! themselves (an embedding's gradient, a batched scatter) runs a thread per position of
//! those dimensions, over several blocks where they are long, and any other on one thread;
//! every one against the reference, and an integer or `replace` scatter with repeated targets
//! (where the order of the updates shows) equal to the reference's element for element.

use kiln_ir::random::{Rng, random_literal};
use kiln_ir::{DType, Literal};
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::run_plan;

mod planned;
use planned::planned;

/// `scatter` of `updates` (`[n, cols]`) into the rows `idx` (`[n, 1]`) of an operand
/// `[rows, cols]`: an embedding's gradient.
fn rows_text(dt: &str, rows: usize, cols: usize, n: usize, kind: &str) -> String {
    format!(
        "func @main(%0: {dt}[{rows},{cols}], %1: i32[{n},1], %2: {dt}[{n},{cols}]) -> {dt}[{rows},{cols}] {{
  %3 = scatter %0, %1, %2 {{update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = {kind}}} : {dt}[{rows},{cols}]
  return %3
}}
"
    )
}

/// A batched scatter: example `b` of `updates` (`[batch, n]`) into its own row of an operand
/// `[batch, cols]` at the columns `idx` (`[batch, n, 1]`).
fn batched_text(dt: &str, batch: usize, cols: usize, n: usize) -> String {
    format!(
        "func @main(%0: {dt}[{batch},{cols}], %1: i32[{batch},{n},1], %2: {dt}[{batch},{n}]) -> {dt}[{batch},{cols}] {{
  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1], index_vector_dim = 2, kind = add, input_batching_dims = [0], scatter_indices_batching_dims = [0]}} : {dt}[{batch},{cols}]
  return %3
}}
"
    )
}

/// A scatter of single elements into a vector: no dimension of its own, one thread.
fn vector_text(dt: &str, len: usize, n: usize) -> String {
    format!(
        "func @main(%0: {dt}[{len}], %1: i32[{n},1], %2: {dt}[{n}]) -> {dt}[{len}] {{
  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = add}} : {dt}[{len}]
  return %3
}}
"
    )
}

/// Arguments of `f`: floats from the generator, indices in `0..range` (so that they repeat),
/// one of them out of bounds when `stray` (that update is dropped).
fn args(f: &kiln_ir::Func, seed: u64, range: usize, stray: bool) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| {
            if t.dtype == DType::I32 {
                let mut v: Vec<i64> = (0..t.numel()).map(|_| rng.below(range) as i64).collect();
                if stray {
                    v[t.numel() / 2] = range as i64 + 3;
                }
                Literal::from_i64s(t.clone(), &v).unwrap()
            } else {
                random_literal(&mut rng, t)
            }
        })
        .collect()
}

#[test]
fn scatters_run_a_thread_per_own_position_in_order() {
    let target = TargetInfo::h200();
    // (what, program, index range, threads the scatter runs on, exact).
    let cases = [
        (
            "embedding f32",
            rows_text("f32", 7, 5, 40, "add"),
            7,
            5,
            false,
        ),
        (
            "embedding f32, long rows",
            rows_text("f32", 30, 700, 200, "add"),
            30,
            700,
            false,
        ),
        (
            "embedding i32",
            rows_text("i32", 6, 33, 50, "add"),
            6,
            33,
            true,
        ),
        (
            "embedding f32 replace",
            rows_text("f32", 4, 9, 30, "replace"),
            4,
            9,
            true,
        ),
        (
            "embedding f64 max",
            rows_text("f64", 5, 3, 20, "max"),
            5,
            3,
            true,
        ),
        ("batched f32", batched_text("f32", 3, 11, 25), 11, 3, false),
        ("batched i32", batched_text("i32", 300, 4, 6), 4, 300, true),
        (
            "embedding f32, no rows",
            rows_text("f32", 4, 0, 6, "add"),
            4,
            0,
            false,
        ),
        ("vector f32", vector_text("f32", 9, 30), 9, 1, false),
        ("vector i32", vector_text("i32", 5, 40), 5, 1, true),
    ];
    let mut failures = Vec::new();
    for (i, (what, src, range, threads, exact)) in cases.iter().enumerate() {
        let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{what}: {e}\n{src}"));
        let plan = planned(&f, &target).unwrap_or_else(|e| panic!("{what}: {e}"));
        let launches: Vec<_> = plan
            .kernel_steps()
            .flat_map(|k| k.program.launches.iter())
            .filter(|l| l.kind == MapKind::Scatter)
            .collect();
        if launches.len() != 1 {
            failures.push(format!("{what}: {} scatter launches", launches.len()));
            continue;
        }
        let s = launches[0];
        let ran = if *threads == 1 { 1 } else { s.grid * s.block };
        // At least one block, even for no threads.
        if ran < *threads || (*threads > 1 && ran >= threads + s.block) || s.grid == 0 {
            failures.push(format!(
                "{what}: grid {} x block {} for {threads} threads",
                s.grid, s.block
            ));
        }
        for stray in [false, true] {
            let a = args(&f, i as u64, *range, stray);
            let refs: Vec<&Literal> = a.iter().collect();
            let got = match run_plan(&plan, &refs) {
                Ok(got) => got,
                Err(e) => {
                    failures.push(format!("{what}: {e}"));
                    continue;
                }
            };
            if let Err(e) = kiln_reference::accuracy::check_outputs(&f, &a, &got) {
                failures.push(format!("{what} (stray index {stray}): {e}"));
            }
            if *exact {
                let want = kiln_reference::eval(&f, &a).unwrap();
                if want != got {
                    failures.push(format!(
                        "{what} (stray index {stray}): not the reference's result"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

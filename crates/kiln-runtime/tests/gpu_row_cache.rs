//! Row caches of warp- and block-per-row kernels on the emulator: softmax, log-softmax, a layer
//! norm with scale and shift and a cross-entropy loss, in every float dtype, with rows that fit
//! registers, fit only shared memory or fit neither, rows that are not a multiple of the
//! row's threads, a warp per row and a block per row; each under the H200's row caches, with
//! shared memory only and with none, against the reference, and bit for bit the same results
//! under all three (the reductions keep their order).

use kiln_ir::Literal;
use kiln_kernel::gpu::plan_print::plan_text;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::run_plan;

mod planned;
use planned::{planned, random_args};

/// A row program over `dt[rows, n]`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Softmax,
    LogSoftmax,
    LayerNorm,
    /// Cross-entropy against one-hot labels: `log Σ exp(x - max) + max - Σ x · y` per row.
    Loss,
}

fn text(op: Op, dt: &str, rows: usize, n: usize) -> String {
    let m = format!("{dt}[{rows},{n}]");
    let r = format!("{dt}[{rows}]");
    let head = |params: &str, out: &str| format!("func @main({params}) -> {out} {{\n");
    let max_and_sum = format!(
        "  %1 = constant {{value = -inf}} : {dt}[]
  %2 = reduce %0, %1 {{dimensions = [1], kind = max}} : {r}
  %3 = broadcast_in_dim %2 {{broadcast_dimensions = [0]}} : {m}
  %4 = subtract %0, %3 : {m}
  %5 = exponential %4 : {m}
  %6 = constant {{value = 0.0}} : {dt}[]
  %7 = reduce %5, %6 {{dimensions = [1], kind = add}} : {r}
"
    );
    match op {
        Op::Softmax => format!(
            "{}{max_and_sum}  %8 = broadcast_in_dim %7 {{broadcast_dimensions = [0]}} : {m}
  %9 = divide %5, %8 : {m}
  return %9
}}
",
            head(&format!("%0: {m}"), &m)
        ),
        Op::LogSoftmax => format!(
            "{}{max_and_sum}  %8 = log %7 : {r}
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0]}} : {m}
  %10 = subtract %4, %9 : {m}
  return %10
}}
",
            head(&format!("%0: {m}"), &m)
        ),
        Op::Loss => format!(
            "{}{max_and_sum}  %8 = log %7 : {r}
  %9 = add %8, %2 : {r}
  %10 = multiply %0, %11 : {m}
  %12 = reduce %10, %6 {{dimensions = [1], kind = add}} : {r}
  %13 = subtract %9, %12 : {r}
  return %13
}}
",
            head(&format!("%0: {m}, %11: {m}"), &r)
        ),
        Op::LayerNorm => {
            let v = format!("{dt}[{n}]");
            format!(
                "{}  %1 = constant {{value = 0.0}} : {dt}[]
  %2 = reduce %0, %1 {{dimensions = [1], kind = add}} : {r}
  %3 = constant {{value = {inv}}} : {dt}[]
  %4 = broadcast_in_dim %3 {{broadcast_dimensions = []}} : {r}
  %5 = multiply %2, %4 : {r}
  %6 = broadcast_in_dim %5 {{broadcast_dimensions = [0]}} : {m}
  %7 = subtract %0, %6 : {m}
  %8 = multiply %7, %7 : {m}
  %9 = reduce %8, %1 {{dimensions = [1], kind = add}} : {r}
  %10 = multiply %9, %4 : {r}
  %11 = rsqrt %10 : {r}
  %12 = broadcast_in_dim %11 {{broadcast_dimensions = [0]}} : {m}
  %13 = multiply %7, %12 : {m}
  %14 = broadcast_in_dim %20 {{broadcast_dimensions = [1]}} : {m}
  %15 = multiply %13, %14 : {m}
  %16 = broadcast_in_dim %21 {{broadcast_dimensions = [1]}} : {m}
  %17 = add %15, %16 : {m}
  return %17
}}
",
                head(&format!("%0: {m}, %20: {v}, %21: {v}"), &m),
                inv = 1.0 / n as f64
            )
        }
    }
}

/// The H200 with its row caches, with shared-memory caches only, and with none.
fn targets() -> [(&'static str, TargetInfo); 3] {
    let with = |registers: Option<usize>, shared: Option<usize>| {
        let mut t = TargetInfo::h200();
        let g = t.gpu.as_mut().expect("a GPU");
        g.row_registers = registers.unwrap_or(g.row_registers);
        g.row_shared_bytes = shared.unwrap_or(g.row_shared_bytes);
        t
    };
    [
        ("registers and shared memory", with(None, None)),
        ("shared memory only", with(Some(0), None)),
        ("no row caches", with(Some(0), Some(0))),
    ]
}

/// Whether the rows of `n` elements of `dt` a block holds (8 rows on warps below 4096, one
/// from there) fit the H200's 48 KiB for row caches, each element at least 4 bytes.
fn shared_fits(dt: &str, n: usize) -> bool {
    let held = if dt == "f64" { 8 } else { 4 };
    let rows = if n < 4096 { 8 } else { 1 };
    rows * n * held <= 48 << 10
}

#[test]
fn row_caches_agree_with_the_reference_and_with_rereading_bit_for_bit() {
    use Op::*;
    // (op, dtype, rows, n, where the H200's default target caches the row). A warp per row
    // below 4096 (threads 32, 8 rows per block), a block of 1024 threads per row from there.
    let cases = [
        (Softmax, "f32", 5, 300, "in registers, 10 slots"),
        (Softmax, "f16", 9, 1024, "in registers, 32 slots"),
        (Softmax, "bf16", 3, 200, "in registers, 7 slots"),
        (Softmax, "f64", 4, 500, "in registers, 16 slots"),
        (Softmax, "f64", 4, 700, "in shared memory"),
        (Softmax, "f32", 3, 1500, "in shared memory"),
        (Softmax, "f32", 2, 2000, "row cache: none"),
        (Softmax, "f32", 2, 5000, "in registers, 5 slots"),
        (Softmax, "bf16", 2, 4096, "in registers, 4 slots"),
        (LogSoftmax, "f32", 6, 500, "in registers, 16 slots"),
        (LogSoftmax, "bf16", 2, 1200, "in shared memory"),
        (LogSoftmax, "f32", 2, 6000, "in registers, 6 slots"),
        (LayerNorm, "f32", 6, 1000, "in registers, 32 slots"),
        (LayerNorm, "f16", 3, 1300, "in shared memory"),
        (LayerNorm, "f32", 2, 4500, "in registers, 5 slots"),
        (Loss, "f32", 7, 600, "in registers, 19 slots"),
        (Loss, "f64", 2, 5000, "in registers, 5 slots"),
    ];
    let mut failures = Vec::new();
    for (i, &(op, dt, rows, n, place)) in cases.iter().enumerate() {
        let src = text(op, dt, rows, n);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("{op:?}: {e}\n{src}"));
        let args = random_args(&f, i as u64);
        let mut first: Option<Vec<Literal>> = None;
        for (which, target) in targets() {
            let what = format!("{op:?} {dt}[{rows},{n}] with {which}");
            let plan = planned(&f, &target).unwrap_or_else(|e| panic!("{what}: {e}"));
            let printed = plan_text(&plan);
            let want = match which {
                "registers and shared memory" => place,
                "shared memory only" if shared_fits(dt, n) => "in shared memory",
                _ => "row cache: none",
            };
            if !printed.contains(want) {
                failures.push(format!("{what}: no `{want}` in\n{printed}"));
                continue;
            }
            let refs: Vec<&Literal> = args.iter().collect();
            let got = match run_plan(&plan, &refs) {
                Ok(got) => got,
                Err(e) => {
                    failures.push(format!("{what}: {e}"));
                    continue;
                }
            };
            if let Err(e) = kiln_reference::accuracy::check_outputs(&f, &args, &got) {
                failures.push(format!("{what}: {e}"));
            }
            match &first {
                None => first = Some(got),
                Some(before) if *before != got => {
                    failures.push(format!("{what}: other bits than with the row caches"))
                }
                Some(_) => {}
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! Scatters and select-and-scatters on the emulator. A scatter whose update dimensions
//! address whole output dimensions by themselves (an embedding's gradient, a batched scatter)
//! runs a thread per position of those dimensions, over several blocks where they are long;
//! any other a thread per output element scanning the updates in order where they are few,
//! else its updates sorted by target and a thread per element combining its run (one thread
//! only where the GPU sort cannot take them and the scan does not pay); a select-and-scatter
//! a thread per output element visiting the windows that cover it. Every one against the reference, and the
//! scans and select-and-scatters (with repeated targets, stray indices, ties and NaN
//! operands, where the order of the combinations shows) equal to the reference's result bit
//! for bit.

use kiln_ir::Literal;
use kiln_ir::random::{Rng, random_literal};
use kiln_kernel::gpu::ir::{GpuKernel, MapKind, Stmt};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::run_plan;

mod planned;
use planned::{indexed_args, planned};

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

/// A scatter of single elements into a vector: no dimension of its own, a thread per
/// output element.
fn vector_text(dt: &str, len: usize, n: usize) -> String {
    vector_kind_text(dt, len, n, "add")
}

fn vector_kind_text(dt: &str, len: usize, n: usize, kind: &str) -> String {
    format!(
        "func @main(%0: {dt}[{len}], %1: i32[{n},1], %2: {dt}[{n}]) -> {dt}[{len}] {{
  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = {kind}}} : {dt}[{len}]
  return %3
}}
"
    )
}

/// A scatter of single elements into a matrix `[rows, cols]` at index pairs (`[n, 2]`): no
/// update dimension addresses an output dimension alone.
fn pairs_text(dt: &str, rows: usize, cols: usize, n: usize, kind: &str) -> String {
    format!(
        "func @main(%0: {dt}[{rows},{cols}], %1: i32[{n},2], %2: {dt}[{n}]) -> {dt}[{rows},{cols}] {{
  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1, kind = {kind}}} : {dt}[{rows},{cols}]
  return %3
}}
"
    )
}

/// A scatter of rows `[n, 3]` into a matrix `[rows, cols]` at `(row, column)` pairs: its
/// window (3 columns) is narrower than the output's rows, so no dimension is its own.
fn window_text(dt: &str, rows: usize, cols: usize, n: usize) -> String {
    format!(
        "func @main(%0: {dt}[{rows},{cols}], %1: i32[{n},2], %2: {dt}[{n},3]) -> {dt}[{rows},{cols}] {{
  %3 = scatter %0, %1, %2 {{update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1, kind = add}} : {dt}[{rows},{cols}]
  return %3
}}
"
    )
}

#[test]
fn scatters_run_a_thread_per_own_position_or_element_in_order() {
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
        ("vector f32", vector_text("f32", 9, 30), 9, 9, false),
        ("vector i32", vector_text("i32", 5, 40), 5, 5, true),
    ];
    let mut failures = Vec::new();
    for (i, (what, src, range, threads, exact)) in cases.iter().enumerate() {
        let (f, plan) = parsed_and_planned(what, src, &target);
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
        let ran = s.grid * s.block;
        // At least one block, even for no threads.
        if one_thread(s)
            || ran < *threads
            || (*threads > 1 && ran >= threads + s.block)
            || s.grid == 0
        {
            failures.push(format!(
                "{what}: grid {} x block {} for {threads} threads",
                s.grid, s.block
            ));
        }
        for stray in [false, true] {
            let a = indexed_args(&f, i as u64, *range, stray);
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

/// Whether `l` runs on thread 0 alone (the sequential scatter: its body one `if` on the
/// thread's index).
fn one_thread(l: &GpuKernel) -> bool {
    matches!(l.body.as_slice(), [Stmt::If { .. }])
}

/// `f`'s launches of mapping `kind`.
fn launches_of(plan: &kiln_kernel::gpu::plan::DevicePlan, kind: MapKind) -> Vec<GpuKernel> {
    plan.kernel_steps()
        .flat_map(|k| k.program.launches.iter())
        .filter(|l| l.kind == kind)
        .cloned()
        .collect()
}

/// `src` parsed and planned for `target` (a case `what` of a test).
fn parsed_and_planned(
    what: &str,
    src: &str,
    target: &TargetInfo,
) -> (kiln_ir::Func, kiln_kernel::gpu::plan::DevicePlan) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{what}: {e}\n{src}"));
    let plan = planned(&f, target).unwrap_or_else(|e| panic!("{what}: {e}"));
    (f, plan)
}

/// [`bit_for_bit`] on arguments from `seed` with indices up to `range`, without and with
/// stray indices: the failures.
fn bit_for_bit_strays(
    what: &str,
    f: &kiln_ir::Func,
    plan: &kiln_kernel::gpu::plan::DevicePlan,
    (seed, range): (u64, usize),
) -> Vec<String> {
    [false, true]
        .into_iter()
        .filter_map(|stray| {
            let a = indexed_args(f, seed, range, stray);
            bit_for_bit(&format!("{what} (stray {stray})"), f, plan, &a)
        })
        .collect()
}

/// Runs `f` planned for `target` on `a` and compares with the reference bit for bit (the
/// bytes of every result); a failure's description, if any.
fn bit_for_bit(
    what: &str,
    f: &kiln_ir::Func,
    plan: &kiln_kernel::gpu::plan::DevicePlan,
    a: &[Literal],
) -> Option<String> {
    let refs: Vec<&Literal> = a.iter().collect();
    let got = match run_plan(plan, &refs) {
        Ok(got) => got,
        Err(e) => return Some(format!("{what}: {e}")),
    };
    let want = kiln_reference::eval(f, a).unwrap();
    if want.len() != got.len() {
        return Some(format!(
            "{what}: {} results, want {}",
            got.len(),
            want.len()
        ));
    }
    for (w, g) in want.iter().zip(&got) {
        if w.to_le_bytes() != g.to_le_bytes() {
            let first = (0..w.numel())
                .find(|&i| w.format_elem(i) != g.format_elem(i))
                .unwrap_or(0);
            return Some(format!(
                "{what}: not the reference's bits (element {first}: {} against {})",
                g.format_elem(first),
                w.format_elem(first)
            ));
        }
    }
    None
}

#[test]
fn scatters_without_own_dimensions_scan_their_updates_per_element_bit_for_bit() {
    let target = TargetInfo::h200();
    // (what, program, index range).
    let mut cases = Vec::new();
    for kind in ["add", "mul", "max", "min", "replace"] {
        for dt in ["f32", "bf16", "i32"] {
            cases.push((
                format!("vector {dt} {kind}"),
                vector_kind_text(dt, 11, 60, kind),
                11,
            ));
        }
    }
    cases.push((
        "pairs f32 add".into(),
        pairs_text("f32", 6, 5, 80, "add"),
        5,
    ));
    cases.push((
        "pairs f64 max".into(),
        pairs_text("f64", 4, 7, 50, "max"),
        4,
    ));
    cases.push((
        "pairs i32 replace".into(),
        pairs_text("i32", 3, 3, 40, "replace"),
        3,
    ));
    cases.push(("window f32".into(), window_text("f32", 5, 8, 30), 6));
    cases.push(("vector f32, long".into(), vector_text("f32", 700, 200), 700));
    let mut failures = Vec::new();
    for (i, (what, src, range)) in cases.iter().enumerate() {
        let (f, plan) = parsed_and_planned(what, src, &target);
        let launches = launches_of(&plan, MapKind::Scatter);
        let total: usize = f.param_types()[0].numel();
        match launches.as_slice() {
            [s] if !one_thread(s)
                && s.grid * s.block >= total
                && s.grid * s.block < total + s.block => {}
            [s] => failures.push(format!(
                "{what}: grid {} x block {} (one thread: {}) for {total} elements",
                s.grid,
                s.block,
                one_thread(s)
            )),
            l => failures.push(format!("{what}: {} scatter launches", l.len())),
        }
        failures.extend(bit_for_bit_strays(
            what,
            &f,
            &plan,
            (100 + i as u64, *range),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// More updates than a scan per element is worth: the updates' targets computed, sorted
/// (a block's network, the network over tiles, the radix sort, as their number calls for),
/// and a thread per element combining its run in order.
#[test]
fn scatters_with_many_updates_sort_them_by_target_bit_for_bit() {
    let target = TargetInfo::h200();
    let cases = [
        (
            "vector f32 add",
            vector_kind_text("f32", 300, 2000, "add"),
            300,
        ),
        (
            "vector bf16 add",
            vector_kind_text("bf16", 50, 1000, "add"),
            50,
        ),
        ("vector i32 mul", vector_kind_text("i32", 9, 600, "mul"), 9),
        (
            "vector f32 replace",
            vector_kind_text("f32", 700, 3000, "replace"),
            700,
        ),
        (
            "vector f64 min, two tiles",
            vector_kind_text("f64", 40, 6000, "min"),
            40,
        ),
        (
            "vector f32 add, radix",
            vector_kind_text("f32", 1000, 20000, "add"),
            1000,
        ),
        ("pairs f32 max", pairs_text("f32", 30, 20, 1500, "max"), 30),
        ("window f32", window_text("f32", 40, 8, 900), 40),
    ];
    let mut failures = Vec::new();
    for (i, (what, src, range)) in cases.iter().enumerate() {
        let (f, plan) = parsed_and_planned(what, src, &target);
        let kinds: Vec<MapKind> = plan
            .kernel_steps()
            .flat_map(|k| k.program.launches.iter().map(|l| l.kind))
            .collect();
        let scatters = launches_of(&plan, MapKind::Scatter);
        if scatters.len() != 2
            || !kinds.contains(&MapKind::Sort)
            || scatters.iter().any(one_thread)
            || kinds.first() != Some(&MapKind::Scatter)
            || kinds.last() != Some(&MapKind::Scatter)
        {
            failures.push(format!("{what}: launches {kinds:?}"));
        }
        failures.extend(bit_for_bit_strays(
            what,
            &f,
            &plan,
            (200 + i as u64, *range),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Where the GPU sort cannot take the targets (shared memory too small for its tiles and
/// counters) and a thread per element does not pay (an output of many passes of a small
/// grid, and many updates), the scatter runs on one thread, with the same result.
#[test]
fn a_scatter_without_a_sort_or_a_scan_runs_on_one_thread() {
    let mut target = TargetInfo::h200();
    let gpu = target.gpu.as_mut().expect("a GPU");
    (gpu.sms, gpu.blocks_per_sm, gpu.elementwise_block) = (1, 1, 32);
    gpu.static_shared_bytes = 16;
    let f = kiln_ir::parse_func_text(&vector_text("f32", 4096, 4096)).unwrap();
    let plan = planned(&f, &target).unwrap();
    let launches = launches_of(&plan, MapKind::Scatter);
    assert_eq!(launches.len(), 1);
    assert!(one_thread(&launches[0]), "{:?}", launches[0].body.first());
    let a = indexed_args(&f, 7, 4096, true);
    assert_eq!(bit_for_bit("serial", &f, &plan, &a), None);
    // Fewer updates: the scan pays again.
    let f = kiln_ir::parse_func_text(&vector_text("f32", 4096, 20)).unwrap();
    let plan = planned(&f, &target).unwrap();
    let launches = launches_of(&plan, MapKind::Scatter);
    assert_eq!(launches.len(), 1);
    assert!(!one_thread(&launches[0]));
    let a = indexed_args(&f, 8, 4096, true);
    assert_eq!(bit_for_bit("scan", &f, &plan, &a), None);
}

/// A select-and-scatter of `source` over windows of an operand of shape `dims` (`window`,
/// `strides`, `pad` as `(low, high)` per dimension).
fn select_scatter_text(
    dt: &str,
    dims: &[usize],
    window: &[usize],
    strides: &[usize],
    pad: &[(usize, usize)],
    select: &str,
    kind: &str,
) -> String {
    let grid: Vec<usize> = (0..dims.len())
        .map(|d| (dims[d] + pad[d].0 + pad[d].1 - window[d]) / strides[d] + 1)
        .collect();
    let list = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let shape = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let pads = pad
        .iter()
        .map(|p| format!("[{}, {}]", p.0, p.1))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "func @main(%0: {dt}[{o}], %1: {dt}[{g}], %2: {dt}[]) -> {dt}[{o}] {{
  %3 = select_and_scatter %0, %1, %2 {{window_dimensions = [{w}], window_strides = [{s}], padding = [{pads}], select = {select}, kind = {kind}}} : {dt}[{o}]
  return %3
}}
",
        o = shape(dims),
        g = shape(&grid),
        w = list(window),
        s = list(strides),
    )
}

/// Arguments of a select-and-scatter: an operand of few distinct values (ties) with some NaN
/// where `nan` (floats), random source values, an init value.
fn pool_args(f: &kiln_ir::Func, seed: u64, nan: bool) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    let ty = f.param_types();
    let operand: Vec<f64> = (0..ty[0].numel())
        .map(|_| {
            if nan && rng.below(7) == 0 {
                f64::NAN
            } else {
                rng.below(4) as f64 - 1.0
            }
        })
        .collect();
    vec![
        Literal::from_f64s(ty[0].clone(), &operand).unwrap(),
        random_literal(&mut rng, &ty[1]),
        random_literal(&mut rng, &ty[2]),
    ]
}

#[test]
fn select_and_scatter_runs_a_thread_per_element_bit_for_bit() {
    let target = TargetInfo::h200();
    type Case = (
        &'static str,
        &'static [usize],
        &'static [usize],
        &'static [usize],
        &'static [(usize, usize)],
    );
    let shapes: [Case; 7] = [
        (
            "2x2/2",
            &[2, 3, 8, 8],
            &[1, 1, 2, 2],
            &[1, 1, 2, 2],
            &[(0, 0); 4],
        ),
        (
            "3x3/2 padded",
            &[1, 2, 9, 9],
            &[1, 1, 3, 3],
            &[1, 1, 2, 2],
            &[(0, 0), (0, 0), (1, 1), (1, 1)],
        ),
        (
            "3x3/1 overlapping, padded",
            &[1, 1, 7, 6],
            &[1, 1, 3, 3],
            &[1, 1, 1, 1],
            &[(0, 0), (0, 0), (1, 1), (1, 1)],
        ),
        (
            "3x3/2 ragged, high padding only",
            &[2, 10, 7],
            &[1, 3, 3],
            &[1, 2, 2],
            &[(0, 0), (0, 2), (0, 1)],
        ),
        ("2/3 with gaps", &[20], &[2], &[3], &[(1, 0)]),
        ("5/2 wide, 1-D", &[23], &[5], &[2], &[(2, 3)]),
        (
            "window past the padding",
            &[3, 4],
            &[4, 2],
            &[1, 1],
            &[(3, 3), (1, 0)],
        ),
    ];
    let mut failures = Vec::new();
    let mut n = 0;
    for (what, dims, window, strides, pad) in shapes {
        for (dt, select, kind) in [
            ("f32", "GE", "add"),
            ("f32", "GT", "add"),
            ("bf16", "GE", "add"),
            ("f32", "LE", "max"),
            ("i32", "GE", "add"),
        ] {
            let what = format!("{what} {dt} {select} {kind}");
            let src = select_scatter_text(dt, dims, window, strides, pad, select, kind);
            let (f, plan) = parsed_and_planned(&what, &src, &target);
            let total: usize = dims.iter().product();
            match launches_of(&plan, MapKind::SelectScatter).as_slice() {
                [s] if s.grid * s.block >= total && s.grid * s.block < total + s.block => {}
                [s] => failures.push(format!(
                    "{what}: grid {} x block {} for {total} elements",
                    s.grid, s.block
                )),
                l => failures.push(format!("{what}: {} select-and-scatter launches", l.len())),
            }
            for nan in [false, dt != "i32"] {
                n += 1;
                let a = pool_args(&f, n, nan);
                failures.extend(bit_for_bit(&format!("{what} (NaN {nan})"), &f, &plan, &a));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A larger pooling gradient than one grid covers at once (a grid of 2 blocks of 32 threads):
/// each thread strides over several elements.
#[test]
fn select_and_scatter_strides_over_the_grid() {
    let mut target = TargetInfo::h200();
    let gpu = target.gpu.as_mut().expect("a GPU");
    (gpu.sms, gpu.blocks_per_sm, gpu.elementwise_block) = (2, 1, 32);
    let src = select_scatter_text(
        "f32",
        &[2, 4, 12, 12],
        &[1, 1, 3, 3],
        &[1, 1, 2, 2],
        &[(0, 0), (0, 0), (1, 1), (1, 1)],
        "GE",
        "add",
    );
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let plan = planned(&f, &target).unwrap();
    let l = launches_of(&plan, MapKind::SelectScatter);
    assert_eq!((l.len(), l[0].grid, l[0].block), (1, 2, 32));
    let a = pool_args(&f, 99, true);
    assert_eq!(bit_for_bit("strided", &f, &plan, &a), None);
}

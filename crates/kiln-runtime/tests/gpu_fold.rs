//! `reduce_region` with an elementwise body as one GPU launch (`gpu/map/fold.rs`) on the
//! emulator, against the reference interpreter bit for bit: argmax and argmin (values and
//! indices, NaN beating every number, ties to the lower index) of f32, bf16 and i32, an
//! exclusive or, and custom combiners (an integer `a + b + a·b`, a float "largest magnitude"),
//! over rows (a warp per row, a block per row, a thread per short row), columns (a thread per
//! column) and whole tensors, of 1, 31, 32, 33, 1000 and 4096 terms, and long rows split over
//! blocks (`fold_split.rs`); each program one kernel of one launch (two when split), and the
//! same bits on a second run.

use kiln_ir::{DType, Literal, TensorType};
use kiln_kernel::gpu::ir::{GpuKernel, MapKind, Stmt};
use kiln_kernel::gpu::plan::{DevicePlan, DeviceStep};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{EmuReport, run_plan};

mod folds;
mod planned;
use folds::{arg_body, arg_types, kept, values};
use planned::planned;

/// The argmax or argmin of `%0` over `dims`, its index the position along the last reduced
/// dimension (an iota the fold's kernel computes).
fn arg_program(dtype: DType, shape: &[usize], dims: &[usize], dir: &str) -> String {
    let [t, i, rt, ri] = arg_types(dtype, shape, dims);
    let d = dims.last().expect("a reduced dimension");
    format!(
        "func @main(%0: {t}, %1: {dtype}[]) -> ({rt}, {ri}) {{
  %3 = iota {{iota_dimension = {d}}} : {i}
  %4 = constant {{value = 0}} : i32[]
  %5, %6 = reduce_region %0, %3, %1, %4 {{dimensions = {dims:?}, body = {}}} : {rt}, {ri}
  return %5, %6
}}
",
        arg_body(dtype, dir)
    )
}

/// A one-result `reduce_region` of `%0` over `dims` whose body computes `ops` from `%0`
/// (the accumulator) and `%1` (the element), its result the last value.
fn one_program(dtype: DType, shape: &[usize], dims: &[usize], ops: &str) -> String {
    let t = TensorType::new(dtype, shape.to_vec());
    let rt = TensorType::new(dtype, kept(shape, dims));
    format!(
        "func @main(%0: {t}, %1: {dtype}[]) -> {rt} {{
  %2 = reduce_region %0, %1 {{dimensions = {dims:?}, body = func @b(%0: {dtype}[], %1: {dtype}[]) -> {dtype}[] {{
{ops}
    }}}} : {rt}
  return %2
}}
"
    )
}

/// The launches of `plan`'s kernel steps.
fn launches(plan: &DevicePlan) -> Vec<&GpuKernel> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            DeviceStep::Kernel(k) => Some(&k.program.launches),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Whether `body` (or a statement inside it) is a note of the fold mapping.
fn notes_a_fold(body: &[Stmt]) -> bool {
    body.iter().any(|s| match s {
        Stmt::Note(n) => n.starts_with("fold of"),
        Stmt::For { body, .. } | Stmt::If { body, .. } => notes_a_fold(body),
        _ => false,
    })
}

/// Plans `text` for the H200, checks it is one kernel of the launches `kinds`, the first
/// computing the fold ahead, runs it twice on the emulator and compares with the reference
/// bit for bit; the failure, if any.
fn check(text: &str, args: &[Literal], kinds: &[MapKind]) -> Result<(), String> {
    check_on(&TargetInfo::h200(), text, args, kinds)
}

/// [`check`] on `target`.
fn check_on(
    target: &TargetInfo,
    text: &str,
    args: &[Literal],
    kinds: &[MapKind],
) -> Result<(), String> {
    let f = kiln_ir::parse_func_text(text).map_err(|e| format!("{e}\n{text}"))?;
    let plan = planned(&f, target).map_err(|e| format!("{e}\n{text}"))?;
    let rep = EmuReport::of(&plan);
    let ls = launches(&plan);
    let got: Vec<MapKind> = ls.iter().map(|l| l.kind).collect();
    if rep.kernels != 1 || got != kinds || !rep.fallbacks.is_empty() {
        return Err(format!("not one kernel of {kinds:?}: {rep:?}\n{text}"));
    }
    if !notes_a_fold(&ls[0].body) {
        return Err(format!("the launch computes no fold ahead\n{text}"));
    }
    let refs: Vec<&Literal> = args.iter().collect();
    let got = run_plan(&plan, &refs).map_err(|e| format!("{e}\n{text}"))?;
    let want = kiln_reference::eval(&f, args).map_err(|e| format!("{e}\n{text}"))?;
    for (g, w) in got.iter().zip(&want) {
        if g.ty() != w.ty() || g.to_le_bytes() != w.to_le_bytes() {
            return Err(format!("{text}\ngot {g:?}\nwant {w:?}"));
        }
    }
    let bytes = |ls: &[Literal]| ls.iter().map(Literal::to_le_bytes).collect::<Vec<_>>();
    match run_plan(&plan, &refs) {
        Ok(again) if bytes(&again) == bytes(&got) => Ok(()),
        Ok(_) => Err(format!("other bits on a second run\n{text}")),
        Err(e) => Err(format!("second run: {e}\n{text}")),
    }
}

/// The launches of `rows` folds of `n` terms on the H200, along rows or down columns.
fn kind_of(rows: usize, n: usize, columns: bool) -> Vec<MapKind> {
    kind_on(&TargetInfo::h200(), rows, n, columns)
}

/// The launches of `rows` folds of `n` terms on `target`, along rows or down columns: a
/// thread per output, a warp or a block per row, or, for long rows fewer than the
/// multiprocessors, slices folded by blocks into partials and then a thread per row.
fn kind_on(target: &TargetInfo, rows: usize, n: usize, columns: bool) -> Vec<MapKind> {
    let gpu = target.gpu.as_ref().expect("a GPU");
    let slices = (gpu.sms * gpu.blocks_per_sm)
        .div_ceil(rows)
        .min(n.div_ceil(gpu.block_reduce_min));
    if columns || n < gpu.warp_reduce_min {
        vec![MapKind::Elementwise]
    } else if n < gpu.block_reduce_min {
        vec![MapKind::WarpRows]
    } else if rows < gpu.sms && slices >= 2 {
        vec![MapKind::SplitPartials, MapKind::Elementwise]
    } else {
        vec![MapKind::BlockRows]
    }
}

/// `(shape, reduced dimensions, terms, down columns)`: rows of each size, columns, and a
/// whole tensor.
fn cases() -> Vec<(Vec<usize>, Vec<usize>, usize, bool)> {
    let mut out = Vec::new();
    for n in [1, 31, 32, 33, 1000, 4096] {
        out.push((vec![3, n], vec![1], n, false));
        out.push((vec![n, 5], vec![0], n, true));
    }
    out.push((vec![2500], vec![0], 2500, false));
    out.push((vec![2, 3, 700], vec![2], 700, false));
    // Split over blocks: a whole tensor, and two long rows.
    out.push((vec![70_001], vec![0], 70_001, false));
    out.push((vec![2, 9000], vec![1], 9000, false));
    out
}

#[test]
fn argmax_and_argmin_agree_with_the_reference_bit_for_bit() {
    let mut failures = Vec::new();
    for dtype in [DType::F32, DType::BF16, DType::I32] {
        for (c, (shape, dims, n, columns)) in cases().into_iter().enumerate() {
            for dir in ["GT", "LT"] {
                let numel: usize = shape.iter().product();
                let x = Literal::from_f64s(
                    TensorType::new(dtype, shape.clone()),
                    &values(dtype, numel, c % 2 == 0, (c * 7 + numel) as u64),
                )
                .expect("values");
                // An init the elements beat (or tie with), and one they may lose to.
                for init in [if dir == "GT" { -1e30 } else { 1e30 }, 0.0] {
                    let init =
                        Literal::from_f64s(TensorType::scalar(dtype), &[init]).expect("init");
                    let text = arg_program(dtype, &shape, &dims, dir);
                    if let Err(e) = check(
                        &text,
                        &[x.clone(), init],
                        &kind_of(numel / n.max(1), n, columns),
                    ) {
                        failures.push(e);
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn xor_and_custom_combiners_agree_with_the_reference_bit_for_bit() {
    // Order-independent bodies: an exclusive or, `a + b + a·b` (`(1 + a)(1 + b) - 1`, wrapping),
    // and the larger magnitude, ties to the larger value.
    let bodies = [
        (
            DType::I32,
            "      %2 = xor %0, %1 : i32[]\n      return %2",
            3.0,
        ),
        (
            DType::I32,
            "      %2 = add %0, %1 : i32[]\n      %3 = multiply %0, %1 : i32[]\n      %4 = add %2, %3 : i32[]\n      return %4",
            2.0,
        ),
        (
            DType::F32,
            "      %2 = abs %0 : f32[]
      %3 = abs %1 : f32[]
      %4 = compare %3, %2 {comparison_direction = GT} : pred[]
      %5 = compare %3, %2 {comparison_direction = EQ} : pred[]
      %6 = compare %1, %0 {comparison_direction = GT} : pred[]
      %7 = and %5, %6 : pred[]
      %8 = or %4, %7 : pred[]
      %9 = select %8, %1, %0 : f32[]
      return %9",
            0.25,
        ),
    ];
    let mut failures = Vec::new();
    for (b, (dtype, ops, init)) in bodies.iter().enumerate() {
        for (c, (shape, dims, n, columns)) in cases().into_iter().enumerate() {
            let numel: usize = shape.iter().product();
            let x = Literal::from_f64s(
                TensorType::new(*dtype, shape.clone()),
                &values(*dtype, numel, false, (b * 1000 + c) as u64),
            )
            .expect("values");
            let init = Literal::from_f64s(TensorType::scalar(*dtype), &[*init]).expect("init");
            let text = one_program(*dtype, &shape, &dims, ops);
            if let Err(e) = check(&text, &[x, init], &kind_of(numel / n.max(1), n, columns)) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn rows_shorter_than_their_threads_combine_only_the_threads_that_took_terms() {
    // Thresholds far below the H200's: warps and blocks of 1024 threads over rows of fewer
    // terms than threads (and of fewer warps' worth than warps), where lanes and warps
    // without terms hold the inits, which a lost or extra combination would show (an init
    // that beats every element). With the H200's multiprocessors the long rows split over
    // blocks of 256 threads (slices of fewer terms than threads, a shorter last one); with
    // two they take a block each.
    let mut failures = Vec::new();
    for sms in [132, 2] {
        let mut target = TargetInfo::h200();
        let gpu = target.gpu.as_mut().expect("a GPU");
        gpu.warp_reduce_min = 4;
        gpu.block_reduce_min = 40;
        gpu.sms = sms;
        for n in [4, 5, 17, 33, 40, 100, 1025] {
            let shape = [3, n];
            let kinds = kind_on(&target, 3, n, false);
            let x = Literal::from_f64s(
                TensorType::new(DType::F32, shape.to_vec()),
                &values(DType::F32, 3 * n, true, n as u64),
            )
            .expect("values");
            for init in [-1e30, 1e30] {
                let init =
                    Literal::from_f64s(TensorType::scalar(DType::F32), &[init]).expect("init");
                let text = arg_program(DType::F32, &shape, &[1], "GT");
                if let Err(e) = check_on(&target, &text, &[x.clone(), init], &kinds) {
                    failures.push(e);
                }
            }
            let x = Literal::from_f64s(
                TensorType::new(DType::I32, shape.to_vec()),
                &values(DType::I32, 3 * n, false, n as u64),
            )
            .expect("values");
            let init = Literal::from_f64s(TensorType::scalar(DType::I32), &[5.0]).expect("init");
            let text = one_program(
                DType::I32,
                &shape,
                &[1],
                "      %2 = xor %0, %1 : i32[]\n      return %2",
            );
            if let Err(e) = check_on(&target, &text, &[x, init], &kinds) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Folds a launch cannot compute ahead run in the expressions, a thread computing each where
/// it is read, in the reference's order: one guarded by a concatenation, one in the row of a
/// reduction the row mapping computes.
#[test]
fn folds_in_expressions_agree_with_the_reference_bit_for_bit() {
    let xor = "func @b(%0: i32[], %1: i32[]) -> i32[] {\n      %2 = xor %0, %1 : i32[]\n      return %2\n    }";
    let programs = [
        format!(
            "func @main(%0: i32[8,1000], %1: i32[], %5: i32[4]) -> i32[12] {{\n  %2 = reduce_region %0, %1 {{dimensions = [1], body = {xor}}} : i32[8]\n  %4 = concatenate %5, %2 {{dimension = 0}} : i32[12]\n  return %4\n}}\n"
        ),
        format!(
            "func @main(%0: i32[8,1000], %1: i32[]) -> (i32[8], i32[8]) {{\n  %2 = reduce_region %0, %1 {{dimensions = [1], body = {xor}}} : i32[8]\n  %3 = constant {{value = 0}} : i32[]\n  %4 = reduce %0, %3 {{dimensions = [1], kind = add}} : i32[8]\n  return %2, %4\n}}\n"
        ),
    ];
    for text in &programs {
        let f = kiln_ir::parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let plan = planned(&f, &TargetInfo::h200()).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let rep = EmuReport::of(&plan);
        assert!(rep.fallbacks.is_empty(), "{rep:?}\n{text}");
        assert!(
            launches(&plan).iter().all(|l| !notes_a_fold(&l.body)),
            "a fold computed ahead\n{text}"
        );
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .enumerate()
            .map(|(i, t)| {
                Literal::from_f64s(t.clone(), &values(DType::I32, t.numel(), false, i as u64))
                    .expect("values")
            })
            .collect();
        let refs: Vec<&Literal> = args.iter().collect();
        let got = run_plan(&plan, &refs).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let want = kiln_reference::eval(&f, &args).expect("the reference");
        assert_eq!(got, want, "{text}");
    }
}

/// `reduce_window_region`s of more than 256 window elements are one fold kernel kept in the
/// reference's order (a thread per output folds its window from the inits, row-major, once for
/// all its results), so a
/// body whose result depends on the order (`acc / 2 + x`, rounded at every step) agrees bit
/// for bit: a 1 x 1024 window with strides and padding, and a global 64 x 64 window.
#[test]
fn large_windows_fold_in_the_references_order() {
    let programs = [
        "func @main(%0: f32[3,2000], %1: f32[]) -> f32[3,11] {\n  %2 = reduce_window_region %0, %1 {window_dimensions = [1, 1024], window_strides = [1, 97], base_dilations = [1, 1], window_dilations = [1, 1], padding = [[0, 0], [3, 5]], body = func @b(%0: f32[], %1: f32[]) -> f32[] {\n      %2 = constant {value = 0.5} : f32[]\n      %3 = multiply %0, %2 : f32[]\n      %4 = add %3, %1 : f32[]\n      return %4\n    }} : f32[3,11]\n  return %2\n}\n",
        "func @main(%0: f32[64,64], %1: f32[]) -> f32[1,1] {\n  %2 = reduce_window_region %0, %1 {window_dimensions = [64, 64], window_strides = [1, 1], base_dilations = [1, 1], window_dilations = [1, 1], padding = [[0, 0], [0, 0]], body = func @b(%0: f32[], %1: f32[]) -> f32[] {\n      %2 = constant {value = 0.5} : f32[]\n      %3 = multiply %0, %2 : f32[]\n      %4 = add %3, %1 : f32[]\n      return %4\n    }} : f32[1,1]\n  return %2\n}\n",
    ];
    for text in programs {
        let f = kiln_ir::parse_func_text(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let plan = planned(&f, &TargetInfo::h200()).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let rep = EmuReport::of(&plan);
        assert!(
            rep.kernels == 1 && rep.interpreted == 0 && rep.fallbacks.is_empty(),
            "{rep:?}\n{text}"
        );
        assert!(
            launches(&plan).iter().all(|l| notes_a_fold(&l.body)),
            "the window fold is not computed once per output\n{text}"
        );
        let t = &f.param_types()[0];
        // Finite values of many magnitudes, so that the order of the roundings shows.
        let xs: Vec<f64> = values(DType::I32, t.numel(), false, 11)
            .iter()
            .enumerate()
            .map(|(k, v)| v * (1.0 + (k % 13) as f64 / 7.0))
            .collect();
        let args = [
            Literal::from_f64s(t.clone(), &xs).expect("values"),
            Literal::f32([], vec![0.3]).expect("init"),
        ];
        let refs: Vec<&Literal> = args.iter().collect();
        let got = run_plan(&plan, &refs).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let want = kiln_reference::eval(&f, &args).expect("the reference");
        assert!(want[0].to_f64s().iter().all(|v| v.is_finite()), "{want:?}");
        assert_eq!(got, want, "{text}");
    }
}

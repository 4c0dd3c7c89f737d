//! Full and column reductions split over many blocks in two launches (`gpu/map/split.rs`) on
//! the emulator: sums, maxima and minima over whole tensors and over columns, ragged sizes,
//! f32, bf16, f16 and i32 inputs, fused producers and epilogues, against the reference within its
//! accuracy bounds; the same bits on a second run and on a smaller grid; a dropped partial
//! caught.

use kiln_ir::Literal;
use kiln_kernel::gpu::ir::{GpuProgram, MapKind, Sc, Stmt};
use kiln_kernel::gpu::plan::{DevicePlan, DeviceStep};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{EmuReport, run_plan};

mod planned;
use planned::{planned, random_args};

/// `f` lowered and planned for the H200.
fn plan_of(src: &str) -> (kiln_ir::Func, DevicePlan) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let plan = planned(&f, &TargetInfo::h200()).unwrap_or_else(|e| panic!("{e}\n{src}"));
    (f, plan)
}

/// A reduction of `%0: dt[shape]` over `dims` by `kind` (`add`, `max`, `min`) to the kept
/// dimensions; `fused`: of a producer `x · y + x`, its result halved plus a third input.
fn reduce_text(dt: &str, shape: &[usize], dims: &[usize], kind: &str, fused: bool) -> String {
    let s = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let kept: Vec<usize> = (0..shape.len())
        .filter(|d| !dims.contains(d))
        .map(|d| shape[d])
        .collect();
    let m = format!("{dt}[{}]", s(shape));
    let r = format!("{dt}[{}]", s(&kept));
    let init = match kind {
        "add" if dt.starts_with('i') => "0",
        "add" => "0.0",
        "max" => "-inf",
        _ => "inf",
    };
    let dl = s(dims);
    if fused {
        // Σ (x · y + x) then · 0.5 + the first kept element of z: a producer and an epilogue.
        format!(
            "func @main(%0: {m}, %10: {m}, %20: {r}) -> {r} {{
  %1 = multiply %0, %10 : {m}
  %2 = add %1, %0 : {m}
  %3 = constant {{value = {init}}} : {dt}[]
  %4 = reduce %2, %3 {{dimensions = [{dl}], kind = {kind}}} : {r}
  %5 = constant {{value = 0.5}} : {dt}[]
  %6 = broadcast_in_dim %5 {{broadcast_dimensions = []}} : {r}
  %7 = multiply %4, %6 : {r}
  %8 = add %7, %20 : {r}
  return %8
}}
"
        )
    } else {
        format!(
            "func @main(%0: {m}) -> {r} {{
  %1 = constant {{value = {init}}} : {dt}[]
  %2 = reduce %0, %1 {{dimensions = [{dl}], kind = {kind}}} : {r}
  return %2
}}
"
        )
    }
}

/// `(dtype, shape, reduced dimensions, kind, fused, the first launch's mapping)`.
type Case = (
    &'static str,
    &'static [usize],
    &'static [usize],
    &'static str,
    bool,
    MapKind,
);

#[test]
fn split_reductions_agree_with_the_reference_and_repeat_bit_for_bit() {
    // 16 slices or fewer meet in one chain, more (up to 256, a multiple of 16) in two levels.
    let cases: [Case; 19] = [
        (
            "i32",
            &[3, 70_001],
            &[1],
            "add",
            false,
            MapKind::SplitPartials,
        ),
        (
            "i32",
            &[3000, 50],
            &[0],
            "add",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "f32",
            &[100_003],
            &[0],
            "add",
            false,
            MapKind::SplitPartials,
        ),
        (
            "f32",
            &[300_001],
            &[0],
            "add",
            false,
            MapKind::SplitPartials,
        ),
        (
            "f32",
            &[4200, 20],
            &[0],
            "add",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "bf16",
            &[2, 150_000],
            &[1],
            "min",
            true,
            MapKind::SplitPartials,
        ),
        (
            "f32",
            &[3, 41_000],
            &[1],
            "add",
            false,
            MapKind::SplitPartials,
        ),
        ("f32", &[70_001], &[0], "max", false, MapKind::SplitPartials),
        (
            "f32",
            &[300, 301],
            &[0, 1],
            "min",
            false,
            MapKind::SplitPartials,
        ),
        (
            "bf16",
            &[50_000],
            &[0],
            "add",
            false,
            MapKind::SplitPartials,
        ),
        (
            "f16",
            &[2, 30_000],
            &[1],
            "max",
            false,
            MapKind::SplitPartials,
        ),
        (
            "f32",
            &[250, 333],
            &[0, 1],
            "add",
            true,
            MapKind::SplitPartials,
        ),
        (
            "f32",
            &[1000, 300],
            &[0],
            "add",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "f32",
            &[257, 33],
            &[0],
            "add",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "f32",
            &[700, 90],
            &[0],
            "max",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "bf16",
            &[600, 130],
            &[0],
            "add",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "f16",
            &[500, 70],
            &[0],
            "min",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "f32",
            &[4, 129, 40],
            &[0, 1],
            "add",
            false,
            MapKind::ColumnPartials,
        ),
        (
            "f32",
            &[640, 257],
            &[0],
            "add",
            true,
            MapKind::ColumnPartials,
        ),
    ];
    let mut failures = Vec::new();
    for (i, &(dt, shape, dims, kind, fused, want)) in cases.iter().enumerate() {
        let what = format!("{kind} of {dt}{shape:?} over {dims:?} (fused: {fused})");
        let src = reduce_text(dt, shape, dims, kind, fused);
        let (f, plan) = plan_of(&src);
        let rep = EmuReport::of(&plan);
        if rep.launches.get(&want) != Some(&1) {
            failures.push(format!("{what}: not one {want:?} launch: {rep:?}"));
            continue;
        }
        let args = random_args(&f, i as u64);
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
        match run_plan(&plan, &refs) {
            Ok(again) if again == got => {}
            Ok(_) => failures.push(format!("{what}: other bits on a second run")),
            Err(e) => failures.push(format!("{what}: second run: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The first program of `plan` with a launch of `kind`.
fn program_with(plan: &mut DevicePlan, kind: MapKind) -> &mut GpuProgram {
    plan.steps
        .iter_mut()
        .find_map(|s| match s {
            DeviceStep::Kernel(k) if k.program.launches.iter().any(|l| l.kind == kind) => {
                Some(&mut k.program)
            }
            _ => None,
        })
        .expect("a split launch")
}

#[test]
fn a_dropped_partial_is_caught() {
    for (shape, dims, kind) in [
        (&[100_003usize][..], &[0usize][..], MapKind::SplitPartials),
        (&[1000, 300][..], &[0][..], MapKind::ColumnPartials),
    ] {
        let src = reduce_text("f32", shape, dims, "add", false);
        let (f, mut plan) = plan_of(&src);
        // Positive terms, so that a missing partial shows.
        let args: Vec<Literal> = random_args(&f, 7)
            .iter()
            .map(|a| Literal::try_full(a.ty().clone(), 1.0).expect("ones"))
            .collect();
        let refs: Vec<&Literal> = args.iter().collect();
        let good = run_plan(&plan, &refs).expect("runs");
        kiln_reference::accuracy::check_outputs(&f, &args, &good).expect("the split agrees");
        // The partials launch stops one block short: its last partial is never written.
        let p = program_with(&mut plan, kind);
        let launch = p.launches.iter_mut().find(|l| l.kind == kind).expect("it");
        let Some(Stmt::For { end, .. }) = launch.body.first_mut() else {
            panic!("the partials launch is a loop over its blocks")
        };
        let Sc::Const(n) = *end else {
            panic!("a constant grid")
        };
        *end = Sc::Const(n - 1);
        // The emulator refusing the unwritten partial, or a wrong result: either is caught.
        let caught = match run_plan(&plan, &refs) {
            Err(_) => true,
            Ok(bad) => kiln_reference::accuracy::check_outputs(&f, &args, &bad).is_err(),
        };
        assert!(caught, "{kind:?}: a dropped partial went unnoticed");
    }
}
#[test]
fn a_sum_and_a_maximum_of_one_tensor_split_together() {
    for (shape, dims, r, want) in [
        ("90000", "0", "", MapKind::SplitPartials),
        ("900,70", "0", "70", MapKind::ColumnPartials),
    ] {
        let src = format!(
            "func @main(%0: f32[{shape}]) -> (f32[{r}], f32[{r}]) {{
  %1 = constant {{value = 0.0}} : f32[]
  %2 = reduce %0, %1 {{dimensions = [{dims}], kind = add}} : f32[{r}]
  %3 = constant {{value = -inf}} : f32[]
  %4 = reduce %0, %3 {{dimensions = [{dims}], kind = max}} : f32[{r}]
  return %2, %4
}}
"
        );
        let (f, plan) = plan_of(&src);
        let rep = EmuReport::of(&plan);
        assert!(rep.launches.contains_key(&want), "{shape}: {rep:?}");
        let args = random_args(&f, 3);
        let refs: Vec<&Literal> = args.iter().collect();
        let got = run_plan(&plan, &refs).unwrap_or_else(|e| panic!("{shape}: {e}"));
        kiln_reference::accuracy::check_outputs(&f, &args, &got)
            .unwrap_or_else(|e| panic!("{shape}: {e}"));
    }
}

#[test]
fn the_partials_do_not_depend_on_the_grid_launched() {
    // The partials launch loops over its slices: on fewer blocks than it asks for (a runtime
    // that caps the grid) every slice is still reduced in the same order, to the same bits.
    for (shape, dims, kind) in [
        (&[100_003usize][..], &[0usize][..], MapKind::SplitPartials),
        (&[1000, 300][..], &[0][..], MapKind::ColumnPartials),
    ] {
        let src = reduce_text("f32", shape, dims, "add", false);
        let (f, mut plan) = plan_of(&src);
        let args = random_args(&f, 11);
        let refs: Vec<&Literal> = args.iter().collect();
        let full = run_plan(&plan, &refs).expect("runs");
        let p = program_with(&mut plan, kind);
        let launch = p.launches.iter_mut().find(|l| l.kind == kind).expect("it");
        launch.grid = 3;
        let few = run_plan(&plan, &refs).expect("runs");
        assert_eq!(full, few, "{kind:?}: other bits on 3 blocks");
    }
}

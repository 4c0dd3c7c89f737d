//! Transposes through shared-memory tiles (`gpu/map/transpose.rs`) on the emulator: 2-D,
//! 3-D and 4-D permutations with ragged edges, f32, bf16 and i32, one fused with an
//! elementwise producer and one inlined into a sum, against the reference bit for bit; the same bits on a smaller
//! grid; a tile read without its padding, and a missing barrier, caught.

use kiln_ir::Literal;
use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_kernel::gpu::ir::{GpuKernel, MapKind, Sc, Stmt};
use kiln_kernel::gpu::plan::{DevicePlan, DeviceStep, device_plan};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{EmuReport, run_plan};

/// `f` lowered and planned for the H200.
fn plan_of(src: &str) -> (kiln_ir::Func, DevicePlan) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let target = TargetInfo::h200();
    let l = kiln_kernel::pipeline::lower_program(
        &f,
        &[],
        &kiln_kernel::Options::default(),
        &target,
        None,
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{e}\n{src}"));
    let plan = device_plan(&l, &target).unwrap_or_else(|e| panic!("{e}\n{src}"));
    (f, plan)
}

fn args_of(f: &kiln_ir::Func, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect()
}

fn shape(dt: &str, s: &[usize]) -> String {
    let dims: Vec<String> = s.iter().map(|x| x.to_string()).collect();
    format!("{dt}[{}]", dims.join(","))
}

/// `transpose(%0: dt[from], perm)`; `fused`: of `%0 · %0` (a producer in the same kernel).
fn transpose_text(dt: &str, from: &[usize], perm: &[usize], fused: bool) -> String {
    let to: Vec<usize> = perm.iter().map(|&p| from[p]).collect();
    let (a, b) = (shape(dt, from), shape(dt, &to));
    let p: Vec<String> = perm.iter().map(|x| x.to_string()).collect();
    let p = p.join(", ");
    if fused {
        format!(
            "func @main(%0: {a}) -> {b} {{\n  %1 = multiply %0, %0 : {a}\n  %2 = transpose %1 {{permutation = [{p}]}} : {b}\n  return %2\n}}\n"
        )
    } else {
        format!(
            "func @main(%0: {a}) -> {b} {{\n  %1 = transpose %0 {{permutation = [{p}]}} : {b}\n  return %1\n}}\n"
        )
    }
}

/// `transpose(%0) + %1` for `%0: f32[n, m]`: the transpose inlined into the sum, read at an
/// affine index across the output.
fn transpose_then_add(n: usize, m: usize) -> String {
    format!(
        "func @main(%0: f32[{n},{m}], %1: f32[{m},{n}]) -> f32[{m},{n}] {{\n  %2 = transpose %0 {{permutation = [1, 0]}} : f32[{m},{n}]\n  %3 = add %2, %1 : f32[{m},{n}]\n  return %3\n}}\n"
    )
}

/// `(dtype, input shape, permutation, fused)`.
type Case = (&'static str, &'static [usize], &'static [usize], bool);

const CASES: [Case; 8] = [
    ("f32", &[64, 96], &[1, 0], false),
    ("f32", &[70, 45], &[1, 0], false),
    ("f32", &[3, 40, 33], &[0, 2, 1], false),
    ("f32", &[33, 3, 50], &[2, 1, 0], false),
    ("f32", &[2, 33, 5, 40], &[0, 2, 3, 1], false),
    ("bf16", &[100, 64], &[1, 0], false),
    ("i32", &[37, 65], &[1, 0], false),
    ("f32", &[45, 70], &[1, 0], true),
];

/// The launch of `kind` in `plan`.
fn launch_of(plan: &mut DevicePlan, kind: MapKind) -> &mut GpuKernel {
    plan.steps
        .iter_mut()
        .find_map(|s| match s {
            DeviceStep::Kernel(k) => k.program.launches.iter_mut().find(|l| l.kind == kind),
            _ => None,
        })
        .expect("a tiled launch")
}

#[test]
fn tiled_transposes_agree_with_the_reference_bit_for_bit() {
    let mut failures = Vec::new();
    let programs = CASES
        .iter()
        .map(|&(dt, from, perm, fused)| {
            (
                format!("{dt}{from:?} by {perm:?} (fused: {fused})"),
                transpose_text(dt, from, perm, fused),
            )
        })
        .chain([(
            "a transpose read by a sum".to_string(),
            transpose_then_add(45, 70),
        )]);
    for (i, (what, src)) in programs.enumerate() {
        let (f, mut plan) = plan_of(&src);
        let rep = EmuReport::of(&plan);
        if rep.launches.get(&MapKind::TransposeTiles) != Some(&1) || rep.launches.len() != 1 {
            failures.push(format!("{what}: not one tiled launch: {rep:?}"));
            continue;
        }
        let args = args_of(&f, i as u64);
        let refs: Vec<&Literal> = args.iter().collect();
        let want = kiln_reference::eval(&f, &args).unwrap();
        match run_plan(&plan, &refs) {
            Ok(got) if got == want => {}
            Ok(_) => {
                failures.push(format!("{what}: differs from the reference"));
                continue;
            }
            Err(e) => {
                failures.push(format!("{what}: {e}"));
                continue;
            }
        }
        // On fewer blocks than it asks for, each block steps through more tiles.
        launch_of(&mut plan, MapKind::TransposeTiles).grid = 3;
        match run_plan(&plan, &refs) {
            Ok(got) if got == want => {}
            Ok(_) => failures.push(format!("{what}: differs on 3 blocks")),
            Err(e) => failures.push(format!("{what}: on 3 blocks: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A transpose whose output's innermost dimension is shorter than a tile, and a copy that
/// reads along its output, stay grid-stride elementwise loops.
#[test]
fn only_transposes_with_a_whole_tile_run_in_tiles() {
    for src in [
        transpose_text("f32", &[5, 64], &[1, 0], false),
        transpose_text("f32", &[64, 40, 3], &[0, 2, 1], false),
        transpose_text("f32", &[64, 64], &[0, 1], true),
    ] {
        let (_, plan) = plan_of(&src);
        let rep = EmuReport::of(&plan);
        assert!(
            !rep.launches.contains_key(&MapKind::TransposeTiles),
            "{src}: {rep:?}"
        );
    }
}

/// Every statement of `body`, nested ones included, through `f`.
fn each_stmt(body: &mut Vec<Stmt>, f: &mut dyn FnMut(&mut Vec<Stmt>)) {
    f(body);
    for s in body.iter_mut() {
        match s {
            Stmt::For { body, .. } | Stmt::If { body, .. } => each_stmt(body, f),
            _ => {}
        }
    }
}

#[test]
fn a_tile_read_without_its_padding_or_its_barrier_is_caught() {
    let src = transpose_text("f32", &[70, 45], &[1, 0], false);
    let (f, plan) = plan_of(&src);
    let args = args_of(&f, 5);
    let refs: Vec<&Literal> = args.iter().collect();
    let want = kiln_reference::eval(&f, &args).unwrap();
    assert_eq!(run_plan(&plan, &refs).expect("runs"), want);
    let caught = |plan: &DevicePlan| match run_plan(plan, &refs) {
        Err(_) => true,
        Ok(got) => got != want,
    };
    // The second phase reads its column as if the rows were not padded.
    let mut unpadded = plan.clone();
    let mut changed = 0;
    each_stmt(
        &mut launch_of(&mut unpadded, MapKind::TransposeTiles).body,
        &mut |b| {
            for s in b.iter_mut() {
                if let Stmt::SharedLoad {
                    index: Sc::Add(x, _),
                    ..
                } = s
                    && let Sc::Mul(_, pitch) = x.as_mut()
                    && let Sc::Const(p) = pitch.as_mut()
                {
                    *p -= 1;
                    changed += 1;
                }
            }
        },
    );
    assert_eq!(changed, 1, "one tile read");
    assert!(
        caught(&unpadded),
        "a read without the padding went unnoticed"
    );
    // No barrier between the phases: a warp reads what others have not written yet.
    let mut racy = plan.clone();
    let mut removed = false;
    each_stmt(
        &mut launch_of(&mut racy, MapKind::TransposeTiles).body,
        &mut |b| {
            if !removed && let Some(i) = b.iter().position(|s| matches!(s, Stmt::Barrier)) {
                b.remove(i);
                removed = true;
            }
        },
    );
    assert!(removed, "a barrier");
    assert!(caught(&racy), "a missing barrier went unnoticed");
}

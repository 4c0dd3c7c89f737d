//! A program's device plan and random arguments, shared by the GPU emulator's tests of plans
//! (not every test that includes this module uses all of it).

use kiln_ir::random::{Rng, random_literal, random_literal_with_specials};
use kiln_ir::{DType, Func, Literal};
use kiln_kernel::gpu::ir::{GpuProgram, Stmt};
use kiln_kernel::gpu::plan::{DevicePlan, DeviceStep, device_plan};
use kiln_kernel::target::TargetInfo;

/// `f` lowered with the default options and planned for `target`: its device plan, or the
/// lowering's or the planner's error.
#[allow(dead_code)]
pub fn planned(f: &Func, target: &TargetInfo) -> Result<DevicePlan, String> {
    let opts = kiln_kernel::Options::default();
    let l = kiln_kernel::pipeline::lower_program(f, &[], &opts, target, None, &mut |_| {})
        .map_err(|e| e.to_string())?;
    device_plan(&l, target).map_err(|e| e.to_string())
}

/// Random arguments of `f`'s parameters from `seed` (no special values).
#[allow(dead_code)]
pub fn random_args(f: &Func, seed: u64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect()
}

/// Arguments of `f` for gathers and scatters: floats from the generator, `i32` indices in
/// `0..range` (so that they repeat), one of them out of bounds when `stray` (that update is
/// dropped).
#[allow(dead_code)]
pub fn indexed_args(f: &Func, seed: u64, range: usize, stray: bool) -> Vec<Literal> {
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

/// The kernel steps' programs of `f`'s device plan for `target`.
#[allow(dead_code)]
pub fn programs(f: &Func, target: &TargetInfo) -> Vec<GpuProgram> {
    let plan = planned(f, target).expect("plans");
    plan.steps
        .into_iter()
        .filter_map(|s| match s {
            DeviceStep::Kernel(k) => Some(k.program),
            _ => None,
        })
        .collect()
}

/// The notes of `f`'s plan for `target` (in its launches' bodies, at any depth) that `keep`
/// accepts.
#[allow(dead_code)]
pub fn plan_notes(f: &Func, target: &TargetInfo, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
    fn walk(body: &[Stmt], keep: &dyn Fn(&str) -> bool, notes: &mut Vec<String>) {
        for s in body {
            match s {
                Stmt::Note(n) if keep(n) => notes.push(n.clone()),
                Stmt::For { body, .. } | Stmt::If { body, .. } => walk(body, keep, notes),
                _ => {}
            }
        }
    }
    let mut notes = Vec::new();
    for p in programs(f, target) {
        for l in &p.launches {
            walk(&l.body, keep, &mut notes);
        }
    }
    notes
}

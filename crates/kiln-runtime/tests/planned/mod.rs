//! A program's device plan and random arguments, shared by the GPU emulator's tests of plans
//! (not every test that includes this module uses all of it).

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{Func, Literal};
use kiln_kernel::gpu::plan::{DevicePlan, device_plan};
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

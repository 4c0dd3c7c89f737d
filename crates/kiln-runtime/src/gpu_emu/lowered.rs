//! A lowered program run on the emulator as a GPU runs it: its device plan
//! ([`kiln_kernel::gpu::plan`]: every kernel step mapped to the GPU, one arena whose
//! intermediates share memory as the memory plan packs them, host steps for the
//! instructions without a kernel) run by [`crate::plan_exec`] on an [`EmuDevice`], a byte
//! arena whose launches are emulated. Donation is ignored, as on the device.

use super::EmuError;
use super::device::EmuDevice;
use crate::plan_exec;
use kiln_ir::Literal;
use kiln_kernel::gpu::MapKind;
use kiln_kernel::gpu::plan::{DevicePlan, DeviceStep, device_plan};
use kiln_kernel::pipeline::Lowered;
use kiln_kernel::target::TargetInfo;
use std::collections::BTreeMap;

/// What a run emulated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EmuReport {
    /// Kernel steps mapped and emulated.
    pub kernels: usize,
    /// Launches emulated, per mapping.
    pub launches: BTreeMap<MapKind, usize>,
    /// Kernel steps the mapping refused, run by the reference interpreter instead, with why.
    pub fallbacks: Vec<String>,
    /// Steps without a kernel, run by the reference interpreter.
    pub interpreted: usize,
    /// The ops of those steps (their mnemonics), in program order.
    pub interpreted_ops: Vec<String>,
    /// Control steps (`while`, `case`) whose regions run on the device.
    pub controls: usize,
}

impl std::ops::AddAssign for EmuReport {
    fn add_assign(&mut self, o: EmuReport) {
        self.kernels += o.kernels;
        for (k, n) in o.launches {
            *self.launches.entry(k).or_default() += n;
        }
        self.fallbacks.extend(o.fallbacks);
        self.interpreted += o.interpreted;
        self.interpreted_ops.extend(o.interpreted_ops);
        self.controls += o.controls;
    }
}

impl EmuReport {
    /// What running `plan` emulates: its kernel steps and their launches, the kernels the
    /// mapping refused and the instructions without a kernel, its control steps' regions'
    /// counted once each.
    pub fn of(plan: &DevicePlan) -> EmuReport {
        let mut rep = EmuReport::default();
        for step in &plan.steps {
            match step {
                DeviceStep::Kernel(k) => {
                    rep.kernels += 1;
                    for launch in &k.program.launches {
                        *rep.launches.entry(launch.kind).or_default() += 1;
                    }
                }
                DeviceStep::Host(h) => match &h.refused {
                    Some(why) => rep.fallbacks.push(why.clone()),
                    None => {
                        rep.interpreted += h.insts.len();
                        rep.interpreted_ops.extend(
                            h.insts
                                .iter()
                                .map(|&i| plan.func.insts[i].op.mnemonic().to_string()),
                        );
                    }
                },
                DeviceStep::Control(c) => {
                    rep.controls += 1;
                    for r in &c.regions {
                        rep += EmuReport::of(r);
                    }
                }
            }
        }
        rep
    }
}

/// Runs `l`, lowered for `target` (which must describe a GPU), on `args`: its device plan
/// ([`device_plan`]) run on an emulated device ([`EmuDevice`]) by the executor the CUDA
/// executor uses ([`crate::plan_exec`]).
pub fn run_lowered(
    l: &Lowered,
    target: &TargetInfo,
    args: &[Literal],
) -> Result<(Vec<Literal>, EmuReport), EmuError> {
    let plan = device_plan(l, target).map_err(EmuError)?;
    let refs: Vec<&Literal> = args.iter().collect();
    let outs = run_plan(&plan, &refs)?;
    Ok((outs, EmuReport::of(&plan)))
}

/// Runs `plan` on `args` on a fresh emulated device: its constants loaded, then one call.
pub fn run_plan(plan: &DevicePlan, args: &[&Literal]) -> Result<Vec<Literal>, EmuError> {
    let mut dev = EmuDevice::new(plan);
    plan_exec::load(plan, &mut dev).map_err(EmuError)?;
    plan_exec::run(plan, &mut dev, args).map_err(EmuError)
}

/// Runs `plan` on a fresh emulated device on arguments given as their device bytes
/// ([`plan_exec::write_param_bytes`]), returning the results' bytes: what a device tensor
/// holds, with no conversion through literals (the emulated device's memory is host memory).
pub fn run_plan_bytes(plan: &DevicePlan, args: &[&[u8]]) -> Result<Vec<Vec<u8>>, EmuError> {
    let mut dev = EmuDevice::new(plan);
    plan_exec::load(plan, &mut dev).map_err(EmuError)?;
    plan_exec::write_param_bytes(plan, &mut dev, args).map_err(EmuError)?;
    plan_exec::run_steps(plan, &mut dev).map_err(EmuError)?;
    plan_exec::read_output_bytes(plan, &mut dev).map_err(EmuError)
}

/// `f` compiled for the GPU `target` describes (an H200 by default, see
/// [`TargetInfo::h200`]) and run on the emulator: the backend `KILN_BACKEND=ptx-emulator`
/// selects.
pub fn compile_and_run(
    f: &kiln_ir::Func,
    donated: &[bool],
    opts: &kiln_kernel::Options,
    target: &TargetInfo,
    args: &[Literal],
) -> Result<(Vec<Literal>, EmuReport), EmuError> {
    let l = kiln_kernel::pipeline::lower_program(f, donated, opts, target, None, &mut |_| {})
        .map_err(|e| EmuError(e.to_string()))?;
    run_lowered(&l, target, args)
}

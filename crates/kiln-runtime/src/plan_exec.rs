//! Running a device plan ([`DevicePlan`]) on a device: the one executor the GPU emulator
//! ([`crate::gpu_emu`]) and the CUDA executor (`cuda_exec`) share. A device only copies bytes
//! into and out of its arena and runs one launch ([`PlanDevice`]); the order of the steps,
//! where each value lives, the parameters and constants written, the host steps on the
//! reference interpreter and the results read back are decided here, once, so that what the
//! emulator tests is what a GPU runs.

use kiln_ir::{Literal, Op, TensorType, ValueId};
use kiln_kernel::gpu::plan::{ControlStep, DevicePlan, DeviceStep, HostStep, KernelStep, Region};
use std::collections::HashMap;

/// What a device does for the plan executor.
pub trait PlanDevice {
    /// Writes `bytes` (as many as the region holds) into the arena at `at`.
    fn write(&mut self, at: Region, bytes: &[u8]) -> Result<(), String>;
    /// The bytes of the arena at `at`, once the work before is done.
    fn read(&mut self, at: Region) -> Result<Vec<u8>, String>;
    /// Runs launch `launch` of the plan's kernel step `step` (the `n`th kernel step), its
    /// buffers at their regions ([`KernelStep::region`]).
    fn launch(&mut self, n: usize, step: &KernelStep, launch: usize) -> Result<(), String>;
    /// Copies the bytes at `from` to `to` (regions of one size that do not overlap), after the
    /// work before. By default through the host; a device copies on the device.
    fn copy(&mut self, from: Region, to: Region) -> Result<(), String> {
        let bytes = self.read(from)?;
        self.write(to, &bytes)
    }

    /// Sets every element of the region `at` to `element`, one element's little-endian bytes
    /// (the region a whole number of them), after the work before, on the device: nothing
    /// the size of the region crosses from the host.
    fn fill(&mut self, at: Region, element: &[u8]) -> Result<(), String>;
}

/// The elements `element` repeats in the region `at`, or why it does not fill it.
pub fn fill_count(at: Region, element: &[u8]) -> Result<usize, String> {
    if element.is_empty() || !at.bytes.is_multiple_of(element.len()) {
        return Err(format!(
            "a region of {} bytes filled with elements of {}",
            at.bytes,
            element.len()
        ));
    }
    Ok(at.bytes / element.len())
}

/// The place of `v` in `plan`, or an error naming it.
fn place(plan: &DevicePlan, v: ValueId) -> Result<Region, String> {
    plan.places
        .get(v.index())
        .copied()
        .flatten()
        .ok_or_else(|| format!("%{} is not on the device", v.index()))
}

/// `v`'s value, read back from the device.
fn read_value<D: PlanDevice>(
    plan: &DevicePlan,
    dev: &mut D,
    v: ValueId,
) -> Result<Literal, String> {
    let ty: TensorType = plan.func.values[v.index()].clone();
    let bytes = dev.read(place(plan, v)?)?;
    Literal::from_le_bytes(ty, &bytes).map_err(|e| format!("%{}: {e}", v.index()))
}

/// Writes `l` as `v`'s value on the device.
fn write_value<D: PlanDevice>(
    plan: &DevicePlan,
    dev: &mut D,
    v: ValueId,
    l: &Literal,
) -> Result<(), String> {
    let at = place(plan, v)?;
    let bytes = l.to_le_bytes();
    if bytes.len() != at.bytes {
        return Err(format!(
            "%{}: {} bytes for a region of {}",
            v.index(),
            bytes.len(),
            at.bytes
        ));
    }
    dev.write(at, &bytes)
}

/// Writes the plan's constants, and its control steps' regions': once, when the executable
/// is loaded.
pub fn load<D: PlanDevice>(plan: &DevicePlan, dev: &mut D) -> Result<(), String> {
    for (v, l) in &plan.constants {
        write_value(plan, dev, *v, l)?;
    }
    for s in &plan.steps {
        if let DeviceStep::Control(c) = s {
            for r in &c.regions {
                load(r, dev)?;
            }
        }
    }
    Ok(())
}

/// Runs `plan` (its constants [`load`]ed) on `args`: the parameters written
/// ([`write_params`]), the steps in order ([`run_steps`]), the results read back
/// ([`read_outputs`]).
pub fn run<D: PlanDevice>(
    plan: &DevicePlan,
    dev: &mut D,
    args: &[&Literal],
) -> Result<Vec<Literal>, String> {
    write_params(plan, dev, args)?;
    run_steps(plan, dev)?;
    read_outputs(plan, dev)
}

/// Checks `args` against the program's parameters and writes them into their regions.
pub fn write_params<D: PlanDevice>(
    plan: &DevicePlan,
    dev: &mut D,
    args: &[&Literal],
) -> Result<(), String> {
    kiln_reference::check_args(&plan.func, args).map_err(|e| e.to_string())?;
    for (p, a) in plan.func.params.iter().zip(args) {
        write_value(plan, dev, *p, a)?;
    }
    Ok(())
}

/// The parameters' and results' sizes in bytes, as laid out on a device (little-endian,
/// row-major: [`Literal::to_le_bytes`]).
pub fn param_bytes(plan: &DevicePlan) -> Vec<usize> {
    plan.func
        .params
        .iter()
        .map(|p| value_bytes(plan, *p))
        .collect()
}

/// The results' sizes in bytes (see [`param_bytes`]).
pub fn output_bytes(plan: &DevicePlan) -> Vec<usize> {
    plan.func
        .outputs
        .iter()
        .map(|o| value_bytes(plan, *o))
        .collect()
}

fn value_bytes(plan: &DevicePlan, v: ValueId) -> usize {
    let t = &plan.func.values[v.index()];
    t.numel() * t.dtype.bytes()
}

/// Writes the parameters' bytes (already laid out as on the device: what a device tensor
/// holds) into their regions, each checked against its parameter's size.
pub fn write_param_bytes<D: PlanDevice>(
    plan: &DevicePlan,
    dev: &mut D,
    args: &[&[u8]],
) -> Result<(), String> {
    let sizes = param_bytes(plan);
    if args.len() != sizes.len() {
        return Err(format!(
            "{} arguments for {} parameters",
            args.len(),
            sizes.len()
        ));
    }
    for (k, ((p, a), want)) in plan.func.params.iter().zip(args).zip(sizes).enumerate() {
        if a.len() != want {
            return Err(format!(
                "argument {k}: {} bytes for a parameter of type {} ({want} bytes)",
                a.len(),
                plan.func.values[p.index()]
            ));
        }
        if want > 0 {
            dev.write(place(plan, *p)?, a)?;
        }
    }
    Ok(())
}

/// The results' bytes, read back from their regions.
pub fn read_output_bytes<D: PlanDevice>(
    plan: &DevicePlan,
    dev: &mut D,
) -> Result<Vec<Vec<u8>>, String> {
    plan.func
        .outputs
        .iter()
        .map(|&o| {
            if value_bytes(plan, o) == 0 {
                Ok(Vec::new())
            } else {
                dev.read(place(plan, o)?)
            }
        })
        .collect()
}

/// Runs the plan's steps in order on the parameters already written (a benchmark times this
/// alone, the arguments staying on the device between calls).
pub fn run_steps<D: PlanDevice>(plan: &DevicePlan, dev: &mut D) -> Result<(), String> {
    steps_from(plan, dev, 0)
}

/// The kernel steps of `plan`, its regions' included ([`DevicePlan::kernel_steps`]).
fn kernel_count(plan: &DevicePlan) -> usize {
    plan.kernel_steps().count()
}

/// [`run_steps`] for a plan whose first kernel step is the executable's `first`th.
fn steps_from<D: PlanDevice>(plan: &DevicePlan, dev: &mut D, first: usize) -> Result<(), String> {
    let mut n = first;
    for step in &plan.steps {
        match step {
            DeviceStep::Kernel(k) => {
                zero(dev, k)?;
                for launch in 0..k.program.launches.len() {
                    dev.launch(n, k, launch)?;
                }
                n += 1;
            }
            DeviceStep::Host(h) => host(plan, dev, h)?,
            DeviceStep::Control(c) => {
                control(plan, dev, c, n)?;
                n += c.regions.iter().map(kernel_count).sum::<usize>();
            }
        }
    }
    Ok(())
}

/// Sets the buffers kernel step `k`'s program zeroes ([`GpuProgram::zeroed`], what its float
/// atomics add into) to negative zero, the identity of a float sum, before its launches: a
/// fill on the device ([`PlanDevice::fill`]) with one element's bytes.
///
/// [`GpuProgram::zeroed`]: kiln_kernel::gpu::ir::GpuProgram::zeroed
fn zero<D: PlanDevice>(dev: &mut D, k: &KernelStep) -> Result<(), String> {
    for (b, t) in &k.program.zeroed {
        let at = k
            .region(*b)
            .ok_or_else(|| format!("k{}: no region for {b}", k.inst))?;
        let zero = Literal::try_full(TensorType::new(t.dtype, []), -0.0)
            .map_err(|e| format!("k{}: {e}", k.inst))?;
        dev.fill(at, &zero.to_le_bytes())
            .map_err(|e| format!("k{}: zeroing {b}: {e}", k.inst))?;
    }
    Ok(())
}

/// Copies `plan`'s values `from` into the regions `to` (one for one).
fn copy_values<D: PlanDevice>(dev: &mut D, from: &[Region], to: &[Region]) -> Result<(), String> {
    if from.len() != to.len() {
        return Err(format!("{} values for {} places", from.len(), to.len()));
    }
    for (&a, &b) in from.iter().zip(to) {
        if a != b {
            dev.copy(a, b)?;
        }
    }
    Ok(())
}

/// A control step (its regions' kernel steps the executable's from `first` on): a `while`
/// keeps its carries in its results' regions, runs its condition's plan on them and reads the
/// `pred` back, and runs its body's plan while it holds, the body's results copied back to the
/// carries; a `case` reads its index back (out of range: the last branch, as the reference
/// says) and runs that branch's plan.
fn control<D: PlanDevice>(
    plan: &DevicePlan,
    dev: &mut D,
    c: &ControlStep,
    first: usize,
) -> Result<(), String> {
    let inst = &plan.func.insts[c.inst];
    let places = |vs: &[ValueId]| -> Result<Vec<Region>, String> {
        vs.iter().map(|&v| place(plan, v)).collect()
    };
    // The first kernel step of each region.
    let mut starts = Vec::with_capacity(c.regions.len());
    let mut n = first;
    for r in &c.regions {
        starts.push(n);
        n += kernel_count(r);
    }
    let run_region = |dev: &mut D, k: usize, args: &[Region]| -> Result<Vec<Region>, String> {
        let r = &c.regions[k];
        copy_values(dev, args, &r.params())?;
        steps_from(r, dev, starts[k])?;
        Ok(r.outputs())
    };
    match &inst.op {
        Op::While { .. } => {
            let carries = places(&inst.results)?;
            copy_values(dev, &places(&inst.operands)?, &carries)?;
            loop {
                let done = run_region(dev, 0, &carries)?;
                let go = dev.read(done[0])?;
                if go.first().is_none_or(|&b| b == 0) {
                    return Ok(());
                }
                let next = run_region(dev, 1, &carries)?;
                copy_values(dev, &next, &carries)?;
            }
        }
        Op::Case { .. } => {
            let index = read_value(plan, dev, inst.operands[0])?.to_i64s()[0];
            let last = c.regions.len() - 1;
            let k = usize::try_from(index).map_or(last, |i| i.min(last));
            let outs = run_region(dev, k, &places(&inst.operands[1..])?)?;
            copy_values(dev, &outs, &places(&inst.results)?)
        }
        op => Err(format!(
            "#{}: `{}` is not control flow the device runs",
            c.inst,
            op.mnemonic()
        )),
    }
}

/// The program's results, read back from the device.
pub fn read_outputs<D: PlanDevice>(plan: &DevicePlan, dev: &mut D) -> Result<Vec<Literal>, String> {
    plan.func
        .outputs
        .iter()
        .map(|&o| read_value(plan, dev, o))
        .collect()
}

/// A host step: its operands read back, its instructions on the reference interpreter, its
/// results written.
fn host<D: PlanDevice>(plan: &DevicePlan, dev: &mut D, h: &HostStep) -> Result<(), String> {
    let f = &plan.func;
    let mut local: HashMap<ValueId, Literal> = HashMap::new();
    for &v in &h.reads {
        if let std::collections::hash_map::Entry::Vacant(e) = local.entry(v) {
            e.insert(read_value(plan, dev, v)?);
        }
    }
    for &i in &h.insts {
        let inst = &f.insts[i];
        let mut xs = Vec::with_capacity(inst.operands.len());
        for o in &inst.operands {
            xs.push(match local.get(o) {
                Some(l) => l.clone(),
                None => read_value(plan, dev, *o)?,
            });
        }
        let refs: Vec<&Literal> = xs.iter().collect();
        let tys: Vec<TensorType> = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let outs = if kiln_kernel::host_routine(&inst.op) {
            crate::collective::host_step(&inst.op, &refs, &tys)?
        } else {
            kiln_reference::eval_op(&inst.op, &refs, &tys)
        };
        for (r, l) in inst.results.iter().zip(outs) {
            local.insert(*r, l);
        }
    }
    for &w in &h.writes {
        let l = local
            .get(&w)
            .ok_or_else(|| format!("the host step never computed %{}", w.index()))?;
        write_value(plan, dev, w, l)?;
    }
    Ok(())
}

//! The device plan: how a lowered program runs on a GPU, decided once per executable. The
//! CUDA executor (`kiln-runtime`'s `cuda_exec`) and the GPU emulator (`gpu_emu::run_lowered`)
//! both run it through one executor (`kiln-runtime`'s `plan_exec`), so the code only a real
//! GPU runs is the copies and the launches themselves.
//!
//! Every value the program materializes lives in one device arena, allocated once:
//!
//! - kernel intermediates (values only kernels read, and not returned) share memory as the
//!   memory plan packs them ([`crate::plan::plan`]), never in place of an operand: the PTX
//!   kernels take their buffers `noalias`, so donation is ignored on the device;
//! - parameters, constants, results, and the values the host reads or writes have regions of
//!   their own, after the intermediates; an `optimization_barrier`'s results are its
//!   operands' regions;
//! - the scratch buffers of the mapped kernels (a product before its epilogue) take one region
//!   at the end, which every kernel step reuses (they live within one step).
//!
//! Steps run in program order: a kernel step's launches one after the other, each with its
//! buffers bound to regions ([`KernelStep`]; a sort the GPU takes, [`super::sort`], is one
//! too), after the buffers its program zeroes ([`GpuProgram::zeroed`]: the results float
//! atomics add into, with the options' float atomics on; always the step's own output
//! regions, never an operand's, whatever the memory plan shares or donation asks); a host step ([`HostStep`]: instructions without
//! a kernel, or a kernel the mapping refused) reads its operands back, runs the reference
//! interpreter and writes its results. Constants are written once, when the executable is
//! loaded, the parameters at each call; the results are read back after the last step.
//! Regions start at multiples of [`crate::plan::ALIGN`] bytes.

use super::ir::{Buf, GpuProgram};
use super::map::map;
use super::print::verify;
use crate::Step;
use crate::pipeline::Lowered;
use crate::plan::{ALIGN, plan};
use crate::target::TargetInfo;
use kiln_ir::{Func, Literal, Op, TensorType, ValueId};

/// Bytes of the device arena, from `offset`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Region {
    /// The first byte.
    pub offset: usize,
    /// Its size.
    pub bytes: usize,
}

impl Region {
    /// The byte after its last.
    pub fn end(&self) -> usize {
        self.offset + self.bytes
    }
}

/// A kernel step: the program its kernel was mapped to, and where each of its buffers lives.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelStep {
    /// The instruction.
    pub inst: usize,
    /// The launches, in order.
    pub program: GpuProgram,
    /// The program's inputs (`Buf::Input(i)`): the kernel's operands and their regions.
    pub inputs: Vec<(ValueId, Region)>,
    /// The program's outputs (`Buf::Output(k)`): the instruction's result, then the results
    /// merged into its kernel.
    pub outputs: Vec<(ValueId, Region)>,
    /// The program's scratch buffers (`Buf::Scratch(s)`), in the scratch region.
    pub scratch: Vec<Region>,
    /// The kernel is a byte copy ([`crate::lower::byte_copy`]): its input is read as bytes.
    pub bytes: bool,
}

impl KernelStep {
    /// Where the program's buffer `b` lives.
    pub fn region(&self, b: Buf) -> Option<Region> {
        match b {
            Buf::Input(i) => self.inputs.get(i).map(|x| x.1),
            Buf::Output(k) => self.outputs.get(k).map(|x| x.1),
            Buf::Scratch(s) => self.scratch.get(s).copied(),
        }
    }
}

/// Instructions the host runs on the reference interpreter, between kernel steps.
#[derive(Clone, Debug, PartialEq)]
pub struct HostStep {
    /// The instructions, in order: a refused kernel's members, or one instruction without a
    /// kernel.
    pub insts: Vec<usize>,
    /// The values it reads from the device.
    pub reads: Vec<ValueId>,
    /// The values it writes to the device.
    pub writes: Vec<ValueId>,
    /// Why the mapping refused the kernel these instructions form (`None`: an instruction
    /// without a kernel).
    pub refused: Option<String>,
}

/// A `while` or a `case` whose regions run on the device: the host reads a `while`'s
/// condition or a `case`'s index back and runs the region's own plan, the values moved between
/// the program's regions and the region plan's parameters and results by device copies.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlStep {
    /// The instruction.
    pub inst: usize,
    /// The plans of its regions, in the op's order (a `while`'s condition, then its body; a
    /// `case`'s branches), each in an area of the arena of its own, after the program's.
    pub regions: Vec<DevicePlan>,
}

/// One step of a [`DevicePlan`].
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceStep {
    /// A mapped kernel's launches.
    Kernel(KernelStep),
    /// Instructions on the host.
    Host(HostStep),
    /// Control flow whose regions run on the device.
    Control(ControlStep),
}

/// How a lowered program runs on a GPU (see the module's documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct DevicePlan {
    /// The program (the lowered one).
    pub func: Func,
    /// Per value of [`DevicePlan::func`], its region, if it is materialized.
    pub places: Vec<Option<Region>>,
    /// The arena's size.
    pub arena_bytes: usize,
    /// The part of the arena the intermediates share (its first bytes).
    pub intermediate_bytes: usize,
    /// What the intermediates would take with a region each.
    pub unplanned_bytes: usize,
    /// The scratch buffers' region.
    pub scratch: Region,
    /// The constants, written when the executable is loaded.
    pub constants: Vec<(ValueId, Literal)>,
    /// The steps, in order.
    pub steps: Vec<DeviceStep>,
    /// The shared memory per block its launches were mapped within: what a kernel declares
    /// statically and what a launch with dynamic shared memory may take
    /// ([`crate::target::Gpu::shared_limit`], [`crate::target::Gpu::dynamic_limit`]). A
    /// launch's own count is [`super::ir::GpuKernel::dynamic_shared`]; the emulator holds
    /// launches to these limits.
    pub shared_limits: (usize, usize),
}

impl DevicePlan {
    /// The regions of the parameters, in order.
    pub fn params(&self) -> Vec<Region> {
        self.func
            .params
            .iter()
            .map(|p| self.places[p.index()].unwrap_or_default())
            .collect()
    }

    /// The regions of the results, in order.
    pub fn outputs(&self) -> Vec<Region> {
        self.func
            .outputs
            .iter()
            .map(|o| self.places[o.index()].unwrap_or_default())
            .collect()
    }

    /// Kernel steps and their launches.
    pub fn kernel_steps(&self) -> impl Iterator<Item = &KernelStep> {
        let mut all = Vec::new();
        self.collect_kernel_steps(&mut all);
        all.into_iter()
    }

    /// The kernel steps in the order [`DevicePlan::kernel_steps`] gives them: this plan's in
    /// order, a control step's regions' in their place (region after region).
    fn collect_kernel_steps<'a>(&'a self, out: &mut Vec<&'a KernelStep>) {
        for s in &self.steps {
            match s {
                DeviceStep::Kernel(k) => out.push(k),
                DeviceStep::Host(_) => {}
                DeviceStep::Control(c) => {
                    for r in &c.regions {
                        r.collect_kernel_steps(out);
                    }
                }
            }
        }
    }

    /// Every region of the plan moved `by` bytes further into the arena (a region's plan,
    /// placed after its program's).
    fn relocate(&mut self, by: usize) {
        let shift = |r: &mut Region| r.offset += by;
        for r in self.places.iter_mut().flatten() {
            shift(r);
        }
        shift(&mut self.scratch);
        for s in &mut self.steps {
            match s {
                DeviceStep::Kernel(k) => {
                    for (_, r) in k.inputs.iter_mut().chain(k.outputs.iter_mut()) {
                        shift(r);
                    }
                    for r in &mut k.scratch {
                        shift(r);
                    }
                }
                DeviceStep::Host(_) => {}
                DeviceStep::Control(c) => {
                    for r in &mut c.regions {
                        r.relocate(by);
                    }
                }
            }
        }
    }
}

/// The device plans of the regions of `op` (a `while` or a `case`), each lowered under
/// `l`'s options for `target`, placed at 0.
fn region_plans(op: &Op, l: &Lowered, target: &TargetInfo) -> Result<Vec<DevicePlan>, String> {
    op.regions()
        .into_iter()
        .map(|g| {
            let rl = crate::pipeline::lower_program(g, &[], &l.options, target, None, &mut |_| {})
                .map_err(|e| format!("@{}: {e}", g.name))?;
            device_plan(&rl, target)
        })
        .collect()
}

fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN) * ALIGN
}

fn bytes_of(t: &TensorType) -> usize {
    t.numel() * t.dtype.bytes()
}

/// The device plan of `l`, lowered for `target` (which must describe a GPU): each kernel step
/// mapped ([`map`], f32 products in the precision `l`'s options allow) and its launches verified against the target ([`verify`]: block size,
/// shared memory per block), a kernel the mapping refuses run on the host. An error names the
/// kernel and what does not fit.
pub fn device_plan(l: &Lowered, target: &TargetInfo) -> Result<DevicePlan, String> {
    let f = &l.func;
    let gpu = target
        .gpu
        .as_ref()
        .ok_or_else(|| format!("@{}: the target has no GPU", f.name))?;
    let ty = |v: ValueId| f.values[v.index()].clone();
    // The intermediates, packed as the memory plan packs them, never in place.
    let no_scratch = vec![0; f.insts.len()];
    let memory = plan(
        f,
        &l.steps,
        &l.fused.operands,
        &no_scratch,
        &[],
        &l.fused.extra,
    );
    let mut places: Vec<Option<Region>> = memory
        .slots
        .iter()
        .map(|s| {
            s.as_ref().map(|s| Region {
                offset: s.offset,
                bytes: s.bytes,
            })
        })
        .collect();
    let mut end = aligned(memory.arena_bytes);
    let mut own = |places: &mut Vec<Option<Region>>, v: ValueId| {
        if places[v.index()].is_none() {
            let bytes = bytes_of(&ty(v));
            places[v.index()] = Some(Region { offset: end, bytes });
            end += aligned(bytes);
        }
    };
    for &p in &f.params {
        own(&mut places, p);
    }
    let mut steps = Vec::new();
    let mut constants = Vec::new();
    let mut scratch_bytes = 0usize;
    for (i, inst) in f.insts.iter().enumerate() {
        match (&l.steps[i], &inst.op) {
            (Step::Fused | Step::Merged, _) => {}
            (Step::Constant, Op::Constant { value }) => {
                own(&mut places, inst.results[0]);
                constants.push((inst.results[0], value.clone()));
            }
            (Step::Forward, _) => {
                for (r, o) in inst.results.iter().zip(&inst.operands) {
                    let at = places[o.index()].ok_or_else(|| {
                        format!("#{i} forwards %{}, which is not on the device", o.index())
                    })?;
                    places[r.index()] = Some(at);
                }
            }
            (Step::Kernel, _) => {
                let k = l.fused.kernels[i]
                    .as_ref()
                    .ok_or_else(|| format!("#{i}: a kernel step without a kernel"))?;
                let operands = &l.fused.operands[i];
                let results: Vec<ValueId> = std::iter::once(inst.results[0])
                    .chain(l.fused.extra[i].iter().copied())
                    .collect();
                for &r in &results {
                    own(&mut places, r);
                }
                let in_types: Vec<TensorType> = operands.iter().map(|&o| ty(o)).collect();
                let name = format!("k{i}_{}", inst.op.mnemonic());
                let program = match map(k, &in_types, target, &l.options, &name) {
                    Ok(p) => p,
                    Err(why) => {
                        steps.push(DeviceStep::Host(HostStep {
                            insts: l.fused.members[i].clone(),
                            reads: operands.clone(),
                            writes: results,
                            refused: Some(why),
                        }));
                        continue;
                    }
                };
                for launch in &program.launches {
                    verify(launch, gpu)?;
                }
                let place = |v: ValueId| {
                    places[v.index()].ok_or_else(|| {
                        format!("{name} reads %{}, which is not on the device", v.index())
                    })
                };
                let inputs = operands
                    .iter()
                    .map(|&o| Ok((o, place(o)?)))
                    .collect::<Result<Vec<_>, String>>()?;
                let outputs = results
                    .iter()
                    .map(|&r| Ok((r, place(r)?)))
                    .collect::<Result<Vec<_>, String>>()?;
                let (scratch, at) = scratch_regions(&program);
                scratch_bytes = scratch_bytes.max(at);
                let bytes = crate::lower::is_byte_copy(f, inst);
                steps.push(DeviceStep::Kernel(KernelStep {
                    inst: i,
                    program,
                    inputs,
                    outputs,
                    scratch,
                    bytes,
                }));
            }
            // A `while` or a `case` runs its regions' own plans on the device; a sort or a
            // linear algebra op runs its own launches (`super::own_program`). What is left runs
            // on the host by design (`docs/gpu.md`, "What runs on the host"): the collectives
            // and the grid position, and the sorts `super::sort` leaves.
            (Step::Reference | Step::Control | Step::Host, _) | (Step::Constant, _) => {
                for &r in &inst.results {
                    own(&mut places, r);
                }
                let in_types: Vec<TensorType> = inst.operands.iter().map(|&o| ty(o)).collect();
                let name = format!("k{i}_{}", inst.op.mnemonic());
                if l.steps[i] == Step::Control
                    && matches!(inst.op, Op::While { .. } | Op::Case { .. })
                {
                    match region_plans(&inst.op, l, target) {
                        Ok(regions) => {
                            steps.push(DeviceStep::Control(ControlStep { inst: i, regions }));
                        }
                        Err(why) => steps.push(DeviceStep::Host(HostStep {
                            insts: vec![i],
                            reads: inst.operands.clone(),
                            writes: inst.results.clone(),
                            refused: Some(format!("its regions do not run on the device: {why}")),
                        })),
                    }
                    continue;
                }
                let out_types: Vec<TensorType> = inst.results.iter().map(|&r| ty(r)).collect();
                let top_k = crate::sort::top_k(&l.func, i).map(|t| t.k);
                if let Some(program) =
                    super::own_program(&inst.op, &in_types, &out_types, target, &name, top_k)
                {
                    for launch in &program.launches {
                        verify(launch, gpu)?;
                    }
                    let place = |v: ValueId| {
                        places[v.index()].ok_or_else(|| {
                            format!("{name} reads %{}, which is not on the device", v.index())
                        })
                    };
                    let on_device = |vs: &[ValueId]| {
                        vs.iter()
                            .map(|&v| Ok((v, place(v)?)))
                            .collect::<Result<Vec<_>, String>>()
                    };
                    // A slice longer than a block sorts, and the linear algebra ops, go through
                    // scratch buffers.
                    let (scratch, at) = scratch_regions(&program);
                    scratch_bytes = scratch_bytes.max(at);
                    steps.push(DeviceStep::Kernel(KernelStep {
                        inst: i,
                        program,
                        inputs: on_device(&inst.operands)?,
                        outputs: on_device(&inst.results)?,
                        scratch,
                        bytes: false,
                    }));
                    continue;
                }
                steps.push(DeviceStep::Host(HostStep {
                    insts: vec![i],
                    reads: inst.operands.clone(),
                    writes: inst.results.clone(),
                    refused: None,
                }));
            }
        }
    }
    let scratch = Region {
        offset: end,
        bytes: scratch_bytes,
    };
    // Each region's plan in an area of its own after the scratch buffers: a region's
    // constants stay where they were written, whatever ran since.
    let mut top = aligned(scratch.offset + scratch.bytes);
    for s in &mut steps {
        match s {
            DeviceStep::Kernel(k) => {
                for r in &mut k.scratch {
                    r.offset += scratch.offset;
                }
                check_sizes(k)?;
            }
            DeviceStep::Host(_) => {}
            DeviceStep::Control(c) => {
                for r in &mut c.regions {
                    r.relocate(top);
                    top += aligned(r.arena_bytes);
                }
            }
        }
    }
    for &o in &f.outputs {
        if places[o.index()].is_none() {
            return Err(format!(
                "@{}: result %{} is never materialized on the device",
                f.name,
                o.index()
            ));
        }
    }
    Ok(DevicePlan {
        func: f.clone(),
        places,
        arena_bytes: top.max(scratch.offset + scratch.bytes),
        intermediate_bytes: memory.arena_bytes,
        unplanned_bytes: memory.unplanned_bytes,
        scratch,
        constants,
        steps,
        shared_limits: (gpu.shared_limit(), gpu.dynamic_limit()),
    })
}

/// The regions of `program`'s scratch buffers from the scratch region's start, and the bytes
/// they take.
fn scratch_regions(program: &GpuProgram) -> (Vec<Region>, usize) {
    let mut scratch = Vec::new();
    let mut at = 0;
    for t in &program.scratch {
        scratch.push(Region {
            offset: at,
            bytes: bytes_of(t),
        });
        at += aligned(bytes_of(t));
    }
    (scratch, at)
}

/// Every launch's buffers fit their regions (a kernel's output type is its value's, bytes for
/// bytes), so no launch can write past a region on the device; so do the buffers zeroed
/// before the launches, which must be outputs or scratch (never an operand's region).
fn check_sizes(k: &KernelStep) -> Result<(), String> {
    for (b, t) in &k.program.zeroed {
        let r = match b {
            Buf::Input(_) => None,
            _ => k.region(*b),
        }
        .ok_or_else(|| format!("k{}: zeroes {b}, not an output or scratch", k.inst))?;
        if bytes_of(t) != r.bytes {
            return Err(format!(
                "k{}: zeroes {b} as {t}, its region {} bytes",
                k.inst, r.bytes
            ));
        }
    }
    for launch in &k.program.launches {
        for (b, t) in launch.inputs.iter().chain(&launch.outputs) {
            let r = k
                .region(*b)
                .ok_or_else(|| format!("{}: no region for {b}", launch.name))?;
            let want = bytes_of(t);
            let input_bytes = k.bytes && matches!(b, Buf::Input(_));
            if want != r.bytes && !input_bytes {
                return Err(format!(
                    "{}: {b} is {t} ({want} bytes), its region {} bytes",
                    launch.name, r.bytes
                ));
            }
        }
    }
    Ok(())
}

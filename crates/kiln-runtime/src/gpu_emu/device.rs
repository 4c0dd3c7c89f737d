//! The emulated device a device plan runs on: one byte arena, as the GPU's, and launches
//! emulated on the buffers its regions hold.

use super::{Buffer, EmuError, run_kernel};
use crate::plan_exec::PlanDevice;
use kiln_ir::{DType, Literal, TensorType};
use kiln_kernel::gpu::ir::{Buf, GpuKernel};
use kiln_kernel::gpu::plan::{DevicePlan, KernelStep, Region};

/// A device plan's arena in host memory, filled with `0xff` bytes when made (NaN in every
/// float, -1 in every integer): device memory starts with whatever it held, so a launch that
/// leaves part of its output unwritten shows in the results instead of reading as zeros.
#[derive(Clone, Debug)]
pub struct EmuDevice {
    arena: Vec<u8>,
    /// The shared memory per block a launch may declare statically and take dynamically
    /// ([`DevicePlan::shared_limits`]).
    shared_limits: (usize, usize),
    traffic: Traffic,
}

/// What the executor asked of an emulated device's memory, as a GPU's driver would count it:
/// copies between the host and the arena, and the work done on the arena alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Copies from the host into the arena.
    pub to_device: usize,
    /// The bytes they copied.
    pub to_device_bytes: usize,
    /// Copies from the arena to the host.
    pub to_host: usize,
    /// Copies from one region of the arena to another.
    pub on_device: usize,
    /// Regions set to one element repeated ([`PlanDevice::fill`]).
    pub fills: usize,
}

impl EmuDevice {
    /// The arena of `plan`, and the shared memory its launches may take.
    pub fn new(plan: &DevicePlan) -> EmuDevice {
        EmuDevice {
            arena: vec![0xff; plan.arena_bytes],
            shared_limits: plan.shared_limits,
            traffic: Traffic::default(),
        }
    }

    /// What has been asked of its memory so far.
    pub fn traffic(&self) -> Traffic {
        self.traffic
    }

    /// Stores `bytes` (as many as the region holds) into the arena at `at`: what a launch
    /// writes, or a copy from the host.
    fn store(&mut self, at: Region, bytes: &[u8]) -> Result<(), String> {
        let dst = self.bytes_mut(at)?;
        if bytes.len() != dst.len() {
            return Err(format!(
                "{} bytes written into a region of {}",
                bytes.len(),
                dst.len()
            ));
        }
        dst.copy_from_slice(bytes);
        Ok(())
    }

    /// The arena's bytes at `at`, to write.
    fn bytes_mut(&mut self, at: Region) -> Result<&mut [u8], String> {
        let len = self.arena.len();
        self.arena.get_mut(at.offset..at.end()).ok_or_else(|| {
            format!(
                "bytes {}..{} lie outside the arena of {len}",
                at.offset,
                at.end()
            )
        })
    }

    /// Whether launch `k` fits the shared memory of a block, as the GPU's driver checks it:
    /// arrays declared statically within the static limit, a dynamic array that holds them
    /// within what a block may opt into.
    fn check_shared(&self, k: &GpuKernel) -> Result<(), String> {
        let (fixed, dynamic) = self.shared_limits;
        let too_large = |what: &str, bytes: usize, limit: usize| {
            format!(
                "{}: a kernel too large for shared memory: {bytes} bytes of {what} shared memory per block, more than the {limit} a block may take",
                k.name
            )
        };
        if k.dynamic_shared == 0 {
            if k.shared_bytes() > fixed {
                return Err(too_large("static", k.shared_bytes(), fixed));
            }
            return Ok(());
        }
        let laid = k.shared_offsets().1;
        if k.dynamic_shared < laid {
            return Err(format!(
                "{}: its shared arrays take {laid} bytes, more than the {} of dynamic shared memory it launches with",
                k.name, k.dynamic_shared
            ));
        }
        if k.dynamic_shared > dynamic {
            return Err(too_large("dynamic", k.dynamic_shared, dynamic));
        }
        Ok(())
    }

    fn bytes(&self, at: Region) -> Result<&[u8], String> {
        self.arena.get(at.offset..at.end()).ok_or_else(|| {
            format!(
                "bytes {}..{} lie outside the arena of {}",
                at.offset,
                at.end(),
                self.arena.len()
            )
        })
    }

    /// The program buffer `b` of `step`, of type `t`, as an emulator buffer.
    fn buffer(&self, step: &KernelStep, b: Buf, t: &TensorType) -> Result<Buffer, String> {
        let at = step
            .region(b)
            .ok_or_else(|| format!("k{}: no region for {b}", step.inst))?;
        let name = match b {
            Buf::Input(i) => format!("%{}", step.inputs[i].0.index()),
            Buf::Output(k) => format!("%{}", step.outputs[k].0.index()),
            Buf::Scratch(s) => format!("scratch{s}"),
        };
        let bytes = self.bytes(at)?;
        if step.bytes && matches!(b, Buf::Input(_)) {
            let l = Literal::from_le_bytes(TensorType::new(DType::I8, [bytes.len()]), bytes)
                .map_err(|e| format!("{name}: {e}"))?;
            return Ok(Buffer::from_literal(&name, &l));
        }
        let l = Literal::from_le_bytes(t.clone(), bytes).map_err(|e| format!("{name}: {e}"))?;
        Ok(Buffer::from_literal(&name, &l))
    }
}

impl PlanDevice for EmuDevice {
    fn write(&mut self, at: Region, bytes: &[u8]) -> Result<(), String> {
        self.store(at, bytes)?;
        self.traffic.to_device += 1;
        self.traffic.to_device_bytes += bytes.len();
        Ok(())
    }

    fn read(&mut self, at: Region) -> Result<Vec<u8>, String> {
        let out = self.bytes(at).map(<[u8]>::to_vec)?;
        self.traffic.to_host += 1;
        Ok(out)
    }

    fn copy(&mut self, from: Region, to: Region) -> Result<(), String> {
        self.bytes(from)?;
        self.bytes_mut(to)?;
        if from.bytes != to.bytes || (from.offset < to.end() && to.offset < from.end()) {
            return Err(format!(
                "a copy of bytes {}..{} to {}..{}: of two sizes or overlapping",
                from.offset,
                from.end(),
                to.offset,
                to.end()
            ));
        }
        self.arena.copy_within(from.offset..from.end(), to.offset);
        self.traffic.on_device += 1;
        Ok(())
    }

    fn fill(&mut self, at: Region, element: &[u8]) -> Result<(), String> {
        crate::plan_exec::fill_count(at, element)?;
        for e in self.bytes_mut(at)?.chunks_exact_mut(element.len()) {
            e.copy_from_slice(element);
        }
        self.traffic.fills += 1;
        Ok(())
    }

    fn launch(&mut self, _n: usize, step: &KernelStep, launch: usize) -> Result<(), String> {
        let k = step
            .program
            .launches
            .get(launch)
            .ok_or_else(|| format!("k{}: no launch {launch}", step.inst))?;
        self.check_shared(k)?;
        let ins = k
            .inputs
            .iter()
            .map(|(b, t)| self.buffer(step, *b, t))
            .collect::<Result<Vec<_>, _>>()?;
        let mut outs = k
            .outputs
            .iter()
            .map(|(b, t)| self.buffer(step, *b, t))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Buffer> = ins.iter().collect();
        run_kernel(k, &refs, &mut outs).map_err(|EmuError(e)| e)?;
        for ((b, t), buf) in k.outputs.iter().zip(&outs) {
            let l = buf.to_literal(t).map_err(|EmuError(e)| e)?;
            let at = step
                .region(*b)
                .ok_or_else(|| format!("k{}: no region for {b}", step.inst))?;
            self.store(at, &l.to_le_bytes())?;
        }
        Ok(())
    }
}

//! A device plan ([`DevicePlan`]) run on a real GPU through [`crate::cuda`]: the executor of
//! [`crate::plan_exec`], which the GPU emulator runs too, over a device arena.
//!
//! An executable is made once per compiled program ([`CudaExecutable::new`]): the plan is
//! checked against the device ([`check_fits`]: the arena against its memory, each launch's
//! block, grid, warp and shared memory against its limits), given a stream of its own, its PTX
//! modules loaded (one per kernel step, rendered by the backend: this crate links no LLVM)
//! and their kernels looked up, its arena allocated once and its constants written. A call
//! writes the parameters into the arena, runs the steps on the stream (launches with the
//! mapping's grid and block sizes, and the dynamic shared memory of a launch whose arrays the PTX
//! cannot declare statically, which its kernel is allowed once, when loaded) and reads
//! the results back. Calls of one executable take turns (they share its arena).

use crate::cuda::{DeviceBuffer, DeviceInfo, Gpu, GpuError, Kernel};
use crate::plan_exec::{self, PlanDevice};
use kiln_ir::Literal;
use kiln_kernel::gpu::plan::{DevicePlan, KernelStep, Region};
use std::sync::Mutex;

/// The most blocks a grid's x dimension may have.
const MAX_GRID_X: usize = (1 << 31) - 1;

/// Whether `plan` fits the GPU `info` describes: its arena within the device's memory, and
/// every launch's block, grid, warp and shared memory within the device's limits. Needs no
/// driver (a [`DeviceInfo`] may be made up).
pub fn check_fits(plan: &DevicePlan, info: &DeviceInfo) -> Result<(), GpuError> {
    if plan.arena_bytes > info.total_memory {
        return Err(GpuError::ArenaTooLarge {
            index: info.index,
            bytes: plan.arena_bytes,
            total: info.total_memory,
        });
    }
    for step in plan.kernel_steps() {
        for k in &step.program.launches {
            let unfit = |what: String| GpuError::Unfit {
                index: info.index,
                kernel: k.name.clone(),
                what,
            };
            if k.warp != info.warp_size {
                return Err(unfit(format!(
                    "mapped for warps of {} threads, the device's have {}",
                    k.warp, info.warp_size
                )));
            }
            if k.block > info.max_threads_per_block {
                return Err(unfit(format!(
                    "a block of {} threads, more than the device's {}",
                    k.block, info.max_threads_per_block
                )));
            }
            if k.grid > MAX_GRID_X {
                return Err(unfit(format!(
                    "a grid of {} blocks, more than the {MAX_GRID_X} a launch may have",
                    k.grid
                )));
            }
            if k.dynamic_shared == 0 && k.shared_bytes() > info.shared_memory_per_block {
                return Err(unfit(format!(
                    "{} bytes of shared memory per block, more than the device's {}",
                    k.shared_bytes(),
                    info.shared_memory_per_block
                )));
            }
            if k.dynamic_shared > info.shared_memory_per_block_optin {
                return Err(unfit(format!(
                    "{} bytes of dynamic shared memory per block, more than the {} the device lets a block opt into",
                    k.dynamic_shared, info.shared_memory_per_block_optin
                )));
            }
        }
    }
    Ok(())
}

/// Whether `ptx` holds one module per kernel step of `plan`, each declaring an `.entry` for
/// every launch of its step.
pub fn check_ptx(plan: &DevicePlan, ptx: &[String]) -> Result<(), GpuError> {
    let steps = plan.kernel_steps().count();
    if ptx.len() != steps {
        return Err(GpuError::NoPtx {
            what: format!("{} modules given for {steps} kernel steps", ptx.len()),
        });
    }
    for (step, text) in plan.kernel_steps().zip(ptx) {
        for k in &step.program.launches {
            let entry = k.entry_name();
            let declared = text.match_indices(".entry").any(|(at, _)| {
                text[at + ".entry".len()..]
                    .trim_start()
                    .strip_prefix(entry.as_str())
                    .is_some_and(|r| r.starts_with(|c: char| c == '(' || c.is_whitespace()))
            });
            if !declared {
                return Err(GpuError::NoPtx {
                    what: format!("the module of `{}` declares no `.entry {entry}`", k.name),
                });
            }
        }
    }
    Ok(())
}

/// A program on a GPU: its plan, its stream, its loaded kernels and its arena.
pub struct CudaExecutable {
    gpu: Gpu,
    plan: DevicePlan,
    /// Per kernel step, per launch, its kernel.
    kernels: Vec<Vec<Kernel>>,
    arena: Mutex<DeviceBuffer>,
}

impl std::fmt::Debug for CudaExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaExecutable")
            .field("device", self.gpu.info())
            .field("arena_bytes", &self.plan.arena_bytes)
            .finish()
    }
}

impl CudaExecutable {
    /// Loads `plan` onto `gpu`, `ptx[n]` being the PTX module of its `n`th kernel step (every
    /// launch an `.entry` named [`kiln_kernel::gpu::GpuKernel::entry_name`]).
    pub fn new(gpu: &Gpu, plan: DevicePlan, ptx: &[String]) -> Result<CudaExecutable, GpuError> {
        check_fits(&plan, gpu.info())?;
        check_ptx(&plan, ptx)?;
        let gpu = gpu.with_own_stream()?;
        let mut kernels = Vec::with_capacity(ptx.len());
        for (step, text) in plan.kernel_steps().zip(ptx) {
            let module = gpu.load_ptx(text)?;
            let ks = step
                .program
                .launches
                .iter()
                .map(|k| {
                    let kernel = module.kernel(&k.entry_name())?;
                    if k.dynamic_shared > 0 {
                        kernel.allow_dynamic_shared(k.dynamic_shared)?;
                    }
                    Ok(kernel)
                })
                .collect::<Result<Vec<_>, GpuError>>()?;
            kernels.push(ks);
        }
        let mut arena = gpu.alloc(plan.arena_bytes)?;
        let mut dev = OnGpu {
            gpu: &gpu,
            arena: &mut arena,
            kernels: &kernels,
        };
        plan_exec::load(&plan, &mut dev).map_err(|message| GpuError::Run { message })?;
        Ok(CudaExecutable {
            gpu,
            plan,
            kernels,
            arena: Mutex::new(arena),
        })
    }

    /// The plan it runs.
    pub fn plan(&self) -> &DevicePlan {
        &self.plan
    }

    /// Runs the program on `args` (of its parameter types).
    pub fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>, GpuError> {
        let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        let mut dev = OnGpu {
            gpu: &self.gpu,
            arena: &mut arena,
            kernels: &self.kernels,
        };
        plan_exec::run(&self.plan, &mut dev, args).map_err(|message| GpuError::Run { message })
    }
}

/// A call of an executable on device-resident arguments ([`CudaExecutable::run_resident`]):
/// its steps queued on the executable's stream, its results in the arena until copied out
/// with [`ResidentRun::copy_output`]. It holds the arena: the next call waits for it to drop.
pub struct ResidentRun<'a> {
    exe: &'a CudaExecutable,
    arena: std::sync::MutexGuard<'a, DeviceBuffer>,
}

impl ResidentRun<'_> {
    /// The size in bytes of each result.
    pub fn output_bytes(&self) -> Vec<usize> {
        plan_exec::output_bytes(&self.exe.plan)
    }

    /// Copies result `k` into `dst` (a buffer of at least its size: a new one, or a donated
    /// argument's), on the device, queued on the executable's stream.
    pub fn copy_output(&self, k: usize, dst: &mut DeviceBuffer) -> Result<(), GpuError> {
        let bytes = *self.output_bytes().get(k).ok_or_else(|| GpuError::Run {
            message: format!("the program has no result {k}"),
        })?;
        if bytes == 0 {
            return Ok(());
        }
        let o = self.exe.plan.outputs()[k];
        self.exe
            .gpu
            .copy_between(&self.arena, o.offset, dst, 0, bytes)
    }

    /// Waits for the call's work, the copies out included.
    pub fn finish(self) -> Result<(), GpuError> {
        self.exe.gpu.synchronize()
    }
}

impl CudaExecutable {
    /// The GPU (with the executable's own stream) it runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Runs the program on arguments that live on its GPU (each as many bytes as its
    /// parameter, laid out as [`Literal::to_le_bytes`] lays it out): each copied into the
    /// arena on the device, then the steps queued on the executable's stream. The results stay
    /// in the arena until copied out ([`ResidentRun::copy_output`]), with no copy through the
    /// host; a buffer of an argument may receive a result (donation): the arguments are all
    /// in the arena by then. Host steps, if the plan has any, read their operands back.
    pub fn run_resident(
        &self,
        args: &[(&DeviceBuffer, usize)],
    ) -> Result<ResidentRun<'_>, GpuError> {
        let run = |message: String| GpuError::Run { message };
        let sizes = plan_exec::param_bytes(&self.plan);
        if args.len() != sizes.len() {
            return Err(run(format!(
                "{} arguments for {} parameters",
                args.len(),
                sizes.len()
            )));
        }
        let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        for (k, ((&(b, len), want), at)) in
            args.iter().zip(&sizes).zip(self.plan.params()).enumerate()
        {
            if len != *want || (len > 0 && at.bytes != len) {
                return Err(run(format!(
                    "argument {k}: {len} bytes for a parameter of {want} bytes in a region of {}",
                    at.bytes
                )));
            }
            self.gpu.copy_between(b, 0, &mut arena, at.offset, len)?;
        }
        let mut dev = OnGpu {
            gpu: &self.gpu,
            arena: &mut arena,
            kernels: &self.kernels,
        };
        plan_exec::run_steps(&self.plan, &mut dev).map_err(run)?;
        Ok(ResidentRun { exe: self, arena })
    }

    /// Times `calls` runs of the program on `args`, the arguments written once and left on the
    /// device: per call, the seconds from a synchronized device to the last step's completion
    /// (the results are not read back; host steps, if any, are included).
    pub fn bench(&self, args: &[&Literal], calls: usize) -> Result<Vec<f64>, GpuError> {
        let run = |message: String| GpuError::Run { message };
        let mut arena = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        let mut dev = OnGpu {
            gpu: &self.gpu,
            arena: &mut arena,
            kernels: &self.kernels,
        };
        plan_exec::write_params(&self.plan, &mut dev, args).map_err(run)?;
        let mut times = Vec::with_capacity(calls);
        for _ in 0..calls {
            self.gpu.synchronize()?;
            let start = std::time::Instant::now();
            plan_exec::run_steps(&self.plan, &mut dev).map_err(run)?;
            self.gpu.synchronize()?;
            times.push(start.elapsed().as_secs_f64());
        }
        Ok(times)
    }
}

/// The device [`plan_exec`] runs on: an executable's arena on its stream.
struct OnGpu<'a> {
    gpu: &'a Gpu,
    arena: &'a mut DeviceBuffer,
    kernels: &'a [Vec<Kernel>],
}

impl PlanDevice for OnGpu<'_> {
    fn write(&mut self, at: Region, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() != at.bytes {
            return Err(format!(
                "{} bytes written into a region of {}",
                bytes.len(),
                at.bytes
            ));
        }
        self.gpu
            .write(self.arena, at.offset, bytes)
            .map_err(|e| e.to_string())
    }

    fn read(&mut self, at: Region) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; at.bytes];
        self.gpu
            .read(self.arena, at.offset, &mut out)
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn copy(&mut self, from: Region, to: Region) -> Result<(), String> {
        if from.bytes != to.bytes {
            return Err(format!("a copy of {} bytes into {}", from.bytes, to.bytes));
        }
        self.gpu
            .copy_within(self.arena, from.offset, to.offset, from.bytes)
            .map_err(|e| e.to_string())
    }

    /// A memset of the element's width on the stream; an element of another width (8 bytes,
    /// which no memset of the driver sets) is written from the host.
    fn fill(&mut self, at: Region, element: &[u8]) -> Result<(), String> {
        let n = plan_exec::fill_count(at, element)?;
        if !matches!(element.len(), 1 | 2 | 4) {
            return self.write(at, &element.repeat(n));
        }
        self.gpu
            .fill(self.arena, at.offset, at.bytes, element)
            .map_err(|e| e.to_string())
    }

    fn launch(&mut self, n: usize, step: &KernelStep, launch: usize) -> Result<(), String> {
        let (Some(k), Some(kernel)) = (
            step.program.launches.get(launch),
            self.kernels.get(n).and_then(|ks| ks.get(launch)),
        ) else {
            return Err(format!("kernel step {n} has no launch {launch}"));
        };
        let mut args = Vec::with_capacity(k.inputs.len() + k.outputs.len());
        for (b, _) in k.inputs.iter().chain(&k.outputs) {
            let at = step
                .region(*b)
                .ok_or_else(|| format!("{}: no region for {b}", k.name))?;
            args.push(self.arena.address(at.offset));
        }
        // Each tensor map describes one of the launch's inputs, at its region's address.
        let mut maps = Vec::with_capacity(k.tensor_maps.len());
        for m in &k.tensor_maps {
            let Some(&address) = args.get(m.input).filter(|_| m.input < k.inputs.len()) else {
                return Err(format!("{}: a tensor map of input {}", k.name, m.input));
            };
            maps.push(crate::cuda_tma::encode(m, address).map_err(|e| e.to_string())?);
        }
        // SAFETY: the kernel's parameters are its inputs' and outputs' global pointers, in
        // that order, then its tensor maps (the PTX emitter's signature); the plan sized every region for its
        // buffer's type (`device_plan` checks it) inside the arena, which lives while the
        // executable does.
        unsafe {
            self.gpu.launch(
                kernel,
                (k.grid as u32, 1, 1),
                (k.block as u32, 1, 1),
                k.dynamic_shared as u32,
                &args,
                &maps,
            )
        }
        .map_err(|e| format!("{}: {e}", k.name))
    }
}

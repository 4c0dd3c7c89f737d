//! Where tensor programs run: [`kiln_trace::backend`]'s registry, the CPU backend, and the
//! choice between backends.
//!
//! The CPU backend ([`Cpu`]: fused LLVM kernels, JIT-compiled for this machine) is the
//! default; set `KILN_BACKEND=reference` to run everything on the reference interpreter
//! instead, `KILN_BACKEND=ptx-emulator` to run compiled functions through the GPU mapping on the
//! GPU emulator ([`PtxEmulator`]), `KILN_BACKEND=cuda` (or `cuda:N`) to run them on an NVIDIA
//! GPU ([`Cuda`]), or install another backend with [`set_backend`]. The facade reads the process
//! environment ([`Options::from_vars`]) once, at the first compile, unless [`set_options`]
//! came first.
//!
//! The facade installs these defaults into `kiln_trace` when the program loads, before
//! `main` (a constructor in the platform's init section), so eager ops on a [`crate::Tensor`]
//! run on the CPU with nothing to call first; [`crate::jit`], the transforms, [`options`] and
//! [`backend`] install them too. Without them `kiln_trace` runs nothing: it returns an error
//! that says no backend is installed, never the reference interpreter in the CPU's place.

use crate::{Error, Result};
use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{Func, Literal};
pub use kiln_trace::backend::*;
use kiln_trace::{Device, DeviceArg, DeviceBuffer};
use std::borrow::Cow;
use std::sync::{Arc, Once};

/// The CPU backend: fused LLVM kernels, optimized at O2 for the host CPU.
///
/// # Examples
///
/// ```
/// use kiln::Tensor;
/// use kiln::backend::{Backend, Cpu, Executable};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// let f = kiln::lower::trace_ir(|x: &Tensor| x * 2.0 + 1.0, &x).unwrap();
/// let exe = Cpu.compile(&f).unwrap();
/// let y = Tensor::new(exe.run(&[x.literal().unwrap()]).unwrap().remove(0));
/// assert_eq!(y.to_vec::<f32>().unwrap(), [3.0, 5.0, 7.0]);
/// assert!(exe.peak_bytes().unwrap() >= 3 * 4); // it plans memory
/// assert_eq!(Cpu.name(), "cpu");
/// ```
pub struct Cpu;

struct CpuCompiled(CpuExecutable);

impl Executable for CpuCompiled {
    fn peak_bytes(&self) -> Option<usize> {
        Some(self.0.memory_plan().peak_bytes())
    }
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        self.0
            .call(args)
            .map_err(|e| Error::internal("run", e.to_string()))
    }
    fn run_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>> {
        self.0
            .call_donating(args)
            .map_err(|e| Error::internal("run", e.to_string()))
    }
}

impl Backend for Cpu {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        self.compile_donating(f, &[])
    }
    fn compile_donating(&self, f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
        self.compile_with_options(f, donated, &options())
    }
    fn compile_with_options(
        &self,
        f: &Func,
        donated: &[bool],
        opts: &Options,
    ) -> Result<Arc<dyn Executable>> {
        let exe = CpuExecutable::compile_with_options(f, donated, opts)
            .map_err(|e| Error::internal("compile", e.to_string()))?;
        Ok(Arc::new(CpuCompiled(exe)))
    }
    fn planned_peak(&self, f: &Func, opts: &Options) -> Result<Option<usize>> {
        kiln_codegen_llvm::cpu::planned_peak(f, opts)
            .map(Some)
            .map_err(|e| Error::internal("compile", e.to_string()))
    }
}

/// The GPU mapping on the GPU emulator (`KILN_BACKEND=ptx-emulator`): each function is
/// lowered for an H200 ([`kiln_kernel::TargetInfo::h200`]), its kernels mapped to the GPU IR
/// ([`kiln_kernel::gpu`]) and run, thread by thread, on `kiln_runtime::gpu_emu`, which checks
/// for shared-memory races, divergent barriers and accesses out of bounds; its device plan
/// ([`kiln_kernel::gpu::plan`]) is made at compile time and run as [`Cuda`] runs it. Slow: it is for
/// testing the GPU mapping where there is no GPU.
///
/// # Examples
///
/// ```
/// use kiln::Tensor;
/// use kiln::backend::{Backend, Executable, PtxEmulator};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// let f = kiln::lower::trace_ir(|x: &Tensor| x * 2.0 + 1.0, &x).unwrap();
/// // Every GPU thread emulated on this CPU: the GPU's results, without a GPU.
/// let exe = PtxEmulator.compile(&f).unwrap();
/// let y = Tensor::new(exe.run(&[x.literal().unwrap()]).unwrap().remove(0));
/// assert_eq!(y.to_vec::<f32>().unwrap(), [3.0, 5.0, 7.0]);
/// assert_eq!(PtxEmulator.name(), "ptx-emulator");
/// ```
pub struct PtxEmulator;

struct Emulated {
    plan: kiln_kernel::gpu::plan::DevicePlan,
}

impl Executable for Emulated {
    fn peak_bytes(&self) -> Option<usize> {
        Some(self.plan.arena_bytes)
    }
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        kiln_runtime::gpu_emu::run_plan(&self.plan, args)
            .map_err(|e| Error::internal("run", e.to_string()))
    }
    fn run_device(&self, args: Vec<DeviceArg>) -> Result<Vec<Arc<dyn DeviceBuffer>>> {
        crate::device::emu_run(&self.plan, args)
    }
}

impl Backend for PtxEmulator {
    fn name(&self) -> &'static str {
        "ptx-emulator"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        self.compile_donating(f, &[])
    }
    fn compile_donating(&self, f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
        self.compile_with_options(f, donated, &options())
    }
    fn compile_with_options(
        &self,
        f: &Func,
        donated: &[bool],
        opts: &Options,
    ) -> Result<Arc<dyn Executable>> {
        let plan = device_plan(f, donated, opts, &kiln_kernel::TargetInfo::h200())
            .map_err(|e| Error::internal("compile", e))?;
        Ok(Arc::new(Emulated { plan }))
    }
    /// The emulated H200's arena, as a real GPU's is planned ([`Backend::planned_peak`]).
    fn planned_peak(&self, f: &Func, opts: &Options) -> Result<Option<usize>> {
        let plan = device_plan(f, &[], opts, &kiln_kernel::TargetInfo::h200())
            .map_err(|e| Error::internal("compile", e))?;
        Ok(Some(plan.arena_bytes))
    }
    /// The emulated `cuda:0`'s memory is host memory (see [`crate::device`]).
    fn upload(&self, device: Device, l: &Literal) -> Result<Arc<dyn DeviceBuffer>> {
        crate::device::emu_upload(device, l)
    }
}

/// An NVIDIA GPU (`KILN_BACKEND=cuda` for device 0, `cuda:N` for device N): each function is
/// lowered for the device (its [`kiln_runtime::cuda::DeviceInfo::target_info`]), its kernels
/// mapped to the GPU, its device plan made ([`kiln_kernel::gpu::plan`]), its PTX rendered here
/// (`kiln_codegen_llvm::ptx`, for `sm_90` or `sm_80`) and handed to the runtime's CUDA
/// executor ([`kiln_runtime::cuda_exec`]), which runs the plan as the GPU emulator does. Without
/// a driver or the device, compiling is an error saying what was looked for.
///
/// # Examples
///
/// ```
/// use kiln::Tensor;
/// use kiln::backend::{Backend, Cuda, Executable};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// let f = kiln::lower::trace_ir(|x: &Tensor| x * 2.0 + 1.0, &x).unwrap();
/// match Cuda::new(0).compile(&f) {
///     // With a GPU: the same results as on the CPU.
///     Ok(exe) => {
///         let y = Tensor::new(exe.run(&[x.literal().unwrap()]).unwrap().remove(0));
///         assert_eq!(y.to_vec::<f32>().unwrap(), [3.0, 5.0, 7.0]);
///     }
///     // Without one: an error that says so.
///     Err(e) => assert!(e.message.contains("GPU"), "{e}"),
/// }
/// ```
pub struct Cuda {
    device: std::result::Result<usize, String>,
}

impl Cuda {
    /// GPU `index` (`cuda:index`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::backend::{Backend, Cuda};
    /// use kiln::{DType, Tensor};
    /// // No machine has a thousand GPUs: compiling for one is an error naming it or the driver.
    /// let x = Tensor::ones(DType::F32, [2]);
    /// let f = kiln::lower::trace_ir(|x: &Tensor| x.exp(), &x).unwrap();
    /// let e = Cuda::new(1000).compile(&f).err().unwrap();
    /// assert!(e.message.contains("cuda:1000") || e.message.contains("driver"), "{e}");
    /// assert_eq!(Cuda::new(1000).name(), "cuda");
    /// ```
    pub fn new(index: usize) -> Cuda {
        Cuda { device: Ok(index) }
    }

    /// The backend a `KILN_BACKEND` value names: `cuda` (device 0) or `cuda:N`; any other
    /// value after `cuda:` makes a backend whose compiles fail saying so.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::backend::{Backend, Cuda};
    /// use kiln::{DType, Tensor};
    /// let x = Tensor::ones(DType::F32, [2]);
    /// let f = kiln::lower::trace_ir(|x: &Tensor| x.exp(), &x).unwrap();
    /// let e = Cuda::named("cuda:first").compile(&f).err().unwrap();
    /// assert!(e.message.contains("a GPU is named `cuda` or `cuda:N`"), "{e}");
    /// let e = Cuda::named("tpu").compile(&f).err().unwrap();
    /// assert!(e.message.contains("KILN_BACKEND=tpu names no GPU"), "{e}");
    /// ```
    pub fn named(name: &str) -> Cuda {
        let device = match name.strip_prefix("cuda") {
            Some("") => Ok(0),
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| {
                    format!("KILN_BACKEND={name}: a GPU is named `cuda` or `cuda:N`, N its index")
                }),
            None => Err(format!("KILN_BACKEND={name} names no GPU")),
        };
        Cuda { device }
    }
}

/// The GPUs opened so far, by index: a device is opened once per process, and its modules
/// are shared by the executables compiled for it.
pub(crate) fn open_gpu(index: usize) -> std::result::Result<Arc<kiln_runtime::cuda::Gpu>, String> {
    use std::sync::Mutex;
    static OPEN: Mutex<Vec<(usize, Arc<kiln_runtime::cuda::Gpu>)>> = Mutex::new(Vec::new());
    let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, g)) = open.iter().find(|(i, _)| *i == index) {
        return Ok(g.clone());
    }
    let g = Arc::new(kiln_runtime::cuda::Gpu::open(index).map_err(|e| e.to_string())?);
    open.push((index, g.clone()));
    Ok(g)
}

struct OnGpu(kiln_runtime::cuda_exec::CudaExecutable);

impl Executable for OnGpu {
    fn peak_bytes(&self) -> Option<usize> {
        Some(self.0.plan().arena_bytes)
    }
    fn run(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        self.0
            .run(args)
            .map_err(|e| Error::internal("run", e.to_string()))
    }
    fn run_device(&self, args: Vec<DeviceArg>) -> Result<Vec<Arc<dyn DeviceBuffer>>> {
        crate::device::cuda_run(&self.0, args)
    }
}

impl Backend for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn compile(&self, f: &Func) -> Result<Arc<dyn Executable>> {
        self.compile_donating(f, &[])
    }
    fn compile_donating(&self, f: &Func, donated: &[bool]) -> Result<Arc<dyn Executable>> {
        self.compile_with_options(f, donated, &options())
    }
    fn compile_with_options(
        &self,
        f: &Func,
        donated: &[bool],
        opts: &Options,
    ) -> Result<Arc<dyn Executable>> {
        let fail = |e: String| Error::internal("compile", e);
        let index = self.device.clone().map_err(fail)?;
        let gpu = open_gpu(index).map_err(fail)?;
        let target = gpu.info().target_info();
        let sm = gpu.info().ptx_sm().map_err(|e| fail(e.to_string()))?;
        let plan = device_plan(f, donated, opts, &target).map_err(fail)?;
        let ptx_target = kiln_codegen_llvm::ptx::PtxTarget {
            sm: sm.to_string(),
            features: "+ptx80".into(),
        };
        let ptx = plan
            .kernel_steps()
            .map(|k| kiln_codegen_llvm::ptx::program_ptx(&k.program, &ptx_target))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| fail(e.to_string()))?;
        let exe = kiln_runtime::cuda_exec::CudaExecutable::new(&gpu, plan, &ptx)
            .map_err(|e| fail(e.to_string()))?;
        Ok(Arc::new(OnGpu(exe)))
    }
    /// The device arena the executable would allocate on this backend's GPU (lowered for
    /// the device's own target data); no driver or no such GPU is an error saying so.
    fn planned_peak(&self, f: &Func, opts: &Options) -> Result<Option<usize>> {
        let fail = |e: String| Error::internal("compile", e);
        let index = self.device.clone().map_err(fail)?;
        let gpu = open_gpu(index).map_err(fail)?;
        let plan = device_plan(f, &[], opts, &gpu.info().target_info()).map_err(fail)?;
        Ok(Some(plan.arena_bytes))
    }
    /// A buffer on this backend's GPU, uploaded through pinned memory (see
    /// [`crate::device`]); another index, no driver or no such GPU is an error saying so.
    fn upload(&self, device: Device, l: &Literal) -> Result<Arc<dyn DeviceBuffer>> {
        crate::device::cuda_upload(self.device.clone(), device, l)
    }
}

/// `f` lowered for the GPU `target` describes and its device plan made (its launches, host
/// steps and arena), as the emulator and a real GPU run it.
fn device_plan(
    f: &Func,
    donated: &[bool],
    opts: &Options,
    target: &kiln_kernel::TargetInfo,
) -> std::result::Result<kiln_kernel::gpu::plan::DevicePlan, String> {
    let lowered = kiln_kernel::pipeline::lower_program(f, donated, opts, target, None, &mut |_| {})
        .map_err(|e| e.to_string())?;
    kiln_kernel::gpu::plan::device_plan(&lowered, target)
}

/// The backend `opts` choose: the reference interpreter under `KILN_BACKEND=reference`, the
/// GPU emulator under `KILN_BACKEND=ptx-emulator`, an NVIDIA GPU under `KILN_BACKEND=cuda`
/// (or `cuda:N`), else the CPU backend.
fn pick(opts: &Options) -> Arc<dyn Backend> {
    match opts.backend.as_deref() {
        Some("reference") => Arc::new(Reference),
        Some("ptx-emulator") => Arc::new(PtxEmulator),
        Some(name) if name.starts_with("cuda") => Arc::new(Cuda::named(name)),
        _ => Arc::new(Cpu),
    }
}

/// The process environment's options (see [`kiln_kernel::options::SWITCHES`]): the one place
/// below `main` that reads it.
fn from_environment() -> Options {
    Options::from_vars(&|name| std::env::var(name).ok())
}

/// Installs the facade's defaults into `kiln_trace`: the backend choice ([`pick`]) and the
/// environment as the options' source. Neither replaces what was set in code
/// ([`set_backend`], [`set_options`]); installing again does nothing.
pub(crate) fn install() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        kiln_trace::backend::set_default_backend(pick);
        kiln_trace::backend::set_options_source(from_environment);
    });
}

/// [`install`] as a constructor the platform's loader runs before `main`: its pointer lives in
/// the init section (`.init_array` on ELF systems, `__mod_init_func` on Apple's, `.CRT$XCU`
/// on Windows) and is marked used, so the linker keeps it whenever the facade is linked.
#[used]
#[cfg_attr(
    any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "netbsd",
        target_os = "openbsd",
        target_os = "dragonfly",
        target_os = "illumos"
    ),
    unsafe(link_section = ".init_array")
)]
#[cfg_attr(
    target_vendor = "apple",
    unsafe(link_section = "__DATA,__mod_init_func")
)]
#[cfg_attr(windows, unsafe(link_section = ".CRT$XCU"))]
static INSTALL_AT_LOAD: extern "C" fn() = {
    extern "C" fn install_at_load() {
        install();
    }
    install_at_load
};

/// The options compiles run under: those given to [`set_options`], else the process
/// environment's, read once.
///
/// # Examples
///
/// ```
/// use kiln::Options;
/// // Nothing set in code: the switches the environment gives.
/// let env = Options::from_vars(&|name| std::env::var(name).ok());
/// assert_eq!(kiln::options(), env);
/// // KILN_NO_FUSION=1 would turn fusion off; it is on by default.
/// assert!(Options::from_vars(&|_| None).fusion);
/// ```
pub fn options() -> Options {
    install();
    kiln_trace::backend::options()
}

/// The installed backend: the one set with [`set_backend`], else the CPU backend (the
/// reference interpreter under `KILN_BACKEND=reference`).
///
/// # Examples
///
/// ```
/// use kiln::backend::{self, Backend, Executable};
/// use kiln::{DType, Tensor};
/// let b = backend::backend().unwrap();
/// assert!(["cpu", "reference", "ptx-emulator", "cuda"].contains(&b.name()));
/// let x = Tensor::ones(DType::F32, [2]);
/// let f = kiln::lower::trace_ir(|x: &Tensor| x + 1.0, &x).unwrap();
/// let y = Tensor::new(b.compile(&f).unwrap().run(&[x.literal().unwrap()]).unwrap().remove(0));
/// assert_eq!(y.to_vec::<f32>().unwrap(), [2.0, 2.0]);
/// ```
pub fn backend() -> Result<Arc<dyn Backend>> {
    install();
    kiln_trace::backend::backend()
}

//! The NVIDIA device runtime (feature `cuda`, on by default): a GPU opened through the CUDA
//! driver API, its description, PTX modules loaded by the driver's JIT, a device arena per
//! executable, host↔device copies and kernel launches on one stream.
//!
//! It builds and links without CUDA installed: cudarc loads `libcuda.so` at run time. Every
//! entry point first checks that the driver library is present ([`driver_present`]) and returns
//! a [`GpuError`] saying what was looked for when it is not; nothing here panics for a missing
//! driver, a missing device or a full device. Only the driver is needed at run time: PTX is
//! compiled by the driver (`cuModuleLoadData`), never by nvcc or NVRTC.

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DriverError, PinnedHostSlice,
};
use kiln_kernel::target::TargetInfo;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Why a GPU operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuError {
    /// The CUDA driver library could not be loaded; `looked_for` lists the file names tried.
    NoDriver {
        /// The library names tried, in order.
        looked_for: Vec<String>,
    },
    /// The driver has no device `index`; it has `count`.
    NoDevice {
        /// The device asked for.
        index: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// Allocating `bytes` on device `index` failed: `free` of `total` bytes were free.
    OutOfMemory {
        /// The device.
        index: usize,
        /// The size asked for.
        bytes: usize,
        /// Free device memory before the request.
        free: usize,
        /// The device's memory.
        total: usize,
    },
    /// The driver rejected a PTX module (`message` is the driver's).
    PtxLoad {
        /// The module's first `.entry` name, or `?`.
        module: String,
        /// The driver's error.
        message: String,
    },
    /// A module has no kernel of that name.
    NoKernel {
        /// The name asked for.
        name: String,
    },
    /// A device plan's arena is larger than the device's memory.
    ArenaTooLarge {
        /// The device.
        index: usize,
        /// The arena's size.
        bytes: usize,
        /// The device's memory.
        total: usize,
    },
    /// A launch does not fit the device (its block, grid, warp or shared memory).
    Unfit {
        /// The device.
        index: usize,
        /// The launch's name.
        kernel: String,
        /// What does not fit, with both sizes.
        what: String,
    },
    /// The device is older than the PTX kiln renders.
    TooOld {
        /// The device.
        index: usize,
        /// Its name.
        name: String,
        /// Its compute capability.
        compute_capability: (u32, u32),
    },
    /// The PTX handed to an executable does not match its plan.
    NoPtx {
        /// What is missing.
        what: String,
    },
    /// A call of a loaded executable failed (its arguments, or a copy or launch).
    Run {
        /// What failed.
        message: String,
    },
    /// A driver call failed.
    Driver {
        /// What kiln was doing.
        call: &'static str,
        /// The driver's error.
        message: String,
    },
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoDriver { looked_for } => write!(
                f,
                "no NVIDIA GPU: the CUDA driver library was not found (looked for {}); \
                 install the NVIDIA driver, or run on the CPU",
                looked_for.join(", ")
            ),
            GpuError::NoDevice { index, count } => write!(
                f,
                "no GPU cuda:{index}: the driver reports {count} device{}",
                if *count == 1 { "" } else { "s" }
            ),
            GpuError::OutOfMemory {
                index,
                bytes,
                free,
                total,
            } => write!(
                f,
                "cuda:{index} is out of memory: {bytes} bytes asked for, {free} of {total} free"
            ),
            GpuError::PtxLoad { module, message } => {
                write!(f, "the driver rejected PTX module `{module}`: {message}")
            }
            GpuError::NoKernel { name } => write!(f, "the PTX module has no kernel `{name}`"),
            GpuError::ArenaTooLarge {
                index,
                bytes,
                total,
            } => write!(
                f,
                "the program's device arena needs {bytes} bytes, more than cuda:{index} has \
                 ({total} bytes)"
            ),
            GpuError::Unfit {
                index,
                kernel,
                what,
            } => write!(f, "kernel `{kernel}` does not fit cuda:{index}: {what}"),
            GpuError::TooOld {
                index,
                name,
                compute_capability: (major, minor),
            } => write!(
                f,
                "cuda:{index} ({name}) has compute capability {major}.{minor}; kiln's PTX needs \
                 sm_80 (8.0) or newer"
            ),
            GpuError::NoPtx { what } => write!(f, "no PTX for the device plan: {what}"),
            GpuError::Run { message } => write!(f, "running on the GPU: {message}"),
            GpuError::Driver { call, message } => {
                write!(f, "CUDA driver error in {call}: {message}")
            }
        }
    }
}

impl std::error::Error for GpuError {}

/// A driver error from `call`, as a [`GpuError`].
fn driver(call: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| GpuError::Driver {
        call,
        message: describe(e),
    }
}

/// The driver's name and text for an error code.
fn describe(e: DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{:?} ({})", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

/// The file names the CUDA driver library is looked for under.
pub fn driver_candidates() -> Vec<String> {
    ["cuda", "nvcuda"]
        .iter()
        .flat_map(|l| cudarc::get_lib_name_candidates(l))
        .collect()
}

/// Whether the CUDA driver library can be loaded. Checked before any other driver call: the
/// driver bindings panic when the library is absent.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by name; nothing is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// A [`GpuError::NoDriver`] unless the driver library is present.
fn require_driver() -> Result<(), GpuError> {
    if driver_present() {
        Ok(())
    } else {
        Err(GpuError::NoDriver {
            looked_for: driver_candidates(),
        })
    }
}

/// How many GPUs the driver reports.
pub fn device_count() -> Result<usize, GpuError> {
    require_driver()?;
    let n = CudaContext::device_count().map_err(driver("counting devices"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// What the compiler needs to know about a GPU (it becomes `TargetInfo`'s GPU part).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's ordinal (`cuda:N`).
    pub index: usize,
    /// The product name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability (9, 0) for sm_90.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub multiprocessors: usize,
    /// Threads in a warp.
    pub warp_size: usize,
    /// The most threads in a block.
    pub max_threads_per_block: usize,
    /// Shared memory a block gets by default, in bytes.
    pub shared_memory_per_block: usize,
    /// Shared memory a block can opt into, in bytes.
    pub shared_memory_per_block_optin: usize,
    /// The L2 cache, in bytes.
    pub l2_cache_bytes: usize,
    /// Device memory, in bytes.
    pub total_memory: usize,
}

impl DeviceInfo {
    /// The PTX target name for this device, e.g. `sm_90`.
    pub fn sm(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    /// The SM kiln renders PTX for on this device: `sm_90` on Hopper and newer (the driver
    /// compiles it forward), `sm_80` on Ampere and Ada; older devices are refused.
    pub fn ptx_sm(&self) -> Result<&'static str, GpuError> {
        match self.compute_capability {
            (major, _) if major >= 9 => Ok("sm_90"),
            (8, _) => Ok("sm_80"),
            _ => Err(GpuError::TooOld {
                index: self.index,
                name: self.name.clone(),
                compute_capability: self.compute_capability,
            }),
        }
    }

    /// What the compiler decides with for this device: an H200's target
    /// ([`TargetInfo::h200`]) with this device's multiprocessors, warp, threads per block,
    /// the shared memory a block gets without opting in (what the PTX declares statically)
    /// and what it may opt into (dynamic shared memory), and TF32 tensor cores where it has
    /// them; no warpgroup products (its PTX is not for `sm_90a`).
    pub fn target_info(&self) -> TargetInfo {
        let mut t = TargetInfo::h200();
        if let Some(g) = t.gpu.as_mut() {
            g.sms = self.multiprocessors.max(1);
            g.warp_size = self.warp_size;
            g.max_threads_per_block = self.max_threads_per_block;
            g.shared_memory_per_block = self.shared_memory_per_block;
            g.dynamic_shared_bytes = self.shared_memory_per_block_optin;
            g.elementwise_block = g.elementwise_block.min(self.max_threads_per_block);
            // TF32 tensor cores from compute capability 8.0 (Ampere) on.
            g.tf32 = self.compute_capability.0 >= 8;
            // The PTX is rendered for `sm_90` (or `sm_80`), not the architecture-specific
            // `sm_90a` that warpgroup products need.
            g.wgmma = false;
        }
        t
    }
}

/// An opened GPU: its context, the stream its work runs on, and the PTX modules loaded so
/// far (by text, so a module is compiled by the driver once).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    modules: Arc<Mutex<HashMap<String, Arc<CudaModule>>>>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu").field("info", &self.info).finish()
    }
}

impl Gpu {
    /// Opens GPU `index` (`cuda:index`) with a stream of its own.
    pub fn open(index: usize) -> Result<Gpu, GpuError> {
        let count = device_count()?;
        if index >= count {
            return Err(GpuError::NoDevice { index, count });
        }
        let ctx = CudaContext::new(index).map_err(driver("creating a context"))?;
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        let attr = |a: Attr| -> Result<usize, GpuError> {
            let v = ctx.attribute(a).map_err(driver("querying the device"))?;
            Ok(usize::try_from(v).unwrap_or(0))
        };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("querying the device"))?;
        let info = DeviceInfo {
            index,
            name: ctx.name().map_err(driver("querying the device"))?,
            compute_capability: (major as u32, minor as u32),
            multiprocessors: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            warp_size: attr(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
            max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            shared_memory_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            shared_memory_per_block_optin: attr(
                Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            l2_cache_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            total_memory: ctx.total_mem().map_err(driver("querying the device"))?,
        };
        Ok(Gpu {
            ctx,
            stream,
            info,
            modules: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    /// The same GPU with a stream of its own (an executable's), sharing the modules loaded.
    pub fn with_own_stream(&self) -> Result<Gpu, GpuError> {
        let stream = self.ctx.new_stream().map_err(driver("creating a stream"))?;
        Ok(Gpu {
            ctx: self.ctx.clone(),
            stream,
            info: self.info.clone(),
            modules: self.modules.clone(),
        })
    }

    /// The device's description.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Loads PTX text (compiled by the driver's JIT for this device), or returns the module
    /// loaded from the same text before.
    pub fn load_ptx(&self, ptx: &str) -> Result<Module, GpuError> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(ptx) {
            return Ok(Module(m.clone()));
        }
        let m = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(|e| GpuError::PtxLoad {
                module: first_entry(ptx).unwrap_or("?").to_string(),
                message: describe(e),
            })?;
        modules.insert(ptx.to_string(), m.clone());
        Ok(Module(m))
    }

    /// A device buffer of `bytes` bytes (uninitialized), for an executable's arena: the
    /// request is checked against the free memory first, so a plan too large for the device
    /// is a [`GpuError::OutOfMemory`] naming both sizes.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        let (free, total) = self
            .ctx
            .mem_get_info()
            .map_err(driver("querying free memory"))?;
        let oom = GpuError::OutOfMemory {
            index: self.info.index,
            bytes,
            free,
            total,
        };
        if bytes > free {
            return Err(oom);
        }
        // SAFETY: the buffer is written (by a copy or a kernel) before it is read.
        match unsafe { self.stream.alloc::<u8>(bytes.max(1)) } {
            Ok(b) => Ok(DeviceBuffer(b, None)),
            Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(oom),
            Err(e) => Err(driver("allocating device memory")(e)),
        }
    }

    /// Copies host bytes to a new device buffer.
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer, GpuError> {
        let mut b = self.alloc(bytes.len())?;
        self.stream
            .memcpy_htod(bytes, &mut b.0.slice_mut(..bytes.len()))
            .map_err(driver("copying to the device"))?;
        Ok(b)
    }

    /// Copies a device buffer's first `out.len()` bytes to the host, waiting for the stream's
    /// work before it.
    pub fn download(&self, b: &DeviceBuffer, out: &mut [u8]) -> Result<(), GpuError> {
        self.stream
            .memcpy_dtoh(&b.0.slice(..out.len()), out)
            .map_err(driver("copying from the device"))?;
        self.synchronize()
    }

    /// Copies host bytes to a new device buffer through a pinned staging buffer: the bytes
    /// are copied into page-locked host memory and the copy to the device is queued on the
    /// stream, asynchronously; the staging buffer lives with the device buffer until the copy
    /// is done. Work on other streams that reads the buffer waits for the copy (cudarc records
    /// an event for it).
    pub fn upload_staged(&self, bytes: &[u8]) -> Result<DeviceBuffer, GpuError> {
        let mut b = self.alloc(bytes.len())?;
        if bytes.is_empty() {
            return Ok(b);
        }
        // SAFETY: every byte of the staging buffer is written before the copy reads it.
        let mut staging = unsafe { self.ctx.alloc_pinned::<u8>(bytes.len()) }
            .map_err(driver("allocating pinned host memory"))?;
        staging
            .as_mut_slice()
            .map_err(driver("allocating pinned host memory"))?
            .copy_from_slice(bytes);
        self.stream
            .memcpy_htod(&staging, &mut b.0.slice_mut(..bytes.len()))
            .map_err(driver("copying to the device"))?;
        b.1 = Some(staging);
        Ok(b)
    }

    /// The first `len` bytes of `b`, copied to the host through a pinned staging buffer once
    /// the work that writes them (on any stream) is done.
    pub fn download_staged(&self, b: &DeviceBuffer, len: usize) -> Result<Vec<u8>, GpuError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        if len > b.len() {
            return Err(GpuError::Run {
                message: format!("{len} bytes read from a buffer of {}", b.len()),
            });
        }
        // SAFETY: the copy below writes every byte before the host reads them.
        let mut staging = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(len, 0) }
            .map_err(driver("allocating pinned host memory"))?;
        self.stream
            .memcpy_dtoh(&b.0.slice(..len), &mut staging)
            .map_err(driver("copying from the device"))?;
        // Waits for the copy.
        let out = staging
            .as_slice()
            .map_err(driver("copying from the device"))?
            .to_vec();
        Ok(out)
    }

    /// Copies `bytes` bytes of `src` from byte `from` on into `dst` from byte `to` on, on the
    /// device (queued on the stream, after the work that writes `src` on any stream).
    pub fn copy_between(
        &self,
        src: &DeviceBuffer,
        from: usize,
        dst: &mut DeviceBuffer,
        to: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        if bytes == 0 {
            return Ok(());
        }
        if from + bytes > src.len() || to + bytes > dst.len() {
            return Err(GpuError::Run {
                message: format!(
                    "a copy of {bytes} bytes from byte {from} of a buffer of {} to byte {to} of \
                     one of {}: out of bounds",
                    src.len(),
                    dst.len()
                ),
            });
        }
        self.stream
            .memcpy_dtod(
                &src.0.slice(from..from + bytes),
                &mut dst.0.slice_mut(to..to + bytes),
            )
            .map_err(driver("copying on the device"))
    }

    /// Copies `bytes` into `b` from byte `offset` on (queued on the stream).
    pub fn write(&self, b: &mut DeviceBuffer, offset: usize, bytes: &[u8]) -> Result<(), GpuError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let end = offset + bytes.len();
        if end > b.len() {
            return Err(GpuError::Run {
                message: format!("bytes {offset}..{end} lie outside a buffer of {}", b.len()),
            });
        }
        self.stream
            .memcpy_htod(bytes, &mut b.0.slice_mut(offset..end))
            .map_err(driver("copying to the device"))
    }

    /// Copies `bytes` bytes of `b` from byte `from` on to byte `to` on (queued on the stream;
    /// the two ranges must not overlap).
    pub fn copy_within(
        &self,
        b: &mut DeviceBuffer,
        from: usize,
        to: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        if bytes == 0 || from == to {
            return Ok(());
        }
        let (lo, hi) = (from.min(to), from.max(to));
        if hi + bytes > b.len() || lo + bytes > hi {
            return Err(GpuError::Run {
                message: format!(
                    "a copy of {bytes} bytes from {from} to {to} in a buffer of {}: out of bounds or overlapping",
                    b.len()
                ),
            });
        }
        // SAFETY: both ranges lie inside `b` (checked above) and do not overlap; the copy is
        // queued on the stream every other use of `b` is, so it runs in order with them.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                b.address(to),
                b.address(from),
                bytes,
                self.stream.cu_stream(),
            )
        }
        .map_err(driver("copying on the device"))
    }

    /// Sets the `bytes` bytes of `b` from byte `offset` on to `pattern` repeated: one
    /// element's little-endian bytes, 1, 2 or 4 of them (the driver's 8-, 16- and 32-bit
    /// memsets), `offset` and `bytes` whole elements. Queued on the stream; nothing crosses
    /// from the host but the pattern.
    pub fn fill(
        &self,
        b: &mut DeviceBuffer,
        offset: usize,
        bytes: usize,
        pattern: &[u8],
    ) -> Result<(), GpuError> {
        let width = pattern.len().max(1);
        if !offset.is_multiple_of(width) || !bytes.is_multiple_of(width) || offset + bytes > b.len()
        {
            return Err(GpuError::Run {
                message: format!(
                    "a fill of bytes {offset}..{} with an element of {width} bytes in a buffer \
                     of {}: out of bounds or not whole elements",
                    offset + bytes,
                    b.len()
                ),
            });
        }
        if bytes == 0 && !pattern.is_empty() {
            return Ok(());
        }
        use cudarc::driver::sys;
        let (dst, n, stream) = (b.address(offset), bytes / width, self.stream.cu_stream());
        // SAFETY: the `n` elements from `dst` lie inside `b` (checked above), at an address
        // aligned to the element (the buffer's start is aligned by the driver, `offset` is a
        // multiple of the width); the memset is queued on the stream every other use of `b`
        // is, so it runs in order with them.
        let r = unsafe {
            match *pattern {
                [x] => sys::cuMemsetD8Async(dst, x, n, stream),
                [x, y] => sys::cuMemsetD16Async(dst, u16::from_le_bytes([x, y]), n, stream),
                [x, y, z, w] => {
                    sys::cuMemsetD32Async(dst, u32::from_le_bytes([x, y, z, w]), n, stream)
                }
                _ => {
                    return Err(GpuError::Run {
                        message: format!(
                            "a fill with an element of {} bytes: the device sets elements of \
                             1, 2 or 4 bytes",
                            pattern.len()
                        ),
                    });
                }
            }
        };
        r.result().map_err(driver("filling device memory"))
    }

    /// Copies `out.len()` bytes of `b` from byte `offset` on to the host, waiting for the
    /// stream's work before it.
    pub fn read(&self, b: &DeviceBuffer, offset: usize, out: &mut [u8]) -> Result<(), GpuError> {
        if out.is_empty() {
            return Ok(());
        }
        let end = offset + out.len();
        if end > b.len() {
            return Err(GpuError::Run {
                message: format!("bytes {offset}..{end} lie outside a buffer of {}", b.len()),
            });
        }
        self.stream
            .memcpy_dtoh(&b.0.slice(offset..end), out)
            .map_err(driver("copying from the device"))?;
        self.synchronize()
    }

    /// Launches `kernel` on `grid` blocks of `block` threads with `shared` bytes of dynamic
    /// shared memory; `args` are the kernel's parameters in order (device addresses from
    /// [`DeviceBuffer::address`] and integers, each 64 bits), then `maps` its tensor maps
    /// (128 bytes each, [`crate::cuda_tma::encode`]).
    ///
    /// # Safety
    /// The kernel's parameters must be `args.len()` 64-bit values then `maps.len()` tensor
    /// maps, and every address it reads or writes at these arguments (the maps' tensors too)
    /// must lie inside live buffers of this GPU.
    pub unsafe fn launch(
        &self,
        kernel: &Kernel,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        args: &[u64],
        maps: &[crate::cuda_tma::EncodedTensorMap],
    ) -> Result<(), GpuError> {
        use cudarc::driver::PushKernelArg;
        let mut b = self.stream.launch_builder(&kernel.0);
        for a in args {
            b.arg(a);
        }
        for m in maps {
            b.arg(m);
        }
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: shared,
        };
        // SAFETY: the caller vouches for the arguments.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(driver("launching a kernel"))
    }

    /// Waits for the stream's work.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(driver("waiting for the device"))
    }
}

/// The first `.entry` name of a PTX module.
fn first_entry(ptx: &str) -> Option<&str> {
    let rest = &ptx[ptx.find(".entry")? + ".entry".len()..];
    let name = rest.trim_start();
    let end = name.find(|c: char| c == '(' || c.is_whitespace())?;
    Some(&name[..end])
}

/// A loaded PTX module.
#[derive(Clone, Debug)]
pub struct Module(Arc<CudaModule>);

impl Module {
    /// The kernel `name` of this module.
    pub fn kernel(&self, name: &str) -> Result<Kernel, GpuError> {
        self.0
            .load_function(name)
            .map(Kernel)
            .map_err(|_| GpuError::NoKernel {
                name: name.to_string(),
            })
    }
}

/// A kernel of a loaded module.
#[derive(Clone, Debug)]
pub struct Kernel(CudaFunction);

impl Kernel {
    /// Lets the kernel's launches take `bytes` of dynamic shared memory (the function's
    /// `MAX_DYNAMIC_SHARED_SIZE_BYTES`): more than the 48 KiB a launch gets unasked needs it,
    /// up to the device's [`DeviceInfo::shared_memory_per_block_optin`]. Set once, after
    /// loading.
    pub fn allow_dynamic_shared(&self, bytes: usize) -> Result<(), GpuError> {
        let bytes = i32::try_from(bytes).map_err(|_| GpuError::Run {
            message: format!("{bytes} bytes of dynamic shared memory"),
        })?;
        self.0
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
            .map_err(driver("allowing dynamic shared memory"))
    }
}

/// Device memory, freed when dropped; with the pinned host buffer an upload was staged in,
/// kept until the copy is done (dropping it waits for the copy).
#[derive(Debug)]
pub struct DeviceBuffer(CudaSlice<u8>, Option<PinnedHostSlice<u8>>);

impl DeviceBuffer {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// Frees the pinned buffer an upload was staged in ([`Gpu::upload_staged`]), once its
    /// copy is done (this waits for it).
    pub fn release_staging(&mut self) {
        self.1 = None;
    }

    /// The device address of byte `offset`, for a kernel argument.
    pub fn address(&self, offset: usize) -> u64 {
        use cudarc::driver::DevicePtr;
        let (p, _sync) = self.0.device_ptr(self.0.stream());
        p + offset as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine without the driver (CI's) gets a clear error from every entry point, and no
    /// panic; a machine with one opens device 0 and refuses an index past its devices.
    #[test]
    fn every_entry_point_says_when_there_is_no_gpu() {
        if driver_present() {
            let n = device_count().expect("the driver counts its devices");
            let e = Gpu::open(n).unwrap_err();
            assert_eq!(e, GpuError::NoDevice { index: n, count: n });
            if n > 0 {
                let g = Gpu::open(0).expect("device 0 opens");
                assert!(g.info().warp_size == 32, "{:?}", g.info());
                let e = g.alloc(g.info().total_memory * 2).unwrap_err();
                assert!(matches!(e, GpuError::OutOfMemory { .. }), "{e}");
                let e = g.load_ptx("not ptx").unwrap_err();
                assert!(matches!(e, GpuError::PtxLoad { .. }), "{e}");
            }
            return;
        }
        for e in [device_count().unwrap_err(), Gpu::open(0).unwrap_err()] {
            let GpuError::NoDriver { looked_for } = &e else {
                panic!("{e}")
            };
            assert!(looked_for.iter().any(|l| l == "libcuda.so"), "{e}");
            let text = e.to_string();
            assert!(
                text.starts_with(
                    "no NVIDIA GPU: the CUDA driver library was not found (looked for libcuda.so"
                ),
                "{text}"
            );
        }
    }

    #[test]
    fn errors_name_what_failed() {
        let cases = [
            (
                GpuError::NoDevice { index: 3, count: 1 },
                "no GPU cuda:3: the driver reports 1 device",
            ),
            (
                GpuError::OutOfMemory {
                    index: 0,
                    bytes: 10,
                    free: 4,
                    total: 8,
                },
                "cuda:0 is out of memory: 10 bytes asked for, 4 of 8 free",
            ),
            (
                GpuError::PtxLoad {
                    module: "k0".into(),
                    message: "CUDA_ERROR_INVALID_PTX".into(),
                },
                "the driver rejected PTX module `k0`: CUDA_ERROR_INVALID_PTX",
            ),
            (
                GpuError::NoKernel { name: "k9".into() },
                "the PTX module has no kernel `k9`",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.to_string(), want);
        }
    }

    #[test]
    fn a_module_is_named_by_its_first_entry() {
        let ptx =
            ".version 8.0\n.target sm_90\n.visible .entry k3_add(\n .param .u64 a\n)\n{ ret; }";
        assert_eq!(first_entry(ptx), Some("k3_add"));
        assert_eq!(first_entry(".version 8.0"), None);
    }
}

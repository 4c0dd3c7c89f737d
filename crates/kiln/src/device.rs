//! Device memory of the GPU backends: the buffers behind device tensors
//! ([`kiln_trace::DeviceBuffer`]) and how compiled programs run on them.
//!
//! Under [`crate::backend::Cuda`] (`KILN_BACKEND=cuda` or `cuda:N`) a device tensor is a buffer
//! on that GPU: uploaded through a pinned staging buffer by an asynchronous copy, downloaded
//! the same way, and given to a compiled program by a copy on the device into the program's
//! arena (the program runs on its own stream); its results are copied, on the device, into new
//! buffers or into the buffers of donated arguments of their size. Under
//! [`crate::backend::PtxEmulator`] (`KILN_BACKEND=ptx-emulator`) the emulated `cuda:0`'s memory
//! is host memory, and programs run on the emulator from the buffers' bytes: everything a
//! device tensor does is tested without a GPU. The CUDA path has not been run on a GPU yet.
//!
//! ```
//! use kiln::backend::{PtxEmulator, set_backend};
//! use kiln::{Device, Tensor, jit};
//! set_backend(std::sync::Arc::new(PtxEmulator));
//! let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap().to(Device::Cuda(0));
//! assert_eq!(x.device(), Device::Cuda(0));
//! let y = jit(|x: &Tensor| x * 2.0 + 1.0).call(&x).unwrap(); // runs on the device
//! assert_eq!(y.device(), Device::Cuda(0));
//! assert_eq!(y.to_vec::<f32>().unwrap(), [3.0, 5.0, 7.0]); // read back
//! ```

use crate::{Error, Result};
use kiln_ir::Literal;
use kiln_kernel::gpu::plan::DevicePlan;
use kiln_runtime::cuda::{DeviceBuffer as GpuBuffer, Gpu};
use kiln_trace::{Device, DeviceArg, DeviceBuffer};
use std::any::Any;
use std::sync::{Arc, Mutex, RwLock};

/// A failure of the device runtime, as an error of `op`.
fn fail(op: &str) -> impl Fn(String) -> Error + '_ {
    move |m| Error::internal(op, m)
}

/// Buffers of one backend, found among `args` (a buffer of another backend, made before the
/// backend was changed, is an error naming both).
fn own<'a, B: 'static>(args: &'a [DeviceArg], backend: &str) -> Result<Vec<&'a B>> {
    args.iter()
        .enumerate()
        .map(|(k, a)| {
            a.buffer.as_any().downcast_ref::<B>().ok_or_else(|| {
                Error::internal(
                    "run",
                    format!(
                        "argument {k} lives on {} of the `{}` backend, not of the installed \
                         `{backend}` backend: move it with `.to(Device::Cpu)` and back",
                        a.buffer.device(),
                        a.buffer.backend()
                    ),
                )
            })
        })
        .collect()
}

/// The donated arguments whose buffers no other handle holds, by size: where results of that
/// size may be written.
fn donated_by_size(args: &[DeviceArg]) -> Vec<(usize, Arc<dyn DeviceBuffer>)> {
    args.iter()
        .filter(|a| a.donated)
        .map(|a| (a.buffer.len(), a.buffer.clone()))
        .collect()
}

/// Takes a donated buffer of `len` bytes out of `pool` when the caller's was the only handle
/// besides the pool's (and the argument list's, dropped by then).
fn take_donated(
    pool: &mut Vec<(usize, Arc<dyn DeviceBuffer>)>,
    len: usize,
) -> Option<Arc<dyn DeviceBuffer>> {
    let k = pool
        .iter()
        .position(|(l, b)| *l == len && len > 0 && Arc::strong_count(b) == 1)?;
    Some(pool.swap_remove(k).1)
}

/// The emulated GPU's memory: host bytes.
pub(crate) struct EmuBuffer {
    bytes: RwLock<Vec<u8>>,
}

impl DeviceBuffer for EmuBuffer {
    fn device(&self) -> Device {
        Device::Cuda(0)
    }
    fn backend(&self) -> &'static str {
        "ptx-emulator"
    }
    fn len(&self) -> usize {
        self.bytes.read().unwrap_or_else(|e| e.into_inner()).len()
    }
    fn read(&self) -> std::result::Result<Vec<u8>, String> {
        Ok(self.bytes.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `l` in the emulated GPU's memory: the emulator emulates one device, `cuda:0`.
pub(crate) fn emu_upload(device: Device, l: &Literal) -> Result<Arc<dyn DeviceBuffer>> {
    if device != Device::Cuda(0) {
        return Err(Error::internal(
            "to",
            format!(
                "no GPU {device}: the GPU emulator (KILN_BACKEND=ptx-emulator) emulates one \
                 device, cuda:0"
            ),
        ));
    }
    Ok(Arc::new(EmuBuffer {
        bytes: RwLock::new(l.to_le_bytes()),
    }))
}

/// Runs `plan` on the emulator from emulated device buffers; results in new buffers or in
/// donated arguments' of their size.
pub(crate) fn emu_run(
    plan: &DevicePlan,
    args: Vec<DeviceArg>,
) -> Result<Vec<Arc<dyn DeviceBuffer>>> {
    let bytes: Vec<Vec<u8>> = own::<EmuBuffer>(&args, "ptx-emulator")?
        .into_iter()
        .map(|b| b.bytes.read().unwrap_or_else(|e| e.into_inner()).clone())
        .collect();
    let mut pool = donated_by_size(&args);
    drop(args);
    let refs: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    let outs = kiln_runtime::gpu_emu::run_plan_bytes(plan, &refs).map_err(|e| fail("run")(e.0))?;
    Ok(outs
        .into_iter()
        .map(|o| match take_donated(&mut pool, o.len()) {
            Some(b) => {
                let emu = b
                    .as_any()
                    .downcast_ref::<EmuBuffer>()
                    .expect("checked above");
                *emu.bytes.write().unwrap_or_else(|e| e.into_inner()) = o;
                b
            }
            None => Arc::new(EmuBuffer {
                bytes: RwLock::new(o),
            }) as Arc<dyn DeviceBuffer>,
        })
        .collect())
}

/// Memory on an NVIDIA GPU: the buffer (at least one byte long), the tensor's size in bytes,
/// and the opened GPU whose stream copies it in and out.
pub(crate) struct CudaBuffer {
    gpu: Arc<Gpu>,
    buffer: Mutex<GpuBuffer>,
    len: usize,
}

impl DeviceBuffer for CudaBuffer {
    fn device(&self) -> Device {
        Device::Cuda(self.gpu.info().index)
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self) -> std::result::Result<Vec<u8>, String> {
        let b = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        self.gpu
            .download_staged(&b, self.len)
            .map_err(|e| e.to_string())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `l` on GPU `device`, for the backend that runs on GPU `index` (the driver and the device
/// checked first: no driver, or no such GPU, is an error saying what was looked for).
pub(crate) fn cuda_upload(
    index: std::result::Result<usize, String>,
    device: Device,
    l: &Literal,
) -> Result<Arc<dyn DeviceBuffer>> {
    let index = index.map_err(fail("to"))?;
    let Device::Cuda(want) = device else {
        return Err(Error::internal("to", "the host is no GPU"));
    };
    let gpu = crate::backend::open_gpu(want).map_err(fail("to"))?;
    if want != index {
        return Err(Error::internal(
            "to",
            format!(
                "cannot move a tensor to {device}: the installed backend runs on cuda:{index} \
                 (KILN_BACKEND=cuda:{want} runs on {device})"
            ),
        ));
    }
    let bytes = l.to_le_bytes();
    let buffer = gpu
        .upload_staged(&bytes)
        .map_err(|e| fail("to")(e.to_string()))?;
    Ok(Arc::new(CudaBuffer {
        gpu,
        buffer: Mutex::new(buffer),
        len: bytes.len(),
    }))
}

/// Runs `exe` on its GPU from device buffers there; results copied on the device into new
/// buffers or into donated arguments' of their size.
pub(crate) fn cuda_run(
    exe: &kiln_runtime::cuda_exec::CudaExecutable,
    args: Vec<DeviceArg>,
) -> Result<Vec<Arc<dyn DeviceBuffer>>> {
    let gpu_err = |e: kiln_runtime::cuda::GpuError| fail("run")(e.to_string());
    let bufs = own::<CudaBuffer>(&args, "cuda")?;
    let index = exe.gpu().info().index;
    if let Some((k, b)) = bufs
        .iter()
        .enumerate()
        .find(|(_, b)| b.gpu.info().index != index)
    {
        return Err(Error::internal(
            "run",
            format!(
                "argument {k} lives on {}, the program runs on cuda:{index}",
                b.device()
            ),
        ));
    }
    // Each buffer locked once, though a tensor may be passed twice.
    let mut unique: Vec<&CudaBuffer> = Vec::new();
    let slot: Vec<usize> = bufs
        .iter()
        .map(|b| match unique.iter().position(|u| std::ptr::eq(*u, *b)) {
            Some(i) => i,
            None => {
                unique.push(b);
                unique.len() - 1
            }
        })
        .collect();
    let guards: Vec<_> = unique
        .iter()
        .map(|b| {
            let mut g = b.buffer.lock().unwrap_or_else(|e| e.into_inner());
            g.release_staging();
            g
        })
        .collect();
    let refs: Vec<(&GpuBuffer, usize)> = slot
        .iter()
        .zip(&bufs)
        .map(|(&i, b)| (&*guards[i], b.len))
        .collect();
    let run = exe.run_resident(&refs).map_err(gpu_err)?;
    drop(refs);
    drop(guards);
    let gpu = bufs.first().map(|b| b.gpu.clone());
    let mut pool = donated_by_size(&args);
    drop(args);
    let gpu = match gpu {
        Some(g) => g,
        None => crate::backend::open_gpu(index).map_err(fail("run"))?,
    };
    let mut outs: Vec<Arc<dyn DeviceBuffer>> = Vec::new();
    for (k, len) in run.output_bytes().into_iter().enumerate() {
        match take_donated(&mut pool, len) {
            Some(b) => {
                let cb = b
                    .as_any()
                    .downcast_ref::<CudaBuffer>()
                    .expect("checked above");
                let mut g = cb.buffer.lock().unwrap_or_else(|e| e.into_inner());
                run.copy_output(k, &mut g).map_err(gpu_err)?;
                drop(g);
                outs.push(b);
            }
            None => {
                // Allocated on the program's stream, which writes it.
                let mut fresh = exe.gpu().alloc(len).map_err(gpu_err)?;
                run.copy_output(k, &mut fresh).map_err(gpu_err)?;
                outs.push(Arc::new(CudaBuffer {
                    gpu: gpu.clone(),
                    buffer: Mutex::new(fresh),
                    len,
                }));
            }
        }
    }
    run.finish().map_err(gpu_err)?;
    Ok(outs)
}

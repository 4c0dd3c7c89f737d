//! Device-resident tensors: a tensor whose bytes live in a device's memory, owned by the
//! backend that put them there.
//!
//! [`Tensor::to`] with [`Device::Cuda`] uploads a host tensor through the installed backend
//! ([`crate::backend::Backend::upload`]); the result keeps the backend's [`DeviceBuffer`] and
//! its type, and reports its [`Device`]. Reading it ([`Tensor::to_vec`], [`Tensor::item`],
//! [`Tensor::literal`], `.to(Device::Cpu)`) downloads it once; the host copy is kept with the
//! tensor, whose value never changes. A compiled function called with device tensors runs on
//! their device and returns device tensors ([`crate::backend::Executable::run_device`]); an
//! eager op on device tensors runs there too, as the backend's one-op program (host scalars
//! used with them, like `2.0` in `&x * 2.0`, are moved to the device first).
//!
//! A host tensor of more than one element used with a device tensor in one op, or tensors on
//! two devices, are errors naming the op and the caller's line: kiln never moves data behind
//! the program's back.
//!
//! ```
//! use kiln_trace::{Device, Tensor};
//! // With a backend without device memory (here: none installed), moving fails clearly.
//! let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
//! let e = x.to(Device::Cuda(0)).error().unwrap().to_string();
//! assert!(e.contains("to: ") && e.contains("cuda:0"), "{e}");
//! ```

use crate::tensor::{Device, Repr, Tensor};
use crate::{Error, Result};
use kiln_ir::{Literal, Loc, TensorType};
use std::any::Any;
use std::sync::{Arc, OnceLock};

/// Memory on a device holding one tensor's bytes (little-endian, row-major, as
/// [`Literal::to_le_bytes`] lays them out), made by a backend's
/// [`crate::backend::Backend::upload`] or by an executable's
/// [`crate::backend::Executable::run_device`], and freed when the last handle drops.
///
/// # Examples
///
/// A backend whose "device" is host memory (what a test or an emulator provides):
///
/// ```
/// use kiln_trace::{Device, DeviceBuffer, Tensor};
/// use kiln_ir::{DType, TensorType};
/// use std::sync::Arc;
/// struct InHost(Vec<u8>);
/// impl DeviceBuffer for InHost {
///     fn device(&self) -> Device { Device::Cuda(0) }
///     fn backend(&self) -> &'static str { "in-host" }
///     fn len(&self) -> usize { self.0.len() }
///     fn read(&self) -> Result<Vec<u8>, String> { Ok(self.0.clone()) }
///     fn as_any(&self) -> &dyn std::any::Any { self }
/// }
/// let buf = Arc::new(InHost(1.5f32.to_le_bytes().to_vec()));
/// let t = Tensor::on_device(buf, TensorType::scalar(DType::F32)).unwrap();
/// assert_eq!((t.device(), t.item().unwrap()), (Device::Cuda(0), 1.5));
/// ```
pub trait DeviceBuffer: Send + Sync + 'static {
    /// The device the bytes live on.
    fn device(&self) -> Device;
    /// The name of the backend that owns the memory ([`crate::backend::Backend::name`]).
    fn backend(&self) -> &'static str;
    /// Its size in bytes.
    fn len(&self) -> usize;
    /// Whether it holds no bytes (an empty tensor's).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies the bytes to the host, once the work that writes them is done.
    fn read(&self) -> std::result::Result<Vec<u8>, String>;
    /// The buffer as `Any`, for its backend to find its own type.
    fn as_any(&self) -> &dyn Any;
}

/// A device buffer passed to [`crate::backend::Executable::run_device`].
///
/// # Examples
///
/// See [`crate::backend::Executable::run_device`].
#[derive(Clone)]
pub struct DeviceArg {
    /// The argument's bytes.
    pub buffer: Arc<dyn DeviceBuffer>,
    /// Whether the caller gave the buffer up (`Jit::call_donating`): the executable may write
    /// a result of the same size into it, when no other handle holds it.
    pub donated: bool,
}

/// A device tensor: its buffer, its type, and its host copy once read.
pub(crate) struct DeviceRepr {
    pub(crate) buffer: Arc<dyn DeviceBuffer>,
    pub(crate) ty: TensorType,
    host: OnceLock<std::result::Result<Literal, String>>,
}

impl DeviceRepr {
    /// The value, downloaded the first time.
    pub(crate) fn literal(&self) -> Result<&Literal> {
        self.host
            .get_or_init(|| {
                let bytes = self.buffer.read()?;
                Literal::from_le_bytes(self.ty.clone(), &bytes).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| {
                Error::internal(
                    "to_literal",
                    format!(
                        "cannot read a {} tensor back from {}: {e}",
                        self.ty,
                        self.buffer.device()
                    ),
                )
            })
    }
}

impl Tensor {
    /// A tensor of type `ty` whose bytes are `buffer` on a device (what a backend's upload or
    /// device run returns), or an error if the buffer's size is not the type's.
    ///
    /// # Examples
    ///
    /// See [`DeviceBuffer`].
    pub fn on_device(buffer: Arc<dyn DeviceBuffer>, ty: TensorType) -> Result<Tensor> {
        let want = ty.byte_size();
        if want != Some(buffer.len()) {
            return Err(Error::internal(
                "to",
                format!(
                    "a {ty} tensor needs {} bytes, the buffer on {} holds {}",
                    want.map_or_else(|| "too many".to_string(), |b| b.to_string()),
                    buffer.device(),
                    buffer.len()
                ),
            ));
        }
        Ok(Tensor::from_repr(Repr::Device(Box::new(DeviceRepr {
            buffer,
            ty,
            host: OnceLock::new(),
        }))))
    }

    /// The device buffer of a device tensor.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// assert!(Tensor::scalar(1.0f32).device_buffer().is_none()); // host memory
    /// ```
    pub fn device_buffer(&self) -> Option<&Arc<dyn DeviceBuffer>> {
        match self.repr() {
            Repr::Device(d) => Some(&d.buffer),
            _ => None,
        }
    }

    /// The device buffer of a device tensor by move, when no other tensor handle shares it
    /// (what donating it needs); otherwise the tensor back.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// assert!(Tensor::scalar(1.0f32).try_into_device_buffer().is_err()); // not on a device
    /// ```
    pub fn try_into_device_buffer(self) -> std::result::Result<Arc<dyn DeviceBuffer>, Tensor> {
        match self.repr() {
            Repr::Device(_) => {}
            _ => return Err(self),
        }
        match self.into_repr() {
            Ok(Repr::Device(d)) => Ok(d.buffer),
            Ok(r) => Err(Tensor::from_repr(r)),
            Err(t) => Err(t),
        }
    }
}

/// `t` on `device` (see [`Tensor::to`]).
pub(crate) fn move_to(t: &Tensor, device: Device, loc: Loc) -> Tensor {
    let fail = |m: String| Tensor::failed(Error::at("to", m, loc));
    match (t.repr(), device) {
        (Repr::Failed(_) | Repr::Traced { .. }, _) => t.clone(),
        (Repr::Device(d), _) if d.buffer.device() == device => t.clone(),
        (Repr::Device(d), Device::Cpu) => match d.literal() {
            Ok(l) => Tensor::new(l.clone()),
            Err(e) => fail(e.message),
        },
        (_, Device::Cpu) => t.clone(),
        (_, Device::Cuda(_)) => {
            let l = match t.to_literal() {
                Ok(l) => l,
                Err(e) => return fail(e.message),
            };
            match upload(&l, device) {
                Ok(t) => t,
                Err(e) => fail(e.message),
            }
        }
    }
}

/// `l` uploaded to `device` by the installed backend.
pub(crate) fn upload(l: &Literal, device: Device) -> Result<Tensor> {
    let b = crate::backend::backend().map_err(|e| {
        Error::internal(
            "to",
            format!("cannot move a {} tensor to {device}: {}", l.ty(), e.message),
        )
    })?;
    let buffer = b
        .upload(device, l)
        .map_err(|e| Error::internal("to", e.message))?;
    Tensor::on_device(buffer, l.ty().clone())
}

/// Where the operands of one op or call live: the host, or one device (one-element host
/// tensors allowed with it when `scalars`); when they are mixed, an error of `op` at `loc`
/// naming the two operands (`noun`s: "operand", "argument") and where each lives.
///
/// # Examples
///
/// ```
/// use kiln_trace::{Device, Tensor, device::common_device};
/// let (a, b) = (Tensor::scalar(1.0f32), Tensor::scalar(2.0f32));
/// let here = kiln_ir::Loc::caller();
/// assert_eq!(common_device(&[&a, &b], false, "add", "operand", here).unwrap(), Device::Cpu);
/// ```
pub fn common_device(
    xs: &[&Tensor],
    scalars: bool,
    op: &str,
    noun: &str,
    loc: Loc,
) -> Result<Device> {
    let on = |t: &Tensor| t.device();
    let Some(first) = xs.iter().position(|t| on(t) != Device::Cpu) else {
        return Ok(Device::Cpu);
    };
    let device = on(xs[first]);
    for (i, t) in xs.iter().enumerate() {
        let d = on(t);
        let ty = t
            .ty()
            .map_or_else(|| "failed".to_string(), |t| t.to_string());
        let first_ty = xs[first].ty().map(|t| t.to_string()).unwrap_or_default();
        if d == Device::Cpu && !(scalars && t.ty().is_some_and(|t| t.numel() == 1)) {
            return Err(Error::at(
                op,
                format!(
                    "host and device tensors mixed in one {op}: {noun} {first} ({first_ty}) is \
                     on {device}, {noun} {i} ({ty}) on cpu; move them to one device with \
                     `.to(Device::...)` first"
                ),
                loc,
            ));
        }
        if d != Device::Cpu && d != device {
            return Err(Error::at(
                op,
                format!(
                    "tensors on two devices in one {op}: {noun} {first} ({first_ty}) is on \
                     {device}, {noun} {i} ({ty}) on {d}; move them to one device with \
                     `.to(Device::...)` first"
                ),
                loc,
            ));
        }
    }
    Ok(device)
}

/// The operands of an op on `device`: the one-element host tensors uploaded, the others
/// unchanged (all on `device` already, [`common_device`] checked).
pub(crate) fn operands_on(xs: &[&Tensor], device: Device, op: &str, loc: Loc) -> Vec<Tensor> {
    xs.iter()
        .map(|t| {
            if t.device() == device {
                (*t).clone()
            } else {
                let moved = move_to(t, device, loc);
                match moved.error() {
                    Some(e) => Tensor::failed(Error::at(op, e.message.clone(), loc)),
                    None => moved,
                }
            }
        })
        .collect()
}

/// Runs the one-op or traced function `f` eagerly on the device tensors `xs` (on `device`),
/// compiled once per signature by the installed backend; `n` results.
pub(crate) fn run_on_device(
    f: &kiln_ir::Func,
    xs: &[&Tensor],
    device: Device,
    op: &str,
    loc: Loc,
) -> Vec<Tensor> {
    let n = f.outputs.len();
    let xs = operands_on(xs, device, op, loc);
    if let Some(e) = xs.iter().find_map(|t| t.error()) {
        return vec![Tensor::failed(e.clone()); n];
    }
    let mut args: Vec<DeviceArg> = Vec::with_capacity(xs.len());
    for t in &xs {
        let Some(buffer) = t.device_buffer() else {
            let e = Error::at(
                op,
                "a traced tensor was used after its trace ended (it escaped the traced function)",
                loc,
            );
            return vec![Tensor::failed(e); n];
        };
        args.push(DeviceArg {
            buffer: buffer.clone(),
            donated: false,
        });
    }
    let run = crate::backend::compile_cached(f)
        .and_then(|exe| exe.run_device(args))
        .and_then(|bufs| wrap_results(bufs, &f.output_types));
    match run {
        Ok(ts) => ts,
        Err(e) => vec![Tensor::failed(Error::at(op, e.message, loc)); n],
    }
}

/// An executable's device results as tensors of `types` (each buffer checked against its
/// type's size).
///
/// # Examples
///
/// ```
/// use kiln_trace::device::wrap_results;
/// use kiln_trace::{Device, DeviceBuffer};
/// use kiln_ir::{DType, TensorType};
/// use std::sync::Arc;
/// struct InHost(Vec<u8>);
/// impl DeviceBuffer for InHost {
///     fn device(&self) -> Device { Device::Cuda(0) }
///     fn backend(&self) -> &'static str { "in-host" }
///     fn len(&self) -> usize { self.0.len() }
///     fn read(&self) -> Result<Vec<u8>, String> { Ok(self.0.clone()) }
///     fn as_any(&self) -> &dyn std::any::Any { self }
/// }
/// let b: Arc<dyn DeviceBuffer> = Arc::new(InHost(7i32.to_le_bytes().to_vec()));
/// let ts = wrap_results(vec![b.clone()], &[TensorType::scalar(DType::I32)]).unwrap();
/// assert_eq!(ts[0].to_vec::<i32>().unwrap(), [7]);
/// assert!(wrap_results(vec![b], &[TensorType::scalar(DType::I64)]).is_err()); // 4 bytes, not 8
/// ```
pub fn wrap_results(
    buffers: Vec<Arc<dyn DeviceBuffer>>,
    types: &[TensorType],
) -> Result<Vec<Tensor>> {
    if buffers.len() != types.len() {
        return Err(Error::internal(
            "run",
            format!(
                "{} device results for {} outputs",
                buffers.len(),
                types.len()
            ),
        ));
    }
    buffers
        .into_iter()
        .zip(types)
        .map(|(b, t)| Tensor::on_device(b, t.clone()))
        .collect()
}

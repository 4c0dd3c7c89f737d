//! The `Tensor` type: an eager value, a symbolic value in a trace, or a failure.

use crate::trace::arc_identity;
use crate::{Error, Result};
use half::{bf16, f16};
use kiln_ir::{DType, Data, Literal, Loc, TensorType, ValueId};
use std::fmt;
use std::sync::Arc;

/// Where a tensor lives.
///
/// # Examples
///
/// ```
/// use kiln_trace::{Device, Tensor};
/// assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
/// assert_eq!(Tensor::scalar(0i32).device(), Device::Cpu);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// An NVIDIA GPU, by ordinal.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

pub(crate) enum Repr {
    Eager(Literal),
    /// A view of another eager tensor's storage (`crate::view`).
    View(Box<crate::view::ViewRepr>),
    Traced {
        frame: u64,
        value: ValueId,
        ty: TensorType,
    },
    Failed(Error),
    /// A value in a device's memory (`crate::device`).
    Device(Box<crate::device::DeviceRepr>),
}

/// A tensor. Outside a trace it holds values and every operation runs at once; inside
/// `jit`/`grad` it is symbolic and operations record IR. The same code works both ways.
///
/// Operators cannot return `Result`, so an operation that fails (a shape or dtype mismatch,
/// say) returns a *failed* tensor carrying the error and the user's source line; operations on
/// failed tensors pass the first error along, and it surfaces where values are read
/// ([`Tensor::to_vec`], [`Tensor::to_literal`]) or where a trace ends (`jit`, `grad` return it).
#[derive(Clone)]
pub struct Tensor(Arc<Repr>);

/// Rust element types that map to kiln dtypes. The sub-byte integers `i4`, `u4`, `i2`, `u2` have
/// no Rust type: make such a tensor by casting (`Tensor::from_vec(v_i8, shape)?.cast(DType::I4)`,
/// which wraps) and read it back cast to `i8` or `u8` (exact).
pub trait Element: Copy + 'static {
    /// The kiln dtype.
    const DTYPE: DType;
    /// Wraps a vector as literal data.
    fn data(v: Vec<Self>) -> Data;
    /// The elements of a literal of this dtype.
    fn elements(l: &Literal) -> Option<Vec<Self>>;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn data(v: Vec<Self>) -> Data {
                Data::$d(v)
            }
            fn elements(l: &Literal) -> Option<Vec<Self>> {
                match l.data() {
                    Data::$d(v) => Some(v.clone()),
                    _ => None,
                }
            }
        }
    };
}
element!(bool, Pred);
element!(i8, I8);
element!(i32, I32);
element!(i64, I64);
element!(u32, U32);
element!(u8, U8);
element!(i16, I16);
element!(u16, U16);
element!(u64, U64);
element!(f16, F16);
element!(bf16, BF16);
element!(f32, F32);
element!(f64, F64);

impl Tensor {
    pub(crate) fn from_repr(r: Repr) -> Tensor {
        Tensor(Arc::new(r))
    }

    pub(crate) fn repr(&self) -> &Repr {
        &self.0
    }

    /// The representation by move, when no other handle shares it.
    pub(crate) fn into_repr(self) -> std::result::Result<Repr, Tensor> {
        Arc::try_unwrap(self.0).map_err(Tensor)
    }

    pub(crate) fn identity(&self) -> usize {
        arc_identity(&self.0)
    }

    /// A tensor holding `value`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::{DType, Literal};
    /// let t = Tensor::new(Literal::from_f64s(kiln_ir::TensorType::new(DType::I32, [2]), &[1.0, 2.0]).unwrap());
    /// assert_eq!(t.to_vec::<i32>().unwrap(), [1, 2]);
    /// ```
    pub fn new(value: Literal) -> Tensor {
        Tensor::from_repr(Repr::Eager(value))
    }

    /// A failed tensor carrying `e`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::{Error, Tensor};
    /// let t = Tensor::failed(Error::new("my_op", "went wrong"));
    /// assert!(t.to_vec::<f32>().unwrap_err().to_string().contains("went wrong"));
    /// // Operations on a failed tensor pass the error on.
    /// assert!((&t + 1.0).error().is_some());
    /// ```
    pub fn failed(e: Error) -> Tensor {
        Tensor::from_repr(Repr::Failed(e))
    }

    /// A tensor of `shape` from row-major values.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], [2, 3]).unwrap();
    /// assert_eq!((x.shape(), x.dtype()), (vec![2, 3], kiln_ir::DType::I64));
    /// assert!(Tensor::from_vec(vec![1.0f32, 2.0], [3]).is_err());
    /// ```
    #[track_caller]
    pub fn from_vec<T: Element>(values: Vec<T>, shape: impl Into<Vec<usize>>) -> Result<Tensor> {
        let ty = TensorType::new(T::DTYPE, shape);
        let loc = Loc::caller();
        Literal::new(ty, T::data(values))
            .map(Tensor::new)
            .map_err(|e| Error::at("from_vec", e.0, loc))
    }

    /// A scalar tensor.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::scalar(2.5f64);
    /// assert_eq!((x.rank(), x.item().unwrap()), (0, 2.5));
    /// ```
    pub fn scalar<T: Element>(x: T) -> Tensor {
        Tensor::new(
            Literal::new(TensorType::scalar(T::DTYPE), T::data(vec![x])).expect("one element"),
        )
    }

    /// A tensor of `dtype` and `shape` filled with `x` (rounded or converted to the dtype). A
    /// shape too large to address or to allocate gives a failed tensor saying so.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::full(DType::I32, [2, 2], 7.0);
    /// assert_eq!(x.to_vec::<i32>().unwrap(), [7, 7, 7, 7]);
    /// ```
    #[track_caller]
    pub fn full(dtype: DType, shape: impl Into<Vec<usize>>, x: f64) -> Tensor {
        Tensor::filled("full", TensorType::new(dtype, shape), x, Loc::caller())
    }

    /// Zeros (a failed tensor for a shape too large to allocate).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// assert_eq!(Tensor::zeros(DType::F32, [3]).to_vec::<f32>().unwrap(), [0.0, 0.0, 0.0]);
    /// ```
    #[track_caller]
    pub fn zeros(dtype: DType, shape: impl Into<Vec<usize>>) -> Tensor {
        Tensor::filled("zeros", TensorType::new(dtype, shape), 0.0, Loc::caller())
    }

    /// Ones (a failed tensor for a shape too large to allocate).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// let x = Tensor::ones(DType::U8, [1, 2]);
    /// assert_eq!((x.shape(), x.to_vec::<u8>().unwrap()), (vec![1, 2], vec![1, 1]));
    /// ```
    #[track_caller]
    pub fn ones(dtype: DType, shape: impl Into<Vec<usize>>) -> Tensor {
        Tensor::filled("ones", TensorType::new(dtype, shape), 1.0, Loc::caller())
    }

    fn filled(op: &str, ty: TensorType, x: f64, loc: Loc) -> Tensor {
        match ty
            .check_size()
            .and_then(|()| Literal::try_full(ty, x).map_err(|e| e.0))
        {
            Ok(l) => Tensor::new(l),
            Err(e) => Tensor::failed(Error::at(op, e, loc)),
        }
    }

    /// `[0, 1, ..., n-1]` of `dtype`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// assert_eq!(Tensor::arange(4, DType::F32).to_vec::<f32>().unwrap(), [0.0, 1.0, 2.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn arange(n: usize, dtype: DType) -> Tensor {
        let ty = TensorType::new(dtype, [n]);
        if let Err(e) = ty.check_size() {
            return Tensor::failed(Error::at("arange", e, Loc::caller()));
        }
        let mut v = Vec::new();
        if v.try_reserve_exact(n).is_err() {
            let e = format!("cannot allocate {n} elements for {ty}");
            return Tensor::failed(Error::at("arange", e, Loc::caller()));
        }
        v.extend((0..n).map(|i| i as f64));
        Tensor::new(Literal::from_f64s(ty, &v).expect("sizes match"))
    }

    /// The type, unless the tensor failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// assert_eq!(x.ty().unwrap().to_string(), "f32[2]");
    /// assert!(x.reshape(&[3]).ty().is_none());
    /// ```
    pub fn ty(&self) -> Option<TensorType> {
        match self.repr() {
            Repr::Eager(l) => Some(l.ty().clone()),
            Repr::View(v) => Some(v.ty().clone()),
            Repr::Traced { ty, .. } => Some(ty.clone()),
            Repr::Device(d) => Some(d.ty.clone()),
            Repr::Failed(_) => None,
        }
    }

    /// The shape (empty for a failed tensor).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// assert_eq!(Tensor::zeros(DType::F32, [2, 3]).shape(), [2, 3]);
    /// ```
    pub fn shape(&self) -> Vec<usize> {
        self.ty().map(|t| t.shape).unwrap_or_default()
    }

    /// The number of dimensions.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// assert_eq!(Tensor::zeros(DType::F32, [2, 3, 4]).rank(), 3);
    /// assert_eq!(Tensor::scalar(1i32).rank(), 0);
    /// ```
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// The element type (`f32` for a failed tensor).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// use kiln_ir::DType;
    /// assert_eq!(Tensor::scalar(1u32).dtype(), DType::U32);
    /// ```
    pub fn dtype(&self) -> DType {
        self.ty().map(|t| t.dtype).unwrap_or(DType::F32)
    }

    /// Whether this tensor is symbolic (inside a trace).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::{Tensor, trace::trace};
    /// use kiln_ir::{DType, TensorType};
    /// assert!(!Tensor::scalar(1.0f32).is_traced());
    /// trace("f", &[TensorType::new(DType::F32, [2])], |p| {
    ///     assert!(p[0].is_traced());
    ///     vec![p[0].clone()]
    /// })
    /// .unwrap();
    /// ```
    pub fn is_traced(&self) -> bool {
        matches!(self.repr(), Repr::Traced { .. })
    }

    /// The error, if this tensor failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    /// assert!(x.error().is_none());
    /// let e = x.squeeze(0).error().unwrap().to_string();
    /// assert!(e.contains("squeeze"), "{e}");
    /// ```
    pub fn error(&self) -> Option<&Error> {
        match self.repr() {
            Repr::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// How many tensor handles (clones) share this tensor's value, this one included.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::scalar(1.0f32);
    /// let y = x.clone();
    /// assert_eq!((x.handles(), y.handles()), (2, 2));
    /// ```
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// The value of an eager tensor by move, when no other handle shares it (what donating a
    /// buffer needs); otherwise the tensor back (a device tensor too: its value is on the
    /// device, see [`Tensor::try_into_device_buffer`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::scalar(1.0f32);
    /// let y = x.clone();
    /// let x = x.try_into_literal().unwrap_err(); // `y` shares the value
    /// drop(y);
    /// assert_eq!(x.try_into_literal().unwrap().to_f64s(), [1.0]);
    /// ```
    pub fn try_into_literal(self) -> std::result::Result<Literal, Tensor> {
        match Arc::try_unwrap(self.0) {
            Ok(Repr::Eager(l)) => Ok(l),
            Ok(Repr::View(v)) => Ok(v.into_literal()),
            Ok(r) => Err(Tensor::from_repr(r)),
            Err(shared) => Err(Tensor(shared)),
        }
    }

    /// The value of an eager tensor; a device tensor's is downloaded the first time and kept
    /// (`None` if that fails: [`Tensor::to_literal`] says why).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    /// assert_eq!(x.literal().unwrap().to_f64s(), [1.0, 2.0]);
    /// ```
    pub fn literal(&self) -> Option<&Literal> {
        match self.repr() {
            Repr::Eager(l) => Some(l),
            Repr::View(v) => Some(v.literal()),
            Repr::Device(d) => d.literal().ok(),
            _ => None,
        }
    }

    /// The values of an eager tensor that nothing else holds (no clone, view or trace shares
    /// it), to change in place.
    pub(crate) fn unshared_literal_mut(&mut self) -> Option<&mut Literal> {
        match Arc::get_mut(&mut self.0)? {
            Repr::Eager(l) => Some(l),
            _ => None,
        }
    }

    /// The value, or the error that made this tensor fail, or an error if it is symbolic.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    /// assert_eq!(x.to_literal().unwrap().ty().to_string(), "i32[2]");
    /// assert!(x.index(5).to_literal().is_err());
    /// ```
    #[track_caller]
    pub fn to_literal(&self) -> Result<Literal> {
        match self.repr() {
            Repr::Eager(l) => Ok(l.clone()),
            Repr::View(v) => Ok(v.literal().clone()),
            Repr::Device(d) => {
                let loc = Loc::caller();
                d.literal().cloned().map_err(|e| Error {
                    loc: Some(loc),
                    ..e
                })
            }
            Repr::Failed(e) => Err(e.clone()),
            Repr::Traced { ty, .. } => Err(Error::new(
                "to_literal",
                format!("a traced {ty} tensor has no value until the traced function runs"),
            )),
        }
    }

    /// The row-major values as `T`, which must match the dtype.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    /// assert_eq!(x.to_vec::<i32>().unwrap(), [1, 2]);
    /// assert!(x.to_vec::<f32>().is_err()); // the dtype must match
    /// ```
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let loc = Loc::caller();
        let l = self.to_literal()?;
        T::elements(&l).ok_or_else(|| {
            Error::at(
                "to_vec",
                format!("the tensor is {}, not {}", l.ty(), T::DTYPE),
                loc,
            )
        })
    }

    /// The single value of a one-element tensor, converted to f64.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::Tensor;
    /// assert_eq!(Tensor::scalar(3i32).item().unwrap(), 3.0);
    /// assert!(Tensor::from_vec(vec![1i32, 2], [2]).unwrap().item().is_err());
    /// ```
    #[track_caller]
    pub fn item(&self) -> Result<f64> {
        let l = self.to_literal()?;
        if l.numel() != 1 {
            return Err(Error::new(
                "item",
                format!("item() needs one element, the tensor is {}", l.ty()),
            ));
        }
        Ok(l.to_f64s()[0])
    }

    /// The device this tensor lives on: [`Device::Cpu`] for host tensors (and traced and
    /// failed ones), the device of its memory for one moved there with [`Tensor::to`].
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::{Device, Tensor};
    /// assert_eq!(Tensor::scalar(1.0f32).device(), Device::Cpu);
    /// ```
    pub fn device(&self) -> Device {
        match self.repr() {
            Repr::Device(d) => d.buffer.device(),
            _ => Device::Cpu,
        }
    }

    /// This tensor on `device`: a host tensor moved to a GPU is uploaded by the installed
    /// backend (`KILN_BACKEND=cuda` or `cuda:N`: that GPU; `KILN_BACKEND=ptx-emulator`: the
    /// emulated `cuda:0`), a device tensor moved to [`Device::Cpu`] downloaded; a tensor
    /// already there is returned as is. A backend without device memory (the CPU backend, the
    /// reference interpreter), a device index the backend does not run on, or no GPU driver
    /// give a failed tensor saying so, with the caller's line. Inside a trace, a traced tensor
    /// is returned unchanged: a compiled function runs where its arguments live.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln_trace::{Device, Tensor};
    /// let x = Tensor::scalar(1.0f32);
    /// assert_eq!(x.to(Device::Cpu).item().unwrap(), 1.0);
    /// // No backend with device memory is installed here: a clear error, not a panic.
    /// assert!(x.to(Device::Cuda(0)).error().is_some());
    /// ```
    #[track_caller]
    pub fn to(&self, device: Device) -> Tensor {
        crate::device::move_to(self, device, Loc::caller())
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.repr() {
            // Large values are summarized (`...`); `{:#}` prints every element.
            Repr::Eager(l) if f.alternate() => write!(f, "{l:#}"),
            Repr::Eager(l) => write!(f, "{l}"),
            Repr::View(v) if f.alternate() => write!(f, "{:#}", v.literal()),
            Repr::View(v) => write!(f, "{}", v.literal()),
            Repr::Traced { ty, value, .. } => write!(f, "traced {value} : {ty}"),
            Repr::Device(d) => match d.literal() {
                Ok(l) if f.alternate() => write!(f, "{l:#} on {}", d.buffer.device()),
                Ok(l) => write!(f, "{l} on {}", d.buffer.device()),
                Err(e) => write!(f, "{} on {} ({e})", d.ty, d.buffer.device()),
            },
            Repr::Failed(e) => write!(f, "failed tensor: {e}"),
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({self})")
    }
}

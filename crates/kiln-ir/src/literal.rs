//! Concrete tensor values.

use crate::half_round::{bf16_from_f64, f16_from_f64};
use crate::{DType, MiniFloat, TensorType};
use half::{bf16, f16};
use std::fmt;

/// Typed element storage of a [`Literal`], row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// `pred` elements.
    Pred(Vec<bool>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `i4` elements, one per byte, each in -8..=7.
    I4(Vec<i8>),
    /// `u4` elements, one per byte, each in 0..=15.
    U4(Vec<u8>),
    /// `i2` elements, one per byte, each in -2..=1.
    I2(Vec<i8>),
    /// `u2` elements, one per byte, each in 0..=3.
    U2(Vec<u8>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `f16` elements.
    F16(Vec<f16>),
    /// `bf16` elements.
    BF16(Vec<bf16>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `f64` elements.
    F64(Vec<f64>),
    /// Small float elements of the given format: each its bit pattern, in the low bits of a
    /// byte.
    Mini(MiniFloat, Vec<u8>),
    /// `c64` elements: `[real, imaginary]`.
    C64(Vec<[f32; 2]>),
    /// `c128` elements: `[real, imaginary]`.
    C128(Vec<[f64; 2]>),
}

/// A concrete tensor: a type and row-major elements of that type.
#[derive(Clone, Debug, PartialEq)]
pub struct Literal {
    ty: TensorType,
    data: Data,
}

/// Why a literal could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiteralError(pub String);

impl fmt::Display for LiteralError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LiteralError {}

/// Rounds `x` to the nearest value representable in the float dtype `dtype` (ties to even;
/// for a complex dtype, in its part type). Integer and `pred` dtypes convert as [`convert_f64`] does.
pub fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::F16 => crate::half_round::f16_from_f64(x).to_f64(),
        DType::BF16 => crate::half_round::bf16_from_f64(x).to_f64(),
        DType::Mini(m) => m.round_f64(x),
        // A part of a complex number.
        DType::C64 => x as f32 as f64,
        DType::C128 => x,
        _ => convert_f64(dtype, x) as f64,
    }
}

/// Wraps the integer `x` to the range of `dtype` (two's complement), or to 0/1 for `pred`.
pub fn wrap_to(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::Pred => (x != 0) as i64,
        DType::I8 => x as i8 as i64,
        DType::I32 => x as i32 as i64,
        DType::U32 => x as u32 as i64,
        DType::U8 => x as u8 as i64,
        DType::I16 => x as i16 as i64,
        DType::U16 => x as u16 as i64,
        DType::I4 | DType::I2 => {
            // The low bits, sign-extended.
            let s = 64 - dtype.bits();
            (x << s) >> s
        }
        DType::U4 | DType::U2 => x & ((1 << dtype.bits()) - 1),
        _ => x,
    }
}

/// The value of the integer `x` of `dtype` as f64. Integers travel as i64; a `u64` as its bits,
/// so one from 2^63 up is a negative i64 whose value is `x as u64`.
pub fn int_to_f64(dtype: DType, x: i64) -> f64 {
    if dtype == DType::U64 {
        x as u64 as f64
    } else {
        x as f64
    }
}

/// The integer `x` of `dtype` as an index: itself, but a `u64` past `i64::MAX` (a negative
/// i64 here) saturates to `i64::MAX`, so it clamps to the top as the large number it is.
pub fn index_of(dtype: DType, x: i64) -> i64 {
    if dtype == DType::U64 && x < 0 {
        i64::MAX
    } else {
        x
    }
}

/// Converts a float to an integer or `pred` dtype: truncation toward zero, saturating at the
/// type's bounds, NaN to 0; `pred` is `x != 0`.
pub fn convert_f64(dtype: DType, x: f64) -> i64 {
    match dtype {
        DType::Pred => (x != 0.0) as i64,
        DType::I8 => x as i8 as i64,
        DType::I32 => x as i32 as i64,
        DType::U32 => x as u32 as i64,
        DType::U8 => x as u8 as i64,
        DType::I16 => x as i16 as i64,
        DType::U16 => x as u16 as i64,
        DType::U64 => x as u64 as i64,
        DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
            let (lo, hi) = dtype.int_bounds().expect("an integer dtype");
            if x.is_nan() {
                0
            } else {
                (x.trunc().clamp(lo as f64, hi as f64)) as i64
            }
        }
        _ => x as i64,
    }
}

/// Sub-byte integer data of `dtype` (`i4`, `u4`, `i2`, `u2`) from i64 values, each wrapped to
/// the type's range (one byte per element, sign- or zero-extended).
fn sub_byte_data(dtype: DType, values: &[i64]) -> Data {
    if dtype.is_signed() {
        Data::I8(values.iter().map(|&x| wrap_to(dtype, x) as i8).collect()).retag(dtype)
    } else {
        Data::U8(values.iter().map(|&x| wrap_to(dtype, x) as u8).collect()).retag(dtype)
    }
}

/// The first element of sub-byte integer data outside its type's range, if any.
fn sub_byte_out_of_range(data: &Data) -> Option<i64> {
    let d = data.dtype();
    let bad = |x: i64| (wrap_to(d, x) != x).then_some(x);
    match data {
        Data::I4(v) | Data::I2(v) => v.iter().find_map(|&x| bad(x as i64)),
        Data::U4(v) | Data::U2(v) => v.iter().find_map(|&x| bad(x as i64)),
        Data::Mini(m, v) => v
            .iter()
            .find(|&&c| (c as u32) >> m.bits() != 0)
            .map(|&c| c as i64),
        _ => None,
    }
}

/// Asks the C allocator to keep large freed blocks for reuse instead of returning them to the
/// system (glibc's default for blocks over 32 MiB), once per process. Results (of compiled
/// programs, of eager ops) move out to the caller, who drops them; the next result of the same
/// size then reuses that memory instead of getting fresh pages, which the kernel must zero
/// first (a third of a 4096 x 4096 softmax's time, four fifths of an eager `where` on a
/// million floats). Blocks up to 1 GiB come from the heap; the heap's top is trimmed only
/// beyond 1 GiB free. Callers ask only when `Options::keep_freed` is set (`KILN_KEEP_FREED=0`
/// leaves the allocator's settings alone).
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            const M_TRIM_THRESHOLD: i32 = -1;
            const M_MMAP_THRESHOLD: i32 = -3;
            unsafe extern "C" {
                fn mallopt(param: i32, value: i32) -> i32;
            }
            // SAFETY: mallopt only changes the allocator's thresholds (for blocks allocated
            // from now on); it is called once.
            unsafe {
                mallopt(M_MMAP_THRESHOLD, 1 << 30);
                mallopt(M_TRIM_THRESHOLD, 1 << 30);
            }
        });
    }
}

/// An empty vector with room for exactly the elements of `ty` (each a `T`), and their count;
/// an error when the byte size of `ty` overflows i64 or the memory cannot be had.
fn storage<T>(ty: &TensorType) -> Result<(Vec<T>, usize), LiteralError> {
    let (Some(n), Some(bytes)) = (ty.checked_numel(), ty.byte_size()) else {
        return Err(LiteralError(format!(
            "cannot hold a literal of type {ty}: its byte size overflows i64"
        )));
    };
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| {
        LiteralError(format!(
            "cannot allocate {bytes} bytes for a literal of type {ty}: {e}"
        ))
    })?;
    Ok((v, n))
}

macro_rules! each_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::Pred($v) => $body,
            Data::I8($v) => $body,
            Data::I4($v) => $body,
            Data::U4($v) => $body,
            Data::I2($v) => $body,
            Data::U2($v) => $body,
            Data::I32($v) => $body,
            Data::I64($v) => $body,
            Data::U32($v) => $body,
            Data::U8($v) => $body,
            Data::I16($v) => $body,
            Data::U16($v) => $body,
            Data::U64($v) => $body,
            Data::F16($v) => $body,
            Data::BF16($v) => $body,
            Data::F32($v) => $body,
            Data::F64($v) => $body,
            Data::Mini(_, $v) => $body,
            Data::C64($v) => $body,
            Data::C128($v) => $body,
        }
    };
}

impl Data {
    /// The dtype of the stored elements.
    pub fn dtype(&self) -> DType {
        match self {
            Data::Pred(_) => DType::Pred,
            Data::I8(_) => DType::I8,
            Data::I4(_) => DType::I4,
            Data::U4(_) => DType::U4,
            Data::I2(_) => DType::I2,
            Data::U2(_) => DType::U2,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::U32(_) => DType::U32,
            Data::U8(_) => DType::U8,
            Data::I16(_) => DType::I16,
            Data::U16(_) => DType::U16,
            Data::U64(_) => DType::U64,
            Data::F16(_) => DType::F16,
            Data::BF16(_) => DType::BF16,
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::Mini(m, _) => DType::Mini(*m),
            Data::C64(_) => DType::C64,
            Data::C128(_) => DType::C128,
        }
    }

    /// The same bytes under another dtype of one-byte integer storage: `i8` data as `i4` or
    /// `i2` (and back), `u8` data as `u4` or `u2` (and back), `u8` data as the bit patterns of
    /// a small float (and back); other data, or another `dtype`,
    /// comes back as it is. For moving sub-byte integers as their storage bytes;
    /// [`Literal::new`] checks that the values fit the narrow type.
    pub fn retag(self, dtype: DType) -> Data {
        match (self, dtype) {
            (Data::I8(v) | Data::I4(v) | Data::I2(v), DType::I8) => Data::I8(v),
            (Data::I8(v) | Data::I4(v) | Data::I2(v), DType::I4) => Data::I4(v),
            (Data::I8(v) | Data::I4(v) | Data::I2(v), DType::I2) => Data::I2(v),
            (Data::U8(v) | Data::U4(v) | Data::U2(v), DType::U8) => Data::U8(v),
            (Data::U8(v) | Data::U4(v) | Data::U2(v), DType::U4) => Data::U4(v),
            (Data::U8(v) | Data::U4(v) | Data::U2(v), DType::U2) => Data::U2(v),
            (Data::U8(v) | Data::Mini(_, v), DType::Mini(m)) => Data::Mini(m, v),
            (Data::Mini(_, v), DType::U8) => Data::U8(v),
            (d, _) => d,
        }
    }

    /// Number of stored elements.
    pub fn len(&self) -> usize {
        each_data!(self, v => v.len())
    }

    /// True when no element is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Literal {
    /// A literal from a type and matching data.
    pub fn new(ty: TensorType, data: Data) -> Result<Literal, LiteralError> {
        if data.dtype() != ty.dtype {
            return Err(LiteralError(format!(
                "data of dtype {} given for type {ty}",
                data.dtype()
            )));
        }
        if data.len() != ty.numel() {
            return Err(LiteralError(format!(
                "{} elements given for type {ty}, which has {}",
                data.len(),
                ty.numel()
            )));
        }
        if let Some(x) = sub_byte_out_of_range(&data) {
            return Err(LiteralError(if data.dtype().mini().is_some() {
                format!("{x:#x} is not a bit pattern of {}", data.dtype())
            } else {
                format!("{x} is out of range for {}", data.dtype())
            }));
        }
        Ok(Literal { ty, data })
    }

    /// A literal of `dtype` and `shape` from f64 values, each rounded (floats) or converted
    /// (integers: truncation, saturating; `pred`: nonzero) to the dtype.
    pub fn from_f64s(ty: TensorType, values: &[f64]) -> Result<Literal, LiteralError> {
        let d = match ty.dtype {
            DType::Pred => Data::Pred(values.iter().map(|&x| x != 0.0).collect()),
            DType::I8 => Data::I8(values.iter().map(|&x| x as i8).collect()),
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
                let v: Vec<i64> = values.iter().map(|&x| convert_f64(ty.dtype, x)).collect();
                sub_byte_data(ty.dtype, &v)
            }
            DType::I32 => Data::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I64 => Data::I64(values.iter().map(|&x| x as i64).collect()),
            DType::U32 => Data::U32(values.iter().map(|&x| x as u32).collect()),
            DType::U8 => Data::U8(values.iter().map(|&x| x as u8).collect()),
            DType::I16 => Data::I16(values.iter().map(|&x| x as i16).collect()),
            DType::U16 => Data::U16(values.iter().map(|&x| x as u16).collect()),
            DType::U64 => Data::U64(values.iter().map(|&x| x as u64).collect()),
            DType::F16 => Data::F16(values.iter().map(|&x| f16_from_f64(x)).collect()),
            DType::BF16 => Data::BF16(values.iter().map(|&x| bf16_from_f64(x)).collect()),
            DType::F32 => Data::F32(values.iter().map(|&x| x as f32).collect()),
            DType::F64 => Data::F64(values.to_vec()),
            DType::Mini(m) => Data::Mini(m, values.iter().map(|&x| m.from_f64(x)).collect()),
            DType::C64 => Data::C64(values.iter().map(|&x| [x as f32, 0.0]).collect()),
            DType::C128 => Data::C128(values.iter().map(|&x| [x, 0.0]).collect()),
        };
        Literal::new(ty, d)
    }

    /// A literal of `ty` whose every element is `x`, converted as [`Literal::from_f64s`]
    /// converts; an error (never an abort) when the type's byte size overflows i64 or its
    /// storage cannot be allocated.
    pub fn try_full(ty: TensorType, x: f64) -> Result<Literal, LiteralError> {
        fn fill<T: Clone>(ty: &TensorType, v: T) -> Result<Vec<T>, LiteralError> {
            let (mut out, n) = storage(ty)?;
            out.resize(n, v);
            Ok(out)
        }
        let t = &ty;
        let data = match ty.dtype {
            DType::Pred => Data::Pred(fill(t, x != 0.0)?),
            DType::I8 => Data::I8(fill(t, x as i8)?),
            DType::I4 | DType::I2 => {
                Data::I8(fill(t, convert_f64(ty.dtype, x) as i8)?).retag(ty.dtype)
            }
            DType::U4 | DType::U2 => {
                Data::U8(fill(t, convert_f64(ty.dtype, x) as u8)?).retag(ty.dtype)
            }
            DType::I32 => Data::I32(fill(t, x as i32)?),
            DType::I64 => Data::I64(fill(t, x as i64)?),
            DType::U32 => Data::U32(fill(t, x as u32)?),
            DType::U8 => Data::U8(fill(t, x as u8)?),
            DType::I16 => Data::I16(fill(t, x as i16)?),
            DType::U16 => Data::U16(fill(t, x as u16)?),
            DType::U64 => Data::U64(fill(t, x as u64)?),
            DType::F16 => Data::F16(fill(t, f16_from_f64(x))?),
            DType::BF16 => Data::BF16(fill(t, bf16_from_f64(x))?),
            DType::F32 => Data::F32(fill(t, x as f32)?),
            DType::F64 => Data::F64(fill(t, x)?),
            DType::Mini(m) => Data::Mini(m, fill(t, m.from_f64(x))?),
            DType::C64 => Data::C64(fill(t, [x as f32, 0.0])?),
            DType::C128 => Data::C128(fill(t, [x, 0.0])?),
        };
        Ok(Literal { ty, data })
    }

    /// A literal from i64 values, each wrapped to the dtype (floats: rounded to nearest).
    pub fn from_i64s(ty: TensorType, values: &[i64]) -> Result<Literal, LiteralError> {
        let d = match ty.dtype {
            DType::Pred => Data::Pred(values.iter().map(|&x| x != 0).collect()),
            DType::I8 => Data::I8(values.iter().map(|&x| x as i8).collect()),
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => sub_byte_data(ty.dtype, values),
            DType::I32 => Data::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I64 => Data::I64(values.to_vec()),
            DType::U32 => Data::U32(values.iter().map(|&x| x as u32).collect()),
            DType::U8 => Data::U8(values.iter().map(|&x| x as u8).collect()),
            DType::I16 => Data::I16(values.iter().map(|&x| x as i16).collect()),
            DType::U16 => Data::U16(values.iter().map(|&x| x as u16).collect()),
            // The i64 carries the u64's bits.
            DType::U64 => Data::U64(values.iter().map(|&x| x as u64).collect()),
            _ => {
                return Literal::from_f64s(
                    ty,
                    &values.iter().map(|&x| x as f64).collect::<Vec<_>>(),
                );
            }
        };
        Literal::new(ty, d)
    }

    /// An f32 literal of the given shape.
    pub fn f32(shape: impl Into<Vec<usize>>, values: Vec<f32>) -> Result<Literal, LiteralError> {
        Literal::new(TensorType::new(DType::F32, shape), Data::F32(values))
    }

    /// An f64 literal of the given shape.
    pub fn f64(shape: impl Into<Vec<usize>>, values: Vec<f64>) -> Result<Literal, LiteralError> {
        Literal::new(TensorType::new(DType::F64, shape), Data::F64(values))
    }

    /// An i32 literal of the given shape.
    pub fn i32(shape: impl Into<Vec<usize>>, values: Vec<i32>) -> Result<Literal, LiteralError> {
        Literal::new(TensorType::new(DType::I32, shape), Data::I32(values))
    }

    /// A literal of zeros (false for `pred`).
    ///
    /// # Panics
    ///
    /// When the storage cannot be allocated; [`Literal::try_zeros`] returns an error instead.
    pub fn zeros(ty: TensorType) -> Literal {
        Literal::try_zeros(ty).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A literal of zeros (false for `pred`), or an error when the type's byte size overflows
    /// i64 or its storage cannot be allocated.
    pub fn try_zeros(ty: TensorType) -> Result<Literal, LiteralError> {
        fn fill<T: Clone>(ty: &TensorType, zero: T) -> Result<Vec<T>, LiteralError> {
            let (mut v, n) = storage(ty)?;
            v.resize(n, zero);
            Ok(v)
        }
        let t = &ty;
        let data = match ty.dtype {
            DType::Pred => Data::Pred(fill(t, false)?),
            DType::I8 => Data::I8(fill(t, 0)?),
            DType::I4 | DType::I2 => Data::I8(fill(t, 0)?).retag(ty.dtype),
            DType::U4 | DType::U2 => Data::U8(fill(t, 0)?).retag(ty.dtype),
            DType::I32 => Data::I32(fill(t, 0)?),
            DType::I64 => Data::I64(fill(t, 0)?),
            DType::U32 => Data::U32(fill(t, 0)?),
            DType::U8 => Data::U8(fill(t, 0)?),
            DType::I16 => Data::I16(fill(t, 0)?),
            DType::U16 => Data::U16(fill(t, 0)?),
            DType::U64 => Data::U64(fill(t, 0)?),
            DType::F16 => Data::F16(fill(t, f16::ZERO)?),
            DType::BF16 => Data::BF16(fill(t, bf16::ZERO)?),
            DType::F32 => Data::F32(fill(t, 0.0)?),
            DType::F64 => Data::F64(fill(t, 0.0)?),
            // f8e8m0fnu has no zero: its zero is NaN, as a conversion of 0 gives.
            DType::Mini(m) => Data::Mini(m, fill(t, m.from_f64(0.0))?),
            DType::C64 => Data::C64(fill(t, [0.0; 2])?),
            DType::C128 => Data::C128(fill(t, [0.0; 2])?),
        };
        Ok(Literal { ty, data })
    }

    /// A literal of `ty` whose elements `init` writes into the buffer it receives
    /// (`numel * bytes` bytes, aligned for the dtype; `pred` elements are bytes 0 or 1). No
    /// time is spent zeroing memory that is about to be overwritten.
    ///
    /// # Safety
    ///
    /// `init` must write every element with a valid value of the dtype (a sub-byte integer: a
    /// byte holding a value in the type's range, sign- or zero-extended).
    ///
    /// # Panics
    ///
    /// When the storage cannot be allocated; [`Literal::try_new_uninit`] returns an error
    /// instead.
    pub unsafe fn new_uninit(ty: TensorType, init: impl FnOnce(*mut u8)) -> Literal {
        // SAFETY: the caller's contract, passed on.
        unsafe { Literal::try_new_uninit(ty, init) }.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Literal::new_uninit`], or an error (without calling `init`) when the type's byte size
    /// overflows i64 or its storage cannot be allocated.
    ///
    /// # Safety
    ///
    /// `init` must write every element with a valid value of the dtype.
    pub unsafe fn try_new_uninit(
        ty: TensorType,
        init: impl FnOnce(*mut u8),
    ) -> Result<Literal, LiteralError> {
        fn fill<T>(ty: &TensorType, init: impl FnOnce(*mut u8)) -> Result<Vec<T>, LiteralError> {
            let (mut v, n) = storage::<T>(ty)?;
            init(v.as_mut_ptr().cast());
            // SAFETY: the caller's contract: `init` wrote all n elements, within the capacity
            // reserved for them.
            unsafe { v.set_len(n) };
            Ok(v)
        }
        let data = match ty.dtype {
            DType::Pred => Data::Pred(fill(&ty, init)?),
            DType::I8 => Data::I8(fill(&ty, init)?),
            DType::I4 | DType::I2 => Data::I8(fill(&ty, init)?).retag(ty.dtype),
            DType::U4 | DType::U2 => Data::U8(fill(&ty, init)?).retag(ty.dtype),
            DType::I32 => Data::I32(fill(&ty, init)?),
            DType::I64 => Data::I64(fill(&ty, init)?),
            DType::U32 => Data::U32(fill(&ty, init)?),
            DType::U8 => Data::U8(fill(&ty, init)?),
            DType::I16 => Data::I16(fill(&ty, init)?),
            DType::U16 => Data::U16(fill(&ty, init)?),
            DType::U64 => Data::U64(fill(&ty, init)?),
            DType::F16 => Data::F16(fill(&ty, init)?),
            DType::BF16 => Data::BF16(fill(&ty, init)?),
            DType::F32 => Data::F32(fill(&ty, init)?),
            DType::F64 => Data::F64(fill(&ty, init)?),
            DType::Mini(m) => Data::Mini(m, fill(&ty, init)?),
            DType::C64 => Data::C64(fill(&ty, init)?),
            DType::C128 => Data::C128(fill(&ty, init)?),
        };
        Ok(Literal { ty, data })
    }

    /// The type of this literal.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The dtype of this literal.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The shape of this literal.
    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    /// A pointer to the first element's storage (for backends handing buffers to kernels).
    // The cast is needed for every element type but `u8`'s.
    #[allow(clippy::unnecessary_cast)]
    pub fn as_ptr(&self) -> *const u8 {
        each_data!(&self.data, v => v.as_ptr() as *const u8)
    }

    /// A mutable pointer to the first element's storage (for backends writing results).
    #[allow(clippy::unnecessary_cast)]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        each_data!(&mut self.data, v => v.as_mut_ptr() as *mut u8)
    }

    /// The typed elements.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// The elements of an `f32` literal, to change in place (their type and count stay).
    pub fn f32s_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements of an `f64` literal, to change in place (their type and count stay).
    pub fn f64s_mut(&mut self) -> Option<&mut [f64]> {
        match &mut self.data {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The same elements viewed with another shape of equal element count.
    pub fn reshaped(&self, shape: impl Into<Vec<usize>>) -> Result<Literal, LiteralError> {
        Literal::new(TensorType::new(self.ty.dtype, shape), self.data.clone())
    }

    /// Every element as f64 (exact for all dtypes except i64 beyond 2^53; a complex element's
    /// real part, as `convert` to a real type takes it).
    pub fn to_f64s(&self) -> Vec<f64> {
        match &self.data {
            Data::Pred(v) => v.iter().map(|&x| x as u8 as f64).collect(),
            Data::I8(v) | Data::I4(v) | Data::I2(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U4(v) | Data::U2(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I16(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U16(v) => v.iter().map(|&x| x as f64).collect(),
            Data::U64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v.clone(),
            Data::Mini(m, v) => v.iter().map(|&c| m.to_f64(c)).collect(),
            Data::C64(v) => v.iter().map(|x| x[0] as f64).collect(),
            Data::C128(v) => v.iter().map(|x| x[0]).collect(),
        }
    }

    /// Every element as a complex number `[real, imaginary]` in f64 (exact for every dtype
    /// [`Literal::to_f64s`] is exact for; a real element's imaginary part is 0).
    pub fn to_complex_f64s(&self) -> Vec<[f64; 2]> {
        match &self.data {
            Data::C64(v) => v.iter().map(|x| [x[0] as f64, x[1] as f64]).collect(),
            Data::C128(v) => v.clone(),
            _ => self.to_f64s().into_iter().map(|x| [x, 0.0]).collect(),
        }
    }

    /// A literal of `ty` from complex values `[real, imaginary]`, each part rounded to the
    /// part type (ties to even); for a real `ty`, the real parts converted as
    /// [`Literal::from_f64s`] converts them.
    pub fn from_complex_f64s(ty: TensorType, values: &[[f64; 2]]) -> Result<Literal, LiteralError> {
        let d = match ty.dtype {
            DType::C64 => Data::C64(values.iter().map(|x| [x[0] as f32, x[1] as f32]).collect()),
            DType::C128 => Data::C128(values.to_vec()),
            _ => return Literal::from_f64s(ty, &values.iter().map(|x| x[0]).collect::<Vec<_>>()),
        };
        Literal::new(ty, d)
    }

    /// Every element as i64: integers exactly, `pred` as 0/1, floats converted as
    /// [`convert_f64`] does for `i64`.
    pub fn to_i64s(&self) -> Vec<i64> {
        match &self.data {
            Data::Pred(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I8(v) | Data::I4(v) | Data::I2(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U4(v) | Data::U2(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I64(v) => v.clone(),
            Data::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Data::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U16(v) => v.iter().map(|&x| x as i64).collect(),
            // The u64's bits: values from 2^63 up come out negative (see `int_to_f64`).
            Data::U64(v) => v.iter().map(|&x| x as i64).collect(),
            _ => self.to_f64s().into_iter().map(|x| x as i64).collect(),
        }
    }

    /// The elements as f32, if this is an f32 literal.
    pub fn as_f32s(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Little-endian bytes of every element, in order (`pred` as one byte 0/1).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.numel() * self.dtype().bytes());
        match &self.data {
            Data::Pred(v) => out.extend(v.iter().map(|&b| b as u8)),
            Data::I8(v) | Data::I4(v) | Data::I2(v) => out.extend(v.iter().map(|&b| b as u8)),
            Data::U4(v) | Data::U2(v) => out.extend_from_slice(v),
            Data::I32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::I64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::U32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::U8(v) => out.extend_from_slice(v),
            Data::I16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::U16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::U64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::F16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::BF16(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::F32(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::F64(v) => v.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Data::Mini(_, v) => out.extend_from_slice(v),
            Data::C64(v) => v.iter().flatten().for_each(|x| out.extend(x.to_le_bytes())),
            Data::C128(v) => v.iter().flatten().for_each(|x| out.extend(x.to_le_bytes())),
        }
        out
    }

    /// A literal from little-endian element bytes.
    pub fn from_le_bytes(ty: TensorType, bytes: &[u8]) -> Result<Literal, LiteralError> {
        let w = ty.dtype.bytes();
        if ty.byte_size() != Some(bytes.len()) {
            return Err(LiteralError(format!(
                "{} bytes given for type {ty}",
                bytes.len()
            )));
        }
        let ch = bytes.chunks_exact(w);
        let data = match ty.dtype {
            DType::Pred => Data::Pred(bytes.iter().map(|&b| b != 0).collect()),
            DType::I8 => Data::I8(bytes.iter().map(|&b| b as i8).collect()),
            DType::U8 => Data::U8(bytes.to_vec()),
            // The bit pattern in the low bits of each byte.
            DType::Mini(m) => Data::Mini(
                m,
                bytes
                    .iter()
                    .map(|&b| b & ((1u32 << m.bits()) - 1) as u8)
                    .collect(),
            ),
            // One byte per element; the low bits are the value (sign- or zero-extended here).
            DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
                let v: Vec<i64> = bytes.iter().map(|&b| b as i64).collect();
                sub_byte_data(ty.dtype, &v)
            }
            DType::I32 => Data::I32(
                ch.map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I64 => Data::I64(
                ch.map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::U32 => Data::U32(
                ch.map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I16 => Data::I16(
                ch.map(|c| i16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::U16 => Data::U16(
                ch.map(|c| u16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::U64 => Data::U64(
                ch.map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F16 => Data::F16(
                ch.map(|c| f16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::BF16 => Data::BF16(
                ch.map(|c| bf16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F32 => Data::F32(
                ch.map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F64 => Data::F64(
                ch.map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::C64 => Data::C64(
                ch.map(|c| {
                    let part =
                        |k: usize| f32::from_le_bytes(c[4 * k..4 * k + 4].try_into().unwrap());
                    [part(0), part(1)]
                })
                .collect(),
            ),
            DType::C128 => Data::C128(
                ch.map(|c| {
                    let part =
                        |k: usize| f64::from_le_bytes(c[8 * k..8 * k + 8].try_into().unwrap());
                    [part(0), part(1)]
                })
                .collect(),
            ),
        };
        Literal::new(ty, data)
    }

    /// The text form of element `i`: shortest round-trip decimal in the element's own precision,
    /// `nan`, `inf`, `-inf`, `true`, `false`; a complex element is its two parts in parentheses,
    /// `(1.5, -inf)`.
    pub fn format_elem(&self, i: usize) -> String {
        fn float(x: f64, s: String) -> String {
            if x.is_nan() {
                "nan".into()
            } else if x.is_infinite() {
                if x > 0.0 { "inf".into() } else { "-inf".into() }
            } else {
                s
            }
        }
        match &self.data {
            Data::Pred(v) => v[i].to_string(),
            Data::I8(v) | Data::I4(v) | Data::I2(v) => v[i].to_string(),
            Data::U4(v) | Data::U2(v) => v[i].to_string(),
            Data::I32(v) => v[i].to_string(),
            Data::I64(v) => v[i].to_string(),
            Data::U32(v) => v[i].to_string(),
            Data::U8(v) => v[i].to_string(),
            Data::I16(v) => v[i].to_string(),
            Data::U16(v) => v[i].to_string(),
            Data::U64(v) => v[i].to_string(),
            Data::F16(v) => float(v[i].to_f64(), format!("{:?}", v[i].to_f32())),
            Data::BF16(v) => float(v[i].to_f64(), format!("{:?}", v[i].to_f32())),
            Data::F32(v) => float(v[i] as f64, format!("{:?}", v[i])),
            Data::F64(v) => float(v[i], format!("{:?}", v[i])),
            Data::Mini(m, v) => {
                let x = m.to_f64(v[i]);
                if x.is_nan() && v[i] & m.sign_mask() != 0 {
                    "-nan".into()
                } else {
                    float(x, format!("{:?}", x as f32))
                }
            }
            Data::C64(v) => {
                let p = |x: f32| float(x as f64, format!("{x:?}"));
                format!("({}, {})", p(v[i][0]), p(v[i][1]))
            }
            Data::C128(v) => {
                let p = |x: f64| float(x, format!("{x:?}"));
                format!("({}, {})", p(v[i][0]), p(v[i][1]))
            }
        }
    }

    /// Parses the text form of one element of `dtype` (the inverse of [`Literal::format_elem`]),
    /// returning it as f64 for floats or i64 for integers and `pred`.
    pub fn parse_elem(dtype: DType, tok: &str) -> Result<Elem, LiteralError> {
        let bad = || {
            LiteralError(format!(
                "{} is not a valid {dtype} value",
                crate::error::quote(tok)
            ))
        };
        if dtype.is_complex() {
            // `(re, im)`: each part a float of the part type.
            let inner = tok
                .strip_prefix('(')
                .and_then(|t| t.strip_suffix(')'))
                .ok_or_else(bad)?;
            let (re, im) = inner.split_once(',').ok_or_else(bad)?;
            let part = |t: &str| match Literal::parse_elem(dtype.part(), t.trim()) {
                Ok(Elem::F(x)) => Ok(x),
                _ => Err(bad()),
            };
            Ok(Elem::C(part(re)?, part(im)?))
        } else if dtype.is_float() {
            let x = match tok {
                "nan" => f64::NAN,
                "-nan" => -f64::NAN,
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                // A small float's bit pattern (`0x7f`), as StableHLO writes them.
                _ if dtype.mini().is_some() && tok.starts_with("0x") => {
                    let m = dtype.mini().expect("a small float");
                    let c = u32::from_str_radix(&tok[2..], 16).map_err(|_| bad())?;
                    if c >> m.bits() != 0 {
                        return Err(LiteralError(format!(
                            "{tok} is not a bit pattern of {dtype}"
                        )));
                    }
                    m.to_f64(c as u8)
                }
                _ if tok.starts_with(|c: char| {
                    c.is_ascii_digit() || c == '-' || c == '+' || c == '.'
                }) =>
                {
                    if dtype == DType::F32 {
                        tok.parse::<f32>().map_err(|_| bad())? as f64
                    } else {
                        tok.parse::<f64>().map_err(|_| bad())?
                    }
                }
                _ => return Err(bad()),
            };
            Ok(Elem::F(round_to(dtype, x)))
        } else if dtype == DType::Pred {
            match tok {
                "true" => Ok(Elem::I(1)),
                "false" => Ok(Elem::I(0)),
                _ => Err(bad()),
            }
        } else if dtype == DType::U64 {
            // Carried as the u64's bits (see `int_to_f64`).
            let x: u64 = tok.parse().map_err(|_| {
                if tok.starts_with('-') {
                    LiteralError(format!("{tok} is out of range for {dtype}"))
                } else {
                    bad()
                }
            })?;
            Ok(Elem::I(x as i64))
        } else {
            let x: i64 = tok.parse().map_err(|_| bad())?;
            if wrap_to(dtype, x) != x {
                return Err(LiteralError(format!("{x} is out of range for {dtype}")));
            }
            Ok(Elem::I(x))
        }
    }

    /// Builds a literal of `dtype` and `shape` from parsed elements.
    pub fn from_elems(ty: TensorType, elems: &[Elem]) -> Result<Literal, LiteralError> {
        if ty.dtype.is_complex() {
            let v: Vec<[f64; 2]> = elems.iter().map(|e| e.as_complex()).collect();
            Literal::from_complex_f64s(ty, &v)
        } else if ty.dtype.is_float() {
            let v: Vec<f64> = elems.iter().map(|e| e.as_f64()).collect();
            Literal::from_f64s(ty, &v)
        } else {
            let v: Vec<i64> = elems.iter().map(|e| e.as_i64()).collect();
            Literal::from_i64s(ty, &v)
        }
    }

    /// Writes the elements as nested lists, one level per dimension (`[[1, 2], [3, 4]]`; a
    /// scalar is just its element). Every element is written: this is the form the IR text
    /// and [`crate::parse_literal`] use.
    pub fn write_nested(&self, out: &mut String) {
        self.write_lists(out, None);
    }

    /// Writes the elements like [`Literal::write_nested`], but when there are more than
    /// [`SUMMARY_THRESHOLD`] of them, each dimension longer than `2 *` [`SUMMARY_EDGE`] shows
    /// only its first and last [`SUMMARY_EDGE`] items, with `...` between (NumPy's
    /// `threshold` and `edgeitems`): `[[0, 1, 2, ..., 47, 48, 49], ..., [...]]`. This is what
    /// `Display` prints; the result is for reading, not for parsing back.
    pub fn write_summary(&self, out: &mut String) {
        let edge = (self.numel() > SUMMARY_THRESHOLD).then_some(SUMMARY_EDGE);
        self.write_lists(out, edge);
    }

    /// The nested lists, with only `edge` items at each end of a longer dimension when given.
    fn write_lists(&self, out: &mut String, edge: Option<usize>) {
        fn rec(
            l: &Literal,
            out: &mut String,
            dim: usize,
            offset: usize,
            strides: &[usize],
            edge: Option<usize>,
        ) {
            if dim == l.shape().len() {
                out.push_str(&l.format_elem(offset));
                return;
            }
            let n = l.shape()[dim];
            // The items written before the gap and the first one after it.
            let (head, tail) = match edge {
                Some(e) if n > 2 * e => (e, n - e),
                _ => (n, n),
            };
            out.push('[');
            for i in (0..head).chain(tail..n) {
                if i > 0 {
                    out.push_str(", ");
                }
                if i == tail && head < tail {
                    out.push_str("..., ");
                }
                rec(l, out, dim + 1, offset + i * strides[dim], strides, edge);
            }
            out.push(']');
        }
        rec(self, out, 0, 0, &self.ty.strides(), edge);
    }
}

/// Above this many elements, a literal's `Display` summarizes it (NumPy's print threshold).
pub const SUMMARY_THRESHOLD: usize = 1000;

/// The items a summarized literal shows at each end of a dimension (NumPy's `edgeitems`).
pub const SUMMARY_EDGE: usize = 3;

/// One parsed element: an integer (or `pred` as 0/1), a float or a complex number.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Elem {
    /// An integer or `pred` value.
    I(i64),
    /// A float value.
    F(f64),
    /// A complex value: real and imaginary parts.
    C(f64, f64),
}

impl Elem {
    /// The value as f64 (a complex value's real part).
    pub fn as_f64(self) -> f64 {
        match self {
            Elem::I(x) => x as f64,
            Elem::F(x) | Elem::C(x, _) => x,
        }
    }

    /// The value as i64 (a complex value's real part, truncated).
    pub fn as_i64(self) -> i64 {
        match self {
            Elem::I(x) => x,
            Elem::F(x) | Elem::C(x, _) => x as i64,
        }
    }

    /// The value as a complex number `[real, imaginary]`.
    pub fn as_complex(self) -> [f64; 2] {
        match self {
            Elem::C(re, im) => [re, im],
            e => [e.as_f64(), 0.0],
        }
    }
}

/// `[[1.0, 2.0], [3.0, 4.0]] : f32[2,2]`: the elements as nested lists, then the type. Above
/// [`SUMMARY_THRESHOLD`] elements only the ends of each dimension are shown (see
/// [`Literal::write_summary`]); the alternate form (`{:#}`) shows every element.
impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        if f.alternate() {
            self.write_nested(&mut s);
        } else {
            self.write_summary(&mut s);
        }
        write!(f, "{s} : {}", self.ty)
    }
}

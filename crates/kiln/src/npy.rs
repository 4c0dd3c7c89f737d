//! NumPy arrays in and out: `.npy` files for one tensor ([`NpyExt`]: `Tensor::save_npy`,
//! `Tensor::load_npy`) and `.npz` archives of named tensors ([`crate::npz`]), through the
//! [npyz](https://docs.rs/npyz) crate.
//!
//! Every kiln dtype that NumPy has maps to its NumPy dtype: `pred` to `bool`, `i8`, `i32`,
//! `i64`, `u32`, `u8`, `f16`, `f32`, `f64` to `int8`, `int32`, `int64`, `uint32`, `uint8`,
//! `float16`, `float32`, `float64`. Files are written little-endian in C (row-major) order; reading
//! accepts either byte order and Fortran order too. `bf16` is not a NumPy dtype: saving a
//! `bf16` tensor is refused (cast it to `f32` first, which is exact), and NumPy dtypes kiln
//! lacks (`complex64`, strings, objects, ...) are refused when read. NumPy has no 4- or 2-bit
//! integers either: `i4` and `i2` tensors are saved as `int8`, `u4` and `u2` ones as `uint8`
//! (one element per byte, as kiln holds them), and so load back as `i8` and `u8`; cast them to
//! the narrow type again (`t.cast(DType::I4)`).
//!
//! ```
//! use kiln::npy::NpyExt;
//! use kiln::Tensor;
//! let dir = std::env::temp_dir().join(format!("kiln-doc-npy-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], [2, 3]).unwrap();
//! t.save_npy(dir.join("t.npy")).unwrap();
//! let back = Tensor::load_npy(dir.join("t.npy")).unwrap();
//! assert_eq!(back.shape(), [2, 3]);
//! assert_eq!(back.to_vec::<i32>().unwrap(), [1, 2, 3, 4, 5, 6]);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use crate::{DType, Element, Error, Result, Tensor};
use half::f16;
use npyz::{AutoSerialize, Deserialize, NpyFile, Order, TypeChar, WriteOptions, WriterBuilder};
use std::path::Path;

fn err(op: &str, message: impl std::fmt::Display) -> Error {
    Error::internal(op, message.to_string())
}

/// `.npy` reading and writing for [`Tensor`] (import the trait to call
/// `Tensor::save_npy` / `Tensor::load_npy`).
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, npy::NpyExt};
/// let path = std::env::temp_dir().join(format!("kiln-doc-npyext-{}.npy", std::process::id()));
/// let t = Tensor::from_vec(vec![true, false, true], [3]).unwrap();
/// t.save_npy(&path).unwrap();
/// let back = Tensor::load_npy(&path).unwrap();
/// assert_eq!(back.dtype(), DType::Pred);
/// assert_eq!(back.to_vec::<bool>().unwrap(), [true, false, true]);
/// std::fs::remove_file(&path).unwrap();
/// ```
pub trait NpyExt: Sized {
    /// Writes the tensor to `path` as a `.npy` file (atomically: temporary file, fsync,
    /// rename).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, npy::NpyExt};
    /// let name = format!("kiln-doc-save-npy-{}.npy", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let t = Tensor::from_vec(vec![0.5f32, 2.0], [2]).unwrap();
    /// t.cast(DType::F16).save_npy(&path).unwrap();
    /// assert_eq!(Tensor::load_npy(&path).unwrap().dtype(), DType::F16);
    /// // NumPy has no bf16: refused (cast to f32 first).
    /// let err = t.cast(DType::BF16).save_npy(&path).unwrap_err();
    /// assert!(err.message.contains("bf16"), "{err}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    fn save_npy(&self, path: impl AsRef<Path>) -> Result<()>;
    /// Reads a `.npy` file.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, npy::NpyExt};
    /// let name = format!("kiln-doc-load-npy-{}.npy", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// // NumPy has no 4-bit integers: an i4 tensor is saved as int8 and loads back as i8.
    /// Tensor::from_vec(vec![-8i8, 7], [2]).unwrap().cast(DType::I4).save_npy(&path).unwrap();
    /// let back = Tensor::load_npy(&path).unwrap();
    /// assert_eq!((back.dtype(), back.to_vec::<i8>().unwrap()), (DType::I8, vec![-8, 7]));
    /// std::fs::remove_file(&path).unwrap();
    /// // A file that is not there is an error naming it.
    /// assert!(Tensor::load_npy(&path).unwrap_err().message.contains("kiln-doc-load-npy"));
    /// ```
    fn load_npy(path: impl AsRef<Path>) -> Result<Self>;
}

impl NpyExt for Tensor {
    fn save_npy(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = to_npy_bytes(self)
            .map_err(|e| err("save_npy", format!("{}: {}", path.display(), e.message)))?;
        crate::checkpoint::write_atomic(path, &bytes)
    }

    fn load_npy(path: impl AsRef<Path>) -> Result<Tensor> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| err("load_npy", format!("{}: cannot read: {e}", path.display())))?;
        from_npy_bytes(&bytes)
            .map_err(|e| err("load_npy", format!("{}: {}", path.display(), e.message)))
    }
}

fn write_typed<T: Element + AutoSerialize>(t: &Tensor, shape: &[u64]) -> Result<Vec<u8>> {
    let values = t.to_vec::<T>()?;
    let mut out = Vec::new();
    let io = |e: std::io::Error| err("save_npy", e);
    let mut w = WriteOptions::<T>::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut out)
        .begin_nd()
        .map_err(io)?;
    w.extend(values).map_err(io)?;
    w.finish().map_err(io)?;
    Ok(out)
}

/// The `.npy` bytes of a tensor (C order, little-endian).
///
/// ```
/// let t = kiln::Tensor::from_vec(vec![1.5f32, -2.0], [2]).unwrap();
/// let bytes = kiln::npy::to_npy_bytes(&t).unwrap();
/// assert_eq!(&bytes[..6], b"\x93NUMPY");
/// let back = kiln::npy::from_npy_bytes(&bytes).unwrap();
/// assert_eq!(back.to_vec::<f32>().unwrap(), [1.5, -2.0]);
/// ```
pub fn to_npy_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let l = t.to_literal()?;
    let shape: Vec<u64> = l.shape().iter().map(|&d| d as u64).collect();
    match l.dtype() {
        DType::Pred => write_typed::<bool>(t, &shape),
        DType::I8 => write_typed::<i8>(t, &shape),
        DType::I4 | DType::I2 => write_typed::<i8>(&t.cast(DType::I8), &shape),
        DType::U4 | DType::U2 => write_typed::<u8>(&t.cast(DType::U8), &shape),
        DType::I32 => write_typed::<i32>(t, &shape),
        DType::I64 => write_typed::<i64>(t, &shape),
        DType::U32 => write_typed::<u32>(t, &shape),
        DType::U8 => write_typed::<u8>(t, &shape),
        DType::I16 => write_typed::<i16>(t, &shape),
        DType::U16 => write_typed::<u16>(t, &shape),
        DType::U64 => write_typed::<u64>(t, &shape),
        DType::F16 => write_typed::<f16>(t, &shape),
        DType::F32 => write_typed::<f32>(t, &shape),
        DType::F64 => write_typed::<f64>(t, &shape),
        DType::C64 | DType::C128 => Err(err(
            "save_npy",
            format!(
                "saving a complex tensor ({}) as .npy is not supported yet; save its real and \
                 imaginary parts",
                l.ty()
            ),
        )),
        DType::Mini(m) => Err(err(
            "save_npy",
            format!(
                "{m} is not a NumPy dtype, so a {} tensor cannot be saved as .npy; cast it to \
                 f32 first (`t.cast(DType::F32)`, exact)",
                l.ty()
            ),
        )),
        DType::BF16 => Err(err(
            "save_npy",
            format!(
                "bf16 is not a NumPy dtype, so a {} tensor cannot be saved as .npy; cast it to \
                 f32 first (`t.cast(DType::F32)`, exact)",
                l.ty()
            ),
        )),
    }
}

fn read_typed<T: Element + Deserialize>(file: NpyFile<&[u8]>, shape: Vec<usize>) -> Result<Tensor> {
    let values = file
        .into_vec::<T>()
        .map_err(|e| err("load_npy", format!("cannot read the data: {e}")))?;
    Tensor::from_vec(values, shape).map_err(|e| err("load_npy", e.message))
}

/// The kiln dtype of a NumPy dtype string (`<f4`, `|b1`, ...), if kiln has one.
pub(crate) fn kiln_dtype(dtype: &npyz::DType) -> Option<DType> {
    let npyz::DType::Plain(ts) = dtype else {
        return None;
    };
    Some(match (ts.type_char(), ts.size_field()) {
        (TypeChar::Bool, 1) => DType::Pred,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Uint, 8) => DType::U64,
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 8) => DType::F64,
        _ => return None,
    })
}

/// A tensor from `.npy` bytes. Fortran-order arrays are returned in kiln's row-major layout.
///
/// # Examples
///
/// ```
/// // [[1, 2, 3], [4, 5, 6]] as int32 in Fortran (column-major) order, as NumPy writes it.
/// let header = "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }";
/// let text = format!("{header:<117}\n"); // magic, version and length make 128 bytes
/// let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
/// bytes.extend((text.len() as u16).to_le_bytes());
/// bytes.extend(text.as_bytes());
/// bytes.extend([1i32, 4, 2, 5, 3, 6].iter().flat_map(|v| v.to_le_bytes()));
/// let t = kiln::npy::from_npy_bytes(&bytes).unwrap();
/// assert_eq!(t.shape(), [2, 3]);
/// assert_eq!(t.to_vec::<i32>().unwrap(), [1, 2, 3, 4, 5, 6]);
/// assert!(kiln::npy::from_npy_bytes(&bytes[..bytes.len() - 4]).is_err()); // truncated
/// ```
pub fn from_npy_bytes(bytes: &[u8]) -> Result<Tensor> {
    let file =
        NpyFile::new(bytes).map_err(|e| err("load_npy", format!("not a valid .npy file: {e}")))?;
    let np_dtype = file.dtype();
    let Some(dtype) = kiln_dtype(&np_dtype) else {
        return Err(err(
            "load_npy",
            format!(
                "the array's NumPy dtype {} has no kiln dtype (kiln reads bool, int8, int16, \
                 int32, int64, uint8, uint16, uint32, uint64, float16, float32, float64)",
                np_dtype.descr()
            ),
        ));
    };
    let mut shape: Vec<usize> = file
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| err("load_npy", "the array's shape does not fit in memory"))?;
    // A header may claim more elements than the file holds: refuse before allocating.
    let needed = shape
        .iter()
        .try_fold(dtype.bytes(), |acc, &d| acc.checked_mul(d));
    if needed.is_none_or(|n| n > bytes.len()) {
        return Err(err(
            "load_npy",
            format!(
                "the header's shape {shape:?} of {} needs more bytes than the file's {} \
                 (truncated or corrupt?)",
                np_dtype.descr(),
                bytes.len()
            ),
        ));
    }
    let fortran = file.order() == Order::Fortran && shape.len() > 1;
    if fortran {
        // Column-major data of shape s is the row-major data of the reversed shape.
        shape.reverse();
    }
    let rank = shape.len();
    let t = match dtype {
        DType::Pred => read_typed::<bool>(file, shape),
        DType::I8 => read_typed::<i8>(file, shape),
        DType::I32 => read_typed::<i32>(file, shape),
        DType::I64 => read_typed::<i64>(file, shape),
        DType::U32 => read_typed::<u32>(file, shape),
        DType::U8 => read_typed::<u8>(file, shape),
        DType::I16 => read_typed::<i16>(file, shape),
        DType::U16 => read_typed::<u16>(file, shape),
        DType::U64 => read_typed::<u64>(file, shape),
        DType::F16 => read_typed::<f16>(file, shape),
        DType::F32 => read_typed::<f32>(file, shape),
        DType::F64 => read_typed::<f64>(file, shape),
        DType::BF16 => unreachable!("NumPy has no bf16"),
        DType::Mini(_) => unreachable!("NumPy has no small floats"),
        DType::C64 | DType::C128 => unreachable!("kiln_dtype reads no complex .npy"),
        DType::I4 | DType::U4 | DType::I2 | DType::U2 => {
            unreachable!("NumPy has no sub-byte integers")
        }
    }?;
    if fortran {
        let perm: Vec<usize> = (0..rank).rev().collect();
        let t = t.permute(&perm);
        // Materialize (and surface any error) now.
        return t.to_literal().map(Tensor::new);
    }
    Ok(t)
}

//! Feeding data to training loops: datasets, samplers and a prefetching [`DataLoader`].
//!
//! A [`Dataset`] is indexable: sample `i` is a list of fields (features, label, ...), each an
//! eager [`Tensor`] (the rows of the dataset's arrays, as PyTorch's `TensorDataset` returns a
//! tuple). kiln ships datasets over arrays in memory ([`TensorDataset`]), memory-mapped `.npy`
//! files and safetensors files ([`NpyDataset`], [`SafetensorsDataset`]: only the rows a batch
//! needs are read from disk) and CSV files ([`CsvDataset`]). Implement [`Dataset`] for anything
//! else.
//!
//! A [`DataLoader`] turns a dataset into batches: it draws indices from a [`Sampler`]
//! ([`Sequential`], seeded [`Shuffled`] or [`Distributed`] for one rank of many), applies a
//! per-sample transform, and collates each field into one tensor with a leading batch
//! dimension. With workers (the default is 2) batches are loaded on background threads into a
//! bounded queue, so the next batch is ready when the training step ends. The batches, their
//! order and their contents never depend on the number of workers.
//!
//! ```
//! use kiln::data::{DataLoader, TensorDataset};
//! use kiln::Tensor;
//! let x = Tensor::from_vec((0..10).map(|i| i as f32).collect::<Vec<_>>(), [5, 2]).unwrap();
//! let y = Tensor::from_vec(vec![0i32, 1, 0, 1, 1], [5]).unwrap();
//! let loader = DataLoader::new(TensorDataset::new(vec![x, y]).unwrap(), 2)
//!     .unwrap()
//!     .shuffle(42);
//! let mut seen = 0;
//! for batch in loader.epoch(0) {
//!     let batch = batch.unwrap();
//!     assert_eq!(batch[0].shape()[1], 2);
//!     seen += batch[1].shape()[0];
//! }
//! assert_eq!(seen, 5); // two batches of 2 and a last one of 1 (`drop_last` is off)
//! ```

mod csv;
mod loader;
mod mapped;
mod memory;
mod sampler;

pub use self::csv::{CsvDataset, CsvOptions};
pub use loader::{Batches, DataLoader};
pub use mapped::{NpyDataset, SafetensorsDataset};
pub use memory::TensorDataset;
pub use sampler::{Distributed, Sampler, Sequential, Shuffled};

use crate::ir::{Literal, Loc, TensorType};
use crate::{Error, Result, Tensor};
use std::sync::Arc;

/// An indexable collection of samples, each a list of fields (PyTorch's map-style `Dataset`).
///
/// `get` is called from the loader's worker threads, hence `Send + Sync`.
///
/// # Examples
///
/// ```
/// use kiln::data::{DataLoader, Dataset};
/// use kiln::{Result, Tensor};
/// // The squares 0, 1, 4, ..., computed when asked for.
/// struct Squares(usize);
/// impl Dataset for Squares {
///     fn len(&self) -> usize { self.0 }
///     fn get(&self, i: usize) -> Result<Vec<Tensor>> { Ok(vec![Tensor::scalar((i * i) as f32)]) }
/// }
/// let d = Squares(4);
/// assert!(!d.is_empty() && Squares(0).is_empty());
/// assert_eq!(d.get(3).unwrap()[0].item().unwrap(), 9.0);
/// let batch = DataLoader::new(d, 4).unwrap().epoch(0).next().unwrap().unwrap();
/// assert_eq!(batch[0].to_vec::<f32>().unwrap(), [0.0, 1.0, 4.0, 9.0]);
/// ```
pub trait Dataset: Send + Sync {
    /// How many samples there are.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Dataset, TensorDataset};
    /// use kiln::{DType, Tensor};
    /// let d = TensorDataset::new(vec![Tensor::zeros(DType::F32, [7, 2])]).unwrap();
    /// assert_eq!(d.len(), 7);
    /// ```
    fn len(&self) -> usize;

    /// Sample `index` (`index < len()`): its fields, eager tensors.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Dataset, TensorDataset};
    /// use kiln::Tensor;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]).unwrap();
    /// let d = TensorDataset::new(vec![x]).unwrap();
    /// assert_eq!(d.get(1).unwrap()[0].to_vec::<i32>().unwrap(), [3, 4]);
    /// assert!(d.get(2).unwrap_err().message.contains("out of range"));
    /// ```
    fn get(&self, index: usize) -> Result<Vec<Tensor>>;

    /// Whether there are no samples.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Dataset, TensorDataset};
    /// use kiln::{DType, Tensor};
    /// assert!(TensorDataset::new(vec![Tensor::zeros(DType::F32, [0, 3])]).unwrap().is_empty());
    /// assert!(!TensorDataset::new(vec![Tensor::zeros(DType::F32, [1, 3])]).unwrap().is_empty());
    /// ```
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dataset error naming the operation (the public constructors add the user's location
/// with [`located`]).
pub(crate) fn data_error(op: &str, message: impl Into<String>) -> Error {
    Error::internal(op, message)
}

/// `r` with its error located at the user's `loc` (constructors are `#[track_caller]`).
pub(crate) fn located<T>(r: Result<T>, loc: Loc) -> Result<T> {
    r.map_err(|mut e| {
        e.loc.get_or_insert(loc);
        e
    })
}

/// The bytes behind a field: a vector in memory or a memory map.
pub(crate) type Bytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One field of a dataset stored as rows: `rows` consecutive rows of type `row`, little-endian,
/// starting at `offset` in `bytes`. Row `i` is the field of sample `i`.
#[derive(Clone)]
pub(crate) struct Rows {
    pub(crate) name: String,
    pub(crate) row: TensorType,
    pub(crate) rows: usize,
    pub(crate) bytes: Bytes,
    pub(crate) offset: usize,
}

impl Rows {
    /// The rows of an array of type `ty` (at least one dimension: the sample axis) whose
    /// little-endian data starts at `offset`; refuses data shorter than the type needs.
    pub(crate) fn new(
        op: &str,
        name: &str,
        ty: &TensorType,
        bytes: Bytes,
        offset: usize,
    ) -> Result<Rows> {
        let Some((&rows, rest)) = ty.shape.split_first() else {
            return Err(data_error(
                op,
                format!("{name} is a scalar ({ty}); a dataset's arrays need a leading sample axis"),
            ));
        };
        let row = TensorType::new(ty.dtype, rest.to_vec());
        let need = row
            .numel()
            .checked_mul(ty.dtype.bytes())
            .and_then(|n| n.checked_mul(rows))
            .and_then(|n| n.checked_add(offset));
        let have = (*bytes).as_ref().len();
        if need.is_none_or(|n| n > have) {
            return Err(data_error(
                op,
                format!(
                    "{name}: {ty} needs more bytes than the {have} there are (truncated or corrupt?)"
                ),
            ));
        }
        Ok(Rows {
            name: name.to_string(),
            row,
            rows,
            bytes,
            offset,
        })
    }

    fn row_bytes(&self) -> usize {
        self.row.numel() * self.row.dtype.bytes()
    }

    /// Row `i` as an eager tensor.
    pub(crate) fn get(&self, op: &str, i: usize) -> Result<Tensor> {
        if i >= self.rows {
            return Err(data_error(
                op,
                format!(
                    "sample {i} is out of range: {} has {} samples",
                    self.name, self.rows
                ),
            ));
        }
        let n = self.row_bytes();
        let start = self.offset + i * n;
        let bytes = &(*self.bytes).as_ref()[start..start + n];
        Literal::from_le_bytes(self.row.clone(), bytes)
            .map(Tensor::new)
            .map_err(|e| data_error(op, format!("{}, sample {i}: {}", self.name, e.0)))
    }
}

/// Checks that every field has the same number of samples; returns it.
pub(crate) fn common_len(op: &str, fields: &[Rows]) -> Result<usize> {
    let Some(first) = fields.first() else {
        return Err(data_error(op, "a dataset needs at least one field"));
    };
    if let Some(other) = fields.iter().find(|f| f.rows != first.rows) {
        return Err(data_error(
            op,
            format!(
                "the fields have different numbers of samples: {} has {}, {} has {}",
                first.name, first.rows, other.name, other.rows
            ),
        ));
    }
    Ok(first.rows)
}

/// The fields of sample `i`.
pub(crate) fn sample(op: &str, fields: &[Rows], i: usize) -> Result<Vec<Tensor>> {
    fields.iter().map(|f| f.get(op, i)).collect()
}

//! [`TensorDataset`]: arrays in memory, one sample per row.

use super::{Dataset, Rows, common_len, data_error, located, sample};
use crate::ir::Loc;
use crate::{Result, Tensor};
use std::sync::Arc;

/// Samples from tensors in memory: sample `i` is row `i` (along the first axis) of each tensor
/// (PyTorch's `TensorDataset`). The tensors must be eager and share their first dimension.
///
/// ```
/// use kiln::data::{Dataset, TensorDataset};
/// use kiln::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]).unwrap();
/// let y = Tensor::from_vec(vec![7i32, 8, 9], [3]).unwrap();
/// let d = TensorDataset::new(vec![x, y]).unwrap();
/// let s = d.get(1).unwrap();
/// assert_eq!(s[0].to_vec::<f32>().unwrap(), [3.0, 4.0]);
/// assert_eq!(s[1].to_vec::<i32>().unwrap(), [8]);
/// ```
#[derive(Clone)]
pub struct TensorDataset {
    fields: Vec<Rows>,
    len: usize,
}

impl TensorDataset {
    /// A dataset over `tensors` (each of shape `[n, ...]`, the same `n`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Dataset, TensorDataset};
    /// use kiln::{DType, Tensor};
    /// let d = TensorDataset::new(vec![Tensor::zeros(DType::F32, [4, 3])]).unwrap();
    /// assert_eq!((d.len(), d.get(0).unwrap()[0].shape()), (4, vec![3]));
    /// // Fields with different numbers of samples are refused.
    /// let fields = vec![Tensor::zeros(DType::F32, [4, 3]), Tensor::zeros(DType::I32, [5])];
    /// let err = TensorDataset::new(fields).err().unwrap();
    /// assert!(err.message.contains("different numbers of samples"), "{err}");
    /// ```
    #[track_caller]
    pub fn new(tensors: Vec<Tensor>) -> Result<TensorDataset> {
        const OP: &str = "TensorDataset::new";
        let loc = Loc::caller();
        let fields = tensors
            .iter()
            .enumerate()
            .map(|(k, t)| {
                let l = t.to_literal().map_err(|e| {
                    data_error(OP, format!("field {k} has no value: {}", e.message))
                })?;
                let bytes: Arc<Vec<u8>> = Arc::new(l.to_le_bytes());
                Rows::new(OP, &format!("field {k}"), l.ty(), bytes, 0)
            })
            .collect::<Result<Vec<_>>>();
        let fields = located(fields, loc)?;
        let len = located(common_len(OP, &fields), loc)?;
        Ok(TensorDataset { fields, len })
    }
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        sample("TensorDataset::get", &self.fields, index)
    }
}

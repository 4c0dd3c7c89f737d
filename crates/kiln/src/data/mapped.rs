//! Memory-mapped datasets: `.npy` files ([`NpyDataset`]) and safetensors files
//! ([`SafetensorsDataset`]). The files are mapped, not read: a batch reads only its rows, so a
//! dataset may be larger than memory.

use super::{Bytes, Dataset, Rows, common_len, data_error, located, sample};
use crate::checkpoint::from_safetensors_dtype;
use crate::ir::{Loc, TensorType};
use crate::npy::kiln_dtype;
use crate::{Result, Tensor};
use memmap2::Mmap;
use npyz::{Endianness, NpyFile, Order};
use safetensors::SafeTensors;
use std::path::Path;
use std::sync::Arc;

/// Maps `path` read-only.
fn map(op: &str, path: &Path) -> Result<Arc<Mmap>> {
    let file = std::fs::File::open(path)
        .map_err(|e| data_error(op, format!("{}: cannot open: {e}", path.display())))?;
    // SAFETY: the map is read-only; as with any memory-mapped file, another process
    // truncating or rewriting the file while it is mapped is outside what kiln can guard
    // (documented on the datasets).
    let m = unsafe { Mmap::map(&file) }
        .map_err(|e| data_error(op, format!("{}: cannot map: {e}", path.display())))?;
    Ok(Arc::new(m))
}

/// Samples from `.npy` files, memory-mapped: sample `i` is row `i` of each file's array (the
/// arrays share their first dimension). The arrays must be C-ordered and little-endian (what
/// NumPy writes by default); others are refused with a message saying to load them with
/// [`crate::npy::NpyExt::load_npy`] into a [`super::TensorDataset`].
///
/// The files must not be rewritten while the dataset maps them.
///
/// ```
/// use kiln::data::{Dataset, NpyDataset};
/// use kiln::npy::NpyExt;
/// use kiln::Tensor;
/// let dir = std::env::temp_dir().join(format!("kiln-doc-npyds-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap().save_npy(dir.join("x.npy")).unwrap();
/// Tensor::from_vec(vec![5i32, 6], [2]).unwrap().save_npy(dir.join("y.npy")).unwrap();
/// let d = NpyDataset::open(&[dir.join("x.npy"), dir.join("y.npy")]).unwrap();
/// assert_eq!(d.len(), 2);
/// assert_eq!(d.get(1).unwrap()[0].to_vec::<f32>().unwrap(), [3.0, 4.0]);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Clone)]
pub struct NpyDataset {
    fields: Vec<Rows>,
    len: usize,
}

impl NpyDataset {
    /// Maps each of `paths` (one field each, in order).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, data::NpyDataset, npy::NpyExt};
    /// let dir = std::env::temp_dir().join(format!("kiln-doc-npyds-open-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// Tensor::zeros(DType::F32, [3, 2]).save_npy(dir.join("x.npy")).unwrap();
    /// Tensor::zeros(DType::I32, [4]).save_npy(dir.join("y.npy")).unwrap();
    /// // 3 samples of x but 4 of y: refused.
    /// let err = NpyDataset::open(&[dir.join("x.npy"), dir.join("y.npy")]).err().unwrap();
    /// assert!(err.message.contains("different numbers of samples"), "{err}");
    /// std::fs::remove_dir_all(&dir).unwrap();
    /// ```
    #[track_caller]
    pub fn open(paths: &[impl AsRef<Path>]) -> Result<NpyDataset> {
        const OP: &str = "NpyDataset::open";
        let loc = Loc::caller();
        let fields = paths
            .iter()
            .map(|p| npy_rows(OP, p.as_ref()))
            .collect::<Result<Vec<_>>>();
        let fields = located(fields, loc)?;
        let len = located(common_len(OP, &fields), loc)?;
        Ok(NpyDataset { fields, len })
    }
}

fn npy_rows(op: &str, path: &Path) -> Result<Rows> {
    let name = path.display().to_string();
    let m = map(op, path)?;
    let file = NpyFile::new(&m[..])
        .map_err(|e| data_error(op, format!("{name}: not a valid .npy file: {e}")))?;
    let np = file.dtype();
    let dtype = kiln_dtype(&np).ok_or_else(|| {
        data_error(
            op,
            format!("{name}: the NumPy dtype {} has no kiln dtype", np.descr()),
        )
    })?;
    if let npyz::DType::Plain(ts) = &np
        && ts.endianness() == Endianness::Big
    {
        return Err(data_error(
            op,
            format!(
                "{name} is big-endian ({}); a mapped dataset reads little-endian data: load it \
                 with `Tensor::load_npy` (which converts) into a `TensorDataset`",
                np.descr()
            ),
        ));
    }
    let shape: Vec<usize> = file.shape().iter().map(|&d| d as usize).collect();
    if file.order() == Order::Fortran && shape.len() > 1 {
        return Err(data_error(
            op,
            format!(
                "{name} is in Fortran (column-major) order, so a sample's row is not contiguous: \
                 load it with `Tensor::load_npy` into a `TensorDataset`, or save it C-ordered"
            ),
        ));
    }
    let offset = m.len() - file.into_inner().len();
    let bytes: Bytes = m;
    Rows::new(op, &name, &TensorType::new(dtype, shape), bytes, offset)
}

impl Dataset for NpyDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        sample("NpyDataset::get", &self.fields, index)
    }
}

/// Samples from tensors of a safetensors file, memory-mapped: sample `i` is row `i` of each
/// named tensor (the tensors share their first dimension).
///
/// The file must not be rewritten while the dataset maps it.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, checkpoint, data::{Dataset, SafetensorsDataset}};
/// let name = format!("kiln-doc-stds-{}.safetensors", std::process::id());
/// let path = std::env::temp_dir().join(name);
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
/// let y = Tensor::from_vec(vec![0i32, 1], [2]).unwrap();
/// checkpoint::save(&path, &vec![x, y], &checkpoint::Metadata::new(0)).unwrap(); // named `0`, `1`
/// let d = SafetensorsDataset::open(&path, &["1", "0"]).unwrap();
/// let s = d.get(1).unwrap();
/// assert_eq!(s[0].to_vec::<i32>().unwrap(), [1]);
/// assert_eq!(s[1].to_vec::<f32>().unwrap(), [3.0, 4.0]);
/// std::fs::remove_file(&path).unwrap();
/// ```
#[derive(Clone)]
pub struct SafetensorsDataset {
    fields: Vec<Rows>,
    len: usize,
}

impl SafetensorsDataset {
    /// Maps `path` and takes the tensors `names`, one field each, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, checkpoint, data::SafetensorsDataset};
    /// let name = format!("kiln-doc-stds-open-{}.safetensors", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let tree = vec![Tensor::ones(DType::F32, [2])];
    /// checkpoint::save(&path, &tree, &checkpoint::Metadata::new(0)).unwrap();
    /// let err = SafetensorsDataset::open(&path, &["labels"]).err().unwrap();
    /// assert!(err.message.contains("no tensor `labels`"), "{err}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    #[track_caller]
    pub fn open(path: impl AsRef<Path>, names: &[&str]) -> Result<SafetensorsDataset> {
        const OP: &str = "SafetensorsDataset::open";
        let loc = Loc::caller();
        let path = path.as_ref();
        let fields = located(safetensors_rows(OP, path, names), loc)?;
        let len = located(common_len(OP, &fields), loc)?;
        Ok(SafetensorsDataset { fields, len })
    }
}

fn safetensors_rows(op: &str, path: &Path, names: &[&str]) -> Result<Vec<Rows>> {
    let file = path.display().to_string();
    let m = map(op, path)?;
    let st = SafeTensors::deserialize(&m[..]).map_err(|e| {
        data_error(
            op,
            format!("{file}: not a valid safetensors file (truncated or corrupt?): {e}"),
        )
    })?;
    let base = m.as_ptr() as usize;
    let mut rows = Vec::with_capacity(names.len());
    for &name in names {
        let view = st.tensor(name).map_err(|_| {
            let mut have: Vec<String> = st.names().into_iter().map(str::to_string).collect();
            have.sort();
            data_error(
                op,
                format!("{file} has no tensor `{name}`; it has {}", have.join(", ")),
            )
        })?;
        let dtype = from_safetensors_dtype(view.dtype()).ok_or_else(|| {
            data_error(
                op,
                format!(
                    "{file}: `{name}` is {:?}, which kiln has no dtype for",
                    view.dtype()
                ),
            )
        })?;
        let offset = view.data().as_ptr() as usize - base;
        let ty = TensorType::new(dtype, view.shape().to_vec());
        let bytes: Bytes = m.clone();
        rows.push(Rows::new(
            op,
            &format!("{file}:{name}"),
            &ty,
            bytes,
            offset,
        )?);
    }
    Ok(rows)
}

impl Dataset for SafetensorsDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        sample("SafetensorsDataset::get", &self.fields, index)
    }
}

//! Checkpoints: a parameter tree (or a whole training state: parameters, optimizer state, step
//! count and PRNG key) saved to and loaded from one [safetensors] file.
//!
//! Every leaf of the tree is one tensor of the file, named by its path in the tree
//! ([`Tree::leaf_names`]: `params.layers.0.weight`, `opt_state.m.layers.0.bias`, `key`). The
//! file's `__metadata__` holds one entry, `kiln`, a JSON object:
//!
//! ```json
//! {"format_version": 1, "kiln_version": "0.1.0", "step": 120,
//!  "data_crc32": 2865411342, "user": {"run": "baseline"}}
//! ```
//!
//! `data_crc32` is the CRC-32 of the tensor data, so a file damaged after its header was
//! written is refused rather than loaded with wrong values.
//!
//! Writes are atomic: the file is written to a temporary file in the same directory, synced,
//! and renamed over the destination (then the directory is synced), so a crash leaves either
//! the old checkpoint or the new one, never half of one.
//!
//! Loading takes a *template*: a tree of the structure to fill (its tensors' values are not
//! used, only their names, shapes and dtypes). Every difference between the file and the
//! template (a missing tensor, an extra one, a wrong shape, a wrong dtype) is reported in one
//! error, each by name. A truncated or corrupt file gives an error, never a panic.
//!
//! Files written elsewhere (PyTorch's `safetensors.torch.save_file`, say) load with
//! [`load_mapped`], which renames the file's tensors to the tree's names.
//!
//! ```
//! use kiln::checkpoint::{self, Metadata, TrainState};
//! use kiln::nn::Mlp;
//! use kiln::optim::Adam;
//! use kiln::{DType, random};
//!
//! let params = Mlp::new(&random::key(0), &[2, 4, 1], DType::F32);
//! let opt = Adam::new(1e-3);
//! let state = TrainState {
//!     opt_state: opt.init(&params),
//!     params,
//!     key: random::key(42),
//!     step: 10,
//! };
//! let dir = std::env::temp_dir().join(format!("kiln-doc-ckpt-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("state.safetensors");
//! let mut user = Metadata::new(0).user;
//! user.insert("run".into(), "doc".into());
//! state.save(&path, &user).unwrap();
//!
//! let (restored, meta) = TrainState::load(&path, &state).unwrap();
//! assert_eq!(restored.step, 10);
//! assert_eq!(meta.user["run"], "doc");
//! assert_eq!(
//!     restored.params.layers[0].weight.to_vec::<f32>().unwrap(),
//!     state.params.layers[0].weight.to_vec::<f32>().unwrap()
//! );
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```
//!
//! [safetensors]: https://github.com/huggingface/safetensors

use crate::random::Key;
use crate::{DType, Error, Result, Tensor, Tree};
use kiln_ir::{Literal, MiniFloat, TensorType};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The version of the checkpoint layout this kiln writes (and the newest it reads).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, checkpoint::{self, FORMAT_VERSION, Metadata}};
/// let x = Tensor::scalar(1.0f32);
/// // A file of a newer layout is refused rather than misread.
/// let newer = Metadata { format_version: FORMAT_VERSION + 1, ..Metadata::new(0) };
/// let bytes = checkpoint::to_bytes(&x, &newer).unwrap();
/// let err = checkpoint::from_bytes(&bytes, &x).unwrap_err();
/// assert!(err.message.contains("is newer than this kiln reads"), "{err}");
/// ```
pub const FORMAT_VERSION: u32 = 1;

/// The key of kiln's JSON block in the safetensors `__metadata__` map.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, checkpoint};
/// let x = Tensor::scalar(1.0f32);
/// let bytes = checkpoint::to_bytes(&x, &checkpoint::Metadata::new(4)).unwrap();
/// // What another safetensors reader sees.
/// let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
/// let block = &header.metadata().as_ref().unwrap()[checkpoint::METADATA_KEY];
/// let json: serde_json::Value = serde_json::from_str(block).unwrap();
/// assert_eq!((json["step"].as_u64(), json["format_version"].as_u64()), (Some(4), Some(1)));
/// ```
pub const METADATA_KEY: &str = "kiln";

/// A checkpoint's metadata block.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, checkpoint::{self, Metadata}};
/// let mut meta = Metadata::new(3);
/// meta.user.insert("lr".into(), "0.1".into());
/// let x = Tensor::scalar(1.0f32);
/// let bytes = checkpoint::to_bytes(&x, &meta).unwrap();
/// let (_, back) = checkpoint::from_bytes(&bytes, &x).unwrap();
/// assert_eq!(back, meta);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// The checkpoint layout version ([`FORMAT_VERSION`] when written by this kiln).
    pub format_version: u32,
    /// The version of kiln that wrote the file (this crate's version when saving).
    pub kiln_version: String,
    /// The training step.
    pub step: u64,
    /// Free-form user entries.
    pub user: BTreeMap<String, String>,
}

impl Metadata {
    /// Metadata for `step` with no user entries, stamped with this kiln's versions.
    ///
    /// ```
    /// let m = kiln::checkpoint::Metadata::new(7);
    /// assert_eq!((m.step, m.format_version), (7, kiln::checkpoint::FORMAT_VERSION));
    /// ```
    pub fn new(step: u64) -> Metadata {
        Metadata {
            format_version: FORMAT_VERSION,
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            step,
            user: BTreeMap::new(),
        }
    }
}

/// A training state: what resuming a run needs. It is a [`Tree`]; its tensors are named
/// `params.*`, `opt_state.*` and `key`, and `step` is kept in the metadata.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, Tree, checkpoint::TrainState, nn::Linear, optim::Sgd, random};
/// let params = Linear::new(&random::key(0), 2, 1, DType::F32);
/// let opt_state = Sgd::new(0.1).init(&params);
/// let state = TrainState { params, opt_state, key: random::key(1), step: 5 };
/// let names = state.leaf_name_vec();
/// assert_eq!(names[..2], ["params.weight", "params.bias"]);
/// assert_eq!(names.last().unwrap(), "key");
/// assert!(!names.iter().any(|n| n.contains("step"))); // the step is metadata
/// ```
#[derive(Clone, Debug, crate::Tree)]
pub struct TrainState<P, S> {
    /// The model's parameters.
    pub params: P,
    /// The optimizer's state ([`crate::optim::AdamState`], [`crate::optim::SgdState`], ...).
    pub opt_state: S,
    /// The PRNG key the next step will use.
    pub key: Key,
    /// Steps taken.
    pub step: u64,
}

impl<P: Tree, S: Tree> TrainState<P, S> {
    /// Saves the state to `path` atomically, with `user` entries in the metadata (see the
    /// [module docs](self)).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{Tensor, checkpoint::TrainState, random};
    /// let key = random::key(7);
    /// let state = TrainState { params: Tensor::scalar(2.5f32), opt_state: (), key, step: 42 };
    /// let name = format!("kiln-doc-state-save-{}.safetensors", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// let user = [("run".to_string(), "doc".to_string())].into();
    /// state.save(&path, &user).unwrap();
    /// let (back, meta) = TrainState::load(&path, &state).unwrap();
    /// assert_eq!((back.step, back.params.item().unwrap()), (42, 2.5));
    /// assert_eq!(meta.user, user);
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn save(&self, path: impl AsRef<Path>, user: &BTreeMap<String, String>) -> Result<()> {
        let mut meta = Metadata::new(self.step);
        meta.user = user.clone();
        save(path, self, &meta)
    }

    /// Loads a state of `like`'s structure from `path`; the step comes from the metadata.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::{DType, Tensor, checkpoint::TrainState, random};
    /// let params = Tensor::ones(DType::F32, [2]);
    /// let state = TrainState { params, opt_state: (), key: random::key(0), step: 9 };
    /// let name = format!("kiln-doc-state-load-{}.safetensors", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// state.save(&path, &Default::default()).unwrap();
    /// let (back, _) = TrainState::load(&path, &TrainState { step: 0, ..state.clone() }).unwrap();
    /// assert_eq!(back.step, 9);
    /// // A template of another shape is refused, naming the tensor.
    /// let other = TrainState { params: Tensor::ones(DType::F32, [3]), ..state };
    /// let err = TrainState::load(&path, &other).unwrap_err();
    /// assert!(err.message.contains("params"), "{err}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn load(path: impl AsRef<Path>, like: &Self) -> Result<(Self, Metadata)> {
        let (mut state, meta) = load(path, like)?;
        state.step = meta.step;
        Ok((state, meta))
    }
}

fn err(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::internal("checkpoint", format!("{}: {message}", path.display()))
}

/// The safetensors dtype of a kiln dtype. safetensors has no 4- or 2-bit integers: `i4` and
/// `i2` are saved as `I8`, `u4` and `u2` as `U8`, one element per byte as kiln holds them, and
/// load back into a leaf of the narrow type when every value is in its range. `c64` is `C64`;
/// safetensors has no 128-bit complex type, so `c128` has none (`None`).
///
/// # Examples
///
/// ```
/// use kiln::{DType, checkpoint};
/// use safetensors::Dtype;
/// assert_eq!(checkpoint::to_safetensors_dtype(DType::BF16), Some(Dtype::BF16));
/// assert_eq!(checkpoint::to_safetensors_dtype(DType::Pred), Some(Dtype::BOOL));
/// assert_eq!(checkpoint::to_safetensors_dtype(DType::I4), Some(Dtype::I8)); // one value per byte
/// assert_eq!(checkpoint::to_safetensors_dtype(DType::U2), Some(Dtype::U8));
/// assert_eq!(checkpoint::to_safetensors_dtype(DType::C128), None);
/// ```
pub fn to_safetensors_dtype(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::Pred => Dtype::BOOL,
        DType::I8 | DType::I4 | DType::I2 => Dtype::I8,
        DType::U4 | DType::U2 => Dtype::U8,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U32 => Dtype::U32,
        DType::U8 => Dtype::U8,
        DType::I16 => Dtype::I16,
        DType::U16 => Dtype::U16,
        DType::U64 => Dtype::U64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::C64 => Dtype::C64,
        DType::C128 => return None,
        // The 8-bit formats safetensors names (its `F8_E4M3` is the OCP format without
        // infinities, `f8e4m3fn`); its 6- and 4-bit types are packed, which kiln's are not.
        DType::Mini(m) => match m {
            MiniFloat::F8E4M3FN => Dtype::F8_E4M3,
            MiniFloat::F8E5M2 => Dtype::F8_E5M2,
            MiniFloat::F8E8M0FNU => Dtype::F8_E8M0,
            MiniFloat::F8E4M3FNUZ => Dtype::F8_E4M3FNUZ,
            MiniFloat::F8E5M2FNUZ => Dtype::F8_E5M2FNUZ,
            _ => return None,
        },
    })
}

/// The kiln dtype of a safetensors dtype, if kiln has one.
///
/// # Examples
///
/// ```
/// use kiln::{DType, checkpoint};
/// use safetensors::Dtype;
/// use checkpoint::{from_safetensors_dtype, to_safetensors_dtype};
/// for d in [DType::Pred, DType::U8, DType::I64, DType::F16, DType::F32, DType::C64, DType::F8E4M3FN] {
///     assert_eq!(to_safetensors_dtype(d).and_then(from_safetensors_dtype), Some(d));
/// }
/// assert_eq!(checkpoint::from_safetensors_dtype(Dtype::F8_E4M3), Some(DType::F8E4M3FN));
/// assert_eq!(checkpoint::from_safetensors_dtype(Dtype::F4), None);
/// ```
pub fn from_safetensors_dtype(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Pred,
        Dtype::I8 => DType::I8,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U32 => DType::U32,
        Dtype::U8 => DType::U8,
        Dtype::I16 => DType::I16,
        Dtype::U16 => DType::U16,
        Dtype::U64 => DType::U64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::C64 => DType::C64,
        Dtype::F8_E4M3 => DType::F8E4M3FN,
        Dtype::F8_E5M2 => DType::F8E5M2,
        Dtype::F8_E8M0 => DType::F8E8M0FNU,
        Dtype::F8_E4M3FNUZ => DType::F8E4M3FNUZ,
        Dtype::F8_E5M2FNUZ => DType::F8E5M2FNUZ,
        _ => return None,
    })
}

/// For a sub-byte integer type, an error naming the first byte outside its range (the file
/// holds one value per byte); `Ok` for every other type.
fn sub_byte_checked(ty: &TensorType, bytes: &[u8]) -> std::result::Result<(), String> {
    let d = ty.dtype;
    if !d.is_sub_byte() {
        return Ok(());
    }
    let (lo, hi) = d.int_bounds().expect("an integer dtype");
    let value = |b: u8| {
        if d.is_signed() {
            b as i8 as i128
        } else {
            b as i128
        }
    };
    match bytes.iter().map(|&b| value(b)).find(|v| *v < lo || *v > hi) {
        Some(v) => Err(format!("value {v} is out of range for {d}")),
        None => Ok(()),
    }
}

fn fail(message: impl Into<String>) -> Error {
    Error::internal("checkpoint", message)
}

/// The named leaves of `tree`, refusing duplicate names.
fn named_leaves<T: Tree>(tree: &T) -> Result<Vec<(String, &Tensor)>> {
    let names = tree.leaf_name_vec();
    let leaves = tree.leaf_vec();
    if names.len() != leaves.len() {
        return Err(fail(format!(
            "{} names {} leaves but has {} (its Tree::leaf_names is wrong)",
            tree.describe(),
            names.len(),
            leaves.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for n in &names {
        if !seen.insert(n.as_str()) {
            return Err(fail(format!(
                "two leaves of {} are both named `{n}`",
                tree.describe()
            )));
        }
    }
    Ok(names.into_iter().zip(leaves).collect())
}

/// Serializes `tree` and `meta` to safetensors bytes (what [`save`] writes).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, checkpoint::{self, Metadata}};
/// let tree = vec![Tensor::scalar(1.5f32), Tensor::from_vec(vec![1i32, 2], [2]).unwrap()];
/// let bytes = checkpoint::to_bytes(&tree, &Metadata::new(2)).unwrap();
/// // A safetensors file: an 8-byte header length, then the header, then the data.
/// let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
/// assert_eq!(bytes.len(), 8 + header + 4 + 2 * 4);
/// let (back, _) = checkpoint::from_bytes(&bytes, &tree).unwrap();
/// assert_eq!(back[1].to_vec::<i32>().unwrap(), [1, 2]);
/// ```
pub fn to_bytes<T: Tree>(tree: &T, meta: &Metadata) -> Result<Vec<u8>> {
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in named_leaves(tree)? {
        let Some(l) = t.literal() else {
            let why = match t.to_literal() {
                Err(e) => e.to_string(),
                Ok(_) => "no value".into(),
            };
            return Err(fail(format!("tensor `{name}` has no value: {why}")));
        };
        let Some(dtype) = to_safetensors_dtype(l.dtype()) else {
            return Err(fail(format!(
                "tensor `{name}` is {}, which safetensors has no dtype for",
                l.ty()
            )));
        };
        tensors.push((name, dtype, l.shape().to_vec(), l.to_le_bytes()));
    }
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            TensorView::new(*d, s.clone(), b)
                .map(|v| (n.as_str(), v))
                .map_err(|e| fail(format!("tensor `{n}`: {e}")))
        })
        .collect::<Result<_>>()?;
    let with_crc = |crc: u32| -> Result<Vec<u8>> {
        let json = serde_json::json!({
            "format_version": meta.format_version,
            "kiln_version": meta.kiln_version,
            "step": meta.step,
            "data_crc32": crc,
            "user": meta.user,
        });
        let info = HashMap::from([(METADATA_KEY.to_string(), json.to_string())]);
        safetensors::serialize(views.iter().map(|(n, v)| (*n, v)), Some(info))
            .map_err(|e| fail(e.to_string()))
    };
    // The CRC covers the data section, laid out in safetensors' order (which depends on the
    // tensors only, not on the metadata): serialize once to find it, then with its CRC.
    let first = with_crc(0)?;
    let data_start = 8 + header_len(&first).unwrap_or(0);
    let crc = crc32fast::hash(&first[data_start..]);
    with_crc(crc)
}

fn header_len(bytes: &[u8]) -> Option<usize> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    usize::try_from(n).ok()
}

/// Saves `tree` to `path` atomically (temporary file in the same directory, fsync, rename),
/// with `meta` as its metadata block. Leaves are named by [`Tree::leaf_names`]; every leaf must
/// have a value (not traced, not failed).
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("kiln-doc-save-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// use kiln::{Tensor, checkpoint};
/// let tree = (Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap(), Tensor::scalar(3i64));
/// let path = dir.join("pair.safetensors");
/// checkpoint::save(&path, &tree, &checkpoint::Metadata::new(5)).unwrap();
/// let (back, meta) = checkpoint::load(&path, &tree).unwrap();
/// assert_eq!(back.1.to_vec::<i64>().unwrap(), [3]);
/// assert_eq!(meta.step, 5);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn save<T: Tree>(path: impl AsRef<Path>, tree: &T, meta: &Metadata) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_bytes(tree, meta).map_err(|e| err(path, e.message))?;
    write_atomic(path, &bytes)
}

/// Writes `bytes` to `path` through a temporary file in the same directory: write, fsync,
/// rename, then fsync the directory.
///
/// # Examples
///
/// ```
/// use kiln::checkpoint;
/// let dir = std::env::temp_dir().join(format!("kiln-doc-atomic-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("notes.txt");
/// checkpoint::write_atomic(&path, b"first").unwrap();
/// checkpoint::write_atomic(&path, b"second").unwrap(); // replaces it whole
/// assert_eq!(std::fs::read(&path).unwrap(), b"second");
/// assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1); // no temporary file left
/// assert!(checkpoint::write_atomic(&dir.join("missing/notes.txt"), b"x").is_err());
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| err(path, "the path names no file"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable (directories cannot be opened for syncing everywhere;
        // where they cannot, the rename is as durable as the platform makes it).
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(path, format!("cannot write: {e}"))
    })
}

/// Loads a tree of `like`'s structure from the checkpoint at `path`: names, shapes and dtypes
/// must match exactly (every mismatch is reported at once). Returns the tree and the
/// metadata (a file without kiln's metadata block, written by another program, gives step 0,
/// `format_version` 0, an empty `kiln_version` and no user entries).
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, checkpoint};
/// let name = format!("kiln-doc-load-{}.safetensors", std::process::id());
/// let path = std::env::temp_dir().join(name);
/// let pair = (Tensor::ones(DType::F32, [2]), Tensor::zeros(DType::I32, [3]));
/// checkpoint::save(&path, &pair, &checkpoint::Metadata::new(1)).unwrap();
/// assert_eq!(checkpoint::load(&path, &pair).unwrap().0.1.shape(), [3]);
/// // Both mismatches of this template are reported, each by name (`0`, `1`).
/// let wrong = (Tensor::ones(DType::F64, [2]), Tensor::zeros(DType::I32, [4]));
/// let err = checkpoint::load(&path, &wrong).unwrap_err();
/// assert!(err.message.contains("`0`") && err.message.contains("`1`"), "{err}");
/// std::fs::remove_file(&path).unwrap();
/// ```
pub fn load<T: Tree>(path: impl AsRef<Path>, like: &T) -> Result<(T, Metadata)> {
    load_mapped(path, like, |name| Some(name.to_string()))
}

/// [`load`] for files whose tensor names differ from the tree's: `map` gives the tree name
/// for each name in the file, or `None` to ignore that tensor. Two file tensors mapped to one
/// name are an error.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("kiln-doc-map-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// use kiln::{DType, checkpoint, nn::Linear, random};
/// let lin = Linear::new(&random::key(0), 3, 2, DType::F32);
/// let path = dir.join("lin.safetensors");
/// checkpoint::save(&path, &lin, &checkpoint::Metadata::new(0)).unwrap();
/// // Read it back as the first layer of a model, renaming `weight` to `fc.weight` etc.
/// #[derive(kiln::Tree)]
/// struct Model { fc: Linear }
/// let like = Model { fc: lin.clone() };
/// let (m, _) = checkpoint::load_mapped(&path, &like, |n| Some(format!("fc.{n}"))).unwrap();
/// assert_eq!(m.fc.weight.shape(), [3, 2]);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn load_mapped<T: Tree>(
    path: impl AsRef<Path>,
    like: &T,
    map: impl FnMut(&str) -> Option<String>,
) -> Result<(T, Metadata)> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    from_bytes_mapped(&bytes, like, map).map_err(|e| err(path, e.message))
}

/// [`load`] from bytes in memory.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, checkpoint::{self, Metadata}};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
/// let mut bytes = checkpoint::to_bytes(&x, &Metadata::new(0)).unwrap();
/// assert_eq!(checkpoint::from_bytes(&bytes, &x).unwrap().0.to_vec::<f32>().unwrap(), [1.0, 2.0]);
/// // Damaged data fails its CRC; a truncated file is refused.
/// *bytes.last_mut().unwrap() ^= 1;
/// assert!(checkpoint::from_bytes(&bytes, &x).unwrap_err().message.contains("CRC-32"));
/// assert!(checkpoint::from_bytes(&bytes[..bytes.len() - 3], &x).is_err());
/// ```
pub fn from_bytes<T: Tree>(bytes: &[u8], like: &T) -> Result<(T, Metadata)> {
    from_bytes_mapped(bytes, like, |name| Some(name.to_string()))
}

fn corrupt(message: impl std::fmt::Display) -> Error {
    Error::internal(
        "checkpoint",
        format!("not a valid safetensors checkpoint (truncated or corrupt?): {message}"),
    )
}

fn parse_metadata(st_meta: Option<&HashMap<String, String>>, data: &[u8]) -> Result<Metadata> {
    let Some(text) = st_meta.and_then(|m| m.get(METADATA_KEY)) else {
        let mut m = Metadata::new(0);
        m.kiln_version.clear();
        m.format_version = 0;
        return Ok(m);
    };
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| corrupt(format!("the `{METADATA_KEY}` metadata is not JSON: {e}")))?;
    let field = |k: &str| {
        v.get(k)
            .ok_or_else(|| corrupt(format!("the `{METADATA_KEY}` metadata has no `{k}`")))
    };
    let format_version = field("format_version")?
        .as_u64()
        .and_then(|x| u32::try_from(x).ok())
        .ok_or_else(|| corrupt("`format_version` is not a small integer"))?;
    if format_version > FORMAT_VERSION {
        return Err(Error::internal(
            "checkpoint",
            format!(
                "checkpoint format version {format_version} is newer than this kiln reads \
                 ({FORMAT_VERSION}); it was written by kiln {}",
                v.get("kiln_version")
                    .and_then(|x| x.as_str())
                    .unwrap_or("?")
            ),
        ));
    }
    let kiln_version = field("kiln_version")?
        .as_str()
        .ok_or_else(|| corrupt("`kiln_version` is not a string"))?
        .to_string();
    let step = field("step")?
        .as_u64()
        .ok_or_else(|| corrupt("`step` is not an unsigned integer"))?;
    if let Some(crc) = v.get("data_crc32") {
        let crc = crc
            .as_u64()
            .ok_or_else(|| corrupt("`data_crc32` is not an integer"))?;
        let actual = crc32fast::hash(data) as u64;
        if crc != actual {
            return Err(corrupt(format!(
                "the tensor data's CRC-32 is {actual:#010x}, the header says {crc:#010x}"
            )));
        }
    }
    let mut user = BTreeMap::new();
    if let Some(u) = v.get("user") {
        let u = u
            .as_object()
            .ok_or_else(|| corrupt("`user` is not an object"))?;
        for (k, x) in u {
            let x = x
                .as_str()
                .ok_or_else(|| corrupt(format!("user entry `{k}` is not a string")))?;
            user.insert(k.clone(), x.to_string());
        }
    }
    Ok(Metadata {
        format_version,
        kiln_version,
        step,
        user,
    })
}

/// [`load_mapped`] from bytes in memory.
///
/// # Examples
///
/// ```
/// use kiln::{DType, Tensor, checkpoint, nn::Linear};
/// let w = Tensor::ones(DType::F32, [3, 2]);
/// let file = vec![w.clone(), Tensor::zeros(DType::F32, [2])]; // tensors `0` and `1`
/// let bytes = checkpoint::to_bytes(&file, &checkpoint::Metadata::new(0)).unwrap();
/// // `0` is the weight; `1` is ignored.
/// let like = Linear { weight: w, bias: None };
/// let rename = |n: &str| (n == "0").then(|| "weight".to_string());
/// let (lin, _) = checkpoint::from_bytes_mapped(&bytes, &like, rename).unwrap();
/// assert_eq!(lin.weight.to_vec::<f32>().unwrap(), [1.0; 6]);
/// // Two file tensors mapped to one name are an error.
/// assert!(checkpoint::from_bytes_mapped(&bytes, &like, |_| Some("weight".into())).is_err());
/// ```
pub fn from_bytes_mapped<T: Tree>(
    bytes: &[u8],
    like: &T,
    mut map: impl FnMut(&str) -> Option<String>,
) -> Result<(T, Metadata)> {
    let (n, st_meta) = SafeTensors::read_metadata(bytes).map_err(corrupt)?;
    let st = SafeTensors::deserialize(bytes).map_err(corrupt)?;
    let data = &bytes[8 + n..];
    let meta = parse_metadata(st_meta.metadata().as_ref(), data)?;

    // The file's tensors under the tree's names.
    let mut file: BTreeMap<String, (String, TensorView<'_>)> = BTreeMap::new();
    let mut problems: Vec<String> = Vec::new();
    let mut file_names: Vec<(String, TensorView<'_>)> = st.tensors();
    file_names.sort_by(|a, b| a.0.cmp(&b.0));
    for (fname, view) in file_names {
        let Some(tname) = map(&fname) else { continue };
        if let Some((other, _)) = file.get(&tname) {
            problems.push(format!(
                "file tensors `{other}` and `{fname}` both map to `{tname}`"
            ));
            continue;
        }
        file.insert(tname, (fname, view));
    }

    let names = like.leaf_name_vec();
    let leaves = like.leaf_vec();
    if names.len() != leaves.len() {
        return Err(Error::internal(
            "checkpoint",
            format!(
                "{} names {} leaves but has {}",
                like.describe(),
                names.len(),
                leaves.len()
            ),
        ));
    }
    let mut out: Vec<Tensor> = Vec::with_capacity(leaves.len());
    let mut used = std::collections::HashSet::new();
    for (name, leaf) in names.iter().zip(&leaves) {
        let Some(want) = leaf.ty() else {
            problems.push(format!(
                "template tensor `{name}` has no type (it failed: {})",
                leaf.error().map(|e| e.to_string()).unwrap_or_default()
            ));
            continue;
        };
        let Some((fname, view)) = file.get(name) else {
            problems.push(format!("missing tensor `{name}` (expected {want})"));
            continue;
        };
        used.insert(name.clone());
        let shown = if fname == name {
            format!("`{name}`")
        } else {
            format!("`{name}` (file: `{fname}`)")
        };
        let dtype = from_safetensors_dtype(view.dtype());
        let mut wrong = Vec::new();
        match dtype {
            None => wrong.push(format!(
                "dtype {:?}, which kiln has no dtype for, expected {}",
                view.dtype(),
                want.dtype
            )),
            // A sub-byte leaf is saved as bytes (see `to_safetensors_dtype`).
            Some(d)
                if Some(d) != to_safetensors_dtype(want.dtype).and_then(from_safetensors_dtype) =>
            {
                wrong.push(format!("dtype {d}, expected {}", want.dtype))
            }
            _ => {}
        }
        if view.shape() != want.shape.as_slice() {
            wrong.push(format!(
                "shape {:?}, expected {:?}",
                view.shape(),
                want.shape
            ));
        }
        if !wrong.is_empty() {
            problems.push(format!("tensor {shown}: file has {}", wrong.join("; ")));
            continue;
        }
        let ty = TensorType::new(want.dtype, want.shape.clone());
        match sub_byte_checked(&ty, view.data())
            .and_then(|()| Literal::from_le_bytes(ty, view.data()).map_err(|e| e.to_string()))
        {
            Ok(l) => out.push(Tensor::new(l)),
            Err(e) => problems.push(format!("tensor {shown}: {e}")),
        }
    }
    for (tname, (fname, view)) in &file {
        if !used.contains(tname) {
            let ty = match from_safetensors_dtype(view.dtype()) {
                Some(d) => TensorType::new(d, view.shape().to_vec()).to_string(),
                None => format!("{:?}{:?}", view.dtype(), view.shape()),
            };
            let from = if fname == tname {
                String::new()
            } else {
                format!(" (file: `{fname}`)")
            };
            problems.push(format!(
                "extra tensor `{tname}`{from} ({ty}): the target has no such leaf"
            ));
        }
    }
    if !problems.is_empty() {
        return Err(Error::internal(
            "checkpoint",
            format!(
                "the checkpoint does not match {} ({} problem{}):\n  {}",
                like.describe(),
                problems.len(),
                if problems.len() == 1 { "" } else { "s" },
                problems.join("\n  ")
            ),
        ));
    }
    Ok((like.with_leaves(&out), meta))
}

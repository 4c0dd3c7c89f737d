//! `.npz` archives of named tensors, as `numpy.savez` writes and `numpy.load` reads: a zip
//! file with one `<name>.npy` member per array (see [`crate::npy`] for the dtypes).
//!
//! [`save`] stores the members uncompressed (like `numpy.savez`); [`load`] reads stored and
//! deflated members (`numpy.savez_compressed`) alike.
//!
//! ```
//! use kiln::{Tensor, npz};
//! let dir = std::env::temp_dir().join(format!("kiln-doc-npz-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let w = Tensor::from_vec(vec![0.5f32, 1.5], [2]).unwrap();
//! let n = Tensor::scalar(3i64);
//! npz::save(dir.join("arrays.npz"), [("w", &w), ("n", &n)]).unwrap();
//! let arrays = npz::load(dir.join("arrays.npz")).unwrap();
//! assert_eq!(arrays["w"].to_vec::<f32>().unwrap(), [0.5, 1.5]);
//! assert_eq!(arrays["n"].to_vec::<i64>().unwrap(), [3]);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use crate::npy::{from_npy_bytes, to_npy_bytes};
use crate::{Error, Result, Tensor};
use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};
use std::path::Path;

fn err(op: &str, path: &Path, message: impl std::fmt::Display) -> Error {
    Error::internal(op, format!("{}: {message}", path.display()))
}

/// The `.npz` bytes of named tensors.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, npz};
/// let a = Tensor::from_vec(vec![1u8, 2, 3], [3]).unwrap();
/// let bytes = npz::to_npz_bytes([("a", &a), ("b", &a)]).unwrap();
/// assert_eq!(&bytes[..2], b"PK"); // a zip archive
/// assert_eq!(npz::from_npz_bytes(&bytes).unwrap().len(), 2);
/// // Two arrays of one name are refused.
/// let err = npz::to_npz_bytes([("a", &a), ("a", &a)]).unwrap_err();
/// assert!(err.message.contains("two arrays are named `a`"), "{err}");
/// ```
pub fn to_npz_bytes<'a, S: AsRef<str>>(
    arrays: impl IntoIterator<Item = (S, &'a Tensor)>,
) -> Result<Vec<u8>> {
    let op = "npz::save";
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(false);
    let mut seen = std::collections::HashSet::new();
    for (name, t) in arrays {
        let name = name.as_ref();
        if !seen.insert(name.to_string()) {
            return Err(Error::internal(
                op,
                format!("two arrays are named `{name}`"),
            ));
        }
        let bytes = to_npy_bytes(t)
            .map_err(|e| Error::internal(op, format!("array `{name}`: {}", e.message)))?;
        let options = options.large_file(bytes.len() as u64 >= u32::MAX as u64);
        zip.start_file(format!("{name}.npy"), options)
            .map_err(|e| Error::internal(op, format!("array `{name}`: {e}")))?;
        zip.write_all(&bytes)
            .map_err(|e| Error::internal(op, format!("array `{name}`: {e}")))?;
    }
    let out = zip
        .finish()
        .map_err(|e| Error::internal(op, e.to_string()))?;
    Ok(out.into_inner())
}

/// Saves named tensors to an `.npz` file at `path` (atomically: temporary file, fsync,
/// rename). Each is stored as `<name>.npy`; `numpy.load(path)[name]` reads it back.
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, npz};
/// let path = std::env::temp_dir().join(format!("kiln-doc-npz-save-{}.npz", std::process::id()));
/// let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2]).unwrap();
/// let names = ["layer0/w".to_string(), "layer1/w".to_string()];
/// npz::save(&path, names.iter().map(|n| (n, &x))).unwrap();
/// let back = npz::load(&path).unwrap();
/// assert_eq!(back.keys().collect::<Vec<_>>(), ["layer0/w", "layer1/w"]);
/// assert_eq!(back["layer1/w"].shape(), [2, 2]);
/// std::fs::remove_file(&path).unwrap();
/// ```
pub fn save<'a, S: AsRef<str>>(
    path: impl AsRef<Path>,
    arrays: impl IntoIterator<Item = (S, &'a Tensor)>,
) -> Result<()> {
    let path = path.as_ref();
    let bytes = to_npz_bytes(arrays).map_err(|e| err("npz::save", path, e.message))?;
    crate::checkpoint::write_atomic(path, &bytes)
}

/// The named tensors of `.npz` bytes (member names without their `.npy` suffix).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, npz};
/// let n = Tensor::scalar(7i64);
/// let arrays = npz::from_npz_bytes(&npz::to_npz_bytes([("n", &n)]).unwrap()).unwrap();
/// assert_eq!(arrays["n"].to_vec::<i64>().unwrap(), [7]);
/// let err = npz::from_npz_bytes(b"not a zip file").unwrap_err();
/// assert!(err.message.contains("not a valid .npz"), "{err}");
/// ```
pub fn from_npz_bytes(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>> {
    let op = "npz::load";
    let mut zip = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| Error::internal(op, format!("not a valid .npz (zip) file: {e}")))?;
    let mut out = BTreeMap::new();
    for i in 0..zip.len() {
        let mut member = zip
            .by_index(i)
            .map_err(|e| Error::internal(op, format!("member {i}: {e}")))?;
        if member.is_dir() {
            continue;
        }
        let member_name = member
            .name()
            .map_err(|e| Error::internal(op, format!("member {i}: {e}")))?
            .to_string();
        let name = member_name
            .strip_suffix(".npy")
            .unwrap_or(&member_name)
            .to_string();
        let mut data = Vec::new();
        member
            .read_to_end(&mut data)
            .map_err(|e| Error::internal(op, format!("member `{member_name}`: {e}")))?;
        let t = from_npy_bytes(&data)
            .map_err(|e| Error::internal(op, format!("member `{member_name}`: {}", e.message)))?;
        out.insert(name, t);
    }
    Ok(out)
}

/// Loads every array of the `.npz` file at `path`, by name (member names without `.npy`).
///
/// # Examples
///
/// ```
/// use kiln::{Tensor, npz};
/// let path = std::env::temp_dir().join(format!("kiln-doc-npz-load-{}.npz", std::process::id()));
/// let (w, b) = (Tensor::ones(kiln::DType::F32, [2, 3]), Tensor::scalar(0.5f32));
/// npz::save(&path, [("w", &w), ("b", &b)]).unwrap();
/// let arrays = npz::load(&path).unwrap();
/// assert_eq!((arrays["w"].shape(), arrays["b"].item().unwrap()), (vec![2, 3], 0.5));
/// std::fs::remove_file(&path).unwrap();
/// assert!(npz::load(&path).unwrap_err().message.contains("cannot read"));
/// ```
pub fn load(path: impl AsRef<Path>) -> Result<BTreeMap<String, Tensor>> {
    let path = path.as_ref();
    let bytes =
        std::fs::read(path).map_err(|e| err("npz::load", path, format!("cannot read: {e}")))?;
    from_npz_bytes(&bytes).map_err(|e| err("npz::load", path, e.message))
}

//! [`CsvDataset`]: a table of numbers (and optionally a label column) from a CSV file.

use super::{Dataset, Rows, common_len, data_error, located, sample};
use crate::ir::{Literal, Loc, TensorType};
use crate::{DType, Result, Tensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// How to read a CSV file into a [`CsvDataset`]. The default: a header row, `,` between
/// fields, no label, every column an `f32` feature.
///
/// # Examples
///
/// ```
/// let path = std::env::temp_dir().join(format!("kiln-doc-csvopts-{}.csv", std::process::id()));
/// std::fs::write(&path, "x,y\n1,2\n3,4\n").unwrap();
/// use kiln::data::{CsvDataset, CsvOptions, Dataset};
/// let d = CsvDataset::open(&path, CsvOptions::default()).unwrap();
/// assert_eq!((d.len(), d.columns()), (2, &["x".to_string(), "y".to_string()][..]));
/// assert_eq!(d.get(1).unwrap().len(), 1); // features only, no label field
/// assert_eq!(d.get(1).unwrap()[0].to_vec::<f32>().unwrap(), [3.0, 4.0]);
/// std::fs::remove_file(&path).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct CsvOptions {
    header: bool,
    delimiter: u8,
    label: Option<String>,
    features: Option<Vec<String>>,
    dtype: DType,
}

impl Default for CsvOptions {
    fn default() -> CsvOptions {
        CsvOptions {
            header: true,
            delimiter: b',',
            label: None,
            features: None,
            dtype: DType::F32,
        }
    }
}

impl CsvOptions {
    /// The file has no header row; columns are then named `0`, `1`, ...
    ///
    /// # Examples
    ///
    /// ```
    /// let name = format!("kiln-doc-csv-noheader-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "1,2\n3,4\n").unwrap();
    /// use kiln::data::{CsvDataset, CsvOptions, Dataset};
    /// let d = CsvDataset::open(&path, CsvOptions::default().no_header()).unwrap();
    /// assert_eq!(d.len(), 2); // the first line is a sample
    /// assert_eq!(d.columns(), ["0", "1"]);
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn no_header(mut self) -> CsvOptions {
        self.header = false;
        self
    }

    /// The field separator (`,` by default).
    ///
    /// # Examples
    ///
    /// ```
    /// let name = format!("kiln-doc-csv-delim-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "a;b\n1.5;-2\n").unwrap();
    /// use kiln::data::{CsvDataset, CsvOptions, Dataset};
    /// let d = CsvDataset::open(&path, CsvOptions::default().delimiter(b';')).unwrap();
    /// assert_eq!(d.get(0).unwrap()[0].to_vec::<f32>().unwrap(), [1.5, -2.0]);
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn delimiter(mut self, delimiter: u8) -> CsvOptions {
        self.delimiter = delimiter;
        self
    }

    /// The column holding each row's label: a second field of `i32` class ids. Integer labels
    /// are kept as they are; any other text names classes, numbered in sorted order
    /// ([`CsvDataset::classes`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let name = format!("kiln-doc-csv-label-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "x,digit\n0.5,3\n1.5,7\n").unwrap();
    /// use kiln::data::{CsvDataset, CsvOptions, Dataset};
    /// let d = CsvDataset::open(&path, CsvOptions::default().label("digit")).unwrap();
    /// let s = d.get(1).unwrap();
    /// assert_eq!(s[0].to_vec::<f32>().unwrap(), [1.5]);
    /// assert_eq!(s[1].to_vec::<i32>().unwrap(), [7]);
    /// assert!(d.classes().is_empty()); // integer labels are kept as they are
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn label(mut self, column: &str) -> CsvOptions {
        self.label = Some(column.to_string());
        self
    }

    /// The feature columns, in order (default: every column but the label).
    ///
    /// # Examples
    ///
    /// ```
    /// let name = format!("kiln-doc-csv-features-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "a,b,c\n1,2,3\n").unwrap();
    /// use kiln::data::{CsvDataset, CsvOptions, Dataset};
    /// let d = CsvDataset::open(&path, CsvOptions::default().features(&["c", "a"])).unwrap();
    /// assert_eq!(d.columns(), ["c", "a"]);
    /// assert_eq!(d.get(0).unwrap()[0].to_vec::<f32>().unwrap(), [3.0, 1.0]);
    /// let err = CsvDataset::open(&path, CsvOptions::default().features(&["d"])).err().unwrap();
    /// assert!(err.message.contains("no column `d`"), "{err}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn features(mut self, columns: &[&str]) -> CsvOptions {
        self.features = Some(columns.iter().map(|c| c.to_string()).collect());
        self
    }

    /// The features' dtype: `f32` (default) or `f64`.
    ///
    /// # Examples
    ///
    /// ```
    /// let name = format!("kiln-doc-csv-dtype-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "a\n0.1\n").unwrap();
    /// use kiln::{DType, data::{CsvDataset, CsvOptions, Dataset}};
    /// let d = CsvDataset::open(&path, CsvOptions::default().dtype(DType::F64)).unwrap();
    /// assert_eq!(d.get(0).unwrap()[0].to_vec::<f64>().unwrap(), [0.1]);
    /// assert!(CsvDataset::open(&path, CsvOptions::default().dtype(DType::I32)).is_err());
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn dtype(mut self, dtype: DType) -> CsvOptions {
        self.dtype = dtype;
        self
    }
}

/// Samples from the rows of a CSV file, read into memory: field 0 is the row's features
/// (`[features]`, `f32` by default), field 1 (with [`CsvOptions::label`]) its label, an `i32`
/// scalar. Every value must be a number (the label excepted); an unreadable or missing value is
/// an error naming its line and column.
///
/// ```
/// use kiln::data::{CsvDataset, CsvOptions, Dataset};
/// let dir = std::env::temp_dir().join(format!("kiln-doc-csv-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let path = dir.join("t.csv");
/// std::fs::write(&path, "a,b,kind\n1,2,cat\n3,4.5,dog\n").unwrap();
/// let d = CsvDataset::open(&path, CsvOptions::default().label("kind")).unwrap();
/// assert_eq!(d.len(), 2);
/// assert_eq!(d.classes(), ["cat", "dog"]);
/// let s = d.get(1).unwrap();
/// assert_eq!(s[0].to_vec::<f32>().unwrap(), [3.0, 4.5]);
/// assert_eq!(s[1].to_vec::<i32>().unwrap(), [1]);
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Clone)]
pub struct CsvDataset {
    fields: Vec<Rows>,
    len: usize,
    columns: Vec<String>,
    classes: Vec<String>,
}

impl CsvDataset {
    /// Reads `path` as `options` say.
    ///
    /// # Examples
    ///
    /// ```
    /// let name = format!("kiln-doc-csv-open-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "a,b\n1,2\n3,\n").unwrap();
    /// use kiln::data::{CsvDataset, CsvOptions};
    /// // A missing value is an error naming its line and column.
    /// let err = CsvDataset::open(&path, CsvOptions::default()).err().unwrap();
    /// assert!(err.message.contains("line 3, column `b`"), "{err}");
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    #[track_caller]
    pub fn open(path: impl AsRef<Path>, options: CsvOptions) -> Result<CsvDataset> {
        let loc = Loc::caller();
        located(read(path.as_ref(), &options), loc)
    }

    /// The feature columns' names, in the order of the features.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{CsvDataset, CsvOptions};
    /// let name = format!("kiln-doc-csv-columns-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "a,y,b\n1,0,2\n").unwrap();
    /// let d = CsvDataset::open(&path, CsvOptions::default().label("y")).unwrap();
    /// assert_eq!(d.columns(), ["a", "b"]); // the label is not a feature
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The class names of a text label column, in the order of their ids (empty for integer
    /// labels or without a label).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{CsvDataset, CsvOptions, Dataset};
    /// let name = format!("kiln-doc-csv-classes-{}.csv", std::process::id());
    /// let path = std::env::temp_dir().join(name);
    /// std::fs::write(&path, "x,kind\n1,dog\n2,cat\n3,dog\n").unwrap();
    /// let d = CsvDataset::open(&path, CsvOptions::default().label("kind")).unwrap();
    /// assert_eq!(d.classes(), ["cat", "dog"]); // ids in sorted order of the names
    /// let id = |i| d.get(i).unwrap()[1].item().unwrap();
    /// assert_eq!([id(0), id(1), id(2)], [1.0, 0.0, 1.0]);
    /// std::fs::remove_file(&path).unwrap();
    /// ```
    pub fn classes(&self) -> &[String] {
        &self.classes
    }
}

impl Dataset for CsvDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        sample("CsvDataset::get", &self.fields, index)
    }
}

const OP: &str = "CsvDataset::open";

fn read(path: &Path, o: &CsvOptions) -> Result<CsvDataset> {
    let file = path.display().to_string();
    if !matches!(o.dtype, DType::F32 | DType::F64) {
        return Err(data_error(
            OP,
            format!("features are read as f32 or f64, not {}", o.dtype),
        ));
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(o.header)
        .delimiter(o.delimiter)
        .from_path(path)
        .map_err(|e| data_error(OP, format!("{file}: {e}")))?;
    let mut records = Vec::new();
    for r in reader.records() {
        records.push(r.map_err(|e| data_error(OP, format!("{file}: {e}")))?);
    }
    let width = records.first().map_or(0, csv::StringRecord::len);
    let names: Vec<String> = if o.header {
        reader
            .headers()
            .map_err(|e| data_error(OP, format!("{file}: {e}")))?
            .iter()
            .map(str::to_string)
            .collect()
    } else {
        (0..width).map(|i| i.to_string()).collect()
    };
    let find = |c: &str| {
        names.iter().position(|n| n == c).ok_or_else(|| {
            data_error(
                OP,
                format!("{file} has no column `{c}`; it has {}", names.join(", ")),
            )
        })
    };
    let label = o.label.as_deref().map(find).transpose()?;
    let features: Vec<usize> = match &o.features {
        Some(cols) => cols.iter().map(|c| find(c)).collect::<Result<_>>()?,
        None => (0..names.len()).filter(|&i| Some(i) != label).collect(),
    };
    // The line of record k: the header's line, then one line per record (the csv crate
    // knows each record's position).
    let line = |r: &csv::StringRecord| r.position().map_or(0, |p| p.line());
    let mut values = Vec::with_capacity(records.len() * features.len());
    for r in &records {
        for &c in &features {
            let text = r.get(c).unwrap_or("").trim();
            let v: f64 = text.parse().map_err(|_| {
                data_error(
                    OP,
                    format!(
                        "{file} line {}, column `{}`: cannot read `{text}` as a number{}",
                        line(r),
                        names[c],
                        if text.is_empty() {
                            " (a missing value: fill or drop it first)"
                        } else {
                            ""
                        }
                    ),
                )
            })?;
            values.push(v);
        }
    }
    let n = records.len();
    let ty = TensorType::new(o.dtype, [n, features.len()]);
    let lit = Literal::from_f64s(ty.clone(), &values).map_err(|e| data_error(OP, e.0))?;
    let mut fields = vec![Rows::new(
        OP,
        &format!("{file} features"),
        &ty,
        Arc::new(lit.to_le_bytes()),
        0,
    )?];
    let mut classes = Vec::new();
    if let Some(c) = label {
        let texts: Vec<&str> = records
            .iter()
            .map(|r| r.get(c).unwrap_or("").trim())
            .collect();
        let ints: Option<Vec<i64>> = texts.iter().map(|t| t.parse::<i64>().ok()).collect();
        let ids: Vec<i64> = match ints {
            Some(ids) => {
                if let Some((r, id)) = records
                    .iter()
                    .zip(&ids)
                    .find(|(_, id)| i32::try_from(**id).is_err())
                {
                    return Err(data_error(
                        OP,
                        format!("{file} line {}, label `{id}` does not fit in i32", line(r)),
                    ));
                }
                ids
            }
            None => {
                // Class ids in sorted order of the names.
                let ids: BTreeMap<&str, i64> = texts.iter().map(|&t| (t, 0)).collect();
                let ids: BTreeMap<&str, i64> = ids
                    .keys()
                    .enumerate()
                    .map(|(i, &t)| (t, i as i64))
                    .collect();
                classes = ids.keys().map(|s| s.to_string()).collect();
                texts.iter().map(|t| ids[t]).collect()
            }
        };
        let lty = TensorType::new(DType::I32, [n]);
        let lit = Literal::from_i64s(lty.clone(), &ids).map_err(|e| data_error(OP, e.0))?;
        fields.push(Rows::new(
            OP,
            &format!("{file} labels"),
            &lty,
            Arc::new(lit.to_le_bytes()),
            0,
        )?);
    }
    let len = common_len(OP, &fields)?;
    Ok(CsvDataset {
        fields,
        len,
        columns: features.iter().map(|&c| names[c].clone()).collect(),
        classes,
    })
}

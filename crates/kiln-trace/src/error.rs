//! Errors of tracing and running tensor programs.

use kiln_ir::Loc;
use std::fmt;

/// What went wrong, and where in the user's source.
///
/// # Examples
///
/// ```
/// use kiln_trace::Tensor;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
/// let e = x.reshape(&[2, 2]).to_vec::<f32>().unwrap_err();
/// assert_eq!(e.op, "reshape");
/// assert!(e.loc.is_some()); // this line of the caller's source
/// assert!(e.to_string().contains("cannot reshape f32[3]"), "{e}");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    /// The user-level operation (`add`, `matmul`, `reshape`, ...).
    pub op: String,
    /// What is wrong, with the shapes and dtypes involved.
    pub message: String,
    /// The user's source line, from `#[track_caller]`.
    pub loc: Option<Loc>,
}

impl Error {
    /// An error of `op` at the caller's location.
    #[track_caller]
    pub fn new(op: &str, message: impl Into<String>) -> Error {
        Error {
            op: op.to_string(),
            message: message.into(),
            loc: Some(Loc::caller()),
        }
    }

    /// An error of `op` at a given location.
    pub fn at(op: &str, message: impl Into<String>, loc: Loc) -> Error {
        Error {
            op: op.to_string(),
            message: message.into(),
            loc: Some(loc),
        }
    }

    /// An error without a user location (from the runtime).
    ///
    /// # Examples
    ///
    /// ```
    /// let e = kiln_trace::Error::internal("run", "out of memory");
    /// assert_eq!((e.loc, e.to_string()), (None, "run: out of memory".to_string()));
    /// ```
    pub fn internal(op: &str, message: impl Into<String>) -> Error {
        Error {
            op: op.to_string(),
            message: message.into(),
            loc: None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(l) = &self.loc {
            write!(f, "{l}: ")?;
        }
        write!(f, "{}: {}", self.op, self.message)
    }
}

impl std::error::Error for Error {}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The importer's error: a position in the input, a kind and a message.

use std::fmt;

/// A 1-based line and column in the input text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    /// 1-based line.
    pub line: u32,
    /// 1-based column, in characters.
    pub column: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// What kind of problem an [`Error`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The text is not well-formed MLIR (or not StableHLO as kiln reads it).
    Syntax,
    /// Well-formed, but it uses an op, attribute or type that kiln does not support.
    Unsupported,
    /// Well-formed, but wrong: an undefined or duplicate value, a type that does not fit.
    Invalid,
}

/// An import error, located in the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// Where in the input.
    pub pos: Pos,
    /// What kind of problem.
    pub kind: ErrorKind,
    /// What was wrong, naming the op, attribute or type.
    pub message: String,
}

impl Error {
    /// A syntax error at `pos`.
    pub fn syntax(pos: Pos, message: impl Into<String>) -> Error {
        Error {
            pos,
            kind: ErrorKind::Syntax,
            message: message.into(),
        }
    }

    /// An unsupported-feature error at `pos`.
    pub fn unsupported(pos: Pos, message: impl Into<String>) -> Error {
        Error {
            pos,
            kind: ErrorKind::Unsupported,
            message: message.into(),
        }
    }

    /// An invalid-program error at `pos`.
    pub fn invalid(pos: Pos, message: impl Into<String>) -> Error {
        Error {
            pos,
            kind: ErrorKind::Invalid,
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Unsupported => write!(f, "{}: unsupported: {}", self.pos, self.message),
            _ => write!(f, "{}: {}", self.pos, self.message),
        }
    }
}

impl std::error::Error for Error {}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// At most this many characters of input are quoted in a message.
const QUOTE_CHARS: usize = 60;

/// `s` in backticks, cut to a few dozen characters.
pub(crate) fn quote(s: &str) -> String {
    let mut it = s.chars();
    let kept: String = it.by_ref().take(QUOTE_CHARS).collect();
    if it.next().is_some() {
        format!("`{kept}…`")
    } else {
        format!("`{kept}`")
    }
}

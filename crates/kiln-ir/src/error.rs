//! The errors of the IR crate.

use std::fmt;

/// A text-form error: where, and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What went wrong, usually "expected X, found Y".
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

impl std::error::Error for ParseError {}

/// A type-rule violation of one instruction: the spec constraint label and the details.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diag {
    /// The constraint label, e.g. `add_c1` (see `ir-specs/ops/add.md`), or an `ir_*` label
    /// for the generic rules in `ir-specs/README.md`.
    pub label: String,
    /// What is wrong, with the shapes and dtypes involved.
    pub message: String,
}

impl fmt::Display for Diag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.label, self.message)
    }
}

/// A verifier error: which function and instruction broke which constraint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The function's name.
    pub func: String,
    /// The offending instruction, printed in text form (without its result type), if any.
    pub inst: Option<String>,
    /// Where the instruction came from in user source, if known.
    pub loc: Option<crate::Loc>,
    /// The broken constraint.
    pub diag: Diag,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in @{}", self.func)?;
        if let Some(i) = &self.inst {
            write!(f, " at `{i}`")?;
        }
        if let Some(l) = &self.loc {
            write!(f, " ({l})")?;
        }
        write!(f, ": {}", self.diag)
    }
}

impl std::error::Error for VerifyError {}

/// Any error of this crate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Malformed text.
    Parse(ParseError),
    /// An ill-typed or malformed program.
    Verify(VerifyError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Parse(e) => write!(f, "parse error: {e}"),
            Error::Verify(e) => write!(f, "verify error: {e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ParseError> for Error {
    fn from(e: ParseError) -> Error {
        Error::Parse(e)
    }
}

impl From<VerifyError> for Error {
    fn from(e: VerifyError) -> Error {
        Error::Verify(e)
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! The errors of the IR crate.
//!
//! Messages quote the input they complain about (a token, an attribute, an instruction), but
//! never much of it: a quote longer than [`EXCERPT_CHARS`] characters (an instruction in a
//! verifier error: [`INST_CHARS`]) is cut, with `…` and a note of how many characters were
//! left out, so an error about a huge input is still a short message.

use std::fmt::{self, Write as _};

/// The most characters of input text a parse error quotes at once.
pub const EXCERPT_CHARS: usize = 80;

/// The most characters of the offending instruction a verifier error quotes.
pub const INST_CHARS: usize = 400;

/// The most characters of a type rule's message a verifier error shows (the message names
/// types and attribute values, which can be arbitrarily long).
pub const DIAG_CHARS: usize = 1000;

/// The first `limit` characters of `x`'s text, and how many more there were. Formats `x`
/// once, keeping no more than `limit` characters of it.
fn clip(x: impl fmt::Display, limit: usize) -> (String, usize) {
    struct Clip {
        kept: String,
        room: usize,
        cut: usize,
    }
    impl fmt::Write for Clip {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            if self.room == 0 {
                self.cut += s.chars().count();
                return Ok(());
            }
            for c in s.chars() {
                if self.room > 0 {
                    self.kept.push(c);
                    self.room -= 1;
                } else {
                    self.cut += 1;
                }
            }
            Ok(())
        }
    }
    let mut w = Clip {
        kept: String::new(),
        room: limit,
        cut: 0,
    };
    let _ = write!(w, "{x}");
    (w.kept, w.cut)
}

/// ` (N more characters)`, the note after a cut excerpt.
fn cut_note(cut: usize) -> String {
    format!(" ({cut} more character{})", if cut == 1 { "" } else { "s" })
}

/// `x` in backticks, cut to `limit` characters: `` `abc…` (N more characters) ``.
fn quote_at(x: impl fmt::Display, limit: usize) -> String {
    match clip(x, limit) {
        (kept, 0) => format!("`{kept}`"),
        (kept, cut) => format!("`{kept}…`{}", cut_note(cut)),
    }
}

/// Input text quoted for an error message: `x` in backticks, cut to [`EXCERPT_CHARS`].
pub(crate) fn quote(x: impl fmt::Display) -> String {
    quote_at(x, EXCERPT_CHARS)
}

/// Input text for an error message, without backticks, cut to [`EXCERPT_CHARS`]:
/// `abc… (N more characters)`.
pub(crate) fn excerpt(x: impl fmt::Display) -> String {
    match clip(x, EXCERPT_CHARS) {
        (kept, 0) => kept,
        (kept, cut) => format!("{kept}…{}", cut_note(cut)),
    }
}

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
        match clip(&self.message, DIAG_CHARS) {
            (m, 0) => write!(f, "{}: {m}", self.label),
            (m, cut) => write!(f, "{}: {m}…{}", self.label, cut_note(cut)),
        }
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
            write!(f, " at {}", quote_at(i, INST_CHARS))?;
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

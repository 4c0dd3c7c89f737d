//! What can go wrong, and the exit code each kind ends the process with.

use std::fmt;

/// A failure of one command.
#[derive(Debug)]
pub enum Error {
    /// Bad command line (exit code 2).
    Usage(String),
    /// The model cannot be read, parsed or imported (exit code 3).
    Model(String),
    /// An input is missing, unreadable or of the wrong type (exit code 4).
    Input(String),
    /// The model does not compile, or cannot be exported (exit code 5).
    Compile(String),
    /// Running the model failed (exit code 6).
    Run(String),
    /// An output cannot be written (exit code 7).
    Output(String),
}

impl Error {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => 2,
            Error::Model(_) => 3,
            Error::Input(_) => 4,
            Error::Compile(_) => 5,
            Error::Run(_) => 6,
            Error::Output(_) => 7,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) => write!(f, "{m}"),
            Error::Model(m) => write!(f, "model: {m}"),
            Error::Input(m) => write!(f, "input: {m}"),
            Error::Compile(m) => write!(f, "compile: {m}"),
            Error::Run(m) => write!(f, "run: {m}"),
            Error::Output(m) => write!(f, "output: {m}"),
        }
    }
}

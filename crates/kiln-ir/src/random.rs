//! Random well-typed programs.

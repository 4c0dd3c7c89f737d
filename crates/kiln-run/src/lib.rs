//! kiln's runtime-only runner of ahead-of-time artifacts ([`artifact`]): a program, its device
//! plan and the PTX of its kernels, or (for a CPU, [`cpu`]) its programs and the shared
//! libraries of their kernels, written by `kiln::aot` where a compiler is, run here where
//! none is. This crate links no LLVM (`cargo tree -p kiln-run` shows no `inkwell` or
//! `llvm-sys`; `tests/cli.rs` checks it): it derives the device plan again with `kiln-kernel`,
//! checks it against the stored one, loads the PTX through the CUDA driver
//! (`kiln_runtime::cuda_exec`) or runs the plan on the GPU emulator
//! (`kiln_runtime::gpu_emu`), or loads a CPU artifact's libraries and runs its steps as the
//! CPU backend does (`kiln_runtime::kernel_program`), reads and writes `.npy` files
//! ([`npy`]), and times calls.
//!
//! The binary: `kiln-run ARTIFACT --inputs a.npy b.npy --out DIR [--device cuda:N|emulator|cpu]
//! [--random-inputs SEED] [--save-inputs DIR] [--bench N] [--expect r0.npy ...]` (see
//! `kiln-run --help`; [`cli::run`] runs it in process). Every failure is an [`Error`] with its
//! own exit code.

pub mod artifact;
pub mod cli;
pub mod cpu;
pub mod exec;
pub mod json;
pub mod npy;

pub use artifact::{Artifact, Target};
pub use exec::{Device, Runner};

/// What went wrong, by kind: each has its exit code ([`Error::exit_code`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// The command line is wrong (exit code 2).
    Usage(String),
    /// The artifact is missing, malformed, or from a kiln that decides otherwise (3).
    Artifact(String),
    /// The inputs do not fit the artifact: their number, types, or files (4).
    Input(String),
    /// No device to run on: no driver, no such GPU, a GPU too old for the PTX (5).
    Device(String),
    /// Running failed (6).
    Run(String),
    /// The results differ from the expected ones (7).
    Mismatch(String),
}

impl Error {
    /// The process exit code of this kind of failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            Error::Artifact(_) => 3,
            Error::Input(_) => 4,
            Error::Device(_) => 5,
            Error::Run(_) => 6,
            Error::Mismatch(_) => 7,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, m) = match self {
            Error::Usage(m) => ("usage", m),
            Error::Artifact(m) => ("bad artifact", m),
            Error::Input(m) => ("bad input", m),
            Error::Device(m) => ("no device", m),
            Error::Run(m) => ("run failed", m),
            Error::Mismatch(m) => ("results differ", m),
        };
        write!(f, "{what}: {m}")
    }
}

impl std::error::Error for Error {}

//! kiln's kernel layer: everything that decides how a program becomes kernels, for every
//! target, and nothing that renders them. It imports no LLVM, no GPU driver and no thread
//! pool; backends (`kiln-codegen-llvm`) render what it decides and the runtime runs it.
//!
//! - [`ir`]: the kernel IR (loop nests over index maps, reductions, epilogues, schedules) and
//!   the one traversal of its expressions; [`lower`]: the kernel of each op.
//! - [`access`]: how kernel bodies read their inputs (free variables, affine reads, reads at
//!   the kernel's own position or row); [`key`]: value keys; [`rewrite`]: renumbered inputs and
//!   renamed variables; [`pattern`]: the expression shapes fusion and the emitters recognize.
//! - [`kernel`]: all of the above under one path, as the emitters import them.
//! - [`canon`]: canonicalizing rewrites of the graph before lowering (rng expansion, transposed
//!   products, Winograd and GEMM convolutions, dot canonicalization).
//! - [`fold`]: `reduce_region` with an elementwise body as one kernel of coupled
//!   accumulators.
//! - [`fuse`]: fusion of kernels (inlining, siblings, epilogues, chains, in-place updates);
//!   [`unread`]: the elements of a product that its readers never use.
//! - [`schedule`]: the memory-aware order of steps; [`plan`]: the memory plan; [`sort`]: how a
//!   `sort` runs (by keys or by its comparator).
//! - [`loop_schedule`]: how each loop-nest kernel's loops run on a target (streaming stores,
//!   transposing tiles, guard segments), decided once for the emitters to render, with a
//!   GEMM's blocking ([`gemm_schedule`]) and how the kernel's rows are split across threads
//!   ([`threads`]).
//! - [`target`]: what a target is, as data ([`TargetInfo`]): every target limit the kernel
//!   layer decides with comes from it.
//! - [`gpu`]: the GPU IR (grids, blocks, warps, shared memory, barriers, shuffles) and the
//!   mapping of kernels onto it, decided from [`target::Gpu`].
//! - [`options`]: every switch of the compiler and the runtime, in one [`Options`] value.
//! - [`pipeline`]: optimize, canonicalize, lower, fuse and schedule, in one place, with the
//!   printed forms the dumps show.
//! - [`print`](mod@print): the text form of kernels; [`verify`]: the kernel verifier, run after lowering
//!   and after fusion in tests and debug builds.

pub mod access;
pub mod band_sums;
pub mod bits;
pub mod canon;
pub mod complex;
mod complex_math;
mod complex_regions;
pub mod fft;
pub mod fold;
pub mod fuse;
pub mod gemm_schedule;
pub mod gpu;
pub mod host_loop;
pub mod ir;
pub mod kernel;
pub mod key;
pub mod loop_schedule;
pub mod lower;
pub mod minifloat;
pub mod options;
pub mod pattern;
pub mod pipeline;
pub mod plan;
pub mod precision;
pub mod print;
pub mod reduce_tree;
pub mod render;
pub mod rewrite;
pub mod schedule;
pub mod sort;
pub mod target;
pub mod threads;
pub mod unread;
pub mod verify;
pub mod window;

pub use options::Options;
use std::fmt;
pub use target::TargetInfo;

/// How one instruction runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A compiled kernel.
    Kernel,
    /// The value is a constant held by the program.
    Constant,
    /// The results are the operands, passed through (`optimization_barrier`).
    Forward,
    /// Computed inside the kernels of its users (fused); never materialized.
    Fused,
    /// Written by a later instruction's kernel along with that instruction's own result
    /// (multi-output fusion); nothing runs here.
    Merged,
    /// The reference interpreter (an instruction the backend has no kernel for).
    Reference,
    /// Control flow run on the host (`while`, `case`): it picks the region to run, runs that
    /// region's own compiled program on the values, and loops; nothing is fused across it.
    Control,
    /// A routine of the runtime's host code (`cholesky`, `triangular_solve`, `lu`: blocked
    /// linear algebra; the collectives and `replica_id` / `partition_id`: an exchange with the
    /// other processes of the grid), [`host_routine`] says which ops have one.
    Host,
}

/// Whether `op` runs as a routine of the runtime's host code ([`Step::Host`]) when it has no
/// kernel.
pub fn host_routine(op: &kiln_ir::Op) -> bool {
    use kiln_ir::Op;
    matches!(
        op,
        Op::Cholesky { .. }
            | Op::TriangularSolve { .. }
            | Op::Lu {}
            | Op::ReplicaId {}
            | Op::PartitionId {}
            | Op::AllGather { .. }
            | Op::AllReduce { .. }
            | Op::AllToAll { .. }
            | Op::ReduceScatter { .. }
            | Op::CollectivePermute { .. }
            | Op::CollectiveBroadcast { .. }
            | Op::CollectiveReduce { .. }
    )
}

/// Why a program could not be lowered to kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The program given does not verify.
    Args(String),
    /// A stage of the pipeline failed (the message names the stage and the function).
    Lowering(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Args(m) => write!(f, "bad arguments: {m}"),
            Error::Lowering(m) => write!(f, "lowering: {m}"),
        }
    }
}

impl std::error::Error for Error {}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! What fusion decided for each instruction, with the measure that decided it.

use std::fmt;

/// What fusion decided for one instruction and why; `Display` prints it as the dumps show it
/// (`KILN_EXPLAIN`, `cargo xtask dump --stage fusion`). Instructions are named by their index
/// in the function fused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FusionDecision {
    /// Fusion is off: every instruction keeps its own kernel.
    Off,
    /// No kernel: a constant or a pass-through.
    NoKernel,
    /// A kernel of its own that is not a loop nest (a GEMM, a scatter), which nothing inlines.
    NotLoopNest,
    /// Computed inside its users' kernels; the measure that allowed it (per user, how often it
    /// reads each element, or what recomputing costs).
    Inlined(String),
    /// A loop-nest kernel of its own; why it is not computed inside its users.
    Own(String),
    /// A matrix product computed inside `user`'s kernel, the GEMM with `user` as its epilogue.
    EpilogueOf(usize),
    /// The GEMM of the product `product`, with this instruction as its epilogue.
    Epilogue(usize),
    /// A GEMM with an epilogue computed inside `user`'s kernel, which multiplies each block of
    /// its rows by a second matrix (see [`crate::ir::Chain`]).
    ChainedInto(usize),
    /// A product run on each block of rows of `first`'s GEMM and epilogue, in its kernel.
    Chained(usize),
    /// A matrix product whose GEMM runs in `layout`'s kernel, storing the product through
    /// strides into the buffer of `layout`, a transpose or reshape of it.
    StoredBy(usize),
    /// The GEMM of the product `product`, storing it through strides into this layout's
    /// buffer (`fuse/stores.rs`).
    Stores(usize),
    /// Written by `kernel`'s kernel (multi-output fusion) over the index space `shape`, the
    /// kernels sharing `shared` input buffers.
    Merged {
        /// The kernel writing the result.
        kernel: usize,
        /// The index space both kernels run over.
        shape: Vec<usize>,
        /// How many input buffers they share.
        shared: usize,
    },
}

impl fmt::Display for FusionDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FusionDecision::Off => write!(f, "fusion is off"),
            FusionDecision::NoKernel => write!(f, "no kernel (a constant or a pass-through)"),
            FusionDecision::NotLoopNest => {
                write!(f, "own kernel: not a loop nest (GEMM, scatter)")
            }
            FusionDecision::Inlined(why) => write!(f, "inlined into its users: {why}"),
            FusionDecision::Own(why) => write!(f, "own kernel: {why}"),
            FusionDecision::EpilogueOf(u) => write!(
                f,
                "runs inside #{u}'s kernel, which is this GEMM with #{u} as its epilogue"
            ),
            FusionDecision::Epilogue(p) => write!(
                f,
                "own kernel: the GEMM of #{p} with this op (and what it inlined) as its epilogue"
            ),
            FusionDecision::ChainedInto(u) => write!(
                f,
                "runs inside #{u}'s kernel: its GEMM and epilogue, then #{u}'s product of each \
                 block of its rows"
            ),
            FusionDecision::Chained(p) => write!(
                f,
                "own kernel: the GEMM of #{p}'s kernel and its epilogue, then this product on \
                 each block of rows while it is in cache"
            ),
            FusionDecision::StoredBy(l) => write!(
                f,
                "runs inside #{l}'s kernel, which is this GEMM storing the product through \
                 strides where #{l} lays it out"
            ),
            FusionDecision::Stores(p) => write!(
                f,
                "own kernel: the GEMM of #{p}, storing its product through strides into this \
                 layout's buffer"
            ),
            FusionDecision::Merged {
                kernel,
                shape,
                shared,
            } => write!(
                f,
                "written by #{kernel}'s kernel: multi-output fusion over the same index space \
                 {shape:?} ({shared} input buffer(s) shared), nothing reads it before #{kernel}"
            ),
        }
    }
}

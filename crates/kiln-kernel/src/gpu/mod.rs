//! The GPU layer: the thread-level IR kernels are mapped to ([`ir`]), the mapping itself
//! ([`mod@map`]), decided from [`crate::target::Gpu`], one warp's tensor-core tile ([`mod@mma`]),
//! the printed form ([`mod@print`]), sorts by keys ([`mod@sort`]), the linear algebra ops ([`mod@linalg`]), TF32 rounding ([`mod@tf32`]), and how a whole lowered program runs on a device
//! ([`mod@plan`]: its arena and steps; printed by [`mod@plan_print`]); the warpgroup
//! products of sm_90a: their matrix descriptors ([`mod@desc`]) and one warpgroup's tile
//! ([`mod@wgmma`]); sm_90a's mbarriers ([`mod@mbarrier`]) and TMA tile loads from tensor
//! maps ([`mod@tma`]).
//!
//! A PTX emitter renders a [`GpuKernel`] statement by statement; `kiln-runtime`'s GPU
//! emulator runs the same program on the CPU with the GPU's semantics, which is how the
//! mapping is tested where there is no GPU.

pub mod desc;
pub mod ir;
pub mod linalg;
pub mod map;
pub mod mbarrier;
pub mod mma;
pub mod plan;
pub mod plan_print;
pub mod print;
pub mod sort;
pub mod tf32;
pub mod tma;
pub mod wgmma;

pub use ir::{
    Buf, GpuKernel, GpuProgram, MapKind, Mbar, MmaOperand, Sc, SharedArray, Shuffle, Special, Stmt,
    TensorMap,
};
pub use map::map;

/// The launches of an instruction that has no fused kernel but runs on the GPU all the same
/// (`op`, of operand types `ins` and result types `outs`, its launches named `name`): a sort
/// ([`sort::sort_program`]: by keys, or the merge sort by a comparator) or a linear algebra
/// op ([`linalg::linalg_program`]).
/// `None` where the host runs it (see those modules for which cases). `top_k` is how many
/// leading elements of each slice a sort's users read (`crate::sort::top_k`), if only those.
pub fn own_program(
    op: &kiln_ir::Op,
    ins: &[kiln_ir::TensorType],
    outs: &[kiln_ir::TensorType],
    target: &crate::target::TargetInfo,
    name: &str,
    top_k: Option<usize>,
) -> Option<GpuProgram> {
    let gpu = target.gpu.as_ref()?;
    sort::sort_program(op, ins, gpu, target.sums, name, top_k)
        .or_else(|| linalg::linalg_program(op, ins, outs, gpu, target.sums, name))
}

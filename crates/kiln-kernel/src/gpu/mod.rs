//! The GPU layer: the thread-level IR kernels are mapped to ([`ir`]), the mapping itself
//! ([`mod@map`]), decided from [`crate::target::Gpu`], one warp's tensor-core tile ([`mod@mma`]),
//! the printed form ([`mod@print`]), sorts by keys ([`mod@sort`]), TF32 rounding ([`mod@tf32`]), and how a whole lowered program runs on a device
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

//! The H200 with one warpgroup tile, shared by the emulator's warpgroup tests
//! (`products/mod.rs`) and the PTX test of the TMA products (`kiln-codegen-llvm`'s
//! `ptx_tma.rs`, by path).

use kiln_kernel::target::{GemmTile, TargetInfo};

/// An H200 whose products of 16-bit operands run on warpgroups of the tile `m x n`, in rings
/// of up to `stages` stages, with dynamic shared memory for the larger rings.
#[allow(dead_code)]
pub fn wgmma_target((m, n): (usize, usize), stages: usize) -> TargetInfo {
    let mut t = TargetInfo::h200();
    let gpu = t.gpu.as_mut().expect("a GPU");
    gpu.wgmma_tiles = vec![GemmTile {
        m,
        n,
        k: 64,
        thread_m: 64,
        thread_n: n,
    }];
    gpu.mma_stages = stages;
    gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
    t
}

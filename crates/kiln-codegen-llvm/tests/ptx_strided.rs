//! PTX of the products that read their operands and store their results through strides
//! (`kiln_kernel::gpu::map`'s `strided.rs`; the programs of the emulator's `gpu_strided.rs`):
//! attention's heads split out of one projection and merged back, in f32 on the CUDA cores,
//! with bf16 operands on `mma.sync` and on warpgroups, attention online, and slices whose
//! strides keep or break 16-byte copies; rendered for sm_80 and sm_90 (sm_90a for
//! warpgroups) and assembled by ptxas.

use kiln_kernel::target::TargetInfo;

mod ptxas;
#[path = "../../kiln-runtime/tests/strided/mod.rs"]
mod strided;
#[path = "../../kiln-runtime/tests/products/wgmma_target.rs"]
mod wgmma_target;

use strided::{heads, sliced};
use wgmma_target::wgmma_target;

#[test]
fn strided_products_assemble() {
    let h200 = TargetInfo::h200();
    let wg = wgmma_target((64, 64), 3);
    let programs = [
        (heads(2, 64, 4, 64, "f32", "f32", false), &h200),
        (heads(1, 40, 3, 24, "f32", "f32", false), &h200),
        (heads(2, 40, 2, 32, "bf16", "f32", false), &h200),
        (heads(1, 64, 2, 64, "bf16", "f32", false), &wg),
        (heads(2, 48, 2, 32, "f32", "f32", true), &h200),
        (heads(2, 48, 2, 32, "bf16", "bf16", true), &h200),
        (sliced((40, 48, 72), (4, 8), (8, 8), ("f32", "f32")), &h200),
        (sliced((40, 48, 72), (1, 1), (1, 1), ("f32", "f32")), &h200),
        (sliced((40, 48, 72), (1, 3), (8, 8), ("bf16", "f32")), &h200),
    ];
    let (jobs, _) = ptxas::ptx_jobs(&programs, "");
    ptxas::assemble_jobs("strided", &jobs);
}

//! PTX of the products that leave the tiles no reader uses uncomputed (`kiln_kernel::gpu::map`'s
//! `skip.rs`; the programs of the emulator's `gpu_unread.rs`): a causal mask's scores in f32 on
//! the CUDA cores and a thread per element, with bf16 operands on `mma.sync`, on warpgroups
//! and through TMA; rendered for sm_80 and sm_90 (sm_90a for warpgroups) and assembled by
//! ptxas.

use kiln_kernel::target::TargetInfo;

mod ptxas;
#[path = "../../kiln-runtime/tests/unread/mod.rs"]
mod unread;
#[path = "../../kiln-runtime/tests/products/wgmma_target.rs"]
mod wgmma_target;

use unread::two_readers;
use wgmma_target::wgmma_target;

#[test]
fn products_leaving_unread_tiles_out_assemble() {
    let h200 = TargetInfo::h200();
    let mut untiled = h200.clone();
    untiled.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    let wg = wgmma_target((64, 64), 2);
    let mut tma = wgmma_target((64, 64), 3);
    tma.gpu.as_mut().expect("a GPU").wgmma_tma = true;
    let programs = [
        (two_readers(1, 2, 128, 64, "f32"), &h200),
        (two_readers(1, 1, 100, 24, "f32"), &h200),
        (two_readers(1, 2, 40, 8, "f32"), &untiled),
        (two_readers(1, 1, 100, 32, "bf16"), &h200),
        (two_readers(1, 2, 128, 64, "bf16"), &wg),
        (two_readers(1, 1, 256, 64, "bf16"), &tma),
    ];
    let (jobs, skipping) = ptxas::ptx_jobs(&programs, "product unread where");
    assert_eq!(
        skipping,
        programs.len(),
        "each program's product leaves tiles out"
    );
    ptxas::assemble_jobs("unread", &jobs);
}

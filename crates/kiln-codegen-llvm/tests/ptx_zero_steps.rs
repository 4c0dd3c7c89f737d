//! PTX of the products that leave out the steps a causal mask makes zero, where checked at
//! run time (`kiln_kernel::gpu::map`'s `zero_steps.rs`; the programs of the emulator's
//! `gpu_zero_steps.rs`): attention's probabilities and their gradient in f32 on the CUDA cores
//! (past the sum tree's first level too), with bf16 operands on `mma.sync` and on warpgroups
//! (rings of 2 and 3 stages); rendered for sm_80 and sm_90 (sm_90a for warpgroups) and
//! assembled by ptxas.

use kiln_kernel::target::TargetInfo;

#[path = "../../kiln-runtime/tests/causal/mod.rs"]
mod causal;
mod ptxas;
#[path = "../../kiln-runtime/tests/products/wgmma_target.rs"]
mod wgmma_target;

use causal::{probabilities, score_gradient};
use wgmma_target::wgmma_target;

#[test]
fn products_leaving_zero_steps_out_assemble() {
    let h200 = TargetInfo::h200();
    let wg2 = wgmma_target((64, 64), 2);
    let wg3 = wgmma_target((64, 64), 3);
    let programs = [
        (probabilities(1, 2, 128, 64), &h200),
        (probabilities(1, 1, 300, 32), &h200),
        (score_gradient(1, 1, 100, 24, "f32"), &h200),
        (score_gradient(1, 2, 128, 64, "bf16"), &h200),
        (score_gradient(1, 1, 300, 64, "bf16"), &h200),
        (score_gradient(1, 2, 128, 64, "bf16"), &wg2),
        (score_gradient(1, 1, 320, 64, "bf16"), &wg3),
    ];
    let (jobs, skipping) = ptxas::ptx_jobs(&programs, "left out where checked at run time");
    assert!(
        skipping >= programs.len(),
        "each program's products leave steps out"
    );
    ptxas::assemble_jobs("zero-steps", &jobs);
}

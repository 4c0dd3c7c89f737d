//! PTX of the products that leave out the steps a causal mask makes zero, where checked at
//! run time (`kiln_kernel::gpu::map`'s `zero_steps.rs`; the programs of the emulator's
//! `gpu_zero_steps.rs`): attention's probabilities and their gradient in f32 on the CUDA cores
//! (past the sum tree's first level too), with bf16 operands on `mma.sync` and on warpgroups
//! (rings of 2 and 3 stages); rendered for sm_80 and sm_90 (sm_90a for warpgroups) and
//! assembled by ptxas.

use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
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
    let mut skipping = 0;
    let opts = kiln_kernel::Options::default();
    let mut jobs = Vec::new();
    for (i, (src, target)) in programs.iter().enumerate() {
        let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        for (name, p) in mapped_kernels(&f, &opts, target).unwrap() {
            let p = p.unwrap_or_else(|e| panic!("program {i} {name}: not mapped: {e}"));
            skipping +=
                usize::from(format!("{p:?}").contains("left out where checked at run time"));
            let sms = if p.launches.iter().any(|l| l.uses_wgmma()) {
                vec![PtxTarget::sm90a()]
            } else {
                vec![PtxTarget::sm80(), PtxTarget::sm90()]
            };
            for sm in sms {
                let text = program_ptx(&p, &sm)
                    .unwrap_or_else(|e| panic!("program {i} {name} ({}): {e}", sm.sm));
                jobs.push((format!("program {i} {name}"), text, sm.sm.clone()));
            }
        }
    }
    assert!(
        skipping >= programs.len(),
        "each program's products leave steps out"
    );
    ptxas::assemble_jobs("zero-steps", &jobs);
}

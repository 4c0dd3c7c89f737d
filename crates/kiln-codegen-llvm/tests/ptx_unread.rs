//! PTX of the products that leave the tiles no reader uses uncomputed (`kiln_kernel::gpu::map`'s
//! `skip.rs`; the programs of the emulator's `gpu_unread.rs`): a causal mask's scores in f32 on
//! the CUDA cores and a thread per element, with bf16 operands on `mma.sync`, on warpgroups
//! and through TMA; rendered for sm_80 and sm_90 (sm_90a for warpgroups) and assembled by
//! ptxas.

use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
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
    let mut skipping = 0;
    let opts = kiln_kernel::Options::default();
    let mut jobs = Vec::new();
    for (i, (src, target)) in programs.iter().enumerate() {
        let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        for (name, p) in mapped_kernels(&f, &opts, target).unwrap() {
            let p = p.unwrap_or_else(|e| panic!("program {i} {name}: not mapped: {e}"));
            skipping += usize::from(format!("{p:?}").contains("product unread where"));
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
    assert_eq!(
        skipping,
        programs.len(),
        "each program's product leaves tiles out"
    );
    ptxas::assemble_jobs("unread", &jobs);
}

//! mbarriers and TMA tile loads render for sm_90a only and assemble there: the mbarrier
//! rounds kernel, a TMA box for every swizzle, a warpgroup tile on operands loaded by TMA
//! (the tensor maps as 64-aligned 128-byte grid-constant parameters), and the
//! warp-specialized product mapping (`Gpu::wgmma_tma`) of an 8192^3 bf16 product for the
//! pack's tiles. ptxas's register and spill report of the products is printed.

use kiln_codegen_llvm::Error;
use kiln_codegen_llvm::ptx::{PtxTarget, kernel_ptx, mapped_kernels};
use kiln_ir::DType;
use kiln_kernel::gpu::desc::WgSwizzle;
use kiln_kernel::gpu::ir::GpuKernel;
use kiln_kernel::gpu::mbarrier::rounds;
use kiln_kernel::gpu::tma::{tma_tile, tma_warpgroup_tile};
use kiln_kernel::target::{GemmTile, TargetInfo};
use std::path::{Path, PathBuf};

/// Where `cargo xtask test` installs ptxas (or `KILN_PTXAS`); in CI its absence is an error.
fn ptxas() -> Option<PathBuf> {
    let found = std::env::var("KILN_PTXAS")
        .ok()
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var("HOME").ok()?;
            let p = Path::new(&home).join(".cache/kiln/ptxas/nvidia/cuda_nvcc/bin/ptxas");
            p.exists().then_some(p)
        });
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("ptxas not found in CI (cargo xtask test installs it, or set KILN_PTXAS)");
    }
    found
}

/// Assembles `text` for sm_90a with `-v`: ptxas's report, or its error.
fn assemble(name: &str, text: &str) -> Option<Result<String, String>> {
    let ptxas = ptxas()?;
    // A directory per kernel: the tests run side by side.
    let dir = std::env::temp_dir().join(format!("kiln-ptx-tma-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.ptx"));
    std::fs::write(&src, text).unwrap();
    let out = std::process::Command::new(ptxas)
        .args(["-arch=sm_90a", "-v"])
        .arg(&src)
        .arg("-o")
        .arg(dir.join(format!("{name}.cubin")))
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    Some(if out.status.success() {
        Ok(report)
    } else {
        Err(format!("{name}: ptxas rejected it:\n{report}"))
    })
}

/// Renders `k` for sm_90a (checking sm_90 and sm_80 refuse it), checks each needle is in
/// its text, and assembles it: ptxas's report.
fn render(k: &GpuKernel, needles: &[&str]) -> Option<String> {
    for target in [PtxTarget::sm90(), PtxTarget::sm80()] {
        match kernel_ptx(k, &target) {
            Err(Error::Unsupported(why)) => assert!(why.contains("sm_90a"), "{why}"),
            other => panic!("{} for {}: {other:?}", k.name, target.sm),
        }
    }
    let text = kernel_ptx(k, &PtxTarget::sm90a()).unwrap();
    for needle in needles {
        assert!(text.contains(needle), "{}: no {needle} in\n{text}", k.name);
    }
    match assemble(&k.entry_name(), &text) {
        Some(Ok(report)) => Some(report),
        Some(Err(e)) => panic!("{e}\n{text}"),
        None => {
            println!("ptxas not found (cargo xtask test installs it): PTX text only");
            None
        }
    }
}

#[test]
fn mbarrier_rounds_assemble_for_sm_90a() {
    let k = rounds(128, 3, TargetInfo::h200().sums);
    render(
        &k,
        &[
            "mbarrier.init.shared",
            "mbarrier.arrive.shared",
            "mbarrier.try_wait.parity.shared::cta.b64",
            "mbarrier.inval.shared",
        ],
    );
}

#[test]
fn tma_boxes_assemble_for_sm_90a() {
    for swizzle in WgSwizzle::ALL {
        let cols = match swizzle {
            WgSwizzle::None => 16,
            s => s.row_bytes() / 2,
        };
        let k = tma_tile(
            DType::BF16,
            (40, 72),
            [cols, 32],
            [-3, 17],
            swizzle,
            TargetInfo::h200().sums,
        )
        .unwrap();
        render(
            &k,
            &[
                ".param .align 64 .b8",
                // The map read where the launch put it (grid-constant), not from a copy.
                "cvta.param.u64",
                "mbarrier.arrive.expect_tx.shared::cta.b64",
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                "mbarrier.try_wait.parity",
            ],
        );
    }
}

#[test]
fn a_warpgroup_product_on_tma_loads_assembles_for_sm_90a() {
    for (swizzle, n) in [
        (WgSwizzle::B128, 256),
        (WgSwizzle::B64, 64),
        (WgSwizzle::B32, 128),
    ] {
        let k = tma_warpgroup_tile(DType::BF16, (n, 64), swizzle, TargetInfo::h200().sums).unwrap();
        let Some(report) = render(
            &k,
            &[
                "cp.async.bulk.tensor.2d",
                &format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16"),
            ],
        ) else {
            continue;
        };
        let spills: Vec<&str> = report.lines().filter(|l| l.contains("spill")).collect();
        println!("{}: {spills:?}", k.name);
    }
}

/// The 8192^3 bf16 product (B by rows, as `x @ w`) mapped with the warp-specialized TMA
/// ring for the tiles the pack sweeps, rendered and assembled for sm_90a; ptxas's spill
/// report printed (`cargo test -p kiln-codegen-llvm --test ptx_tma -- --nocapture`).
#[test]
fn warp_specialized_products_assemble_for_sm_90a() {
    let src = "func @main(%0: bf16[8192,8192], %1: bf16[8192,8192]) -> f32[8192,8192] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[8192,8192]\n  return %2\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    for (m, n, ring) in [(64, 64, 4), (128, 128, 4), (128, 256, 3), (64, 256, 4)] {
        let mut target = TargetInfo::h200();
        let gpu = target.gpu.as_mut().unwrap();
        gpu.wgmma_tiles = vec![GemmTile {
            m,
            n,
            k: 64,
            thread_m: 64,
            thread_n: n,
        }];
        gpu.mma_stages = ring;
        gpu.tile_dynamic_bytes = gpu.dynamic_shared_bytes;
        gpu.wgmma_tma = true;
        let opts = kiln_kernel::Options::default();
        let (_, p) = mapped_kernels(&f, &opts, &target).unwrap().remove(0);
        let mut k = p.unwrap().launches.remove(0);
        assert!(k.uses_tma() && k.uses_wgmma(), "{m}x{n}: not the TMA ring");
        k.name = format!("tma_ring_{m}x{n}_{ring}");
        let Some(report) = render(
            &k,
            &[
                "cp.async.bulk.tensor.2d",
                "mbarrier.try_wait.parity",
                &format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16"),
            ],
        ) else {
            continue;
        };
        let lines: Vec<&str> = report
            .lines()
            .filter(|l| l.contains("spill") || l.contains("registers"))
            .collect();
        println!("{} ({} threads): {lines:?}", k.name, k.block);
    }
}

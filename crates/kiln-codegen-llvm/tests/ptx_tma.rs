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
use kiln_kernel::target::TargetInfo;

mod ptxas;
#[path = "../../kiln-runtime/tests/products/wgmma_target.rs"]
mod wgmma_target;

use ptxas::ptxas;
use wgmma_target::wgmma_target;

/// Assembles `text` for sm_90a with `-v`: ptxas's report, or its error.
fn assemble(name: &str, text: &str) -> Option<Result<String, String>> {
    let ptxas = ptxas()?;
    // A directory per kernel: the tests run side by side.
    let dir = std::env::temp_dir().join(format!("kiln-ptx-tma-{}-{name}", std::process::id()));
    let (ok, report) = ptxas::assemble(&ptxas, &dir, name, "sm_90a", &["-v"], text);
    let _ = std::fs::remove_dir_all(&dir);
    Some(if ok {
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

/// The 8192^3 bf16 product (B by rows, as `x @ w`) on warpgroup tiles of `m x n` in rings of
/// `ring` stages, loaded by TMA (by a producer warp, or with `inline` by the consumers' first
/// thread) or by `cp.async`, with the sum tree's
/// chunks `leaf` long (`None`: the H200's), rendered and assembled for sm_90a: the launch's
/// threads and ptxas's register and spill report.
fn product_report(
    (m, n, ring): (usize, usize, usize),
    (tma, inline): (bool, bool),
    leaf: Option<usize>,
) -> Option<(usize, String)> {
    let src = "func @main(%0: bf16[8192,8192], %1: bf16[8192,8192]) -> f32[8192,8192] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[8192,8192]\n  return %2\n}\n";
    let f = kiln_ir::parse_func_text(src).unwrap();
    let mut target = wgmma_target((m, n), ring);
    if let Some(leaf) = leaf {
        target.sums.leaf = leaf;
    }
    let gpu = target.gpu.as_mut().unwrap();
    gpu.wgmma_tma = tma;
    gpu.wgmma_tma_inline = inline;
    let opts = kiln_kernel::Options::default();
    let (_, p) = mapped_kernels(&f, &opts, &target).unwrap().remove(0);
    let mut k = p.unwrap().launches.remove(0);
    assert_eq!(k.uses_tma(), tma, "{m}x{n}");
    assert!(k.uses_wgmma(), "{m}x{n}: not on warpgroups");
    k.name = format!(
        "{}_{m}x{n}_{ring}{}",
        match (tma, inline) {
            (false, _) => "cp_async_ring",
            (true, false) => "tma_ring",
            (true, true) => "tma_inline_ring",
        },
        leaf.map_or(String::new(), |l| format!("_leaf_{l}"))
    );
    let mut needles = vec![format!(
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16"
    )];
    if tma {
        needles.push("cp.async.bulk.tensor.2d".into());
        needles.push("mbarrier.try_wait.parity".into());
    }
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    let report = render(&k, &needles)?;
    let lines: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("spill") || l.contains("registers"))
        .collect();
    println!("{} ({} threads): {lines:?}", k.name, k.block);
    Some((k.block, report))
}

/// Bytes ptxas reports spilled (stores) in `report`.
fn spilled(report: &str) -> usize {
    report
        .lines()
        .find_map(|l| {
            let (before, _) = l.split_once(" bytes spill stores")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .unwrap_or(0)
}

/// The warp-specialized TMA ring for the tiles the pack sweeps renders and assembles for
/// sm_90a (`cargo test -p kiln-codegen-llvm --test ptx_tma -- --nocapture` prints ptxas's
/// report); a 64-row tile does not spill.
#[test]
fn warp_specialized_products_assemble_for_sm_90a() {
    for tile in [(64, 64, 4), (128, 128, 4), (128, 256, 3), (64, 256, 4)] {
        let Some((threads, report)) = product_report(tile, (true, false), None) else {
            continue;
        };
        assert_eq!(threads, tile.0 / 64 * 128 + 32, "{tile:?}");
        if tile == (64, 64, 4) {
            assert_eq!(spilled(&report), 0, "{tile:?}: {report}");
        }
    }
}

/// The accumulators of a 128 x 256 block tile: each of its two warpgroups holds 128 f32 per
/// level of the sum tree and thread, so the H200's tree (three levels over 8192 terms) asks
/// for 384 registers a thread, past the 255 an instruction can name: it spills whatever the
/// arrangement (three sets of 128 x 256 f32 are 384 KiB, more than the SM's 256 KiB register
/// file). The tiles that hold three sets, 128 x 128 (192 a thread), and 128 x 256 with one
/// level (chunks of 8192, the sweep's `sum_leaf_8192` variant) do not spill.
#[test]
fn which_warpgroup_tiles_spill() {
    let Some((_, wide)) = product_report((128, 256, 3), (false, false), None) else {
        return;
    };
    assert!(spilled(&wide) > 0, "{wide}");
    for (tile, leaf) in [((128, 128, 4), None), ((128, 256, 3), Some(8192))] {
        let (_, report) = product_report(tile, (false, false), leaf).unwrap();
        assert_eq!(spilled(&report), 0, "{tile:?} leaf {leaf:?}: {report}");
    }
}

/// The TMA ring with the consumers' first thread as the producer: a block of the consumers
/// alone, so a 128 x 128 tile holds its three sets of accumulators without spilling, as the
/// `cp.async` ring does.
#[test]
fn tma_rings_without_a_producer_warp_assemble_for_sm_90a() {
    for tile in [(64, 64, 4), (128, 128, 4), (128, 256, 3)] {
        let Some((threads, report)) = product_report(tile, (true, true), None) else {
            continue;
        };
        assert_eq!(threads, tile.0 / 64 * 128, "{tile:?}");
        if tile != (128, 256, 3) {
            assert_eq!(spilled(&report), 0, "{tile:?}: {report}");
        }
    }
}

//! Products on sm_90a's warpgroups (`wgmma`, `kiln_kernel::gpu::map`'s warpgroup mapping) on
//! the GPU emulator: exact on small integers for every warpgroup tile the tests take (64 x 64,
//! 128 x 64, 128 x 128 and 64 x 256, rings of 2 to 4 stages of 64), rows, columns and
//! contractions not multiples of the tiles, batches, operands transposed or not (staged with
//! `cp.async` or through registers); against the reference interpreter with random operands,
//! contractions past one and sixteen chunks of the sum tree, bias-and-tanh epilogues and
//! results of the operands' dtype; and the `mma.sync` mapping kept where the GPU has no
//! warpgroup products or no tile for them.

use kiln_ir::DType;
use kiln_kernel::gpu::ir::*;
use kiln_kernel::target::TargetInfo;

mod products;
use products::{
    against_reference, count, exact_program, in_launches, mapped, product_text, wgmma_target,
};

/// `wgmma`s in the launches of `p`.
fn wgmmas(p: &GpuProgram) -> usize {
    in_launches(p, &|s| matches!(s, Stmt::Wgmma { .. }))
}

/// The product `(batch, m, k, n)` of small integers (A with its contraction first when
/// `at`, B with its contraction last when `bt`) in `dtype` on `target`, against the exact
/// product; whether it ran on warpgroups.
fn exact_product(
    target: &TargetInfo,
    (batch, m, k, n): (usize, usize, usize, usize),
    (at, bt): (bool, bool),
    dtype: DType,
) -> Result<bool, String> {
    let p = exact_program(target, (batch, m, k, n), (at, bt), dtype)?;
    // Operands stored with their rows contiguous (A transposed, B by rows) are staged
    // MN-major (whole 64-column panels of B) and copied with `cp.async`.
    let l = &p.launches[0];
    let mn = |a: bool| {
        count(&l.body, &|s| match s {
            Stmt::Wgmma { a: da, b: db, .. } => if a { da } else { db }.mn_major,
            _ => false,
        }) > 0
    };
    if wgmmas(&p) > 0 {
        let tile_n = target.gpu.as_ref().unwrap().wgmma_tiles[0].n;
        let want = (at, !bt && tile_n.is_multiple_of(64));
        if (mn(true), mn(false)) != want {
            return Err(format!(
                "MN-major A and B {:?}, not {want:?}",
                (mn(true), mn(false))
            ));
        }
    }
    Ok(wgmmas(&p) > 0)
}

#[test]
fn products_on_warpgroups_are_exact_on_integers() {
    let cases = [
        ((1, 64, 64, 128), (false, true)),
        ((2, 70, 100, 129), (false, true)),
        ((1, 130, 17, 136), (false, false)),
        ((1, 66, 200, 130), (true, true)),
        ((3, 66, 1, 129), (true, false)),
        ((1, 70, 300, 136), (false, true)),
    ];
    let mut failures = Vec::new();
    let runs = [
        ((64, 64), 3, DType::BF16),
        ((128, 64), 2, DType::F16),
        ((128, 128), 4, DType::BF16),
        ((64, 256), 2, DType::BF16),
    ];
    for (tile, stages, dtype) in runs {
        let target = wgmma_target(tile, stages);
        for (c, &(shape, trans)) in cases.iter().enumerate() {
            let what = format!("{dtype} case {c} {shape:?} {trans:?} on {tile:?} x {stages}");
            match exact_product(&target, shape, trans, dtype) {
                Ok(true) => {}
                Ok(false) => failures.push(format!("{what}: not on warpgroups")),
                Err(e) => failures.push(format!("{what}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Random operands against the reference (`kiln_reference::accuracy`'s bound): bf16 and f16,
/// an f32 result or one of the operands' dtype, bias-and-tanh epilogues in the launch,
/// contractions past one chunk of the sum tree (300) and past sixteen (4100, two levels).
#[test]
fn products_on_warpgroups_agree_with_the_reference() {
    let cases = [
        ((1, 70, 33, 65), ("bf16", "f32"), false, true, true),
        ((2, 40, 300, 40), ("bf16", "f32"), true, false, true),
        ((1, 72, 48, 40), ("f16", "f32"), false, true, false),
        ((2, 40, 64, 72), ("bf16", "bf16"), false, false, true),
        ((1, 40, 4100, 40), ("bf16", "f32"), false, true, false),
        ((1, 40, 48, 72), ("f16", "f16"), false, true, false),
    ];
    let target = wgmma_target((64, 64), 3);
    let mut failures = Vec::new();
    for (i, &(shape, dts, at, bt, ep)) in cases.iter().enumerate() {
        let src = product_text(shape, dts, at, bt, ep);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("case {i}: {e}\n{src}"));
        if !mapped(&f, &target, None).iter().any(|p| wgmmas(p) > 0) {
            failures.push(format!("case {i}: not on warpgroups\n{src}"));
            continue;
        }
        match against_reference(&f, &target, 300 + i as u64) {
            Ok(rep) => {
                if rep.launches.get(&MapKind::GemmMma) != Some(&1) || rep.launches.len() != 1 {
                    failures.push(format!(
                        "case {i}: one launch expected: {:?}\n{src}",
                        rep.launches
                    ));
                }
            }
            Err(e) => failures.push(format!("case {i}: {e}\n{src}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Without warpgroup products (`Gpu::wgmma` cleared, as for sm_80 and the sm_90 PTX the
/// runtime renders) or without a warpgroup tile (the H200's default), 16-bit products stay on
/// `mma.sync`, exact as before.
#[test]
fn products_stay_on_mma_sync_without_warpgroups() {
    let mut off = wgmma_target((64, 64), 3);
    off.gpu.as_mut().unwrap().wgmma = false;
    for target in [off, TargetInfo::h200()] {
        assert_eq!(
            exact_product(&target, (1, 70, 100, 65), (false, true), DType::BF16),
            Ok(false)
        );
    }
}

//! Warp-specialized products on sm_90a (`Gpu::wgmma_tma`: a producer warp loading A and B by
//! TMA into a ring guarded by full and empty mbarriers, consumer warpgroups running `wgmma`)
//! on the GPU emulator: exact on small integers for the warpgroup tiles the tests take,
//! B stored by columns (K-major boxes) and by rows (MN-major panels), rows and contractions
//! not multiples of the tiles (zero-filled by TMA); against the reference with random
//! operands, a contraction past sixteen chunks of the sum tree and an epilogue; the
//! `cp.async` ring kept where the operands do not suit TMA; and planted protocol bugs the
//! emulator refuses.

use kiln_ir::DType;
use kiln_kernel::gpu::ir::*;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{Buffer, V, run_kernel};

mod products;
use products::{
    against_reference, edit, exact_program, in_launches, mapped, product_text, wgmma_target,
};

/// [`tma_target`] with the loads issued by the consumers' first thread.
fn inline_target(tile: (usize, usize), stages: usize) -> TargetInfo {
    let mut t = tma_target(tile, stages);
    t.gpu.as_mut().unwrap().wgmma_tma_inline = true;
    t
}

/// An H200 whose 16-bit products run on warpgroups of the tile `m x n`, up to `stages`
/// stages, loaded by TMA where they can be.
fn tma_target(tile: (usize, usize), stages: usize) -> TargetInfo {
    let mut t = wgmma_target(tile, stages);
    t.gpu.as_mut().expect("a GPU").wgmma_tma = true;
    t
}

/// TMA loads in the launches of `p`.
fn tma_loads(p: &GpuProgram) -> usize {
    in_launches(p, &|s| matches!(s, Stmt::TmaLoad { .. }))
}

/// The product `(batch, m, k, n)` of small integers (B with its contraction last when `bt`)
/// in `dtype` on `target`, against the exact product; whether it loaded by TMA.
fn exact(
    target: &TargetInfo,
    shape: (usize, usize, usize, usize),
    (at, bt): (bool, bool),
    dtype: DType,
) -> Result<bool, String> {
    let p = exact_program(target, shape, (at, bt), dtype)?;
    Ok(tma_loads(&p) > 0)
}

#[test]
fn warp_specialized_products_are_exact_on_integers() {
    // Contractions and rows 16-byte aligned (multiples of 8), rows and contractions past
    // the tiles' edges.
    let cases = [
        ((1, 64, 64, 128), (false, true)),
        ((1, 70, 200, 136), (false, false)),
        ((1, 130, 72, 128), (false, true)),
        ((1, 66, 136, 192), (false, false)),
        ((1, 72, 8, 136), (false, true)),
    ];
    let runs = [
        ((64, 64), 3, DType::BF16),
        ((128, 64), 2, DType::F16),
        ((128, 128), 4, DType::BF16),
        ((64, 256), 2, DType::BF16),
    ];
    let mut failures = Vec::new();
    let targets = runs
        .iter()
        .map(|&(tile, stages, dtype)| (tma_target(tile, stages), tile, stages, dtype))
        .chain(
            // The consumers' first thread as the producer, filling 1 and 3 steps ahead.
            [((64, 64), 2), ((128, 128), 4)]
                .map(|(tile, stages)| (inline_target(tile, stages), tile, stages, DType::BF16)),
        );
    for (target, tile, stages, dtype) in targets {
        for (i, &(shape, trans)) in cases.iter().enumerate() {
            let inline = target.gpu.as_ref().unwrap().wgmma_tma_inline;
            let what = format!(
                "{dtype} case {i} {shape:?} {trans:?} on {tile:?} x {stages}{}",
                if inline { " inline" } else { "" }
            );
            match exact(&target, shape, trans, dtype) {
                Ok(true) => {}
                Ok(false) => failures.push(format!("{what}: not loaded by TMA")),
                Err(e) => failures.push(format!("{what}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn warp_specialized_products_agree_with_the_reference() {
    let cases = [
        ((1, 72, 48, 40), ("bf16", "f32"), false, true, true),
        ((1, 40, 4104, 40), ("bf16", "f32"), false, true, false),
        ((1, 64, 96, 64), ("f16", "f16"), false, false, true),
    ];
    let target = tma_target((64, 64), 3);
    let mut failures = Vec::new();
    for (i, &(shape, dts, at, bt, ep)) in cases.iter().enumerate() {
        let src = product_text(shape, dts, at, bt, ep);
        let f = kiln_ir::parse_func_text(&src).unwrap_or_else(|e| panic!("case {i}: {e}\n{src}"));
        if !mapped(&f, &target, None).iter().any(|p| tma_loads(p) > 0) {
            failures.push(format!("case {i}: not loaded by TMA\n{src}"));
            continue;
        }
        if let Err(e) = against_reference(&f, &target, 700 + i as u64) {
            failures.push(format!("case {i}: {e}\n{src}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Operands TMA cannot load as they are (A transposed, a contraction whose rows are not
/// 16-byte aligned, batches) keep the `cp.async` ring, exact; without `Gpu::wgmma_tma`
/// nothing is loaded by TMA.
#[test]
fn unsuited_operands_keep_the_cp_async_ring() {
    let target = tma_target((64, 64), 3);
    for (shape, trans) in [
        ((1, 64, 64, 64), (true, true)),
        ((1, 64, 60, 64), (false, true)),
        ((2, 64, 64, 64), (false, true)),
    ] {
        assert_eq!(
            exact(&target, shape, trans, DType::BF16),
            Ok(false),
            "{shape:?} {trans:?}"
        );
    }
    let mut off = target.clone();
    off.gpu.as_mut().unwrap().wgmma_tma = false;
    assert_eq!(
        exact(&off, (1, 64, 64, 128), (false, true), DType::BF16),
        Ok(false)
    );
}

/// The launch of a 64 x 192 x 64 product (B by columns) on 64 x 64 tiles: 3 steps in a ring
/// of 2 stages, so the producer waits for a released slot once.
fn launch() -> GpuKernel {
    let target = tma_target((64, 64), 2);
    let src = product_text((1, 64, 192, 64), ("f32", "f32"), false, true, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let mut p = mapped(&f, &target, Some(DType::BF16)).remove(0);
    p.launches.remove(0)
}

/// Runs `k` (a bf16 product of 64 x 192 by 192 x 64, B by columns) on integers: the first
/// wrong element or the emulator's error.
fn run(k: &GpuKernel) -> Result<(), String> {
    let (m, kk, n) = (64, 192, 64);
    let av = |i: usize, s: usize| ((i + 3 * s) % 7) as f64 - 3.0;
    let bv = |s: usize, j: usize| ((2 * s + j) % 5) as f64 - 2.0;
    let a = Buffer {
        name: "%a".into(),
        dtype: DType::BF16,
        data: (0..m * kk).map(|x| V::F(av(x / kk, x % kk))).collect(),
    };
    let b = Buffer {
        name: "%b".into(),
        dtype: DType::BF16,
        data: (0..n * kk).map(|x| V::F(bv(x % kk, x / kk))).collect(),
    };
    let mut out = vec![Buffer::zeros("%out", &k.outputs[0].1)];
    run_kernel(k, &[&a, &b], &mut out).map_err(|e| e.to_string())?;
    for i in 0..m {
        for j in 0..n {
            let want: f64 = (0..kk).map(|s| av(i, s) * bv(s, j)).sum();
            if out[0].data[i * n + j] != V::F(want) {
                return Err(format!(
                    "({i}, {j}) is {:?}, not {want}",
                    out[0].data[i * n + j]
                ));
            }
        }
    }
    Ok(())
}

/// `k` with the producer's waits for a released slot (the waits on the flipped parity)
/// dropped.
fn without_empty_waits(k: &GpuKernel) -> GpuKernel {
    let mut k = k.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::If { body, .. } = s {
            body.retain(
                |s| !matches!(s, Stmt::MbarWait { parity, .. } if matches!(parity, Sc::Rem(..))),
            );
        }
    });
    k
}

#[test]
fn planted_ring_bugs_are_caught() {
    let good = launch();
    assert!(good.uses_tma() && good.uses_wgmma(), "{}", good.name);
    assert_eq!(
        good.block,
        128 + 32,
        "one consumer warpgroup and the producer's warp"
    );
    run(&good).unwrap();
    let fails = |what: &str, k: &GpuKernel, want: &str| {
        let e = run(k).expect_err(what);
        assert!(e.contains(want), "{what}: wanted {want:?}, got {e}");
    };
    // The consumers wait on the wrong parity: round 0's phase has not come.
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::MbarWait { bar, parity } = s
            && matches!(bar.index, Sc::Reg(_))
        {
            *parity = Sc::plus(parity.clone(), Sc::Const(1));
        }
    });
    fails("consumer parity", &k, "cannot complete");
    // The consumers do not wait: the wgmma reads boxes in flight.
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::If { body, .. } = s {
            body.retain(
                |s| !matches!(s, Stmt::MbarWait { bar, .. } if matches!(bar.index, Sc::Reg(_))),
            );
        }
    });
    fails("no full wait", &k, "in flight");
    // The producer expects half the bytes.
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::MbarArrive { tx, .. } = s
            && *tx > 0
        {
            *tx /= 2;
        }
    });
    // The A box alone completes the phase: B's lands in the next one, which the consumers
    // have not waited for (or, where A's bytes do not match, the phase never completes).
    fails("half the bytes", &k, "phase");
    // The consumers never release their slot: the producer's second round waits forever.
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::If { body, .. } = s {
            body.retain(|s| !matches!(s, Stmt::MbarArrive { tx: 0, .. }));
        }
    });
    fails("no release", &k, "cannot complete");
    // The producer refills a slot without waiting for its release.
    let k = without_empty_waits(&good);
    fails(
        "no empty wait",
        &k,
        "a slot refilled before its readers released it",
    );
    // The same with the consumers' first thread as the producer.
    let target = inline_target((64, 64), 2);
    let src = product_text((1, 64, 192, 64), ("f32", "f32"), false, true, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let good = mapped(&f, &target, Some(DType::BF16))
        .remove(0)
        .launches
        .remove(0);
    assert_eq!(good.block, 128, "the consumers alone");
    run(&good).unwrap();
    let k = without_empty_waits(&good);
    fails(
        "inline: no empty wait",
        &k,
        "a slot refilled before its readers released it",
    );
    // B's boxes a contraction step off: the product is wrong.
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::TmaLoad { map: 1, coords, .. } = s {
            coords[0] = Sc::plus(coords[0].clone(), Sc::Const(8));
        }
    });
    assert!(run(&k).is_err(), "B shifted");
}

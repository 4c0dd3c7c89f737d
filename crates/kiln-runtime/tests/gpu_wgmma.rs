//! Warpgroup products (sm_90a `wgmma`) on the GPU emulator: one warpgroup's tile
//! (`kiln_kernel::gpu::wgmma::warpgroup_tile`) against the plain product for every width the
//! tests take (8, 64, 128, 256 columns), each swizzle mode, B K-major and MN-major, bf16 and
//! f16, one and four contraction steps; planted bugs (a wrong leading or stride byte offset, a descriptor
//! started at the wrong step, a wrong accumulator fragment) that the comparison catches; and
//! the rules the emulator enforces (fences, waits, whole warpgroups, the target's flag).

use kiln_ir::DType;
use kiln_kernel::gpu::desc::WgSwizzle;
use kiln_kernel::gpu::ir::*;
use kiln_kernel::gpu::wgmma::warpgroup_tile;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{Buffer, V, run_kernel};

/// A's, B's and C's elements: small integers (and halves for C), so that every product and
/// sum is exact and D must be `A x B + C` exactly.
fn a_at(r: usize, k: usize) -> f64 {
    ((r * 3 + k * 5 + r * k) % 11) as f64 - 5.0
}

fn b_at(k: usize, n: usize) -> f64 {
    ((k * 7 + n * 2 + (k * n) / 3) % 9) as f64 - 4.0
}

fn c_at(r: usize, n: usize) -> f64 {
    ((r * 5 + n) % 13) as f64 * 0.5
}

/// The inputs of a tile of `n` columns and contraction `k`: A (64 x k, row-major), B by
/// columns (n x k; by rows, k x n, with `b_mn`) and C (64 x n).
fn inputs(dtype: DType, n: usize, k: usize, b_mn: bool) -> [Buffer; 3] {
    let buf = |name: &str, dtype, data: Vec<f64>| Buffer {
        name: name.into(),
        dtype,
        data: data.into_iter().map(V::F).collect(),
    };
    [
        buf(
            "%a",
            dtype,
            (0..64 * k).map(|i| a_at(i / k, i % k)).collect(),
        ),
        buf(
            "%b",
            dtype,
            (0..n * k)
                .map(|i| {
                    if b_mn {
                        b_at(i / n, i % n)
                    } else {
                        b_at(i % k, i / k)
                    }
                })
                .collect(),
        ),
        buf(
            "%c",
            DType::F32,
            (0..64 * n).map(|i| c_at(i / n, i % n)).collect(),
        ),
    ]
}

/// Runs `kernel` (a tile of `n` columns and contraction `k`) and compares D with the plain
/// product: the first wrong element, or the emulator's error.
fn check(kernel: &GpuKernel, dtype: DType, n: usize, k: usize) -> Result<(), String> {
    let b_mn = kernel.name.ends_with("_b_mn");
    let ins = inputs(dtype, n, k, b_mn);
    let mut out = vec![Buffer::zeros("%d", &kernel.outputs[0].1)];
    run_kernel(kernel, &[&ins[0], &ins[1], &ins[2]], &mut out).map_err(|e| e.to_string())?;
    for r in 0..64 {
        for c in 0..n {
            let want = c_at(r, c) + (0..k).map(|s| a_at(r, s) * b_at(s, c)).sum::<f64>();
            let got = out[0].data[r * n + c];
            if got != V::F(want) {
                return Err(format!("D[{r}][{c}] is {got:?}, not {want}"));
            }
        }
    }
    Ok(())
}

/// The tile (B K-major), verified for an H200.
fn tile(dtype: DType, n: usize, k: usize, swizzle: WgSwizzle) -> GpuKernel {
    tile_of(dtype, n, k, swizzle, false).expect("the tile fits")
}

/// The tile, B MN-major with `b_mn`, verified for an H200; `None` where it does not fit.
fn tile_of(dtype: DType, n: usize, k: usize, swizzle: WgSwizzle, b_mn: bool) -> Option<GpuKernel> {
    let target = TargetInfo::h200();
    let kernel = warpgroup_tile(dtype, (n, k), swizzle, b_mn, target.sums)?;
    kiln_kernel::gpu::print::verify(&kernel, target.gpu.as_ref().unwrap())
        .unwrap_or_else(|e| panic!("{e}"));
    Some(kernel)
}

/// The contractions a swizzle mode's tile takes: whole atom rows (8, 16, 32 or 64 steps),
/// at least one `wgmma` step of 16.
fn contractions(swizzle: WgSwizzle) -> Vec<usize> {
    match swizzle {
        WgSwizzle::None | WgSwizzle::B32 => vec![16, 64],
        WgSwizzle::B64 => vec![32, 64],
        WgSwizzle::B128 => vec![64],
    }
}

#[test]
fn a_warpgroup_tile_computes_the_product_for_every_width_and_swizzle() {
    let mut failures = Vec::new();
    for swizzle in WgSwizzle::ALL {
        for k in contractions(swizzle) {
            for n in [8, 64, 128, 256] {
                for dtype in [DType::BF16, DType::F16] {
                    // f16 on the smaller widths only: the layouts are the same.
                    if dtype == DType::F16 && n > 64 {
                        continue;
                    }
                    // B by columns (K-major), and by rows (MN-major) where `n` is whole
                    // panels of the swizzle's rows.
                    let mut ran = 0;
                    for b_mn in [false, true] {
                        let Some(kernel) = tile_of(dtype, n, k, swizzle, b_mn) else {
                            continue;
                        };
                        ran += 1;
                        if let Err(e) = check(&kernel, dtype, n, k) {
                            failures.push(format!("{}: {e}", kernel.name));
                        }
                    }
                    if ran == 0 || (n >= 64 && ran != 2) {
                        failures.push(format!("{swizzle:?} n {n} k {k}: {ran} layouts ran"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each `wgmma` of the tile, to change in place.
fn wgmmas(k: &mut GpuKernel) -> impl Iterator<Item = (&mut MatrixDesc, &mut MatrixDesc)> {
    k.body.iter_mut().filter_map(|s| match s {
        Stmt::Wgmma { a, b, .. } => Some((a, b)),
        _ => None,
    })
}

/// A planted bug in a descriptor or a fragment index gives a wrong product (or an emulator
/// error): the comparison catches each.
#[test]
fn planted_layout_bugs_are_caught() {
    let (n, dtype) = (64, DType::BF16);
    let mut planted: Vec<(String, GpuKernel, usize)> = Vec::new();
    for swizzle in WgSwizzle::ALL {
        let k = *contractions(swizzle).last().unwrap();
        let good = tile(dtype, n, k, swizzle);
        check(&good, dtype, n, k).unwrap();
        // A's stride byte offset one row group short (16 bytes less) or doubled.
        let mut bad = good.clone();
        for (a, _) in wgmmas(&mut bad) {
            a.sbo -= 16;
        }
        planted.push((format!("{swizzle:?}: A's SBO - 16"), bad, k));
        let mut bad = good.clone();
        for (_, b) in wgmmas(&mut bad) {
            b.sbo *= 2;
        }
        planted.push((format!("{swizzle:?}: B's SBO x 2"), bad, k));
        // The descriptors of every step at the first step's start.
        let mut bad = good.clone();
        for (a, b) in wgmmas(&mut bad) {
            a.start = Sc::Const(0);
            b.start = Sc::Const(0);
        }
        planted.push((format!("{swizzle:?}: every step at step 0"), bad, k));
        // The wrong swizzle mode in the descriptors.
        let other =
            WgSwizzle::ALL[(WgSwizzle::ALL.iter().position(|&s| s == swizzle).unwrap() + 1) % 4];
        let mut bad = good.clone();
        for (a, b) in wgmmas(&mut bad) {
            a.swizzle = other;
            b.swizzle = other;
        }
        planted.push((format!("{swizzle:?}: described as {other:?}"), bad, k));
    }
    // Without swizzle, the leading byte offset (between core matrices along the contraction)
    // matters: doubled, A reads the wrong core matrices.
    let good = tile(dtype, n, 64, WgSwizzle::None);
    let mut bad = good.clone();
    for (a, _) in wgmmas(&mut bad) {
        a.lbo *= 2;
    }
    planted.push(("None: A's LBO x 2".into(), bad, 64));
    // B MN-major under a 128-byte swizzle: its leading byte offset (between panels of 64
    // columns) halved reads the wrong panel for columns 64 and up; its descriptors K-major
    // read rows as columns.
    let mn = tile_of(dtype, 128, 64, WgSwizzle::B128, true).unwrap();
    check(&mn, dtype, 128, 64).unwrap();
    let mut bad = mn.clone();
    for (_, b) in wgmmas(&mut bad) {
        b.lbo /= 2;
    }
    planted.push(("B MN-major: LBO / 2".into(), bad, 64));
    let mut bad = mn.clone();
    for (_, b) in wgmmas(&mut bad) {
        b.mn_major = false;
    }
    planted.push(("B MN-major described K-major".into(), bad, 64));
    // A wrong fragment index: D's stores swap accumulators 1 and 2 (a column and a row
    // apart).
    let mut bad = good.clone();
    let stores: Vec<usize> = bad
        .body
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Stmt::Store { .. }))
        .map(|(i, _)| i)
        .collect();
    if let (Stmt::Store { value: v1, .. }, Stmt::Store { value: v2, .. }) =
        (bad.body[stores[1]].clone(), bad.body[stores[2]].clone())
    {
        if let Stmt::Store { value, .. } = &mut bad.body[stores[1]] {
            *value = v2;
        }
        if let Stmt::Store { value, .. } = &mut bad.body[stores[2]] {
            *value = v1;
        }
    }
    planted.push(("D's accumulators 1 and 2 swapped".into(), bad, 64));
    let missed: Vec<&String> = planted
        .iter()
        .filter(|(_, k, kk)| check(k, dtype, k.outputs[0].1.shape[1], *kk).is_ok())
        .map(|(what, ..)| what)
        .collect();
    assert!(missed.is_empty(), "planted bugs not caught: {missed:?}");
}

/// Runs `k` (a bf16 tile of 64 columns, contraction 64) and returns its error.
fn error_of(k: &GpuKernel) -> String {
    let ins = inputs(DType::BF16, 64, 64, false);
    let mut out = vec![Buffer::zeros("%d", &k.outputs[0].1)];
    run_kernel(k, &[&ins[0], &ins[1], &ins[2]], &mut out)
        .expect_err("the kernel breaks a rule")
        .to_string()
}

/// The position of the first statement of `k` that `f` picks.
fn find(k: &GpuKernel, f: impl Fn(&Stmt) -> bool) -> usize {
    k.body.iter().position(f).expect("the tile has it")
}

#[test]
fn misused_warpgroup_statements_are_errors() {
    let good = tile(DType::BF16, 64, 64, WgSwizzle::B128);
    // No wgmma.fence after the accumulators were loaded.
    let mut k = good.clone();
    k.body.retain(|s| !matches!(s, Stmt::WgmmaFence));
    let e = error_of(&k);
    assert!(e.contains("since its last wgmma.fence"), "{e}");
    // D stored before the wait retired the group.
    let mut k = good.clone();
    k.body.retain(|s| !matches!(s, Stmt::WgmmaWait { .. }));
    let e = error_of(&k);
    assert!(e.contains("still in flight"), "{e}");
    // Waiting for all but one group leaves it in flight: the stores read its accumulators.
    let mut k = good.clone();
    let at = find(&k, |s| matches!(s, Stmt::WgmmaWait { .. }));
    k.body[at] = Stmt::WgmmaWait { pending: 1 };
    let e = error_of(&k);
    assert!(
        e.contains("an accumulator of a wgmma still in flight"),
        "{e}"
    );
    // Never committed: the wait does not retire it.
    let mut k = good.clone();
    k.body.retain(|s| !matches!(s, Stmt::WgmmaCommit));
    let e = error_of(&k);
    assert!(e.contains("still in flight"), "{e}");
    // No fence.proxy.async after the copies landed.
    let mut k = good.clone();
    k.body.retain(|s| !matches!(s, Stmt::ProxyFence));
    let e = error_of(&k);
    assert!(e.contains("without a fence.proxy.async"), "{e}");
    // No barrier between the copies of other threads and the product.
    let mut k = good.clone();
    k.body.retain(|s| !matches!(s, Stmt::Barrier));
    let e = error_of(&k);
    assert!(e.contains("since the last barrier"), "{e}");
    // A wgmma by half a warpgroup.
    let mut k = good.clone();
    let at = find(&k, |s| matches!(s, Stmt::Wgmma { .. }));
    let w = k.body[at].clone();
    k.body[at] = Stmt::If {
        cond: Sc::lt(Sc::Special(Special::Thread), Sc::Const(64)),
        body: vec![w],
    };
    let e = error_of(&k);
    assert!(e.contains("a wgmma by 64 of the 128 threads"), "{e}");
    // A shared write into what a wgmma in flight reads.
    let mut k = good.clone();
    let r = k.regs;
    k.regs += 1;
    let at = find(&k, |s| matches!(s, Stmt::WgmmaCommit));
    k.body.insert(
        at,
        Stmt::If {
            cond: Sc::eq(Sc::Special(Special::Thread), Sc::Const(0)),
            body: vec![
                Stmt::Let {
                    reg: r,
                    value: Sc::Const(0),
                },
                Stmt::SharedStore {
                    array: 0,
                    index: Sc::Const(0),
                    value: r,
                },
            ],
        },
    );
    let e = error_of(&k);
    assert!(e.contains("which a wgmma still in flight reads"), "{e}");
    // A swizzled descriptor started in the middle of an atom (row 1).
    let mut k = good.clone();
    for (a, _) in wgmmas(&mut k) {
        a.start = Sc::plus(a.start.clone(), Sc::Const(64));
    }
    let e = error_of(&k);
    assert!(e.contains("past the first row of an atom"), "{e}");
}

/// The verifier takes warpgroup products only on a target with them, in whole warpgroups.
#[test]
fn warpgroup_products_verify_only_where_the_target_has_them() {
    let target = TargetInfo::h200();
    let mut gpu = target.gpu.clone().unwrap();
    let k = tile(DType::BF16, 64, 64, WgSwizzle::B128);
    gpu.wgmma = false;
    let e = kiln_kernel::gpu::print::verify(&k, &gpu).unwrap_err();
    assert!(e.contains("sm_90a only"), "{e}");
    gpu.wgmma = true;
    let mut half = k.clone();
    half.block = 96;
    let e = kiln_kernel::gpu::print::verify(&half, &gpu).unwrap_err();
    assert!(e.contains("whole warpgroups of 128"), "{e}");
    let mut odd = k.clone();
    for (_, b) in wgmmas(&mut odd) {
        b.sbo = 1000;
    }
    let e = kiln_kernel::gpu::print::verify(&odd, &gpu).unwrap_err();
    assert!(e.contains("a multiple of 16"), "{e}");
    // The arrays a descriptor names are aligned to 1024 bytes.
    let (offsets, _) = k.shared_offsets();
    assert!(offsets.iter().all(|o| o % 1024 == 0), "{offsets:?}");
}

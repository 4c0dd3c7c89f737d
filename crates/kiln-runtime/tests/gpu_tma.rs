//! mbarriers and TMA tile loads (sm_90a) on the GPU emulator: phases counted over rounds of
//! arrivals and parity waits, and the misuses the emulator refuses (a barrier never
//! initialized, initialized twice or not published, a wrong count, a parity not flipped, a
//! generic store to a barrier's word); a box loaded by TMA equals its source for every
//! swizzle (read back through the swizzle), ragged and negative boxes zero-filled; a
//! warpgroup's product on operands loaded by TMA is exact, so the TMA swizzles are the ones
//! the `wgmma` descriptors read; and planted bugs (bytes not expected, too few expected, no
//! wait, the wrong swizzle) that the comparison or the emulator catches.

use kiln_ir::DType;
use kiln_kernel::gpu::desc::WgSwizzle;
use kiln_kernel::gpu::ir::*;
use kiln_kernel::gpu::mbarrier::rounds;
use kiln_kernel::gpu::print::verify;
use kiln_kernel::gpu::tma::{tma_tile, tma_warpgroup_tile};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{Buffer, V, run_kernel};

mod products;
use products::edit;

fn sums() -> kiln_kernel::target::SumTree {
    TargetInfo::h200().sums
}

/// Verifies `k` for an H200, panicking with the verifier's message.
fn verified(k: GpuKernel) -> GpuKernel {
    let target = TargetInfo::h200();
    verify(&k, target.gpu.as_ref().unwrap()).unwrap_or_else(|e| panic!("{e}"));
    k
}

/// Runs a kernel of no inputs and one output; its output or the emulator's error.
fn run_rounds(k: &GpuKernel) -> Result<Vec<V>, String> {
    let mut out = vec![Buffer::zeros("%out", &k.outputs[0].1)];
    run_kernel(k, &[], &mut out).map_err(|e| e.to_string())?;
    Ok(out.remove(0).data)
}

#[test]
fn mbarrier_phases_count_every_round() {
    for n in [1, 2, 5] {
        let k = verified(rounds(128, n, sums()));
        let got = run_rounds(&k).unwrap();
        assert!(
            got.iter().all(|v| *v == V::I(n as i64)),
            "{n} rounds: {got:?}"
        );
    }
}

#[test]
fn misused_mbarriers_are_errors() {
    let good = rounds(128, 3, sums());
    let fails = |k: &GpuKernel, want: &str| {
        let e = run_rounds(k).expect_err(want);
        assert!(e.contains(want), "wanted {want:?}, got {e}");
    };
    // A count of half the block: each round's arrivals complete two phases, and the wait
    // for the round's parity finds the next phase open.
    fails(&rounds(64, 3, sums()), "which cannot complete");
    // One arrival more than the block has.
    fails(
        &rounds(129, 3, sums()),
        "1 arrivals and 0 transaction bytes outstanding",
    );
    // The wait repeated: the second returns on the phase the first did.
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::For { body, .. } = s {
            let wait = body[1].clone();
            body.insert(2, wait);
        }
    });
    fails(&k, "the parity was not flipped");
    // Never initialized.
    let mut k = good.clone();
    k.body.remove(0);
    fails(&k, "never initialized");
    // Initialized by every thread.
    let mut k = good.clone();
    k.body[0] = Stmt::MbarInit {
        bar: Mbar {
            array: 0,
            index: Sc::Const(0),
        },
        count: 128,
    };
    fails(&k, "already initialized");
    // No block barrier between the init and the other threads' arrivals.
    let mut k = good.clone();
    k.body.remove(1);
    fails(&k, "with no block barrier since");
    // Invalidated before use.
    let mut k = good.clone();
    let inval = k.body.pop().unwrap();
    k.body.insert(2, inval);
    fails(&k, "never initialized");
    // A generic store to the barrier's word.
    let mut k = good.clone();
    k.body.insert(
        2,
        Stmt::If {
            cond: Sc::eq(Sc::Special(Special::Thread), Sc::Const(0)),
            body: vec![
                Stmt::Let {
                    reg: 2,
                    value: Sc::Const(7),
                },
                Stmt::SharedStore {
                    array: 0,
                    index: Sc::Const(0),
                    value: 2,
                },
            ],
        },
    );
    fails(&k, "an mbarrier's word");
    // The last round's wait out of order: on the parity of a phase that never comes.
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::MbarWait { parity, .. } = s {
            *parity = Sc::plus(parity.clone(), Sc::Const(1));
        }
    });
    fails(&k, "cannot complete");
}

#[test]
fn mbarriers_verify_only_where_the_target_has_them() {
    let target = TargetInfo::h200();
    let mut gpu = target.gpu.clone().unwrap();
    let k = rounds(128, 2, sums());
    gpu.wgmma = false;
    let e = verify(&k, &gpu).unwrap_err();
    assert!(e.contains("sm_90a only"), "{e}");
    gpu.wgmma = true;
    let mut zero = k.clone();
    edit(&mut zero.body, &mut |s| {
        if let Stmt::MbarInit { count, .. } = s {
            *count = 0;
        }
    });
    let e = verify(&zero, &gpu).unwrap_err();
    assert!(e.contains("mbarrier.init of count 0"), "{e}");
    let mut f32s = k.clone();
    f32s.shared[0].dtype = DType::F32;
    let e = verify(&f32s, &gpu).unwrap_err();
    assert!(e.contains("not an unswizzled array of u64"), "{e}");
}

/// Element `(r, c)` of a test tensor: small integers, exact in bf16.
fn src(r: usize, c: usize) -> f64 {
    ((r * 7 + c * 3 + r * c) % 23) as f64 - 11.0
}

/// A `rows x cols` tensor of `dtype` (rows padded to 16 bytes as the map's stride says).
fn tensor(dtype: DType, rows: usize, cols: usize) -> Buffer {
    let e = dtype.bits() as usize / 8;
    let pitch = (cols * e).next_multiple_of(16) / e;
    Buffer {
        name: "%src".into(),
        dtype,
        data: (0..rows * pitch)
            .map(|i| {
                V::F(if i % pitch < cols {
                    src(i / pitch, i % pitch)
                } else {
                    99.0
                })
            })
            .collect(),
    }
}

/// Runs a [`tma_tile`] kernel and compares the box it wrote with the source (zeros outside
/// it): the first wrong element, or the emulator's error.
fn check_tile(k: &GpuKernel, (rows, cols): (usize, usize), coords: [i64; 2]) -> Result<(), String> {
    let m = &k.tensor_maps[0];
    let input = tensor(m.dtype, rows, cols);
    let mut out = vec![Buffer::zeros("%box", &k.outputs[0].1)];
    // The padded source is longer than the kernel's input type says: give exactly it.
    let input = Buffer {
        data: input.data[..m.dims[1] * m.row_stride / m.elem_bytes()].to_vec(),
        ..input
    };
    run_kernel(k, &[&input], &mut out).map_err(|e| e.to_string())?;
    let (br, bc) = (k.outputs[0].1.shape[0], k.outputs[0].1.shape[1]);
    for r in 0..br {
        for c in 0..bc {
            let (y, x) = (coords[1] + r as i64, coords[0] + c as i64);
            let inside = (0..rows as i64).contains(&y) && (0..cols as i64).contains(&x);
            let want = if inside {
                src(y as usize, x as usize)
            } else {
                0.0
            };
            let got = out[0].data[r * bc + c];
            if got != V::F(want) {
                return Err(format!("box ({r}, {c}) is {got:?}, not {want}"));
            }
        }
    }
    Ok(())
}

/// The tensor's shape and the box's columns of each case: a swizzled box's row is the
/// swizzle's width.
fn box_cols(dtype: DType, swizzle: WgSwizzle) -> usize {
    match swizzle {
        WgSwizzle::None => 16,
        s => s.row_bytes() / (dtype.bits() as usize / 8),
    }
}

#[test]
fn a_box_loaded_by_tma_equals_its_source_for_every_swizzle() {
    let mut failures = Vec::new();
    let (rows, cols) = (40, 72);
    for swizzle in WgSwizzle::ALL {
        for dtype in [DType::BF16, DType::F32] {
            let bc = box_cols(dtype, swizzle);
            for (br, coords) in [
                (16, [0, 0]),
                (32, [bc as i64, 8]),
                // Ragged: past the right and bottom edges, and before the top-left corner.
                (32, [cols as i64 - 5, rows as i64 - 20]),
                (16, [-3, -7]),
            ] {
                let Some(k) = tma_tile(dtype, (rows, cols), [bc, br], coords, swizzle, sums())
                else {
                    failures.push(format!("{swizzle:?} {dtype} box {bc} x {br}: no kernel"));
                    continue;
                };
                let k = verified(k);
                if let Err(e) = check_tile(&k, (rows, cols), coords) {
                    failures.push(format!("{}: {e}", k.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A swizzled tile, to plant bugs in.
fn swizzled_tile(swizzle: WgSwizzle) -> (GpuKernel, [i64; 2]) {
    let coords = [8, 30];
    let k = tma_tile(
        DType::BF16,
        (40, 72),
        [swizzle.row_bytes() / 2, 16],
        coords,
        swizzle,
        sums(),
    )
    .unwrap();
    (verified(k), coords)
}

#[test]
fn planted_tma_bugs_are_caught() {
    let shape = (40, 72);
    for swizzle in [WgSwizzle::B32, WgSwizzle::B64, WgSwizzle::B128] {
        let (good, at) = swizzled_tile(swizzle);
        check_tile(&good, shape, at).unwrap();
        let caught = |what: &str, k: &GpuKernel, want: Option<&str>| match check_tile(k, shape, at)
        {
            Ok(()) => panic!("{swizzle:?}: {what} not caught"),
            Err(e) => {
                if let Some(w) = want {
                    assert!(e.contains(w), "{swizzle:?}: {what}: {e}");
                }
            }
        };
        // The map unswizzled, or swizzled another way, than the reads assume.
        for other in WgSwizzle::ALL.into_iter().filter(|&s| s != swizzle) {
            let mut k = good.clone();
            k.tensor_maps[0].swizzle = other;
            caught(&format!("landed as {other:?}"), &k, None);
        }
        // A plain arrive: the phase completes before the bytes land.
        let mut k = good.clone();
        edit(&mut k.body, &mut |s| {
            if let Stmt::MbarArrive { tx, .. } = s {
                *tx = 0;
            }
        });
        caught(
            "no bytes expected",
            &k,
            Some("a phase it has not waited for"),
        );
        // Too few bytes expected: the count goes below zero and the phase never completes.
        let mut k = good.clone();
        edit(&mut k.body, &mut |s| {
            if let Stmt::MbarArrive { tx, .. } = s {
                *tx -= 16;
            }
        });
        caught(
            "16 bytes short",
            &k,
            Some("-16 transaction bytes outstanding"),
        );
        // No wait: the box is read while in flight.
        let mut k = good.clone();
        k.body.retain(|s| !matches!(s, Stmt::MbarWait { .. }));
        caught("no wait", &k, Some("while a TMA load into it is in flight"));
        // A destination not on a 128-byte boundary.
        let mut k = good.clone();
        k.shared[0].len += 64;
        edit(&mut k.body, &mut |s| {
            if let Stmt::TmaLoad { index, .. } = s {
                *index = Sc::Const(32);
            }
        });
        caught("misaligned", &k, Some("not a multiple of 128"));
    }
}

/// A's, B's and C's elements of the warpgroup product: small integers and halves, so D is
/// exact.
fn a_at(r: usize, k: usize) -> f64 {
    ((r * 5 + k * 3 + r * k) % 13) as f64 - 6.0
}

fn b_at(k: usize, n: usize) -> f64 {
    ((k * 2 + n * 7 + (k * n) / 5) % 11) as f64 - 5.0
}

fn c_at(r: usize, n: usize) -> f64 {
    ((r * 3 + n) % 7) as f64 * 0.5
}

/// Runs a warpgroup tile (`n` columns, contraction `k`; B by columns) and compares D with
/// the plain product.
fn check_product(kernel: &GpuKernel, n: usize, k: usize) -> Result<(), String> {
    let dtype = kernel.inputs[0].1.dtype;
    let buf = |name: &str, dtype, data: Vec<f64>| Buffer {
        name: name.into(),
        dtype,
        data: data.into_iter().map(V::F).collect(),
    };
    let a = buf(
        "%a",
        dtype,
        (0..64 * k).map(|i| a_at(i / k, i % k)).collect(),
    );
    let b = buf(
        "%b",
        dtype,
        (0..n * k).map(|i| b_at(i % k, i / k)).collect(),
    );
    let c = buf(
        "%c",
        DType::F32,
        (0..64 * n).map(|i| c_at(i / n, i % n)).collect(),
    );
    let mut out = vec![Buffer::zeros("%d", &kernel.outputs[0].1)];
    run_kernel(kernel, &[&a, &b, &c], &mut out).map_err(|e| e.to_string())?;
    for r in 0..64 {
        for col in 0..n {
            let want = c_at(r, col) + (0..k).map(|s| a_at(r, s) * b_at(s, col)).sum::<f64>();
            let got = out[0].data[r * n + col];
            if got != V::F(want) {
                return Err(format!("D[{r}][{col}] is {got:?}, not {want}"));
            }
        }
    }
    Ok(())
}

#[test]
fn a_warpgroup_product_reads_what_tma_loaded() {
    let mut failures = Vec::new();
    for swizzle in [WgSwizzle::B32, WgSwizzle::B64, WgSwizzle::B128] {
        for (n, k, dtype) in [
            (64, 64, DType::BF16),
            (256, 64, DType::BF16),
            (128, 64, DType::F16),
        ] {
            let kernel = verified(tma_warpgroup_tile(dtype, (n, k), swizzle, sums()).unwrap());
            if let Err(e) = check_product(&kernel, n, k) {
                failures.push(format!("{}: {e}", kernel.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(tma_warpgroup_tile(DType::BF16, (64, 64), WgSwizzle::None, sums()).is_none());
    // Planted: the descriptors read another swizzle than the TMA wrote; B's boxes one atom
    // column off; the wait gone (the wgmma reads what is in flight).
    let good = verified(tma_warpgroup_tile(DType::BF16, (64, 64), WgSwizzle::B64, sums()).unwrap());
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::Wgmma { a, .. } = s {
            a.swizzle = WgSwizzle::B32;
        }
    });
    assert!(
        check_product(&k, 64, 64).is_err(),
        "A read as 32-byte swizzled"
    );
    let mut k = good.clone();
    edit(&mut k.body, &mut |s| {
        if let Stmt::TmaLoad { map: 1, coords, .. } = s {
            coords[0] = Sc::plus(coords[0].clone(), Sc::Const(32));
        }
    });
    assert!(check_product(&k, 64, 64).is_err(), "B's boxes shifted");
    let mut k = good.clone();
    k.body.retain(|s| !matches!(s, Stmt::MbarWait { .. }));
    let e = check_product(&k, 64, 64).unwrap_err();
    assert!(e.contains("in flight"), "{e}");
}

//! Matrix products on the GPU emulator reading their operands in place through strides and
//! storing their results through strides (`kiln_kernel::gpu::map`'s `strided.rs`):
//! attention's heads split out of `[b, s, 3 h d]` (keys transposed) and merged back into `[b,
//! s, h d]` take no copy kernels, every product agrees with the reference interpreter (under
//! `kiln_reference::accuracy`'s bound, the emulator checking races, barriers and bounds), in
//! f32 on the CUDA cores, with bf16 operands on `mma.sync` and on warpgroups, and in attention
//! computed online; strides that leave 16-byte copies unaligned stage the operand through
//! registers instead of `cp.async`.

use kiln_ir::{Func, Literal};
use kiln_kernel::gpu::ir::{Buf, GpuProgram, MapKind, Stmt};
use kiln_kernel::gpu::plan::DeviceStep;
use kiln_kernel::ir::Schedule;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::compile_and_run;

mod planned;
mod products;
mod strided;

use planned::{planned, random_args};
use products::{count, wgmma_target};
use strided::{heads, sliced};

/// `target` with its products reading and storing through strides or not.
fn strided_or_not(target: &TargetInfo, on: bool) -> TargetInfo {
    let mut t = target.clone();
    t.fusion.strided_operands = on;
    t
}

/// The kernel steps of `f`'s device plan for `target`, and their launches in all.
fn kernel_steps(f: &Func, target: &TargetInfo) -> (usize, usize) {
    let plan = planned(f, target).expect("plans");
    let programs: Vec<&GpuProgram> = (plan.steps.iter())
        .filter_map(|s| match s {
            DeviceStep::Kernel(k) => Some(&k.program),
            _ => None,
        })
        .collect();
    let launches = programs.iter().map(|p| p.launches.len()).sum();
    (programs.len(), launches)
}

/// `src` run on the emulator for `target` against the reference interpreter: the launches it
/// ran, by mapping; an error on a fallback, an emulator error or a result outside the
/// accuracy module's bound.
fn agrees(src: &str, target: &TargetInfo, seed: u64) -> Result<Vec<MapKind>, String> {
    let f: Func = kiln_ir::parse_func_text(src).map_err(|e| format!("{e}\n{src}"))?;
    let args: Vec<Literal> = random_args(&f, seed);
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(&f, &[], &opts, target, &args).map_err(|e| e.to_string())?;
    if let Some(w) = rep.fallbacks.first() {
        return Err(format!("a kernel fell back to the reference: {w}"));
    }
    kiln_reference::accuracy::check_outputs(&f, &args, &got).map_err(|e| format!("{e}\n{src}"))?;
    Ok(rep
        .launches
        .iter()
        .flat_map(|(&k, &n)| std::iter::repeat_n(k, n))
        .collect())
}

/// The GEMM kernels of `f` for `target`: how many read an operand through strides and how
/// many store through strides.
fn strided_gemms(f: &Func, target: &TargetInfo) -> (usize, usize) {
    let opts = kiln_kernel::Options::default();
    let l = kiln_kernel::pipeline::lower_program(f, &[], &opts, target, None, &mut |_| {})
        .expect("lowers");
    let mut out = (0, 0);
    for k in l.fused.kernels.iter().flatten() {
        if let Schedule::Gemm {
            strides,
            store,
            chain,
            ..
        } = &k.schedule
        {
            let chained = chain.as_ref().is_some_and(|c| c.b_strides.is_some());
            out.0 += usize::from(strides.iter().any(Option::is_some) || chained);
            out.1 += usize::from(store.is_some());
        }
    }
    out
}

/// The transformer's heads at its shape, `[16, 128, 768]` split into `[16, 4, 128, 64]`, K
/// transposed: on the H200 both products read in place and the second stores merged back,
/// so the plan is the two products alone (the layouts' six copies and the merge gone).
#[test]
fn the_heads_take_no_copies_on_the_gpu() {
    let h200 = TargetInfo::h200();
    let f = kiln_ir::parse_func_text(&heads(16, 128, 4, 64, "f32", "f32", false)).unwrap();
    assert_eq!(strided_gemms(&f, &h200), (2, 1));
    assert_eq!(kernel_steps(&f, &h200), (2, 2));
    // Without strides: the three head layouts (K's transposed), the merge and the products.
    let off = strided_or_not(&h200, false);
    assert_eq!(strided_gemms(&f, &off), (0, 0));
    let (steps, _) = kernel_steps(&f, &off);
    assert!(steps >= 6, "{steps} kernel steps without strides");
}

/// The heads' products in f32 (register tiles on the CUDA cores, and a thread per element
/// where the GPU has no tiles) agree with the reference through strides, with heads the width
/// of a tile and narrower.
#[test]
fn products_of_heads_agree_in_f32() {
    let h200 = TargetInfo::h200();
    for (seed, (b, s, h, d)) in [(2, 64, 4, 64), (1, 40, 3, 24), (2, 17, 2, 8)]
        .into_iter()
        .enumerate()
    {
        let src = heads(b, s, h, d, "f32", "f32", false);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        assert_eq!(strided_gemms(&f, &h200), (2, 1), "{src}");
        // V (the second product's B, by rows, two batch dimensions) is copied with
        // `cp.async` through its gathered batch offset; the A tiles, stored by columns on the
        // CUDA cores, go through registers.
        let copies = (copies_input(&f, &h200, 0), copies_input(&f, &h200, 1));
        assert_eq!(copies, (false, d % 4 == 0), "{src}");
        let kinds = agrees(&src, &h200, seed as u64).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kinds, vec![MapKind::GemmTiled; 2], "{src}");
        // A GPU without block tiles: a thread per element, reading and storing alike.
        let mut untiled = h200.clone();
        untiled.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
        let kinds = agrees(&src, &untiled, seed as u64).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kinds, vec![MapKind::Gemm; 2], "{src}");
    }
}

/// Whether any launch of `f`'s plan for `target` runs on warpgroups.
fn on_warpgroups(f: &Func, target: &TargetInfo) -> bool {
    let plan = planned(f, target).expect("plans");
    plan.steps.iter().any(|s| match s {
        DeviceStep::Kernel(k) => k.program.launches.iter().any(|l| l.uses_wgmma()),
        _ => false,
    })
}

/// bf16 operands with f32 products, on `mma.sync` (the H200's default tiles) and on
/// warpgroups: the scores read Q and K in place, the output V, stored merged back.
#[test]
fn products_of_heads_agree_on_the_tensor_cores() {
    for (target, warpgroups) in [
        (TargetInfo::h200(), false),
        (wgmma_target((64, 64), 3), true),
    ] {
        for (seed, (b, s, h, d)) in [(1, 64, 2, 64), (2, 40, 2, 32)].into_iter().enumerate() {
            let src = heads(b, s, h, d, "bf16", "f32", false);
            let f = kiln_ir::parse_func_text(&src).unwrap();
            let (reads, stores) = strided_gemms(&f, &target);
            assert!(reads >= 2 && stores == 1, "{reads} {stores}\n{src}");
            assert_eq!(on_warpgroups(&f, &target), warpgroups, "{src}");
            // Q, K and V copied with `cp.async` through their gathered batch offsets.
            let copies = (copies_input(&f, &target, 0), copies_input(&f, &target, 1));
            assert_eq!(copies, (true, true), "{src}");
            let kinds = agrees(&src, &target, seed as u64).unwrap_or_else(|e| panic!("{e}"));
            assert!(kinds.contains(&MapKind::GemmMma), "{kinds:?}\n{src}");
        }
    }
}

/// Attention computed online in one launch (f32) reads Q, K and V through strides (its merge
/// back keeps its kernel: the chained product has an epilogue); bf16 attention traced this
/// way (its softmax in bf16, not chained) reads its heads in place in both products. Either
/// way the heads' copies are gone: 4 launches to 2 in f32, 7 to 4 in bf16.
#[test]
fn attention_reads_its_heads_in_place() {
    let h200 = TargetInfo::h200();
    let cases = [
        ("f32", (1, MapKind::AttentionTiled), (4, 2)),
        ("bf16", (2, MapKind::GemmMma), (7, 4)),
    ];
    for (dt, (reads, kind), (before, after)) in cases {
        let src = heads(2, 48, 2, 32, dt, dt, true);
        let f = kiln_ir::parse_func_text(&src).unwrap();
        assert_eq!(strided_gemms(&f, &h200).0, reads, "{dt}: {src}");
        let kinds = agrees(&src, &h200, 7).unwrap_or_else(|e| panic!("{e}"));
        assert!(kinds.contains(&kind), "{kinds:?}\n{src}");
        assert_eq!(kinds.len(), after, "{kinds:?}\n{src}");
        let off = strided_or_not(&h200, false);
        let kinds = agrees(&src, &off, 7).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kinds.len(), before, "{kinds:?}\n{src}");
    }
}

/// Whether a launch of `f`'s only product copies input `input` into shared memory with
/// `cp.async`.
fn copies_input(f: &Func, target: &TargetInfo, input: usize) -> bool {
    let plan = planned(f, target).expect("plans");
    plan.steps.iter().any(|s| match s {
        DeviceStep::Kernel(k) => k.program.launches.iter().any(|l| {
            count(
                &l.body,
                &|s| matches!(s, Stmt::CopyAsync { buf: Buf::Input(i), .. } if *i == input),
            ) > 0
        }),
        _ => false,
    })
}

/// Slices read in place: an offset and a row distance of whole 16-byte copies are copied
/// with `cp.async`; an odd offset or row distance stages the operand through registers (the
/// narrow path), and every case agrees with the reference, in f32 and with bf16 operands.
/// (On the CUDA cores A by rows is staged through registers whatever its strides: its tile
/// is stored by columns.)
#[test]
fn unaligned_strides_take_the_narrow_path() {
    let h200 = TargetInfo::h200();
    let (m, k, n) = (40, 48, 72);
    for (dt, acc, elems, a_copied) in [("f32", "f32", 4, false), ("bf16", "f32", 8, true)] {
        // (A's offset and extra columns, B's, whether each is copied with `cp.async`).
        let cases = [
            ((elems, 2 * elems), (2 * elems, 2 * elems), (true, true)),
            ((1, 3), (elems, elems), (false, true)),
            ((elems, elems), (3, 5), (true, false)),
            ((1, 1), (1, 1), (false, false)),
        ];
        for (seed, (a, b, (ca, cb))) in cases.into_iter().enumerate() {
            let src = sliced((m, k, n), a, b, (dt, acc));
            let f = kiln_ir::parse_func_text(&src).unwrap();
            assert_eq!(strided_gemms(&f, &h200), (1, 0), "{src}");
            assert_eq!(kernel_steps(&f, &h200), (1, 1), "{src}");
            let copies = (copies_input(&f, &h200, 0), copies_input(&f, &h200, 1));
            assert_eq!(copies, (ca && a_copied, cb), "{src}");
            agrees(&src, &h200, seed as u64).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

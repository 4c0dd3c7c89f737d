//! Products whose readers never use a triangle of them (a causal mask's scores, which every
//! reader selects away: `kiln_kernel::ir::Unread`) leave the block tiles wholly inside it
//! uncomputed on the GPU (`kiln_kernel::gpu::map`'s `skip.rs`): on the CUDA cores, on
//! `mma.sync`, on warpgroups through the `cp.async` ring and through TMA, and a thread per
//! element. Each mapping's plan says how many tiles it leaves out, and the results agree with
//! the reference interpreter (the emulator checking races, barriers and bounds) with heads
//! that fill whole tiles and partial ones, with NaN and infinities in the keys and queries
//! both where the mask hides the scores and where it shows them.

use kiln_ir::{Func, Literal};
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::compile_and_run;

mod planned;
mod products;
mod unread;

use planned::{plan_notes, programs, random_args};
use products::wgmma_target;
use unread::two_readers;

/// The notes of `f`'s plan for `target` that say a product leaves its unread tiles out.
fn skip_notes(f: &Func, target: &TargetInfo) -> Vec<String> {
    plan_notes(f, target, &|n| n.starts_with("product unread where"))
}

/// `f` on the emulator of `target` with `args`, against the reference interpreter: the
/// launches it ran by mapping, or the error (a fallback, an emulator error, a result outside
/// the accuracy module's bound, NaN where the reference has none or the reverse).
fn agrees(f: &Func, target: &TargetInfo, args: &[Literal]) -> Result<Vec<MapKind>, String> {
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(f, &[], &opts, target, args).map_err(|e| e.to_string())?;
    if let Some(w) = rep.fallbacks.first() {
        return Err(format!("a kernel fell back to the reference: {w}"));
    }
    kiln_reference::accuracy::check_outputs(f, args, &got)?;
    // The accuracy module's bound is loose for 16-bit operands: every element also within a
    // thousandth of its output's largest finite magnitude, NaN where the reference's is,
    // infinities equal.
    let want = kiln_reference::eval(f, args).map_err(|e| e.to_string())?;
    for (o, (w, g)) in want.iter().zip(&got).enumerate() {
        let (w, g) = (w.to_f64s(), g.to_f64s());
        let top = w
            .iter()
            .filter(|x| x.is_finite())
            .fold(0f64, |m, x| m.max(x.abs()));
        for (i, (&x, &y)) in w.iter().zip(&g).enumerate() {
            let same = if x.is_finite() {
                (x - y).abs() <= 1e-3 * top.max(1.0)
            } else {
                x.is_nan() && y.is_nan() || x == y
            };
            if !same {
                return Err(format!(
                    "output {o}: element {i} is {y}, the reference's {x}"
                ));
            }
        }
    }
    Ok(rep.launches.keys().copied().collect())
}

/// Random arguments of `f` from `seed` with NaN, +inf and -inf placed in the queries and keys
/// `[b, h, s, d]`: a late key (hidden from the early queries), the first key (shown to all),
/// a query (hidden and shown scores).
fn with_specials(f: &Func, seed: u64, (s, d): (usize, usize)) -> Vec<Literal> {
    let mut args = random_args(f, seed);
    let put = |lit: &Literal, at: &[(usize, f64)]| {
        let mut v = lit.to_f64s();
        for &(i, x) in at {
            v[i] = x;
        }
        Literal::from_f64s(lit.ty().clone(), &v).unwrap()
    };
    let late = (s - 3) * d + 1;
    args[1] = put(&args[1], &[(late, f64::NAN), (2, f64::INFINITY)]);
    args[0] = put(&args[0], &[((s / 2) * d + 3, f64::NEG_INFINITY)]);
    args
}

/// Each mapping's plan, its tiles left out and its results: `(target, mapping, notes)` for
/// `[b, h, s, d]` heads of `inp`.
fn check(target: &TargetInfo, inp: &str, (b, h, s, d): (usize, usize, usize, usize)) -> String {
    let src = two_readers(b, h, s, d, inp);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let mut notes = skip_notes(&f, target);
    assert_eq!(
        notes.len(),
        1,
        "one product leaves its tiles out: {notes:?}\n{src}"
    );
    for (seed, args) in [random_args(&f, 3), with_specials(&f, 5, (s, d))]
        .into_iter()
        .enumerate()
    {
        agrees(&f, target, &args).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{src}"));
    }
    notes.remove(0)
}

/// The mapping of the scores' product in `f`'s plan for `target`.
fn product_kind(f: &Func, target: &TargetInfo) -> MapKind {
    let p = programs(f, target);
    p.iter()
        .flat_map(|p| &p.launches)
        .map(|l| l.kind)
        .find(|k| matches!(k, MapKind::Gemm | MapKind::GemmTiled | MapKind::GemmMma))
        .expect("a product launch")
}

/// On the CUDA cores (f32): the `[128, 128]` scores take `64 x 64` tiles rather than `128 x
/// 64` (none of which lies above the diagonal) and leave one of four out; heads of 100
/// leave out the tiles clipped at the edges that lie wholly above it.
#[test]
fn f32_scores_leave_their_unread_tiles_out_on_the_cuda_cores() {
    let h200 = TargetInfo::h200();
    let note = check(&h200, "f32", (1, 2, 128, 64));
    assert!(
        note.ends_with("1 of 4 tiles a matrix skip their contraction, zeros stored"),
        "{note}"
    );
    let note = check(&h200, "f32", (1, 1, 100, 24));
    assert!(note.contains("col - row > 0: 1 of 4 tiles"), "{note}");
    let note = check(&h200, "f32", (2, 1, 256, 32));
    assert!(note.contains(": 2 of 8 tiles"), "{note}");
    let f = kiln_ir::parse_func_text(&two_readers(1, 1, 100, 24, "f32")).unwrap();
    assert_eq!(product_kind(&f, &h200), MapKind::GemmTiled);
}

/// A thread per element where the GPU has no tiles: each element above the diagonal skips its
/// contraction.
#[test]
fn scores_leave_their_unread_elements_out_a_thread_per_element() {
    let mut untiled = TargetInfo::h200();
    untiled.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    let note = check(&untiled, "f32", (1, 2, 40, 8));
    assert!(
        note.ends_with("those elements skip their contraction, zeros stored"),
        "{note}"
    );
    let f = kiln_ir::parse_func_text(&two_readers(1, 2, 40, 8, "f32")).unwrap();
    assert_eq!(product_kind(&f, &untiled), MapKind::Gemm);
}

/// bf16 queries and keys on `mma.sync` (f32 scores), and on warpgroups through the
/// `cp.async` ring and through TMA.
#[test]
fn bf16_scores_leave_their_unread_tiles_out_on_the_tensor_cores() {
    let h200 = TargetInfo::h200();
    let note = check(&h200, "bf16", (1, 2, 128, 64));
    assert!(note.contains(": 1 of 4 tiles"), "{note}");
    let note = check(&h200, "bf16", (1, 1, 100, 32));
    assert!(note.contains(": 1 of 4 tiles"), "{note}");
    let f = kiln_ir::parse_func_text(&two_readers(1, 1, 100, 32, "bf16")).unwrap();
    assert_eq!(product_kind(&f, &h200), MapKind::GemmMma);
    // Warpgroups of 64 x 64 in a ring of 2 stages: cp.async for batched heads.
    let wg = wgmma_target((64, 64), 2);
    let note = check(&wg, "bf16", (1, 2, 128, 64));
    assert!(note.contains(": 1 of 4 tiles"), "{note}");
    let f = kiln_ir::parse_func_text(&two_readers(1, 2, 128, 64, "bf16")).unwrap();
    let uses_wgmma = programs(&f, &wg)
        .iter()
        .any(|p| p.launches.iter().any(|l| l.uses_wgmma()));
    assert!(uses_wgmma);
    // Through TMA: one matrix (the ring's operands plain row-major tensors).
    let mut tma = wgmma_target((64, 64), 3);
    tma.gpu.as_mut().expect("a GPU").wgmma_tma = true;
    let note = check(&tma, "bf16", (1, 1, 256, 64));
    assert!(note.contains(": 6 of 16 tiles"), "{note}");
    let f = kiln_ir::parse_func_text(&two_readers(1, 1, 256, 64, "bf16")).unwrap();
    let maps = programs(&f, &tma)
        .iter()
        .any(|p| p.launches.iter().any(|l| !l.tensor_maps.is_empty()));
    assert!(maps, "the product loads by TMA");
}

/// Without the target's `unread_blocks` every tile computes its contraction, as before.
#[test]
fn without_the_limit_every_tile_is_computed() {
    let mut h200 = TargetInfo::h200();
    h200.fusion.unread_blocks = false;
    let f = kiln_ir::parse_func_text(&two_readers(1, 2, 128, 64, "f32")).unwrap();
    assert!(skip_notes(&f, &h200).is_empty());
    agrees(&f, &h200, &with_specials(&f, 5, (128, 64))).unwrap();
}

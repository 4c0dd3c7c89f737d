//! Products whose operand is zero over a causal mask's triangle (attention's probabilities kept
//! for the backward pass, and their gradient: `kiln_kernel::ir::ZeroBlocks`) leave the stages
//! of steps zero for a whole block tile out on the GPU (`kiln_kernel::gpu::map`'s
//! `zero_steps.rs`), only where the block checks at run time that they are zero and the other
//! operand finite there: on the CUDA cores, on `mma.sync` and on warpgroups (rings of 2 and 3
//! stages); the TMA ring and a thread per element run every step and say so. The results agree
//! with the reference interpreter (the emulator checking races, barriers and bounds), NaN for
//! NaN, with NaN and infinities in the other operands and in a query (whose row of `P` is then
//! NaN, not zero, so the check fails and the block runs every step), with partial tiles and
//! contractions past the sum tree's first level (its flushes replayed).

use kiln_ir::{Func, Literal};
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::compile_and_run;

mod causal;
mod planned;
mod products;

use causal::{probabilities, score_gradient};
use planned::{plan_notes, random_args};
use products::wgmma_target;

/// The notes of `f`'s plan for `target` about zero steps.
fn zero_notes(f: &Func, target: &TargetInfo) -> Vec<String> {
    plan_notes(f, target, &|n| n.contains(" zero where "))
}

/// `f` on the emulator of `target` with `args` against the reference interpreter: under the
/// accuracy module's bound, and every element within a thousandth of its output's largest
/// finite magnitude, NaN exactly where the reference's is, infinities equal.
fn agrees(f: &Func, target: &TargetInfo, args: &[Literal]) -> Result<(), String> {
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(f, &[], &opts, target, args).map_err(|e| e.to_string())?;
    if let Some(w) = rep.fallbacks.first() {
        return Err(format!("a kernel fell back to the reference: {w}"));
    }
    kiln_reference::accuracy::check_outputs(f, args, &got)?;
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
    Ok(())
}

/// `args` with `at`'s `(argument, flat index, value)` placed.
fn with(args: &[Literal], at: &[(usize, usize, f64)]) -> Vec<Literal> {
    let mut out = args.to_vec();
    for &(p, i, x) in at {
        let mut v = out[p].to_f64s();
        v[i] = x;
        out[p] = Literal::from_f64s(out[p].ty().clone(), &v).unwrap();
    }
    out
}

/// The probabilities' products of `[1, h, s, d]` heads on `target`: each of the three
/// carries a note `expect` ends, and they agree with the reference on random arguments and
/// with NaN and infinities placed: V's last row (hidden from all but the last query), dO's
/// first row, a late key, a query (its row of `P` NaN).
fn check_probabilities(target: &TargetInfo, (h, s, d): (usize, usize, usize), expect: &str) {
    let src = probabilities(1, h, s, d);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let notes = zero_notes(&f, target);
    assert_eq!(notes.len(), 3, "{notes:?}\n{src}");
    assert!(notes.iter().all(|n| n.contains(expect)), "{notes:?}");
    let args = random_args(&f, 7);
    let cases = [
        vec![],
        vec![(2, (s - 1) * d + 1, f64::NAN), (3, 2, f64::INFINITY)],
        vec![
            (2, (s - 1) * d, f64::NEG_INFINITY),
            (1, (s - 2) * d, f64::NAN),
        ],
        vec![(0, (s / 3) * d + 1, f64::NAN)],
    ];
    for (c, at) in cases.iter().enumerate() {
        agrees(&f, target, &with(&args, at)).unwrap_or_else(|e| panic!("case {c}: {e}\n{src}"));
    }
}

/// The scores' gradient's products of `[1, h, s, d]` heads of `inp` on `target`: each of the
/// two carries a note `expect` ends, and they agree with the reference with NaN and
/// infinities placed above G's diagonal (hidden by the mask), in K's last row, Q's first row.
fn check_gradient(target: &TargetInfo, inp: &str, (h, s, d): (usize, usize, usize), expect: &str) {
    let src = score_gradient(1, h, s, d, inp);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let notes = zero_notes(&f, target);
    assert_eq!(notes.len(), 2, "{notes:?}\n{src}");
    // The TMA ring takes plain row-major operands only: `dSᵀ Q` keeps the cp.async ring.
    let each = notes.iter().all(|n| n.contains(expect));
    let some = notes.iter().any(|n| n.contains(expect));
    assert!(each || expect.contains("TMA") && some, "{notes:?}");
    let args = random_args(&f, 9);
    let cases = [
        vec![],
        vec![(0, s - 1, f64::NAN), (0, 2 * s + 5, f64::INFINITY)],
        vec![(1, (s - 1) * d + 2, f64::NAN), (2, 1, f64::NEG_INFINITY)],
        vec![(2, (s - 1) * d, f64::INFINITY)],
    ];
    for (c, at) in cases.iter().enumerate() {
        agrees(&f, target, &with(&args, at)).unwrap_or_else(|e| panic!("case {c}: {e}\n{src}"));
    }
}

const CHECKED: &str = "left out where checked at run time";

/// f32 on the CUDA cores (block tiles of `64 x 64` where `128 x 64` would leave nothing out).
#[test]
fn f32_products_leave_zero_steps_out_on_the_cuda_cores() {
    let h200 = TargetInfo::h200();
    for shape in [(2, 128, 64), (1, 100, 24), (1, 300, 32)] {
        check_probabilities(&h200, shape, CHECKED);
        check_gradient(&h200, "f32", shape, CHECKED);
    }
}

#[test]
fn bf16_products_leave_zero_steps_out_on_the_tensor_cores() {
    let h200 = TargetInfo::h200();
    for shape in [(2, 128, 64), (1, 100, 32), (1, 300, 64)] {
        check_gradient(&h200, "bf16", shape, CHECKED);
    }
    for stages in [2, 3] {
        let wg = wgmma_target((64, 64), stages);
        for shape in [(2, 128, 64), (1, 320, 64)] {
            check_gradient(&wg, "bf16", shape, CHECKED);
        }
    }
}

#[test]
fn the_tma_ring_and_a_thread_per_element_run_every_step() {
    let mut tma = wgmma_target((64, 64), 3);
    tma.gpu.as_mut().expect("a GPU").wgmma_tma = true;
    check_gradient(&tma, "bf16", (1, 128, 64), "the TMA ring runs every step");
    let mut untiled = TargetInfo::h200();
    untiled.gpu.as_mut().expect("a GPU").gemm_tiles.clear();
    check_probabilities(&untiled, (1, 40, 8), "a thread per element runs every step");
}

/// At the transformer step's shapes (`[16, 4, 128, 64]` heads, f32) the notes count the
/// stages each product may leave out.
#[test]
fn the_steps_products_count_the_stages_they_may_leave_out() {
    let h200 = TargetInfo::h200();
    let f = kiln_ir::parse_func_text(&probabilities(16, 4, 128, 64)).unwrap();
    let notes = zero_notes(&f, &h200);
    assert_eq!(
        notes,
        [
            "A zero where step - row > 0: up to 8 of 32 stages a matrix left out where checked at run time",
            "A zero where -step + row > 0: up to 8 of 32 stages a matrix left out where checked at run time",
            "B zero where -step + col > 0: up to 8 of 32 stages a matrix left out where checked at run time",
        ]
    );
}

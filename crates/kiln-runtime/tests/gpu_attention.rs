//! Attention in one launch on the emulator, by register tiles (`gpu/map/attention_tiles.rs`)
//! and a warp per query row (`gpu/map/attention.rs`), against the reference interpreter
//! under `kiln_reference::accuracy`'s bound and, tighter, within a tolerance of their own.

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{Func, Literal};
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::{AttentionTile, TargetInfo};
use kiln_runtime::gpu_emu::compile_and_run;

/// One attention: sizes `(batch, queries, keys, head, columns)`, the dtype, and how the
/// logits are made from the scores.
#[derive(Clone, Copy, Debug)]
struct Case {
    shape: (usize, usize, usize, usize, usize),
    dtype: &'static str,
    logits: Logits,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Logits {
    /// `s / 8`.
    Scaled,
    /// `s / 8`, query `i` keeping keys `j <= i`.
    Causal,
    /// `s / 8`, query `i` keeping keys `j >= i + shift`.
    Shifted(i64),
    /// `s · 0.3 + bias[b, i, j]`, the bias a fourth input.
    Bias,
    /// `s / 8`, V given transposed (`[batch, columns, keys]`).
    VTransposed,
}

impl Case {
    fn text(&self) -> String {
        let (b, m, keys, k, n2) = self.shape;
        let dt = self.dtype;
        let s = format!("{dt}[{b},{m},{keys}]");
        let i = format!("i64[{b},{m},{keys}]");
        let p = format!("pred[{b},{m},{keys}]");
        let mask = |cond: String| {
            format!(
                "  %20 = multiply %3, %5 : {s}\n  %21 = iota {{iota_dimension = 2}} : {i}\n  %22 = iota {{iota_dimension = 1}} : {i}\n{cond}  %27 = constant {{value = -inf}} : {dt}[]\n  %28 = broadcast_in_dim %27 {{broadcast_dimensions = []}} : {s}\n  %6 = select %26, %20, %28 : {s}\n"
            )
        };
        let (scale, logits, bias) = match self.logits {
            Logits::Scaled | Logits::VTransposed => {
                ("0.125", format!("  %6 = multiply %3, %5 : {s}\n"), "")
            }
            Logits::Causal => (
                "0.125",
                mask(format!(
                    "  %26 = compare %21, %22 {{comparison_direction = LE}} : {p}\n"
                )),
                "",
            ),
            Logits::Shifted(shift) => (
                "0.125",
                mask(format!(
                    "  %23 = constant {{value = {shift}}} : i64[]\n  %24 = broadcast_in_dim %23 {{broadcast_dimensions = []}} : {i}\n  %25 = add %22, %24 : {i}\n  %26 = compare %21, %25 {{comparison_direction = GE}} : {p}\n"
                )),
                "",
            ),
            Logits::Bias => (
                "0.3",
                format!("  %20 = multiply %3, %5 : {s}\n  %6 = add %20, %30 : {s}\n"),
                ", %30: BIAS",
            ),
        };
        let bias = bias.replace("BIAS", &s);
        let (v, v_keys) = if self.logits == Logits::VTransposed {
            (format!("{dt}[{b},{n2},{keys}]"), 2)
        } else {
            (format!("{dt}[{b},{keys},{n2}]"), 1)
        };
        format!(
            "func @main(%0: {dt}[{b},{m},{k}], %1: {dt}[{b},{keys},{k}], %2: {v}{bias}) -> {dt}[{b},{m},{n2}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : {s}
  %4 = constant {{value = {scale}}} : {dt}[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : {s}
{logits}  %7 = constant {{value = -inf}} : {dt}[]
  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : {dt}[{b},{m}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : {s}
  %10 = subtract %6, %9 : {s}
  %11 = exponential %10 : {s}
  %12 = constant {{value = 0.0}} : {dt}[]
  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : {dt}[{b},{m}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : {s}
  %15 = divide %11, %14 : {s}
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [{v_keys}]}} : {dt}[{b},{m},{n2}]
  return %16
}}
"
        )
    }
}

fn case(shape: (usize, usize, usize, usize, usize), logits: Logits) -> Case {
    Case {
        shape,
        dtype: "f32",
        logits,
    }
}

/// Runs `c` on the emulator for `target`: the launches it mapped to, or why it failed
/// (an emulator error, an output outside the accuracy module's bound, or further from the
/// reference's than the tolerance: `1e-4` in f32 and `1e-11` in f64 of the largest magnitude
/// of V, NaN exactly where the reference has NaN).
fn run(c: &Case, target: &TargetInfo, seed: u64) -> Result<Vec<MapKind>, String> {
    let src = c.text();
    let f: Func = kiln_ir::parse_func_text(&src).map_err(|e| format!("{e}\n{src}"))?;
    let mut rng = Rng::new(seed);
    let args: Vec<Literal> = f
        .param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect();
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(&f, &[], &opts, target, &args).map_err(|e| e.to_string())?;
    if let Some(w) = rep.fallbacks.first() {
        return Err(format!("a kernel fell back to the reference: {w}"));
    }
    kiln_reference::accuracy::check_outputs(&f, &args, &got).map_err(|e| format!("{e}\n{src}"))?;
    let want = kiln_reference::eval(&f, &args).map_err(|e| e.to_string())?;
    let (g, w) = (got[0].to_f64s(), want[0].to_f64s());
    let v_max = args[2].to_f64s().iter().fold(0.0f64, |a, x| a.max(x.abs()));
    let tol = if c.dtype == "f64" { 1e-11 } else { 1e-4 } * v_max.max(1.0);
    for (e, (x, y)) in g.iter().zip(&w).enumerate() {
        let ok = if y.is_nan() {
            x.is_nan()
        } else {
            (x - y).abs() <= tol
        };
        if !ok {
            return Err(format!(
                "element {e}: {x}, the reference {y} (tolerance {tol})"
            ));
        }
    }
    Ok(rep
        .launches
        .iter()
        .flat_map(|(&k, &n)| std::iter::repeat_n(k, n))
        .collect())
}

/// An H200 whose attention takes `tiles` (none: a warp per query row), as if kernels could
/// declare all of a block's shared memory, so that every tile fits the widest outputs.
fn with_tiles(tiles: &[AttentionTile]) -> TargetInfo {
    let mut t = TargetInfo::h200();
    let gpu = t.gpu.as_mut().expect("a GPU");
    gpu.static_shared_bytes = gpu.shared_memory_per_block;
    gpu.attention_tiles = tiles.to_vec();
    t
}

fn tile(
    rows: usize,
    keys: usize,
    thread_rows: usize,
    thread_keys: usize,
    thread_cols: usize,
) -> AttentionTile {
    AttentionTile {
        rows,
        keys,
        thread_rows,
        thread_keys,
        thread_cols,
    }
}

/// The H200's tiles and other shapes of thread tiles (row groups of 4, 8 and 16 lanes, one
/// row or several, keys per step 16 to 64), each on attention with keys that are not a
/// multiple of its step, query rows that are not a multiple of its block's, one key, head
/// dimensions 7 (staged through registers), 16, 40, 64 and 128, output columns from 1 to the
/// tile's limit, causal masks, masks that leave queries nothing in their first steps or
/// nothing at all (NaN rows), a bias read from memory and V given transposed: every one by
/// register tiles, within the tolerance of the reference.
#[test]
fn register_tiles_agree_with_the_reference() {
    let tiles = [
        tile(64, 32, 4, 4, 8),
        tile(32, 32, 2, 4, 16),
        tile(16, 32, 1, 4, 16),
        tile(32, 64, 2, 8, 8),
        tile(32, 32, 4, 2, 4),
        tile(16, 16, 2, 4, 16),
        tile(64, 32, 8, 8, 16),
    ];
    let cases = [
        case((2, 9, 40, 8, 12), Logits::Scaled),
        case((1, 70, 300, 16, 7), Logits::Scaled),
        case((1, 3, 1, 4, 20), Logits::Scaled),
        case((3, 33, 64, 32, 33), Logits::Scaled),
        case((1, 40, 70, 40, 24), Logits::Scaled),
        case((1, 20, 50, 64, 1), Logits::Scaled),
        case((1, 65, 100, 64, 64), Logits::Causal),
        case((2, 9, 40, 8, 12), Logits::Causal),
        case((1, 20, 100, 8, 12), Logits::Shifted(40)),
        case((1, 20, 100, 8, 12), Logits::Shifted(90)),
        case((2, 17, 45, 16, 9), Logits::Bias),
        case((2, 21, 77, 24, 40), Logits::VTransposed),
        case((1, 20, 50, 7, 10), Logits::Scaled),
    ];
    let mut failures = Vec::new();
    for t in tiles {
        let lanes = t.keys / t.thread_keys;
        let target = with_tiles(&[t]);
        // The widest output the tile takes, with a head of 128.
        let widest = case((1, 30, 70, 128, lanes * t.thread_cols), Logits::Causal);
        for (i, c) in cases.iter().chain([&widest]).enumerate() {
            match run(c, &target, 100 + i as u64) {
                Ok(kinds) if kinds == [MapKind::AttentionTiled] => {}
                Ok(kinds) => failures.push(format!("{t:?}, {c:?}: launches {kinds:?}")),
                Err(e) => failures.push(format!("{t:?}, {c:?}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// f64 attention by register tiles (unswizzled arrays), plain and causal.
#[test]
fn register_tiles_run_f64() {
    let target = TargetInfo::h200();
    for (i, logits) in [Logits::Scaled, Logits::Causal].into_iter().enumerate() {
        let c = Case {
            shape: (2, 37, 90, 16, 20),
            dtype: "f64",
            logits,
        };
        let kinds = run(&c, &target, 200 + i as u64).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        assert_eq!(kinds, [MapKind::AttentionTiled], "{c:?}");
    }
}

/// Where no tile fits (an output wider than every tile's columns, or no tiles at all), a
/// warp per query row takes the attention, and agrees with the reference too.
#[test]
fn a_warp_per_row_takes_what_no_tile_fits() {
    let wide = case((1, 20, 70, 16, 200), Logits::Scaled);
    let kinds = run(&wide, &TargetInfo::h200(), 300).unwrap();
    assert_eq!(kinds, [MapKind::Attention]);
    for (i, c) in [
        case((2, 9, 40, 8, 12), Logits::Causal),
        case((1, 33, 100, 64, 64), Logits::Bias),
    ]
    .iter()
    .enumerate()
    {
        let kinds =
            run(c, &with_tiles(&[]), 301 + i as u64).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        assert_eq!(kinds, [MapKind::Attention], "{c:?}");
    }
}

/// The H200 gives the pack's attention (1024 keys, heads of 64) its first tile, and smaller
/// ones to fewer queries and wider outputs: the tile the kernel's note names.
#[test]
fn the_h200_picks_its_tiles_by_queries_and_columns() {
    let target = TargetInfo::h200();
    let opts = kiln_kernel::Options::default();
    let note = |shape| {
        let f = kiln_ir::parse_func_text(&case(shape, Logits::Causal).text()).unwrap();
        let l = kiln_kernel::pipeline::lower_program(&f, &[], &opts, &target, None, &mut |_| {})
            .unwrap();
        let plan = kiln_kernel::gpu::plan::device_plan(&l, &target).unwrap();
        let text: Vec<String> = plan
            .kernel_steps()
            .flat_map(|k| k.program.launches.iter())
            .map(kiln_kernel::gpu::print::kernel_text)
            .collect();
        let text = text.join("\n");
        text.lines()
            .find(|l| l.contains("query rows"))
            .map(|l| l.trim().to_string())
            .unwrap_or(text)
    };
    for (shape, want) in [
        ((2, 1024, 1024, 64, 64), "a block of 64 query rows"),
        ((2, 1024, 1024, 64, 128), "a block of 32 query rows"),
        ((2, 1024, 1024, 128, 128), "a block of 16 query rows"),
        ((2, 20, 100, 64, 64), "a block of 32 query rows"),
        ((2, 5, 100, 64, 64), "a block of 16 query rows"),
    ] {
        let got = note(shape);
        assert!(got.contains(want), "{shape:?}: {got}");
    }
}

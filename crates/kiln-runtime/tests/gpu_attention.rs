//! Attention in one launch on the emulator, by register tiles (`gpu/map/attention_tiles.rs`)
//! and a warp per query row (`gpu/map/attention.rs`), against the reference interpreter
//! under `kiln_reference::accuracy`'s bound and, tighter, within a tolerance of their own.

use kiln_ir::Func;
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::{AttentionTile, TargetInfo};

mod attention;

use attention::{Case, Logits, inputs, run_checked, within};

fn case(shape: (usize, usize, usize, usize, usize), logits: Logits) -> Case {
    attention::case(shape, "f32", logits)
}

/// Runs `c` on the emulator for `target`: the launches it mapped to, or why it failed
/// (an emulator error, an output outside the accuracy module's bound, or further from the
/// reference's than the tolerance: `1e-4` in f32 and `1e-11` in f64 of the largest magnitude
/// of V, NaN exactly where the reference has NaN).
fn run(c: &Case, target: &TargetInfo, seed: u64) -> Result<Vec<MapKind>, String> {
    let src = c.text();
    let f: Func = kiln_ir::parse_func_text(&src).map_err(|e| format!("{e}\n{src}"))?;
    let args = inputs(&f, seed);
    let (got, kinds) = run_checked(&f, &src, target, &args)?;
    let want = kiln_reference::eval(&f, &args).map_err(|e| e.to_string())?;
    let tol = if c.dtype == "f64" { 1e-11 } else { 1e-4 };
    within(&args, &got[0], &want[0], tol)?;
    Ok(kinds)
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

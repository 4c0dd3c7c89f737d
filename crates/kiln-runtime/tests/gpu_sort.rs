//! Sorts by keys on the GPU (`kiln_kernel::gpu::sort`), run on the emulator: a launch of the
//! bitonic network per sort, for slices of two blocks' tiles the network over several launches
//! (tiles in shared memory, the cross-tile stage in global memory), and for longer slices the
//! radix sort (a count, a scan and a scatter per digit), their results bit for bit the
//! reference's (a stable sort: equal keys, zeros of both signs and NaNs keep their order), and
//! sorts by other comparators as the reference's merge sort, a thread per slice.

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{DType, Literal};
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::gpu::sort::radix;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::{EmuReport, compile_and_run};

mod planned;
use planned::planned;

/// A comparator over `operands` operands of `dtypes` ordering by operand `key`: ascending
/// `a < b` with NaN greatest (as `Tensor::sort` traces it), or descending `a > b` with NaN
/// first; `bare` leaves NaN unordered (a plain `LT`).
fn comparator(dtypes: &[DType], key: usize, descending: bool, bare: bool) -> String {
    let params: Vec<String> = dtypes
        .iter()
        .enumerate()
        .flat_map(|(k, d)| {
            [
                format!("%{}: {d}[]", 2 * k),
                format!("%{}: {d}[]", 2 * k + 1),
            ]
        })
        .collect();
    let (a, b) = (2 * key, 2 * key + 1);
    let n = 2 * dtypes.len();
    let dir = if descending { "GT" } else { "LT" };
    let body = if bare || !dtypes[key].is_float() {
        format!(
            "      %{n} = compare %{a}, %{b} {{comparison_direction = {dir}}} : pred[]\n      return %{n}\n"
        )
    } else {
        // Ascending: b is NaN and a is not; descending: a is NaN and b is not.
        let (nan, num) = if descending { (a, b) } else { (b, a) };
        format!(
            "      %{n} = compare %{a}, %{b} {{comparison_direction = {dir}}} : pred[]\n      %{} = compare %{nan}, %{nan} {{comparison_direction = NE}} : pred[]\n      %{} = compare %{num}, %{num} {{comparison_direction = EQ}} : pred[]\n      %{} = and %{}, %{} : pred[]\n      %{} = or %{n}, %{} : pred[]\n      return %{}\n",
            n + 1,
            n + 2,
            n + 3,
            n + 1,
            n + 2,
            n + 4,
            n + 3,
            n + 4
        )
    };
    format!(
        "func @cmp({}) -> pred[] {{\n{body}    }}",
        params.join(", ")
    )
}

/// `sort` of operands of `dtypes` (each of `shape`) along `dim` by operand `key`.
fn sort_text(
    dtypes: &[DType],
    shape: &[usize],
    dim: usize,
    key: usize,
    descending: bool,
    bare: bool,
) -> String {
    let dims = shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let ty = |d: &DType| format!("{d}[{dims}]");
    let params: Vec<String> = dtypes
        .iter()
        .enumerate()
        .map(|(k, d)| format!("%{k}: {}", ty(d)))
        .collect();
    let m = dtypes.len();
    let results: Vec<String> = (0..m).map(|k| format!("%{}", m + k)).collect();
    let operands: Vec<String> = (0..m).map(|k| format!("%{k}")).collect();
    let types: Vec<String> = dtypes.iter().map(ty).collect();
    format!(
        "func @main({}) -> ({}) {{\n  {} = sort {} {{dimension = {dim}, is_stable = true, comparator = {}}} : {}\n  return {}\n}}\n",
        params.join(", "),
        types.join(", "),
        results.join(", "),
        operands.join(", "),
        comparator(dtypes, key, descending, bare),
        types.join(", "),
        results.join(", ")
    )
}

/// Arguments for `f` with many equal keys (small integers), zeros of both signs, and with
/// `specials`, infinities and NaNs.
fn args(f: &kiln_ir::Func, seed: u64, specials: f64) -> Vec<Literal> {
    let mut rng = Rng::new(seed);
    f.param_types()
        .iter()
        .map(|t| {
            let l = random_literal_with_specials(&mut rng, t, specials);
            if t.dtype.is_float() && seed.is_multiple_of(2) {
                // Few distinct keys, so that equal keys meet.
                let v: Vec<f64> = l
                    .to_f64s()
                    .iter()
                    .map(|x| (x * 2.0).round() / 2.0)
                    .collect();
                Literal::from_f64s(t.clone(), &v).unwrap()
            } else {
                l
            }
        })
        .collect()
}

/// Runs `src` on the emulated H200 and compares it with the reference bit for bit; returns
/// the launches of the sort mapping.
fn run(src: &str, seed: u64, specials: f64) -> usize {
    let rep = run_on(src, seed, specials, &TargetInfo::h200());
    rep.launches.get(&MapKind::Sort).copied().unwrap_or(0)
}

/// Runs `src` on the emulated `target` and compares it with the reference bit for bit;
/// returns what ran where.
fn run_on(src: &str, seed: u64, specials: f64, target: &TargetInfo) -> EmuReport {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let a = args(&f, seed, specials);
    let opts = kiln_kernel::Options::default();
    let (got, rep) =
        compile_and_run(&f, &[], &opts, target, &a).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let want = kiln_reference::eval(&f, &a).unwrap();
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_le_bytes(),
            w.to_le_bytes(),
            "output {k} differs from the reference's (seed {seed})\n{src}\ngot  {g}\nwant {w}"
        );
    }
    rep
}

/// A sort: its operands' dtypes and shape, its dimension, key operand, and whether descending.
type Case = (&'static [DType], &'static [usize], usize, usize, bool);

#[test]
fn sorts_by_keys_run_on_the_gpu_and_match_the_reference_bit_for_bit() {
    let cases: &[Case] = &[
        (&[DType::F32], &[37], 0, 0, false),
        (&[DType::F32, DType::I32], &[3, 37], 1, 0, false),
        (&[DType::F32, DType::I32], &[3, 37], 1, 0, true),
        (&[DType::I32, DType::F32], &[40, 5], 0, 1, true),
        (&[DType::F64, DType::F16], &[2, 9, 3], 1, 0, false),
        (&[DType::BF16], &[4, 64], 1, 0, true),
        (&[DType::F16, DType::I64], &[130], 0, 0, false),
        (&[DType::I32, DType::U8], &[5, 33], 1, 0, false),
        (&[DType::U32, DType::F32], &[2, 17], 1, 0, true),
        (&[DType::I64], &[300], 0, 0, true),
        (&[DType::U64, DType::I16], &[64, 2], 0, 0, false),
        (&[DType::I8], &[2, 2], 1, 0, false),
    ];
    for (k, &(dtypes, shape, dim, key, descending)) in cases.iter().enumerate() {
        let src = sort_text(dtypes, shape, dim, key, descending, false);
        for seed in 0..3u64 {
            let specials = if seed == 1 { 0.25 } else { 0.0 };
            let launches = run(&src, 100 * k as u64 + seed, specials);
            assert_eq!(launches, 1, "the sort did not run on the GPU:\n{src}");
        }
    }
}

/// A bare `LT` on float keys leaves a NaN unordered (the reference's merge sort gives the
/// order), and a comparator that is more than one key's order is no sort by keys: both run
/// the reference's merge sort on the GPU (`gpu::sort::merge`, one launch), bit for bit.
#[test]
fn sorts_by_other_comparators_run_the_merge_sort_on_the_gpu() {
    let bare = sort_text(&[DType::F32], &[20], 0, 0, false, true);
    assert_eq!(run(&bare, 1, 0.25), 1);
    let two_keys = "func @main(%0: f32[12], %1: i32[12]) -> (f32[12], i32[12]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @cmp(%0: f32[], %1: f32[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = compare %2, %3 {comparison_direction = LT} : pred[]\n      %5 = compare %0, %1 {comparison_direction = LT} : pred[]\n      %6 = or %4, %5 : pred[]\n      return %6\n    }} : f32[12], i32[12]\n  return %2, %3\n}\n";
    assert_eq!(run(two_keys, 2, 0.0), 1);
}

/// An H200 whose blocks declare `bytes` of shared memory: tiles of a long sort short enough
/// that slices of a few hundred keys take several global passes.
fn small_blocks(bytes: usize) -> TargetInfo {
    let mut t = TargetInfo::h200();
    t.gpu.as_mut().expect("a GPU").static_shared_bytes = bytes;
    t
}

/// The launches of the long sort of slices of `n` keys padded to `p` in tiles of `t`: one for
/// the tiles, then for each run `k = 2t, ..., p` a global stage per `j = k/2, ..., t` and one
/// within tiles.
fn long_launches(n: usize, t: usize) -> usize {
    let p = n.next_power_of_two();
    let mut launches = 1;
    let mut k = 2 * t;
    while k <= p {
        launches += (k / t).trailing_zeros() as usize + 1;
        k *= 2;
    }
    launches
}

/// The launches of the long sort of slices of `n` keys of `key` in tiles of `t` on `target`:
/// the network over two tiles ([`long_launches`]) where the slice pads to two tiles, else the
/// radix sort's three a digit.
fn launches_of(key: DType, n: usize, t: usize, target: &TargetInfo) -> usize {
    if n.next_power_of_two() <= 2 * t {
        long_launches(n, t)
    } else {
        radix::launches(key, target.gpu.as_ref().expect("a GPU")).expect("a radix sort")
    }
}

/// Slices longer than a block's shared memory holds run on the GPU (several launches, nothing
/// on the host) and match the reference bit for bit: odd lengths and lengths just past a
/// tile, several slices along inner and outer dimensions, duplicates, NaNs and zeros of both
/// signs, descending, every key dtype, payloads of other dtypes. Blocks of 768 bytes hold 64
/// f32 keys with their positions (32 of f64), and give the radix sort 32 threads and 2-bit
/// digits, so slices of a few hundred keys take many passes over several chunks (the
/// radix sort's tiles are 512 elements); slices of two tiles run the network.
#[test]
fn long_sorts_run_on_the_gpu_and_match_the_reference_bit_for_bit() {
    let target = small_blocks(768);
    // Dtypes, shape, dimension, key operand, descending, and the tile.
    let cases: &[(Case, usize)] = &[
        ((&[DType::F32], &[65], 0, 0, false), 64),
        ((&[DType::F32, DType::I32], &[1000], 0, 0, false), 64),
        ((&[DType::F32, DType::I32], &[3, 257], 1, 0, true), 64),
        ((&[DType::I32, DType::F32], &[300, 2], 0, 1, false), 64),
        ((&[DType::F64, DType::F16], &[2, 129, 3], 1, 0, false), 32),
        ((&[DType::BF16], &[2, 200], 1, 0, true), 64),
        ((&[DType::F16, DType::I64], &[513], 0, 0, false), 64),
        ((&[DType::F16], &[2, 700], 1, 0, true), 64),
        ((&[DType::I64], &[130], 0, 0, true), 32),
        ((&[DType::U8, DType::F32], &[2, 190], 1, 0, false), 64),
        ((&[DType::I8, DType::BF16], &[150], 0, 0, true), 64),
        ((&[DType::U64, DType::I16], &[97, 2], 0, 0, false), 32),
        ((&[DType::I16, DType::U32], &[3, 70], 1, 0, true), 64),
        ((&[DType::I16, DType::U32], &[1100], 0, 0, false), 64),
        ((&[DType::U32, DType::F64], &[2, 600], 1, 0, true), 64),
        ((&[DType::U16], &[1030, 2], 0, 0, true), 64),
        ((&[DType::I32], &[2, 1537], 1, 0, true), 64),
    ];
    for (k, &((dtypes, shape, dim, key, descending), tile)) in cases.iter().enumerate() {
        let src = sort_text(dtypes, shape, dim, key, descending, false);
        for seed in 0..3u64 {
            let specials = if seed == 1 { 0.25 } else { 0.0 };
            let rep = run_on(&src, 100 * k as u64 + seed, specials, &target);
            assert_eq!(
                rep.launches.get(&MapKind::Sort).copied(),
                Some(launches_of(dtypes[key], shape[dim], tile, &target)),
                "{rep:?}\n{src}"
            );
            assert!(
                rep.fallbacks.is_empty() && rep.interpreted == 0,
                "the long sort left work to the host: {rep:?}\n{src}"
            );
        }
    }
}

/// On the H200 itself, slices of more than two tiles (of 4,096 f32, f16 or bf16 keys, 2,048 f64)
/// run the radix sort (128 threads, 6-bit digits, tiles of 2,048
/// elements, several chunks a slice), with nothing left to the host, and match the reference
/// bit for bit.
#[test]
fn long_slices_radix_sort_on_the_h200() {
    let h200 = TargetInfo::h200();
    let cases: &[Case] = &[
        (&[DType::F32, DType::I32], &[12_293], 0, 0, false),
        (&[DType::F32], &[2, 8_195], 1, 0, true),
        (&[DType::F16, DType::U8], &[8_200], 0, 0, true),
        (&[DType::BF16], &[3, 8_193], 1, 0, false),
        (&[DType::F64, DType::I64], &[8_193, 1], 0, 0, false),
    ];
    for (k, &(dtypes, shape, dim, key, descending)) in cases.iter().enumerate() {
        let src = sort_text(dtypes, shape, dim, key, descending, false);
        let rep = run_on(&src, 31 + k as u64, 0.05, &h200);
        assert_eq!(
            rep.launches.get(&MapKind::Sort).copied(),
            radix::launches(dtypes[key], h200.gpu.as_ref().unwrap()),
            "{rep:?}\n{src}"
        );
        assert!(rep.fallbacks.is_empty() && rep.interpreted == 0, "{rep:?}");
    }
}

/// On the H200 itself: slices just past the longest a block sorts (4,096 f32 keys, 2,048 f64)
/// run in tiles on the GPU, with nothing left to the host.
#[test]
fn slices_just_past_a_block_sort_in_tiles_on_the_h200() {
    let cases: &[(Case, usize)] = &[
        ((&[DType::F32], &[4097], 0, 0, false), 4096),
        ((&[DType::F64, DType::I32], &[2, 2049], 1, 0, true), 2048),
    ];
    for (k, &((dtypes, shape, dim, key, descending), tile)) in cases.iter().enumerate() {
        let src = sort_text(dtypes, shape, dim, key, descending, false);
        let rep = run_on(&src, 7 + k as u64, 0.05, &TargetInfo::h200());
        assert_eq!(
            rep.launches.get(&MapKind::Sort).copied(),
            Some(long_launches(shape[dim], tile)),
            "{rep:?}\n{src}"
        );
        assert!(rep.fallbacks.is_empty() && rep.interpreted == 0, "{rep:?}");
    }
}

/// A radix sort's launches read from one pair of scratch buffers and write the other (no
/// launch writes what it reads), its scratch holding every slice's mapped keys and positions
/// twice, then the counts and the offsets; the count and scatter launches' shared counters
/// fit what a block declares.
#[test]
fn a_radix_sort_ping_pongs_between_scratch_buffers() {
    let src = sort_text(&[DType::F32, DType::I32], &[3, 300], 1, 0, false, false);
    let f = kiln_ir::parse_func_text(&src).unwrap();
    let target = small_blocks(768);
    let plan = planned(&f, &target).unwrap();
    let steps: Vec<_> = plan.kernel_steps().collect();
    assert_eq!(steps.len(), 1);
    let p = &steps[0].program;
    let gpu = target.gpu.as_ref().unwrap();
    assert_eq!(Some(p.launches.len()), radix::launches(DType::F32, gpu));
    let dims: Vec<(DType, Vec<usize>)> = p
        .scratch
        .iter()
        .map(|t| (t.dtype, t.shape.to_vec()))
        .collect();
    assert_eq!(
        dims[..4],
        [DType::U32, DType::I32, DType::U32, DType::I32].map(|d| (d, vec![3 * 300]))
    );
    // One chunk of 2-bit digits a slice: 4 counts each.
    assert_eq!(dims[4..], [(DType::I64, vec![12]), (DType::I64, vec![12])]);
    for launch in &p.launches {
        assert!(
            launch.shared_bytes() <= gpu.shared_limit(),
            "{}",
            launch.name
        );
        for (b, _) in &launch.outputs {
            assert!(
                !launch.inputs.iter().any(|(i, _)| i == b),
                "{} reads what it writes ({b})",
                launch.name
            );
        }
    }
    assert_eq!(steps[0].scratch.len(), 6);
}

/// `sort_text`'s sort with every result sliced to its first `k` along `dim` (what
/// `Tensor::topk` traces): only those elements are read, so the sort runs as a top-k.
fn top_k_text(
    dtypes: &[DType],
    shape: &[usize],
    dim: usize,
    key: usize,
    descending: bool,
    k: usize,
) -> String {
    let sort = sort_text(dtypes, shape, dim, key, descending, false);
    let m = dtypes.len();
    let mut head = shape.to_vec();
    head[dim] = k;
    let dims = |s: &[usize]| {
        s.iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let zeros = dims(&vec![0; shape.len()]);
    let ones = dims(&vec![1; shape.len()]);
    let slices: String = dtypes
        .iter()
        .enumerate()
        .map(|(j, d)| {
            format!(
                "  %{} = slice %{} {{start_indices = [{zeros}], limit_indices = [{}], strides = [{ones}]}} : {d}[{}]\n",
                1000 + j,
                m + j,
                dims(&head),
                dims(&head).replace(' ', "")
            )
        })
        .collect();
    let types: Vec<String> = dtypes
        .iter()
        .map(|d| format!("{d}[{}]", dims(&head).replace(' ', "")))
        .collect();
    // Past the comparator's values (one numbering for the whole function).
    let results: Vec<String> = (0..m).map(|j| format!("%{}", 1000 + j)).collect();
    let (signature, rest) = sort.split_once(" -> (").expect("a signature");
    let body = rest.split_once(") {\n").expect("a body").1;
    let (sort_line, _) = body.rsplit_once("  return").expect("a return");
    format!(
        "{signature} -> ({}) {{\n{sort_line}{slices}  return {}\n}}\n",
        types.join(", "),
        results.join(", ")
    )
}

/// A sort whose users read only the first `k` elements of each slice longer than a block
/// sorts runs as a top-k on the GPU: two launches (each tile's leading `k`, then the
/// candidates' network), nothing on the host, the `k` elements bit for bit the reference's
/// stable sort's (equal keys, NaNs and zeros of both signs keep their order; payloads of other
/// dtypes; slices along inner and outer dimensions; partial last tiles). Without it the slices
/// sort whole (the long network or the radix sort: more launches).
#[test]
fn leading_elements_of_long_slices_run_as_a_top_k_on_the_gpu() {
    let target = small_blocks(768);
    // Dtypes, shape, dimension, key operand, descending, k; tiles of 64 f32 keys, 32 f64.
    let cases: &[(Case, usize)] = &[
        ((&[DType::F32], &[1000], 0, 0, false), 3),
        ((&[DType::F32, DType::I32], &[3, 257], 1, 0, true), 12),
        ((&[DType::I32, DType::F32], &[300, 2], 0, 1, false), 5),
        ((&[DType::F64, DType::F16], &[2, 129, 3], 1, 0, false), 6),
        ((&[DType::I64, DType::U8], &[2, 70], 1, 0, true), 1),
        ((&[DType::BF16], &[2, 200], 1, 0, true), 16),
    ];
    for (c, &((dtypes, shape, dim, key, descending), k)) in cases.iter().enumerate() {
        let src = top_k_text(dtypes, shape, dim, key, descending, k);
        for seed in 0..3u64 {
            let specials = if seed == 1 { 0.25 } else { 0.0 };
            let rep = run_on(&src, 500 + 10 * c as u64 + seed, specials, &target);
            assert_eq!(
                rep.launches.get(&MapKind::Sort).copied(),
                Some(2),
                "{rep:?}\n{src}"
            );
            assert!(
                rep.fallbacks.is_empty() && rep.interpreted == 0,
                "the top-k left work to the host: {rep:?}\n{src}"
            );
        }
    }
    // On the H200 itself: tiles of 4,096 f32 keys.
    let src = top_k_text(&[DType::F32, DType::I32], &[2, 9000], 1, 0, true, 5);
    let rep = run_on(&src, 77, 0.05, &TargetInfo::h200());
    assert_eq!(
        rep.launches.get(&MapKind::Sort).copied(),
        Some(2),
        "{rep:?}"
    );
    assert!(rep.fallbacks.is_empty() && rep.interpreted == 0, "{rep:?}");
}

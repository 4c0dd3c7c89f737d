//! Sorts by keys on the GPU (`kiln_kernel::gpu::sort`), run on the emulator: a launch of the
//! bitonic network per sort, its results bit for bit the reference's (a stable sort: equal
//! keys, zeros of both signs and NaNs keep their order), and the sorts the GPU does not take
//! left to the host.

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{DType, Literal};
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;
use kiln_runtime::gpu_emu::compile_and_run;

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
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let a = args(&f, seed, specials);
    let opts = kiln_kernel::Options::default();
    let (got, rep) = compile_and_run(&f, &[], &opts, &TargetInfo::h200(), &a)
        .unwrap_or_else(|e| panic!("{e}\n{src}"));
    let want = kiln_reference::eval(&f, &a).unwrap();
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_le_bytes(),
            w.to_le_bytes(),
            "output {k} differs from the reference's (seed {seed})\n{src}\ngot  {g}\nwant {w}"
        );
    }
    rep.launches.get(&MapKind::Sort).copied().unwrap_or(0)
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

/// A bare `LT` on float keys leaves a NaN unordered (the host's merge sort gives the order),
/// and a comparator that is more than one key's order runs on the host; so do slices too long
/// for a block's shared memory. Their results still match.
#[test]
fn sorts_the_gpu_does_not_take_run_on_the_host() {
    let bare = sort_text(&[DType::F32], &[20], 0, 0, false, true);
    assert_eq!(run(&bare, 1, 0.25), 0);
    let two_keys = "func @main(%0: f32[12], %1: i32[12]) -> (f32[12], i32[12]) {\n  %2, %3 = sort %0, %1 {dimension = 0, is_stable = true, comparator = func @cmp(%0: f32[], %1: f32[], %2: i32[], %3: i32[]) -> pred[] {\n      %4 = compare %2, %3 {comparison_direction = LT} : pred[]\n      %5 = compare %0, %1 {comparison_direction = LT} : pred[]\n      %6 = or %4, %5 : pred[]\n      return %6\n    }} : f32[12], i32[12]\n  return %2, %3\n}\n";
    assert_eq!(run(two_keys, 2, 0.0), 0);
    let long = sort_text(&[DType::F64], &[20000], 0, 0, false, false);
    let f = kiln_ir::parse_func_text(&long).unwrap();
    let l = kiln_kernel::pipeline::lower_program(
        &f,
        &[],
        &kiln_kernel::Options::default(),
        &TargetInfo::h200(),
        None,
        &mut |_| {},
    )
    .unwrap();
    let plan = kiln_kernel::gpu::plan::device_plan(&l, &TargetInfo::h200()).unwrap();
    assert!(
        plan.steps
            .iter()
            .all(|s| matches!(s, kiln_kernel::gpu::plan::DeviceStep::Host(_))),
        "a slice of 20,000 f64 keys (16 bytes a pair, 32,768 padded) does not fit 48 KiB"
    );
}

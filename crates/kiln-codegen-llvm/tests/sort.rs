//! `sort` on the CPU backend against the reference interpreter, bit for bit: key comparators
//! (a radix sort on the host: ascending, descending, NaN greatest, keys of every width, a
//! payload, along inner and outer dimensions, short and long slices), a bare `LT` meeting NaNs,
//! and a comparator that is no key comparison (a compiled region in a merge sort).

use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
use kiln_ir::{DType, Literal, TensorType, parse_func_text};

/// The comparator bodies, over parameters `%0, %1` (keys) and `%2, %3` (payload).
const BODIES: &[(&str, &str)] = &[
    (
        "lt",
        "%4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      return %4",
    ),
    (
        "gt",
        "%4 = compare %0, %1 {comparison_direction = GT} : pred[]\n      return %4",
    ),
    (
        "swapped",
        "%4 = compare %1, %0 {comparison_direction = LT} : pred[]\n      return %4",
    ),
    (
        "nan_last",
        "%4 = compare %0, %1 {comparison_direction = LT} : pred[]\n      %5 = compare %1, %1 {comparison_direction = NE} : pred[]\n      %6 = compare %0, %0 {comparison_direction = EQ} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8",
    ),
    (
        "nan_first_desc",
        "%4 = compare %0, %1 {comparison_direction = GT} : pred[]\n      %5 = compare %0, %0 {comparison_direction = NE} : pred[]\n      %6 = compare %1, %1 {comparison_direction = EQ} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8",
    ),
    (
        "by_payload_then_key",
        "%4 = compare %2, %3 {comparison_direction = LT} : pred[]\n      %5 = compare %2, %3 {comparison_direction = EQ} : pred[]\n      %6 = compare %0, %1 {comparison_direction = GT} : pred[]\n      %7 = and %5, %6 : pred[]\n      %8 = or %4, %7 : pred[]\n      return %8",
    ),
];

fn program(dtype: DType, shape: &[usize], dimension: usize, body: &str) -> String {
    let t = TensorType::new(dtype, shape.to_vec()).to_string();
    let p = TensorType::new(DType::I32, shape.to_vec()).to_string();
    format!(
        "func @main(%0: {t}, %1: {p}) -> ({t}, {p}) {{
  %2, %3 = sort %0, %1 {{dimension = {dimension}, is_stable = true, comparator = func @c(%0: {dtype}[], %1: {dtype}[], %2: i32[], %3: i32[]) -> pred[] {{
      {body}
    }}}} : {t}, {p}
  return %2, %3
}}
"
    )
}

/// Keys with many ties, both zeros, infinities and (`nans`) NaNs; a payload counting up.
fn args(dtype: DType, shape: &[usize], nans: bool, seed: u64) -> [Literal; 2] {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 33) as i64
    };
    let keys: Vec<f64> = (0..n)
        .map(|_| {
            let r = next();
            if dtype.is_float() {
                match r % 23 {
                    0 if nans => f64::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    3 => f64::INFINITY,
                    4 => f64::NEG_INFINITY,
                    _ => ((r % 41) - 20) as f64 * 0.375,
                }
            } else if dtype == DType::U32 || dtype == DType::U8 {
                (r % 200) as f64
            } else {
                ((r % 200) - 100) as f64
            }
        })
        .collect();
    let ty = TensorType::new(dtype, shape.to_vec());
    let keys = Literal::from_f64s(ty, &keys).unwrap();
    let payload: Vec<i32> = (0..n as i32).collect();
    [keys, Literal::i32(shape.to_vec(), payload).unwrap()]
}

fn check(dtype: DType, shape: &[usize], dimension: usize, body: (&str, &str), nans: bool) {
    let text = program(dtype, shape, dimension, body.1);
    let f = parse_func_text(&text).unwrap();
    let exe = CpuExecutable::compile(&f).unwrap();
    assert!(exe.plan().contains(&Step::Control), "{:?}", exe.plan());
    let args = args(dtype, shape, nans, shape.iter().product::<usize>() as u64);
    let got = exe.run(&args).unwrap();
    let want = kiln_reference::eval(&f, &args).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g.to_le_bytes(),
            w.to_le_bytes(),
            "{} {dtype:?} {shape:?} along {dimension}, nans {nans}",
            body.0
        );
    }
}

#[test]
fn key_sorts_agree_with_the_reference_bit_for_bit() {
    for &dtype in &[
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::BF16,
    ] {
        for shape in [
            vec![5],
            vec![63],
            vec![64],
            vec![1000],
            vec![7, 300],
            vec![300, 7],
        ] {
            for dimension in 0..shape.len() {
                for &body in &BODIES[..5] {
                    let nan_aware = body.0.starts_with("nan");
                    check(
                        dtype,
                        &shape,
                        dimension,
                        body,
                        dtype.is_float() && nan_aware,
                    );
                }
            }
        }
    }
}

#[test]
fn a_bare_lt_meeting_nans_gives_the_references_permutation() {
    for shape in [vec![10], vec![500], vec![9, 70]] {
        for dimension in 0..shape.len() {
            check(DType::F32, &shape, dimension, BODIES[0], true);
            check(DType::F64, &shape, dimension, BODIES[1], true);
        }
    }
}

#[test]
fn any_comparator_runs_as_a_compiled_region() {
    for shape in [vec![3], vec![200], vec![20, 30]] {
        for dimension in 0..shape.len() {
            check(DType::F32, &shape, dimension, BODIES[5], true);
            check(DType::I32, &shape, dimension, BODIES[5], false);
        }
    }
}

#[test]
fn one_f32_operand_sorts_by_its_own_keys() {
    // One operand, no payload: the keys themselves are sorted and turned back.
    for n in [1usize, 70, 5000] {
        for (name, dir) in [("lt", "LT"), ("gt", "GT")] {
            let text = format!(
                "func @main(%0: f32[{n}]) -> f32[{n}] {{
  %1 = sort %0 {{dimension = 0, is_stable = false, comparator = func @c(%0: f32[], %1: f32[]) -> pred[] {{
      %2 = compare %0, %1 {{comparison_direction = {dir}}} : pred[]
      return %2
    }}}} : f32[{n}]
  return %1
}}
"
            );
            let f = parse_func_text(&text).unwrap();
            let exe = CpuExecutable::compile(&f).unwrap();
            // No -0 (it would tie with +0 and need the permutation): values with ties.
            let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 97) as f32 - 48.5).collect();
            let x = Literal::f32([n], v).unwrap();
            let got = exe.run(std::slice::from_ref(&x)).unwrap();
            let want = kiln_reference::eval(&f, std::slice::from_ref(&x)).unwrap();
            assert_eq!(got[0].to_le_bytes(), want[0].to_le_bytes(), "{name} {n}");
        }
    }
}

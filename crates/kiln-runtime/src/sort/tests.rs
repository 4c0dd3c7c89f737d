//! The runtime's sort by keys on slices long enough for the parallel radix sort (and just too
//! short for it) against the reference interpreter's merge sort with the comparator's order
//! written out: every key dtype, ascending and descending, ties, -0 beside +0, NaN counted
//! greatest, a payload, several slices, and slices along an outer dimension.

use super::*;
use crate::radix::PARALLEL_MIN;
use kiln_ir::DType;

/// The lengths around the parallel sort's threshold.
const LENGTHS: [usize; 2] = [PARALLEL_MIN - 1, PARALLEL_MIN + 17];

/// Keys of one kind: `wide` spreads over many magnitudes (the top digit splits them, see
/// [`crate::radix`]); otherwise few values with many ties (every digit a pass over all).
/// `zeros` puts -0 beside +0, `nans` NaNs.
fn keys(dtype: DType, n: usize, seed: u64, wide: bool, zeros: bool, nans: bool) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (s >> 24) as i64;
            let float = dtype.is_float();
            match r % 31 {
                0 if float && zeros => -0.0,
                1 if float && zeros => 0.0,
                2 if float && nans => f64::NAN,
                3 if float => f64::INFINITY,
                _ if !float && !wide => {
                    ((r >> 8) % 200 - if dtype == DType::U32 { 0 } else { 100 }) as f64
                }
                _ if !float => {
                    let v = (r >> 5) % (1 << 31);
                    if dtype == DType::U32 || r % 2 == 0 {
                        v as f64
                    } else {
                        -v as f64
                    }
                }
                _ if wide => {
                    let m = ((r >> 8) % 1_000_000) as f64 / 1_000_000.0 - 0.5;
                    m * 2f64.powi(((r >> 3) % 40 - 20) as i32)
                }
                _ => ((r >> 8) % 41 - 20) as f64 * 0.375,
            }
        })
        .collect()
}

/// The comparator's order on the keys' values: `a` before `b`.
fn less(v: &[f64], descending: bool, nan_greatest: bool) -> impl FnMut(usize, usize) -> bool {
    move |a, b| {
        let (p, q) = if descending {
            (v[b], v[a])
        } else {
            (v[a], v[b])
        };
        p < q || (nan_greatest && q.is_nan() && !p.is_nan())
    }
}

/// Sorts `x` along `dimension` by operand 0 with the runtime and with the reference's merge
/// sort, and checks every result bit for bit.
fn check(x: &[Literal], dimension: usize, descending: bool, nan_greatest: bool, what: &str) {
    let refs: Vec<&Literal> = x.iter().collect();
    let plan = SortPlan::Keys {
        operand: 0,
        descending,
        nan_greatest,
    };
    let got = sort(&refs, dimension, plan, None, None).expect("a sort by keys");
    let v = x[0].to_f64s();
    let perm = kiln_reference::sort_permutation(
        x[0].shape(),
        dimension,
        &mut less(&v, descending, nan_greatest),
    );
    for (i, (g, l)) in got.iter().zip(x).enumerate() {
        let want = kiln_reference::take_positions(l, l.ty(), &perm);
        assert!(
            g.to_le_bytes() == want.to_le_bytes(),
            "{what}: operand {i}, descending {descending}"
        );
    }
}

fn literal(dtype: DType, shape: &[usize], v: &[f64]) -> Literal {
    Literal::from_f64s(TensorType::new(dtype, shape.to_vec()), v).expect("values of the dtype")
}

#[test]
fn one_long_f32_slice_sorts_by_its_own_keys() {
    // The keys made in the first pass and undone in the last; with a -0 or a NaN the radix
    // sort declines and the permutation moves the elements.
    for n in LENGTHS {
        for (wide, zeros, nans) in [
            (true, false, false),
            (false, false, false),
            (true, true, false),
            (false, false, true),
        ] {
            let v = keys(DType::F32, n, n as u64, wide, zeros, nans);
            let x = [literal(DType::F32, &[n], &v)];
            for descending in [false, true] {
                let what = format!("f32 [{n}], wide {wide}, zeros {zeros}, nans {nans}");
                check(&x, 0, descending, true, &what);
            }
        }
    }
}

#[test]
fn long_slices_of_every_key_dtype_carry_a_payload() {
    for dtype in [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::I8,
    ] {
        for n in LENGTHS {
            // Wide keys overflow i8.
            for wide in [dtype != DType::I8, false] {
                let v = keys(dtype, n, 7 + n as u64, wide, true, true);
                let payload: Vec<f64> = (0..n).map(|i| i as f64).collect();
                let x = [
                    literal(dtype, &[n], &v),
                    literal(DType::I32, &[n], &payload),
                ];
                for descending in [false, true] {
                    check(
                        &x,
                        0,
                        descending,
                        true,
                        &format!("{dtype:?} [{n}], wide {wide}"),
                    );
                }
            }
        }
    }
}

#[test]
fn several_long_slices_sort_each_along_either_dimension() {
    let n = PARALLEL_MIN + 3;
    let v = keys(DType::F32, 2 * n, 11, true, false, false);
    // Two rows of one operand: each row's keys sorted and turned back.
    check(
        &[literal(DType::F32, &[2, n], &v)],
        1,
        false,
        true,
        "f32 [2, n] along 1",
    );
    // Two columns, with a payload: strided slices.
    let payload: Vec<f64> = (0..2 * n).map(|i| i as f64).collect();
    let x = [
        literal(DType::F32, &[n, 2], &v),
        literal(DType::I32, &[n, 2], &payload),
    ];
    check(&x, 0, true, true, "f32 [n, 2] along 0");
}

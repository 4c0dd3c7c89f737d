//! The top-k against the reference interpreter's whole stable sort (its merge sort with the
//! comparator's order written out): each result slice's first `k` bit for bit, the rest zeros,
//! for every key dtype, both directions, ties, -0 beside +0, NaN, infinities, payloads, slices
//! along an inner and an outer dimension, and inputs that make every element a candidate.

use super::super::Slices;
use super::top_k;
use kiln_ir::{DType, Literal, TensorType};

/// `n` keys of `dtype`: many ties, -0 and +0, NaN and infinities (floats), the extremes of
/// the integer range.
fn keys(dtype: DType, n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    let (lo, hi) = match dtype {
        DType::Pred => (0.0, 1.0),
        DType::I8 => (-128.0, 127.0),
        DType::U8 => (0.0, 255.0),
        DType::U32 => (0.0, 4294967295.0),
        DType::I32 => (-2147483648.0, 2147483647.0),
        DType::I64 => (-4e18, 4e18),
        _ => (-1e30, 1e30),
    };
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (s >> 24) as i64;
            let float = dtype.is_float();
            let v = match r % 23 {
                0 if float => -0.0,
                1 if float => 0.0,
                2 if float => f64::NAN,
                3 if float => f64::INFINITY,
                4 if float => f64::NEG_INFINITY,
                5 => lo,
                6 => hi,
                _ if dtype == DType::Pred => (r >> 7) as f64 % 2.0,
                _ => ((r >> 8) % 61 - if lo < 0.0 { 30 } else { 0 }) as f64 * 0.5,
            };
            if float { v } else { v.trunc().clamp(lo, hi) }
        })
        .collect()
}

fn literal(dtype: DType, shape: &[usize], v: &[f64]) -> Literal {
    Literal::from_f64s(TensorType::new(dtype, shape.to_vec()), v).expect("values of the dtype")
}

/// The top-k of `x` along `dimension` by operand 0 against the reference's whole sort.
fn check(x: &[Literal], dimension: usize, k: usize, descending: bool, what: &str) {
    let refs: Vec<&Literal> = x.iter().collect();
    let shape = x[0].shape().to_vec();
    let sl = Slices::new(&shape, dimension);
    let got = top_k(&refs, &sl, k, 0, descending, true).expect("ordered keys");
    let v = x[0].to_f64s();
    let perm = kiln_reference::sort_permutation(&shape, dimension, &mut |a, b| {
        let (p, q) = if descending {
            (v[b], v[a])
        } else {
            (v[a], v[b])
        };
        p < q || (q.is_nan() && !p.is_nan())
    });
    for (o, (g, l)) in got.iter().zip(x).enumerate() {
        assert_eq!(g.ty(), l.ty(), "{what}: operand {o}'s type");
        let want = kiln_reference::take_positions(l, l.ty(), &perm);
        let zero = Literal::zeros(l.ty().clone());
        let (g, want, zero) = (g.to_le_bytes(), want.to_le_bytes(), zero.to_le_bytes());
        let size = g.len() / l.numel().max(1);
        for s in 0..sl.count {
            for i in 0..sl.len {
                let p = sl.position(s, i) * size;
                let expect = if i < k { &want } else { &zero };
                assert_eq!(
                    g[p..p + size],
                    expect[p..p + size],
                    "{what}: operand {o}, slice {s}, position {i}, k {k}, descending {descending}"
                );
            }
        }
    }
}

#[test]
fn the_first_k_of_every_key_dtype_are_the_whole_stable_sorts() {
    for (seed, dtype) in [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::I8,
        DType::U8,
        DType::Pred,
    ]
    .into_iter()
    .enumerate()
    {
        let n = 700;
        let v = keys(dtype, 3 * n, 5 + seed as u64);
        let payload: Vec<f64> = (0..3 * n).map(|i| (i % n) as f64).collect();
        let rows = [
            literal(dtype, &[3, n], &v),
            literal(DType::I32, &[3, n], &payload),
            literal(DType::F64, &[3, n], &v),
        ];
        let columns = [
            literal(dtype, &[n, 3], &v),
            literal(DType::I32, &[n, 3], &payload),
        ];
        for k in [1, 2, 5, 64, 87, 300, n] {
            for descending in [false, true] {
                check(
                    &rows,
                    1,
                    k,
                    descending,
                    &format!("{dtype:?} [3, {n}] along 1"),
                );
                check(
                    &columns,
                    0,
                    k,
                    descending,
                    &format!("{dtype:?} [{n}, 3] along 0"),
                );
            }
        }
    }
}

#[test]
fn every_element_a_candidate_and_every_key_equal() {
    // Ascending keys taken greatest first (and the reverse): each element beats the bar, so
    // the candidates are cut back again and again; equal keys: the first positions win.
    let n = 5000;
    let up: Vec<f64> = (0..n).map(|i| i as f64 * 0.25 - 300.0).collect();
    let down: Vec<f64> = up.iter().rev().copied().collect();
    let same = vec![1.5; n];
    for (v, what) in [(&up, "ascending"), (&down, "descending"), (&same, "equal")] {
        let pos: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let x = [
            literal(DType::F32, &[n], v),
            literal(DType::I32, &[n], &pos),
        ];
        for k in [1, 3, 255, 256, 257, 600] {
            for descending in [false, true] {
                check(&x, 0, k, descending, what);
            }
        }
    }
}

#[test]
fn unordered_keys_decline() {
    // A NaN under a bare `LT` orders against nothing, and complex numbers have no order: the
    // whole sort's comparisons decide.
    let x = literal(DType::F32, &[100], &keys(DType::F32, 100, 3));
    let sl = Slices::new(&[100], 0);
    assert!(top_k(&[&x], &sl, 5, 0, true, false).is_none());
    assert!(top_k(&[&x], &sl, 5, 0, true, true).is_some());
    let c = Literal::zeros(TensorType::new(DType::C64, vec![100]));
    assert!(top_k(&[&c], &sl, 5, 0, false, true).is_none());
}

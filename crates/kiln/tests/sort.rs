//! `Tensor::sort`, `argsort`, `sort_with` and `top_k` (and its earlier name `topk`), eager
//! and under `jit`, against a stable sort written here (NaN greatest, -0 equal to +0, ties in
//! order, as NumPy and PyTorch sort); `clip` and `clip_between`; their gradients against
//! finite differences; and the errors of bad arguments.

use kiln::{DType, Tensor, grad, jit};
use std::cmp::Ordering;

/// Values with ties, both zeros, infinities and NaNs.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (s >> 33) as i64;
            match r % 29 {
                0 => f32::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => f32::INFINITY,
                4 => f32::NEG_INFINITY,
                _ => ((r % 51) - 25) as f32 * 0.5,
            }
        })
        .collect()
}

/// NaN greatest; -0 == +0.
fn order(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap(),
    }
}

/// The stable order of each row of `v` ([rows, n], sorted along the last axis).
fn expected(v: &[f32], n: usize, descending: bool) -> Vec<i32> {
    v.chunks(n)
        .flat_map(|row| {
            let mut idx: Vec<usize> = (0..n).collect();
            if descending {
                idx.sort_by(|&a, &b| order(row[b], row[a]));
            } else {
                idx.sort_by(|&a, &b| order(row[a], row[b]));
            }
            idx.into_iter().map(|i| i as i32)
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn sort_and_argsort_match_a_stable_sort_eagerly_and_compiled() {
    // Rows short and long; the 70,000-element one runs compiled even eagerly.
    for (rows, n) in [(1, 1), (1, 9), (3, 64), (2, 1000), (1, 70_000)] {
        let v = values(rows * n, (rows * n) as u64);
        let x = Tensor::from_vec(v.clone(), [rows, n]).unwrap();
        for descending in [false, true] {
            let idx = expected(&v, n, descending);
            let sorted: Vec<f32> = idx
                .chunks(n)
                .enumerate()
                .flat_map(|(r, c)| c.iter().map(move |&i| (r, i)))
                .map(|(r, i)| v[r * n + i as usize])
                .collect();
            let eager = x.sort(-1, descending).to_vec::<f32>().unwrap();
            assert_eq!(
                bits(&eager),
                bits(&sorted),
                "eager sort {rows}x{n} {descending}"
            );
            let compiled = jit(move |x: &Tensor| x.sort(1, descending))
                .call(&x)
                .unwrap();
            assert_eq!(
                bits(&compiled.to_vec::<f32>().unwrap()),
                bits(&sorted),
                "jit sort {rows}x{n} {descending}"
            );
            assert_eq!(x.argsort(1, descending).to_vec::<i32>().unwrap(), idx);
            let compiled = jit(move |x: &Tensor| x.argsort(-1, descending))
                .call(&x)
                .unwrap();
            assert_eq!(
                compiled.to_vec::<i32>().unwrap(),
                idx,
                "jit argsort {rows}x{n}"
            );
        }
    }
}

#[test]
fn compiled_topk_selects_the_stable_sorts_first_k() {
    // A compiled sort whose users read only a prefix orders only that prefix (a selection,
    // then a sort): the first k must be those of the stable sort, ties in order, for k short
    // and long, along rows and along columns.
    let (rows, n) = (3, 1000);
    let v = values(rows * n, 11);
    let x = Tensor::from_vec(v.clone(), [rows, n]).unwrap();
    let idx = expected(&v, n, true);
    for k in [1usize, 5, 100, 125, 126, 999] {
        let (vals, pos) = jit(move |x: &Tensor| x.top_k(k, 1)).call(&x).unwrap();
        let want: Vec<i32> = idx.chunks(n).flat_map(|c| c[..k].to_vec()).collect();
        assert_eq!(pos.to_vec::<i32>().unwrap(), want, "positions, k = {k}");
        let want_vals: Vec<f32> = want
            .chunks(k)
            .enumerate()
            .flat_map(|(r, c)| c.iter().map(move |&i| (r, i)))
            .map(|(r, i)| v[r * n + i as usize])
            .collect();
        assert_eq!(bits(&vals.to_vec::<f32>().unwrap()), bits(&want_vals));
        // Along the first axis of the transpose: the same rows, strided.
        let xt = x.transpose(&[1, 0]);
        let (_, pos_t) = jit(move |x: &Tensor| x.top_k(k, 0)).call(&xt).unwrap();
        let pos_t = pos_t.to_vec::<i32>().unwrap();
        let back: Vec<i32> = (0..rows)
            .flat_map(|r| (0..k).map(move |j| (r, j)))
            .map(|(r, j)| pos_t[j * rows + r])
            .collect();
        assert_eq!(back, want, "positions along axis 0, k = {k}");
    }
    // One operand sorted by its own keys (no -0, no NaN), then its first k: the elements.
    let w: Vec<f32> = (0..4096)
        .map(|i| ((i * 7919) % 4099) as f32 - 2000.0)
        .collect();
    let y = Tensor::from_vec(w.clone(), [2, 2048]).unwrap();
    for k in [3usize, 256] {
        let got = jit(move |y: &Tensor| y.sort(1, false).slice(1, 0, k as isize, 1))
            .call(&y)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want: Vec<f32> = w
            .chunks(2048)
            .flat_map(|c| {
                let mut c = c.to_vec();
                c.sort_by(|a, b| a.partial_cmp(b).unwrap());
                c.truncate(k);
                c
            })
            .collect();
        assert_eq!(got, want, "k = {k}");
    }
}

/// The stable order of each row of `v` ([rows, n]) as [`expected`] gives it, for keys read
/// back as f64 (NaN greatest; -0 == +0).
fn expected64(v: &[f64], n: usize, descending: bool) -> Vec<i32> {
    let order = |a: f64, b: f64| match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap(),
    };
    v.chunks(n)
        .flat_map(|row| {
            let mut idx: Vec<usize> = (0..n).collect();
            if descending {
                idx.sort_by(|&a, &b| order(row[b], row[a]));
            } else {
                idx.sort_by(|&a, &b| order(row[a], row[b]));
            }
            idx.into_iter().map(|i| i as i32)
        })
        .collect()
}

/// `top_k`'s values and positions are exactly the first `k` of each row of `n` in the stable
/// sort's order `idx` of `keys` (the keys read back as f64), compared bit for bit.
fn assert_stable_prefix(
    vals: &Tensor,
    pos: &Tensor,
    keys: &[f64],
    idx: &[i32],
    (n, k): (usize, usize),
    dtype: DType,
) {
    let want: Vec<i32> = idx.chunks(n).flat_map(|c| c[..k].to_vec()).collect();
    assert_eq!(pos.to_vec::<i32>().unwrap(), want, "{dtype:?}, k = {k}");
    let want_vals: Vec<u64> = want
        .chunks(k)
        .enumerate()
        .flat_map(|(r, c)| c.iter().map(move |&i| (r, i)))
        .map(|(r, i)| keys[r * n + i as usize].to_bits())
        .collect();
    let got: Vec<u64> = vals
        .cast(DType::F64)
        .to_vec::<f64>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(got, want_vals, "{dtype:?} values, k = {k}");
}

#[test]
fn compiled_top_k_runs_as_one_pass_on_every_key_dtype() {
    // The printed plan: a short prefix of each row (at most an eighth) runs as a top-k, the
    // runtime's one pass over each row; a longer one, or the whole row, sorts whole.
    let (rows, n) = (3, 1000);
    let x = Tensor::from_vec(values(rows * n, 29), [rows, n]).unwrap();
    let shown = |k: usize, x: &Tensor| {
        let func = jit(move |x: &Tensor| x.top_k(k, 1)).lower(x).unwrap();
        kiln_codegen_llvm::cpu::describe_fusion(&func, &Default::default()).unwrap()
    };
    let five = shown(5, &x);
    assert!(
        five.contains("top-k: the first 5 of each slice of 1000"),
        "{five}"
    );
    for k in [126, n] {
        let s = shown(k, &x);
        assert!(!s.contains("top-k:"), "k = {k}: {s}");
    }
    // Exactly the whole stable sort's first k, ties, NaN, -0 and +0 included, for each key
    // dtype (the keys read back as f64 to write the expected order).
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32] {
        let xd = x.cast(dtype);
        let keys = xd.cast(DType::F64).to_vec::<f64>().unwrap();
        let idx = expected64(&keys, n, true);
        for k in [1usize, 5, 125, n] {
            let (vals, pos) = jit(move |x: &Tensor| x.top_k(k, 1)).call(&xd).unwrap();
            assert_stable_prefix(&vals, &pos, &keys, &idx, (n, k), dtype);
        }
    }
    // More than the row holds is an error under jit too.
    let e = jit(|x: &Tensor| x.top_k(1001, 1))
        .call(&x)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("top_k") && e.contains("k = 1001"), "{e}");
}

#[test]
fn eager_top_k_of_long_rows_is_the_stable_sort_prefix_on_every_key_dtype() {
    // Eager, rows long enough that the kernel layer runs a short prefix as a top-k (the
    // runtime's one pass over each row): exactly the whole stable sort's first k, ties, NaN,
    // -0 and +0 included; a longer prefix (the whole sort) too.
    let (rows, n) = (4, 4096);
    let x = Tensor::from_vec(values(rows * n, 31), [rows, n]).unwrap();
    for dtype in [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U8,
    ] {
        let xd = x.cast(dtype);
        let keys = xd.cast(DType::F64).to_vec::<f64>().unwrap();
        let idx = expected64(&keys, n, true);
        for k in [1usize, 7, 512, 513] {
            let (vals, pos) = xd.top_k(k, 1);
            assert_stable_prefix(&vals, &pos, &keys, &idx, (n, k), dtype);
        }
    }
}

#[test]
fn jitted_gradients_through_top_k_and_argsort_move_back() {
    // d/dx sum(top_k(x, 3) * w): w[j] lands where the j-th greatest of each row came from;
    // the same through take_along_axis of argsort's first 3. Rows long enough for a top-k.
    let (rows, n) = (2, 200);
    let v: Vec<f64> = values(rows * n, 31)
        .iter()
        .map(|&x| if x.is_nan() { 0.25 } else { x as f64 })
        .collect();
    let x = Tensor::from_vec(v.clone(), [rows, n]).unwrap();
    let w = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 10.0, 20.0, 30.0], [rows, 3]).unwrap();
    let idx = expected64(&v, n, true);
    let mut want = vec![0.0f64; rows * n];
    for r in 0..rows {
        for j in 0..3 {
            want[r * n + idx[r * n + j] as usize] += [1.0, 2.0, 3.0, 10.0, 20.0, 30.0][r * 3 + j];
        }
    }
    let wc = w.clone();
    let top = jit(grad(move |x: &Tensor| x.top_k(3, 1).0.mul(&wc).sum_all()))
        .call(&x)
        .unwrap();
    assert_eq!(top.to_vec::<f64>().unwrap(), want, "top_k");
    let wc = w.clone();
    let arg = jit(grad(move |x: &Tensor| {
        let first = x.argsort(1, true).slice(1, 0, 3, 1);
        x.take_along_axis(&first, 1).mul(&wc).sum_all()
    }))
    .call(&x)
    .unwrap();
    assert_eq!(arg.to_vec::<f64>().unwrap(), want, "argsort");
}

#[test]
fn sorting_along_the_first_axis_sorts_each_column() {
    let v: Vec<i32> = vec![5, -1, 2, 8, 9, 0, 2, 8];
    let x = Tensor::from_vec(v, [4, 2]).unwrap();
    let want = vec![2, -1, 2, 0, 5, 8, 9, 8];
    assert_eq!(x.sort(0, false).to_vec::<i32>().unwrap(), want);
    let got = jit(|x: &Tensor| x.sort(0, false)).call(&x).unwrap();
    assert_eq!(got.to_vec::<i32>().unwrap(), want);
    // Ties keep their order: the two 2s of column 0, the two 8s of column 1.
    assert_eq!(
        x.argsort(0, false).to_vec::<i32>().unwrap(),
        vec![1, 0, 3, 2, 0, 1, 2, 3]
    );
    assert_eq!(
        x.argsort(0, true).to_vec::<i32>().unwrap(),
        vec![2, 1, 0, 3, 1, 2, 3, 0]
    );
}

#[test]
fn sort_with_carries_values_and_topk_takes_the_greatest() {
    let keys = Tensor::from_vec(vec![3i32, 1, 3, 0, 2], [5]).unwrap();
    let vals = Tensor::from_vec(vec![10.0f32, 11.0, 12.0, 13.0, 14.0], [5]).unwrap();
    for out in [
        keys.sort_with(&[&vals], 0, false),
        jit(|(k, v): &(Tensor, Tensor)| {
            let s = k.sort_with(&[v], 0, false);
            (s[0].clone(), s[1].clone())
        })
        .call(&(keys.clone(), vals.clone()))
        .map(|(a, b)| vec![a, b])
        .unwrap(),
    ] {
        assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![0, 1, 2, 3, 3]);
        assert_eq!(
            out[1].to_vec::<f32>().unwrap(),
            vec![13.0, 11.0, 14.0, 10.0, 12.0]
        );
    }
    let x = Tensor::from_vec(vec![0.5f32, f32::NAN, 2.0, 2.0, -1.0, 7.0], [2, 3]).unwrap();
    let (v, i) = x.top_k(2, 1);
    let v = v.to_vec::<f32>().unwrap();
    assert!(v[0].is_nan() && v[1] == 2.0, "{v:?}");
    assert_eq!(&v[2..], &[7.0, 2.0]);
    assert_eq!(i.to_vec::<i32>().unwrap(), vec![1, 2, 2, 0]);
}

#[test]
fn gradients_move_back_to_where_each_element_came_from() {
    // d/dx sum(sort(x) * w) = w moved back: the element sorted to position p gets w[p].
    let x = Tensor::from_vec(vec![0.3f64, -1.2, 2.5, 0.7, -0.4], [5]).unwrap();
    let w = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0], [5]).unwrap();
    let wc = w.clone();
    let g = grad(move |x: &Tensor| x.sort(0, false).mul(&wc).sum_all())(&x);
    // Ascending order of x: -1.2, -0.4, 0.3, 0.7, 2.5.
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![3.0, 1.0, 5.0, 4.0, 2.0]);
    // The same through jit, and against finite differences (descending, top-k, 2-D).
    let wc = w.clone();
    let gj = jit(grad(move |x: &Tensor| x.sort(0, false).mul(&wc).sum_all()))
        .call(&x)
        .unwrap();
    assert_eq!(gj.to_vec::<f64>().unwrap(), vec![3.0, 1.0, 5.0, 4.0, 2.0]);
    let m = Tensor::from_vec(
        vec![
            0.3f64, -1.2, 2.5, 0.7, -0.4, 1.1, 0.05, -2.0, 1.7, 0.9, -0.6, 0.2,
        ],
        [3, 4],
    )
    .unwrap();
    let n = kiln::testing::check_grads(
        |m: &Tensor| {
            let s = m.sort(1, true);
            let (t, _) = m.top_k(2, 0);
            s.mul(&s).sum_all().add(&t.sin().sum_all())
        },
        &m,
        1e-6,
        1e-6,
    )
    .unwrap();
    assert_eq!(n, 12);
    // Values carried by a sort get their gradients back too; integer keys get none.
    let keys = Tensor::from_vec(vec![2i32, 0, 1], [3]).unwrap();
    let v = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3]).unwrap();
    let gv = grad(move |v: &Tensor| {
        let s = keys.sort_with(&[v], 0, false);
        s[1].mul(&Tensor::from_vec(vec![10.0f64, 20.0, 30.0], [3]).unwrap())
            .sum_all()
    })(&v);
    assert_eq!(gv.to_vec::<f64>().unwrap(), vec![30.0, 10.0, 20.0]);
}

#[test]
fn bad_arguments_are_errors_naming_the_operation() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    let e = x.sort(1, false).to_vec::<f32>().unwrap_err().to_string();
    assert!(
        e.contains("sort") && e.contains("axis 1 is out of range"),
        "{e}"
    );
    let e = x.top_k(4, 0).0.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("top_k") && e.contains("k = 4"), "{e}");
    // The earlier name is the same function, and its errors name it.
    let e = x.topk(4, 0).0.to_vec::<f32>().unwrap_err().to_string();
    assert!(e.contains("topk") && e.contains("k = 4"), "{e}");
    let (a, b) = (x.topk(2, 0), x.top_k(2, 0));
    assert_eq!(a.0.to_vec::<f32>().unwrap(), b.0.to_vec::<f32>().unwrap());
    assert_eq!(a.1.to_vec::<i32>().unwrap(), b.1.to_vec::<i32>().unwrap());
    let y = Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap();
    let e = x.sort_with(&[&y], 0, false)[1]
        .to_vec::<f32>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("sort_with") && e.contains("f32[2]"), "{e}");
    assert!(e.contains("sort.rs"), "the user's line: {e}");
    let e = Tensor::zeros(DType::F32, [])
        .argsort(0, false)
        .to_vec::<i32>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("argsort"), "{e}");
}

#[test]
fn argmax_and_argmin_pick_the_first_extreme_or_nan() {
    let x = Tensor::from_vec(
        vec![1.0f32, 5.0, 5.0, -2.0, 0.0, f32::NAN, 3.0, -7.0, -7.0],
        [3, 3],
    )
    .unwrap();
    for got in [
        x.argmax(1, false),
        jit(|x: &Tensor| x.argmax(-1, false)).call(&x).unwrap(),
    ] {
        assert_eq!(got.shape(), [3]);
        assert_eq!(got.to_vec::<i32>().unwrap(), vec![1, 2, 0]);
    }
    assert_eq!(x.argmin(1, false).to_vec::<i32>().unwrap(), vec![0, 2, 1]);
    assert_eq!(x.argmax(0, true).shape(), [1, 3]);
    assert_eq!(x.argmax(0, true).to_vec::<i32>().unwrap(), vec![2, 0, 1]);
    let i = Tensor::from_vec(vec![3i32, 9, 9, -1], [4]).unwrap();
    assert_eq!(i.argmax(0, false).to_vec::<i32>().unwrap(), vec![1]);
    assert_eq!(i.argmin(0, false).to_vec::<i32>().unwrap(), vec![3]);
    let e = Tensor::zeros(DType::F32, [2, 0])
        .argmax(1, false)
        .to_vec::<i32>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("argmax") && e.contains("empty"), "{e}");
}

#[test]
fn clip_limits_each_element_and_keeps_nan() {
    let x = Tensor::from_vec(vec![-3.0f32, 0.5, 9.0, f32::NAN], [4]).unwrap();
    let got = x.clip(-1.0, 2.0).to_vec::<f32>().unwrap();
    assert_eq!(&got[..3], &[-1.0, 0.5, 2.0]);
    assert!(got[3].is_nan());
    let g = grad(|x: &Tensor| x.clip(-1.0, 2.0).sum_all())(
        &Tensor::from_vec(vec![-3.0f64, 0.5, 9.0], [3]).unwrap(),
    );
    assert_eq!(g.to_vec::<f64>().unwrap(), vec![0.0, 1.0, 0.0]);
}

#[test]
fn clip_between_takes_tensor_bounds_that_broadcast() {
    // Row bounds [2, 1] and column bounds [3] against a [2, 3] tensor; a NaN stays NaN, and
    // lo > hi gives hi.
    let x = Tensor::from_vec(vec![-5.0f32, 0.5, 5.0, f32::NAN, 0.5, 5.0], [2, 3]).unwrap();
    let lo = Tensor::from_vec(vec![-1.0f32, 3.0], [2, 1]).unwrap();
    let hi = Tensor::from_vec(vec![1.0f32, 0.25, 2.0], [3]).unwrap();
    let want = [-1.0, 0.25, 2.0, f32::NAN, 0.25, 2.0];
    for got in [
        x.clip_between(&lo, &hi),
        jit(|(x, lo, hi): &(Tensor, Tensor, Tensor)| x.clip_between(lo, hi))
            .call(&(x.clone(), lo.clone(), hi.clone()))
            .unwrap(),
    ] {
        assert_eq!(got.shape(), [2, 3]);
        let got = got.to_vec::<f32>().unwrap();
        assert!(got[3].is_nan(), "{got:?}");
        assert_eq!((&got[..3], &got[4..]), (&want[..3], &want[4..]));
    }
    // Scalar tensor bounds agree with the scalar form; a bound tensor of a wider dtype
    // promotes as in other binary ops.
    let v = Tensor::from_vec(vec![-3.0f32, 0.5, 9.0], [3]).unwrap();
    let (l, h) = (Tensor::scalar(-1.0f32), Tensor::scalar(2.0f32));
    assert_eq!(
        v.clip_between(&l, &h).to_vec::<f32>().unwrap(),
        v.clip(-1.0, 2.0).to_vec::<f32>().unwrap()
    );
    let wide = v.clip_between(&Tensor::scalar(-1.0f64), &Tensor::scalar(2.0f64));
    assert_eq!(wide.dtype(), DType::F64);
    // Gradients: 1 where x is inside its bounds, to lo where lo binds, to hi where hi binds.
    let x = Tensor::from_vec(vec![-3.0f64, 0.5, 9.0], [3]).unwrap();
    let lo = Tensor::from_vec(vec![-1.0f64, -1.0, -1.0], [3]).unwrap();
    let hi = Tensor::scalar(2.0f64);
    let (gx, glo, ghi) =
        grad(|(x, lo, hi): &(Tensor, Tensor, Tensor)| x.clip_between(lo, hi).sum_all())(&(
            x, lo, hi,
        ));
    assert_eq!(gx.to_vec::<f64>().unwrap(), vec![0.0, 1.0, 0.0]);
    assert_eq!(glo.to_vec::<f64>().unwrap(), vec![1.0, 0.0, 0.0]);
    assert_eq!(ghi.to_vec::<f64>().unwrap(), vec![1.0]);
    // Bounds that do not broadcast with the tensor: an error naming clip and this line.
    let bad = Tensor::from_vec(vec![0.0f32; 2], [2]).unwrap();
    let e = v
        .clip_between(&bad, &h)
        .to_vec::<f32>()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("clip") && e.contains("f32[2]") && e.contains("sort.rs"),
        "{e}"
    );
}

#[test]
fn cumsum_and_cumprod_run_along_an_axis_both_ways() {
    let x = Tensor::from_vec(
        vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0],
        [2, 5],
    )
    .unwrap();
    let want = vec![1.0, 3.0, 6.0, 10.0, 15.0, 6.0, 13.0, 21.0, 30.0, 40.0];
    assert_eq!(x.cumsum(1, false).to_vec::<f64>().unwrap(), want);
    let got = jit(|x: &Tensor| x.cumsum(-1, false)).call(&x).unwrap();
    assert_eq!(got.to_vec::<f64>().unwrap(), want);
    assert_eq!(
        x.cumsum(1, true).to_vec::<f64>().unwrap(),
        vec![15.0, 14.0, 12.0, 9.0, 5.0, 40.0, 34.0, 27.0, 19.0, 10.0]
    );
    assert_eq!(
        x.cumsum(0, false).to_vec::<f64>().unwrap(),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]
    );
    assert_eq!(
        x.cumprod(1, false).to_vec::<f64>().unwrap(),
        vec![
            1.0, 2.0, 6.0, 24.0, 120.0, 6.0, 42.0, 336.0, 3024.0, 30240.0
        ]
    );
    let i = Tensor::from_vec(vec![3i32, -1, 4, 1, -5], [5]).unwrap();
    assert_eq!(
        i.cumsum(0, false).to_vec::<i32>().unwrap(),
        vec![3, 2, 6, 7, 2]
    );
    // Long and accurate: 100,000 copies of 0.1f32 run up to 10,000 within a few ulps.
    let ones = Tensor::full(DType::F32, [100_000], 0.1);
    let c = jit(|x: &Tensor| x.cumsum(0, false)).call(&ones).unwrap();
    let c = c.to_vec::<f32>().unwrap();
    for (i, v) in c.iter().enumerate().step_by(997) {
        let exact = 0.1f32 as f64 * (i + 1) as f64;
        assert!(
            ((*v as f64) - exact).abs() <= 1e-5 * exact,
            "{i}: {v} vs {exact}"
        );
    }
    // Gradients: d/dx sum(cumsum(x) * w) = reverse cumsum of w; checked against differences.
    let n = kiln::testing::check_grads(
        |x: &Tensor| {
            x.cumsum(1, false)
                .sin()
                .sum_all()
                .add(&x.cumprod(0, true).sum_all())
        },
        &x.mul(&Tensor::scalar(0.1f64)),
        1e-6,
        1e-6,
    )
    .unwrap();
    assert_eq!(n, 10);
    let e = x.cumsum(2, false).to_vec::<f64>().unwrap_err().to_string();
    assert!(e.contains("cumsum") && e.contains("axis 2"), "{e}");
}

#[test]
fn take_along_axis_sorts_with_argsort_and_checks_its_indices() {
    let x = Tensor::from_vec(vec![3.0f64, 1.0, 2.0, -1.0, 5.0, 0.0], [2, 3]).unwrap();
    let idx = x.argsort(1, false);
    for got in [
        x.take_along_axis(&idx, 1),
        jit(|(x, i): &(Tensor, Tensor)| x.take_along_axis(i, -1))
            .call(&(x.clone(), idx.clone()))
            .unwrap(),
    ] {
        assert_eq!(
            got.to_vec::<f64>().unwrap(),
            x.sort(1, false).to_vec::<f64>().unwrap()
        );
    }
    // Fewer indices than the axis, negative ones from the end, along axis 0.
    let i = Tensor::from_vec(vec![-1i32, 0, 1], [1, 3]).unwrap();
    assert_eq!(
        x.take_along_axis(&i, 0).to_vec::<f64>().unwrap(),
        vec![-1.0, 1.0, 0.0]
    );
    // The gradient scatters back (a position taken twice gets both).
    let j = Tensor::from_vec(vec![0i32, 0, 2, 1], [2, 2]).unwrap();
    let g = grad(move |x: &Tensor| x.take_along_axis(&j, 1).sum_all())(&x);
    assert_eq!(
        g.to_vec::<f64>().unwrap(),
        vec![2.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    );
    let bad = Tensor::from_vec(vec![3i32, 0], [2, 1]).unwrap();
    let e = x
        .take_along_axis(&bad, 1)
        .to_vec::<f64>()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("take_along_axis") && e.contains("index 3 is out of range"),
        "{e}"
    );
    let e = x
        .take_along_axis(&Tensor::from_vec(vec![0i32; 4], [2, 2]).unwrap(), 0)
        .to_vec::<f64>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("except along axis 0"), "{e}");
    // Under jit an index out of range takes the fill value (NaN for floats).
    let got = jit(|(x, i): &(Tensor, Tensor)| x.take_along_axis(i, 1))
        .call(&(x.clone(), bad))
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert!(got[0].is_nan(), "{got:?}");
}

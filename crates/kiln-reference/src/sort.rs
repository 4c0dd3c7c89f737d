//! `sort`: every 1-D slice along the sorted dimension put in the comparator's order, by a
//! stable merge sort that asks the comparator only "does this element go before that one?".
//!
//! A comparator that is not a strict weak order (a float `LT` meeting a NaN) cannot make the
//! sort fail: the merge takes the right element first only when the comparator says it goes
//! before the left one, so every call ends with a permutation, the same one every time.

use kiln_ir::{Func, Literal, TensorType};

/// Sorts `idx` stably by `less` (`less(a, b)`: `a` goes before `b`): a top-down merge sort
/// that keeps `a` before `b` unless `less(b, a)`.
pub fn merge_sort_by(idx: &mut [usize], less: &mut impl FnMut(usize, usize) -> bool) {
    let mut buf = idx.to_vec();
    sort_into(idx, &mut buf, less);
}

/// Sorts `v` (with `scratch` as long) in place.
fn sort_into(v: &mut [usize], scratch: &mut [usize], less: &mut impl FnMut(usize, usize) -> bool) {
    let n = v.len();
    if n <= 1 {
        return;
    }
    if n <= 8 {
        // Insertion sort: an element moves left past those it goes before, not past equals.
        for i in 1..n {
            let mut j = i;
            while j > 0 && less(v[j], v[j - 1]) {
                v.swap(j, j - 1);
                j -= 1;
            }
        }
        return;
    }
    let mid = n / 2;
    {
        let (lo, hi) = v.split_at_mut(mid);
        let (slo, shi) = scratch.split_at_mut(mid);
        sort_into(lo, slo, less);
        sort_into(hi, shi, less);
    }
    scratch.copy_from_slice(v);
    let (lo, hi) = scratch.split_at(mid);
    let (mut i, mut j) = (0, 0);
    for out in v.iter_mut() {
        let take_hi = j < hi.len() && (i == lo.len() || less(hi[j], lo[i]));
        if take_hi {
            *out = hi[j];
            j += 1;
        } else {
            *out = lo[i];
            i += 1;
        }
    }
}

/// For every position of the sorted result, the linear position in the operands its elements
/// come from: each slice along `dimension` of `shape` sorted by `less` on source positions.
pub fn permutation(
    shape: &[usize],
    dimension: usize,
    less: &mut impl FnMut(usize, usize) -> bool,
) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let len = shape[dimension];
    let stride: usize = shape[dimension + 1..].iter().product();
    let mut perm = vec![0usize; n];
    if len == 0 {
        return perm;
    }
    let mut idx = vec![0usize; len];
    for base in 0..n {
        // A slice starts at every position whose coordinate along `dimension` is 0.
        if !(base / stride).is_multiple_of(len) {
            continue;
        }
        for (i, x) in idx.iter_mut().enumerate() {
            *x = base + i * stride;
        }
        merge_sort_by(&mut idx, less);
        for (i, &src) in idx.iter().enumerate() {
            perm[base + i * stride] = src;
        }
    }
    perm
}

/// Evaluates `sort` on the operands `x` with `comparator` run by the interpreter.
pub(crate) fn sort(x: &[&Literal], dimension: usize, comparator: &Func) -> Vec<Literal> {
    let perm = sort_permutation(x, dimension, comparator);
    x.iter()
        .map(|l| crate::ops::take(l, l.ty(), &perm))
        .collect()
}

/// The [`permutation`] that `sort` of the operands `x` with `comparator` applies to each.
pub(crate) fn sort_permutation(x: &[&Literal], dimension: usize, comparator: &Func) -> Vec<usize> {
    let scalars: Vec<TensorType> = x.iter().map(|l| TensorType::new(l.dtype(), [])).collect();
    let mut less = |a: usize, b: usize| {
        let mut args = Vec::with_capacity(2 * x.len());
        for (l, t) in x.iter().zip(&scalars) {
            args.push(crate::ops::take(l, t, &[a]));
            args.push(crate::ops::take(l, t, &[b]));
        }
        let refs: Vec<&Literal> = args.iter().collect();
        let out = crate::run(comparator, &refs);
        out[0].to_i64s().first().is_some_and(|&v| v != 0)
    };
    permutation(x[0].shape(), dimension, &mut less)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_sort_is_stable_and_total_on_any_comparator() {
        let keys = [3, 1, 2, 1, 3, 0, 2, 2, 1, 0, 5, 4, 3, 1];
        let mut idx: Vec<usize> = (0..keys.len()).collect();
        merge_sort_by(&mut idx, &mut |a, b| keys[a] < keys[b]);
        let sorted: Vec<i32> = idx.iter().map(|&i| keys[i]).collect();
        assert_eq!(sorted, [0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 5]);
        // Equal keys keep their order.
        for w in idx.windows(2) {
            if keys[w[0]] == keys[w[1]] {
                assert!(w[0] < w[1]);
            }
        }
        // A comparator that is no order at all still gives a permutation.
        let mut idx: Vec<usize> = (0..100).collect();
        let mut flip = 0u32;
        merge_sort_by(&mut idx, &mut |_, _| {
            flip = flip.wrapping_mul(1103515245).wrapping_add(12345);
            flip & 0x100 != 0
        });
        let mut seen = idx.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn permutation_sorts_each_slice_along_the_dimension() {
        // [[3, 1], [2, 0]] sorted along dimension 0: column-wise.
        let v = [3, 1, 2, 0];
        let perm = permutation(&[2, 2], 0, &mut |a, b| v[a] < v[b]);
        assert_eq!(perm, [2, 3, 0, 1]);
        let perm = permutation(&[2, 2], 1, &mut |a, b| v[a] < v[b]);
        assert_eq!(perm, [1, 0, 3, 2]);
    }
}

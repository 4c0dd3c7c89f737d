//! An eager `sort` by keys: the reference interpreter's merge sort with the comparison made
//! on the key operand's values directly (what the comparator would answer), so the
//! permutation, and every result bit, is the reference's.

use kiln_ir::{Literal, Op};
use kiln_kernel::sort::{KeySort, key_sort};

/// The results of `op` (a `sort` whose comparator orders by one operand's keys) on `lits`;
/// `None` for any other op or comparator.
pub(crate) fn sort(op: &Op, lits: &[&Literal]) -> Option<Vec<Literal>> {
    let KeySort {
        dimension,
        operand,
        descending,
        nan_greatest,
    } = key_sort(op, lits.len())?;
    let key = lits.get(operand)?;
    let shape = key.shape().to_vec();
    let d = dimension as usize;
    let perm = if key.dtype().is_float() {
        let v = key.to_f64s();
        let nan = |i: usize| nan_greatest && v[i].is_nan();
        kiln_reference::sort_permutation(&shape, d, &mut |a, b| {
            if descending {
                v[a] > v[b] || (nan(a) && !v[b].is_nan())
            } else {
                v[a] < v[b] || (nan(b) && !v[a].is_nan())
            }
        })
    } else {
        let (v, dt) = (key.to_i64s(), key.dtype());
        let cmp = |a: usize, b: usize| kiln_reference::scalar::int_cmp(dt, v[a], v[b]);
        kiln_reference::sort_permutation(&shape, d, &mut |a, b| {
            if descending {
                cmp(a, b).is_gt()
            } else {
                cmp(a, b).is_lt()
            }
        })
    };
    Some(
        lits.iter()
            .map(|l| kiln_reference::take_positions(l, l.ty(), &perm))
            .collect(),
    )
}

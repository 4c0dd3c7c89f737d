//! `reduce` over any dimensions with any combiner. As in the reference, each output starts at
//! the initial value and combines its operand elements in the operand's row-major order, in
//! f64 for floats (rounded once at the end) and in wrapping i64 for integers and `pred`; the
//! loops walk the operand row-major, so every output sees its terms in that order whichever
//! dimensions are reduced. Threads split the outputs (along the outermost kept dimension), so
//! no sum is reordered.

use super::{Elem, filled, par_chunks, with_elem};
use kiln_ir::{Combiner, Data, Literal, TensorType};
use kiln_reference::scalar::{combine_i, nan_max, nan_min};

/// The operand's dimensions grouped: neighbours both reduced or both kept merged, dimensions
/// of size 1 dropped. `stride` is in the operand, `out_stride` in the result (kept groups).
#[derive(Clone, Copy, Debug)]
struct Group {
    size: usize,
    reduced: bool,
    stride: usize,
    out_stride: usize,
}

fn groups(shape: &[usize], reduced: &[bool]) -> Vec<Group> {
    let mut g: Vec<Group> = Vec::new();
    for (&n, &r) in shape.iter().zip(reduced) {
        if n == 1 {
            continue;
        }
        match g.last_mut() {
            Some(last) if last.reduced == r => last.size *= n,
            _ => g.push(Group {
                size: n,
                reduced: r,
                stride: 0,
                out_stride: 0,
            }),
        }
    }
    let (mut s, mut os) = (1, 1);
    for x in g.iter_mut().rev() {
        x.stride = s;
        s *= x.size;
        if !x.reduced {
            x.out_stride = os;
            os *= x.size;
        }
    }
    g
}

/// Combines the operand elements of the box `groups` (the first kept group restricted to
/// `first_kept`) into `acc`, the outputs from `out0` on, walking the operand row-major.
fn walk<A: Copy, T: Copy>(
    x: &[T],
    groups: &[Group],
    acc: &mut [A],
    out0: usize,
    in_off: usize,
    out_off: usize,
    combine: &impl Fn(A, T) -> A,
) {
    let Some((g, rest)) = groups.split_first() else {
        acc[out_off - out0] = combine(acc[out_off - out0], x[in_off]);
        return;
    };
    if rest.is_empty() {
        let xs = &x[in_off..in_off + g.size];
        if g.reduced {
            let a = &mut acc[out_off - out0];
            for &v in xs {
                *a = combine(*a, v);
            }
        } else {
            let o = out_off - out0;
            for (a, &v) in acc[o..o + g.size].iter_mut().zip(xs) {
                *a = combine(*a, v);
            }
        }
        return;
    }
    let mut first = 0;
    if let [inner] = rest
        && inner.reduced
        && !g.reduced
    {
        // Rows summed one after another, four at a time (four chains in flight, each in
        // order): the outputs of consecutive rows are consecutive.
        let len = inner.size;
        while first + 4 <= g.size {
            let o = out_off + first * g.out_stride - out0;
            let xs: [&[T]; 4] =
                std::array::from_fn(|q| &x[in_off + (first + q) * g.stride..][..len]);
            let mut a = [acc[o], acc[o + 1], acc[o + 2], acc[o + 3]];
            for (((&x0, &x1), &x2), &x3) in xs[0].iter().zip(xs[1]).zip(xs[2]).zip(xs[3]) {
                a = [
                    combine(a[0], x0),
                    combine(a[1], x1),
                    combine(a[2], x2),
                    combine(a[3], x3),
                ];
            }
            acc[o..o + 4].copy_from_slice(&a);
            first += 4;
        }
    }
    for i in first..g.size {
        walk(
            x,
            rest,
            acc,
            out0,
            in_off + i * g.stride,
            out_off + if g.reduced { 0 } else { i * g.out_stride },
            combine,
        );
    }
}

/// Reduces `x` (of shape `shape`) over the dimensions marked in `reduced` into `acc` (one
/// per output, each holding the initial value), with threads splitting the outputs along
/// the outermost kept dimension.
fn reduce_into<A: Copy + Send, T: Copy + Sync>(
    x: &[T],
    shape: &[usize],
    reduced: &[bool],
    acc: &mut [A],
    cost: usize,
    combine: impl Fn(A, T) -> A + Sync,
) {
    if x.is_empty() || acc.is_empty() {
        return;
    }
    let gs = groups(shape, reduced);
    let Some(k) = gs.iter().position(|g| !g.reduced) else {
        // A single sum: in order, on one thread.
        walk(x, &gs, acc, 0, 0, 0, &combine);
        return;
    };
    // Each chunk of outputs is a range of the first kept group's indices; the groups before
    // it are reduced, so they move only the operand's offset.
    let kept = gs[k];
    par_chunks(acc, kept.out_stride, x.len() * cost, |start, chunk| {
        let mut g = gs.clone();
        g[k].size = chunk.len() / kept.out_stride;
        let first = start / kept.out_stride;
        walk(x, &g, chunk, start, first * kept.stride, start, &combine);
    });
}

/// `reduce` of `lits` = [operand, initial value] over `dimensions` with `kind`.
pub(super) fn run(
    dimensions: &[i64],
    kind: Combiner,
    lits: &[&Literal],
    ty: &TensorType,
) -> Option<Data> {
    let [x, init] = lits else { return None };
    let rank = x.ty().rank();
    let mut reduced = vec![false; rank];
    for &d in dimensions {
        *reduced.get_mut(usize::try_from(d).ok()?)? = true;
    }
    if x.dtype() != ty.dtype || init.dtype() != ty.dtype || init.numel() != 1 {
        return None;
    }
    let d = ty.dtype;
    let n = ty.numel();
    let shape = x.shape();
    Some(with_elem!(d, T => {
        let xs = T::slice(x.data())?;
        let init = T::slice(init.data())?[0];
        if d.is_float() {
            let mut acc = filled(n, init.f64())?;
            match kind {
                Combiner::Add => reduce_into(xs, shape, &reduced, &mut acc, 1, |a, v: T| a + v.f64()),
                Combiner::Mul => reduce_into(xs, shape, &reduced, &mut acc, 1, |a, v: T| a * v.f64()),
                Combiner::Max => reduce_into(xs, shape, &reduced, &mut acc, 1, |a, v: T| nan_max(a, v.f64())),
                Combiner::Min => reduce_into(xs, shape, &reduced, &mut acc, 1, |a, v: T| nan_min(a, v.f64())),
                Combiner::Replace => reduce_into(xs, shape, &reduced, &mut acc, 1, |_, v: T| v.f64()),
                Combiner::And | Combiner::Or => return None,
            }
            T::data(acc.into_iter().map(T::from_f64).collect())
        } else {
            let mut acc = filled(n, init.i64())?;
            reduce_into(xs, shape, &reduced, &mut acc, 2, |a, v: T| combine_i(kind, d, a, v.i64()));
            T::data(acc.into_iter().map(T::from_i64).collect())
        }
    }))
}

//! The sums of products: `dot_general` and `convolution`.
//!
//! Each result element is a sum of products, accumulated in f64 (floats, rounded once at the
//! end) or wrapping i64 (integers), starting from +0 as a dot product's accumulator does (XLA,
//! BLAS: products that are all -0, or none, sum to +0), one term after the other in a fixed
//! order: a dot's contracting positions in row-major order (of `lhs_contracting_dimensions`),
//! a convolution's input features and, for each, its kernel positions in row-major order. A
//! convolution's padding and dilation holes are zeros that still multiply their weight
//! (StableHLO pads, then multiplies): `0 * inf` is NaN.
//!
//! # Why the loops are shaped as they are
//!
//! These are the reference's largest sums: the benchmark checks a 2048 x 2048 product and
//! convolutions of 4-7 x 10^9 multiply-adds against it, twice (the values and the
//! magnitudes of `accuracy`). So a result *row* is computed at once: the elements that differ
//! only in a dot's rhs free dimensions, or in a convolution's output feature. They share their
//! lhs (input) factor term by term, and their rhs (weight) factors are contiguous once the
//! operands are copied into that order ([`transposed`]). The loop runs over the terms outside
//! and over the row inside, `acc[j] = acc[j] + x * w[j]`, which the compiler vectorizes and
//! which reads memory in order. It is still the per-element definition: each element gets its
//! terms one by one, in order, from +0, only side by side with its row's other elements; the
//! tests compare it with the plain per-element loop, bit for bit. Rows are split into
//! contiguous chunks computed on scoped threads ([`fill_rows`]); each element is computed by
//! one thread alone, so the result does not depend on the number of threads.

use crate::ops::for_each_index;
use kiln_ir::literal::wrap_to;
use kiln_ir::{Literal, TensorType, strides};

const VERIFIED: &str = "the verifier guarantees consistent types";

/// The accumulator of a sum of products: f64 for floats, wrapping i64 for integers.
trait Acc: Copy + Default + Send + Sync {
    /// `self + x * y`: two roundings (floats; never a fused multiply-add), or wrapping.
    fn add_product(self, x: Self, y: Self) -> Self;
}

impl Acc for f64 {
    fn add_product(self, x: f64, y: f64) -> f64 {
        self + x * y
    }
}

impl Acc for i64 {
    fn add_product(self, x: i64, y: i64) -> i64 {
        self.wrapping_add(x.wrapping_mul(y))
    }
}

/// The dimension numbers of a `dot_general`: lhs and rhs batching, lhs and rhs contracting.
pub(crate) struct DotDims<'a> {
    pub lb: &'a [i64],
    pub rb: &'a [i64],
    pub lc: &'a [i64],
    pub rc: &'a [i64],
}

/// The attributes of a `convolution`.
pub(crate) struct ConvAttrs<'a> {
    pub window_strides: &'a [i64],
    pub padding: &'a [(i64, i64)],
    pub lhs_dilation: &'a [i64],
    pub rhs_dilation: &'a [i64],
    pub feature_group_count: i64,
    pub input_dims: &'a [i64],
    pub kernel_dims: &'a [i64],
    pub output_dims: &'a [i64],
    pub batch_group_count: i64,
}

/// Below this many multiply-adds an op runs on the calling thread alone.
const PARALLEL_WORK: usize = 1 << 20;

/// The threads for an op of `work` multiply-adds: every core for large ones.
fn threads_for(work: usize) -> usize {
    if work < PARALLEL_WORK {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// `dot_general` of `a` and `b` into a result of type `ty`.
pub(crate) fn dot_general(a: &Literal, b: &Literal, ty: &TensorType, d: &DotDims) -> Literal {
    let terms: usize = d.lc.iter().map(|&i| a.shape()[i as usize]).product();
    dot_general_on(a, b, ty, d, threads_for(ty.numel().saturating_mul(terms)))
}

/// `convolution` of `a` (input) and `w` (kernel) into a result of type `ty`.
pub(crate) fn convolution(a: &Literal, w: &Literal, ty: &TensorType, c: &ConvAttrs) -> Literal {
    let per_output = w.ty().numel() / w.shape()[c.kernel_dims[0] as usize].max(1);
    convolution_on(
        a,
        w,
        ty,
        c,
        threads_for(ty.numel().saturating_mul(per_output)),
    )
}

/// [`dot_general`] on `threads` threads.
fn dot_general_on(
    a: &Literal,
    b: &Literal,
    ty: &TensorType,
    d: &DotDims,
    threads: usize,
) -> Literal {
    let shapes = (a.shape(), b.shape());
    if ty.dtype.is_float() {
        let v = dot(&a.to_f64s(), &b.to_f64s(), shapes, d, threads);
        Literal::from_f64s(ty.clone(), &v).expect(VERIFIED)
    } else {
        let v = dot(&a.to_i64s(), &b.to_i64s(), shapes, d, threads);
        let v: Vec<i64> = v.into_iter().map(|x| wrap_to(ty.dtype, x)).collect();
        Literal::from_i64s(ty.clone(), &v).expect(VERIFIED)
    }
}

/// [`convolution`] on `threads` threads.
fn convolution_on(
    a: &Literal,
    w: &Literal,
    ty: &TensorType,
    c: &ConvAttrs,
    threads: usize,
) -> Literal {
    let shapes = (a.shape(), w.shape(), &ty.shape[..]);
    if ty.dtype.is_float() {
        let v = conv(&a.to_f64s(), &w.to_f64s(), shapes, c, threads);
        Literal::from_f64s(ty.clone(), &v).expect(VERIFIED)
    } else {
        let v = conv(&a.to_i64s(), &w.to_i64s(), shapes, c, threads);
        let v: Vec<i64> = v.into_iter().map(|x| wrap_to(ty.dtype, x)).collect();
        Literal::from_i64s(ty.clone(), &v).expect(VERIFIED)
    }
}

/// The dot product's elements, row-major in the result's order (batch, lhs free, rhs free).
///
/// With lhs copied as [batch, lhs free, contracting] and rhs as [batch, contracting, rhs free],
/// result row r (one batch and lhs free position) is the sum over contracting positions c of
/// lhs[r, c] times rhs row [batch, c]: `row += lhs[r, c] * rhs[batch, c, ..]`, c in order.
fn dot<T: Acc>(
    av: &[T],
    bv: &[T],
    (a_shape, b_shape): (&[usize], &[usize]),
    d: &DotDims,
    threads: usize,
) -> Vec<T> {
    let free = |rank: usize, batch: &[i64], contracting: &[i64]| -> Vec<usize> {
        (0..rank)
            .filter(|&i| !batch.contains(&(i as i64)) && !contracting.contains(&(i as i64)))
            .collect()
    };
    let dims = |v: &[i64]| -> Vec<usize> { v.iter().map(|&i| i as usize).collect() };
    let (lfree, rfree) = (
        free(a_shape.len(), d.lb, d.lc),
        free(b_shape.len(), d.rb, d.rc),
    );
    let size = |shape: &[usize], ds: &[usize]| -> usize { ds.iter().map(|&i| shape[i]).product() };
    let batches = size(a_shape, &dims(d.lb));
    let lhs_rows = size(a_shape, &lfree);
    let contract = size(a_shape, &dims(d.lc));
    let row_len = size(b_shape, &rfree);
    let lhs = transposed(av, a_shape, &[dims(d.lb), lfree, dims(d.lc)].concat());
    let rhs = transposed(bv, b_shape, &[dims(d.rb), dims(d.rc), rfree].concat());
    let mut out = vec![T::default(); batches * lhs_rows * row_len];
    fill_rows(&mut out, row_len, threads, |r, row| {
        let lhs = &lhs[r * contract..][..contract];
        let rhs = &rhs[r / lhs_rows * contract * row_len..][..contract * row_len];
        for (&x, rhs_row) in lhs.iter().zip(rhs.chunks_exact(row_len)) {
            for (s, &y) in row.iter_mut().zip(rhs_row) {
                *s = s.add_product(x, y);
            }
        }
    });
    out
}

/// The convolution's elements, row-major in the result's order (`output_dims`).
///
/// With batch groups, `batch` below is the result's batch: output feature group g reads the
/// g-th run of that many input batch elements.
///
/// With the input copied as [batch, feature, spatial...] and the kernel as [input feature,
/// kernel position..., output feature], the result is computed as [batch, spatial...,
/// output feature]: one row per output pixel, whose group g's elements are, for each input
/// feature ic of the group and kernel position k in row-major order, `row_g += x * w[ic, k,
/// g's output features]` with x the input at the position k reaches (or a zero of padding
/// or a dilation hole). The result is then put in `output_dims`' order.
fn conv<T: Acc>(
    av: &[T],
    wv: &[T],
    (a_shape, w_shape, out_shape): (&[usize], &[usize], &[usize]),
    c: &ConvAttrs,
    threads: usize,
) -> Vec<T> {
    let sp = a_shape.len() - 2;
    let (id, kd, od) = (
        |i: usize| c.input_dims[i] as usize,
        |i: usize| c.kernel_dims[i] as usize,
        |i: usize| c.output_dims[i] as usize,
    );
    let input = transposed(av, a_shape, &(0..sp + 2).map(id).collect::<Vec<_>>());
    let mut w_perm: Vec<usize> = (1..sp + 2).map(kd).collect();
    w_perm.push(kd(0));
    let kernel = transposed(wv, w_shape, &w_perm);
    // Feature groups or batch groups (one of the counts is 1): output feature group g reads
    // input feature group `g % feature_groups` of input batch group `g % batch_groups`.
    let (feature_groups, batch_groups) =
        (c.feature_group_count as usize, c.batch_group_count as usize);
    let (batch, in_features) = (a_shape[id(0)] / batch_groups, a_shape[id(1)]);
    let (k_out, k_in) = (w_shape[kd(0)], w_shape[kd(1)]);
    let per_group = k_out / (feature_groups * batch_groups);
    let in_spatial: Vec<usize> = (0..sp).map(|i| a_shape[id(2 + i)]).collect();
    let in_strides = strides(&in_spatial);
    let in_size: usize = in_spatial.iter().product();
    let k_spatial: Vec<usize> = (0..sp).map(|i| w_shape[kd(2 + i)]).collect();
    let positions: usize = k_spatial.iter().product();
    let out_spatial: Vec<usize> = (0..sp).map(|i| out_shape[od(2 + i)]).collect();
    let pixels: usize = out_spatial.iter().product();
    // The input offset (within one feature) that each kernel position reaches from output
    // pixel `o`, in row-major order of the positions; `None` for padding or a dilation hole.
    let window = |o: &[usize]| -> Vec<Option<usize>> {
        let mut v = Vec::with_capacity(positions);
        for_each_index(&k_spatial, |k| {
            let mut at = Some(0);
            for i in 0..sp {
                let pos = o[i] as i64 * c.window_strides[i] - c.padding[i].0
                    + k[i] as i64 * c.rhs_dilation[i];
                let dil = c.lhs_dilation[i];
                let inside = pos >= 0 && pos % dil == 0 && pos / dil < in_spatial[i] as i64;
                at = at
                    .filter(|_| inside)
                    .map(|a| a + (pos / dil) as usize * in_strides[i]);
            }
            v.push(at);
        });
        v
    };
    let mut out = vec![T::default(); batch * pixels * k_out];
    fill_rows(&mut out, k_out, threads, |p, row| {
        let (b, window) = (p / pixels, window(&unravel(p % pixels, &out_spatial)));
        for (g, acc) in row.chunks_exact_mut(per_group).enumerate() {
            for ic in 0..k_in {
                let image = g % batch_groups * batch + b;
                let feature = (image * in_features + g % feature_groups * k_in + ic) * in_size;
                let x_of = &input[feature..][..in_size];
                let weights = &kernel[ic * positions * k_out..][..positions * k_out];
                for (&at, w) in window.iter().zip(weights.chunks_exact(k_out)) {
                    let x = at.map_or(T::default(), |i| x_of[i]);
                    for (s, &y) in acc.iter_mut().zip(&w[g * per_group..][..per_group]) {
                        *s = s.add_product(x, y);
                    }
                }
            }
        }
    });
    // Dimension d of the result is the computed [batch, spatial..., feature]'s perm[d].
    let mut perm = vec![0; sp + 2];
    perm[od(1)] = sp + 1;
    for i in 0..sp {
        perm[od(2 + i)] = 1 + i;
    }
    let computed: Vec<usize> = [&[batch][..], &out_spatial[..], &[k_out][..]].concat();
    transposed(&out, &computed, &perm)
}

/// The multi-index of row-major position `i` in `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// `v` (row-major, of shape `shape`) with its dimensions reordered, as `transpose` does:
/// dimension d of the result is dimension `perm[d]` of `v`.
fn transposed<T: Copy>(v: &[T], shape: &[usize], perm: &[usize]) -> Vec<T> {
    let st = strides(shape);
    let to: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let step: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let mut out = Vec::with_capacity(v.len());
    for_each_index(&to, |i| {
        out.push(v[i.iter().zip(&step).map(|(i, s)| i * s).sum::<usize>()]);
    });
    out
}

/// Fills `out`, rows of `row_len` elements, with `row(r, row_r)` for each row r. With more
/// than one thread the rows are split into as many contiguous chunks, each computed on its own
/// scoped thread; every row is computed by one call, whatever the split.
fn fill_rows<T: Send>(
    out: &mut [T],
    row_len: usize,
    threads: usize,
    row: impl Fn(usize, &mut [T]) + Sync,
) {
    if row_len == 0 || out.is_empty() {
        return;
    }
    let rows = out.len() / row_len;
    let chunk = rows.div_ceil(threads.clamp(1, rows));
    let run = |first: usize, part: &mut [T]| {
        for (i, r) in part.chunks_exact_mut(row_len).enumerate() {
            row(first + i, r);
        }
    };
    if chunk == rows {
        return run(0, out);
    }
    std::thread::scope(|s| {
        for (k, part) in out.chunks_mut(chunk * row_len).enumerate() {
            let run = &run;
            s.spawn(move || run(k * chunk, part));
        }
    });
}

#[cfg(test)]
mod tests;

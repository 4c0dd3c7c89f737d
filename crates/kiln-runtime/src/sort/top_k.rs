//! A `sort` by keys whose users read only the first `k` elements of each slice
//! ([`kiln_kernel::sort::top_k`]), run without sorting the slices.
//!
//! Each element's key is an unsigned integer that orders as the comparator orders the
//! elements (as the whole sort's keys, see [`super`]: -0 as +0, NaN greatest when the
//! comparator says so, every bit flipped for descending). The first `k` of a slice in the
//! stable sort's order are its `k` least (key, position) pairs. One pass over the slice keeps
//! candidates: the first `k` elements, then every later element whose key is under the bar,
//! the key of the `k`-th least candidate (a later element with an equal key has a greater
//! position, so it goes after that one). The pass reads the keys in chunks, each chunk's least
//! key found without branches, and looks at a chunk element by element only when that least
//! key is under the bar; when the candidates fill their room they are cut back to the `k`
//! least, which lowers the bar. At the end the candidates are cut back once more, only the
//! `k` winners are sorted, and only they are written, for every operand; the rest of each
//! result slice, which no user reads, stays zero.

use super::Slices;
use kiln_ir::{Data, Literal};
use rayon::prelude::*;

/// Keys read between two looks at the bar.
const CHUNK: usize = 64;

/// The most candidates held for a top-`k` before they are cut back to `k`: cuts cost about
/// the candidates they sort through, so each lets at least `k` (and 256) more in.
fn room(k: usize) -> usize {
    k + k.max(256)
}

/// An f32's key, ascending: the sign bit flipped for positives, every bit for negatives, -0
/// as +0, NaN the greatest (a NaN is only met when the comparator counts it greatest).
#[inline(always)]
fn f32_key(x: f32) -> u32 {
    let b = x.to_bits();
    let b = if b == 1 << 31 { 0 } else { b };
    let key = b ^ (((b as i32 >> 31) as u32) | 1 << 31);
    if x.is_nan() { u32::MAX } else { key }
}

/// An f64's key, as [`f32_key`].
#[inline(always)]
fn f64_key(x: f64) -> u64 {
    let b = x.to_bits();
    let b = if b == 1 << 63 { 0 } else { b };
    let key = b ^ (((b as i64 >> 63) as u64) | 1 << 63);
    if x.is_nan() { u64::MAX } else { key }
}

/// Writes into `out` the positions of the first `out.len()` elements of `row` in the stable
/// order of their keys (`key`).
fn first_k<T: Copy, K: Copy + Ord>(row: &[T], out: &mut [u32], key: impl Fn(T) -> K + Copy) {
    let k = out.len();
    if k == 0 {
        return;
    }
    let room = room(k);
    let mut held: Vec<(K, u32)> = Vec::with_capacity(room);
    held.extend(
        row[..k]
            .iter()
            .enumerate()
            .map(|(i, &x)| (key(x), i as u32)),
    );
    let mut bar = cut(&mut held, k);
    let mut look = |chunk: &[T], start: usize, bar: &mut K| {
        for (j, &x) in chunk.iter().enumerate() {
            let kx = key(x);
            if kx < *bar {
                held.push((kx, (start + j) as u32));
                if held.len() == room {
                    *bar = cut(&mut held, k);
                }
            }
        }
    };
    let rest = &row[k..];
    let mut chunks = rest.chunks_exact(CHUNK);
    let mut start = k;
    for chunk in chunks.by_ref() {
        let least = chunk.iter().fold(bar, |m, &x| m.min(key(x)));
        if least < bar {
            look(chunk, start, &mut bar);
        }
        start += CHUNK;
    }
    look(chunks.remainder(), start, &mut bar);
    // The winners alone sorted; (key, position) pairs are distinct, so any sort of them is
    // the stable order.
    if held.len() > k {
        cut(&mut held, k);
    }
    held.sort_unstable();
    for (o, &(_, p)) in out.iter_mut().zip(&held) {
        *o = p;
    }
}

/// Cuts `held` (at least `k` candidates) back to its `k` least, and returns the key of the
/// `k`-th.
fn cut<K: Copy + Ord>(held: &mut Vec<(K, u32)>, k: usize) -> K {
    held.select_nth_unstable(k - 1);
    held.truncate(k);
    held[k - 1].0
}

/// The positions within its slice of each slice's first `k` (`k` per slice, slice after
/// slice) of `v`, ordered by `key`.
fn winners<T, K>(v: &[T], sl: &Slices, k: usize, key: impl Fn(T) -> K + Copy + Sync) -> Vec<u32>
where
    T: Copy + Send + Sync,
    K: Copy + Ord,
{
    let mut w = vec![0u32; sl.count * k];
    if k == 0 {
        return w;
    }
    w.par_chunks_mut(k).enumerate().for_each(|(s, out)| {
        if sl.stride == 1 {
            let base = sl.base(s);
            first_k(&v[base..base + sl.len], out, key);
        } else {
            let row: Vec<T> = (0..sl.len).map(|i| v[sl.position(s, i)]).collect();
            first_k(&row, out, key);
        }
    });
    w
}

/// `l` with each slice's first `k` positions holding its elements at `w`'s positions, and
/// zeros elsewhere.
fn gather(l: &Literal, sl: &Slices, k: usize, w: &[u32]) -> Literal {
    fn pick<T: Copy + Default>(v: &[T], sl: &Slices, k: usize, w: &[u32]) -> Vec<T> {
        let mut out = vec![T::default(); v.len()];
        for (s, ws) in w.chunks(k.max(1)).enumerate().take(sl.count) {
            for (i, &p) in ws.iter().enumerate() {
                out[sl.position(s, i)] = v[sl.position(s, p as usize)];
            }
        }
        out
    }
    let data = match l.data() {
        Data::Pred(v) => Data::Pred(pick(v, sl, k, w)),
        Data::I8(v) => Data::I8(pick(v, sl, k, w)),
        Data::I4(v) => Data::I4(pick(v, sl, k, w)),
        Data::U4(v) => Data::U4(pick(v, sl, k, w)),
        Data::I2(v) => Data::I2(pick(v, sl, k, w)),
        Data::U2(v) => Data::U2(pick(v, sl, k, w)),
        Data::I32(v) => Data::I32(pick(v, sl, k, w)),
        Data::I64(v) => Data::I64(pick(v, sl, k, w)),
        Data::U32(v) => Data::U32(pick(v, sl, k, w)),
        Data::U8(v) => Data::U8(pick(v, sl, k, w)),
        Data::I16(v) => Data::I16(pick(v, sl, k, w)),
        Data::U16(v) => Data::U16(pick(v, sl, k, w)),
        Data::U64(v) => Data::U64(pick(v, sl, k, w)),
        Data::F16(v) => Data::F16(pick(v, sl, k, w)),
        Data::BF16(v) => Data::BF16(pick(v, sl, k, w)),
        Data::F32(v) => Data::F32(pick(v, sl, k, w)),
        Data::F64(v) => Data::F64(pick(v, sl, k, w)),
        Data::Mini(m, v) => Data::Mini(*m, pick(v, sl, k, w)),
        Data::C64(v) => Data::C64(pick(v, sl, k, w)),
        Data::C128(v) => Data::C128(pick(v, sl, k, w)),
    };
    Literal::new(l.ty().clone(), data).expect("the operand's own type")
}

/// The results of a sort of `x` by operand `operand`'s keys whose users read only the first
/// `k` elements of each slice of `sl`: those hold what the whole sort puts there, the rest
/// zeros. `None` for keys the comparator leaves unordered (a NaN under a bare `LT`) or that
/// have no order (complex numbers), or a `k` over the slices' length: the whole sort runs.
pub(super) fn top_k(
    x: &[&Literal],
    sl: &Slices,
    k: usize,
    operand: usize,
    descending: bool,
    nan_greatest: bool,
) -> Option<Vec<Literal>> {
    if k > sl.len {
        return None;
    }
    let (f32s, f64s) = if descending {
        (u32::MAX, u64::MAX)
    } else {
        (0, 0)
    };
    // Integer keys: as the whole sort's (signed ones with the sign bit flipped).
    let s32 = move |x: i32| (x as u32 ^ 1 << 31) ^ f32s;
    let u32s = move |x: u32| x ^ f32s;
    let fl = move |x: f32| f32_key(x) ^ f32s;
    // Under a bare `LT` a NaN is unordered: the whole sort's comparisons decide.
    let unordered = |nan: &dyn Fn() -> bool| !nan_greatest && nan();
    let w = match x.get(operand)?.data() {
        Data::Pred(v) => winners(v, sl, k, move |x: bool| u32s(x as u32)),
        Data::U8(v) | Data::U4(v) | Data::U2(v) => winners(v, sl, k, move |x: u8| u32s(x as u32)),
        Data::U16(v) => winners(v, sl, k, move |x: u16| u32s(x as u32)),
        Data::U32(v) => winners(v, sl, k, u32s),
        Data::U64(v) => winners(v, sl, k, move |x: u64| x ^ f64s),
        Data::I8(v) | Data::I4(v) | Data::I2(v) => winners(v, sl, k, move |x: i8| s32(x as i32)),
        Data::I16(v) => winners(v, sl, k, move |x: i16| s32(x as i32)),
        Data::I32(v) => winners(v, sl, k, s32),
        Data::I64(v) => winners(v, sl, k, move |x: i64| (x as u64 ^ 1 << 63) ^ f64s),
        Data::F32(v) => {
            if unordered(&|| v.par_iter().any(|x| x.is_nan())) {
                return None;
            }
            winners(v, sl, k, fl)
        }
        Data::F16(v) => {
            if unordered(&|| v.iter().any(|x| x.is_nan())) {
                return None;
            }
            winners(v, sl, k, move |x: half::f16| fl(x.to_f32()))
        }
        Data::BF16(v) => {
            if unordered(&|| v.iter().any(|x| x.is_nan())) {
                return None;
            }
            winners(v, sl, k, move |x: half::bf16| fl(x.to_f32()))
        }
        Data::Mini(m, v) => {
            let m = *m;
            if unordered(&|| v.iter().any(|&c| m.to_f32(c).is_nan())) {
                return None;
            }
            winners(v, sl, k, move |c: u8| fl(m.to_f32(c)))
        }
        Data::F64(v) => {
            if unordered(&|| v.iter().any(|x| x.is_nan())) {
                return None;
            }
            winners(v, sl, k, move |x: f64| f64_key(x) ^ f64s)
        }
        Data::C64(_) | Data::C128(_) => return None,
    };
    Some(x.iter().map(|l| gather(l, sl, k, &w)).collect())
}

#[cfg(test)]
mod tests;

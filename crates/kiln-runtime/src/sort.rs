//! Running a `sort` step as its plan says ([`kiln_kernel::sort::SortPlan`]).
//!
//! By keys: each element of the key operand becomes an unsigned integer that orders as the
//! comparator orders the elements (floats: the sign bit flipped for positives, every bit for
//! negatives; -0 counts as +0, which `LT` does not tell apart; descending: every bit flipped),
//! and each slice is sorted by a least-significant-digit radix sort on bytes, which is stable,
//! so equal keys keep their order exactly as the comparator's stable sort keeps them; a slice
//! of at least `radix::PARALLEL_MIN` keys sorts on every thread, by 11-bit digits
//! ([`crate::radix`]), and its float keys are made on every thread too. A key
//! operand with a NaN, which `LT` leaves unordered, sorts by the comparison itself in the
//! reference interpreter's merge sort, giving its permutation. With one operand and no -0
//! the sorted keys are turned back into elements; otherwise the slices' permutations move
//! every operand. One long f32 operand sorted by itself (one slice, no NaN, no -0) goes to the
//! radix sort as it is: its first read and pass make the keys, and its last pass writes the
//! sorted elements into the fresh result.
//!
//! By keys, when the users read only a short prefix of each slice
//! ([`kiln_kernel::sort::top_k`]): [`top_k`]'s one pass over each slice's keys.
//!
//! By comparator: the reference's merge sort, each comparison a call of the compiled region.

use crate::{Error, Region};
use kiln_ir::{Data, Literal, TensorType};
use kiln_kernel::sort::SortPlan;
use rayon::prelude::*;

/// Slices shorter than this sort by comparisons (the radix passes' fixed costs outweigh
/// them).
const SHORT: usize = 64;

/// The elements of `l` as order-preserving unsigned keys (descending: reversed), with
/// whether a key stands for several elements (a -0 or a NaN was met); at a NaN, `None`
/// unless `nan_greatest` (then every NaN is the greatest key).
fn keys(l: &Literal, descending: bool, nan_greatest: bool) -> Option<(Keys, bool)> {
    fn f32_key(x: f32) -> u32 {
        let b = if x == 0.0 { 0 } else { x.to_bits() };
        if b >> 31 == 1 { !b } else { b | 1 << 31 }
    }
    fn f64_key(x: f64) -> u64 {
        let b = if x == 0.0 { 0 } else { x.to_bits() };
        if b >> 63 == 1 { !b } else { b | 1 << 63 }
    }
    // Float keys: `None` at a NaN, and whether a -0 was met.
    let float32 = |v: &mut dyn Iterator<Item = f32>| -> Option<(Keys, bool)> {
        let mut lossy = false;
        let mut k = Vec::with_capacity(v.size_hint().0);
        for x in v {
            if x.is_nan() {
                if !nan_greatest {
                    return None;
                }
                lossy = true;
                k.push(u32::MAX);
                continue;
            }
            lossy |= x == 0.0 && x.is_sign_negative();
            k.push(f32_key(x));
        }
        Some((Keys::U32(k), lossy))
    };
    let (keys, nz) = match l.data() {
        Data::Pred(v) => (Keys::U32(v.iter().map(|&b| b as u32).collect()), false),
        Data::U8(v) | Data::U4(v) | Data::U2(v) => {
            (Keys::U32(v.iter().map(|&x| x as u32).collect()), false)
        }
        Data::U32(v) => (Keys::U32(v.clone()), false),
        Data::U16(v) => (Keys::U32(v.iter().map(|&x| x as u32).collect()), false),
        Data::U64(v) => (Keys::U64(v.clone()), false),
        Data::I8(v) | Data::I4(v) | Data::I2(v) => (
            Keys::U32(v.iter().map(|&x| (x as i32 as u32) ^ 1 << 31).collect()),
            false,
        ),
        Data::I16(v) => (
            Keys::U32(v.iter().map(|&x| (x as i32 as u32) ^ 1 << 31).collect()),
            false,
        ),
        Data::I32(v) => (
            Keys::U32(v.iter().map(|&x| (x as u32) ^ 1 << 31).collect()),
            false,
        ),
        Data::I64(v) => (
            Keys::U64(v.iter().map(|&x| (x as u64) ^ 1 << 63).collect()),
            false,
        ),
        Data::F32(v) if v.len() >= crate::radix::PARALLEL_MIN => {
            // Long keys: converted on every thread.
            let nan = v.par_iter().any(|x| x.is_nan());
            if nan && !nan_greatest {
                return None;
            }
            let nz = v.par_iter().any(|&x| x == 0.0 && x.is_sign_negative());
            let k = v
                .par_iter()
                .map(|&x| if x.is_nan() { u32::MAX } else { f32_key(x) })
                .collect();
            (Keys::U32(k), nz || nan)
        }
        Data::F32(v) => float32(&mut v.iter().copied())?,
        // Complex numbers have no order: a sort of them runs its comparator.
        Data::C64(_) | Data::C128(_) => return None,
        Data::F16(v) => float32(&mut v.iter().map(|x| x.to_f32()))?,
        Data::BF16(v) => float32(&mut v.iter().map(|x| x.to_f32()))?,
        Data::Mini(m, v) => float32(&mut v.iter().map(|&c| m.to_f32(c)))?,
        Data::F64(v) => {
            let nan = v.iter().any(|x| x.is_nan());
            if nan && !nan_greatest {
                return None;
            }
            let nz = v.iter().any(|&x| x == 0.0 && x.is_sign_negative());
            let k = v
                .iter()
                .map(|&x| if x.is_nan() { u64::MAX } else { f64_key(x) })
                .collect();
            (Keys::U64(k), nz || nan)
        }
    };
    Some((if descending { keys.reversed() } else { keys }, nz))
}

/// f32 elements as keys that order as the comparator orders them, when none is a NaN or a -0
/// (the radix sort declines those): the sign bit flipped for positives, every bit for
/// negatives, and every bit again for descending.
struct F32Keys {
    /// All ones for descending, else zero.
    flip: u32,
}

impl F32Keys {
    fn new(descending: bool) -> F32Keys {
        F32Keys {
            flip: if descending { u32::MAX } else { 0 },
        }
    }
}

impl crate::radix::Codec for F32Keys {
    type In = f32;
    type Key = u32;
    type Out = f32;
    #[inline(always)]
    fn admits(&self, x: f32) -> bool {
        // Neither a NaN (magnitude bits above the infinity's) nor -0, in integer operations
        // (`is_nan` compiles to a classification several times as long, in the loop that
        // counts the keys).
        let b = x.to_bits();
        b & !(1 << 31) <= 0x7f80_0000 && b != 1 << 31
    }
    #[inline(always)]
    fn key(&self, x: f32) -> u32 {
        let b = x.to_bits();
        // All ones for a negative, the sign bit alone for a positive.
        let mask = ((b as i32 >> 31) as u32) | 1 << 31;
        (b ^ mask) ^ self.flip
    }
    #[inline(always)]
    fn element(&self, k: u32) -> f32 {
        let k = k ^ self.flip;
        // A key with its top bit set is a positive's: clear it; otherwise flip every bit.
        let mask = (((k as i32) >> 31) as u32 ^ u32::MAX) | 1 << 31;
        f32::from_bits(k ^ mask)
    }
}

/// Keys of one width.
enum Keys {
    U32(Vec<u32>),
    U64(Vec<u64>),
}

impl Keys {
    fn reversed(self) -> Keys {
        match self {
            Keys::U32(v) => Keys::U32(v.into_iter().map(|k| !k).collect()),
            Keys::U64(v) => Keys::U64(v.into_iter().map(|k| !k).collect()),
        }
    }
}

/// An unsigned key the one-thread radix sort reads a byte at a time.
trait ByteKey: crate::radix::RadixKey + Ord {
    const BYTES: usize;
    fn byte(self, i: usize) -> usize;
}

impl ByteKey for u32 {
    const BYTES: usize = 4;
    fn byte(self, i: usize) -> usize {
        (self >> (8 * i)) as usize & 0xff
    }
}

impl ByteKey for u64 {
    const BYTES: usize = 8;
    fn byte(self, i: usize) -> usize {
        (self >> (8 * i)) as usize & 0xff
    }
}

/// Every byte's histogram of `keys`, in one pass.
fn histograms<K: ByteKey>(keys: &[K]) -> Vec<[usize; 256]> {
    let mut h = vec![[0usize; 256]; K::BYTES];
    for &k in keys {
        for (i, hi) in h.iter_mut().enumerate() {
            hi[k.byte(i)] += 1;
        }
    }
    h
}

/// The passes that move something (a byte where the keys differ), with each one's starting
/// offsets per bucket.
fn passes<K: ByteKey>(keys: &[K]) -> Vec<(usize, [usize; 256])> {
    let n = keys.len();
    histograms(keys)
        .into_iter()
        .enumerate()
        .filter(|(_, h)| !h.contains(&n))
        .map(|(i, h)| {
            let mut start = [0usize; 256];
            let mut sum = 0;
            for (s, c) in start.iter_mut().zip(h) {
                *s = sum;
                sum += c;
            }
            (i, start)
        })
        .collect()
}

/// Sorts `keys` ascending (stable), carrying `idx` along when it is given.
fn radix_sort<K: ByteKey>(keys: &mut Vec<K>, mut idx: Option<&mut Vec<u32>>) {
    let n = keys.len();
    let mut kb = vec![K::default(); n];
    let mut ib = vec![0u32; if idx.is_some() { n } else { 0 }];
    for (byte, mut start) in passes(keys) {
        match idx.as_deref_mut() {
            Some(ix) => {
                for (&k, &i) in keys.iter().zip(ix.iter()) {
                    let d = &mut start[k.byte(byte)];
                    kb[*d] = k;
                    ib[*d] = i;
                    *d += 1;
                }
                std::mem::swap(ix, &mut ib);
            }
            None => {
                for &k in keys.iter() {
                    let d = &mut start[k.byte(byte)];
                    kb[*d] = k;
                    *d += 1;
                }
            }
        }
        std::mem::swap(keys, &mut kb);
    }
}

/// The order of one slice's keys: positions within the slice, sorted stably.
fn slice_order<K: ByteKey>(keys: Vec<K>) -> Vec<u32> {
    if keys.len() < SHORT {
        let mut pos: Vec<usize> = (0..keys.len()).collect();
        kiln_reference::merge_sort_by(&mut pos, &mut |a, b| keys[a] < keys[b]);
        return pos.into_iter().map(|p| p as u32).collect();
    }
    if keys.len() >= crate::radix::PARALLEL_MIN {
        let (_, positions) =
            crate::radix::sort(&crate::radix::Plain::new(), &keys, true).expect("plain keys");
        return positions.expect("positions asked for");
    }
    let mut idx: Vec<u32> = (0..keys.len() as u32).collect();
    let mut keys = keys;
    radix_sort(&mut keys, Some(&mut idx));
    idx
}

/// The slices of `shape` along `dimension`: their count, length and stride, and the first
/// position of slice `s`.
struct Slices {
    count: usize,
    len: usize,
    stride: usize,
}

impl Slices {
    fn new(shape: &[usize], dimension: usize) -> Slices {
        let len = shape[dimension];
        let stride: usize = shape[dimension + 1..].iter().product();
        let n: usize = shape.iter().product();
        Slices {
            count: n.checked_div(len).unwrap_or(0),
            len,
            stride,
        }
    }
    fn base(&self, s: usize) -> usize {
        (s / self.stride) * self.stride * self.len + s % self.stride
    }
    fn position(&self, s: usize, i: usize) -> usize {
        self.base(s) + i * self.stride
    }
}

/// The permutation (result position -> source position) sorting every slice by `keys`.
fn keyed_permutation<K: ByteKey>(keys: &[K], sl: &Slices) -> Vec<usize> {
    let n = keys.len();
    let orders: Vec<Vec<u32>> = (0..sl.count)
        .into_par_iter()
        .map(|s| {
            let slice = (0..sl.len).map(|i| keys[sl.position(s, i)]).collect();
            slice_order(slice)
        })
        .collect();
    let mut perm = vec![0usize; n];
    for (s, order) in orders.into_iter().enumerate() {
        for (i, &o) in order.iter().enumerate() {
            perm[sl.position(s, i)] = sl.position(s, o as usize);
        }
    }
    perm
}

/// One f32 operand sorted by its own keys (no -0, no NaN: each key one element) along contiguous slices: each
/// slice's keys sorted and turned back into elements, with no permutation to carry.
fn sorted_f32_keys(l: &Literal, mut k: Vec<u32>, descending: bool, len: usize) -> Literal {
    k.par_chunks_mut(len.max(1)).for_each(sort_f32_slice);
    let back = |k: u32| {
        let k = if descending { !k } else { k };
        f32::from_bits(if k >> 31 == 1 { k & !(1 << 31) } else { !k })
    };
    Literal::new(
        l.ty().clone(),
        Data::F32(k.into_par_iter().map(back).collect()),
    )
    .expect("the operand's own type")
}

/// One slice of [`sorted_f32_keys`]'s keys sorted.
fn sort_f32_slice(c: &mut [u32]) {
    if c.len() < SHORT {
        c.sort_unstable();
    } else if c.len() >= crate::radix::PARALLEL_MIN {
        let (v, _) = crate::radix::sort(&crate::radix::Plain::new(), c, false).expect("plain keys");
        c.copy_from_slice(&v);
    } else {
        let mut v = c.to_vec();
        radix_sort(&mut v, None);
        c.copy_from_slice(&v);
    }
}

/// Runs a `sort` of the operands `x` along `dimension` as `plan` says; `comparator` is the
/// comparator's compiled program (needed by [`SortPlan::Comparator`] only). With `top_k`
/// (`kiln_kernel::sort::top_k`: the users read only that many leading elements of each
/// slice), a sort by keys runs as [`top_k::top_k`], which writes only those; the rest of each
/// result slice is zeros.
pub(crate) fn sort(
    x: &[&Literal],
    dimension: usize,
    plan: SortPlan,
    comparator: Option<&dyn Region>,
    top_k: Option<usize>,
) -> Result<Vec<Literal>, Error> {
    let shape = x[0].shape().to_vec();
    let sl = Slices::new(&shape, dimension);
    if let (
        SortPlan::Keys {
            operand,
            descending,
            nan_greatest,
        },
        Some(k),
    ) = (plan, top_k)
        && let Some(out) = top_k::top_k(x, &sl, k, operand, descending, nan_greatest)
    {
        return Ok(out);
    }
    if let (SortPlan::Keys { descending, .. }, [l], Data::F32(v)) = (plan, x, x[0].data())
        && sl.count == 1
        && sl.len >= crate::radix::PARALLEL_MIN
        && let Some((sorted, _)) = crate::radix::sort(&F32Keys::new(descending), v, false)
    {
        // One long f32 slice sorted by itself, without a NaN or a -0 (each key one element):
        // the keys made by the first pass and turned back by the last.
        return Ok(vec![
            Literal::new(l.ty().clone(), Data::F32(sorted)).expect("the operand's own type"),
        ]);
    }
    let perm = match plan {
        SortPlan::Keys {
            operand,
            descending,
            nan_greatest,
        } => match keys(x[operand], descending, nan_greatest) {
            Some((k, lossy)) => match k {
                Keys::U32(v) => {
                    let own = x.len() == 1 && !lossy && sl.stride == 1;
                    if own && matches!(x[0].data(), Data::F32(_)) {
                        return Ok(vec![sorted_f32_keys(x[0], v, descending, sl.len)]);
                    }
                    keyed_permutation(&v, &sl)
                }
                Keys::U64(v) => keyed_permutation(&v, &sl),
            },
            None => {
                // NaN keys: the comparison itself, as the reference's merge sort makes it.
                let v = x[operand].to_f64s();
                let mut less = |a: usize, b: usize| {
                    if descending { v[a] > v[b] } else { v[a] < v[b] }
                };
                kiln_reference::sort_permutation(&shape, dimension, &mut less)
            }
        },
        SortPlan::Comparator => {
            let comparator = comparator
                .ok_or_else(|| Error("sort: its comparator has no compiled program".to_string()))?;
            let scalars: Vec<TensorType> =
                x.iter().map(|l| TensorType::new(l.dtype(), [])).collect();
            let mut failed: Option<Error> = None;
            let mut less = |a: usize, b: usize| {
                if failed.is_some() {
                    return false;
                }
                let mut args = Vec::with_capacity(2 * x.len());
                for (l, t) in x.iter().zip(&scalars) {
                    args.push(kiln_reference::take_positions(l, t, &[a]));
                    args.push(kiln_reference::take_positions(l, t, &[b]));
                }
                let refs: Vec<&Literal> = args.iter().collect();
                match comparator.run_region(&refs) {
                    Ok(out) => out
                        .first()
                        .is_some_and(|p| p.to_i64s().first().is_some_and(|&v| v != 0)),
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                }
            };
            let perm = kiln_reference::sort_permutation(&shape, dimension, &mut less);
            if let Some(e) = failed {
                return Err(e);
            }
            perm
        }
    };
    Ok(x.iter()
        .map(|l| kiln_reference::take_positions(l, l.ty(), &perm))
        .collect())
}

mod top_k;

#[cfg(test)]
mod tests;

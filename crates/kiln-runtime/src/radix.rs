//! A parallel radix sort for long runs of unsigned keys, stable, that reads its elements
//! through a [`Codec`] (the key transform fused into the first read and the first pass) and
//! writes a fresh result through it (the transform undone as the last pass writes), with an
//! optional payload of positions moved alongside.
//!
//! Digits are 11 bits (2048 buckets), so 32-bit keys have 3 and 64-bit ones 6; the passes
//! that sort a bucket of the top digit take 7-bit digits for 32-bit keys
//! ([`RadixKey::LOW_BITS`]). Every scatter asks for each bucket's next line ahead of its
//! writes ([`AHEAD_BYTES`]). One read of the elements counts the top digit's values per chunk
//! (one chunk per thread) and asks the codec whether it takes every element. Then, when no
//! bucket of the top digit holds more than an eighth of the keys, the keys are scattered by
//! the top digit (each chunk into its own range of every bucket, chunks in order within a
//! bucket, so the pass is stable), and the buckets, on every thread, are each sorted by the
//! lower digits least significant first (those it does not share, counted in a read of the
//! bucket), in memory that a bucket's passes keep in the caches. Otherwise a second read
//! counts every digit's values per chunk, and every digit is a pass over all the
//! keys, least significant first, each split into one chunk per thread the same way; a digit
//! all keys share is skipped, and each pass after the first counts its digit per chunk in a
//! read of its own. Either way the passes alternate between the result and one scratch buffer
//! so that the last one writes the result, and since the sorted order is unique, the result
//! does not depend on the threads.

use rayon::prelude::*;

/// Bits per digit.
const BITS: u32 = 11;
/// Buckets per digit.
const BUCKETS: usize = 1 << BITS;

/// Keys at least this long sort with [`sort`] (shorter ones: one thread's radix sort on bytes,
/// whose fixed costs are lower).
pub(crate) const PARALLEL_MIN: usize = 1 << 18;

/// The top digit goes first when no bucket of it holds more than this fraction of the keys
/// (each bucket is then sorted on one thread).
const SPREAD: usize = 8;

/// An unsigned key, read a digit at a time.
pub(crate) trait RadixKey: Copy + Default + Send + Sync {
    /// Bits in the key.
    const KEY_BITS: u32;
    /// Bits per digit of the passes that sort a bucket of the top digit (see
    /// [`Buffers::sort_bucket`]): narrower digits make more passes over a bucket, each
    /// scattering to fewer places. The 21 bits below a 32-bit key's top digit sort in three
    /// passes of 7 bits faster than in two of 11 (normal f32 keys, whose buckets reach 3.5 MiB:
    /// 117 against 147 ms of CPU for 16·2²⁰ keys on an Intel Xeon, family 6 model 207); a 64-bit
    /// key's 53 keep 11 (five passes, not eight).
    const LOW_BITS: u32;
    /// The `width` bits at `shift`.
    fn bits(self, shift: u32, width: u32) -> usize;
    /// The digit at `shift`.
    #[inline(always)]
    fn digit(self, shift: u32) -> usize {
        self.bits(shift, BITS)
    }
}

impl RadixKey for u32 {
    const KEY_BITS: u32 = 32;
    const LOW_BITS: u32 = 7;
    #[inline(always)]
    fn bits(self, shift: u32, width: u32) -> usize {
        (self >> shift) as usize & ((1 << width) - 1)
    }
}

impl RadixKey for u64 {
    const KEY_BITS: u32 = 64;
    const LOW_BITS: u32 = 11;
    #[inline(always)]
    fn bits(self, shift: u32, width: u32) -> usize {
        (self >> shift) as usize & ((1 << width) - 1)
    }
}

/// How the sort reads its elements as keys and writes keys back as elements. `Out` must have
/// the size and alignment of `Key`: the passes before the last keep keys in the result's
/// memory.
pub(crate) trait Codec: Sync {
    /// The elements read.
    type In: Copy + Sync;
    /// Their keys, ordered as the elements sort.
    type Key: RadixKey;
    /// The elements written.
    type Out: Copy + Send + Sync;
    /// Whether the keys can stand for `x` (otherwise the sort declines, see [`sort`]).
    fn admits(&self, x: Self::In) -> bool;
    /// The key of `x`.
    fn key(&self, x: Self::In) -> Self::Key;
    /// The element of key `k`.
    fn element(&self, k: Self::Key) -> Self::Out;
}

/// Keys sorted as they are.
pub(crate) struct Plain<K>(std::marker::PhantomData<K>);

impl<K> Plain<K> {
    pub(crate) fn new() -> Plain<K> {
        Plain(std::marker::PhantomData)
    }
}

impl<K: RadixKey> Codec for Plain<K> {
    type In = K;
    type Key = K;
    type Out = K;
    fn admits(&self, _: K) -> bool {
        true
    }
    #[inline(always)]
    fn key(&self, x: K) -> K {
        x
    }
    #[inline(always)]
    fn element(&self, k: K) -> K {
        k
    }
}

/// The shift of digit `d` of a `K`: `d` digits up, except the top digit, which ends at the
/// key's top bit (and so shares bits with the digit below it, which is harmless: they are
/// equal wherever the top digits tie).
const fn shift<K: RadixKey>(d: u32) -> u32 {
    let s = d * BITS;
    if s + BITS > K::KEY_BITS {
        K::KEY_BITS - BITS
    } else {
        s
    }
}

/// A pointer the scatter's threads write through, each to ranges of its own.
#[derive(Clone, Copy)]
struct Out<T>(*mut T);

// SAFETY: a scatter gives every (chunk, bucket) pair a disjoint range of its output, and each
// thread writes only the ranges of its own chunk; a bucket sorted on its own is read and
// written by one thread. So no two threads touch one element.
unsafe impl<T: Send> Send for Out<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Out<T> {}

/// Sorted elements, with the source position of each when asked for.
pub(crate) type Sorted<T> = (Vec<T>, Option<Vec<u32>>);

/// The sorted elements of `x` (ascending by key, stable), with the source position of each
/// when `positions`; `None` when the codec does not admit some element.
pub(crate) fn sort<C: Codec>(codec: &C, x: &[C::In], positions: bool) -> Option<Sorted<C::Out>> {
    const {
        assert!(std::mem::size_of::<C::Out>() == std::mem::size_of::<C::Key>());
        assert!(std::mem::align_of::<C::Out>() == std::mem::align_of::<C::Key>());
    }
    let n = x.len();
    let digits = C::Key::KEY_BITS.div_ceil(BITS) as usize;
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads).max(1);
    let chunks = n.div_ceil(chunk);
    // Every chunk's count of the top digit, if the codec admits the chunk: the one read before
    // the top digit's scatter (each of its buckets counts its lower digits itself).
    let first: Vec<Option<Vec<usize>>> = x
        .par_chunks(chunk)
        .map(|c| top_counts_admitted(codec, c))
        .collect();
    let top_counts: Vec<usize> = first.into_iter().collect::<Option<Vec<_>>>()?.concat();
    let top_totals: Vec<usize> = (0..BUCKETS)
        .map(|b| (0..chunks).map(|c| top_counts[c * BUCKETS + b]).sum())
        .collect();
    if top_totals.iter().all(|&t| t <= n / SPREAD) {
        return Some(by_top_digit(
            codec,
            x,
            positions,
            &top_counts,
            &top_totals,
            chunk,
        ));
    }
    // Every chunk's count of every digit, in a second read.
    let first: Vec<Vec<usize>> = x
        .par_chunks(chunk)
        .map(|c| count_every_digit(c, |e| codec.key(e), digits))
        .collect();
    // The digits where keys differ (at least one pass, which then only copies), each with its
    // count per (chunk, bucket) from the first read.
    let mut passes: Vec<(u32, Vec<usize>)> = Vec::new();
    for d in 0..digits {
        let counts: Vec<usize> = first
            .iter()
            .flat_map(|h| h[d * BUCKETS..(d + 1) * BUCKETS].iter().copied())
            .collect();
        let constant =
            (0..BUCKETS).any(|b| (0..chunks).map(|c| counts[c * BUCKETS + b]).sum::<usize>() == n);
        if !constant || (passes.is_empty() && d + 1 == digits) {
            passes.push((shift::<C::Key>(d as u32), counts));
        }
    }
    let mut out: Vec<C::Out> = Vec::with_capacity(n);
    let mut scratch: Vec<C::Key> = Vec::with_capacity(if passes.len() > 1 { n } else { 0 });
    let mut pos_out: Vec<u32> = Vec::with_capacity(if positions { n } else { 0 });
    let mut pos_scratch: Vec<u32> =
        Vec::with_capacity(if positions && passes.len() > 1 { n } else { 0 });
    let last = passes.len() - 1;
    let mut counts = std::mem::take(&mut passes[0].1);
    for j in 0..passes.len() {
        let shift = passes[j].0;
        // The pass writes the result when an even number of passes follow it; the others
        // alternate with it, so the first one reads `x` and the last one writes the result.
        let to_out = (last - j).is_multiple_of(2);
        let pn = if positions { n } else { 0 };
        let (key_dst, pos_dst) = if to_out {
            (
                Out(out.as_mut_ptr().cast::<C::Key>()),
                Out(pos_out.as_mut_ptr()),
            )
        } else {
            (Out(scratch.as_mut_ptr()), Out(pos_scratch.as_mut_ptr()))
        };
        let out_dst = Out(out.as_mut_ptr());
        // SAFETY: a pass after the first reads all `n` keys (and positions, when carried) the
        // pass before wrote to the other buffer; the result's memory holds keys of the same
        // size and alignment until the last pass.
        let (key_src, pos_src): (&[C::Key], &[u32]) = match (j, to_out) {
            (0, _) => (&[], &[]),
            (_, true) => unsafe {
                (
                    std::slice::from_raw_parts(scratch.as_ptr(), n),
                    std::slice::from_raw_parts(pos_scratch.as_ptr(), pn),
                )
            },
            (_, false) => unsafe {
                (
                    std::slice::from_raw_parts(out.as_ptr().cast::<C::Key>(), n),
                    std::slice::from_raw_parts(pos_out.as_ptr(), pn),
                )
            },
        };
        let starts = starts(&counts, chunks);
        (0..chunks).into_par_iter().for_each(|c| {
            let (lo, hi) = (c * chunk, ((c + 1) * chunk).min(n));
            let begin = &starts[c * BUCKETS..(c + 1) * BUCKETS];
            let (key_dst, pos_dst, out_dst) = (key_dst, pos_dst, out_dst);
            let id = |k| k;
            let el = |k| codec.element(k);
            let ks = |e| codec.key(e);
            // One scatter per (source, destination) and with or without positions, each
            // monomorphized: the first pass reads `x` through the codec, later ones the
            // keys the pass before wrote; the last writes elements into the result.
            macro_rules! scatter_to {
                ($src:expr, $key:expr, $pos:expr, $dst:expr, $put:expr) => {
                    if positions {
                        scatter(
                            $src,
                            $key,
                            $pos,
                            true,
                            (shift, BITS),
                            begin,
                            $dst,
                            $put,
                            pos_dst.0,
                        )
                    } else {
                        scatter(
                            $src,
                            $key,
                            |_| 0,
                            false,
                            (shift, BITS),
                            begin,
                            $dst,
                            $put,
                            pos_dst.0,
                        )
                    }
                };
            }
            let first = |i| (lo + i) as u32;
            let later = |i| pos_src[lo + i];
            // SAFETY (every call): `begin` gives this chunk's own ranges of the destinations,
            // which have room for `n` elements (and positions, when carried).
            unsafe {
                match (j == 0, j == last) {
                    (true, true) => scatter_to!(&x[lo..hi], ks, first, out_dst.0, el),
                    (true, false) => scatter_to!(&x[lo..hi], ks, first, key_dst.0, id),
                    (false, true) => scatter_to!(&key_src[lo..hi], id, later, out_dst.0, el),
                    (false, false) => scatter_to!(&key_src[lo..hi], id, later, key_dst.0, id),
                }
            }
        });
        if let Some(&(next, _)) = passes.get(j + 1) {
            // SAFETY: this pass wrote all `n` keys to `key_dst`.
            let written = unsafe { std::slice::from_raw_parts(key_dst.0.cast_const(), n) };
            counts = chunk_counts(written, chunk, next);
        }
    }
    // SAFETY: the last pass wrote every one of the `n` elements (and positions, when carried).
    unsafe {
        out.set_len(n);
        if positions {
            pos_out.set_len(n);
        }
    }
    Some((out, positions.then_some(pos_out)))
}

/// The sort by the top digit first, then each of its buckets by the other digits (see the
/// module doc): `top_counts` per (chunk, bucket), `top_totals` per bucket.
fn by_top_digit<C: Codec>(
    codec: &C,
    x: &[C::In],
    positions: bool,
    top_counts: &[usize],
    top_totals: &[usize],
    chunk: usize,
) -> Sorted<C::Out> {
    let n = x.len();
    let chunks = n.div_ceil(chunk);
    let top_shift = C::Key::KEY_BITS - BITS;
    let mut out: Vec<C::Out> = Vec::with_capacity(n);
    let mut scratch: Vec<C::Key> = Vec::with_capacity(n);
    let pn = if positions { n } else { 0 };
    let mut pos_out: Vec<u32> = Vec::with_capacity(pn);
    let mut pos_scratch: Vec<u32> = Vec::with_capacity(pn);
    let keys = Out(out.as_mut_ptr().cast::<C::Key>());
    let pos = Out(pos_out.as_mut_ptr());
    let starts = starts(top_counts, chunks);
    (0..chunks).into_par_iter().for_each(|c| {
        let (lo, hi) = (c * chunk, ((c + 1) * chunk).min(n));
        let begin = &starts[c * BUCKETS..(c + 1) * BUCKETS];
        let (keys, pos) = (keys, pos);
        let ks = |e| codec.key(e);
        // SAFETY: `begin` gives this chunk's own ranges of the result's memory, which has
        // room for `n` keys (of the elements' size) and, when carried, positions.
        unsafe {
            if positions {
                let ps = |i| (lo + i) as u32;
                scatter(
                    &x[lo..hi],
                    ks,
                    ps,
                    true,
                    (top_shift, BITS),
                    begin,
                    keys.0,
                    |k| k,
                    pos.0,
                )
            } else {
                scatter(
                    &x[lo..hi],
                    ks,
                    |_| 0,
                    false,
                    (top_shift, BITS),
                    begin,
                    keys.0,
                    |k| k,
                    pos.0,
                )
            }
        }
    });
    let mut bounds = vec![0usize; BUCKETS + 1];
    for b in 0..BUCKETS {
        bounds[b + 1] = bounds[b] + top_totals[b];
    }
    let bufs = Buffers {
        keys,
        scratch: Out(scratch.as_mut_ptr()),
        pos,
        pos_scratch: Out(pos_scratch.as_mut_ptr()),
        positions,
        element: std::marker::PhantomData,
    };
    (0..BUCKETS).into_par_iter().for_each(|b| {
        let bufs = &bufs;
        // SAFETY: the buckets' ranges are disjoint, and the scatter above wrote every key
        // (and position) of each.
        unsafe { bufs.sort_bucket(codec, bounds[b], bounds[b + 1], top_shift) }
    });
    // SAFETY: every bucket wrote its elements (and positions) to the result.
    unsafe {
        out.set_len(n);
        pos_out.set_len(pn);
    }
    (out, positions.then_some(pos_out))
}

/// The memory [`by_top_digit`]'s buckets sort in: the result (holding keys until a bucket is
/// sorted), a scratch buffer of keys, and the same for positions when they are carried.
struct Buffers<K, T> {
    keys: Out<K>,
    scratch: Out<K>,
    pos: Out<u32>,
    pos_scratch: Out<u32>,
    positions: bool,
    /// The elements the buckets are written as.
    element: std::marker::PhantomData<fn() -> T>,
}

impl<K: RadixKey, T: Send> Buffers<K, T> {
    /// Sorts positions `lo..hi` of the result by the digits (of [`RadixKey::LOW_BITS`]) below
    /// `top_shift`, leaving their elements there.
    ///
    /// # Safety
    ///
    /// The range holds keys (and positions) and no other thread touches it meanwhile.
    unsafe fn sort_bucket<C: Codec<Key = K, Out = T>>(
        &self,
        codec: &C,
        lo: usize,
        hi: usize,
        top_shift: u32,
    ) {
        let m = hi - lo;
        if m == 0 {
            return;
        }
        // SAFETY (the slices): the caller's; the result's and the scratch's ranges are
        // disjoint memory.
        let (keys, scratch) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.keys.0.add(lo), m),
                std::slice::from_raw_parts_mut(self.scratch.0.add(lo), m),
            )
        };
        let pm = if self.positions { m } else { 0 };
        let (pos, pos_scratch) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.pos.0.add(lo), pm),
                std::slice::from_raw_parts_mut(self.pos_scratch.0.add(lo), pm),
            )
        };
        // The result's range as elements: the same memory as `keys`, derived from it.
        let out = keys.as_mut_ptr().cast::<T>();
        let (width, buckets) = (K::LOW_BITS, 1usize << K::LOW_BITS);
        debug_assert_eq!(top_shift, K::KEY_BITS - BITS);
        let low_digits = (K::KEY_BITS - BITS).div_ceil(width) as usize;
        let mut h = vec![0usize; buckets * low_digits];
        let mut h32 = vec![0u32; buckets * low_digits];
        for block in keys.chunks(u32::MAX as usize) {
            for &k in block {
                // A constant trip count (the digits below the top one): the loop unrolls.
                for d in 0..(K::KEY_BITS - BITS).div_ceil(K::LOW_BITS) {
                    h32[d as usize * buckets + k.bits(d * width, width)] += 1;
                }
            }
            for (a, b) in h.iter_mut().zip(&mut h32) {
                *a += std::mem::take(b) as usize;
            }
        }
        let passes: Vec<usize> = (0..low_digits)
            .filter(|&d| !h[d * buckets..(d + 1) * buckets].contains(&m))
            .collect();
        // Ping-pong between the result's range and the scratch's: `in_keys` says where the
        // keys are.
        let mut in_keys = true;
        for (j, &d) in passes.iter().enumerate() {
            let mut at = vec![0usize; buckets];
            let mut sum = 0;
            for (a, &c) in at.iter_mut().zip(&h[d * buckets..(d + 1) * buckets]) {
                *a = sum;
                sum += c;
            }
            let shift = d as u32 * width;
            let last = j + 1 == passes.len();
            let carry = self.positions;
            // SAFETY (each call): `at` partitions `0..m`, the length of both ranges.
            unsafe {
                match (in_keys, last) {
                    (true, _) => {
                        let p = &*pos;
                        scatter(
                            keys,
                            |k| k,
                            |i| p[i],
                            carry,
                            (shift, width),
                            &at,
                            scratch.as_mut_ptr(),
                            |k| k,
                            pos_scratch.as_mut_ptr(),
                        )
                    }
                    (false, false) => {
                        let p = &*pos_scratch;
                        scatter(
                            scratch,
                            |k| k,
                            |i| p[i],
                            carry,
                            (shift, width),
                            &at,
                            keys.as_mut_ptr(),
                            |k| k,
                            pos.as_mut_ptr(),
                        )
                    }
                    (false, true) => {
                        // The last pass into the result writes elements.
                        let p = &*pos_scratch;
                        scatter(
                            scratch,
                            |k| k,
                            |i| p[i],
                            carry,
                            (shift, width),
                            &at,
                            out,
                            |k| codec.element(k),
                            pos.as_mut_ptr(),
                        );
                        return;
                    }
                }
            }
            in_keys = !in_keys;
        }
        if in_keys {
            // The keys are in the result's range: turned into elements in place.
            for i in 0..m {
                // SAFETY: position `i` of the range, read as a key before it is written as an
                // element of the same size (`out` is `keys`' pointer).
                unsafe {
                    out.add(i)
                        .write(codec.element(out.cast::<K>().add(i).read()))
                };
            }
        } else {
            for (i, &k) in scratch.iter().enumerate() {
                // SAFETY: position `i` of the range.
                unsafe { out.add(i).write(codec.element(k)) };
            }
            pos.copy_from_slice(pos_scratch);
        }
    }
}

/// Each (chunk, bucket)'s first output position (`counts` and the result indexed
/// `chunk * BUCKETS + bucket`): buckets in order, and chunks in order within a bucket.
fn starts(counts: &[usize], chunks: usize) -> Vec<usize> {
    let mut starts = vec![0usize; chunks * BUCKETS];
    let mut at = 0;
    for b in 0..BUCKETS {
        for c in 0..chunks {
            starts[c * BUCKETS + b] = at;
            at += counts[c * BUCKETS + b];
        }
    }
    starts
}

/// Scatters one chunk `x` (keys by `key`, positions by `pos` of the index within the chunk
/// when `carry`) into `dst` (elements by `element`) and `pos_dst`, each bucket of the digit of
/// `width` bits at `shift` from its position in `begin` (one a bucket).
///
/// # Safety
///
/// `dst` (and `pos_dst` when `carry`) must be valid for writes at every position of
/// `begin[b] .. begin[b] + (keys of x in bucket b)`, for every bucket, and no other thread may
/// access those positions meanwhile.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn scatter<I: Copy, K: RadixKey, T>(
    x: &[I],
    key: impl Fn(I) -> K,
    pos: impl Fn(usize) -> u32,
    carry: bool,
    (shift, width): (u32, u32),
    begin: &[usize],
    dst: *mut T,
    element: impl Fn(K) -> T,
    pos_dst: *mut u32,
) {
    let mut at = begin.to_vec();
    let ahead = AHEAD_BYTES / std::mem::size_of::<T>().max(1);
    for (i, &e) in x.iter().enumerate() {
        let k = key(e);
        let b = k.bits(shift, width);
        // SAFETY: `b < 1 << width`, the length of `at`.
        let p = unsafe { at.get_unchecked_mut(b) };
        // SAFETY: `*p` is the next position of this chunk's range for bucket `b` (the caller's).
        unsafe { dst.add(*p).write(element(k)) };
        // The bucket's line after this one, asked for ahead of its writes.
        prefetch_write(dst.wrapping_add(*p + ahead));
        if carry {
            // SAFETY: as above.
            unsafe { pos_dst.add(*p).write(pos(i)) };
            prefetch_write(pos_dst.wrapping_add(*p + AHEAD_BYTES / 4));
        }
        *p += 1;
    }
}

/// How far ahead of a bucket's next write a scatter asks for its destination's line (one
/// line). Every write of a scatter to hundreds of buckets otherwise waits for its line to be
/// read from memory (no hardware prefetcher follows that many streams): on an Intel Xeon
/// (family 6 model 207) one pass of 16·2²⁰ u32 keys by an 8-bit digit took 105 ms of CPU
/// without and 44 ms with (docs/performance.md, "The radix sort's writes asked for ahead").
const AHEAD_BYTES: usize = 64;

/// Asks for the cache line at `p` for writing, where the CPU offers that hint (a hint only:
/// it never faults, whatever the address).
#[inline(always)]
fn prefetch_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads and writes nothing and never faults, at any address.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_ET0>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Each chunk's count of the digit at `shift` (indexed `chunk * BUCKETS + bucket`).
fn chunk_counts<K: RadixKey>(keys: &[K], chunk: usize, shift: u32) -> Vec<usize> {
    keys.par_chunks(chunk)
        .flat_map_iter(|c| count_digits(c, |k| k, [shift]))
        .collect()
}

/// The count of each value of the top digit among the keys of the elements `x`, if the codec
/// admits every one of them: the admission checked a block at a time (a loop the compiler
/// vectorizes), then the block counted, its shift a constant. Checked in the counting loop,
/// the admission cost about as much as the count, and checked through a closure's reference
/// (stored and reloaded for every element) more: for 16·2²⁰ f32 keys on one core of an Intel
/// Xeon, about 38 ms so and 31 in the loop, against 19.5 ms now.
fn top_counts_admitted<C: Codec>(codec: &C, x: &[C::In]) -> Option<Vec<usize>> {
    let shift = C::Key::KEY_BITS - BITS;
    let mut h = vec![0usize; BUCKETS];
    let mut h32 = vec![0u32; BUCKETS];
    for block in x.chunks(u32::MAX as usize) {
        for b in block.chunks(256) {
            if !b.iter().fold(true, |ok, &e| ok & codec.admits(e)) {
                return None;
            }
            for &e in b {
                h32[codec.key(e).digit(shift)] += 1;
            }
        }
        for (a, b) in h.iter_mut().zip(&mut h32) {
            *a += std::mem::take(b) as usize;
        }
    }
    Some(h)
}

/// The count of each value of the digit at each of `shifts` among the keys of `x` (by `key`),
/// indexed `digit * BUCKETS + value`: 32-bit counts (the tables stay in the first-level
/// cache), in blocks they cannot overflow. `D` digits, a constant (the loop over them
/// unrolls).
fn count_digits<I: Copy, K: RadixKey, const D: usize>(
    x: &[I],
    key: impl Fn(I) -> K,
    shifts: [u32; D],
) -> Vec<usize> {
    let mut h = vec![0usize; BUCKETS * D];
    let mut h32 = vec![0u32; BUCKETS * D];
    for block in x.chunks(u32::MAX as usize) {
        for &e in block {
            let k = key(e);
            for (d, &s) in shifts.iter().enumerate() {
                h32[d * BUCKETS + k.digit(s)] += 1;
            }
        }
        for (a, b) in h.iter_mut().zip(&mut h32) {
            *a += std::mem::take(b) as usize;
        }
    }
    h
}

/// Each digit's count (indexed `digit * BUCKETS + value`) among the keys of the elements `x`
/// (by `key`), for keys of `digits` digits: 3 (32-bit keys) and 6 (64-bit) in loops of their
/// own.
fn count_every_digit<I: Copy, K: RadixKey>(
    x: &[I],
    key: impl Fn(I) -> K,
    digits: usize,
) -> Vec<usize> {
    let s = shift::<K>;
    match digits {
        3 => count_digits(x, key, [s(0), s(1), s(2)]),
        6 => count_digits(x, key, [s(0), s(1), s(2), s(3), s(4), s(5)]),
        _ => (0..digits as u32)
            .flat_map(|d| count_digits(x, &key, [s(d)]))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(n: usize, seed: u64) -> Vec<u64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                s
            })
            .collect()
    }

    /// Keys in `[0, 1 << 31)` doubled and offset: the codec takes even keys only.
    struct Evens;

    impl Codec for Evens {
        type In = u32;
        type Key = u32;
        type Out = u32;
        fn admits(&self, x: u32) -> bool {
            x.is_multiple_of(2)
        }
        fn key(&self, x: u32) -> u32 {
            !x
        }
        fn element(&self, k: u32) -> u32 {
            !k
        }
    }

    #[test]
    fn sorts_stably_like_the_standard_sort() {
        // Keys spread over the top digit (which then goes first) and keys that share it (every
        // digit a pass, constant ones skipped), and more threads than some lengths have keys.
        for (n, spread) in [
            (0usize, 1u64),
            (1, 1),
            (2, 1 << 40),
            (17, 5),
            (5000, 1 << 40),
            (300_000, 1000),
            (300_001, 1 << 40),
            (70_000, 3),
            (70_000, 1),
            (40_000, 1 << 22),
            (90_000, 0),
        ] {
            // A spread of 0: keys over the whole range.
            let spread = if spread == 0 { u64::MAX } else { spread };
            let raw = lcg(n, n as u64 + 1);
            let k32: Vec<u32> = raw.iter().map(|&x| ((x >> 20) % spread) as u32).collect();
            let (keys, idx) = sort(&Plain::new(), &k32, true).expect("plain keys");
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_by_key(|&i| k32[i as usize]);
            assert_eq!(idx, Some(want), "n {n}");
            let mut sorted = k32.clone();
            sorted.sort();
            assert_eq!(keys, sorted, "n {n}");
            let k64: Vec<u64> = raw.iter().map(|&x| x % spread.max(1)).collect();
            let mut want64 = k64.clone();
            want64.sort();
            let (got64, none) = sort(&Plain::new(), &k64, false).expect("plain keys");
            assert_eq!(got64, want64, "u64, n {n}");
            assert_eq!(none, None);
            let mut want_pos: Vec<u32> = (0..n as u32).collect();
            want_pos.sort_by_key(|&i| k64[i as usize]);
            let (_, pos64) = sort(&Plain::new(), &k64, true).expect("plain keys");
            assert_eq!(pos64, Some(want_pos), "u64 positions, n {n}");
        }
        // Keys spread over the top digit whose bucket passes are an odd and an even number
        // (32-bit keys' three 7-bit digits below the top one, one of them constant, or two).
        let raw = lcg(200_000, 3);
        for mask in [u32::MAX, !0x7f, !0x3f80, !0x3fff] {
            let k32: Vec<u32> = raw.iter().map(|&x| (x >> 32) as u32 & mask).collect();
            let (keys, idx) = sort(&Plain::new(), &k32, true).expect("plain keys");
            let mut want: Vec<u32> = (0..k32.len() as u32).collect();
            want.sort_by_key(|&i| k32[i as usize]);
            assert_eq!(idx, Some(want), "mask {mask:x}");
            let mut sorted = k32.clone();
            sorted.sort();
            assert_eq!(keys, sorted, "mask {mask:x}");
        }
    }

    #[test]
    fn the_codec_transforms_on_the_way_in_and_out_and_may_decline() {
        let raw = lcg(100_000, 7);
        let evens: Vec<u32> = raw.iter().map(|&x| (x >> 33) as u32 & !1).collect();
        let (got, pos) = sort(&Evens, &evens, true).expect("even keys");
        let mut want = evens.clone();
        want.sort_by(|a, b| b.cmp(a));
        assert_eq!(got, want);
        let pos = pos.expect("positions");
        assert!(pos.iter().zip(&got).all(|(&p, &g)| evens[p as usize] == g));
        assert!(
            pos.windows(2)
                .zip(got.windows(2))
                .all(|(p, g)| g[0] != g[1] || p[0] < p[1])
        );
        let mut odd = evens;
        odd[99_999] = 3;
        assert!(sort(&Evens, &odd, false).is_none());
    }
}

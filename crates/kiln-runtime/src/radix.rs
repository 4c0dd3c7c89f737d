//! A parallel least-significant-digit radix sort for long runs of unsigned keys, stable, with
//! an optional payload of positions moved alongside.
//!
//! Digits are 11 bits (2048 buckets: few passes, and a scatter whose open write streams still
//! fit the cache's line buffers), so 32-bit keys take 3 passes and 64-bit ones 6. One read of
//! the keys counts every digit's values; a digit all keys share is skipped. Each pass splits
//! the keys into one contiguous chunk per thread: every chunk counts its digits, the counts
//! give each (chunk, bucket) its own range of the output (chunks in order within a bucket, so
//! the pass is stable), and the chunks scatter into their ranges at once.

use rayon::prelude::*;

/// Bits per digit.
const BITS: u32 = 11;
/// Buckets per digit.
const BUCKETS: usize = 1 << BITS;

/// Keys at least this long sort with [`par_radix_sort`] (shorter ones: one thread's radix
/// sort, whose fixed costs are lower).
pub(crate) const PARALLEL_MIN: usize = 1 << 18;

/// A pointer the scatter's threads write through, each to a range of its own.
#[derive(Clone, Copy)]
struct Out<T>(*mut T);

// SAFETY: the scatter gives every (chunk, bucket) pair a disjoint range of the output, and each
// thread writes only the ranges of its own chunk, so no two threads write one element.
unsafe impl<T: Send> Send for Out<T> {}
// SAFETY: as above; nothing reads through the pointer while the scatter runs.
unsafe impl<T: Send> Sync for Out<T> {}

/// The digit of `k` at `shift`.
fn digit(k: u64, shift: u32) -> usize {
    (k >> shift) as usize & (BUCKETS - 1)
}

/// Sorts `keys` ascending, stably, moving `idx` (one position per key) along when given.
pub(crate) fn par_radix_sort<K>(keys: &mut Vec<K>, mut idx: Option<&mut Vec<u32>>)
where
    K: Copy + Default + Send + Sync + Into<u64>,
{
    let n = keys.len();
    if n < 2 {
        return;
    }
    let key_bits = 8 * std::mem::size_of::<K>() as u32;
    let shifts: Vec<u32> = (0..key_bits.div_ceil(BITS)).map(|d| d * BITS).collect();
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads);
    // Which digits vary: one read counting every digit's values.
    let totals: Vec<Vec<usize>> = keys
        .par_chunks(chunk)
        .map(|c| {
            let mut h = vec![vec![0usize; BUCKETS]; shifts.len()];
            for &k in c {
                let k: u64 = k.into();
                for (hd, &s) in h.iter_mut().zip(&shifts) {
                    hd[digit(k, s)] += 1;
                }
            }
            h.concat()
        })
        .reduce(
            || vec![0usize; BUCKETS * shifts.len()],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            },
        )
        .chunks(BUCKETS)
        .map(<[usize]>::to_vec)
        .collect();
    let mut kb: Vec<K> = vec![K::default(); n];
    let mut ib: Vec<u32> = vec![0; if idx.is_some() { n } else { 0 }];
    for (&shift, total) in shifts.iter().zip(&totals) {
        if total.contains(&n) {
            continue;
        }
        // Each chunk's count per bucket, then its first output position per bucket.
        let counts: Vec<Vec<usize>> = keys
            .par_chunks(chunk)
            .map(|c| {
                let mut h = vec![0usize; BUCKETS];
                for &k in c {
                    h[digit(k.into(), shift)] += 1;
                }
                h
            })
            .collect();
        let mut starts = vec![vec![0usize; BUCKETS]; counts.len()];
        let mut at = 0;
        for b in 0..BUCKETS {
            for (c, h) in counts.iter().enumerate() {
                starts[c][b] = at;
                at += h[b];
            }
        }
        let kout = Out(kb.as_mut_ptr());
        let iout = Out(ib.as_mut_ptr());
        let ids: Option<&[u32]> = idx.as_deref().map(Vec::as_slice);
        keys.par_chunks(chunk)
            .zip(starts.into_par_iter())
            .enumerate()
            .for_each(|(c, (ks, mut next))| {
                let (kout, iout) = (kout, iout);
                let next = &mut next[..BUCKETS];
                match ids {
                    None => {
                        for &k in ks {
                            let d = &mut next[digit(k.into(), shift)];
                            // SAFETY: `*d` lies in this chunk's range for the bucket (below
                            // `n`: the ranges partition 0..n), which no other thread writes.
                            unsafe { kout.0.add(*d).write(k) };
                            *d += 1;
                        }
                    }
                    Some(ids) => {
                        let ids = &ids[c * chunk..c * chunk + ks.len()];
                        for (&k, &i) in ks.iter().zip(ids) {
                            let d = &mut next[digit(k.into(), shift)];
                            // SAFETY: as above; `ib` has `n` elements when `idx` is given.
                            unsafe {
                                kout.0.add(*d).write(k);
                                iout.0.add(*d).write(i);
                            }
                            *d += 1;
                        }
                    }
                }
            });
        std::mem::swap(keys, &mut kb);
        if let Some(ix) = idx.as_deref_mut() {
            std::mem::swap(ix, &mut ib);
        }
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

    #[test]
    fn sorts_stably_like_the_standard_sort() {
        for (n, spread) in [
            (0usize, 1u64),
            (1, 1),
            (5000, 1 << 40),
            (300_000, 1000),
            (70_000, 3),
        ] {
            let raw = lcg(n, n as u64 + 1);
            let k32: Vec<u32> = raw.iter().map(|&x| ((x >> 20) % spread) as u32).collect();
            let mut keys = k32.clone();
            let mut idx: Vec<u32> = (0..n as u32).collect();
            par_radix_sort(&mut keys, Some(&mut idx));
            let mut want: Vec<u32> = (0..n as u32).collect();
            want.sort_by_key(|&i| k32[i as usize]);
            assert_eq!(idx, want, "n {n}");
            assert!(keys.windows(2).all(|w| w[0] <= w[1]));
            let mut k64: Vec<u64> = raw.iter().map(|&x| x % spread.max(1)).collect();
            let mut want64 = k64.clone();
            want64.sort();
            par_radix_sort(&mut k64, None);
            assert_eq!(k64, want64, "u64, n {n}");
        }
    }
}

//! Samplers: the order in which a [`super::DataLoader`] visits a dataset's samples.

use super::{data_error, located};
use crate::Result;
use crate::ir::Loc;

/// Which sample indices an epoch visits, in order. Every rank and every worker sees the same
/// indices for the same epoch: a sampler is a pure function of `(len, epoch)`.
///
/// # Examples
///
/// ```
/// use kiln::data::{DataLoader, Sampler, TensorDataset};
/// use kiln::Tensor;
/// // Last sample first.
/// struct Backwards;
/// impl Sampler for Backwards {
///     fn indices(&self, len: usize, _epoch: u64) -> Vec<usize> { (0..len).rev().collect() }
/// }
/// assert_eq!(Backwards.indices(3, 0), [2, 1, 0]);
/// let x = Tensor::from_vec(vec![10i32, 20, 30], [3]).unwrap();
/// let data = TensorDataset::new(vec![x]).unwrap();
/// let loader = DataLoader::new(data, 3).unwrap().sampler(Backwards);
/// let batch = loader.epoch(0).next().unwrap().unwrap();
/// assert_eq!(batch[0].to_vec::<i32>().unwrap(), [30, 20, 10]);
/// ```
pub trait Sampler: Send + Sync {
    /// The indices of epoch `epoch` over a dataset of `len` samples (each `< len`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Distributed, Sampler, Sequential, Shuffled};
    /// // With one rank, every sampler visits each sample once an epoch.
    /// let one_rank = Distributed::new(0, 1).unwrap();
    /// let samplers: [&dyn Sampler; 3] = [&Sequential, &Shuffled { seed: 1 }, &one_rank];
    /// for s in samplers {
    ///     let mut seen = s.indices(6, 2);
    ///     seen.sort();
    ///     assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
    /// }
    /// ```
    fn indices(&self, len: usize, epoch: u64) -> Vec<usize>;
}

/// `0, 1, ..., len - 1`, every epoch.
///
/// # Examples
///
/// ```
/// use kiln::data::{Sampler, Sequential};
/// assert_eq!(Sequential.indices(4, 0), [0, 1, 2, 3]);
/// assert_eq!(Sequential.indices(4, 9), [0, 1, 2, 3]);
/// assert!(Sequential.indices(0, 0).is_empty());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Sequential;

impl Sampler for Sequential {
    fn indices(&self, len: usize, _epoch: u64) -> Vec<usize> {
        (0..len).collect()
    }
}

/// A permutation of `0..len` drawn from `seed` and the epoch: the same seed and epoch give
/// the same order on every run and machine; each epoch's order differs.
///
/// The permutation is a Fisher–Yates shuffle driven by SplitMix64 seeded with
/// `mix(seed, epoch)` (documented so that another implementation can reproduce it).
///
/// # Examples
///
/// ```
/// use kiln::data::{Sampler, Shuffled};
/// let s = Shuffled { seed: 3 };
/// let e0 = s.indices(10, 0);
/// assert_eq!(e0, Shuffled { seed: 3 }.indices(10, 0)); // the same seed and epoch
/// assert_ne!(e0, s.indices(10, 1)); // another epoch
/// let mut sorted = e0.clone();
/// sorted.sort();
/// assert_eq!(sorted, (0..10).collect::<Vec<_>>()); // a permutation
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Shuffled {
    /// The seed.
    pub seed: u64,
}

impl Sampler for Shuffled {
    fn indices(&self, len: usize, epoch: u64) -> Vec<usize> {
        permutation(len, self.seed, epoch)
    }
}

/// One rank's share of every epoch when `world` processes train together (PyTorch's
/// `DistributedSampler`): the epoch's indices (shuffled from `seed` if set, the same on every
/// rank) are padded by repeating from the start to a multiple of `world` (or cut to one with
/// `drop_last`), and rank `r` takes every `world`-th index from position `r`. The ranks'
/// shares are disjoint and together cover every sample (padding aside).
///
/// # Examples
///
/// ```
/// use kiln::data::{Distributed, Sampler};
/// // 5 samples over 2 ranks: padded to 6 by repeating sample 0.
/// let r0 = Distributed::new(0, 2).unwrap().indices(5, 0);
/// let r1 = Distributed::new(1, 2).unwrap().indices(5, 0);
/// assert_eq!((r0, r1), (vec![0, 2, 4], vec![1, 3, 0]));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Distributed {
    rank: usize,
    world: usize,
    seed: Option<u64>,
    drop_last: bool,
}

impl Distributed {
    /// Rank `rank` of `world` (`rank < world`), sequential order, padded.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Distributed, Sampler};
    /// assert_eq!(Distributed::new(2, 3).unwrap().indices(7, 0), [2, 5, 1]);
    /// let err = Distributed::new(3, 3).unwrap_err();
    /// assert!(err.message.contains("rank 3 is not one of the 3 ranks"), "{err}");
    /// ```
    #[track_caller]
    pub fn new(rank: usize, world: usize) -> Result<Distributed> {
        let loc = Loc::caller();
        if world == 0 || rank >= world {
            return located(
                Err(data_error(
                    "Distributed::new",
                    format!("rank {rank} is not one of the {world} ranks (0 <= rank < world)"),
                )),
                loc,
            );
        }
        Ok(Distributed {
            rank,
            world,
            seed: None,
            drop_last: false,
        })
    }

    /// Shuffles each epoch from `seed` (every rank must use the same seed).
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Distributed, Sampler};
    /// let share = |rank| Distributed::new(rank, 3).unwrap().shuffle(11).indices(9, 4);
    /// let mut all: Vec<usize> = (0..3).flat_map(share).collect();
    /// assert_ne!(all, [0, 3, 6, 1, 4, 7, 2, 5, 8]); // not the sequential shares
    /// all.sort();
    /// assert_eq!(all, (0..9).collect::<Vec<_>>()); // disjoint, covering every sample
    /// ```
    pub fn shuffle(mut self, seed: u64) -> Distributed {
        self.seed = Some(seed);
        self
    }

    /// Drops the tail that does not divide evenly among the ranks instead of padding.
    ///
    /// # Examples
    ///
    /// ```
    /// use kiln::data::{Distributed, Sampler};
    /// let r1 = Distributed::new(1, 2).unwrap().drop_last(true);
    /// assert_eq!(r1.indices(5, 0), [1, 3]); // sample 4 is left out, nothing repeated
    /// ```
    pub fn drop_last(mut self, drop_last: bool) -> Distributed {
        self.drop_last = drop_last;
        self
    }
}

impl Sampler for Distributed {
    fn indices(&self, len: usize, epoch: u64) -> Vec<usize> {
        let mut all = match self.seed {
            Some(seed) => permutation(len, seed, epoch),
            None => (0..len).collect(),
        };
        let total = if self.drop_last {
            len / self.world * self.world
        } else {
            len.div_ceil(self.world) * self.world
        };
        if len > 0 {
            let mut k = 0;
            while all.len() < total {
                all.push(all[k % len]);
                k += 1;
            }
        }
        all.truncate(total);
        all.into_iter()
            .skip(self.rank)
            .step_by(self.world)
            .collect()
    }
}

/// SplitMix64: a small, well-mixed 64-bit generator.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=bound`, unbiased (rejection of the short last interval).
    fn up_to(&mut self, bound: u64) -> u64 {
        if bound == u64::MAX {
            return self.next();
        }
        let n = bound + 1;
        let zone = u64::MAX - (u64::MAX % n + 1) % n;
        loop {
            let x = self.next();
            if x <= zone {
                return x % n;
            }
        }
    }
}

/// The permutation of `0..len` for `seed` and `epoch`.
fn permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut mix = SplitMix64(seed);
    let start = mix.next() ^ epoch.wrapping_mul(0xd605_bbb5_8c8a_bbe5);
    let mut rng = SplitMix64(start);
    let mut v: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = rng.up_to(i as u64) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_permutation_is_one_and_depends_on_seed_and_epoch() {
        let p = permutation(1000, 7, 0);
        let mut s = p.clone();
        s.sort();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(p, permutation(1000, 7, 0));
        assert_ne!(p, permutation(1000, 7, 1));
        assert_ne!(p, permutation(1000, 8, 0));
        assert!(permutation(0, 1, 0).is_empty());
        assert_eq!(permutation(1, 1, 0), [0]);
    }

    #[test]
    fn every_position_is_reached_about_evenly() {
        // 4,000 shuffles of 4 elements: each element lands in each place about 1,000 times.
        let mut count = [[0u32; 4]; 4];
        for e in 0..4000 {
            for (pos, &x) in permutation(4, 3, e).iter().enumerate() {
                count[x][pos] += 1;
            }
        }
        for row in count {
            for c in row {
                assert!((880..1120).contains(&c), "{count:?}");
            }
        }
    }

    #[test]
    fn up_to_stays_in_range() {
        let mut r = SplitMix64(1);
        for b in [0u64, 1, 2, 3, 7, 1000, u64::MAX / 2 + 1, u64::MAX] {
            for _ in 0..100 {
                assert!(r.up_to(b) <= b);
            }
        }
    }
}

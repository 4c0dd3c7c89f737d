//! What random programs may contain, and the differential tests' profile of it per seed.

use crate::DType;

/// What random programs may contain.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of instructions to attempt.
    pub ops: usize,
    /// Element types of parameters. The default is every real dtype but the small floats
    /// ([`Config::with_small_floats`]); the complex ones ([`Config::with_complex`]) only when
    /// asked, since the backends run several complex ops on the reference interpreter, which
    /// the differential tests refuse.
    pub dtypes: Vec<DType>,
    /// Largest rank of a parameter.
    pub max_rank: usize,
    /// Largest dimension size (0 and 1 included).
    pub max_dim: usize,
    /// When not empty, parameter dimensions are drawn from these sizes instead of
    /// `0..=max_dim` (say, around vector widths: 7, 8, 9, 15, 16, 17, ...).
    pub dims: Vec<usize>,
    /// The chance that a drawn size (a dimension, a slice's extent, a product's width) is 0:
    /// empty tensors stay tested without making most programs compute nothing.
    pub empty: f64,
    /// Large programs: when set to `(lo, hi)`, parameters have between `lo` and `hi` elements
    /// (log-uniformly; the leading dimensions from `dims`, the last one what remains), an
    /// instruction whose results would hold more than `hi` elements is not added, and a
    /// `dot_general`'s width keeps its multiply-adds under `16 * hi`, so the reference
    /// interpreter stays fast.
    pub elements: Option<(usize, usize)>,
    /// Whether programs may hold control flow: `while` loops with a static or a data-dependent
    /// (bounded) trip count, `case`, `call`, `sort` (with their regions), control flow nested
    /// in regions, and collectives.
    pub control: bool,
    /// Whether programs (but large ones) may hold `random/wide.rs`'s ops, each an output: a
    /// scatter of hundreds of updates, a `select_and_scatter` of any order and combiner, a
    /// `reduce_region` over rows of thousands of elements, a `reduce_window_region` of windows
    /// over 256 elements ([`Config::with_wide`]).
    pub wide: bool,
    /// Whether programs stay within what has a derivative, for gradient checks: no bits
    /// reinterpreted (`bitcast_convert`), no `reduce_precision` (its VJP is a straight-through
    /// estimator, not its derivative), no `fft` (its values are complex), `reduce_window`'s
    /// maxima without dilations, and linear algebra on the configuration's first float type
    /// ([`Config::gradient_profile`]).
    pub differentiable: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            ops: 12,
            dtypes: DType::ALL
                .into_iter()
                .filter(|d| !d.is_complex() && d.mini().is_none())
                .collect(),
            max_rank: 3,
            max_dim: 4,
            dims: Vec::new(),
            empty: 0.05,
            elements: None,
            control: false,
            wide: false,
            differentiable: false,
        }
    }
}

/// Sizes around vector widths (8, 16, 32, 64 lanes) and their tails.
pub const VECTOR_DIMS: [usize; 13] = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65];

/// Leading dimensions of large programs' parameters (the last one makes up the element count).
pub const LARGE_DIMS: [usize; 8] = [1, 3, 17, 33, 64, 100, 127, 257];

/// Element counts of large programs' parameters: 10^5 to 10^6.
pub const LARGE_ELEMENTS: (usize, usize) = (100_000, 1_000_000);

impl Config {
    /// This configuration with complex parameters (`c64`, `c128`) too.
    pub fn with_complex(self) -> Config {
        let mut dtypes = self.dtypes.clone();
        dtypes.extend([DType::C64, DType::C128]);
        Config { dtypes, ..self }
    }

    /// This configuration with parameters of the small floats (`f8e4m3fn`, ..., `f4e2m1fn`)
    /// too: as likely as all the other dtypes together.
    pub fn with_small_floats(self) -> Config {
        let mut dtypes = self.dtypes.clone();
        let minis: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|d| d.mini().is_some())
            .collect();
        for _ in 0..dtypes.len().div_ceil(minis.len()).max(1) {
            dtypes.extend(&minis);
        }
        Config { dtypes, ..self }
    }

    /// This configuration with `random/wide.rs`'s ops ([`Config::wide`]), which reach the
    /// kernels for many updates and long folds. A seed's program changes only where one is
    /// added (they draw from a stream of their own).
    pub fn with_wide(self) -> Config {
        Config { wide: true, ..self }
    }

    /// The differential tests' configuration for `seed`: 1 to 12 ops of small shapes (at most
    /// rank 3, dimensions up to 4); one seed in ten with dimensions around vector widths (rank
    /// at most 2, so the reference stays fast); one in two hundred (seeds 77, 277, ...) a
    /// large program of 1 to 4 ops over 10^5 to 10^6 elements ([`Config::elements`]); one in
    /// seven (seeds 3, 10, 17, ...) with control flow ([`Config::control`]); one in thirteen
    /// (seeds 6, 19, 32, ...) with small floats ([`Config::with_small_floats`]).
    pub fn profile(seed: u64) -> Config {
        let mut cfg = Config {
            ops: 1 + (seed as usize % 12),
            control: seed % 7 == 3,
            ..Config::default()
        };
        if seed % 200 == 77 {
            cfg.ops = 1 + (seed / 200) as usize % 4;
            cfg.dims = LARGE_DIMS.to_vec();
            cfg.elements = Some(LARGE_ELEMENTS);
        } else if seed % 10 == 5 {
            cfg.dims = VECTOR_DIMS.to_vec();
            cfg.max_rank = 2;
        }
        if seed % 13 == 6 {
            cfg = cfg.with_small_floats();
        }
        cfg
    }

    /// The gradient checks' configuration for `seed`: 1 to 12 ops over `f64` values of rank
    /// up to 3 and dimensions up to 3, with control flow, calls and region ops
    /// ([`Config::control`]), and only what has a derivative ([`Config::differentiable`]).
    pub fn gradient_profile(seed: u64) -> Config {
        Config {
            ops: 1 + (seed as usize % 12),
            dtypes: vec![DType::F64],
            max_dim: 3,
            control: true,
            differentiable: true,
            ..Config::default()
        }
    }
}

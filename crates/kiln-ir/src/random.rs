//! Random well-typed programs, for property tests and differential testing of backends.
//!
//! The generator is deterministic for a given seed, so a failing case is reproduced by its
//! seed alone.

use crate::{
    Builder, Combiner, ComparisonDirection, DType, Func, Literal, Op, TensorType, ValueId,
};

mod collective;
mod fft;
pub mod seeds;
mod wide;

/// A small, fast, seedable generator (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A uniform float in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.uniform(0.0, 1.0) < p
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

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
    /// Whether programs may hold control flow: `while` loops with a static trip count, `case`
    /// and `sort` (with their regions).
    pub control: bool,
    /// Whether programs (but large ones) may hold `random/wide.rs`'s ops, each an output: a
    /// scatter of hundreds of updates, a `select_and_scatter` of any order and combiner, a
    /// `reduce_region` over rows of thousands of elements, a `reduce_window_region` of windows
    /// over 256 elements ([`Config::with_wide`]).
    pub wide: bool,
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
}

/// Random values of a type: floats in [-4, 4) (`f8e8m0fnu`, which has no sign, in (0, 4)),
/// integers in [-20, 20) (unsigned [0, 40)), random `pred`s.
pub fn random_literal(rng: &mut Rng, ty: &TensorType) -> Literal {
    let n = ty.numel();
    if ty.dtype.is_float() {
        let unsigned = ty.dtype == DType::F8E8M0FNU;
        let v: Vec<f64> = (0..n)
            .map(|_| rng.uniform(-4.0, 4.0))
            .map(|x| if unsigned { x.abs() } else { x })
            .collect();
        Literal::from_f64s(ty.clone(), &v).expect("sizes match")
    } else {
        let v: Vec<i64> = (0..n)
            .map(|_| match ty.dtype {
                DType::Pred => rng.below(2) as i64,
                d if !d.is_signed() => rng.below(40) as i64,
                _ => rng.below(40) as i64 - 20,
            })
            .collect();
        Literal::from_i64s(ty.clone(), &v).expect("sizes match")
    }
}

/// Like [`random_literal`], with each float element replaced, with probability `rate`, by a
/// special value: -0, +inf, -inf, NaN, a subnormal of the dtype or its largest finite value.
pub fn random_literal_with_specials(rng: &mut Rng, ty: &TensorType, rate: f64) -> Literal {
    let l = random_literal(rng, ty);
    if !ty.dtype.is_float() || rate <= 0.0 {
        return l;
    }
    let (sub, max) = match ty.dtype {
        DType::F16 => (3.0e-6, 65504.0),
        DType::BF16 => (5.0e-39, 3.38e38),
        DType::Mini(m) => (m.to_f64(1), m.max_value()),
        DType::F32 => (5.0e-40, f64::from(f32::MAX)),
        _ => (5.0e-310, f64::MAX),
    };
    let specials = [
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        sub,
        -sub,
        max,
        -max,
    ];
    let v: Vec<f64> = l
        .to_f64s()
        .into_iter()
        .map(|x| {
            if rng.chance(rate) {
                *rng.pick(&specials)
            } else {
                x
            }
        })
        .collect();
    Literal::from_f64s(ty.clone(), &v).expect("sizes match")
}

struct Gen<'a> {
    rng: &'a mut Rng,
    cfg: &'a Config,
    b: Builder,
    pool: Vec<ValueId>,
    /// The results of `random/wide.rs`'s ops, each also an output (later ops would leave
    /// most of them dead).
    wide: Vec<ValueId>,
}

impl Gen<'_> {
    fn ty(&self, v: ValueId) -> TensorType {
        self.b.ty(v).expect("pool values exist").clone()
    }

    fn random_type(&mut self) -> TensorType {
        let dtype = *self.rng.pick(&self.cfg.dtypes);
        if let Some((lo, hi)) = self.cfg.elements {
            return self.large_type(dtype, lo, hi);
        }
        let rank = self.rng.below(self.cfg.max_rank + 1);
        let shape: Vec<usize> = (0..rank)
            .map(|_| {
                if self.cfg.dims.is_empty() {
                    self.size(self.cfg.max_dim)
                } else if self.rng.chance(self.cfg.empty) {
                    0
                } else {
                    *self.rng.pick(&self.cfg.dims)
                }
            })
            .collect();
        TensorType::new(dtype, shape)
    }

    /// A type of rank 1 to `max_rank` with between `lo` and `hi` elements (about): leading
    /// dimensions from `dims`, the last what remains, in a random order.
    fn large_type(&mut self, dtype: DType, lo: usize, hi: usize) -> TensorType {
        let n = self.log_uniform(lo, hi);
        let rank = 1 + self.rng.below(self.cfg.max_rank.max(1));
        let mut shape = Vec::with_capacity(rank);
        let mut rest = n;
        for _ in 1..rank {
            let d = if self.cfg.dims.is_empty() {
                1 + self.rng.below(self.cfg.max_dim.max(1))
            } else {
                *self.rng.pick(&self.cfg.dims)
            };
            let d = d.clamp(1, rest);
            shape.push(d);
            rest /= d;
        }
        shape.push(rest.max(1));
        for i in (1..shape.len()).rev() {
            let j = self.rng.below(i + 1);
            shape.swap(i, j);
        }
        TensorType::new(dtype, shape)
    }

    /// An integer in `lo..=hi` (`1 <= lo <= hi`), uniform in its logarithm.
    fn log_uniform(&mut self, lo: usize, hi: usize) -> usize {
        let (a, b) = ((lo.max(1) as f64).ln(), (hi.max(lo).max(1) as f64).ln());
        (self.rng.uniform(a, b).exp().round() as usize).clamp(lo, hi.max(lo))
    }

    /// A size in `0..=n`: 0 only with the chance `empty` (or when `n` is 0), else uniform in
    /// `1..=n`.
    fn size(&mut self, n: usize) -> usize {
        if n == 0 || self.rng.chance(self.cfg.empty) {
            0
        } else {
            1 + self.rng.below(n)
        }
    }

    /// A `dot_general`'s width for a left operand `t`: small, or for large programs up to what
    /// keeps the multiply-adds under `16 * hi` and the right operand and result under `hi`
    /// elements, log-uniformly.
    fn dot_width(&mut self, t: &TensorType) -> usize {
        let Some((_, hi)) = self.cfg.elements else {
            return self.size(self.cfg.max_dim);
        };
        let k = t.shape.last().copied().unwrap_or(1).max(1);
        let numel = t.numel().max(1);
        let rows = (numel / k).max(1);
        let max = (16 * hi / numel).min(hi / k).min(hi / rows).max(1);
        self.log_uniform(1, max)
    }

    fn param(&mut self, ty: TensorType) -> ValueId {
        let v = self.b.param(ty);
        self.pool.push(v);
        v
    }

    /// A value of exactly this type: from the pool when one exists, else a new parameter.
    fn value_of(&mut self, ty: &TensorType) -> ValueId {
        let same: Vec<ValueId> = self
            .pool
            .iter()
            .copied()
            .filter(|&v| self.b.ty(v) == Some(ty))
            .collect();
        if !same.is_empty() && self.rng.chance(0.7) {
            *self.rng.pick(&same)
        } else {
            self.param(ty.clone())
        }
    }

    fn scalar_const(&mut self, dtype: DType, x: f64) -> ValueId {
        let value = Literal::from_f64s(TensorType::scalar(dtype), &[x]).expect("scalar");
        self.b
            .inst(Op::Constant { value }, &[])
            .expect("constants are well-typed")
    }

    fn step(&mut self) {
        // Large programs drop an instruction whose results grow too large, and favour matrix
        // products (one step in three) and transposes (one in six).
        let saved = self.cfg.elements.map(|_| (self.b.clone(), self.pool.len()));
        let a = *self.rng.pick(&self.pool);
        let t = self.ty(a);
        let d = t.dtype;
        let r = t.rank();
        let case = match self.cfg.elements.map(|_| self.rng.below(6)) {
            Some(0 | 1) => 14,
            Some(2) => 9,
            _ if self.cfg.control => self.rng.below(30),
            _ => self.rng.below(26),
        };
        let result: Option<ValueId> = match case {
            0 | 1 => {
                let ops: Vec<Op> = if d.is_complex() {
                    vec![
                        Op::Negate {},
                        Op::Abs {},
                        Op::Sign {},
                        Op::Exponential {},
                        Op::ExponentialMinusOne {},
                        Op::Log {},
                        Op::LogPlusOne {},
                        Op::Sqrt {},
                        Op::Rsqrt {},
                        Op::Sine {},
                        Op::Cosine {},
                        Op::Tan {},
                        Op::Tanh {},
                        Op::Real {},
                        Op::Imag {},
                    ]
                } else if d.is_float() {
                    vec![
                        Op::Negate {},
                        Op::Abs {},
                        Op::Exponential {},
                        Op::Tanh {},
                        Op::Logistic {},
                        Op::Sine {},
                        Op::Floor {},
                        Op::Erf {},
                        Op::Sqrt {},
                        Op::Log {},
                        Op::Ceil {},
                        Op::RoundNearestAfz {},
                        Op::Cosine {},
                        Op::ExponentialMinusOne {},
                        Op::LogPlusOne {},
                        Op::Rsqrt {},
                        Op::Tan {},
                        Op::Cbrt {},
                        Op::RoundNearestEven {},
                        Op::ReducePrecision {
                            exponent_bits: 1 + self.rng.below(8) as i64,
                            mantissa_bits: self.rng.below(12) as i64,
                        },
                    ]
                } else if d.is_pred() {
                    vec![Op::Not {}]
                } else if d.is_signed() {
                    vec![
                        Op::Negate {},
                        Op::Abs {},
                        Op::Sign {},
                        Op::Not {},
                        Op::Popcnt {},
                        Op::CountLeadingZeros {},
                    ]
                } else {
                    vec![
                        Op::Not {},
                        Op::Negate {},
                        Op::Popcnt {},
                        Op::CountLeadingZeros {},
                    ]
                };
                let op = self.rng.pick(&ops).clone();
                self.b.inst(op, &[a]).ok()
            }
            2..=4 if d.is_complex() => {
                let ops = [
                    Op::Add {},
                    Op::Subtract {},
                    Op::Multiply {},
                    Op::Divide {},
                    Op::Power {},
                    Op::Complex {},
                ];
                let op = self.rng.pick(&ops).clone();
                let b = self.value_of(&t);
                if op == (Op::Complex {}) {
                    // Parts taken apart and put together again, crossed.
                    let re = self.b.inst(Op::Real {}, &[a]).ok();
                    let im = self.b.inst(Op::Imag {}, &[b]).ok();
                    re.zip(im)
                        .and_then(|(re, im)| self.b.inst(op, &[im, re]).ok())
                } else {
                    self.b.inst(op, &[a, b]).ok()
                }
            }
            2..=4 => {
                let ops: Vec<Op> = if d.is_float() {
                    vec![
                        Op::Add {},
                        Op::Subtract {},
                        Op::Multiply {},
                        Op::Divide {},
                        Op::Maximum {},
                        Op::Minimum {},
                        Op::Power {},
                        Op::Remainder {},
                        Op::Atan2 {},
                    ]
                } else if d.is_pred() {
                    vec![Op::And {}, Op::Or {}, Op::Xor {}, Op::Add {}]
                } else {
                    vec![
                        Op::Add {},
                        Op::Subtract {},
                        Op::Multiply {},
                        Op::Maximum {},
                        Op::And {},
                        Op::Xor {},
                        Op::ShiftLeft {},
                        Op::ShiftRightLogical {},
                        Op::ShiftRightArithmetic {},
                        Op::Divide {},
                    ]
                };
                let op = self.rng.pick(&ops).clone();
                let b = self.value_of(&t);
                self.b.inst(op, &[a, b]).ok()
            }
            5 => {
                let b = self.value_of(&t);
                let dir = *self.rng.pick(ComparisonDirection::ALL);
                let p = self
                    .b
                    .inst(
                        Op::Compare {
                            comparison_direction: dir,
                        },
                        &[a, b],
                    )
                    .ok();
                let c = self.value_of(&t);
                p.and_then(|p| self.b.inst(Op::Select {}, &[p, a, c]).ok())
            }
            6 => {
                let to = *self.rng.pick(&self.cfg.dtypes);
                self.b
                    .inst_typed(Op::Convert {}, &[a], t.with_dtype(to))
                    .ok()
            }
            7 => {
                let n = self.rng.below(3) + 1;
                let mut shape = vec![n];
                shape.extend(&t.shape);
                self.b
                    .inst_typed(
                        Op::BroadcastInDim {
                            broadcast_dimensions: (1..=r as i64).collect(),
                        },
                        &[a],
                        TensorType::new(d, shape),
                    )
                    .ok()
            }
            8 => {
                let shape = if r > 1 && self.rng.chance(0.5) {
                    vec![t.numel()]
                } else {
                    t.shape.iter().rev().copied().collect()
                };
                let shape = if shape.iter().product::<usize>() == t.numel() {
                    shape
                } else {
                    vec![t.numel()]
                };
                self.b
                    .inst_typed(Op::Reshape {}, &[a], TensorType::new(d, shape))
                    .ok()
            }
            9 => {
                let mut p: Vec<i64> = (0..r as i64).collect();
                for i in (1..p.len()).rev() {
                    let j = self.rng.below(i + 1);
                    p.swap(i, j);
                }
                // Large programs move their innermost dimension (transposes in tiles).
                if self.cfg.elements.is_some() && r >= 2 && p[r - 1] == r as i64 - 1 {
                    p.swap(r - 1, self.rng.below(r - 1));
                }
                self.b.inst(Op::Transpose { permutation: p }, &[a]).ok()
            }
            10 => {
                let mut s = Vec::new();
                let mut l = Vec::new();
                let mut st = Vec::new();
                for &n in &t.shape {
                    let x = self.rng.below(n.max(1));
                    let y = x + self.size(n - x);
                    s.push(x as i64);
                    l.push(y as i64);
                    st.push(self.rng.below(2) as i64 + 1);
                }
                self.b
                    .inst(
                        Op::Slice {
                            start_indices: s,
                            limit_indices: l,
                            strides: st,
                        },
                        &[a],
                    )
                    .ok()
            }
            11 => {
                let dims: Vec<i64> = (0..r as i64).filter(|_| self.rng.chance(0.5)).collect();
                self.b.inst(Op::Reverse { dimensions: dims }, &[a]).ok()
            }
            12 => {
                let pv = self.scalar_const(d, 0.0);
                let lo: Vec<i64> = (0..r).map(|_| self.rng.below(3) as i64 - 1).collect();
                let hi: Vec<i64> = (0..r).map(|_| self.rng.below(3) as i64).collect();
                let int: Vec<i64> = (0..r).map(|_| self.rng.below(2) as i64).collect();
                self.b
                    .inst(
                        Op::Pad {
                            edge_padding_low: lo,
                            edge_padding_high: hi,
                            interior_padding: int,
                        },
                        &[a, pv],
                    )
                    .ok()
            }
            13 if r > 0 => {
                let kind = if d.is_float() || d.is_signed() {
                    *self
                        .rng
                        .pick(&[Combiner::Add, Combiner::Max, Combiner::Min])
                } else {
                    Combiner::Add
                };
                let init = match kind {
                    Combiner::Add => 0.0,
                    Combiner::Max => -100.0,
                    _ => 100.0,
                };
                let init = self.scalar_const(d, init);
                let dims: Vec<i64> = (0..r as i64).filter(|_| self.rng.chance(0.5)).collect();
                self.b
                    .inst(
                        Op::Reduce {
                            dimensions: dims,
                            kind,
                        },
                        &[a, init],
                    )
                    .ok()
            }
            14 if r >= 1 && !d.is_pred() => {
                let k = t.shape[r - 1];
                let n = self.dot_width(&t);
                let w = self.value_of(&TensorType::new(d, [k, n]));
                self.b
                    .inst(
                        Op::DotGeneral {
                            lhs_batching_dimensions: vec![],
                            rhs_batching_dimensions: vec![],
                            lhs_contracting_dimensions: vec![r as i64 - 1],
                            rhs_contracting_dimensions: vec![0],
                        },
                        &[a, w],
                    )
                    .ok()
            }
            15 if r >= 1 => {
                let b = self.value_of(&t);
                let dim = self.rng.below(r) as i64;
                self.b
                    .inst(Op::Concatenate { dimension: dim }, &[a, b])
                    .ok()
            }
            // A window at run-time start indices (any values: they are clamped).
            16 if r >= 1 => {
                let sizes: Vec<i64> = t.shape.iter().map(|&n| self.size(n) as i64).collect();
                let mut ops = vec![a];
                for _ in 0..r {
                    let x = self.rng.below(9) as f64 - 4.0;
                    ops.push(self.scalar_const(DType::I32, x));
                }
                self.b
                    .inst(Op::DynamicSlice { slice_sizes: sizes }, &ops)
                    .ok()
            }
            // Per batch element along dim 0, elements of dim 1 picked by (possibly
            // out-of-range, so clamped) indices: a gather with batching dimensions.
            17 if r >= 2 && t.shape[1] > 0 && self.rng.chance(0.4) => {
                let (b, n) = (t.shape[0], self.rng.below(3) + 1);
                let idx: Vec<i64> = (0..b * n)
                    .map(|_| self.rng.below(t.shape[1] + 2) as i64)
                    .collect();
                let value = Literal::from_i64s(TensorType::new(DType::I32, [b, n]), &idx)
                    .expect("sizes match");
                let ids = self.b.inst(Op::Constant { value }, &[]).ok();
                let mut sizes: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                sizes[0] = 1;
                sizes[1] = 1;
                ids.and_then(|ids| {
                    let op = Op::Gather {
                        offset_dims: (2..r as i64).collect(),
                        collapsed_slice_dims: vec![1],
                        start_index_map: vec![1],
                        index_vector_dim: 2,
                        slice_sizes: sizes,
                        operand_batching_dims: vec![0],
                        start_indices_batching_dims: vec![0],
                    };
                    self.b.inst(op, &[a, ids]).ok()
                })
            }
            // Rows picked by (possibly out-of-range, so clamped) indices.
            17 if r >= 1 && t.shape[0] > 0 => {
                let n = self.rng.below(4) + 1;
                let idx: Vec<i64> = (0..n)
                    .map(|_| self.rng.below(t.shape[0] + 2) as i64)
                    .collect();
                let value = Literal::from_i64s(TensorType::new(DType::I32, [n]), &idx)
                    .expect("sizes match");
                let ids = self.b.inst(Op::Constant { value }, &[]).ok();
                let mut sizes: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                sizes[0] = 1;
                ids.and_then(|ids| {
                    let op = Op::Gather {
                        offset_dims: (1..r as i64).collect(),
                        collapsed_slice_dims: vec![0],
                        start_index_map: vec![0],
                        index_vector_dim: 1,
                        slice_sizes: sizes,
                        operand_batching_dims: Vec::new(),
                        start_indices_batching_dims: Vec::new(),
                    };
                    self.b.inst(op, &[a, ids]).ok()
                })
            }
            // Per batch element along dim 0, elements of dim 1 added into or replaced (out of
            // range ones are skipped): a scatter with batching dimensions.
            18 if r >= 2 && !d.is_pred() && self.rng.chance(0.4) => {
                let (b, n) = (t.shape[0], self.rng.below(3) + 1);
                let idx: Vec<i64> = (0..b * n)
                    .map(|_| self.rng.below(t.shape[1] + 2) as i64)
                    .collect();
                let value = Literal::from_i64s(TensorType::new(DType::I32, [b, n]), &idx)
                    .expect("sizes match");
                let mut ushape = vec![b, n];
                ushape.extend(&t.shape[2..]);
                let u = self.value_of(&TensorType::new(d, ushape));
                let ids = self.b.inst(Op::Constant { value }, &[]).ok();
                let kind = if self.rng.chance(0.5) {
                    Combiner::Add
                } else {
                    Combiner::Replace
                };
                ids.and_then(|ids| {
                    let op = Op::Scatter {
                        update_window_dims: (2..r as i64).collect(),
                        inserted_window_dims: vec![1],
                        scatter_dims_to_operand_dims: vec![1],
                        index_vector_dim: 2,
                        kind,
                        input_batching_dims: vec![0],
                        scatter_indices_batching_dims: vec![0],
                    };
                    self.b.inst(op, &[a, ids, u]).ok()
                })
            }
            // Rows added into (out-of-range rows are skipped).
            18 if r >= 1 && !d.is_pred() => {
                let n = self.rng.below(4) + 1;
                let idx: Vec<i64> = (0..n)
                    .map(|_| self.rng.below(t.shape[0] + 2) as i64)
                    .collect();
                let value = Literal::from_i64s(TensorType::new(DType::I32, [n, 1]), &idx)
                    .expect("sizes match");
                let mut ushape = vec![n];
                ushape.extend(&t.shape[1..]);
                let u = self.value_of(&TensorType::new(d, ushape));
                let ids = self.b.inst(Op::Constant { value }, &[]).ok();
                let kind = if self.rng.chance(0.5) {
                    Combiner::Add
                } else {
                    Combiner::Replace
                };
                ids.and_then(|ids| {
                    let op = Op::Scatter {
                        update_window_dims: (1..r as i64).collect(),
                        inserted_window_dims: vec![0],
                        scatter_dims_to_operand_dims: vec![0],
                        index_vector_dim: 1,
                        kind,
                        input_batching_dims: Vec::new(),
                        scatter_indices_batching_dims: Vec::new(),
                    };
                    self.b.inst(op, &[a, ids, u]).ok()
                })
            }
            // Windowed sums and maxima with strides, padding and dilations.
            19 if r >= 1 && !d.is_pred() => {
                let kind = if self.rng.chance(0.5) {
                    Combiner::Add
                } else {
                    Combiner::Max
                };
                let init = self.scalar_const(d, if kind == Combiner::Add { 0.0 } else { -100.0 });
                let pick = |g: &mut Self, lo: usize, hi: usize| -> Vec<i64> {
                    (0..r)
                        .map(|_| (lo + g.rng.below(hi - lo + 1)) as i64)
                        .collect()
                };
                let op = Op::ReduceWindow {
                    window_dimensions: pick(self, 1, 3),
                    window_strides: pick(self, 1, 2),
                    base_dilations: pick(self, 1, 2),
                    window_dilations: pick(self, 1, 2),
                    padding: (0..r)
                        .map(|_| (self.rng.below(2) as i64, self.rng.below(2) as i64))
                        .collect(),
                    kind,
                };
                self.b.inst(op, &[a, init]).ok()
            }
            // The gradient of max pooling.
            20 if r >= 1 && d.is_float() => {
                let wd: Vec<i64> = (0..r).map(|_| self.rng.below(2) as i64 + 1).collect();
                let ws: Vec<i64> = (0..r).map(|_| self.rng.below(2) as i64 + 1).collect();
                let padding: Vec<(i64, i64)> =
                    (0..r).map(|_| (self.rng.below(2) as i64, 0)).collect();
                let grid: Vec<usize> = (0..r)
                    .map(|i| {
                        crate::verify::window_output_size(
                            t.shape[i], 1, padding[i], wd[i], 1, ws[i],
                        )
                    })
                    .collect();
                let src = self.value_of(&TensorType::new(d, grid));
                let init = self.scalar_const(d, 0.0);
                let op = Op::SelectAndScatter {
                    window_dimensions: wd,
                    window_strides: ws,
                    padding,
                    select: ComparisonDirection::Ge,
                    kind: Combiner::Add,
                };
                self.b.inst(op, &[a, src, init]).ok()
            }
            // A small NCHW convolution with strides, padding, dilation and feature or batch
            // groups.
            21 if d.is_float() => {
                let groups = self.rng.below(2) + 1;
                let by_batch = groups > 1 && self.rng.chance(0.5);
                let (fg, bg) = if by_batch { (1, groups) } else { (groups, 1) };
                let (n, c, h, w) = (
                    bg * (self.rng.below(2) + 1),
                    fg * (self.rng.below(2) + 1),
                    self.rng.below(5) + 2,
                    self.rng.below(5) + 2,
                );
                let (o, kh, kw) = (
                    groups * (self.rng.below(2) + 1),
                    self.rng.below(2) + 1,
                    self.rng.below(3) + 1,
                );
                let x = self.value_of(&TensorType::new(d, [n, c, h, w]));
                let k = self.value_of(&TensorType::new(d, [o, c / fg, kh, kw]));
                let op = Op::Convolution {
                    window_strides: vec![
                        self.rng.below(2) as i64 + 1,
                        self.rng.below(2) as i64 + 1,
                    ],
                    padding: vec![
                        (self.rng.below(2) as i64, self.rng.below(2) as i64),
                        (self.rng.below(2) as i64, 0),
                    ],
                    lhs_dilation: vec![self.rng.below(2) as i64 + 1, 1],
                    rhs_dilation: vec![1, self.rng.below(2) as i64 + 1],
                    feature_group_count: fg as i64,
                    input_dims: vec![0, 1, 2, 3],
                    kernel_dims: vec![0, 1, 2, 3],
                    output_dims: vec![0, 1, 2, 3],
                    batch_group_count: bg as i64,
                };
                self.b.inst(op, &[x, k]).ok()
            }
            // Clamped between two values of the same type (bounds may cross: the spec's order
            // of max then min decides).
            22 if !d.is_pred() => {
                let lo = self.value_of(&t);
                let hi = self.value_of(&t);
                self.b.inst(Op::Clamp {}, &[lo, a, hi]).ok()
            }
            // Finiteness tests, and bits reinterpreted between types of one width.
            23 => {
                if d.is_float() && self.rng.chance(0.5) {
                    self.b.inst(Op::IsFinite {}, &[a]).ok()
                } else {
                    // Any other type of the same width (the same type when there is none).
                    // Complex types and small floats only where the configuration has them.
                    let same: Vec<DType> = DType::ALL
                        .into_iter()
                        .filter(|&o| o != d && !o.is_pred() && !d.is_pred() && o.bits() == d.bits())
                        .filter(|o| {
                            !(o.is_complex() || o.mini().is_some()) || self.cfg.dtypes.contains(o)
                        })
                        .collect();
                    let to = if same.is_empty() {
                        d
                    } else {
                        *self.rng.pick(&same)
                    };
                    self.b
                        .inst_typed(Op::BitcastConvert {}, &[a], t.with_dtype(to))
                        .ok()
                }
            }
            // A window written at run-time start indices (clamped).
            24 if r >= 1 => {
                let ushape: Vec<usize> = t.shape.iter().map(|&n| self.size(n)).collect();
                let u = self.value_of(&TensorType::new(d, ushape));
                let mut ops = vec![a, u];
                for _ in 0..r {
                    let x = self.rng.below(9) as f64 - 4.0;
                    ops.push(self.scalar_const(DType::I32, x));
                }
                self.b.inst(Op::DynamicUpdateSlice {}, &ops).ok()
            }
            // A barrier over one or two values, or random bits from a key.
            25 => {
                if self.rng.chance(0.5) {
                    let b = *self.rng.pick(&self.pool);
                    let ops = if a == b { vec![a] } else { vec![a, b] };
                    self.b
                        .push(Op::OptimizationBarrier {}, &ops)
                        .ok()
                        .map(|rs| rs[0])
                } else {
                    // The state as four u32 words or as XLA's two u64s; u32 or u64 bits.
                    let state = if self.rng.chance(0.5) {
                        TensorType::new(DType::U32, [4])
                    } else {
                        TensorType::new(DType::U64, [2])
                    };
                    let bits = *self.rng.pick(&[DType::U32, DType::U64]);
                    let key = random_literal(self.rng, &state);
                    let key = self.b.inst(Op::Constant { value: key }, &[]).ok();
                    let n = self.size(self.cfg.max_dim);
                    let shape: Vec<usize> = (0..self.rng.below(3)).map(|_| n).collect();
                    key.and_then(|k| {
                        self.b
                            .push_typed(
                                Op::RngBitGenerator {
                                    algorithm: crate::RngAlgorithm::ThreeFry,
                                },
                                &[k],
                                &[state, TensorType::new(bits, shape)],
                            )
                            .ok()
                            .map(|rs| rs[1])
                    })
                }
            }
            26 => self.random_loop(a, &t),
            27 => self.random_case(a, &t),
            28 if r >= 1 => self.random_sort(a, &t),
            29 => self.random_linalg(a, &t),
            _ => {
                let ty = TensorType::new(if d.is_pred() { DType::I32 } else { d }, t.shape.clone());
                if r > 0 {
                    let dim = self.rng.below(r) as i64;
                    self.b
                        .inst_typed(
                            Op::Iota {
                                iota_dimension: dim,
                            },
                            &[],
                            ty,
                        )
                        .ok()
                } else {
                    let value = random_literal(self.rng, &t);
                    self.b.inst(Op::Constant { value }, &[]).ok()
                }
            }
        };
        if let (Some((b, pool)), Some((_, hi))) = (saved, self.cfg.elements) {
            let start = b.func().values.len();
            if self.b.func().values[start..].iter().any(|t| t.numel() > hi) {
                self.b = b;
                self.pool.truncate(pool);
                return;
            }
        }
        if let Some(v) = result {
            self.pool.push(v);
        }
        self.maybe_region_op();
        self.maybe_call();
        self.maybe_wide_op();
    }

    /// With control flow, one step in ten also adds a `map`, `reduce_region` or
    /// `reduce_window_region`. These draw from a stream of their own (the main one is left
    /// where it was), so a seed's program changes only where one is added.
    fn maybe_region_op(&mut self) {
        if !self.cfg.control || self.cfg.elements.is_some() {
            return;
        }
        let v = self.on_side_stream(0xD1B5_4A32_D192_ED03, 10, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            if g.rng.chance(0.3) {
                g.random_map(a, &t)
            } else {
                g.random_reduce_region(a, &t)
            }
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
        }
    }

    /// With control flow, one step in twenty adds a `call` (from a stream of its own, as
    /// [`Gen::maybe_region_op`]'s).
    fn maybe_call(&mut self) {
        if !self.cfg.control || self.cfg.elements.is_some() {
            return;
        }
        let v = self.on_side_stream(0x6A09_E667_F3BC_C909, 20, |g| {
            let a = *g.rng.pick(&g.pool);
            let t = g.ty(a);
            g.random_call(a, &t)
        });
        if let Some(v) = v.flatten() {
            self.pool.push(v);
        }
    }

    /// One time in `one_in` (drawn from a stream of its own, seeded by the main stream's state
    /// and `salt`), `f` run with that side stream in place of the main one, which is left where
    /// it was: a seed's program changes only where `f` adds something.
    fn on_side_stream<T>(
        &mut self,
        salt: u64,
        one_in: usize,
        f: impl FnOnce(&mut Self) -> T,
    ) -> Option<T> {
        let mut aux = Rng::new(self.rng.0 ^ salt);
        if aux.below(one_in) != 0 {
            return None;
        }
        std::mem::swap(&mut *self.rng, &mut aux);
        let r = f(self);
        std::mem::swap(&mut *self.rng, &mut aux);
        Some(r)
    }

    /// A `call` of a new function combining `a` with another value by two elementwise ops
    /// (the second through a nested call half the time); half the time the function is called
    /// again on its own result.
    fn random_call(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let x = self.value_of(t);
        let n = self.b.func().values.len();
        let (op1, op2) = (self.combine_op(t.dtype), self.combine_op(t.dtype));
        let inner = Self::region(
            &format!("callee{n}_inner"),
            &[t.clone(), t.clone()],
            |b, ps| Some(vec![b.binary(op2.clone(), ps[0], ps[1]).ok()?]),
        )?;
        let nested = self.rng.chance(0.5);
        let callee = Self::region(&format!("callee{n}"), &[t.clone(), t.clone()], |b, ps| {
            let v = b.binary(op1, ps[0], ps[1]).ok()?;
            let w = if nested {
                let callee = crate::Callee::of(&inner);
                b.push(Op::Call { callee }, &[v, ps[1]]).ok()?[0]
            } else {
                b.binary(op2, v, ps[1]).ok()?
            };
            Some(vec![w])
        })?;
        let op = Op::Call {
            callee: crate::Callee::of(&callee),
        };
        let r = self.b.push(op.clone(), &[a, x]).ok()?[0];
        if self.rng.chance(0.5) {
            return self.b.push(op, &[r, x]).ok().map(|rs| rs[0]);
        }
        Some(r)
    }

    /// A random elementwise op combining two values of dtype `d`.
    fn combine_op(&mut self, d: DType) -> Op {
        let ops: Vec<Op> = if d.is_pred() {
            vec![Op::Xor {}, Op::And {}, Op::Or {}]
        } else if d.is_float() {
            vec![
                Op::Add {},
                Op::Multiply {},
                Op::Subtract {},
                Op::Maximum {},
                Op::Atan2 {},
            ]
        } else {
            vec![Op::Add {}, Op::Xor {}, Op::Maximum {}, Op::Multiply {}]
        };
        self.rng.pick(&ops).clone()
    }

    /// A region of parameters `params` returning `emit`'s values.
    fn region(
        name: &str,
        params: &[TensorType],
        emit: impl FnOnce(&mut Builder, &[ValueId]) -> Option<Vec<ValueId>>,
    ) -> Option<Func> {
        let mut b = Builder::new(name);
        let ps: Vec<ValueId> = params.iter().map(|t| b.param(t.clone())).collect();
        let outs = emit(&mut b, &ps)?;
        b.finish(&outs).ok()
    }

    /// A `while` with a static trip count (0 to 3): a counter from 0 and a carry of `a`'s
    /// type stepped by an elementwise op with a value passed through unchanged.
    fn random_loop(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let trips = self.rng.below(4) as f64;
        let x = self.value_of(t);
        let op = self.combine_op(t.dtype);
        let counter = TensorType::scalar(DType::I32);
        let carries = [counter.clone(), t.clone(), t.clone()];
        let cond = Self::region("cond", &carries, |b, ps| {
            let k = b.scalar(DType::I32, trips).ok()?;
            Some(vec![
                b.compare(ps[0], k, crate::ComparisonDirection::Lt).ok()?,
            ])
        })?;
        let body = Self::region("body", &carries, |b, ps| {
            let one = b.scalar(DType::I32, 1.0).ok()?;
            let i = b.binary(Op::Add {}, ps[0], one).ok()?;
            let v = b.binary(op, ps[1], ps[2]).ok()?;
            Some(vec![i, v, ps[2]])
        })?;
        let zero = self.scalar_const(DType::I32, 0.0);
        let rs = self
            .b
            .push(
                Op::While {
                    cond: Box::new(cond),
                    body: Box::new(body),
                },
                &[zero, a, x],
            )
            .ok()?;
        Some(rs[1])
    }

    /// A `case` over two or three branches, each combining `a` with another value by a
    /// different op; the index is an `i32[]` input (out of range: the last branch).
    fn random_case(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let index = self.value_of(&TensorType::scalar(DType::I32));
        let x = self.value_of(t);
        let n = 2 + self.rng.below(2);
        let mut branches = Vec::with_capacity(n);
        for k in 0..n {
            let op = self.combine_op(t.dtype);
            branches.push(Self::region(
                &format!("branch{k}"),
                &[t.clone(), t.clone()],
                |b, ps| Some(vec![b.binary(op, ps[0], ps[1]).ok()?]),
            )?);
        }
        self.b
            .push(Op::Case { branches }, &[index, a, x])
            .ok()
            .map(|rs| rs[0])
    }

    /// A `sort` along a random dimension by the first operand (`<` or `>`), with a second
    /// operand carried along half the time. Float keys are parameters (no NaN, whose order a
    /// plain `<` leaves open).
    fn random_sort(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let key = if t.dtype.is_float() && !self.b.func().params.contains(&a) {
            self.value_of(&t.with_dtype(DType::I32))
        } else {
            a
        };
        let kt = self.ty(key);
        let mut operands = vec![key];
        if self.rng.chance(0.5) {
            let d = *self.rng.pick(&self.cfg.dtypes);
            operands.push(self.value_of(&t.with_dtype(d)));
        }
        let scalars: Vec<TensorType> = operands
            .iter()
            .flat_map(|&v| {
                let s = TensorType::scalar(self.ty(v).dtype);
                [s.clone(), s]
            })
            .collect();
        let dir = if self.rng.chance(0.5) {
            crate::ComparisonDirection::Lt
        } else {
            crate::ComparisonDirection::Gt
        };
        let comparator = Self::region("comparator", &scalars, |b, ps| {
            Some(vec![b.compare(ps[0], ps[1], dir).ok()?])
        })?;
        let op = Op::Sort {
            dimension: self.rng.below(kt.rank()) as i64,
            is_stable: self.rng.chance(0.5),
            comparator: Box::new(comparator),
        };
        let rs = self.b.push(op, &operands).ok()?;
        Some(*self.rng.pick(&rs))
    }

    /// A `map` of `a` and another value of its type by a computation of one or two
    /// elementwise ops (negated for floats, half the time).
    fn random_map(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let x = self.value_of(t);
        let op = self.combine_op(t.dtype);
        let negate = t.dtype.is_float() && self.rng.chance(0.5);
        let s = TensorType::scalar(t.dtype);
        let computation = Self::region("computation", &[s.clone(), s], |b, ps| {
            let v = b.binary(op, ps[0], ps[1]).ok()?;
            Some(vec![if negate {
                b.unary(Op::Negate {}, v).ok()?
            } else {
                v
            }])
        })?;
        let op = Op::Map {
            dimensions: (0..t.rank() as i64).collect(),
            computation: Box::new(computation),
        };
        self.b.inst(op, &[a, x]).ok()
    }

    /// A `reduce_region` over random dimensions of `a`, or a `reduce_window_region` over small
    /// random windows (strides, dilations and padding of 1 or 2): an argmax or argmin (with NaN
    /// greatest, ties to the smaller index of a unique `i32` index per element) or, for `pred`
    /// and integers, an exclusive or (a body that is a named combiner would be a `reduce`).
    /// Every body is associative and commutative (the argmax's a total order), so the results
    /// do not depend on the combining order.
    fn random_reduce_region(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        let dims: Vec<i64> = (0..t.rank() as i64)
            .filter(|_| self.rng.chance(0.6))
            .collect();
        // Some of the time a `reduce_window_region` of small random windows instead.
        let window = self.rng.chance(0.4).then(|| {
            let r = t.rank();
            let mut pick = |lo: usize, hi: usize| (lo + self.rng.below(hi - lo + 1)) as i64;
            let dims: Vec<i64> = (0..r).map(|_| pick(1, 3)).collect();
            let strides: Vec<i64> = (0..r).map(|_| pick(1, 2)).collect();
            let base: Vec<i64> = (0..r).map(|_| pick(1, 2)).collect();
            let wdil: Vec<i64> = (0..r).map(|_| pick(1, 2)).collect();
            let padding: Vec<(i64, i64)> = (0..r).map(|_| (pick(0, 1), pick(0, 1))).collect();
            (dims, strides, base, wdil, padding)
        });
        let make = |body: Func| match &window {
            Some((wd, ws, bd, wdl, padding)) => Op::ReduceWindowRegion {
                window_dimensions: wd.clone(),
                window_strides: ws.clone(),
                base_dilations: bd.clone(),
                window_dilations: wdl.clone(),
                padding: padding.clone(),
                body: Box::new(body),
            },
            None => Op::ReduceRegion {
                dimensions: dims.clone(),
                body: Box::new(body),
            },
        };
        self.region_reduction(a, t, &make)
    }

    /// `make`'s op (a `reduce_region` or `reduce_window_region` of the body it is given) over
    /// `a` of type `t`: an argmax or argmin with a unique index per element or, for `pred` and
    /// integers, an exclusive or (see [`Gen::random_reduce_region`]).
    fn region_reduction(
        &mut self,
        a: ValueId,
        t: &TensorType,
        make: &dyn Fn(Func) -> Op,
    ) -> Option<ValueId> {
        use crate::ComparisonDirection as Cmp;
        let d = t.dtype;
        let s = TensorType::scalar(d);
        if d.is_pred() || (d.is_int() && self.rng.chance(0.3)) {
            let body = Self::region("combine", &[s.clone(), s.clone()], |b, ps| {
                Some(vec![b.binary(Op::Xor {}, ps[0], ps[1]).ok()?])
            })?;
            let init = self.value_of(&s);
            return self.b.push(make(body), &[a, init]).ok().map(|rs| rs[0]);
        }
        // A unique index per element: a flat iota in the operand's shape.
        let it = TensorType::new(DType::I32, [t.numel()]);
        let flat = self
            .b
            .inst_typed(Op::Iota { iota_dimension: 0 }, &[], it)
            .ok()?;
        let index = self.b.reshape(flat, &t.shape).ok()?;
        let dir = if self.rng.chance(0.5) {
            Cmp::Gt
        } else {
            Cmp::Lt
        };
        let i = TensorType::scalar(DType::I32);
        let body = Self::region("argbest", &[s.clone(), i.clone(), s.clone(), i], |b, ps| {
            let (av, ai, xv, xi) = (ps[0], ps[1], ps[2], ps[3]);
            let better = b.compare(xv, av, dir).ok()?;
            let x_nan = b.compare(xv, xv, Cmp::Ne).ok()?;
            let a_nan = b.compare(av, av, Cmp::Ne).ok()?;
            let a_num = b.unary(Op::Not {}, a_nan).ok()?;
            let nan_wins = b.binary(Op::And {}, x_nan, a_num).ok()?;
            let wins = b.binary(Op::Or {}, better, nan_wins).ok()?;
            let eq = b.compare(xv, av, Cmp::Eq).ok()?;
            let both_nan = b.binary(Op::And {}, x_nan, a_nan).ok()?;
            let tie = b.binary(Op::Or {}, eq, both_nan).ok()?;
            let first = b.compare(xi, ai, Cmp::Lt).ok()?;
            let tie_wins = b.binary(Op::And {}, tie, first).ok()?;
            let pick = b.binary(Op::Or {}, wins, tie_wins).ok()?;
            Some(vec![
                b.select(pick, xv, av).ok()?,
                b.select(pick, xi, ai).ok()?,
            ])
        })?;
        let init = self.value_of(&s);
        let init_index = self.scalar_const(DType::I32, 0.0);
        let rs = self
            .b
            .push(make(body), &[a, index, init, init_index])
            .ok()?;
        Some(*self.rng.pick(&rs))
    }

    /// A `cholesky` of a positive definite matrix made from `a` (an f32 or f64 value of rank at
    /// least 2, else a new one): `a aᵀ` plus `(k + 1) I` for `a`'s `k` columns, so its
    /// eigenvalues are at least `k + 1`; then, most of the time, a `triangular_solve` with
    /// the factor as its matrix. One time in eight an `lu` instead, one in eight an `fft`
    /// (`random/fft.rs`).
    fn random_linalg(&mut self, a: ValueId, t: &TensorType) -> Option<ValueId> {
        if self.rng.chance(0.25) {
            return if self.rng.chance(0.5) {
                self.random_lu()
            } else {
                self.random_fft(a, t)
            };
        }
        let (a, t) = if matches!(t.dtype, DType::F32 | DType::F64) && t.rank() >= 2 {
            (a, t.clone())
        } else {
            let d = *self.rng.pick(&[DType::F32, DType::F64]);
            let n = self.size(self.cfg.max_dim);
            let k = self.size(self.cfg.max_dim);
            let t = TensorType::new(d, [n, k]);
            (self.value_of(&t), t)
        };
        let r = t.rank() as i64;
        let (m, k) = (t.shape[t.rank() - 2], t.shape[t.rank() - 1]);
        let batch: Vec<i64> = (0..r - 2).collect();
        let gram = self
            .b
            .inst(
                Op::DotGeneral {
                    lhs_batching_dimensions: batch.clone(),
                    rhs_batching_dimensions: batch,
                    lhs_contracting_dimensions: vec![r - 1],
                    rhs_contracting_dimensions: vec![r - 1],
                },
                &[a, a],
            )
            .ok()?;
        let gt = self.ty(gram);
        let diag: Vec<f64> = (0..m * m)
            .map(|i| if i / m == i % m { (k + 1) as f64 } else { 0.0 })
            .collect();
        let value = Literal::from_f64s(TensorType::new(t.dtype, [m, m]), &diag).ok()?;
        let eye = self.b.inst(Op::Constant { value }, &[]).ok()?;
        let eye = self
            .b
            .inst_typed(
                Op::BroadcastInDim {
                    broadcast_dimensions: vec![r - 2, r - 1],
                },
                &[eye],
                gt.clone(),
            )
            .ok()?;
        let spd = self.b.binary(Op::Add {}, gram, eye).ok()?;
        let lower = self.rng.chance(0.5);
        let l = self.b.inst(Op::Cholesky { lower }, &[spd]).ok()?;
        if self.rng.chance(0.3) {
            return Some(l);
        }
        let left_side = self.rng.chance(0.5);
        let mut shape = gt.shape.clone();
        let side = if left_side {
            shape.len() - 1
        } else {
            shape.len() - 2
        };
        shape[side] = self.size(self.cfg.max_dim);
        let rhs = self.value_of(&TensorType::new(t.dtype, shape));
        let op = Op::TriangularSolve {
            left_side,
            lower,
            unit_diagonal: self.rng.chance(0.25),
            transpose_a: *self.rng.pick(crate::TransposeA::ALL),
        };
        self.b.inst(op, &[l, rhs]).ok()
    }

    /// An `lu` of `tanh(a) + (n + 2) I` for a square f32 or f64 `a`: strictly diagonally
    /// dominant by columns (every other element of a column is at most 1 in size), so every
    /// pivot is the diagonal one with a wide margin and rounding never changes the
    /// permutation; one of its three results.
    fn random_lu(&mut self) -> Option<ValueId> {
        let d = *self.rng.pick(&[DType::F32, DType::F64]);
        let n = self.size(self.cfg.max_dim);
        let batch = self.rng.below(2);
        let mut shape = vec![2; batch];
        shape.extend([n, n]);
        let t = TensorType::new(d, shape);
        let a = self.value_of(&t);
        let bounded = self.b.unary(Op::Tanh {}, a).ok()?;
        let diag: Vec<f64> = (0..n * n)
            .map(|i| if i / n == i % n { (n + 2) as f64 } else { 0.0 })
            .collect();
        let value = Literal::from_f64s(TensorType::new(d, [n, n]), &diag).ok()?;
        let eye = self.b.inst(Op::Constant { value }, &[]).ok()?;
        let r = t.rank() as i64;
        let eye = self
            .b
            .inst_typed(
                Op::BroadcastInDim {
                    broadcast_dimensions: vec![r - 2, r - 1],
                },
                &[eye],
                t.clone(),
            )
            .ok()?;
        let m = self.b.binary(Op::Add {}, bounded, eye).ok()?;
        let rs = self.b.push(Op::Lu {}, &[m]).ok()?;
        Some(*self.rng.pick(&rs))
    }

    /// The last value computed from a parameter (through at least one instruction) with an
    /// element, if any.
    fn last_computed(&self) -> Option<ValueId> {
        let f = self.b.func();
        let computed = computed_from_inputs(f);
        f.insts
            .iter()
            .rev()
            .flat_map(|i| i.results.iter().rev().copied())
            .find(|r| computed[r.index()] && f.values[r.index()].numel() > 0)
    }
}

/// For each value of `f`, whether an instruction computed it from a parameter (constants, iotas
/// and the parameters themselves are not computed from one).
pub fn computed_from_inputs(f: &Func) -> Vec<bool> {
    let mut from_param = vec![false; f.values.len()];
    for &p in &f.params {
        from_param[p.index()] = true;
    }
    let mut computed = vec![false; f.values.len()];
    for inst in &f.insts {
        let hit = inst.operands.iter().any(|o| from_param[o.index()]);
        for r in &inst.results {
            from_param[r.index()] = hit;
            computed[r.index()] = hit;
        }
    }
    computed
}

/// Whether `f` computes something from its inputs: an output with an element that an
/// instruction computed from a parameter (not only empty, constant or passed-through outputs).
pub fn computes_from_inputs(f: &Func) -> bool {
    let computed = computed_from_inputs(f);
    f.outputs
        .iter()
        .any(|o| computed[o.index()] && f.values[o.index()].numel() > 0)
}

/// A random well-typed function named `main`.
pub fn random_func(rng: &mut Rng, cfg: &Config) -> Func {
    let mut g = Gen {
        rng,
        cfg,
        b: Builder::new("main"),
        pool: Vec::new(),
        wide: Vec::new(),
    };
    let t = g.random_type();
    g.param(t);
    for _ in 0..cfg.ops {
        g.step();
    }
    // The first output computes something from an input: the last value that does, after a
    // few more instructions if none does yet, or else the negation of a new parameter.
    for _ in 0..2 * cfg.ops.max(2) {
        if g.last_computed().is_some() {
            break;
        }
        g.step();
    }
    let last = g.last_computed().unwrap_or_else(|| {
        let mut t = g.random_type();
        t.shape.iter_mut().for_each(|d| *d = (*d).max(1));
        let p = g.param(t.clone());
        let op = if t.dtype.is_pred() {
            Op::Not {}
        } else {
            Op::Negate {}
        };
        g.b.inst(op, &[p]).expect("negation is well-typed")
    });
    let mut outs = vec![last];
    if g.pool.len() > 2 && g.rng.chance(0.5) {
        let other = *g.rng.pick(&g.pool);
        outs.push(other);
    }
    for v in std::mem::take(&mut g.wide) {
        if !outs.contains(&v) {
            outs.push(v);
        }
    }
    g.b.finish(&outs).expect("outputs come from the pool")
}

#[cfg(test)]
mod tests;

//! The op set, declared once.
//!
//! Every op's name, text mnemonic, operand and result counts, attributes (with their text names)
//! and properties come from the single [`define_ops!`] invocation below. Passes match on
//! [`Op`] or [`OpKind`] exhaustively, so adding an op walks the compiler through every place
//! that must learn about it.

use crate::attr::{
    Attr, AttrCtx, AttrValue, Combiner, ComparisonDirection, FftType, RngAlgorithm, TransposeA,
};
use crate::call::Callee;
use crate::{Func, Literal};

/// Op properties, as data: passes ask these instead of listing ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Props(u16);

impl Props {
    /// Applies independently to each element position of same-shaped operands.
    pub const ELEMENTWISE: Props = Props(1);
    /// `op(a, b) == op(b, a)` exactly.
    pub const COMMUTATIVE: Props = Props(2);
    /// `op(op(a, b), c) == op(a, op(b, c))` (exactly for integers; up to rounding for floats).
    pub const ASSOCIATIVE: Props = Props(4);
    /// Has a VJP rule (see the op's spec); the gradient flows to float operands.
    pub const DIFFERENTIABLE: Props = Props(8);
    /// Combines many elements into fewer.
    pub const REDUCTION: Props = Props(16);
    /// Moves or replicates elements without computing on them.
    pub const LAYOUT: Props = Props(32);
    /// Must not be moved, merged or removed by rewrites.
    pub const BARRIER: Props = Props(64);
    /// Runs nested functions (regions: a loop's condition and body, a case's branches); passes
    /// treat it as an opaque boundary and the regions as functions of their own.
    pub const CONTROL: Props = Props(128);
    /// No property.
    pub const NONE: Props = Props(0);

    /// True when every property of `other` is in `self`.
    pub fn contains(self, other: Props) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Props {
    type Output = Props;
    fn bitor(self, rhs: Props) -> Props {
        Props(self.0 | rhs.0)
    }
}

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Fixed(usize),
    /// At least this many.
    AtLeast(usize),
}

impl Arity {
    /// Whether `n` operands are accepted.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Fixed(k) => n == k,
            Arity::AtLeast(k) => n >= k,
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arity::Fixed(k) => write!(f, "{k}"),
            Arity::AtLeast(k) => write!(f, "at least {k}"),
        }
    }
}

/// How many results an op produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultCount {
    /// Exactly this many.
    Fixed(usize),
    /// One per operand.
    PerOperand,
    /// As many as the op's regions return (`case`: its branches' results; `call`: its
    /// callee's).
    Regions,
    /// Half as many as operands (`reduce_region`, `reduce_window_region`: one per input, its
    /// inputs and init values being the operands).
    HalfOperands,
}

impl ResultCount {
    /// The number of results for `n` operands, where it does not depend on the op's regions
    /// (`None` for [`ResultCount::Regions`]: ask [`Op::result_count`]).
    pub fn for_operands(self, n: usize) -> Option<usize> {
        match self {
            ResultCount::Fixed(k) => Some(k),
            ResultCount::PerOperand => Some(n),
            ResultCount::Regions => None,
            ResultCount::HalfOperands => Some(n / 2),
        }
    }
}

const EW: Props = Props::ELEMENTWISE;
const COMM: Props = Props::COMMUTATIVE;
const ASSOC: Props = Props::ASSOCIATIVE;
const DIFF: Props = Props::DIFFERENTIABLE;
const RED: Props = Props::REDUCTION;
const LAYOUT: Props = Props::LAYOUT;
const BARRIER: Props = Props::BARRIER;
const CONTROL: Props = Props::CONTROL;
const NONE: Props = Props::NONE;

macro_rules! define_ops {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $mnem:literal, $arity:expr, $results:expr, $props:expr $(, { $($field:ident : $fty:ty),* $(,)? })? ;
    )*) => {
        /// An operation with its attributes. The text mnemonic and attribute names are the
        /// StableHLO ones.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Op {
            $(
                $(#[doc = $doc])*
                $variant { $($(
                    #[allow(missing_docs)]
                    $field: $fty,
                )*)? },
            )*
        }

        /// The kind of an [`Op`], without attributes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl OpKind {
            /// Every op kind, in declaration order.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$variant),*];

            /// The text mnemonic (StableHLO name without the dialect prefix).
            pub fn mnemonic(self) -> &'static str {
                match self { $(OpKind::$variant => $mnem),* }
            }

            /// The op kind with this mnemonic.
            pub fn from_mnemonic(s: &str) -> Option<OpKind> {
                match s { $($mnem => Some(OpKind::$variant),)* _ => None }
            }

            /// How many operands the op takes.
            pub fn arity(self) -> Arity {
                match self { $(OpKind::$variant => $arity),* }
            }

            /// How many results the op produces.
            pub fn results(self) -> ResultCount {
                match self { $(OpKind::$variant => $results),* }
            }

            /// The op's properties.
            pub fn props(self) -> Props {
                match self { $(OpKind::$variant => $props),* }
            }

            /// The names of the op's attributes, in text order.
            pub fn attr_names(self) -> &'static [&'static str] {
                match self { $(OpKind::$variant => &[$($(stringify!($field)),*)?]),* }
            }

            /// The one-line description from the declaration.
            pub fn doc(self) -> &'static str {
                match self { $(OpKind::$variant => concat!($($doc),*).trim_ascii()),* }
            }
        }

        impl Op {
            /// The kind of this op.
            pub fn kind(&self) -> OpKind {
                match self { $(Op::$variant { .. } => OpKind::$variant),* }
            }

            /// The attributes as (name, text tree) pairs, in declaration order; an attribute
            /// with a default ([`attr_default`]) is left out when it has that value.
            pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
                let all: Vec<(&'static str, Attr)> = match self {
                    $(Op::$variant { $($($field),*)? } => vec![$($((stringify!($field), $field.to_attr())),*)?],)*
                };
                all.into_iter()
                    .filter(|(name, a)| attr_default(name).as_ref() != Some(a))
                    .collect()
            }

            /// Builds an op of `kind` from named attribute trees; every attribute must be
            /// present exactly once (or left out, where it has a default) and no other may be.
            pub fn from_attrs(kind: OpKind, attrs: &[(String, Attr)], ctx: &AttrCtx) -> Result<Op, String> {
                for (name, _) in attrs {
                    if !kind.attr_names().contains(&name.as_str()) {
                        return Err(format!("`{}` has no attribute {} (it has: {})", kind.mnemonic(), crate::error::quote(name),
                            if kind.attr_names().is_empty() { "none".to_string() } else { kind.attr_names().join(", ") }));
                    }
                    if attrs.iter().filter(|(n, _)| n == name).count() > 1 {
                        return Err(format!("attribute {} is given twice", crate::error::quote(name)));
                    }
                }
                #[allow(unused)]
                let get = |name: &str| -> Result<std::borrow::Cow<'_, Attr>, String> {
                    attrs.iter().find(|(n, _)| n == name).map(|(_, a)| std::borrow::Cow::Borrowed(a))
                        .or_else(|| attr_default(name).map(std::borrow::Cow::Owned))
                        .ok_or_else(|| format!("`{}` needs the attribute `{name}`", kind.mnemonic()))
                };
                Ok(match kind {
                    $(OpKind::$variant => Op::$variant { $($(
                        $field: <$fty as AttrValue>::from_attr(&*get(stringify!($field))?, ctx)
                            .map_err(|e| format!("attribute `{}`: {e}", stringify!($field)))?,
                    )*)? },)*
                })
            }
        }
    };
}

/// The value an attribute has when the text leaves it out, for the attributes that have one:
/// StableHLO's batching dimensions of `gather` and `scatter` (none), `convolution`'s
/// `batch_group_count` (1) and `collective_broadcast`'s `has_dynamic_root` (false). The
/// printer leaves such an attribute out when it has this value.
pub fn attr_default(name: &str) -> Option<Attr> {
    match name {
        "operand_batching_dims"
        | "start_indices_batching_dims"
        | "input_batching_dims"
        | "scatter_indices_batching_dims" => Some(Attr::List(Vec::new())),
        "batch_group_count" => Some(Attr::Token("1".into())),
        "has_dynamic_root" => Some(Attr::Token("false".into())),
        _ => None,
    }
}

use Arity::{AtLeast, Fixed};
const ONE: ResultCount = ResultCount::Fixed(1);

define_ops! {
    /// Elementwise sum (logical or on `pred`).
    Add = "add", Fixed(2), ONE, EW | COMM | ASSOC | DIFF;
    /// Elementwise difference.
    Subtract = "subtract", Fixed(2), ONE, EW | DIFF;
    /// Elementwise product (logical and on `pred`).
    Multiply = "multiply", Fixed(2), ONE, EW | COMM | ASSOC | DIFF;
    /// Elementwise quotient (integers: truncating).
    Divide = "divide", Fixed(2), ONE, EW | DIFF;
    /// Elementwise remainder with the sign of the dividend.
    Remainder = "remainder", Fixed(2), ONE, EW | DIFF;
    /// Elementwise maximum (NaN-propagating).
    Maximum = "maximum", Fixed(2), ONE, EW | COMM | ASSOC | DIFF;
    /// Elementwise minimum (NaN-propagating).
    Minimum = "minimum", Fixed(2), ONE, EW | COMM | ASSOC | DIFF;
    /// Elementwise `lhs` raised to the power `rhs`.
    Power = "power", Fixed(2), ONE, EW | DIFF;
    /// Elementwise bitwise or logical and.
    And = "and", Fixed(2), ONE, EW | COMM | ASSOC;
    /// Elementwise bitwise or logical or.
    Or = "or", Fixed(2), ONE, EW | COMM | ASSOC;
    /// Elementwise bitwise or logical exclusive or.
    Xor = "xor", Fixed(2), ONE, EW | COMM | ASSOC;
    /// Elementwise left shift (0 when the shift is out of range).
    ShiftLeft = "shift_left", Fixed(2), ONE, EW;
    /// Elementwise logical right shift (0 when the shift is out of range).
    ShiftRightLogical = "shift_right_logical", Fixed(2), ONE, EW;
    /// Elementwise arithmetic right shift: the top bit fills in (all of it when the shift is
    /// out of range).
    ShiftRightArithmetic = "shift_right_arithmetic", Fixed(2), ONE, EW;
    /// Elementwise arc tangent of `lhs / rhs`, in the quadrant of the point `(rhs, lhs)`.
    Atan2 = "atan2", Fixed(2), ONE, EW | DIFF;
    /// Elementwise negation.
    Negate = "negate", Fixed(1), ONE, EW | DIFF;
    /// Elementwise absolute value.
    Abs = "abs", Fixed(1), ONE, EW | DIFF;
    /// Elementwise sign: -1, 0 or 1 (NaN stays NaN, -0 stays -0).
    Sign = "sign", Fixed(1), ONE, EW | DIFF;
    /// Elementwise e^x.
    Exponential = "exponential", Fixed(1), ONE, EW | DIFF;
    /// Elementwise natural logarithm.
    Log = "log", Fixed(1), ONE, EW | DIFF;
    /// Elementwise ln(1 + x), accurate near 0.
    LogPlusOne = "log_plus_one", Fixed(1), ONE, EW | DIFF;
    /// Elementwise e^x - 1, accurate near 0.
    ExponentialMinusOne = "exponential_minus_one", Fixed(1), ONE, EW | DIFF;
    /// Elementwise square root.
    Sqrt = "sqrt", Fixed(1), ONE, EW | DIFF;
    /// Elementwise reciprocal square root.
    Rsqrt = "rsqrt", Fixed(1), ONE, EW | DIFF;
    /// Elementwise hyperbolic tangent.
    Tanh = "tanh", Fixed(1), ONE, EW | DIFF;
    /// Elementwise logistic sigmoid 1 / (1 + e^-x).
    Logistic = "logistic", Fixed(1), ONE, EW | DIFF;
    /// Elementwise sine.
    Sine = "sine", Fixed(1), ONE, EW | DIFF;
    /// Elementwise cosine.
    Cosine = "cosine", Fixed(1), ONE, EW | DIFF;
    /// Elementwise tangent.
    Tan = "tan", Fixed(1), ONE, EW | DIFF;
    /// Elementwise cube root.
    Cbrt = "cbrt", Fixed(1), ONE, EW | DIFF;
    /// Elementwise Gauss error function.
    Erf = "erf", Fixed(1), ONE, EW | DIFF;
    /// Elementwise round toward negative infinity.
    Floor = "floor", Fixed(1), ONE, EW | DIFF;
    /// Elementwise round toward positive infinity.
    Ceil = "ceil", Fixed(1), ONE, EW | DIFF;
    /// Elementwise round to nearest, ties away from zero.
    RoundNearestAfz = "round_nearest_afz", Fixed(1), ONE, EW | DIFF;
    /// Elementwise round to nearest, ties to even.
    RoundNearestEven = "round_nearest_even", Fixed(1), ONE, EW | DIFF;
    /// Elementwise rounding to a float format of `exponent_bits` and `mantissa_bits` (results
    /// past its range become infinite, below its normal range zero), kept in the operand's type.
    ReducePrecision = "reduce_precision", Fixed(1), ONE, EW | DIFF, { exponent_bits: i64, mantissa_bits: i64 };
    /// Elementwise count of set bits.
    Popcnt = "popcnt", Fixed(1), ONE, EW;
    /// Elementwise count of zero bits above the highest set bit.
    CountLeadingZeros = "count_leading_zeros", Fixed(1), ONE, EW;
    /// Elementwise bitwise or logical not.
    Not = "not", Fixed(1), ONE, EW;
    /// Elementwise real part of a complex number (a float's own value), of the part type.
    Real = "real", Fixed(1), ONE, EW;
    /// Elementwise imaginary part of a complex number (0 for a float), of the part type.
    Imag = "imag", Fixed(1), ONE, EW;
    /// Elementwise complex number `lhs + i rhs` from its real and imaginary parts.
    Complex = "complex", Fixed(2), ONE, EW;
    /// Elementwise test for a finite value (neither infinite nor NaN).
    IsFinite = "is_finite", Fixed(1), ONE, EW;
    /// Elementwise comparison producing `pred`.
    Compare = "compare", Fixed(2), ONE, EW, { comparison_direction: ComparisonDirection };
    /// Elementwise choice: `on_true` where `pred` holds, else `on_false`.
    Select = "select", Fixed(3), ONE, EW | DIFF;
    /// Elementwise `min(max(operand, min), max)`; operands are (min, operand, max).
    Clamp = "clamp", Fixed(3), ONE, EW | DIFF;
    /// Elementwise conversion to the result's element type.
    Convert = "convert", Fixed(1), ONE, EW | DIFF;
    /// Reinterprets the bits of each element as the result's element type.
    BitcastConvert = "bitcast_convert", Fixed(1), ONE, NONE;
    /// A tensor given by value.
    Constant = "constant", Fixed(0), ONE, NONE, { value: Literal };
    /// The index along `iota_dimension`, at every position of the result.
    Iota = "iota", Fixed(0), ONE, NONE, { iota_dimension: i64 };
    /// Replicates the operand into the result shape; operand dim i maps to result dim
    /// `broadcast_dimensions[i]`.
    BroadcastInDim = "broadcast_in_dim", Fixed(1), ONE, LAYOUT | DIFF, { broadcast_dimensions: Vec<i64> };
    /// The same elements, row-major, in the result shape.
    Reshape = "reshape", Fixed(1), ONE, LAYOUT | DIFF;
    /// Permutes dimensions: result dim i is operand dim `permutation[i]`.
    Transpose = "transpose", Fixed(1), ONE, LAYOUT | DIFF, { permutation: Vec<i64> };
    /// A strided window of the operand.
    Slice = "slice", Fixed(1), ONE, LAYOUT | DIFF, { start_indices: Vec<i64>, limit_indices: Vec<i64>, strides: Vec<i64> };
    /// A window of size `slice_sizes` at run-time start indices (clamped into bounds).
    DynamicSlice = "dynamic_slice", AtLeast(1), ONE, DIFF, { slice_sizes: Vec<i64> };
    /// The operand with a window replaced by `update` at run-time start indices (clamped).
    DynamicUpdateSlice = "dynamic_update_slice", AtLeast(2), ONE, DIFF;
    /// Pads with `padding_value` at the edges (negative edges crop) and between elements.
    Pad = "pad", Fixed(2), ONE, LAYOUT | DIFF, { edge_padding_low: Vec<i64>, edge_padding_high: Vec<i64>, interior_padding: Vec<i64> };
    /// Joins operands along `dimension`.
    Concatenate = "concatenate", AtLeast(1), ONE, LAYOUT | DIFF, { dimension: i64 };
    /// Reverses the order of elements along `dimensions`.
    Reverse = "reverse", Fixed(1), ONE, LAYOUT | DIFF, { dimensions: Vec<i64> };
    /// Reduces `dimensions` of the operand with `kind`, starting from `init_value`.
    Reduce = "reduce", Fixed(2), ONE, RED | DIFF, { dimensions: Vec<i64>, kind: Combiner };
    /// Reduces `dimensions` of k inputs together with the `body` region, starting from k init
    /// values (operands `inputs..., init_values...`): the body takes `acc0..acc(k-1),
    /// x0..x(k-1)` scalars and returns the k next accumulators (an argmax reduces values and
    /// indices together).
    ReduceRegion = "reduce_region", AtLeast(2), ResultCount::HalfOperands, RED | CONTROL | DIFF, { dimensions: Vec<i64>, body: Box<Func> };
    /// Generalized matrix product with batch and contracting dimensions.
    DotGeneral = "dot_general", Fixed(2), ONE, DIFF, {
        lhs_batching_dimensions: Vec<i64>, rhs_batching_dimensions: Vec<i64>,
        lhs_contracting_dimensions: Vec<i64>, rhs_contracting_dimensions: Vec<i64>,
    };
    /// N-dimensional convolution (cross-correlation) with strides, padding, dilations and
    /// feature or batch groups. `input_dims` = [batch, feature, spatial...], `kernel_dims` =
    /// [output feature, input feature, spatial...], `output_dims` = [batch, feature, spatial...].
    Convolution = "convolution", Fixed(2), ONE, DIFF, {
        window_strides: Vec<i64>, padding: Vec<(i64, i64)>, lhs_dilation: Vec<i64>, rhs_dilation: Vec<i64>,
        feature_group_count: i64, input_dims: Vec<i64>, kernel_dims: Vec<i64>, output_dims: Vec<i64>,
        batch_group_count: i64,
    };
    /// Gathers slices of the operand at positions read from `start_indices`; the operand's
    /// `operand_batching_dims` are indexed by the batch position along the indices'
    /// `start_indices_batching_dims`.
    Gather = "gather", Fixed(2), ONE, DIFF, {
        offset_dims: Vec<i64>, collapsed_slice_dims: Vec<i64>, start_index_map: Vec<i64>,
        index_vector_dim: i64, slice_sizes: Vec<i64>,
        operand_batching_dims: Vec<i64>, start_indices_batching_dims: Vec<i64>,
    };
    /// Writes `updates` into the operand at positions read from `scatter_indices`, replacing
    /// or combining with `kind`; out-of-bounds elements are skipped.
    /// The operand's `input_batching_dims` are indexed by the update's position along the
    /// indices' `scatter_indices_batching_dims`.
    Scatter = "scatter", Fixed(3), ONE, DIFF, {
        update_window_dims: Vec<i64>, inserted_window_dims: Vec<i64>, scatter_dims_to_operand_dims: Vec<i64>,
        index_vector_dim: i64, kind: Combiner,
        input_batching_dims: Vec<i64>, scatter_indices_batching_dims: Vec<i64>,
    };
    /// Reduces sliding windows of the operand with `kind`, starting from `init_value`.
    ReduceWindow = "reduce_window", Fixed(2), ONE, RED | DIFF, {
        window_dimensions: Vec<i64>, window_strides: Vec<i64>, base_dilations: Vec<i64>,
        window_dilations: Vec<i64>, padding: Vec<(i64, i64)>, kind: Combiner,
    };
    /// Reduces sliding windows of k inputs together with the `body` region (`reduce_window`
    /// with any body; operands `inputs..., init_values...`): the body takes `acc0..acc(k-1),
    /// x0..x(k-1)` scalars and returns the next accumulators; padding and dilation holes hold
    /// the init values.
    ReduceWindowRegion = "reduce_window_region", AtLeast(2), ResultCount::HalfOperands, RED | CONTROL | DIFF, {
        window_dimensions: Vec<i64>, window_strides: Vec<i64>, base_dilations: Vec<i64>,
        window_dilations: Vec<i64>, padding: Vec<(i64, i64)>, body: Box<Func>,
    };
    /// For each window, picks one element with `select` and combines the matching `source`
    /// value into it with `kind` (the gradient of max pooling).
    SelectAndScatter = "select_and_scatter", Fixed(3), ONE, DIFF, {
        window_dimensions: Vec<i64>, window_strides: Vec<i64>, padding: Vec<(i64, i64)>,
        select: ComparisonDirection, kind: Combiner,
    };
    /// Pseudo-random bits from a counter-based generator; returns the next state and the bits.
    RngBitGenerator = "rng_bit_generator", Fixed(1), ResultCount::Fixed(2), NONE, { algorithm: RngAlgorithm };
    /// Returns its operands unchanged; a fence that rewrites do not move values across.
    OptimizationBarrier = "optimization_barrier", AtLeast(0), ResultCount::PerOperand, BARRIER | DIFF;
    /// Runs `body` on the carries (the operands at first) as long as `cond` returns true on
    /// them; the results are the last carries. Both regions take the carries; `cond` returns
    /// a `pred[]`, `body` the next carries.
    While = "while", AtLeast(1), ResultCount::PerOperand, CONTROL, { cond: Box<Func>, body: Box<Func> };
    /// Runs the branch the first operand (an `i32[]`) picks, the last one when it is out of
    /// range, on the other operands; the results are what that branch returns.
    Case = "case", AtLeast(1), ResultCount::Regions, CONTROL | DIFF, { branches: Vec<Func> };
    /// Runs the function `callee` of the module on the operands; the results are what it
    /// returns. The call graph of a module is acyclic: no function calls itself, directly or
    /// through others.
    Call = "call", AtLeast(0), ResultCount::Regions, CONTROL | DIFF, { callee: Callee };
    /// Sorts the operands together along `dimension`: each 1-D slice is put in the order
    /// `comparator` defines on the operands' elements (it takes `lhs0, rhs0, lhs1, rhs1, ...`
    /// scalars and returns `pred[]`: whether lhs goes before rhs); equal elements keep their
    /// order when `is_stable`.
    Sort = "sort", AtLeast(1), ResultCount::PerOperand, CONTROL | DIFF, { dimension: i64, is_stable: bool, comparator: Box<Func> };
    /// Applies the scalar function `computation` at every position of the operands (one
    /// shape): result element = `computation(operand0[i], operand1[i], ...)`; `dimensions` are
    /// all of the operands' dimensions.
    Map = "map", AtLeast(1), ONE, CONTROL | DIFF, { dimensions: Vec<i64>, computation: Box<Func> };
    /// The Cholesky factor of each symmetric positive definite matrix (the last two dimensions;
    /// the leading ones are a batch): `l` with `l lᵀ = a` and `l` lower triangular, or `u` with
    /// `uᵀ u = a` and `u` upper triangular when not `lower`. Only that triangle of `a` is read;
    /// the other triangle of the result is zero; a matrix that is not positive definite gives
    /// NaN in every element of its result.
    Cholesky = "cholesky", Fixed(1), ONE, DIFF, { lower: bool };
    /// Solves `op(a) x = b` (`left_side`) or `x op(a) = b` for `x`, each triangular matrix of
    /// `a` (its `lower` or upper triangle; a diagonal of ones when `unit_diagonal`) with the
    /// matrix of `b` at the same batch position; `op` is given by `transpose_a`.
    TriangularSolve = "triangular_solve", Fixed(2), ONE, DIFF, { left_side: bool, lower: bool, unit_diagonal: bool, transpose_a: TransposeA };
    /// The discrete Fourier transform of `fft_type` over the trailing `fft_length` dimensions
    /// (one to three), one dimension after another: complex to complex (`FFT`, `IFFT`, the
    /// inverse scaled by `1/n`), real to the `n/2 + 1` leading elements of the spectrum
    /// (`RFFT`), or such a half spectrum back to real (`IRFFT`).
    Fft = "fft", Fixed(1), ONE, NONE, { fft_type: FftType, fft_length: Vec<i64> };
    /// The LU factorization with partial pivoting of each square matrix (a kiln extension, as
    /// XLA's `LuDecomposition`; not StableHLO): the factors packed in one matrix (`l`'s
    /// unit-diagonal strict lower triangle and `u`), the `i32` row each step swapped with, and
    /// the `i32` row permutation `p` with `a[p] = l u`.
    Lu = "lu", Fixed(1), ResultCount::Fixed(3), DIFF;
    /// The process running the program: its replica index in the grid, as `ui32[]`.
    ReplicaId = "replica_id", Fixed(0), ONE, BARRIER;
    /// The process running the program: its partition index in the grid, as `ui32[]`.
    PartitionId = "partition_id", Fixed(0), ONE, BARRIER;
    /// Within each process group, every process's operands concatenated along
    /// `all_gather_dim` in group order (groups from `replica_groups`, `channel_id` and
    /// `use_global_device_ids`, see `ir-specs/ops/all_gather.md`).
    AllGather = "all_gather", AtLeast(1), ResultCount::PerOperand, BARRIER | DIFF, { all_gather_dim: i64, replica_groups: Vec<Vec<i64>>, channel_id: i64, use_global_device_ids: bool };
    /// Within each process group, the elementwise reduction of every process's operands with
    /// the scalar `computation`, folded in group order.
    AllReduce = "all_reduce", AtLeast(1), ResultCount::PerOperand, BARRIER | CONTROL | DIFF, { replica_groups: Vec<Vec<i64>>, channel_id: i64, use_global_device_ids: bool, computation: Box<Func> };
    /// Within each process group, each operand split into `split_count` parts along
    /// `split_dimension`, part i sent to the group's i-th process, and the received parts
    /// concatenated along `concat_dimension` in group order.
    AllToAll = "all_to_all", AtLeast(1), ResultCount::PerOperand, BARRIER | DIFF, { split_dimension: i64, concat_dimension: i64, split_count: i64, replica_groups: Vec<Vec<i64>>, channel_id: i64 };
    /// Within each process group, the `all_reduce` of the operand split along
    /// `scatter_dimension` into one part per process: the group's i-th process gets part i.
    ReduceScatter = "reduce_scatter", Fixed(1), ONE, BARRIER | CONTROL | DIFF, { scatter_dimension: i64, replica_groups: Vec<Vec<i64>>, channel_id: i64, use_global_device_ids: bool, computation: Box<Func> };
    /// Each `[source, target]` pair sends the source process's operand to the target process
    /// (replica indices, or partition indices when `channel_id > 0`); a process no pair targets
    /// gets zeros.
    CollectivePermute = "collective_permute", Fixed(1), ONE, BARRIER | DIFF, { source_target_pairs: Vec<(i64, i64)>, channel_id: i64 };
    /// Within each process group, the operands of the group's first process (with
    /// `has_dynamic_root`, of the process at the group position the last operand, an `i32`
    /// vector, gives for each result), on every process of the group; a process in no group
    /// gets zeros.
    CollectiveBroadcast = "collective_broadcast", AtLeast(1), ResultCount::PerOperand, BARRIER | DIFF, { replica_groups: Vec<Vec<i64>>, channel_id: i64, has_dynamic_root: bool };
    /// Within each process group, the `all_reduce` of the operands on the group's first
    /// process, zeros on the others and on a process in no group.
    CollectiveReduce = "collective_reduce", AtLeast(1), ResultCount::PerOperand, BARRIER | CONTROL | DIFF, { replica_groups: Vec<Vec<i64>>, channel_id: i64, computation: Box<Func> };
}

impl Op {
    /// The text mnemonic of this op.
    pub fn mnemonic(&self) -> &'static str {
        self.kind().mnemonic()
    }

    /// The properties of this op.
    pub fn props(&self) -> Props {
        self.kind().props()
    }

    /// How many results the op produces with `n` operands (a `case`: as many as its first
    /// branch returns, none without branches).
    pub fn result_count(&self, n: usize) -> usize {
        match self {
            Op::Case { branches } => branches.first().map_or(0, |b| b.output_types.len()),
            Op::Call { callee } => callee.func.as_ref().map_or(0, |g| g.output_types.len()),
            Op::CollectiveBroadcast {
                has_dynamic_root: true,
                ..
            } => n.saturating_sub(1),
            _ => self.kind().results().for_operands(n).unwrap_or(0),
        }
    }

    /// The op's regions, the functions it runs: a `while`'s condition and body, a `case`'s
    /// branches, a `sort`'s comparator, a `reduce_region`'s or `reduce_window_region`'s body, a
    /// `map`'s computation, a collective reduction's computation, a `call`'s callee (once
    /// resolved); empty for every other op.
    pub fn regions(&self) -> Vec<&Func> {
        match self {
            Op::Call { callee } => callee.func.as_deref().into_iter().collect(),
            Op::While { cond, body } => vec![cond.as_ref(), body.as_ref()],
            Op::Case { branches } => branches.iter().collect(),
            Op::Sort { comparator, .. } => vec![comparator.as_ref()],
            Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } => {
                vec![body.as_ref()]
            }
            Op::Map { computation, .. }
            | Op::AllReduce { computation, .. }
            | Op::ReduceScatter { computation, .. }
            | Op::CollectiveReduce { computation, .. } => vec![computation.as_ref()],
            _ => Vec::new(),
        }
    }
}

impl Op {
    /// [`Op::regions`], mutable, in the same order.
    pub fn regions_mut(&mut self) -> Vec<&mut Func> {
        match self {
            Op::Call { callee } => callee.func.as_deref_mut().into_iter().collect(),
            Op::While { cond, body } => vec![cond.as_mut(), body.as_mut()],
            Op::Case { branches } => branches.iter_mut().collect(),
            Op::Sort { comparator, .. } => vec![comparator.as_mut()],
            Op::ReduceRegion { body, .. } | Op::ReduceWindowRegion { body, .. } => {
                vec![body.as_mut()]
            }
            Op::Map { computation, .. }
            | Op::AllReduce { computation, .. }
            | Op::ReduceScatter { computation, .. }
            | Op::CollectiveReduce { computation, .. } => vec![computation.as_mut()],
            _ => Vec::new(),
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.mnemonic())
    }
}

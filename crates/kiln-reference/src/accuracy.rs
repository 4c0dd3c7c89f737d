//! One comparison of a backend's results with the reference's, for every test: per element, in
//! units in the last place of the result dtype, with a bound derived from the ops that produced
//! each output.
//!
//! # The bound
//!
//! For an output `o` of a function, let the *cone* be the instructions `o` depends on. Each op has
//! a bound in ulps for one application in a dtype ([`op_ulps`]): 0 for ops the CPU backend
//! computes exactly as the reference rounds (once, to nearest even: `add`, `multiply`, `divide`,
//! `sqrt`, `compare`, `select`, `convert`, data movement, ...; f16 and bf16 are computed in f32
//! and rounded on every store and between fused ops, and f32 in f32, which rounds like the
//! reference's exact f64 value by the double-rounding theorem, 24 >= 2 * 11 + 2 and
//! 53 >= 2 * 24 + 2), a stated bound for the polynomial and C-library transcendentals, and for
//! float sums (`reduce`, `dot_general`, `convolution`, `reduce_window`, `scatter` with add) the
//! summation-tree bound of `ir-specs/ops/reduce.md`, `K(n, r) = 256 + 16 ⌈log16(n / 256)⌉ + 16 r`
//! times `ε · Σ|terms|`.
//!
//! Element `i` of `o` passes when, with `e` the reference's value and `a` the backend's,
//!
//! `|a - e| <= U · ulp(e) + (2 U + K) · ε · M[i] + (U + K) · η`
//!
//! where `U` is the sum over the cone's instructions of their ulp bounds (first-order error
//! propagation: errors of a chain add when each op's condition number is about 1), `K` the
//! largest summation bound in the cone, `ε` the largest unit roundoff of a float dtype in the
//! cone, and `M` the *magnitude* of the element: the program evaluated by the reference with
//! every float value replaced by an upper bound of the absolute values it is computed from
//! (`subtract` adds magnitudes, `negate` keeps them, sums add |terms|, products multiply them;
//! quotients, exponentials, logarithms and roots carry an inexact operand's magnitude through
//! their derivative, first order: `exp x` has `exp x · M_x`, `ln x` has `M_x / |x|`; see
//! [`magnitudes`]; at `-inf`, where the exponential and its derivative are 0, it carries
//! nothing, unless that `-inf` is a sum's that may be NaN in a backend, below). A maximum or
//! minimum (`maximum`, `minimum`, `clamp`, and `reduce`, `reduce_window` and `scatter` of that
//! kind) is one of its operands: it takes the largest of
//! their magnitudes, where an operand at an infinity counts 0, since it is the result only
//! where the result is that infinity (so a mask's `-inf` before a row's maximum, or a clamp's
//! infinite bound, bounds nothing it does not select), unless it is a sum's whose finite terms
//! pass the accumulator's range (a backend may hold NaN there: its magnitude is `NAN_RISK`,
//! `accuracy/infinities.rs`). So for a sum, `M` is exactly `Σ|terms|` (but `NAN_RISK`), and a
//! cancellation after inexact ops (`exp(x) - exp(y)` with nearly equal values) is measured
//! against the size of what cancelled, not the tiny result. `η` is the smallest subnormal of
//! the result's dtype: a rounding in the subnormal range errs by up to half of it whatever the
//! value's size (underflow), which the relative terms do not cover; it matters only for
//! results near the subnormal range.
//! A transcendental of exact operands has its result's size as magnitude: its own ulps
//! bound it, whatever the argument's size. `tanh` and `logistic` of an inexact operand carry
//! its magnitude through their derivative at the point (`1 - tanh²`, `σ (1 - σ)`), so that a
//! recurrence through them keeps its carry's size. `2 U` covers the first-order growth through the
//! transcendentals (whose condition numbers on
//! the generator's ranges are a few units), except `power`'s, which grow without bound (`|y|`
//! for the base, `|y ln x|` for the exponent): a power's magnitude carries them for its inexact
//! operands (see `power_magnitude`). A cone of exact ops has `U = K = 0`: the element must be
//! bit for bit the reference's.
//!
//! Complex numbers are bounded norm-wise: a complex value's magnitude bounds its modulus (sums
//! and products of moduli; the functions with poles, or that grow off the real axis, carry
//! their operand's magnitude through a bound of their derivative), `ulp` and `ε` are the part
//! type's at the reference's modulus, and each part of the backend's result must lie within the
//! bound of the reference's part. The ops that the backends compute on parts in more steps
//! than the reference's one rounding have ulp bounds of their own (`complex_op_ulps`).
//!
//! A `case` runs one branch once: its results take the largest of its branches' bounds, and
//! their magnitudes come from the branch taken, run on the operands' values and magnitudes; a
//! `call` likewise runs its callee once. A `while` is its body unrolled: after `T` trips (the
//! most any run of it took on the checked arguments) a path through it meets at most `T` times
//! the rounding ops of one trip, so it adds `T` times its body's largest `U` (with the body's
//! `K` and `ε`), and its magnitudes come from its body run trip by trip on the carries' values
//! and magnitudes. That holds while the backend takes the same trips: the condition must be
//! exact and read only carries that stay exact (exact on entry, and each trip computing them
//! exactly from exact carries); otherwise a float result of a loop whose body rounds is
//! checked by class only, as are the results of the other ops with rounding regions
//! (`reduce` and `reduce_window` with any body, `scatter` with a body, `sort` with a rounding
//! comparator). A `map` runs its computation once per element: its results take the
//! computation's bound, their magnitudes the computation run on each element's operands' values
//! and magnitudes. A `sort` moves elements: its results keep their operands' magnitudes, in the
//! sorted order.
//!
//! An element whose sum has terms past the accumulator's range (`M` above f32's largest value
//! for f16, bf16 and f32 results, or `NAN_RISK`) is not compared: the backend's partial sums
//! may overflow to an infinity, or meet both infinities (NaN), where the reference's f64 sum
//! stays finite.
//!
//! Whatever the bound, NaN must meet NaN, an infinity the same infinity (a finite result never
//! passes for an infinite reference, nor the opposite sign), and a finite reference a finite
//! result. Zeros of either sign are equal: a zero's sign shows only through a later op (`1 / -0`
//! is `-inf`), where the infinity's sign is checked. Integers and `pred` are compared exactly.
//!
//! A `select_and_scatter` over an inexact operand may select another element of a window
//! than the reference (two within their error of each other), so its results are checked by
//! class only. The bits of a float or of a complex number (`bitcast_convert` to an integer
//! type, or to another float type of its width: a `c64` to an `i64`) that are only moved are
//! compared as that float or number: under its bound when
//! inexact, bit for bit when exact except that a NaN matches any NaN (no op defines a NaN's
//! sign or payload: the reference's are canonical, a backend may pass an operand's on).
//! Bitcast to an integer type and straight back to the same float type (an identity that
//! traced programs contain), they are that float, under its bound and with its magnitude.
//! Computed on as integers (added, shifted, scattered), the bits of an inexact float have no
//! bound: such outputs are checked by type only (integers) or by class (floats); so are the
//! bits of any float computed on as another float type. Not covered: other discontinuous ops
//! after inexact ones (`floor`, `compare`, a conversion to an integer) can legitimately flip
//! their result when it lies within its error of a step; such a flip fails the comparison and
//! has to be looked at by hand.

mod infinities;
mod loops;

use infinities::{NAN_RISK, at_finite, is_sum, mark_nan_risk};

use crate::ops::eval_op;
use kiln_ir::{Combiner, DType, Func, Literal, Op, OpKind, TensorType};
pub use loops::Trips;
use loops::loop_bound;

/// The largest finite value of the type a backend accumulates dtype `d`'s sums in.
fn accumulator_max(d: DType) -> f64 {
    // `f8e8m0fnu` is held in f64 (`kiln_kernel::minifloat`).
    if d.part() == DType::F64 || d == DType::F8E8M0FNU {
        f64::MAX
    } else {
        f32::MAX as f64
    }
}

/// Unit roundoff (half the spacing of 1) of a float dtype, or of a complex dtype's parts; 0 for
/// the others.
pub fn unit_roundoff(d: DType) -> f64 {
    match d.part() {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        DType::F64 => 2f64.powi(-53),
        DType::Mini(m) => 2f64.powi(-(m.layout().1 as i32) - 1),
        _ => 0.0,
    }
}

/// The spacing of `d`'s floats (a complex dtype's parts') at `x` (the gap above |x|; the smallest
/// subnormal at 0).
pub fn ulp(d: DType, x: f64) -> f64 {
    let (p, emin) = match d.part() {
        DType::F16 => (11, -14),
        DType::BF16 => (8, -126),
        DType::F32 => (24, -126),
        DType::Mini(m) => {
            let (_, mant, bias) = m.layout();
            (mant as i32 + 1, 1 - bias)
        }
        _ => (53, -1022),
    };
    let e = if x == 0.0 || !x.is_finite() {
        emin
    } else {
        (x.abs().log2().floor() as i32).max(emin)
    };
    // log2 may round up just below a power of two; the spacing is then one binade too large,
    // which only matters by a factor of two, in the lenient direction, at that single point.
    pow2(e - (p - 1))
}

/// 2^k for `k` in f64's range down to its smallest subnormal (-1074 to 1023), from its bits:
/// `2f64.powi(k)` takes the reciprocal of 2^-k for a negative `k`, which overflows past 2^1023,
/// so f64's spacing below 2^-971 came out 0 (every subnormal difference was then infinitely
/// many ulps: random program 28307, `erf` of a subnormal within half an ulp).
fn pow2(k: i32) -> f64 {
    debug_assert!((-1074..=1023).contains(&k), "2^{k} is not an f64");
    if k >= -1022 {
        f64::from_bits(((k + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (k + 1074))
    }
}

/// The error bound in ulps of one application of `op` with a result of dtype `d` (float), when
/// its operands are exact. Sums are bounded separately (`sum_terms`).
pub fn op_ulps(op: OpKind, d: DType) -> f64 {
    use OpKind::*;
    if d.is_complex() {
        return complex_op_ulps(op);
    }
    let narrow = matches!(d, DType::F16 | DType::BF16 | DType::Mini(_));
    match op {
        // Polynomials within 2-4 ulps of the correctly rounded value (`common/math.rs` and,
        // on the GPU, `common/libm.rs` and `trig.rs` of kiln-codegen-llvm, tested over hundreds
        // of thousands of points); C library calls within 1-2; f16/bf16 compute these in f32, so
        // their one rounding may land on the other neighbour.
        Exponential | Log | Tanh | Logistic | Erf | LogPlusOne | ExponentialMinusOne | Sine
        | Cosine | Power | Tan | Atan2 | Cbrt => {
            if narrow {
                1.0
            } else {
                4.0
            }
        }
        // 1 / sqrt(x): two roundings.
        Rsqrt => {
            if narrow {
                1.0
            } else {
                2.0
            }
        }
        // Rounding once at the end of a float sum (the sum's own error is `sum_terms`).
        Reduce | DotGeneral | Convolution | ReduceWindow | Scatter | SelectAndScatter => 1.0,
        // Rounding once at the end; the factorization's or the substitution's own error is
        // `sum_terms` times their magnitudes (`crate::linalg`).
        Cholesky | TriangularSolve | Lu => 1.0,
        // Rounding once at the end of each stage of a transform (the sums' own error is
        // `sum_terms`, the twiddles' rounding one more ε per term).
        Fft => 1.0,
        _ => 0.0,
    }
}

/// [`op_ulps`] for a complex result, in ulps of the part type at the result's modulus: the
/// compiled backends compute complex numbers on their parts (a `c64` in f32 steps) where the
/// reference computes each result in f64 and rounds it once.
fn complex_op_ulps(op: OpKind) -> f64 {
    use OpKind::*;
    match op {
        // (ac - bd) + i(ad + bc): two products and a sum per part, each within |z1||z2| by
        // Cauchy-Schwarz.
        Multiply => 2.0,
        // Smith's division: a ratio, a product, a sum and a quotient per part.
        Divide => 6.0,
        // z / |z|: the modulus, then a division per part.
        Sign => 3.0,
        // Formulas over the parts' real functions (`complex_math.rs` of kiln-kernel), each
        // within 4 ulps, combined by a few products and sums.
        Exponential | Log | Tanh | Logistic | LogPlusOne | ExponentialMinusOne | Sine | Cosine
        | Power | Tan | Atan2 | Cbrt | Sqrt | Rsqrt => 16.0,
        Reduce | DotGeneral | Convolution | ReduceWindow | Scatter | SelectAndScatter => 2.0,
        Cholesky | TriangularSolve | Lu | Fft => 2.0,
        _ => 0.0,
    }
}

/// For a float sum-like instruction: its summation-tree factor `K(n, r)` (see the module
/// documentation), 0 when the instruction sums nothing.
fn sum_terms(f: &Func, inst: &kiln_ir::Inst) -> f64 {
    let ty = |i: usize| &f.values[inst.operands[i].index()];
    let k = |n: usize, r: usize| {
        let levels = if n > 256 {
            ((n as f64 / 256.0).ln() / 16f64.ln()).ceil()
        } else {
            0.0
        };
        256.0 + 16.0 * levels + 16.0 * r as f64
    };
    match &inst.op {
        Op::Reduce { dimensions, kind } if *kind == Combiner::Add || *kind == Combiner::Mul => {
            let n = dimensions
                .iter()
                .map(|&d| ty(0).shape[d as usize])
                .product();
            k(n, dimensions.len())
        }
        Op::DotGeneral {
            lhs_contracting_dimensions,
            ..
        } => {
            let n = lhs_contracting_dimensions
                .iter()
                .map(|&d| ty(0).shape[d as usize])
                .product();
            k(n, lhs_contracting_dimensions.len())
        }
        Op::Convolution { .. } => {
            let kt = ty(1);
            k(
                kt.numel() / kt.shape.first().copied().unwrap_or(1).max(1),
                3,
            )
        }
        Op::ReduceWindow {
            window_dimensions,
            kind,
            ..
        } if *kind == Combiner::Add || *kind == Combiner::Mul => k(
            window_dimensions.iter().map(|&w| w as usize).product(),
            window_dimensions.len(),
        ),
        // The sums of n terms of each element of a factor or a solution, whose errors the
        // magnitudes carry through (`crate::linalg`).
        Op::Cholesky { .. } | Op::TriangularSolve { .. } | Op::Lu {} => {
            let t = ty(0);
            k(t.shape[t.rank() - 1], 1)
        }
        // Every element of a transform sums the products of all the elements of its line with
        // twiddles, stage after stage (`crate::fft`).
        Op::Fft { fft_length, .. } => k(
            fft_length.iter().map(|&n| n as usize).product(),
            2 * fft_length.len(),
        ),
        Op::Scatter { kind, .. } | Op::SelectAndScatter { kind, .. } if *kind == Combiner::Add => {
            k(f.values[inst.results[0].index()].numel().max(1), 1)
        }
        _ => 0.0,
    }
}

/// The bound of one output: see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bound {
    /// `U`: ulps of the result, summed over the cone's inexact ops.
    pub ulps: f64,
    /// `K`: the largest summation factor in the cone.
    pub sum: f64,
    /// `ε`: the largest unit roundoff among the cone's float values.
    pub eps: f64,
}

impl Bound {
    /// True when the output must match the reference bit for bit.
    pub fn exact(&self) -> bool {
        self.ulps == 0.0 && self.sum == 0.0
    }
}

/// The bound of each output of `f`, from the instructions in its cone, without trip counts:
/// a loop whose body rounds bounds nothing (see [`output_bounds_after`]).
pub fn output_bounds(f: &Func) -> Vec<Bound> {
    output_bounds_with(f, None)
}

/// The bound of each output of `f` after an evaluation that took `trips` (see
/// [`values_magnitudes_and_trips`]): a loop's results bounded by its trips (see the module
/// documentation).
pub fn output_bounds_after(f: &Func, trips: &Trips) -> Vec<Bound> {
    output_bounds_with(f, Some(trips))
}

fn output_bounds_with(f: &Func, trips: Option<&Trips>) -> Vec<Bound> {
    let def = defining_insts(f);
    f.outputs
        .iter()
        .map(|&o| cone_bound(f, &def, o, trips))
        .collect()
}

/// The defining instruction of each value of `f` (`usize::MAX` for a parameter).
fn defining_insts(f: &Func) -> Vec<usize> {
    let mut def = vec![usize::MAX; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            def[r.index()] = i;
        }
    }
    def
}

/// The bound of value `v`, from the instructions of its cone (`def`: each value's defining
/// instruction). A `select_and_scatter` whose operand is inexact may select another element
/// than the reference where two are within their error of each other, so its results are
/// unbounded (checked by class only).
fn cone_bound(f: &Func, def: &[usize], o: kiln_ir::ValueId, trips: Option<&Trips>) -> Bound {
    let mut seen = vec![false; f.insts.len()];
    let mut stack = vec![o];
    let mut b = Bound {
        ulps: 0.0,
        sum: 0.0,
        eps: unit_roundoff(f.values[o.index()].dtype),
    };
    while let Some(v) = stack.pop() {
        let i = def[v.index()];
        if i == usize::MAX || seen[i] {
            continue;
        }
        seen[i] = true;
        let inst = &f.insts[i];
        if let Some(y) = bits_round_trip(f, def, inst) {
            stack.push(y);
            continue;
        }
        let Some(first) = inst.results.first() else {
            continue;
        };
        let d = f.values[first.index()].dtype;
        let float_in = inst
            .operands
            .iter()
            .any(|x| rounds(f.values[x.index()].dtype));
        let complex_in = inst
            .operands
            .first()
            .is_some_and(|x| f.values[x.index()].dtype.is_complex());
        if rounds(d) {
            b.ulps += op_ulps(inst.op.kind(), d);
            // |z| = m sqrt(1 + (n / m)²) over the parts: a quotient, a square, a sum, a root
            // and a product.
            if complex_in && !d.is_complex() && matches!(inst.op, Op::Abs {}) {
                b.ulps += 3.0;
            }
            if float_in {
                b.sum = b.sum.max(sum_terms(f, inst));
            }
            if matches!(inst.op, Op::SelectAndScatter { .. })
                && !cone_bound(f, def, inst.operands[0], trips).exact()
            {
                b.ulps = f64::INFINITY;
            }
            // The bits of one float type read as another and computed on: an ulp of error, or
            // a NaN's sign and payload (which no op defines), lands anywhere in the other type.
            // A complex number's parts (the part type, with a last dimension of 2) keep the
            // number's bound, and so do parts assembled into one.
            if let (Op::BitcastConvert {}, Some(x)) = (&inst.op, inst.operands.first()) {
                let from = f.values[x.index()].dtype;
                if rounds(from) && from.part() != d.part() {
                    b.ulps = f64::INFINITY;
                }
            }
        } else if matches!(inst.op, Op::BitcastConvert {})
            && rounds(f.values[inst.operands[0].index()].dtype)
            && !cone_bound(f, def, inst.operands[0], trips).exact()
        {
            // The bits of an inexact float computed on as integers: a float one ulp off is an
            // integer one off, and no bound follows it through integer arithmetic.
            b.ulps = f64::INFINITY;
        }
        // A `case` runs one of its branches once: its results are within the largest of the
        // branches' bounds (their magnitudes computed through the branch taken, see
        // `values_and_magnitudes`).
        // A `call` runs its callee once, as a branch taken: the callee's bounds; a `map` runs
        // its computation once per element.
        let once: Vec<&Func> = match &inst.op {
            Op::Case { branches } => branches.iter().collect(),
            Op::Call { callee } => callee.func.as_deref().into_iter().collect(),
            Op::Map { computation, .. } => vec![computation.as_ref()],
            _ => Vec::new(),
        };
        if !once.is_empty() {
            for g in once {
                for o in output_bounds_with(g, trips) {
                    b.ulps = b.ulps.max(o.ulps);
                    b.sum = b.sum.max(o.sum);
                    b.eps = b.eps.max(o.eps);
                }
            }
        }
        // A region that rounds: a loop whose trips are known adds its body's bound once per
        // trip (`loop_bound`); other regions that round keep no bound (checked by class
        // only); an exact one stays exact. Any float result counts, not only the first (a
        // loop's first carry is often its integer counter).
        let regions: Vec<Vec<Bound>> = if inst
            .results
            .iter()
            .any(|r| rounds(f.values[r.index()].dtype))
            && !matches!(inst.op, Op::Case { .. } | Op::Call { .. } | Op::Map { .. })
        {
            let g = inst.op.regions();
            g.iter().map(|g| output_bounds_with(g, trips)).collect()
        } else {
            Vec::new()
        };
        if regions.iter().any(|g| !g.iter().all(Bound::exact)) {
            let by_trips = match (&inst.op, trips) {
                (Op::While { cond, body }, Some(t)) => loop_bound(
                    f,
                    def,
                    inst,
                    [(&**cond, &regions[0]), (&**body, &regions[1])],
                    t,
                ),
                _ => None,
            };
            match by_trips {
                Some(l) => {
                    b.ulps += l.ulps;
                    b.sum = b.sum.max(l.sum);
                    b.eps = b.eps.max(l.eps);
                }
                None => b.ulps = f64::INFINITY,
            }
        }
        for x in inst.operands.iter().chain(&inst.results) {
            b.eps = b.eps.max(unit_roundoff(f.values[x.index()].dtype));
        }
        stack.extend(inst.operands.iter().copied());
    }
    b
}

/// When `inst` reads back as floats the bits of floats of the same type, only bitcast to an
/// integer type between (`bitcast_convert` to `u32`, then back to `f32`: an identity that
/// traced programs contain), the float value read back; `None` elsewhere. The round trip keeps
/// its operand's bound and magnitude, where integer arithmetic on the bits would lose them.
fn bits_round_trip(f: &Func, def: &[usize], inst: &kiln_ir::Inst) -> Option<kiln_ir::ValueId> {
    let (Op::BitcastConvert {}, [x], [r]) = (&inst.op, &inst.operands[..], &inst.results[..])
    else {
        return None;
    };
    let inner = f.insts.get(def[x.index()])?;
    let (Op::BitcastConvert {}, [y]) = (&inner.op, &inner.operands[..]) else {
        return None;
    };
    let (from, mid, to) = (
        &f.values[y.index()],
        &f.values[x.index()],
        &f.values[r.index()],
    );
    (from == to && rounds(to.dtype) && !rounds(mid.dtype)).then_some(*y)
}

/// Whether values of `d` carry rounding errors: floats and complex numbers.
fn rounds(d: DType) -> bool {
    d.is_float() || d.is_complex()
}

/// The type of a magnitude of a value of type `t`: f64 for floats and complex numbers (a
/// complex magnitude bounds the modulus), `t` for the others.
fn f64_type(t: &TensorType) -> TensorType {
    if rounds(t.dtype) {
        t.with_dtype(DType::F64)
    } else {
        t.clone()
    }
}

/// The elements of `l` as f64: a complex element's modulus, the others' values.
fn moduli(l: &Literal) -> Vec<f64> {
    if l.dtype().is_complex() {
        l.to_complex_f64s()
            .iter()
            .map(|z| z[0].hypot(z[1]))
            .collect()
    } else {
        l.to_f64s()
    }
}

/// `g` of each element of `l` ([`moduli`]), an f64 magnitude.
fn map(l: &Literal, g: impl Fn(f64) -> f64) -> Literal {
    let v: Vec<f64> = moduli(l).into_iter().map(g).collect();
    Literal::from_f64s(f64_type(l.ty()), &v).expect("same size")
}

/// `g` of the elements of `a` and `b` ([`moduli`]), an f64 magnitude of `a`'s shape.
fn zip(a: &Literal, b: &Literal, g: impl Fn(f64, f64) -> f64) -> Literal {
    let v: Vec<f64> = moduli(a)
        .into_iter()
        .zip(moduli(b))
        .map(|(x, y)| g(x, y))
        .collect();
    Literal::from_f64s(f64_type(a.ty()), &v).expect("same size")
}

/// The magnitude of the result `out` of `op` on complex operands (`complex_in`) or with a complex
/// result, where the real rules of [`magnitudes`] do not carry over (`None` elsewhere), from the
/// operands' values `r` and magnitudes `m`. A complex magnitude bounds the modulus; a function
/// `g` whose derivative can exceed its value (poles, or sin and cos off the real axis) carries
/// its operand's magnitude through `|g'|`, the first-order growth of the operand's error.
fn complex_magnitude(
    op: &Op,
    r: &[&Literal],
    m: &[&Literal],
    out: &Literal,
    complex_in: bool,
) -> Option<Literal> {
    if !complex_in && !out.dtype().is_complex() {
        return None;
    }
    let o = moduli(out);
    let each = |g: &dyn Fn(usize) -> f64| {
        let v: Vec<f64> = (0..o.len()).map(g).collect();
        Literal::from_f64s(f64_type(out.ty()), &v).expect("a result's element count")
    };
    let (z, mz) = (r.first().map(|x| moduli(x))?, m[0].to_f64s());
    // `g` of the operand's magnitude `mz` over `|z|`, 0 where the operand is exactly 0.
    let over = |i: usize, den: f64| if mz[i] == 0.0 { 0.0 } else { mz[i] / den };
    let v = match op {
        Op::Complex {} => zip(m[0], m[1], |a, b| a + b),
        Op::Real {} | Op::Imag {} => m[0].clone(),
        // z / |z| moves by δ / |z|.
        Op::Sign {} => each(&|i| o[i].max(over(i, z[i]))),
        // z1 / z2 moves by δ1 / |z2| + |z1 / z2| δ2 / |z2|.
        Op::Divide {} => {
            let (z2, m2) = (moduli(r[1]), m[1].to_f64s());
            each(&|i| (mz[i] + o[i] * m2[i]) / z2[i])
        }
        // |sin' z| = |cos z| <= 1 + |sin z| (cos² = 1 - sin²), and cos likewise.
        Op::Sine {} | Op::Cosine {} => each(&|i| o[i].max(mz[i] * (1.0 + o[i]))),
        // tan' = 1 + tan², tanh' = 1 - tanh², logistic' = σ (1 - σ).
        Op::Tan {} | Op::Tanh {} => each(&|i| o[i].max(mz[i]) * (1.0 + o[i] * o[i])),
        Op::Logistic {} => each(&|i| o[i].max(mz[i]) * (1.0 + o[i])),
        Op::Log {} => each(&|i| o[i].max(over(i, z[i]))),
        Op::LogPlusOne {} => {
            let c = r[0].to_complex_f64s();
            each(&|i| o[i].max(over(i, (c[i][0] + 1.0).hypot(c[i][1]))))
        }
        Op::Sqrt {} => each(&|i| o[i].max(over(i, 2.0 * o[i]))),
        Op::Rsqrt {} => each(&|i| o[i].max(over(i, 2.0 * z[i]) * o[i])),
        // atan2(y, x) moves by (x δy - y δx) / (x² + y²).
        Op::Atan2 {} => {
            let (y, x) = (r[0].to_complex_f64s(), r[1].to_complex_f64s());
            let mx = m[1].to_f64s();
            each(&|i| {
                let [a, b] = y[i];
                let [c, d] = x[i];
                let den = (a * a - b * b + c * c - d * d).hypot(2.0 * (a * b + c * d));
                let num = c.hypot(d) * mz[i] + a.hypot(b) * mx[i];
                o[i].max(if num == 0.0 { 0.0 } else { num / den })
            })
        }
        // A complex number's parts, as the part type with a last dimension of 2: each part
        // within the number's magnitude.
        Op::BitcastConvert {} if complex_in && o.len() == 2 * mz.len() => {
            let v: Vec<f64> = mz.iter().flat_map(|&x| [x, x]).collect();
            Literal::from_f64s(f64_type(out.ty()), &v).expect("a result's element count")
        }
        // Parts assembled into complex numbers: the sum of their magnitudes.
        Op::BitcastConvert {} if 2 * o.len() == mz.len() => each(&|i| mz[2 * i] + mz[2 * i + 1]),
        // The bits of one width as another type (a `c64` as an `f64`): no bound follows them
        // (`cone_bound`), only the value's own size.
        Op::BitcastConvert {} => each(&|i| o[i]),
        _ => return None,
    };
    Some(v)
}

/// The magnitude of the result `out` of a real quotient, exponential, logarithm or root, from
/// its operands' values `r` and magnitudes `m`, where `inexact[k]` when operand `k`'s cone
/// rounds: `|out|`, and where an operand is inexact, at least what its error becomes through
/// the op's derivative (first order, as for the complex ops): an error `δ` of `x` moves `exp x`
/// by `exp x · δ`, `expm1 x` by `exp x · δ`, `ln x` by `δ / |x|`, `ln(1 + x)` by
/// `δ / |1 + x|`, `√x` by `δ / (2 √x)` and `1 / √x` by `δ / (2 |x| √x)`; errors `δa`, `δb` of
/// a quotient's operands move `a / b` by `(δa + |a / b| δb) / |b|`. An operand's error is within
/// `(2 U + K) · ε` times its magnitude, so these carry it at the result's scale. Not the
/// operand's magnitude through the function itself (`exp M`), which for the largest scores of
/// a softmax is beyond any float and would leave its outputs unchecked; nor the value alone,
/// which misses the growth of a logarithm's error near 1 or a quotient's through a denominator
/// that cancelled.
fn first_order_magnitude(
    op: &Op,
    r: &[&Literal],
    m: &[&Literal],
    out: &Literal,
    inexact: Vec<bool>,
) -> Option<Literal> {
    if !matches!(
        op,
        Op::Divide {}
            | Op::Exponential {}
            | Op::ExponentialMinusOne {}
            | Op::Log {}
            | Op::LogPlusOne {}
            | Op::Sqrt {}
            | Op::Rsqrt {}
    ) {
        return None;
    }
    let o = out.to_f64s();
    let (x, mx) = (r[0].to_f64s(), m[0].to_f64s());
    let (y, my) = match op {
        Op::Divide {} => (r[1].to_f64s(), m[1].to_f64s()),
        _ => (vec![], vec![]),
    };
    // `num / den`, 0 where the error is 0 (an exact 0 over a 0).
    let over = |num: f64, den: f64| if num == 0.0 { 0.0 } else { num / den };
    let v: Vec<f64> = (0..o.len())
        .map(|i| {
            let a = o[i].abs();
            if let Op::Divide {} = op {
                let (b, mb) = (y[i].abs(), my[i]);
                let da = if inexact[0] { mx[i] } else { x[i].abs() };
                let db = if inexact[1] { a * mb } else { 0.0 };
                return a.max(over(da + db, b));
            }
            if !inexact[0] {
                return a;
            }
            let carried = match op {
                // At -inf (a masked score minus its row's maximum) the exponential is 0 and
                // its derivative 0: a backend's value there is that -inf, or a finite value
                // past the dtype's range, whose exponential is 0 as well.
                // (Unless the -inf is a sum's that may be NaN in a backend.)
                Op::Exponential {} | Op::ExponentialMinusOne {} if x[i] == f64::NEG_INFINITY => {
                    if mx[i] == NAN_RISK {
                        NAN_RISK
                    } else {
                        0.0
                    }
                }
                Op::Exponential {} => a * mx[i],
                Op::ExponentialMinusOne {} => (o[i] + 1.0).abs() * mx[i],
                Op::Log {} => over(mx[i], x[i].abs()),
                Op::LogPlusOne {} => over(mx[i], (1.0 + x[i]).abs()),
                Op::Sqrt {} => over(mx[i], 2.0 * a),
                _ => over(mx[i] * a, 2.0 * x[i].abs()),
            };
            a.max(carried)
        })
        .collect();
    Some(Literal::from_f64s(f64_type(out.ty()), &v).expect("a result's element count"))
}

/// The magnitude of `z = x^y` (`out`) from its operands' values `r` and magnitudes `m`, where
/// `inexact[k]` when operand `k`'s cone is not exact: `|z|`, plus what the operands' errors
/// become through the power's condition numbers. An error `δx` of the base changes `z` by about
/// `|z| · |y| · δx / |x|`, and `δy` of the exponent by `|z| · |ln x| · δy`; the operands' errors
/// are within `(2 U + K) · ε` times their magnitudes (the output's `U` and `K` include theirs),
/// so `|z| · (1 + |y| · M_x / |x| + |ln |x|| · M_y)` carries them at the output's own scale. An
/// exact operand adds nothing (a power of exact operands keeps the bound of its own rounding),
/// and an inexact base of 0 has no bound (infinite).
fn power_magnitude(
    out: &Literal,
    r: [&Literal; 2],
    m: [&Literal; 2],
    inexact: [bool; 2],
) -> Literal {
    let (z, x, y) = (moduli(out), moduli(r[0]), moduli(r[1]));
    let (mx, my) = (m[0].to_f64s(), m[1].to_f64s());
    // |ln x| of a complex x: |ln |x| + i arg x| <= |ln |x|| + π.
    let arg = if r[0].dtype().is_complex() {
        std::f64::consts::PI
    } else {
        0.0
    };
    let v: Vec<f64> = (0..z.len())
        .map(|i| {
            let mut c = 1.0;
            if inexact[0] {
                c += if x[i] == 0.0 {
                    f64::INFINITY
                } else {
                    y[i].abs() * mx[i] / x[i].abs()
                };
            }
            if inexact[1] {
                c += (x[i].abs().ln().abs() + arg) * my[i];
            }
            // A zero or infinite power times an infinite condition: no bound (NaN, made
            // infinite by the caller).
            z[i].abs() * c
        })
        .collect();
    Literal::from_f64s(f64_type(out.ty()), &v).expect("same size")
}

/// For each output of `f` on `args`, the magnitude `M` of each element (an f64 tensor of the
/// output's shape; the output itself for integer and `pred` outputs): the reference's evaluation
/// with each float value replaced by a bound on the absolute values it is computed from.
/// Integer, `pred` and index values keep their real values, and so do decisions: `select` picks
/// by the real predicate, `select_and_scatter` by the real operand. Every magnitude is at least
/// the absolute value of the real result.
pub fn magnitudes(f: &Func, args: &[Literal]) -> crate::Result<Vec<Literal>> {
    Ok(values_magnitudes_and_trips(f, args)?.1)
}

/// The outputs of `f` on `args`, as [`crate::eval`] computes them, their [`magnitudes`] and
/// the trips its loops took ([`output_bounds_after`]): the magnitudes are computed beside the
/// real values, so one pass gives all three.
pub fn values_magnitudes_and_trips(
    f: &Func,
    args: &[Literal],
) -> crate::Result<(Vec<Literal>, Vec<Literal>, Trips)> {
    let mut trips = Trips::default();
    let (v, m) = values_and_magnitudes_given(f, args, None, &mut trips)?;
    Ok((v, m, trips))
}

/// [`values_magnitudes_and_trips`] with the parameters' magnitudes given (`arg_mags`: a
/// region's operands' magnitudes), else their absolute values; loops' trips recorded in
/// `trips`.
fn values_and_magnitudes_given(
    f: &Func,
    args: &[Literal],
    arg_mags: Option<&[&Literal]>,
    trips: &mut Trips,
) -> crate::Result<(Vec<Literal>, Vec<Literal>)> {
    kiln_ir::verify(f).map_err(crate::Error::Verify)?;
    crate::check_args(f, args)?;
    let mut real: Vec<Option<Literal>> = vec![None; f.values.len()];
    let mut mag: Vec<Option<Literal>> = vec![None; f.values.len()];
    let mut def = vec![usize::MAX; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            def[r.index()] = i;
        }
    }
    for (k, (&p, a)) in f.params.iter().zip(args).enumerate() {
        real[p.index()] = Some(a.clone());
        mag[p.index()] = Some(match arg_mags {
            Some(m) => m[k].clone(),
            None if rounds(a.dtype()) => map(a, f64::abs),
            None => a.clone(),
        });
    }
    // Whether a value's cone rounds (memoized: the first-order rules below ask per operand).
    // A region's parameters carry the caller's errors, whose cones are outside the region.
    let mut inexact_memo: Vec<Option<bool>> = vec![None; f.values.len()];
    let mut inexact = |v: kiln_ir::ValueId| -> bool {
        arg_mags.is_some()
            || *inexact_memo[v.index()].get_or_insert_with(|| !cone_bound(f, &def, v, None).exact())
    };
    for inst in &f.insts {
        let r: Vec<&Literal> = inst
            .operands
            .iter()
            .map(|o| real[o.index()].as_ref().expect("verified SSA"))
            .collect();
        let m: Vec<&Literal> = inst
            .operands
            .iter()
            .map(|o| mag[o.index()].as_ref().expect("verified SSA"))
            .collect();
        let types: Vec<TensorType> = inst
            .results
            .iter()
            .map(|v| f.values[v.index()].clone())
            .collect();
        // A loop runs here, trip by trip on values and magnitudes (its trips recorded).
        if let Op::While { cond, body } = &inst.op {
            let mut vals: Vec<Literal> = r.iter().map(|x| (*x).clone()).collect();
            let mut mags: Vec<Literal> = m.iter().map(|x| (*x).clone()).collect();
            let mut n = 0;
            loop {
                let refs: Vec<&Literal> = vals.iter().collect();
                if !crate::ops::loop_goes_on(cond, &refs) {
                    break;
                }
                let mrefs: Vec<&Literal> = mags.iter().collect();
                (vals, mags) = values_and_magnitudes_given(body, &vals, Some(&mrefs), trips)?;
                n += 1;
            }
            trips.record(body, n);
            for ((&v, o), mg) in inst.results.iter().zip(vals).zip(mags) {
                real[v.index()] = Some(o);
                mag[v.index()] = Some(mg);
            }
            continue;
        }
        let out = eval_op(&inst.op, &r, &types);
        let ftypes: Vec<TensorType> = types.iter().map(f64_type).collect();
        let float_out = types.first().is_some_and(|t| rounds(t.dtype));
        let float_in = r.first().is_some_and(|x| rounds(x.dtype()));
        let complex_in = r.first().is_some_and(|x| x.dtype().is_complex());
        let mags: Vec<Literal> = if let Some(y) = bits_round_trip(f, &def, inst) {
            vec![mag[y.index()].clone().expect("verified SSA")]
        } else if let Op::Lu {} = inst.op {
            // The factors' magnitudes (`crate::linalg`); the pivots are integers.
            let m = crate::linalg::lu_magnitude(&map(&out[0], |x| x));
            vec![
                Literal::from_f64s(ftypes[0].clone(), &m).expect("a result's element count"),
                out[1].clone(),
                out[2].clone(),
            ]
        } else if let Op::Case { branches } = &inst.op {
            // The branch taken, run on the operands' values and magnitudes.
            let g = &branches[crate::case_branch(r[0], branches.len())];
            let args: Vec<Literal> = r[1..].iter().map(|x| (*x).clone()).collect();
            values_and_magnitudes_given(g, &args, Some(&m[1..]), trips)?.1
        } else if let Op::Call {
            callee: kiln_ir::Callee { func: Some(g), .. },
        } = &inst.op
        {
            // The callee, run on the operands' values and magnitudes.
            let args: Vec<Literal> = r.iter().map(|x| (*x).clone()).collect();
            values_and_magnitudes_given(g, &args, Some(&m), trips)?.1
        } else if let Op::Map { computation, .. } = &inst.op {
            // Each element through the computation, on its operands' values and magnitudes.
            let mut each = Vec::with_capacity(out[0].numel());
            for i in 0..out[0].numel() {
                let args = crate::reduce_region::elements_at(&r, i);
                let mags = crate::reduce_region::elements_at(&m, i);
                let refs: Vec<&Literal> = mags.iter().collect();
                let (_, mg) = values_and_magnitudes_given(computation, &args, Some(&refs), trips)?;
                each.push(mg[0].to_f64s()[0]);
            }
            if float_out {
                vec![Literal::from_f64s(ftypes[0].clone(), &each).expect("one per element")]
            } else {
                out.clone()
            }
        } else if let Op::Sort {
            dimension,
            comparator,
            ..
        } = &inst.op
        {
            // Elements moved: each result's magnitudes are its operand's, in the sorted order.
            let perm = crate::sort::sort_permutation(&r, *dimension as usize, comparator);
            m.iter()
                .map(|l| crate::ops::take(l, l.ty(), &perm))
                .collect()
        } else if !inst.op.regions().is_empty() {
            // The results of another op with regions bound themselves (the bound through a
            // region that rounds is infinite, see `cone_bound`); the regions do not run on
            // magnitudes.
            out.iter()
                .map(|o| {
                    if rounds(o.dtype()) {
                        map(o, f64::abs)
                    } else {
                        o.clone()
                    }
                })
                .collect()
        } else if !float_out {
            out.clone()
        } else if let Some(c) = complex_magnitude(&inst.op, &r, &m, &out[0], complex_in) {
            vec![c]
        } else if let Some(c) = first_order_magnitude(
            &inst.op,
            &r,
            &m,
            &out[0],
            inst.operands.iter().map(|&v| inexact(v)).collect(),
        ) {
            vec![c]
        } else {
            let abs_out = || map(&out[0], f64::abs);
            let one = match &inst.op {
                Op::Subtract {} => Some(eval_op(&Op::Add {}, &m, &ftypes).remove(0)),
                Op::Negate {} | Op::Abs {} => Some(m[0].clone()),
                Op::Remainder {} => Some(m[0].clone()),
                // A maximum or minimum is one of its operands: the largest of their
                // magnitudes, but an operand at an infinity bounds only a result that is that
                // infinity (`at_finite`).
                Op::Maximum {} | Op::Minimum {} | Op::Clamp {} => {
                    let n = out[0].numel();
                    let each: Vec<Vec<f64>> = r
                        .iter()
                        .zip(&m)
                        .map(|(x, mx)| at_finite(x, mx).to_f64s())
                        .collect();
                    let v: Vec<f64> = (0..n)
                        .map(|i| {
                            each.iter()
                                .map(|e| if e.len() == n { e[i] } else { e[0] })
                                .fold(0.0, f64::max)
                        })
                        .collect();
                    Some(
                        Literal::from_f64s(ftypes[0].clone(), &v)
                            .expect("a result's element count"),
                    )
                }
                Op::Convert {} if float_in => Some(m[0].clone()),
                // Exact operands: the function's own rounding, `op_ulps` of its result (an
                // exact argument's size says nothing of the result's error).
                Op::Sine {}
                | Op::Cosine {}
                | Op::Tan {}
                | Op::Tanh {}
                | Op::Logistic {}
                | Op::Erf {}
                | Op::Atan2 {}
                    if inst.operands.iter().all(|&v| !inexact(v)) =>
                {
                    Some(abs_out())
                }
                // Through its derivative at the point (first order), `1 - tanh²` and
                // `σ (1 - σ)`: an RNN's carry keeps its size over a long loop where a
                // derivative taken as 1 compounds the weights' sums every trip.
                Op::Tanh {} => Some(zip(m[0], &out[0], |x, t| (x * (1.0 - t * t)).max(t.abs()))),
                Op::Logistic {} => Some(zip(m[0], &out[0], |x, s| {
                    (x * (s * (1.0 - s))).max(s.abs())
                })),
                Op::Sine {} | Op::Cosine {} | Op::Erf {} => {
                    Some(zip(m[0], &out[0], |x, y| x.max(y.abs())))
                }
                // The first-order error of tan(x) is (1 + tan²x) times x's.
                Op::Tan {} => Some(zip(m[0], &out[0], |x, t| x.max(t.abs()) * (1.0 + t * t))),
                // atan2(y, x) moves by (|x| dy + |y| dx) / (x² + y²): at most the operands'
                // magnitudes over their distance from the origin.
                Op::Atan2 {} => {
                    let (ys, xs) = (r[0].to_f64s(), r[1].to_f64s());
                    let (my, mx) = (m[0].to_f64s(), m[1].to_f64s());
                    let o = out[0].to_f64s();
                    let v: Vec<f64> = (0..o.len())
                        .map(|i| o[i].abs().max((my[i] + mx[i]) / ys[i].hypot(xs[i])))
                        .collect();
                    Some(Literal::from_f64s(f64_type(out[0].ty()), &v).expect("same size"))
                }
                // cbrt(x) moves by dx / (3 cbrt(x)²).
                // An exact operand: the root's own size (its rounding alone).
                Op::Cbrt {} if !inexact(inst.operands[0]) => Some(abs_out()),
                Op::Cbrt {} => Some(zip(m[0], &out[0], |x, c| c.abs().max(x / (3.0 * c * c)))),
                Op::Power {} => Some(power_magnitude(
                    &out[0],
                    [r[0], r[1]],
                    [m[0], m[1]],
                    [0, 1].map(|k| inexact(inst.operands[k])),
                )),
                Op::Floor {}
                | Op::Ceil {}
                | Op::RoundNearestAfz {}
                | Op::RoundNearestEven {}
                | Op::ReducePrecision { .. }
                | Op::Sign {}
                | Op::Convert {}
                | Op::BitcastConvert {}
                | Op::Iota { .. }
                | Op::Constant { .. } => Some(abs_out()),
                // A maximum or minimum is one of its elements (or the init, where none is
                // larger): the largest of the elements' magnitudes, and the result's own size
                // (added below), so that an init of -inf bounds nothing it does not select.
                Op::Reduce {
                    dimensions,
                    kind: Combiner::Min | Combiner::Max,
                } => Some(
                    eval_op(
                        &Op::Reduce {
                            dimensions: dimensions.clone(),
                            kind: Combiner::Max,
                        },
                        &[&at_finite(r[0], m[0]), &map(m[1], |_| 0.0)],
                        &ftypes,
                    )
                    .remove(0),
                ),
                Op::ReduceWindow {
                    window_dimensions,
                    window_strides,
                    base_dilations,
                    window_dilations,
                    padding,
                    kind: Combiner::Min | Combiner::Max,
                } => Some(
                    eval_op(
                        &Op::ReduceWindow {
                            window_dimensions: window_dimensions.clone(),
                            window_strides: window_strides.clone(),
                            base_dilations: base_dilations.clone(),
                            window_dilations: window_dilations.clone(),
                            padding: padding.clone(),
                            kind: Combiner::Max,
                        },
                        &[&at_finite(r[0], m[0]), &map(m[1], |_| 0.0)],
                        &ftypes,
                    )
                    .remove(0),
                ),
                // Each element is the operand's or one of its updates': the largest of their
                // magnitudes, as for `maximum` (magnitudes are combined by `max` whatever the
                // kind: the minimum of two magnitudes bounds neither's error).
                Op::Scatter {
                    update_window_dims,
                    inserted_window_dims,
                    scatter_dims_to_operand_dims,
                    index_vector_dim,
                    kind: Combiner::Min | Combiner::Max,
                    input_batching_dims,
                    scatter_indices_batching_dims,
                } => Some(
                    eval_op(
                        &Op::Scatter {
                            update_window_dims: update_window_dims.clone(),
                            inserted_window_dims: inserted_window_dims.clone(),
                            scatter_dims_to_operand_dims: scatter_dims_to_operand_dims.clone(),
                            index_vector_dim: *index_vector_dim,
                            kind: Combiner::Max,
                            input_batching_dims: input_batching_dims.clone(),
                            scatter_indices_batching_dims: scatter_indices_batching_dims.clone(),
                        },
                        &[&at_finite(r[0], m[0]), m[1], &at_finite(r[2], m[2])],
                        &ftypes,
                    )
                    .remove(0),
                ),
                Op::Select {} => Some(eval_op(&inst.op, &[r[0], m[1], m[2]], &ftypes).remove(0)),
                Op::Cholesky { lower } => Some(
                    Literal::from_f64s(
                        ftypes[0].clone(),
                        &crate::linalg::cholesky_magnitude(&map(&out[0], |x| x), *lower, m[0]),
                    )
                    .expect("a result's element count"),
                ),
                Op::TriangularSolve {
                    left_side,
                    lower,
                    unit_diagonal,
                    transpose_a,
                } => Some(
                    Literal::from_f64s(
                        ftypes[0].clone(),
                        &crate::linalg::triangular_solve_magnitude(
                            &map(r[0], |x| x),
                            &map(&out[0], |x| x),
                            crate::linalg::Solve {
                                left_side: *left_side,
                                lower: *lower,
                                unit_diagonal: *unit_diagonal,
                                transpose_a: *transpose_a,
                            },
                            m[0],
                            m[1],
                        ),
                    )
                    .expect("a result's element count"),
                ),
                Op::SelectAndScatter { .. } => {
                    Some(eval_op(&inst.op, &[r[0], m[1], m[2]], &ftypes).remove(0))
                }
                Op::Fft {
                    fft_type,
                    fft_length,
                } => Some(
                    Literal::from_f64s(
                        ftypes[0].clone(),
                        &crate::fft::fft_magnitude(m[0], *fft_type, fft_length, &types[0]),
                    )
                    .expect("a result's element count"),
                ),
                _ => None,
            };
            match one {
                Some(x) => vec![x],
                // Everything else (sums, products, maxima, data movement, barriers) applies to
                // magnitudes as it is.
                None if is_sum(&inst.op) => {
                    let mags = eval_op(&inst.op, &m, &ftypes).remove(0);
                    vec![mark_nan_risk(&inst.op, (&r, &m), &out[0], &ftypes, mags)]
                }
                None => eval_op(&inst.op, &m, &ftypes),
            }
        };
        for ((&v, o), mg) in inst.results.iter().zip(out).zip(mags) {
            let mg = if rounds(o.dtype()) {
                // NaN magnitudes (inf - inf among them) bound nothing: infinite.
                // A sum's infinity that may be NaN in a backend keeps its mark.
                zip(&mg, &o, |x, y| {
                    let x = if x.is_nan() { f64::INFINITY } else { x.abs() };
                    if x == NAN_RISK { x } else { x.max(y.abs()) }
                })
            } else {
                mg
            };
            real[v.index()] = Some(o);
            mag[v.index()] = Some(mg);
        }
    }
    let outputs = |env: &[Option<Literal>]| -> Vec<Literal> {
        f.outputs
            .iter()
            .map(|o| env[o.index()].clone().expect("verified SSA"))
            .collect()
    };
    Ok((outputs(&real), outputs(&mag)))
}

/// Counts of one comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Elements compared.
    pub elements: usize,
    /// Of those, in outputs that had to match bit for bit.
    pub exact: usize,
    /// NaN reference elements.
    pub nan: usize,
    /// Infinite reference elements.
    pub inf: usize,
    /// Negative zeros in the reference.
    pub neg_zero: usize,
    /// Subnormal reference elements.
    pub subnormal: usize,
    /// Elements whose bound was infinite (an infinite magnitude: inf or NaN met on the way).
    pub unbounded: usize,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.elements += o.elements;
        self.exact += o.exact;
        self.nan += o.nan;
        self.inf += o.inf;
        self.neg_zero += o.neg_zero;
        self.subnormal += o.subnormal;
        self.unbounded += o.unbounded;
    }
}

fn is_subnormal(d: DType, x: f64) -> bool {
    let min = match d.part() {
        DType::F16 => 2f64.powi(-14),
        DType::BF16 | DType::F32 => 2f64.powi(-126),
        // `f8e8m0fnu` has no subnormals; its smallest value, 2^-127, is normal.
        DType::Mini(m) => 2f64.powi(1 - m.layout().2).min(m.to_f64(0).abs()),
        _ => f64::MIN_POSITIVE,
    };
    x != 0.0 && x.abs() < min
}

/// Checks `actual` against the reference's `expected` under `bound`, with the elements'
/// magnitudes `mag` (needed when the bound is not exact). The error names the first failing
/// element, both values and the distance in ulps.
pub fn check(
    actual: &Literal,
    expected: &Literal,
    bound: Bound,
    mag: Option<&Literal>,
) -> Result<Stats, String> {
    if actual.ty() != expected.ty() {
        return Err(format!(
            "type {} differs from the reference's {}",
            actual.ty(),
            expected.ty()
        ));
    }
    let d = expected.dtype();
    let mut s = Stats {
        elements: expected.numel(),
        ..Stats::default()
    };
    if bound.exact() {
        s.exact = s.elements;
    }
    if !rounds(d) && bound.ulps.is_infinite() {
        s.unbounded = s.elements;
        return Ok(s);
    }
    if !rounds(d) {
        let (a, e) = (actual.to_i64s(), expected.to_i64s());
        return match a.iter().zip(&e).position(|(x, y)| x != y) {
            None => Ok(s),
            Some(i) => Err(format!(
                "element {i}: {} differs from the reference's {}",
                actual.format_elem(i),
                expected.format_elem(i)
            )),
        };
    }
    // Each element as its parts (one for a real dtype), and its size: a complex element is
    // bounded at its modulus, each part under the same bound (the bound is norm-wise: a part
    // much smaller than the other errs by the larger one's ulps).
    let parts = |l: &Literal| -> Vec<[f64; 2]> {
        if d.is_complex() {
            l.to_complex_f64s()
        } else {
            l.to_f64s().into_iter().map(|x| [x, 0.0]).collect()
        }
    };
    let (a, e, size) = (parts(actual), parts(expected), moduli(expected));
    let m = match (bound.exact(), mag) {
        (true, _) => None,
        (false, Some(m)) => Some(m.to_f64s()),
        (false, None) => return Err("an inexact bound needs the magnitudes".into()),
    };
    let n_parts = if d.is_complex() { 2 } else { 1 };
    for i in 0..e.len() {
        let y_size = size[i];
        let any = |g: fn(f64) -> bool| e[i][..n_parts].iter().any(|&y| g(y));
        s.nan += any(f64::is_nan) as usize;
        s.inf += any(f64::is_infinite) as usize;
        s.neg_zero += any(|y| y == 0.0 && y.is_sign_negative()) as usize;
        s.subnormal += is_subnormal(d, y_size) as usize;
        let y_size = if y_size.is_finite() { y_size } else { 0.0 };
        let allowed = match &m {
            None => 0.0,
            Some(_) if bound.ulps.is_infinite() => f64::INFINITY,
            // The last term is underflow: a rounding in the subnormal range errs by up to half
            // the smallest subnormal, whatever the value's size (seed 7750: two chained products
            // of subnormal values).
            Some(m) => {
                bound.ulps * ulp(d, y_size)
                    + (2.0 * bound.ulps + bound.sum) * bound.eps * m[i]
                    + (bound.ulps + bound.sum) * ulp(d, 0.0)
            }
        };
        if allowed.is_infinite() {
            s.unbounded += 1;
        }
        // Terms past the accumulator's range (f32 for f16, bf16 and f32; f64 for f64): a
        // backend's partial sums may overflow to ±inf (and meet the other infinity: NaN) where
        // the reference's f64 sum stays finite and rounds to an infinity only at the end.
        let overflows = bound.sum > 0.0
            && m.as_ref()
                .is_some_and(|m| m[i] > accumulator_max(d) || m[i] == NAN_RISK);
        if overflows {
            // Counted once: an infinite bound (above) is past the range too.
            s.unbounded += usize::from(allowed.is_finite());
            continue;
        }
        let ok = |x: f64, y: f64| {
            if y.is_nan() {
                x.is_nan()
            } else if y.is_infinite() || x.is_infinite() || x.is_nan() {
                x == y
            } else {
                (x - y).abs() <= allowed
            }
        };
        if let Some(k) = (0..n_parts).find(|&k| !ok(a[i][k], e[i][k])) {
            let dist = (a[i][k] - e[i][k]).abs() / ulp(d, y_size);
            let part = match (n_parts, k) {
                (1, _) => "",
                (_, 0) => " (real part)",
                _ => " (imaginary part)",
            };
            return Err(format!(
                "element {i}: {} differs from the reference's {}{part} by {dist:.3e} ulp (allowed {:.3e} ulp: {bound:?}{})",
                actual.format_elem(i),
                expected.format_elem(i),
                allowed / ulp(d, y_size),
                m.as_ref()
                    .map(|m| format!(", magnitude {:e}", m[i]))
                    .unwrap_or_default()
            ));
        }
    }
    Ok(s)
}

/// Checks every output `got` of `f` on `args` against the reference interpreter, each under the
/// bound of its cone. The error names the output.
pub fn check_outputs(f: &Func, args: &[Literal], got: &[Literal]) -> Result<Stats, String> {
    check_outputs_with(f, args, got, None)
}

/// [`check_outputs`] against results computed before (`want`: the reference's on `args`, as
/// shipped beside an ahead-of-time artifact), each output under the bound of its cone.
pub fn check_outputs_against(
    f: &Func,
    args: &[Literal],
    got: &[Literal],
    want: &[Literal],
) -> Result<Stats, String> {
    check_outputs_with(f, args, got, Some(want))
}

fn check_outputs_with(
    f: &Func,
    args: &[Literal],
    got: &[Literal],
    given: Option<&[Literal]>,
) -> Result<Stats, String> {
    let mut bounds = output_bounds(f);
    // The magnitudes' pass computes the values too: the program runs once for them, not once
    // more (a large product's or convolution's check spends its time in these passes). It
    // also counts the loops' trips, which bound their results.
    let (want, mags) = if bounds.iter().all(Bound::exact) {
        match given {
            Some(w) => (w.to_vec(), None),
            None => (crate::eval(f, args).map_err(|e| e.to_string())?, None),
        }
    } else {
        let (want, mags, trips) =
            values_magnitudes_and_trips(f, args).map_err(|e| e.to_string())?;
        bounds = output_bounds_after(f, &trips);
        (given.map(<[Literal]>::to_vec).unwrap_or(want), Some(mags))
    };
    if got.len() != want.len() {
        return Err(format!(
            "{} outputs, the reference has {}",
            got.len(),
            want.len()
        ));
    }
    let mut s = Stats::default();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if let Some(h) = as_float_program(f, i) {
            let ft = h.output_types[0].clone();
            let as_float =
                |l: &Literal| Literal::from_le_bytes(ft.clone(), &l.to_le_bytes()).map_err(|e| e.0);
            if bounds[i].exact() {
                // The bits of an exact float: bit for bit, but a NaN for a NaN whatever its
                // sign and payload (which no op defines).
                s += same_bits_or_nan(&as_float(g)?, &as_float(w)?)
                    .map_err(|e| format!("output {i} (the bits of a {ft}): {e}"))?;
                continue;
            }
            // The bits of an inexact float (moved around): compared as that float, under its
            // own bound (one ulp apart is one apart as an integer of the same width).
            let (_, mag, trips) =
                values_magnitudes_and_trips(&h, args).map_err(|e| e.to_string())?;
            s += check(
                &as_float(g)?,
                &as_float(w)?,
                output_bounds_after(&h, &trips)[0],
                Some(&mag[0]),
            )
            .map_err(|e| format!("output {i} (the bits of a {ft}): {e}"))?;
            continue;
        }
        s += check(g, w, bounds[i], mags.as_ref().map(|m| &m[i]))
            .map_err(|e| format!("output {i}: {e}"))?;
    }
    Ok(s)
}

/// Float (or complex) elements of `actual` and `expected` (one type) bit for bit, except that
/// any NaN matches any NaN (a complex element is NaN when a part is).
fn same_bits_or_nan(actual: &Literal, expected: &Literal) -> Result<Stats, String> {
    let width = expected.dtype().bytes();
    let (ab, eb) = (actual.to_le_bytes(), expected.to_le_bytes());
    let nan = |l: &Literal| -> Vec<bool> {
        let parts = l.to_complex_f64s();
        parts
            .iter()
            .map(|z| z[0].is_nan() || z[1].is_nan())
            .collect()
    };
    let (a, e) = (nan(actual), nan(expected));
    for i in 0..e.len() {
        let bits = |b: &[u8]| b[i * width..(i + 1) * width].to_vec();
        if bits(&ab) != bits(&eb) && !(a[i] && e[i]) {
            return Err(format!(
                "element {i}: {} differs from the reference's {} (bits {:02x?} and {:02x?})",
                actual.format_elem(i),
                expected.format_elem(i),
                bits(&ab),
                bits(&eb)
            ));
        }
    }
    let bound = Bound {
        ulps: 0.0,
        sum: 0.0,
        eps: 0.0,
    };
    check(actual, expected, bound, None)
}

/// When output `i` is the bits of floats (a `bitcast_convert` of a float or complex value of
/// the same shape and width to an integer type or another float type, then only moved: transposed, reshaped, reversed, sliced,
/// broadcast, gathered), `f` returning only output `i`, with those values kept as floats (the
/// bitcast an identity reshape), and without the instructions outside its cone (which may use
/// the bits as integers).
fn as_float_program(f: &Func, i: usize) -> Option<Func> {
    let def = |v: kiln_ir::ValueId| f.insts.iter().position(|k| k.results.contains(&v));
    let mut chain = Vec::new();
    let mut v = f.outputs[i];
    loop {
        let k = def(v)?;
        let inst = &f.insts[k];
        chain.push(k);
        match inst.op {
            Op::BitcastConvert {} => break,
            Op::Transpose { .. }
            | Op::Reshape {}
            | Op::Reverse { .. }
            | Op::Slice { .. }
            | Op::BroadcastInDim { .. }
            | Op::DynamicSlice { .. }
            | Op::Gather { .. } => v = inst.operands[0],
            _ => return None,
        }
    }
    let cast = &f.insts[*chain.last()?];
    let (from, to) = (
        &f.values[cast.operands[0].index()],
        &f.values[cast.results[0].index()],
    );
    // To an integer type or to another float type (f16 to bf16): NaN bits land on a number.
    // A complex number's bits (a `c64` as an `i64`) are its parts', compared as that number.
    let float = from.dtype.is_float() || from.dtype.is_complex();
    if !float || from.dtype == to.dtype || from.shape != to.shape {
        return None;
    }
    let mut h = f.clone();
    h.outputs = vec![f.outputs[i]];
    let mut live = vec![false; f.values.len()];
    live[f.outputs[i].index()] = true;
    let mut keep = vec![false; f.insts.len()];
    for (k, inst) in f.insts.iter().enumerate().rev() {
        if inst.results.iter().any(|r| live[r.index()]) {
            keep[k] = true;
            for o in &inst.operands {
                live[o.index()] = true;
            }
        }
    }
    h.insts[*chain.last()?].op = Op::Reshape {};
    for &k in &chain {
        let r = h.insts[k].results[0].index();
        h.values[r] = h.values[r].with_dtype(from.dtype);
    }
    h.output_types = h
        .outputs
        .iter()
        .map(|o| h.values[o.index()].clone())
        .collect();
    let mut k = 0;
    h.insts.retain(|_| {
        k += 1;
        keep[k - 1]
    });
    // An index computed from the bits themselves would now read floats.
    kiln_ir::verify(&h).ok()?;
    Some(h)
}

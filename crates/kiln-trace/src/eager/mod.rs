//! Eager ops without a compiler: the ops a training or inference step is made of (elementwise
//! arithmetic, functions, comparisons, selections and conversions on every dtype; broadcasts,
//! reshapes, transposes, slices, reversals and concatenations; reductions; dot products) run as
//! native loops over the literals' typed slices, split across threads when they are large, so
//! an eager op costs no compile.
//!
//! Each loop computes every element exactly as the reference interpreter does, so its results
//! are the reference's bit for bit: the per-element arithmetic is the reference's own
//! (`kiln_reference::scalar`: floats in f64 rounded once to the result dtype, integers in
//! wrapping i64), and sums (reductions, dot products) accumulate in f64 (wrapping i64) in the
//! reference's order, each output's terms in row-major order of its operand, rounded once.
//! Threads split the outputs, never one output's sum.
//!
//! Most of these loops run as fast as a compiled kernel would (they move memory), so they are
//! used every time. For a few ops a compiled kernel is much faster: dot products (a GEMM with
//! packed panels against a plain blocked loop in f64) and the transcendental functions (f32
//! polynomials against the C library's f64 functions). Those run natively the first time a
//! large one of a signature is used, and are compiled when used again (a training loop), once
//! ([`compiles_when_reused`]).

mod dot;
mod elementwise;
pub(crate) mod layout;
mod reduce;
mod sort;
pub(crate) use sort::sort;
#[cfg(test)]
mod tests;

use crate::Tensor;
use half::{bf16, f16};
use kiln_ir::half_round::{bf16_from_f64, f16_from_f64};
use kiln_ir::{DType, Data, Func, Literal, Op, TensorType};
use std::collections::HashSet;
use std::mem::MaybeUninit;
use std::sync::{Mutex, OnceLock};

/// Whether `f` (a one-op eager function) is used for the first time in this process: the
/// signatures seen so far are kept by their text.
pub(crate) fn first_use(f: &Func) -> bool {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(kiln_ir::print_func(f))
}

/// Whether a large eager `op` used again is compiled (its kernel then runs from the second
/// use on) rather than run natively every time: the ops whose compiled kernels are several
/// times faster than their native loops.
pub(crate) fn compiles_when_reused(op: &Op) -> bool {
    matches!(
        op,
        Op::DotGeneral { .. }
            | Op::Exponential {}
            | Op::Log {}
            | Op::LogPlusOne {}
            | Op::ExponentialMinusOne {}
            | Op::Tanh {}
            | Op::Logistic {}
            | Op::Sine {}
            | Op::Cosine {}
            | Op::Tan {}
            | Op::Atan2 {}
            | Op::Cbrt {}
            | Op::Erf {}
            | Op::Power {}
    )
}

/// `op` on `lits` with result types `out`, computed natively (bit for bit as the reference
/// interpreter computes it); `None` for the ops and dtypes without a native loop (the caller
/// interprets or compiles them).
pub(crate) fn native(op: &Op, lits: &[&Literal], out: &[TensorType]) -> Option<Literal> {
    let [ty] = out else { return None };
    // Control flow runs its regions (interpreted or compiled), never as a native loop.
    if op.props().contains(kiln_ir::Props::CONTROL) {
        return None;
    }
    keep_freed();
    let data = match op {
        Op::Reshape {} => return lits.first()?.reshaped(ty.shape.clone()).ok(),
        // To or from pred (one bit each): the reference's.
        Op::BitcastConvert {} if lits.first()?.dtype().is_pred() != ty.dtype.is_pred() => {
            return None;
        }
        Op::BitcastConvert {} => {
            return Literal::from_le_bytes(ty.clone(), &lits.first()?.to_le_bytes()).ok();
        }
        Op::BroadcastInDim { .. }
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Reverse { .. }
        | Op::Concatenate { .. } => layout::run(op, lits, ty)?,
        Op::Reduce { dimensions, kind } => reduce::run(dimensions, *kind, lits, ty)?,
        Op::DotGeneral {
            lhs_batching_dimensions,
            rhs_batching_dimensions,
            lhs_contracting_dimensions,
            rhs_contracting_dimensions,
        } => dot::run(
            [lits.first()?, lits.get(1)?],
            [lhs_batching_dimensions, rhs_batching_dimensions],
            [lhs_contracting_dimensions, rhs_contracting_dimensions],
            ty,
        )?,
        _ => elementwise::run(op, lits, ty)?,
    };
    Literal::new(ty.clone(), data).ok()
}

/// Elementwise `op` on eager tensors `xs` of which some are one value broadcast
/// ([`Tensor::single_value`]: `x * 2.0`, `x.gt(&zero)`), computed natively with those values
/// read as they are instead of broadcast into buffers of the result's size first (the elements
/// are the same); `None` when no operand is one, or for the ops the caller runs otherwise (see
/// [`native`]; those [`compiles_when_reused`]).
pub(crate) fn with_single_values(op: &Op, xs: &[&Tensor], out: &[TensorType]) -> Option<Literal> {
    if !op.props().contains(kiln_ir::Props::ELEMENTWISE) || compiles_when_reused(op) {
        return None;
    }
    let single: Vec<Option<&Literal>> = xs.iter().map(|t| t.single_value()).collect();
    if single.iter().all(Option::is_none) {
        return None;
    }
    let lits: Vec<&Literal> = xs
        .iter()
        .zip(&single)
        .map(|(t, s)| s.or_else(|| t.literal()))
        .collect::<Option<_>>()?;
    native(op, &lits, out)
}

/// Results are dropped and allocated again op after op: keeps the freed blocks for reuse, as
/// compiled programs do. The allocator is set once per process, so the options are asked
/// once, not on every op.
fn keep_freed() {
    static KEEP_FREED: std::sync::Once = std::sync::Once::new();
    KEEP_FREED.call_once(|| {
        if crate::backend::options().keep_freed {
            kiln_ir::literal::keep_freed_buffers();
        }
    });
}

/// `p - g * s` on eager literals of one float dtype and shape (`s` a value of that dtype), in
/// one pass with the bits of the two ops; `None` for other operands.
pub(crate) fn sub_scaled(p: &Literal, g: &Literal, s: f64) -> Option<Literal> {
    if p.ty() != g.ty() || !p.dtype().is_float() {
        return None;
    }
    keep_freed();
    Literal::new(p.ty().clone(), elementwise::sub_scaled(p, g, s)?).ok()
}

/// [`sub_scaled`] written into `p` (same elements), for `f32` and `f64`: whether it was.
pub(crate) fn sub_scaled_in_place(p: &mut Literal, g: &Literal, s: f64) -> bool {
    p.ty() == g.ty() && elementwise::sub_scaled_in_place(p, g, s)
}

/// An element type of a literal, converted as the reference converts it.
pub(super) trait Elem: Copy + Default + Send + Sync + 'static {
    /// The dtype.
    const DTYPE: DType;
    /// The value as `Literal::to_f64s` gives it (`pred` as 0 or 1).
    fn f64(self) -> f64;
    /// The value as `Literal::to_i64s` gives it (unsigned ones zero-extended).
    fn i64(self) -> i64;
    /// An f64 converted as `Literal::from_f64s` converts it (floats: to nearest, ties to
    /// even).
    fn from_f64(x: f64) -> Self;
    /// An i64 converted as `Literal::from_i64s` converts it (integers: wrapped).
    fn from_i64(x: i64) -> Self;
    /// An f32 converted as [`Elem::from_f64`] converts it (its f64 value is exact).
    fn from_f32(x: f32) -> Self {
        Self::from_f64(x as f64)
    }
    /// The elements of `d`, if it holds this type.
    fn slice(d: &Data) -> Option<&[Self]>;
    /// Elements of this type as data.
    fn data(v: Vec<Self>) -> Data;
}

macro_rules! float_elem {
    ($t:ty, $d:ident, $to:expr, $from:expr $(, $from32:expr)?) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$d;
            fn f64(self) -> f64 {
                $to(self)
            }
            fn i64(self) -> i64 {
                $to(self) as i64
            }
            fn from_f64(x: f64) -> Self {
                $from(x)
            }
            fn from_i64(x: i64) -> Self {
                $from(x as f64)
            }
            $(fn from_f32(x: f32) -> Self {
                $from32(x)
            })?
            fn slice(d: &Data) -> Option<&[Self]> {
                match d {
                    Data::$d(v) => Some(v),
                    _ => None,
                }
            }
            fn data(v: Vec<Self>) -> Data {
                Data::$d(v)
            }
        }
    };
}
float_elem!(f16, F16, |x: f16| x.to_f64(), f16_from_f64, f16::from_f32);
float_elem!(
    bf16,
    BF16,
    |x: bf16| x.to_f64(),
    bf16_from_f64,
    bf16::from_f32
);
float_elem!(f32, F32, |x: f32| x as f64, |x: f64| x as f32);
float_elem!(f64, F64, |x: f64| x, |x: f64| x);

macro_rules! int_elem {
    ($t:ty, $d:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$d;
            fn f64(self) -> f64 {
                self as f64
            }
            fn i64(self) -> i64 {
                self as i64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn from_i64(x: i64) -> Self {
                x as $t
            }
            fn slice(d: &Data) -> Option<&[Self]> {
                match d {
                    Data::$d(v) => Some(v),
                    _ => None,
                }
            }
            fn data(v: Vec<Self>) -> Data {
                Data::$d(v)
            }
        }
    };
}
int_elem!(i8, I8);
int_elem!(i32, I32);
int_elem!(i64, I64);
int_elem!(u32, U32);
int_elem!(u8, U8);
int_elem!(i16, I16);
int_elem!(u16, U16);
int_elem!(u64, U64);

impl Elem for bool {
    const DTYPE: DType = DType::Pred;
    fn f64(self) -> f64 {
        self as u8 as f64
    }
    fn i64(self) -> i64 {
        self as i64
    }
    fn from_f64(x: f64) -> Self {
        x != 0.0
    }
    fn from_i64(x: i64) -> Self {
        x != 0
    }
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::Pred(v) => Some(v),
            _ => None,
        }
    }
    fn data(v: Vec<Self>) -> Data {
        Data::Pred(v)
    }
}

/// `$body` with `$t` the element type of dtype `$d`. The sub-byte integers (`i4`, `u4`, `i2`,
/// `u2`) and the complex numbers (`c64`, `c128`) have no native loops: the enclosing function returns `None`, and the caller interprets
/// the op (data movement moves them as their storage bytes: `DType::storage`).
macro_rules! with_elem {
    ($d:expr, $t:ident => $body:expr) => {
        match $d {
            // Interpreted: the sub-byte integers, the small floats and the complex numbers.
            kiln_ir::DType::I4
            | kiln_ir::DType::U4
            | kiln_ir::DType::I2
            | kiln_ir::DType::U2
            | kiln_ir::DType::Mini(_)
            | kiln_ir::DType::C64
            | kiln_ir::DType::C128 => {
                return None;
            }
            kiln_ir::DType::Pred => {
                type $t = bool;
                $body
            }
            kiln_ir::DType::I8 => {
                type $t = i8;
                $body
            }
            kiln_ir::DType::I32 => {
                type $t = i32;
                $body
            }
            kiln_ir::DType::I64 => {
                type $t = i64;
                $body
            }
            kiln_ir::DType::U32 => {
                type $t = u32;
                $body
            }
            kiln_ir::DType::U8 => {
                type $t = u8;
                $body
            }
            kiln_ir::DType::I16 => {
                type $t = i16;
                $body
            }
            kiln_ir::DType::U16 => {
                type $t = u16;
                $body
            }
            kiln_ir::DType::U64 => {
                type $t = u64;
                $body
            }
            kiln_ir::DType::F16 => {
                type $t = half::f16;
                $body
            }
            kiln_ir::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            kiln_ir::DType::F32 => {
                type $t = f32;
                $body
            }
            kiln_ir::DType::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}
pub(super) use with_elem;

/// `$body` with `$t` the element type of float dtype `$d`; `None` for other dtypes.
macro_rules! with_float {
    ($d:expr, $t:ident => $body:expr) => {
        match $d {
            kiln_ir::DType::F16 => {
                type $t = half::f16;
                Some($body)
            }
            kiln_ir::DType::BF16 => {
                type $t = half::bf16;
                Some($body)
            }
            kiln_ir::DType::F32 => {
                type $t = f32;
                Some($body)
            }
            kiln_ir::DType::F64 => {
                type $t = f64;
                Some($body)
            }
            _ => None,
        }
    };
}
pub(super) use with_float;

/// The threads a large loop is split across: those compiled kernels run on (the thread
/// team, or the thread pool where the team takes no launch), at most 16.
fn threads() -> usize {
    kiln_team::threads()
        .unwrap_or_else(rayon::current_num_threads)
        .min(16)
}

/// `out`'s elements, for chunks of it handed to other threads.
struct Elements<T>(*mut T);

// SAFETY: shared only to hand each thread a chunk of its own (`par_chunks`), and `T: Send`.
unsafe impl<T: Send> Sync for Elements<T> {}

/// The work (about nanoseconds on one core) each thread of a split loop gets at least, about a
/// quarter of a millisecond. The calling thread and the thread team (`kiln-team`, already
/// started, as compiled kernels use it) share the chunks, so a split costs at most waking the
/// team's workers (microseconds), not starting threads; on a busy machine a split loop may
/// still wait for a core. One core does not reach the memory's bandwidth on its own: on a
/// 2-core Xeon VM, `p -= 0.01 * g` over 16 M f32 took 13.1 ms on one thread and 6.6 on two,
/// and over an MLP's parameters (1.8 M f32, in cache) 0.71 and 0.35 ms.
#[cfg(not(test))]
const WORK_PER_THREAD: usize = 1 << 18;
/// Unit tests split far smaller loops, so that every loop's split is checked.
#[cfg(test)]
const WORK_PER_THREAD: usize = 1 << 12;

/// Calls `f(start, chunk)` on consecutive chunks of `out` that together cover it (`start`:
/// the index of the chunk's first element), each chunk a whole number of `unit`s, on up to
/// [`threads`] threads when `work` (for all of `out`, in about nanoseconds) pays for them: on
/// the calling thread and the thread team ([`kiln_team::run`]), or where the team is busy, the
/// first chunk on the calling thread and the others on the thread pool's.
pub(super) fn par_chunks<T: Send>(
    out: &mut [T],
    unit: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let unit = unit.max(1);
    let units = out.len() / unit;
    let parts = (work / WORK_PER_THREAD).min(threads()).min(units).max(1);
    if parts == 1 {
        f(0, out);
        return;
    }
    let per = units.div_ceil(parts) * unit;
    let (len, at) = (out.len(), Elements(out.as_mut_ptr()));
    let chunk = |c: usize| {
        let start = c * per;
        let at = &at;
        // SAFETY: chunk `c` is `out`'s elements from `start`, at most `per` of them; `out`
        // outlives this call and nothing else touches it during it; the team runs each chunk
        // once, so the chunks handed out are disjoint.
        let part = unsafe { std::slice::from_raw_parts_mut(at.0.add(start), per.min(len - start)) };
        f(start, part)
    };
    if kiln_team::run(len.div_ceil(per), &chunk) {
        return;
    }
    let (first, mut rest) = out.split_at_mut(per);
    rayon::in_place_scope(|s| {
        let f = &f;
        let mut start = per;
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at_mut(per.min(rest.len()));
            let len = chunk.len();
            s.spawn(move |_| f(start, chunk));
            start += len;
            rest = tail;
        }
        f(0, first);
    });
}

/// `body()`, compiled for AVX2 (which brings SSE4.1's rounding instructions) as well as for
/// the baseline x86-64 the crate is built for, and run as the CPU allows: the elementwise
/// loops inlined into it vectorize 256 bits wide and round in registers instead of calling the
/// C library. Products and sums stay separate instructions (Rust never fuses them).
#[inline(always)]
pub(super) fn vectorized<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        static AVX2: OnceLock<bool> = OnceLock::new();
        if *AVX2.get_or_init(|| std::arch::is_x86_feature_detected!("avx2")) {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { avx2(body) };
        }
    }
    body()
}

/// A vector of `n` elements written by `f(start, chunk)` on chunks as [`par_chunks`] makes
/// them (`f` must write every element of its chunk), or `None` when the memory cannot be had.
/// The elements are not initialized first: an output is written once.
pub(super) fn par_collect<T: Copy + Send>(
    n: usize,
    unit: usize,
    work: usize,
    f: impl Fn(usize, &mut [MaybeUninit<T>]) + Sync,
) -> Option<Vec<T>> {
    let mut v: Vec<T> = Vec::new();
    v.try_reserve_exact(n).ok()?;
    par_chunks(&mut v.spare_capacity_mut()[..n], unit, work, f);
    // SAFETY: the chunks cover the first `n` elements, and `f` wrote each of its chunk's.
    unsafe { v.set_len(n) };
    Some(v)
}

/// A vector of `n` copies of `x`, or `None` when the memory cannot be had.
pub(super) fn filled<T: Clone>(n: usize, x: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, x);
    Some(v)
}

//! Infinities in the magnitudes of [`crate::accuracy`]. A maximum's or minimum's operand at an
//! infinity counts 0 ([`at_finite`]): it is the result only where the result is that infinity.
//! But an infinite element of a sum whose finite terms pass the accumulator's range may be NaN
//! in a backend (its partial sums overflowing to the other infinity), which a maximum passes
//! on; such an element's magnitude is [`NAN_RISK`], which [`at_finite`] keeps.

use super::accumulator_max;
use crate::ops::eval_op;
use kiln_ir::{Combiner, Literal, Op, TensorType};

/// The magnitude of an infinite element of a sum whose finite terms pass the accumulator's
/// range: finite, so that [`at_finite`] tells it from an infinity's magnitude, and past every
/// range but f64's, so that the comparison leaves alone the element and any result that takes
/// it as its magnitude (a maximum's), as it does a finite sum past the range. The float just
/// below f64's largest: not a value an argument takes (the random programs' special values
/// include f64's largest, whose conversion to f32 is an infinity every backend has), and
/// adding any magnitude below 2^970 leaves it as it is.
pub(super) const NAN_RISK: f64 = f64::from_bits(f64::MAX.to_bits() - 1);

/// Whether `op` sums terms in a backend's accumulator (where the reference sums in f64).
pub(super) fn is_sum(op: &Op) -> bool {
    matches!(
        op,
        Op::DotGeneral { .. }
            | Op::Convolution { .. }
            | Op::Reduce {
                kind: Combiner::Add,
                ..
            }
            | Op::ReduceWindow {
                kind: Combiner::Add,
                ..
            }
            | Op::Scatter {
                kind: Combiner::Add,
                ..
            }
    )
}

/// The magnitudes `mags` of the sum `op`'s result `out` (operand values `r`, magnitudes `m`),
/// with [`NAN_RISK`] where `out` is infinite and the magnitude of its finite terms (the sum of
/// `m` with the infinite operand elements left out, unless themselves [`NAN_RISK`]) passes
/// the accumulator's range (seed 129799: a bf16 convolution beside an input's `-inf`, its
/// products past f32's range).
pub(super) fn mark_nan_risk(
    op: &Op,
    (r, m): (&[&Literal], &[&Literal]),
    out: &Literal,
    ftypes: &[TensorType],
    mags: Literal,
) -> Literal {
    let o = out.to_f64s();
    if !out.dtype().is_float() || !o.iter().any(|v| v.is_infinite()) {
        return mags;
    }
    let finite: Vec<Literal> = r.iter().zip(m).map(|(x, mx)| at_finite(x, mx)).collect();
    let refs: Vec<&Literal> = finite.iter().collect();
    let terms = eval_op(op, &refs, ftypes).remove(0).to_f64s();
    let top = accumulator_max(out.dtype());
    let v: Vec<f64> = mags
        .to_f64s()
        .into_iter()
        .zip(o.iter().zip(terms))
        .map(|(mg, (y, t))| {
            if y.is_infinite() && t > top {
                NAN_RISK
            } else {
                mg
            }
        })
        .collect();
    Literal::from_f64s(mags.ty().clone(), &v).expect("same size")
}

/// The magnitudes `m` of the elements of `x` as an operand of a maximum or minimum: 0 where the
/// element is an infinity, but [`NAN_RISK`] kept. Such an element is the result only where the
/// result is that infinity (whose magnitude is infinite, `|out|`); elsewhere it is not
/// selected, by the reference nor by a backend, whose value there is that infinity or past the
/// dtype's range, unless a sum's partials met both infinities there.
/// So the `-inf` of a mask (`select` before a row's maximum) bounds nothing it does not select.
pub(super) fn at_finite(x: &Literal, m: &Literal) -> Literal {
    if !x.dtype().is_float() {
        return m.clone();
    }
    let v: Vec<f64> = m
        .to_f64s()
        .into_iter()
        .zip(x.to_f64s())
        .map(|(mg, v)| {
            if v.is_infinite() && mg != NAN_RISK {
                0.0
            } else {
                mg
            }
        })
        .collect();
    Literal::from_f64s(m.ty().clone(), &v).expect("same size")
}

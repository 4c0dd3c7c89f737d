//! Eager elementwise arithmetic that needs no compiler: float add, subtract, multiply,
//! divide, maximum, minimum, negate and abs on f32 and f64 run as plain loops the first time
//! an op of a signature is used, so that use costs no compile (an optimizer update step is
//! made of them); an op used again (a training loop) is compiled once, and its kernel, split
//! across threads, runs from then on. Each result is bit for bit the reference interpreter's: the reference
//! computes in f64 and rounds once, and for these operations rounding an f32 operation's exact
//! result once (here) or the f64 result again (there) gives the same value.

use kiln_ir::{Data, Func, Literal, Op, TensorType};
use std::collections::HashSet;
use std::sync::Mutex;

/// Whether `f` (a one-op eager function) is used for the first time in this process: the
/// signatures seen so far are kept by their text.
pub(crate) fn first_use(f: &Func) -> bool {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    SEEN.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(kiln_ir::print_func(f))
}

/// `op` on `lits` computed natively, when it is one of the operations above on f32 or f64
/// operands; `None` otherwise (the caller compiles or interprets it).
pub(crate) fn native(op: &Op, lits: &[&Literal], out: &[TensorType]) -> Option<Literal> {
    let [ty] = out else { return None };
    if lits.iter().any(|l| l.shape() != ty.shape.as_slice()) {
        // Not elementwise over the result's shape (a reduction, a broadcast, ...).
        return None;
    }
    let data = match (lits, lits.first()?.data()) {
        ([_, b], Data::F32(x)) => {
            let Data::F32(y) = b.data() else { return None };
            Data::F32(binary_f32(op, x, y)?)
        }
        ([_, b], Data::F64(x)) => {
            let Data::F64(y) = b.data() else { return None };
            Data::F64(binary_f64(op, x, y)?)
        }
        ([_], Data::F32(x)) => Data::F32(unary_f32(op, x)?),
        ([_], Data::F64(x)) => Data::F64(unary_f64(op, x)?),
        _ => return None,
    };
    Literal::new(ty.clone(), data).ok()
}

macro_rules! float_kernels {
    ($t:ty, $binary:ident, $unary:ident) => {
        fn $binary(op: &Op, x: &[$t], y: &[$t]) -> Option<Vec<$t>> {
            let f: fn($t, $t) -> $t = match op {
                Op::Add {} => |a, b| a + b,
                Op::Subtract {} => |a, b| a - b,
                Op::Multiply {} => |a, b| a * b,
                Op::Divide {} => |a, b| a / b,
                // StableHLO's maximum and minimum: NaN if either is, and +0 above -0.
                Op::Maximum {} => |a, b| {
                    if a.is_nan() || b.is_nan() {
                        <$t>::NAN
                    } else if a == b {
                        if a.is_sign_negative() { b } else { a }
                    } else if a > b {
                        a
                    } else {
                        b
                    }
                },
                Op::Minimum {} => |a, b| {
                    if a.is_nan() || b.is_nan() {
                        <$t>::NAN
                    } else if a == b {
                        if a.is_sign_negative() { a } else { b }
                    } else if a < b {
                        a
                    } else {
                        b
                    }
                },
                _ => return None,
            };
            Some(x.iter().zip(y).map(|(&a, &b)| f(a, b)).collect())
        }

        fn $unary(op: &Op, x: &[$t]) -> Option<Vec<$t>> {
            let f: fn($t) -> $t = match op {
                Op::Negate {} => |a| -a,
                Op::Abs {} => |a| a.abs(),
                _ => return None,
            };
            Some(x.iter().map(|&a| f(a)).collect())
        }
    };
}
float_kernels!(f32, binary_f32, unary_f32);
float_kernels!(f64, binary_f64, unary_f64);

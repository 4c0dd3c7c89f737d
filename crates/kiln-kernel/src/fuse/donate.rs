//! Donation: the kernels that write their result into the buffer of a donated parameter, an
//! elementwise update (or a GEMM's `X - P s` epilogue) reading each element just before it is
//! overwritten.

use super::{Fused, step_reads};
use crate::access::{reads_input, reads_only_own_position};
use crate::ir::{Expr, Kernel, Schedule};
use kiln_ir::{DType, Func, ValueId};

/// Which kernels write their result into the buffer of a donated parameter (`donated[p]` for
/// parameter `p`): per instruction, `Some(q)` for its operand `fused.operands[i][q]`.
///
/// A kernel may when the parameter has its result's type, is not an output, the kernel is its
/// last reader (`steps` as the runtime runs them), and the kernel reads it only at the position
/// it is writing, outside reductions (an elementwise update such as `b - lr * db`): each element
/// is then read once, just before it is overwritten. A GEMM whose epilogue is such an update of
/// the parameter by its product, `X - P s` or `X + P s` with `s` the same everywhere (the SGD
/// step `w - lr * dW`), qualifies too: it runs in update mode (see [`gemm_update`]). Other GEMM
/// epilogues do not, since the product is accumulated in the output buffer before they read
/// their inputs.
pub fn in_place(
    f: &Func,
    fused: &Fused,
    steps: &[crate::Step],
    donated: &[bool],
) -> Vec<Vec<(usize, usize)>> {
    use crate::Step;
    let n = f.insts.len();
    let mut out = vec![Vec::new(); n];
    if !donated.iter().any(|&d| d) {
        return out;
    }
    let mut last: Vec<Option<usize>> = vec![None; f.values.len()];
    for i in 0..n {
        for v in step_reads(f, fused, i) {
            last[v.index()] = Some(i);
        }
    }
    for (&v, _) in f.params.iter().zip(donated).filter(|(_, d)| **d) {
        if f.outputs.contains(&v) {
            continue;
        }
        let Some(i) = last[v.index()] else { continue };
        if steps[i] != Step::Kernel {
            continue;
        }
        let Some(q) = can_update(f, fused, i, v) else {
            continue;
        };
        let k = fused.kernels[i].as_ref().expect("checked by can_update");
        let bodies: Vec<&Expr> = std::iter::once(&k.body)
            .chain(k.extra.iter().map(|x| &x.body))
            .collect();
        let results: Vec<ValueId> = std::iter::once(f.insts[i].results[0])
            .chain(fused.extra[i].iter().copied())
            .collect();
        // A free output of the parameter's type, preferring one computed from it (the update
        // of that parameter).
        let free = |o: usize| {
            f.values[results[o].index()] == f.values[v.index()]
                && !out[i].iter().any(|&(_, taken)| taken == o)
        };
        let choice = (0..results.len())
            .find(|&o| free(o) && reads_input(bodies[o], q))
            .or_else(|| (0..results.len()).find(|&o| free(o)));
        // A GEMM in update mode writes its one result.
        if let Some(o) = choice.filter(|&o| o == 0 || k.schedule == Schedule::Nest) {
            out[i].push((q, o));
        }
    }
    out
}

/// Whether kernel `i` may write a result into the buffer of parameter `v` once it is `v`'s last
/// reader: the operand index `q` it reads `v` as, when it reads `v` through one operand, only at
/// the position it writes (outside reductions, or as the GEMM update `X - P s`), and has a
/// result of `v`'s type. [`in_place`] uses it for the last readers of donated parameters;
/// [`crate::schedule`] runs such kernels after `v`'s other readers.
pub fn can_update(f: &Func, fused: &Fused, i: usize, v: ValueId) -> Option<usize> {
    let k = fused.kernels[i].as_ref()?;
    let ops = &fused.operands[i];
    let q = ops.iter().position(|&o| o == v)?;
    if ops.iter().filter(|&&o| o == v).count() != 1 {
        return None;
    }
    let legal = match k.schedule {
        Schedule::Nest => std::iter::once(&k.body)
            .chain(k.extra.iter().map(|x| &x.body))
            .all(|b| reads_only_own_position(b, q, &k.out)),
        Schedule::Gemm { .. } => gemm_update(k, q).is_some(),
        _ => false,
    };
    let ty = &f.values[v.index()];
    let typed = f.values[f.insts[i].results[0].index()] == *ty
        || (k.schedule == Schedule::Nest
            && fused.extra[i].iter().any(|r| f.values[r.index()] == *ty));
    (legal && typed).then_some(q)
}

/// For a GEMM kernel whose epilogue updates its input `q` by the product, `X - P s`,
/// `X - s P`, `X - P`, or the same with `+` (X read at the output position): `s` (a value that
/// is the same at every position; the constant 1 for a bare `P`) and whether it subtracts.
/// Only for f32 and f64 results, and never for the GEMM's own operands (inputs 0 and 1).
pub fn gemm_update(k: &Kernel, q: usize) -> Option<(Expr, bool)> {
    let Schedule::Gemm {
        epilogue: Some(p),
        chain: None,
        ref conv,
        ..
    } = k.schedule
    else {
        return None;
    };
    // (A convolution's output stored by planes has no update mode.)
    if q < 2
        || !matches!(k.out.dtype, DType::F32 | DType::F64)
        || conv.as_ref().is_some_and(|c| c.planes)
    {
        return None;
    }
    let own = |e: &Expr, j: usize| {
        matches!(e, Expr::Load { input, .. } | Expr::Gather { input, .. } if *input == j)
            && reads_only_own_position(e, j, &k.out)
    };
    // Whether `e` is the same at every position and reads neither X nor the product.
    fn invariant(e: &Expr, p: usize, q: usize) -> bool {
        match e {
            Expr::Const { .. } => true,
            Expr::Load { input, coef, .. } => {
                *input != p && *input != q && coef.iter().all(|&c| c == 0)
            }
            Expr::Gather { input, index, .. } => {
                *input != p && *input != q && index.iter().all(crate::access::is_constant)
            }
            Expr::Op { args, .. } => args.iter().all(|a| invariant(a, p, q)),
            _ => false,
        }
    }
    fn kind(e: &Expr) -> Option<(kiln_ir::OpKind, &Expr, &Expr)> {
        match e {
            Expr::Op {
                op: crate::ir::Ew::Kind(k),
                args,
                ..
            } if args.len() == 2 => Some((*k, &args[0], &args[1])),
            _ => None,
        }
    }
    let scaled = |t: &Expr| -> Option<Expr> {
        if own(t, p) {
            return Some(Expr::Const {
                dtype: k.out.dtype,
                value: 1.0,
            });
        }
        match kind(t)? {
            (kiln_ir::OpKind::Multiply, a, b) if own(a, p) && invariant(b, p, q) => Some(b.clone()),
            (kiln_ir::OpKind::Multiply, a, b) if own(b, p) && invariant(a, p, q) => Some(a.clone()),
            _ => None,
        }
    };
    match kind(&k.body)? {
        (kiln_ir::OpKind::Subtract, x, t) if own(x, q) => Some((scaled(t)?, true)),
        (kiln_ir::OpKind::Add, x, t) if own(x, q) => Some((scaled(t)?, false)),
        (kiln_ir::OpKind::Add, t, x) if own(x, q) => Some((scaled(t)?, false)),
        _ => None,
    }
}

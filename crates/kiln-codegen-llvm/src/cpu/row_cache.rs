//! Row caches: costly per-position values a reduction keeps for the loops after it.

use super::*;

/// The largest row cache, in bytes: a softmax row of 4096 f32 values (16 KiB), which stays in
/// the L1 cache between the reduction that fills it and the loop that reads it.
pub(super) const ROW_CACHE_BYTES: usize = 16 * 1024;

/// What a reduction keeps per position for the expressions after it (see [`row_cache`]).
pub(super) struct RowCache<'e> {
    /// The costly part of the reduction's body, computed at each position of its variable.
    pub(super) part: &'e Expr,
    /// The loop variable along which the expressions compute the same part.
    pub(super) var: usize,
    /// [`value_key`] of the part as the expressions compute it (at `var`).
    pub(super) key: crate::kernel::ValueKey,
    /// Positions: the reduction's trip count, equal to `var`'s.
    pub(super) len: usize,
}

/// Whether `op` is much costlier than a multiply-add (a polynomial or a library call).
pub(super) fn costly_op(op: &Ew) -> bool {
    matches!(
        op,
        Ew::Kind(
            OpKind::Exponential
                | OpKind::ExponentialMinusOne
                | OpKind::Log
                | OpKind::LogPlusOne
                | OpKind::Tanh
                | OpKind::Logistic
                | OpKind::Erf
                | OpKind::Power
        )
    )
}

/// Whether `e` contains a costly operation (see [`costly_op`]).
pub(super) fn costly(e: &Expr) -> bool {
    let mut found = false;
    visit(e, &mut |x| {
        found |= matches!(x, Expr::Op { op, .. } if costly_op(op));
    });
    found
}

/// The row cache for the reduction `r`, hoisted ahead of loop `d` of expressions `bodies`
/// (whose loop variables below the output's rank have trip counts `extents`), if it is worth
/// one: `r` reduces over one variable, and the largest costly float part of its body that reads
/// nothing but that variable and the enclosing loops' variables is also computed by `bodies`
/// with the reduced variable replaced by an inner loop variable of the same trip count. A
/// softmax's sum of exp(x - max) then stores each exp(x - max) in the buffer, and its outputs
/// read it back instead of computing a second exp.
pub(super) fn row_cache<'e>(
    r: &'e Expr,
    bodies: &[&Expr],
    d: usize,
    extents: &[usize],
) -> Option<RowCache<'e>> {
    let Expr::Reduce { vars, body, .. } = r else {
        return None;
    };
    let [(from, len)] = vars.as_slice() else {
        return None;
    };
    let (from, len) = (*from, *len);
    // The body's operations reachable through operations, largest first.
    fn parts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
        if let Expr::Op { args, .. } = e {
            out.push(e);
            args.iter().for_each(|a| parts(a, out));
        }
    }
    let mut candidates = Vec::new();
    parts(body, &mut candidates);
    let mut keys: Option<Vec<crate::kernel::ValueKey>> = None;
    for part in candidates {
        let fv = free_vars(part);
        // Values are kept as they are computed: f64, or f32 for the narrower floats.
        let bytes = if part.dtype() == DType::F64 { 8 } else { 4 };
        if !part.dtype().is_float()
            || len * bytes > ROW_CACHE_BYTES
            || !fv.contains(&from)
            || fv.iter().any(|&v| v != from && v >= d)
            || !costly(part)
        {
            continue;
        }
        // Every value the expressions compute, by key (computed once, when needed).
        let keys = keys.get_or_insert_with(|| {
            let mut ks = Vec::new();
            for b in bodies {
                visit(b, &mut |x| {
                    if matches!(x, Expr::Op { .. }) {
                        ks.push(value_key(x));
                    }
                });
            }
            ks
        });
        for (to, &n) in extents.iter().enumerate().skip(d) {
            if n != len || fv.contains(&to) {
                continue;
            }
            let key = value_key(&rename_var(part, from, to));
            if keys.contains(&key) {
                return Some(RowCache {
                    part,
                    var: to,
                    key,
                    len,
                });
            }
        }
    }
    None
}

/// What the emitter keeps in row caches in kernel `k` (see [`row_cache`]), one line per
/// cached reduction, for the fusion dump.
pub(super) fn row_cache_notes(k: &Kernel, cpu: &CpuOptions) -> Vec<String> {
    if !cpu.row_caches {
        return Vec::new();
    }
    let bodies: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .collect();
    // Where the emitter hoists each reduction: ahead of the first loop inside all its free
    // variables, or, in a GEMM's row epilogue, ahead of the loop over a row's columns.
    let split = match k.schedule {
        Schedule::Gemm {
            batch,
            m,
            n,
            epilogue: Some(_),
            ..
        } => crate::fuse::row_split(&k.out.shape, batch * m, n),
        Schedule::Nest => None,
        _ => return Vec::new(),
    };
    let mut seen: Vec<crate::kernel::ValueKey> = Vec::new();
    let mut notes = Vec::new();
    for r in bodies.iter().flat_map(|b| hoistable_reduces(b)) {
        let d = match split {
            Some(d) => d,
            None => free_vars(r).last().map_or(0, |&v| v + 1),
        };
        let key = value_key(r);
        if seen.contains(&key) || free_vars(r).iter().any(|&v| v >= d) {
            continue;
        }
        seen.push(key);
        if let (Expr::Reduce { kind, .. }, Some(plan)) = (r, row_cache(r, &bodies, d, &k.out.shape))
        {
            let op = match plan.part {
                Expr::Op {
                    op: Ew::Kind(op), ..
                } => op.to_string(),
                _ => "costly part".to_string(),
            };
            notes.push(format!(
                "row cache: the {kind} reduction over {} positions keeps its {op} of each for the outputs along dimension {}",
                plan.len, plan.var
            ));
        }
    }
    notes
}

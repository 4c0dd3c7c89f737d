//! Products whose readers leave a triangle of them unused: a causal attention's scores `S = Q
//! Kᵀ`, stored for the softmax (and, in a training step, for its recomputation in the
//! backward pass), are read by each reader only inside a `select(col <= row, S * s, -inf)`, so
//! the scores above the diagonal change no result. Fusion gives such a GEMM an
//! [`Unread`] naming them ([`crate::unread`] finds them: every reader of a product stored by
//! rows, or the product's own epilogue), and the target's tiles may leave them uncomputed.
//! Unlike [`super::zero_blocks`]'s steps, nothing is checked at run time: an element no
//! reader uses may hold anything, so leaving it out is exact whatever the operands hold.

use super::Fused;
use crate::ir::{Schedule, Unread};
use crate::unread::{Region, unread_by_epilogue, unread_by_readers};
use kiln_ir::Func;
use std::collections::BTreeSet;

/// Gives each GEMM kernel of `out` whose product's readers leave a region of it unused its
/// [`Unread`], where the target's tiles leave such elements out (`on`:
/// [`crate::target::FusionLimits::unread_blocks`]).
pub(super) fn mark_unread_blocks(f: &Func, out: &mut Fused, on: bool) {
    if !on {
        return;
    }
    for u in 0..out.kernels.len() {
        let Some(k) = &out.kernels[u] else {
            continue;
        };
        let Schedule::Gemm {
            epilogue,
            batch,
            m,
            n,
            conv: None,
            chain: None,
            store: None,
            unread: None,
            ..
        } = k.schedule
        else {
            continue;
        };
        if !k.extra.is_empty() || k.out.numel() != batch * m * n {
            continue;
        }
        let regions = match epilogue {
            None => unread_by_readers(f, out, f.insts[u].results[0], (m, n)),
            Some(_) => unread_by_epilogue(f, &out.operands[u], k),
        };
        let Some(at) = regions.as_ref().and_then(unit_region) else {
            continue;
        };
        if let Some(k) = out.kernels[u].as_mut()
            && let Schedule::Gemm { unread, .. } = &mut k.schedule
        {
            *unread = Some(Box::new(Unread { at }));
        }
    }
}

/// The first region of `regions` whose row and column coefficients are 1 or -1 (the tiles'
/// triangles).
fn unit_region(regions: &BTreeSet<Region>) -> Option<Region> {
    regions
        .iter()
        .copied()
        .find(|&(a, b, _)| a.abs() == 1 && b.abs() == 1)
}

//! Contraction steps a product may leave out: where one operand of a GEMM is the result of a
//! kernel that selects a constant over a triangle of its matrices (a causal mask: attention's
//! probabilities, `exp(-inf - max) / sum`, and their gradient, `select(mask, dP', 0) * s`),
//! the product's tiles need not multiply those zeros. Which kernel's result that is, and where,
//! is read from the producer's body here ([`ZeroBlocks`] on the GEMM's schedule); whether the
//! steps are really zeros, and the other operand's same steps finite (`0 * inf` and `0 * NaN`
//! are NaN, which the full product would carry into its result), is checked at run time on the
//! packed operands by the emitter, so leaving them out changes no bit of the result.
//!
//! The forward product of a causal attention chained to its softmax skips its masked blocks on
//! its own ([`crate::ir::Chain::masked`]); this covers the products of a training step, where
//! the probabilities are kept for the backward pass and each product is a kernel of its own.

use super::Fused;
use super::chain::constant_of;
use crate::ir::{Expr, Schedule, Visitor, ZeroBlocks};
use kiln_ir::Func;

/// Gives each GEMM kernel of `out` whose A or B is such a masked result its [`ZeroBlocks`]
/// (A first), where the target's tiles leave steps out (`on`:
/// [`crate::target::FusionLimits::zero_steps`]).
pub(super) fn mark_zero_blocks(f: &Func, out: &mut Fused, on: bool) {
    if !on {
        return;
    }
    // The instruction whose first result each value is.
    let mut producer = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        if let Some(r) = inst.results.first() {
            producer[r.index()] = Some(i);
        }
    }
    for u in 0..out.kernels.len() {
        let Some(k) = &out.kernels[u] else {
            continue;
        };
        let Schedule::Gemm {
            batch,
            m,
            n,
            k: kk,
            conv: None,
            chain: None,
            a_trans,
            b_trans,
            ref strides,
            zero: None,
            ..
        } = k.schedule
        else {
            continue;
        };
        let found = (0..2).find_map(|o| {
            // The stored matrix's rows and columns, and whether its rows are the steps.
            let (dims, steps_are_rows) = match o {
                0 if a_trans => ((kk, m), true),
                0 => ((m, kk), false),
                _ if b_trans => ((n, kk), false),
                _ => ((kk, n), true),
            };
            if strides[o].is_some() {
                return None;
            }
            let v = *out.operands[u].get(o)?;
            let p = producer[v.index()]?;
            let (a, b, c) = masked_triangle(f, out, p, (batch, dims))?;
            // `step * alpha + x * beta + c`, from `col * a + row * b + c`.
            let (alpha, beta) = if steps_are_rows { (b, a) } else { (a, b) };
            (alpha.abs() == 1 && beta.abs() == 1).then_some(ZeroBlocks {
                operand: o,
                at: (alpha, beta, c),
            })
        });
        if let (Some(z), Some(k)) = (found, out.kernels[u].as_mut())
            && let Schedule::Gemm { zero, .. } = &mut k.schedule
        {
            *zero = Some(z);
        }
    }
}

/// Where the result of instruction `p`'s kernel, `batch` matrices of `dims` (rows, columns),
/// is a constant by a causal mask: its loop nest's or GEMM epilogue's body selects an arm that
/// does not depend on the position wherever `col * a + row * b + c > 0` (`col` and `row` its
/// last two loop variables), as `(a, b, c)`.
fn masked_triangle(
    f: &Func,
    out: &Fused,
    p: usize,
    (batch, dims): (usize, (usize, usize)),
) -> Option<(i64, i64, i64)> {
    if out.inlined[p] || out.merged_into[p].is_some() {
        return None;
    }
    let pk = out.kernels[p].as_ref()?;
    match pk.schedule {
        Schedule::Nest
        | Schedule::Gemm {
            epilogue: Some(_), ..
        } => {}
        _ => return None,
    }
    let rank = pk.out.rank();
    if rank < 2
        || (pk.out.shape[rank - 2], pk.out.shape[rank - 1]) != dims
        || pk.out.numel() != batch * dims.0 * dims.1
        || dims.0 >= 1 << 30
        || dims.1 >= 1 << 30
    {
        return None;
    }
    let value = constant_of(f, &out.operands[p]);
    struct Selects<'v> {
        vars: (usize, usize),
        value: &'v dyn Fn(&Expr) -> Option<f64>,
        found: Option<(i64, i64, i64)>,
    }
    impl<'e> Visitor<'e> for Selects<'_> {
        fn expr(&mut self, e: &'e Expr) {
            if self.found.is_some() {
                return;
            }
            self.found = crate::pattern::constant_arm_where(e, self.vars, self.value);
            if self.found.is_none() {
                e.for_each_child(self);
            }
        }
    }
    let mut s = Selects {
        vars: (rank - 1, rank - 2),
        value: &value,
        found: None,
    };
    s.expr(&pk.body);
    s.found
}

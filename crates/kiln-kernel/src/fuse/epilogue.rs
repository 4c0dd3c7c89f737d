//! GEMM epilogues: the elementwise or row-reducing user of a matrix product runs inside the
//! GEMM, on each block of the product while it is in cache.

use super::chain::{chain_reader, constant_of, half_softmax_logits, online_softmax};
use super::{Fused, FusionDecision};
use crate::access::{reads_input, reads_only_own_position, reads_own_position_or_row};
use crate::ir::{Kernel, Schedule};
use crate::pattern::hoistable_reduces;
use crate::rewrite::map_inputs;
use crate::target::FusionLimits;
use kiln_ir::{DType, Func};

/// Whether GEMM kernel `k`'s epilogue reduces over rows of the product (a softmax of the
/// scores): it then needs blocks of whole rows, each row's reductions computed before its
/// elements are overwritten.
pub fn row_epilogue(k: &Kernel) -> bool {
    match k.schedule {
        Schedule::Gemm {
            epilogue: Some(p), ..
        } => hoistable_reduces(&k.body).iter().any(|r| reads_input(r, p)),
        _ => false,
    }
}

/// Runs users of matrix products inside the GEMM: where a product's only user is a loop-nest
/// kernel over the same type that reads it only at its own position (a bias, an activation, an
/// SGD update), or also in reductions over the row it writes (a softmax, for products at most
/// [`FusionLimits::row_epilogue`] columns wide), the user's kernel becomes the GEMM with the user's body as
/// epilogue, and the product has no buffer of its own: each block of the product is
/// transformed while it is in cache.
pub(super) fn fuse_gemm_epilogues(
    f: &Func,
    producer: &[Option<usize>],
    out: &mut Fused,
    chains: bool,
    limits: &FusionLimits,
) {
    for u in 0..f.insts.len() {
        let Some(uk) = &out.kernels[u] else { continue };
        if out.inlined[u] || uk.schedule != Schedule::Nest {
            continue;
        }
        let found = out.operands[u].iter().enumerate().find_map(|(j, v)| {
            let p = producer[v.index()]?;
            let pk = out.kernels[p].as_ref()?;
            let Schedule::Gemm {
                epilogue: None,
                batch,
                m,
                n,
                k,
                ref conv,
                ..
            } = pk.schedule
            else {
                return None;
            };
            // The user must be the only kernel (after inlining) that reads the product.
            let only_reader = (0..f.insts.len())
                .filter(|&i| !out.inlined[i] && out.operands[i].contains(v))
                .all(|i| i == u);
            // A convolution's output stored by planes takes elementwise epilogues over its own
            // shape (see `emit_epilogue`); other products, over their rows and columns.
            let planes = conv.as_ref().is_some_and(|c| c.planes);
            let layout_ok = |split: usize| {
                reads_only_own_position(&uk.body, j, &uk.out)
                    || ((n <= limits.row_epilogue
                        || (chains
                            && conv.is_none()
                            && (1..=limits.chain_k).contains(&k)
                            // A row epilogue (whole rows per block) for certain.
                            && hoistable_reduces(&uk.body).iter().any(|r| reads_input(r, j))
                            && chain_reader(f, out, u, (batch, m, n)).is_some()
                            // Longer rows than a block can hold whole: a softmax, online.
                            && (n <= limits.chain_row
                                || online_softmax(
                                    &uk.body,
                                    j,
                                    &uk.out,
                                    &constant_of(f, &out.operands[u]),
                                )
                                .is_some())))
                        && reads_own_position_or_row(&uk.body, j, &uk.out, split))
            };
            // A product of bf16 or f16 operands with an f32 result (kept only for a GPU's
            // tensor cores, `canon::widen_dots`) takes an elementwise epilogue of another
            // dtype (the conversion to bf16 that a bf16 product becomes): the GPU runs it in
            // the product's launch, on the accumulators, so the product needs no buffer of
            // its dtype. Any other product's epilogue keeps its dtype (the CPU writes it in
            // place of the product).
            let operand = |i: usize| out.operands[p].get(i).map(|x| f.values[x.index()].dtype);
            let tensor_cores = pk.out.dtype == DType::F32
                && operand(0) == operand(1)
                && matches!(operand(0), Some(DType::BF16 | DType::F16));
            let converts = pk.out.dtype != uk.out.dtype;
            // A softmax in that dtype of the scores that a chained product of the same
            // operand type reads (attention traced in bf16 or f16): it chains, online, and
            // the GPU runs it on the tensor cores.
            let half_chain = tensor_cores
                && converts
                && chains
                && conv.is_none()
                && (1..=limits.chain_k).contains(&k)
                && operand(0) == Some(uk.out.dtype)
                && hoistable_reduces(&uk.body)
                    .iter()
                    .any(|r| reads_input(r, j))
                && chain_reader(f, out, u, (batch, m, n)).is_some()
                && half_softmax_logits(&uk.body, j, &uk.out, &constant_of(f, &out.operands[u]))
                    .is_some();
            let ok = only_reader
                // One output: not a fold's several results.
                && uk.extra.is_empty()
                && !f.outputs.contains(v)
                // Same elements: the user's type may be a reshape of the product's.
                && (!converts
                    || half_chain
                    || (tensor_cores
                        && conv.is_none()
                        && reads_only_own_position(&uk.body, j, &uk.out)))
                && pk.out.numel() == uk.out.numel()
                && if planes {
                    pk.out.shape == uk.out.shape && reads_only_own_position(&uk.body, j, &uk.out)
                } else {
                    row_split(&uk.out.shape, batch * m, n).is_some_and(|s| {
                        layout_ok(s)
                            || (half_chain && reads_own_position_or_row(&uk.body, j, &uk.out, s))
                    })
                };
            ok.then_some((j, p))
        });
        let Some((j, p)) = found else { continue };
        let pk = out.kernels[p].clone().expect("checked");
        let uk = out.kernels[u].clone().expect("checked");
        // Inputs: the product's operands, then the user's others; the product itself is read
        // after them.
        let mut inputs = out.operands[p].clone();
        let mut map = vec![0; out.operands[u].len()];
        for (i, v) in out.operands[u].iter().enumerate() {
            if i != j {
                map[i] = inputs.len();
                inputs.push(*v);
            }
        }
        let product = inputs.len();
        map[j] = product;
        let body = map_inputs(&uk.body, &|i| map[i]);
        let Schedule::Gemm {
            batch,
            m,
            n,
            k,
            conv,
            a_trans,
            b_trans,
            strides,
            store,
            ..
        } = pk.schedule
        else {
            unreachable!("checked above")
        };
        out.kernels[u] = Some(Kernel {
            schedule: Schedule::Gemm {
                epilogue: Some(product),
                batch,
                m,
                n,
                k,
                conv,
                a_trans,
                b_trans,
                chain: None,
                strides,
                store,
                zero: None,
                unread: None,
            },
            out: uk.out.clone(),
            vars: uk.vars,
            body,
            extra: Vec::new(),
        });
        out.operands[u] = inputs;
        let absorbed = std::mem::take(&mut out.members[p]);
        out.members[u].extend(absorbed);
        out.members[u].sort_unstable();
        out.inlined[p] = true;
        out.decisions[p] = FusionDecision::EpilogueOf(u);
        out.decisions[u] = FusionDecision::Epilogue(p);
    }
}

/// The first `s` such that `shape[..s]` makes `rows` and `shape[s..]` makes `cols`.
pub fn row_split(shape: &[usize], rows: usize, cols: usize) -> Option<usize> {
    (0..=shape.len()).find(|&s| {
        shape[..s].iter().product::<usize>() == rows && shape[s..].iter().product::<usize>() == cols
    })
}

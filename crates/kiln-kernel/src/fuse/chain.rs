//! Chained products: a GEMM whose row epilogue's result only a second product reads runs that
//! product on each block of its rows (attention's probabilities times V), the softmax online.

use super::epilogue::row_epilogue;
use super::{Fused, FusionDecision};
use crate::access::free_vars;
use crate::ir::{Expr, Schedule};
use crate::rewrite::map_inputs;
use crate::target::FusionLimits;
use kiln_ir::{DType, Func, ValueId, strides};

/// Chains matrix products (see [`crate::ir::Chain`]): where a GEMM kernel with a row
/// epilogue (a softmax of attention scores) of at most [`FusionLimits::chain_k`] contraction steps (one
/// contraction block, so each block of rows is final after one pass) has as its only reader a
/// plain matrix product that takes it, stored by rows, as its A with the same batches and rows
/// (the probabilities times V), that product runs inside the first kernel on each block of
/// rows as soon as its epilogue is done, and the epilogue's result is never stored whole.
pub(super) fn fuse_gemm_chains(f: &Func, out: &mut Fused, chains: bool, limits: &FusionLimits) {
    if !chains {
        return;
    }
    for p in 0..f.insts.len() {
        let Some(pk) = &out.kernels[p] else { continue };
        let Schedule::Gemm {
            epilogue: Some(_),
            batch,
            m,
            n,
            k,
            conv: None,
            chain: None,
            ..
        } = pk.schedule
        else {
            continue;
        };
        if !(1..=limits.chain_k).contains(&k)
            || !pk.extra.is_empty()
            || !row_epilogue(pk)
            || out.inlined[p]
        {
            continue;
        }
        let Some(u) = chain_reader(f, out, p, (batch, m, n)) else {
            continue;
        };
        let uk = out.kernels[u].as_ref().expect("checked by chain_reader");
        let Schedule::Gemm {
            n: n2,
            b_trans: b2_trans,
            strides: [_, ref b2_strides],
            ..
        } = uk.schedule
        else {
            unreachable!("checked by chain_reader")
        };
        let b = out.operands[u][1];
        let chain = crate::ir::Chain {
            n: n2,
            b: 0,
            b_trans: b2_trans,
            b_strides: b2_strides.clone(),
            out: uk.out.clone(),
            online: None,
            masked: None,
        };
        let half = half_scores(pk);
        let mut pk = pk.clone();
        let Schedule::Gemm {
            epilogue: Some(product),
            chain: slot,
            ..
        } = &mut pk.schedule
        else {
            unreachable!("checked above")
        };
        // B2 takes the product's slot; the product is read after it.
        let b_slot = *product;
        *product += 1;
        let product = *product;
        pk.body = map_inputs(&pk.body, &|i| if i == b_slot { b_slot + 1 } else { i });
        // A softmax runs online, over blocks of columns; another row epilogue over whole rows,
        // if they are short enough. Measured on attention (one process, alternating calls, the
        // online softmax against whole rows): 8 x 8 heads of 512 queries and keys, width 64,
        // 19 of 20 pairs, 24.4 -> 23.6 ms; 8 heads of 1024 queries, 4096 keys: 6 of 6, 46.1 ->
        // 45.2 ms; 16384 keys: 6 of 6, 200 -> 179 ms.
        let operands: Vec<ValueId> = out.operands[p].iter().chain([&b]).copied().collect();
        let value = constant_of(f, &operands);
        // A softmax in bf16 or f16 of a tensor-core product's f32 scores chains only online
        // (the GPU runs it on the tensor cores, `gpu/map/attention_mma.rs`).
        let online = if half {
            half_softmax_logits(&pk.body, product, &pk.out, &value)
        } else {
            online_softmax(&pk.body, product, &pk.out, &value)
        };
        if online.is_none() && (half || n > limits.chain_row) {
            continue;
        }
        // Blocks a causal mask leaves nothing of are skipped (positions well inside i32).
        let rank = pk.out.rank();
        let masked = online.as_ref().filter(|_| rank >= 2).and_then(|h| {
            let small = pk.out.shape[rank - 2..].iter().all(|&d| d < 1 << 30);
            small
                .then(|| crate::pattern::masked_where(h, (rank - 1, rank - 2), &value))
                .flatten()
        });
        *slot = Some(Box::new(crate::ir::Chain {
            b: b_slot,
            online,
            masked,
            ..chain
        }));
        let mut inputs = out.operands[p].clone();
        inputs.push(b);
        out.kernels[u] = Some(pk);
        out.operands[u] = inputs;
        let absorbed = std::mem::take(&mut out.members[p]);
        out.members[u].extend(absorbed);
        out.members[u].sort_unstable();
        out.inlined[p] = true;
        out.decisions[p] = FusionDecision::ChainedInto(u);
        out.decisions[u] = FusionDecision::Chained(p);
    }
}

/// The logits `h` when a GEMM epilogue's `body` (reading the product as input `j`, over `out`)
/// is a softmax of them along its last dimension, `exp(h - max h) / Σ exp(h - max h)` (the
/// maximum through a stop-gradient's bit-cast round trips, starting from -inf; the sum from
/// 0), `h` reading the product only at its own position: what a chained product's online
/// softmax computes (see [`crate::ir::Chain::online`]). `value` gives the value of an
/// expression that is a constant (the reductions' starting values), where it is one.
pub fn online_softmax(
    body: &Expr,
    j: usize,
    out: &kiln_ir::TensorType,
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<Expr> {
    if !matches!(out.dtype, DType::F32 | DType::F64) {
        return None;
    }
    softmax_logits(body, j, out, value)
}

/// Whether GEMM kernel `k` is a tensor-core product (bf16 or f16 operands, an f32 product,
/// kept for a GPU by `canon::widen_dots`) whose epilogue computes in its operands' dtype:
/// the softmax of attention's scores traced in bf16 or f16.
pub(super) fn half_scores(k: &crate::ir::Kernel) -> bool {
    matches!(k.out.dtype, DType::BF16 | DType::F16) && k.product_dtype() == DType::F32
}

/// The logits of a softmax computed in bf16 or f16 (a [`half_scores`] kernel's epilogue), as
/// [`online_softmax`] finds them, its roundings to that dtype between the ops
/// ([`crate::ir::Ew::Narrow`]) left out (the chain computes the softmax in f32), and a
/// stop-gradient's exact round trip of the maximum through f32's bits too.
pub(super) fn half_softmax_logits(
    body: &Expr,
    j: usize,
    out: &kiln_ir::TensorType,
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<Expr> {
    struct Strip;
    impl crate::ir::Rewriter for Strip {
        fn expr(&mut self, e: &Expr) -> Expr {
            match e {
                Expr::Op {
                    op: crate::ir::Ew::Narrow,
                    args,
                    ..
                } if args.len() == 1 => self.expr(&args[0]),
                // A stop-gradient's round trip through f32's bits, `convert(bitcast(bitcast(
                // convert(x))))` back to `x`'s dtype: `x` itself (every conversion exact).
                Expr::Op {
                    op: crate::ir::Ew::Convert,
                    dtype,
                    args,
                } if args.len() == 1 => match &args[0] {
                    Expr::Op {
                        op: crate::ir::Ew::Bitcast,
                        dtype: wide,
                        args: bits,
                    } if matches!(&bits[..], [Expr::Op {
                        op: crate::ir::Ew::Bitcast,
                        args: inner,
                        ..
                    }] if matches!(&inner[..], [Expr::Op {
                        op: crate::ir::Ew::Convert,
                        dtype: widened,
                        args: x,
                    }] if widened == wide && x.len() == 1 && x[0].dtype() == *dtype)) =>
                    {
                        let Expr::Op { args: inner, .. } = &bits[0] else {
                            unreachable!("matched above")
                        };
                        let Expr::Op { args: x, .. } = &inner[0] else {
                            unreachable!("matched above")
                        };
                        self.expr(&x[0])
                    }
                    _ => e.map_children(self),
                },
                _ => e.map_children(self),
            }
        }
    }
    use crate::ir::Rewriter;
    softmax_logits(&Strip.expr(body), j, out, value)
}

/// [`online_softmax`]'s logits of a softmax in any float dtype.
fn softmax_logits(
    body: &Expr,
    j: usize,
    out: &kiln_ir::TensorType,
    value: &dyn Fn(&Expr) -> Option<f64>,
) -> Option<Expr> {
    use crate::ir::Ew;
    use kiln_ir::OpKind;
    let col = out.rank().checked_sub(1)?;
    let n = out.shape[col];
    // `exp(h - max_v h[v/col])`, with `col` the position's column variable: `h`.
    let exp_from_max = |e: &Expr, col: usize| -> Option<Expr> {
        let Expr::Op {
            op: Ew::Kind(OpKind::Exponential),
            args,
            ..
        } = e
        else {
            return None;
        };
        let (h, m) = crate::pattern::minus_max(&args[0])?;
        let Expr::Reduce {
            init, vars, body, ..
        } = m
        else {
            return None;
        };
        let [(v, len)] = vars[..] else {
            return None;
        };
        (len == n
            && value(init) == Some(f64::NEG_INFINITY)
            && !free_vars(m).contains(&col)
            && crate::rewrite::rename_var(body, v, col) == *h)
            .then(|| h.clone())
    };
    let Expr::Op {
        op: Ew::Kind(OpKind::Divide),
        args,
        ..
    } = body
    else {
        return None;
    };
    let h = exp_from_max(&args[0], col)?;
    let Expr::Reduce {
        kind: kiln_ir::Combiner::Add,
        init,
        vars,
        body: terms,
        ..
    } = &args[1]
    else {
        return None;
    };
    let [(u, len)] = vars[..] else {
        return None;
    };
    let own: Vec<i64> = strides(&out.shape).iter().map(|&s| s as i64).collect();
    (len == n
        && value(init) == Some(0.0)
        && exp_from_max(terms, u)? == crate::rewrite::rename_var(&h, col, u)
        && free_vars(&h).iter().all(|&v| v < out.rank())
        && crate::rewrite::reindex_input(&h, j, (&own, &own), &out.shape).is_some())
    .then_some(h)
}

/// The value of an expression of a kernel reading `operands` when it is a constant: a constant
/// expression, or a read of a scalar constant (or a constant whose elements are all equal).
pub(crate) fn constant_of<'a>(
    f: &'a Func,
    operands: &'a [ValueId],
) -> impl Fn(&Expr) -> Option<f64> + 'a {
    move |e| match e {
        Expr::Const { value, .. } => Some(*value),
        Expr::Load { input, .. } | Expr::Gather { input, .. } => {
            let v = operands.get(*input)?;
            let inst = f.insts.iter().find(|i| i.results.contains(v))?;
            let kiln_ir::Op::Constant { value } = &inst.op else {
                return None;
            };
            let xs = value.to_f64s();
            let first = *xs.first()?;
            xs.iter()
                .all(|x| x.to_bits() == first.to_bits())
                .then_some(first)
        }
        _ => None,
    }
}

/// The product that can run chained to instruction `p`'s GEMM kernel (see
/// [`fuse_gemm_chains`]), whose result is a `[batch, m, n]` matrix: the only kernel reading
/// `p`'s result, a plain matrix product (no epilogue, not a convolution's) that takes it as its
/// A, stored by rows, with the same batches and rows and a contraction over its `n` columns, in
/// the same element type; and `p`'s result is not a function output.
pub(super) fn chain_reader(
    f: &Func,
    out: &Fused,
    p: usize,
    (batch, m, n): (usize, usize, usize),
) -> Option<usize> {
    let a = f.insts[p].results[0];
    if f.outputs.contains(&a) {
        return None;
    }
    let mut readers =
        (0..f.insts.len()).filter(|&i| !out.inlined[i] && out.operands[i].contains(&a));
    let u = readers.next()?;
    if readers.next().is_some() {
        return None;
    }
    let uk = out.kernels[u].as_ref()?;
    let dtype = f.values[a.index()].dtype;
    // A product of bf16 or f16 operands kept in f32 for a GPU's tensor cores
    // (`canon::widen_dots`), as it is or with the conversion of its result back to their dtype
    // as its epilogue.
    let operand = |i: usize| out.operands[u].get(i).map(|x| f.values[x.index()].dtype);
    let half = matches!(dtype, DType::BF16 | DType::F16)
        && operand(0) == Some(dtype)
        && operand(1) == Some(dtype)
        && uk.product_dtype() == DType::F32;
    let epilogue_ok = match uk.schedule {
        // Kept in f32 for the tensor cores, its result must become its dtype again and
        // nothing else (the conversion is then its epilogue, as `fuse_gemm_epilogues` makes
        // it, before the chains are made).
        Schedule::Gemm { epilogue: None, .. } if half && uk.out.dtype != dtype => {
            converted_back(f, out, u, dtype)
        }
        Schedule::Gemm { epilogue: None, .. } => true,
        Schedule::Gemm {
            epilogue: Some(e), ..
        } => half && uk.out.dtype == dtype && converts_own(&uk.body, e, &uk.out),
        _ => false,
    };
    let ok = epilogue_ok
        && matches!(
            uk.schedule,
            Schedule::Gemm {
                batch: b2,
                m: m2,
                k: k2,
                conv: None,
                a_trans: false,
                chain: None,
                strides: [None, _],
                ..
            } if b2 == batch && m2 == m && k2 == n
        )
        && uk.extra.is_empty()
        && out.operands[u].len() == 2
        && out.operands[u][0] == a
        && out.operands[u][1] != a
        && (dtype == uk.out.dtype || half);
    ok.then_some(u)
}

/// Whether instruction `u`'s result is read by one kernel alone, a loop nest that converts
/// it to `dtype` at each position and does nothing else, and is no function output.
fn converted_back(f: &Func, out: &Fused, u: usize, dtype: DType) -> bool {
    let r = f.insts[u].results[0];
    if f.outputs.contains(&r) {
        return false;
    }
    let mut readers =
        (0..f.insts.len()).filter(|&i| !out.inlined[i] && out.operands[i].contains(&r));
    let (Some(c), None) = (readers.next(), readers.next()) else {
        return false;
    };
    let Some(ck) = out.kernels[c].as_ref() else {
        return false;
    };
    let Some(j) = out.operands[c].iter().position(|&v| v == r) else {
        return false;
    };
    ck.schedule == Schedule::Nest
        && ck.out.dtype == dtype
        && ck.extra.is_empty()
        && converts_own(&ck.body, j, &ck.out)
}

/// Whether `body` is the conversion of input `e` read at its own position of `out`, and
/// nothing else.
fn converts_own(body: &Expr, e: usize, out: &kiln_ir::TensorType) -> bool {
    matches!(
        body,
        Expr::Op {
            op: crate::ir::Ew::Convert,
            args,
            ..
        } if matches!(args[..], [Expr::Load { input, .. }] if input == e)
    ) && crate::access::reads_only_own_position(body, e, out)
}

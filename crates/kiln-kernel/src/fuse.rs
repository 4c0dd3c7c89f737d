//! Loop fusion: producers inlined into their consumers' loop nests.
//!
//! A kernel's body reads its inputs through index expressions of its loop variables. When an
//! instruction's kernel is a loop nest (elementwise ops, broadcasts, transposes, slices,
//! reshapes, pads, concatenations, iotas, converts, selects, reductions, ...), its body can be
//! evaluated at any index instead of being stored and loaded back: every load of its
//! value in a consumer is replaced by the producer's body with the producer's loop variables
//! replaced by the consumer's index expressions. An instruction is inlined when:
//!
//! - it is not a function output, and every user is itself a loop-nest kernel (GEMM, scatter
//!   and select-and-scatter kernels read whole buffers);
//! - if it is a reduction, it has one user, which reads each of its elements once and has no
//!   reduction of its own: the reduction then runs inside the user's loop nest, followed by the
//!   user's elementwise epilogue (`sum / n`, `rsqrt(var + eps)`), with loop variables of its
//!   own;
//! - each user reads each of its elements about once, or the body is cheap enough to
//!   recompute where a user reads it many times (a broadcast, a reduction over it);
//! - the fused body stays small (compile time).
//!
//! Chains fuse transitively (producers are processed first), and a value used by several
//! consumers is recomputed in each, trading arithmetic for memory traffic, which is what
//! bounds these kernels. Inlining never creates cycles: a consumer only absorbs instructions
//! that precede it.

use crate::access::{free_vars, reads_input, reads_only_own_position, reads_own_position_or_row};
use crate::ir::{Cond, Expr, Idx, Kernel, Schedule, visit};
use crate::pattern::hoistable_reduces;
use crate::rewrite::map_inputs;
use kiln_ir::{DType, Func, ValueId, strides};

mod merge;

/// Largest body (in expression nodes) a fused kernel may grow to.
const MAX_NODES: usize = 400;
/// Largest total of the bodies of a multi-output kernel (its outputs often repeat the same
/// inlined producers, which the emitter computes once).
const MAX_MERGED_NODES: usize = 2 * MAX_NODES;
/// Widest product (columns) whose epilogue may reduce over its rows: the GEMM then packs
/// blocks of B that hold whole rows (see [`row_epilogue`]).
const MAX_ROW_EPILOGUE: usize = 2048;
/// Longest contraction of a GEMM whose epilogue's result a chained product reads (see
/// [`fuse_gemm_chains`]): one contraction block on every target.
const MAX_CHAIN_K: usize = 256;
/// Widest product whose epilogue may reduce over its rows when a chained product reads the
/// result and the epilogue is not a softmax (which runs online, over blocks of columns, for any
/// width: see [`crate::ir::Chain::online`]): the blocks of rows are then as few as one
/// tile's, so the epilogue's result takes `O(rows x columns)` memory for one block instead of
/// the whole matrix (B's packed blocks take one contraction block of whole rows).
const MAX_CHAIN_ROW: usize = 16384;
/// Largest arithmetic cost of a producer recomputed for every read of a user that reads each
/// of its elements more than once.
const CHEAP: usize = 3;

/// The fused kernels of a function.
#[derive(Clone, Debug)]
pub struct Fused {
    /// Per instruction: its kernel with inlined producers (`None` for an instruction without
    /// a kernel, or one inlined into all its users).
    pub kernels: Vec<Option<Kernel>>,
    /// Per instruction: the values whose buffers its kernel reads, in input order.
    pub operands: Vec<Vec<ValueId>>,
    /// Per instruction: whether it is computed inside its users' kernels.
    pub inlined: Vec<bool>,
    /// Per instruction: the instructions its kernel computes (itself and what it inlined).
    pub members: Vec<Vec<usize>>,
    /// Per instruction: why it got a kernel of its own or was computed inside its users.
    pub decisions: Vec<String>,
    /// Per instruction: the later instruction whose kernel also writes its result
    /// (multi-output fusion); its own kernel is then `None`.
    pub merged_into: Vec<Option<usize>>,
    /// Per instruction: the results of the instructions merged into its kernel, in the order
    /// of the kernel's [`Kernel::extra`] outputs.
    pub extra: Vec<Vec<ValueId>>,
}

/// The per-instruction kernels `ks` of `f` as they are: nothing inlined.
pub fn unfused(f: &Func, ks: Vec<Option<Kernel>>) -> Fused {
    let n = f.insts.len();
    Fused {
        kernels: ks,
        operands: f.insts.iter().map(|i| i.operands.clone()).collect(),
        inlined: vec![false; n],
        members: (0..n).map(|i| vec![i]).collect(),
        decisions: vec!["fusion is off".to_string(); n],
        merged_into: vec![None; n],
        extra: vec![Vec::new(); n],
    }
}

/// Fuses the per-instruction kernels `ks` of `f`.
pub fn fuse(f: &Func, ks: Vec<Option<Kernel>>, chains: bool) -> Fused {
    let mut out = fuse_unmerged(f, ks, chains);
    merge::merge_siblings(f, &mut out);
    out
}

/// [`fuse`] before multi-output fusion.
fn fuse_unmerged(f: &Func, ks: Vec<Option<Kernel>>, chains: bool) -> Fused {
    let n = f.insts.len();
    let mut producer: Vec<Option<usize>> = vec![None; f.values.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
        for o in &inst.operands {
            users[o.index()].push(i);
        }
    }
    let mut out = Fused {
        kernels: vec![None; n],
        operands: vec![Vec::new(); n],
        inlined: vec![false; n],
        members: vec![Vec::new(); n],
        decisions: vec![String::new(); n],
        merged_into: vec![None; n],
        extra: vec![Vec::new(); n],
    };
    for (i, inst) in f.insts.iter().enumerate() {
        out.members[i] = vec![i];
        let Some(k) = &ks[i] else {
            out.operands[i] = inst.operands.clone();
            out.decisions[i] = "no kernel (a constant or a pass-through)".into();
            continue;
        };
        if k.schedule != Schedule::Nest {
            out.operands[i] = inst.operands.clone();
            out.kernels[i] = Some(k.clone());
            out.decisions[i] = "own kernel: not a loop nest (GEMM, scatter)".into();
            continue;
        }
        // Inline the operands computed by inlined producers.
        let mut inputs: Vec<ValueId> = Vec::new();
        let mut members = vec![i];
        let extents = var_extents(k);
        let body = {
            let mut ctx = Inline {
                f,
                fused: &out,
                producer: &producer,
                old_inputs: &inst.operands,
                inputs: &mut inputs,
                members: &mut members,
                extents: &extents,
                next_var: k.vars,
            };
            let body = ctx.expr(&k.body);
            (body, ctx.next_var)
        };
        let (body, vars) = body;
        members.sort_unstable();
        members.dedup();
        let fused = Kernel {
            body,
            vars,
            ..k.clone()
        };
        out.operands[i] = inputs;
        out.members[i] = members;
        out.kernels[i] = Some(fused);
        let decision = inlinable(f, i, &ks, &out, &users);
        out.inlined[i] = decision.is_ok();
        out.decisions[i] = match decision {
            Ok(why) => format!("inlined into its users: {why}"),
            Err(why) => format!("own kernel: {why}"),
        };
    }
    fuse_gemm_epilogues(f, &producer, &mut out, chains);
    fuse_gemm_chains(f, &mut out, chains);
    for i in 0..n {
        if out.inlined[i] {
            // Its users compute it; it has no kernel of its own.
            out.kernels[i] = None;
            out.members[i].clear();
        }
    }
    out
}

/// The values step `u` of the fused program reads: a kernel's buffers, or the operands of an
/// instruction that runs without a kernel (nothing for one computed elsewhere).
pub fn step_reads<'a>(f: &'a Func, fused: &'a Fused, u: usize) -> &'a [ValueId] {
    if fused.kernels[u].is_some() {
        &fused.operands[u]
    } else if fused.inlined[u] || fused.merged_into[u].is_some() {
        &[]
    } else {
        &f.insts[u].operands
    }
}

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

/// Checks that the fused program can run: no kernel reads a value computed only inside other
/// kernels, and the kernels, with an edge from each kernel to every kernel that reads its
/// result, form a DAG (a topological order exists), so no fused group depends on itself.
pub fn check_legal(f: &Func, fused: &Fused) -> Result<(), String> {
    use petgraph::graph::{DiGraph, NodeIndex};
    let n = f.insts.len();
    let mut producer = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
    }
    let mut g: DiGraph<usize, ()> = DiGraph::with_capacity(n, n);
    let nodes: Vec<NodeIndex> = (0..n).map(|i| g.add_node(i)).collect();
    for u in (0..n).filter(|&u| !fused.inlined[u]) {
        for v in step_reads(f, fused, u) {
            let Some(p) = producer[v.index()] else {
                continue;
            };
            if fused.inlined[p] {
                return Err(format!(
                    "#{u} reads {v}, which #{p} computes only inside other kernels"
                ));
            }
            // A merged instruction's value is written by the kernel it merged into, which
            // runs at that kernel's place in the program.
            let w = fused.merged_into[p].unwrap_or(p);
            if w != p && w > u {
                return Err(format!(
                    "#{u} reads {v} before #{w}'s kernel writes it (merged from #{p})"
                ));
            }
            g.add_edge(nodes[w], nodes[u], ());
        }
    }
    petgraph::algo::toposort(&g, None)
        .map(|_| ())
        .map_err(|c| format!("the fused kernels form a cycle through #{}", g[c.node_id()]))
}

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
/// [`MAX_ROW_EPILOGUE`] columns wide), the user's kernel becomes the GEMM with the user's body as
/// epilogue, and the product has no buffer of its own: each block of the product is
/// transformed while it is in cache.
fn fuse_gemm_epilogues(f: &Func, producer: &[Option<usize>], out: &mut Fused, chains: bool) {
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
                    || ((n <= MAX_ROW_EPILOGUE
                        || (chains
                            && conv.is_none()
                            && (1..=MAX_CHAIN_K).contains(&k)
                            // A row epilogue (whole rows per block) for certain.
                            && hoistable_reduces(&uk.body).iter().any(|r| reads_input(r, j))
                            && chain_reader(f, out, u, (batch, m, n)).is_some()
                            // Longer rows than a block can hold whole: a softmax, online.
                            && (n <= MAX_CHAIN_ROW
                                || online_softmax(
                                    &uk.body,
                                    j,
                                    &uk.out,
                                    &constant_of(f, &out.operands[u]),
                                )
                                .is_some())))
                        && reads_own_position_or_row(&uk.body, j, &uk.out, split))
            };
            let ok = only_reader
                && !f.outputs.contains(v)
                // Same bytes: the user's type may be a reshape of the product's.
                && pk.out.dtype == uk.out.dtype
                && pk.out.numel() == uk.out.numel()
                && if planes {
                    pk.out.shape == uk.out.shape && reads_only_own_position(&uk.body, j, &uk.out)
                } else {
                    row_split(&uk.out.shape, batch * m, n).is_some_and(layout_ok)
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
        out.decisions[p] =
            format!("runs inside #{u}'s kernel, which is this GEMM with #{u} as its epilogue");
        out.decisions[u] = format!(
            "own kernel: the GEMM of #{p} with this op (and what it inlined) as its epilogue"
        );
    }
}

/// Chains matrix products (see [`crate::ir::Chain`]): where a GEMM kernel with a row
/// epilogue (a softmax of attention scores) of at most [`MAX_CHAIN_K`] contraction steps (one
/// contraction block, so each block of rows is final after one pass) has as its only reader a
/// plain matrix product that takes it, stored by rows, as its A with the same batches and rows
/// (the probabilities times V), that product runs inside the first kernel on each block of
/// rows as soon as its epilogue is done, and the epilogue's result is never stored whole.
fn fuse_gemm_chains(f: &Func, out: &mut Fused, chains: bool) {
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
        if !(1..=MAX_CHAIN_K).contains(&k)
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
            out: uk.out.clone(),
            online: None,
            masked: None,
        };
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
        let online = online_softmax(&pk.body, product, &pk.out, &value);
        if online.is_none() && n > MAX_CHAIN_ROW {
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
        out.decisions[p] = format!(
            "runs inside #{u}'s kernel: its GEMM and epilogue, then #{u}'s product of each block \
             of its rows"
        );
        out.decisions[u] = format!(
            "own kernel: the GEMM of #{p}'s kernel and its epilogue, then this product on each \
             block of rows while it is in cache"
        );
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
    use crate::ir::Ew;
    use kiln_ir::OpKind;
    let col = out.rank().checked_sub(1)?;
    let n = out.shape[col];
    if !matches!(out.dtype, DType::F32 | DType::F64) {
        return None;
    }
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
fn constant_of<'a>(f: &'a Func, operands: &'a [ValueId]) -> impl Fn(&Expr) -> Option<f64> + 'a {
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
fn chain_reader(
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
    let ok = matches!(
        uk.schedule,
        Schedule::Gemm {
            epilogue: None,
            batch: b2,
            m: m2,
            k: k2,
            conv: None,
            a_trans: false,
            chain: None,
            ..
        } if b2 == batch && m2 == m && k2 == n
    ) && uk.extra.is_empty()
        && out.operands[u].len() == 2
        && out.operands[u][0] == a
        && out.operands[u][1] != a
        && f.values[a.index()].dtype == uk.out.dtype;
    ok.then_some(u)
}

/// The first `s` such that `shape[..s]` makes `rows` and `shape[s..]` makes `cols`.
pub fn row_split(shape: &[usize], rows: usize, cols: usize) -> Option<usize> {
    (0..=shape.len()).find(|&s| {
        shape[..s].iter().product::<usize>() == rows && shape[s..].iter().product::<usize>() == cols
    })
}

/// Whether instruction `i` (its fused kernel already in `fused`) can be computed inside every
/// user's kernel: `Ok` with the measure that allowed it, or `Err` with the reason it may not.
fn inlinable(
    f: &Func,
    i: usize,
    ks: &[Option<Kernel>],
    fused: &Fused,
    users: &[Vec<usize>],
) -> Result<String, String> {
    let inst = &f.insts[i];
    let Some(k) = &fused.kernels[i] else {
        return Err("no loop-nest kernel".into());
    };
    let v = inst.results[0];
    let numel = f.values[v.index()].numel();
    // A reduction is inlined only where the user computes each of its elements once: the
    // CPU backend computes a reduction that reads only enclosing loop variables ahead of the
    // inner loops (a row's sum before the loop over the row), and computes equal reductions
    // in one kernel once. Users in different kernels each compute it, so only a few may.
    let reduces = has_reduce(&k.body);
    let n_users = users[v.index()].len();
    // Users over the same index space usually end up in one multi-output kernel (see
    // `merge_siblings`), which computes the reduction once: count index spaces.
    let mut spaces: Vec<&[usize]> = users[v.index()]
        .iter()
        .map(|&u| f.values[f.insts[u].results[0].index()].shape.as_slice())
        .collect();
    spaces.sort_unstable();
    spaces.dedup();
    if reduces && spaces.len() > MAX_REDUCTION_USERS {
        return Err(format!(
            "computes a reduction and has {n_users} users over {} index spaces (at most {MAX_REDUCTION_USERS} may recompute it)",
            spaces.len()
        ));
    }
    if inst.results.len() != 1 || k.schedule != Schedule::Nest {
        return Err("not a single-result loop nest".into());
    }
    if numel == 0 {
        return Err("empty".into());
    }
    if k.out != f.values[v.index()] {
        // A byte copy (a bitcast between 16- or 8-bit types): its positions are bytes.
        return Err(format!("writes the bytes of a {}", f.values[v.index()]));
    }
    if f.outputs.contains(&v) {
        return Err("a function output (must be stored)".into());
    }
    if n_users == 0 {
        return Err("unused".into());
    }
    let size = nodes(&k.body);
    if size > MAX_NODES {
        return Err(format!("body of {size} nodes (limit {MAX_NODES})"));
    }
    let cost = cost(&k.body);
    let mut why = Vec::new();
    let mut seen = Vec::new();
    for &u in &users[v.index()] {
        if seen.contains(&u) {
            continue;
        }
        seen.push(u);
        let Some(uk) = &ks[u] else {
            return Err(format!("user #{u} has no kernel"));
        };
        if uk.schedule != Schedule::Nest || uk.out.numel() == 0 {
            return Err(format!("user #{u} is not a loop nest"));
        }
        let ext = var_extents(uk);
        let positions: Vec<usize> = f.insts[u]
            .operands
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == v)
            .map(|(j, _)| j)
            .collect();
        // A user that reads the value's bytes as another type (a bitcast between 16- or 8-bit
        // types is a byte copy) indexes the stored buffer, so the value must be stored.
        let dtype = f.values[v.index()].dtype;
        let mut reinterprets = false;
        visit(&uk.body, &mut |e| {
            if let Expr::Load {
                input, dtype: d, ..
            }
            | Expr::Gather {
                input, dtype: d, ..
            } = e
                && positions.contains(input)
                && *d != dtype
            {
                reinterprets = true;
            }
        });
        if reinterprets {
            return Err(format!("user #{u} reads its bytes as another type"));
        }
        if reduces {
            // Its reductions run ahead of the loops they do not depend on; read inside a
            // reduction of the user that moves along a dimension they depend on (a row's
            // variance inside a sum down a column), they would run again at every step.
            // That wastes work when the user also has an output loop those reductions do not
            // depend on: they are recomputed for each of its positions.
            let shape = &f.values[v.index()].shape;
            let (moved, by_output) = dims_moved(&uk.body, &positions, shape, uk.out.rank());
            let inner: std::collections::BTreeSet<usize> = hoistable_reduces(&k.body)
                .into_iter()
                .flat_map(free_vars)
                .filter(|&d| d < k.out.rank())
                .collect();
            let stepped = inner.iter().find(|d| moved.contains(d));
            let repeated = (0..uk.out.rank())
                .find(|&o| uk.out.shape[o] > 1 && !by_output[o].iter().any(|d| inner.contains(d)));
            if let (Some(d), Some(o)) = (stepped, repeated) {
                return Err(format!(
                    "user #{u} reads it inside a reduction along its dimension {d}, which its own reduction depends on, for each position of its output dimension {o} (the reduction would be recomputed {} times over)",
                    uk.out.shape[o]
                ));
            }
        }
        let reads: usize = if reduces {
            hoisted_reads(&uk.body, &positions, &ext, uk.out.rank(), uk.out.numel())
        } else {
            positions
                .iter()
                .map(|&j| reads_of(&uk.body, j, uk.out.numel(), &ext))
                .sum()
        };
        if reads <= numel {
            why.push(format!(
                "#{u} reads each of its {numel} elements at most once ({reads} reads)"
            ));
        } else if cost <= CHEAP && !reduces {
            why.push(format!("#{u} reads it {reads} times for {numel} elements, but it costs {cost} <= {CHEAP} per element"));
        } else {
            return Err(format!(
                "user #{u} would compute its {numel} elements {reads} times at cost {cost} each{}",
                if reduces {
                    " (it holds a reduction)"
                } else {
                    ""
                }
            ));
        }
    }
    Ok(why.join("; "))
}

/// Users (kernels, counted by index space) a reduction may be inlined into; each computes it
/// once.
const MAX_REDUCTION_USERS: usize = 3;

/// How many times a kernel over `outer` positions evaluates input `j` of `e` when a reduction
/// inlined in its place is computed ahead of the loops it does not depend on (the CPU
/// backend's `emit_nest`): a load reached through elementwise ops and reductions only, whose
/// index uses output variables `0..=d` and no reduction variable, runs once per iteration of
/// loops `0..=d`. Other loads count as [`reads_of`] counts them.
fn hoisted_reads(e: &Expr, js: &[usize], ext: &[usize], rank: usize, outer: usize) -> usize {
    // Loads of any of `js` at the same position read the same value.
    let same = |a: &Expr, b: &Expr| match (a, b) {
        (
            Expr::Load {
                input: i,
                coef: c,
                off: o,
                ..
            },
            Expr::Load {
                input: i2,
                coef: c2,
                off: o2,
                ..
            },
        ) if js.contains(i) && js.contains(i2) => c == c2 && o == o2,
        _ => a == b,
    };
    match e {
        Expr::Load { input, coef, .. } if js.contains(input) => {
            let free: Vec<usize> = (0..coef.len()).filter(|&v| coef[v] != 0).collect();
            if free.iter().all(|&v| v < rank) {
                let last = free.last().map_or(0, |&v| v + 1);
                ext[..last].iter().product()
            } else {
                outer
            }
        }
        // An argument equal to an earlier one is the same value (`d * d`): counted once.
        Expr::Op { args, .. } => args
            .iter()
            .enumerate()
            .filter(|(i, a)| !args[..*i].iter().any(|b| same(a, b)))
            .map(|(_, a)| hoisted_reads(a, js, ext, rank, outer))
            .sum(),
        Expr::Reduce {
            init, vars, body, ..
        } => {
            let n: usize = vars.iter().map(|v| v.1).product();
            hoisted_reads(init, js, ext, rank, outer)
                + hoisted_reads(body, js, ext, rank, outer.saturating_mul(n))
        }
        _ => js.iter().map(|&j| reads_of(e, j, outer, ext)).sum(),
    }
}

/// How many times a kernel over `outer` positions, its variables `v` ranging over
/// `0..ext[v]`, evaluates loads of input `j` in `e`. The branches of a guard on plain variables
/// (`lo <= var < hi`) run on their share of the positions only: each piece of a concatenation
/// is read on its own rows, once per element, not at every position of the result.
fn reads_of(e: &Expr, j: usize, outer: usize, ext: &[usize]) -> usize {
    let mut range: Vec<(i64, i64)> = ext.iter().map(|&n| (0, n as i64)).collect();
    reads_in(e, j, outer, &mut range)
}

/// [`reads_of`] with each variable's current range.
fn reads_in(e: &Expr, j: usize, outer: usize, range: &mut Vec<(i64, i64)>) -> usize {
    match e {
        Expr::Load { input, .. } | Expr::Gather { input, .. } => {
            let inner = match e {
                Expr::Gather { index, .. } => {
                    index.iter().map(|i| idx_reads(i, j, outer, range)).sum()
                }
                _ => 0,
            };
            if *input == j { outer + inner } else { inner }
        }
        Expr::Iota { .. } | Expr::Const { .. } | Expr::Index { .. } => 0,
        Expr::Op { args, .. } => args.iter().map(|a| reads_in(a, j, outer, range)).sum(),
        Expr::Reduce {
            init, vars, body, ..
        } => {
            let n: usize = vars.iter().map(|v| v.1).product();
            reads_in(init, j, outer, range) + reads_in(body, j, outer.saturating_mul(n), range)
        }
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => {
            let in_conds: usize = conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(i, ..) | Cond::Divisible(i, _) => idx_reads(i, j, outer, range),
                })
                .sum();
            // The share of the positions each branch runs on: `outer` scaled by how much of
            // a guarded variable's range its condition keeps (or leaves, for `otherwise`).
            let plain: Option<Vec<(usize, i64, i64)>> = conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(Idx::Var(d), lo, hi) if *d < range.len() => Some((*d, *lo, *hi)),
                    _ => None,
                })
                .collect();
            let Some(plain) = plain else {
                return in_conds
                    + reads_in(then, j, outer, range)
                    + reads_in(otherwise, j, outer, range);
            };
            let scaled = |outer: usize, kept: i64, of: i64| {
                if of <= 0 {
                    outer
                } else {
                    (outer as u128 * kept.max(0) as u128 / of as u128) as usize
                }
            };
            let saved = range.clone();
            let mut then_outer = outer;
            for &(d, lo, hi) in &plain {
                let (a, b) = range[d];
                let kept = (a.max(lo), b.min(hi));
                then_outer = scaled(then_outer, kept.1 - kept.0, b - a);
                range[d] = (kept.0, kept.1.max(kept.0));
            }
            let then_reads = reads_in(then, j, then_outer, range);
            range.clone_from(&saved);
            // What a single condition leaves is one interval when it cuts the range at one
            // end (a concatenation's guard tree); otherwise count every position.
            let mut other_outer = outer;
            if let [(d, lo, hi)] = plain[..] {
                let (a, b) = range[d];
                let left = if lo <= a {
                    Some((a.max(hi), b))
                } else if hi >= b {
                    Some((a, b.min(lo)))
                } else {
                    None
                };
                if let Some(left) = left {
                    other_outer = scaled(outer, left.1 - left.0, b - a);
                    range[d] = (left.0, left.1.max(left.0));
                }
            }
            let other_reads = reads_in(otherwise, j, other_outer, range);
            *range = saved;
            in_conds + then_reads + other_reads
        }
    }
}

fn idx_reads(i: &Idx, j: usize, outer: usize, range: &mut Vec<(i64, i64)>) -> usize {
    match i {
        Idx::Value(e) => reads_in(e, j, outer, range),
        Idx::Add(xs) => xs.iter().map(|x| idx_reads(x, j, outer, range)).sum(),
        Idx::Mul(x, _) | Idx::Div(x, _) | Idx::Clamp(x, ..) => idx_reads(x, j, outer, range),
        Idx::Var(_) | Idx::Const(_) => 0,
    }
}

/// Where `e` reads a producer of shape `shape` (as inputs `js`): the producer dimensions that
/// the variables of enclosing reductions move, and per output variable `0..rank` the
/// dimensions it moves. A load's coefficient for a variable names the dimension with that
/// stride; a read that cannot be attributed moves every dimension.
fn dims_moved(
    e: &Expr,
    js: &[usize],
    shape: &[usize],
    rank: usize,
) -> (Vec<usize>, Vec<Vec<usize>>) {
    struct Walk<'a> {
        js: &'a [usize],
        st: Vec<usize>,
        shape: &'a [usize],
        bound: Vec<usize>,
        in_reduce: Vec<usize>,
        by_output: Vec<Vec<usize>>,
    }
    impl Walk<'_> {
        fn dims(&self, c: i64) -> Vec<usize> {
            match (0..self.shape.len()).find(|&d| self.shape[d] > 1 && self.st[d] as i64 == c.abs())
            {
                Some(d) => vec![d],
                None => (0..self.shape.len()).collect(),
            }
        }
        fn walk(&mut self, e: &Expr) {
            match e {
                Expr::Load { input, coef, .. } if self.js.contains(input) => {
                    for (v, &c) in coef.iter().enumerate() {
                        if c == 0 {
                            continue;
                        }
                        let ds = self.dims(c);
                        if self.bound.contains(&v) {
                            self.in_reduce.extend(&ds);
                        } else if let Some(o) = self.by_output.get_mut(v) {
                            o.extend(ds);
                        }
                    }
                }
                Expr::Gather { input, .. } if self.js.contains(input) => {
                    let all: Vec<usize> = (0..self.shape.len()).collect();
                    if !self.bound.is_empty() {
                        self.in_reduce.extend(&all);
                    }
                    for o in &mut self.by_output {
                        o.extend(&all);
                    }
                }
                Expr::Reduce {
                    init, vars, body, ..
                } => {
                    self.walk(init);
                    let mark = self.bound.len();
                    self.bound.extend(vars.iter().map(|v| v.0));
                    self.walk(body);
                    self.bound.truncate(mark);
                }
                Expr::Op { args, .. } => args.iter().for_each(|a| self.walk(a)),
                Expr::Guard {
                    then, otherwise, ..
                } => {
                    self.walk(then);
                    self.walk(otherwise);
                }
                _ => {}
            }
        }
    }
    let mut w = Walk {
        js,
        st: strides(shape),
        shape,
        bound: Vec::new(),
        in_reduce: Vec::new(),
        by_output: vec![Vec::new(); rank],
    };
    w.walk(e);
    w.in_reduce.sort_unstable();
    w.in_reduce.dedup();
    (w.in_reduce, w.by_output)
}

fn has_reduce(e: &Expr) -> bool {
    let mut found = false;
    visit(e, &mut |x| found |= matches!(x, Expr::Reduce { .. }));
    found
}

fn nodes(e: &Expr) -> usize {
    let mut n = 0;
    visit(e, &mut |_| n += 1);
    n
}

/// Arithmetic cost of evaluating `e` once: elementwise ops count 1, transcendental ones 8.
fn cost(e: &Expr) -> usize {
    use kiln_ir::OpKind::*;
    let mut c = 0;
    visit(e, &mut |x| {
        if let Expr::Op { op, .. } = x {
            c += match op {
                crate::ir::Ew::Kind(
                    Exponential | Log | LogPlusOne | ExponentialMinusOne | Tanh | Logistic | Sine
                    | Cosine | Erf | Power | Divide | Remainder | Sqrt | Rsqrt,
                ) => 8,
                _ => 1,
            }
        }
    });
    c
}

/// Calls `f` on every expression node of `e`, index expressions included.
/// The extent of each loop variable of `k`: the output dimensions, then reduction variables.
fn var_extents(k: &Kernel) -> Vec<usize> {
    let mut ext: Vec<usize> = k.out.shape.clone();
    visit(&k.body, &mut |e| {
        if let Expr::Reduce { vars, .. } = e {
            for &(v, n) in vars {
                if ext.len() <= v {
                    ext.resize(v + 1, 1);
                }
                ext[v] = n;
            }
        }
    });
    ext
}

/// Rewrites one consumer body, inlining producers and renumbering inputs.
struct Inline<'a> {
    f: &'a Func,
    fused: &'a Fused,
    producer: &'a [Option<usize>],
    /// The consumer's operands (its unfused kernel's inputs).
    old_inputs: &'a [ValueId],
    /// The fused kernel's inputs, built up.
    inputs: &'a mut Vec<ValueId>,
    members: &'a mut Vec<usize>,
    extents: &'a [usize],
    /// The first loop variable not yet used by the fused kernel (inlined reductions bring
    /// loop variables of their own).
    next_var: usize,
}

impl Inline<'_> {
    /// The fused input index of value `v`.
    fn input(&mut self, v: ValueId) -> usize {
        match self.inputs.iter().position(|&x| x == v) {
            Some(p) => p,
            None => {
                self.inputs.push(v);
                self.inputs.len() - 1
            }
        }
    }

    /// The producer of the consumer's input `j`, when it is inlined.
    fn inlined(&self, j: usize) -> Option<usize> {
        let p = self.producer[self.old_inputs[j].index()]?;
        self.fused.inlined[p].then_some(p)
    }

    fn expr(&mut self, e: &Expr) -> Expr {
        match e {
            Expr::Load {
                input,
                dtype,
                coef,
                off,
            } => match self.inlined(*input) {
                Some(p) => {
                    let shape = &self.f.values[self.old_inputs[*input].index()].shape;
                    let terms: Vec<(usize, i64)> = coef
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| **c != 0)
                        .map(|(v, c)| (v, *c))
                        .collect();
                    let index = split_flat(&terms, *off, shape, self.extents);
                    self.producer_at(p, &index)
                }
                None => Expr::Load {
                    input: self.input(self.old_inputs[*input]),
                    dtype: *dtype,
                    coef: coef.clone(),
                    off: *off,
                },
            },
            Expr::Gather {
                input,
                dtype,
                index,
                strides: st,
            } => {
                let index: Vec<Idx> = index.iter().map(|i| self.idx(i)).collect();
                match self.inlined(*input) {
                    Some(p) => {
                        let shape = &self.f.values[self.old_inputs[*input].index()].shape;
                        let own: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
                        let at = if *st == own {
                            index
                        } else {
                            let flat = Idx::Add(
                                index
                                    .into_iter()
                                    .zip(st)
                                    .map(|(i, &s)| Idx::Mul(Box::new(i), s))
                                    .collect(),
                            );
                            unflatten(flat, shape)
                        };
                        self.producer_at(p, &at)
                    }
                    None => Expr::Gather {
                        input: self.input(self.old_inputs[*input]),
                        dtype: *dtype,
                        index,
                        strides: st.clone(),
                    },
                }
            }
            Expr::Iota { .. } | Expr::Const { .. } => e.clone(),
            Expr::Index { idx, dtype } => Expr::Index {
                idx: self.idx(idx),
                dtype: *dtype,
            },
            Expr::Op { op, dtype, args } => Expr::Op {
                op: op.clone(),
                dtype: *dtype,
                args: args.iter().map(|a| self.expr(a)).collect(),
            },
            Expr::Reduce {
                kind,
                dtype,
                init,
                vars,
                body,
            } => Expr::Reduce {
                kind: *kind,
                dtype: *dtype,
                init: Box::new(self.expr(init)),
                vars: vars.clone(),
                body: Box::new(self.expr(body)),
            },
            Expr::Guard {
                conds,
                then,
                otherwise,
            } => Expr::Guard {
                conds: conds.iter().map(|c| self.cond(c)).collect(),
                then: Box::new(self.expr(then)),
                otherwise: Box::new(self.expr(otherwise)),
            },
        }
    }

    fn idx(&mut self, i: &Idx) -> Idx {
        match i {
            Idx::Value(e) => Idx::Value(Box::new(self.expr(e))),
            Idx::Add(xs) => Idx::Add(xs.iter().map(|x| self.idx(x)).collect()),
            Idx::Mul(x, c) => Idx::Mul(Box::new(self.idx(x)), *c),
            Idx::Div(x, c) => Idx::Div(Box::new(self.idx(x)), *c),
            Idx::Clamp(x, lo, hi) => Idx::Clamp(Box::new(self.idx(x)), *lo, *hi),
            Idx::Var(_) | Idx::Const(_) => i.clone(),
        }
    }

    fn cond(&mut self, c: &Cond) -> Cond {
        match c {
            Cond::InRange(i, lo, hi) => Cond::InRange(self.idx(i), *lo, *hi),
            Cond::Divisible(i, m) => Cond::Divisible(self.idx(i), *m),
        }
    }

    /// Producer `p`'s fused body at output position `at` (one index per dimension), its
    /// inputs renumbered into the consumer's.
    fn producer_at(&mut self, p: usize, at: &[Idx]) -> Expr {
        let pk = self.fused.kernels[p]
            .as_ref()
            .expect("an inlined producer has a kernel");
        let map: Vec<usize> = self.fused.operands[p]
            .iter()
            .map(|&v| self.input(v))
            .collect();
        self.members.extend(self.fused.members[p].iter().copied());
        self.members.push(p);
        let base = self.next_var;
        self.next_var += pk.vars - pk.out.rank();
        let body = substitute(
            &pk.body,
            &Subst {
                at,
                map: &map,
                base,
            },
        );
        match pk.out.dtype {
            // The producer's kernel would have rounded its f32 result on store.
            DType::F16 | DType::BF16 => Expr::Op {
                op: crate::ir::Ew::Narrow,
                dtype: pk.out.dtype,
                args: vec![body],
            },
            _ => body,
        }
    }
}

/// How a producer body moves into a consumer: its output variable `d` becomes `at[d]`, its
/// other (reduction) variables `at.len() + i` become `base + i`, and its input `j` becomes
/// input `map[j]`.
struct Subst<'a> {
    at: &'a [Idx],
    map: &'a [usize],
    base: usize,
}

impl Subst<'_> {
    /// The consumer variable standing for producer reduction variable `v`.
    fn var(&self, v: usize) -> usize {
        v - self.at.len() + self.base
    }
}

/// `e` (a producer body) moved into a consumer by `s`.
fn substitute(e: &Expr, s: &Subst) -> Expr {
    let (at, map) = (s.at, s.map);
    let sub = |x: &Expr| substitute(x, s);
    match e {
        Expr::Load {
            input,
            dtype,
            coef,
            off,
        } => {
            let mut terms = vec![Idx::Const(*off)];
            for (d, &c) in coef.iter().enumerate() {
                if c != 0 {
                    let v = substitute_idx(&Idx::Var(d), s);
                    terms.push(Idx::Mul(Box::new(v), c));
                }
            }
            Expr::Gather {
                input: map[*input],
                dtype: *dtype,
                index: vec![Idx::Add(terms)],
                strides: vec![1],
            }
        }
        Expr::Gather {
            input,
            dtype,
            index,
            strides,
        } => Expr::Gather {
            input: map[*input],
            dtype: *dtype,
            index: index.iter().map(|i| substitute_idx(i, s)).collect(),
            strides: strides.clone(),
        },
        Expr::Iota { var, dtype } if *var < at.len() => Expr::Index {
            idx: at[*var].clone(),
            dtype: *dtype,
        },
        Expr::Iota { var, dtype } => Expr::Iota {
            var: s.var(*var),
            dtype: *dtype,
        },
        Expr::Index { idx, dtype } => Expr::Index {
            idx: substitute_idx(idx, s),
            dtype: *dtype,
        },
        Expr::Const { .. } => e.clone(),
        Expr::Op { op, dtype, args } => Expr::Op {
            op: op.clone(),
            dtype: *dtype,
            args: args.iter().map(sub).collect(),
        },
        Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } => Expr::Reduce {
            kind: *kind,
            dtype: *dtype,
            init: Box::new(sub(init)),
            vars: vars.iter().map(|&(v, n)| (s.var(v), n)).collect(),
            body: Box::new(sub(body)),
        },
        Expr::Guard {
            conds,
            then,
            otherwise,
        } => Expr::Guard {
            conds: conds
                .iter()
                .map(|c| match c {
                    Cond::InRange(i, lo, hi) => Cond::InRange(substitute_idx(i, s), *lo, *hi),
                    Cond::Divisible(i, m) => Cond::Divisible(substitute_idx(i, s), *m),
                })
                .collect(),
            then: Box::new(sub(then)),
            otherwise: Box::new(sub(otherwise)),
        },
    }
}

fn substitute_idx(i: &Idx, s: &Subst) -> Idx {
    let sub = |x: &Idx| substitute_idx(x, s);
    match i {
        Idx::Var(d) if *d < s.at.len() => s.at[*d].clone(),
        Idx::Var(d) => Idx::Var(s.var(*d)),
        Idx::Const(_) => i.clone(),
        Idx::Add(xs) => Idx::Add(xs.iter().map(sub).collect()),
        Idx::Mul(x, c) => Idx::Mul(Box::new(sub(x)), *c),
        Idx::Div(x, c) => Idx::Div(Box::new(sub(x)), *c),
        Idx::Clamp(x, lo, hi) => Idx::Clamp(Box::new(sub(x)), *lo, *hi),
        Idx::Value(e) => Idx::Value(Box::new(substitute(e, s))),
    }
}

/// The position in `shape` of flat element `off + Σ c * var` (vars ranging over `extents`):
/// per dimension an affine expression of the variables when the terms split exactly between
/// dimensions without carries (broadcasts, transposes, slices, reshapes that keep dimensions),
/// otherwise by division and remainder of the flat index.
fn split_flat(terms: &[(usize, i64)], off: i64, shape: &[usize], extents: &[usize]) -> Vec<Idx> {
    // A variable with one value (a batch of one) is always zero: its term adds nothing, and
    // keeping it would defeat the exact split (its coefficient fits no dimension).
    let terms: Vec<(usize, i64)> = terms
        .iter()
        .copied()
        .filter(|&(v, _)| extents.get(v) != Some(&1))
        .collect();
    let terms = &terms[..];
    let st: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
    let rank = shape.len();
    let mut parts: Vec<Vec<(usize, i64)>> = vec![Vec::new(); rank];
    let mut offs = vec![0i64; rank];
    let mut exact = off >= 0;
    // Each term goes to the outermost dimension whose stride divides its coefficient.
    for &(v, c) in terms {
        match (0..rank)
            .find(|&d| st[d] != 0 && c % st[d] == 0 && (c / st[d]).abs() < shape[d] as i64)
        {
            Some(d) => parts[d].push((v, c / st[d])),
            None => exact = false,
        }
    }
    let mut rest = off.max(0);
    for d in 0..rank {
        if st[d] > 0 {
            offs[d] = rest / st[d];
            rest %= st[d];
        }
    }
    exact &= rest == 0;
    if exact {
        for d in 0..rank {
            let (mut lo, mut hi) = (offs[d], offs[d]);
            for &(v, c) in &parts[d] {
                let e = extents.get(v).copied().unwrap_or(1) as i64 - 1;
                if c > 0 {
                    hi += c * e;
                } else {
                    lo += c * e;
                }
            }
            if lo < 0 || hi >= shape[d] as i64 {
                exact = false;
            }
        }
    }
    if exact {
        return (0..rank)
            .map(|d| {
                let mut xs: Vec<Idx> = parts[d]
                    .iter()
                    .map(|&(v, c)| {
                        if c == 1 {
                            Idx::Var(v)
                        } else {
                            Idx::Mul(Box::new(Idx::Var(v)), c)
                        }
                    })
                    .collect();
                if offs[d] != 0 || xs.is_empty() {
                    xs.push(Idx::Const(offs[d]));
                }
                if xs.len() == 1 {
                    xs.pop().expect("one term")
                } else {
                    Idx::Add(xs)
                }
            })
            .collect();
    }
    let mut flat = vec![Idx::Const(off)];
    flat.extend(
        terms
            .iter()
            .map(|&(v, c)| Idx::Mul(Box::new(Idx::Var(v)), c)),
    );
    unflatten(Idx::Add(flat), shape)
}

/// The position in `shape` of the (in-range) flat index `flat`, by division and remainder.
fn unflatten(flat: Idx, shape: &[usize]) -> Vec<Idx> {
    let st: Vec<i64> = strides(shape).iter().map(|&s| s as i64).collect();
    (0..shape.len())
        .map(|d| {
            let q = Idx::Div(Box::new(flat.clone()), st[d].max(1));
            if d == 0 {
                q
            } else {
                // q mod shape[d] = q - (flat / st[d - 1]) * shape[d].
                let outer = Idx::Div(Box::new(flat.clone()), st[d - 1].max(1));
                Idx::Add(vec![q, Idx::Mul(Box::new(outer), -(shape[d] as i64))])
            }
        })
        .collect()
}

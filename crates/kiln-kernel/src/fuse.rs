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
//! - its users run over one index space, or its body reads at most two buffers of its size
//!   (each user would read them all: a residual stream is stored, not recomputed from its
//!   first term by every layer's kernels);
//! - the fused body stays small (compile time).
//!
//! A transpose, reshape or slice that only lays out a matrix product's operand is read by the
//! product in place, through strides, where the target's GEMM takes them (`fuse/views.rs`):
//! it has no kernel, and its producer sees the product as its reader. A plain product that
//! only such layouts read stores its result through strides into the last one's buffer
//! (`fuse/stores.rs`): the layouts take no kernel either.
//!
//! Chains fuse transitively (producers are processed first), and a value used by several
//! consumers is recomputed in each, trading arithmetic for memory traffic, which is what
//! bounds these kernels. Inlining never creates cycles: a consumer only absorbs instructions
//! that precede it.

mod chain;
mod decision;
mod donate;
mod epilogue;
mod inlinable;
mod inline;
mod legality;
mod merge;
mod stores;
mod unread_blocks;
mod views;
mod zero_blocks;

use crate::ir::{Expr, Extra, Kernel, Rewriter, Schedule};
use crate::target::FusionLimits;
use kiln_ir::{Func, ValueId};

use chain::fuse_gemm_chains;
use epilogue::fuse_gemm_epilogues;
use inlinable::{inlinable, var_extents};
use inline::Inline;

pub(crate) use chain::constant_of;
pub use chain::online_softmax;
pub use decision::FusionDecision;
pub use donate::{can_update, gemm_update, in_place};
pub use epilogue::{row_epilogue, row_split};
pub use legality::check_legal;

/// Largest body (in expression nodes) a fused kernel may grow to.
const MAX_NODES: usize = 400;
/// Largest total of the bodies of a multi-output kernel (its outputs often repeat the same
/// inlined producers, which the emitter computes once).
const MAX_MERGED_NODES: usize = 2 * MAX_NODES;
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
    pub decisions: Vec<FusionDecision>,
    /// Per instruction: the later instruction whose kernel also writes its result
    /// (multi-output fusion); its own kernel is then `None`.
    pub merged_into: Vec<Option<usize>>,
    /// Per instruction: the results of the instructions merged into its kernel, in the order
    /// of the kernel's [`Kernel::extra`] outputs.
    pub extra: Vec<Vec<ValueId>>,
    /// Per instruction: why lowering gave it no kernel ([`crate::lower::NoKernel`]), which the
    /// kernels dump prints; `None` where it has one, and where the fusion was not made by
    /// [`crate::pipeline::fused_kernels`] (which alone knows the reasons).
    pub no_kernel: Vec<Option<crate::lower::NoKernel>>,
}

/// The per-instruction kernels `ks` of `f` as they are: nothing inlined.
pub fn unfused(f: &Func, ks: Vec<Option<Kernel>>) -> Fused {
    let n = f.insts.len();
    let extra = own_extras(f, &ks);
    Fused {
        kernels: ks,
        operands: f.insts.iter().map(|i| i.operands.clone()).collect(),
        inlined: vec![false; n],
        members: (0..n).map(|i| vec![i]).collect(),
        decisions: vec![FusionDecision::Off; n],
        merged_into: vec![None; n],
        extra,
        no_kernel: vec![None; n],
    }
}

/// Per instruction: the results its kernel writes as extra outputs from the start (a fold's
/// results after the first, see [`crate::fold`]).
fn own_extras(f: &Func, ks: &[Option<Kernel>]) -> Vec<Vec<ValueId>> {
    f.insts
        .iter()
        .zip(ks)
        .map(|(inst, k)| match k {
            Some(k) if !k.extra.is_empty() => inst.results[1..].to_vec(),
            _ => Vec::new(),
        })
        .collect()
}

/// Fuses the per-instruction kernels `ks` of `f` within the target's `limits`.
pub fn fuse(f: &Func, ks: Vec<Option<Kernel>>, chains: bool, limits: &FusionLimits) -> Fused {
    let mut out = fuse_unmerged(f, ks, chains, limits);
    merge::merge_siblings(f, &mut out);
    zero_blocks::mark_zero_blocks(f, &mut out, limits.zero_steps);
    unread_blocks::mark_unread_blocks(f, &mut out, limits.unread_blocks);
    out
}

/// The instruction defining each value of `f` (`None` for its parameters).
fn producers(f: &Func) -> Vec<Option<usize>> {
    let mut producer = vec![None; f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
    }
    producer
}

/// [`fuse`] before multi-output fusion.
fn fuse_unmerged(f: &Func, ks: Vec<Option<Kernel>>, chains: bool, limits: &FusionLimits) -> Fused {
    let n = f.insts.len();
    let producer = producers(f);
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); f.values.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for o in &inst.operands {
            users[o.index()].push(i);
        }
    }
    // Operands the products read in place through layouts: fusion sees each such product
    // reading the farther buffer, and a layout read only in place as having no readers.
    let in_place = views::read_in_place(f, &ks, &producer, limits.strided_operands);
    for (g, p) in in_place.products.iter().enumerate() {
        let Some(p) = p else { continue };
        for (&v, &o) in p.values.iter().zip(&f.insts[g].operands) {
            if v != o {
                users[o.index()].retain(|&u| u != g);
                if !users[v.index()].contains(&g) {
                    users[v.index()].push(g);
                }
            }
        }
    }
    for (i, _) in in_place.layouts.iter().enumerate().filter(|(_, l)| **l) {
        for o in &f.insts[i].operands {
            users[o.index()].retain(|&u| u != i);
        }
    }
    let mut out = Fused {
        kernels: vec![None; n],
        operands: vec![Vec::new(); n],
        inlined: vec![false; n],
        members: vec![Vec::new(); n],
        decisions: vec![FusionDecision::NoKernel; n],
        merged_into: vec![None; n],
        extra: own_extras(f, &ks),
        no_kernel: vec![None; n],
    };
    for (i, inst) in f.insts.iter().enumerate() {
        out.members[i] = vec![i];
        let Some(k) = &ks[i] else {
            out.operands[i] = inst.operands.clone();
            out.decisions[i] = FusionDecision::NoKernel;
            continue;
        };
        if in_place.layouts[i] {
            out.operands[i] = inst.operands.clone();
            out.inlined[i] = true;
            out.decisions[i] = FusionDecision::Inlined(
                "a layout every reader reads in place (a product, through strides)".into(),
            );
            continue;
        }
        if k.schedule != Schedule::Nest {
            let mut k = k.clone();
            out.operands[i] = inst.operands.clone();
            if let (
                Some(p),
                Schedule::Gemm {
                    a_trans,
                    b_trans,
                    strides,
                    ..
                },
            ) = (&in_place.products[i], &mut k.schedule)
            {
                out.operands[i] = p.values.to_vec();
                *strides = p.strides.clone();
                (*a_trans, *b_trans) = p.trans;
            }
            out.kernels[i] = Some(k);
            out.decisions[i] = FusionDecision::NotLoopNest;
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
            // A fold's other results: the same fold, inlined once.
            let extra: Vec<Extra> = (k.extra.iter())
                .map(|x| {
                    let body = match (&body, &x.body) {
                        // Lowered together: one fold (`fold::lower_reduce_region`).
                        (Expr::Fold { fold, .. }, Expr::Fold { result, .. }) => Expr::Fold {
                            fold: fold.clone(),
                            result: *result,
                        },
                        _ => ctx.expr(&x.body),
                    };
                    Extra { body, ..x.clone() }
                })
                .collect();
            (body, extra, ctx.next_var)
        };
        let (body, extra, vars) = body;
        members.sort_unstable();
        members.dedup();
        let fused = Kernel {
            body,
            vars,
            extra,
            ..k.clone()
        };
        out.operands[i] = inputs;
        out.members[i] = members;
        out.kernels[i] = Some(fused);
        let decision = inlinable(f, i, &ks, &out, &users);
        out.inlined[i] = decision.is_ok();
        out.decisions[i] = match decision {
            Ok(why) => FusionDecision::Inlined(why),
            Err(why) => FusionDecision::Own(why),
        };
    }
    fuse_gemm_epilogues(f, &producer, &mut out, chains, limits);
    fuse_gemm_chains(f, &mut out, chains, limits);
    stores::store_through_layouts(f, &mut out, limits.strided_operands);
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

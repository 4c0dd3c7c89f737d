//! A scatter by its updates sorted by target ([`Mapper::scatter_sorted`]): the general form
//! for a scatter too large for a thread per output element to scan every update (see
//! `scatter.rs`), deterministic and bit for bit the sequential result.
//!
//! 1. A launch (a thread per update, grid-stride) writes each update's flat target, or the
//!    output's size where the target is out of bounds (an element no thread owns), and its
//!    position in row-major update order.
//! 2. The pairs are sorted by target, stably, by the GPU sort of a `sort` by keys
//!    (`gpu/sort.rs`: a block's bitonic network, tiles across launches, or the radix sort,
//!    as the number of updates calls for): the sort orders by key, then position, so equal
//!    targets keep their update order.
//! 3. A launch of a thread per output element (grid-stride) finds its element's run of
//!    targets by two binary searches, reads its element from the operand, combines the
//!    run's updates in order and stores it once.
//!
//! Every element thus receives its updates in the sequential order, with no atomics and
//! each element written by one thread. The cost is the sort (`O(n)` a radix pass) and
//! `log2 n` loads a thread, where a scan would take every update per element.

use super::select_scatter::narrowed;
use super::*;
use crate::gpu::sort::keys_program;
use kiln_ir::{Builder, ComparisonDirection, Op};

/// A scatter's updates and their targets, as the mappings of `scatter.rs` and
/// [`Mapper::scatter_sorted`] read them.
#[derive(Clone)]
pub(super) struct Targets {
    /// The updates' shape.
    pub(super) shape: Vec<usize>,
    /// The register holding the update's position.
    pub(super) update: usize,
    /// Statements setting the update variables from `update`, evaluating the target's
    /// indices and setting `inb` to whether they are in bounds.
    pub(super) target: Vec<Stmt>,
    pub(super) inb: usize,
    /// The target's flat position (valid where `inb`).
    pub(super) flat: Sc,
}

/// A `sort` by its first operand's elements, ascending, of `operands` operands.
fn sort_op(key: DType, operands: usize) -> Option<Op> {
    let mut b = Builder::new("comparator");
    let ps: Vec<_> = (0..operands)
        .flat_map(|_| [TensorType::scalar(key), TensorType::scalar(key)])
        .map(|t| b.param(t))
        .collect();
    let lt = b.compare(ps[0], ps[1], ComparisonDirection::Lt).ok()?;
    Some(Op::Sort {
        dimension: 0,
        is_stable: true,
        comparator: Box::new(b.finish(&[lt]).ok()?),
    })
}

/// `b` with its launch-level buffer names moved: inputs `Input(i)` to `ins[i]`, outputs
/// `Output(k)` to `outs[k]`, scratch `Scratch(s)` to `Scratch(s + base)`.
fn renamed(b: Buf, ins: &[Buf], outs: &[Buf], base: usize) -> Buf {
    match b {
        Buf::Input(i) => ins[i],
        Buf::Output(k) => outs[k],
        Buf::Scratch(s) => Buf::Scratch(s + base),
    }
}

impl Mapper<'_> {
    /// The scatter `k` by its updates sorted by target (see the module's doc); `None` where
    /// the GPU sort does not take the keys (then the caller runs it on one thread).
    pub(super) fn scatter_sorted(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        kind: Combiner,
        t: Targets,
        mut r: Regs,
    ) -> Option<GpuProgram> {
        let total = k.out.numel();
        let n: usize = t.shape.iter().product();
        // Targets up to the output's size (the out-of-bounds mark) in the narrowest key.
        let key = if total < i32::MAX as usize && n < i32::MAX as usize {
            DType::I32
        } else {
            DType::I64
        };
        let pairs = vec![TensorType::new(key, [n]), TensorType::new(key, [n])];
        let sort = keys_program(
            &sort_op(key, 2)?,
            &pairs,
            self.gpu,
            self.sums,
            &format!("{name}_sort"),
            None,
        )?;
        // Scratch: the targets and positions, then sorted, then the sort's own.
        let (keys, order, sorted_keys, sorted_order) = (0, 1, 2, 3);
        let mut scratch = pairs.clone();
        scratch.extend(pairs.iter().cloned());
        let base = scratch.len();
        scratch.extend(sort.scratch.iter().cloned());
        let block = self.gpu.elementwise_block;
        let warp = self.gpu.warp_size;
        let first = Sc::plus(
            Sc::times(sp(Special::Block), sp(Special::BlockDim)),
            sp(Special::Thread),
        );
        let stride = Sc::times(sp(Special::BlockDim), sp(Special::GridDim));

        // 1. The targets.
        let mark = r.next();
        let mut each = t.target;
        each.push(Stmt::Let {
            reg: mark,
            value: Sc::plus(
                Sc::times(Sc::Reg(t.inb), t.flat),
                Sc::times(
                    Sc::plus(c(1), Sc::times(Sc::Reg(t.inb), Sc::Const(-1))),
                    c(total),
                ),
            ),
        });
        each.push(Stmt::Store {
            buf: Buf::Output(0),
            index: Sc::Reg(t.update),
            value: mark,
        });
        each.push(Stmt::Store {
            buf: Buf::Output(1),
            index: Sc::Reg(t.update),
            value: t.update,
        });
        let mut launches = vec![GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: format!("{name}_targets"),
            kind: MapKind::Scatter,
            grid: self.grid(n, block),
            block,
            warp,
            inputs: inputs.clone(),
            outputs: vec![
                (Buf::Scratch(keys), pairs[0].clone()),
                (Buf::Scratch(order), pairs[1].clone()),
            ],
            shared: Vec::new(),
            regs: r.0,
            vars: k.vars,
            sums: self.sums,
            body: vec![Stmt::For {
                reg: t.update,
                start: first.clone(),
                end: c(n),
                step: stride.clone(),
                body: each,
            }],
        }];

        // 2. The sort, on the scratch buffers.
        let sort_ins = [Buf::Scratch(keys), Buf::Scratch(order)];
        let sort_outs = [Buf::Scratch(sorted_keys), Buf::Scratch(sorted_order)];
        for mut l in sort.launches {
            for (b, _) in l.inputs.iter_mut().chain(l.outputs.iter_mut()) {
                *b = renamed(*b, &sort_ins, &sort_outs, base);
            }
            launches.push(l);
        }

        // 3. A thread per element: its run of the sorted targets, combined in order.
        let mut r = Regs::default();
        let [p, lo, hi, mid, at, below, step, from, to, j, pos] = r.array();
        let (acc, value) = (r.next(), r.next());
        let (run_keys, run_order) = (inputs.len(), inputs.len() + 1);
        let steps = usize::BITS as usize - n.leading_zeros() as usize + 1;
        // The first sorted position whose target is not below `v` (into `out`).
        let search = |v: Sc, out: usize| {
            vec![
                Stmt::Let {
                    reg: lo,
                    value: c(0),
                },
                Stmt::Let {
                    reg: hi,
                    value: c(n),
                },
                Stmt::For {
                    reg: step,
                    start: c(0),
                    end: c(steps),
                    step: c(1),
                    body: vec![Stmt::If {
                        cond: Sc::lt(Sc::Reg(lo), Sc::Reg(hi)),
                        body: vec![
                            Stmt::Let {
                                reg: mid,
                                value: Sc::quot(Sc::plus(Sc::Reg(lo), Sc::Reg(hi)), c(2)),
                            },
                            Stmt::Load {
                                reg: at,
                                buf: Buf::Input(run_keys),
                                index: Sc::Reg(mid),
                            },
                            Stmt::Let {
                                reg: below,
                                value: Sc::lt(Sc::Reg(at), v.clone()),
                            },
                            // lo = mid + 1 where below, hi = mid where not.
                            Stmt::Let {
                                reg: hi,
                                value: Sc::plus(
                                    Sc::Reg(hi),
                                    Sc::times(
                                        Sc::plus(c(1), Sc::times(Sc::Reg(below), Sc::Const(-1))),
                                        Sc::plus(
                                            Sc::Reg(mid),
                                            Sc::times(Sc::Reg(hi), Sc::Const(-1)),
                                        ),
                                    ),
                                ),
                            },
                            Stmt::Let {
                                reg: lo,
                                value: Sc::plus(
                                    Sc::Reg(lo),
                                    Sc::times(
                                        Sc::Reg(below),
                                        Sc::plus(
                                            Sc::plus(Sc::Reg(mid), c(1)),
                                            Sc::times(Sc::Reg(lo), Sc::Const(-1)),
                                        ),
                                    ),
                                ),
                            },
                        ],
                    }],
                },
                Stmt::Let {
                    reg: out,
                    value: Sc::Reg(lo),
                },
            ]
        };
        let mut combine = vec![Stmt::Load {
            reg: pos,
            buf: Buf::Input(run_order),
            index: Sc::Reg(j),
        }];
        combine.extend(set_vars(&dims(&t.shape, 0), Sc::Reg(pos)));
        combine.push(Stmt::Eval {
            reg: value,
            expr: k.body.clone(),
            scalars: Vec::new(),
        });
        combine.push(Stmt::Combine {
            acc,
            value,
            kind,
            dtype: k.out.dtype,
        });
        combine.extend(narrowed(acc, p, k.out.dtype));
        let mut body = search(Sc::Reg(p), from);
        body.extend(search(Sc::plus(Sc::Reg(p), c(1)), to));
        body.push(Stmt::Load {
            reg: acc,
            buf: Buf::Input(0),
            index: Sc::Reg(p),
        });
        body.push(Stmt::For {
            reg: j,
            start: Sc::Reg(from),
            end: Sc::Reg(to),
            step: c(1),
            body: combine,
        });
        body.push(Stmt::Store {
            buf: Buf::Output(0),
            index: Sc::Reg(p),
            value: acc,
        });
        let mut ins = inputs;
        ins.push((Buf::Scratch(sorted_keys), pairs[0].clone()));
        ins.push((Buf::Scratch(sorted_order), pairs[1].clone()));
        launches.push(GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind: MapKind::Scatter,
            grid: self.grid(total, block),
            block,
            warp,
            inputs: ins,
            outputs: vec![(Buf::Output(0), k.out.clone())],
            shared: Vec::new(),
            regs: r.0,
            vars: k.vars,
            sums: self.sums,
            body: vec![Stmt::For {
                reg: p,
                start: first,
                end: c(total),
                step: stride,
                body,
            }],
        });
        Some(GpuProgram::new(scratch, launches))
    }
}

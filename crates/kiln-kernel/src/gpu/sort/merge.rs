//! A sort by any comparator the kernels can evaluate: a thread per slice running the
//! reference's merge sort (`kiln_reference::merge_sort_by`), comparison for comparison.
//!
//! The comparator region becomes one kernel expression (`crate::fold::fold_body`: elementwise
//! ops and scalar constants) over the two elements' values, operand by operand, as the region
//! takes them. The thread sorts its slice's positions (`0..n`, in a scratch buffer) by a
//! top-down merge sort with the reference's shape: a segment of at most 8 positions is sorted
//! by insertion (a position moves left past those it goes before, not past equals); a longer
//! one splits at half its length (rounded down), both halves are sorted, then merged, the
//! right half's element taken first only when the comparator says it goes before the left's.
//! Since the slice's length is known, so is the whole tree of segments: the thread walks it
//! bottom-up, depth by depth, each segment's bounds computed from its index at its depth by
//! the halvings that lead to it, and the segments below a leaf skipped. Each segment sees the
//! same comparisons in the same order as the reference's recursion makes, so any comparator,
//! a strict weak order or not (a float `LT` meeting a NaN), gives the reference's
//! permutation. Each operand's slice is then written in that order, read from the operand, so
//! every element keeps its bits.
//!
//! It is the form for comparators that are not one key's order (by absolute value, by two
//! keys, a float `LT` that leaves NaN unordered). Its cost is a thread's `O(n log n)`
//! comparisons per slice, with `2n` positions of scratch per slice: it suits many short
//! slices, not one long one (a sort by keys takes the block-wide network or the radix sort).

use super::c;
use crate::gpu::ir::{Buf, GpuKernel, GpuProgram, MapKind, Sc, Stmt};
use crate::ir::Expr;
use crate::target::{Gpu, SumTree};
use kiln_ir::{DType, Func, TensorType};

/// The longest segment sorted by insertion (the reference's).
const INSERTION: usize = 8;

/// The program sorting slices of length `n` along dimension `d` of operands of types `ins`
/// by `comparator`, its launch named `name`; `None` when the comparator is not one kernel
/// expression or an operand is complex or a float narrower than 16 bits.
pub(super) fn program(
    comparator: &Func,
    ins: &[TensorType],
    d: usize,
    gpu: &Gpu,
    sums: SumTree,
    name: &str,
) -> Option<GpuProgram> {
    if ins
        .iter()
        .any(|t| t.dtype.is_complex() || t.dtype.mini().is_some())
    {
        return None;
    }
    let [less] = &crate::fold::fold_body(comparator).ok()?[..] else {
        return None;
    };
    if less.dtype() != DType::Pred {
        return None;
    }
    let shape = &ins.first()?.shape;
    let n = *shape.get(d)?;
    let inner: usize = shape[d + 1..].iter().product();
    let total: usize = shape.iter().product();
    if total == 0 {
        // Nothing to sort: every result is empty.
        return Some(GpuProgram::new(Vec::new(), Vec::new()));
    }
    let rows = total / n;
    let mut m = Merger {
        n,
        inner,
        inputs: ins.len(),
        regs: 0,
        less: args_as_scalars(less, ins.len()),
    };
    let body = m.slice(ins.len());
    let block = rows
        .div_ceil(gpu.warp_size)
        .saturating_mul(gpu.warp_size)
        .min(gpu.elementwise_block)
        .max(gpu.warp_size);
    let grid = rows.div_ceil(block).min(gpu.sms * gpu.blocks_per_sm).max(1);
    let positions = TensorType::new(DType::I64, [rows * n]);
    let mut outputs: Vec<(Buf, TensorType)> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| (Buf::Output(i), t.clone()))
        .collect();
    outputs.push((Buf::Scratch(0), positions.clone()));
    outputs.push((Buf::Scratch(1), positions.clone()));
    Some(GpuProgram::new(
        vec![positions.clone(), positions],
        vec![GpuKernel {
            name: name.to_string(),
            kind: MapKind::Sort,
            grid,
            block,
            warp: gpu.warp_size,
            inputs: ins
                .iter()
                .enumerate()
                .map(|(i, t)| (Buf::Input(i), t.clone()))
                .collect(),
            outputs,
            shared: Vec::new(),
            dynamic_shared: 0,
            regs: m.regs,
            vars: 0,
            sums,
            tensor_maps: Vec::new(),
            body: vec![Stmt::grid_stride(ROW, c(rows), body)],
        }],
    ))
}

/// `e` with the fold body's argument `slot` read as value register `inputs + slot` of an
/// [`Stmt::Eval`]'s scalars.
fn args_as_scalars(e: &Expr, inputs: usize) -> Expr {
    match e {
        Expr::Arg { slot, dtype } => Expr::Load {
            input: inputs + slot,
            dtype: *dtype,
            coef: Vec::new(),
            off: 0,
        },
        Expr::Op { op, dtype, args } => Expr::Op {
            op: op.clone(),
            dtype: *dtype,
            args: args.iter().map(|a| args_as_scalars(a, inputs)).collect(),
        },
        other => other.clone(),
    }
}

/// The register holding the thread's slice.
const ROW: usize = 0;

fn reg(r: usize) -> Sc {
    Sc::Reg(r)
}

/// What the statements of one merge sort depend on.
struct Merger {
    /// The slices' length and their stride apart in memory.
    n: usize,
    inner: usize,
    /// The launch's inputs (the operands).
    inputs: usize,
    /// Registers allocated.
    regs: usize,
    /// The comparator: whether the first element goes before the second, over the scalars
    /// `a_0, b_0, a_1, b_1, ...` (each operand's two elements).
    less: Expr,
}

impl Merger {
    fn reg(&mut self) -> usize {
        self.regs = self.regs.max(ROW + 1);
        self.regs += 1;
        self.regs - 1
    }

    /// The global index of position `i` of the thread's slice.
    fn at(&self, i: Sc) -> Sc {
        let inner = c(self.inner);
        Sc::plus(
            Sc::plus(
                Sc::times(Sc::quot(reg(ROW), inner.clone()), c(self.n * self.inner)),
                Sc::times(i, inner.clone()),
            ),
            Sc::modulo(reg(ROW), inner),
        )
    }

    /// Element `i` of the thread's slice of a positions buffer.
    fn slot(&self, i: Sc) -> Sc {
        Sc::plus(Sc::times(reg(ROW), c(self.n)), i)
    }

    /// `less = comparator(a, b)` of the slice's positions in registers `pa` and `pb`, each
    /// operand's elements loaded into `elems` (two registers per operand).
    fn compare(&self, less: usize, pa: usize, pb: usize, elems: &[usize]) -> Vec<Stmt> {
        let mut out = Vec::new();
        for o in 0..self.inputs {
            for (k, p) in [pa, pb].into_iter().enumerate() {
                out.push(Stmt::Load {
                    reg: elems[2 * o + k],
                    buf: Buf::Input(o),
                    index: self.at(reg(p)),
                });
            }
        }
        out.push(Stmt::Eval {
            reg: less,
            expr: self.less.clone(),
            scalars: elems.to_vec(),
        });
        out
    }

    /// The thread's whole sort of slice `ROW`: its positions in order, the tree of segments
    /// bottom-up, then each operand's slice (output `o`) in the sorted order. `outs` is the
    /// number of the operands' outputs (the scratch buffers come after them).
    fn slice(&mut self, outs: usize) -> Vec<Stmt> {
        let (p_buf, q_buf) = (Buf::Output(outs), Buf::Output(outs + 1));
        let n = self.n;
        let elems: Vec<usize> = (0..2 * self.inputs).map(|_| self.reg()).collect();
        let [
            e,
            pos,
            start,
            len,
            plen,
            i,
            j,
            k,
            t,
            mid,
            end,
            pa,
            pb,
            less,
            take,
            moving,
            out,
        ] = std::array::from_fn(|_| self.reg());
        // The deepest level of the tree: where every segment has at most 8 positions (a
        // level's segments are all ⌊n/2^d⌋ or ⌈n/2^d⌉ long).
        let mut depth = 0;
        while n.div_ceil(1 << depth) > INSERTION {
            depth += 1;
        }
        let mut body = vec![Stmt::count_up(
            e,
            c(0),
            c(n),
            vec![
                Stmt::Let {
                    reg: pos,
                    value: reg(e),
                },
                Stmt::Store {
                    buf: p_buf,
                    index: self.slot(reg(e)),
                    value: pos,
                },
            ],
        )];
        // Insertion into [start, start + len): position i moves left while the comparator
        // puts it before its left neighbour.
        let step_left = vec![
            Stmt::Load {
                reg: pa,
                buf: p_buf,
                index: self.slot(reg(j)),
            },
            Stmt::Load {
                reg: pb,
                buf: p_buf,
                index: self.slot(Sc::minus(reg(j), c(1))),
            },
        ]
        .into_iter()
        .chain(self.compare(less, pa, pb, &elems))
        .chain([
            Stmt::If {
                cond: reg(less),
                body: vec![
                    Stmt::Store {
                        buf: p_buf,
                        index: self.slot(reg(j)),
                        value: pb,
                    },
                    Stmt::Store {
                        buf: p_buf,
                        index: self.slot(Sc::minus(reg(j), c(1))),
                        value: pa,
                    },
                    Stmt::Let {
                        reg: j,
                        value: Sc::minus(reg(j), c(1)),
                    },
                ],
            },
            Stmt::If {
                cond: Sc::is_zero(reg(less)),
                body: vec![Stmt::Let {
                    reg: moving,
                    value: c(0),
                }],
            },
        ])
        .collect();
        let insertion = Stmt::count_up(
            i,
            Sc::plus(reg(start), c(1)),
            reg(end),
            vec![
                Stmt::Let {
                    reg: j,
                    value: reg(i),
                },
                Stmt::Let {
                    reg: moving,
                    value: c(1),
                },
                Stmt::count_up(
                    t,
                    reg(start),
                    reg(i),
                    vec![Stmt::If {
                        cond: reg(moving),
                        body: step_left,
                    }],
                ),
            ],
        );
        // The merge of [start, mid) and [mid, end), copied to Q first: the right half's
        // element first only when it goes before the left's.
        let mut decide = vec![
            Stmt::Load {
                reg: pa,
                buf: q_buf,
                index: self.slot(reg(j)),
            },
            Stmt::Load {
                reg: pb,
                buf: q_buf,
                index: self.slot(reg(i)),
            },
        ];
        decide.extend(self.compare(less, pa, pb, &elems));
        decide.push(Stmt::Let {
            reg: take,
            value: reg(less),
        });
        let take_from = |from: usize, next: usize| -> Vec<Stmt> {
            vec![
                Stmt::Load {
                    reg: pa,
                    buf: q_buf,
                    index: self.slot(reg(from)),
                },
                Stmt::Store {
                    buf: p_buf,
                    index: self.slot(reg(out)),
                    value: pa,
                },
                Stmt::Let {
                    reg: next,
                    value: Sc::plus(reg(from), c(1)),
                },
            ]
        };
        let merge = vec![
            Stmt::count_up(
                e,
                reg(start),
                reg(end),
                vec![
                    Stmt::Load {
                        reg: pa,
                        buf: p_buf,
                        index: self.slot(reg(e)),
                    },
                    Stmt::Store {
                        buf: q_buf,
                        index: self.slot(reg(e)),
                        value: pa,
                    },
                ],
            ),
            Stmt::Let {
                reg: i,
                value: reg(start),
            },
            Stmt::Let {
                reg: j,
                value: reg(mid),
            },
            Stmt::count_up(
                out,
                reg(start),
                reg(end),
                vec![
                    Stmt::Let {
                        reg: take,
                        value: c(0),
                    },
                    Stmt::If {
                        cond: Sc::lt(reg(j), reg(end)),
                        body: vec![
                            Stmt::If {
                                cond: Sc::eq(reg(i), reg(mid)),
                                body: vec![Stmt::Let {
                                    reg: take,
                                    value: c(1),
                                }],
                            },
                            Stmt::If {
                                cond: Sc::lt(reg(i), reg(mid)),
                                body: decide,
                            },
                        ],
                    },
                    Stmt::If {
                        cond: reg(take),
                        body: take_from(j, j),
                    },
                    Stmt::If {
                        cond: Sc::is_zero(reg(take)),
                        body: take_from(i, i),
                    },
                ],
            ),
        ];
        for level in (0..=depth).rev() {
            // Segment k of this level: from the whole slice, halve `level` times, taking the
            // right half where k's bit (from the highest) is set.
            let mut segment = vec![
                Stmt::Let {
                    reg: start,
                    value: c(0),
                },
                Stmt::Let {
                    reg: len,
                    value: c(n),
                },
                // A parent longer than any leaf, at the root.
                Stmt::Let {
                    reg: plen,
                    value: c(n.max(INSERTION + 1)),
                },
            ];
            for b in 0..level {
                let bit = Sc::modulo(Sc::quot(reg(k), c(1 << (level - 1 - b))), c(2));
                let half = Sc::quot(reg(len), c(2));
                segment.extend([
                    Stmt::Let {
                        reg: plen,
                        value: reg(len),
                    },
                    Stmt::Let {
                        reg: start,
                        value: Sc::plus(reg(start), Sc::times(bit.clone(), half.clone())),
                    },
                    // The left half is ⌊len/2⌋ long, the right one the rest.
                    Stmt::Let {
                        reg: len,
                        value: Sc::plus(
                            half.clone(),
                            Sc::times(bit, Sc::minus(reg(len), Sc::times(half, c(2)))),
                        ),
                    },
                ]);
            }
            let exists = Sc::lt(c(INSERTION), reg(plen));
            let leaf = Sc::lt(reg(len), c(INSERTION + 1));
            segment.extend([
                Stmt::Let {
                    reg: end,
                    value: Sc::plus(reg(start), reg(len)),
                },
                Stmt::Let {
                    reg: mid,
                    value: Sc::plus(reg(start), Sc::quot(reg(len), c(2))),
                },
                Stmt::If {
                    cond: Sc::and(exists.clone(), leaf.clone()),
                    body: vec![insertion.clone()],
                },
                Stmt::If {
                    cond: Sc::and(exists, Sc::is_zero(leaf)),
                    body: merge.clone(),
                },
            ]);
            body.push(Stmt::count_up(k, c(0), c(1 << level), segment));
        }
        // Each operand's slice in the sorted order.
        for o in 0..self.inputs {
            body.push(Stmt::count_up(
                e,
                c(0),
                c(n),
                vec![
                    Stmt::Load {
                        reg: pos,
                        buf: p_buf,
                        index: self.slot(reg(e)),
                    },
                    Stmt::Load {
                        reg: elems[2 * o],
                        buf: Buf::Input(o),
                        index: self.at(reg(pos)),
                    },
                    Stmt::Store {
                        buf: Buf::Output(o),
                        index: self.at(reg(e)),
                        value: elems[2 * o],
                    },
                ],
            ));
        }
        body
    }
}

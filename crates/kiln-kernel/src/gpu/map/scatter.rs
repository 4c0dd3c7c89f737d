//! Scatters and select-and-scatters on the GPU, each update combined in order, so that the
//! result is deterministic (see the parent module).
//!
//! A scatter whose update dimensions include some that each address one whole output
//! dimension by themselves (the target index along it is that update variable, and both have
//! the same extent: an embedding's gradient, whose rows are scattered and whose columns are
//! the window; a batched scatter's batch) runs a thread per position of those
//! dimensions: two positions never meet at an output element, and each thread copies the
//! operand's elements it owns, then combines its updates in the order of the others. Every
//! output element then sees its updates in the order one thread would, so the result is the
//! sequential scatter's bit for bit. Any other scatter runs on one thread, in order.

use super::*;

/// The update variables that each address one whole output dimension alone, as
/// `(variable, output dimension)` by output dimension (see the module's doc): the target
/// index along that dimension is the variable itself, of the dimension's extent, so updates
/// at two values of it never meet (whatever the other target indices read).
fn parallel_dims(target: &[Idx], updates: &[usize], out: &[usize]) -> Vec<(usize, usize)> {
    let alone = |i: &Idx| match i {
        Idx::Var(v) => Some(*v),
        Idx::Add(parts) => match parts.as_slice() {
            [Idx::Var(v)] => Some(*v),
            _ => None,
        },
        _ => None,
    };
    let mut found: Vec<(usize, usize)> = Vec::new();
    for (d, t) in target.iter().enumerate() {
        if let Some(v) = alone(t)
            && updates.get(v) == Some(&out[d])
            && !found.iter().any(|f| f.0 == v)
        {
            found.push((v, d));
        }
    }
    found
}

impl Mapper<'_> {
    /// A scatter: the operand copied, then each update combined in order where its target is
    /// in bounds; by a thread per position of its parallel dimensions where it has some, else
    /// on thread 0 of one warp (see the module's doc).
    pub(super) fn scatter(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        updates: &[usize],
        target: &[Idx],
        kind: Combiner,
    ) -> GpuKernel {
        let mut r = Regs::default();
        let (p, old, x, flat, inb) = (r.next(), r.next(), r.next(), r.next(), r.next());
        let total = k.out.numel();
        let dtype = k.out.dtype;
        let copy = Stmt::For {
            reg: p,
            start: c(0),
            end: c(total),
            step: c(1),
            body: vec![
                Stmt::Load {
                    reg: old,
                    buf: Buf::Input(0),
                    index: Sc::Reg(p),
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: Sc::Reg(p),
                    value: old,
                },
            ],
        };
        let u = r.next();
        let mut each = set_vars(&dims(updates, 0), Sc::Reg(u));
        let mut stride = 1i64;
        let mut flat_sc = Sc::Const(0);
        let mut in_bounds = Sc::Const(1);
        for (d, t) in target.iter().enumerate().rev() {
            let reg = r.next();
            each.push(Stmt::Eval {
                reg,
                expr: Expr::Index {
                    idx: t.clone(),
                    dtype: DType::I64,
                },
                scalars: Vec::new(),
            });
            let size = k.out.shape[d] as i64;
            in_bounds = Sc::and(
                in_bounds,
                Sc::and(
                    Sc::lt(Sc::Const(-1), Sc::Reg(reg)),
                    Sc::lt(Sc::Reg(reg), Sc::Const(size)),
                ),
            );
            flat_sc = Sc::plus(flat_sc, Sc::times(Sc::Reg(reg), Sc::Const(stride)));
            stride *= size;
        }
        each.push(Stmt::Let {
            reg: inb,
            value: in_bounds,
        });
        each.push(Stmt::If {
            cond: Sc::Reg(inb),
            body: vec![
                Stmt::Let {
                    reg: flat,
                    value: flat_sc,
                },
                Stmt::Load {
                    reg: old,
                    buf: Buf::Output(0),
                    index: Sc::Reg(flat),
                },
                Stmt::Eval {
                    reg: x,
                    expr: k.body.clone(),
                    scalars: Vec::new(),
                },
                Stmt::Combine {
                    acc: old,
                    value: x,
                    kind,
                    dtype,
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: Sc::Reg(flat),
                    value: old,
                },
            ],
        });
        let parallel = parallel_dims(target, updates, &k.out.shape);
        if !parallel.is_empty() {
            // `each` without its first statements, which set every update variable.
            let combine = each.split_off(updates.len());
            return self.scatter_by_dims(name, k, inputs, updates, &parallel, combine, r);
        }
        let updates_total: usize = updates.iter().product();
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind: MapKind::Scatter,
            grid: 1,
            block: self.gpu.warp_size,
            warp: self.gpu.warp_size,
            inputs,
            outputs: vec![(Buf::Output(0), k.out.clone())],
            shared: Vec::new(),
            regs: r.0,
            vars: k.vars.max(updates.len()),
            sums: self.sums,
            body: vec![Stmt::If {
                cond: Sc::eq(sp(Special::Thread), c(0)),
                body: vec![
                    copy,
                    Stmt::For {
                        reg: u,
                        start: c(0),
                        end: c(updates_total),
                        step: c(1),
                        body: each,
                    },
                ],
            }],
        }
    }
}

impl Mapper<'_> {
    /// The scatter `k` by a thread per position of its `parallel` dimensions (from
    /// [`parallel_dims`]): the thread's variables set from its index, its output elements
    /// copied from the operand, then `each` (one update's combination, `r` its registers) run
    /// over the other update dimensions in order.
    #[allow(clippy::too_many_arguments)]
    fn scatter_by_dims(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        updates: &[usize],
        parallel: &[(usize, usize)],
        each: Vec<Stmt>,
        mut r: Regs,
    ) -> GpuKernel {
        let (t, q, u, old) = (r.next(), r.next(), r.next(), r.next());
        let shape = &k.out.shape;
        let threads: usize = parallel.iter().map(|&(_, d)| shape[d]).product();
        let own: Vec<(usize, usize)> = parallel.iter().map(|&(v, d)| (v, shape[d])).collect();
        let rest: Vec<(usize, usize)> = (0..updates.len())
            .filter(|v| !parallel.iter().any(|p| p.0 == *v))
            .map(|v| (v, updates[v]))
            .collect();
        // The flat output position of the thread's element `q` (its dimensions' coordinates
        // the thread's variables, the others the row-major digits of `q`).
        let others: Vec<usize> = (0..shape.len())
            .filter(|d| !parallel.iter().any(|p| p.1 == *d))
            .collect();
        let (mut flat, mut stride, mut digit) = (Sc::Const(0), 1usize, 1usize);
        for d in (0..shape.len()).rev() {
            let coord = match parallel.iter().find(|p| p.1 == d) {
                Some(&(v, _)) => Sc::Var(v),
                None => {
                    let x = Sc::modulo(Sc::quot(Sc::Reg(q), c(digit)), c(shape[d]));
                    digit *= shape[d];
                    x
                }
            };
            flat = Sc::plus(flat, Sc::times(coord, c(stride)));
            stride *= shape[d];
        }
        let copied: usize = others.iter().map(|&d| shape[d]).product();
        let mut body = set_vars(&own, Sc::Reg(t));
        body.push(Stmt::For {
            reg: q,
            start: c(0),
            end: c(copied),
            step: c(1),
            body: vec![
                Stmt::Load {
                    reg: old,
                    buf: Buf::Input(0),
                    index: flat.clone(),
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: flat,
                    value: old,
                },
            ],
        });
        let mut step = set_vars(&rest, Sc::Reg(u));
        step.extend(each);
        body.push(Stmt::For {
            reg: u,
            start: c(0),
            end: c(rest.iter().map(|x| x.1).product()),
            step: c(1),
            body: step,
        });
        let warp = self.gpu.warp_size;
        let block = self
            .gpu
            .elementwise_block
            .min(threads.div_ceil(warp) * warp)
            .max(warp);
        GpuKernel {
            tensor_maps: Vec::new(),
            name: name.to_string(),
            kind: MapKind::Scatter,
            // At least one block, though an empty output leaves it nothing to do.
            grid: threads.div_ceil(block).max(1),
            block,
            warp,
            inputs,
            outputs: vec![(Buf::Output(0), k.out.clone())],
            shared: Vec::new(),
            dynamic_shared: 0,
            regs: r.0,
            vars: k.vars.max(updates.len()),
            sums: self.sums,
            body: vec![
                Stmt::Let {
                    reg: t,
                    value: Sc::plus(
                        Sc::times(sp(Special::Block), sp(Special::BlockDim)),
                        sp(Special::Thread),
                    ),
                },
                Stmt::If {
                    cond: Sc::lt(Sc::Reg(t), c(threads)),
                    body,
                },
            ],
        }
    }
}

/// A select-and-scatter's windows (see [`Schedule::SelectScatter`]).
pub(super) struct SelectWindows<'s> {
    pub(super) grid: &'s [usize],
    pub(super) window: &'s [usize],
    pub(super) strides: &'s [i64],
    pub(super) pad_low: &'s [i64],
    pub(super) select: kiln_ir::ComparisonDirection,
    pub(super) kind: Combiner,
}

impl Mapper<'_> {
    /// A select-and-scatter on thread 0 of one warp, as [`Schedule::SelectScatter`] says: the
    /// output set to the init value (input 2), then for each window of the operand (input 0),
    /// in order, its valid positions scanned in order keeping the current selection where
    /// `select(current, candidate)` holds, and the source value (the body) combined into the
    /// output at the selected position.
    pub(super) fn select_scatter(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        w: &SelectWindows,
    ) -> GpuKernel {
        let mut r = Regs::default();
        let dtype = k.out.dtype;
        let rank = k.out.shape.len();
        let total = k.out.numel();
        let (p, init, g, have, u, ok, pos, cand, cur, keep, best, old, src) = (
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
        );
        let scalar = |i: usize| Expr::Load {
            input: inputs.len() + i,
            dtype,
            coef: Vec::new(),
            off: 0,
        };
        let fill = vec![
            Stmt::Eval {
                reg: init,
                expr: Expr::Load {
                    input: 2,
                    dtype,
                    coef: Vec::new(),
                    off: 0,
                },
                scalars: Vec::new(),
            },
            Stmt::For {
                reg: p,
                start: c(0),
                end: c(total),
                step: c(1),
                body: vec![Stmt::Store {
                    buf: Buf::Output(0),
                    index: Sc::Reg(p),
                    value: init,
                }],
            },
        ];
        let window_vars: Vec<(usize, usize)> = w
            .window
            .iter()
            .enumerate()
            .map(|(d, &e)| (rank + d, e))
            .collect();
        let mut scan = set_vars(&window_vars, Sc::Reg(u));
        let mut valid = Sc::Const(1);
        let mut flat = Sc::Const(0);
        let mut stride = 1i64;
        for d in (0..rank).rev() {
            let coord = Sc::plus(
                Sc::plus(
                    Sc::times(Sc::Var(d), Sc::Const(w.strides[d])),
                    Sc::Const(-w.pad_low[d]),
                ),
                Sc::Var(rank + d),
            );
            let size = k.out.shape[d] as i64;
            valid = Sc::and(
                valid,
                Sc::and(
                    Sc::lt(Sc::Const(-1), coord.clone()),
                    Sc::lt(coord.clone(), Sc::Const(size)),
                ),
            );
            flat = Sc::plus(flat, Sc::times(coord, Sc::Const(stride)));
            stride *= size;
        }
        scan.push(Stmt::Let {
            reg: ok,
            value: valid,
        });
        scan.push(Stmt::If {
            cond: Sc::Reg(ok),
            body: vec![
                Stmt::Let {
                    reg: pos,
                    value: flat,
                },
                Stmt::Load {
                    reg: cand,
                    buf: Buf::Input(0),
                    index: Sc::Reg(pos),
                },
                Stmt::Eval {
                    reg: keep,
                    expr: Expr::Op {
                        op: Ew::Cmp(w.select),
                        dtype: DType::Pred,
                        args: vec![scalar(0), scalar(1)],
                    },
                    scalars: vec![cur, cand],
                },
                Stmt::If {
                    cond: Sc::eq(Sc::and(Sc::Reg(have), Sc::Reg(keep)), c(0)),
                    body: vec![
                        Stmt::Combine {
                            acc: cur,
                            value: cand,
                            kind: Combiner::Replace,
                            dtype,
                        },
                        Stmt::Let {
                            reg: best,
                            value: Sc::Reg(pos),
                        },
                    ],
                },
                Stmt::Let {
                    reg: have,
                    value: c(1),
                },
            ],
        });
        let mut each = set_vars(&dims(w.grid, 0), Sc::Reg(g));
        each.push(Stmt::Let {
            reg: have,
            value: c(0),
        });
        each.push(Stmt::For {
            reg: u,
            start: c(0),
            end: c(w.window.iter().product()),
            step: c(1),
            body: scan,
        });
        each.push(Stmt::If {
            cond: Sc::Reg(have),
            body: vec![
                Stmt::Load {
                    reg: old,
                    buf: Buf::Output(0),
                    index: Sc::Reg(best),
                },
                Stmt::Eval {
                    reg: src,
                    expr: k.body.clone(),
                    scalars: Vec::new(),
                },
                Stmt::Combine {
                    acc: old,
                    value: src,
                    kind: w.kind,
                    dtype,
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: Sc::Reg(best),
                    value: old,
                },
            ],
        });
        let mut body = fill;
        body.push(Stmt::For {
            reg: g,
            start: c(0),
            end: c(w.grid.iter().product()),
            step: c(1),
            body: each,
        });
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind: MapKind::SelectScatter,
            grid: 1,
            block: self.gpu.warp_size,
            warp: self.gpu.warp_size,
            inputs,
            outputs: vec![(Buf::Output(0), k.out.clone())],
            shared: Vec::new(),
            regs: r.0,
            vars: k.vars.max(2 * rank),
            sums: self.sums,
            body: vec![Stmt::If {
                cond: Sc::eq(sp(Special::Thread), c(0)),
                body,
            }],
        }
    }
}

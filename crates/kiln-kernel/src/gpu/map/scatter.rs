//! Scatters and select-and-scatters on the GPU: one thread, in order (see the parent
//! module).

use super::*;

impl Mapper<'_> {
    /// A scatter on thread 0 of one warp: the operand copied, then each update combined in
    /// order where its target is in bounds.
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
        let updates_total: usize = updates.iter().product();
        GpuKernel {
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

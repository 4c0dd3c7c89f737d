//! The mapping of kernels onto the GPU ([`map`]): which threads compute what, decided from
//! [`crate::target::Gpu`] and [`crate::target::SumTree`], never from constants.
//!
//! - A loop nest without long reductions runs as a grid-stride loop over its output, one
//!   element per thread per iteration, the grid filling every multiprocessor
//!   (`sms * blocks_per_sm` blocks at most) ([`MapKind::Elementwise`]).
//! - A loop nest whose reductions depend on the output's leading dimensions only (a row's
//!   sum, maximum, mean; softmax's maximum and denominator) and are at least
//!   `warp_reduce_min` long runs one warp per row ([`MapKind::WarpRows`]), or one block of
//!   `max_threads_per_block` threads per row from `block_reduce_min` on
//!   ([`MapKind::BlockRows`]). Each reduction is computed once per row, innermost first, by
//!   all the row's threads together, then the row's elements are computed thread-strided with
//!   the reductions read from registers.
//! - A matrix product runs one thread per output element over the whole contraction, with its
//!   epilogue (and a chained second product) as further launches over a scratch buffer
//!   ([`MapKind::Gemm`]). This is a first, correct mapping: tensor cores
//!   (`Gpu::tensor_core_shapes`), tiles in shared memory and an epilogue fused into the
//!   product's launch come later.
//! - A scatter runs on one thread, in order, so its result is deterministic
//!   ([`MapKind::Scatter`]), and so does a select-and-scatter ([`MapKind::SelectScatter`]).
//!
//! # The order of a cooperative sum, and its error bound
//!
//! A row's reduction of `N` terms over `T` threads (a warp or a block) is cut into chunks of
//! `c = clamp(⌈N / T⌉, 1, leaf)` consecutive terms (`leaf` of [`SumTree`]); thread `t` adds
//! chunks `t, t + T, t + 2T, ...`, each chunk in one chain from the reduction's identity, the
//! chunk results in a second chain; the threads' results are combined by a fixed butterfly
//! of `log2(warp)` shuffle levels (every lane ends with the same value: a float sum or
//! maximum is commutative bit for bit), and for a block, the warps' results by one more such
//! tree in warp 0 through shared memory. Finally the reduction's start value is combined
//! with the total. The order is fixed by the geometry, so results are deterministic. A term
//! passes through at most `leaf + ⌈N / (T · leaf)⌉ + log2(T)` roundings, against the
//! `K(n, r) = leaf + fanout · ⌈log_fanout(n / leaf)⌉ + fanout · r` of `ir-specs/ops/reduce.md`:
//! within it for every `N <= T · leaf · fanout` (1,048,576 terms per warp-mapped row and
//! 4,194,304 per block-mapped row with the defaults; longer warp rows are block rows, and
//! block rows longer than that exceed the stated bound by `⌈N / (T · leaf)⌉ - fanout`
//! roundings). Reductions inside a thread's own expression (short ones, and those of matrix
//! products over the contraction) run as [`SumTree`] says, as on the CPU.

use super::ir::*;
use crate::access::free_vars;
use crate::ir::{ConvPatches, Ew, Expr, Idx, Kernel, Rewriter, Schedule, Visitor};
use crate::target::{Gpu, SumTree, TargetInfo};
use kiln_ir::{Combiner, DType, OpKind, TensorType};

/// `k` (with inputs of types `inputs`, extra outputs after them) mapped onto the GPU of
/// `target`, its launches named after `name`; an error for a target without a GPU.
pub fn map(
    k: &Kernel,
    inputs: &[TensorType],
    target: &TargetInfo,
    name: &str,
) -> Result<GpuProgram, String> {
    let gpu = target
        .gpu
        .as_ref()
        .ok_or_else(|| format!("{name}: the target has no GPU"))?;
    let m = Mapper {
        gpu,
        sums: target.sums,
    };
    let ins: Vec<(Buf, TensorType)> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (Buf::Input(i), t.clone()))
        .collect();
    match &k.schedule {
        Schedule::Nest => {
            let mut outs = vec![(Buf::Output(0), k.out.clone(), k.body.clone())];
            for (e, x) in k.extra.iter().enumerate() {
                outs.push((Buf::Output(1 + e), x.out.clone(), x.body.clone()));
            }
            Ok(GpuProgram {
                scratch: Vec::new(),
                launches: vec![m.nest(name, &k.out, k.vars, ins, outs)],
            })
        }
        Schedule::Gemm { .. } => m.gemm(name, k, ins),
        Schedule::Scatter {
            updates,
            target: at,
            kind,
        } => Ok(GpuProgram {
            scratch: Vec::new(),
            launches: vec![m.scatter(name, k, ins, updates, at, *kind)],
        }),
        Schedule::SelectScatter {
            grid,
            window,
            strides,
            pad_low,
            select,
            kind,
        } => Ok(GpuProgram {
            scratch: Vec::new(),
            launches: vec![m.select_scatter(
                name,
                k,
                ins,
                &SelectWindows {
                    grid,
                    window,
                    strides,
                    pad_low,
                    select: *select,
                    kind: *kind,
                },
            )],
        }),
    }
}

struct Mapper<'g> {
    gpu: &'g Gpu,
    sums: SumTree,
}

/// Register numbering of one launch.
#[derive(Default)]
struct Regs(usize);

impl Regs {
    fn next(&mut self) -> usize {
        self.0 += 1;
        self.0 - 1
    }
}

fn c(x: usize) -> Sc {
    Sc::Const(x as i64)
}

fn sp(s: Special) -> Sc {
    Sc::Special(s)
}

/// Statements setting each variable `vars[d].0` to its digit of the row-major position `p`
/// over the extents `vars[d].1`.
fn set_vars(vars: &[(usize, usize)], p: Sc) -> Vec<Stmt> {
    let mut stride = 1;
    let mut out = Vec::with_capacity(vars.len());
    for (d, &(v, e)) in vars.iter().enumerate().rev() {
        let mut x = p.clone();
        if stride != 1 {
            x = Sc::quot(x, c(stride));
        }
        if d != 0 {
            x = Sc::modulo(x, c(e));
        }
        out.push(Stmt::SetVar { var: v, value: x });
        stride *= e;
    }
    out.reverse();
    out
}

/// `(var, extent)` for dimensions `from..` of `shape`, numbered from `from`.
fn dims(shape: &[usize], from: usize) -> Vec<(usize, usize)> {
    shape
        .iter()
        .enumerate()
        .skip(from)
        .map(|(d, &e)| (d, e))
        .collect()
}

/// The reductions of `bodies` that depend on the first `rank` variables only, innermost
/// first, each once.
fn hoistable(bodies: &[&Expr], rank: usize) -> Vec<Expr> {
    struct Walk {
        rank: usize,
        out: Vec<Expr>,
    }
    impl<'e> Visitor<'e> for Walk {
        fn expr(&mut self, e: &'e Expr) {
            e.for_each_child(self);
            if matches!(e, Expr::Reduce { .. })
                && free_vars(e).iter().all(|&v| v < self.rank)
                && !self.out.contains(e)
            {
                self.out.push(e.clone());
            }
        }
    }
    let mut w = Walk {
        rank,
        out: Vec::new(),
    };
    for b in bodies {
        w.expr(b);
    }
    w.out
}

/// `e` with each of `hoisted` replaced by a load of the scalar input `first + i`.
fn substituted(e: &Expr, hoisted: &[Expr], first: usize, vars: usize) -> Expr {
    struct Sub<'h> {
        hoisted: &'h [Expr],
        first: usize,
        vars: usize,
    }
    impl Rewriter for Sub<'_> {
        fn expr(&mut self, e: &Expr) -> Expr {
            match self.hoisted.iter().position(|h| h == e) {
                Some(i) => Expr::Load {
                    input: self.first + i,
                    dtype: e.dtype(),
                    coef: vec![0; self.vars],
                    off: 0,
                },
                None => e.map_children(self),
            }
        }
    }
    Sub {
        hoisted,
        first,
        vars,
    }
    .expr(e)
}

fn extent(vars: &[(usize, usize)]) -> usize {
    vars.iter().map(|v| v.1).product()
}

impl Mapper<'_> {
    /// The grid of a grid-stride loop over `total` items in blocks of `block` threads.
    fn grid(&self, total: usize, block: usize) -> usize {
        total
            .div_ceil(block)
            .clamp(1, self.gpu.sms * self.gpu.blocks_per_sm)
    }

    /// A loop nest over `out`'s index space with `vars` loop variables, storing each of `outs`
    /// (`(buffer, type, body)`) at every position.
    fn nest(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: Vec<(Buf, TensorType)>,
        outs: Vec<(Buf, TensorType, Expr)>,
    ) -> GpuKernel {
        let rank = out.shape.len();
        let bodies: Vec<&Expr> = outs.iter().map(|o| &o.2).collect();
        let hoisted = hoistable(&bodies, rank);
        let longest = hoisted
            .iter()
            .map(|h| match h {
                Expr::Reduce { vars, .. } => extent(vars),
                _ => 0,
            })
            .max()
            .unwrap_or(0);
        if longest < self.gpu.warp_reduce_min {
            return self.elementwise(name, out, vars, inputs, outs);
        }
        self.rows(name, out, vars, inputs, outs, hoisted, longest)
    }

    fn elementwise(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: Vec<(Buf, TensorType)>,
        outs: Vec<(Buf, TensorType, Expr)>,
    ) -> GpuKernel {
        let mut r = Regs::default();
        let p = r.next();
        let total = out.numel();
        let block = self.gpu.elementwise_block;
        let mut body = set_vars(&dims(&out.shape, 0), Sc::Reg(p));
        let mut outputs = Vec::new();
        for (k, (buf, ty, e)) in outs.into_iter().enumerate() {
            let v = r.next();
            body.push(Stmt::Eval {
                reg: v,
                expr: e,
                scalars: Vec::new(),
            });
            body.push(Stmt::Store {
                buf: Buf::Output(k),
                index: Sc::Reg(p),
                value: v,
            });
            outputs.push((buf, ty));
        }
        GpuKernel {
            name: name.to_string(),
            kind: MapKind::Elementwise,
            grid: self.grid(total, block),
            block,
            warp: self.gpu.warp_size,
            inputs,
            outputs,
            shared: Vec::new(),
            regs: r.0,
            vars,
            sums: self.sums,
            body: vec![Stmt::For {
                reg: p,
                start: Sc::plus(
                    Sc::times(sp(Special::Block), sp(Special::BlockDim)),
                    sp(Special::Thread),
                ),
                end: c(total),
                step: Sc::times(sp(Special::BlockDim), sp(Special::GridDim)),
                body,
            }],
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rows(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: Vec<(Buf, TensorType)>,
        outs: Vec<(Buf, TensorType, Expr)>,
        hoisted: Vec<Expr>,
        longest: usize,
    ) -> GpuKernel {
        let warp = self.gpu.warp_size;
        let (kind, threads) = if longest >= self.gpu.block_reduce_min {
            (MapKind::BlockRows, self.gpu.max_threads_per_block)
        } else {
            (MapKind::WarpRows, warp)
        };
        // The row: the leading dimensions every hoisted reduction depends on.
        let split = hoisted
            .iter()
            .flat_map(free_vars)
            .map(|v| v + 1)
            .max()
            .unwrap_or(0);
        let rows: usize = out.shape[..split].iter().product();
        let row_len: usize = out.shape[split..].iter().product();
        let first = inputs.len();
        let mut r = Regs::default();
        let row = r.next();
        let mut shared = Vec::new();
        let mut body = set_vars(&dims(&out.shape[..split], 0), Sc::Reg(row));
        let mut scalars = Vec::new();
        for (i, h) in hoisted.iter().enumerate() {
            let h = substituted(h, &hoisted[..i], first, vars);
            let s = self.cooperative(&h, threads, &scalars, &mut r, &mut shared, &mut body);
            scalars.push(s);
        }
        let e = r.next();
        let mut each = set_vars(&dims(&out.shape, split), Sc::Reg(e));
        let pos = r.next();
        each.push(Stmt::Let {
            reg: pos,
            value: Sc::plus(Sc::times(Sc::Reg(row), c(row_len)), Sc::Reg(e)),
        });
        let mut outputs = Vec::new();
        for (k, (buf, ty, x)) in outs.into_iter().enumerate() {
            let v = r.next();
            each.push(Stmt::Eval {
                reg: v,
                expr: substituted(&x, &hoisted, first, vars),
                scalars: scalars.clone(),
            });
            each.push(Stmt::Store {
                buf: Buf::Output(k),
                index: Sc::Reg(pos),
                value: v,
            });
            outputs.push((buf, ty));
        }
        body.push(Stmt::For {
            reg: e,
            start: sp(Special::Thread),
            end: c(row_len),
            step: sp(Special::BlockDim),
            body: each,
        });
        GpuKernel {
            name: name.to_string(),
            kind,
            grid: rows.clamp(1, self.gpu.sms * self.gpu.blocks_per_sm),
            block: threads,
            warp,
            inputs,
            outputs,
            shared,
            regs: r.0,
            vars,
            sums: self.sums,
            body: vec![Stmt::For {
                reg: row,
                start: sp(Special::Block),
                end: c(rows),
                step: sp(Special::GridDim),
                body,
            }],
        }
    }

    /// Statements computing the reduction `h` by all `threads` threads of the block together
    /// (see the module documentation for the order), leaving the result in the register
    /// returned, the same in every thread.
    fn cooperative(
        &self,
        h: &Expr,
        threads: usize,
        scalars: &[usize],
        r: &mut Regs,
        shared: &mut Vec<SharedArray>,
        out: &mut Vec<Stmt>,
    ) -> usize {
        let Expr::Reduce {
            kind,
            dtype,
            init,
            vars,
            body,
        } = h
        else {
            unreachable!("hoisted reductions only")
        };
        let (kind, dtype) = (*kind, *dtype);
        let warp = self.gpu.warp_size;
        let n = extent(vars);
        let chunk = n.div_ceil(threads).clamp(1, self.sums.leaf);
        let rounds = n.div_ceil(chunk).div_ceil(threads);
        let (acc, part, round, j, q, x, t) = (
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
            r.next(),
        );
        out.push(Stmt::Identity {
            reg: acc,
            kind,
            dtype,
        });
        let mut term = vec![Stmt::Let {
            reg: q,
            value: Sc::plus(
                Sc::times(
                    Sc::plus(Sc::times(Sc::Reg(round), c(threads)), sp(Special::Thread)),
                    c(chunk),
                ),
                Sc::Reg(j),
            ),
        }];
        let mut inside = set_vars(vars, Sc::Reg(q));
        inside.push(Stmt::Eval {
            reg: x,
            expr: (**body).clone(),
            scalars: scalars.to_vec(),
        });
        inside.push(Stmt::Combine {
            acc: part,
            value: x,
            kind,
            dtype,
        });
        term.push(Stmt::If {
            cond: Sc::lt(Sc::Reg(q), c(n)),
            body: inside,
        });
        out.push(Stmt::For {
            reg: round,
            start: c(0),
            end: c(rounds),
            step: c(1),
            body: vec![
                Stmt::Identity {
                    reg: part,
                    kind,
                    dtype,
                },
                Stmt::For {
                    reg: j,
                    start: c(0),
                    end: c(chunk),
                    step: c(1),
                    body: term,
                },
                Stmt::Combine {
                    acc,
                    value: part,
                    kind,
                    dtype,
                },
            ],
        });
        let tree = |upto: usize| -> Vec<Stmt> {
            let mut s = Vec::new();
            let mut off = upto / 2;
            while off >= 1 {
                s.push(Stmt::Shuffle {
                    reg: t,
                    src: acc,
                    mode: Shuffle::Xor(off),
                });
                s.push(Stmt::Combine {
                    acc,
                    value: t,
                    kind,
                    dtype,
                });
                off /= 2;
            }
            s
        };
        out.extend(tree(warp));
        if threads > warp {
            let warps = threads / warp;
            let (partials, total) = (shared.len(), shared.len() + 1);
            shared.push(SharedArray { dtype, len: warps });
            shared.push(SharedArray { dtype, len: 1 });
            let lane0 = Sc::eq(sp(Special::Lane), c(0));
            out.push(Stmt::If {
                cond: lane0.clone(),
                body: vec![Stmt::SharedStore {
                    array: partials,
                    index: sp(Special::Warp),
                    value: acc,
                }],
            });
            out.push(Stmt::Barrier);
            let mut first_warp = vec![
                Stmt::Identity {
                    reg: acc,
                    kind,
                    dtype,
                },
                Stmt::If {
                    cond: Sc::lt(sp(Special::Lane), c(warps)),
                    body: vec![Stmt::SharedLoad {
                        reg: acc,
                        array: partials,
                        index: sp(Special::Lane),
                    }],
                },
            ];
            first_warp.extend(tree(warps.next_power_of_two().min(warp)));
            first_warp.push(Stmt::If {
                cond: lane0,
                body: vec![Stmt::SharedStore {
                    array: total,
                    index: c(0),
                    value: acc,
                }],
            });
            out.push(Stmt::If {
                cond: Sc::eq(sp(Special::Warp), c(0)),
                body: first_warp,
            });
            out.push(Stmt::Barrier);
            out.push(Stmt::SharedLoad {
                reg: acc,
                array: total,
                index: c(0),
            });
        }
        let result = r.next();
        out.push(Stmt::Eval {
            reg: result,
            expr: (**init).clone(),
            scalars: scalars.to_vec(),
        });
        out.push(Stmt::Combine {
            acc: result,
            value: acc,
            kind,
            dtype,
        });
        result
    }

    /// A matrix product (with its epilogue and chained product, see the module
    /// documentation).
    fn gemm(
        &self,
        name: &str,
        k: &Kernel,
        mut ins: Vec<(Buf, TensorType)>,
    ) -> Result<GpuProgram, String> {
        let Schedule::Gemm {
            epilogue,
            batch,
            m,
            n,
            k: kk,
            conv,
            a_trans,
            b_trans,
            chain,
        } = &k.schedule
        else {
            unreachable!("a GEMM kernel")
        };
        let (a, b) = match (ins.first(), ins.get(1)) {
            (Some(a), Some(b)) => (a.clone(), b.clone()),
            _ => return Err(format!("{name}: a matrix product needs two inputs")),
        };
        let mut scratch = Vec::new();
        let mut launches = Vec::new();
        let product_to = if epilogue.is_none() && chain.is_none() {
            (Buf::Output(0), k.out.clone())
        } else {
            scratch.push(k.out.clone());
            (Buf::Scratch(0), k.out.clone())
        };
        let dims = Product {
            batch: *batch,
            m: *m,
            n: *n,
            k: *kk,
            a_trans: *a_trans,
            b_trans: *b_trans,
        };
        launches.push(self.product(
            &format!("{name}.product"),
            a,
            b,
            &dims,
            conv.as_ref(),
            product_to.clone(),
        ));
        if let Some(e) = epilogue {
            let to = if chain.is_some() {
                scratch.push(k.out.clone());
                (Buf::Scratch(1), k.out.clone())
            } else {
                (Buf::Output(0), k.out.clone())
            };
            while ins.len() <= *e {
                ins.push((Buf::Scratch(0), k.out.clone()));
            }
            ins[*e] = product_to.clone();
            launches.push(self.nest(
                &format!("{name}.epilogue"),
                &k.out,
                k.vars,
                ins.clone(),
                vec![(to.0, to.1, k.body.clone())],
            ));
        }
        if let Some(ch) = chain {
            let a = (
                if epilogue.is_some() {
                    Buf::Scratch(1)
                } else {
                    Buf::Scratch(0)
                },
                k.out.clone(),
            );
            let b = ins
                .get(ch.b)
                .cloned()
                .ok_or_else(|| format!("{name}: no input {} for the chained product", ch.b))?;
            let dims = Product {
                batch: *batch,
                m: *m,
                n: ch.n,
                k: *n,
                a_trans: false,
                b_trans: ch.b_trans,
            };
            launches.push(self.product(
                &format!("{name}.chain"),
                a,
                b,
                &dims,
                None,
                (Buf::Output(0), ch.out.clone()),
            ));
        }
        Ok(GpuProgram { scratch, launches })
    }

    /// One thread per element of the product `a x b`, stored at its place in `out` (by
    /// feature planes for a convolution that asks for them).
    fn product(
        &self,
        name: &str,
        a: (Buf, TensorType),
        b: (Buf, TensorType),
        d: &Product,
        conv: Option<&ConvPatches>,
        out: (Buf, TensorType),
    ) -> GpuKernel {
        let dtype = out.1.dtype;
        let (m, n, kk) = (d.m as i64, d.n as i64, d.k as i64);
        let as_out = |e: Expr| {
            if e.dtype() == dtype {
                e
            } else {
                Expr::Op {
                    op: Ew::Convert,
                    dtype,
                    args: vec![e],
                }
            }
        };
        let a_elem = match conv {
            None => Expr::Load {
                input: 0,
                dtype: a.1.dtype,
                coef: if d.a_trans {
                    vec![kk * m, 1, 0, m]
                } else {
                    vec![m * kk, kk, 0, 1]
                },
                off: 0,
            },
            Some(p) => Expr::Gather {
                input: 0,
                dtype: a.1.dtype,
                index: vec![patch_index(p, m)],
                strides: vec![1],
            },
        };
        let b_coef = match (conv.is_some(), d.b_trans) {
            (true, false) => vec![0, 0, 1, n],
            (true, true) => vec![0, 0, kk, 1],
            (false, false) => vec![kk * n, 0, 1, n],
            (false, true) => vec![n * kk, 0, kk, 1],
        };
        let b_elem = Expr::Load {
            input: 1,
            dtype: b.1.dtype,
            coef: b_coef,
            off: 0,
        };
        let body = Expr::Reduce {
            kind: Combiner::Add,
            dtype,
            init: Box::new(Expr::Const { dtype, value: 0.0 }),
            vars: vec![(3, d.k)],
            body: Box::new(Expr::Op {
                op: Ew::Kind(OpKind::Multiply),
                dtype,
                args: vec![as_out(a_elem), as_out(b_elem)],
            }),
        };
        let mut r = Regs::default();
        let p = r.next();
        let v = r.next();
        let total = d.batch * d.m * d.n;
        let index = match conv {
            Some(c) if c.planes => Sc::plus(
                Sc::times(
                    Sc::plus(Sc::times(Sc::Var(0), Sc::Const(n)), Sc::Var(2)),
                    Sc::Const(m),
                ),
                Sc::Var(1),
            ),
            _ => Sc::Reg(p),
        };
        let mut each = set_vars(&[(0, d.batch), (1, d.m), (2, d.n)], Sc::Reg(p));
        each.push(Stmt::Eval {
            reg: v,
            expr: body,
            scalars: Vec::new(),
        });
        each.push(Stmt::Store {
            buf: Buf::Output(0),
            index,
            value: v,
        });
        let block = self.gpu.elementwise_block;
        GpuKernel {
            name: name.to_string(),
            kind: MapKind::Gemm,
            grid: self.grid(total, block),
            block,
            warp: self.gpu.warp_size,
            inputs: vec![a, b],
            outputs: vec![out],
            shared: Vec::new(),
            regs: r.0,
            vars: 4,
            sums: self.sums,
            body: vec![Stmt::For {
                reg: p,
                start: Sc::plus(
                    Sc::times(sp(Special::Block), sp(Special::BlockDim)),
                    sp(Special::Thread),
                ),
                end: c(total),
                step: Sc::times(sp(Special::BlockDim), sp(Special::GridDim)),
                body: each,
            }],
        }
    }

    /// A scatter on thread 0 of one warp: the operand copied, then each update combined in
    /// order where its target is in bounds.
    fn scatter(
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
struct SelectWindows<'s> {
    grid: &'s [usize],
    window: &'s [usize],
    strides: &'s [i64],
    pad_low: &'s [i64],
    select: kiln_ir::ComparisonDirection,
    kind: Combiner,
}

impl Mapper<'_> {
    /// A select-and-scatter on thread 0 of one warp, as [`Schedule::SelectScatter`] says: the
    /// output set to the init value (input 2), then for each window of the operand (input 0),
    /// in order, its valid positions scanned in order keeping the current selection where
    /// `select(current, candidate)` holds, and the source value (the body) combined into the
    /// output at the selected position.
    fn select_scatter(
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

/// The dimensions of one product launch.
struct Product {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a_trans: bool,
    b_trans: bool,
}

/// `x mod m` for `x >= 0`.
fn idx_rem(x: Idx, m: i64) -> Idx {
    Idx::Add(vec![
        x.clone(),
        Idx::Mul(Box::new(Idx::Div(Box::new(x), m)), -m),
    ])
}

/// The flat input element of row `(var 0) * m + (var 1)`, column `var 3` of a convolution's
/// patch matrix.
fn patch_index(p: &ConvPatches, m: i64) -> Idx {
    let g = Idx::Add(vec![Idx::Mul(Box::new(Idx::Var(0)), m), Idx::Var(1)]);
    let plane = (p.oh * p.ow) as i64;
    let img = Idx::Div(Box::new(g.clone()), plane);
    let within = idx_rem(g, plane);
    let y = Idx::Div(Box::new(within.clone()), p.ow as i64);
    let x = idx_rem(within, p.ow as i64);
    let col = Idx::Var(3);
    let kh = Idx::Div(Box::new(col.clone()), (p.kw * p.c) as i64);
    let kw = idx_rem(Idx::Div(Box::new(col.clone()), p.c as i64), p.kw as i64);
    let ch = idx_rem(col, p.c as i64);
    let row = Idx::Add(vec![
        Idx::Mul(Box::new(img), p.h as i64),
        Idx::Mul(Box::new(y), p.stride[0] as i64),
        Idx::Mul(Box::new(kh), p.dilation[0] as i64),
    ]);
    let column = Idx::Add(vec![
        Idx::Mul(Box::new(row), p.w as i64),
        Idx::Mul(Box::new(x), p.stride[1] as i64),
        Idx::Mul(Box::new(kw), p.dilation[1] as i64),
    ]);
    Idx::Add(vec![Idx::Mul(Box::new(column), p.c as i64), ch])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::print::{program_text, verify};
    use crate::options::Options;

    /// The launches of the first kernel of `src` lowered for an H200.
    fn mapped(src: &str) -> GpuProgram {
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let target = TargetInfo::h200();
        let l = crate::pipeline::lower_program(
            &f,
            &[],
            &Options::default(),
            &target,
            None,
            &mut |_| {},
        )
        .expect("lowers");
        let i = l
            .fused
            .kernels
            .iter()
            .position(Option::is_some)
            .expect("a kernel");
        let ins: Vec<TensorType> = l.fused.operands[i]
            .iter()
            .map(|v| l.func.values[v.index()].clone())
            .collect();
        let p = map(l.fused.kernels[i].as_ref().unwrap(), &ins, &target, "k").expect("maps");
        for k in &p.launches {
            verify(k, target.gpu.as_ref().unwrap()).expect("verifies");
        }
        p
    }

    fn row_sum(shape: &str, out: &str) -> String {
        format!(
            "func @main(%0: f32[{shape}]) -> f32[{out}] {{\n  %1 = constant {{value = 0.0}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [1], kind = add}} : f32[{out}]\n  return %2\n}}\n"
        )
    }

    #[test]
    fn elementwise_kernels_fill_every_multiprocessor_with_grid_stride_loops() {
        let p = mapped(
            "func @main(%0: f32[1000000], %1: f32[1000000]) -> f32[1000000] {\n  %2 = add %0, %1 : f32[1000000]\n  return %2\n}\n",
        );
        let k = &p.launches[0];
        assert_eq!(
            (k.kind, k.grid, k.block),
            (MapKind::Elementwise, 132 * 8, 256)
        );
        let small = mapped(
            "func @main(%0: f32[300]) -> f32[300] {\n  %1 = exponential %0 : f32[300]\n  return %1\n}\n",
        );
        assert_eq!(small.launches[0].grid, 2);
    }

    #[test]
    fn long_rows_get_a_warp_or_a_block_and_short_ones_a_thread() {
        let short = mapped(&row_sum("64,100", "64"));
        assert_eq!(short.launches[0].kind, MapKind::Elementwise);
        let warp = mapped(&row_sum("64,1000", "64"));
        let k = &warp.launches[0];
        assert_eq!((k.kind, k.grid, k.block), (MapKind::WarpRows, 64, 32));
        let text = program_text(&warp);
        assert!(
            text.contains("shfl.bfly r") && !text.contains("barrier"),
            "{text}"
        );
        let block = mapped(&row_sum("3,100000", "3"));
        let k = &block.launches[0];
        assert_eq!((k.kind, k.grid, k.block), (MapKind::BlockRows, 3, 1024));
        let text = program_text(&block);
        assert_eq!(text.matches("barrier").count(), 2, "{text}");
        assert!(text.contains("shared0: f32[32]"), "{text}");
    }

    #[test]
    fn a_target_without_a_gpu_maps_nothing() {
        let f = kiln_ir::parse_func_text(&row_sum("2,3", "2")).unwrap();
        let ks = crate::pipeline::kernels(&f);
        let k = ks.iter().flatten().next().unwrap();
        let e = map(k, &[f.values[0].clone()], &TargetInfo::reference(), "k").unwrap_err();
        assert!(e.contains("no GPU"), "{e}");
    }
}

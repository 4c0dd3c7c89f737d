//! Long reductions split over many blocks, in two launches, deterministic: full reductions
//! ([`MapKind::SplitPartials`]) and column reductions ([`MapKind::ColumnPartials`]).
//!
//! A loop nest whose reductions depend on its output's leading dimensions (the rows) runs a
//! warp or a block per row (`mod.rs`). That leaves the GPU idle when there are few rows and
//! long reductions (a sum over a whole tensor: one row, one block of the
//! multiprocessors), and reads with a stride when the reduced dimension is outer and the kept
//! one inner and contiguous (a column sum, `f32[N, C]` over `N`: a warp per column reading
//! `C` apart). Both run in two launches instead, each reduction's partial results in a
//! scratch buffer between them:
//!
//! - **full** (the row mapping would take fewer blocks than the GPU has multiprocessors, and
//!   the reductions are longer than `block_reduce_min`): each row's terms are cut into `K`
//!   consecutive slices, `K = min(⌈sms · blocks_per_sm / rows⌉, ⌈n / block_reduce_min⌉)`
//!   (at least 2), and block `(row, k)` of `elementwise_block` threads (whole warps, at most
//!   a warp of warps) reduces slice `k` as a row's block does (threads striding over the
//!   slice, chunk chains, the chunk tree, shuffles, the warps' results through shared
//!   memory), without the start value, into partial `row · K + k`;
//! - **columns** (every term read contiguous along the innermost kept dimension and strided
//!   along the reduction): a thread per kept position, consecutive threads on consecutive
//!   columns (coalesced), and `K = min(⌈sms · blocks_per_sm / tiles⌉, ⌈n / warp_reduce_min⌉,
//!   warp_reduce_min - 1)` blocks of rows (slices of the reduction) per tile of columns; a
//!   thread reduces its column's slice in `SumTree` order into partial `k · rows + row`.
//!
//! Both apply to loop nests with one output element per row (the reductions and what is
//! computed from them: sums, norms, losses, a bias gradient). The second launch is the loop
//! nest itself with each reduction replaced by the reduction of its `K` partials, in order,
//! with the original start value, mapped as any loop nest (on the H200 a thread per row: `K`
//! is short), so producers fused into the terms run in the first launch and the epilogue
//! (and extra outputs) in the second. `K` and every slice follow from the shape and the
//! target only, so the results are the same bits on every run (and on any grid the partials
//! launch is given: its blocks loop over the slices). `K` is at most the sum tree's `fanout`,
//! or a multiple of it up to `fanout²`, so that the partials meet in one or two levels of
//! `fanout` chains: the levels of the tree that the slices, `K` times shorter than the rows,
//! no longer take, which keeps a term's roundings within the bound of
//! `ir-specs/ops/reduce.md` as the row mapping's are (see `mod.rs`). Reductions
//! that read another one (softmax's sum of `exp(x - max)`) stay with the row mapping, which
//! computes them in one pass.
//!
//! Where the options allow float atomics ([`Options::float_atomics`]) and every output is an
//! f32 sum and nothing else (a sum over a whole tensor, a bias gradient; not a mean, whose
//! epilogue needs the whole sum), the split runs in one launch instead: the same blocks
//! ([`MapKind::SplitAtomic`]) or threads ([`MapKind::ColumnAtomic`]) over the same slices,
//! each adding its slice's sum into its output element by [`Stmt::AtomicAdd`], the first
//! slice's with the reduction's start value added, into outputs the program zeroes first
//! ([`GpuProgram::zeroed`]; negative zero, the sum's identity). No scratch and no second
//! launch. Each partial is computed as before; only the last step changes: the `K` partials
//! meet in a chain of `K` additions, in whatever order the hardware runs them, instead of one
//! or two levels of `fanout` chains, so the last bits vary from run to run.

use super::*;

/// Where a split's first launch puts each reduction's result.
enum Sink<'a> {
    /// Reduction `i`'s partials into scratch buffer `i`, which the second launch reduces.
    Scratch,
    /// Added atomically into the outputs `(buffer, type, reduction)`, zeroed before the
    /// launch; the first slice adds the reduction's start value too.
    Atomic(&'a [(Buf, TensorType, usize)]),
}

/// How a loop nest's reductions are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// `K` slices of each row's terms, a block each.
    Full(usize),
    /// `K` slices of each column's terms, a thread each.
    Columns(usize),
}

impl Mapper<'_> {
    /// The launches of a loop nest over `out` ([`Mapper::nest`]): two when its reductions
    /// split (see the module documentation), else one.
    pub(super) fn nest_program(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: Vec<(Buf, TensorType)>,
        outs: Vec<(Buf, TensorType, Expr)>,
    ) -> GpuProgram {
        let bodies: Vec<&Expr> = outs.iter().map(|o| &o.2).collect();
        let hoisted = hoistable(&bodies, out.shape.len());
        match self.split_of(out, &hoisted) {
            Some((split, rows, how)) => match self.atomic_sums(&outs, &hoisted) {
                Some(adds) => {
                    let sink = Sink::Atomic(&adds);
                    let launch = self.partials(
                        name,
                        out,
                        vars,
                        &inputs,
                        &hoisted,
                        (split, rows, how),
                        &sink,
                    );
                    GpuProgram {
                        scratch: Vec::new(),
                        zeroed: adds.iter().map(|(b, t, _)| (*b, t.clone())).collect(),
                        launches: vec![launch],
                    }
                }
                None => {
                    self.split_launches(name, out, vars, inputs, outs, &hoisted, (split, rows, how))
                }
            },
            None => GpuProgram {
                scratch: Vec::new(),
                zeroed: Vec::new(),
                launches: vec![self.nest(name, out, vars, inputs, outs)],
            },
        }
    }

    /// Whether and how `hoisted` split: the row dimensions, the rows and the split.
    fn split_of(&self, out: &TensorType, hoisted: &[Expr]) -> Option<(usize, usize, Split)> {
        let longest = hoisted.iter().map(extent_of).max().unwrap_or(0);
        if longest < self.gpu.warp_reduce_min {
            return None;
        }
        // Independent reductions only: none reads another.
        for (i, h) in hoisted.iter().enumerate() {
            if substituted(h, &hoisted[..i], usize::MAX / 2, 0) != *h {
                return None;
            }
        }
        let split = row_rank(hoisted);
        // One output element per row: the second launch computes each from its partials
        // once. (Elements over a long row, a row scaled by its sum, keep the row mapping,
        // whose block or warp computes the sum once for all of them.)
        if out.shape[split..].iter().product::<usize>() != 1 {
            return None;
        }
        let rows: usize = out.shape[..split].iter().product();
        if rows == 0 {
            // An empty output: the row mapping's one idle block.
            return None;
        }
        let blocks = self.gpu.sms * self.gpu.blocks_per_sm;
        if split > 0 && hoisted.iter().all(|h| columnar(h, split - 1)) {
            let tiles = rows.div_ceil(self.partials_block()).max(1);
            let k = blocks
                .div_ceil(tiles)
                .min(longest.div_ceil(self.gpu.warp_reduce_min.max(1)))
                .min(self.gpu.warp_reduce_min.saturating_sub(1))
                .max(1);
            return Some((split, rows, Split::Columns(self.slices(k))));
        }
        let per_block = if longest >= self.gpu.block_reduce_min {
            1
        } else {
            (self.gpu.elementwise_block / self.gpu.warp_size).max(1)
        };
        if rows.div_ceil(per_block) >= self.gpu.sms {
            return None;
        }
        let k = blocks
            .div_ceil(rows.max(1))
            .min(longest.div_ceil(self.gpu.block_reduce_min.max(1)));
        (k >= 2).then_some((split, rows, Split::Full(self.slices(k))))
    }

    /// Where float atomics are allowed and every output of `outs` is an f32 sum of `hoisted`
    /// and nothing more: each output with its reduction's index (else `None`: the split's
    /// deterministic two launches).
    fn atomic_sums(
        &self,
        outs: &[(Buf, TensorType, Expr)],
        hoisted: &[Expr],
    ) -> Option<Vec<(Buf, TensorType, usize)>> {
        if !self.float_atomics {
            return None;
        }
        let keys: Vec<ValueKey> = hoisted.iter().map(value_key).collect();
        let mut adds = Vec::with_capacity(outs.len());
        for (b, t, e) in outs {
            let sum = matches!(
                e,
                Expr::Reduce {
                    kind: Combiner::Add,
                    dtype: DType::F32,
                    ..
                }
            );
            if !sum || t.dtype != DType::F32 {
                return None;
            }
            let i = keys.iter().position(|k| *k == value_key(e))?;
            adds.push((*b, t.clone(), i));
        }
        // Every reduction is one of the outputs (none computed only for an epilogue).
        (0..hoisted.len())
            .all(|i| adds.iter().any(|a| a.2 == i))
            .then_some(adds)
    }

    /// Threads of a partials block: an elementwise block's, within what a block may have and
    /// what one warp combines of the warps' results (a warp of them), whole warps.
    pub(super) fn partials_block(&self) -> usize {
        let warp = self.gpu.warp_size.max(1);
        let most = self
            .gpu
            .elementwise_block
            .min(self.gpu.max_threads_per_block)
            .min(warp * warp);
        (most - most % warp).max(warp)
    }

    /// The slices for at most `k`: `k` itself up to `fanout`, else a multiple of `fanout`
    /// below it, at most `fanout²`, so that the partials meet in a tree of one or two levels of
    /// `fanout` ([`Mapper::of_partials`]).
    fn slices(&self, k: usize) -> usize {
        let f = self.sums.fanout.max(2);
        if k <= f { k } else { (k / f * f).min(f * f) }
    }

    /// Reduction `h` (`kind`, `dtype` and start value of its own) of the `k` partials at
    /// `coef` plus `unit` each, `coef` over `vars` kernel variables, `vars` and `vars + 1`
    /// free for its own: a chain over them when `k <= fanout`, else a chain over groups of
    /// `fanout`, each a chain from its first partial (as from the identity: the same bits).
    fn of_partials(
        &self,
        h: &Expr,
        input: usize,
        k: usize,
        (coef, unit): (&[i64], i64),
        vars: usize,
    ) -> Expr {
        let Expr::Reduce {
            kind, dtype, init, ..
        } = h
        else {
            unreachable!("hoisted reductions only")
        };
        let f = self.sums.fanout.max(2);
        let (hi, lo) = (vars, vars + 1);
        let load = |at: &[(usize, i64)], off: i64| {
            let mut c = coef.to_vec();
            c.resize(vars + 2, 0);
            for &(v, x) in at {
                c[v] = x;
            }
            Expr::Load {
                input,
                dtype: *dtype,
                coef: c,
                off,
            }
        };
        let body = if k <= f {
            load(&[(hi, unit)], 0)
        } else {
            Expr::Reduce {
                kind: *kind,
                dtype: *dtype,
                init: Box::new(load(&[(hi, unit * f as i64)], 0)),
                vars: vec![(lo, f - 1)],
                body: Box::new(load(&[(hi, unit * f as i64), (lo, unit)], unit)),
            }
        };
        Expr::Reduce {
            kind: *kind,
            dtype: *dtype,
            init: init.clone(),
            vars: vec![(hi, if k <= f { k } else { k / f })],
            body: Box::new(body),
        }
    }

    /// The partials launch and the loop nest over them.
    #[allow(clippy::too_many_arguments)]
    fn split_launches(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: Vec<(Buf, TensorType)>,
        outs: Vec<(Buf, TensorType, Expr)>,
        hoisted: &[Expr],
        (split, rows, how): (usize, usize, Split),
    ) -> GpuProgram {
        let k = match how {
            Split::Full(k) | Split::Columns(k) => k,
        };
        let scratch: Vec<TensorType> = hoisted
            .iter()
            .map(|h| TensorType {
                dtype: h.dtype(),
                shape: vec![rows * k],
            })
            .collect();
        let first = self.partials(
            name,
            out,
            vars,
            &inputs,
            hoisted,
            (split, rows, how),
            &Sink::Scratch,
        );
        // The nest over the partials: reduction `i` is the reduction of partials
        // `row · K + k` (full) or `k · rows + row` (columns) over `k`, in order.
        let row_strides = {
            let mut s = vec![0i64; split];
            let mut at = 1i64;
            for d in (0..split).rev() {
                s[d] = at;
                at *= out.shape[d] as i64;
            }
            s
        };
        let mut ins = inputs.clone();
        let base = ins.len();
        let rows_coef: Vec<i64> = row_strides
            .iter()
            .map(|&s| match how {
                Split::Full(k) => s * k as i64,
                Split::Columns(_) => s,
            })
            .collect();
        let unit = match how {
            Split::Full(_) => 1,
            Split::Columns(_) => rows as i64,
        };
        let replaced: Vec<Expr> = hoisted
            .iter()
            .enumerate()
            .map(|(i, h)| self.of_partials(h, base + i, k, (&rows_coef, unit), vars))
            .collect();
        for (i, t) in scratch.iter().enumerate() {
            ins.push((Buf::Scratch(i), t.clone()));
        }
        let outs = outs
            .into_iter()
            .map(|(b, t, e)| (b, t, replace(&e, hoisted, &replaced)))
            .collect();
        let second = self.nest(name, out, vars + 2, ins, outs);
        GpuProgram {
            scratch,
            zeroed: Vec::new(),
            launches: vec![first, second],
        }
    }

    /// The first launch: each reduction's partial results into scratch buffer `i`, or added
    /// into the outputs atomically (as `sink` says: then the only launch).
    #[allow(clippy::too_many_arguments)]
    fn partials(
        &self,
        name: &str,
        out: &TensorType,
        vars: usize,
        inputs: &[(Buf, TensorType)],
        hoisted: &[Expr],
        (split, rows, how): (usize, usize, Split),
        sink: &Sink,
    ) -> GpuKernel {
        let block = self.partials_block();
        let mut r = Regs::default();
        let [blk, row, slice] = r.array();
        let mut shared = Vec::new();
        let row_vars = dims(&out.shape[..split], 0);
        let (kind, grid, mut body) = match how {
            Split::Full(k) => (
                MapKind::SplitPartials,
                rows * k,
                Self::row_and_slice(blk, (row, slice), k),
            ),
            Split::Columns(k) => {
                let tiles = rows.div_ceil(block).max(1);
                (
                    MapKind::ColumnPartials,
                    tiles * k,
                    vec![
                        Stmt::Let {
                            reg: row,
                            value: Sc::plus(
                                Sc::times(Sc::modulo(Sc::Reg(blk), c(tiles)), c(block)),
                                sp(Special::Thread),
                            ),
                        },
                        Stmt::Let {
                            reg: slice,
                            value: Sc::quot(Sc::Reg(blk), c(tiles)),
                        },
                    ],
                )
            }
        };
        let mut each = set_vars(&row_vars, Sc::Reg(row));
        let mut outputs = Vec::new();
        for (i, h) in hoisted.iter().enumerate() {
            let len = extent_of(h).div_ceil(match how {
                Split::Full(k) | Split::Columns(k) => k,
            });
            let base = Sc::times(Sc::Reg(slice), c(len));
            let team = match how {
                Split::Full(_) => Team {
                    threads: block,
                    lane: sp(Special::Thread),
                    base,
                    len,
                    combine: true,
                    init: false,
                },
                Split::Columns(_) => Team {
                    threads: 1,
                    lane: c(0),
                    base,
                    len,
                    combine: false,
                    init: false,
                },
            };
            let s = self.cooperative(
                h,
                &team,
                (None, split, vars),
                &[],
                &mut r,
                &mut shared,
                &mut each,
            );
            let put = match sink {
                Sink::Scratch => {
                    outputs.push((
                        Buf::Scratch(i),
                        TensorType {
                            dtype: h.dtype(),
                            shape: vec![grid_len(rows, how)],
                        },
                    ));
                    let at = match how {
                        Split::Full(_) => Sc::Reg(blk),
                        Split::Columns(_) => {
                            Sc::plus(Sc::times(Sc::Reg(slice), c(rows)), Sc::Reg(row))
                        }
                    };
                    vec![Stmt::Store {
                        buf: Buf::Output(i),
                        index: at,
                        value: s,
                    }]
                }
                Sink::Atomic(adds) => {
                    let Expr::Reduce { init, .. } = h else {
                        unreachable!("hoisted reductions only")
                    };
                    let start = r.next();
                    let mut put = vec![Stmt::If {
                        cond: Sc::eq(Sc::Reg(slice), c(0)),
                        body: vec![
                            Stmt::Eval {
                                reg: start,
                                expr: (**init).clone(),
                                scalars: Vec::new(),
                            },
                            Stmt::Combine {
                                acc: s,
                                value: start,
                                kind: Combiner::Add,
                                dtype: DType::F32,
                            },
                        ],
                    }];
                    for (o, _) in adds.iter().enumerate().filter(|a| a.1.2 == i) {
                        put.push(Stmt::AtomicAdd {
                            buf: Buf::Output(o),
                            index: Sc::Reg(row),
                            value: s,
                        });
                    }
                    put
                }
            };
            match how {
                // Every thread holds the block's partial; the first stores or adds it.
                Split::Full(_) => each.push(Stmt::If {
                    cond: Sc::eq(sp(Special::Thread), c(0)),
                    body: put,
                }),
                Split::Columns(_) => each.extend(put),
            }
        }
        let kind = match (sink, kind) {
            (Sink::Scratch, kind) => kind,
            (Sink::Atomic(adds), kind) => {
                outputs = adds.iter().map(|(b, t, _)| (*b, t.clone())).collect();
                if kind == MapKind::SplitPartials {
                    MapKind::SplitAtomic
                } else {
                    MapKind::ColumnAtomic
                }
            }
        };
        match how {
            Split::Full(_) => body.extend(each),
            Split::Columns(_) => body.push(Stmt::If {
                cond: Sc::lt(Sc::Reg(row), c(rows)),
                body: each,
            }),
        }
        let mut launch = self.partials_kernel(
            (name, kind),
            (inputs.to_vec(), outputs, shared),
            (r.0, vars),
            (grid, block),
            (blk, body),
        );
        if let Sink::Atomic(_) = sink {
            // The program's only launch.
            launch.name = name.to_string();
        }
        launch
    }

    /// A partials launch `name.partials` of `grid` blocks of `block` threads: register `blk`
    /// over the blocks from the block's own, a grid's worth apart (the results do not depend on
    /// the grid it is given), running `body` for each.
    pub(super) fn partials_kernel(
        &self,
        (name, kind): (&str, MapKind),
        (inputs, outputs, shared): (Buffers, Buffers, Vec<SharedArray>),
        (regs, vars): (usize, usize),
        (grid, block): (usize, usize),
        (blk, body): (usize, Vec<Stmt>),
    ) -> GpuKernel {
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: format!("{name}.partials"),
            kind,
            grid,
            block,
            warp: self.gpu.warp_size,
            inputs,
            outputs,
            shared,
            regs,
            vars,
            sums: self.sums,
            body: vec![Stmt::For {
                reg: blk,
                start: sp(Special::Block),
                end: c(grid),
                step: sp(Special::GridDim),
                body,
            }],
        }
    }

    /// The opening of a full split's partials block `blk`: its row `blk / k` and its slice
    /// `blk % k` of the row's `k`.
    pub(super) fn row_and_slice(blk: usize, (row, slice): (usize, usize), k: usize) -> Vec<Stmt> {
        vec![
            Stmt::Let {
                reg: row,
                value: Sc::quot(Sc::Reg(blk), c(k)),
            },
            Stmt::Let {
                reg: slice,
                value: Sc::modulo(Sc::Reg(blk), c(k)),
            },
        ]
    }
}

/// Partials of a split: `K` per row.
fn grid_len(rows: usize, how: Split) -> usize {
    match how {
        Split::Full(k) | Split::Columns(k) => rows * k,
    }
}

/// Whether reduction (or fold) `h` reads its terms as a column sum does: some read contiguous
/// along kept variable `kept` (coefficient ±1), none contiguous along its innermost reduced
/// one, and every read at an affine index (loads, and gathers at affine indices).
pub(super) fn columnar(h: &Expr, kept: usize) -> bool {
    let (vars, bodies): (&[(usize, usize)], Vec<&Expr>) = match h {
        Expr::Reduce { vars, body, .. } => (vars, vec![&**body]),
        Expr::Fold { fold, .. } => (&fold.vars, fold.elems.iter().collect()),
        _ => return false,
    };
    let Some(&(inner, _)) = vars.last() else {
        return false;
    };
    struct Reads {
        kept: usize,
        inner: usize,
        along_kept: bool,
        along_inner: bool,
        other: bool,
    }
    impl Visitor<'_> for Reads {
        fn expr(&mut self, e: &Expr) {
            match e {
                Expr::Load { input, .. } | Expr::Gather { input, .. } => {
                    match crate::access::affine_read(e, *input) {
                        Some((coef, _)) => {
                            let at = |v: usize| coef.get(v).copied().unwrap_or(0).abs();
                            self.along_kept |= at(self.kept) == 1;
                            self.along_inner |= at(self.inner) == 1;
                        }
                        None => self.other = true,
                    }
                }
                _ => e.for_each_child(self),
            }
        }
    }
    let mut w = Reads {
        kept,
        inner,
        along_kept: false,
        along_inner: false,
        other: false,
    };
    bodies.into_iter().for_each(|b| w.expr(b));
    w.along_kept && !w.along_inner && !w.other
}

//! Select-and-scatter on the GPU (max pooling's gradient): a thread per output element,
//! deterministic, bit for bit the sequential result of [`Schedule::SelectScatter`].
//!
//! The sequential form fills the output with the init value, then walks the windows in
//! row-major order, selects one element of each (its valid positions scanned in row-major
//! order, the current selection kept where `select(current, candidate)` holds) and combines
//! the window's source value into the output there. An output element thus receives the
//! source values of the windows that select it, in increasing window order, combined from
//! the init value.
//!
//! Here each output element `o` has a thread (a grid-stride loop over the output, blocks
//! enough for every multiprocessor as an elementwise kernel has). Along dimension `d` the
//! windows that cover `o_d` are those `g` with `g·s - pad ≤ o_d ≤ g·s - pad + w - 1`, that
//! is from `⌈(o_d + pad - w + 1) / s⌉` to `⌊(o_d + pad) / s⌋` (inside the grid): at most
//! `⌊(w - 1) / s⌋ + 1` of them. The thread visits these windows in increasing row-major
//! order, recomputes each window's selection exactly as the sequential form does (the same
//! scan, comparison and tie rule), and where the selection is its own element combines the
//! window's source value into its accumulator, which starts at the init value and is
//! stored once at the end. Every element sees the same values in the same order as the
//! sequential walk gives it, so the result is the same bits, with no atomics and no two
//! threads writing one element.
//!
//! The work per element is the covering windows times the window's elements: a 3x3 window
//! of stride 2 visits at most 4 windows of 9 (2.25 on average), a 2x2 window of stride 2
//! exactly one of 4. No case needs the single thread any more: the covering windows of an
//! element follow from the window sizes, strides and low padding alone (a select-and-scatter
//! has no dilations).

use super::*;

/// A select-and-scatter's windows (see [`Schedule::SelectScatter`]).
pub(super) struct SelectWindows<'s> {
    pub(super) grid: &'s [usize],
    pub(super) window: &'s [usize],
    pub(super) strides: &'s [i64],
    pub(super) pad_low: &'s [i64],
    pub(super) select: kiln_ir::ComparisonDirection,
    pub(super) kind: Combiner,
}

/// The most windows that cover one element along a dimension of window size `w` and stride
/// `s` (0 for an empty window).
fn covering(w: usize, s: i64) -> usize {
    if w == 0 {
        0
    } else {
        (w - 1) / s.max(1) as usize + 1
    }
}

/// For an accumulator of a float narrower than f32 (bf16, f16: which a register may hold in
/// f32), statements rounding it as the sequential form's store after each combination does:
/// stored at `p` (the thread's own element) and loaded back. None for other dtypes.
pub(super) fn narrowed(acc: usize, p: usize, dtype: DType) -> Vec<Stmt> {
    if !dtype.is_float() || dtype.bytes() >= 4 {
        return Vec::new();
    }
    vec![
        Stmt::Store {
            buf: Buf::Output(0),
            index: Sc::Reg(p),
            value: acc,
        },
        Stmt::Load {
            reg: acc,
            buf: Buf::Output(0),
            index: Sc::Reg(p),
        },
    ]
}

impl Mapper<'_> {
    /// A select-and-scatter by a thread per output element (see the module's doc). Input 0
    /// is the operand, 1 the source (read by the body), 2 the init value.
    pub(super) fn select_scatter(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        w: &SelectWindows,
    ) -> GpuKernel {
        let mut r = Regs::default();
        let dtype = k.out.dtype;
        let shape = &k.out.shape;
        let rank = shape.len();
        let total = k.out.numel();
        let [
            p,
            acc,
            g,
            ok,
            u,
            inside,
            pos,
            cand,
            cur,
            keep,
            best,
            have,
            src,
        ] = r.array();
        let coords: Vec<usize> = (0..rank).map(|_| r.next()).collect();
        let firsts: Vec<usize> = (0..rank).map(|_| r.next()).collect();
        let scalar = |i: usize| Expr::Load {
            input: inputs.len() + i,
            dtype,
            coef: Vec::new(),
            off: 0,
        };
        let strides: Vec<i64> = w.strides.iter().map(|&s| s.max(1)).collect();

        // The thread's element: its coordinates, and per dimension the first window that
        // may cover it, `⌈(o + pad - w + 1) / s⌉`, computed on a non-negative numerator
        // (shifted by `shift`, a multiple of the stride).
        let mut body = Vec::new();
        let mut digit = 1usize;
        for d in (0..rank).rev() {
            let mut x = Sc::Reg(p);
            if digit != 1 {
                x = Sc::quot(x, c(digit));
            }
            if d != 0 {
                x = Sc::modulo(x, c(shape[d]));
            }
            body.push(Stmt::Let {
                reg: coords[d],
                value: x,
            });
            digit *= shape[d];
        }
        for d in 0..rank {
            let s = strides[d];
            let low = w.pad_low[d] - w.window[d] as i64 + 1;
            let shift = s * ((-low).max(0) + s - 1).div_euclid(s);
            body.push(Stmt::Let {
                reg: firsts[d],
                value: Sc::plus(
                    Sc::quot(
                        Sc::plus(Sc::Reg(coords[d]), Sc::Const(low + shift + s - 1)),
                        Sc::Const(s),
                    ),
                    Sc::Const(-shift / s),
                ),
            });
        }
        body.push(Stmt::Eval {
            reg: acc,
            expr: Expr::Load {
                input: 2,
                dtype,
                coef: Vec::new(),
                off: 0,
            },
            scalars: Vec::new(),
        });

        // One window's selection, as the sequential form makes it: its valid positions
        // (variables `rank..2 rank`) in row-major order.
        let window_vars: Vec<(usize, usize)> = w
            .window
            .iter()
            .enumerate()
            .map(|(d, &e)| (rank + d, e))
            .collect();
        let mut scan = set_vars(&window_vars, Sc::Reg(u));
        let (valid, flat) = bounded_position((0..rank).rev().map(|d| {
            let coord = Sc::plus(
                Sc::plus(
                    Sc::times(Sc::Var(d), Sc::Const(strides[d])),
                    Sc::Const(-w.pad_low[d]),
                ),
                Sc::Var(rank + d),
            );
            (coord, shape[d] as i64)
        }));
        scan.push(Stmt::Let {
            reg: inside,
            value: valid,
        });
        scan.push(Stmt::If {
            cond: Sc::Reg(inside),
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

        // The covering windows in increasing row-major order: the digits of `g` over the
        // per-dimension counts (variables `rank..2 rank` for the moment, which the scan then
        // takes over) added to the first windows give the window (variables `0..rank`).
        let counts: Vec<(usize, usize)> = (0..rank)
            .map(|d| (rank + d, covering(w.window[d], strides[d])))
            .collect();
        let mut each = set_vars(&counts, Sc::Reg(g));
        let mut covers = Sc::Const(1);
        for d in 0..rank {
            each.push(Stmt::SetVar {
                var: d,
                value: Sc::plus(Sc::Reg(firsts[d]), Sc::Var(rank + d)),
            });
            // Inside the grid, and starting at or before the element.
            covers = Sc::and(
                covers,
                Sc::and(
                    Sc::and(
                        Sc::lt(Sc::Const(-1), Sc::Var(d)),
                        Sc::lt(Sc::Var(d), c(w.grid[d])),
                    ),
                    Sc::lt(
                        Sc::plus(
                            Sc::times(Sc::Var(d), Sc::Const(strides[d])),
                            Sc::Const(-w.pad_low[d]),
                        ),
                        Sc::plus(Sc::Reg(coords[d]), Sc::Const(1)),
                    ),
                ),
            );
        }
        each.push(Stmt::Let {
            reg: ok,
            value: covers,
        });
        each.push(Stmt::If {
            cond: Sc::Reg(ok),
            body: vec![
                Stmt::Let {
                    reg: have,
                    value: c(0),
                },
                Stmt::Let {
                    reg: best,
                    value: Sc::Const(-1),
                },
                Stmt::For {
                    reg: u,
                    start: c(0),
                    end: c(w.window.iter().product()),
                    step: c(1),
                    body: scan,
                },
                // `best` is -1 unless the window selected a position.
                Stmt::If {
                    cond: Sc::eq(Sc::Reg(best), Sc::Reg(p)),
                    body: vec![
                        Stmt::Eval {
                            reg: src,
                            expr: k.body.clone(),
                            scalars: Vec::new(),
                        },
                        Stmt::Combine {
                            acc,
                            value: src,
                            kind: w.kind,
                            dtype,
                        },
                    ]
                    .into_iter()
                    .chain(narrowed(acc, p, dtype))
                    .collect(),
                },
            ],
        });
        body.push(Stmt::For {
            reg: g,
            start: c(0),
            end: c(counts.iter().map(|x| x.1).product()),
            step: c(1),
            body: each,
        });
        body.push(Stmt::Store {
            buf: Buf::Output(0),
            index: Sc::Reg(p),
            value: acc,
        });
        self.grid_stride(
            (name, MapKind::SelectScatter),
            (inputs, vec![(Buf::Output(0), k.out.clone())]),
            (r.0, k.vars.max(2 * rank)),
            (p, total, body),
        )
    }
}

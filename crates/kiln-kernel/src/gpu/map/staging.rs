//! Staging a product's operand tiles through shared memory in a ring of stages: the loop over
//! the contraction both block-tile products (`tiled.rs` on the CUDA cores, `tensor.rs` on the
//! tensor cores) run.
//!
//! Every shared operand array holds `stages` copies of its tile ([`Stepping::stages`]; two on
//! the CUDA cores, `Gpu::mma_stages` on the tensor cores). Before the loop the block starts
//! loading the first `stages - 1` contraction steps into stages `0..stages - 1`, each step's
//! copies one `cp.async` group. In the loop, for step `s` (stage `s % stages`), each thread
//! waits until at most `stages - 2` of its groups are in flight (`cp.async.wait_group`: its
//! copies of step `s` have landed, those of the steps after it may still be in flight), the
//! block meets at one barrier (after which step `s`'s tiles are visible to every thread, and
//! every thread has finished multiplying step `s - 1`, whose stage is free again), the threads
//! start loading step `s + stages - 1` into that freed stage, and then multiply step `s` while
//! the loads of the next `stages - 1` steps are in flight. One barrier per step. With two
//! stages this is double buffering: `cp.async.wait_group 0`, one step in flight.
//!
//! A tile is loaded with `cp.async` (16 bytes a copy, global straight into shared memory, no
//! registers) when the operand is a plain load (or one through strides) of the shared array's
//! dtype whose contiguous dimension is the tile's contiguous dimension in shared memory, and
//! every copy stays aligned and either wholly inside the operand or wholly past its edge
//! ([`Staging::copies`]); the copies past the edge become zero stores. Otherwise (a
//! convolution's patches, a conversion, a transposed layout, strides that leave a copy
//! unaligned) each thread loads elements through registers and stores them into the
//! stage being filled, which still overlaps with the products of the current step. A
//! thread that started copies waits for them before the barrier that makes them visible; the
//! GPU emulator refuses any access to a shared element while a copy into it is in flight, so a
//! missing wait, or one that leaves a group too many in flight, fails its tests.

use super::strided::{Affine, affine};
use super::*;

/// One operand tile of a contraction step.
pub(super) struct Tile<'e> {
    /// The kernel variable the tile's rows set (1: A's rows, 2: B's columns).
    pub row_var: usize,
    /// The operand's rows (or columns) in all.
    pub rows: usize,
    /// The register holding the block's first row.
    pub base: usize,
    /// Rows (or columns) in the tile.
    pub extent: usize,
    /// Contraction indices in the tile.
    pub depth: usize,
    /// Shared layout: `row * depth + kc` when true (the contraction contiguous), else
    /// `kc * extent + row`, or with `panel` in panels of `panel` rows one after the other,
    /// `(row / panel) * depth * panel + kc * panel + row % panel`.
    pub k_fastest: bool,
    /// Rows of a panel when the rows are contiguous (0: one panel of `extent` rows; else a
    /// divisor of `extent` that 16-byte copies divide).
    pub panel: usize,
    /// The operand's element at the kernel variables, in the staged dtype.
    pub expr: &'e Expr,
    /// The shared array (a ring of stages of `extent * depth` elements each).
    pub array: usize,
}

impl Tile<'_> {
    /// Elements of one stage.
    pub fn len(&self) -> usize {
        self.extent * self.depth
    }
}

/// What the loop staging operand tiles into shared memory works with.
pub(super) struct Staging {
    /// The staging loops' register: the tile element (or copy) a thread loads.
    pub e: usize,
    /// The block's threads, the staging loops' step.
    pub threads: usize,
    /// The register holding the batch index.
    pub batch: usize,
    /// The register holding the staged step's first contraction index.
    pub k0: usize,
    /// The register holding the stage being filled.
    pub stage: usize,
    /// The register an element is loaded into.
    pub staged: usize,
    /// The contraction's length.
    pub k: usize,
    /// The dtype elements are staged in (zero past the operand's edges).
    pub dtype: DType,
}

/// A tile's `cp.async` copies (see [`Staging::copies`]).
struct Copies {
    /// The operand's element (its input, its coefficients of (batch, row, column,
    /// contraction), its batch's quotients and offset).
    at: Affine,
    /// Elements per copy (16 bytes).
    elems: usize,
}

impl Staging {
    /// The statements staging the tiles of the step at `self.k0` into stage `self.stage`.
    pub(super) fn stage(&self, tiles: &[Tile], arrays: &[SharedArray]) -> Vec<Stmt> {
        tiles
            .iter()
            .map(|t| match self.copies(t, &arrays[t.array]) {
                Some(cp) => self.stage_async(t, &cp),
                None => self.stage_through_registers(t),
            })
            .collect()
    }

    /// Whether any of `tiles` is staged with `cp.async`.
    pub(super) fn any_async(&self, tiles: &[Tile], arrays: &[SharedArray]) -> bool {
        tiles
            .iter()
            .any(|t| self.copies(t, &arrays[t.array]).is_some())
    }

    /// How `t` is copied with `cp.async`, if it can be: its element is a plain load, or one
    /// through strides (`strided.rs`), maybe converted losslessly to the staged dtype, of the
    /// shared array's element type, 4 bytes or more unless the array is packed; the load's
    /// coefficient of the tile's contiguous variable is 1 and of the variable the tile does
    /// not set 0; 16-byte copies divide the tile's contiguous extent and the operand's extent
    /// along it, and every other coefficient, the batch's terms and the offset, so each copy
    /// is aligned and either wholly inside the operand or wholly past its edge. Strides that
    /// leave copies unaligned (an odd row distance, an offset off 16 bytes) stage the tile
    /// through registers instead.
    fn copies(&self, t: &Tile, array: &SharedArray) -> Option<Copies> {
        let load = plain_load(t.expr)?;
        if t.expr != load && !array.packed {
            return None;
        }
        let at = affine(load)?;
        let bytes = at.dtype.bits().div_ceil(8) as usize;
        let same = at.dtype == array.dtype && (array.packed || bytes >= 4);
        if !same || 16 % bytes != 0 {
            return None;
        }
        let elems = 16 / bytes;
        let other = 3 - t.row_var;
        let (fast, fast_extent, fast_len) = if t.k_fastest {
            (3, t.depth, self.k)
        } else {
            (t.row_var, t.extent, t.rows)
        };
        let panels = t.k_fastest || t.panel == 0 || t.panel.is_multiple_of(elems);
        let aligned = panels
            && at.coef[fast] == 1
            && at.coef[other] == 0
            && fast_extent.is_multiple_of(elems)
            && fast_len.is_multiple_of(elems)
            && at.aligned(fast, elems as i64);
        aligned.then_some(Copies { at, elems })
    }

    /// The shared element of tile element `(row, kc)` in the stage being filled.
    fn at(&self, t: &Tile, row: Sc, kc: Sc) -> Sc {
        let within = if t.k_fastest {
            Sc::plus(Sc::times(row, c(t.depth)), kc)
        } else if t.panel > 0 {
            Sc::plus(
                Sc::plus(
                    Sc::times(Sc::quot(row.clone(), c(t.panel)), c(t.depth * t.panel)),
                    Sc::times(kc, c(t.panel)),
                ),
                Sc::modulo(row, c(t.panel)),
            )
        } else {
            Sc::plus(Sc::times(kc, c(t.extent)), row)
        };
        Sc::plus(within, Sc::times(Sc::Reg(self.stage), c(t.len())))
    }

    /// `1` when tile element `(row, kc)` lies inside the operand.
    fn inside(&self, t: &Tile, row: &Sc, kc: &Sc) -> Sc {
        Sc::and(
            Sc::lt(Sc::plus(Sc::Reg(t.base), row.clone()), c(t.rows)),
            Sc::lt(Sc::plus(Sc::Reg(self.k0), kc.clone()), c(self.k)),
        )
    }

    /// The block's threads copying `t` with `cp.async`, `cp.elems` elements a copy along the
    /// tile's contiguous dimension; a copy past the operand's edge stores zeros instead.
    fn stage_async(&self, t: &Tile, cp: &Copies) -> Stmt {
        let reg = Sc::Reg;
        let e = || reg(self.e);
        let per = (if t.k_fastest { t.depth } else { t.extent }) / cp.elems;
        let slow = Sc::quot(e(), c(per));
        let fast = Sc::times(Sc::modulo(e(), c(per)), c(cp.elems));
        let (row, kc) = if t.k_fastest {
            (slow, fast)
        } else {
            (fast, slow)
        };
        let inside = self.inside(t, &row, &kc);
        let at = self.at(t, row.clone(), kc.clone());
        let src = [
            (t.row_var, Sc::plus(reg(t.base), row)),
            (3, Sc::plus(reg(self.k0), kc)),
        ]
        .into_iter()
        .fold(
            Sc::plus(Sc::Const(cp.at.off), cp.at.batch_offset(reg(self.batch))),
            |s, (v, x)| Sc::plus(s, Sc::times(x, Sc::Const(cp.at.coef[v]))),
        );
        let mut zeros = vec![zero(self.staged, self.dtype)];
        for q in 0..cp.elems {
            zeros.push(Stmt::SharedStore {
                array: t.array,
                index: Sc::plus(at.clone(), c(q)),
                value: self.staged,
            });
        }
        Stmt::For {
            reg: self.e,
            start: sp(Special::Thread),
            end: c(t.len() / cp.elems),
            step: c(self.threads),
            body: vec![
                Stmt::If {
                    cond: inside.clone(),
                    body: vec![Stmt::CopyAsync {
                        array: t.array,
                        index: at,
                        buf: Buf::Input(cp.at.input),
                        src,
                        elems: cp.elems,
                    }],
                },
                Stmt::If {
                    cond: Sc::eq(inside, c(0)),
                    body: zeros,
                },
            ],
        }
    }

    /// The block's threads loading the elements of `t` into a register, element `e` at row
    /// `base + row` (kernel variable `row_var`) and contraction index `k0 + kc` (variable 3),
    /// the operand's contiguous dimension fastest so that neighbouring threads read
    /// neighbouring elements, zero past the operand's edges, each stored into its stage.
    fn stage_through_registers(&self, t: &Tile) -> Stmt {
        let e = || Sc::Reg(self.e);
        let along_k = plain_load(t.expr)
            .and_then(affine)
            .is_none_or(|at| at.coef[3] == 1);
        let (row, kc) = if along_k {
            (Sc::quot(e(), c(t.depth)), Sc::modulo(e(), c(t.depth)))
        } else {
            (Sc::modulo(e(), c(t.extent)), Sc::quot(e(), c(t.extent)))
        };
        let at_row = Sc::plus(Sc::Reg(t.base), row.clone());
        let at_k = Sc::plus(Sc::Reg(self.k0), kc.clone());
        Stmt::For {
            reg: self.e,
            start: sp(Special::Thread),
            end: c(t.len()),
            step: c(self.threads),
            body: vec![
                Stmt::SetVar {
                    var: 0,
                    value: Sc::Reg(self.batch),
                },
                Stmt::SetVar {
                    var: t.row_var,
                    value: at_row,
                },
                Stmt::SetVar {
                    var: 3,
                    value: at_k,
                },
                zero(self.staged, self.dtype),
                Stmt::If {
                    cond: self.inside(t, &row, &kc),
                    body: vec![Stmt::Eval {
                        reg: self.staged,
                        expr: t.expr.clone(),
                        scalars: Vec::new(),
                    }],
                },
                Stmt::SharedStore {
                    array: t.array,
                    index: self.at(t, row, kc),
                    value: self.staged,
                },
            ],
        }
    }
}

/// The registers and depth of the pipelined loop over the contraction (see the module
/// documentation).
pub(super) struct Stepping {
    /// The loop register: the multiplied step's first contraction index.
    pub k0: usize,
    /// The stage the multiplied step is in (`0..stages`).
    pub cur: usize,
    /// The contraction indices per step (one stage's tiles).
    pub step: usize,
    /// Stages in the ring (at least 2: two is double buffering).
    pub stages: usize,
    /// Steps whose stages stay in use after their multiply (asynchronous products still
    /// reading them: `wgmma` groups left in flight), so that step `s` stages step `s +
    /// stages - 1 - lag` into the stage of step `s - 1 - lag`; at most `stages - 2`.
    pub lag: usize,
    /// The registers holding the block's first contraction index (a multiple of `step`) and
    /// its end, where the block runs only part of the contraction (the steps a causal mask
    /// makes zero left out: `zero_steps.rs`); `None`: from 0 to the contraction's length.
    pub range: Option<(usize, usize)>,
}

/// The pipelined loop over the contraction: `staging` fills a stage (its `k0` and `stage`
/// registers are set here), `multiply` reads stage `cur` (ending with the sum tree's
/// flushes); `copies` when any tile is staged with `cp.async`. Before the loop the first
/// `stages - 1` steps are staged, each its own `cp.async` group; step `s` waits until at most
/// `stages - 2` groups are in flight (so its own has landed), meets the block at the barrier,
/// stages step `s + stages - 1` into the stage step `s - 1` was multiplied from, and
/// multiplies. With a lag ([`Stepping::lag`]) each of those is `lag` steps fewer: step `s`
/// stages into the stage step `s - 1 - lag` was multiplied from. Every step commits a group, empty past the contraction's end, so the count
/// stays right; the last `stages - 1` steps stage nothing and drain the ring.
pub(super) fn pipelined(
    staging: &Staging,
    stage: Vec<Stmt>,
    s: &Stepping,
    multiply: Vec<Stmt>,
    copies: bool,
) -> Vec<Stmt> {
    let reg = Sc::Reg;
    let stages = s.stages.max(2);
    // Steps staged ahead of the one multiplied.
    let ahead = (stages - 1).saturating_sub(s.lag).max(1);
    let mut out = Vec::new();
    let (start, end) = match s.range {
        Some((kb, ke)) => (reg(kb), reg(ke)),
        None => (c(0), c(staging.k)),
    };
    for p in 0..ahead {
        let k0 = match s.range {
            Some(_) => Sc::plus(start.clone(), c(p * s.step)),
            None => c(p * s.step),
        };
        out.extend([
            Stmt::Let {
                reg: staging.k0,
                value: k0.clone(),
            },
            Stmt::Let {
                reg: staging.stage,
                value: c(p),
            },
            Stmt::If {
                cond: Sc::lt(k0, end.clone()),
                body: stage.clone(),
            },
        ]);
        if copies {
            out.push(Stmt::CopyCommit);
        }
    }
    // The step's place in the block's range, which the ring's stages count from.
    let at = || match s.range {
        Some((kb, _)) => Sc::quot(Sc::minus(reg(s.k0), reg(kb)), c(s.step)),
        None => Sc::quot(reg(s.k0), c(s.step)),
    };
    let mut body = vec![Stmt::Let {
        reg: s.cur,
        value: Sc::modulo(at(), c(stages)),
    }];
    if copies {
        body.push(Stmt::CopyWait { pending: ahead - 1 });
    }
    // The stage freed last: `cur - 1 - lag`, that is `cur + ahead`, around the ring.
    let next = if stages == 2 && ahead == 1 {
        Sc::plus(c(1), Sc::times(reg(s.cur), Sc::Const(-1)))
    } else {
        Sc::modulo(Sc::plus(at(), c(ahead)), c(stages))
    };
    body.extend([
        Stmt::Barrier,
        Stmt::Let {
            reg: staging.k0,
            value: Sc::plus(reg(s.k0), c(ahead * s.step)),
        },
        Stmt::Let {
            reg: staging.stage,
            value: next,
        },
        Stmt::If {
            cond: Sc::lt(reg(staging.k0), end.clone()),
            body: stage,
        },
    ]);
    if copies {
        body.push(Stmt::CopyCommit);
    }
    body.extend(multiply);
    out.push(Stmt::For {
        reg: s.k0,
        start,
        end,
        step: c(s.step),
        body,
    });
    out
}

/// The load `expr` is (or gather, through strides: `strided.rs`), under conversions to a
/// wider float type (exact ones).
fn plain_load(expr: &Expr) -> Option<&Expr> {
    match expr {
        Expr::Load { .. } | Expr::Gather { .. } => Some(expr),
        Expr::Op {
            op: Ew::Convert,
            dtype,
            args,
        } if dtype.is_float() && args.len() == 1 => {
            let inner = plain_load(&args[0])?;
            (inner.dtype().is_float() && inner.dtype().bits() < dtype.bits()).then_some(inner)
        }
        _ => None,
    }
}

/// `reg = 0` in `dtype` (the sum's identity).
pub(super) fn zero(reg: usize, dtype: DType) -> Stmt {
    Stmt::Identity {
        reg,
        kind: Combiner::Add,
        dtype,
    }
}

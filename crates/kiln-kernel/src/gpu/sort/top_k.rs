//! A sort by keys whose users read only the first `k` elements of each slice
//! ([`crate::sort::top_k`]), on slices longer than a block sorts: the `k` leading elements
//! found in two launches instead of sorting every slice whole.
//!
//! 1. A block per tile of `T` keys (the longest power of two a block sorts, as for
//!    [`mod@super::long`]) loads the tile's keys with their positions in the slice, sorts them
//!    by the network of [`super`] (every run ascending: the whole tile in order) and writes
//!    its first `k` keys and positions to scratch buffers, `k` per tile.
//! 2. A block per slice loads the slice's `t · k` candidates (its `t` tiles' leading `k`),
//!    padded to a power of two, sorts them by the same network, and writes each operand's
//!    first `k` elements in the sorted positions' order, read from the operands, so every
//!    element keeps its bits; the rest of each result slice is zeros (as the host's top-k
//!    leaves it).
//!
//! The `k` elements that lead the stable sort of a slice each lead the stable sort of their
//! tile (an element with `k` elements of its tile before it has as many before it in the
//! slice), so the candidates hold them; pairs compare by key, then by position (a total
//! order, the padding after every element), so the second network puts them first in the
//! stable sort's order, bit for bit the reference's. Where the candidates would not fit a
//! block (`t · k` padded to more than `T` keys), the slice sorts whole instead
//! (`fits`). The scratch buffers take `t · k · (key bytes + 8)` bytes per slice, two reads
//! of each key against the radix sort's passes over every key, position and element.

use super::{KEYS, POSITIONS, Regs, Sorter, c};
use crate::gpu::ir::{Buf, GpuKernel, GpuProgram, MapKind, Sc, SharedArray, Special, Stmt};
use crate::ir::Expr;
use crate::target::{Gpu, SumTree};
use kiln_ir::{DType, TensorType};

/// Whether a top-`k` of slices of `n` keys in tiles of `tile` runs as this module's two
/// launches: the slice is longer than a tile, `k` is shorter than the slice, and the
/// candidates, padded to a power of two, fit one block's tile.
pub(super) fn fits(n: usize, k: usize, tile: usize) -> bool {
    let tiles = n.div_ceil(tile.max(1));
    n > tile && k >= 1 && k < n && (tiles * k).next_power_of_two() <= tile
}

/// A launch's buffers with their types.
type Buffers = Vec<(Buf, TensorType)>;

/// Registers beyond a block sort's.
struct Extra {
    /// The tile (a grid-strided loop over every slice's tiles).
    tile: usize,
    /// Where the tile starts in its slice.
    base: usize,
}

/// The two launches of a top-`k` of `rows` slices of the sort `s` describes (its `padded` is
/// the tile; see [`fits`]), with a block sort's registers `r` (`count` of them), operands of
/// types `ins`.
#[allow(clippy::too_many_arguments)]
pub(super) fn program(
    s: &Sorter,
    rows: usize,
    k: usize,
    (r, count): (Regs, usize),
    ins: &[TensorType],
    gpu: &Gpu,
    sums: SumTree,
    name: &str,
) -> GpuProgram {
    let t = TopK {
        s,
        r: &r,
        x: Extra {
            tile: count,
            base: count + 1,
        },
        regs: count + 2,
        rows,
        k,
        tiles: s.n.div_ceil(s.padded),
        gpu,
        sums,
        name,
        ins,
    };
    let total = rows * t.candidates();
    let scratch = vec![
        TensorType::new(s.key, [total]),
        TensorType::new(DType::I64, [total]),
    ];
    GpuProgram::new(scratch, vec![t.tiles_launch(), t.select_launch()])
}

/// What the two launches depend on.
struct TopK<'a> {
    /// The sort, its `padded` the tile.
    s: &'a Sorter,
    r: &'a Regs,
    x: Extra,
    /// Registers every launch declares.
    regs: usize,
    rows: usize,
    k: usize,
    /// Tiles per slice.
    tiles: usize,
    gpu: &'a Gpu,
    sums: SumTree,
    name: &'a str,
    ins: &'a [TensorType],
}

impl TopK<'_> {
    /// Candidates per slice.
    fn candidates(&self) -> usize {
        self.tiles * self.k
    }

    /// The scratch buffers (keys, positions) with their types.
    fn scratch(&self) -> Buffers {
        let total = self.rows * self.candidates();
        vec![
            (Buf::Scratch(0), TensorType::new(self.s.key, [total])),
            (Buf::Scratch(1), TensorType::new(DType::I64, [total])),
        ]
    }

    /// A launch named `label` (after the sort's name) of `grid` blocks sorting `len` keys in
    /// shared memory.
    fn launch(
        &self,
        label: &str,
        grid: usize,
        len: usize,
        (inputs, outputs): (Buffers, Buffers),
        body: Vec<Stmt>,
    ) -> GpuKernel {
        let shared = |dtype| SharedArray {
            dtype,
            len,
            packed: false,
            swizzle: None,
        };
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: format!("{}.{label}", self.name),
            kind: MapKind::Sort,
            grid: grid.min(self.gpu.sms * self.gpu.blocks_per_sm).max(1),
            block: self.s.threads,
            warp: self.gpu.warp_size,
            inputs,
            outputs,
            shared: vec![shared(self.s.key), shared(DType::I64)],
            regs: self.regs,
            vars: 0,
            sums: self.sums,
            body,
        }
    }

    /// Every stage of the network over `len` keys in shared memory (every run ascending, so
    /// the keys end in order), a barrier after each.
    fn network(&self, s: &Sorter, len: usize) -> Vec<Stmt> {
        let mut out = Vec::new();
        let mut k = 2;
        while k <= len {
            let mut j = k / 2;
            while j >= 1 {
                out.push(s.stage(self.r, k, j));
                out.push(Stmt::Barrier);
                j /= 2;
            }
            k *= 2;
        }
        out
    }

    /// The first launch: each tile sorted, its first `k` keys and positions into the scratch
    /// buffers (tile `g` of all slices' tiles at `g · k`).
    fn tiles_launch(&self) -> GpuKernel {
        let (r, x) = (self.r, &self.x);
        let tile = self.s.padded;
        let s = Sorter {
            inputs: 1,
            base: None,
            ..self.s.clone()
        };
        let mut body = vec![
            Stmt::Let {
                reg: r.row,
                value: Sc::quot(Sc::Reg(x.tile), c(self.tiles)),
            },
            Stmt::Let {
                reg: x.base,
                value: Sc::times(Sc::modulo(Sc::Reg(x.tile), c(self.tiles)), c(tile)),
            },
            // Positions in the slice (`base + i`); past its end, the padding.
            s.load_keys(r, 0, Some(x.base), tile),
            Stmt::Barrier,
        ];
        body.extend(self.network(&s, tile));
        let at = Sc::plus(Sc::times(Sc::Reg(x.tile), c(self.k)), Sc::Reg(r.i));
        body.push(s.strided(
            r,
            self.k,
            vec![
                Stmt::SharedLoad {
                    reg: r.key,
                    array: KEYS,
                    index: Sc::Reg(r.i),
                },
                Stmt::SharedLoad {
                    reg: r.position,
                    array: POSITIONS,
                    index: Sc::Reg(r.i),
                },
                Stmt::Let {
                    reg: r.pos,
                    value: at,
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: Sc::Reg(r.pos),
                    value: r.key,
                },
                Stmt::Store {
                    buf: Buf::Output(1),
                    index: Sc::Reg(r.pos),
                    value: r.position,
                },
            ],
        ));
        // The next tile's loads wait for every thread's last reads of this one.
        body.push(Stmt::Barrier);
        let all = self.rows * self.tiles;
        let key = self.ins[s.key_input].clone();
        self.launch(
            "tiles",
            all,
            tile,
            (vec![(Buf::Input(s.key_input), key)], self.scratch()),
            vec![Stmt::For {
                reg: x.tile,
                start: Sc::Special(Special::Block),
                end: c(all),
                step: Sc::Special(Special::GridDim),
                body,
            }],
        )
    }

    /// The second launch: each slice's candidates sorted, each operand's first `k` elements
    /// written in their order, zeros after them.
    fn select_launch(&self) -> GpuKernel {
        let r = self.r;
        let n = self.candidates();
        let len = n.next_power_of_two();
        let s = Sorter {
            padded: len,
            inputs: 2 + self.ins.len(),
            base: None,
            ..self.s.clone()
        };
        let from = Sc::plus(Sc::times(Sc::Reg(r.row), c(n)), Sc::Reg(r.i));
        let candidate = vec![
            Stmt::Let {
                reg: r.pos,
                value: from,
            },
            Stmt::Load {
                reg: r.key,
                buf: Buf::Input(0),
                index: Sc::Reg(r.pos),
            },
            Stmt::Load {
                reg: r.position,
                buf: Buf::Input(1),
                index: Sc::Reg(r.pos),
            },
        ];
        // Past the candidates, padding: key 0 (never compared), a position past every tile's.
        let padding = vec![
            Stmt::Eval {
                reg: r.key,
                expr: Expr::Const {
                    dtype: s.key,
                    value: 0.0,
                },
                scalars: Vec::new(),
            },
            Stmt::Let {
                reg: r.position,
                value: Sc::plus(c(self.tiles * self.s.padded), Sc::Reg(r.i)),
            },
        ];
        let load = s.strided(
            r,
            len,
            vec![
                Stmt::If {
                    cond: Sc::lt(Sc::Reg(r.i), c(n)),
                    body: candidate,
                },
                Stmt::If {
                    cond: Sc::is_zero(Sc::lt(Sc::Reg(r.i), c(n))),
                    body: padding,
                },
                Stmt::SharedStore {
                    array: KEYS,
                    index: Sc::Reg(r.i),
                    value: r.key,
                },
                Stmt::SharedStore {
                    array: POSITIONS,
                    index: Sc::Reg(r.i),
                    value: r.position,
                },
            ],
        );
        let mut per_row = vec![load, Stmt::Barrier];
        per_row.extend(self.network(&s, len));
        per_row.push(self.write_operands(&s));
        // The next slice's loads wait for every thread's last reads of this one.
        per_row.push(Stmt::Barrier);
        let mut inputs = self.scratch();
        inputs.extend(
            self.ins
                .iter()
                .enumerate()
                .map(|(i, t)| (Buf::Input(i), t.clone())),
        );
        let outputs = self
            .ins
            .iter()
            .enumerate()
            .map(|(i, t)| (Buf::Output(i), t.clone()))
            .collect();
        self.launch(
            "select",
            self.rows,
            len,
            (inputs, outputs),
            vec![Stmt::For {
                reg: r.row,
                start: Sc::Special(Special::Block),
                end: c(self.rows),
                step: Sc::Special(Special::GridDim),
                body: per_row,
            }],
        )
    }

    /// Each operand's first `k` elements of the slice (inputs from 2 on) in the sorted
    /// positions' order, then zeros to the slice's end.
    fn write_operands(&self, s: &Sorter) -> Stmt {
        let r = self.r;
        let led = Sc::lt(Sc::Reg(r.i), c(self.k));
        let mut lead = vec![Stmt::SharedLoad {
            reg: r.src,
            array: POSITIONS,
            index: Sc::Reg(r.i),
        }];
        let mut rest = Vec::new();
        for (m, (&v, t)) in r.values.iter().zip(self.ins).enumerate() {
            lead.push(Stmt::Load {
                reg: v,
                buf: Buf::Input(2 + m),
                index: s.at(Sc::Reg(r.row), Sc::Reg(r.src)),
            });
            lead.push(Stmt::Store {
                buf: Buf::Output(m),
                index: Sc::Reg(r.pos),
                value: v,
            });
            rest.push(Stmt::Eval {
                reg: v,
                expr: Expr::Const {
                    dtype: t.dtype,
                    value: 0.0,
                },
                scalars: Vec::new(),
            });
            rest.push(Stmt::Store {
                buf: Buf::Output(m),
                index: Sc::Reg(r.pos),
                value: v,
            });
        }
        s.strided(
            r,
            s.n,
            vec![
                Stmt::Let {
                    reg: r.pos,
                    value: s.at(Sc::Reg(r.row), Sc::Reg(r.i)),
                },
                Stmt::If {
                    cond: led.clone(),
                    body: lead,
                },
                Stmt::If {
                    cond: Sc::is_zero(led),
                    body: rest,
                },
            ],
        )
    }
}

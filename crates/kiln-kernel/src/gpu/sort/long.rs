//! A sort by keys whose slices are longer than one block sorts: the bitonic network of
//! [`super`] over the whole padded slice, its stages split between shared and global memory.
//!
//! A slice padded to `P` keys sorts in tiles of `T`, the longest power of two whose keys and
//! positions fit a block's shared memory. The network's stages for runs up to `T` only pair
//! elements of one tile; so do, for every longer run `k`, its stages with `j < T`. The sort is
//! then a chain of launches over two pairs of scratch buffers (keys and positions, `P` of each
//! per slice), read from one pair and written to the other:
//!
//! 1. a block per tile loads the tile's keys and positions, runs the stages of runs up to
//!    `T` in shared memory (each run ascending or descending by its place in the slice, as
//!    the whole network has it) and writes the tile out;
//! 2. for each `k = 2T, 4T, ..., P`: a launch per stage `j = k/2, ..., T`, a thread per pair
//!    `(lo, lo + j)` (grid-stride), exchanging the pair as it writes it when it is out of
//!    order; then a block per tile runs the stages `j = T/2, ..., 1` in shared memory. After
//!    the last (`k = P`) the blocks write each operand's slice in the sorted positions'
//!    order instead, read from the operands, so every element keeps its bits.
//!
//! Pairs compare as the short sort's do (by key, then by position; the padding, positions
//! from the slice's length on, after every element), a total order, so the result is the
//! stable sort's and deterministic: no launch has two threads write one element, and none
//! reads what it writes.
//!
//! When it runs ([`super`] says): for slices that pad to two tiles, where its three launches
//! (the tiles, one global stage, the stages within tiles) move fewer bytes than the radix
//! sort's passes ([`mod@super::radix`]), and for longer ones only where the radix sort's
//! counters do not fit a block. Its stages are the short sort's, with the same comparison, so
//! it is the proven network split at a tile's edge; each global stage reads and writes every
//! element once, coalesced, with no search, no scan and no atomics. Over longer slices its
//! `O(n log² n)` comparisons cost many passes (for 16·2²⁰ f32 keys in tiles of 4,096: 78
//! global stages and 13 tile launches, 91 in all, 15.3 ms on an H200 against `torch.sort`'s
//! 0.84), which is why the radix sort takes those. The scratch buffers take
//! `2 P (key bytes + 8)` bytes per slice.

use super::{KEYS, POSITIONS, Regs, Sorter, c};
use crate::gpu::ir::{Buf, GpuKernel, GpuProgram, MapKind, Sc, SharedArray, Special, Stmt};
use crate::target::{Gpu, SumTree};
use kiln_ir::{DType, TensorType};

/// The slices of a long sort.
pub(super) struct Slices {
    /// How many.
    pub rows: usize,
    /// Each one's length padded to a power of two (more than a tile).
    pub padded: usize,
}

/// The scratch buffers: keys and positions, twice.
const SCRATCH: [(usize, usize); 2] = [(0, 1), (2, 3)];

/// Registers the long sort uses beyond a block sort's.
struct Extra {
    /// The tile (a grid-strided loop over every slice's tiles).
    tile: usize,
    /// Where the tile starts in its slice.
    base: usize,
    /// A pair of a global stage (a grid-strided loop over every slice's pairs).
    pair: usize,
}

/// The launches sorting slices `sl` of the sort `s` describes (its `padded` is the tile),
/// with a block sort's registers `r` (`count` of them), operands of types `ins`.
pub(super) fn program(
    s: &Sorter,
    sl: Slices,
    (r, count): (Regs, usize),
    ins: &[TensorType],
    gpu: &Gpu,
    sums: SumTree,
    name: &str,
) -> GpuProgram {
    let x = Extra {
        tile: count,
        base: count + 1,
        pair: count + 2,
    };
    let l = Long {
        s,
        r: &r,
        x: &x,
        rows: sl.rows,
        padded: sl.padded,
        gpu,
        sums,
        regs: count + 3,
        name,
        ins,
    };
    let tile = s.padded;
    let mut launches = vec![l.tiles()];
    let mut at = 0;
    let mut k = 2 * tile;
    while k <= sl.padded {
        let mut j = k / 2;
        while j >= tile {
            launches.push(l.global(k, j, at));
            at = 1 - at;
            j /= 2;
        }
        launches.push(l.merge(k, at, k == sl.padded));
        at = 1 - at;
        k *= 2;
    }
    let total = sl.rows * sl.padded;
    let scratch = vec![
        TensorType::new(s.key, [total]),
        TensorType::new(DType::I64, [total]),
        TensorType::new(s.key, [total]),
        TensorType::new(DType::I64, [total]),
    ];
    GpuProgram::new(scratch, launches)
}

/// What the launches of one long sort depend on.
struct Long<'a> {
    /// The sort, its `padded` the tile.
    s: &'a Sorter,
    /// The registers, and how many every launch declares.
    r: &'a Regs,
    x: &'a Extra,
    regs: usize,
    /// The slices, and their padded length.
    rows: usize,
    padded: usize,
    gpu: &'a Gpu,
    sums: SumTree,
    /// The sort's launch name (each launch's name follows it).
    name: &'a str,
    /// The operands' types.
    ins: &'a [TensorType],
}

impl Long<'_> {
    /// Keys a block sorts.
    fn tile(&self) -> usize {
        self.s.padded
    }

    /// The scratch buffers `at` (keys, positions) with their types.
    fn scratch(&self, at: usize) -> Vec<(Buf, TensorType)> {
        let total = self.rows * self.padded;
        let (k, p) = SCRATCH[at];
        vec![
            (Buf::Scratch(k), TensorType::new(self.s.key, [total])),
            (Buf::Scratch(p), TensorType::new(DType::I64, [total])),
        ]
    }

    /// A launch named `label` (after the sort's name) of a grid of blocks, its buffers, its
    /// tile's shared arrays if `shared`, and its body.
    fn launch(
        &self,
        label: String,
        (grid, block): (usize, usize),
        inputs: Vec<(Buf, TensorType)>,
        outputs: Vec<(Buf, TensorType)>,
        shared: bool,
        body: Vec<Stmt>,
    ) -> GpuKernel {
        let shared = if shared {
            vec![
                SharedArray {
                    dtype: self.s.key,
                    len: self.tile(),
                    packed: false,
                    swizzle: None,
                },
                SharedArray {
                    dtype: DType::I64,
                    len: self.tile(),
                    packed: false,
                    swizzle: None,
                },
            ]
        } else {
            Vec::new()
        };
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: format!("{}.{label}", self.name),
            kind: MapKind::Sort,
            grid,
            block,
            warp: self.gpu.warp_size,
            inputs,
            outputs,
            shared,
            regs: self.regs,
            vars: 0,
            sums: self.sums,
            body,
        }
    }

    /// The geometry of a launch with a block per tile.
    fn per_tile(&self) -> (usize, usize) {
        let tiles = self.rows * (self.padded / self.tile());
        let grid = tiles.min(self.gpu.sms * self.gpu.blocks_per_sm).max(1);
        (grid, self.s.threads)
    }

    /// `for tile in every slice's tiles (block-strided): row, base; body; barrier`.
    fn each_tile(&self, mut body: Vec<Stmt>) -> Vec<Stmt> {
        let (r, x) = (self.r, self.x);
        let per_slice = self.padded / self.tile();
        let mut all = vec![
            Stmt::Let {
                reg: r.row,
                value: Sc::quot(Sc::Reg(x.tile), c(per_slice)),
            },
            Stmt::Let {
                reg: x.base,
                value: Sc::times(Sc::modulo(Sc::Reg(x.tile), c(per_slice)), c(self.tile())),
            },
        ];
        all.append(&mut body);
        // The next tile's loads wait for every thread's last reads of this one.
        all.push(Stmt::Barrier);
        vec![Stmt::For {
            reg: x.tile,
            start: Sc::Special(Special::Block),
            end: c(self.rows * per_slice),
            step: Sc::Special(Special::GridDim),
            body: all,
        }]
    }

    /// Element `i` of the tile in the scratch buffers: `row · P + base + i`.
    fn in_scratch(&self, i: Sc) -> Sc {
        Sc::plus(
            Sc::plus(
                Sc::times(Sc::Reg(self.r.row), c(self.padded)),
                Sc::Reg(self.x.base),
            ),
            i,
        )
    }

    /// The stages of runs `k` from `j` down to 1 in shared memory, a barrier after each.
    fn stages(&self, s: &Sorter, k: usize, from: usize) -> Vec<Stmt> {
        let mut out = Vec::new();
        let mut j = from;
        while j >= 1 {
            out.push(s.stage(self.r, k, j));
            out.push(Stmt::Barrier);
            j /= 2;
        }
        out
    }

    /// The tile's keys and positions from shared memory into scratch buffers `Output(0)` and
    /// `Output(1)`.
    fn write_tile(&self) -> Stmt {
        let r = self.r;
        self.s.strided(
            r,
            self.tile(),
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
                    value: self.in_scratch(Sc::Reg(r.i)),
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
        )
    }

    /// The first launch: each tile's keys (from the key operand, `Input(0)`) and positions
    /// sorted by the stages of runs up to the tile, into scratch buffers 0.
    fn tiles(&self) -> GpuKernel {
        let (r, x) = (self.r, self.x);
        let s = Sorter {
            inputs: 1,
            base: Some(x.base),
            ..self.s.clone()
        };
        // The element's index in its slice, in `pos`.
        let load = s.load_keys(r, 0, Some(x.base), self.tile());
        let mut body = vec![load, Stmt::Barrier];
        let mut k = 2;
        while k <= self.tile() {
            body.extend(self.stages(&s, k, k / 2));
            k *= 2;
        }
        body.push(self.write_tile());
        let key = self.ins[s.key_input].clone();
        self.launch(
            "tiles".into(),
            self.per_tile(),
            vec![(Buf::Input(s.key_input), key)],
            self.scratch(0),
            true,
            self.each_tile(body),
        )
    }

    /// Stage `j` (a tile or longer) of runs `k` in global memory: every pair read from scratch
    /// buffers `from` and written, exchanged where out of order, to the others.
    fn global(&self, k: usize, j: usize, from: usize) -> GpuKernel {
        let r = self.r;
        let s = Sorter {
            inputs: 2,
            ..self.s.clone()
        };
        let [klo, plo, khi, phi] = r.pair;
        let half = self.padded / 2;
        let pairs = self.rows * half;
        let block = self.gpu.elementwise_block;
        let grid = pairs
            .div_ceil(block)
            .min(self.gpu.sms * self.gpu.blocks_per_sm)
            .max(1);
        let p = Sc::Reg(r.i);
        let at = |i: usize| Sc::plus(Sc::times(Sc::Reg(r.row), c(self.padded)), Sc::Reg(i));
        let load = |reg: usize, buf: usize, i: usize| Stmt::Load {
            reg,
            buf: Buf::Input(buf),
            index: at(i),
        };
        let store = |buf: usize, i: usize, value: usize| Stmt::Store {
            buf: Buf::Output(buf),
            index: at(i),
            value,
        };
        let body = vec![
            Stmt::Let {
                reg: r.row,
                value: Sc::quot(Sc::Reg(self.x.pair), c(half)),
            },
            Stmt::Let {
                reg: r.i,
                value: Sc::modulo(Sc::Reg(self.x.pair), c(half)),
            },
            Stmt::Let {
                reg: r.lo,
                value: Sc::plus(
                    Sc::times(Sc::quot(p.clone(), c(j)), c(2 * j)),
                    Sc::modulo(p, c(j)),
                ),
            },
            Stmt::Let {
                reg: r.hi,
                value: Sc::plus(Sc::Reg(r.lo), c(j)),
            },
            load(klo, 0, r.lo),
            load(plo, 1, r.lo),
            load(khi, 0, r.hi),
            load(phi, 1, r.hi),
            Stmt::Eval {
                reg: r.less[0],
                expr: s.key_less(0, 1),
                scalars: vec![klo, khi],
            },
            Stmt::Eval {
                reg: r.less[1],
                expr: s.key_less(1, 0),
                scalars: vec![klo, khi],
            },
            Stmt::Let {
                reg: r.swap,
                value: s.swap(r, k, Sc::Reg(r.lo)),
            },
            Stmt::If {
                cond: Sc::Reg(r.swap),
                body: vec![
                    store(0, r.lo, khi),
                    store(1, r.lo, phi),
                    store(0, r.hi, klo),
                    store(1, r.hi, plo),
                ],
            },
            Stmt::If {
                cond: Sc::is_zero(Sc::Reg(r.swap)),
                body: vec![
                    store(0, r.lo, klo),
                    store(1, r.lo, plo),
                    store(0, r.hi, khi),
                    store(1, r.hi, phi),
                ],
            },
        ];
        let first = Sc::plus(
            Sc::times(Sc::Special(Special::Block), Sc::Special(Special::BlockDim)),
            Sc::Special(Special::Thread),
        );
        let stride = Sc::times(
            Sc::Special(Special::GridDim),
            Sc::Special(Special::BlockDim),
        );
        self.launch(
            format!("k{k}_j{j}"),
            (grid, block),
            self.scratch(from),
            self.scratch(1 - from),
            false,
            vec![Stmt::For {
                reg: self.x.pair,
                start: first,
                end: c(pairs),
                step: stride,
                body,
            }],
        )
    }

    /// The stages of runs `k` within tiles, each tile read from scratch buffers `from` into
    /// shared memory; written to the others, or, after the `last` run, each operand's slice
    /// written in the sorted positions' order.
    fn merge(&self, k: usize, from: usize, last: bool) -> GpuKernel {
        let (r, x) = (self.r, self.x);
        let s = Sorter {
            inputs: if last { 2 + self.ins.len() } else { 2 },
            base: Some(x.base),
            ..self.s.clone()
        };
        let load = s.strided(
            r,
            self.tile(),
            vec![
                Stmt::Let {
                    reg: r.pos,
                    value: self.in_scratch(Sc::Reg(r.i)),
                },
                Stmt::Load {
                    reg: r.key,
                    buf: Buf::Input(0),
                    index: Sc::Reg(r.pos),
                },
                Stmt::SharedStore {
                    array: KEYS,
                    index: Sc::Reg(r.i),
                    value: r.key,
                },
                Stmt::Load {
                    reg: r.position,
                    buf: Buf::Input(1),
                    index: Sc::Reg(r.pos),
                },
                Stmt::SharedStore {
                    array: POSITIONS,
                    index: Sc::Reg(r.i),
                    value: r.position,
                },
            ],
        );
        let mut body = vec![load, Stmt::Barrier];
        body.extend(self.stages(&s, k, self.tile() / 2));
        let mut inputs = self.scratch(from);
        let outputs = if last {
            body.push(self.write_operands(&s));
            inputs.extend(
                self.ins
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (Buf::Input(i), t.clone())),
            );
            self.ins
                .iter()
                .enumerate()
                .map(|(i, t)| (Buf::Output(i), t.clone()))
                .collect()
        } else {
            body.push(self.write_tile());
            self.scratch(1 - from)
        };
        self.launch(
            format!("k{k}"),
            self.per_tile(),
            inputs,
            outputs,
            true,
            self.each_tile(body),
        )
    }

    /// Each operand's elements of the tile (inputs from 2 on) in the sorted positions' order,
    /// the padding left out.
    fn write_operands(&self, s: &Sorter) -> Stmt {
        let r = self.r;
        let mut element = vec![
            Stmt::SharedLoad {
                reg: r.src,
                array: POSITIONS,
                index: Sc::Reg(r.i),
            },
            Stmt::Let {
                reg: r.pos,
                value: s.at(Sc::Reg(r.row), Sc::Reg(r.pos)),
            },
        ];
        for (m, &v) in r.values.iter().enumerate() {
            element.push(Stmt::Load {
                reg: v,
                buf: Buf::Input(2 + m),
                index: s.at(Sc::Reg(r.row), Sc::Reg(r.src)),
            });
            element.push(Stmt::Store {
                buf: Buf::Output(m),
                index: Sc::Reg(r.pos),
                value: v,
            });
        }
        s.strided(
            r,
            self.tile(),
            vec![
                Stmt::Let {
                    reg: r.pos,
                    value: Sc::plus(Sc::Reg(self.x.base), Sc::Reg(r.i)),
                },
                Stmt::If {
                    cond: Sc::lt(Sc::Reg(r.pos), c(s.n)),
                    body: element,
                },
            ],
        )
    }
}

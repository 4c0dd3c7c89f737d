//! A sort by keys whose slices are longer than one block sorts: a stable least-significant-digit
//! radix sort on the keys' order-preserving bits, three launches a digit, no atomics.
//!
//! Each key is first mapped to unsigned bits that order as the sort orders the keys
//! ([`KeyBits::transform`]): a float's bits with the sign bit flipped (all bits for a
//! negative), `-0` taking `+0`'s bits (so the two keep their order), every NaN the largest
//! bits (after every number, in position order); a signed integer offset by half its range;
//! descending, the bits complemented. f32, f16 and bf16 keys map through f32's 32 bits, of
//! which f16's low 13 and bf16's low 16 are the same for every key of one sign and are
//! skipped; f64 and 64-bit integers map to 64 bits, narrower integers to their own width in
//! 32.
//!
//! The bits are sorted a digit of `b` bits at a time, least significant first, each digit one
//! pass of three launches over every slice. A slice is cut into tiles of `E` elements per
//! thread (thread `t` of a tile takes elements `t E .. (t + 1) E`, in order), and consecutive
//! tiles into one chunk per block of the count and scatter launches:
//!
//! 1. count: each thread counts its elements' digits in its own column of a shared array of
//!    counters (`2^b` digits by the block's threads), over every tile of its chunk; then a
//!    thread per digit sums its row and writes the chunk's count of that digit;
//! 2. scan: a block per slice turns the counts, in (digit, chunk) order, into exclusive prefix
//!    sums (each thread sums a run of them, one thread scans the threads' sums in order, each
//!    thread then writes its run's offsets): where each chunk's elements of each digit start;
//! 3. scatter: each block walks its chunk's tiles in order; per tile its threads count their
//!    digits again, a thread per digit turns its row into each thread's first slot (the chunk's
//!    offset of the digit plus the tile's elements of that digit before the thread, kept from
//!    tile to tile in shared memory), and each thread writes its elements, in order, to the
//!    next slot of their digit. So the elements of a digit keep their order: the pass is
//!    stable, and the result of all passes the stable sort's, whatever order the threads and
//!    blocks run in. No atomics, no float arithmetic, no order that depends on scheduling.
//!
//! The first pass reads the key operand (mapping each key as it reads it, its position its
//! index); the passes read and write two pairs of scratch buffers (the mapped bits and the
//! positions, ping-ponging), and the last writes each operand's slice in the sorted positions'
//! order, read from the operands, so every element keeps its bits. The digit is as wide as a
//! block's counters (4 bytes per thread and digit value) and running offsets allow in the
//! shared memory a kernel declares, at most 8 bits: on an H200, 128 threads and 6-bit digits
//! (32 KiB of counters).
//!
//! Cost, for `sort_16M` (one slice of 16·2²⁰ f32 keys) on an H200: 6 passes of 6 bits, 18
//! launches (the bitonic form, [`mod@super::long`], takes 91). A pass reads the keys three
//! times (the count, and the scatter's count and its writes) and the positions once, and
//! writes keys and positions: about 24 bytes an element, 384 MiB a pass and 2.3 GiB in all
//! (the first pass reads the f32 operand and no positions; the last gathers and writes the
//! operand instead of keys and positions), against the bitonic form's 78 global stages of
//! about the same 384 MiB each (some 29 GiB). The scatter's writes are scattered within each
//! digit's runs, and the scan is one block per slice over `2^b` counts per chunk (32,768 a
//! pass here). Unmeasured on a real GPU.

use super::{Sorter, c};
use crate::gpu::ir::{Buf, GpuKernel, GpuProgram, MapKind, Sc, SharedArray, Special, Stmt};
use crate::ir::{Ew, Expr};
use crate::target::{Gpu, SumTree};
use kiln_ir::{ComparisonDirection, DType, OpKind, TensorType};

/// The most threads a block of the count and scatter launches has.
const THREADS: usize = 128;
/// Elements each thread takes of a tile.
const ITEMS: usize = 16;
/// The widest digit.
const MAX_BITS: u32 = 8;
/// Digit values the counters should hold at least before a block is given fewer threads.
const MIN_BUCKETS: usize = 16;
/// Blocks per multiprocessor the count and scatter grids aim for (slices are cut into about
/// `sms` times this many chunks in all).
const CHUNKS_PER_SM: usize = 4;

/// The scratch buffers: mapped keys and positions (twice), the counts and the offsets.
const KEYS: [usize; 2] = [0, 2];
const POSITIONS: [usize; 2] = [1, 3];
const COUNTS: usize = 4;
const OFFSETS: usize = 5;

/// The shared arrays: the counters, then the scatter's running offsets; the scan's sums.
const COUNTERS: usize = 0;
const RUNNING: usize = 1;
const SUMS: usize = 0;

/// The bits a key maps to: the range of them the digits cover, and whether they are 64 bits
/// wide (else 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyBits {
    /// The keys' dtype.
    pub key: DType,
    /// The lowest bit sorted on.
    pub low: u32,
    /// One past the highest.
    pub high: u32,
    /// 64-bit keys.
    pub wide: bool,
}

impl KeyBits {
    /// The bits of keys of `key`; `None` for a dtype the radix sort does not take.
    pub fn of(key: DType) -> Option<KeyBits> {
        let narrow = |low, high| KeyBits {
            key,
            low,
            high,
            wide: false,
        };
        Some(match key {
            DType::F32 => narrow(0, 32),
            DType::F16 => narrow(13, 32),
            DType::BF16 => narrow(16, 32),
            DType::F64 | DType::I64 | DType::U64 => KeyBits {
                key,
                low: 0,
                high: 64,
                wide: true,
            },
            DType::I8 | DType::U8 => narrow(0, 8),
            DType::I16 | DType::U16 => narrow(0, 16),
            DType::I32 | DType::U32 => narrow(0, 32),
            _ => return None,
        })
    }

    /// The signed dtype the mapping computes in, and the unsigned one the bits are kept in.
    fn dtypes(self) -> (DType, DType) {
        if self.wide {
            (DType::I64, DType::U64)
        } else {
            (DType::I32, DType::U32)
        }
    }
}

/// The block geometry of the count and scatter launches on a GPU: threads per block and bits
/// per digit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digits {
    /// Threads per block.
    pub threads: usize,
    /// Bits per digit.
    pub bits: u32,
}

impl Digits {
    /// The geometry on `gpu`: up to 128 threads, halved (down to a warp) while the counters of
    /// a 4-bit digit do not fit, then the widest digit (at most 8 bits) whose counters (4 bytes
    /// a thread) and running offsets (8 bytes) fit the shared memory a kernel declares; `None`
    /// when not even a 1-bit digit's do.
    pub fn on(gpu: &Gpu) -> Option<Digits> {
        let shared = gpu.shared_limit();
        let warp = gpu.warp_size.max(1);
        let mut threads = THREADS.min(gpu.max_threads_per_block).max(warp);
        let buckets = |t: usize| shared / (t * 4 + 8);
        while threads > warp && buckets(threads) < MIN_BUCKETS {
            threads /= 2;
        }
        let threads = threads.div_ceil(warp) * warp;
        let most = buckets(threads);
        if most < 2 {
            return None;
        }
        let bits = (usize::BITS - 1 - most.leading_zeros()).min(MAX_BITS);
        Some(Digits { threads, bits })
    }

    /// Passes over keys of `k`.
    pub fn passes(self, k: KeyBits) -> usize {
        (k.high - k.low).div_ceil(self.bits) as usize
    }
}

/// The launches of a radix sort of keys of `key` on `gpu` (3 a pass), or `None` where it does
/// not run.
pub fn launches(key: DType, gpu: &Gpu) -> Option<usize> {
    Some(3 * Digits::on(gpu)?.passes(KeyBits::of(key)?))
}

/// Registers of the radix sort's threads.
struct Regs {
    /// The (slice, chunk) a block takes, the slice and the chunk.
    unit: usize,
    row: usize,
    chunk: usize,
    /// A tile of the chunk, an element of the thread's, and its index in the slice.
    tile: usize,
    item: usize,
    e: usize,
    /// A key as read, its mapped bits, its digit and position.
    key: usize,
    bits: usize,
    digit: usize,
    position: usize,
    /// A shared slot, a counter read, and its next value.
    slot: usize,
    count: usize,
    next: usize,
    /// A digit value, a thread, and a running sum.
    d: usize,
    j: usize,
    acc: usize,
    /// Zero.
    zero: usize,
    /// Where an element goes.
    dest: usize,
    /// Each operand's element.
    values: Vec<usize>,
}

impl Regs {
    fn new(operands: usize) -> (Regs, usize) {
        let mut r = 0;
        let mut reg = || {
            r += 1;
            r - 1
        };
        let regs = Regs {
            unit: reg(),
            row: reg(),
            chunk: reg(),
            tile: reg(),
            item: reg(),
            e: reg(),
            key: reg(),
            bits: reg(),
            digit: reg(),
            position: reg(),
            slot: reg(),
            count: reg(),
            next: reg(),
            d: reg(),
            j: reg(),
            acc: reg(),
            zero: reg(),
            dest: reg(),
            values: (0..operands).map(|_| reg()).collect(),
        };
        (regs, r)
    }
}

fn op(op: Ew, dtype: DType, args: Vec<Expr>) -> Expr {
    Expr::Op { op, dtype, args }
}

fn kind(k: OpKind, dtype: DType, args: Vec<Expr>) -> Expr {
    op(Ew::Kind(k), dtype, args)
}

fn konst(dtype: DType, value: f64) -> Expr {
    Expr::Const { dtype, value }
}

fn cmp(d: ComparisonDirection, a: Expr, b: Expr) -> Expr {
    op(Ew::Cmp(d), DType::Pred, vec![a, b])
}

fn select(p: Expr, a: Expr, b: Expr) -> Expr {
    let d = a.dtype();
    op(Ew::Select, d, vec![p, a, b])
}

impl KeyBits {
    /// The order-preserving bits (32 or 64, unsigned) of key `x`, descending complemented.
    pub fn transform(self, x: Expr, descending: bool) -> Expr {
        let (k, key) = (self, self.key);
        let (signed, unsigned) = k.dtypes();
        let width = if k.wide { 64 } else { 32 };
        let min = -(2f64.powi(width - 1));
        let mapped = if key.is_float() {
            let (x, f) = if matches!(key, DType::F16 | DType::BF16) {
                (op(Ew::Convert, DType::F32, vec![x]), DType::F32)
            } else {
                (x, key)
            };
            let s = op(Ew::Bitcast, signed, vec![x.clone()]);
            // Negative: every bit flipped; else the sign bit set.
            let bits = select(
                cmp(ComparisonDirection::Lt, s.clone(), konst(signed, 0.0)),
                kind(OpKind::Not, signed, vec![s.clone()]),
                kind(OpKind::Xor, signed, vec![s, konst(signed, min)]),
            );
            // -0 as +0; every NaN after every number.
            let bits = select(
                cmp(ComparisonDirection::Eq, x.clone(), konst(f, 0.0)),
                konst(signed, min),
                bits,
            );
            select(
                cmp(ComparisonDirection::Ne, x.clone(), x),
                konst(signed, -1.0),
                bits,
            )
        } else {
            let w = key.bits() as i32;
            let s = op(Ew::Convert, signed, vec![x]);
            if !key.is_signed() {
                s
            } else if w == width {
                kind(OpKind::Xor, signed, vec![s, konst(signed, min)])
            } else {
                kind(
                    OpKind::Add,
                    signed,
                    vec![s, konst(signed, 2f64.powi(w - 1))],
                )
            }
        };
        let mapped = if descending {
            // The bits the key occupies, complemented.
            let w = k.high as i32;
            let mask = if w == width { -1.0 } else { 2f64.powi(w) - 1.0 };
            kind(OpKind::Xor, signed, vec![mapped, konst(signed, mask)])
        } else {
            mapped
        };
        op(Ew::Bitcast, unsigned, vec![mapped])
    }
}

/// The digit (an i64) at bit `shift`, `bits` wide, of mapped bits `x` of unsigned dtype `u`.
fn digit(x: Expr, u: DType, shift: u32, bits: u32) -> Expr {
    let down = kind(
        OpKind::ShiftRightLogical,
        u,
        vec![x, konst(u, f64::from(shift))],
    );
    let low = kind(
        OpKind::And,
        u,
        vec![down, konst(u, f64::from((1u32 << bits) - 1))],
    );
    op(Ew::Convert, DType::I64, vec![low])
}

/// What the launches of one radix sort depend on.
pub(super) struct Radix<'a> {
    s: &'a Sorter,
    r: Regs,
    regs: usize,
    k: KeyBits,
    g: Digits,
    rows: usize,
    /// Tiles a chunk takes, and chunks per slice.
    per_chunk: usize,
    chunks: usize,
    /// Threads of the scan.
    scan_threads: usize,
    /// The positions' dtype.
    pos: DType,
    gpu: &'a Gpu,
    sums: SumTree,
    name: &'a str,
    ins: &'a [TensorType],
}

/// The radix sort of `rows` slices the sort `s` describes, operands of types `ins`, on `gpu`;
/// `None` where its keys or the GPU's shared memory do not allow it.
pub(super) fn program(
    s: &Sorter,
    rows: usize,
    ins: &[TensorType],
    gpu: &Gpu,
    sums: SumTree,
    name: &str,
) -> Option<GpuProgram> {
    let k = KeyBits::of(s.key)?;
    let g = Digits::on(gpu)?;
    let tile = g.threads * ITEMS;
    let tiles = s.n.div_ceil(tile);
    let target = gpu.sms.max(1) * CHUNKS_PER_SM;
    let wanted = target.div_ceil(rows).clamp(1, tiles);
    let per_chunk = tiles.div_ceil(wanted);
    let chunks = tiles.div_ceil(per_chunk);
    let m = chunks << g.bits;
    let warp = gpu.warp_size.max(1);
    // The scan's threads, each an i64 sum in shared memory.
    let scan_threads = m
        .next_power_of_two()
        .min(super::prev_power_of_two(gpu.max_threads_per_block))
        .min(super::prev_power_of_two(gpu.shared_limit() / 8))
        .max(warp);
    if scan_threads * 8 > gpu.shared_limit() {
        return None;
    }
    let (r, regs) = Regs::new(ins.len());
    let pos = if s.n <= i32::MAX as usize {
        DType::I32
    } else {
        DType::I64
    };
    let x = Radix {
        s,
        r,
        regs,
        k,
        g,
        rows,
        per_chunk,
        chunks,
        scan_threads,
        pos,
        gpu,
        sums,
        name,
        ins,
    };
    let passes = g.passes(k);
    let mut launches = Vec::with_capacity(3 * passes);
    for p in 0..passes {
        launches.push(x.count(p));
        launches.push(x.scan(p));
        launches.push(x.scatter(p, passes));
    }
    let scratch = (0..=OFFSETS).map(|b| x.scratch(b).1).collect();
    Some(GpuProgram::new(scratch, launches))
}

impl Radix<'_> {
    fn buckets(&self) -> usize {
        1 << self.g.bits
    }

    /// Counts per slice: `2^b` a chunk.
    fn per_row(&self) -> usize {
        self.chunks << self.g.bits
    }

    fn tile(&self) -> usize {
        self.g.threads * ITEMS
    }

    fn shift(&self, pass: usize) -> u32 {
        self.k.low + pass as u32 * self.g.bits
    }

    fn scratch(&self, b: usize) -> (Buf, TensorType) {
        let total = self.rows * self.s.n;
        let (_, unsigned) = self.k.dtypes();
        let t = match b {
            COUNTS | OFFSETS => TensorType::new(DType::I64, [self.rows * self.per_row()]),
            _ if KEYS.contains(&b) => TensorType::new(unsigned, [total]),
            _ => TensorType::new(self.pos, [total]),
        };
        (Buf::Scratch(b), t)
    }

    /// A launch named `label` (after the sort's name).
    fn launch(
        &self,
        label: String,
        (grid, block): (usize, usize),
        inputs: Vec<(Buf, TensorType)>,
        outputs: Vec<(Buf, TensorType)>,
        shared: Vec<SharedArray>,
        body: Vec<Stmt>,
    ) -> GpuKernel {
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

    fn shared(dtype: DType, len: usize) -> SharedArray {
        SharedArray {
            dtype,
            len,
            packed: false,
            swizzle: None,
        }
    }

    /// The count and scatter launches' geometry: a block per chunk.
    fn per_chunk_grid(&self) -> (usize, usize) {
        let units = self.rows * self.chunks;
        let grid = units.min(self.gpu.sms * self.gpu.blocks_per_sm).max(1);
        (grid, self.g.threads)
    }

    /// `for (slice, chunk) (block-strided): body`.
    fn each_chunk(&self, mut body: Vec<Stmt>) -> Vec<Stmt> {
        let r = &self.r;
        let mut all = vec![
            Stmt::Let {
                reg: r.row,
                value: Sc::quot(Sc::Reg(r.unit), c(self.chunks)),
            },
            Stmt::Let {
                reg: r.chunk,
                value: Sc::modulo(Sc::Reg(r.unit), c(self.chunks)),
            },
            Stmt::Let {
                reg: r.zero,
                value: c(0),
            },
        ];
        all.append(&mut body);
        vec![Stmt::For {
            reg: r.unit,
            start: Sc::Special(Special::Block),
            end: c(self.rows * self.chunks),
            step: Sc::Special(Special::GridDim),
            body: all,
        }]
    }

    /// `for (reg = start; reg < end; reg += step) body`.
    fn range(reg: usize, start: Sc, end: usize, step: Sc, body: Vec<Stmt>) -> Stmt {
        Stmt::For {
            reg,
            start,
            end: c(end),
            step,
            body,
        }
    }

    /// `body` for each digit value `d` a thread takes (thread-strided).
    fn each_digit(&self, body: Vec<Stmt>) -> Stmt {
        Self::range(
            self.r.d,
            Sc::Special(Special::Thread),
            self.buckets(),
            c(self.g.threads),
            body,
        )
    }

    /// Shared counter `(digit, thread)`.
    fn counter(&self, digit: Sc, thread: Sc) -> Sc {
        Sc::plus(Sc::times(digit, c(self.g.threads)), thread)
    }

    /// The thread's counters set to zero.
    fn zero_column(&self) -> Stmt {
        let r = &self.r;
        Self::range(
            r.d,
            c(0),
            self.buckets(),
            c(1),
            vec![Stmt::SharedStore {
                array: COUNTERS,
                index: self.counter(Sc::Reg(r.d), Sc::Special(Special::Thread)),
                value: r.zero,
            }],
        )
    }

    /// Element `item` of the thread's in tile `tile` of the chunk, into `e`; then, when it is
    /// in the slice, its key read and mapped, its digit (of pass `pass`) and `more`, in a
    /// launch of `inputs` inputs (its expressions read registers as inputs after those).
    fn each_element(
        &self,
        pass: usize,
        inputs: usize,
        with_position: bool,
        more: Vec<Stmt>,
    ) -> Stmt {
        let r = &self.r;
        let (_, unsigned) = self.k.dtypes();
        let first = pass == 0;
        let mut body = Vec::new();
        // A register read as the expression's input after the launch's.
        let scalar = |dtype: DType| Expr::Load {
            input: inputs,
            dtype,
            coef: Vec::new(),
            off: 0,
        };
        // The launch's first inputs: the key operand, or the mapped keys and the positions.
        if first {
            body.push(Stmt::Load {
                reg: r.key,
                buf: Buf::Input(0),
                index: self.s.at(Sc::Reg(r.row), Sc::Reg(r.e)),
            });
            body.push(Stmt::Eval {
                reg: r.bits,
                expr: self.k.transform(scalar(self.s.key), self.s.descending),
                scalars: vec![r.key],
            });
            if with_position {
                body.push(Stmt::Let {
                    reg: r.position,
                    value: Sc::Reg(r.e),
                });
            }
        } else {
            let at = self.in_scratch(Sc::Reg(r.e));
            body.push(Stmt::Load {
                reg: r.bits,
                buf: Buf::Input(0),
                index: at.clone(),
            });
            if with_position {
                body.push(Stmt::Load {
                    reg: r.position,
                    buf: Buf::Input(1),
                    index: at,
                });
            }
        }
        body.push(Stmt::Eval {
            reg: r.digit,
            expr: digit(scalar(unsigned), unsigned, self.shift(pass), self.g.bits),
            scalars: vec![r.bits],
        });
        body.push(Stmt::Let {
            reg: r.slot,
            value: self.counter(Sc::Reg(r.digit), Sc::Special(Special::Thread)),
        });
        body.extend(more);
        // e = (chunk · per_chunk + tile) · T + thread · E + item
        let e = Sc::plus(
            Sc::plus(
                Sc::times(
                    Sc::plus(
                        Sc::times(Sc::Reg(r.chunk), c(self.per_chunk)),
                        Sc::Reg(r.tile),
                    ),
                    c(self.tile()),
                ),
                Sc::times(Sc::Special(Special::Thread), c(ITEMS)),
            ),
            Sc::Reg(r.item),
        );
        Self::range(
            r.item,
            c(0),
            ITEMS,
            c(1),
            vec![
                Stmt::Let { reg: r.e, value: e },
                Stmt::If {
                    cond: Sc::lt(Sc::Reg(r.e), c(self.s.n)),
                    body,
                },
            ],
        )
    }

    /// The thread's counter of the element's digit plus one.
    fn bump(&self) -> Vec<Stmt> {
        let r = &self.r;
        vec![
            Stmt::SharedLoad {
                reg: r.count,
                array: COUNTERS,
                index: Sc::Reg(r.slot),
            },
            Stmt::Let {
                reg: r.next,
                value: Sc::plus(Sc::Reg(r.count), c(1)),
            },
            Stmt::SharedStore {
                array: COUNTERS,
                index: Sc::Reg(r.slot),
                value: r.next,
            },
        ]
    }

    /// `body` for each tile of the chunk, in order.
    fn each_tile(&self, body: Vec<Stmt>) -> Stmt {
        Self::range(self.r.tile, c(0), self.per_chunk, c(1), body)
    }

    /// Element `i` of the slice in the scratch buffers.
    fn in_scratch(&self, i: Sc) -> Sc {
        Sc::plus(Sc::times(Sc::Reg(self.r.row), c(self.s.n)), i)
    }

    /// Count `(digit d, chunk)` of the slice in the counts or offsets.
    fn count_at(&self) -> Sc {
        Sc::plus(
            Sc::plus(
                Sc::times(Sc::Reg(self.r.row), c(self.per_row())),
                Sc::times(Sc::Reg(self.r.d), c(self.chunks)),
            ),
            Sc::Reg(self.r.chunk),
        )
    }

    /// The first inputs of pass `pass`'s count and scatter launches: the key operand, or the
    /// mapped keys and positions the pass before wrote; the scatter's also the offsets.
    fn inputs_of(&self, pass: usize, scatter: bool) -> Vec<(Buf, TensorType)> {
        let mut v = if pass == 0 {
            vec![(
                Buf::Input(self.s.key_input),
                self.ins[self.s.key_input].clone(),
            )]
        } else {
            let from = (pass - 1) % 2;
            let keys = self.scratch(KEYS[from]);
            if scatter {
                vec![keys, self.scratch(POSITIONS[from])]
            } else {
                vec![keys]
            }
        };
        if scatter {
            v.push(self.scratch(OFFSETS));
        }
        v
    }

    /// Pass `pass`'s counts of each chunk's digits.
    fn count(&self, pass: usize) -> GpuKernel {
        let r = &self.r;
        let ins = self.inputs_of(pass, false);
        let sum_row = vec![
            Stmt::Let {
                reg: r.acc,
                value: c(0),
            },
            Self::range(
                r.j,
                c(0),
                self.g.threads,
                c(1),
                vec![
                    Stmt::SharedLoad {
                        reg: r.count,
                        array: COUNTERS,
                        index: self.counter(Sc::Reg(r.d), Sc::Reg(r.j)),
                    },
                    Stmt::Let {
                        reg: r.acc,
                        value: Sc::plus(Sc::Reg(r.acc), Sc::Reg(r.count)),
                    },
                ],
            ),
            Stmt::Store {
                buf: Buf::Output(0),
                index: self.count_at(),
                value: r.acc,
            },
        ];
        let body = vec![
            self.zero_column(),
            self.each_tile(vec![self.each_element(pass, ins.len(), false, self.bump())]),
            Stmt::Barrier,
            self.each_digit(sum_row),
            // The next chunk's counters wait for every thread's sums of this one.
            Stmt::Barrier,
        ];
        self.launch(
            format!("d{pass}_count"),
            self.per_chunk_grid(),
            ins,
            vec![self.scratch(COUNTS)],
            vec![Self::shared(DType::I32, self.buckets() * self.g.threads)],
            self.each_chunk(body),
        )
    }

    /// Pass `pass`'s offsets: the exclusive prefix sums of each slice's counts.
    fn scan(&self, pass: usize) -> GpuKernel {
        let r = &self.r;
        let m = self.per_row();
        let threads = self.scan_threads;
        let run = m.div_ceil(threads);
        let thread = Sc::Special(Special::Thread);
        // Count `at` (in `e`) of the thread's run `j`, when in the slice's counts.
        let each = |body: Vec<Stmt>| {
            Self::range(
                r.j,
                c(0),
                run,
                c(1),
                vec![
                    Stmt::Let {
                        reg: r.e,
                        value: Sc::plus(Sc::times(thread.clone(), c(run)), Sc::Reg(r.j)),
                    },
                    Stmt::If {
                        cond: Sc::lt(Sc::Reg(r.e), c(m)),
                        body,
                    },
                ],
            )
        };
        let at = Sc::plus(Sc::times(Sc::Reg(r.row), c(m)), Sc::Reg(r.e));
        let read = Stmt::Load {
            reg: r.count,
            buf: Buf::Input(0),
            index: at.clone(),
        };
        let add = Stmt::Let {
            reg: r.acc,
            value: Sc::plus(Sc::Reg(r.acc), Sc::Reg(r.count)),
        };
        let per_row = vec![
            Stmt::Let {
                reg: r.acc,
                value: c(0),
            },
            each(vec![read.clone(), add.clone()]),
            Stmt::SharedStore {
                array: SUMS,
                index: thread.clone(),
                value: r.acc,
            },
            Stmt::Barrier,
            // One thread turns the threads' sums into where their runs start, in order.
            Stmt::If {
                cond: Sc::eq(thread.clone(), c(0)),
                body: vec![
                    Stmt::Let {
                        reg: r.acc,
                        value: c(0),
                    },
                    Self::range(
                        r.j,
                        c(0),
                        threads,
                        c(1),
                        vec![
                            Stmt::SharedLoad {
                                reg: r.count,
                                array: SUMS,
                                index: Sc::Reg(r.j),
                            },
                            Stmt::SharedStore {
                                array: SUMS,
                                index: Sc::Reg(r.j),
                                value: r.acc,
                            },
                            add.clone(),
                        ],
                    ),
                ],
            },
            Stmt::Barrier,
            Stmt::SharedLoad {
                reg: r.acc,
                array: SUMS,
                index: thread.clone(),
            },
            each(vec![
                read,
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: at,
                    value: r.acc,
                },
                add,
            ]),
            // The next slice's sums wait for every thread's read of this one's.
            Stmt::Barrier,
        ];
        let grid = self.rows.min(self.gpu.sms * self.gpu.blocks_per_sm).max(1);
        self.launch(
            format!("d{pass}_scan"),
            (grid, threads),
            vec![self.scratch(COUNTS)],
            vec![self.scratch(OFFSETS)],
            vec![Self::shared(DType::I64, threads)],
            vec![Self::range(
                r.row,
                Sc::Special(Special::Block),
                self.rows,
                Sc::Special(Special::GridDim),
                per_row,
            )],
        )
    }

    /// Pass `pass` of `passes`: each chunk's elements written, in order, where their digits'
    /// offsets say; the last pass writes the operands.
    fn scatter(&self, pass: usize, passes: usize) -> GpuKernel {
        let r = &self.r;
        let last = pass + 1 == passes;
        let mut ins = self.inputs_of(pass, true);
        let offsets = Buf::Input(ins.len() - 1);
        let operands = ins.len();
        // The chunk's first slot of each digit.
        let start = self.each_digit(vec![
            Stmt::Load {
                reg: r.acc,
                buf: offsets,
                index: self.count_at(),
            },
            Stmt::SharedStore {
                array: RUNNING,
                index: Sc::Reg(r.d),
                value: r.acc,
            },
        ]);
        // A thread per digit: each thread's first slot of it in the tile.
        let slots = self.each_digit(vec![
            Stmt::SharedLoad {
                reg: r.acc,
                array: RUNNING,
                index: Sc::Reg(r.d),
            },
            Self::range(
                r.j,
                c(0),
                self.g.threads,
                c(1),
                vec![
                    Stmt::Let {
                        reg: r.slot,
                        value: self.counter(Sc::Reg(r.d), Sc::Reg(r.j)),
                    },
                    Stmt::SharedLoad {
                        reg: r.count,
                        array: COUNTERS,
                        index: Sc::Reg(r.slot),
                    },
                    Stmt::SharedStore {
                        array: COUNTERS,
                        index: Sc::Reg(r.slot),
                        value: r.acc,
                    },
                    Stmt::Let {
                        reg: r.acc,
                        value: Sc::plus(Sc::Reg(r.acc), Sc::Reg(r.count)),
                    },
                ],
            ),
            Stmt::SharedStore {
                array: RUNNING,
                index: Sc::Reg(r.d),
                value: r.acc,
            },
        ]);
        // Each element to its digit's next slot.
        let mut place = vec![
            Stmt::SharedLoad {
                reg: r.dest,
                array: COUNTERS,
                index: Sc::Reg(r.slot),
            },
            Stmt::Let {
                reg: r.next,
                value: Sc::plus(Sc::Reg(r.dest), c(1)),
            },
            Stmt::SharedStore {
                array: COUNTERS,
                index: Sc::Reg(r.slot),
                value: r.next,
            },
        ];
        let outputs = if last {
            for (m, &v) in r.values.iter().enumerate() {
                place.push(Stmt::Load {
                    reg: v,
                    buf: Buf::Input(operands + m),
                    index: self.s.at(Sc::Reg(r.row), Sc::Reg(r.position)),
                });
                place.push(Stmt::Store {
                    buf: Buf::Output(m),
                    index: self.s.at(Sc::Reg(r.row), Sc::Reg(r.dest)),
                    value: v,
                });
            }
            ins.extend(
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
            let at = self.in_scratch(Sc::Reg(r.dest));
            place.push(Stmt::Store {
                buf: Buf::Output(0),
                index: at.clone(),
                value: r.bits,
            });
            place.push(Stmt::Store {
                buf: Buf::Output(1),
                index: at,
                value: r.position,
            });
            let to = pass % 2;
            vec![self.scratch(KEYS[to]), self.scratch(POSITIONS[to])]
        };
        let body = vec![
            start,
            self.each_tile(vec![
                self.zero_column(),
                self.each_element(pass, ins.len(), false, self.bump()),
                Stmt::Barrier,
                slots,
                Stmt::Barrier,
                self.each_element(pass, ins.len(), true, place),
                // The next tile's counters wait for every thread's slots of this one.
                Stmt::Barrier,
            ]),
        ];
        self.launch(
            format!("d{pass}_scatter"),
            self.per_chunk_grid(),
            ins,
            outputs,
            vec![
                Self::shared(DType::I32, self.buckets() * self.g.threads),
                Self::shared(DType::I64, self.buckets()),
            ],
            self.each_chunk(body),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_h200_takes_6_bit_digits_in_blocks_of_128() {
        let g = Digits::on(&Gpu::h200()).unwrap();
        assert_eq!(
            g,
            Digits {
                threads: 128,
                bits: 6
            }
        );
        assert_eq!(g.passes(KeyBits::of(DType::F32).unwrap()), 6);
        assert_eq!(g.passes(KeyBits::of(DType::F16).unwrap()), 4);
        assert_eq!(g.passes(KeyBits::of(DType::F64).unwrap()), 11);
        assert_eq!(launches(DType::F32, &Gpu::h200()), Some(18));
    }
}

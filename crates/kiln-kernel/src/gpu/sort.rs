//! A `sort` by keys on the GPU ([`MapKind::Sort`]): one block per slice, a bitonic network
//! in shared memory; slices too long for a block, a radix sort over several launches.
//!
//! A sort whose plan is [`crate::sort::SortPlan::Keys`] (its comparator only compares one
//! operand's elements: what `Tensor::sort`, `argsort` and `topk` trace) orders each slice along its
//! dimension by those keys, stably. The block loads the slice's keys into shared memory with
//! their positions, padded to a power of two `P` (the padding sorts after every element),
//! and sorts the pairs by a bitonic network: for `k = 2, 4, ..., P` and `j = k/2, ..., 1`,
//! thread-strided over the `P/2` pairs `(lo, lo + j)`, each pair is exchanged where it is out
//! of order (ascending where `lo & k` is 0, else descending), with a barrier after each of
//! the `log2(P) (log2(P) + 1) / 2` stages. Pairs compare by key, then by position: a total
//! order, so the network's result is the stable sort's, deterministic and equal to the
//! reference's whatever the network does with equal keys. A key of a float type is ordered as
//! the plan says: `-0` equal to `+0` (they keep their order), NaN greater than every number
//! (`nan_greatest`), descending the reverse with positions still ascending. Each operand's
//! slice is then written in the sorted positions' order, read from global memory, so every
//! element keeps its bits (a NaN's payload, a zero's sign).
//!
//! Which form runs when:
//!
//! - a slice whose padded pairs fit the shared memory a kernel declares
//!   ([`crate::target::Gpu::static_shared_bytes`]: 4,096 f32 keys on an H200) is sorted by one
//!   block in one launch, the network above: one read and one write of each element, however
//!   many slices;
//! - a slice that pads to two such tiles runs the same network in three launches
//!   ([`mod@long`]: the tiles sorted in shared memory, one stage between them in global memory,
//!   the last stages within tiles): about three passes over keys and positions, fewer than a
//!   radix sort's passes (six for f32 keys on an H200), so the network stays better there;
//! - any longer slice runs the radix sort ([`mod@radix`]): a pass of three launches per digit
//!   of the keys' order-preserving bits, `O(n)` a pass, where the network's launches grow as
//!   the square of the logarithm of the slice's tiles (91 launches for 16·2²⁰ f32 keys
//!   against the radix sort's 18).
//!
//! - a long slice whose users read only its first `k` elements ([`crate::sort::top_k`])
//!   finds those in two launches ([`mod@top_k`]: each tile's leading `k`, then the
//!   candidates' network), where the candidates fit a block.
//!
//! Where the radix sort's counters do not fit a block (a GPU with almost no shared memory),
//! long slices fall back to the network over the whole slice. Every form is checked on the
//! emulator and by ptxas; the radix sort is not measured on a real GPU yet.
//!
//! Any other sort (a comparator that is more than one key's order, float keys whose plan
//! leaves NaN unordered, where a NaN among them makes the result depend on the algorithm, and
//! long slices of 8-bit and narrower float keys, which the radix sort does not map and whose
//! bits the network's scratch buffers would not order as the values) runs the reference's
//! merge sort, a thread per slice, comparison for comparison ([`mod@merge`]), when its
//! comparator is one kernel expression. Left to the host: comparators that are not (a region
//! with an op that is not elementwise, or computing on small floats or complex numbers), and
//! operands of complex or 8-bit and narrower float dtypes.

pub mod long;
pub mod merge;
pub mod radix;
pub mod top_k;

use super::ir::{Buf, GpuKernel, GpuProgram, MapKind, Sc, SharedArray, Special, Stmt};
use crate::ir::{Ew, Expr};
use crate::sort::{KeySort, key_sort};
use crate::target::{Gpu, SumTree};
use kiln_ir::{ComparisonDirection, DType, Op, OpKind, TensorType};

/// The program sorting `op` (a `sort` of operands of types `ins`) on `gpu`, its launch named
/// `name`; `None` when the host runs it (see the module's documentation). With `top_k`
/// (`crate::sort::top_k`: its users read only that many leading elements of each slice), a
/// sort by keys of long slices finds only those ([`mod@top_k`]).
pub fn sort_program(
    op: &Op,
    ins: &[TensorType],
    gpu: &Gpu,
    sums: SumTree,
    name: &str,
    top_k: Option<usize>,
) -> Option<GpuProgram> {
    keys_program(op, ins, gpu, sums, name, top_k).or_else(|| {
        let Op::Sort {
            dimension,
            comparator,
            ..
        } = op
        else {
            return None;
        };
        let d = usize::try_from(*dimension).ok()?;
        merge::program(comparator, ins, d, gpu, sums, name)
    })
}

/// The program of a sort by keys (the network, the radix sort, or with `top_k` the leading
/// elements of long slices); `None` for any other sort, and for keys these forms do not order
/// (see the module's documentation).
pub fn keys_program(
    op: &Op,
    ins: &[TensorType],
    gpu: &Gpu,
    sums: SumTree,
    name: &str,
    top_k: Option<usize>,
) -> Option<GpuProgram> {
    let KeySort {
        dimension,
        operand,
        descending,
        nan_greatest,
    } = key_sort(op, ins.len())?;
    let key = ins.get(operand)?.dtype;
    // Whole-byte integers and floats; a float's NaN must have its place.
    let byte_int = matches!(
        key,
        DType::I8
            | DType::I16
            | DType::I32
            | DType::I64
            | DType::U8
            | DType::U16
            | DType::U32
            | DType::U64
    );
    if !(byte_int || key.is_float() && nan_greatest) {
        return None;
    }
    let shape = &ins[0].shape;
    let d = usize::try_from(dimension)
        .ok()
        .filter(|&d| d < shape.len())?;
    let n = shape[d];
    let inner: usize = shape[d + 1..].iter().product();
    let rows = shape.iter().product::<usize>() / n.max(1);
    let padded = n.max(2).next_power_of_two();
    // The keys as registers hold them (f16 and bf16 as f32), and an i64 position each.
    let key_bytes = if key.is_float() {
        key.bytes().max(4)
    } else {
        key.bytes()
    };
    let shared = gpu.shared_limit();
    if rows == 0 || n <= 1 {
        return None;
    }
    let largest = prev_power_of_two(gpu.max_threads_per_block);
    let fits = |p: usize| p * (key_bytes + 8) <= shared;
    // A slice too long for one block sorts in tiles of the longest that fits.
    let tile = if fits(padded) {
        padded
    } else {
        prev_power_of_two(shared / (key_bytes + 8))
    };
    if tile < 2 {
        return None;
    }
    let threads = (tile / 2).min(largest).max(gpu.warp_size);
    let s = Sorter {
        n,
        inner,
        padded: tile,
        threads,
        key,
        key_input: operand,
        descending,
        inputs: ins.len(),
        base: None,
    };
    let (regs, r) = Regs::new(ins.len());
    if let Some(k) = top_k
        && key.mini().is_none()
        && top_k::fits(n, k, tile)
    {
        return Some(top_k::program(&s, rows, k, (regs, r), ins, gpu, sums, name));
    }
    if padded > 2 * tile
        && let Some(p) = radix::program(&s, rows, ins, gpu, sums, name)
    {
        return Some(p);
    }
    if tile < padded {
        if key.mini().is_some() {
            // Left to the host (see the module's documentation).
            return None;
        }
        return Some(long::program(
            &s,
            long::Slices { rows, padded },
            (regs, r),
            ins,
            gpu,
            sums,
            name,
        ));
    }
    let grid = rows.min(gpu.sms * gpu.blocks_per_sm).max(1);
    let mut per_row = vec![s.load_keys(&regs, s.key_input, None, s.padded)];
    per_row.push(Stmt::Barrier);
    let mut k = 2;
    while k <= padded {
        let mut j = k / 2;
        while j >= 1 {
            per_row.push(s.stage(&regs, k, j));
            per_row.push(Stmt::Barrier);
            j /= 2;
        }
        k *= 2;
    }
    per_row.extend(s.store(&regs));
    // The next slice's loads wait for every thread's last reads of this one.
    per_row.push(Stmt::Barrier);
    let body = vec![Stmt::For {
        reg: regs.row,
        start: Sc::Special(Special::Block),
        end: c(rows),
        step: Sc::Special(Special::GridDim),
        body: per_row,
    }];
    Some(GpuProgram {
        scratch: Vec::new(),
        zeroed: Vec::new(),
        launches: vec![GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind: MapKind::Sort,
            grid,
            block: threads,
            warp: gpu.warp_size,
            inputs: ins
                .iter()
                .enumerate()
                .map(|(i, t)| (Buf::Input(i), t.clone()))
                .collect(),
            outputs: ins
                .iter()
                .enumerate()
                .map(|(i, t)| (Buf::Output(i), t.clone()))
                .collect(),
            shared: vec![
                SharedArray {
                    dtype: key,
                    len: padded,
                    packed: false,
                    swizzle: None,
                },
                SharedArray {
                    dtype: DType::I64,
                    len: padded,
                    packed: false,
                    swizzle: None,
                },
            ],
            regs: r,
            vars: 0,
            sums,
            body,
        }],
    })
}

fn prev_power_of_two(x: usize) -> usize {
    if x == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - x.leading_zeros())
    }
}

fn c(x: usize) -> Sc {
    Sc::Const(x as i64)
}

/// `1` where either of two 0-or-1 values is 1.
fn or(a: Sc, b: Sc) -> Sc {
    Sc::lt(c(0), Sc::plus(a, b))
}

/// The shared arrays of the launch.
const KEYS: usize = 0;
const POSITIONS: usize = 1;

/// The registers of a thread.
#[derive(Clone)]
struct Regs {
    /// The slice.
    row: usize,
    /// A thread-strided position or pair.
    i: usize,
    /// A key loaded or stored, a position stored, and each operand's element.
    key: usize,
    position: usize,
    values: Vec<usize>,
    /// A pair's two positions.
    lo: usize,
    hi: usize,
    /// The pair's keys and positions: key lo, position lo, key hi, position hi.
    pair: [usize; 4],
    /// Whether lo's key orders before hi's, and hi's before lo's.
    less: [usize; 2],
    /// Whether the pair is exchanged.
    swap: usize,
    /// The position an output element comes from.
    src: usize,
    /// A global element index.
    pos: usize,
}

impl Regs {
    /// The registers of a sort of `operands` operands, and how many they are.
    fn new(operands: usize) -> (Regs, usize) {
        let mut r = 0;
        let mut reg = || {
            r += 1;
            r - 1
        };
        let regs = Regs {
            row: reg(),
            i: reg(),
            key: reg(),
            position: reg(),
            values: (0..operands).map(|_| reg()).collect(),
            lo: reg(),
            hi: reg(),
            pair: [reg(), reg(), reg(), reg()],
            less: [reg(), reg()],
            swap: reg(),
            src: reg(),
            pos: reg(),
        };
        (regs, r)
    }
}

/// What the statements of one sort depend on.
#[derive(Clone)]
struct Sorter {
    /// The slices' length, their stride apart in memory, and the padded length.
    n: usize,
    inner: usize,
    padded: usize,
    threads: usize,
    key: DType,
    key_input: usize,
    descending: bool,
    /// The launch's inputs (a key comparison reads its registers as inputs after those).
    inputs: usize,
    /// A register holding where the block's tile starts in its slice, when the slice is
    /// longer than one block sorts ([`mod@long`]): the network's runs ascend or descend by their
    /// place in the slice.
    base: Option<usize>,
}

impl Sorter {
    /// The global index of element `i` of slice `row`.
    fn at(&self, row: Sc, i: Sc) -> Sc {
        let inner = c(self.inner);
        Sc::plus(
            Sc::plus(
                Sc::times(Sc::quot(row.clone(), inner.clone()), c(self.n * self.inner)),
                Sc::times(i, inner.clone()),
            ),
            Sc::modulo(row, inner),
        )
    }

    /// `for (i = thread; i < end; i += threads) body`.
    fn strided(&self, r: &Regs, end: usize, body: Vec<Stmt>) -> Stmt {
        Stmt::For {
            reg: r.i,
            start: Sc::Special(Special::Thread),
            end: c(end),
            step: c(self.threads),
            body,
        }
    }

    /// `len` of the slice's keys and their positions into shared memory, thread-strided: slot
    /// `i` takes the key at position `i` of the slice (`base + i`, into `r.pos`, with a base
    /// register) from input `input`; past the slice, padding (key 0, never compared; its
    /// position past the slice).
    fn load_keys(&self, r: &Regs, input: usize, base: Option<usize>, len: usize) -> Stmt {
        let at = if base.is_some() { r.pos } else { r.i };
        let element = vec![
            Stmt::Load {
                reg: r.key,
                buf: Buf::Input(input),
                index: self.at(Sc::Reg(r.row), Sc::Reg(at)),
            },
            Stmt::SharedStore {
                array: KEYS,
                index: Sc::Reg(r.i),
                value: r.key,
            },
        ];
        let padding = vec![
            Stmt::Eval {
                reg: r.key,
                expr: Expr::Const {
                    dtype: self.key,
                    value: 0.0,
                },
                scalars: Vec::new(),
            },
            Stmt::SharedStore {
                array: KEYS,
                index: Sc::Reg(r.i),
                value: r.key,
            },
        ];
        let mut body: Vec<Stmt> = base
            .map(|b| Stmt::Let {
                reg: r.pos,
                value: Sc::plus(Sc::Reg(b), Sc::Reg(r.i)),
            })
            .into_iter()
            .collect();
        body.extend([
            Stmt::If {
                cond: Sc::lt(Sc::Reg(at), c(self.n)),
                body: element,
            },
            Stmt::If {
                cond: Sc::is_zero(Sc::lt(Sc::Reg(at), c(self.n))),
                body: padding,
            },
            Stmt::Let {
                reg: r.position,
                value: Sc::Reg(at),
            },
            Stmt::SharedStore {
                array: POSITIONS,
                index: Sc::Reg(r.i),
                value: r.position,
            },
        ]);
        self.strided(r, len, body)
    }

    /// Whether key `a` orders before key `b` (registers read as the expression's scalars 0
    /// and 1): `a < b`, a NaN after every number; descending, the reverse.
    fn key_less(&self, a: usize, b: usize) -> Expr {
        let (a, b) = if self.descending { (b, a) } else { (a, b) };
        let scalar = |i: usize| Expr::Load {
            input: self.inputs + i,
            dtype: self.key,
            coef: Vec::new(),
            off: 0,
        };
        let (x, y) = (scalar(a), scalar(b));
        let cmp = |d: ComparisonDirection, p: Expr, q: Expr| Expr::Op {
            op: Ew::Cmp(d),
            dtype: DType::Pred,
            args: vec![p, q],
        };
        let logic = |k: OpKind, args: Vec<Expr>| Expr::Op {
            op: Ew::Kind(k),
            dtype: DType::Pred,
            args,
        };
        let lt = cmp(ComparisonDirection::Lt, x.clone(), y.clone());
        if !self.key.is_float() {
            return lt;
        }
        // b is NaN and a is not.
        let nan_after = logic(
            OpKind::And,
            vec![
                cmp(ComparisonDirection::Ne, y.clone(), y),
                cmp(ComparisonDirection::Eq, x.clone(), x),
            ],
        );
        logic(OpKind::Or, vec![lt, nan_after])
    }

    /// Whether a pair loaded into `r.pair` (its lower element first) is exchanged in a run of
    /// `k` at `first` (the lower element's index in the slice: runs where `first & k` is 0
    /// ascend).
    fn swap(&self, r: &Regs, k: usize, first: Sc) -> Sc {
        let [_, plo, _, phi] = r.pair;
        // Pair (x, y) in order: x's key first, or equal keys and x's position first; the
        // padding (positions from n on) after every element, in position order.
        let before = |x_is_lo: bool, x_pos: usize, y_pos: usize| -> Sc {
            let (xp, yp) = (Sc::Reg(x_pos), Sc::Reg(y_pos));
            let x_pad = Sc::is_zero(Sc::lt(xp.clone(), c(self.n)));
            let y_pad = Sc::is_zero(Sc::lt(yp.clone(), c(self.n)));
            let by_position = Sc::lt(xp, yp);
            let (kl, kg) = if x_is_lo {
                (r.less[0], r.less[1])
            } else {
                (r.less[1], r.less[0])
            };
            let keys = or(
                Sc::Reg(kl),
                Sc::and(Sc::is_zero(Sc::Reg(kg)), by_position.clone()),
            );
            or(
                Sc::and(Sc::is_zero(x_pad.clone()), y_pad.clone()),
                or(
                    Sc::and(Sc::and(x_pad.clone(), y_pad.clone()), by_position),
                    Sc::and(Sc::and(Sc::is_zero(x_pad), Sc::is_zero(y_pad)), keys),
                ),
            )
        };
        let ascending = Sc::eq(Sc::modulo(Sc::quot(first, c(k)), c(2)), c(0));
        // Ascending runs exchange when hi belongs before lo; descending ones, lo before hi.
        or(
            Sc::and(ascending.clone(), before(false, phi, plo)),
            Sc::and(Sc::is_zero(ascending), before(true, plo, phi)),
        )
    }

    /// One stage of the network: each pair `(lo, lo + j)` in order for its run of `k`.
    fn stage(&self, r: &Regs, k: usize, j: usize) -> Stmt {
        let [klo, plo, khi, phi] = r.pair;
        let p = Sc::Reg(r.i);
        let lo = Sc::plus(
            Sc::times(Sc::quot(p.clone(), c(j)), c(2 * j)),
            Sc::modulo(p, c(j)),
        );
        // A tile of a longer slice (`long`) runs in the direction of its place in the slice.
        let first = match self.base {
            Some(b) => Sc::plus(Sc::Reg(b), Sc::Reg(r.lo)),
            None => Sc::Reg(r.lo),
        };
        let swap = self.swap(r, k, first);
        let exchange = vec![
            Stmt::SharedStore {
                array: KEYS,
                index: Sc::Reg(r.lo),
                value: khi,
            },
            Stmt::SharedStore {
                array: KEYS,
                index: Sc::Reg(r.hi),
                value: klo,
            },
            Stmt::SharedStore {
                array: POSITIONS,
                index: Sc::Reg(r.lo),
                value: phi,
            },
            Stmt::SharedStore {
                array: POSITIONS,
                index: Sc::Reg(r.hi),
                value: plo,
            },
        ];
        self.strided(
            r,
            self.padded / 2,
            vec![
                Stmt::Let {
                    reg: r.lo,
                    value: lo,
                },
                Stmt::Let {
                    reg: r.hi,
                    value: Sc::plus(Sc::Reg(r.lo), c(j)),
                },
                Stmt::SharedLoad {
                    reg: klo,
                    array: KEYS,
                    index: Sc::Reg(r.lo),
                },
                Stmt::SharedLoad {
                    reg: plo,
                    array: POSITIONS,
                    index: Sc::Reg(r.lo),
                },
                Stmt::SharedLoad {
                    reg: khi,
                    array: KEYS,
                    index: Sc::Reg(r.hi),
                },
                Stmt::SharedLoad {
                    reg: phi,
                    array: POSITIONS,
                    index: Sc::Reg(r.hi),
                },
                Stmt::Eval {
                    reg: r.less[0],
                    expr: self.key_less(0, 1),
                    scalars: vec![klo, khi],
                },
                Stmt::Eval {
                    reg: r.less[1],
                    expr: self.key_less(1, 0),
                    scalars: vec![klo, khi],
                },
                Stmt::Let {
                    reg: r.swap,
                    value: swap,
                },
                Stmt::If {
                    cond: Sc::Reg(r.swap),
                    body: exchange,
                },
            ],
        )
    }

    /// Each operand's slice in the sorted positions' order.
    fn store(&self, r: &Regs) -> Vec<Stmt> {
        let mut body = vec![
            Stmt::SharedLoad {
                reg: r.src,
                array: POSITIONS,
                index: Sc::Reg(r.i),
            },
            Stmt::Let {
                reg: r.pos,
                value: self.at(Sc::Reg(r.row), Sc::Reg(r.i)),
            },
        ];
        for (m, &v) in r.values.iter().enumerate() {
            body.push(Stmt::Load {
                reg: v,
                buf: Buf::Input(m),
                index: self.at(Sc::Reg(r.row), Sc::Reg(r.src)),
            });
            body.push(Stmt::Store {
                buf: Buf::Output(m),
                index: Sc::Reg(r.pos),
                value: v,
            });
        }
        vec![self.strided(r, self.n, body)]
    }
}

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
//!   the reductions read from registers. A row that several of these passes read is loaded
//!   once, into registers or shared memory (`row_cache.rs`).
//! - Such reductions split over many blocks in two launches, partials in scratch between
//!   them, when few rows would leave multiprocessors idle (a sum over a whole tensor,
//!   [`MapKind::SplitPartials`]) or when the terms are contiguous along the kept dimension
//!   rather than the reduced one (a column sum, [`MapKind::ColumnPartials`]): `split.rs`.
//! - A fold ([`Expr::Fold`]: a `reduce_region` of an elementwise body, an argmax's value and
//!   index) is one launch: a warp or block per long row, its threads' `k` accumulators
//!   combined in thread order, or a thread per short row or column (`fold.rs`); long rows
//!   fewer than the multiprocessors split over blocks in two launches (`fold_split.rs`).
//! - A matrix product runs by block tiles (`Gpu::gemm_tiles`): A's and B's tiles staged
//!   through shared memory, double buffered (`staging.rs`), a register tile per thread
//!   ([`MapKind::GemmTiled`], `tiled.rs`), or, on a target without tiles, one thread per
//!   output element over the whole contraction ([`MapKind::Gemm`]). An elementwise epilogue
//!   runs in the product's launch; a row-reducing one (and a chained second product) run as
//!   further launches over a scratch buffer (`gemm.rs`). Every product mapping reads its
//!   operands, and stores a plain product, through strides where fusion gives it strides
//!   (`strided.rs`: attention's heads read and merged back in place). A product of bf16 or
//!   f16 operands with an f32 result runs on the tensor cores (`Gpu::mma_tiles`, `ldmatrix` and
//!   `mma.m16n8k16` per warp, [`MapKind::GemmMma`], `tensor.rs`), and so does an f32 product
//!   when the options allow TF32 ([`MatmulPrecision::Tf32`]) and the GPU has TF32 tensor cores
//!   (`Gpu::tf32`; `mma.m16n8k8`, operands rounded to TF32 as they are loaded). On a GPU
//!   with sm_90a's warpgroup products (`Gpu::wgmma`) and a tile for them (`Gpu::wgmma_tiles`)
//!   a product of bf16 or f16 operands runs on `wgmma.m64nNk16` instead (`warpgroup.rs`,
//!   operands through matrix descriptors of the staged 128-byte-swizzled tiles), or, with
//!   `Gpu::wgmma_tma`, warp-specialized: a producer warp loading the tiles by TMA into a ring
//!   guarded by mbarriers (`warpgroup_tma.rs`). Attention (a product whose
//!   softmax epilogue fusion computes online, chained into a second product) runs as one
//!   launch, flash-attention style: by register tiles of query rows x keys where one of
//!   `Gpu::attention_tiles` fits ([`MapKind::AttentionTiled`], `attention_tiles.rs`), else a
//!   warp per query row ([`MapKind::Attention`], `attention.rs`); attention traced in bf16
//!   or f16 runs on the tensor cores, `mma.m16n8k16` for both products and the softmax in
//!   f32 ([`MapKind::AttentionMma`], `attention_mma.rs`).
//! - A loop nest without reductions that reads across its output (a transpose, NCHW to NHWC,
//!   a gather that is a transpose: [`crate::loop_schedule::transpose_tile_dim`], as the CPU
//!   picks its tiles) runs in tiles of warp-size x warp-size elements staged through a padded
//!   shared array, reads and writes both coalesced ([`MapKind::TransposeTiles`],
//!   `transpose.rs`).
//! - A scatter combines its updates in order, so its result is deterministic
//!   ([`MapKind::Scatter`], `scatter.rs`): a thread per position of the update dimensions
//!   that address whole output dimensions by themselves (an embedding gradient's columns),
//!   each in order over the others; else a thread per output element scanning every update
//!   in order, where they are few; else the updates sorted by target and a thread per element
//!   combining its run (`scatter_sorted.rs`). A select-and-scatter runs a thread per
//!   output element visiting the windows that cover it, each window's selection recomputed
//!   ([`MapKind::SelectScatter`], `select_scatter.rs`). Both are the sequential result bit
//!   for bit, without atomics.
//! - Float atomics only where the options allow them ([`Options::float_atomics`], off by
//!   default): then an f32 sum that splits (above) runs in one launch whose blocks or threads
//!   add their partials into the result, zeroed first (the program's
//!   [`GpuProgram::zeroed`]), by [`Stmt::AtomicAdd`] ([`MapKind::SplitAtomic`],
//!   [`MapKind::ColumnAtomic`]), and an f32 or f16 scatter-add that would sort its updates
//!   copies its operand and adds each update into its target atomically instead
//!   ([`MapKind::ScatterAtomic`], `scatter_atomic.rs`). bf16 keeps the deterministic forms:
//!   PTX's `red.add.noftz.bf16` needs sm_90, and the kernels also assemble for sm_80. The
//!   order of the additions is the hardware's, so the last bits vary from run to run.
//!
//! # The order of a cooperative sum, and its error bound
//!
//! A row's reduction of `N` terms over `T` threads (a warp or a block) is cut into chunks of
//! `c = clamp(⌈N / T⌉, 1, leaf)` terms `T` apart (`leaf` of [`SumTree`]; chunk `k` of thread
//! `t` holds terms `(k·c + j)·T + t`, `j < c`, so a warp's loads are consecutive); thread `t`
//! adds its chunks `k = 0, 1, ...`, each chunk in one chain from the reduction's identity, the
//! chunk results in a tree of `fanout` per node (as [`SumTree`] does); the threads' results
//! are combined by a fixed butterfly of `log2(warp)` shuffle levels (every lane ends with the
//! same value: a float sum or maximum is commutative bit for bit), and for a block, the
//! warps' results by one more such tree in warp 0 through shared memory. Finally the
//! reduction's start value is combined with the total. The order is fixed by the geometry, so
//! results are deterministic. A term passes through at most
//! `leaf + (fanout + 1) · L + log2(T) + 1` roundings (its chunk's chain; the tree of chunk
//! results, `L = ⌈log_fanout ⌈N / (T · leaf)⌉⌉` levels of at most `fanout` each, plus one
//! flush per level; the shuffle levels; the start value), within the
//! `K(n, r) = leaf + fanout · ⌈log_fanout(n / leaf)⌉ + fanout · r` of `ir-specs/ops/reduce.md`:
//! with `T >= fanout` threads, `K`'s tree has at least `L + 1` levels and `r >= 1`, which pays
//! for the shuffles, the flushes and the start value while `L <= 2 · fanout - log2(T) - 1`
//! (21 levels for a block of 1024 threads with the defaults: any row that fits in memory).
//! Reductions inside a thread's own expression (short ones, and those of matrix
//! products over the contraction) run as [`SumTree`] says, as on the CPU.

use super::ir::*;
use crate::access::free_vars;
use crate::ir::{ConvPatches, Ew, Expr, Idx, Kernel, Rewriter, Schedule, Visitor};
use crate::key::{ValueKey, value_key};
use crate::options::{MatmulPrecision, Options};
use crate::target::{Gpu, SumTree, TargetInfo};
use kiln_ir::{Combiner, DType, OpKind, TensorType};

mod attention;
mod attention_mma;
mod attention_tiles;
mod fold;
mod fold_split;
mod gemm;
mod row_cache;
mod scatter;
mod scatter_atomic;
mod scatter_sorted;
mod select_scatter;
mod skip;
mod split;
mod staging;
mod strided;
mod tensor;
mod tiled;
mod transpose;
mod warpgroup;
mod warpgroup_tma;
mod zero_steps;

use row_cache::{RowCache, Rows};
use select_scatter::SelectWindows;

/// `k` (with inputs of types `inputs`, extra outputs after them) mapped onto the GPU of
/// `target`, its launches named after `name`, as `opts` allow: f32 products in the options'
/// [`MatmulPrecision`] (TF32 on the tensor cores where it allows it and the GPU has them),
/// float atomics where [`Options::float_atomics`] allows them (`split.rs`,
/// `scatter_atomic.rs`); an error for a target without a GPU. A launch whose shared arrays take
/// more than a kernel may declare statically holds them in dynamic shared memory
/// ([`GpuKernel::place_shared`]).
pub fn map(
    k: &Kernel,
    inputs: &[TensorType],
    target: &TargetInfo,
    opts: &Options,
    name: &str,
) -> Result<GpuProgram, String> {
    let gpu = target
        .gpu
        .as_ref()
        .ok_or_else(|| format!("{name}: the target has no GPU"))?;
    let mut p = map_launches(k, inputs, target, gpu, opts, name)?;
    for launch in &mut p.launches {
        launch.place_shared(gpu);
    }
    Ok(p)
}

/// [`map`]'s launches, their shared arrays not placed yet.
fn map_launches(
    k: &Kernel,
    inputs: &[TensorType],
    target: &TargetInfo,
    gpu: &Gpu,
    opts: &Options,
    name: &str,
) -> Result<GpuProgram, String> {
    let m = Mapper {
        gpu,
        sums: target.sums,
        precision: opts.matmul_precision,
        float_atomics: opts.float_atomics,
    };
    let ins: Vec<(Buf, TensorType)> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (Buf::Input(i), t.clone()))
        .collect();
    match &k.schedule {
        Schedule::Nest if k.extra.is_empty() && m.transpose_dim(k).is_some() => {
            let a = m.transpose_dim(k).expect("checked");
            Ok(GpuProgram {
                scratch: Vec::new(),
                zeroed: Vec::new(),
                launches: vec![m.transpose_tiles(name, k, a, ins)],
            })
        }
        Schedule::Nest => {
            let mut outs = vec![(Buf::Output(0), k.out.clone(), k.body.clone())];
            for (e, x) in k.extra.iter().enumerate() {
                outs.push((Buf::Output(1 + e), x.out.clone(), x.body.clone()));
            }
            // Folds computed once per output row, unless the row also has reductions the row
            // mappings compute (the folds then run in the expressions, a thread each).
            let bodies: Vec<&Expr> = outs.iter().map(|o| &o.2).collect();
            let rank = k.out.shape.len();
            let folds = fold::row_folds(&bodies, rank);
            if !folds.is_empty() && hoistable(&bodies, rank).is_empty() {
                if let Some(p) = m.fold_split(name, &k.out, k.vars, &ins, &outs, &folds) {
                    return Ok(p);
                }
                return Ok(GpuProgram {
                    scratch: Vec::new(),
                    zeroed: Vec::new(),
                    launches: vec![m.fold_rows(name, &k.out, k.vars, ins, outs, &folds)],
                });
            }
            Ok(m.nest_program(name, &k.out, k.vars, ins, outs))
        }
        Schedule::Gemm { .. } => m.gemm(name, k, ins),
        Schedule::Scatter {
            updates,
            target: at,
            kind,
        } => Ok(m.scatter(name, k, ins, updates, at, *kind)),
        Schedule::SelectScatter {
            grid,
            window,
            strides,
            pad_low,
            select,
            kind,
        } => Ok(GpuProgram {
            scratch: Vec::new(),
            zeroed: Vec::new(),
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
    /// The precision f32 products may run in.
    precision: MatmulPrecision,
    /// Whether float sums may be combined by atomic additions ([`Options::float_atomics`]).
    float_atomics: bool,
}

/// A launch's buffers with their types (its inputs, its outputs).
type Buffers = Vec<(Buf, TensorType)>;

/// Register numbering of one launch.
#[derive(Default)]
struct Regs(usize);

impl Regs {
    fn next(&mut self) -> usize {
        self.0 += 1;
        self.0 - 1
    }

    /// `N` fresh registers, numbered in order.
    fn array<const N: usize>(&mut self) -> [usize; N] {
        std::array::from_fn(|_| self.next())
    }
}

/// The threads that compute one reduction together ([`Mapper::cooperative`]): which of its
/// terms they take and how their results meet.
struct Team {
    /// Threads striding over the terms together (`lane` numbers them).
    threads: usize,
    lane: Sc,
    /// The slice of terms taken: from term `base`, `len` of them (clipped at the reduction's
    /// end).
    base: Sc,
    len: usize,
    /// Whether the threads combine their results (shuffles, then shared memory past a warp);
    /// else each thread keeps its own.
    combine: bool,
    /// Whether the reduction's start value is combined into the total (not into a partial).
    init: bool,
}

impl Team {
    /// A row's threads over the whole reduction of `n` terms, combined, with the start value.
    fn row(threads: usize, lane: Sc, n: usize) -> Team {
        Team {
            threads,
            lane,
            base: c(0),
            len: n,
            combine: true,
            init: true,
        }
    }
}

/// The terms of reduction `h` (0 for anything else).
fn extent_of(h: &Expr) -> usize {
    match h {
        Expr::Reduce { vars, .. } => extent(vars),
        _ => 0,
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

/// Over coordinates `(coord, size)` from the innermost dimension out: whether every one lies
/// in `0..size`, and the row-major position they address.
fn bounded_position(coords: impl IntoIterator<Item = (Sc, i64)>) -> (Sc, Sc) {
    let (mut inside, mut flat, mut stride) = (Sc::Const(1), Sc::Const(0), 1i64);
    for (coord, size) in coords {
        inside = Sc::and(
            inside,
            Sc::and(
                Sc::lt(Sc::Const(-1), coord.clone()),
                Sc::lt(coord.clone(), Sc::Const(size)),
            ),
        );
        flat = Sc::plus(flat, Sc::times(coord, Sc::Const(stride)));
        stride *= size;
    }
    (inside, flat)
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
/// first, each value once (copies of one inlined reduction, with variables of their own, have
/// one [`value_key`]); see [`unguarded`].
fn hoistable(bodies: &[&Expr], rank: usize) -> Vec<Expr> {
    unguarded(
        bodies,
        rank,
        |e| matches!(e, Expr::Reduce { .. }),
        value_key,
        Expr::clone,
    )
}

/// The subexpressions of `bodies` that `wanted` picks and that depend on the first `rank`
/// variables only, innermost first, one for each `key` (each as `keep` has it). None under a
/// guard: computed ahead for every position, it would read where the guard keeps the position
/// from reading (a padded or concatenated producer's operand past its end).
fn unguarded(
    bodies: &[&Expr],
    rank: usize,
    wanted: fn(&Expr) -> bool,
    key: fn(&Expr) -> ValueKey,
    keep: fn(&Expr) -> Expr,
) -> Vec<Expr> {
    struct Walk {
        rank: usize,
        guarded: usize,
        wanted: fn(&Expr) -> bool,
        key: fn(&Expr) -> ValueKey,
        keep: fn(&Expr) -> Expr,
        keys: Vec<ValueKey>,
        out: Vec<Expr>,
    }
    impl<'e> Visitor<'e> for Walk {
        fn expr(&mut self, e: &'e Expr) {
            if matches!(e, Expr::Guard { .. }) {
                self.guarded += 1;
                e.for_each_child(self);
                self.guarded -= 1;
                return;
            }
            e.for_each_child(self);
            if self.guarded == 0 && (self.wanted)(e) && free_vars(e).iter().all(|&v| v < self.rank)
            {
                let key = (self.key)(e);
                if !self.keys.contains(&key) {
                    self.keys.push(key);
                    self.out.push((self.keep)(e));
                }
            }
        }
    }
    let mut w = Walk {
        rank,
        guarded: 0,
        wanted,
        key,
        keep,
        keys: Vec::new(),
        out: Vec::new(),
    };
    for b in bodies {
        w.expr(b);
    }
    w.out
}

/// `e` with each reduction that computes the value of one of `hoisted` replaced by a load of
/// the scalar input `first + i`.
fn substituted(e: &Expr, hoisted: &[Expr], first: usize, vars: usize) -> Expr {
    let loads: Vec<Expr> = (hoisted.iter().enumerate())
        .map(|(i, h)| Expr::Load {
            input: first + i,
            dtype: h.dtype(),
            coef: vec![0; vars],
            off: 0,
        })
        .collect();
    replace(e, hoisted, &loads)
}

/// `e` with each reduction computing the value of `hoisted[i]` replaced by `by[i]`.
fn replace(e: &Expr, hoisted: &[Expr], by: &[Expr]) -> Expr {
    struct Sub<'a> {
        keys: Vec<ValueKey>,
        by: &'a [Expr],
    }
    impl Rewriter for Sub<'_> {
        fn expr(&mut self, e: &Expr) -> Expr {
            if !matches!(e, Expr::Reduce { .. }) {
                return e.map_children(self);
            }
            let key = value_key(e);
            match self.keys.iter().position(|h| *h == key) {
                Some(i) => self.by[i].clone(),
                None => e.map_children(self),
            }
        }
    }
    Sub {
        keys: hoisted.iter().map(value_key).collect(),
        by,
    }
    .expr(e)
}

/// The row of `hoisted`'s loop nest: how many leading dimensions of the output its reductions
/// depend on.
fn row_rank(hoisted: &[Expr]) -> usize {
    hoisted
        .iter()
        .flat_map(free_vars)
        .map(|v| v + 1)
        .max()
        .unwrap_or(0)
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

    /// A kernel of one grid-stride loop over `total` positions: thread
    /// `block · blockDim + thread` runs `body` with register `p` at its first position, then a
    /// grid's worth of threads further on (blocks of `elementwise_block` threads, no shared
    /// memory).
    fn grid_stride(
        &self,
        (name, kind): (&str, MapKind),
        (inputs, outputs): (Buffers, Buffers),
        (regs, vars): (usize, usize),
        (p, total, body): (usize, usize, Vec<Stmt>),
    ) -> GpuKernel {
        let block = self.gpu.elementwise_block;
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind,
            grid: self.grid(total, block),
            block,
            warp: self.gpu.warp_size,
            inputs,
            outputs,
            shared: Vec::new(),
            regs,
            vars,
            sums: self.sums,
            body: vec![Stmt::grid_stride(p, c(total), body)],
        }
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
        let longest = hoisted.iter().map(extent_of).max().unwrap_or(0);
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
        // Consecutive elements per thread and iteration (at most 4, the body written out
        // once for each, so that LLVM sees their loads and stores side by side and merges
        // them into vector accesses): a vector of the widest output's dtype, when the
        // outputs divide into such groups.
        let widest = outs.iter().map(|o| o.1.dtype.bytes()).max().unwrap_or(1);
        let group = (self.gpu.vector_bytes / widest.max(1)).clamp(1, 4);
        let group = if total.is_multiple_of(group) {
            group
        } else {
            1
        };
        let q = if group > 1 { r.next() } else { p };
        let mut compute = Vec::new();
        let mut outputs = Vec::new();
        for (k, (buf, ty, e)) in outs.into_iter().enumerate() {
            let v = r.next();
            compute.push(Stmt::Eval {
                reg: v,
                expr: e,
                scalars: Vec::new(),
            });
            compute.push(Stmt::Store {
                buf: Buf::Output(k),
                index: Sc::Reg(p),
                value: v,
            });
            outputs.push((buf, ty));
        }
        let rank = out.shape.len();
        let body = if group == 1 {
            let mut body = set_vars(&dims(&out.shape, 0), Sc::Reg(p));
            body.extend(compute);
            body
        } else if out.shape[rank - 1].is_multiple_of(group) {
            // The group lies in one row: the variables from its first element, the last one
            // counting up, so the copies' addresses differ by constants LLVM can see.
            let (first, last) = (r.next(), r.next());
            let mut body = vec![Stmt::Let {
                reg: first,
                value: Sc::times(Sc::Reg(q), c(group)),
            }];
            body.extend(set_vars(&dims(&out.shape, 0), Sc::Reg(first)));
            let from = if rank == 1 {
                Sc::Reg(first)
            } else {
                Sc::modulo(Sc::Reg(first), c(out.shape[rank - 1]))
            };
            body.push(Stmt::Let {
                reg: last,
                value: from,
            });
            for u in 0..group {
                body.push(Stmt::Let {
                    reg: p,
                    value: Sc::plus(Sc::Reg(first), c(u)),
                });
                body.push(Stmt::SetVar {
                    var: rank - 1,
                    value: Sc::plus(Sc::Reg(last), c(u)),
                });
                body.extend(compute.iter().cloned());
            }
            body
        } else {
            let mut body = Vec::new();
            for u in 0..group {
                body.push(Stmt::Let {
                    reg: p,
                    value: Sc::plus(Sc::times(Sc::Reg(q), c(group)), c(u)),
                });
                body.extend(set_vars(&dims(&out.shape, 0), Sc::Reg(p)));
                body.extend(compute.iter().cloned());
            }
            body
        };
        let total = total / group;
        self.grid_stride(
            (name, MapKind::Elementwise),
            (inputs, outputs),
            (r.0, vars),
            (q, total, body),
        )
    }

    /// Who computes a row whose longest reduction has `longest` terms: the mapping's kind,
    /// the threads of a row, the rows of a block, the row's thread number and the first row
    /// of the block. `threads` compute one row; a block holds `per_block` rows. A row's
    /// threads are the block's (`lane`: the thread, `BlockDim` of them), or a warp's (`lane`:
    /// the lane) when a block holds a warp per row, as many warps as an elementwise block has
    /// threads, so that a multiprocessor keeps enough loads in flight.
    fn row_team(&self, longest: usize) -> (MapKind, usize, usize, Sc, Sc) {
        let warp = self.gpu.warp_size;
        if longest >= self.gpu.block_reduce_min {
            // Warp 0 combines the warps' results: at most a warp of them.
            let most = self.gpu.max_threads_per_block.min(warp * warp);
            (
                MapKind::BlockRows,
                most - most % warp,
                1,
                sp(Special::Thread),
                sp(Special::Block),
            )
        } else {
            let per_block = (self.gpu.elementwise_block / warp).max(1);
            (
                MapKind::WarpRows,
                warp,
                per_block,
                sp(Special::Lane),
                Sc::plus(
                    Sc::times(sp(Special::Block), c(per_block)),
                    sp(Special::Warp),
                ),
            )
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
        let (kind, threads, per_block, lane, row0) = self.row_team(longest);
        // The row: the leading dimensions every hoisted reduction depends on.
        let split = row_rank(&hoisted);
        let rows: usize = out.shape[..split].iter().product();
        let row_len: usize = out.shape[split..].iter().product();
        let first = inputs.len();
        let mut r = Regs::default();
        let row = r.next();
        let out_row = dims(&out.shape, split);
        let bodies: Vec<&Expr> = outs.iter().map(|o| &o.2).collect();
        let row_in_block = if per_block == 1 {
            c(0)
        } else {
            sp(Special::Warp)
        };
        let plan = self.row_cache(
            &Rows {
                hoisted: &hoisted,
                bodies: &bodies,
                split,
                out_row: out_row.clone(),
                threads,
                per_block,
                first,
                row_in_block,
            },
            &mut r,
        );
        let mut shared = Vec::new();
        let mut head = Vec::new();
        let mut body = set_vars(&dims(&out.shape[..split], 0), Sc::Reg(row));
        let cache = match plan {
            Ok(Some(mut cache)) => {
                shared = cache.shared(0, per_block);
                head = cache.init();
                body.push(cache.note());
                let (e, tmp) = (r.next(), r.next());
                body.extend(cache.fill(&lane, e, tmp));
                Some(cache)
            }
            Ok(None) => None,
            Err(note) => {
                body.push(Stmt::Note(note));
                None
            }
        };
        let cache = cache.as_ref();
        // Cached loads are the inputs after the kernel's own, then the hoisted reductions.
        let hfirst = first + cache.map_or(0, RowCache::count);
        let mut scalars = cache.map_or(Vec::new(), RowCache::padding);
        for (i, h) in hoisted.iter().enumerate() {
            let h = substituted(h, &hoisted[..i], hfirst, vars);
            let s = self.cooperative(
                &h,
                &Team::row(threads, lane.clone(), extent_of(&h)),
                (cache, split, vars),
                &scalars,
                &mut r,
                &mut shared,
                &mut body,
            );
            scalars.push(s);
        }
        let e = r.next();
        let pos = r.next();
        let values: Vec<usize> = outs.iter().map(|_| r.next()).collect();
        let cached = cache.filter(|c| c.covers(&out_row));
        let mut outputs = Vec::new();
        let mut exprs = Vec::new();
        for (buf, ty, x) in outs {
            let x = substituted(&x, &hoisted, hfirst, vars);
            exprs.push(match cached {
                Some(c) => c.substitute(&x, &out_row, split, vars),
                None => x,
            });
            outputs.push((buf, ty));
        }
        // The elements at position `at` (slot `k` of a cached row).
        let element = |at: Sc, k: usize| {
            let mut each = set_vars(&out_row, at.clone());
            each.push(Stmt::Let {
                reg: pos,
                value: Sc::plus(Sc::times(Sc::Reg(row), c(row_len)), at.clone()),
            });
            let mut scalars = scalars.clone();
            if let Some(rc) = cached {
                let (regs, loads) = rc.at(k, &at);
                each.extend(loads);
                scalars.splice(..regs.len(), regs);
            }
            for (o, (x, &v)) in exprs.iter().zip(&values).enumerate() {
                each.push(Stmt::Eval {
                    reg: v,
                    expr: x.clone(),
                    scalars: scalars.clone(),
                });
                each.push(Stmt::Store {
                    buf: Buf::Output(o),
                    index: Sc::Reg(pos),
                    value: v,
                });
            }
            each
        };
        match cached {
            Some(rc) if rc.unrolled() => {
                for k in 0..rc.slots {
                    let at = Sc::plus(c(k * threads), lane.clone());
                    body.extend(rc.guarded(k, at.clone(), element(at, k)));
                }
            }
            _ => body.push(Stmt::For {
                reg: e,
                start: lane,
                end: c(row_len),
                step: c(threads),
                body: element(Sc::Reg(e), 0),
            }),
        }
        self.row_kernel(
            (name, kind),
            (inputs, outputs, shared),
            (r.0, vars),
            (rows, threads, per_block),
            (head, (row, row0), body),
        )
    }

    /// A kernel of `rows` rows, `threads` threads each and `per_block` of them a block (as
    /// [`Mapper::row_team`] has them, `row0` the block's first): `head`, then register `row`
    /// from `row0` over the rows, a grid's worth of rows apart, running `body` for each.
    fn row_kernel(
        &self,
        (name, kind): (&str, MapKind),
        (inputs, outputs, shared): (Buffers, Buffers, Vec<SharedArray>),
        (regs, vars): (usize, usize),
        (rows, threads, per_block): (usize, usize, usize),
        (mut head, (row, row0), body): (Vec<Stmt>, (usize, Sc), Vec<Stmt>),
    ) -> GpuKernel {
        head.push(Stmt::For {
            reg: row,
            start: row0,
            end: c(rows),
            step: Sc::times(sp(Special::GridDim), c(per_block)),
            body,
        });
        GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind,
            grid: self.grid(rows, per_block),
            block: threads * per_block,
            warp: self.gpu.warp_size,
            inputs,
            outputs,
            shared,
            regs,
            vars,
            sums: self.sums,
            body: head,
        }
    }

    /// Statements computing the reduction `h` by the `threads` threads of a row together
    /// (`lane` numbers them; see the module documentation for the order), leaving the result
    /// in the register returned, the same in every thread. A reduction over the row that
    /// `cache` holds reads its cached loads from there (`split` leading row variables, `n`
    /// kernel variables), unrolled over the slots when they are registers.
    #[allow(clippy::too_many_arguments)]
    fn cooperative(
        &self,
        h: &Expr,
        team: &Team,
        (cache, split, n_vars): (Option<&RowCache>, usize, usize),
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
        let (threads, lane) = (team.threads, &team.lane);
        let n = extent(vars);
        let len = team.len;
        let chunk = len.div_ceil(threads).clamp(1, self.sums.leaf);
        let rounds = len.div_ceil(chunk).div_ceil(threads);
        let [acc, part, round, j, q, x, t] = r.array();
        out.push(Stmt::Identity {
            reg: acc,
            kind,
            dtype,
        });
        let cached = cache.filter(|rc| rc.covers(vars));
        let body = match cached {
            Some(rc) => rc.substitute(body, vars, split, n_vars),
            None => (**body).clone(),
        };
        // The term at position `at` (slot `k` of a cached row).
        let term_at = |at: Sc, k: usize| -> Vec<Stmt> {
            let mut inside = set_vars(vars, at.clone());
            let mut sc = scalars.to_vec();
            if let Some(rc) = cached {
                let (regs, loads) = rc.at(k, &at);
                inside.extend(loads);
                sc.splice(..regs.len(), regs);
            }
            inside.push(Stmt::Eval {
                reg: x,
                expr: body.clone(),
                scalars: sc,
            });
            inside.push(Stmt::Combine {
                acc: part,
                value: x,
                kind,
                dtype,
            });
            inside
        };
        // The chunk results in a tree of `fanout` per node: level `l` takes `fanout` results
        // of level `l - 1` (the chunks at level 0) before it passes its own up; `acc` is the
        // top.
        let fanout = self.sums.fanout.max(2);
        let (mut levels, mut span) = (0, 1);
        while span < rounds {
            span *= fanout;
            levels += 1;
        }
        let lower: Vec<usize> = (0..levels).map(|_| r.next()).collect();
        let level = |l: usize| if l < levels { lower[l] } else { acc };
        let identity = |reg: usize| Stmt::Identity { reg, kind, dtype };
        let up = |l: usize| Stmt::Combine {
            acc: level(l + 1),
            value: level(l),
            kind,
            dtype,
        };
        let to_level0 = Stmt::Combine {
            acc: level(0),
            value: part,
            kind,
            dtype,
        };
        out.extend(lower.iter().map(|&reg| identity(reg)));
        if let Some(rc) = cached.filter(|rc| rc.unrolled()) {
            // The same rounds, chunks and tree, unrolled: the term of slot
            // `k = round · chunk + j` reads register slot `k`.
            for round in 0..rounds {
                out.push(identity(part));
                for j in 0..chunk {
                    let k = round * chunk + j;
                    let at = Sc::plus(c(k * threads), lane.clone());
                    out.extend(rc.guarded(k, at.clone(), term_at(at, k)));
                }
                out.push(to_level0.clone());
                let mut every = 1;
                for l in 0..levels {
                    every *= fanout;
                    if (round + 1).is_multiple_of(every) {
                        out.extend([up(l), identity(level(l))]);
                    }
                }
            }
        } else {
            // Term `q = (round · chunk + j) · threads + lane` of the team's slice: a chunk's
            // terms are `threads` apart, so the threads of a warp read consecutive elements
            // together (one transaction).
            let (cond, at) = if team.base == c(0) && len == n {
                (Sc::lt(Sc::Reg(q), c(n)), Sc::Reg(q))
            } else {
                let at = Sc::plus(team.base.clone(), Sc::Reg(q));
                (
                    Sc::and(Sc::lt(Sc::Reg(q), c(len)), Sc::lt(at.clone(), c(n))),
                    at,
                )
            };
            let term = vec![
                Stmt::Let {
                    reg: q,
                    value: Sc::plus(
                        Sc::times(
                            Sc::plus(Sc::times(Sc::Reg(round), c(chunk)), Sc::Reg(j)),
                            c(threads),
                        ),
                        lane.clone(),
                    ),
                },
                Stmt::If {
                    cond,
                    body: term_at(at, 0),
                },
            ];
            let mut each_round = vec![
                identity(part),
                Stmt::For {
                    reg: j,
                    start: c(0),
                    end: c(chunk),
                    step: c(1),
                    body: term,
                },
                to_level0,
            ];
            let mut every = 1;
            for l in 0..levels {
                every *= fanout;
                each_round.push(Stmt::If {
                    cond: Sc::eq(Sc::modulo(Sc::plus(Sc::Reg(round), c(1)), c(every)), c(0)),
                    body: vec![up(l), identity(level(l))],
                });
            }
            out.push(Stmt::For {
                reg: round,
                start: c(0),
                end: c(rounds),
                step: c(1),
                body: each_round,
            });
        }
        out.extend((0..levels).map(up));
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
        if !team.combine {
            return acc;
        }
        out.extend(tree(warp));
        if threads > warp {
            let warps = threads / warp;
            let (partials, total) = (shared.len(), shared.len() + 1);
            shared.push(SharedArray {
                dtype,
                len: warps,
                packed: false,
                swizzle: None,
            });
            shared.push(SharedArray {
                dtype,
                len: 1,
                packed: false,
                swizzle: None,
            });
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
        if !team.init {
            return acc;
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
}

#[cfg(test)]
mod tests;

//! How the loops of each loop-nest kernel run on a target: [`KernelSchedule`], decided here
//! once per kernel (from the kernel, the [`TargetInfo`] and the [`CpuOptions`]) and rendered
//! by the emitters, which never decide it again. (The order of steps is [`crate::schedule`].)
//!
//! - Streaming stores ([`streams`]): a large output written once goes to memory a cache line
//!   at a time, past the caches.
//! - Transposing tiles ([`transpose_tile_dim`]): a kernel that reads across its input runs in
//!   square tiles of two dimensions.
//! - Guard segments ([`guard_segments`]): each loop is cut where the guards on its variable
//!   (a pad's edges, a concatenation's seams) change their outcome.
//! - Column strips ([`column_strips`]): the innermost loop of a kernel with column sums runs in
//!   strips of positions, each reduction once per strip.
//! - Row caches ([`row_caches`]): a reduction keeps a costly part of its body per position for
//!   the expressions after it (also in a GEMM's row epilogue).
//! - A GEMM's blocking ([`crate::gemm_schedule`]) and, for every kernel, how its rows are split
//!   across threads ([`crate::threads`]).

use crate::gemm_schedule::{GemmSchedule, gemm_schedule};
use crate::kernel::{
    Cond, Ew, Expr, Kernel, Schedule, ValueKey, free_vars, hoistable_reduces, rename_var,
    value_key, var_plus_const, visit,
};
use crate::options::CpuOptions;
use crate::target::TargetInfo;
use crate::threads::Launch;
use kiln_ir::{DType, OpKind};
use std::fmt;

/// The loop strategy of one kernel: a loop nest's loops, a GEMM's blocking and its row
/// epilogue's row caches, and how every kernel's rows are split across threads.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelSchedule {
    /// The output is written with streaming (non-temporal) stores (see [`streams`]).
    pub stream: bool,
    /// The kernel runs in square tiles of this dimension and its innermost one (see
    /// [`transpose_tile_dim`]).
    pub tile: Option<Tile>,
    /// Per output dimension: the segments `(start, end)` its loop runs in, in each of which
    /// every guard on its variable is decided (see [`guard_segments`]); one segment covering
    /// the dimension where the loop is not cut. (Empty for a GEMM.)
    pub segments: Vec<Vec<(i64, i64)>>,
    /// The reductions that keep a costly part of their body in a row's buffer (see
    /// [`row_caches`]).
    pub row_caches: Vec<RowCache>,
    /// The column sums the innermost loop computes in strips (see [`column_strips`]).
    pub strips: Option<Strips>,
    /// The folds that run in vector lanes along their row (see [`row_folds`]).
    pub row_folds: Vec<RowFold>,
    /// A GEMM's blocking (see [`crate::gemm_schedule`]; `None` for other kernels).
    pub gemm: Option<GemmSchedule>,
    /// How the kernel's rows are split across threads (see [`crate::threads`]).
    pub launch: Launch,
}

/// The column sums a loop nest's innermost loop computes strip by strip (see
/// [`column_strips`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strips {
    /// The output dimension the strips run along: the innermost one, or, where the dimensions
    /// after it are all of extent 1 (a global pooling's `[n, 1, 1]`), the last longer one.
    pub dim: usize,
    /// Positions a strip holds: as many as
    /// [`LoopLimits::strip_vectors`](crate::target::LoopLimits::strip_vectors) vectors of f32
    /// hold over the column sums, a multiple of [`Self::tail`].
    pub width: usize,
    /// Positions of the strips the positions past the last wide strip run in (then one by one):
    /// [`LoopLimits::strip`](crate::target::LoopLimits::strip).
    pub tail: usize,
    /// [`value_key`] of each reduction computed per strip, in the order of the kernel's
    /// bodies.
    pub reduces: Vec<ValueKey>,
    /// The folds among [`Self::reduces`] with an element read across the strip's positions
    /// rather than contiguously along them (a window's, strided or guarded: a gather per
    /// step). The loop over the positions reads their accumulators where the fold left them,
    /// so that nothing but a loop position addresses them and the step vectorizes; a fold
    /// read contiguously (a column's) vectorizes either way, and its accumulators are copied
    /// out per position, which keeps its loop faster.
    pub gathered: Vec<ValueKey>,
}

/// A fold ([`crate::fold`]) over one contiguous loop, run in lanes (see [`row_folds`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowFold {
    /// [`crate::fold::fold_key`] of the fold.
    pub fold: ValueKey,
    /// The sets of accumulators it keeps, one per vector lane: each starts at an element,
    /// takes every `lanes`-th element after it, and the lanes are combined with the body
    /// (pairwise, halving) after the loop, then with the inits.
    pub lanes: usize,
}

/// The square tiles a transposing kernel runs in (see [`transpose_tile_dim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    /// The output dimension tiled along with the innermost one.
    pub dim: usize,
    /// The tiles' edge, in elements.
    pub edge: usize,
}

/// The schedule of each of the kernels `ks` (`None` for a slot without a kernel), on
/// `target` under the emitter's switches `cpu`.
pub fn schedules(
    ks: &[Option<Kernel>],
    target: &TargetInfo,
    cpu: &CpuOptions,
) -> Vec<Option<KernelSchedule>> {
    ks.iter()
        .map(|k| k.as_ref().map(|k| kernel_schedule(k, target, cpu)))
        .collect()
}

/// The schedule of kernel `k` on `target` under `cpu`: for a GEMM its blocking
/// ([`gemm_schedule`]) and its epilogue's row caches ([`row_caches`]), for every kernel how its
/// rows are split across threads ([`crate::threads::launch`]).
///
/// The loops cut at guards: with tiles, the dimensions between the outermost and the
/// innermost (the outermost loop is split across threads, the innermost is tiled); without,
/// every dimension, the outermost (a thread's rows) up to
/// [`LoopLimits::row_guard_cuts`](crate::target::LoopLimits::row_guard_cuts) times unless it
/// is also the innermost of a streaming kernel.
pub fn kernel_schedule(k: &Kernel, target: &TargetInfo, cpu: &CpuOptions) -> KernelSchedule {
    if k.schedule != Schedule::Nest {
        let gemm = gemm_schedule(k, target);
        return KernelSchedule {
            stream: false,
            tile: None,
            segments: Vec::new(),
            row_caches: row_caches(k, target, cpu),
            row_folds: Vec::new(),
            strips: None,
            gemm,
            launch: crate::threads::launch(k, gemm.as_ref(), target),
        };
    }
    let tile = transpose_tile_dim(k, target.loops.transpose_tile).map(|dim| Tile {
        dim,
        edge: target.loops.transpose_tile,
    });
    let stream = streams(k, target, cpu);
    let bodies: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .collect();
    let rank = k.out.rank();
    let segments = (0..rank)
        .map(|d| {
            let extent = k.out.shape[d];
            let max_cuts = match tile {
                Some(_) if d == 0 || d + 1 == rank => 0,
                None if d == 0 && !(stream && rank == 1) => target.loops.row_guard_cuts,
                _ => target.loops.guard_cuts,
            };
            guard_segments(&bodies, d, extent, max_cuts, cpu.guard_splits)
        })
        .collect();
    let strips = column_strips(k, target);
    let mut launch = crate::threads::launch(k, None, target);
    // Strips along the rows the threads split: chunks no narrower than a strip.
    if let Some(s) = strips.as_ref().filter(|s| s.dim == 0) {
        launch.chunks_per_thread =
            crate::threads::strip_chunks(launch.rows, s.width, target.threads);
    }
    KernelSchedule {
        stream,
        tile,
        segments,
        row_caches: row_caches(k, target, cpu),
        row_folds: row_folds(k, strips.as_ref(), target),
        strips,
        gemm: None,
        launch,
    }
}

/// For loop-nest kernel `k`: the reductions of its bodies that depend on its innermost output
/// variable of extent above 1 (`d`, see [`Strips::dim`]) and read contiguously along it (a
/// column sum: each output element sums a strided column), without duplicates, which the loop
/// over `d` computes in strips of [`LoopLimits::strip`](crate::target::LoopLimits::strip)
/// positions; `None` when there are none or the loop is shorter than a strip. (A tiled kernel
/// has no reductions.)
///
/// A fold kept in the reference's order ([`crate::ir::Fold::in_order`], a window's) runs in
/// the strips however it reads along `d` (strided, guarded at a padding): each position folds
/// its own window in order, the positions side by side in vector lanes, so that the order of
/// each fold is the reference's and still the work is vectors, across outputs.
pub fn column_strips(k: &Kernel, target: &TargetInfo) -> Option<Strips> {
    let rank = k.out.rank();
    let d = (0..rank)
        .rev()
        .find(|&d| k.out.shape[d] > 1)
        .unwrap_or(rank.checked_sub(1)?);
    if k.out.shape[d] < target.loops.strip {
        return None;
    }
    // The loop variables a strip's reductions may read: `d`, the enclosing loops' and the
    // unit dimensions' after it (always 0).
    let readable = |v: usize| v <= d || k.out.shape.get(v) == Some(&1);
    let mut reduces: Vec<ValueKey> = Vec::new();
    let mut gathered: Vec<ValueKey> = Vec::new();
    // Accumulators per position, and the most rows a sum reduces.
    let mut accumulators = 0;
    let mut rows = 0usize;
    let bodies = std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body));
    for r in bodies.flat_map(hoistable_reduces) {
        let free = free_vars(r);
        let extent = |vars: &[(usize, usize)]| vars.iter().map(|&(_, n)| n).product::<usize>();
        let (fits, key, n, gathers, reduced) = match r {
            Expr::Reduce {
                body, init, vars, ..
            } => (
                free_vars(init).is_empty() && crate::kernel::contiguous_along(body, d),
                value_key(r),
                1,
                false,
                extent(vars),
            ),
            Expr::Fold { fold, .. } => {
                // Each element read along the row, or the same along it (an index); in order,
                // any element without a reduction of its own.
                let along = |e: &Expr| crate::kernel::contiguous_along(e, d);
                let fixed = |e: &Expr| !free_vars(e).contains(&d) && !has_reduction(e);
                let across = |e: &Expr| fold.in_order && !has_reduction(e);
                (
                    fold.inits.iter().all(|i| free_vars(i).is_empty())
                        && fold.elems.iter().any(|e| along(e) || across(e))
                        && fold.elems.iter().all(|e| along(e) || fixed(e) || across(e)),
                    crate::fold::fold_key(r),
                    fold.arity(),
                    fold.elems.iter().any(|e| !along(e) && !fixed(e)),
                    extent(&fold.vars),
                )
            }
            _ => continue,
        };
        if fits && free.contains(&d) && free.iter().all(|&v| readable(v)) && !reduces.contains(&key)
        {
            if gathers {
                gathered.push(key.clone());
            }
            reduces.push(key);
            accumulators += n;
            rows = rows.max(reduced);
        }
    }
    let tail = target.loops.strip.max(1);
    // Sums over few rows take half the registers (see `LoopLimits::wide_strip_rows`).
    let vectors = if rows < target.loops.wide_strip_rows {
        (target.loops.strip_vectors / 2).max(1)
    } else {
        target.loops.strip_vectors
    };
    let budget = vectors * target.vector_bytes / 4;
    // No wider than the loop: a strip holds whole strips of the tail's width.
    let width = (budget / accumulators.max(1)).min(k.out.shape[d]);
    let width = (width / tail).max(1) * tail;
    (!reduces.is_empty()).then_some(Strips {
        dim: d,
        width,
        tail,
        reduces,
        gathered,
    })
}

/// The folds of loop-nest kernel `k`'s bodies outside its column strips (`strips`) that run
/// over one loop long enough for two rounds of lanes: they keep one set of accumulators per
/// lane of a vector of their widest accumulator ([`TargetInfo::fold_lanes`]), which the
/// emitter keeps side by side so that each round of the loop is one vector's work. The
/// others (several reduced loops, short loops, folds [`crate::ir::Fold::in_order`]) fold in
/// order.
pub fn row_folds(k: &Kernel, strips: Option<&Strips>, target: &TargetInfo) -> Vec<RowFold> {
    let mut out: Vec<RowFold> = Vec::new();
    let bodies = std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body));
    for r in bodies.flat_map(hoistable_reduces) {
        let Expr::Fold { fold, .. } = r else {
            continue;
        };
        let key = crate::fold::fold_key(r);
        let in_strips = strips.is_some_and(|s| s.reduces.contains(&key));
        let bytes = fold
            .inits
            .iter()
            .map(|i| i.dtype().bytes())
            .max()
            .unwrap_or(4);
        let lanes = target.fold_lanes(bytes);
        if let [(_, n)] = fold.vars[..]
            && !fold.in_order
            && lanes > 1
            && n >= 2 * lanes
            && !in_strips
            && !out.iter().any(|f| f.fold == key)
        {
            out.push(RowFold { fold: key, lanes });
        }
    }
    out
}

/// Whether `e` holds a reduction or a fold.
fn has_reduction(e: &Expr) -> bool {
    let mut found = false;
    visit(e, &mut |x| {
        found |= matches!(x, Expr::Reduce { .. } | Expr::Fold { .. })
    });
    found
}

/// Whether loop-nest kernel `k` writes its output with streaming stores on `target` (see
/// [`crate::target::LoopLimits::stream_bytes`]): one output, large, on a target that has
/// them, whose innermost dimension holds at least
/// [`crate::target::LoopLimits::stream_row_lines`] cache lines.
/// [`CpuOptions::streaming_stores`] (`KILN_STREAM=0`) turns them off (for measuring).
pub fn streams(k: &Kernel, target: &TargetInfo, cpu: &CpuOptions) -> bool {
    let bytes = k.out.dtype.bytes();
    target.nontemporal_stores
        && cpu.streaming_stores
        && k.extra.is_empty()
        && k.out.numel() * bytes >= target.loops.stream_bytes
        && k.out
            .shape
            .last()
            .is_some_and(|&n| n * bytes >= target.loops.stream_row_lines * target.cache_line)
}

/// For a loop-nest kernel without reductions that reads an input with a stride of at least a
/// tile (of edge `tile`) along its innermost output dimension and contiguously along another
/// output dimension (a transpose, NHWC to NCHW and back): that dimension. Run in order, the
/// innermost loop touches a new cache line of the input for every element it writes, and the
/// lines are gone by the time the next row comes back for their neighbours (96 ms for conv
/// 7x7's 103 MB output transpose); in `tile` x `tile` tiles of the two dimensions, each line
/// read and written is used whole while in L1.
pub fn transpose_tile_dim(k: &Kernel, tile: usize) -> Option<usize> {
    let rank = k.out.rank();
    if rank < 2 || k.out.shape[rank - 1] < tile {
        return None;
    }
    let bodies: Vec<&Expr> = std::iter::once(&k.body)
        .chain(k.extra.iter().map(|x| &x.body))
        .collect();
    if bodies.iter().any(|b| !hoistable_reduces(b).is_empty()) {
        return None;
    }
    let reads: Vec<Vec<i64>> = bodies
        .iter()
        .flat_map(|b| crate::kernel::affine_reads(b))
        .collect();
    let inner = rank - 1;
    (0..inner).filter(|&a| k.out.shape[a] >= tile).find(|&a| {
        reads
            .iter()
            .any(|c| c.get(inner).map_or(0, |x| x.abs()) >= tile as i64 && c.get(a) == Some(&1))
    })
}

/// `0..extent` cut where a guard of `bodies` on loop variable `var` (a condition
/// `lo <= var + k < hi`: a pad's edge, a concatenation's seam) changes its outcome, so that
/// in each segment every such condition holds everywhere or nowhere: a padded row then runs
/// its interior without a check per element (and vectorized) and its edges as constants.
/// One segment when there is no such guard, more than `max_cuts` cuts, or `splits` is off
/// ([`CpuOptions::guard_splits`], `KILN_GUARD_SPLIT=0`).
pub fn guard_segments(
    bodies: &[&Expr],
    var: usize,
    extent: usize,
    max_cuts: usize,
    splits: bool,
) -> Vec<(i64, i64)> {
    let n = extent as i64;
    let mut cuts = std::collections::BTreeSet::new();
    for b in bodies {
        visit(b, &mut |x| {
            if let Expr::Guard { conds, .. } = x {
                for c in conds {
                    if let Cond::InRange(i, lo, hi) = c
                        && let Some((v, k)) = var_plus_const(i)
                        && v == var
                    {
                        cuts.extend([lo - k, hi - k].into_iter().filter(|&p| p > 0 && p < n));
                    }
                }
            }
        });
    }
    if cuts.is_empty() || cuts.len() > max_cuts || !splits {
        return vec![(0, n)];
    }
    let points: Vec<i64> = std::iter::once(0)
        .chain(cuts)
        .chain(std::iter::once(n))
        .collect();
    points.windows(2).map(|w| (w[0], w[1])).collect()
}

/// A reduction that keeps the costly part of its body per position, in a buffer of a row, for
/// the expressions after it (see [`row_caches`]): a softmax's sum of exp(x - max) stores each
/// exp(x - max), and its outputs read them back instead of computing a second exp.
#[derive(Clone, Debug, PartialEq)]
pub struct RowCache {
    /// [`value_key`] of the reduction.
    pub reduce: ValueKey,
    /// The loop the reduction is computed ahead of: the first whose enclosing loops' variables
    /// are all it reads (in a GEMM's row epilogue, the loop over a row's columns).
    pub at: usize,
    /// The costly part of the reduction's body, computed at each position of its variable.
    pub part: Expr,
    /// The loop variable along which the expressions compute the same part.
    pub var: usize,
    /// [`value_key`] of the part as the expressions compute it (at `var`).
    pub key: ValueKey,
    /// Positions: the reduction's trip count, equal to `var`'s.
    pub len: usize,
}

/// Whether `op` is much costlier than a multiply-add (a polynomial or a library call).
pub fn costly_op(op: &Ew) -> bool {
    matches!(
        op,
        Ew::Kind(
            OpKind::Exponential
                | OpKind::ExponentialMinusOne
                | OpKind::Log
                | OpKind::LogPlusOne
                | OpKind::Tanh
                | OpKind::Logistic
                | OpKind::Erf
                | OpKind::Power
        )
    )
}

/// Whether `e` contains a costly operation (see [`costly_op`]).
pub fn costly(e: &Expr) -> bool {
    let mut found = false;
    visit(e, &mut |x| {
        found |= matches!(x, Expr::Op { op, .. } if costly_op(op));
    });
    found
}

/// The row caches of kernel `k` (a loop nest, or a GEMM with a row epilogue) on `target`: for
/// each reduction the emitter computes ahead of a loop (ahead of the first loop inside all its
/// free variables; in a GEMM's row epilogue, ahead of the loop over a row's columns), the
/// [`row_cache`] it keeps, if any. None with [`CpuOptions::row_caches`] off
/// (`KILN_ROW_CACHE=0`).
pub fn row_caches(k: &Kernel, target: &TargetInfo, cpu: &CpuOptions) -> Vec<RowCache> {
    if !cpu.row_caches {
        return Vec::new();
    }
    // A GEMM's epilogue has no extra outputs; the loop nest's are computed with its body. An
    // online softmax and an epilogue stored by planes compute no reduction ahead of a loop.
    let (bodies, split): (Vec<&Expr>, _) = match &k.schedule {
        Schedule::Gemm { chain: Some(c), .. } if c.online.is_some() => return Vec::new(),
        Schedule::Gemm { conv: Some(p), .. } if p.planes => return Vec::new(),
        &Schedule::Gemm {
            batch,
            m,
            n,
            epilogue: Some(_),
            ..
        } => (
            vec![&k.body],
            crate::fuse::row_split(&k.out.shape, batch * m, n),
        ),
        Schedule::Nest => (
            std::iter::once(&k.body)
                .chain(k.extra.iter().map(|x| &x.body))
                .collect(),
            None,
        ),
        _ => return Vec::new(),
    };
    let mut seen: Vec<ValueKey> = Vec::new();
    let mut caches = Vec::new();
    for r in bodies.iter().flat_map(|b| hoistable_reduces(b)) {
        let at = match split {
            Some(d) => d,
            None => free_vars(r).last().map_or(0, |&v| v + 1),
        };
        let key = value_key(r);
        if seen.contains(&key) || free_vars(r).iter().any(|&v| v >= at) {
            continue;
        }
        seen.push(key.clone());
        if let Some(c) = row_cache(r, key, &bodies, at, &k.out.shape, target) {
            caches.push(c);
        }
    }
    caches
}

/// The row cache for the reduction `r` (whose [`value_key`] is `reduce`), computed ahead of
/// loop `d` of expressions `bodies` (whose loop variables below the output's rank have trip
/// counts `extents`), if it is worth one: `r` reduces over one variable, and the largest
/// costly float part of its body that reads nothing but that variable and the enclosing loops'
/// variables is also computed by `bodies` with the reduced variable replaced by an inner loop
/// variable of the same trip count, and fits
/// [`LoopLimits::row_cache_bytes`](crate::target::LoopLimits::row_cache_bytes).
pub fn row_cache(
    r: &Expr,
    reduce: ValueKey,
    bodies: &[&Expr],
    d: usize,
    extents: &[usize],
    target: &TargetInfo,
) -> Option<RowCache> {
    let Expr::Reduce { vars, body, .. } = r else {
        return None;
    };
    let [(from, len)] = vars.as_slice() else {
        return None;
    };
    let (from, len) = (*from, *len);
    // The body's operations reachable through operations, largest first.
    fn parts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
        if let Expr::Op { args, .. } = e {
            out.push(e);
            args.iter().for_each(|a| parts(a, out));
        }
    }
    let mut candidates = Vec::new();
    parts(body, &mut candidates);
    let mut keys: Option<Vec<ValueKey>> = None;
    for part in candidates {
        let fv = free_vars(part);
        // Values are kept as they are computed: f64, or f32 for the narrower floats.
        let bytes = if part.dtype() == DType::F64 { 8 } else { 4 };
        if !part.dtype().is_float()
            || len * bytes > target.loops.row_cache_bytes
            || !fv.contains(&from)
            || fv.iter().any(|&v| v != from && v >= d)
            || !costly(part)
        {
            continue;
        }
        // Every value the expressions compute, by key (computed once, when needed).
        let keys = keys.get_or_insert_with(|| {
            let mut ks = Vec::new();
            for b in bodies {
                visit(b, &mut |x| {
                    if matches!(x, Expr::Op { .. }) {
                        ks.push(value_key(x));
                    }
                });
            }
            ks
        });
        for (to, &n) in extents.iter().enumerate().skip(d) {
            if n != len || fv.contains(&to) {
                continue;
            }
            let key = value_key(&rename_var(part, from, to));
            if keys.contains(&key) {
                return Some(RowCache {
                    reduce,
                    at: d,
                    part: part.clone(),
                    var: to,
                    key,
                    len,
                });
            }
        }
    }
    None
}

/// `stream, tile d1 16, cuts d0 [0, 3, 61, 64], strips of 16 (2 column sums), row cache
/// exponential d1 x 4096`, a GEMM's blocking first (`gemm 6x16 kc 256 mc 72 nc 4096`), or
/// `in order` when nothing is decided; then `; threads: ` and the split
/// (`128 rows split, 4 chunks a thread`).
impl fmt::Display for KernelSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(g) = &self.gemm {
            parts.push(g.to_string());
        }
        if self.stream {
            parts.push("stream".to_string());
        }
        if let Some(t) = self.tile {
            parts.push(format!("tile d{} {}", t.dim, t.edge));
        }
        for (d, segs) in self.segments.iter().enumerate() {
            if segs.len() > 1 {
                let points: Vec<String> = std::iter::once(segs[0].0)
                    .chain(segs.iter().map(|s| s.1))
                    .map(|p| p.to_string())
                    .collect();
                parts.push(format!("cuts d{d} [{}]", points.join(", ")));
            }
        }
        if let Some(st) = &self.strips {
            let n = st.reduces.len();
            let plural = if n == 1 { "" } else { "s" };
            let then = if st.tail < st.width {
                format!(", then {}", st.tail)
            } else {
                String::new()
            };
            let along = if st.dim + 1 == self.segments.len() {
                String::new()
            } else {
                format!(" along d{}", st.dim)
            };
            parts.push(format!(
                "strips of {}{then}{along} ({n} column sum{plural})",
                st.width
            ));
        }
        for r in &self.row_folds {
            parts.push(format!("fold in {} lanes", r.lanes));
        }
        for c in &self.row_caches {
            let op = match &c.part {
                Expr::Op { op, .. } => crate::print::ew_name(op),
                _ => "part".to_string(),
            };
            parts.push(format!("row cache {op} d{} x {}", c.var, c.len));
        }
        if parts.is_empty() {
            parts.push("in order".to_string());
        }
        write!(f, "{}; threads: {}", parts.join(", "), self.launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    /// The printed schedules of the loop nests of `src`, fused for the reference target.
    fn printed(src: &str, opts: &Options) -> Vec<String> {
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let target = TargetInfo::reference();
        let fused = crate::pipeline::fused_kernels(&f, opts, &target);
        schedules(&fused.kernels, &target, &opts.cpu)
            .into_iter()
            .flatten()
            .filter(|s| s.gemm.is_none())
            .map(|s| {
                let s = s.to_string();
                s.split("; threads").next().unwrap_or_default().to_string()
            })
            .collect()
    }

    #[test]
    fn a_transpose_runs_in_tiles() {
        let src = "func @t(%0: f32[64,48]) -> f32[48,64] {\n  %1 = transpose %0 {permutation = [1, 0]} : f32[48,64]\n  return %1\n}\n";
        assert_eq!(printed(src, &Options::default()), ["tile d0 16"]);
    }

    #[test]
    fn a_large_output_streams_unless_switched_off() {
        let src = "func @e(%0: f32[4096,4096]) -> f32[4096,4096] {\n  %1 = exponential %0 : f32[4096,4096]\n  return %1\n}\n";
        assert_eq!(printed(src, &Options::default()), ["stream"]);
        let mut opts = Options::default();
        opts.cpu.streaming_stores = false;
        assert_eq!(printed(src, &opts), ["in order"]);
    }

    #[test]
    fn a_pad_cuts_its_loops_at_its_edges_unless_switched_off() {
        let src = "func @p(%0: f32[6,6], %1: f32[]) -> f32[8,8] {\n  %2 = pad %0, %1 {edge_padding_low = [1, 1], edge_padding_high = [1, 1], interior_padding = [0, 0]} : f32[8,8]\n  return %2\n}\n";
        assert_eq!(
            printed(src, &Options::default()),
            ["cuts d0 [0, 1, 7, 8], cuts d1 [0, 1, 7, 8]"]
        );
        let mut opts = Options::default();
        opts.cpu.guard_splits = false;
        assert_eq!(printed(src, &opts), ["in order"]);
    }

    #[test]
    fn a_softmax_caches_its_exponentials_within_the_target_budget() {
        let src = "func @s(%0: f32[2,3]) -> f32[2,3] {\n  %1 = constant {value = -inf} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = max} : f32[2]\n  %3 = broadcast_in_dim %2 {broadcast_dimensions = [0]} : f32[2,3]\n  %4 = subtract %0, %3 : f32[2,3]\n  %5 = exponential %4 : f32[2,3]\n  %6 = constant {value = 0.0} : f32[]\n  %7 = reduce %5, %6 {dimensions = [1], kind = add} : f32[2]\n  %8 = broadcast_in_dim %7 {broadcast_dimensions = [0]} : f32[2,3]\n  %9 = divide %5, %8 : f32[2,3]\n  return %9\n}\n";
        assert_eq!(
            printed(src, &Options::default()),
            ["row cache exponential d1 x 3"]
        );
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let mut target = TargetInfo::reference();
        target.loops.row_cache_bytes = 8;
        let fused = crate::pipeline::fused_kernels(&f, &Options::default(), &target);
        let k = fused.kernels.iter().flatten().next().expect("a kernel");
        assert!(row_caches(k, &target, &CpuOptions::default()).is_empty());
        let mut opts = Options::default();
        opts.cpu.row_caches = false;
        assert_eq!(printed(src, &opts), ["in order"]);
    }

    #[test]
    fn a_column_sum_runs_in_strips_when_its_row_holds_one() {
        let sum = |n: usize| {
            format!(
                "func @c(%0: f32[8,{n}]) -> f32[{n}] {{\n  %1 = constant {{value = 0.0}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [0], kind = add}} : f32[{n}]\n  return %2\n}}\n"
            )
        };
        // As wide as the loop, up to `strip_vectors` vectors of f32 for the one sum.
        assert_eq!(
            printed(&sum(16), &Options::default()),
            ["strips of 16 (1 column sum)"]
        );
        assert_eq!(
            printed(&sum(40), &Options::default()),
            ["strips of 32, then 16 (1 column sum)"]
        );
        // Over 8 rows (fewer than `wide_strip_rows`), half the registers.
        let t = TargetInfo::reference();
        let wide = t.loops.strip_vectors * t.vector_bytes / 4;
        assert_eq!(
            printed(&sum(4096), &Options::default()),
            [format!("strips of {}, then 16 (1 column sum)", wide / 2)]
        );
        assert_eq!(printed(&sum(8), &Options::default()), ["in order"]);
    }

    #[test]
    fn column_sums_over_many_rows_take_wide_strips_and_over_few_narrow_ones() {
        let t = TargetInfo::reference();
        let wide = t.loops.strip_vectors * t.vector_bytes / 4;
        let rows = t.loops.wide_strip_rows;
        let sum = |m: usize| {
            format!(
                "func @c(%0: f32[{m},1024]) -> f32[1024] {{\n  %1 = constant {{value = 0.0}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [0], kind = add}} : f32[1024]\n  return %2\n}}\n"
            )
        };
        // The transformer's sums over 2048 rows, and the first count that takes wide strips.
        for m in [2048, rows] {
            assert_eq!(
                printed(&sum(m), &Options::default()),
                [format!("strips of {wide}, then 16 (1 column sum)")],
                "{m} rows"
            );
        }
        // The MLP step's bias gradients over its batch of 256, and one row short.
        for m in [256, rows - 1] {
            assert_eq!(
                printed(&sum(m), &Options::default()),
                [format!("strips of {}, then 16 (1 column sum)", wide / 2)],
                "{m} rows"
            );
        }
    }

    #[test]
    fn a_split_column_sum_takes_chunks_no_narrower_than_its_strips() {
        let t = TargetInfo::reference();
        let wide = t.loops.strip_vectors * t.vector_bytes / 4;
        let launch = |n: usize| {
            let src = format!(
                "func @c(%0: f32[2048,{n}]) -> f32[{n}] {{\n  %1 = constant {{value = 0.0}} : f32[]\n  %2 = reduce %0, %1 {{dimensions = [0], kind = add}} : f32[{n}]\n  return %2\n}}\n"
            );
            let f = kiln_ir::parse_func_text(&src).expect("valid IR");
            let fused = crate::pipeline::fused_kernels(&f, &Options::default(), &t);
            let k = fused.kernels.iter().flatten().next().expect("a kernel");
            let s = kernel_schedule(k, &t, &CpuOptions::default());
            assert!(s.strips.is_some() && s.launch.split, "{n} columns: {s}");
            s.launch
        };
        // One wide strip a thread: one chunk each, not four chunks of a narrow strip.
        let l = launch(wide * t.threads);
        assert_eq!(l.chunks_per_thread, 1, "{l}");
        let l = launch(3 * wide * t.threads);
        assert_eq!(l.chunks_per_thread, 3, "{l}");
        // Wide enough for the usual chunks.
        let l = launch(64 * wide);
        assert_eq!(
            l.chunks_per_thread,
            crate::threads::CHUNKS_PER_THREAD,
            "{l}"
        );
        // Strips along an inner dimension leave the rows' chunks as they were.
        let src = "func @c(%0: f32[64,2048,256]) -> f32[64,256] {\n  %1 = constant {value = 0.0} : f32[]\n  %2 = reduce %0, %1 {dimensions = [1], kind = add} : f32[64,256]\n  return %2\n}\n";
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let fused = crate::pipeline::fused_kernels(&f, &Options::default(), &t);
        let k = fused.kernels.iter().flatten().next().expect("a kernel");
        let s = kernel_schedule(k, &t, &CpuOptions::default());
        assert_eq!(s.strips.as_ref().map(|s| s.dim), Some(1), "{s}");
        assert_eq!(
            s.launch.chunks_per_thread,
            crate::threads::CHUNKS_PER_THREAD,
            "{s}"
        );
    }

    /// An argmax pooling of `f32[shape]` over `window` (no padding, strides of 1, unless
    /// `pad` pads the last dimension in front, with strides of 2 along it).
    fn pool(shape: &[usize], window: &[usize], pad: usize) -> String {
        let r = shape.len();
        let out: Vec<usize> = (0..r)
            .map(|d| match d + 1 == r && pad > 0 {
                true => (shape[d] + pad - window[d]) / 2 + 1,
                false => shape[d] - window[d] + 1,
            })
            .collect();
        let dims = |v: &[usize]| {
            v.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let (s, o, n) = (dims(shape), dims(&out), shape.iter().product::<usize>());
        let strides: Vec<usize> = (0..r)
            .map(|d| 1 + (d + 1 == r && pad > 0) as usize)
            .collect();
        let padding: Vec<[usize; 2]> = (0..r)
            .map(|d| [if d + 1 == r { pad } else { 0 }, 0])
            .collect();
        format!(
            "func @p(%0: f32[{s}]) -> (f32[{o}], i32[{o}]) {{
  %1 = iota {{iota_dimension = 0}} : i32[{n}]
  %2 = reshape %1 : i32[{s}]
  %3 = constant {{value = -inf}} : f32[]
  %4 = constant {{value = 0}} : i32[]
  %5, %6 = reduce_window_region %0, %2, %3, %4 {{window_dimensions = {window:?}, window_strides = {strides:?}, base_dilations = {ones:?}, window_dilations = {ones:?}, padding = {padding:?}, body = func @arg(%0: f32[], %1: i32[], %2: f32[], %3: i32[]) -> (f32[], i32[]) {{
      %4 = compare %2, %0 {{comparison_direction = GT}} : pred[]
      %5 = select %4, %2, %0 : f32[]
      %6 = select %4, %3, %1 : i32[]
      return %5, %6
    }}}} : f32[{o}], i32[{o}]
  return %5, %6
}}
",
            ones = vec![1; r],
        )
    }

    #[test]
    fn large_windows_fold_across_outputs_in_strips() {
        let t = TargetInfo::reference();
        // Two accumulators a position (the values and their indices), over windows of 600
        // rows (at least `wide_strip_rows`).
        let wide = t.loops.strip_vectors * t.vector_bytes / 4 / 2;
        assert!(600 >= t.loops.wide_strip_rows);
        // Strided and padded along the rows.
        let got = printed(&pool(&[3, 1400], &[1, 600], 599), &Options::default());
        assert!(
            got.contains(&format!("strips of {wide}, then 16 (1 column sum)")),
            "{got:?}"
        );
        // A global pooling: its `[40, 1, 1]` output in strips along its first dimension.
        let got = printed(&pool(&[40, 30, 30], &[1, 30, 30], 0), &Options::default());
        assert!(
            got.contains(&"strips of 32, then 16 along d0 (1 column sum)".to_string()),
            "{got:?}"
        );
        // Fewer outputs than a strip: in order.
        let got = printed(&pool(&[8, 30, 30], &[1, 30, 30], 0), &Options::default());
        assert!(got.iter().all(|s| !s.contains("strips")), "{got:?}");
    }

    #[test]
    fn column_sums_share_the_strips_registers() {
        // Two sums down the same columns (a layer norm's gradient over many rows): half as
        // wide each.
        let src = "func @c(%0: f32[1024,4096], %1: f32[1024,4096]) -> f32[4096] {\n  %2 = constant {value = 0.0} : f32[]\n  %3 = reduce %0, %2 {dimensions = [0], kind = add} : f32[4096]\n  %4 = multiply %0, %1 : f32[1024,4096]\n  %5 = reduce %4, %2 {dimensions = [0], kind = add} : f32[4096]\n  %6 = add %3, %5 : f32[4096]\n  return %6\n}\n";
        let t = TargetInfo::reference();
        let wide = t.loops.strip_vectors * t.vector_bytes / 4;
        let got = printed(src, &Options::default());
        assert!(
            got.contains(&format!("strips of {}, then 16 (2 column sums)", wide / 2)),
            "{got:?}"
        );
    }
}

//! Row caches of warp- and block-per-row kernels ([`MapKind::WarpRows`],
//! [`MapKind::BlockRows`]): a row that several passes read (a softmax's maximum, its
//! denominator and its elements; a layer norm's mean, variance and elements) is loaded from
//! global memory once, ahead of the passes, and the passes read the copy.
//!
//! # What is cached
//!
//! A pass is a hoisted reduction over the row (the extents of the longest one), or the
//! output's elements when they run over the same extents. Every pass visits position
//! `q = k · threads + lane` of the row as its thread's `k`-th term (the order of the module
//! documentation of [`super`]), so slot `k` of a thread holds the same position in every pass.
//! The cached values are the loads of an input element at the row's position (the leaves),
//! those that at least two passes read, outside any guard (a guarded load may be out of
//! bounds where its guard fails). Caching the leaves rather than what a pass computes from
//! them (an elementwise prologue, a conversion) keeps one copy per element however the passes
//! differ (softmax's maximum reads `x`, its sum `exp(x - max)`), costs the fewest bytes (an
//! f16 input stays 16-bit values in registers), and recomputes only arithmetic, which the
//! row's memory traffic hides.
//!
//! # Where
//!
//! - In registers, when a thread's slots (`⌈row / threads⌉` per cached load, two 32-bit
//!   registers for a 64-bit element) fit [`Gpu::row_registers`]: the fill, every pass and the
//!   elements are unrolled over the slots, so each slot is a register at a compile-time
//!   position (no local memory); a position past the row's end (only in the last slot) is
//!   skipped as the loops skip it.
//! - Else in shared memory, when the block's rows (`per_block · row` elements per cached load,
//!   each at least 4 bytes) fit [`Gpu::row_shared_bytes`] beside the reductions' own arrays:
//!   one array per cached load, row `r` of the block at `r · row`, element `q` at `q`. A warp
//!   stores and loads consecutive elements (conflict-free banks), and each thread only reads
//!   back what it stored itself, so the cache needs no barrier.
//! - Else nowhere: every pass reads global memory, as without a cache.
//!
//! The reductions keep their order (chunks, trees and shuffles as before): only where a term's
//! input comes from changes, so the results are bit for bit those without a cache.

use super::*;
use crate::access::affine_read;

/// Where a row cache lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// Registers, one per slot and cached load, the loops unrolled.
    Registers,
    /// Shared arrays from `first` on, one per cached load (numbered by
    /// [`RowCache::shared`]).
    Shared { first: usize },
}

/// A launch's row cache: the loads it holds and where.
pub(super) struct RowCache {
    /// The cached loads, at the home variables `home`.
    loads: Vec<Expr>,
    /// The variables the loads are written in and the fill sets: the first pass's.
    home: Vec<(usize, usize)>,
    /// Elements of the row.
    len: usize,
    /// The row's threads.
    threads: usize,
    /// Slots per thread: `⌈len / threads⌉`.
    pub slots: usize,
    /// Registers or shared memory.
    pub place: Place,
    /// Registers: `regs[m][k]` holds load `m` at slot `k`; shared: `regs[m][0]` receives it.
    regs: Vec<Vec<usize>>,
    /// Where the thread's row starts in a shared array: its row within the block times the
    /// row's length.
    base: Sc,
    /// The kernel's inputs: cached load `m` is read as input `first + m`.
    first: usize,
}

/// The extents of `vars`.
fn extents(vars: &[(usize, usize)]) -> Vec<usize> {
    vars.iter().map(|v| v.1).collect()
}

/// `e` (a load of one of the `first` inputs, or a gather of one at an affine index) as a
/// load written in the variables `home` instead of `pass`, if it reads at the row's position
/// only: its coefficients are zero but on the leading `split` variables and on `pass`, and
/// not all zero on `pass`.
/// Trailing zero coefficients are dropped, so equal reads compare equal.
fn at_home(
    e: &Expr,
    pass: &[(usize, usize)],
    home: &[(usize, usize)],
    split: usize,
    first: usize,
) -> Option<Expr> {
    let (Expr::Load { input, dtype, .. } | Expr::Gather { input, dtype, .. }) = e else {
        return None;
    };
    if *input >= first {
        return None;
    }
    let (coef, off) = affine_read(e, *input)?;
    let width = home.iter().map(|h| h.0 + 1).max().unwrap_or(0).max(split);
    let mut out = vec![0; width];
    let mut along = false;
    for (v, &x) in coef.iter().enumerate() {
        if x == 0 {
            continue;
        }
        if v < split {
            out[v] = x;
        } else if let Some(d) = pass.iter().position(|p| p.0 == v) {
            out[home[d].0] = x;
            along = true;
        } else {
            return None;
        }
    }
    if !along {
        // The same element for the whole row: nothing to cache.
        return None;
    }
    while out.last() == Some(&0) {
        out.pop();
    }
    Some(Expr::Load {
        input: *input,
        dtype: *dtype,
        coef: out,
        off,
    })
}

/// The loads of `e` outside guards that read at the row's position, written at `home`.
fn row_loads(
    e: &Expr,
    pass: &[(usize, usize)],
    home: &[(usize, usize)],
    split: usize,
    first: usize,
) -> Vec<Expr> {
    struct Walk<'a> {
        pass: &'a [(usize, usize)],
        home: &'a [(usize, usize)],
        split: usize,
        first: usize,
        guarded: usize,
        out: Vec<Expr>,
    }
    impl<'e> Visitor<'e> for Walk<'_> {
        fn expr(&mut self, e: &'e Expr) {
            if matches!(e, Expr::Guard { .. }) {
                self.guarded += 1;
                e.for_each_child(self);
                self.guarded -= 1;
                return;
            }
            if self.guarded == 0
                && let Some(l) = at_home(e, self.pass, self.home, self.split, self.first)
                && !self.out.contains(&l)
            {
                self.out.push(l);
            }
            e.for_each_child(self);
        }
    }
    let mut w = Walk {
        pass,
        home,
        split,
        first,
        guarded: 0,
        out: Vec::new(),
    };
    w.expr(e);
    w.out
}

/// A pass over the row: its variables and the expressions it evaluates there.
type Pass<'a> = (&'a [(usize, usize)], Vec<&'a Expr>);

/// The geometry of a row launch a cache is planned for.
pub(super) struct Rows<'a> {
    /// The hoisted reductions, innermost first.
    pub hoisted: &'a [Expr],
    /// The outputs' bodies.
    pub bodies: &'a [&'a Expr],
    /// The leading variables that number rows.
    pub split: usize,
    /// The output row's variables (`split..`).
    pub out_row: Vec<(usize, usize)>,
    /// Threads per row.
    pub threads: usize,
    /// Rows per block.
    pub per_block: usize,
    /// The kernel's inputs.
    pub first: usize,
    /// The thread's row within its block (0 for a block per row, the warp for warps).
    pub row_in_block: Sc,
}

impl Mapper<'_> {
    /// The row cache of a row launch (`None` where no load is read by two passes), or, as the
    /// error, the note saying why the row is read in every pass (it fits neither registers
    /// nor shared memory).
    pub(super) fn row_cache(&self, g: &Rows, r: &mut Regs) -> Result<Option<RowCache>, String> {
        let longest = g
            .hoisted
            .iter()
            .filter_map(|h| match h {
                Expr::Reduce { vars, .. } => Some(vars),
                _ => None,
            })
            .max_by_key(|v| extent(v));
        let Some(row) = longest.map(|v| extents(v)) else {
            return Ok(None);
        };
        // The passes' variables, in the order they run: the row's reductions, then the
        // elements.
        let mut passes: Vec<Pass> = Vec::new();
        for h in g.hoisted {
            if let Expr::Reduce { vars, body, .. } = h
                && extents(vars) == row
            {
                passes.push((vars, vec![body]));
            }
        }
        if extents(&g.out_row) == row {
            passes.push((&g.out_row, g.bodies.to_vec()));
        }
        let Some(home) = passes.first().map(|p| p.0.to_vec()) else {
            return Ok(None);
        };
        let mut loads: Vec<(Expr, usize)> = Vec::new();
        for (vars, bodies) in &passes {
            let mut here: Vec<Expr> = Vec::new();
            for b in bodies {
                for l in row_loads(b, vars, &home, g.split, g.first) {
                    if !here.contains(&l) {
                        here.push(l);
                    }
                }
            }
            for l in here {
                match loads.iter_mut().find(|(x, _)| *x == l) {
                    Some((_, n)) => *n += 1,
                    None => loads.push((l, 1)),
                }
            }
        }
        let loads: Vec<Expr> = loads
            .into_iter()
            .filter(|(_, n)| *n >= 2)
            .map(|(l, _)| l)
            .collect();
        if loads.is_empty() {
            return Ok(None);
        }
        let len: usize = row.iter().product();
        let slots = len.div_ceil(g.threads);
        let held = |d: DType| d.bytes().max(4);
        // 32-bit registers per slot: two for an f64 or 64-bit element.
        let words: usize = loads.iter().map(|l| l.dtype().bytes().div_ceil(4)).sum();
        let (place, regs) = if slots * words <= self.gpu.row_registers {
            let regs = loads
                .iter()
                .map(|_| (0..slots).map(|_| r.next()).collect())
                .collect();
            (Place::Registers, regs)
        } else {
            let bytes: usize = loads
                .iter()
                .map(|l| g.per_block * len * held(l.dtype()))
                .sum();
            // The reductions' own arrays (a block's partial results and total per reduction).
            let warps = g.threads * g.per_block / self.gpu.warp_size.max(1);
            let theirs: usize = if g.per_block == 1 && warps > 1 {
                g.hoisted
                    .iter()
                    .map(|h| (warps + 1) * held(h.dtype()))
                    .sum()
            } else {
                0
            };
            let budget = self.gpu.row_shared_bytes.min(self.gpu.shared_limit());
            if bytes + theirs > budget {
                return Err(format!(
                    "row cache: none (rows of {len} elements fit neither {} registers per thread \
                     nor {budget} bytes of shared memory per block): each pass reads global memory",
                    self.gpu.row_registers
                ));
            }
            let regs = loads.iter().map(|_| vec![r.next()]).collect();
            (Place::Shared { first: usize::MAX }, regs)
        };
        Ok(Some(RowCache {
            loads,
            home,
            len,
            threads: g.threads,
            slots,
            place,
            regs,
            base: Sc::times(g.row_in_block.clone(), c(len)),
            first: g.first,
        }))
    }
}

impl RowCache {
    /// Cached loads: the inputs the kernel's expressions read after the kernel's own.
    pub fn count(&self) -> usize {
        self.loads.len()
    }

    /// Whether a pass over `vars` reads the cache.
    pub fn covers(&self, vars: &[(usize, usize)]) -> bool {
        extents(vars) == extents(&self.home)
    }

    /// Whether the passes run unrolled over the slots.
    pub fn unrolled(&self) -> bool {
        self.place == Place::Registers
    }

    /// Its line in the printed form.
    pub fn note(&self) -> Stmt {
        let what = match self.place {
            Place::Registers => format!("registers, {} slots per thread", self.slots),
            Place::Shared { first } => format!(
                "shared memory, shared{first}..shared{}",
                first + self.loads.len() - 1
            ),
        };
        let inputs: Vec<String> = self
            .loads
            .iter()
            .map(|l| match l {
                Expr::Load { input, dtype, .. } => format!("in{input} ({dtype})"),
                _ => unreachable!("loads only"),
            })
            .collect();
        Stmt::Note(format!(
            "row cache: {} elements of {} read once, in {what}",
            self.len,
            inputs.join(", ")
        ))
    }

    /// Its shared arrays (none in registers), numbered from `first`.
    pub fn shared(&mut self, first: usize, per_block: usize) -> Vec<SharedArray> {
        let Place::Shared { first: at } = &mut self.place else {
            return Vec::new();
        };
        *at = first;
        self.loads
            .iter()
            .map(|l| SharedArray {
                dtype: l.dtype(),
                len: per_block * self.len,
                packed: false,
                swizzle: None,
            })
            .collect()
    }

    /// Statements giving every cache register a value (once per thread, ahead of the rows),
    /// so an expression that lists them reads a written register.
    pub fn init(&self) -> Vec<Stmt> {
        self.loads
            .iter()
            .zip(&self.regs)
            .flat_map(|(l, regs)| {
                regs.iter().map(|&reg| Stmt::Eval {
                    reg,
                    expr: Expr::Const {
                        dtype: l.dtype(),
                        value: 0.0,
                    },
                    scalars: Vec::new(),
                })
            })
            .collect()
    }

    /// Statements loading the row (this thread's positions) into the cache; `e` is a free
    /// register for the shared-memory fill loop and `tmp` a value register.
    pub fn fill(&self, lane: &Sc, e: usize, tmp: usize) -> Vec<Stmt> {
        match self.place {
            Place::Registers => {
                let mut out = Vec::new();
                for k in 0..self.slots {
                    let q = Sc::plus(c(k * self.threads), lane.clone());
                    let mut each = set_vars(&self.home, q.clone());
                    for (l, regs) in self.loads.iter().zip(&self.regs) {
                        each.push(Stmt::Eval {
                            reg: regs[k],
                            expr: l.clone(),
                            scalars: Vec::new(),
                        });
                    }
                    out.extend(self.guarded(k, q, each));
                }
                out
            }
            Place::Shared { first } => {
                let mut each = set_vars(&self.home, Sc::Reg(e));
                for (m, l) in self.loads.iter().enumerate() {
                    each.push(Stmt::Eval {
                        reg: tmp,
                        expr: l.clone(),
                        scalars: Vec::new(),
                    });
                    each.push(Stmt::SharedStore {
                        array: first + m,
                        index: Sc::plus(self.base.clone(), Sc::Reg(e)),
                        value: tmp,
                    });
                }
                vec![Stmt::For {
                    reg: e,
                    start: lane.clone(),
                    end: c(self.len),
                    step: c(self.threads),
                    body: each,
                }]
            }
        }
    }

    /// `body` (a term at slot `k`, position `q`) under the guard `q < len` where slot `k`
    /// reaches past the row's end; nothing where it lies wholly past it.
    pub fn guarded(&self, k: usize, q: Sc, body: Vec<Stmt>) -> Vec<Stmt> {
        if k * self.threads >= self.len {
            Vec::new()
        } else if (k + 1) * self.threads > self.len {
            vec![Stmt::If {
                cond: Sc::lt(q, c(self.len)),
                body,
            }]
        } else {
            body
        }
    }

    /// The registers a term at slot `k` (position `q`) reads its cached loads from, and for
    /// shared memory the statements that load them there first.
    pub fn at(&self, k: usize, q: &Sc) -> (Vec<usize>, Vec<Stmt>) {
        match self.place {
            Place::Registers => (self.regs.iter().map(|r| r[k]).collect(), Vec::new()),
            Place::Shared { first } => {
                let regs: Vec<usize> = self.regs.iter().map(|r| r[0]).collect();
                let loads = regs
                    .iter()
                    .enumerate()
                    .map(|(m, &reg)| Stmt::SharedLoad {
                        reg,
                        array: first + m,
                        index: Sc::plus(self.base.clone(), q.clone()),
                    })
                    .collect();
                (regs, loads)
            }
        }
    }

    /// Registers listed where an expression reads no cached load (any written ones: only
    /// their count matters, so the hoisted reductions' scalars keep their numbers).
    pub fn padding(&self) -> Vec<usize> {
        self.regs.iter().map(|r| r[0]).collect()
    }

    /// `e`, evaluated in a pass over `vars`, with each cached load replaced by a read of its
    /// scalar (input `first + m`, `vars_n` kernel variables).
    pub fn substitute(&self, e: &Expr, vars: &[(usize, usize)], split: usize, n: usize) -> Expr {
        struct Sub<'a> {
            cache: &'a RowCache,
            vars: &'a [(usize, usize)],
            split: usize,
            n: usize,
        }
        impl Rewriter for Sub<'_> {
            fn expr(&mut self, e: &Expr) -> Expr {
                let c = self.cache;
                if let Some(l) = at_home(e, self.vars, &c.home, self.split, c.first)
                    && let Some(m) = c.loads.iter().position(|x| *x == l)
                {
                    return Expr::Load {
                        input: c.first + m,
                        dtype: e.dtype(),
                        coef: vec![0; self.n],
                        off: 0,
                    };
                }
                e.map_children(self)
            }
        }
        Sub {
            cache: self,
            vars,
            split,
            n,
        }
        .expr(e)
    }
}

//! Scatters on the GPU, each update combined in order, so that the result is deterministic
//! (see the parent module); select-and-scatters are in `select_scatter.rs`.
//!
//! A scatter whose update dimensions include some that each address one whole output
//! dimension by themselves (the target index along it is that update variable, and both have
//! the same extent: an embedding's gradient, whose rows are scattered and whose columns are
//! the window; a batched scatter's batch) runs a thread per position of those
//! dimensions: two positions never meet at an output element, and each thread copies the
//! operand's elements it owns, then combines its updates in the order of the others. Every
//! output element then sees its updates in the order one thread would, so the result is the
//! sequential scatter's bit for bit.
//!
//! Any other scatter with few updates for its output ([`Mapper::scan_steps`], the grid's
//! passes over the output times the updates, at most [`SCAN_STEPS`]) runs a thread per output
//! element (a grid-stride loop): the thread reads its element from the operand, scans every
//! update in order, combines those whose target (in bounds) is its element, and stores it
//! once. One with more updates sorts them by target (`scatter_sorted.rs`: their targets
//! computed, a stable GPU sort, a thread per element combining its run in order). Again each
//! element sees its updates in the sequential order, so the bits are the sequential
//! scatter's, with no atomics. Only where the GPU sort cannot take the targets (a GPU without
//! the shared memory for its tiles) does the scatter scan where that pays
//! ([`Mapper::scan_pays`]) or run on one thread, in order.
//!
//! Where the options allow float atomics, an f32 or f16 scatter-add that would sort its
//! updates adds them into the copied operand atomically instead (`scatter_atomic.rs`), its
//! last bits then depending on the order the hardware runs the threads.
//!
//! The IR's scatter has no `unique_indices` or `indices_are_sorted` flags, so no path
//! relies on them.

use super::scatter_sorted::Targets;
use super::*;

/// The operand's element at `index` copied into the result, through register `reg`: every
/// scatter's result starts as its operand.
pub(super) fn copy_element(reg: usize, index: Sc) -> Vec<Stmt> {
    vec![
        Stmt::Load {
            reg,
            buf: Buf::Input(0),
            index: index.clone(),
        },
        Stmt::Store {
            buf: Buf::Output(0),
            index,
            value: reg,
        },
    ]
}

/// A program of one launch.
fn one(launch: GpuKernel) -> GpuProgram {
    GpuProgram {
        scratch: Vec::new(),
        zeroed: Vec::new(),
        launches: vec![launch],
    }
}

/// The update variables that each address one whole output dimension alone, as
/// `(variable, output dimension)` by output dimension (see the module's doc): the target
/// index along that dimension is the variable itself, of the dimension's extent, so updates
/// at two values of it never meet (whatever the other target indices read).
fn parallel_dims(target: &[Idx], updates: &[usize], out: &[usize]) -> Vec<(usize, usize)> {
    let alone = |i: &Idx| match i {
        Idx::Var(v) => Some(*v),
        Idx::Add(parts) => match parts.as_slice() {
            [Idx::Var(v)] => Some(*v),
            _ => None,
        },
        _ => None,
    };
    let mut found: Vec<(usize, usize)> = Vec::new();
    for (d, t) in target.iter().enumerate() {
        if let Some(v) = alone(t)
            && updates.get(v) == Some(&out[d])
            && !found.iter().any(|f| f.0 == v)
        {
            found.push((v, d));
        }
    }
    found
}

impl Mapper<'_> {
    /// A scatter: the operand copied, then each update combined in order where its target is
    /// in bounds; by a thread per position of its parallel dimensions where it has some, else
    /// by a thread per output element scanning few updates, else by its updates sorted by
    /// target, else on thread 0 of one warp (see the module's doc).
    pub(super) fn scatter(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        updates: &[usize],
        target: &[Idx],
        kind: Combiner,
    ) -> GpuProgram {
        let mut r = Regs::default();
        let [p, old, x, flat, inb] = r.array();
        let total = k.out.numel();
        let dtype = k.out.dtype;
        let copy = Stmt::For {
            reg: p,
            start: c(0),
            end: c(total),
            step: c(1),
            body: copy_element(old, Sc::Reg(p)),
        };
        let u = r.next();
        let mut each = set_vars(&dims(updates, 0), Sc::Reg(u));
        let mut coords = Vec::new();
        for (d, t) in target.iter().enumerate().rev() {
            let reg = r.next();
            each.push(Stmt::Eval {
                reg,
                expr: Expr::Index {
                    idx: t.clone(),
                    dtype: DType::I64,
                },
                scalars: Vec::new(),
            });
            coords.push((Sc::Reg(reg), k.out.shape[d] as i64));
        }
        let (in_bounds, flat_sc) = bounded_position(coords);
        each.push(Stmt::Let {
            reg: inb,
            value: in_bounds,
        });
        each.push(Stmt::If {
            cond: Sc::Reg(inb),
            body: vec![
                Stmt::Let {
                    reg: flat,
                    value: flat_sc.clone(),
                },
                Stmt::Load {
                    reg: old,
                    buf: Buf::Output(0),
                    index: Sc::Reg(flat),
                },
                Stmt::Eval {
                    reg: x,
                    expr: k.body.clone(),
                    scalars: Vec::new(),
                },
                Stmt::Combine {
                    acc: old,
                    value: x,
                    kind,
                    dtype,
                },
                Stmt::Store {
                    buf: Buf::Output(0),
                    index: Sc::Reg(flat),
                    value: old,
                },
            ],
        });
        let parallel = parallel_dims(target, updates, &k.out.shape);
        if !parallel.is_empty() {
            // `each` without its first statements, which set every update variable.
            let combine = each.split_off(updates.len());
            return one(self.scatter_by_dims(name, k, inputs, updates, &parallel, combine, r));
        }
        let updates_total: usize = updates.iter().product();
        // `each` up to whether its target is in bounds (the variables set, the indices
        // evaluated, `inb`), without the combination.
        let mut target_of = each.clone();
        target_of.truncate(updates.len() + target.len() + 1);
        let targets = Targets {
            shape: updates.to_vec(),
            update: u,
            target: target_of,
            inb,
            flat: flat_sc,
        };
        let scan = Scan {
            of: targets.clone(),
            acc: old,
            value: x,
        };
        if self.scan_steps(total, updates_total) <= SCAN_STEPS {
            return one(self.scatter_by_elements(name, k, inputs, updates_total, kind, scan, r));
        }
        if let Some(p) = self.scatter_atomic(name, k, &inputs, kind, &targets, Regs(r.0)) {
            return p;
        }
        let regs = Regs(r.0);
        if let Some(p) = self.scatter_sorted(name, k, inputs.clone(), kind, targets, regs) {
            return p;
        }
        if self.scan_pays(total, updates_total) {
            return one(self.scatter_by_elements(name, k, inputs, updates_total, kind, scan, r));
        }
        one(GpuKernel {
            tensor_maps: Vec::new(),
            dynamic_shared: 0,
            name: name.to_string(),
            kind: MapKind::Scatter,
            grid: 1,
            block: self.gpu.warp_size,
            warp: self.gpu.warp_size,
            inputs,
            outputs: vec![(Buf::Output(0), k.out.clone())],
            shared: Vec::new(),
            regs: r.0,
            vars: k.vars.max(updates.len()),
            sums: self.sums,
            body: vec![Stmt::If {
                cond: Sc::eq(sp(Special::Thread), c(0)),
                body: vec![
                    copy,
                    Stmt::For {
                        reg: u,
                        start: c(0),
                        end: c(updates_total),
                        step: c(1),
                        body: each,
                    },
                ],
            }],
        })
    }
}

impl Mapper<'_> {
    /// The scatter `k` by a thread per position of its `parallel` dimensions (from
    /// [`parallel_dims`]): the thread's variables set from its index, its output elements
    /// copied from the operand, then `each` (one update's combination, `r` its registers) run
    /// over the other update dimensions in order.
    #[allow(clippy::too_many_arguments)]
    fn scatter_by_dims(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        updates: &[usize],
        parallel: &[(usize, usize)],
        each: Vec<Stmt>,
        mut r: Regs,
    ) -> GpuKernel {
        let [t, q, u, old] = r.array();
        let shape = &k.out.shape;
        let threads: usize = parallel.iter().map(|&(_, d)| shape[d]).product();
        let own: Vec<(usize, usize)> = parallel.iter().map(|&(v, d)| (v, shape[d])).collect();
        let rest: Vec<(usize, usize)> = (0..updates.len())
            .filter(|v| !parallel.iter().any(|p| p.0 == *v))
            .map(|v| (v, updates[v]))
            .collect();
        // The flat output position of the thread's element `q` (its dimensions' coordinates
        // the thread's variables, the others the row-major digits of `q`).
        let others: Vec<usize> = (0..shape.len())
            .filter(|d| !parallel.iter().any(|p| p.1 == *d))
            .collect();
        let (mut flat, mut stride, mut digit) = (Sc::Const(0), 1usize, 1usize);
        for d in (0..shape.len()).rev() {
            let coord = match parallel.iter().find(|p| p.1 == d) {
                Some(&(v, _)) => Sc::Var(v),
                None => {
                    let x = Sc::modulo(Sc::quot(Sc::Reg(q), c(digit)), c(shape[d]));
                    digit *= shape[d];
                    x
                }
            };
            flat = Sc::plus(flat, Sc::times(coord, c(stride)));
            stride *= shape[d];
        }
        let copied: usize = others.iter().map(|&d| shape[d]).product();
        let mut body = set_vars(&own, Sc::Reg(t));
        body.push(Stmt::For {
            reg: q,
            start: c(0),
            end: c(copied),
            step: c(1),
            body: copy_element(old, flat),
        });
        let mut step = set_vars(&rest, Sc::Reg(u));
        step.extend(each);
        body.push(Stmt::For {
            reg: u,
            start: c(0),
            end: c(rest.iter().map(|x| x.1).product()),
            step: c(1),
            body: step,
        });
        let warp = self.gpu.warp_size;
        let block = self
            .gpu
            .elementwise_block
            .min(threads.div_ceil(warp) * warp)
            .max(warp);
        GpuKernel {
            tensor_maps: Vec::new(),
            name: name.to_string(),
            kind: MapKind::Scatter,
            // At least one block, though an empty output leaves it nothing to do.
            grid: threads.div_ceil(block).max(1),
            block,
            warp,
            inputs,
            outputs: vec![(Buf::Output(0), k.out.clone())],
            shared: Vec::new(),
            dynamic_shared: 0,
            regs: r.0,
            vars: k.vars.max(updates.len()),
            sums: self.sums,
            body: vec![
                Stmt::Let {
                    reg: t,
                    value: Sc::plus(
                        Sc::times(sp(Special::Block), sp(Special::BlockDim)),
                        sp(Special::Thread),
                    ),
                },
                Stmt::If {
                    cond: Sc::lt(Sc::Reg(t), c(threads)),
                    body,
                },
            ],
        }
    }
}

/// The updates' targets as [`Mapper::scatter_by_elements`] checks them against its element,
/// with the element's accumulator register and the update value's.
struct Scan {
    of: Targets,
    acc: usize,
    value: usize,
}

/// The most steps ([`Mapper::scan_steps`]) of a scan by a thread per element that is
/// preferred to sorting the updates by target (`scatter_sorted.rs`): the sort takes a few
/// launches (a block's network for up to a few thousand updates, a dozen or more for the
/// radix sort) and two more, about 10 us of launches, where a scan step of a few loads from
/// the first-level cache takes 50 to 100 cycles. An estimate, not measured on a GPU.
const SCAN_STEPS: usize = 256;

/// A serial step of the single thread (an element copied, or an update's target read and
/// its element loaded, combined and stored: a round trip to memory each) costs about as much
/// as this many steps of a whole grid of scanning threads (each warp a dozen or so
/// instructions for one update, all the resident warps of a multiprocessor issuing in turn,
/// the update's index and value read by every thread from the same cached address). An
/// estimate, not measured on a GPU.
const SERIAL_STEP_IN_SCANS: usize = 4;

impl Mapper<'_> {
    /// Whether a scatter of `updates` updates into `total` elements runs faster by a thread
    /// per output element, each scanning every update, than on one thread: the grid's
    /// passes over the output (`⌈total / threads⌉`, `threads` the grid-stride grid's) times
    /// the `updates + 1` steps of each pass, against one thread's `total + updates` steps at
    /// [`SERIAL_STEP_IN_SCANS`] scan steps each.
    fn scan_pays(&self, total: usize, updates: usize) -> bool {
        self.scan_steps(total, updates)
            <= SERIAL_STEP_IN_SCANS.saturating_mul(total.saturating_add(updates))
    }

    /// The steps of a scan of `updates` updates by a thread per element of `total`: the
    /// grid-stride grid's passes over the output times `updates + 1`.
    fn scan_steps(&self, total: usize, updates: usize) -> usize {
        let threads = self.gpu.sms * self.gpu.blocks_per_sm * self.gpu.elementwise_block;
        let passes = total.div_ceil(threads.max(1)).max(1);
        passes.saturating_mul(updates.saturating_add(1))
    }

    /// The scatter `k` by a thread per output element (a grid-stride loop): the element
    /// read from the operand, then every update in order, combined into it where its
    /// target is in bounds and is the element, then stored once. An element receives its
    /// updates in the order the sequential scatter combines them, so the result is the same
    /// bits; each thread writes only its element.
    #[allow(clippy::too_many_arguments)]
    fn scatter_by_elements(
        &self,
        name: &str,
        k: &Kernel,
        inputs: Vec<(Buf, TensorType)>,
        updates: usize,
        kind: Combiner,
        scan: Scan,
        mut r: Regs,
    ) -> GpuKernel {
        let (p, u) = (r.next(), scan.of.update);
        let total = k.out.numel();
        let mut each = scan.of.target;
        each.push(Stmt::If {
            cond: Sc::and(Sc::Reg(scan.of.inb), Sc::eq(scan.of.flat, Sc::Reg(p))),
            body: vec![
                Stmt::Eval {
                    reg: scan.value,
                    expr: k.body.clone(),
                    scalars: Vec::new(),
                },
                Stmt::Combine {
                    acc: scan.acc,
                    value: scan.value,
                    kind,
                    dtype: k.out.dtype,
                },
            ]
            .into_iter()
            .chain(super::select_scatter::narrowed(scan.acc, p, k.out.dtype))
            .collect(),
        });
        let body = vec![
            Stmt::Load {
                reg: scan.acc,
                buf: Buf::Input(0),
                index: Sc::Reg(p),
            },
            Stmt::For {
                reg: u,
                start: c(0),
                end: c(updates),
                step: c(1),
                body: each,
            },
            Stmt::Store {
                buf: Buf::Output(0),
                index: Sc::Reg(p),
                value: scan.acc,
            },
        ];
        self.grid_stride(
            (name, MapKind::Scatter),
            (inputs, vec![(Buf::Output(0), k.out.clone())]),
            (r.0, k.vars),
            (p, total, body),
        )
    }
}

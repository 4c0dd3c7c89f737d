//! kiln's host runtime: what runs a compiled function once a backend has produced its kernels.
//!
//! - [`Program`]: the function's instructions in order, each a [`Step`] (a kernel, a constant, a
//!   pass-through, or, as a fallback, the reference interpreter). It is `Send + Sync`, and
//!   concurrent calls are safe: each call owns its intermediate buffers.
//! - Buffers: arguments are read in place, results move out without a copy, and the
//!   intermediates live in one arena laid out by a memory plan ([`plan`]: liveness, reuse of
//!   dead buffers), kept from one call to the next (repeated calls do not pay for fresh pages).
//! - Threads ([`launch`]): a kernel's outer rows are split into chunks run on rayon where the
//!   kernel layer decided so ([`Launch::split`], from the target's
//!   [`SplitLimits`](kiln_kernel::target::SplitLimits)); other kernels run on one thread, and
//!   consecutive ones with enough work ([`Launch::beside`]) that do not depend on each other
//!   run side by side (`concurrent_groups`). The runtime only clamps the chunks to its threads.
//! - Scratch memory: each thread keeps one 64-byte aligned scratch area, grown to the largest
//!   request and reused (the GEMM packs its operands there).
//! - [`cuda`] (feature `cuda`, on by default): the NVIDIA device runtime, which builds without
//!   CUDA installed and says so, without panicking, where there is no driver or no GPU;
//!   [`cuda_tma`] encodes the tensor maps of TMA loads.
//! - [`gpu_emu`]: the GPU emulator, which runs kernels mapped to the GPU (`kiln_kernel::gpu`)
//!   on the CPU with the GPU's semantics, and whole lowered programs on it
//!   (`KILN_BACKEND=ptx-emulator`).
//! - [`plan_exec`]: the executor of a device plan (`kiln_kernel::gpu::plan`), shared by the GPU
//!   emulator and `cuda_exec` (feature `cuda`), which runs a plan on a real GPU from PTX the
//!   backend rendered.
//! - [`kernel_program`]: a lowered program run with compiled CPU kernel functions (JIT-compiled,
//!   or from a shared library: [`library`]), shared by the CPU backend and `kiln-run`.

pub mod collective;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_exec;
#[cfg(feature = "cuda")]
pub mod cuda_tma;
pub mod gpu_emu;
pub mod kernel_program;
pub mod library;
pub mod linalg;
pub mod plan_exec;
mod radix;
mod reduce_region;
mod sort;

pub use kiln_kernel::{Step, plan};

use kiln_ir::{Func, Literal, Op, TensorType, ValueId};
use plan::MemoryPlan;
use std::borrow::Cow;
use std::fmt;
use std::sync::Mutex;

/// A compiled kernel: input pointers, output pointer, the row range `lo..hi` to compute, and
/// scratch memory of [`Launch::scratch`] bytes, 64-byte aligned.
pub type KernelFn = unsafe extern "C" fn(*const *const u8, *mut u8, i64, i64, *mut u8);

pub use kiln_kernel::threads::Launch;

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad arguments: {}", self.0)
    }
}

impl std::error::Error for Error {}

/// A region's compiled program, which a `Step::Control` instruction runs: the backend's
/// executable of a `while`'s condition or body, or of a `case`'s branch.
pub trait Region: Send + Sync {
    /// Runs the region on arguments of its parameter types.
    fn run_region(&self, args: &[&Literal]) -> Result<Vec<Literal>, Error>;

    /// Runs like [`Region::run_region`], where the arguments passed by value are donated (see
    /// [`Program::call_donating`]). By default they are only read.
    fn run_region_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>, Error> {
        let refs: Vec<&Literal> = args.iter().map(|a| a.as_ref()).collect();
        self.run_region(&refs)
    }
}

impl Region for Program {
    fn run_region(&self, args: &[&Literal]) -> Result<Vec<Literal>, Error> {
        self.call(args)
    }

    fn run_region_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>, Error> {
        self.call_donating(args)
    }
}

/// A function ready to run: its instructions, how each runs, and the kernels.
pub struct Program {
    func: Func,
    steps: Vec<Step>,
    kernels: Vec<Option<KernelFn>>,
    launch: Vec<Launch>,
    /// Per instruction: the values whose buffers its kernel reads, in input order.
    operands: Vec<Vec<ValueId>>,
    /// Per instruction: pairs `(q, k)` where its kernel writes output `k` (0: its result, then
    /// its extra results) into the buffer of `operands[i][q]`, a donated parameter (read only
    /// there, through that output's pointer).
    in_place: Vec<Vec<(usize, usize)>>,
    /// Per instruction: the results of `Step::Merged` instructions its kernel also writes,
    /// whose buffers it finds after its inputs.
    extra: Vec<Vec<ValueId>>,
    /// Where the intermediates live in the arena.
    memory: MemoryPlan,
    /// The arena of the previous call, reused so repeated calls do not pay for fresh pages
    /// (a concurrent call finds it taken and allocates its own).
    arena: Mutex<Vec<Line>>,
    /// Kernel results outside the arena (read by steps that are not kernels) of the previous
    /// call, by value, reused likewise (every kernel writes its whole output).
    pool: Mutex<Vec<Option<Literal>>>,
    /// Per value, the last step that reads it (`usize::MAX` for outputs): a value passed on
    /// (`Step::Forward`) by its last reader moves instead of being copied.
    last_read: Vec<usize>,
    /// Per step: for a kernel run side by side with others ([`concurrent_groups`]), the
    /// group's last step, once whose buffers are ready they all run.
    groups: Vec<Option<usize>>,
    /// Per step: for a `Step::Control` instruction, its regions' programs (a `while`'s
    /// condition and body, a `case`'s branches), set by [`Program::set_regions`].
    regions: Vec<Vec<Box<dyn Region>>>,
    /// With [`kiln_kernel::Options::profile`] (`KILN_PROFILE=1`): time spent in each instruction, summed over calls, reported on
    /// stderr after 4, 16, 64, ... calls and when the program is dropped.
    profile: Option<Mutex<(usize, Vec<std::time::Duration>)>>,
}

impl Drop for Program {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let (calls, times) = &*p.lock().unwrap_or_else(|e| e.into_inner());
            if *calls > 0 {
                eprint!("{}", self.profile_report(*calls, times));
            }
        }
    }
}

impl Program {
    /// A program running `func` with `steps[i]` for instruction `i`; a `Step::Kernel`
    /// instruction calls `kernels[i]` on the buffers of `operands[i]` as `launch[i]` says.
    ///
    /// # Safety
    ///
    /// Each kernel must compute its instruction's (first) result from buffers of the types
    /// `func` gives its operand values, write every element of it (rows `lo..hi` when called
    /// on them), use no more scratch than its launch says, and stay callable, from any thread,
    /// for as long as the program lives. A `Step::Fused` instruction's value must not be read
    /// by any other step or be an output. For each pair `(q, k)` of `in_place[i]`,
    /// `operands[i][q]` must be a parameter of output `k`'s type that is not an output and that
    /// no later step reads, and kernel `i` must read it only through output `k`'s pointer, each
    /// element before writing it and nowhere else (the runtime passes that buffer as the
    /// output). Kernel `i`
    /// also writes every element of the results `extra[i]` (of `Step::Merged` instructions
    /// before it, whose values nothing reads before step `i`), through the pointers that follow
    /// its inputs in the pointer array, in that order.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new(
        func: Func,
        steps: Vec<Step>,
        kernels: Vec<Option<KernelFn>>,
        launch: Vec<Launch>,
        operands: Vec<Vec<ValueId>>,
        in_place: Vec<Vec<(usize, usize)>>,
        extra: Vec<Vec<ValueId>>,
        opts: &kiln_kernel::Options,
    ) -> Program {
        let n = func.insts.len();
        assert_eq!(steps.len(), n, "one step per instruction");
        assert_eq!(kernels.len(), n, "one kernel slot per instruction");
        assert_eq!(launch.len(), n, "one launch per instruction");
        assert_eq!(operands.len(), n, "one operand list per instruction");
        assert_eq!(in_place.len(), n, "one in-place slot per instruction");
        assert_eq!(extra.len(), n, "one extra-result list per instruction");
        if opts.keep_freed {
            kiln_ir::literal::keep_freed_buffers();
        }
        let scratch: Vec<usize> = launch.iter().map(|l| l.scratch).collect();
        let memory = plan::plan(&func, &steps, &operands, &scratch, &in_place, &extra);
        let mut last_read: Vec<usize> = plan::last_reads(&func, &steps, &operands)
            .into_iter()
            .map(|l| l.unwrap_or(0))
            .collect();
        for o in &func.outputs {
            last_read[o.index()] = usize::MAX;
        }
        let groups = concurrent_groups(
            &func, &steps, &launch, &operands, &in_place, &extra, &memory,
        );
        Program {
            last_read,
            groups,
            func,
            steps,
            kernels,
            launch,
            operands,
            in_place,
            extra,
            memory,
            arena: Mutex::new(Vec::new()),
            pool: Mutex::new(Vec::new()),
            regions: (0..n).map(|_| Vec::new()).collect(),
            profile: opts
                .profile
                .then(|| Mutex::new((0, vec![std::time::Duration::ZERO; n]))),
        }
    }

    /// The per-instruction profile: time per call of each instruction that ran, slowest
    /// first (the 25 slowest), with its op, result type and step; then the time per op over
    /// every instruction, with the number of instructions.
    fn profile_report(&self, calls: usize, times: &[std::time::Duration]) -> String {
        let total: std::time::Duration = times.iter().sum();
        let mut rows: Vec<(usize, std::time::Duration)> = times
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, t)| !t.is_zero())
            .collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let per_call = |t: std::time::Duration| t.as_secs_f64() * 1e3 / calls as f64;
        let kernels = self.steps.iter().filter(|s| **s == Step::Kernel).count();
        let mut out = format!(
            "kiln profile of @{}: {calls} calls, {:.3} ms per call, {kernels} kernels\n",
            self.func.name,
            per_call(total)
        );
        for (i, t) in rows.into_iter().take(25) {
            let inst = &self.func.insts[i];
            let ty = &self.func.values[inst.results[0].index()];
            out += &format!(
                "  {:>9.3} ms {:>5.1}%  #{i} {} -> {ty} ({:?})\n",
                per_call(t),
                100.0 * t.as_secs_f64() / total.as_secs_f64().max(1e-12),
                inst.op.mnemonic(),
                self.steps[i]
            );
        }
        // Then the time per op, over every instruction.
        let mut by_op: Vec<(&str, std::time::Duration, usize)> = Vec::new();
        for (i, t) in times.iter().enumerate().filter(|(_, t)| !t.is_zero()) {
            let name = self.func.insts[i].op.mnemonic();
            match by_op.iter_mut().find(|(n, _, _)| *n == name) {
                Some(e) => {
                    e.1 += *t;
                    e.2 += 1;
                }
                None => by_op.push((name, *t, 1)),
            }
        }
        by_op.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        out += "  by op:";
        for (name, t, n) in by_op {
            out += &format!(
                " {name} {:.3} ms ({:.1}%, {n}),",
                per_call(t),
                100.0 * t.as_secs_f64() / total.as_secs_f64().max(1e-12)
            );
        }
        out.pop();
        out.push('\n');
        out
    }

    /// The function the program runs.
    pub fn func(&self) -> &Func {
        &self.func
    }

    /// Gives the `Step::Control` instruction `i` the programs of its regions, in the order
    /// [`kiln_ir::Op::regions`] lists them (a `while`'s condition, then its body; a `case`'s
    /// branches). Until then, running it is an error.
    pub fn set_regions(&mut self, i: usize, regions: Vec<Box<dyn Region>>) {
        self.regions[i] = regions;
    }

    /// Runs the control-flow instruction `i` on its operands `x`: a `while` runs its condition
    /// and body programs in turn until the condition is false, a `case` the program of the
    /// branch its index picks (the last one when out of range), a `sort` by its keys or its
    /// comparator's program ([`sort`]), a `reduce_region` or `reduce_window_region` its body's
    /// program per element, a `map` its computation's program per element.
    fn control(&self, i: usize, x: &[&Literal]) -> Result<Vec<Literal>, Error> {
        let inst = &self.func.insts[i];
        let regions = &self.regions[i];
        let missing = || {
            Error(format!(
                "#{i} {}: its regions have no compiled programs",
                inst.op.mnemonic()
            ))
        };
        match &inst.op {
            Op::While {
                body: body_func, ..
            } => {
                let [cond, body] = &regions[..] else {
                    return Err(missing());
                };
                // Invariant carries stay the operands, by reference; the others are owned
                // here and donated to the body, which returns only them
                // (`kiln_kernel::host_loop`).
                let plan = kiln_kernel::host_loop::loop_plan(body_func);
                let mut owned: Vec<Option<Literal>> = x
                    .iter()
                    .zip(&plan.invariant)
                    .map(|(&l, &inv)| (!inv).then(|| l.clone()))
                    .collect();
                // The first test runs the condition's program; the body's program returns the
                // next test after the carries that change.
                let holds = |p: Option<&Literal>| {
                    p.is_some_and(|p| p.to_i64s().first().is_some_and(|&b| b != 0))
                };
                let mut go = holds(cond.run_region(x)?.first());
                while go {
                    let args: Vec<Cow<'_, Literal>> = owned
                        .iter_mut()
                        .zip(x)
                        .map(|(o, &l)| match o.take() {
                            Some(v) => Cow::Owned(v),
                            None => Cow::Borrowed(l),
                        })
                        .collect();
                    let mut next = body.run_region_donating(args)?.into_iter();
                    for (o, &inv) in owned.iter_mut().zip(&plan.invariant) {
                        if !inv {
                            *o = Some(next.next().ok_or_else(|| {
                                Error(format!("#{i} while: the body returned too few carries"))
                            })?);
                        }
                    }
                    go = holds(next.next().as_ref());
                }
                Ok(owned
                    .into_iter()
                    .zip(x)
                    .map(|(o, &l)| o.unwrap_or_else(|| l.clone()))
                    .collect())
            }
            Op::Case { .. } => {
                if regions.is_empty() {
                    return Err(missing());
                }
                let k = kiln_reference::case_branch(x[0], regions.len());
                regions[k].run_region(&x[1..])
            }
            Op::Sort {
                dimension,
                comparator,
                ..
            } => {
                // A sort by keys never calls its comparator, which is then not compiled.
                let plan = kiln_kernel::sort::sort_plan(comparator, x.len());
                let cmp = match (&regions[..], plan) {
                    ([cmp], _) => Some(cmp.as_ref()),
                    (_, kiln_kernel::sort::SortPlan::Keys { .. }) => None,
                    _ => return Err(missing()),
                };
                let top_k = kiln_kernel::sort::top_k(&self.func, i).map(|t| t.k);
                sort::sort(x, *dimension as usize, plan, cmp, top_k)
            }
            Op::Map { .. } => {
                let [computation] = &regions[..] else {
                    return Err(missing());
                };
                let ty = &self.func.values[inst.results[0].index()];
                reduce_region::map(x, computation.as_ref(), ty).map(|l| vec![l])
            }
            Op::ReduceRegion { .. } | Op::ReduceWindowRegion { .. } => {
                let [body] = &regions[..] else {
                    return Err(missing());
                };
                let types: Vec<kiln_ir::TensorType> = inst
                    .results
                    .iter()
                    .map(|r| self.func.values[r.index()].clone())
                    .collect();
                reduce_region::fold(&inst.op, x, body.as_ref(), &types)
            }
            op => Err(Error(format!(
                "#{i} {}: a control step on an op without regions",
                op.mnemonic()
            ))),
        }
    }

    /// How each instruction runs.
    pub fn plan(&self) -> &[Step] {
        &self.steps
    }

    /// The groups of kernel steps that run side by side, each as its steps in order: runs of
    /// kernels that run on one thread with enough work to run beside others
    /// ([`Launch::beside`]), and that
    /// neither read nor write what another writes.
    pub fn concurrent_steps(&self) -> Vec<Vec<usize>> {
        let mut by_last: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, g) in self.groups.iter().enumerate() {
            if let Some(last) = g {
                by_last.entry(*last).or_default().push(i);
            }
        }
        by_last.into_values().collect()
    }

    /// Where the intermediates live.
    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.memory
    }

    /// Runs on arguments of the function's parameter types.
    pub fn run(&self, args: &[Literal]) -> Result<Vec<Literal>, Error> {
        self.call(&args.iter().collect::<Vec<_>>())
    }

    /// Runs on borrowed arguments of the function's parameter types: arguments are read in
    /// place, and results move out of the program without a copy.
    pub fn call(&self, args: &[&Literal]) -> Result<Vec<Literal>, Error> {
        self.call_donating(args.iter().map(|&a| Cow::Borrowed(a)).collect())
    }

    /// Runs like [`Program::call`], where the arguments passed by value (`Cow::Owned`) are
    /// donated: a kernel compiled in place writes its result into such an argument's buffer
    /// instead of a new one (like JAX's `donate_argnums`). An in-place kernel given a borrowed
    /// argument works on a copy of it.
    pub fn call_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>, Error> {
        let f = &self.func;
        let refs: Vec<&Literal> = args.iter().map(|a| a.as_ref()).collect();
        kiln_reference::check_args(f, &refs).map_err(|e| Error(e.to_string()))?;
        let mut env: Vec<Option<Cow<'_, Literal>>> = vec![None; f.values.len()];
        // Take the pool and the arena (a concurrent call finds them empty and allocates its
        // own buffers).
        let mut reuse = std::mem::take(&mut *self.pool.lock().unwrap_or_else(|e| e.into_inner()));
        let mut arena = std::mem::take(&mut *self.arena.lock().unwrap_or_else(|e| e.into_inner()));
        let lines = self.memory.arena_bytes.div_ceil(64);
        if arena.len() < lines {
            arena = vec![Line([0; 64]); lines];
            if self.memory.arena_bytes >= HUGE_PAGE_BYTES {
                advise_huge_pages(arena.as_mut_ptr().cast(), self.memory.arena_bytes);
            }
        }
        let base: *mut u8 = arena.as_mut_ptr().cast();
        // The arena address of a value placed there.
        let in_arena = |v: ValueId| -> Option<*mut u8> {
            let s = self.memory.slots[v.index()].as_ref()?;
            // SAFETY: the plan keeps every slot inside the arena, which has arena_bytes.
            Some(unsafe { base.add(s.offset) })
        };
        for (&p, a) in f.params.iter().zip(args) {
            env[p.index()] = Some(a);
        }
        let mut times = self
            .profile
            .as_ref()
            .map(|_| vec![std::time::Duration::ZERO; f.insts.len()]);
        // The launches of the current group of kernels that run side by side.
        let mut pending: Vec<Pending> = Vec::new();
        for (i, inst) in f.insts.iter().enumerate() {
            let start = times.as_ref().map(|_| std::time::Instant::now());
            let outs = match (&self.steps[i], &inst.op) {
                (Step::Constant, Op::Constant { value }) => vec![Cow::Borrowed(value)],
                // An operand in the arena stays there: its results are its slot under other
                // names (the plan gives them that slot). Any other is moved when nothing reads
                // it after this step (an operand given twice is copied for the earlier
                // position).
                (Step::Forward, _) => {
                    for (k, (&o, &r)) in inst.operands.iter().zip(&inst.results).enumerate() {
                        if in_arena(o).is_some() {
                            continue;
                        }
                        let again = inst.operands[k + 1..].contains(&o);
                        let v = if self.last_read[o.index()] == i && !again {
                            env[o.index()].take()
                        } else {
                            env[o.index()].clone()
                        };
                        env[r.index()] = Some(v.expect("verified SSA"));
                    }
                    Vec::new()
                }
                (Step::Fused, _) => continue,
                (Step::Merged, _) => continue,
                (Step::Kernel, _) => {
                    let kernel = self.kernels[i].expect("a kernel for every Kernel step");
                    // What the kernel writes: its result, then the results of the instructions
                    // merged into it (multi-output fusion).
                    let results: Vec<ValueId> = std::iter::once(inst.results[0])
                        .chain(self.extra[i].iter().copied())
                        .collect();
                    // Each result's buffer: an arena slot, or a literal we hold.
                    let mut held: Vec<Option<Literal>> = vec![None; results.len()];
                    let mut at: Vec<Option<*mut u8>> = vec![None; results.len()];
                    for &(q, k) in &self.in_place[i] {
                        // The donated parameter's buffer becomes the result (a copy of it when
                        // the caller only lent it).
                        let v = self.operands[i][q];
                        let mut buf = env[v.index()].take().expect("verified SSA").into_owned();
                        at[k] = Some(buf.as_mut_ptr());
                        held[k] = Some(buf);
                    }
                    for (k, r) in results.iter().enumerate() {
                        if at[k].is_some() {
                            continue;
                        }
                        if let Some(p) = in_arena(*r) {
                            at[k] = Some(p);
                        } else if let Some(mut l) = reuse
                            .get_mut(r.index())
                            .and_then(Option::take)
                            .filter(|l| l.ty() == &f.values[r.index()])
                        {
                            at[k] = Some(l.as_mut_ptr());
                            held[k] = Some(l);
                        }
                    }
                    let mut ptrs: Vec<*const u8> = self.operands[i]
                        .iter()
                        .enumerate()
                        .map(|(j, &o)| {
                            if let Some(&(_, k)) = self.in_place[i].iter().find(|p| p.0 == j) {
                                at[k].expect("set above") as *const u8
                            } else {
                                match in_arena(o) {
                                    Some(p) => p as *const u8,
                                    None => env[o.index()].as_ref().expect("verified SSA").as_ptr(),
                                }
                            }
                        })
                        .collect();
                    let fresh: Vec<usize> =
                        (0..results.len()).filter(|&k| at[k].is_none()).collect();
                    let tys: Vec<TensorType> = fresh
                        .iter()
                        .map(|&k| f.values[results[k].index()].clone())
                        .collect();
                    // SAFETY: the pointers address live buffers of the types the kernel was
                    // compiled for (Program::new's contract); arena slots overlap no live value
                    // (in particular no input of this kernel); held and fresh buffers are ours
                    // alone; an in-place kernel reads its donated operand only through its
                    // output; and the kernel writes every element of every result, so fresh
                    // buffers need no zeroing.
                    let made = unsafe {
                        with_uninit(&tys, &mut Vec::new(), &mut |fresh_at| {
                            for (n, &k) in fresh.iter().enumerate() {
                                at[k] = Some(fresh_at[n]);
                            }
                            ptrs.extend(
                                at[1..]
                                    .iter()
                                    .map(|p| p.expect("every result placed") as *const u8),
                            );
                            let out = at[0].expect("every result placed");
                            if self.groups[i].is_some() {
                                pending.push(Pending {
                                    kernel,
                                    inputs: std::mem::take(&mut ptrs),
                                    out,
                                    launch: self.launch[i],
                                });
                            } else {
                                launch(kernel, &ptrs, out, self.launch[i]);
                            }
                        })
                    };
                    if self.groups[i] == Some(i) {
                        // SAFETY: as for `launch` above, for each of the group's kernels: their
                        // buffers stay alive (in `env`, the arena or the arguments) to the end
                        // of the call, none of them reads or writes what another writes
                        // (`concurrent_groups`), and nothing reads their results before now.
                        unsafe { launch_all(std::mem::take(&mut pending)) };
                    }
                    for (l, &k) in made.into_iter().zip(&fresh) {
                        held[k] = Some(l);
                    }
                    // Results in the arena have no env entry: readers find them there.
                    for (r, h) in results.iter().zip(held) {
                        if let Some(l) = h {
                            env[r.index()] = Some(Cow::Owned(l));
                        }
                    }
                    Vec::new()
                }
                (Step::Control, _) => {
                    let xs: Vec<&Literal> = inst
                        .operands
                        .iter()
                        .map(|o| env[o.index()].as_deref().expect("verified SSA"))
                        .collect();
                    self.control(i, &xs)?.into_iter().map(Cow::Owned).collect()
                }
                (Step::Host, _) => {
                    let xs: Vec<&Literal> = inst
                        .operands
                        .iter()
                        .map(|o| env[o.index()].as_deref().expect("verified SSA"))
                        .collect();
                    let tys: Vec<TensorType> = inst
                        .results
                        .iter()
                        .map(|r| f.values[r.index()].clone())
                        .collect();
                    collective::host_step(&inst.op, &xs, &tys)
                        .map_err(|e| Error(format!("#{i} {e}")))?
                        .into_iter()
                        .map(Cow::Owned)
                        .collect()
                }
                _ => {
                    let xs: Vec<&Literal> = inst
                        .operands
                        .iter()
                        .map(|o| env[o.index()].as_deref().expect("verified SSA"))
                        .collect();
                    let tys: Vec<TensorType> = inst
                        .results
                        .iter()
                        .map(|r| f.values[r.index()].clone())
                        .collect();
                    kiln_reference::eval_op(&inst.op, &xs, &tys)
                        .into_iter()
                        .map(Cow::Owned)
                        .collect()
                }
            };
            for (&r, v) in inst.results.iter().zip(outs) {
                env[r.index()] = Some(v);
            }
            if let (Some(t), Some(s)) = (times.as_mut(), start) {
                t[i] += s.elapsed();
            }
        }
        if let (Some(p), Some(t)) = (&self.profile, times) {
            let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
            p.0 += 1;
            for (acc, x) in p.1.iter_mut().zip(t) {
                *acc += x;
            }
            // Programs often live until the process exits (compile caches hold them): report
            // after 4, 16, 64, ... calls too.
            if p.0 >= 4 && p.0.is_power_of_two() && p.0.trailing_zeros() % 2 == 0 {
                eprint!("{}", self.profile_report(p.0, &p.1));
            }
        }
        // Results move out, except a value returned twice (copied for the earlier position).
        let mut outputs: Vec<Literal> = Vec::with_capacity(f.outputs.len());
        for (pos, o) in f.outputs.iter().enumerate() {
            let again = f.outputs[pos + 1..].contains(o);
            let v = if again {
                env[o.index()].as_deref().expect("verified SSA").clone()
            } else {
                env[o.index()].take().expect("verified SSA").into_owned()
            };
            outputs.push(v);
        }
        // Keep the intermediates written by kernels for the next call.
        let mut keep: Vec<Option<Literal>> = vec![None; f.values.len()];
        let mut kernel_result = vec![false; f.values.len()];
        for (i, inst) in f.insts.iter().enumerate() {
            if self.steps[i] != Step::Kernel {
                continue;
            }
            for r in std::iter::once(&inst.results[0]).chain(&self.extra[i]) {
                kernel_result[r.index()] = true;
                if let Some(Cow::Owned(l)) = env[r.index()].take() {
                    keep[r.index()] = Some(l);
                }
            }
        }
        // A kernel's result moved on by an `optimization_barrier` comes back the same way
        // (latest barrier first, so a chain of them ends at the kernel); anything else passed
        // on (a donated argument) is dropped, not kept.
        for (i, inst) in f.insts.iter().enumerate().rev() {
            if self.steps[i] != Step::Forward {
                continue;
            }
            for (o, r) in inst.operands.iter().zip(&inst.results) {
                if keep[o.index()].is_none() {
                    keep[o.index()] = match env[r.index()].take() {
                        Some(Cow::Owned(l)) => Some(l),
                        _ => keep[r.index()].take(),
                    };
                }
            }
        }
        for (k, is_result) in keep.iter_mut().zip(&kernel_result) {
            if !is_result {
                *k = None;
            }
        }
        *self.pool.lock().unwrap_or_else(|e| e.into_inner()) = keep;
        *self.arena.lock().unwrap_or_else(|e| e.into_inner()) = arena;
        Ok(outputs)
    }
}

/// Allocates literals of `tys` without zeroing them, calls `init` with their buffers (after
/// those already in `at`), and returns them.
///
/// # Safety
///
/// `init` must write every element of every buffer with a valid value of its dtype.
unsafe fn with_uninit(
    tys: &[TensorType],
    at: &mut Vec<*mut u8>,
    init: &mut dyn FnMut(&[*mut u8]),
) -> Vec<Literal> {
    let Some((t, rest)) = tys.split_first() else {
        init(at);
        return Vec::new();
    };
    let mut tail = Vec::new();
    let bytes = t.numel() * t.dtype.bytes();
    // SAFETY: the caller's contract, passed on.
    let l = unsafe {
        Literal::new_uninit(t.clone(), |p| {
            if bytes >= HUGE_PAGE_BYTES {
                advise_huge_pages(p, bytes);
            }
            at.push(p);
            tail = with_uninit(rest, at, init);
        })
    };
    let mut all = vec![l];
    all.extend(tail);
    all
}

/// Buffers at least this large are backed by transparent huge pages where the system offers
/// them on request: large fresh buffers are faulted in on first touch, one 4 KiB page at a
/// time, which costs more than writing them; huge pages (2 MiB) cut the faults 512-fold.
const HUGE_PAGE_BYTES: usize = 4 << 20;

#[cfg(target_os = "linux")]
fn advise_huge_pages(p: *mut u8, bytes: usize) {
    const MADV_HUGEPAGE: i32 = 14;
    const HUGE: usize = 2 << 20;
    unsafe extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    // The whole huge pages inside the buffer.
    let start = (p as usize).div_ceil(HUGE) * HUGE;
    let end = (p as usize + bytes) / HUGE * HUGE;
    if end > start {
        // SAFETY: the range lies inside a live allocation we own; MADV_HUGEPAGE is advice
        // about how to back it and leaves its contents unchanged. Failure (no THP) is harmless.
        unsafe { madvise(start as *mut std::ffi::c_void, end - start, MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: *mut u8, _: usize) {}

/// A kernel launch waiting for the rest of its group ([`concurrent_groups`]).
struct Pending {
    kernel: KernelFn,
    inputs: Vec<*const u8>,
    out: *mut u8,
    launch: Launch,
}

// SAFETY: a pending launch's buffers are read (inputs) or written (outputs) by its kernel
// alone while its group runs (`concurrent_groups`), and outlive the scope it runs in.
unsafe impl Send for Pending {}
// SAFETY: running a pending launch only reads its fields; the team runs each launch of a group
// on one thread (`launch_all`), and the buffers are as above.
unsafe impl Sync for Pending {}

impl Pending {
    /// # Safety
    ///
    /// [`launch`]'s contract.
    unsafe fn run(&self) {
        // SAFETY: the caller's contract.
        unsafe { launch(self.kernel, &self.inputs, self.out, self.launch) }
    }
}

/// Runs the launches `all` side by side on the thread pool, a task each.
///
/// # Safety
///
/// Each launch must satisfy [`launch`]'s contract, and none may read or write a buffer another
/// one writes.
unsafe fn launch_all(all: Vec<Pending>) {
    if rayon::current_num_threads() < 2 {
        for p in &all {
            // SAFETY: the caller's contract.
            unsafe { p.run() };
        }
        return;
    }
    // SAFETY: the caller's contract, for each launch run once.
    if kiln_team::run(all.len(), &|i| unsafe { all[i].run() }) {
        return;
    }
    rayon::scope(|s| {
        for p in all {
            // SAFETY: the caller's contract.
            s.spawn(move |_| unsafe { p.run() });
        }
    });
}

/// Per step of a program, for the kernels that run side by side, their group's last step.
///
/// A group is a run of kernel steps, with only constants and steps that run nothing
/// (`Step::Fused`, `Step::Merged`) between them, each of which runs on one thread with enough
/// work to run beside others ([`Launch::beside`]) and writes no donated buffer,
/// and none of which reads what another writes or writes an arena block another reads or
/// writes (the memory plan reuses blocks in program order, so a later kernel's output may lie
/// where an earlier one's input did).
fn concurrent_groups(
    func: &Func,
    steps: &[Step],
    launch: &[Launch],
    operands: &[Vec<ValueId>],
    in_place: &[Vec<(usize, usize)>],
    extra: &[Vec<ValueId>],
    memory: &MemoryPlan,
) -> Vec<Option<usize>> {
    let n = steps.len();
    let eligible = |i: usize| {
        steps[i] == Step::Kernel && in_place[i].is_empty() && !launch[i].split && launch[i].beside
    };
    let writes = |i: usize| -> Vec<ValueId> {
        std::iter::once(func.insts[i].results[0])
            .chain(extra[i].iter().copied())
            .collect()
    };
    let block = |v: &ValueId| {
        memory.slots[v.index()]
            .as_ref()
            .map(|s| (s.offset, s.offset + s.bytes))
    };
    // Whether step `b` neither reads nor writes anything step `a` writes, value or arena block.
    let apart = |a: usize, b: usize| {
        let wa = writes(a);
        operands[b].iter().chain(&writes(b)).all(|v| {
            !wa.contains(v)
                && wa.iter().all(|w| match (block(w), block(v)) {
                    (Some((s, e)), Some((s2, e2))) => e <= s2 || e2 <= s,
                    _ => true,
                })
        })
    };
    let mut groups = vec![None; n];
    let mut i = 0;
    while i < n {
        if !eligible(i) {
            i += 1;
            continue;
        }
        let mut members = vec![i];
        for (j, step) in steps.iter().enumerate().skip(i + 1) {
            match step {
                Step::Fused | Step::Merged | Step::Constant => {}
                Step::Kernel
                    if eligible(j) && members.iter().all(|&m| apart(m, j) && apart(j, m)) =>
                {
                    members.push(j)
                }
                _ => break,
            }
        }
        let last = *members.last().expect("one member");
        if members.len() > 1 {
            for &m in &members {
                groups[m] = Some(last);
            }
        }
        i = last + 1;
    }
    groups
}

/// Pointers handed to kernels running on other threads.
#[derive(Clone, Copy)]
struct Buffers(*const *const u8, *mut u8);

// SAFETY: the input buffers are only read, and each thread writes a disjoint range of rows of
// the output (and of a multi-output kernel's extra outputs, which have the output's shape); all
// of them outlive the scope the threads run in.
unsafe impl Send for Buffers {}
unsafe impl Sync for Buffers {}

/// A 64-byte aligned block of scratch memory.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

thread_local! {
    /// Each thread's kernel scratch memory, grown to the largest request and kept.
    static SCRATCH: std::cell::RefCell<Vec<Line>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Calls `kernel` on all its rows, split across threads where `l` says so ([`Launch::split`]),
/// in at most `l.chunks_per_thread` chunks per thread of the pool.
///
/// # Safety
///
/// `inputs` and `out` must address live buffers of the types `kernel` was compiled for, `out`
/// must not be read or written by anyone else during the call, and `kernel` must write only
/// rows `lo..hi` of `out` when called on them and use at most `l.scratch` bytes of scratch.
pub unsafe fn launch(kernel: KernelFn, inputs: &[*const u8], out: *mut u8, l: Launch) {
    let bufs = Buffers(inputs.as_ptr(), out);
    // Asked only of split kernels: a program that splits none starts no team.
    let threads = if l.split {
        kiln_team::threads().unwrap_or_else(rayon::current_num_threads)
    } else {
        1
    };
    let call = |lo: usize, hi: usize| {
        let b = bufs;
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            let lines = l.scratch.div_ceil(64);
            if s.len() < lines {
                s.resize(lines, Line([0; 64]));
            }
            // SAFETY: the caller's contract; rows lo..hi are this call's alone, and the
            // scratch memory is this thread's and as large as the kernel asked for.
            unsafe { kernel(b.0, b.1, lo as i64, hi as i64, s.as_mut_ptr().cast()) };
        })
    };
    if threads < 2 {
        call(0, l.rows);
        return;
    }
    let chunks = l.rows.min(threads * l.chunks_per_thread.max(1));
    let chunk = |c: usize| call(l.rows * c / chunks, l.rows * (c + 1) / chunks);
    if kiln_team::run(chunks, &chunk) {
        return;
    }
    rayon::scope(|s| {
        for c in 0..chunks {
            s.spawn(move |_| chunk(c));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// out[i] = 2 * in[i] over rows lo..hi of an f32 vector, using scratch as a staging area.
    unsafe extern "C" fn double(ins: *const *const u8, out: *mut u8, lo: i64, hi: i64, s: *mut u8) {
        // SAFETY: the test hands one f32 input and an f32 output of the launched length.
        unsafe {
            let x = *ins as *const f32;
            let y = out as *mut f32;
            assert_eq!(s as usize % 64, 0, "scratch is 64-byte aligned");
            for i in lo..hi {
                *(s as *mut f32) = *x.add(i as usize) * 2.0;
                *y.add(i as usize) = *(s as *const f32);
            }
        }
    }

    /// A chain of four doublings returning only the last: the intermediates live in the
    /// arena, the third reuses the first's block, and results are right on every call.
    #[test]
    fn intermediates_share_the_arena_by_liveness() {
        let n = 1000;
        let p = doubling_chain(
            n,
            &format!(
                "func @main(%0: f32[{n}]) -> f32[{n}] {{\n  %1 = add %0, %0 : f32[{n}]\n  %2 = add %1, %1 : f32[{n}]\n  %3 = add %2, %2 : f32[{n}]\n  %4 = add %3, %3 : f32[{n}]\n  return %4\n}}\n"
            ),
        );
        let m = p.memory_plan();
        let block = (n * 4).div_ceil(plan::ALIGN) * plan::ALIGN;
        assert_eq!(m.arena_bytes, 2 * block, "{m}");
        assert_eq!(m.unplanned_bytes, 3 * n * 4);
        assert_eq!(m.other_bytes, n * 4, "the output is outside the arena");
        let s1 = m.slots[1].as_ref().unwrap();
        let s3 = m.slots[3].as_ref().unwrap();
        assert_eq!(s1.offset, s3.offset, "%3 reuses %1's block:\n{m}");
        assert_ne!(m.slots[2].as_ref().unwrap().offset, s1.offset);
        let x = Literal::f32([n], (0..n).map(|i| i as f32).collect()).unwrap();
        for _ in 0..3 {
            let y = p.run(std::slice::from_ref(&x)).unwrap();
            let want: Vec<f32> = (0..n).map(|i| 16.0 * i as f32).collect();
            assert_eq!(y[0].as_f32s().unwrap(), &want[..]);
        }
    }

    /// A kernel's result passed on by an `optimization_barrier` stays in its arena slot under
    /// the barrier's name, lives until its last reader under either name, and its block is
    /// reused after that; results are right on every call.
    #[test]
    fn a_value_passed_on_keeps_its_arena_slot() {
        let n = 1000;
        let t = format!("f32[{n}]");
        let p = doubling_chain(
            n,
            &format!(
                "func @main(%0: {t}) -> {t} {{\n  %1 = add %0, %0 : {t}\n  %2 = optimization_barrier %1 : {t}\n  %3 = add %2, %2 : {t}\n  %4 = add %3, %3 : {t}\n  %5 = add %4, %4 : {t}\n  return %5\n}}\n"
            ),
        );
        let m = p.memory_plan();
        let block = (n * 4).div_ceil(plan::ALIGN) * plan::ALIGN;
        assert_eq!(m.arena_bytes, 2 * block, "{m}");
        assert_eq!(
            m.other_bytes,
            n * 4,
            "only the output is outside the arena:\n{m}"
        );
        let (s1, s2) = (m.slots[1].as_ref().unwrap(), m.slots[2].as_ref().unwrap());
        assert_eq!(s1, s2, "%2 is %1's slot:\n{m}");
        assert_eq!(s1.last, 2, "read last as %2 by step 2:\n{m}");
        assert_eq!(
            m.slots[4].as_ref().unwrap().offset,
            s1.offset,
            "%4 reuses it:\n{m}"
        );
        let x = Literal::f32([n], (0..n).map(|i| i as f32).collect()).unwrap();
        for _ in 0..3 {
            let y = p.run(std::slice::from_ref(&x)).unwrap();
            let want: Vec<f32> = (0..n).map(|i| 16.0 * i as f32).collect();
            assert_eq!(y[0].as_f32s().unwrap(), &want[..]);
        }
    }

    /// Independent one-thread kernels run side by side, and right: two doublings of
    /// different arguments form a group; a kernel that reads another's result, or whose output
    /// takes the arena block of an input another reads, does not join it.
    #[test]
    fn independent_kernels_run_side_by_side() {
        let n = kiln_kernel::TargetInfo::reference().splits.concurrent_work + 100;
        let f32n = format!("f32[{n}]");
        let p = doubling_chain(
            n,
            &format!(
                "func @main(%0: {f32n}, %1: {f32n}) -> ({f32n}, {f32n}) {{\n  %2 = add %0, %0 : {f32n}\n  %3 = add %1, %1 : {f32n}\n  return %2, %3\n}}\n"
            ),
        );
        assert_eq!(p.concurrent_steps(), vec![vec![0, 1]]);
        let x = Literal::f32([n], (0..n).map(|i| i as f32).collect()).unwrap();
        let y = Literal::f32([n], (0..n).map(|i| -(i as f32)).collect()).unwrap();
        for _ in 0..3 {
            let out = p.run(&[x.clone(), y.clone()]).unwrap();
            let want: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
            assert_eq!(out[0].as_f32s().unwrap(), &want[..]);
            let want: Vec<f32> = want.iter().map(|v| -v).collect();
            assert_eq!(out[1].as_f32s().unwrap(), &want[..]);
        }
        // %2 reads %1, and %3 (independent of %2) may take %1's block once %2 has read it.
        let p = doubling_chain(
            n,
            &format!(
                "func @main(%0: {f32n}) -> {f32n} {{\n  %1 = add %0, %0 : {f32n}\n  %2 = add %1, %1 : {f32n}\n  %3 = add %0, %0 : {f32n}\n  %4 = add %2, %3 : {f32n}\n  return %4\n}}\n"
            ),
        );
        let m = p.memory_plan();
        let s1 = m.slots[1].as_ref().unwrap();
        let s3 = m.slots[3].as_ref().unwrap();
        assert_eq!(s1.offset, s3.offset, "%3 reuses %1's block:\n{m}");
        assert!(
            p.concurrent_steps()
                .iter()
                .all(|g| !(g.contains(&1) && g.contains(&2))),
            "{:?}",
            p.concurrent_steps()
        );
        let x = Literal::f32([n], (0..n).map(|i| i as f32).collect()).unwrap();
        let out = p.run(std::slice::from_ref(&x)).unwrap();
        let want: Vec<f32> = (0..n).map(|i| 8.0 * i as f32).collect();
        assert_eq!(out[0].as_f32s().unwrap(), &want[..]);
    }

    /// A program of `add x, x` instructions (`src`, over f32 vectors of `n` elements), each a
    /// `double` kernel.
    fn doubling_chain(n: usize, src: &str) -> Program {
        let f = kiln_ir::parse_func_text(src).unwrap();
        // `optimization_barrier`s pass their operands on; the rest are doublings.
        let steps: Vec<Step> = f
            .insts
            .iter()
            .map(|i| match i.op {
                Op::OptimizationBarrier {} => Step::Forward,
                _ => Step::Kernel,
            })
            .collect();
        let kernels = steps
            .iter()
            .map(|s| (*s == Step::Kernel).then_some(double as KernelFn))
            .collect();
        let l = Launch::new(n, n, 4, 4, &kiln_kernel::TargetInfo::reference());
        let k = f.insts.len();
        let operands = f.insts.iter().map(|i| i.operands[..1].to_vec()).collect();
        // SAFETY: `double` computes `add x, x` for f32 vectors of n elements, row by row.
        unsafe {
            Program::new(
                f,
                steps,
                kernels,
                vec![l; k],
                operands,
                vec![Vec::new(); k],
                vec![Vec::new(); k],
                &kiln_kernel::Options::default(),
            )
        }
    }

    /// A donated argument's buffer becomes the result of the kernel compiled in place on it; a
    /// lent one is copied first and left as it was.
    #[test]
    fn in_place_kernels_write_into_donated_arguments() {
        let n = 1 << 17;
        let f = kiln_ir::parse_func_text(&format!(
            "func @main(%0: f32[{n}]) -> f32[{n}] {{\n  %1 = add %0, %0 : f32[{n}]\n  return %1\n}}\n"
        ))
        .unwrap();
        let l = Launch::new(n, n, 4, 4, &kiln_kernel::TargetInfo::reference());
        // SAFETY: `double` reads each element before writing it, at the same position.
        let p = unsafe {
            Program::new(
                f,
                vec![Step::Kernel],
                vec![Some(double)],
                vec![l],
                vec![vec![ValueId(0)]],
                vec![vec![(0, 0)]],
                vec![Vec::new()],
                &kiln_kernel::Options::default(),
            )
        };
        assert_eq!(p.memory_plan().in_place_bytes, 4 * n);
        let x = Literal::f32([n], (0..n).map(|i| i as f32).collect()).unwrap();
        let want: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
        let lent = p.call(&[&x]).unwrap();
        assert_eq!(lent[0].as_f32s().unwrap(), &want[..]);
        assert_eq!(
            x.as_f32s().unwrap()[5],
            5.0,
            "a lent argument is not written"
        );
        let mut owned = x.clone();
        let addr = owned.as_mut_ptr();
        let y = p.call_donating(vec![Cow::Owned(owned)]).unwrap();
        assert_eq!(y[0].as_f32s().unwrap(), &want[..]);
        let mut y = y;
        assert_eq!(
            y[0].as_mut_ptr(),
            addr,
            "the result lives in the donated buffer"
        );
    }

    fn doubling_program(n: usize) -> Program {
        doubling_chain(
            n,
            &format!(
                "func @main(%0: f32[{n}]) -> (f32[{n}], f32[{n}]) {{\n  %1 = add %0, %0 : f32[{n}]\n  %2 = add %1, %1 : f32[{n}]\n  return %2, %1\n}}\n"
            ),
        )
    }

    #[test]
    fn programs_run_kernels_in_order_on_every_thread_count_and_concurrently() {
        // Small (one thread) and large (split across threads) kernels.
        for n in [3, 200_000] {
            let p = doubling_program(n);
            let x = Literal::f32([n], (0..n).map(|i| i as f32).collect()).unwrap();
            let want2: Vec<f32> = (0..n).map(|i| 4.0 * i as f32).collect();
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        for _ in 0..3 {
                            let out = p.run(std::slice::from_ref(&x)).unwrap();
                            assert_eq!(out[0].as_f32s().unwrap(), want2.as_slice());
                            assert_eq!(out[1].as_f32s().unwrap()[n - 1], 2.0 * (n - 1) as f32);
                        }
                    });
                }
            });
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let p = doubling_program(3);
        let e = p.run(&[]).unwrap_err();
        assert!(e.to_string().contains("argument"), "{e}");
        let wrong = Literal::f32([2], vec![1.0, 2.0]).unwrap();
        assert!(p.run(&[wrong]).is_err());
    }
}

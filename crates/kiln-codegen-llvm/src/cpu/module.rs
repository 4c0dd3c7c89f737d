//! Modules of kernels, their printed forms (LLVM IR, the fusion dump, the memory plan),
//! and compiling them through the kernel cache: jobs, GEMM routines, weights.

use super::*;

pub(super) use kiln_runtime::kernel_program::{Alias, first_equal};

/// The module of `f`'s kernels; `target.host` adds this machine's CPU and features to every
/// function (needed to run them well, left out of machine-independent dumps). `aliases[i]` (if
/// present) is kernel `i`'s in-place alias (see [`emit_kernel`]); `schedules[i]`, its loop
/// schedule.
pub(super) fn build_module<'c>(
    ctx: &'c Context,
    f: &Func,
    ks: &[Option<Kernel>],
    schedules: &[Option<KernelSchedule>],
    target: Target,
    aliases: &[Alias],
    routines: Routines,
) -> Result<Module<'c>> {
    let m = ctx.create_module(&f.name);
    // SAFETY: `m` outlives the emitters, which only borrow it for the calls below.
    let mref: &'c Module<'c> = unsafe { &*(&m as *const Module<'c>) };
    let groups = contraction_groups(ks, aliases, &target.info());
    let mut shared = std::collections::BTreeMap::new();
    for (i, k) in ks.iter().enumerate() {
        let Some(k) = k else { continue };
        let Some(g) = groups[i] else {
            emit_kernel(
                ctx,
                mref,
                &format!("k{i}"),
                k,
                schedules.get(i).and_then(Option::as_ref),
                target,
                aliases.get(i),
                routines,
                false,
            )?;
            continue;
        };
        if g == i {
            let body = emit_kernel(
                ctx,
                mref,
                &format!("k{i}.shared"),
                k,
                schedules.get(i).and_then(Option::as_ref),
                target,
                aliases.get(i),
                routines,
                true,
            )?;
            shared.insert(i, body);
        }
        let Schedule::Gemm { k: kk, .. } = k.schedule else {
            unreachable!("only matrix products share a function")
        };
        emit_contraction_wrapper(ctx, mref, &format!("k{i}"), shared[&g], kk, target)?;
    }
    m.verify()
        .map_err(|e| Error::Llvm(format!("invalid module for @{}: {e}", f.name)))?;
    Ok(m)
}

/// For each of the kernels `ks` (compiled with in-place outputs `aliases`), the index of the
/// first kernel equal to it (the same body over the same types, the same in-place outputs),
/// and the kernels to compile: those that are their own first. The others run through the
/// first one's function (Winograd's 36 products, for one).
pub(super) fn distinct_kernels(
    ks: &[Option<Kernel>],
    aliases: &[Alias],
) -> (Vec<usize>, Vec<Option<Kernel>>) {
    let t = kiln_runtime::kernel_program::KernelTable::of(ks, aliases.to_vec());
    (t.first, t.own)
}

/// The LLVM IR of every kernel of `f`, before (`optimized = false`) or after optimization for
/// this CPU, module by module as the kernel cache compiles them (with the GEMM routines they
/// call): a kernel equal to an earlier one is compiled once (`distinct_kernels`) and printed
/// once.
pub fn function_llvm_ir(f: &Func, optimized: bool, opts: &Options) -> Result<String> {
    let (f, fused) = lowered_for_printing(f, opts)?;
    let (_, kernels) = distinct_kernels(&fused.kernels, &[]);
    if !optimized {
        let target = Target::any(opts);
        let schedules = loop_schedules(&fused, opts, &target.info());
        let ctx = Context::create();
        let m = build_module(&ctx, &f, &kernels, &schedules, target, &[], Routines::Here)?;
        return Ok(m.print_to_string().to_string());
    }
    // Optimized as the kernel cache compiles them: the same modules, each with its pipeline.
    let tm = crate::host_machine()?;
    let schedules = loop_schedules(&fused, opts, &Target::host(opts).info());
    let mut text = String::new();
    let mut jobs = kernel_jobs(&kernels, &[], Target::host(opts));
    jobs.extend(
        planned_routines(&kernels, Target::host(opts))
            .into_iter()
            .map(Job::Routine),
    );
    for job in &jobs {
        let ctx = Context::create();
        let (m, _) = job.module(&ctx, &f, &schedules, &[], Target::host(opts))?;
        crate::optimize_as(&m, &tm, job.pipeline())?;
        text.push_str(&m.print_to_string().to_string());
    }
    Ok(text)
}

/// The fused kernels of `f` as the CPU backend builds them (after the optimizer and the
/// canonicalizing rewrites), as text: each kernel with its member instructions and inputs, and
/// for every instruction the reason it has a kernel of its own or runs inside its users (and,
/// for a sort whose users read only a prefix, that it runs as a top-k).
///
/// This is the machine-independent lowering (the reference CPU's fusion, blocks and schedules,
/// so the text is the same everywhere, as the snapshots need); what a compile for this machine
/// decided is [`describe_lowered`]'s (`KILN_EXPLAIN=1` prints that).
pub fn describe_fusion(f: &Func, opts: &Options) -> Result<String> {
    let (g, fused) = lowered_for_printing(f, opts)?;
    let target = Target::any(opts);
    let schedules = loop_schedules(&fused, opts, &target.info());
    Ok(describe_fused(&g, &fused, &schedules, target))
}

/// The fused kernels of a program lowered for this machine under `opts` (by
/// [`kiln_kernel::pipeline::lower_program`] with [`cpu_target_info`]`(opts)`, as
/// [`CpuExecutable::compile_with_options`] lowers it; `l` must be lowered so), as
/// [`describe_fusion`] prints them, with the fusion, blocks, loop schedules and thread splits
/// decided for this machine's vectors, caches and threads: what that compile runs, headed by
/// [`kiln_kernel::print::target_header`] (naming the CPU of [`Options::cpu`]'s `machine` when
/// the code is for another one).
pub fn describe_lowered(l: &Lowered, opts: &Options) -> String {
    let target = Target::host(opts);
    kiln_kernel::print::target_header(&target.info(), &machine_words(opts))
        + &describe_fused(&l.func, &l.fused, &l.schedules, target)
}

/// `f`'s fused kernels as a compile for this machine under `opts` decides them
/// ([`describe_lowered`] of `f` lowered for it): what `KILN_EXPLAIN=1` prints when `f` is
/// compiled, without compiling it (`kiln dump --stage fused --host`).
pub fn describe_host_fusion(f: &Func, opts: &Options) -> Result<String> {
    let info = cpu_target_info(opts);
    let l = kiln_kernel::pipeline::lower_program(f, &[], opts, &info, None, &mut |_| {})?;
    Ok(describe_lowered(&l, opts))
}

/// `f`'s kernels ([`kiln_kernel::print::describe_kernels`]) as a compile for this machine under
/// `opts` decides them (`kiln dump --stage kernels --host`).
pub fn describe_host_kernels(f: &Func, opts: &Options) -> Result<String> {
    let info = cpu_target_info(opts);
    let machine = machine_words(opts);
    Ok(kiln_kernel::print::describe_kernels_on(
        f, opts, &info, &machine,
    )?)
}

/// "this machine", or the CPU `opts` compiles for ahead of time.
fn machine_words(opts: &Options) -> String {
    match opts.cpu.machine {
        Some(m) => format!("the CPU {}", m.name),
        None => "this machine".to_string(),
    }
}

/// [`describe_fusion`]'s text for the fused program `g` with its loop `schedules` on `target`.
fn describe_fused(
    g: &Func,
    fused: &kiln_kernel::fuse::Fused,
    schedules: &[Option<KernelSchedule>],
    target: Target,
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "{g}");
    let count = fused.kernels.iter().filter(|k| k.is_some()).count();
    let _ = writeln!(s, "// {count} kernels");
    for (i, inst) in g.insts.iter().enumerate() {
        let ty = &g.values[inst.results[0].index()];
        if let Some(k) = &fused.kernels[i] {
            let (members, reads, also) = kiln_kernel::print::kernel_members_and_reads(g, fused, i);
            let launch = launch_of(k, schedules[i].as_ref(), target);
            let _ = writeln!(
                s,
                "kernel k{i}: {} -> {ty}{also}; members [{members}]; reads [{reads}]; rows {}, work {}{}",
                inst.op.mnemonic(),
                launch.rows,
                launch.work,
                match schedules[i].as_ref().and_then(|s| s.tile) {
                    Some(Tile { dim, edge }) => format!(
                        "; in {edge} x {edge} tiles of dimensions {dim} and {}",
                        k.out.rank() - 1
                    ),
                    None => String::new(),
                },
            );
            // The loops and blocks decided for the target, and how the threads share them.
            if let Some(sched) = schedules[i].as_ref() {
                let _ = writeln!(s, "  loops: {sched}");
            }
            if let (
                Schedule::Gemm { chain: Some(c), .. },
                Some(GemmSchedule { blocking: bl, .. }),
            ) = (&k.schedule, gemm_of(k, schedules[i].as_ref(), target))
            {
                let _ = writeln!(
                    s,
                    "  chained: the epilogue's {} is never stored; each block of {} rows is \
                     multiplied by {} ({} columns) as soon as it is done",
                    k.out,
                    bl.rows_per_block(),
                    fused.operands[i][c.b],
                    c.n
                );
                if c.online.is_some() {
                    let _ = writeln!(
                        s,
                        "  online: the softmax runs over blocks of {} columns, from each row's \
                         running maximum and sum",
                        bl.columns_per_block()
                    );
                }
                if let Some((a, b, c)) = c.masked {
                    let _ = writeln!(
                        s,
                        "  masked: blocks where column * {a} + row * {b} + {c} > 0 throughout \
                         are skipped"
                    );
                }
            }
            // (An online softmax does not run the body as it stands.)
            let online =
                matches!(&k.schedule, Schedule::Gemm { chain: Some(c), .. } if c.online.is_some());
            for note in row_cache_notes(k, schedules[i].as_ref())
                .into_iter()
                .filter(|_| !online)
            {
                let _ = writeln!(s, "  {note}");
            }
        }
    }
    for (i, inst) in g.insts.iter().enumerate() {
        let _ = writeln!(
            s,
            "#{i} {} = {}: {}",
            inst.results[0],
            inst.op.mnemonic(),
            fused.decisions[i]
        );
        // How a sort runs when its users read only a prefix (the runtime's top-k).
        if let Some(t) = kiln_kernel::sort::top_k(g, i) {
            let _ = writeln!(s, "  {t}");
        }
    }
    s
}

/// The kernel cache's key of the library of `f`'s kernels `ks` with in-place outputs `aliases`
/// (see [`kiln_runtime::kernel_program::KernelTable::source_text`]).
pub(super) fn library_key(
    f: &Func,
    ks: &[Option<Kernel>],
    aliases: &[Alias],
    opts: &Options,
) -> String {
    crate::cache::key(
        &format!("{f}\n{ks:?}\n{aliases:?}"),
        &lowering::machine_settings(opts),
    )
}

/// The kernels `ks` of `f` as a shared library: from the cache when an intact one is stored
/// under their key (`true`), else compiled at O2 to objects, linked and stored (`false`).
///
/// A miss compiles the kernels on all cores: each GEMM kernel in a module of its own, the
/// others together, each module optimized and turned into an object in its own LLVM context
/// by whichever thread is free, and the objects are linked into one library.
#[allow(clippy::too_many_arguments)]
pub(super) fn compile_cached(
    f: &Func,
    ks: &[Option<Kernel>],
    schedules: &[Option<KernelSchedule>],
    aliases: &[Alias],
    dir: &std::path::Path,
    names: &[String],
    opts: &Options,
) -> Result<(crate::cache::Library, bool)> {
    let target = Target::host(opts);
    use inkwell::targets::FileType;
    // The key: what the modules are built from (the function, its kernels and the in-place
    // outputs), the settings that change how they are emitted and optimized, the CPU and
    // this crate's sources. Building and printing the LLVM IR to hash it instead took about
    // 40 ms of the MLP step's 60 ms compile with the cache warm.
    let machine = lowering::machine_settings(opts);
    let key = library_key(f, ks, aliases, opts);
    if let Some(lib) = crate::cache::load(dir, &key, names) {
        return Ok((lib, true));
    }
    crate::aot_machine(opts.cpu.machine)?; // initializes LLVM's native target once, before the threads
    let mut jobs = kernel_jobs(ks, aliases, target);
    // The GEMM routines (register tiles, packing) the kernels call, each compiled once in a
    // module of its own, or loaded as an object from the cache: they depend on the tile and
    // the machine, not on the function, so every function with the same tiles shares them.
    let planned = planned_routines(ks, target);
    let routine_key =
        |r: &gemm::Routine| crate::cache::key(&format!("routine {}", r.name()), &machine);
    let mut routine_objects = Vec::new();
    for r in &planned {
        match crate::cache::load_object(dir, &routine_key(r)) {
            Some(o) => routine_objects.push(o),
            None => jobs.push(Job::Routine(*r)),
        }
    }
    // Longest first (a stable sort: equal weights keep their order).
    jobs.sort_by_key(|j| std::cmp::Reverse(j.weight()));
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    // Per-module lines, for functions only: eager ops are tallied (see `compile_times`).
    let times = opts.compile_times && compile_times::prints_phases(&f.name);
    let t_begin = std::time::Instant::now();
    let compile = |job: &Job, tm: &inkwell::targets::TargetMachine| -> Result<Vec<u8>> {
        let start = std::time::Instant::now();
        let cpu_start = compile_times::thread_cpu();
        let ctx = Context::create();
        let (m, what) = job.module(&ctx, f, schedules, aliases, target)?;
        // The routines the kernels declare must be among those compiled for the library.
        for g in m.get_functions() {
            let name = g.get_name().to_string_lossy();
            if g.count_basic_blocks() == 0
                && name.starts_with(gemm::ROUTINE_PREFIX)
                && !planned.iter().any(|r| r.name() == name)
            {
                return Err(Error::Llvm(format!(
                    "@{}: GEMM routine {name} called but not planned",
                    f.name
                )));
            }
        }
        let built = std::time::Instant::now();
        crate::optimize_as(&m, tm, job.pipeline())?;
        let optimized = std::time::Instant::now();
        let object = tm
            .write_to_memory_buffer(&m, FileType::Object)
            .map_err(llvm)?;
        if let Job::Routine(t) = job {
            crate::cache::store_object(dir, &routine_key(t), object.as_slice())?;
        }
        if times {
            eprintln!(
                "kiln compile @{}: module [{what}]: at {:.1} ms: build {:.1} ms, optimize {:.1} ms, code {:.1} ms, cpu {:.1} ms",
                f.name,
                (start - t_begin).as_secs_f64() * 1e3,
                (built - start).as_secs_f64() * 1e3,
                (optimized - built).as_secs_f64() * 1e3,
                optimized.elapsed().as_secs_f64() * 1e3,
                (compile_times::thread_cpu().saturating_sub(cpu_start)).as_secs_f64() * 1e3
            );
        }
        Ok(object.as_slice().to_vec())
    };
    // Each thread's objects, with the index of their job.
    type Objects = Vec<(usize, Vec<u8>)>;
    let done: Vec<Result<Objects>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<Objects> {
                    // One target machine per thread for all its modules: LLVM builds the
                    // subtarget for the host CPU's features once per target machine.
                    let tm = crate::aot_machine(opts.cpu.machine)?;
                    let mut objects = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(job) = jobs.get(j) else {
                            return Ok(objects);
                        };
                        objects.push((j, compile(job, &tm)?));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Llvm("a compile thread panicked".into())))
            })
            .collect()
    });
    // Linked in job order, whichever thread compiled them.
    let mut objects: Objects = done
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    objects.sort_by_key(|o| o.0);
    let objects: Vec<Vec<u8>> = objects
        .into_iter()
        .map(|o| o.1)
        .chain(routine_objects)
        .collect();
    Ok((
        crate::cache::store(dir, &key, &objects, opts.linker.as_deref())?,
        false,
    ))
}

/// Work (output elements times reduction steps, see [`kiln_kernel::threads::launch`]) below
/// which a loop-nest kernel is optimized with the light pipeline (`LIGHT_PIPELINE`); also the
/// outputs below which a GEMM kernel's epilogue is (see [`kernel_jobs`]). Like
/// [`MODULE_NODES`], a compile-time detail of this backend (how long LLVM takes), not a target
/// property: it stays here (docs/architecture.md, "Targets and loop schedules").
pub(super) const LIGHT_WORK: usize = 1 << 22;

/// The most expression nodes (see [`kernel_nodes`]) of the non-GEMM kernels that share one
/// module in the kernel cache's compile.
pub(super) const MODULE_NODES: usize = 500;

/// Expression nodes of `k`'s bodies (its result's and its extra outputs').
pub(super) fn kernel_nodes(k: &Kernel) -> usize {
    let mut n = 0;
    for body in std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body)) {
        visit(body, &mut |_| n += 1);
    }
    n
}

/// One module the kernel cache compiles: kernels (each in its slot), or a GEMM routine.
pub(super) enum Job {
    Kernels(Vec<Option<Kernel>>, crate::Pipeline),
    Routine(gemm::Routine),
}

impl Job {
    /// The module, built in `ctx` for function `f` with loop schedules `schedules` and
    /// in-place outputs `aliases`, and what it holds (kernel names, or the routine's).
    fn module<'c>(
        &self,
        ctx: &'c Context,
        f: &Func,
        schedules: &[Option<KernelSchedule>],
        aliases: &[Alias],
        target: Target,
    ) -> Result<(Module<'c>, String)> {
        Ok(match self {
            Job::Kernels(part, _) => {
                let names: Vec<String> = (0..part.len())
                    .filter(|&i| part[i].is_some())
                    .map(|i| format!("k{i}"))
                    .collect();
                (
                    build_module(ctx, f, part, schedules, target, aliases, Routines::Apart)?,
                    names.join(" "),
                )
            }
            Job::Routine(r) => (routine_module(ctx, r, target)?, r.name()),
        })
    }

    fn pipeline(&self) -> crate::Pipeline {
        match self {
            Job::Kernels(_, p) => *p,
            Job::Routine(_) => crate::Pipeline::Explicit,
        }
    }

    /// About how long the job takes to compile, in milliseconds on the machine the figures
    /// were taken on (`KILN_COMPILE_TIMES=1`, the MLP step): the compile threads take the jobs
    /// longest first, so that the last ones to finish are short.
    fn weight(&self) -> usize {
        match self {
            // Modules of other kernels, filled up to `MODULE_NODES`: the longest (40-80 ms).
            Job::Kernels(part, _) if part.iter().flatten().any(|k| !is_matrix_gemm(k)) => {
                100 + part.iter().flatten().map(kernel_nodes).sum::<usize>()
            }
            // GEMM kernels: their loops and epilogues at O2 (12-37 ms with two kernels), or
            // only loops calling the routines (8-10 ms).
            Job::Kernels(part, pipeline) => {
                let each = match pipeline {
                    crate::Pipeline::O2 { .. } => 15,
                    _ => 8,
                };
                each * part.iter().flatten().count()
            }
            // The routines: tiles 13-19 ms, packing A or transposed B 8-14, plain B 4.
            Job::Routine(r) => match r {
                gemm::Routine::Tile { .. } => 16,
                gemm::Routine::PackA { .. } | gemm::Routine::PackB { trans: true, .. } => 11,
                gemm::Routine::PackB { .. } => 4,
            },
        }
    }
}

/// Whether `k` is a matrix product on the GEMM (not a convolution's, which compiles with the
/// other kernels: see [`split_gemms`]).
pub(super) fn is_matrix_gemm(k: &Kernel) -> bool {
    matches!(k.schedule, Schedule::Gemm { conv: None, .. })
}

/// The modules the kernels `ks` are compiled in, in the order the threads take them.
///
/// - The non-GEMM kernels, which mostly compile quickly, share modules of up to
///   [`MODULE_NODES`] expression nodes (a large kernel alone), first in the queue: they are
///   the largest jobs, and started last they would finish alone on one core. Kernels with
///   less work than [`LIGHT_WORK`] (a training step's loss, its gradient, bias updates) share
///   modules of their own optimized with the light pipeline (`LIGHT_PIPELINE`), the others
///   are optimized at O2.
/// - Each matrix-product kernel has a module of its own, without LLVM's loop unrolling: its
///   tiles are unrolled as emitted, and the unroll passes took a quarter of its O2 time
///   (`opt -time-passes`); runtime even (matmul 1024 and 2048 76 of 145 and 28 of 55
///   alternating calls, attention 13 of 25; the MLP step 14.6 against 14.7 ms over four
///   alternating processes: see docs/performance.md). One with an epilogue (fused elementwise
///   users, whose loops LLVM vectorizes) is optimized at O2, or with the light pipeline when
///   its output has fewer than [`LIGHT_WORK`] elements (an elementwise epilogue's loops
///   vectorized but not interleaved: `LIGHT_EPILOGUE_PIPELINE`); one without with the
///   pipeline of explicit vector code (`EXPLICIT_PIPELINE`): its loops only walk the cache
///   blocks and call the GEMM routines. Products that share a function
///   (`contraction_groups`) share the module.
///
/// The threads take the next module as they finish one, so a few large ones do not leave a
/// core idle.
pub(super) fn kernel_jobs(ks: &[Option<Kernel>], aliases: &[Alias], target: Target) -> Vec<Job> {
    let groups = contraction_groups(ks, aliases, &target.info());
    let (gemms, others) = split_gemms(ks);
    let mut jobs: Vec<Job> = Vec::new();
    for light in [false, true] {
        let pipeline = if light {
            crate::Pipeline::Light { interleave: true }
        } else {
            crate::Pipeline::O2 { unroll: true }
        };
        let mut filled = MODULE_NODES;
        for (i, k) in others.iter().enumerate() {
            let Some(k) = k else { continue };
            if (kiln_kernel::threads::launch(k, None, &TargetInfo::reference()).work < LIGHT_WORK)
                != light
            {
                continue;
            }
            let size = kernel_nodes(k);
            if filled + size > MODULE_NODES {
                jobs.push(Job::Kernels(vec![None; ks.len()], pipeline));
                filled = 0;
            }
            filled += size;
            if let Some(Job::Kernels(part, _)) = jobs.last_mut() {
                part[i] = Some(k.clone());
            }
        }
    }
    let mut group_job = std::collections::BTreeMap::new();
    for (i, k) in gemms.into_iter().enumerate() {
        let Some(k) = k else { continue };
        if let Some(&j) = groups[i].and_then(|g| group_job.get(&g)) {
            if let Job::Kernels(part, _) = &mut jobs[j] {
                part[i] = Some(k);
            }
            continue;
        }
        if let Some(g) = groups[i] {
            group_job.insert(g, jobs.len());
        }
        let plain =
            matches!(k.schedule, Schedule::Gemm { epilogue: None, .. }) && k.extra.is_empty();
        let pipeline = if plain && !target.cpu.gemm_unroll {
            crate::Pipeline::Explicit
        } else if k.out.numel() < LIGHT_WORK {
            // An epilogue that reduces (a row's maximum and sum, a chained product's online
            // softmax) keeps the interleaved loops, whose accumulators run side by side; an
            // elementwise one's elements are independent.
            let mut reduces = matches!(k.schedule, Schedule::Gemm { chain: Some(_), .. });
            for body in std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body)) {
                visit(body, &mut |x| {
                    reduces |= matches!(x, Expr::Reduce { .. } | Expr::Fold { .. });
                });
            }
            crate::Pipeline::Light {
                interleave: reduces,
            }
        } else {
            crate::Pipeline::O2 {
                unroll: target.cpu.gemm_unroll,
            }
        };
        let mut part = vec![None; ks.len()];
        part[i] = Some(k);
        jobs.push(Job::Kernels(part, pipeline));
    }
    jobs
}

/// The GEMM routines that the kernels `ks` call (see [`gemm::Routine`]), whichever outputs are
/// written in place (a tile's update mode is an argument of its routine).
pub(super) fn planned_routines(
    ks: &[Option<Kernel>],
    target: Target,
) -> std::collections::BTreeSet<gemm::Routine> {
    ks.iter()
        .flatten()
        .filter_map(|k| Some(kernel_routines(k, gemm_of(k, None, target)?)))
        .flatten()
        .collect()
}

/// The GEMM routines kernel `k` calls with its GEMM schedule `g`: its product's, and its
/// chained product's (none for a kernel that is not a GEMM).
pub(super) fn kernel_routines(k: &Kernel, g: GemmSchedule) -> Vec<gemm::Routine> {
    let Schedule::Gemm {
        n,
        a_trans,
        b_trans,
        conv,
        chain,
        ..
    } = &k.schedule
    else {
        return Vec::new();
    };
    let mut routines = Vec::new();
    if let Some(c) = chain {
        routines.extend(gemm::Routine::of_gemm(
            g.chain.expect("a chained product's blocking"),
            c.n as i64,
            (false, c.b_trans),
            None,
            if c.b_strides.is_some() {
                gemm::InChain::SecondStrided
            } else {
                gemm::InChain::Second
            },
        ));
    }
    routines.extend(gemm::Routine::of_gemm(
        g.blocking,
        *n as i64,
        (*a_trans, *b_trans),
        conv.as_ref(),
        if chain.is_some() {
            gemm::InChain::First
        } else {
            gemm::InChain::No
        },
    ));
    routines
}

/// A module defining GEMM routine `r` alone.
pub(super) fn routine_module<'c>(
    ctx: &'c Context,
    r: &gemm::Routine,
    target: Target,
) -> Result<Module<'c>> {
    let m = ctx.create_module(&r.name());
    // SAFETY: `m` outlives the function built in it, which only borrows it for the call.
    let mref: &'c Module<'c> = unsafe { &*(&m as *const Module<'c>) };
    r.function(ctx, mref, Routines::Here, target)?;
    m.verify()
        .map_err(|e| Error::Llvm(format!("invalid module for {}: {e}", r.name())))?;
    Ok(m)
}

/// `part` as its matrix-product GEMM kernels and its other kernels (each in `part`'s slots).
/// Convolutions' GEMMs stay with the others: without LLVM's unrolling, conv 3x3 64 -> 64 lost
/// 10 of 11 alternating calls (73 -> 77 ms).
pub(super) fn split_gemms(part: &[Option<Kernel>]) -> (Vec<Option<Kernel>>, Vec<Option<Kernel>>) {
    let pick = |gemm: bool| {
        part.iter()
            .map(|k| k.as_ref().filter(|k| is_matrix_gemm(k) == gemm).cloned())
            .collect()
    };
    (pick(true), pick(false))
}

/// Functions without a GEMM go through the kernel cache when their kernels' LLVM instructions
/// as emitted, plus `COSTLY_WEIGHT` for each costly operation (exp, log, tanh, logistic, erf,
/// power: the loop vectorizer and the code generator then work through their polynomials
/// in vector form), reach this weight. Measured JIT compiles: an eager elementwise op (35-180
/// instructions) 7-15 ms, less than linking a library would add on a miss; a 4096 x 4096
/// softmax (213 and one exp) 25-80 ms, layernorm (366) 35-75 ms, the GELU chain (432 and a
/// logistic) 55-80 ms, erf + tanh x logistic over 100 x 100 (180 and three) about 50 ms, where
/// loading a stored library takes about a millisecond.
pub(super) const CACHE_WEIGHT: usize = 250;

/// What one costly operation adds to a function's compile weight (see [`CACHE_WEIGHT`]).
pub(super) const COSTLY_WEIGHT: usize = 100;

/// The costly operations (see [`costly_op`]) in kernel `k`'s expressions.
pub(super) fn costly_ops(k: &Kernel) -> usize {
    let mut n = 0;
    for body in std::iter::once(&k.body).chain(k.extra.iter().map(|x| &x.body)) {
        visit(body, &mut |x| {
            n += usize::from(matches!(x, Expr::Op { op, .. } if costly_op(op)));
        });
    }
    n
}

/// The number of instructions in `m`'s functions.
pub(super) fn instruction_count(m: &Module<'_>) -> usize {
    m.get_functions()
        .flat_map(|f| f.get_basic_block_iter())
        .map(|bb| bb.get_instructions().count())
        .sum()
}

/// Reports, once per process, that the kernel cache could not be used (kernels are then
/// JIT-compiled as usual).
pub(super) fn warn_cache_off(e: &Error) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| eprintln!("kiln: kernel cache not used: {e}"));
}

/// The memory plan of `f` on the CPU backend, as text: the program as lowered, then each
/// intermediate's arena offset, size and live steps, and the arena, outside and peak bytes.
pub fn describe_memory(f: &Func, opts: &Options) -> Result<String> {
    describe_memory_donating(f, &[], opts)
}

/// [`describe_memory`] for a function whose parameters `p` with `donated[p]` are donated: the
/// plan also lists the results written in place into their buffers.
pub fn describe_memory_donating(f: &Func, donated: &[bool], opts: &Options) -> Result<String> {
    let (g, fused, note) = lowered_for_printing_donating(f, donated, opts)?;
    let steps = steps_of(&g, &fused);
    let in_place = crate::fuse::in_place(&g, &fused, &steps, donated);
    // The 256-bit blocking's scratch, so the text is the same on every machine.
    let scratch: Vec<usize> = fused
        .kernels
        .iter()
        .map(|k| {
            k.as_ref().map_or(0, |k| {
                kiln_kernel::threads::launch(k, None, &TargetInfo::reference()).scratch
            })
        })
        .collect();
    let plan = kiln_kernel::plan::plan(
        &g,
        &steps,
        &fused.operands,
        &scratch,
        &in_place,
        &fused.extra,
    );
    Ok(format!("{g}\n{note}\n{plan}"))
}

/// The peak bytes of `f`'s memory plan as [`CpuExecutable::compile_with_options`] lowers it
/// for this machine under `opts` (optimized, fused, scheduled, no donation), without compiling
/// its kernels: what [`kiln_runtime::plan::MemoryPlan::peak_bytes`] of the executable says.
pub fn planned_peak(f: &Func, opts: &Options) -> Result<usize> {
    let target = Target::host(opts).info();
    let l = kiln_kernel::pipeline::lower_program(f, &[], opts, &target, None, &mut |_| {})?;
    let scratch = vec![0; l.func.insts.len()];
    let plan = kiln_kernel::plan::plan(
        &l.func,
        &l.steps,
        &l.fused.operands,
        &scratch,
        &l.in_place,
        &l.fused.extra,
    );
    Ok(plan.peak_bytes())
}

//! `CpuExecutable`: compiling a function for this CPU and running it.

use super::*;

impl CpuExecutable {
    /// Compiles `f` for this CPU under the default [`Options`] (no kernel cache).
    pub fn compile(f: &Func) -> Result<CpuExecutable> {
        Self::compile_with_options(f, &[], &Options::default())
    }

    /// Compiles `f` for this CPU, with the kernel cache in `cache` (`None`: no cache).
    pub fn compile_with_cache(f: &Func, cache: Option<&std::path::Path>) -> Result<CpuExecutable> {
        Self::compile_donating(f, &[], cache)
    }

    /// Compiles `f` for this CPU, where the parameters `p` with `donated[p]` are donated by the
    /// caller ([`CpuExecutable::call_donating`] passes them by value): kernels that can write
    /// their result into a donated buffer are compiled to do so (see [`crate::fuse::in_place`];
    /// `cargo xtask dump --stage plan` lists them).
    pub fn compile_donating(
        f: &Func,
        donated: &[bool],
        cache: Option<&std::path::Path>,
    ) -> Result<CpuExecutable> {
        let opts = Options {
            kernel_cache: cache.map(std::path::Path::to_path_buf),
            ..Options::default()
        };
        Self::compile_with_options(f, donated, &opts)
    }

    /// Compiles `f` for this CPU under `opts` (its kernel cache, switches and reports), where
    /// the parameters `p` with `donated[p]` are donated (see [`Self::compile_donating`]).
    pub fn compile_with_options(
        f: &Func,
        donated: &[bool],
        opts: &Options,
    ) -> Result<CpuExecutable> {
        // `f` is verified by the pipeline (`lower_program`).
        let cache = usable_cache(opts);
        let mut clock = PhaseClock::new(&f.name, opts.compile_times);
        let lowered = lowering::lowered(f, donated, cache, &mut clock, opts)?;
        if opts.explain {
            // What this compile decided for this machine, not the dumps' reference lowering.
            eprintln!(
                "// kiln: fused kernels of @{}\n{}",
                f.name,
                describe_lowered(&lowered, opts)
            );
        }
        Self::render_timed(lowered, opts, cache, clock)
    }

    /// Renders a program the kernel layer lowered for this machine
    /// ([`kiln_kernel::pipeline::lower_program`] with [`host_target_info`]): emits its kernels
    /// as they were decided, compiles them (through the kernel cache of `opts`) and builds the
    /// program that runs them. [`CpuExecutable::compile_with_options`] is `lower_program`, then
    /// this.
    pub fn render(lowered: Lowered, opts: &Options) -> Result<CpuExecutable> {
        let cache = usable_cache(opts);
        let clock = PhaseClock::new(&lowered.func.name, opts.compile_times);
        Self::render_timed(lowered, opts, cache, clock)
    }

    /// [`CpuExecutable::render`] with the kernel cache in `cache`, reporting phases on `clock`.
    fn render_timed(
        lowered: Lowered,
        opts: &Options,
        cache: Option<&std::path::Path>,
        mut clock: PhaseClock,
    ) -> Result<CpuExecutable> {
        if let Some(m) = opts.cpu.machine {
            return Err(Error::Llvm(format!(
                "@{}: code for the CPU {} does not run in this process; compile it ahead of \
                 time (`kiln::aot`) and run the artifact there",
                lowered.func.name, m.name
            )));
        }
        let target = Target::host(opts);
        let table = kiln_runtime::kernel_program::KernelTable::new(&lowered);
        let launches = kiln_runtime::kernel_program::launches(&lowered, &target.info());
        if opts.explain {
            for (i, pairs) in lowered.in_place.iter().enumerate() {
                for &(q, o) in pairs {
                    let r = if o == 0 {
                        lowered.func.insts[i].results[0]
                    } else {
                        lowered.fused.extra[i][o - 1]
                    };
                    eprintln!(
                        "// kiln: k{i} writes {r} in place of donated {}",
                        lowered.fused.operands[i][q]
                    );
                }
            }
        }
        let lowered_from_cache = lowered.from_index;
        let f = &lowered.func;
        let ks = &lowered.fused.kernels;
        let schedules = &lowered.schedules;
        let aliases = &table.aliases;
        let own = &table.own;
        let context = Box::new(Context::create());
        // SAFETY: the context is boxed (its address is stable) and is dropped after the engine
        // and every value derived from it (field order of CpuExecutable).
        let ctx: &'static Context = unsafe { &*(context.as_ref() as *const Context) };
        let mut kernels_fns = vec![None; f.insts.len()];
        let names = table.symbols();
        // Functions that are slow to compile go through the on-disk cache: a GEMM, 8 kernels or
        // more, or kernels whose compile weight (see `CACHE_WEIGHT`) is large.
        let mut module = None;
        let cacheable = ks
            .iter()
            .flatten()
            .any(|k| matches!(k.schedule, Schedule::Gemm { .. }))
            || names.len() >= 8
            || (cache.is_some() && {
                let m = build_module(ctx, f, own, schedules, target, aliases, Routines::Here)?;
                let n = instruction_count(&m);
                let costly = own.iter().flatten().map(costly_ops).sum::<usize>();
                module = Some(m);
                clock.lap(&format!(
                    "emit LLVM IR ({n} instructions, {costly} costly operations)"
                ));
                n + COSTLY_WEIGHT * costly >= CACHE_WEIGHT
            });
        let mut library = None;
        let mut from_cache = false;
        if cacheable && let Some(dir) = cache {
            match compile_cached(f, own, schedules, aliases, dir, &names, opts) {
                Ok((lib, hit)) => {
                    clock.lap(if hit {
                        "load from the kernel cache"
                    } else {
                        "LLVM O2, object code, link (stored in the kernel cache)"
                    });
                    for (i, k) in own.iter().enumerate() {
                        if k.is_some() {
                            let p = lib.symbol(&format!("k{i}")).ok_or_else(|| {
                                Error::Llvm(format!("kernel k{i} missing from the library"))
                            })?;
                            // SAFETY: every kernel was emitted with this signature.
                            kernels_fns[i] = Some(unsafe {
                                std::mem::transmute::<*const std::ffi::c_void, KernelFn>(p)
                            });
                        }
                    }
                    library = Some(lib);
                    from_cache = hit;
                }
                Err(e) => warn_cache_off(&e),
            }
        }
        let engine = if library.is_none() && own.iter().any(Option::is_some) {
            let m = match module.take() {
                Some(m) => m,
                None => {
                    let m = build_module(ctx, f, own, schedules, target, aliases, Routines::Here)?;
                    clock.lap("emit LLVM IR");
                    m
                }
            };
            crate::optimize(&m, &crate::host_machine()?)?;
            clock.lap("LLVM O2");
            let ee = m
                .create_jit_execution_engine(OptimizationLevel::Aggressive)
                .map_err(llvm)?;
            for (i, k) in own.iter().enumerate() {
                if k.is_some() {
                    // SAFETY: every kernel was emitted with this signature.
                    let jf =
                        unsafe { ee.get_function::<KernelFn>(&format!("k{i}")) }.map_err(llvm)?;
                    kernels_fns[i] = Some(unsafe { jf.into_raw() });
                }
            }
            clock.lap("machine code (JIT)");
            Some(ee)
        } else {
            None
        };
        let functions = own.iter().flatten().count();
        let mut lowered = lowered;
        let kernels = std::mem::take(&mut lowered.fused.kernels);
        let schedules = std::mem::take(&mut lowered.schedules);
        let launched = launches.clone();
        // SAFETY: each kernel was emitted for its instruction's operand and result types,
        // writes its whole result (its rows when split), uses the scratch its launch names, and
        // lives in the engine, which the executable keeps alive as long as the program.
        // Kernels compiled in place read their donated operand through the output pointer only
        // (crate::fuse::in_place checked it is their last use, at their own positions).
        let mut program = unsafe { table.program(lowered, kernels_fns, launches, opts) };
        // Control flow runs on the host: each region is a program of its own, compiled (and
        // optimized, fused and scheduled) apart, so nothing fuses across a region's boundary.
        for i in 0..program.plan().len() {
            if program.plan()[i] != Step::Control {
                continue;
            }
            let regions = kiln_runtime::kernel_program::control_regions(&program.func().insts[i])
                .map_err(Error::Args)?
                .into_iter()
                .map(|(g, donated)| {
                    Self::compile_with_options(&g, &donated, opts)
                        .map(|e| Box::new(e) as Box<dyn kiln_runtime::Region>)
                })
                .collect::<Result<Vec<_>>>()?;
            program.set_regions(i, regions);
        }
        let paths = paths::kernel_paths(
            program.func(),
            &kernels,
            &schedules,
            &launched,
            &program.concurrent_steps(),
        );
        Ok(CpuExecutable {
            paths,
            program,
            _engine: engine,
            _library: library,
            from_cache,
            lowered_from_cache,
            functions,
            _context: context,
        })
    }

    /// How each instruction runs.
    pub fn plan(&self) -> &[Step] {
        self.program.plan()
    }

    /// Whether the kernels were loaded from the on-disk cache (see [`crate::cache`]).
    pub fn loaded_from_cache(&self) -> bool {
        self.from_cache
    }

    /// Whether the optimized, canonicalized and scheduled program came from the kernel cache's
    /// index of input programs (see [`crate::cache`]), so the optimizer did not run.
    pub fn lowered_from_cache(&self) -> bool {
        self.lowered_from_cache
    }

    /// Whether the kernels run from a library of the kernel cache (loaded, or compiled and
    /// stored by this call), rather than from the JIT: false for functions the cache does not
    /// take, without a cache, or when building the library failed (which prints a warning).
    pub fn in_kernel_cache(&self) -> bool {
        self._library.is_some()
    }

    /// How many kernel functions were compiled: one per kernel, except that a kernel equal to
    /// an earlier one (the same body over the same types, the same in-place outputs) runs the
    /// earlier one's function.
    pub fn kernel_functions(&self) -> usize {
        self.functions
    }

    /// The code paths each kernel takes (its GEMM blocking, streaming stores, tiles, guard
    /// cuts, row caches, column strips, thread split, concurrent group), as compiled.
    pub fn kernel_paths(&self) -> &[KernelPath] {
        &self.paths
    }

    /// Where the intermediates live.
    pub fn memory_plan(&self) -> &kiln_runtime::plan::MemoryPlan {
        self.program.memory_plan()
    }

    /// Runs on arguments of the function's parameter types.
    pub fn run(&self, args: &[Literal]) -> Result<Vec<Literal>> {
        self.program.run(args).map_err(|e| Error::Args(e.0))
    }

    /// Runs on borrowed arguments of the function's parameter types: arguments are read in
    /// place, and results move out of the executable without a copy.
    pub fn call(&self, args: &[&Literal]) -> Result<Vec<Literal>> {
        self.program.call(args).map_err(|e| Error::Args(e.0))
    }

    /// Runs like [`CpuExecutable::call`], where arguments passed by value are donated: results
    /// of kernels compiled in place on them (see [`CpuExecutable::compile_donating`]) are
    /// written into their buffers.
    pub fn call_donating(&self, args: Vec<std::borrow::Cow<'_, Literal>>) -> Result<Vec<Literal>> {
        self.program
            .call_donating(args)
            .map_err(|e| Error::Args(e.0))
    }
}

impl kiln_runtime::Region for CpuExecutable {
    fn run_region(
        &self,
        args: &[&Literal],
    ) -> std::result::Result<Vec<Literal>, kiln_runtime::Error> {
        self.program.call(args)
    }

    fn run_region_donating(
        &self,
        args: Vec<std::borrow::Cow<'_, Literal>>,
    ) -> std::result::Result<Vec<Literal>, kiln_runtime::Error> {
        self.program.call_donating(args)
    }
}

/// The kernel cache directory of `opts`, unless others could write it (then it is not used,
/// and that warns once).
fn usable_cache(opts: &Options) -> Option<&std::path::Path> {
    opts.kernel_cache
        .as_deref()
        .filter(|d| crate::cache::usable(d))
}

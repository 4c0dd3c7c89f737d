//! From the function given to the backend to the fused, scheduled program whose kernels are
//! emitted: the optimizer, canonicalization, fusion and scheduling, and the kernel cache's index
//! of input programs, which lets a warm cache skip all but fusion.
//!
//! The library cache (see [`crate::cache`]) is keyed by what the kernels are built from, which
//! is known only after the optimizer (seconds on a program of tens of thousands of
//! instructions) and scheduling have run. So a function of at least [`INDEX_MIN_INSTS`]
//! instructions compiled with a cache directory also stores its scheduled program, as text,
//! under a key of the input program, the donated parameters and every setting that changes the
//! result (the pipeline's switches of [`Options`] and the optimizer's options, the
//! machine settings of the library key, and hashes of the optimizer's, the IR's and this
//! crate's sources). The next compile of the same function reads it back, fuses it (the
//! fusion it was scheduled with: scheduling keeps the fusion of the program it returns) and
//! goes on to the library cache, which then hits as well. A text that does not parse, verify
//! or fuse legally is ignored and the program lowered again.

use super::{
    KernelSchedule, PhaseClock, Target, fused_kernels, loop_schedules, prepare, scheduled,
    wide_vectors,
};
use crate::{Error, Result};
use kiln_ir::Func;
use kiln_kernel::Options;

/// The fewest instructions of a function whose lowering the index keeps (smaller ones lower in
/// a few milliseconds; eager ops compile by the hundreds and would only fill the directory).
pub(super) const INDEX_MIN_INSTS: usize = 16;

/// The settings that change the code emitted for a lowered program: the CPU, the pass
/// pipelines, the emission switches and this crate's sources (part of every cache key).
pub(super) fn machine_settings(opts: &Options) -> String {
    use inkwell::targets::TargetMachine;
    let cpu = &opts.cpu;
    format!(
        "{} {} {} {} {} gemm-unroll={} wide={} stream={} row-caches={} guard-splits={} codegen={}",
        TargetMachine::get_host_cpu_name().to_string_lossy(),
        TargetMachine::get_host_cpu_features().to_string_lossy(),
        crate::PIPELINE,
        crate::EXPLICIT_PIPELINE,
        crate::LIGHT_PIPELINE,
        cpu.gemm_unroll,
        wide_vectors(Target::host(opts)),
        cpu.streaming_stores,
        cpu.row_caches,
        cpu.guard_splits,
        env!("KILN_CODEGEN_SOURCE_HASH"),
    )
}

/// The index key of `f` compiled with `donated` under `opts`.
fn index_key(f: &Func, donated: &[bool], opts: &Options) -> String {
    let mask: String = donated.iter().map(|&d| if d { 'd' } else { '-' }).collect();
    let settings = format!(
        "{}\nlowered-v2 {} {:?} prepare={}",
        machine_settings(opts),
        opts.pipeline_key(),
        opts.optimizer(super::host_target_info().cost_machine()),
        env!("KILN_PREPARE_SOURCE_HASH"),
    );
    crate::cache::key(&format!("input program\n{mask}\n{f}"), &settings)
}

/// The lowered program stored under `key` in `dir`, with its fusion, if it is there and sound.
fn load(dir: &std::path::Path, key: &str, opts: &Options) -> Option<(Func, crate::fuse::Fused)> {
    let bytes = crate::cache::load_file(dir, key, "kir")?;
    let g = kiln_ir::parse_func_text(std::str::from_utf8(&bytes).ok()?).ok()?;
    kiln_ir::verify(&g).ok()?;
    let fused = fused_kernels(&g, opts, &Target::host(opts).info());
    crate::fuse::check_legal(&g, &fused).ok()?;
    // In tests and debug builds, kernels read back are verified like those lowered anew.
    kiln_kernel::verify::debug_check(&g, &fused).ok()?;
    Some((g, fused))
}

/// `f` optimized, canonicalized, fused and scheduled for the donated parameters `donated`,
/// through the index of the kernel cache in `cache` (`None`: computed), with its kernels' loop
/// schedules; `true` when it came from the index (the optimizer did not run).
pub(super) fn lowered(
    f: &Func,
    donated: &[bool],
    cache: Option<&std::path::Path>,
    clock: &mut PhaseClock,
    opts: &Options,
) -> Result<(Func, crate::fuse::Fused, Vec<Option<KernelSchedule>>, bool)> {
    let key = cache
        .filter(|_| f.insts.len() >= INDEX_MIN_INSTS)
        .map(|dir| (dir, index_key(f, donated, opts)));
    if let Some((dir, key)) = &key
        && let Some((g, fused)) = load(dir, key, opts)
    {
        clock.lap("lowered program from the kernel cache's index, fused");
        let schedules = loop_schedules(&fused, opts, &Target::host(opts).info());
        return Ok((g, fused, schedules, true));
    }
    let target = Target::host(opts).info();
    let canonical = prepare(f, opts, &target)?;
    clock.lap("optimize and canonicalize the graph");
    let fused = fused_kernels(&canonical, opts, &target);
    crate::fuse::check_legal(&canonical, &fused)
        .map_err(|e| Error::Llvm(format!("fusion of @{}: {e}", canonical.name)))?;
    clock.lap("fuse");
    let (g, fused, note) = scheduled(canonical, fused, donated, opts, &target)?;
    if opts.explain {
        eprintln!("// kiln: {note}");
    }
    clock.lap("schedule");
    if let Some((dir, key)) = &key {
        // A failure to store costs only the next compile's time.
        let _ = crate::cache::store_file(dir, key, "kir", g.to_string().as_bytes());
    }
    let schedules = loop_schedules(&fused, opts, &target);
    Ok((g, fused, schedules, false))
}

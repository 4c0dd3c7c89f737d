//! From the function given to the backend to the fused, scheduled program whose kernels are
//! emitted: the kernel layer's pipeline ([`kiln_kernel::pipeline::lower_program`]) for this machine,
//! through the kernel cache's index of input programs, which lets a warm cache skip all but
//! fusion.
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

use super::{PhaseClock, Target, wide_vectors};
use crate::Result;
use kiln_ir::Func;
use kiln_kernel::Options;
use kiln_kernel::pipeline::{Lowered, LoweredIndex, lower_program};

/// The fewest instructions of a function whose lowering the index keeps (smaller ones lower in
/// a few milliseconds; eager ops compile by the hundreds and would only fill the directory).
pub(super) const INDEX_MIN_INSTS: usize = 16;

/// The settings that change the code emitted for a lowered program: the CPU, the pass
/// pipelines, the emission switches and this crate's sources (part of every cache key).
pub(super) fn machine_settings(opts: &Options) -> String {
    let cpu = &opts.cpu;
    let (name, features) = crate::cpu_of(cpu.machine);
    format!(
        "{} {} {} {} {} gemm-unroll={} wide={} stream={} row-caches={} guard-splits={} codegen={}",
        name,
        features,
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
        opts.optimizer(Target::host(opts).info().cost_machine()),
        env!("KILN_PREPARE_SOURCE_HASH"),
    );
    crate::cache::key(&format!("input program\n{mask}\n{f}"), &settings)
}

/// The kernel cache's index of lowered programs: `kir` files in the cache directory.
struct DiskIndex<'a>(&'a std::path::Path);

impl LoweredIndex for DiskIndex<'_> {
    fn load(&self, key: &str) -> Option<String> {
        let bytes = crate::cache::load_file(self.0, key, "kir")?;
        String::from_utf8(bytes).ok()
    }
    fn store(&self, key: &str, text: &str) {
        // A failure to store costs only the next compile's time.
        let _ = crate::cache::store_file(self.0, key, "kir", text.as_bytes());
    }
}

/// `f` lowered for this machine ([`kiln_kernel::pipeline::lower_program`]) with the donated
/// parameters `donated`, through the index of the kernel cache in `cache` (`None`: computed).
pub(super) fn lowered(
    f: &Func,
    donated: &[bool],
    cache: Option<&std::path::Path>,
    clock: &mut PhaseClock,
    opts: &Options,
) -> Result<Lowered> {
    let key = cache
        .filter(|_| f.insts.len() >= INDEX_MIN_INSTS)
        .map(|dir| (DiskIndex(dir), index_key(f, donated, opts)));
    let index = key
        .as_ref()
        .map(|(ix, key)| (ix as &dyn LoweredIndex, key.as_str()));
    let target = Target::host(opts).info();
    let lowered = lower_program(f, donated, opts, &target, index, &mut |phase| {
        clock.lap(phase)
    })?;
    if opts.explain && !lowered.from_index {
        eprintln!("// kiln: {}", lowered.note);
    }
    Ok(lowered)
}

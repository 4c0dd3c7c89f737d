//! Ahead-of-time compilation for this CPU: a function lowered as the JIT lowers it, its
//! kernels built into a shared library by the kernel cache's code (objects, `ld -shared`:
//! [`compile_cached`]), for `kiln::aot` to write into an artifact that `kiln-run` runs with
//! no compiler (`kiln_runtime::kernel_program::load`).
//!
//! A function with control flow is several programs: its own and, depth first, those of its
//! control steps' regions ([`kiln_runtime::kernel_program::control_regions`]), each lowered
//! and compiled apart with a library of its own, as the JIT compiles them.

use super::*;
use kiln_runtime::kernel_program::{KernelTable, control_regions, launches};

/// One program of an ahead-of-time artifact for the CPU.
#[derive(Clone, Debug)]
pub struct AotProgram {
    /// The program as lowered (optimized, canonicalized, scheduled), which the runtime fuses
    /// again exactly as here.
    pub func: Func,
    /// Its donated parameters (a loop body's carries).
    pub donated: Vec<bool>,
    /// The shared library of its kernel functions (`k0`, `k3`, ...), if it has any.
    pub library: Option<Vec<u8>>,
    /// The checksum of what the functions are compiled from
    /// ([`KernelTable::source_text`]): the runtime derives it again and refuses a library
    /// compiled from other kernels.
    pub kernels: String,
    /// Its memory plan, printed.
    pub memory: String,
    /// For each control step, the indices (in the artifact's list) of its regions' programs.
    pub regions: Vec<(usize, Vec<usize>)>,
}

/// What the kernel layer decides with for this CPU under `opts` (the JIT's target): an
/// artifact records it, and the runtime lowers its programs for it again.
pub fn cpu_target_info(opts: &Options) -> TargetInfo {
    Target::host(opts).info()
}

/// The programs of `f` compiled for this CPU under `opts`, `f`'s own first. The libraries are
/// built (or found) in the kernel cache of `opts` when it is usable, else in a private
/// temporary directory removed afterwards.
pub fn aot_programs(f: &Func, opts: &Options) -> Result<Vec<AotProgram>> {
    let scratch;
    let dir = match opts
        .kernel_cache
        .as_deref()
        .filter(|d| crate::cache::usable(d))
    {
        Some(d) => d.to_path_buf(),
        None => {
            let name = format!(
                "kiln-aot-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            )
            .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_");
            scratch = std::env::temp_dir().join(name);
            scratch.clone()
        }
    };
    let mut out = Vec::new();
    let built = add_program(f, &[], opts, &dir, &mut out);
    if opts.kernel_cache.as_deref() != Some(dir.as_path()) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    built.map(|_| out)
}

/// Lowers and compiles `f` (with `donated`) and, after it, its regions' programs into `out`;
/// its index.
fn add_program(
    f: &Func,
    donated: &[bool],
    opts: &Options,
    dir: &std::path::Path,
    out: &mut Vec<AotProgram>,
) -> Result<usize> {
    let mut clock = PhaseClock::new(&f.name, false);
    let lowered = lowering::lowered(f, donated, None, &mut clock, opts)?;
    let table = KernelTable::new(&lowered);
    let info = cpu_target_info(opts);
    let launch = launches(&lowered, &info);
    let scratch: Vec<usize> = launch.iter().map(|l| l.scratch).collect();
    let memory = kiln_kernel::plan::plan(
        &lowered.func,
        &lowered.steps,
        &lowered.fused.operands,
        &scratch,
        &lowered.in_place,
        &lowered.fused.extra,
    );
    let names = table.symbols();
    let library = if names.is_empty() {
        None
    } else {
        let (_lib, _) = compile_cached(
            &lowered.func,
            &table.own,
            &lowered.schedules,
            &table.aliases,
            dir,
            &names,
            opts,
        )?;
        let key = library_key(&lowered.func, &table.own, &table.aliases, opts);
        Some(crate::cache::library_bytes(dir, &key).ok_or_else(|| {
            Error::Llvm(format!(
                "@{}: the library just built in {} cannot be read back",
                f.name,
                dir.display()
            ))
        })?)
    };
    let index = out.len();
    out.push(AotProgram {
        func: lowered.func.clone(),
        donated: donated.to_vec(),
        library,
        kernels: kiln_runtime::library::checksum(table.source_text(&lowered.func).as_bytes()),
        memory: memory.to_string(),
        regions: Vec::new(),
    });
    let mut regions = Vec::new();
    for (i, step) in lowered.steps.iter().enumerate() {
        if *step != Step::Control {
            continue;
        }
        let programs = control_regions(&lowered.func.insts[i])
            .map_err(Error::Args)?
            .into_iter()
            .map(|(g, donated)| add_program(&g, &donated, opts, dir, out))
            .collect::<Result<Vec<_>>>()?;
        regions.push((i, programs));
    }
    out[index].regions = regions;
    Ok(index)
}

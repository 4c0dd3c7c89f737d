//! A lowered program ([`Lowered`]) run with compiled kernel functions: which functions its
//! kernels need ([`KernelTable`]), the [`Program`] that runs its steps calling them
//! ([`KernelTable::program`]), and the regions its control-flow steps run
//! ([`control_regions`]).
//!
//! Both ways CPU kernels reach the runtime assemble their programs here: the CPU backend
//! (`kiln_codegen_llvm::cpu`, kernels JIT-compiled or from its kernel cache's libraries) and
//! `kiln-run`, which runs an ahead-of-time artifact's libraries ([`load`]) with no compiler
//! linked. So an artifact runs exactly as the function compiled in process does.

use crate::library::Library;
use crate::{Error, KernelFn, Launch, Program, Region, Step};
use kiln_ir::{Func, Inst, Literal};
use kiln_kernel::kernel::Kernel;
use kiln_kernel::pipeline::Lowered;
use kiln_kernel::{Options, TargetInfo};
use std::borrow::Cow;
use std::sync::Arc;

/// The regions of a control step as functions to compile, each with its donated parameters
/// (see [`control_regions`]).
pub type RegionFuncs = Vec<(Func, Vec<bool>)>;

/// In-place inputs of a kernel: `(input, output)` pairs and the pointer table's length.
pub type Alias = (Vec<(usize, usize)>, usize);

/// For each slot of `keys` that holds one, the first slot (itself, or an earlier one) with an
/// equal key and the same in-place outputs (`aliases`).
pub fn first_equal<T: PartialEq>(keys: &[Option<T>], aliases: &[Alias]) -> Vec<Option<usize>> {
    (0..keys.len())
        .map(|i| {
            keys[i].as_ref()?;
            (0..=i).find(|&j| keys[j] == keys[i] && aliases.get(j) == aliases.get(i))
        })
        .collect()
}

/// The kernel functions a lowered program needs.
#[derive(Clone, Debug)]
pub struct KernelTable {
    /// Per instruction, its kernel's in-place outputs.
    pub aliases: Vec<Alias>,
    /// Per instruction, the first instruction whose kernel equals its own (the same body over
    /// the same types, the same in-place outputs): it runs that one's function.
    pub first: Vec<usize>,
    /// The kernels to compile, in their instructions' slots: those that are their own first.
    pub own: Vec<Option<Kernel>>,
}

/// The symbol of instruction `i`'s kernel function.
pub fn kernel_symbol(i: usize) -> String {
    format!("k{i}")
}

impl KernelTable {
    /// The table of `lowered`'s kernels. Winograd's 36 products, for one, run through one
    /// function.
    pub fn new(lowered: &Lowered) -> KernelTable {
        let fused = &lowered.fused;
        let aliases: Vec<Alias> = lowered
            .in_place
            .iter()
            .zip(fused.operands.iter().zip(&fused.extra))
            .map(|(pairs, (ops, extra))| (pairs.clone(), ops.len() + extra.len()))
            .collect();
        KernelTable::of(&fused.kernels, aliases)
    }

    /// The table of the kernels `ks` with in-place outputs `aliases`.
    pub fn of(ks: &[Option<Kernel>], aliases: Vec<Alias>) -> KernelTable {
        let first: Vec<usize> = first_equal(ks, &aliases)
            .into_iter()
            .enumerate()
            .map(|(i, f)| f.unwrap_or(i))
            .collect();
        let own = (0..ks.len())
            .map(|i| if first[i] == i { ks[i].clone() } else { None })
            .collect();
        KernelTable {
            aliases,
            first,
            own,
        }
    }

    /// The symbols of the functions to compile, in order.
    pub fn symbols(&self) -> Vec<String> {
        (0..self.own.len())
            .filter(|&i| self.own[i].is_some())
            .map(kernel_symbol)
            .collect()
    }

    /// What the functions are compiled from, as text: the program, its kernels and their
    /// in-place outputs. A library built from it holds these functions; its checksum names
    /// the library (the kernel cache's key, an artifact's `kernels` field).
    pub fn source_text(&self, func: &Func) -> String {
        format!("{func}\n{:?}\n{:?}", self.own, self.aliases)
    }

    /// The program of `lowered` (this table's), calling `fns[i]` for instruction `i` that
    /// has a function of its own (`own[i]`); instructions whose kernel equals an earlier one
    /// call its function. `launch` is each instruction's ([`launches`]).
    ///
    /// # Safety
    ///
    /// Each `fns[i]` must be the function compiled from `own[i]` with `aliases[i]` (see
    /// [`Program::new`]) and stay callable as long as the program lives.
    pub unsafe fn program(
        &self,
        lowered: Lowered,
        mut fns: Vec<Option<KernelFn>>,
        launch: Vec<Launch>,
        opts: &Options,
    ) -> Program {
        fns.resize(self.first.len(), None);
        for i in 0..self.first.len() {
            fns[i] = fns[self.first[i]];
        }
        // SAFETY: the caller's promise, and each kernel was lowered for its instruction's
        // operand and result types, its in-place outputs checked (crate::fuse::in_place).
        unsafe {
            Program::new(
                lowered.func,
                lowered.steps,
                fns,
                launch,
                lowered.fused.operands,
                lowered.in_place,
                lowered.fused.extra,
                opts,
            )
        }
    }
}

/// How the runtime calls each of `lowered`'s kernels: its loop schedule's launch, else as
/// the kernel layer decides it for `target` ([`kiln_kernel::threads::launch`]).
pub fn launches(lowered: &Lowered, target: &TargetInfo) -> Vec<Launch> {
    lowered
        .fused
        .kernels
        .iter()
        .enumerate()
        .map(|(i, k)| {
            k.as_ref()
                .map(
                    |k| match lowered.schedules.get(i).and_then(Option::as_ref) {
                        Some(s) => s.launch,
                        None => kiln_kernel::threads::launch(k, None, target),
                    },
                )
                .unwrap_or_default()
        })
        .collect()
}

/// The regions the control-flow instruction `inst` runs, each as a function to compile and
/// its donated parameters, in the order [`Program::set_regions`] takes them: a `while`'s
/// condition and its body without its invariant carries, the others donated
/// ([`kiln_kernel::host_loop`]); a `case`'s branches; a sort's comparator, except for a sort by
/// keys, which never calls it (none).
pub fn control_regions(inst: &Inst) -> Result<RegionFuncs, String> {
    if let kiln_ir::Op::Sort { comparator, .. } = &inst.op
        && let kiln_kernel::sort::SortPlan::Keys { .. } =
            kiln_kernel::sort::sort_plan(comparator, inst.operands.len())
    {
        return Ok(Vec::new());
    }
    Ok(match &inst.op {
        kiln_ir::Op::While { cond, body } => {
            let plan = kiln_kernel::host_loop::loop_plan(body);
            let stepped = plan.stepped_body(cond, body).map_err(|e| e.to_string())?;
            vec![((**cond).clone(), Vec::new()), (stepped, plan.donated())]
        }
        _ => inst
            .op
            .regions()
            .into_iter()
            .map(|g| (g.clone(), Vec::new()))
            .collect(),
    })
}

/// A program whose kernels live in a loaded library, which it keeps open.
pub struct LoadedProgram {
    // Declared first, so dropped before the library its kernels live in.
    program: Program,
    _library: Option<Arc<Library>>,
}

impl LoadedProgram {
    /// The runtime program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Runs on borrowed arguments of the function's parameter types.
    pub fn call(&self, args: &[&Literal]) -> Result<Vec<Literal>, Error> {
        self.program.call(args)
    }
}

impl Region for LoadedProgram {
    fn run_region(&self, args: &[&Literal]) -> Result<Vec<Literal>, Error> {
        self.program.call(args)
    }

    fn run_region_donating(&self, args: Vec<Cow<'_, Literal>>) -> Result<Vec<Literal>, Error> {
        self.program.call_donating(args)
    }
}

/// The program of `lowered` running the kernel functions of `library` (named by
/// [`kernel_symbol`]; `None` when the program has no kernels), its control-flow steps running
/// the programs `regions` gives for them (called with each step's index and its
/// [`control_regions`]). A function the program needs and the library lacks, or a library
/// for a program without kernels, is an error naming it; `name` names the library.
///
/// # Safety
///
/// The library's functions must have been compiled from `lowered`'s [`KernelTable`]
/// ([`KernelTable::source_text`]: callers check its checksum) for a CPU this one runs.
pub unsafe fn load(
    lowered: Lowered,
    library: Option<Arc<Library>>,
    name: &str,
    target: &TargetInfo,
    opts: &Options,
    regions: &mut dyn FnMut(usize, RegionFuncs) -> Result<Vec<Box<dyn Region>>, String>,
) -> Result<LoadedProgram, String> {
    let table = KernelTable::new(&lowered);
    let symbols = table.symbols();
    let mut fns = vec![None; table.own.len()];
    match &library {
        None if !symbols.is_empty() => {
            return Err(format!(
                "@{}: {} kernel functions and no library",
                lowered.func.name,
                symbols.len()
            ));
        }
        None => {}
        Some(lib) => {
            for (i, k) in table.own.iter().enumerate() {
                if k.is_none() {
                    continue;
                }
                let s = kernel_symbol(i);
                let p = lib.symbol(&s).ok_or_else(|| {
                    format!(
                        "{name}: the library has no kernel function `{s}` (@{} #{i} {})",
                        lowered.func.name,
                        lowered.func.insts[i].op.mnemonic()
                    )
                })?;
                // SAFETY: the caller's promise: `s` is the kernel compiled for `own[i]`, with
                // the signature of every kernel.
                fns[i] =
                    Some(unsafe { std::mem::transmute::<*const std::ffi::c_void, KernelFn>(p) });
            }
        }
    }
    let launch = launches(&lowered, target);
    let control: Vec<(usize, RegionFuncs)> = lowered
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| **s == Step::Control)
        .map(|(i, _)| control_regions(&lowered.func.insts[i]).map(|r| (i, r)))
        .collect::<Result<_, _>>()?;
    // SAFETY: the caller's promise; the library is kept open as long as the program.
    let mut program = unsafe { table.program(lowered, fns, launch, opts) };
    for (i, rs) in control {
        let want = rs.len();
        let got = regions(i, rs)?;
        if got.len() != want {
            return Err(format!(
                "#{i} {}: {} region programs for its {want} regions",
                program.func().insts[i].op.mnemonic(),
                got.len()
            ));
        }
        program.set_regions(i, got);
    }
    Ok(LoadedProgram {
        program,
        _library: library,
    })
}

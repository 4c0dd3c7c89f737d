//! The pipeline from the function a backend is given to its fused, scheduled kernels:
//! optimize ([`kiln_opt`]), canonicalize ([`crate::canon`]), lower each instruction to a kernel
//! ([`crate::lower`]), fuse ([`crate::fuse`]) and schedule ([`crate::schedule`]), and
//! the printed forms of its result.

use crate::Step;
use crate::canon;
use crate::fuse::Fused;
use crate::ir::Kernel;
use crate::loop_schedule::KernelSchedule;
use crate::lower::{NoKernel, lower};
use crate::options::Options;
use crate::target::TargetInfo;
use crate::{Error, Result};
use kiln_ir::{Func, Op, TensorType};

/// A program lowered for a target: everything the kernel layer decided, which a backend
/// renders without deciding again (the LLVM backend's `CpuExecutable::render`).
#[derive(Clone, Debug)]
pub struct Lowered {
    /// The optimized, canonicalized program, in the order [`scheduled`] kept.
    pub func: Func,
    /// Its fusion: kernels, members, operands, merged results.
    pub fused: Fused,
    /// The loop schedule of each loop-nest kernel (see [`crate::loop_schedule`]).
    pub schedules: Vec<Option<KernelSchedule>>,
    /// How each instruction runs.
    pub steps: Vec<Step>,
    /// Per instruction, the `(operand, output)` pairs its kernel writes in place of a donated
    /// operand (see [`crate::fuse::in_place`]).
    pub in_place: Vec<Vec<(usize, usize)>>,
    /// What scheduling decided, in words (`--explain` prints it); empty when the program came
    /// from an index.
    pub note: String,
    /// Whether the program came from the index (the optimizer did not run).
    pub from_index: bool,
    /// The options it was lowered under (a device plan lowers control flow's regions under
    /// them too).
    pub options: Options,
}

/// Where a backend keeps lowered programs between compiles, as text under a key of the input
/// program and every setting that changes the result (the LLVM backend: its kernel cache's
/// index). The optimizer takes seconds on a program of tens of thousands of instructions; a
/// program read back is only fused again.
pub trait LoweredIndex {
    /// The text stored under `key`, if any.
    fn load(&self, key: &str) -> Option<String>;
    /// Stores `text` under `key` (a failure costs only the next compile's time).
    fn store(&self, key: &str, text: &str);
}

/// `f` lowered for `target` under `opts`, with the parameters `p` with `donated[p]` donated:
/// optimized and canonicalized ([`prepare`]), fused ([`fused_kernels`], checked legal),
/// scheduled ([`scheduled`]), its loops scheduled ([`loop_schedules`]) and its in-place
/// kernels chosen. With `index`, a program stored under the key is read back and only fused
/// (a text that does not parse, verify or fuse legally is ignored), and a program lowered anew
/// is stored. `lap` is called after each phase with its name (compile-time reports).
pub fn lower_program(
    f: &Func,
    donated: &[bool],
    opts: &Options,
    target: &TargetInfo,
    index: Option<(&dyn LoweredIndex, &str)>,
    lap: &mut dyn FnMut(&str),
) -> Result<Lowered> {
    kiln_ir::verify(f).map_err(|e| Error::Args(e.to_string()))?;
    let read_back = index.and_then(|(ix, key)| {
        let g = kiln_ir::parse_func_text(&ix.load(key)?).ok()?;
        kiln_ir::verify(&g).ok()?;
        let fused = fused_kernels(&g, opts, target);
        crate::fuse::check_legal(&g, &fused).ok()?;
        // In tests and debug builds, kernels read back are verified like those lowered anew.
        crate::verify::debug_check(&g, &fused).ok()?;
        Some((g, fused))
    });
    let (func, fused, note, from_index) = match read_back {
        Some((g, fused)) => {
            lap("lowered program from the index, fused");
            (g, fused, String::new(), true)
        }
        None => {
            let canonical = prepare(f, opts, target)?;
            lap("optimize and canonicalize the graph");
            let fused = fused_kernels(&canonical, opts, target);
            crate::fuse::check_legal(&canonical, &fused)
                .map_err(|e| Error::Lowering(format!("fusion of @{}: {e}", canonical.name)))?;
            lap("fuse");
            let (g, fused, note) = scheduled(canonical, fused, donated, opts, target)?;
            lap("schedule");
            if let Some((ix, key)) = index {
                ix.store(key, &g.to_string());
            }
            (g, fused, note, false)
        }
    };
    let schedules = loop_schedules(&fused, opts, target);
    let steps = steps_of(&func, &fused);
    let in_place = crate::fuse::in_place(&func, &fused, &steps, donated);
    Ok(Lowered {
        func,
        fused,
        schedules,
        steps,
        in_place,
        note,
        from_index,
        options: opts.clone(),
    })
}

/// The fused kernels of `f` (see [`crate::fuse`]) within the limits of `target`; without
/// [`Options::fusion`], one kernel per instruction (for measuring what fusion buys, and for
/// debugging).
/// Each instruction without a kernel keeps why ([`Fused::no_kernel`]).
pub fn fused_kernels(f: &Func, opts: &Options, target: &TargetInfo) -> Fused {
    let (ks, no_kernel): (Vec<_>, Vec<_>) = lowerings(f)
        .into_iter()
        .map(|l| match l {
            Ok(k) => (Some(k), None),
            Err(why) => (None, Some(why)),
        })
        .unzip();
    let mut fused = if opts.fusion {
        crate::fuse::fuse(f, ks, opts.chain_products, &target.fusion)
    } else {
        crate::fuse::unfused(f, ks)
    };
    fused.no_kernel = no_kernel;
    fused
}

/// The loop schedule of each of `fused`'s kernels on `target` under `opts` (see
/// [`crate::loop_schedule`]), decided once for the emitter, which renders it.
pub fn loop_schedules(
    fused: &Fused,
    opts: &Options,
    target: &TargetInfo,
) -> Vec<Option<KernelSchedule>> {
    crate::loop_schedule::schedules(&fused.kernels, target, &opts.cpu)
}

/// The kernels of `f`, one per instruction that has one (`None` for the others; see
/// [`lowerings`] for why).
pub fn kernels(f: &Func) -> Vec<Option<Kernel>> {
    lowerings(f).into_iter().map(Result::ok).collect()
}

/// Per instruction of `f`: its kernel ([`lower`]), or why it has none.
pub fn lowerings(f: &Func) -> Vec<std::result::Result<Kernel, NoKernel>> {
    f.insts
        .iter()
        .map(|inst| {
            let Some(r) = inst.results.first() else {
                return Err(NoKernel("no result: nothing to compute"));
            };
            let x: Vec<TensorType> = inst
                .operands
                .iter()
                .map(|o| f.values[o.index()].clone())
                .collect();
            let lowered = lower(&inst.op, &x, &f.values[r.index()]);
            // A fold writes each of its results (the others as extra outputs).
            let writes_all = |k: &Kernel| {
                k.extra.len() + 1 == inst.results.len()
                    && (inst.results[1..].iter().zip(&k.extra))
                        .all(|(v, x)| f.values[v.index()] == x.out)
            };
            if inst.results.len() != 1 && !lowered.as_ref().is_ok_and(writes_all) {
                // A kernel writes one result: the op's own reason when it has one.
                lowered.and(Err(NoKernel("more than one result")))
            } else {
                lowered
            }
        })
        .collect()
}

/// `f` as the backend lowers it for the reference target ([`TargetInfo::reference`], so the
/// text is the same on every machine) and its fusion: what the dumps print.
pub fn lowered_for_printing(f: &Func, opts: &Options) -> Result<(Func, Fused)> {
    lowered_for_printing_donating(f, &[], opts).map(|(g, fused, _)| (g, fused))
}

/// [`lowered_for_printing`] for the parameters `p` with `donated[p]` donated (scheduling
/// depends on them), with the line saying what scheduling decided.
pub fn lowered_for_printing_donating(
    f: &Func,
    donated: &[bool],
    opts: &Options,
) -> Result<(Func, Fused, String)> {
    kiln_ir::verify(f).map_err(|e| Error::Args(e.to_string()))?;
    let target = TargetInfo::reference();
    let g = prepare(f, opts, &target)?;
    let fused = fused_kernels(&g, opts, &target);
    scheduled(g, fused, donated, opts, &target)
}

/// The fused program `f`, `fused` in the order [`crate::schedule::step_order`] picks, fused
/// again (for `target`), when that lowers the memory plan's peak without adding kernels; else (and without
/// [`Options::memory_schedule`], for measuring) as it is. With it, one line saying
/// which order was kept and the peaks of both. In tests and debug builds the kernels are
/// verified first (see [`crate::verify::debug_check`]).
pub fn scheduled(
    f: Func,
    fused: Fused,
    donated: &[bool],
    opts: &Options,
    target: &TargetInfo,
) -> Result<(Func, Fused, String)> {
    crate::verify::debug_check(&f, &fused)?;
    let peak = |g: &Func, fz: &Fused| {
        let steps = steps_of(g, fz);
        let in_place = crate::fuse::in_place(g, fz, &steps, donated);
        let no_scratch = vec![0; g.insts.len()];
        crate::plan::plan(g, &steps, &fz.operands, &no_scratch, &in_place, &fz.extra).peak_bytes()
    };
    let count = |fz: &Fused| fz.kernels.iter().flatten().count();
    let before = peak(&f, &fused);
    if !opts.memory_schedule {
        let note = format!("schedule: program order (KILN_SCHEDULE=0; peak {before} bytes)");
        return Ok((f, fused, note));
    }
    let order = crate::schedule::step_order(&f, &fused, donated);
    if order.windows(2).all(|w| w[0] < w[1]) {
        let note = format!("schedule: program order (the memory-aware order; peak {before} bytes)");
        return Ok((f, fused, note));
    }
    let placement = crate::schedule::placement(&f, &fused, &order);
    let g = crate::schedule::permute(&f, &placement);
    // The reordered program under the same kernels first: when even that does not peak lower,
    // the program order stays without fusing the reordered program (as long as fusing the
    // program itself; the two fusions differ only where multi-output fusion finds other
    // siblings in the new order).
    let estimate = peak(&g, &crate::schedule::carried(&f, &fused, &placement));
    if estimate >= before {
        let note = format!(
            "schedule: program order (peak {before} bytes; the memory-aware order peaks at \
             {estimate} bytes with {} kernels)",
            count(&fused)
        );
        return Ok((f, fused, note));
    }
    let refused = fused_kernels(&g, opts, target);
    crate::verify::debug_check(&g, &refused)?;
    if crate::fuse::check_legal(&g, &refused).is_ok() {
        let after = peak(&g, &refused);
        if after < before && count(&refused) <= count(&fused) {
            // Steps some earlier step in the order comes after in the program.
            let mut latest = 0;
            let moved = order
                .iter()
                .filter(|&&u| {
                    let earlier = latest > u;
                    latest = latest.max(u);
                    earlier
                })
                .count();
            let note = format!(
                "schedule: {moved} step(s) moved earlier for memory; peak {before} -> {after} bytes"
            );
            return Ok((g, refused, note));
        }
        let note = format!(
            "schedule: program order (peak {before} bytes; the memory-aware order peaks at \
             {after} bytes with {} kernels)",
            count(&refused)
        );
        return Ok((f, fused, note));
    }
    let note = format!("schedule: program order (peak {before} bytes)");
    Ok((f, fused, note))
}

/// How each instruction of the prepared function `f` runs, given its fusion.
pub fn steps_of(f: &Func, fused: &Fused) -> Vec<Step> {
    f.insts
        .iter()
        .zip(&fused.kernels)
        .enumerate()
        .map(|(i, (inst, k))| match (k, &inst.op) {
            _ if fused.inlined[i] => Step::Fused,
            _ if fused.merged_into[i].is_some() => Step::Merged,
            (Some(_), _) => Step::Kernel,
            (None, Op::Constant { .. }) => Step::Constant,
            (None, Op::OptimizationBarrier {}) => Step::Forward,
            // Before control flow: a collective reduction holds its computation as a region.
            (None, op) if crate::host_routine(op) => Step::Host,
            (None, op) if op.props().contains(kiln_ir::Props::CONTROL) => Step::Control,
            (None, _) => Step::Reference,
        })
        .collect()
}

/// The fused graph in Graphviz dot: one box per kernel (its member ops inside), edges for the
/// buffers kernels read.
pub fn fusion_dot(f: &Func, opts: &Options) -> Result<String> {
    use std::fmt::Write as _;
    let (g, fused) = lowered_for_printing(f, opts)?;
    let mut producer = vec![None; g.values.len()];
    for (i, inst) in g.insts.iter().enumerate() {
        for r in &inst.results {
            producer[r.index()] = Some(i);
        }
    }
    let mut s =
        String::from("digraph fused {\n  rankdir=TB;\n  node [shape=box, fontname=monospace];\n");
    for (i, p) in g.params.iter().enumerate() {
        let _ = writeln!(
            s,
            "  p{i} [shape=ellipse, label=\"{p}: {}\"];",
            g.values[p.index()]
        );
    }
    // A merged instruction's value comes from the kernel that writes it.
    for p in producer.iter_mut().flatten() {
        *p = fused.merged_into[*p].unwrap_or(*p);
    }
    for (i, inst) in g.insts.iter().enumerate() {
        if fused.inlined[i] || fused.merged_into[i].is_some() {
            continue;
        }
        let ty = &g.values[inst.results[0].index()];
        let label = if fused.kernels[i].is_some() {
            let members: Vec<String> = fused.members[i]
                .iter()
                .map(|&m| format!("#{m} {}", g.insts[m].op.mnemonic()))
                .collect();
            let also: String = fused.extra[i]
                .iter()
                .map(|v| format!(", {v}: {}", g.values[v.index()]))
                .collect();
            format!("k{i} -> {ty}{also}\\n{}", members.join("\\n"))
        } else {
            format!("#{i} {} -> {ty}", inst.op.mnemonic())
        };
        let _ = writeln!(s, "  n{i} [label=\"{label}\"];");
        for v in &fused.operands[i] {
            match producer[v.index()] {
                Some(p) => {
                    let _ = writeln!(s, "  n{p} -> n{i};");
                }
                None => {
                    if let Some(k) = g.params.iter().position(|q| q == v) {
                        let _ = writeln!(s, "  p{k} -> n{i};");
                    }
                }
            }
        }
    }
    for (k, o) in g.outputs.iter().enumerate() {
        let _ = writeln!(s, "  out{k} [shape=ellipse, label=\"output {k}\"];");
        if let Some(p) = producer[o.index()] {
            let _ = writeln!(s, "  n{p} -> out{k};");
        }
    }
    s.push_str("}\n");
    Ok(s)
}

/// The program the backend lowers: its calls inlined ([`kiln_ir::inline_calls`]), optimized
/// (with [`Options::optimize`], under the costs of
/// `target`, see [`TargetInfo::cost_machine`]), then canonicalized for `target`.
pub fn prepare(f: &Func, opts: &Options, target: &TargetInfo) -> Result<Func> {
    // Calls go first: every later pass, and every backend, sees a call-free program.
    let f =
        &kiln_ir::inline_calls(f).map_err(|e| Error::Lowering(format!("inlining calls: {e}")))?;
    let f = &crate::minifloat::expand_minifloats(f)
        .map_err(|e| Error::Lowering(format!("holding small floats in f32: {e}")))?;
    let f = &canon::widen_dots(f, target.gpu.is_some())
        .map_err(|e| Error::Lowering(format!("widening mixed matrix products: {e}")))?;
    let optimized;
    let f = if !opts.optimize {
        f
    } else {
        optimized = kiln_opt::optimize(f, &opts.optimizer(target.cost_machine()))
            .map_err(|e| Error::Lowering(format!("optimizing: {e}")))?
            .0;
        &optimized
    };
    let f = &crate::fft::expand_ffts(f, &target.fusion)
        .map_err(|e| Error::Lowering(format!("expanding fft into products: {e}")))?;
    // Regions expanded into elementwise ops before complex values are split, so that complex
    // ops in a `map` or a reduction's body are computed on parts like the others.
    let f = &crate::reduce_tree::expand_region_reduces(f, target)
        .map_err(|e| Error::Lowering(format!("expanding reduce_region: {e}")))?;
    let f = &crate::complex::split_complex(f)
        .map_err(|e| Error::Lowering(format!("splitting complex numbers into parts: {e}")))?;
    let f = &canon::expand_rngs(f)
        .map_err(|e| Error::Lowering(format!("expanding rng_bit_generator: {e}")))?;
    let f = &crate::bits::expand_pred_bitcasts(f)
        .map_err(|e| Error::Lowering(format!("expanding bitcasts to or from pred: {e}")))?;
    let f = &crate::precision::expand_reduce_precisions(f)
        .map_err(|e| Error::Lowering(format!("expanding reduce_precision: {e}")))?;
    let f = &canon::fold_transposed_products(f)
        .map_err(|e| Error::Lowering(format!("folding transposed products: {e}")))?;
    let winograd;
    let f = if opts.winograd {
        winograd = canon::winograd_convs(f, target).map_err(|e| {
            Error::Lowering(format!("rewriting 3 x 3 convolutions (Winograd): {e}"))
        })?;
        &winograd
    } else {
        f
    };
    let banded;
    let f = if opts.band_sums {
        banded = crate::band_sums::band_column_sums(f, target)
            .map_err(|e| Error::Lowering(format!("summing columns in bands of rows: {e}")))?;
        &banded
    } else {
        f
    };
    let convs = canon::gemm_convs(f)
        .map_err(|e| Error::Lowering(format!("rewriting convolutions: {e}")))?;
    canon::canonicalize_dots(&convs)
        .map_err(|e| Error::Lowering(format!("canonicalizing matrix products: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instruction_without_a_kernel_is_printed_with_its_reason() {
        let src = "func @r(%0: u32[4], %1: f32[4]) -> (u32[4], u32[2,2], f32[4]) {\n  %2, %3 = rng_bit_generator %0 {algorithm = THREE_FRY} : u32[4], u32[2,2]\n  %4 = constant {value = 1.0} : f32[]\n  %5 = broadcast_in_dim %4 {broadcast_dimensions = []} : f32[4]\n  %6 = add %1, %5 : f32[4]\n  return %2, %3, %6\n}\n";
        let f = kiln_ir::parse_func_text(src).expect("valid IR");
        let opts = Options::default();
        let fused = fused_kernels(&f, &opts, &TargetInfo::reference());
        assert_eq!(steps_of(&f, &fused)[0], Step::Reference);
        let text = crate::print::fused_text(&f, &fused);
        assert!(
            text.contains(
                "#0 rng_bit_generator: interpreted (a generator with two results, run by the \
                 interpreter where canonicalization did not expand it)\n"
            ),
            "{text}"
        );
        // The constant runs nothing and is left out; the broadcast runs inside the add's kernel.
        assert_eq!(text.matches(": interpreted").count(), 1, "{text}");
        assert!(text.contains("kernel k3 (#3 add)"), "{text}");
    }
}

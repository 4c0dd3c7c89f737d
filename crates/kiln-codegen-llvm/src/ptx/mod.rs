//! PTX through LLVM's NVPTX target (no GPU or CUDA toolkit needed to produce it): the launches
//! of a kernel mapped to the GPU ([`kiln_kernel::gpu`]) rendered one `.entry` each, statement
//! by statement, as the GPU emulator in `kiln-runtime` defines them.
//!
//! - `kernel.rs`: a [`GpuKernel`] as an LLVM function: its buffers as global pointers
//!   (address space 1), its shared arrays as address-space-3 globals, registers and loop
//!   variables in stack slots (promoted to SSA values by the optimizer), `For`/`If` as control
//!   flow, special registers, barriers and warp shuffles through NVVM intrinsics.
//! - `mma.rs`, `copy.rs`, `wgmma.rs`, `tma.rs`: the tensor-core statements, asynchronous
//!   copies, sm_90a's warpgroup products, and its mbarriers and TMA loads (tensor maps as
//!   `__grid_constant__` parameters after the buffers); `atomic.rs`: atomic float additions
//!   (`red.global.add`), which the mapping emits only where the options allow them.
//! - `expr.rs`: kernel-IR expressions at a thread's loop variables, reductions in the
//!   [`kiln_kernel::target::SumTree`] order the emulator follows.
//! - Element operations are the CPU's (`crate::common`), with kiln's own LLVM IR for what
//!   the CPU takes from its C math library (PTX cannot call one).
//!
//! The PTX ISA version and the SM come from a [`PtxTarget`].

mod atomic;
mod copy;
mod expr;
mod kernel;
mod mma;
mod tma;
mod wgmma;

use crate::{Error, Result};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::targets::{FileType, TargetMachine};
use kiln_ir::TensorType;
use kiln_kernel::gpu::ir::{GpuKernel, GpuProgram};
use kiln_kernel::kernel::Kernel;
use kiln_kernel::target::TargetInfo;

/// The GPU PTX is generated for: an SM (LLVM's target CPU, `sm_90`) and the target features
/// (`+ptx80`: PTX ISA 8.0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxTarget {
    /// The SM, as LLVM names the CPU (`sm_80`, `sm_90`).
    pub sm: String,
    /// LLVM target features (the PTX ISA version, `+ptx80`).
    pub features: String,
}

impl PtxTarget {
    /// Hopper (H100, H200), PTX ISA 8.0.
    pub fn sm90() -> PtxTarget {
        PtxTarget {
            sm: "sm_90".into(),
            features: "+ptx80".into(),
        }
    }

    /// Hopper's architecture-specific target (`sm_90a`, PTX ISA 8.0): warpgroup products
    /// (`wgmma`), whose PTX runs on sm_90 devices only.
    pub fn sm90a() -> PtxTarget {
        PtxTarget {
            sm: "sm_90a".into(),
            features: "+ptx80".into(),
        }
    }

    /// Whether warpgroup products (`wgmma`) render for it: `sm_90a`.
    pub fn has_wgmma(&self) -> bool {
        self.sm == "sm_90a"
    }

    /// Ampere (A100), PTX ISA 8.0.
    pub fn sm80() -> PtxTarget {
        PtxTarget {
            sm: "sm_80".into(),
            features: "+ptx80".into(),
        }
    }
}

/// The `.entry` name of launch `k`: its name with every character but letters, digits and
/// `_` as `_`.
pub fn entry_name(k: &GpuKernel) -> String {
    k.entry_name()
}

/// The PTX of every launch of `p`, one `.entry` each (named by [`entry_name`]), in one
/// module for `target`.
pub fn program_ptx(p: &GpuProgram, target: &PtxTarget) -> Result<String> {
    let ctx = Context::create();
    let m = ctx.create_module("kiln");
    let tm = crate::ptx_machine(&target.sm, &target.features)?;
    // NVPTX's data layout before any instruction is built: loads and stores take their type's
    // alignment from it. Without it an `i64` store gets LLVM's default 4-byte alignment and
    // is split into two `st.b32` of one 64-bit register, whose low half the driver's JIT was
    // seen to write as zero (an f64 bitcast to i64 on an H200).
    m.set_triple(&tm.get_triple());
    m.set_data_layout(&tm.get_target_data().get_data_layout());
    if let Some(k) = p
        .launches
        .iter()
        .find(|k| (k.uses_wgmma() || k.uses_tma()) && !target.has_wgmma())
    {
        return Err(Error::Unsupported(format!(
            "{}: warpgroup products (wgmma), mbarriers and TMA loads need sm_90a, not {}",
            k.name, target.sm
        )));
    }
    for k in &p.launches {
        kernel::emit(&ctx, &m, k)?;
    }
    assemble(&m, &tm)
}

/// The PTX of one launch `k`, a module of one `.entry` (named by [`entry_name`]).
pub fn kernel_ptx(k: &GpuKernel, target: &PtxTarget) -> Result<String> {
    program_ptx(
        &GpuProgram {
            scratch: Vec::new(),
            zeroed: Vec::new(),
            launches: vec![k.clone()],
        },
        target,
    )
}

/// `k` (inputs of types `inputs`) mapped to the GPU `gpu` describes as `opts` allow (f32
/// products in their precision, float atomics where they allow them), and rendered for
/// `target`; a kernel the mapping refuses is [`Error::Unsupported`].
pub fn ptx_of(
    k: &Kernel,
    inputs: &[TensorType],
    gpu: &TargetInfo,
    opts: &kiln_kernel::Options,
    name: &str,
    target: &PtxTarget,
) -> Result<String> {
    let p = kiln_kernel::gpu::map(k, inputs, gpu, opts, name).map_err(Error::Unsupported)?;
    program_ptx(&p, target)
}

/// Optimizes `m` (verified) and writes it as PTX for `target`.
fn assemble(m: &Module, tm: &TargetMachine) -> Result<String> {
    m.verify().map_err(|e| Error::Llvm(e.to_string()))?;
    crate::optimize(m, tm)?;
    let buf = tm
        .write_to_memory_buffer(m, FileType::Assembly)
        .map_err(|e| Error::Llvm(e.to_string()))?;
    String::from_utf8(buf.as_slice().to_vec()).map_err(|e| Error::Llvm(e.to_string()))
}

/// One kernel step of a function mapped to the GPU: its name (`k{instruction}_{op}`), and
/// its program or why the mapping refused it.
pub type MappedKernel = (String, std::result::Result<GpuProgram, String>);

/// The kernel steps of `f`, lowered with `opts` for the GPU `gpu` describes, each mapped
/// (as the GPU emulator maps them), and its sorts the GPU takes (`kiln_kernel::gpu::sort`).
pub fn mapped_kernels(
    f: &kiln_ir::Func,
    opts: &kiln_kernel::Options,
    gpu: &TargetInfo,
) -> Result<Vec<MappedKernel>> {
    let l = kiln_kernel::pipeline::lower_program(f, &[], opts, gpu, None, &mut |_| {})?;
    let mut out = Vec::new();
    for (i, inst) in l.func.insts.iter().enumerate() {
        if l.steps[i] != kiln_kernel::Step::Kernel {
            // A sort by keys and a linear algebra op run as launches of their own (as the
            // device plan runs them).
            let types = |vs: &[kiln_ir::ValueId]| -> Vec<TensorType> {
                vs.iter()
                    .map(|v| l.func.values[v.index()].clone())
                    .collect()
            };
            let name = format!("k{i}_{}", inst.op.mnemonic());
            if let Some(p) = kiln_kernel::gpu::own_program(
                &inst.op,
                &types(&inst.operands),
                &types(&inst.results),
                gpu,
                &name,
                kiln_kernel::sort::top_k(&l.func, i).map(|t| t.k),
            ) {
                out.push((name, Ok(p)));
            }
            continue;
        }
        let Some(k) = l.fused.kernels[i].as_ref() else {
            continue;
        };
        let ins: Vec<TensorType> = l.fused.operands[i]
            .iter()
            .map(|v| l.func.values[v.index()].clone())
            .collect();
        let name = format!("k{i}_{}", inst.op.mnemonic());
        let p = kiln_kernel::gpu::map(k, &ins, gpu, opts, &name);
        out.push((name, p));
    }
    Ok(out)
}

/// The PTX of every kernel of `f` (lowered with `opts` for an H200) for `target`, a module per
/// kernel step; steps the mapping refuses or that do not render are comments saying why. What `cargo xtask dump FILE --stage ptx` prints.
pub fn function_ptx(
    f: &kiln_ir::Func,
    opts: &kiln_kernel::Options,
    target: &PtxTarget,
) -> Result<String> {
    let mut out = String::new();
    for (name, p) in mapped_kernels(f, opts, &TargetInfo::h200())? {
        match p
            .map_err(Error::Unsupported)
            .and_then(|p| program_ptx(&p, target))
        {
            Ok(text) => {
                out += &format!("// {name}\n{text}\n");
            }
            Err(Error::Unsupported(why)) => out += &format!("// {name}: not rendered: {why}\n\n"),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

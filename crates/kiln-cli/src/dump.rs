//! `kiln dump`: a model at one compilation stage, as `cargo xtask dump` prints it; the `dot`
//! stage (the fused kernels for Graphviz) can be drawn as SVG or PNG with `--render`.

use crate::error::Error;
use crate::model;
use std::path::Path;

/// The stages `kiln dump` prints.
pub const STAGES: &str = "opt|fused|dot|kernels|llvm|ptx";

/// `kiln dump MODEL --stage STAGE [--sm SM] [--host]`: with `host`, the `kernels` and `fused`
/// stages as a compile for this machine decides them (its vectors, caches and threads; the
/// `fused` stage is then what `KILN_EXPLAIN=1` prints), not for the machine-independent
/// reference CPU.
pub fn dump(model: &Path, stage: &str, sm: Option<&str>, host: bool) -> Result<String, Error> {
    let m = model::load(model)?;
    let f = model::entry(&m)?;
    let opts = kiln::options();
    let compile = |e: String| Error::Compile(format!("@{}: {e}", f.name));
    if host {
        return match stage {
            "kernels" => kiln_codegen_llvm::cpu::describe_host_kernels(f, &opts),
            "fused" => kiln_codegen_llvm::cpu::describe_host_fusion(f, &opts),
            other => return Err(host_only_for(other)),
        }
        .map_err(|e| compile(e.to_string()));
    }
    match stage {
        "opt" => {
            let o = kiln_opt::Options {
                fast_math: opts.fast_math,
                ..kiln_opt::Options::default()
            };
            kiln_opt::explain(f, &o).map_err(compile)
        }
        "kernels" => {
            kiln_kernel::print::describe_kernels(f, &opts).map_err(|e| compile(e.to_string()))
        }
        "fused" => {
            kiln_codegen_llvm::cpu::describe_fusion(f, &opts).map_err(|e| compile(e.to_string()))
        }
        "dot" => kiln_kernel::pipeline::fusion_dot(f, &opts).map_err(|e| compile(e.to_string())),
        "llvm" => {
            let before = kiln_codegen_llvm::cpu::function_llvm_ir(f, false, &opts)
                .map_err(|e| compile(e.to_string()))?;
            let after = kiln_codegen_llvm::cpu::function_llvm_ir(f, true, &opts)
                .map_err(|e| compile(e.to_string()))?;
            Ok(format!(
                "; LLVM IR before optimization\n{before}; LLVM IR after O2 for this CPU\n{after}"
            ))
        }
        "ptx" => {
            let target = kiln_codegen_llvm::ptx::PtxTarget {
                sm: sm.unwrap_or("sm_90").to_string(),
                ..kiln_codegen_llvm::ptx::PtxTarget::sm90()
            };
            kiln_codegen_llvm::ptx::function_ptx(f, &opts, &target)
                .map_err(|e| compile(e.to_string()))
        }
        other => Err(Error::Usage(format!(
            "unknown stage `{other}` (the stages: {STAGES})"
        ))),
    }
}

/// `kiln dump MODEL --stage dot --render OUT [--dot-program PROG]`: the fused graph drawn by
/// Graphviz's `dot` (or `program`) into `out` (`.svg` or `.png`), its text kept next to it as
/// `.dot`. Returns what to print.
pub fn render(model: &Path, out: &Path, program: &str) -> Result<String, Error> {
    // A bad picture name is a usage error, found before compiling anything.
    kiln_kernel::render::format_of(out).map_err(Error::Usage)?;
    let dot = dump(model, "dot", None, false)?;
    let r = kiln_kernel::render::render_dot(&dot, out, program).map_err(Error::Output)?;
    Ok(format!(
        "wrote {} (Graphviz text: {})\n",
        r.picture.display(),
        r.dot.display()
    ))
}

/// The usage error for `--host` with a stage it does not apply to.
pub fn host_only_for(stage: &str) -> Error {
    Error::Usage(format!(
        "--host prints the `kernels` and `fused` stages as decided for this machine, not \
         `{stage}`"
    ))
}

//! `kiln dump`: a model at one compilation stage, as `cargo xtask dump` prints it.

use crate::error::Error;
use crate::model;
use std::path::Path;

/// The stages `kiln dump` prints.
pub const STAGES: &str = "opt|fused|kernels|llvm|ptx";

/// `kiln dump MODEL --stage STAGE [--sm SM]`.
pub fn dump(model: &Path, stage: &str, sm: Option<&str>) -> Result<String, Error> {
    let m = model::load(model)?;
    let f = model::entry(&m)?;
    let opts = kiln::options();
    let compile = |e: String| Error::Compile(format!("@{}: {e}", f.name));
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

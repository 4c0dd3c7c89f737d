//! Prints the LLVM IR of a `.kir` file's entry function, or its fused kernels:
//! `kiln-llvm-dump FILE [--optimized | --fused | --dot | --ptx=sm_90 | --plan [--donate=0,1,...]]`. Used by
//! `cargo xtask dump FILE --stage llvm|fused|dot|plan|ptx` (`--ptx=SM`: each kernel mapped
//! to the GPU for an H200 and rendered as PTX for that SM). `--donate` lists the donated parameters
//! whose buffers the plan may reuse for results.

use std::process::ExitCode;

fn main() -> ExitCode {
    // A program's boundary: the one place it reads the environment.
    let opts = kiln_kernel::Options::from_vars(&|name| std::env::var(name).ok());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(file) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!(
            "usage: kiln-llvm-dump FILE [--optimized | --fused | --dot | --ptx=SM | --plan [--donate=0,1,...]]"
        );
        return ExitCode::FAILURE;
    };
    let donate: Result<Vec<usize>, String> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--donate="))
        .flat_map(|l| l.split(','))
        .map(|p| {
            p.trim()
                .parse()
                .map_err(|e| format!("--donate: `{p}`: {e}"))
        })
        .collect();
    let optimized = args.iter().any(|a| a == "--optimized");
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{file}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = kiln_ir::parse_module(&text)
        .map_err(|e| format!("{file}:{e}"))
        .and_then(|m| m.entry().cloned().ok_or_else(|| "no function".to_string()))
        .and_then(|f| {
            let donate = donate?;
            if let Some(&p) = donate.iter().find(|&&p| p >= f.params.len()) {
                return Err(format!("--donate: @{} has no parameter {p}", f.name));
            }
            let mut donated = vec![false; f.params.len()];
            for p in donate {
                donated[p] = true;
            }
            if args.iter().any(|a| a == "--fused") {
                kiln_codegen_llvm::cpu::describe_fusion(&f, &opts)
            } else if args.iter().any(|a| a == "--plan") {
                kiln_codegen_llvm::cpu::describe_memory_donating(&f, &donated, &opts)
            } else if let Some(sm) = args.iter().find_map(|a| a.strip_prefix("--ptx=")) {
                let target = kiln_codegen_llvm::ptx::PtxTarget {
                    sm: sm.to_string(),
                    ..kiln_codegen_llvm::ptx::PtxTarget::sm90()
                };
                kiln_codegen_llvm::ptx::function_ptx(&f, &opts, &target)
            } else if args.iter().any(|a| a == "--dot") {
                kiln_kernel::pipeline::fusion_dot(&f, &opts).map_err(Into::into)
            } else {
                kiln_codegen_llvm::cpu::function_llvm_ir(&f, optimized, &opts)
            }
            .map_err(|e| e.to_string())
        });
    match result {
        Ok(ir) => {
            print!("{ir}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

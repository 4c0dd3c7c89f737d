//! `kiln-run`: runs an ahead-of-time artifact (see the `kiln_run` library) on a GPU, the GPU
//! emulator or (a CPU artifact) this CPU. No compiler is linked: the artifact's PTX is loaded
//! by the CUDA driver, its CPU kernels from their shared libraries.

use kiln_run::cli::{USAGE, run};
use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if argv.iter().any(|a| a == "--version") {
        println!("kiln-run {}", kiln_run::artifact::KILN_VERSION);
        return ExitCode::SUCCESS;
    }
    // A bug below must still end in a message and an exit code, not an abort.
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(|| run(&argv));
    match r {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("kiln-run: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
        Err(p) => {
            let m = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!("kiln-run: internal error (a bug in kiln; please report it): {m}");
            ExitCode::from(70)
        }
    }
}

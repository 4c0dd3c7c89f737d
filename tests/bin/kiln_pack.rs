//! `kiln-pack DIR --kiln-run BINARY [--quick]`: writes the GPU pack (see `kiln_tests::pack`).
//! `cargo xtask gpu-pack DIR [--quick]` builds `kiln-run` in release mode and runs this.

use kiln_tests::pack::{PackOptions, pack};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: kiln-pack DIR --kiln-run BINARY [--quick]";
    let mut dir = None;
    let mut kiln_run = None;
    let mut quick = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => quick = true,
            "--kiln-run" => {
                i += 1;
                kiln_run = args.get(i).map(PathBuf::from);
            }
            a if !a.starts_with("--") && dir.is_none() => dir = Some(PathBuf::from(a)),
            a => {
                eprintln!("kiln-pack: unknown argument {a}\n{usage}");
                return ExitCode::from(2);
            }
        }
        i += 1;
    }
    let (Some(dir), Some(kiln_run)) = (dir, kiln_run) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    match pack(&PackOptions {
        dir: dir.clone(),
        quick,
        kiln_run,
    }) {
        Ok(s) => {
            for why in &s.skipped {
                println!("left out: {why}");
            }
            println!(
                "{}: {} programs, {} workloads, {} sweep variants, {:.1} MiB",
                dir.display(),
                s.programs,
                s.workloads,
                s.variants,
                s.bytes as f64 / (1 << 20) as f64
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kiln-pack: {e}");
            ExitCode::FAILURE
        }
    }
}

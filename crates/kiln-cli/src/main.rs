//! `kiln`: run, inspect, benchmark and export models written as StableHLO text (`.mlir`, as
//! JAX's `lowered.as_text()` prints) or kiln IR text (`.kir`).

mod bench;
mod dump;
mod error;
mod export;
mod model;
mod run;

use error::Error;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "usage:
  kiln run MODEL [--input NAME=FILE.npy]... [--output DIR]
  kiln dump MODEL --stage opt|fused|dot|kernels|llvm|ptx [--sm sm_90] [--host]
  kiln dump MODEL --stage dot --render OUT.svg|OUT.png [--dot-program dot]
  kiln bench MODEL [--input NAME=FILE.npy]... [--runs N] [--seed S]
  kiln export MODEL [-o OUT.mlir]

MODEL is StableHLO text (.mlir) or kiln IR (.kir); its entry function (@main or the first) runs.
An input NAME is a parameter's position (0, arg0 or %arg0); other names take the parameters
left in the order given. `run` prints the results, or writes DIR/out0.npy, ... with --output.
`bench` prints the compile time and the median run time (inputs random from the seed when none
are given). `--render` draws the fused kernels with Graphviz's `dot` (apt-get install graphviz,
brew install graphviz) and keeps the graph's text as OUT.dot. The dumps describe the
machine-independent reference CPU (the same text everywhere); `--host` prints the `kernels` and
`fused` stages as a compile for this machine decides them (the `fused` one is what
KILN_EXPLAIN=1 prints when the model is compiled).
`export` writes StableHLO text (to stdout without -o).
The backend is the CPU unless KILN_BACKEND selects another (see the kiln crate).
Exit codes: 0 success, 2 usage, 3 bad model, 4 bad input, 5 compile or export failed,
6 run failed, 7 output not written.";

/// The parsed command line.
#[derive(Default)]
struct Args {
    command: String,
    model: Option<PathBuf>,
    inputs: Vec<(String, String)>,
    output: Option<PathBuf>,
    stage: Option<String>,
    sm: Option<String>,
    runs: Option<usize>,
    seed: Option<u64>,
    render: Option<PathBuf>,
    dot_program: Option<String>,
    host: bool,
}

fn parse(argv: &[String]) -> Result<Args, Error> {
    let usage = |m: String| Error::Usage(format!("{m}\n{USAGE}"));
    let mut a = Args {
        command: argv
            .first()
            .cloned()
            .ok_or_else(|| usage("no command".into()))?,
        ..Args::default()
    };
    let mut it = argv[1..].iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| usage(format!("{flag} needs a value")))
        };
        match arg.as_str() {
            "--input" => {
                let v = value("--input")?;
                let (n, f) = v
                    .split_once('=')
                    .ok_or_else(|| usage(format!("--input `{v}`: expected NAME=FILE.npy")))?;
                a.inputs.push((n.to_string(), f.to_string()));
            }
            "--output" | "-o" => a.output = Some(PathBuf::from(value(arg)?)),
            "--stage" => a.stage = Some(value("--stage")?),
            "--sm" => a.sm = Some(value("--sm")?),
            "--render" => a.render = Some(PathBuf::from(value("--render")?)),
            "--dot-program" => a.dot_program = Some(value("--dot-program")?),
            "--host" => a.host = true,
            "--runs" => {
                let v = value("--runs")?;
                a.runs = Some(
                    v.parse()
                        .map_err(|_| usage(format!("--runs `{v}`: not a count")))?,
                );
            }
            "--seed" => {
                let v = value("--seed")?;
                a.seed = Some(
                    v.parse()
                        .map_err(|_| usage(format!("--seed `{v}`: not a number")))?,
                );
            }
            "-h" | "--help" => return Err(Error::Usage(USAGE.into())),
            s if s.starts_with('-') => return Err(usage(format!("unknown flag `{s}`"))),
            s if a.model.is_none() => a.model = Some(PathBuf::from(s)),
            s => return Err(usage(format!("unexpected argument `{s}`"))),
        }
    }
    Ok(a)
}

fn main_with(argv: &[String]) -> Result<(), Error> {
    let a = parse(argv)?;
    let usage = |m: &str| Error::Usage(format!("{m}\n{USAGE}"));
    let model: &Path = a
        .model
        .as_deref()
        .ok_or_else(|| usage(&format!("`kiln {}` needs a MODEL", a.command)))?;
    match a.command.as_str() {
        "run" => run::run(model, &a.inputs, a.output.as_deref()),
        "dump" => {
            let stage = a
                .stage
                .as_deref()
                .ok_or_else(|| usage(&format!("`kiln dump` needs --stage {}", dump::STAGES)))?;
            match &a.render {
                Some(_) if a.host => return Err(dump::host_only_for(stage)),
                Some(out) if stage == "dot" => {
                    let program = a
                        .dot_program
                        .as_deref()
                        .unwrap_or(kiln_kernel::render::DEFAULT_DOT_PROGRAM);
                    print!("{}", dump::render(model, out, program)?);
                }
                Some(_) => {
                    return Err(usage(&format!(
                        "--render draws the `dot` stage, not `{stage}`"
                    )));
                }
                None => print!("{}", dump::dump(model, stage, a.sm.as_deref(), a.host)?),
            }
            Ok(())
        }
        "bench" => {
            let t = bench::bench(model, &a.inputs, a.runs.unwrap_or(10), a.seed.unwrap_or(0))?;
            println!("compile: {:.3} ms", t.compile_ms);
            println!("run: median {:.3} ms over {} runs", t.median_ms, t.runs);
            Ok(())
        }
        "export" => {
            if let Some(text) = export::export(model, a.output.as_deref())? {
                print!("{text}");
            }
            Ok(())
        }
        other => Err(usage(&format!("unknown command `{other}`"))),
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match main_with(&argv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kiln: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

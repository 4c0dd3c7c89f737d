//! The `kiln-run` command line ([`run`]), apart from the binary so that programs and tests run
//! it in process.

use crate::exec::{self, Device, Runner};
use crate::{Artifact, Error};
use std::path::PathBuf;

/// The usage text (`kiln-run --help`).
pub const USAGE: &str = "usage: kiln-run ARTIFACT [--inputs A.npy B.npy ... | --random-inputs SEED]
                [--save-inputs DIR] [--out DIR] [--device cuda|cuda:N|emulator|cpu]
                [--bench N] [--expect R0.npy R1.npy ...]

Runs the artifact ARTIFACT (a folder written by kiln::aot) once on its inputs and writes each
result as DIR/out0.npy, DIR/out1.npy, ...
  --inputs FILES       the arguments, one .npy file each, in order
  --random-inputs SEED make the arguments from SEED (the same on every machine)
  --save-inputs DIR    write the arguments used as DIR/arg0.npy, ...
  --out DIR            where the results go (none written without it)
  --device D           cuda:N (default cuda:0) or emulator (the GPU emulator, on the CPU)
                       for a GPU artifact; cpu (the default) for a CPU artifact
  --bench N            also time N calls (arguments left on the device) and print
                       {\"median_ms\": ...} as JSON
  --expect FILES       compare the results with these .npy files under the bounds of kiln's
                       differential tests (exit code 7 when they differ)
Exit codes: 0 success, 2 usage, 3 bad artifact, 4 bad input, 5 no device, 6 run failed,
7 results differ.";

#[derive(Default)]
struct Args {
    artifact: Option<PathBuf>,
    inputs: Option<Vec<PathBuf>>,
    random: Option<u64>,
    save_inputs: Option<PathBuf>,
    out: Option<PathBuf>,
    device: Option<Device>,
    bench: Option<usize>,
    expect: Option<Vec<PathBuf>>,
}

fn parse(argv: &[String]) -> Result<Args, Error> {
    let mut a = Args::default();
    let mut i = 0;
    let usage = |m: String| Error::Usage(format!("{m}\n{USAGE}"));
    let value = |i: usize, flag: &str| {
        argv.get(i + 1)
            .filter(|v| !v.starts_with("--"))
            .cloned()
            .ok_or_else(|| usage(format!("{flag} needs a value")))
    };
    let files = |i: &mut usize| {
        let mut v = Vec::new();
        while let Some(f) = argv.get(*i + 1).filter(|f| !f.starts_with("--")) {
            v.push(PathBuf::from(f));
            *i += 1;
        }
        v
    };
    while i < argv.len() {
        let flag = argv[i].as_str();
        match flag {
            "--inputs" => a.inputs = Some(files(&mut i)),
            "--expect" => a.expect = Some(files(&mut i)),
            "--random-inputs" => {
                let v = value(i, flag)?;
                a.random = Some(v.parse().map_err(|_| {
                    usage(format!(
                        "--random-inputs {v}: the seed is a non-negative integer"
                    ))
                })?);
                i += 1;
            }
            "--bench" => {
                let v = value(i, flag)?;
                a.bench = Some(v.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| {
                    usage(format!("--bench {v}: the count is a positive integer"))
                })?);
                i += 1;
            }
            "--save-inputs" => {
                a.save_inputs = Some(value(i, flag)?.into());
                i += 1;
            }
            "--out" => {
                a.out = Some(value(i, flag)?.into());
                i += 1;
            }
            "--device" => {
                a.device = Some(Device::parse(&value(i, flag)?)?);
                i += 1;
            }
            f if f.starts_with("--") => return Err(usage(format!("unknown option {f}"))),
            path => {
                if a.artifact.is_some() {
                    return Err(usage(format!("a second artifact `{path}`")));
                }
                a.artifact = Some(path.into());
            }
        }
        i += 1;
    }
    if a.artifact.is_none() {
        return Err(usage("no artifact given".into()));
    }
    if a.inputs.is_some() == a.random.is_some() {
        return Err(usage(
            "give the arguments with either --inputs or --random-inputs".into(),
        ));
    }
    Ok(a)
}

/// The command `kiln-run ARGV...` (without the program's name; see [`USAGE`]): parses the
/// arguments, loads the artifact, runs it once and writes, times and checks as asked.
pub fn run(argv: &[String]) -> Result<(), Error> {
    let a = parse(argv)?;
    let dir = a.artifact.as_deref().unwrap_or(std::path::Path::new("."));
    let artifact = Artifact::load(dir)?;
    let args = match (&a.inputs, a.random) {
        (Some(files), _) => exec::read_inputs(&artifact, files)?,
        (None, seed) => exec::random_inputs(&artifact, seed.unwrap_or(0)),
    };
    if let Some(d) = &a.save_inputs {
        exec::write_all(d, "arg", &args)?;
    }
    let default = if artifact.target.is_cpu() {
        Device::Cpu
    } else {
        Device::Cuda(0)
    };
    let device = a.device.clone().unwrap_or(default);
    let runner = if artifact.target.is_cpu() {
        if device != Device::Cpu {
            return Err(Error::Device(format!(
                "{device}: a CPU artifact runs on the CPU (`--device cpu`, the default for it)"
            )));
        }
        Runner::open_cpu(&artifact)?
    } else {
        Runner::open(&artifact, artifact.device_plan()?, &device)?
    };
    let got = runner.run(&args)?;
    if let Some(d) = &a.out {
        exec::write_all(d, "out", &got)?;
    }
    if let Some(n) = a.bench {
        let times = runner.bench(&args, n)?;
        let ms = |s: f64| s * 1e3;
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{}",
            serde_json::json!({
                "artifact": dir.display().to_string(),
                "device": device.to_string(),
                "calls": n,
                "median_ms": ms(exec::median(&times)),
                "min_ms": ms(min),
            })
        );
    }
    if let Some(files) = &a.expect {
        exec::check_expected(&artifact, &args, &got, files)?;
    }
    Ok(())
}

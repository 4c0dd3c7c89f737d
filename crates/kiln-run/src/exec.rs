//! Running an artifact: the device chosen ([`Device`]), its arguments read or made
//! ([`read_inputs`], [`random_inputs`]), its plan loaded ([`Runner::open`]) and run once or
//! timed, its results checked against expected ones ([`check_expected`]).

use crate::artifact::{Artifact, Port};
use crate::{Error, npy};
use kiln_ir::Literal;
use kiln_kernel::gpu::plan::DevicePlan;
use kiln_runtime::cuda::{Gpu, GpuError};
use kiln_runtime::cuda_exec::CudaExecutable;
use kiln_runtime::gpu_emu::EmuDevice;
use kiln_runtime::kernel_program::LoadedProgram;
use kiln_runtime::plan_exec;
use std::path::{Path, PathBuf};

/// Where an artifact runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Device {
    /// NVIDIA GPU `N` through the CUDA driver (`cuda:N`; `cuda` is `cuda:0`).
    Cuda(usize),
    /// The GPU emulator (`emulator`): the same plan, thread by thread on the CPU.
    Emulator,
    /// This machine's CPU (`cpu`), for a CPU artifact.
    Cpu,
}

impl Device {
    /// The device a `--device` value names.
    pub fn parse(s: &str) -> Result<Device, Error> {
        match s {
            "emulator" => Ok(Device::Emulator),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "--device {s}: a device is `cuda`, `cuda:N` (N the GPU's index), `emulator` or `cpu`"
                    ))
                }),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Emulator => write!(f, "emulator"),
            Device::Cpu => write!(f, "cpu"),
        }
    }
}

fn signature(ports: &[Port]) -> String {
    ports
        .iter()
        .map(|p| format!("{}: {}", p.name, p.ty))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The arguments in `files` (`.npy`), checked against the artifact's: their number, then each
/// one's dtype and shape.
pub fn read_inputs(a: &Artifact, files: &[PathBuf]) -> Result<Vec<Literal>, Error> {
    if files.len() != a.args.len() {
        return Err(Error::Input(format!(
            "{} input files given, the artifact takes {} argument(s) ({})",
            files.len(),
            a.args.len(),
            signature(&a.args)
        )));
    }
    files
        .iter()
        .zip(&a.args)
        .map(|(f, p)| {
            let l = npy::as_dtype(npy::read(f).map_err(Error::Input)?, p.ty.dtype)
                .map_err(|e| Error::Input(format!("{} ({}): {e}", p.name, f.display())))?;
            if l.ty() != &p.ty {
                return Err(Error::Input(format!(
                    "{} ({}): a {} array, the artifact takes {}",
                    p.name,
                    f.display(),
                    l.ty(),
                    p.ty
                )));
            }
            Ok(l)
        })
        .collect()
}

/// Arguments made from `seed`, the same on every machine: argument `i` from the random
/// generator seeded with `seed * 1000003 + i` (floats in [-4, 4), integers in [-20, 20),
/// unsigned ones in [0, 40); see [`kiln_ir::random::random_literal`]).
pub fn random_inputs(a: &Artifact, seed: u64) -> Vec<Literal> {
    a.args
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut rng =
                kiln_ir::random::Rng::new(seed.wrapping_mul(1_000_003).wrapping_add(i as u64));
            kiln_ir::random::random_literal(&mut rng, &p.ty)
        })
        .collect()
}

/// Writes `values` into `dir` as `{prefix}{i}.npy`.
pub fn write_all(dir: &Path, prefix: &str, values: &[Literal]) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Input(format!("{}: cannot make the folder: {e}", dir.display())))?;
    values
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let p = dir.join(format!("{prefix}{i}.npy"));
            npy::write(&p, l).map_err(Error::Input)?;
            Ok(p)
        })
        .collect()
}

/// `got` against the results in `files`, under the bounds the emulator's differential tests
/// hold kiln to (`kiln_reference::accuracy`, each output's bound computed from the program on
/// `args`).
pub fn check_expected(
    a: &Artifact,
    args: &[Literal],
    got: &[Literal],
    files: &[PathBuf],
) -> Result<(), Error> {
    if files.len() != a.results.len() {
        return Err(Error::Input(format!(
            "{} expected files given for {} result(s) ({})",
            files.len(),
            a.results.len(),
            signature(&a.results)
        )));
    }
    let want = files
        .iter()
        .zip(&a.results)
        .map(|(f, p)| {
            let l = npy::as_dtype(npy::read(f).map_err(Error::Input)?, p.ty.dtype)
                .map_err(|e| Error::Input(format!("{} ({}): {e}", p.name, f.display())))?;
            if l.ty() != &p.ty {
                return Err(Error::Input(format!(
                    "{} ({}): a {} array, the result is {}",
                    p.name,
                    f.display(),
                    l.ty(),
                    p.ty
                )));
            }
            Ok(l)
        })
        .collect::<Result<Vec<_>, _>>()?;
    kiln_reference::accuracy::check_outputs_against(&a.program, args, got, &want)
        .map(|_| ())
        .map_err(Error::Mismatch)
}

/// An artifact loaded onto a device, ready to run.
pub enum Runner {
    /// On the GPU emulator.
    Emulator(Box<DevicePlan>),
    /// On a GPU.
    Cuda(Box<CudaExecutable>),
    /// A CPU artifact's programs, on this CPU.
    Cpu(Box<LoadedProgram>),
}

fn device_error(e: GpuError) -> Error {
    match e {
        GpuError::NoDriver { .. } | GpuError::NoDevice { .. } | GpuError::TooOld { .. } => {
            Error::Device(e.to_string())
        }
        _ => Error::Run(e.to_string()),
    }
}

impl Runner {
    /// `a` (its plan `plan`, from [`Artifact::device_plan`]) loaded onto `device`: on a GPU,
    /// the device opened (without a driver, an error naming the libraries looked for), its SM
    /// checked against the PTX's, the plan checked against its limits and the PTX loaded.
    pub fn open(a: &Artifact, plan: DevicePlan, device: &Device) -> Result<Runner, Error> {
        if a.target.is_cpu() {
            return Err(Error::Device(format!(
                "{device}: a CPU artifact runs on the CPU (`--device cpu`)"
            )));
        }
        match device {
            Device::Cpu => Err(Error::Device(
                "a GPU artifact runs on `cuda:N` or the `emulator`, not on the CPU".into(),
            )),
            Device::Emulator => Ok(Runner::Emulator(Box::new(plan))),
            Device::Cuda(index) => {
                let gpu = Gpu::open(*index).map_err(device_error)?;
                let (major, minor) = gpu.info().compute_capability;
                let have = major * 10 + minor;
                let need = a.target.sm_number().ok_or_else(|| {
                    Error::Artifact(format!("target.sm `{}` is not an SM (sm_NN)", a.target.sm))
                })?;
                // Architecture-specific PTX (`sm_90a`: warpgroup products) runs on its own SM
                // only.
                let specific = a.target.sm.ends_with('a');
                if have < need || (specific && have != need) {
                    return Err(Error::Device(format!(
                        "cuda:{index} ({}) is sm_{have}; the artifact's PTX is for {} (compile it for sm_80 to run here)",
                        gpu.info().name,
                        a.target.sm
                    )));
                }
                let exe = CudaExecutable::new(&gpu, plan, &a.ptx).map_err(device_error)?;
                Ok(Runner::Cuda(Box::new(exe)))
            }
        }
    }

    /// A CPU artifact `a` loaded to run on this CPU ([`crate::cpu::open`]): refused where the
    /// CPU lacks a feature its code requires, or where its libraries are damaged or lack a
    /// kernel function.
    pub fn open_cpu(a: &Artifact) -> Result<Runner, Error> {
        crate::cpu::open(a).map(|p| Runner::Cpu(Box::new(p)))
    }

    /// One call on `args`.
    pub fn run(&self, args: &[Literal]) -> Result<Vec<Literal>, Error> {
        let refs: Vec<&Literal> = args.iter().collect();
        match self {
            Runner::Emulator(plan) => {
                kiln_runtime::gpu_emu::run_plan(plan, &refs).map_err(|e| Error::Run(e.to_string()))
            }
            Runner::Cuda(exe) => exe.run(&refs).map_err(device_error),
            Runner::Cpu(p) => p.call(&refs).map_err(|e| Error::Run(e.to_string())),
        }
    }

    /// The seconds of each of `calls` timed calls on `args` (the arguments written once; each
    /// call from a synchronized device to its last step's completion).
    pub fn bench(&self, args: &[Literal], calls: usize) -> Result<Vec<f64>, Error> {
        let refs: Vec<&Literal> = args.iter().collect();
        match self {
            Runner::Emulator(plan) => {
                let run = Error::Run;
                let mut dev = EmuDevice::new(plan);
                plan_exec::load(plan, &mut dev).map_err(run)?;
                plan_exec::write_params(plan, &mut dev, &refs).map_err(run)?;
                (0..calls)
                    .map(|_| {
                        let start = std::time::Instant::now();
                        plan_exec::run_steps(plan, &mut dev).map_err(Error::Run)?;
                        Ok(start.elapsed().as_secs_f64())
                    })
                    .collect()
            }
            Runner::Cuda(exe) => exe.bench(&refs, calls).map_err(device_error),
            Runner::Cpu(p) => (0..calls)
                .map(|_| {
                    let start = std::time::Instant::now();
                    p.call(&refs).map_err(|e| Error::Run(e.to_string()))?;
                    Ok(start.elapsed().as_secs_f64())
                })
                .collect(),
        }
    }
}

/// The median of `xs` (the mean of the middle two for an even count).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

//! An ahead-of-time artifact: everything a runtime needs to run one program on a GPU or a CPU,
//! with no compiler. A folder of plain files; a GPU artifact's:
//!
//! - `manifest.json`: the format (`"format": "kiln-aot"`, [`FORMAT_VERSION`]), the kiln
//!   version that wrote it, the target (`kind` `ptx`, the SM the PTX was rendered for, and
//!   every field of the [`TargetInfo`] the program was lowered for), the switches it was
//!   lowered with ([`crate::json::options_to_json`]), the arguments' and results' names and
//!   types, and the files below;
//! - `program.kiln`: the program kernel lowering starts from (optimized, canonicalized and
//!   scheduled: [`kiln_kernel::pipeline::Lowered::func`]) in kiln IR text;
//! - `plan.txt`: its device plan as [`plan_text`] prints it, for people to read and for the
//!   runtime to compare with the plan it derives ([`Artifact::device_plan`]);
//! - `kernels/NNN.ptx`: the PTX module of each kernel step, in order.
//!
//! A CPU artifact's manifest has the target `kind` `cpu`, its `arch` (`x86_64`), the `cpu`
//! and the `features` (LLVM's names) its code was compiled for, and lists under
//! `files.programs` each program (the function's own first, then its control steps' regions):
//! `programs/NNN.kiln` (the program as lowered), `programs/NNN.plan.txt` (its memory plan),
//! `kernels/NNN.so` (the shared library of its kernel functions, with the checksum of its
//! bytes), the checksum of its kernels' description, its donated parameters and its regions'
//! programs (see [`crate::cpu`]).
//!
//! The runtime never trusts the plan text: it derives the plan again from `program.kiln`,
//! the target and the options (fusion and the mapping only; the optimizer does not run), and
//! refuses an artifact whose plan prints otherwise (one written by a kiln that decides
//! differently).

use crate::Error;
use crate::cpu::{CpuProgram, program_from_json, program_json};
use crate::json::{options_from_json, options_to_json, target_from_json, target_to_json};
use kiln_ir::{DType, Func, TensorType};
use kiln_kernel::gpu::plan::{DevicePlan, device_plan};
use kiln_kernel::gpu::plan_print::plan_text;
use kiln_kernel::pipeline::{Lowered, LoweredIndex, lower_program};
use kiln_kernel::{Options, TargetInfo};
use serde_json::{Value, json};
use std::path::Path;

/// The artifact format this kiln writes and reads.
pub const FORMAT_VERSION: u64 = 1;

/// This kiln's version, written into every artifact.
pub const KILN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The kind of code an artifact holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// PTX for an NVIDIA GPU (`target.kind` `ptx`).
    Ptx,
    /// Shared libraries of kernels for an x86-64 CPU named `cpu` as LLVM names it
    /// (`sapphirerapids`, `znver4`; `host`: this machine's, which `kiln::aot::compile` fills
    /// in) (`target.kind` `cpu`; see [`crate::cpu`]).
    Cpu {
        /// The CPU's name.
        cpu: String,
    },
}

/// What an artifact runs on.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// PTX or CPU code.
    pub kind: Kind,
    /// The SM the PTX was rendered for (`sm_80`, `sm_90`); empty for a CPU.
    pub sm: String,
    /// The PTX features (`+ptx80`), or the CPU's features as LLVM lists them
    /// (`+avx2,+fma,-avx512f,...`): a CPU artifact runs only where every `+` feature is.
    pub features: String,
    /// What the program was lowered and mapped for.
    pub info: TargetInfo,
}

impl Target {
    /// An NVIDIA GPU of SM `sm` (`sm_80`: Ampere and Ada; `sm_90`: Hopper) with `sms`
    /// multiprocessors: an H200's target ([`TargetInfo::h200`]) with the shared memory a block
    /// gets without opting in (48 KiB: the PTX declares it statically) and what it may opt into
    /// (dynamic shared memory: 227 KiB from `sm_90`, 163 KiB on `sm_80`, 99 KiB on the other
    /// `sm_8x`), as `KILN_BACKEND=cuda` lowers for such a device; its tensor cores take TF32
    /// operands from `sm_80` on, and warpgroup products (`wgmma`) only for `sm_90a`.
    pub fn ptx(sm: &str, sms: usize) -> Target {
        let mut t = Target {
            kind: Kind::Ptx,
            sm: sm.to_string(),
            features: "+ptx80".into(),
            info: TargetInfo::h200(),
        };
        // TF32 tensor cores from sm_80 (Ampere) on.
        let tf32 = t.sm_number().is_some_and(|n| n >= 80);
        let opt_in = match t.sm_number() {
            Some(n) if n >= 90 => None,
            Some(80) => Some(163 << 10),
            Some(n) if n > 80 => Some(99 << 10),
            _ => Some(48 << 10),
        };
        if let Some(g) = t.info.gpu.as_mut() {
            g.sms = sms.max(1);
            g.shared_memory_per_block = 48 << 10;
            g.dynamic_shared_bytes = opt_in.unwrap_or(g.dynamic_shared_bytes);
            g.tf32 = tf32;
            // Warpgroup products only in PTX for sm_90a (architecture-specific: `wgmma`).
            g.wgmma = sm == "sm_90a";
        }
        t
    }

    /// This machine's CPU: `kiln::aot::compile` fills in its name and features (from LLVM)
    /// and what the kernel layer decides with for it.
    pub fn host() -> Target {
        Target::cpu("host", "")
    }

    /// The x86-64 CPU `cpu` (LLVM's name: `x86-64-v3`, `sapphirerapids`) with `features`
    /// (LLVM's form: `+avx2,+fma`; empty: the CPU's own); `kiln::aot::compile` fills in what
    /// the kernel layer decides with for it.
    pub fn cpu(cpu: &str, features: &str) -> Target {
        Target {
            kind: Kind::Cpu {
                cpu: cpu.to_string(),
            },
            sm: String::new(),
            features: features.to_string(),
            info: TargetInfo::reference(),
        }
    }

    /// Whether the target is a CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self.kind, Kind::Cpu { .. })
    }

    /// An H200 (`sm_90`, 132 multiprocessors).
    pub fn h200() -> Target {
        Target::ptx("sm_90", 132)
    }

    /// An A100 (`sm_80`, 108 multiprocessors).
    pub fn a100() -> Target {
        Target::ptx("sm_80", 108)
    }

    /// The SM's number (`sm_90`: 90).
    pub fn sm_number(&self) -> Option<u32> {
        self.sm
            .strip_prefix("sm_")?
            .trim_end_matches('a')
            .parse()
            .ok()
    }
}

/// A named, typed argument or result.
#[derive(Clone, Debug, PartialEq)]
pub struct Port {
    /// Its name (`arg0`, `out0`, ...).
    pub name: String,
    /// Its type.
    pub ty: TensorType,
}

/// An artifact in memory (see the module's documentation).
#[derive(Clone, Debug)]
pub struct Artifact {
    /// The kiln version that wrote it.
    pub kiln_version: String,
    /// The target.
    pub target: Target,
    /// The switches it was lowered with.
    pub options: Options,
    /// The program kernel lowering starts from.
    pub program: Func,
    /// Its device plan, printed.
    pub plan: String,
    /// The PTX module of each kernel step, in order (a GPU artifact's).
    pub ptx: Vec<String>,
    /// The programs, the function's own first, with their kernels' libraries (a CPU
    /// artifact's: see [`crate::cpu`]).
    pub programs: Vec<CpuProgram>,
    /// The arguments.
    pub args: Vec<Port>,
    /// The results.
    pub results: Vec<Port>,
}

/// The index [`lower_program`] reads a program back from: the stored text, under any key.
struct Stored(String);

impl LoweredIndex for Stored {
    fn load(&self, _: &str) -> Option<String> {
        Some(self.0.clone())
    }
    fn store(&self, _: &str, _: &str) {}
}

/// `program` (a lowered program's text form, read back) with the donated parameters
/// `donated`, lowered for `target` under `options` from its own text: fused and scheduled
/// again, never optimized, so a runtime derives its kernels cheaply and exactly as the compiler
/// did. A program that does not lower as it is written is an error.
pub fn relower(
    program: &Func,
    donated: &[bool],
    options: &Options,
    target: &TargetInfo,
) -> Result<Lowered, String> {
    let text = program.to_string();
    let lowered = lower_program(
        program,
        donated,
        options,
        target,
        Some((&Stored(text), "aot")),
        &mut |_| {},
    )
    .map_err(|e| e.to_string())?;
    if !lowered.from_index {
        return Err(format!(
            "@{}: the program does not lower as it is written (it does not parse back, verify or fuse legally)",
            program.name
        ));
    }
    Ok(lowered)
}

/// The device plan of `program` (a lowered program's text form, read back) for `target` under
/// `options`: fused and mapped again ([`relower`]).
pub fn derive_plan(
    program: &Func,
    options: &Options,
    target: &TargetInfo,
) -> Result<DevicePlan, String> {
    let lowered = relower(program, &[], options, target)?;
    device_plan(&lowered, target)
}

fn ports(prefix: &str, tys: &[TensorType]) -> Vec<Port> {
    tys.iter()
        .enumerate()
        .map(|(i, t)| Port {
            name: format!("{prefix}{i}"),
            ty: t.clone(),
        })
        .collect()
}

fn port_json(p: &Port) -> Value {
    json!({ "name": p.name, "dtype": p.ty.dtype.name(), "shape": p.ty.shape })
}

fn port_from_json(what: &str, i: usize, v: &Value) -> Result<Port, String> {
    let bad = |m: &str| format!("manifest `{what}[{i}]`: {m}");
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no name"))?;
    let dtype = v
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no dtype"))?;
    let dtype = DType::from_name(dtype).ok_or_else(|| bad(&format!("unknown dtype `{dtype}`")))?;
    let shape = v
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no shape"))?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("a shape of other than sizes"))?;
    Ok(Port {
        name: name.to_string(),
        ty: TensorType::new(dtype, shape),
    })
}

impl Artifact {
    /// The artifact of `program` (the lowered program's text form, read back) for `target`
    /// under `options`, its plan derived ([`derive_plan`]) and `render` turning each kernel
    /// step's mapped program into PTX (the compiler's part: this crate renders nothing).
    pub fn new(
        program: Func,
        options: &Options,
        target: Target,
        render: &dyn Fn(&kiln_kernel::gpu::GpuProgram) -> Result<String, String>,
    ) -> Result<Artifact, String> {
        let plan = derive_plan(&program, options, &target.info)?;
        let ptx = plan
            .kernel_steps()
            .map(|k| render(&k.program))
            .collect::<Result<Vec<_>, _>>()?;
        kiln_runtime::cuda_exec::check_ptx(&plan, &ptx).map_err(|e| e.to_string())?;
        Ok(Artifact {
            kiln_version: KILN_VERSION.to_string(),
            args: ports("arg", &program.param_types()),
            results: ports("out", &program.output_types),
            plan: plan_text(&plan),
            target,
            options: options.clone(),
            program,
            ptx,
            programs: Vec::new(),
        })
    }

    /// The artifact of a function compiled for the CPU `target` under `options`: its
    /// `programs` (the function's own first, as lowered, with their libraries; see
    /// [`crate::cpu`]). The compiler's part: this crate compiles nothing.
    pub fn new_cpu(
        options: &Options,
        target: Target,
        programs: Vec<CpuProgram>,
    ) -> Result<Artifact, String> {
        if !target.is_cpu() {
            return Err("the target is not a CPU".into());
        }
        let main = programs
            .first()
            .ok_or_else(|| "a CPU artifact without programs".to_string())?;
        Ok(Artifact {
            kiln_version: KILN_VERSION.to_string(),
            args: ports("arg", &main.program.param_types()),
            results: ports("out", &main.program.output_types),
            plan: main.memory.clone(),
            program: main.program.clone(),
            target,
            options: options.clone(),
            ptx: Vec::new(),
            programs,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> Value {
        json!({
            "format": "kiln-aot",
            "format_version": FORMAT_VERSION,
            "kiln_version": self.kiln_version,
            "name": self.program.name,
            "target": self.target_json(),
            "options": options_to_json(&self.options),
            "args": self.args.iter().map(port_json).collect::<Vec<_>>(),
            "results": self.results.iter().map(port_json).collect::<Vec<_>>(),
            "files": self.files_json(),
        })
    }

    fn target_json(&self) -> Value {
        let info = target_to_json(&self.target.info);
        match &self.target.kind {
            Kind::Ptx => json!({
                "kind": "ptx",
                "sm": self.target.sm,
                "features": self.target.features,
                "info": info,
            }),
            Kind::Cpu { cpu } => json!({
                "kind": "cpu",
                "arch": "x86_64",
                "cpu": cpu,
                "features": self.target.features,
                "info": info,
            }),
        }
    }

    fn files_json(&self) -> Value {
        match self.target.kind {
            Kind::Ptx => json!({
                "program": "program.kiln",
                "plan": "plan.txt",
                "ptx": (0..self.ptx.len()).map(ptx_file).collect::<Vec<_>>(),
            }),
            Kind::Cpu { .. } => json!({
                "programs": self
                    .programs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| program_json(i, p))
                    .collect::<Vec<_>>(),
            }),
        }
    }

    /// Writes the artifact into `dir` (made if missing).
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        let io = |p: &Path, e: std::io::Error| Error::Artifact(format!("{}: {e}", p.display()));
        std::fs::create_dir_all(dir.join("kernels")).map_err(|e| io(dir, e))?;
        let manifest = serde_json::to_string_pretty(&self.manifest())
            .map_err(|e| Error::Artifact(e.to_string()))?;
        std::fs::create_dir_all(dir.join("programs")).map_err(|e| io(dir, e))?;
        let mut files: Vec<(String, Vec<u8>)> =
            vec![("manifest.json".to_string(), manifest.into())];
        if self.target.is_cpu() {
            for (i, p) in self.programs.iter().enumerate() {
                let (text, plan, lib) = crate::cpu::files(i);
                files.push((text, p.program.to_string().into()));
                files.push((plan, p.memory.clone().into()));
                if let Some(bytes) = &p.library {
                    files.push((lib, bytes.clone()));
                }
            }
        } else {
            files.push(("program.kiln".to_string(), self.program.to_string().into()));
            files.push(("plan.txt".to_string(), self.plan.clone().into()));
            for (i, p) in self.ptx.iter().enumerate() {
                files.push((ptx_file(i), p.clone().into()));
            }
        }
        for (name, bytes) in files {
            let p = dir.join(name);
            std::fs::write(&p, bytes).map_err(|e| io(&p, e))?;
        }
        Ok(())
    }

    /// Reads the artifact in `dir`: every file present and well formed, the program parsed and
    /// verified, its signature the manifest's.
    pub fn load(dir: &Path) -> Result<Artifact, Error> {
        let bad = |m: String| Error::Artifact(format!("{}: {m}", dir.display()));
        let read = |name: &str| {
            let p = dir.join(name);
            std::fs::read_to_string(&p).map_err(|e| bad(format!("cannot read {name}: {e}")))
        };
        if !dir.is_dir() {
            return Err(bad("no such artifact folder".into()));
        }
        let m: Value = serde_json::from_str(&read("manifest.json")?)
            .map_err(|e| bad(format!("manifest.json is not JSON: {e}")))?;
        let field = |k: &str| {
            m.get(k)
                .ok_or_else(|| bad(format!("manifest.json has no `{k}`")))
        };
        if field("format")?.as_str() != Some("kiln-aot") {
            return Err(bad(
                "manifest.json is not a kiln AOT manifest (`format` is not \"kiln-aot\")".into(),
            ));
        }
        let version = field("format_version")?.as_u64();
        if version != Some(FORMAT_VERSION) {
            return Err(bad(format!(
                "artifact format version {} (this kiln-run reads version {FORMAT_VERSION})",
                field("format_version")?
            )));
        }
        let kiln_version = field("kiln_version")?.as_str().unwrap_or("?").to_string();
        let t = field("target")?;
        let text = |k: &str| {
            t.get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(format!("manifest.json has no target.{k}")))
        };
        let kind = match t.get("kind").and_then(Value::as_str) {
            Some("ptx") => Kind::Ptx,
            Some("cpu") => {
                let arch = text("arch")?;
                if arch != "x86_64" {
                    return Err(bad(format!(
                        "target.arch is \"{arch}\" (kiln-run runs CPU artifacts for x86_64)"
                    )));
                }
                Kind::Cpu { cpu: text("cpu")? }
            }
            _ => {
                return Err(bad(
                    "target.kind is neither \"ptx\" nor \"cpu\" (kiln-run runs GPU and CPU artifacts)"
                        .into(),
                ));
            }
        };
        let target = Target {
            sm: if kind == Kind::Ptx {
                text("sm")?
            } else {
                String::new()
            },
            kind,
            features: text("features")?,
            info: target_from_json(t.get("info").unwrap_or(&Value::Null))
                .map_err(|e| bad(format!("manifest.json: {e}")))?,
        };
        let options =
            options_from_json(field("options")?).map_err(|e| bad(format!("manifest.json: {e}")))?;
        let list = |k: &str| -> Result<Vec<Port>, Error> {
            field(k)?
                .as_array()
                .ok_or_else(|| bad(format!("manifest.json: `{k}` is not a list")))?
                .iter()
                .enumerate()
                .map(|(i, v)| port_from_json(k, i, v).map_err(&bad))
                .collect()
        };
        let (args, results) = (list("args")?, list("results")?);
        let files = field("files")?;
        if target.is_cpu() {
            let list = files
                .get("programs")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("manifest.json has no files.programs list".into()))?;
            let read_bytes = |name: &str| {
                std::fs::read(dir.join(name)).map_err(|e| bad(format!("cannot read {name}: {e}")))
            };
            let programs = list
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    program_from_json(i, v, list.len(), &read, &read_bytes).map_err(|e| match e {
                        Error::Artifact(m) => bad(m),
                        e => e,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let a = Artifact::new_cpu(&options, target, programs).map_err(&bad)?;
            check_signature(&a.program, &args, &results).map_err(&bad)?;
            return Ok(Artifact {
                kiln_version,
                args,
                results,
                ..a
            });
        }
        let ptx_files = files
            .get("ptx")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("manifest.json has no files.ptx list".into()))?;
        let ptx = ptx_files
            .iter()
            .map(|f| {
                let name = f
                    .as_str()
                    .filter(|n| !n.contains("..") && !n.starts_with('/'))
                    .ok_or_else(|| {
                        bad(format!(
                            "files.ptx holds {f}, not a file name inside the artifact"
                        ))
                    })?;
                read(name)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let program = kiln_ir::parse_func_text(&read("program.kiln")?)
            .map_err(|e| bad(format!("program.kiln: {e}")))?;
        kiln_ir::verify(&program).map_err(|e| bad(format!("program.kiln: {e}")))?;
        check_signature(&program, &args, &results).map_err(&bad)?;
        Ok(Artifact {
            kiln_version,
            target,
            options,
            program,
            plan: read("plan.txt")?,
            ptx,
            programs: Vec::new(),
            args,
            results,
        })
    }

    /// The device plan, derived again from the program ([`derive_plan`]) and checked to print
    /// as the stored one: an artifact from a kiln that decides differently is refused, with the
    /// first line that differs.
    pub fn device_plan(&self) -> Result<DevicePlan, Error> {
        if self.target.is_cpu() {
            return Err(Error::Device(
                "a CPU artifact has no device plan: it runs on the CPU (`--device cpu`)".into(),
            ));
        }
        let plan = derive_plan(&self.program, &self.options, &self.target.info)
            .map_err(|e| Error::Artifact(format!("the program's device plan: {e}")))?;
        let text = plan_text(&plan);
        if text != self.plan {
            let (n, (ours, theirs)) = text
                .lines()
                .chain(std::iter::repeat("(end of plan)"))
                .zip(self.plan.lines().chain(std::iter::repeat("(end of plan)")))
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .unwrap_or((0, ("", "")));
            return Err(Error::Artifact(format!(
                "the stored device plan is not the one this kiln-run ({KILN_VERSION}) derives \
                 from the program (the artifact was written by kiln {}); plan.txt line {}: \
                 stored `{theirs}`, derived `{ours}`; compile the artifact again with this kiln",
                self.kiln_version,
                n + 1
            )));
        }
        if plan.kernel_steps().count() != self.ptx.len() {
            return Err(Error::Artifact(format!(
                "{} PTX modules for {} kernel steps",
                self.ptx.len(),
                plan.kernel_steps().count()
            )));
        }
        Ok(plan)
    }
}

/// Checks that the manifest's `args` and `results` are `program`'s signature.
fn check_signature(program: &Func, args: &[Port], results: &[Port]) -> Result<(), String> {
    let sig: Vec<&TensorType> = args.iter().map(|p| &p.ty).collect();
    if sig != program.param_types().iter().collect::<Vec<_>>()
        || results.iter().map(|p| &p.ty).collect::<Vec<_>>()
            != program.output_types.iter().collect::<Vec<_>>()
    {
        return Err("the manifest's arguments or results are not the program's signature".into());
    }
    Ok(())
}

fn ptx_file(i: usize) -> String {
    format!("kernels/{i:03}.ptx")
}

//! The GPU pack (`cargo xtask gpu-pack DIR [--quick]`): a folder, under 60 MiB, that checks
//! kiln on a machine with an NVIDIA GPU and no compiler. It holds the runtime-only `kiln-run`
//! binary, an ahead-of-time artifact (`kiln::aot`) of every spec example and of 200 random
//! programs (the differential tests' generator and seeds) with their arguments and the
//! reference interpreter's results as `.npy`, and the benchmark workloads at GPU sizes (their
//! inputs made there from a seed, each also at a tiny size with reference results), plus
//! `check.sh` and `check.py`, which run it all and print one table (see `docs/gpu.md`).
//!
//! `pack.json` lists the programs, the workloads and what was left out with why.

pub mod gpt;
pub mod sweep;
pub mod workloads;

use kiln::aot::{Target, compile_func_with_options};
use kiln_ir::random::{Config, Rng, random_func, random_literal_with_specials};
use kiln_ir::{Func, Literal};
use kiln_run::exec::write_all;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The most a pack may weigh.
pub const MAX_BYTES: u64 = 60 << 20;

/// Random programs in a full pack (seeds 0 to 199).
pub const RANDOM_PROGRAMS: u64 = 200;

/// The check script.
pub const CHECK_SH: &str = include_str!("check.sh");

/// The check's Python half (stdlib and PyTorch only).
pub const CHECK_PY: &str = include_str!("check.py");

/// How to run the check, for whoever opens the folder.
pub const README: &str = include_str!("README.txt");

/// What [`pack`] makes.
pub struct PackOptions {
    /// The folder (made; a previous pack there is replaced; any other non-empty folder is
    /// refused).
    pub dir: PathBuf,
    /// A few programs and workloads only (for tests).
    pub quick: bool,
    /// The `kiln-run` binary to ship.
    pub kiln_run: PathBuf,
}

/// What a pack holds, in numbers.
#[derive(Debug, Default)]
pub struct Summary {
    /// Programs packed.
    pub programs: usize,
    /// Workloads packed.
    pub workloads: usize,
    /// Sweep variants packed ([`sweep`]).
    pub variants: usize,
    /// What was left out, with why.
    pub skipped: Vec<String>,
    /// The pack's size.
    pub bytes: u64,
}

fn io(p: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", p.display())
}

fn folder_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => folder_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A program packed: its artifact, arguments and reference results, under `dir/rel`.
fn pack_program(
    dir: &Path,
    rel: &str,
    f: &Func,
    args: &[Literal],
) -> Result<(usize, usize), String> {
    let artifact = compile_func_with_options(f, &kiln::Options::default(), Target::h200())
        .map_err(|e| e.message)?;
    let want = kiln_reference::eval(f, args).map_err(|e| format!("the reference: {e}"))?;
    let at = dir.join(rel);
    artifact
        .save(&at.join("artifact"))
        .map_err(|e| e.to_string())?;
    write_all(&at, "arg", args).map_err(|e| e.to_string())?;
    write_all(&at, "ref", &want).map_err(|e| e.to_string())?;
    Ok((args.len(), want.len()))
}

/// The spec examples and random programs: (name, folder, program, arguments).
fn programs(quick: bool) -> Vec<(String, String, Func, Vec<Literal>)> {
    let mut out = Vec::new();
    let mut n = 0;
    for spec in crate::load_specs() {
        for ex in &spec.examples {
            n += 1;
            // The quick pack takes every 16th example.
            if quick && n % 16 != 1 {
                continue;
            }
            let Ok((m, args, _)) = crate::load_example(ex) else {
                continue;
            };
            let Some(f) = m.entry() else { continue };
            out.push((
                format!("spec {}.md:{}", spec.name, ex.line),
                format!("programs/spec-{}-{}", spec.name, ex.line),
                f.clone(),
                args,
            ));
        }
    }
    let count = if quick { 4 } else { RANDOM_PROGRAMS };
    for seed in 0..count {
        // As `kiln-runtime/tests/gpu_emulator.rs` makes them.
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
        let mut rng = Rng::new(seed ^ 77);
        let rate = if seed % 2 == 1 && Config::profile(seed).elements.is_none() {
            1.0 / 32.0
        } else {
            0.0
        };
        let args = f
            .param_types()
            .iter()
            .map(|t| random_literal_with_specials(&mut rng, t, rate))
            .collect();
        out.push((
            format!("random seed {seed}"),
            format!("programs/random-{seed:04}"),
            f,
            args,
        ));
    }
    out
}

/// Makes the pack `o` describes, printing what it leaves out; fails when it weighs more than
/// [`MAX_BYTES`].
pub fn pack(o: &PackOptions) -> Result<Summary, String> {
    let dir = &o.dir;
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .next()
            .is_none();
        if !empty && !dir.join("pack.json").exists() {
            return Err(format!(
                "{} is not empty and holds no previous pack; give an empty or new folder",
                dir.display()
            ));
        }
        std::fs::remove_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let bin = dir.join("kiln-run");
    std::fs::copy(&o.kiln_run, &bin).map_err(|e| io(&o.kiln_run, e))?;
    for (name, text) in [
        ("check.sh", CHECK_SH),
        ("check.py", CHECK_PY),
        ("README.txt", README),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| io(&p, e))?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for name in ["kiln-run", "check.sh", "check.py"] {
            let p = dir.join(name);
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io(&p, e))?;
        }
    }
    let mut s = Summary::default();
    let mut listed = Vec::new();
    for (name, rel, f, args) in programs(o.quick) {
        match pack_program(dir, &rel, &f, &args) {
            Ok((a, r)) => {
                listed.push(json!({ "name": name, "dir": rel, "args": a, "results": r }));
            }
            Err(e) => s.skipped.push(format!("{name}: {}", first_line(&e))),
        }
    }
    s.programs = listed.len();
    let (ws, skipped) = workloads::workloads();
    s.skipped.extend(skipped);
    let mut wl = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        if o.quick
            && !matches!(
                w.kind,
                "softmax"
                    | "matmul"
                    | "matmul_tf32"
                    | "attention_causal"
                    | "attention_causal_bf16"
                    | "linear_bias_gelu"
            )
        {
            continue;
        }
        match pack_workload(dir, w, 100 + i as u64) {
            Ok(v) => wl.push(v),
            Err(e) => s.skipped.push(format!("{}: {}", w.name, first_line(&e))),
        }
    }
    s.workloads = wl.len();
    let mut variants = Vec::new();
    if !o.quick {
        for v in sweep::variants() {
            let Some(w) = ws.iter().find(|w| w.name == v.workload) else {
                continue;
            };
            if !wl.iter().any(|p| p["name"] == v.workload) {
                continue;
            }
            match pack_variant(dir, w, &v) {
                Ok(rel) => variants.push(json!({
                    "workload": v.workload,
                    "label": v.label,
                    "dir": rel,
                })),
                Err(e) => s.skipped.push(format!(
                    "sweep {} {}: {}",
                    v.workload,
                    v.label,
                    first_line(&e)
                )),
            }
        }
    }
    s.variants = variants.len();
    let manifest = json!({
        "kiln_version": kiln_run::artifact::KILN_VERSION,
        "programs": listed,
        "workloads": wl,
        "sweep": variants,
        "skipped": s.skipped,
    });
    let p = dir.join("pack.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())?;
    std::fs::write(&p, text).map_err(|e| io(&p, e))?;
    s.bytes = folder_bytes(dir);
    if s.bytes > MAX_BYTES {
        return Err(format!(
            "{} weighs {:.1} MiB, more than the {} MiB a pack may",
            dir.display(),
            s.bytes as f64 / (1 << 20) as f64,
            MAX_BYTES >> 20
        ));
    }
    Ok(s)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// A sweep variant packed: the workload's artifact at the GPU size for the H200's target (on
/// the variant's SM) as `v` changes it, under `sweep/`; returns its folder.
fn pack_variant(dir: &Path, w: &workloads::Workload, v: &sweep::Variant) -> Result<String, String> {
    let rel = format!("sweep/{}--{}", w.name, v.label);
    let mut target = Target::ptx(v.sm, Target::h200().info.gpu.map_or(132, |g| g.sms));
    (v.change)(&mut target.info);
    let a = compile_func_with_options(&w.full, &kiln::Options::default(), target)
        .map_err(|e| e.message)?;
    a.save(&dir.join(&rel).join("artifact"))
        .map_err(|e| e.to_string())?;
    Ok(rel)
}

/// A workload packed: its artifact at the GPU size (inputs made there from `seed`) and at the
/// tiny size with arguments and reference results, both compiled in the workload's precision
/// (the reference results of a TF32 workload are the reference's on the arguments rounded to
/// TF32, see [`workloads::Workload::precision`]).
pub fn pack_workload(dir: &Path, w: &workloads::Workload, seed: u64) -> Result<Value, String> {
    let rel = format!("workloads/{}", w.name);
    let at = dir.join(&rel);
    let opts = kiln::Options {
        matmul_precision: w.precision,
        ..kiln::Options::default()
    };
    let full = compile_func_with_options(&w.full, &opts, Target::h200()).map_err(|e| e.message)?;
    let host = full.plan.lines().filter(|l| l.contains(": host ")).count();
    if host > 0 {
        return Err(format!(
            "its device plan has {host} host step(s), which would run on the reference interpreter at the GPU size"
        ));
    }
    full.save(&at.join("artifact")).map_err(|e| e.to_string())?;
    let tiny = compile_func_with_options(&w.tiny, &opts, Target::h200()).map_err(|e| e.message)?;
    let args = match w.inputs {
        Some(make) => make(&w.tiny.param_types(), seed),
        None => kiln_run::exec::random_inputs(&tiny, seed),
    };
    let operands: Vec<Literal> = match w.precision {
        kiln::MatmulPrecision::Highest => args.clone(),
        kiln::MatmulPrecision::Tf32 => args.iter().map(tf32_rounded).collect(),
    };
    let want = kiln_reference::eval(&w.tiny, &operands).map_err(|e| e.to_string())?;
    tiny.save(&at.join("tiny/artifact"))
        .map_err(|e| e.to_string())?;
    write_all(&at.join("tiny"), "arg", &args).map_err(|e| e.to_string())?;
    write_all(&at.join("tiny"), "ref", &want).map_err(|e| e.to_string())?;
    Ok(json!({
        "name": w.name,
        "kind": w.kind,
        "dir": rel,
        "seed": seed,
        "calls": w.calls,
        "tolerance": w.tolerance,
        "precision": w.precision.name(),
        "args": w.full.params.len(),
        "results": w.full.outputs.len(),
        "arg_shapes": w.full.param_types().iter().map(|t| t.shape.clone()).collect::<Vec<_>>(),
        // Who makes the GPU size's arguments: `kiln-run --random-inputs SEED`, or check.py.
        "inputs": if w.inputs.is_some() { "check.py" } else { "kiln-run" },
    }))
}

/// `l` with its f32 elements rounded to TF32 (other dtypes as they are).
fn tf32_rounded(l: &Literal) -> Literal {
    if l.dtype() != kiln_ir::DType::F32 {
        return l.clone();
    }
    let v: Vec<f64> = l
        .to_f64s()
        .into_iter()
        .map(|x| f64::from(kiln_kernel::gpu::tf32::round(x as f32)))
        .collect();
    Literal::from_f64s(l.ty().clone(), &v).unwrap_or_else(|_| l.clone())
}

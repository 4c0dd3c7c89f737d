//! Helpers for kiln's integration tests: reading `ir-specs/`, running spec examples, running
//! filetests, and generating `ir-specs/status.md`.
//!
//! A filetest is a `.kir` file under `tests/filetests/` whose first line says what to run:
//!
//! - `// RUN: parse`: parse and print the module (the output must round-trip).
//! - `// RUN: verify`: cases separated by `// -----`, each with `// error: LABEL`; every case
//!   must parse and then fail verification citing LABEL.
//! - `// RUN: parse-error`: cases separated by `// -----`; every case must fail to parse.
//! - `// RUN: eval`: `// %N = VALUE` lines give the arguments; prints the reference results.
//! - `// RUN: llvm`: prints the CPU backend's LLVM IR before optimization (the optimized IR
//!   depends on the host CPU, so it is not snapshotted; `cargo xtask dump --stage llvm` shows it).
//! - `// RUN: plan`: prints the CPU backend's memory plan; a `// DONATE: 0,1` line donates those
//!   parameters (their buffers may hold results, like `donate_argnums`).
//! - `// RUN: kernels`: prints the fused kernels in the kernel IR's text form (loop nests, index
//!   maps, guards, reductions, schedules), after checking them with the kernel verifier.
//! - `// RUN: differential`: `// %N = VALUE` lines give the arguments; runs the program on the
//!   CPU backend (every instruction compiled) and fails unless every output agrees with the
//!   reference under `kiln_reference::accuracy`. The random programs' failures are saved as
//!   such files, shrunk (`tests/filetests/differential/`).
//!
//! The modes that compile for a target (`llvm`, `plan`, `fused`, `kernels`, `dot`,
//! `differential`) name it on the second line, `// TARGET: cpu` (the only target so far); the
//! others must not name one. Each of them also runs its program, checked against the reference
//! interpreter under `kiln_reference::accuracy` (like Cranelift's `test run`): every
//! `// run: ARGS` line is one run, its arguments either written out (`// run: [1.0, 2.0] ; [3]`,
//! one literal per parameter, separated by ` ; `) or drawn from a seed (`// run: random 7`,
//! values from `kiln_ir::random::random_literal`). A `differential` file's `// %N = VALUE`
//! lines are its one run; every other target filetest needs at least one `// run:` line.
//!
//! The printed output of each file is an insta snapshot under `tests/snapshots/`.
//!
//! The suites that compile and run programs (the spec examples, every target filetest's runs,
//! the `differential` filetests) run them on the backend `KILN_BACKEND` selects
//! ([`selected_backend`], read once, as the facade reads it): the CPU backend by default, or
//! under `KILN_BACKEND=ptx-emulator` the GPU mapping (lowered for an H200) on the GPU emulator.
//! What a filetest prints is the CPU backend's either way (`// TARGET: cpu` names the target
//! its printed stages are for); only its runs follow the selected backend. A file marked
//! `// CPU-ONLY: REASON` runs on the CPU whatever is selected (programs too large to emulate).

pub mod pack;

use kiln_ir::{Literal, Module, OpKind, parse_literal, parse_module, print_module, verify_module};
use kiln_reference::compare::{Tolerance, check_close};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// One example of a spec: a program, its argument values and its expected results.
#[derive(Clone, Debug)]
pub struct Example {
    /// The program text.
    pub kiln: String,
    /// `%N = VALUE` argument values, in order.
    pub args: Vec<String>,
    /// Expected result values, in order.
    pub results: Vec<String>,
    /// 1-based line of the example in the spec file.
    pub line: usize,
    /// The process grid (`grid = RxP`: replicas x partitions) of an example run by every
    /// process of a grid; its values are then written per process, `%N@(r, p) = VALUE` and
    /// `result@(r, p) = VALUE` (or `resultK@(r, p)`), process by process.
    pub grid: Option<(usize, usize)>,
    /// The keys of `args` (`%N` or `%N@(r, p)`), in order.
    pub arg_keys: Vec<String>,
    /// The keys of `results`, in order.
    pub result_keys: Vec<String>,
}

/// One op spec file.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The op mnemonic (file stem).
    pub name: String,
    /// The whole text.
    pub text: String,
    /// Constraint labels, in order.
    pub labels: Vec<String>,
    /// The examples run by one process.
    pub examples: Vec<Example>,
    /// The examples run by every process of a grid ([`Example::grid`]).
    pub grid_examples: Vec<Example>,
    /// Whether the VJP section gives a rule (not "Not differentiable.").
    pub differentiable: bool,
}

fn section<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("\n## {name}\n"))? + name.len() + 5;
    let rest = &text[start..];
    Some(&rest[..rest.find("\n## ").unwrap_or(rest.len())])
}

/// Reads every `ir-specs/ops/*.md`, sorted by name.
pub fn load_specs() -> Vec<Spec> {
    let dir = root().join("ir-specs/ops");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ir-specs/ops exists")
        .map(|e| e.expect("readable").path())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable spec");
            let name = p
                .file_stem()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            let labels = section(&text, "Constraints")
                .unwrap_or("")
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("- `")
                        .and_then(|r| r.split('`').next())
                        .map(str::to_string)
                })
                .collect();
            let differentiable =
                section(&text, "VJP").is_some_and(|v| !v.trim().starts_with("Not differentiable"));
            let (grid_examples, examples) = parse_examples(&text)
                .into_iter()
                .partition(|e| e.grid.is_some());
            Spec {
                name,
                text,
                labels,
                examples,
                grid_examples,
                differentiable,
            }
        })
        .collect()
}

fn parse_examples(text: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        if lines[i] == "```kiln" {
            let line = i + 1;
            let mut kiln = String::new();
            i += 1;
            while i < lines.len() && lines[i] != "```" {
                kiln.push_str(lines[i]);
                kiln.push('\n');
                i += 1;
            }
            while i < lines.len() && lines[i] != "```values" {
                i += 1;
            }
            let (mut args, mut results) = (Vec::new(), Vec::new());
            let (mut arg_keys, mut result_keys) = (Vec::new(), Vec::new());
            let mut grid = None;
            i += 1;
            while i < lines.len() && lines[i] != "```" {
                if let Some((k, v)) = lines[i].split_once(" = ") {
                    if k == "grid" {
                        grid = v.split_once('x').and_then(|(r, p)| {
                            Some((r.trim().parse().ok()?, p.trim().parse().ok()?))
                        });
                    } else if k.starts_with('%') {
                        args.push(v.to_string());
                        arg_keys.push(k.to_string());
                    } else {
                        results.push(v.to_string());
                        result_keys.push(k.to_string());
                    }
                }
                i += 1;
            }
            out.push(Example {
                kiln,
                args,
                results,
                line,
                grid,
                arg_keys,
                result_keys,
            });
        }
        i += 1;
    }
    out
}

/// The tolerance spec examples are held to: a few ulps of the result type.
pub fn example_tolerance(l: &Literal) -> Tolerance {
    Tolerance::ulps(l.dtype(), 4.0)
}

/// Parses an example's program and values: (module, arguments, expected results).
pub fn load_example(ex: &Example) -> Result<(Module, Vec<Literal>, Vec<Literal>), String> {
    let m = parse_module(&ex.kiln).map_err(|e| format!("parse: {e}"))?;
    let f = m.entry().ok_or("no function")?;
    if ex.args.len() != f.params.len() || ex.results.len() != f.output_types.len() {
        return Err(format!(
            "{} args and {} results given for {} params and {} results",
            ex.args.len(),
            ex.results.len(),
            f.params.len(),
            f.output_types.len()
        ));
    }
    let args = ex
        .args
        .iter()
        .zip(f.param_types())
        .map(|(s, t)| parse_literal(s, &t).map_err(|e| format!("argument `{s}`: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let expected = ex
        .results
        .iter()
        .zip(&f.output_types)
        .map(|(s, t)| parse_literal(s, t).map_err(|e| format!("result `{s}`: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((m, args, expected))
}

/// Checks results against expected values with [`example_tolerance`].
pub fn check_results(actual: &[Literal], expected: &[Literal]) -> Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "{} results, {} expected",
            actual.len(),
            expected.len()
        ));
    }
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        check_close(a, e, example_tolerance(e)).map_err(|m| format!("result {i}: {m}"))?;
    }
    Ok(())
}

/// Runs an example on the reference interpreter.
pub fn run_example_reference(ex: &Example) -> Result<(), String> {
    let (m, args, expected) = load_example(ex)?;
    let got = kiln_reference::eval_module(&m, &args).map_err(|e| e.to_string())?;
    check_results(&got, &expected)
}

/// A grid example ([`Example::grid`]) loaded: the module, the grid, and per process (in flat
/// order, `replica * partitions + partition`) its arguments and expected results.
pub type GridExample = (
    Module,
    kiln_reference::spmd::Grid,
    Vec<Vec<Literal>>,
    Vec<Vec<Literal>>,
);

/// The values of a grid example, checked to be written process by process: `keys` must be
/// `{prefix}{i}@(r, p)` for every process in flat order and `i` in `0..per` (the index left
/// out when `per` is 1 and `prefix` is `result`).
fn per_process(
    keys: &[String],
    values: &[String],
    (replicas, partitions): (usize, usize),
    types: &[kiln_ir::TensorType],
    prefix: &str,
) -> Result<Vec<Vec<Literal>>, String> {
    let per = types.len();
    let mut out = Vec::new();
    let mut it = keys.iter().zip(values);
    for r in 0..replicas {
        for p in 0..partitions {
            let mut mine = Vec::new();
            for (i, t) in types.iter().enumerate() {
                let want = if prefix == "result" && per == 1 {
                    format!("result@({r}, {p})")
                } else {
                    format!("{prefix}{i}@({r}, {p})")
                };
                let (k, v) = it
                    .next()
                    .ok_or_else(|| format!("no value `{want}` (values go process by process)"))?;
                if *k != want {
                    return Err(format!(
                        "`{k}` where `{want}` is due (values go process by process)"
                    ));
                }
                mine.push(parse_literal(v, t).map_err(|e| format!("`{k}`: {e}"))?);
            }
            out.push(mine);
        }
    }
    if let Some((k, _)) = it.next() {
        return Err(format!("`{k}` is past the grid's values"));
    }
    Ok(out)
}

/// Parses a grid example ([`Example::grid`]).
pub fn load_grid_example(ex: &Example) -> Result<GridExample, String> {
    let grid = ex.grid.ok_or("not a grid example")?;
    let m = parse_module(&ex.kiln).map_err(|e| format!("parse: {e}"))?;
    let f = m.entry().ok_or("no function")?;
    let args = per_process(&ex.arg_keys, &ex.args, grid, &f.param_types(), "%")?;
    let expected = per_process(
        &ex.result_keys,
        &ex.results,
        grid,
        &f.output_types,
        "result",
    )?;
    let g = kiln_reference::spmd::Grid::new(grid.0, grid.1);
    Ok((m, g, args, expected))
}

/// Runs a grid example on the reference interpreter, every process on its own thread.
pub fn run_grid_example_reference(ex: &Example) -> Result<(), String> {
    let (m, grid, args, expected) = load_grid_example(ex)?;
    let f = m.entry().ok_or("no function")?;
    let funcs = vec![f; grid.processes()];
    let got = kiln_reference::spmd::eval_grid(grid, &funcs, &args).map_err(|e| e.to_string())?;
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        check_results(g, e).map_err(|m| format!("process {}: {m}", grid.process(i)))?;
    }
    Ok(())
}

/// Runs a grid example on the CPU backend: the function compiled once (its collectives host
/// steps, nothing on the reference interpreter), run by every process on its own thread.
pub fn run_grid_example_cpu(ex: &Example) -> Result<(), String> {
    use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
    use kiln_reference::spmd::{LocalCommunicator, run_processes};
    let (m, grid, args, expected) = load_grid_example(ex)?;
    let f = m.entry().ok_or("no function")?;
    let exe = CpuExecutable::compile_with_cache(f, None).map_err(|e| format!("compile: {e}"))?;
    if exe.plan().contains(&Step::Reference) {
        return Err("an instruction runs on the reference interpreter".into());
    }
    let comm = std::sync::Arc::new(LocalCommunicator::new(grid));
    let got = run_processes(comm, |p| {
        exe.run(&args[p.flat(grid)]).map_err(|e| e.to_string())
    })?;
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        check_results(g, e).map_err(|m| format!("process {}: {m}", grid.process(i)))?;
    }
    Ok(())
}

/// Splits a filetest body into `// -----`-separated cases.
pub fn split_cases(text: &str) -> Vec<&str> {
    text.split("\n// -----\n").collect()
}

/// Runs one filetest file and returns its printed output.
pub fn run_filetest(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mode = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("// RUN: "))
        .ok_or("first line must be `// RUN: MODE`")?
        .trim()
        .to_string();
    let target = filetest_target(&text, &mode)?;
    let mut out = String::new();
    match mode.as_str() {
        "parse" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            let printed = print_module(&m);
            let again = parse_module(&printed).map_err(|e| format!("reparse: {e}"))?;
            if print_module(&again) != printed {
                return Err("printing is not a fixed point".into());
            }
            out.push_str(&printed);
        }
        "verify" => {
            for case in split_cases(&text) {
                let label = case
                    .lines()
                    .find_map(|l| l.strip_prefix("// error: "))
                    .ok_or("a case without `// error:`")?
                    .trim();
                let m =
                    parse_module(case).map_err(|e| format!("case {label} does not parse: {e}"))?;
                match verify_module(&m) {
                    Ok(()) => return Err(format!("case {label} verified, but should fail")),
                    Err(e) if e.diag.label == label => out.push_str(&format!("{e}\n")),
                    Err(e) => return Err(format!("case {label} failed with another label: {e}")),
                }
            }
        }
        "parse-error" => {
            for case in split_cases(&text) {
                match parse_module(case) {
                    Ok(_) => return Err(format!("case parsed, but should fail:\n{case}")),
                    Err(e) => out.push_str(&format!("{e}\n")),
                }
            }
        }
        "eval" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            verify_module(&m).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            let args = filetest_args(&text, f)?;
            for r in kiln_reference::eval_module(&m, &args).map_err(|e| e.to_string())? {
                out.push_str(&format!("{r}\n"));
            }
        }
        "differential" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            verify_module(&m).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            let args = filetest_args(&text, f)?;
            run_on_target(
                f,
                &args,
                &[],
                target.unwrap_or(Target::Cpu),
                runs_backend(&text)?,
            )?;
            out.push_str(&format!(
                "{} outputs agree with the reference\n",
                f.outputs.len()
            ));
        }
        "llvm" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            out.push_str(
                &kiln_codegen_llvm::cpu::function_llvm_ir(f, false, &Default::default())
                    .map_err(|e| e.to_string())?,
            );
        }
        "rule" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            let rule = path
                .file_stem()
                .and_then(|s| s.to_str())
                .ok_or("no file name")?;
            let rewritten = kiln_opt::rewrite_once(f, rule)?;
            if rewritten.is_empty() {
                return Err(format!("rule `{rule}` does not fire on its filetest"));
            }
            let parts: Vec<String> = rewritten.iter().map(|g| g.to_string()).collect();
            out.push_str(&parts.join("// -----\n"));
        }
        "fused" | "plan" | "dot" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            let opts = kiln_kernel::Options::default();
            let text = match mode.as_str() {
                "fused" => kiln_codegen_llvm::cpu::describe_fusion(f, &opts),
                "plan" => {
                    let donated = donated_params(&text, f)?;
                    kiln_codegen_llvm::cpu::describe_memory_donating(f, &donated, &opts)
                }
                _ => kiln_kernel::pipeline::fusion_dot(f, &opts).map_err(Into::into),
            };
            out.push_str(&text.map_err(|e| e.to_string())?);
        }
        "kernels" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            out.push_str(
                &kiln_kernel::print::describe_kernels(f, &kiln_kernel::Options::default())
                    .map_err(|e| e.to_string())?,
            );
        }
        "egraph" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            let opts = kiln_opt::Options {
                machine: kiln_opt::cost::Machine::REFERENCE,
                ..kiln_opt::Options::default()
            };
            out.push_str(&kiln_opt::dump_egraph(f, &opts)?);
        }
        "opt" | "opt fast-math" => {
            let m = parse_module(&text).map_err(|e| e.to_string())?;
            let f = m.entry().ok_or("no function")?;
            let opts = kiln_opt::Options {
                fast_math: mode == "opt fast-math",
                machine: kiln_opt::cost::Machine::REFERENCE,
                ..kiln_opt::Options::default()
            };
            out.push_str(&kiln_opt::explain(f, &opts)?);
        }
        other => return Err(format!("unknown mode `{other}`")),
    }
    if let Some(target) = target
        && mode != "differential"
    {
        check_runs(&text, target)?;
    }
    Ok(out)
}

/// A target a filetest compiles for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The CPU backend (LLVM, JIT-compiled for the host).
    Cpu,
}

/// The filetest modes that compile for a target, and so name it (`// TARGET: ...`) and run.
pub const TARGET_MODES: [&str; 6] = ["llvm", "plan", "fused", "kernels", "dot", "differential"];

/// The target a filetest of `mode` names on its second line: required for the modes in
/// [`TARGET_MODES`], refused for the others (their output depends on no target).
fn filetest_target(text: &str, mode: &str) -> Result<Option<Target>, String> {
    let named = text
        .lines()
        .nth(1)
        .and_then(|l| l.strip_prefix("// TARGET: "))
        .map(str::trim);
    let stray = text.lines().skip(2).any(|l| l.starts_with("// TARGET:"));
    if stray {
        return Err("`// TARGET:` belongs on the second line, after `// RUN:`".into());
    }
    match (TARGET_MODES.contains(&mode), named) {
        (true, Some("cpu")) => Ok(Some(Target::Cpu)),
        (true, Some(other)) => Err(format!("unknown target `{other}` (known: cpu)")),
        (true, None) => Err(format!(
            "mode `{mode}` compiles for a target: name it on the second line (`// TARGET: cpu`)"
        )),
        (false, Some(t)) => Err(format!(
            "mode `{mode}` depends on no target, but the file names `{t}`"
        )),
        (false, None) => Ok(None),
    }
}

/// Runs every `// run:` line of a target filetest on `target`, each checked against the
/// reference; an error names the line. A file with no `// run:` line is refused: a target
/// filetest must show that what it prints also computes the right numbers.
fn check_runs(text: &str, target: Target) -> Result<usize, String> {
    let m = parse_module(text).map_err(|e| e.to_string())?;
    verify_module(&m).map_err(|e| e.to_string())?;
    let f = m.entry().ok_or("no function")?;
    let donated = donated_params(text, f)?;
    let backend = runs_backend(text)?;
    let mut runs = 0;
    for line in text.lines().filter_map(|l| l.strip_prefix("// run: ")) {
        let args = run_args(line.trim(), f).map_err(|e| format!("`// run: {line}`: {e}"))?;
        run_on_target(f, &args, &donated, target, backend)
            .map_err(|e| format!("`// run: {line}`: {e}"))?;
        runs += 1;
    }
    if runs == 0 {
        return Err(
            "a target filetest needs a `// run:` line (`// run: random 1`, or the arguments \
             written out) checked against the reference"
                .into(),
        );
    }
    Ok(runs)
}

/// The arguments of one `// run:` line: `random SEED`, or one literal per parameter separated
/// by ` ; `.
fn run_args(line: &str, f: &kiln_ir::Func) -> Result<Vec<Literal>, String> {
    let types = f.param_types();
    if let Some(seed) = line.strip_prefix("random ") {
        let seed: u64 = seed
            .trim()
            .parse()
            .map_err(|e| format!("seed `{seed}`: {e}"))?;
        let mut rng = kiln_ir::random::Rng::new(seed);
        return Ok(types
            .iter()
            .map(|t| kiln_ir::random::random_literal(&mut rng, t))
            .collect());
    }
    let parts: Vec<&str> = if line.is_empty() {
        Vec::new()
    } else {
        line.split(" ; ").collect()
    };
    if parts.len() != types.len() {
        return Err(format!(
            "{} arguments given for {} parameters",
            parts.len(),
            types.len()
        ));
    }
    parts
        .iter()
        .zip(&types)
        .enumerate()
        .map(|(i, (v, t))| parse_literal(v.trim(), t).map_err(|e| format!("argument {i}: {e}")))
        .collect()
}

/// The parameters a filetest donates: `// DONATE: 0,2` donates those parameters (their
/// buffers may hold results, like `donate_argnums`).
fn donated_params(text: &str, f: &kiln_ir::Func) -> Result<Vec<bool>, String> {
    let mut donated = vec![false; f.params.len()];
    for l in text.lines().filter_map(|l| l.strip_prefix("// DONATE: ")) {
        for p in l.split(',') {
            let p: usize = p.trim().parse().map_err(|e| format!("DONATE: {e}"))?;
            *donated.get_mut(p).ok_or("DONATE: no such parameter")? = true;
        }
    }
    Ok(donated)
}

/// The backends the suites that compile and run programs can run on (`KILN_BACKEND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The CPU backend (LLVM, JIT-compiled for the host): `KILN_BACKEND` unset or `cpu`.
    Cpu,
    /// The GPU mapping for an H200 on the GPU emulator: `KILN_BACKEND=ptx-emulator`.
    PtxEmulator,
}

/// The backend named by `backend` (an [`kiln_kernel::Options::backend`]); the reference
/// interpreter is refused, since every result would then agree with itself.
pub fn backend_named(backend: Option<&str>) -> Result<Backend, String> {
    match backend {
        None | Some("cpu") => Ok(Backend::Cpu),
        Some("ptx-emulator") => Ok(Backend::PtxEmulator),
        Some(other) => Err(format!(
            "KILN_BACKEND={other}: the test suites run on `cpu` or `ptx-emulator`"
        )),
    }
}

/// The backend `KILN_BACKEND` selects, read once (the test binary is a program boundary, like
/// the facade): see [`backend_named`].
pub fn selected_backend() -> Result<Backend, String> {
    static SELECTED: OnceLock<Result<Backend, String>> = OnceLock::new();
    SELECTED
        .get_or_init(|| {
            let opts = kiln_kernel::Options::from_vars(&|name| std::env::var(name).ok());
            backend_named(opts.backend.as_deref())
        })
        .clone()
}

/// Compiles `f` with the parameters `donated` given up for `backend` and runs it on `args`
/// (copies of them, the donated ones passed by value). Unless `interpreted_ok`, an instruction
/// run by the reference interpreter (no kernel) is an error; a kernel the GPU mapping refuses
/// always is.
pub fn run_on_backend(
    backend: Backend,
    f: &kiln_ir::Func,
    args: &[Literal],
    donated: &[bool],
    interpreted_ok: bool,
) -> Result<Vec<Literal>, String> {
    let opts = kiln_kernel::Options::default();
    match backend {
        Backend::Cpu => {
            let exe =
                kiln_codegen_llvm::cpu::CpuExecutable::compile_with_options(f, donated, &opts)
                    .map_err(|e| e.to_string())?;
            if !interpreted_ok
                && let Some(i) = exe
                    .plan()
                    .iter()
                    .position(|s| *s == kiln_codegen_llvm::cpu::Step::Reference)
            {
                return Err(format!(
                    "instruction {i} fell back to the reference interpreter"
                ));
            }
            let owned = args.iter().map(|a| Cow::Owned(a.clone())).collect();
            exe.call_donating(owned).map_err(|e| e.to_string())
        }
        Backend::PtxEmulator => {
            let target = kiln_kernel::TargetInfo::h200();
            let (got, report) =
                kiln_runtime::gpu_emu::compile_and_run(f, donated, &opts, &target, args)
                    .map_err(|e| format!("on the GPU emulator: {e}"))?;
            if let Some(why) = report.fallbacks.first() {
                return Err(format!(
                    "the GPU mapping refused a kernel, run by the reference interpreter: {why}"
                ));
            }
            if !interpreted_ok && report.interpreted > 0 {
                return Err(format!(
                    "{} instructions fell back to the reference interpreter on the GPU emulator",
                    report.interpreted
                ));
            }
            Ok(got)
        }
    }
}

/// The backend a filetest's runs use: the selected one ([`selected_backend`]), or the CPU for
/// a file marked `// CPU-ONLY: REASON` (programs too large for the GPU emulator: the
/// full-size MLP train step is about 1.6 GFLOP, hours of emulated threads).
fn runs_backend(text: &str) -> Result<Backend, String> {
    match text.lines().find_map(|l| l.strip_prefix("// CPU-ONLY:")) {
        Some(why) if why.trim().is_empty() => Err("`// CPU-ONLY:` needs a reason".into()),
        Some(_) => Ok(Backend::Cpu),
        None => selected_backend(),
    }
}

/// Compiles `f` for `target` with the parameters `donated` given up (every instruction
/// compiled: a fallback to the reference interpreter is an error), runs it on `args` (copies of
/// them, the donated ones passed by value) on `backend` and checks every output against the
/// reference.
fn run_on_target(
    f: &kiln_ir::Func,
    args: &[Literal],
    donated: &[bool],
    target: Target,
    backend: Backend,
) -> Result<(), String> {
    if args.len() != f.params.len() {
        return Err(format!(
            "{} arguments given for {} parameters",
            args.len(),
            f.params.len()
        ));
    }
    let got = match target {
        Target::Cpu => run_on_backend(backend, f, args, donated, false)?,
    };
    kiln_reference::accuracy::check_outputs(f, args, &got)
        .map(|_| ())
        .map_err(|e| format!("disagrees with the reference: {e}"))
}

/// The arguments of a filetest: its `// %N = VALUE` lines, parsed with the parameters' types.
fn filetest_args(text: &str, f: &kiln_ir::Func) -> Result<Vec<Literal>, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("// %").and_then(|r| r.split_once(" = ")))
        .zip(f.param_types())
        .map(|((_, v), t)| parse_literal(v, &t).map_err(|e| e.to_string()))
        .collect()
}

/// Every filetest path, sorted.
pub fn filetests() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "kir") {
                    out.push(p);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join("tests/filetests"), &mut out);
    out.sort();
    out
}

/// The labels cited by `// error:` lines of the verify filetests.
pub fn negative_labels() -> Vec<String> {
    let mut labels: Vec<String> = filetests()
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter(|t| t.starts_with("// RUN: verify"))
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.strip_prefix("// error: ").map(|s| s.trim().to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

/// How one spec example fared on the CPU backend (see [`cpu_coverage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuExample {
    /// Compiled with every instruction in a kernel, run, and its results equal to the spec's
    /// and to the reference's under `kiln_reference::accuracy`'s bounds.
    Checked,
    /// Compiled with every instruction in a kernel, but its results not checked (they differ
    /// from the spec's or the reference's, or it failed to run).
    Unchecked,
    /// Some instruction ran on the reference interpreter, or it did not compile.
    Interpreted,
}

/// Runs spec example `ex` on the CPU backend, unoptimized (so that nothing folds away and the
/// op itself is compiled), and says how it fared.
pub fn cpu_example(ex: &Example) -> CpuExample {
    use kiln_codegen_llvm::cpu::{CpuExecutable, Step};
    let Ok((m, args, expected)) = load_example(ex) else {
        return CpuExample::Interpreted;
    };
    let Some(f) = m.entry() else {
        return CpuExample::Interpreted;
    };
    let opts = kiln_kernel::Options {
        optimize: false,
        ..kiln_kernel::Options::from_vars(&|name| std::env::var(name).ok())
    };
    let Ok(exe) = CpuExecutable::compile_with_options(f, &[], &opts) else {
        return CpuExample::Interpreted;
    };
    if exe.plan().contains(&Step::Reference) {
        return CpuExample::Interpreted;
    }
    let checked = exe.run(&args).is_ok_and(|got| {
        check_results(&got, &expected).is_ok()
            && kiln_reference::accuracy::check_outputs(f, &args, &got).is_ok()
    });
    if checked {
        CpuExample::Checked
    } else {
        CpuExample::Unchecked
    }
}

/// The text of `ir-specs/coverage/cpu.txt`: per op, how many of its spec examples the CPU
/// backend compiled as kernels and checked against the spec's results and the reference
/// ([`cpu_example`]). Deterministic; `cpu_coverage_is_fresh` fails when the file is stale.
pub fn cpu_coverage() -> String {
    let mut s = String::from(
        "# Generated by `cargo xtask codegen` (the test `cpu_coverage_is_fresh`, which fails when\n\
         # this file is stale): per op, its spec examples on the CPU backend, compiled unoptimized:\n\
         # checked (every instruction in a kernel, results equal to the spec's and within the\n\
         # reference's ulp bounds), compiled but unchecked, interpreted (an instruction on the\n\
         # reference interpreter, or no compile). ir-specs/status.md's llvm column reads it.\n",
    );
    let specs = load_specs();
    let mut kinds: Vec<OpKind> = OpKind::ALL.to_vec();
    kinds.sort_by_key(|k| k.mnemonic());
    for k in kinds {
        let runs: Vec<CpuExample> = specs
            .iter()
            .find(|s| s.name == k.mnemonic())
            .map_or(Vec::new(), |s| s.examples.iter().map(cpu_example).collect());
        let count = |c: CpuExample| runs.iter().filter(|&&r| r == c).count();
        s.push_str(&format!(
            "{}: {} examples; checked {}, compiled unchecked {}, interpreted {}\n",
            k.mnemonic(),
            runs.len(),
            count(CpuExample::Checked),
            count(CpuExample::Unchecked),
            count(CpuExample::Interpreted)
        ));
    }
    s
}

/// The `llvm` column of op `op` from the committed `ir-specs/coverage/cpu.txt`: `checked`
/// (every example compiled as kernels and checked), `compiled, unchecked` (every example
/// compiled as kernels, some not checked), `interpreted` (some example not compiled as
/// kernels), `-` (no examples, or the op missing from the file).
fn cpu_column(coverage: &str, op: &str) -> &'static str {
    let Some(line) = coverage
        .lines()
        .find_map(|l| l.strip_prefix(op).and_then(|r| r.strip_prefix(": ")))
    else {
        return "-";
    };
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    match nums[..] {
        [0, ..] => "-",
        [n, c, _, _] if c == n => "checked",
        [_, _, _, 0] => "compiled, unchecked",
        _ => "interpreted",
    }
}

/// The text of `ir-specs/status.md`, generated from the specs, the filetests, the reference
/// interpreter, autodiff's rule table and the CPU backend's test results
/// (`ir-specs/coverage/cpu.txt`).
/// `docs/ops.md`: every op with the first paragraph of its spec's semantics and links to its
/// spec, grouped by the first letter; generated like `ir-specs/status.md`.
pub fn ops_reference() -> String {
    let specs = load_specs();
    let mut s = String::from(
        "# Op reference\n\nGenerated from `ir-specs/ops/` by `cargo xtask codegen`; a test fails \
         when it is stale. Each op's page has its full semantics, its inputs and attributes, \
         the constraints the verifier checks (with their labels), its VJP, and examples that \
         run as tests on the reference interpreter and every backend; `ir-specs/status.md` \
         shows what each layer covers. The ops follow StableHLO's names and semantics, except `lu`, \
         kiln's own.\n",
    );
    let mut kinds: Vec<OpKind> = OpKind::ALL.to_vec();
    kinds.sort_by_key(|k| k.mnemonic());
    let mut letter = None;
    for k in kinds {
        let name = k.mnemonic();
        let first = name.chars().next().map(|c| c.to_ascii_uppercase());
        if first != letter {
            letter = first;
            s.push_str(&format!("\n## {}\n\n", first.unwrap_or('?')));
        }
        let summary = specs
            .iter()
            .find(|sp| sp.name == name)
            .and_then(|sp| section(&sp.text, "Semantics"))
            .and_then(|sem| sem.trim().split("\n\n").next())
            .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| "(no spec)".to_string());
        s.push_str(&format!(
            "- [`{name}`](../ir-specs/ops/{name}.md): {summary}\n"
        ));
    }
    s
}

pub fn status_table() -> String {
    let specs = load_specs();
    let negs = negative_labels();
    let coverage =
        std::fs::read_to_string(root().join("ir-specs/coverage/cpu.txt")).unwrap_or_default();
    let mut s = String::from(
        "# Op status\n\nGenerated by `cargo xtask codegen`; a test fails when it is stale. \
         Columns: a spec file exists; every constraint has a negative filetest; every example \
         passes on the reference interpreter; the VJP (`yes` = implemented by autodiff and checked against finite differences, \
         `partial` = some attribute combinations, `n/a` = not differentiable); the CPU (LLVM) backend \
         (`checked`: every example compiled as kernels and checked against the spec's results and the reference, \
         `compiled, unchecked`: every example compiled as kernels, some not checked, `interpreted`: some example \
         runs an instruction on the reference interpreter, `-`: no examples; from `ir-specs/coverage/cpu.txt`, \
         which `cpu_coverage_is_fresh` writes from the examples' runs); the vmap batching rule (`yes`: \
         the batch runs as one program for every combination of batched operands, `loop when ...`: \
         except in that case, which runs once per example; every example is checked against a loop by \
         `tests/vmap.rs`).\n\n\
         | op | spec | verifier | reference | vjp | llvm | vmap |\n|---|---|---|---|---|---|---|\n",
    );
    let yes = |b: bool| if b { "yes" } else { "-" };
    let mut kinds: Vec<OpKind> = OpKind::ALL.to_vec();
    kinds.sort_by_key(|k| k.mnemonic());
    for k in kinds {
        let spec = specs.iter().find(|s| s.name == k.mnemonic());
        let verifier = spec.is_some_and(|s| s.labels.iter().all(|l| negs.contains(l)));
        let reference = spec.is_some_and(|s| {
            !s.examples.is_empty() && s.examples.iter().all(|e| run_example_reference(e).is_ok())
        });
        let vjp = match kiln_autodiff::coverage(k) {
            kiln_autodiff::Coverage::Full => "yes",
            kiln_autodiff::Coverage::Partial(_) => "partial",
            kiln_autodiff::Coverage::NotDifferentiable => "n/a",
        };
        let llvm = cpu_column(&coverage, k.mnemonic());
        let vmap = match kiln_autodiff::vmap::batching(k) {
            kiln_autodiff::vmap::Batching::Whole => "yes".to_string(),
            kiln_autodiff::vmap::Batching::LoopWhen(when) => format!("loop when {when}"),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {vjp} | {llvm} | {vmap} |\n",
            k.mnemonic(),
            yes(spec.is_some()),
            yes(verifier),
            yes(reference),
        ));
    }
    s
}

//! StableHLO's interpreter tests (`stablehlo/tests/interpret`, copied to
//! `../shared/peer-suites/stablehlo-interpret/` next to the repository) as a peer suite:
//! every `// -----` module is imported with its `check.*` ops, its entry function (`@main`,
//! or the only function; else every function without parameters) runs on the reference
//! interpreter and on the CPU backend, and the checks compare the results on the host. An
//! entry that takes arguments runs on those of the file's `--args` RUN lines, its printed
//! results matched against their `CHECK` lines. An `interpreter.run_parallel` runs its
//! programs on a grid of threads, their `send` and `recv` ops meeting in a
//! [`Channels`] table.
//!
//! The outcome of every module is in `ir-specs/stablehlo-suite.md`; the test fails when a
//! module listed there as passing no longer passes. `KILN_BLESS=1` rewrites the table.

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{Builder, Func, Literal, Loc, Op, ValueId};
use kiln_reference::spmd::{Grid, LocalCommunicator, run_processes};
use kiln_stablehlo::args::parse_args;
use kiln_stablehlo::channel::{Channels, sent};
use kiln_stablehlo::probe::interpreter_text;
use kiln_stablehlo::{ErrorKind, FuncChecks, Imported, Parallel, Piece, parse_with_checks, split};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Duration;

/// How long one function may run on one backend before it counts as failing.
const TIMEOUT: Duration = Duration::from_secs(20);

/// The outcome of one module on one backend.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Pass,
    Fail(String),
    Unsupported(String),
}

impl Outcome {
    fn word(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail(_) => "fail",
            Outcome::Unsupported(_) => "unsupported",
        }
    }

    fn cell(&self) -> String {
        match self {
            Outcome::Pass => "pass".into(),
            Outcome::Fail(m) => format!("fail: {}", clean(m)),
            Outcome::Unsupported(m) => format!("unsupported: {}", clean(m)),
        }
    }
}

/// A message fit for one table cell: one line, no pipes, at most 160 characters.
fn clean(m: &str) -> String {
    let one: String = m
        .chars()
        .map(|c| match c {
            '\n' | '\r' => ' ',
            '|' => '/',
            c => c,
        })
        .collect();
    let mut it = one.chars();
    let kept: String = it.by_ref().take(160).collect();
    if it.next().is_some() {
        format!("{kept}…")
    } else {
        kept
    }
}

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer-suites/stablehlo-interpret")
}

fn table_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ir-specs/stablehlo-suite.md")
}

/// The `.mlir` files under `dir`, sorted, as paths relative to it.
fn mlir_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "mlir") {
                let rel = p
                    .strip_prefix(dir)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// Runs `f` on another thread, failing after [`TIMEOUT`] or on a panic.
fn guarded(
    f: impl FnOnce() -> Result<Vec<Literal>, String> + Send + 'static,
) -> Result<Vec<Literal>, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("panic: {msg}"))
        });
        let _ = tx.send(r);
    });
    rx.recv_timeout(TIMEOUT)
        .unwrap_or_else(|_| Err(format!("no result within {TIMEOUT:?}")))
}

/// The function with each top-level constant turned into a parameter, and the constants' values
/// (the arguments to pass): the CPU backend then computes what the reference interpreter does,
/// instead of folding constants at compile time.
fn lift_constants(f: &Func) -> Result<(Func, Vec<Literal>), String> {
    let mut b = Builder::new(&f.name);
    let mut map: Vec<Option<ValueId>> = vec![None; f.values.len()];
    let mut args = Vec::new();
    for &p in &f.params {
        map[p.index()] = Some(b.param(f.values[p.index()].clone()));
    }
    for inst in &f.insts {
        if let Op::Constant { value } = &inst.op {
            let v = b.param(value.ty().clone());
            args.push(value.clone());
            map[inst.results[0].index()] = Some(v);
            continue;
        }
        let operands: Vec<ValueId> = inst
            .operands
            .iter()
            .map(|o| map[o.index()].expect("defined"))
            .collect();
        let types: Vec<_> = inst
            .results
            .iter()
            .map(|r| f.values[r.index()].clone())
            .collect();
        let loc = inst.loc.unwrap_or_else(Loc::caller);
        let rs = b
            .push_at(inst.op.clone(), &operands, Some(&types), loc)
            .map_err(|e| e.to_string())?;
        for (r, v) in inst.results.iter().zip(rs) {
            map[r.index()] = Some(v);
        }
    }
    let outs: Vec<ValueId> = f
        .outputs
        .iter()
        .map(|o| map[o.index()].expect("defined"))
        .collect();
    Ok((b.finish(&outs).map_err(|e| e.to_string())?, args))
}

/// Runs `f` on `args` on one backend (the CPU with `f`'s constants lifted into arguments).
fn run_func(f: &Func, args: Vec<Literal>, backend: &str) -> Result<Vec<Literal>, String> {
    let g = f.clone();
    match backend {
        "reference" => guarded(move || kiln_reference::eval(&g, &args).map_err(|e| e.to_string())),
        _ => guarded(move || {
            let (lifted, consts) = lift_constants(&g)?;
            let exe = CpuExecutable::compile_with_cache(&lifted, None)
                .map_err(|e| format!("compile: {e}"))?;
            let all: Vec<Literal> = args.into_iter().chain(consts).collect();
            exe.run(&all).map_err(|e| format!("run: {e}"))
        }),
    }
}

/// Prints what the `interpreter.print` ops of a function printed, as StableHLO's interpreter
/// does (`%name = type {` the value `}`), and passes its outputs on.
fn printed(outs: Vec<Literal>, checks: &FuncChecks) -> Vec<Literal> {
    let mut text = String::new();
    for p in &checks.prints {
        if let Some(v) = outs.get(p.output) {
            let mut nested = String::new();
            v.write_nested(&mut nested);
            text += &format!(
                "%{} = {} {{\n  {nested}\n}}\n",
                p.name,
                kiln_stablehlo::literal::type_name(v.ty())
            );
        }
    }
    print!("{text}");
    outs
}

/// Runs an `interpreter.run_parallel` on one backend: `p.programs` on a grid of threads, each
/// process on its share of `operands`; returns every process's results, in process order
/// (what a program prints is printed, one process after another).
fn run_grid(
    imported: &Imported,
    p: &Parallel,
    operands: Vec<Literal>,
    backend: &str,
) -> Result<Vec<Literal>, String> {
    let m = &imported.module;
    let grid = Grid::new(p.programs.len(), p.programs[0].len());
    let mut funcs = Vec::new();
    let mut checks = Vec::new();
    for name in p.programs.iter().flatten() {
        let i = m
            .funcs
            .iter()
            .position(|f| f.name == *name)
            .ok_or_else(|| format!("run_parallel: no function @{name}"))?;
        funcs.push(m.funcs[i].clone());
        checks.push(imported.checks[i].clone());
    }
    // The infeed queue: the results of the `infeed` functions, in order.
    let mut queue = Vec::new();
    for name in &p.infeed {
        let i = m
            .funcs
            .iter()
            .position(|f| f.name == *name)
            .ok_or_else(|| format!("run_parallel: no infeed function @{name}"))?;
        let mut outs = run_func(&m.funcs[i], Vec::new(), backend)?;
        outs.truncate(imported.checks[i].outputs);
        queue.extend(outs);
    }
    let mut queue = queue.into_iter();
    // Each process takes its share of the operands, and what its infeed ops read from the
    // queue, in process order; what its recv ops read comes from the channels when it starts.
    let mut args: Vec<Vec<Option<Literal>>> = Vec::new();
    let mut rest = operands.into_iter();
    for (f, c) in funcs.iter().zip(&checks) {
        let mut a = Vec::with_capacity(f.params.len());
        for k in 0..f.params.len() {
            if c.recvs.iter().any(|r| r.values.contains(&k)) {
                a.push(None);
                continue;
            }
            let from = if c.infeed.contains(&k) {
                queue
                    .next()
                    .ok_or("run_parallel: the infeed queue ran out")?
            } else {
                rest.next()
                    .ok_or("run_parallel: fewer operands than the programs take")?
            };
            a.push(Some(from));
        }
        args.push(a);
    }
    if rest.next().is_some() {
        return Err("run_parallel: more operands than the programs take".into());
    }
    let cpu = backend != "reference";
    guarded(move || {
        let comm = Arc::new(LocalCommunicator::new(grid));
        let channels = Channels::new(grid.processes(), comm.timeout());
        let mut exes = Vec::new();
        for f in funcs.iter().filter(|_| cpu) {
            exes.push(
                CpuExecutable::compile_with_cache(f, None).map_err(|e| format!("compile: {e}"))?,
            );
        }
        // Process `i`'s arguments: its own, with what its recv ops read from the channels.
        let receive = |i: usize| -> Result<Vec<Literal>, String> {
            let c = &checks[i];
            let mut a = args[i].clone();
            if !c.recvs.is_empty() {
                for (r, vals) in c.recvs.iter().zip(channels.receive(&c.func, &c.recvs)?) {
                    for (k, v) in r.values.clone().zip(vals) {
                        a[k] = Some(v);
                    }
                }
            }
            a.into_iter()
                .map(|v| v.ok_or_else(|| "run_parallel: a parameter without a value".to_string()))
                .collect()
        };
        let outs = run_processes(comm, |proc| {
            let i = proc.flat(grid);
            let r = receive(i).and_then(|a| {
                if cpu {
                    exes[i].run(&a).map_err(|e| format!("run: {e}"))
                } else {
                    kiln_reference::eval(&funcs[i], &a).map_err(|e| e.to_string())
                }
            });
            // What its send ops sent is posted when the process finishes.
            match &r {
                Ok(o) => channels.finish(sent(&checks[i].sends, o)),
                Err(_) => channels.fail(),
            }
            r
        })?;
        Ok(outs
            .into_iter()
            .zip(&checks)
            .flat_map(|(outs, c)| {
                // A program's own results, without what it prints, outfeeds or sends.
                let mut own = printed(outs, c);
                own.truncate(c.outputs);
                own
            })
            .collect())
    })
}

/// Runs one function of the module on one backend: with an `interpreter.run_parallel`, first
/// on zeros for the grid's results (to compute its operands), then on the grid's results.
fn run_entry(
    imported: &Imported,
    f: &Func,
    checks: &FuncChecks,
    backend: &str,
) -> Result<Vec<Literal>, String> {
    match checks.parallel.as_slice() {
        [] => run_func(f, Vec::new(), backend).map(|o| printed(o, checks)),
        [p] => {
            let zeros: Vec<Literal> = f.param_types().into_iter().map(Literal::zeros).collect();
            let first = run_func(f, zeros, backend)?;
            let operands = first[p.outputs.clone()].to_vec();
            let results = run_grid(imported, p, operands, backend)?;
            run_func(f, results, backend).map(|o| printed(o, checks))
        }
        _ => Err("more than one interpreter.run_parallel in a function".into()),
    }
}

/// Runs the functions on one backend and checks their results.
fn run_on(imported: &Imported, funcs: &[(Func, FuncChecks)], backend: &str) -> Outcome {
    for (f, checks) in funcs {
        let outs = match run_entry(imported, f, checks, backend) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(format!("@{}: {e}", f.name)),
        };
        for c in &checks.checks {
            if let Err(e) = c.verify(&outs) {
                return Outcome::Fail(format!("@{}: {e}", f.name));
            }
        }
    }
    Outcome::Pass
}

/// A `// RUN:` line that gives the entry function's arguments (`--args="[...]"`).
#[derive(Clone, Debug)]
struct ArgsRun {
    /// Its line in the file.
    line: usize,
    /// The text of the arguments.
    args: String,
    /// Whether the line expects the arguments to be refused (`not stablehlo-translate`).
    refused: bool,
    /// The prefix of the FileCheck lines that check its output (`CHECK` unless given).
    prefix: String,
}

/// The RUN lines of `text` that give arguments.
fn args_runs(text: &str) -> Vec<ArgsRun> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let run = l.trim_start().strip_prefix("// RUN:")?.trim();
            let (_, rest) = run.split_once("--args=\"")?;
            let (args, tail) = rest.split_once('"')?;
            let prefix = tail
                .split_whitespace()
                .find_map(|w| {
                    w.strip_prefix("--check-prefixes=")
                        .or_else(|| w.strip_prefix("--check-prefix="))
                })
                .and_then(|p| p.split(',').next())
                .unwrap_or("CHECK");
            Some(ArgsRun {
                line: i + 1,
                args: args.to_string(),
                refused: run.starts_with("not "),
                prefix: prefix.to_string(),
            })
        })
        .collect()
}

/// Matches `output` against the `// PREFIX:` and `// PREFIX-NEXT:` lines of `text` as FileCheck
/// does for those two directives: a `PREFIX` line is found in a later output line, a
/// `PREFIX-NEXT` line in the output line right after the last match (runs of whitespace count
/// as one space).
fn file_check(text: &str, prefix: &str, output: &str) -> Result<(), String> {
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let out: Vec<String> = output.lines().map(norm).collect();
    let (plain, next) = (format!("{prefix}:"), format!("{prefix}-NEXT:"));
    let mut last: Option<usize> = None;
    let mut any = false;
    for (i, l) in text.lines().enumerate() {
        let Some(rest) = l.trim_start().strip_prefix("//").map(str::trim_start) else {
            continue;
        };
        let (is_next, pat) = if let Some(p) = rest.strip_prefix(&next) {
            (true, norm(p))
        } else if let Some(p) = rest.strip_prefix(&plain) {
            (false, norm(p))
        } else {
            continue;
        };
        any = true;
        let from = last.map_or(0, |k| k + 1);
        let found = if is_next {
            if last.is_none() {
                return Err(format!("line {}: {next} before any {plain}", i + 1));
            }
            out.get(from).filter(|o| o.contains(&pat)).map(|_| from)
        } else {
            (from..out.len()).find(|&k| out[k].contains(&pat))
        };
        let Some(k) = found else {
            return Err(format!(
                "line {}: `{pat}` not found in the output from its line {} (`{}`)",
                i + 1,
                from + 1,
                out.get(from).map_or("the end", String::as_str)
            ));
        };
        last = Some(k);
    }
    if !any {
        return Err(format!("no `// {plain}` lines check the output"));
    }
    Ok(())
}

/// Runs the entry function `i` (which takes arguments) on one backend with the arguments of
/// each of `runs`: arguments a RUN line expects refused must be refused with a located error;
/// the others must parse, and the function's results, printed as StableHLO's interpreter
/// prints them, must pass the FileCheck lines of the RUN line's prefix in `text`.
fn run_with_args(
    imported: &Imported,
    i: usize,
    runs: &[ArgsRun],
    text: &str,
    backend: &str,
) -> Outcome {
    let f = &imported.module.funcs[i];
    let checks = &imported.checks[i];
    for r in runs {
        let args = match (parse_args(&r.args), r.refused) {
            (Err(e), true) if e.pos.line > 0 => continue,
            (Err(e), _) => return Outcome::Fail(format!("RUN line {}: --args: {e}", r.line)),
            (Ok(_), true) => {
                return Outcome::Fail(format!(
                    "RUN line {}: --args=\"{}\" was to be refused",
                    r.line, r.args
                ));
            }
            (Ok(a), false) => a,
        };
        let given: Vec<_> = args.iter().map(|a| a.ty().clone()).collect();
        if given != f.param_types() {
            return Outcome::Fail(format!(
                "RUN line {}: @{} takes {} argument(s) of types {:?}, --args gives {:?}",
                r.line,
                f.name,
                f.params.len(),
                f.param_types(),
                given
            ));
        }
        let outs = match run_func(f, args, backend) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(format!("@{}: {e}", f.name)),
        };
        for c in &checks.checks {
            if let Err(e) = c.verify(&outs) {
                return Outcome::Fail(format!("@{}: {e}", f.name));
            }
        }
        let printed: String = outs[..checks.outputs.min(outs.len())]
            .iter()
            .map(|v| interpreter_text(v) + "\n")
            .collect();
        if let Err(e) = file_check(text, &r.prefix, &printed) {
            return Outcome::Fail(format!("RUN line {}: {e}", r.line));
        }
    }
    Outcome::Pass
}

/// Imports one module and runs it on both backends; an entry that takes arguments runs on
/// those of each of `runs` (the file's RUN lines with `--args`).
fn run_module(piece: Piece, runs: &[ArgsRun]) -> (Outcome, Outcome) {
    let imported = match parse_with_checks(piece) {
        Ok(m) => m,
        Err(e) if e.kind == ErrorKind::Unsupported => {
            let o = Outcome::Unsupported(format!("{}: {}", e.pos, e.message));
            return (o.clone(), o);
        }
        Err(e) => {
            let o = Outcome::Fail(format!("import: {e}"));
            return (o.clone(), o);
        }
    };
    let m = &imported.module;
    let takes_args = |i: usize| {
        let grid_results: usize = imported.checks[i]
            .parallel
            .iter()
            .map(|p| p.params.len())
            .sum();
        m.funcs[i].params.len() != grid_results
    };
    let entry = m.func("main").or(if m.funcs.len() == 1 {
        m.funcs.first()
    } else {
        None
    });
    let picked: Vec<usize> = match entry {
        Some(e) => vec![m.funcs.iter().position(|f| std::ptr::eq(f, e)).unwrap_or(0)],
        None => (0..m.funcs.len()).filter(|&i| !takes_args(i)).collect(),
    };
    if let Some(&i) = picked.iter().find(|&&i| takes_args(i)) {
        if picked.len() != 1
            || !imported.checks[i].parallel.is_empty()
            || !runs.iter().any(|r| !r.refused)
        {
            let o = Outcome::Unsupported(format!(
                "the entry @{} takes arguments that no RUN line gives",
                m.funcs[i].name
            ));
            return (o.clone(), o);
        }
        return (
            run_with_args(&imported, i, runs, piece.text, "reference"),
            run_with_args(&imported, i, runs, piece.text, "cpu"),
        );
    }
    let funcs: Vec<(Func, FuncChecks)> = picked
        .iter()
        .map(|&i| (m.funcs[i].clone(), imported.checks[i].clone()))
        .collect();
    (
        run_on(&imported, &funcs, "reference"),
        run_on(&imported, &funcs, "cpu"),
    )
}

/// Reads the committed table: module → (reference, cpu) outcome words.
fn committed(text: &str) -> BTreeMap<String, (String, String)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 4 && cells[1].starts_with('`') && cells[1].contains(".mlir#") {
            let word = |c: &str| c.split(':').next().unwrap_or("").trim().to_string();
            out.insert(
                cells[1].trim_matches('`').to_string(),
                (word(cells[2]), word(cells[3])),
            );
        }
    }
    out
}

#[test]
fn stablehlo_interpreter_suite() {
    let dir = suite_dir();
    if !dir.is_dir() {
        println!(
            "SKIPPED: the StableHLO peer suite is not at {} (it lives in the steering repository's shared/ folder)",
            dir.display()
        );
        return;
    }
    std::panic::set_hook(Box::new(|_| {}));
    let mut rows = Vec::new();
    for file in mlir_files(&dir) {
        let Ok(text) = std::fs::read_to_string(dir.join(&file)) else {
            rows.push((
                format!("{file}#0"),
                Outcome::Fail("unreadable".into()),
                Outcome::Fail("unreadable".into()),
            ));
            continue;
        };
        let runs = args_runs(&text);
        for (i, piece) in split(&text).into_iter().enumerate() {
            let (r, c) = run_module(piece, &runs);
            rows.push((format!("{file}#{i}"), r, c));
        }
    }
    let _ = std::panic::take_hook();
    let count = |col: usize, word: &str| {
        rows.iter()
            .filter(|(_, r, c)| {
                if col == 0 {
                    r.word() == word
                } else {
                    c.word() == word
                }
            })
            .count()
    };
    let mut table = String::from(
        "# StableHLO interpreter suite\n\n\
         The outcome of every module of StableHLO's interpreter tests (`stablehlo/tests/interpret`, in\n\
         `../shared/peer-suites/stablehlo-interpret/`) imported by `kiln-stablehlo` and run on the reference\n\
         interpreter and on the CPU backend, its `check.*` ops compared on the host. Written by\n\
         `crates/kiln-stablehlo/tests/peer_suite.rs` (`KILN_BLESS=1` rewrites it); the test fails when a module\n\
         listed here as passing stops passing. A module is `unsupported` when it uses an op, type or\n\
         attribute kiln does not have (the reason is the importer's located error), `fail` otherwise.\n\n\
         ## Totals\n\n| backend | pass | fail | unsupported |\n|---|---:|---:|---:|\n",
    );
    for (col, name) in [(0, "reference"), (1, "cpu")] {
        table += &format!(
            "| {name} | {} | {} | {} |\n",
            count(col, "pass"),
            count(col, "fail"),
            count(col, "unsupported")
        );
    }
    table += &format!(
        "\n{} modules.\n\n## Modules\n\n| module | reference | cpu |\n|---|---|---|\n",
        rows.len()
    );
    for (id, r, c) in &rows {
        table += &format!("| `{id}` | {} | {} |\n", r.cell(), c.cell());
    }
    let path = table_path();
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let before = committed(&old);
    let mut regressions = Vec::new();
    for (id, r, c) in &rows {
        if let Some((or, oc)) = before.get(id) {
            if or == "pass" && *r != Outcome::Pass {
                regressions.push(format!("{id} on the reference: {}", r.cell()));
            }
            if oc == "pass" && *c != Outcome::Pass {
                regressions.push(format!("{id} on the CPU: {}", c.cell()));
            }
        }
    }
    println!(
        "reference: {} pass, cpu: {} pass, of {} modules",
        count(0, "pass"),
        count(1, "pass"),
        rows.len()
    );
    if std::env::var_os("KILN_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &table).expect("write the suite table");
    } else if old != table {
        println!(
            "{} is out of date; rerun with KILN_BLESS=1 to update it",
            path.display()
        );
    }
    assert!(
        regressions.is_empty(),
        "{} module(s) passed before and do not now:\n{}",
        regressions.len(),
        regressions.join("\n")
    );
}

/// A grid whose first process receives what the third sends through the second, with the
/// third sending on channel `channel` (1 matches the second's recv).
fn relay(channel: i64) -> String {
    let handle =
        |h: i64| format!("channel_handle = #stablehlo.channel_handle<handle = {h}, type = 1>");
    format!(
        r#"module {{
  func.func @first(%x: tensor<2xi64>, %t: !stablehlo.token) -> !stablehlo.token {{
    %u = "stablehlo.send"(%x, %t) {{{}}} : (tensor<2xi64>, !stablehlo.token) -> !stablehlo.token
    func.return %u : !stablehlo.token
  }}
  func.func @relay(%t: !stablehlo.token) -> !stablehlo.token {{
    %r:2 = "stablehlo.recv"(%t) {{{}}} : (!stablehlo.token) -> (tensor<2xi64>, !stablehlo.token)
    %d = stablehlo.add %r#0, %r#0 : tensor<2xi64>
    %u = "stablehlo.send"(%d, %r#1) {{{}}} : (tensor<2xi64>, !stablehlo.token) -> !stablehlo.token
    func.return %u : !stablehlo.token
  }}
  func.func @last(%t: !stablehlo.token) -> (tensor<2xi64>, !stablehlo.token) {{
    %r:2 = "stablehlo.recv"(%t) {{{}}} : (!stablehlo.token) -> (tensor<2xi64>, !stablehlo.token)
    func.return %r#0, %r#1 : tensor<2xi64>, !stablehlo.token
  }}
  func.func @main() {{
    %x = stablehlo.constant dense<[1, 2]> : tensor<2xi64>
    %t = stablehlo.after_all : !stablehlo.token
    %o:4 = "interpreter.run_parallel"(%t, %t, %x, %t) {{
      programs = [[@last], [@relay], [@first]]
    }} : (!stablehlo.token, !stablehlo.token, tensor<2xi64>, !stablehlo.token) ->
        (tensor<2xi64>, !stablehlo.token, !stablehlo.token, !stablehlo.token)
    check.expect_eq_const %o#0, dense<[2, 4]> : tensor<2xi64>
    func.return
  }}
}}"#,
        handle(channel),
        handle(1),
        handle(2),
        handle(2)
    )
}

#[test]
fn send_and_recv_relay_through_a_grid_on_both_backends() {
    let text = relay(1);
    let piece = Piece {
        text: &text,
        first_line: 1,
    };
    assert_eq!(run_module(piece, &[]), (Outcome::Pass, Outcome::Pass));
}

#[test]
fn a_recv_without_a_send_fails_naming_it_on_both_backends() {
    // The first process sends on channel 3, which nothing receives: the relay's recv on
    // channel 1 never gets a value, nor, in turn, the last process's recv on channel 2.
    let text = relay(3);
    let piece = Piece {
        text: &text,
        first_line: 1,
    };
    let (r, c) = run_module(piece, &[]);
    for o in [r, c] {
        let Outcome::Fail(m) = &o else {
            panic!("expected a failure, got {o:?}")
        };
        assert!(
            (m.contains("7:12: `stablehlo.recv` of @relay on channel 1")
                || m.contains("13:12: `stablehlo.recv` of @last on channel 2"))
                && m.contains("has no matching `stablehlo.send`"),
            "{m}"
        );
    }
}

#[test]
fn arguments_come_from_the_run_line_and_results_pass_its_check_lines() {
    let text = r#"// RUN: stablehlo-translate %s --interpret --args="[dense<[1, 2]> : tensor<2xi32>, dense<3> : tensor<i32>]" | FileCheck %s
// RUN: not stablehlo-translate %s --interpret --args="[dense<1> : tensor<2xi32>" 2>&1 | FileCheck %s --check-prefixes=CHECK-ERR
func.func @main(%a: tensor<2xi32>, %b: tensor<i32>) -> (tensor<2x2xi32>, tensor<i32>) {
  %c = stablehlo.broadcast_in_dim %a, dims = [1] : (tensor<2xi32>) -> tensor<2x2xi32>
  %d = stablehlo.add %b, %b : tensor<i32>
  return %c, %d : tensor<2x2xi32>, tensor<i32>
}
// CHECK:      tensor<2x2xi32> {
// CHECK-NEXT:   [
// CHECK-NEXT:     [1, 2],
// CHECK-NEXT:     [1, 2]
// CHECK-NEXT:   ]
// CHECK-NEXT: }
// CHECK-NEXT: tensor<i32> {6}
"#;
    let runs = args_runs(text);
    assert_eq!(runs.len(), 2);
    assert!(!runs[0].refused && runs[1].refused && runs[1].prefix == "CHECK-ERR");
    let piece = Piece {
        text,
        first_line: 1,
    };
    assert_eq!(run_module(piece, &runs), (Outcome::Pass, Outcome::Pass));
    // A result the check lines do not expect fails the module.
    let wrong = text.replace("tensor<i32> {6}", "tensor<i32> {7}");
    let piece = Piece {
        text: &wrong,
        first_line: 1,
    };
    let (r, c) = run_module(piece, &runs);
    assert!(
        matches!((&r, &c), (Outcome::Fail(m), Outcome::Fail(_)) if m.contains("`tensor<i32> {7}` not found")),
        "{r:?}"
    );
    // So do arguments that a RUN line expects refused but that parse.
    let accepted = text.replace(
        "[dense<1> : tensor<2xi32>\"",
        "[dense<1> : tensor<2xi32>]\"",
    );
    let piece = Piece {
        text: &accepted,
        first_line: 1,
    };
    let (r, _) = run_module(piece, &args_runs(&accepted));
    assert!(
        matches!(&r, Outcome::Fail(m) if m.contains("was to be refused")),
        "{r:?}"
    );
}

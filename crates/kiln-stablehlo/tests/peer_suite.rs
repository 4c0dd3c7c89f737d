//! StableHLO's interpreter tests (`stablehlo/tests/interpret`, copied to
//! `../shared/peer-suites/stablehlo-interpret/` next to the repository) as a peer suite:
//! every `// -----` module is imported with its `check.*` ops, its entry function (`@main`,
//! or the only function; else every function without parameters) runs on the reference
//! interpreter and on the CPU backend, and the checks compare the results on the host.
//!
//! The outcome of every module is in `ir-specs/stablehlo-suite.md`; the test fails when a
//! module listed there as passing no longer passes. `KILN_BLESS=1` rewrites the table.

use kiln_codegen_llvm::cpu::CpuExecutable;
use kiln_ir::{Builder, Func, Literal, Loc, Op, ValueId};
use kiln_reference::spmd::{Grid, LocalCommunicator, run_processes};
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
    // queue, in process order.
    let mut args = Vec::new();
    let mut rest = operands.into_iter();
    for (f, c) in funcs.iter().zip(&checks) {
        let mut a = Vec::with_capacity(f.params.len());
        for k in 0..f.params.len() {
            let from = if c.infeed.contains(&k) {
                queue
                    .next()
                    .ok_or("run_parallel: the infeed queue ran out")?
            } else {
                rest.next()
                    .ok_or("run_parallel: fewer operands than the programs take")?
            };
            a.push(from);
        }
        args.push(a);
    }
    if rest.next().is_some() {
        return Err("run_parallel: more operands than the programs take".into());
    }
    let flat = move |r: Vec<Vec<Literal>>| {
        r.into_iter()
            .zip(&checks)
            .flat_map(|(outs, c)| {
                // A program's own results, without what it prints or outfeeds.
                let mut own = printed(outs, c);
                own.truncate(c.outputs);
                own
            })
            .collect::<Vec<_>>()
    };
    match backend {
        "reference" => guarded(move || {
            let refs: Vec<&Func> = funcs.iter().collect();
            kiln_reference::spmd::eval_grid(grid, &refs, &args)
                .map(flat)
                .map_err(|e| e.to_string())
        }),
        _ => guarded(move || {
            let mut exes = Vec::new();
            for f in &funcs {
                exes.push(
                    CpuExecutable::compile_with_cache(f, None)
                        .map_err(|e| format!("compile: {e}"))?,
                );
            }
            let comm = Arc::new(LocalCommunicator::new(grid));
            run_processes(comm, |proc| {
                let i = proc.flat(grid);
                exes[i].run(&args[i]).map_err(|e| format!("run: {e}"))
            })
            .map(flat)
        }),
    }
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

/// Imports one module and runs it on both backends.
fn run_module(piece: Piece) -> (Outcome, Outcome) {
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
        let o = Outcome::Unsupported(format!("the entry @{} takes arguments", m.funcs[i].name));
        return (o.clone(), o);
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
        for (i, piece) in split(&text).into_iter().enumerate() {
            let (r, c) = run_module(piece);
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

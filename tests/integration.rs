//! kiln's integration tests: one binary, so the LLVM-linked test code is linked once.
//!
//! Bless snapshots with `INSTA_UPDATE=always cargo test -p kiln-tests` (or `cargo insta
//! review`); regenerate `ir-specs/status.md` with `cargo xtask codegen`.
//!
//! The tests that compile and run programs (`*_on_the_selected_backend`: the spec examples and
//! random programs; the runs of `filetests_match_snapshots`) follow `KILN_BACKEND`: `KILN_BACKEND=ptx-emulator cargo
//! test -p kiln-tests --test integration` runs them through the GPU mapping on the emulator.
//! What the filetests print (LLVM IR, memory plans, fused kernels) is the CPU backend's
//! either way, and `cpu_coverage_is_fresh` records the CPU backend's coverage; the other tests
//! run no backend (the parser, the verifier, the reference interpreter, autodiff on the
//! reference in `gradcheck`).

use kiln_ir::random::{Config, Rng, random_func, random_literal};
use kiln_ir::{Func, Literal, OpKind, parse_func_text, parse_module, print_func, verify};
use kiln_tests::*;

mod gradcheck;
mod how_it_compiles;
use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};

#[test]
fn spec_files_match_the_op_list() {
    let specs: BTreeSet<String> = load_specs().into_iter().map(|s| s.name).collect();
    let ops: BTreeSet<String> = OpKind::ALL
        .iter()
        .map(|k| k.mnemonic().to_string())
        .collect();
    assert_eq!(
        specs, ops,
        "ir-specs/ops/*.md must match OpKind::ALL one to one"
    );
    assert!(ops.len() >= 55, "{} ops", ops.len());
}

#[test]
fn specs_have_every_section_and_numbered_labels() {
    for s in load_specs() {
        for sec in [
            "Semantics",
            "Inputs",
            "Outputs",
            "Constraints",
            "VJP",
            "Examples",
        ] {
            assert!(
                s.text.contains(&format!("\n## {sec}\n")),
                "{}: missing section {sec}",
                s.name
            );
        }
        let want: Vec<String> = (1..=s.labels.len())
            .map(|i| format!("{}_c{i}", s.name))
            .collect();
        assert_eq!(
            s.labels, want,
            "{}: labels must be numbered {}_c1, {}_c2, ...",
            s.name, s.name, s.name
        );
        assert!(!s.examples.is_empty(), "{}: needs an example", s.name);
        let k = OpKind::from_mnemonic(&s.name).expect("checked by spec_files_match_the_op_list");
        // A rule for some cases only (a `while` with a static trip count) counts as a rule.
        let has_rule = k.props().contains(kiln_ir::Props::DIFFERENTIABLE)
            || matches!(
                kiln_autodiff::coverage(k),
                kiln_autodiff::Coverage::Partial(_)
            );
        assert_eq!(
            s.differentiable, has_rule,
            "{}: the spec's VJP section and the DIFFERENTIABLE property (or autodiff's partial coverage) disagree",
            s.name
        );
    }
}

#[test]
fn spec_examples_run_on_the_reference_interpreter() {
    let mut n = 0;
    let mut failures = Vec::new();
    for s in load_specs() {
        for ex in &s.examples {
            n += 1;
            if let Err(e) = run_example_reference(ex) {
                failures.push(format!("ir-specs/ops/{}.md:{}: {e}", s.name, ex.line));
            }
        }
    }
    println!("{n} spec examples ran on the reference interpreter");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every spec example written for a grid of processes runs on the reference interpreter and
/// on the CPU backend (its collectives host steps), each process's results the spec's.
#[test]
fn spec_grid_examples_run_on_the_reference_and_the_cpu() {
    let mut n = 0;
    let mut failures = Vec::new();
    for s in load_specs() {
        for ex in &s.grid_examples {
            n += 1;
            for (backend, r) in [
                ("reference", run_grid_example_reference(ex)),
                ("cpu", run_grid_example_cpu(ex)),
            ] {
                if let Err(e) = r {
                    failures.push(format!(
                        "ir-specs/ops/{}.md:{} on the {backend}: {e}",
                        s.name, ex.line
                    ));
                }
            }
        }
    }
    println!("{n} grid examples ran on the reference interpreter and the CPU");
    assert!(n > 0, "no spec has a grid example");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every spec example compiled and run on the selected backend (`KILN_BACKEND`: the CPU by
/// default, `ptx-emulator` for the GPU mapping on the emulator), its results equal to the
/// spec's. Instructions without a kernel may run on the reference interpreter (the
/// `interpreted` entries of `ir-specs/coverage/cpu.txt`); a kernel the GPU mapping refuses
/// may not.
#[test]
fn spec_examples_run_on_the_selected_backend() {
    let backend = selected_backend().unwrap();
    let mut n = 0;
    let mut failures = Vec::new();
    for s in load_specs() {
        for ex in &s.examples {
            let (m, args, expected) = load_example(ex).unwrap();
            let f = m.entry().unwrap();
            let r = run_on_backend(backend, f, &args, &[], true);
            match r.and_then(|got| check_results(&got, &expected)) {
                Ok(()) => n += 1,
                Err(e) => failures.push(format!("ir-specs/ops/{}.md:{}: {e}", s.name, ex.line)),
            }
        }
    }
    println!("{n} spec examples ran on the {backend:?} backend");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Random programs (seeds from 100,000 on, apart from the GPU emulator's own suite, with the
/// wide ops of `Config::with_wide`) compiled on the selected backend and checked against the reference under
/// `kiln_reference::accuracy`: 300 on the GPU emulator, 40 on the CPU (whose own differential
/// suite, `kiln-codegen-llvm/tests/differential.rs`, runs thousands); `KILN_SUITE_PROGRAMS=N`
/// for another count. Instructions without a kernel may run on the reference interpreter; a
/// kernel the GPU mapping refuses may not.
#[test]
fn random_programs_agree_with_the_reference_on_the_selected_backend() {
    let backend = selected_backend().unwrap();
    let n: u64 = std::env::var("KILN_SUITE_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(match backend {
            Backend::Cpu => 40,
            Backend::PtxEmulator => 300,
        });
    let t = std::time::Instant::now();
    let mut failures = Vec::new();
    for seed in 100_000..100_000 + n {
        let f = random_func(&mut Rng::new(seed), &Config::profile(seed).with_wide());
        let mut rng = Rng::new(seed ^ 77);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal(&mut rng, t))
            .collect();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let got = run_on_backend(backend, &f, &args, &[], true)?;
            kiln_reference::accuracy::check_outputs(&f, &args, &got).map(|_| ())
        }))
        .unwrap_or_else(|_| Err("panicked".into()));
        if let Err(e) = r {
            failures.push(format!("seed {seed}: {e}\n{f}"));
        }
    }
    println!(
        "{n} random programs on the {backend:?} backend, {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The test binary's backend choice: `cpu` (or nothing) and `ptx-emulator`, and a clear error
/// for any other (the reference interpreter would agree with itself).
#[test]
fn the_suites_backend_is_chosen_by_name() {
    assert_eq!(backend_named(None), Ok(Backend::Cpu));
    assert_eq!(backend_named(Some("cpu")), Ok(Backend::Cpu));
    assert_eq!(
        backend_named(Some("ptx-emulator")),
        Ok(Backend::PtxEmulator)
    );
    for other in ["reference", "gpu"] {
        let e = backend_named(Some(other)).unwrap_err();
        assert_eq!(
            e,
            format!("KILN_BACKEND={other}: the test suites run on `cpu` or `ptx-emulator`")
        );
    }
}

#[test]
fn spec_examples_print_canonically() {
    for s in load_specs() {
        for ex in s.examples.iter().chain(&s.grid_examples) {
            let m = parse_module(&ex.kiln).unwrap();
            assert_eq!(
                kiln_ir::print_module(&m),
                ex.kiln,
                "ir-specs/ops/{}.md:{} is not in printed form",
                s.name,
                ex.line
            );
        }
    }
}

#[test]
fn every_constraint_label_has_a_negative_filetest() {
    let negs: BTreeSet<String> = negative_labels().into_iter().collect();
    let spec: BTreeSet<String> = load_specs().into_iter().flat_map(|s| s.labels).collect();
    let generic: BTreeSet<String> = negs
        .iter()
        .filter(|l| l.starts_with("ir_"))
        .cloned()
        .collect();
    let missing: Vec<_> = spec.difference(&negs).collect();
    assert!(
        missing.is_empty(),
        "labels without a negative filetest: {missing:?}"
    );
    let unknown: Vec<_> = negs
        .difference(&spec)
        .filter(|l| !generic.contains(*l))
        .collect();
    assert!(
        unknown.is_empty(),
        "negative filetests cite labels no spec defines: {unknown:?}"
    );
    let readme = std::fs::read_to_string(root().join("ir-specs/README.md")).unwrap();
    for g in &generic {
        assert!(
            readme.contains(&format!("`{g}`")),
            "generic label {g} is not documented in ir-specs/README.md"
        );
    }
}

#[test]
fn filetests_match_snapshots() {
    let files = filetests();
    assert!(!files.is_empty());
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(root().join("tests/snapshots"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for path in &files {
            let rel = path.strip_prefix(root().join("tests/filetests")).unwrap();
            let name = rel.with_extension("").to_string_lossy().replace('/', "__");
            let out = run_filetest(path).unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
            insta::assert_snapshot!(name, out);
        }
    });
    println!("{} filetests", files.len());
}

#[test]
fn ir_ssa_violations_are_caught() {
    let mut f = parse_func_text("func @main(%0: f32[2]) -> f32[2] {\n  %1 = add %0, %0 : f32[2]\n  %2 = add %1, %1 : f32[2]\n  return %2\n}\n").unwrap();
    f.insts.swap(0, 1);
    let e = verify(&f).unwrap_err();
    assert_eq!(e.diag.label, "ir_ssa", "{e}");
    let mut g = parse_func_text(
        "func @main(%0: f32[2]) -> f32[2] {\n  %1 = add %0, %0 : f32[2]\n  return %1\n}\n",
    )
    .unwrap();
    g.outputs = vec![kiln_ir::ValueId(9)];
    assert_eq!(verify(&g).unwrap_err().diag.label, "ir_ssa");
}

/// The text and reference tests' random programs: seeds `default`, or those
/// `KILN_TEXT_PROGRAMS` names (a count `N` or a range `A..B` of fresh seeds).
fn random_programs(default: std::ops::Range<u64>) -> impl Iterator<Item = (u64, Func)> {
    let knob = std::env::var("KILN_TEXT_PROGRAMS").ok();
    let seeds =
        kiln_ir::random::seeds::seed_range("KILN_TEXT_PROGRAMS", knob.as_deref(), default).unwrap();
    seeds.map(|seed| {
        let cfg = Config {
            ops: 1 + (seed as usize % 30),
            control: seed % 4 == 1,
            ..Config::default()
        }
        .with_wide();
        (seed, random_func(&mut Rng::new(seed), &cfg))
    })
}

#[test]
fn random_programs_round_trip_through_text() {
    let mut n = 0;
    for (seed, f) in random_programs(0..600) {
        verify(&f)
            .unwrap_or_else(|e| panic!("seed {seed}: generated an ill-typed program: {e}\n{f}"));
        let text = print_func(&f);
        let g = parse_func_text(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{text}"));
        verify(&g).unwrap_or_else(|e| {
            panic!("seed {seed}: parsed back, it does not verify: {e}\n{text}")
        });
        assert_eq!(
            print_func(&g),
            text,
            "seed {seed}: print -> parse -> print changed the text"
        );
        assert_eq!(
            print_func(&f),
            text,
            "seed {seed}: printing is not deterministic"
        );
        n += 1;
    }
    println!("{n} random programs round-tripped");
}

#[test]
fn random_programs_run_on_the_reference_without_panicking() {
    let mut n = 0;
    for (seed, f) in random_programs(0..300) {
        let mut rng = Rng::new(seed ^ 0xABCD);
        let args: Vec<Literal> = f
            .param_types()
            .iter()
            .map(|t| random_literal(&mut rng, t))
            .collect();
        let a = kiln_reference::eval(&f, &args).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let b = kiln_reference::eval(&f, &args).unwrap();
        assert_eq!(
            format!("{a:?}"),
            format!("{b:?}"),
            "seed {seed}: evaluation is not deterministic"
        );
        n += 1;
    }
    println!("{n} random programs evaluated");
}

/// Each case must produce an error, never a panic.
fn must_fail(what: &str, f: impl FnOnce() -> Result<(), String>) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => panic!("{what}: accepted, but should be rejected"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{what}: panicked instead of returning an error"),
    }
}

#[test]
fn bad_input_gives_errors_never_panics() {
    let good = "func @main(%0: f32[2], %1: f32[2]) -> f32[2] {\n  %2 = add %0, %1 : f32[2]\n  return %2\n}\n";
    let texts = [
        "",
        "func",
        "func @main",
        "func @main(%0: f32[2] -> f32[2] { return %0 }",
        "func @main(%0: f33[2]) -> f32[2] { return %0 }",
        "func @main(%0: f32[2,]) -> f32[2] { return %0 }",
        "func @main(%0: f32[-2]) -> f32[2] { return %0 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = frobnicate %0 : f32[2] return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = add %0, %9 : f32[2] return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %0 = add %0, %0 : f32[2] return %0 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = add %0, %0 return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = add %0, %0 : f32[2], f32[2] return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = transpose %0 {permutation = 0} : f32[2] return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = transpose %0 {perm = [0]} : f32[2] return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = transpose %0 : f32[2] return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = compare %0, %0 {comparison_direction = ABOUT} : pred[2] return %1 }",
        "func @main() -> f32[2] { %1 = constant {value = [1.0, [2.0]]} : f32[2] return %1 }",
        "func @main() -> f32[2] { %1 = constant {value = [1.0, x]} : f32[2] return %1 }",
        "func @main() -> i8[1] { %1 = constant {value = [300]} : i8[1] return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { return %0 } garbage",
        "func @main(%0: f32[2]) -> f32[2] { %1 = add %0, %0 : f32[2] $ return %1 }",
        "func @main(%0: f32[2]) -> f32[2] { %1 = add %0, %0 {} : f32[2] return %1 }",
        "func @main(%0: f32[]) -> f32[] { %1 = while %0 {cond = func @c(%0: f32[]) -> pred[] { return %0 }} : f32[] return %1 }",
        "func @main(%0: f32[]) -> f32[] { %1 = while %0 {cond = 3, body = 4} : f32[] return %1 }",
        "func @main(%0: f32[]) -> f32[] { %1 = while %0 {cond = func @c(%0: f32[]) -> pred[] { return %5 }, body = func @b(%0: f32[]) -> f32[] { return %0 }} : f32[] return %1 }",
        "func @main(%0: i32[]) -> f32[] { %1 = case %0 {branches = [func @b() -> f32[] { return %0 }]} : f32[] return %1 }",
        "func @main(%0: i32[]) -> f32[] { %1 = case %0 {branches = func @b() -> f32[] { %1 = constant {value = 1.0} : f32[] return %1 }} : f32[] return %1 }",
        "func @main(%0: i32[]) -> f32[] { %1 = case %0 {branches = [func @b() -> f32[] { %1 = constant {value = 1.0} : f32[] return %1 }, ]} : f32[] return %1 }",
    ];
    let mut n = 0;
    for t in texts {
        let e = must_fail(t, || parse_module(t).map(|_| ()).map_err(|e| e.to_string()));
        assert!(e.contains(':'), "parse errors give line:column: {e}");
        n += 1;
    }
    let ill_typed = [
        "func @main(%0: f32[2], %1: f32[3]) -> f32[2] {\n  %2 = add %0, %1 : f32[2]\n  return %2\n}\n",
        "func @main(%0: f32[2]) -> f32[2] {\n  %1 = reshape %0 : f32[3]\n  return %1\n}\n",
        "func @main(%0: f32[2]) -> i32[2] {\n  %1 = add %0, %0 : i32[2]\n  return %1\n}\n",
        "func @main(%0: f32[2,2]) -> f32[2] {\n  %1 = dot_general %0, %0 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [7], rhs_contracting_dimensions = [0]} : f32[2]\n  return %1\n}\n",
        "func @main(%0: f32[0]) -> f32[1] {\n  %1 = slice %0 {start_indices = [0], limit_indices = [1], strides = [1]} : f32[1]\n  return %1\n}\n",
        "func @main(%0: f32[]) -> f32[] {\n  %1 = while %0 {cond = func @c(%0: f32[]) -> f32[] {\n      return %0\n    }, body = func @b(%0: f32[]) -> f32[] {\n      return %0\n    }} : f32[]\n  return %1\n}\n",
        "func @main(%0: f32[]) -> f32[] {\n  %1 = while %0 {cond = func @c(%0: f32[]) -> pred[] {\n      %1 = constant {value = true} : pred[]\n      return %1\n    }, body = func @b(%0: f32[]) -> i32[] {\n      %1 = convert %0 : i32[]\n      return %1\n    }} : f32[]\n  return %1\n}\n",
        "func @main(%0: i32[], %1: f32[]) -> f32[] {\n  %2 = case %0, %1 {branches = [func @b0(%0: f32[]) -> f32[] {\n      return %0\n    }, func @b1(%0: f32[]) -> i32[] {\n      %1 = convert %0 : i32[]\n      return %1\n    }]} : f32[]\n  return %2\n}\n",
    ];
    for t in ill_typed {
        let e = must_fail(t, || {
            kiln_reference::eval_module(&parse_module(t).map_err(|e| e.to_string())?, &[])
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        assert!(
            e.contains("_c") || e.contains("ir_"),
            "verifier errors cite a label: {e}"
        );
        n += 1;
    }
    let f = parse_func_text(good).unwrap();
    let two = Literal::f32([2], vec![1.0, 2.0]).unwrap();
    let three = Literal::f32([3], vec![1.0, 2.0, 3.0]).unwrap();
    let int = Literal::i32([2], vec![1, 2]).unwrap();
    let arg_cases: [(&str, Vec<Literal>); 4] = [
        ("no arguments", vec![]),
        ("too many", vec![two.clone(), two.clone(), two.clone()]),
        ("wrong shape", vec![two.clone(), three]),
        ("wrong dtype", vec![two, int]),
    ];
    for (what, args) in arg_cases {
        let e = must_fail(what, || {
            kiln_reference::eval(&f, &args)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        assert!(e.contains("argument"), "{what}: {e}");
        n += 1;
    }
    for v in [
        "[1.0]",
        "[1.0, 2.0, 3.0]",
        "[[1.0, 2.0]]",
        "[1.0, true]",
        "[1.0, 2.0",
        "1.0",
    ] {
        must_fail(v, || {
            kiln_ir::parse_literal(v, &kiln_ir::TensorType::new(kiln_ir::DType::F32, [2]))
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        n += 1;
    }
    println!("{n} bad inputs rejected with errors");
    assert!(n >= 30);
}

/// `ir-specs/coverage/cpu.txt` (what the CPU backend compiled as kernels and checked, per op)
/// is what the spec examples give now; `KILN_BLESS` (`cargo xtask codegen`) rewrites it.
/// CPU-only whatever `KILN_BACKEND` says: the file records the CPU backend's coverage
/// (`spec_examples_run_on_the_selected_backend` runs the examples on the selected one).
#[test]
fn cpu_coverage_is_fresh() {
    let want = kiln_tests::cpu_coverage();
    let path = root().join("ir-specs/coverage/cpu.txt");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "ir-specs/coverage/cpu.txt is stale: run `cargo xtask codegen`"
    );
}

#[test]
fn status_md_is_fresh() {
    let want = status_table();
    let path = root().join("ir-specs/status.md");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "ir-specs/status.md is stale: run `cargo xtask codegen`"
    );
}

/// `docs/ops.md` lists every op with its spec's summary; `KILN_BLESS` rewrites it.
#[test]
fn ops_md_is_fresh() {
    let want = kiln_tests::ops_reference();
    let path = root().join("docs/ops.md");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/ops.md is stale: run `cargo xtask codegen`"
    );
}

#[test]
fn builder_errors_name_the_op_the_types_and_the_callers_line() {
    use kiln_ir::{Builder, DType, Op, TensorType};
    let mut b = Builder::new("f");
    let x = b.param(TensorType::new(DType::F32, [2, 3]));
    let y = b.param(TensorType::new(DType::F32, [3, 2]));
    let line = line!() + 1;
    let e = b.inst(Op::Add {}, &[x, y]).unwrap_err();
    let text = e.to_string();
    assert_eq!(
        e.loc.map(|l| (l.file, l.line)),
        Some((file!(), line)),
        "{text}"
    );
    for part in [
        "add_c1",
        "add %0, %1",
        "f32[2,3]",
        "f32[3,2]",
        "integration.rs",
    ] {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
}

/// One `Options` value carries every switch, read from the environment at the API boundary
/// only: no source file below the facade reads an environment variable, except the programs'
/// `main`s (`src/bin/`) and the backend choice in `kiln-trace/src/backend.rs` (which moves to
/// the facade with the CPU backend). Comments do not count.
#[test]
fn no_environment_reads_below_the_api_boundary() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        if krate.file_name() != "kiln" {
            walk(&krate.path().join("src"), &mut files);
        }
    }
    assert!(files.len() > 40, "found only {} source files", files.len());
    let allowed = |p: &std::path::Path| {
        let p = p.to_string_lossy().replace('\\', "/");
        p.contains("/src/bin/")
    };
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !allowed(f)) {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("env::var") || code.contains("env::vars") {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "environment read below the facade:\n{}",
        found.join("\n")
    );
}

/// The crates `krate` depends on, directly or through other workspace crates (what `cargo
/// tree -p krate` shows of them, read from the manifests' `[dependencies]`).
fn dependencies_of(krate: &str) -> std::collections::BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let deps = |krate: &str| -> Vec<String> {
        let text = std::fs::read_to_string(root.join("crates").join(krate).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{krate}: {e}"));
        let mut in_deps = false;
        let mut out = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_deps = line == "[dependencies]";
            } else if in_deps && let Some((name, _)) = line.split_once('=') {
                out.push(name.trim().trim_end_matches(".workspace").to_string());
            }
        }
        out
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec![krate.to_string()];
    while let Some(k) = todo.pop() {
        for d in deps(&k) {
            if seen.insert(d.clone()) && d.starts_with("kiln-") {
                todo.push(d);
            }
        }
    }
    seen
}

/// The kernel layer decides and does not render or run: no crate `kiln-kernel` depends on,
/// directly or through other workspace crates, is LLVM, a GPU driver, a thread pool or the
/// runtime (what `cargo tree -p kiln-kernel` shows, read from the manifests).
#[test]
fn the_kernel_layer_depends_on_no_backend_or_runtime() {
    let seen = dependencies_of("kiln-kernel");
    assert!(
        seen.contains("kiln-ir") && seen.contains("kiln-opt"),
        "{seen:?}"
    );
    for banned in [
        "inkwell",
        "cudarc",
        "rayon",
        "kiln-runtime",
        "kiln-codegen-llvm",
        "melior",
    ] {
        assert!(
            !seen.contains(banned),
            "kiln-kernel depends on {banned}: {seen:?}"
        );
    }
}

/// The filetest harness refuses target filetests that name no target, an unknown one, or no
/// run against the reference, and target-independent ones that name a target.
#[test]
fn filetest_headers_are_checked() {
    let dir = std::env::temp_dir().join(format!("kiln-filetest-headers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body = "func @main(%0: f32[2]) -> f32[2] {\n  %1 = add %0, %0 : f32[2]\n  return %1\n}\n";
    let cases = [
        ("// RUN: kernels\n", "name it on the second line"),
        (
            "// RUN: kernels\n// TARGET: gpu\n// run: random 1\n",
            "unknown target `gpu`",
        ),
        ("// RUN: llvm\n// TARGET: cpu\n", "needs a `// run:` line"),
        ("// RUN: parse\n// TARGET: cpu\n", "depends on no target"),
        (
            "// RUN: llvm\n// run: random 1\n// TARGET: cpu\n",
            "on the second line",
        ),
        (
            "// RUN: llvm\n// TARGET: cpu\n// run: [1.0, 2.0] ; [3.0]\n",
            "2 arguments given for 1",
        ),
        (
            "// RUN: llvm\n// TARGET: cpu\n// run: [1.0, 2.0, 3.0]\n",
            "argument 0",
        ),
        (
            "// RUN: llvm\n// TARGET: cpu\n// run: random x\n",
            "seed `x`",
        ),
    ];
    for (i, (head, want)) in cases.iter().enumerate() {
        let path = dir.join(format!("case-{i}.kir"));
        std::fs::write(&path, format!("{head}{body}")).unwrap();
        let e = run_filetest(&path).expect_err(head);
        assert!(e.contains(want), "{head}: {e}");
    }
    let ok = dir.join("ok.kir");
    std::fs::write(
        &ok,
        format!("// RUN: llvm\n// TARGET: cpu\n// run: [1.5, -2.0]\n// run: random 3\n{body}"),
    )
    .unwrap();
    run_filetest(&ok).unwrap();
    std::fs::remove_dir_all(&dir).ok();
}

/// Tensors and tracing name no code generator: the facade (`kiln`) links the CPU backend and
/// installs it, so `cargo tree -p kiln-trace` shows no LLVM, MLIR or GPU driver.
#[test]
fn tracing_depends_on_no_codegen_crate() {
    let seen = dependencies_of("kiln-trace");
    assert!(
        seen.contains("kiln-ir") && seen.contains("kiln-kernel"),
        "{seen:?}"
    );
    for banned in [
        "inkwell",
        "melior",
        "cudarc",
        "kiln-codegen-llvm",
        "kiln-mlir",
        "kiln-runtime",
    ] {
        assert!(
            !seen.contains(banned),
            "kiln-trace depends on {banned}: {seen:?}"
        );
    }
}

/// `docs/how-kiln-compiles.md` is what the compiler makes of its program now; `KILN_BLESS`
/// (`cargo xtask codegen`) rewrites it.
#[test]
fn how_kiln_compiles_is_fresh() {
    let want = how_it_compiles::document();
    let path = root().join("docs/how-kiln-compiles.md");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/how-kiln-compiles.md is stale: run `cargo xtask codegen`"
    );
}

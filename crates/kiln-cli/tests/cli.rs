//! The `kiln` binary end to end: export, run, dump and bench on a small model, and each bad
//! input ending with its message and exit code.

use kiln_ir::{Literal, TensorType};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MODEL: &str = "func @main(%0: f32[2,3], %1: f32[3]) -> (f32[2,3], f32[2]) {
  %2 = broadcast_in_dim %1 {broadcast_dimensions = [1]} : f32[2,3]
  %3 = multiply %0, %2 : f32[2,3]
  %4 = constant {value = 0.0} : f32[]
  %5 = reduce %3, %4 {dimensions = [1], kind = add} : f32[2]
  return %3, %5
}
";

/// A fresh directory for one test.
fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kiln-cli")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("writable target dir");
    d
}

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("the kiln binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes the model as `.kir` and its inputs as `.npy`; returns (model path, input paths).
fn setup(d: &Path) -> (String, String, String) {
    let kir = d.join("m.kir");
    std::fs::write(&kir, MODEL).expect("write");
    let x = Literal::f32([2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).expect("literal");
    let y = Literal::f32([3], vec![10.0, 100.0, 1000.0]).expect("literal");
    let (xp, yp) = (d.join("x.npy"), d.join("y.npy"));
    kiln_run::npy::write(&xp, &x).expect("write");
    kiln_run::npy::write(&yp, &y).expect("write");
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    (s(kir), s(xp), s(yp))
}

#[test]
fn export_then_run_the_stablehlo() {
    let d = dir("export-run");
    let (kir, x, y) = setup(&d);
    let mlir = d.join("m.mlir").to_string_lossy().into_owned();
    let o = kiln(&["export", &kir, "-o", &mlir]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&mlir).expect("exported");
    assert!(
        text.contains("func.func public @main") && text.contains("\"stablehlo.reduce\""),
        "{text}"
    );
    let out = d.join("out").to_string_lossy().into_owned();
    let o = kiln(&[
        "run",
        &mlir,
        "--input",
        &format!("x={x}"),
        "--input",
        &format!("arg1={y}"),
        "--output",
        &out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r0 = kiln_run::npy::read(&d.join("out/out0.npy")).expect("out0");
    let r1 = kiln_run::npy::read(&d.join("out/out1.npy")).expect("out1");
    assert_eq!(r0.ty(), &TensorType::new(kiln_ir::DType::F32, [2, 3]));
    assert_eq!(r0.to_f64s(), vec![10.0, 200.0, 3000.0, 40.0, 500.0, 6000.0]);
    assert_eq!(r1.to_f64s(), vec![3210.0, 6540.0]);
    // Without --output the results are printed.
    let o = kiln(&[
        "run",
        &kir,
        "--input",
        &format!("0={x}"),
        "--input",
        &format!("1={y}"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("3210"), "{}", stdout(&o));
}

#[test]
fn dump_stages_and_bench() {
    let d = dir("dump-bench");
    let (kir, _, _) = setup(&d);
    for (stage, needle) in [
        ("opt", "reduce"),
        ("kernels", "kernel"),
        ("fused", "kernel"),
        ("dot", "digraph"),
        ("llvm", "define"),
        ("ptx", "nvptx"),
    ] {
        let o = kiln(&["dump", &kir, "--stage", stage]);
        assert!(o.status.success(), "{stage}: {}", stderr(&o));
        assert!(
            stdout(&o).to_lowercase().contains(needle),
            "{stage}:\n{}",
            stdout(&o)
        );
    }
    let o = kiln(&["bench", &kir, "--runs", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("compile: ") && s.contains("median") && s.contains("over 3 runs"),
        "{s}"
    );
}

/// A `[512,512] x [512,512]` product in kiln IR (at `kir`), with what its descriptions should
/// say under the options the `kiln` binary reads from this environment: the header for this
/// machine, and the product's blocking as a compile for this machine (`ours`) and for the
/// reference CPU (`theirs`) decides it.
struct Product {
    kir: String,
    header: String,
    ours: String,
    theirs: String,
}

/// [`Product`], written to `d/mm.kir`.
fn product(d: &Path) -> Product {
    let kir = d.join("mm.kir");
    let text = "func @main(%0: f32[512,512], %1: f32[512,512]) -> f32[512,512] {\n  %2 = dot_general %0, %1 {lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]} : f32[512,512]\n  return %2\n}\n";
    std::fs::write(&kir, text).expect("write");
    let f = kiln_ir::parse_func_text(text).unwrap();
    // The binary reads the environment once; so do the expectations.
    let opts = kiln_kernel::Options::from_vars(&|n| std::env::var(n).ok());
    let blocking = |t: &kiln_kernel::TargetInfo| {
        let l = kiln_kernel::pipeline::lower_program(&f, &[], &opts, t, None, &mut |_| {}).unwrap();
        let k = l.fused.kernels.iter().flatten().next().expect("one kernel");
        kiln_kernel::gemm_schedule::gemm_schedule(k, t)
            .expect("a GEMM")
            .to_string()
    };
    let host = kiln_codegen_llvm::cpu::cpu_target_info(&opts);
    Product {
        kir: kir.to_string_lossy().into_owned(),
        header: kiln_kernel::print::target_header(&host, "this machine"),
        ours: blocking(&host),
        theirs: blocking(&kiln_kernel::TargetInfo::reference()),
    }
}

/// `kiln dump --host`: the `kernels` and `fused` stages as decided for this machine, headed
/// by its vector width; a product's blocking is the one `gemm_schedule` gives on this
/// machine's `TargetInfo` (and, where the reference CPU's differs, not that one). Without it,
/// the reference CPU's, with no header. Other stages, and `--render`, refuse it.
#[test]
fn dump_host_prints_this_machines_decisions() {
    let d = dir("dump-host");
    let Product {
        kir,
        header,
        ours,
        theirs,
    } = product(&d);
    for stage in ["kernels", "fused"] {
        let o = kiln(&["dump", &kir, "--stage", stage, "--host"]);
        assert!(o.status.success(), "{stage}: {}", stderr(&o));
        let s = stdout(&o);
        assert!(s.starts_with(&header), "{stage}:\n{s}");
        assert!(s.contains(&ours), "{stage}: no `{ours}` in\n{s}");
        if ours != theirs {
            assert!(
                !s.contains(&theirs),
                "{stage}: the reference's blocking in\n{s}"
            );
        }
        let o = kiln(&["dump", &kir, "--stage", stage]);
        let s = stdout(&o);
        assert!(!s.starts_with("// for "), "{stage}:\n{s}");
        assert!(s.contains(&theirs), "{stage}: no `{theirs}` in\n{s}");
    }
    let svg = d.join("k.svg").to_string_lossy().into_owned();
    for args in [
        vec!["dump", &kir, "--stage", "llvm", "--host"],
        vec!["dump", &kir, "--stage", "dot", "--render", &svg, "--host"],
    ] {
        let o = kiln(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("--host prints the `kernels` and `fused` stages"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

/// `KILN_EXPLAIN=1` on a compile prints the fused kernels as this machine runs them: the
/// header and the product's blocking on this machine's `TargetInfo`, as `dump --host` does
/// (before, it printed the reference CPU's lowering).
#[test]
fn explain_prints_what_this_machine_runs() {
    let d = dir("explain");
    let Product {
        kir,
        header,
        ours,
        theirs,
    } = product(&d);
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", &kir, "--runs", "1"])
        .env("KILN_EXPLAIN", "1")
        .env("KILN_NO_CACHE", "1")
        .output()
        .expect("the kiln binary runs");
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    let at = e
        .find("// kiln: fused kernels of @main")
        .expect("the explanation");
    assert!(e[at..].contains(&header), "no `{header}` in\n{e}");
    assert!(
        e[at..].contains(&format!("  loops: {ours}")),
        "no `{ours}` in\n{e}"
    );
    if ours != theirs {
        assert!(!e.contains(&theirs), "the reference's blocking in\n{e}");
    }
}

#[test]
fn bad_input_ends_with_its_exit_code() {
    let d = dir("errors");
    let (kir, x, _) = setup(&d);
    let bad = d.join("bad.mlir");
    std::fs::write(&bad, "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = stablehlo.frobnicate %a : tensor<2xf32>\n  func.return %0 : tensor<2xf32>\n}\n").expect("write");
    let bad = bad.to_string_lossy().into_owned();
    let missing = d.join("none.kir").to_string_lossy().into_owned();
    let (x0, x1) = (format!("0={x}"), format!("1={x}"));
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec![], 2, "no command"),
        (vec!["fly", &kir], 2, "unknown command `fly`"),
        (vec!["run"], 2, "needs a MODEL"),
        (
            vec!["dump", &kir, "--stage", "hlo"],
            2,
            "unknown stage `hlo`",
        ),
        (
            vec!["run", &kir, "--input", "x"],
            2,
            "expected NAME=FILE.npy",
        ),
        (vec!["run", &missing], 3, "cannot read"),
        (vec!["run", &bad], 3, "2:"),
        (
            vec!["run", &kir, "--input", &x0],
            4,
            "parameter 1 (f32[3]) of @main is not given",
        ),
        (
            vec!["run", &kir, "--input", &x1, "--input", &x0],
            4,
            "parameter 1 of @main is f32[3]",
        ),
    ];
    for (args, code, needle) in cases {
        let o = kiln(&args);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn dot_renders_with_graphviz_or_says_how_to_install_it() {
    let d = dir("render");
    let (kir, _, _) = setup(&d);
    let svg = d.join("fused.svg").to_string_lossy().into_owned();
    let text = stdout(&kiln(&["dump", &kir, "--stage", "dot"]));
    // `dot` missing: a clear error (an output error, 7), the text kept next to the picture.
    let missing = d
        .join("no-graphviz")
        .join("dot")
        .to_string_lossy()
        .into_owned();
    let o = kiln(&[
        "dump",
        &kir,
        "--stage",
        "dot",
        "--render",
        &svg,
        "--dot-program",
        &missing,
    ]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    for needle in [
        "Graphviz's `dot` is needed",
        "apt-get install graphviz",
        "brew install graphviz",
        "fused.dot",
    ] {
        assert!(stderr(&o).contains(needle), "{needle}: {}", stderr(&o));
    }
    let kept = d.join("fused.dot");
    assert_eq!(std::fs::read_to_string(&kept).expect("kept"), text);
    // A stand-in for `dot` that copies its input: the picture is the graph.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let fake = d.join("fake-dot");
        std::fs::write(
            &fake,
            "#!/bin/sh\n[ \"$1\" = -Tsvg ] || exit 3\ncp \"$4\" \"$3\"\n",
        )
        .expect("write");
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let fake = fake.to_string_lossy().into_owned();
        std::fs::remove_file(&kept).expect("remove");
        let o = kiln(&[
            "dump",
            &kir,
            "--stage",
            "dot",
            "--render",
            &svg,
            "--dot-program",
            &fake,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stdout(&o).contains("fused.svg"), "{}", stdout(&o));
        assert_eq!(std::fs::read_to_string(&svg).expect("drawn"), text);
        assert_eq!(std::fs::read_to_string(&kept).expect("kept"), text);
    }
    // Usage errors: another stage, or a picture format Graphviz is not asked for.
    let pdf = d.join("fused.pdf").to_string_lossy().into_owned();
    for (args, needle) in [
        (
            vec!["dump", &kir, "--stage", "opt", "--render", &svg],
            "--render draws the `dot` stage",
        ),
        (
            vec!["dump", &kir, "--stage", "dot", "--render", &pdf],
            ".svg or .png",
        ),
    ] {
        let o = kiln(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

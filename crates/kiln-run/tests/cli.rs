//! `kiln-run` end to end on the GPU emulator, and its failures: each bad input (a missing
//! file, the wrong number, shape or dtype of inputs, a corrupt manifest, a plan this kiln does
//! not derive, no driver) ends with its message and exit code. The artifacts are made here
//! without a compiler: their PTX modules only declare the entries the plan launches (the
//! emulator does not read them), which is all `kiln-run` checks before a GPU loads them.

use kiln_ir::{Literal, TensorType};
use kiln_kernel::gpu::GpuProgram;
use kiln_run::{Artifact, Target, npy};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SOFTMAX_PLUS: &str =
    "func @main(%0: f32[4,40], %1: f32[40], %2: f32[]) -> (f32[4,40], f32[4]) {
  %3 = reduce %0, %2 {dimensions = [1], kind = max} : f32[4]
  %4 = broadcast_in_dim %3 {broadcast_dimensions = [0]} : f32[4,40]
  %5 = subtract %0, %4 : f32[4,40]
  %6 = exponential %5 : f32[4,40]
  %7 = reduce %6, %2 {dimensions = [1], kind = add} : f32[4]
  %8 = broadcast_in_dim %1 {broadcast_dimensions = [1]} : f32[4,40]
  %9 = add %6, %8 : f32[4,40]
  return %9, %7
}
";

fn fake_ptx(p: &GpuProgram) -> Result<String, String> {
    Ok(p.launches
        .iter()
        .map(|k| format!(".visible .entry {}(\n)\n{{\n  ret;\n}}\n", k.entry_name()))
        .collect())
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-run-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The artifact of `text` for an H200, saved into `dir/artifact`, with its arguments as
/// `dir/arg{i}.npy`.
fn make(dir: &Path, text: &str) -> (PathBuf, Vec<Literal>) {
    let f = kiln_ir::parse_func_text(text).unwrap();
    let target = Target::h200();
    let opts = kiln_kernel::Options::default();
    let l = kiln_kernel::pipeline::lower_program(&f, &[], &opts, &target.info, None, &mut |_| {})
        .unwrap();
    let a = Artifact::new(l.func, &opts, target, &fake_ptx).unwrap();
    let at = dir.join("artifact");
    a.save(&at).unwrap();
    let args = kiln_run::exec::random_inputs(&a, 5);
    kiln_run::exec::write_all(dir, "arg", &args).unwrap();
    (at, args)
}

fn kiln_run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln-run"));
    for a in args {
        c.arg(a);
    }
    c.output().unwrap()
}

fn fails(o: &Output, code: i32, words: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    for w in words {
        assert!(err.contains(w), "`{w}` not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn an_artifact_runs_on_the_emulator_as_the_reference_computes() {
    let d = scratch("run");
    let (art, args) = make(&d, SOFTMAX_PLUS);
    let out = d.join("out");
    let o = kiln_run(&[
        &art,
        &"--device",
        &"emulator",
        &"--inputs",
        &d.join("arg0.npy"),
        &d.join("arg1.npy"),
        &d.join("arg2.npy"),
        &"--out",
        &out,
        &"--bench",
        &"3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json = String::from_utf8_lossy(&o.stdout);
    assert!(
        json.contains("\"median_ms\"") && json.contains("\"calls\":3"),
        "{json}"
    );
    let f = kiln_ir::parse_func_text(SOFTMAX_PLUS).unwrap();
    let want = kiln_reference::eval(&f, &args).unwrap();
    let got: Vec<Literal> = (0..2)
        .map(|i| npy::read(&out.join(format!("out{i}.npy"))).unwrap())
        .collect();
    kiln_reference::accuracy::check_outputs(&f, &args, &got).unwrap();
    assert_eq!(got[0].ty(), want[0].ty());
    // The reference's results as the expected files pass; one changed element does not.
    let refs = kiln_run::exec::write_all(&d.join("ref"), "out", &want).unwrap();
    let expect = |files: &[PathBuf]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kiln-run"));
        c.arg(&art)
            .args(["--device", "emulator", "--random-inputs", "5", "--expect"]);
        c.args(files);
        c.output().unwrap()
    };
    assert!(expect(&refs).status.success());
    let mut bad = want[1].to_f64s();
    bad[2] += 1.0;
    let bad = Literal::from_f64s(want[1].ty().clone(), &bad).unwrap();
    npy::write(&refs[1], &bad).unwrap();
    fails(
        &expect(&refs),
        7,
        &["results differ", "output 1", "element 2"],
    );
    // --save-inputs writes what --random-inputs made.
    let saved = d.join("saved");
    let o = kiln_run(&[
        &art,
        &"--device",
        &"emulator",
        &"--random-inputs",
        &"5",
        &"--save-inputs",
        &saved,
    ]);
    assert!(o.status.success());
    assert_eq!(npy::read(&saved.join("arg1.npy")).unwrap(), args[1]);
}

#[test]
fn bad_inputs_are_named() {
    let d = scratch("inputs");
    let (art, _) = make(&d, SOFTMAX_PLUS);
    let emu = ["--device", "emulator"];
    let a0 = d.join("arg0.npy");
    // Too few inputs.
    let o = kiln_run(&[&art, &emu[0], &emu[1], &"--inputs", &a0]);
    fails(
        &o,
        4,
        &["1 input files given", "3 argument(s)", "arg1: f32[40]"],
    );
    // A missing file.
    let o = kiln_run(&[
        &art,
        &emu[0],
        &emu[1],
        &"--inputs",
        &a0,
        &d.join("nope.npy"),
        &d.join("arg2.npy"),
    ]);
    fails(&o, 4, &["nope.npy", "cannot read"]);
    // The wrong shape, then the wrong dtype.
    let wrong = d.join("wrong.npy");
    npy::write(
        &wrong,
        &Literal::zeros(TensorType::new(kiln_ir::DType::F32, [41])),
    )
    .unwrap();
    let o = kiln_run(&[
        &art,
        &emu[0],
        &emu[1],
        &"--inputs",
        &a0,
        &wrong,
        &d.join("arg2.npy"),
    ]);
    fails(&o, 4, &["arg1", "f32[41]", "takes f32[40]"]);
    npy::write(
        &wrong,
        &Literal::zeros(TensorType::new(kiln_ir::DType::I32, [40])),
    )
    .unwrap();
    let o = kiln_run(&[
        &art,
        &emu[0],
        &emu[1],
        &"--inputs",
        &a0,
        &wrong,
        &d.join("arg2.npy"),
    ]);
    fails(&o, 4, &["arg1", "i32[40]", "takes f32[40]"]);
    // Not a .npy file.
    std::fs::write(&wrong, "hello").unwrap();
    let o = kiln_run(&[
        &art,
        &emu[0],
        &emu[1],
        &"--inputs",
        &a0,
        &wrong,
        &d.join("arg2.npy"),
    ]);
    fails(&o, 4, &["wrong.npy", "not a .npy file"]);
    // Usage.
    fails(&kiln_run(&[&art]), 2, &["--inputs or --random-inputs"]);
    fails(
        &kiln_run(&[&art, &"--random-inputs", &"1", &"--device", &"tpu"]),
        2,
        &["cuda:N"],
    );
    fails(&kiln_run(&[&art, &"--random-inputs", &"x"]), 2, &["seed"]);
}

#[test]
fn corrupt_artifacts_are_refused() {
    let d = scratch("corrupt");
    let (art, _) = make(&d, SOFTMAX_PLUS);
    let run = || kiln_run(&[&art, &"--device", &"emulator", &"--random-inputs", &"1"]);
    assert!(run().status.success());
    let manifest = art.join("manifest.json");
    let good = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, &good[..good.len() / 2]).unwrap();
    fails(&run(), 3, &["manifest.json is not JSON"]);
    std::fs::write(&manifest, good.replace("\"sms\"", "\"sm_count\"")).unwrap();
    fails(&run(), 3, &["target.info.gpu", "sms"]);
    std::fs::write(
        &manifest,
        good.replace("\"format_version\": 1", "\"format_version\": 9"),
    )
    .unwrap();
    fails(&run(), 3, &["format version 9"]);
    std::fs::write(&manifest, good.replace("\"f32\"", "\"f16\"")).unwrap();
    fails(&run(), 3, &["signature"]);
    std::fs::write(&manifest, &good).unwrap();
    // A plan from a kiln that decides otherwise.
    let plan = art.join("plan.txt");
    let text = std::fs::read_to_string(&plan).unwrap();
    std::fs::write(&plan, text.replacen("grid ", "grid 1", 1)).unwrap();
    fails(&run(), 3, &["stored device plan", "derives", "line"]);
    std::fs::write(&plan, &text).unwrap();
    // A missing PTX module, a program that does not parse, no artifact at all.
    let ptx = art.join("kernels/000.ptx");
    let module = std::fs::read_to_string(&ptx).unwrap();
    std::fs::remove_file(&ptx).unwrap();
    fails(&run(), 3, &["kernels/000.ptx"]);
    std::fs::write(&ptx, module).unwrap();
    std::fs::write(art.join("program.kiln"), "func @main(").unwrap();
    fails(&run(), 3, &["program.kiln"]);
    let none = d.join("none");
    fails(
        &kiln_run(&[&none, &"--device", &"emulator", &"--random-inputs", &"1"]),
        3,
        &["no such artifact folder"],
    );
}

#[test]
fn without_a_driver_a_gpu_run_says_what_was_looked_for() {
    let d = scratch("driver");
    let (art, _) = make(&d, SOFTMAX_PLUS);
    let o = kiln_run(&[&art, &"--random-inputs", &"1", &"--device", &"cuda:0"]);
    if kiln_runtime::cuda::driver_present() {
        // A GPU machine: the PTX here only declares entries, so loading may fail, but never
        // with a panic.
        assert!(matches!(o.status.code(), Some(0 | 5 | 6)), "{o:?}");
    } else {
        fails(&o, 5, &["no device", "libcuda"]);
    }
}

/// The runtime-only binary links no LLVM.
#[test]
fn kiln_run_depends_on_no_llvm() {
    let o = Command::new(env!("CARGO"))
        .args(["tree", "-p", "kiln-run", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tree = String::from_utf8_lossy(&o.stdout);
    assert!(tree.contains("kiln-kernel"), "{tree}");
    for llvm in ["inkwell", "llvm-sys", "kiln-codegen-llvm"] {
        assert!(!tree.contains(llvm), "kiln-run depends on {llvm}:\n{tree}");
    }
}

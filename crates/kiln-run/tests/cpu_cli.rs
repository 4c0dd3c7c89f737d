//! The `kiln-run` binary on CPU artifacts made here without a compiler: a program whose only
//! step is a sort by keys (a host step, no kernel functions, no library) runs on the CPU as the
//! reference computes; a CPU lacking a required feature, a library whose bytes do not match
//! their checksum, bytes that are no library, and a GPU device for a CPU artifact each end
//! with their message and exit code, never a panic. (`crates/kiln/tests/aot.rs` compiles and
//! runs artifacts with kernels.)

use kiln_ir::Literal;
use kiln_kernel::{Options, TargetInfo};
use kiln_run::artifact::Kind;
use kiln_run::cpu::CpuProgram;
use kiln_run::{Artifact, Target, npy};
use kiln_runtime::kernel_program::{KernelTable, launches};
use kiln_runtime::library::checksum;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SORT: &str = "func @main(%0: f32[6]) -> f32[6] {
  %1 = sort %0 {dimension = 0, is_stable = true, comparator = func @lt(%0: f32[], %1: f32[]) -> pred[] {
      %2 = compare %0, %1 {comparison_direction = LT} : pred[]
      return %2
    }} : f32[6]
  return %1
}
";

const EXP: &str = "func @main(%0: f32[6]) -> f32[6] {
  %1 = exponential %0 : f32[6]
  return %1
}
";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-run-cpu-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The CPU artifact of `text` (lowered for the reference CPU) with `library` as its library,
/// requiring `+sse2`, saved into `dir/artifact`, with its argument as `dir/arg0.npy`.
fn make(dir: &Path, text: &str, library: Option<Vec<u8>>) -> (PathBuf, Literal) {
    let f = kiln_ir::parse_func_text(text).unwrap();
    let (opts, info) = (Options::default(), TargetInfo::reference());
    let l = kiln_kernel::pipeline::lower_program(&f, &[], &opts, &info, None, &mut |_| {}).unwrap();
    let scratch: Vec<usize> = launches(&l, &info).iter().map(|l| l.scratch).collect();
    let memory = kiln_kernel::plan::plan(
        &l.func,
        &l.steps,
        &l.fused.operands,
        &scratch,
        &l.in_place,
        &l.fused.extra,
    );
    let program = CpuProgram {
        kernels: checksum(KernelTable::new(&l).source_text(&l.func).as_bytes()),
        program: l.func.clone(),
        donated: Vec::new(),
        checksum: library.as_deref().map(checksum),
        library,
        memory: memory.to_string(),
        regions: Vec::new(),
    };
    let target = Target {
        kind: Kind::Cpu {
            cpu: "x86-64".into(),
        },
        sm: String::new(),
        features: "+sse2,-avx512f".into(),
        info,
    };
    let a = Artifact::new_cpu(&opts, target, vec![program]).unwrap();
    let at = dir.join("artifact");
    a.save(&at).unwrap();
    let arg = Literal::f32([6], vec![3.0, -1.0, 0.5, 2.5, -2.0, 1.0]).unwrap();
    npy::write(&dir.join("arg0.npy"), &arg).unwrap();
    (at, arg)
}

fn kiln_run(dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln-run"))
        .arg(dir.join("artifact"))
        .arg("--inputs")
        .arg(dir.join("arg0.npy"))
        .arg("--out")
        .arg(dir.join("out"))
        .args(extra)
        .output()
        .unwrap()
}

fn fails(o: &Output, code: i32, words: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    for w in words {
        assert!(err.contains(w), "`{w}` not in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("artifact/manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&p, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

#[test]
fn a_cpu_artifact_of_host_steps_runs_on_the_cpu_as_the_reference_computes() {
    let d = scratch("sort");
    let (_, arg) = make(&d, SORT, None);
    let o = kiln_run(&d, &["--bench", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"device\":\"cpu\""));
    let got = npy::read(&d.join("out/out0.npy")).unwrap();
    let f = kiln_ir::parse_func_text(SORT).unwrap();
    assert_eq!(got, kiln_reference::eval(&f, &[arg]).unwrap()[0]);
    // A GPU device is refused for it.
    fails(
        &kiln_run(&d, &["--device", "emulator"]),
        5,
        &["runs on the CPU"],
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_cpu_lacking_a_required_feature_is_named() {
    let d = scratch("feature");
    make(&d, SORT, None);
    let lacking = [
        "sse4a",
        "avx512fp16",
        "avx512bf16",
        "avxvnni",
        "avx512ifma",
        "sha",
    ]
    .into_iter()
    .find(|f| kiln_run::cpu::has_feature(f) == Some(false))
    .expect("an x86-64 CPU lacks one of these");
    edit_manifest(&d, |m| {
        m["target"]["features"] = format!("+sse2,+{lacking},-avx512f").into();
    });
    fails(
        &kiln_run(&d, &[]),
        5,
        &["this CPU lacks a feature", lacking, "x86-64"],
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_damaged_library_and_bytes_that_are_no_library_are_refused() {
    let d = scratch("library");
    make(&d, EXP, Some(b"\x7fELF but not a shared library".to_vec()));
    // Bytes that match their checksum but do not load: the loader's reason.
    fails(
        &kiln_run(&d, &[]),
        3,
        &["bad artifact", "kernels/000.so", "loading"],
    );
    // Bytes that do not match their checksum.
    std::fs::write(d.join("artifact/kernels/000.so"), b"other bytes").unwrap();
    fails(&kiln_run(&d, &[]), 3, &["kernels/000.so is damaged"]);
    // A program with kernels and no library.
    edit_manifest(&d, |m| {
        m["files"]["programs"][0]["library"] = serde_json::Value::Null;
    });
    fails(&kiln_run(&d, &[]), 3, &["kernel functions and no library"]);
    std::fs::remove_dir_all(&d).unwrap();
}

//! Ahead-of-time artifacts round trip: a function compiled by `kiln::aot`, saved, loaded as
//! `kiln-run` loads it, its plan derived again and run on the GPU emulator, agrees with the
//! reference interpreter; its PTX is rendered for the target's SM.

use kiln::Tensor;
use kiln::aot::{Artifact, Target, compile};
use kiln_run::{Device, Runner};

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-aot-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn an_artifact_saved_and_loaded_runs_on_the_emulator_as_the_reference() {
    let f = |(x, w): &(Tensor, Tensor)| (&x.matmul(w) * 0.5).softmax(-1);
    let x = (
        Tensor::from_vec((0..24).map(|i| i as f32 / 7.0).collect::<Vec<_>>(), [4, 6]).unwrap(),
        Tensor::from_vec(
            (0..30).map(|i| (i % 5) as f32 - 2.0).collect::<Vec<_>>(),
            [6, 5],
        )
        .unwrap(),
    );
    let a = compile(f, &x, Target::h200()).unwrap();
    assert_eq!(a.args.len(), 2);
    assert_eq!(a.results[0].ty.to_string(), "f32[4,5]");
    assert!(!a.ptx.is_empty());
    assert!(
        a.ptx
            .iter()
            .all(|p| p.contains(".target sm_90") && p.contains(".entry"))
    );
    let dir = scratch("round-trip");
    a.save(&dir).unwrap();
    let back = Artifact::load(&dir).unwrap();
    assert_eq!(back.plan, a.plan);
    assert_eq!(back.ptx, a.ptx);
    let plan = back.device_plan().unwrap();
    let runner = Runner::open(&back, plan, &Device::Emulator).unwrap();
    let args = kiln_run::exec::random_inputs(&back, 1);
    let got = runner.run(&args).unwrap();
    let traced = kiln::lower::trace_ir(f, &x).unwrap();
    kiln::reference::accuracy::check_outputs(&traced, &args, &got).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_ampere_artifact_is_rendered_for_sm_80_and_a_cpu_target_is_refused() {
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]).unwrap();
    let a = compile(|x: &Tensor| x.exp() + x, &x, Target::a100()).unwrap();
    assert!(a.ptx.iter().all(|p| p.contains(".target sm_80")));
    assert_eq!(a.manifest()["target"]["info"]["gpu"]["sms"], 108);
    let cpu = Target {
        info: kiln_kernel::TargetInfo::reference(),
        ..Target::h200()
    };
    let e = compile(|x: &Tensor| x.exp(), &x, cpu).unwrap_err();
    assert!(e.message.contains("describes no GPU"), "{e}");
}

/// The MLP's forward pass: a product, a bias and GELU (fused), a second product and a softmax.
fn mlp((x, w1, b1, w2): &(Tensor, Tensor, Tensor, Tensor)) -> Tensor {
    (&x.matmul(w1) + b1).gelu(false).matmul(w2).softmax(-1)
}

/// A function with host steps: a sort and a `while` loop (Newton's square root of each
/// element, to a relative 1e-6).
fn sorted_roots(x: &Tensor) -> (Tensor, Tensor) {
    let a = &x.abs() + 1.0;
    let half = Tensor::scalar(0.5f32);
    let (r, _) = kiln::control::while_loop(
        |(r, prev): &(Tensor, Tensor)| {
            let change = r.sub(prev).abs().sub(&r.mul(&Tensor::scalar(1e-6f32)));
            change.max(&[0], false).gt(&Tensor::scalar(0.0f32))
        },
        |(r, _): &(Tensor, Tensor)| (r.add(&a.div(r)).mul(&half), r.clone()),
        (a.clone(), Tensor::zeros(kiln::DType::F32, a.shape())),
    );
    (x.sort(0, false), r)
}

fn random_tensor(shape: &[usize], seed: u64) -> Tensor {
    let ty = kiln::ir::TensorType::new(kiln::DType::F32, shape.to_vec());
    let mut rng = kiln::ir::random::Rng::new(seed);
    Tensor::new(kiln::ir::random::random_literal(&mut rng, &ty))
}

fn mlp_inputs() -> (Tensor, Tensor, Tensor, Tensor) {
    (
        random_tensor(&[8, 48], 1),
        random_tensor(&[48, 64], 2),
        random_tensor(&[64], 3),
        random_tensor(&[64, 10], 4),
    )
}

/// Runs `kiln-run ARTIFACT --inputs ... --out DIR` in process ([`kiln_run::cli::run`]) on
/// `args` and reads its results back.
fn kiln_run(artifact: &std::path::Path, args: &[kiln::ir::Literal]) -> Vec<kiln::ir::Literal> {
    let dir = artifact.with_extension("io");
    let files = kiln_run::exec::write_all(&dir, "arg", args).unwrap();
    let out = dir.join("out");
    let mut argv = vec![artifact.display().to_string(), "--inputs".into()];
    argv.extend(files.iter().map(|f| f.display().to_string()));
    argv.extend(["--out".into(), out.display().to_string()]);
    kiln_run::cli::run(&argv).unwrap();
    let n = Artifact::load(artifact).unwrap().results.len();
    (0..n)
        .map(|i| kiln_run::npy::read(&out.join(format!("out{i}.npy"))).unwrap())
        .collect()
}

fn literals(ts: &[Tensor]) -> Vec<kiln::ir::Literal> {
    ts.iter().map(|t| t.to_literal().unwrap()).collect()
}

#[test]
fn a_cpu_artifact_runs_in_kiln_run_as_jit_computes_bit_for_bit() {
    let x = mlp_inputs();
    let a = compile(mlp, &x, Target::host()).unwrap();
    assert!(a.target.is_cpu());
    assert_eq!(a.programs.len(), 1);
    let p = &a.programs[0];
    assert!(
        p.library
            .as_ref()
            .is_some_and(|l| l.starts_with(b"\x7fELF"))
    );
    assert_eq!(a.manifest()["target"]["kind"], "cpu");
    assert_ne!(a.manifest()["target"]["cpu"], "host");
    let dir = scratch("cpu-mlp");
    a.save(&dir).unwrap();
    let args = literals(&[x.0.clone(), x.1.clone(), x.2.clone(), x.3.clone()]);
    let got = kiln_run(&dir, &args);
    let want = kiln::jit(mlp).call(&x).unwrap().to_literal().unwrap();
    assert_eq!(
        got[0].to_le_bytes(),
        want.to_le_bytes(),
        "kiln-run and jit differ"
    );
    let traced = kiln::lower::trace_ir(mlp, &x).unwrap();
    kiln::reference::accuracy::check_outputs(&traced, &args, &got).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(dir.with_extension("io")).unwrap();
}

#[test]
fn a_cpu_artifact_with_a_sort_and_a_loop_runs_its_host_steps() {
    let x = random_tensor(&[96], 7);
    let a = compile(sorted_roots, &x, Target::host()).unwrap();
    // The loop's condition and body are programs of their own, after the function's.
    assert!(a.programs.len() >= 3, "{} programs", a.programs.len());
    assert!(a.programs[0].regions.iter().any(|(_, ps)| ps.len() == 2));
    let dir = scratch("cpu-host-steps");
    a.save(&dir).unwrap();
    let args = literals(std::slice::from_ref(&x));
    let got = kiln_run(&dir, &args);
    let (sorted, roots) = kiln::jit(sorted_roots).call(&x).unwrap();
    assert_eq!(
        got[0].to_le_bytes(),
        sorted.to_literal().unwrap().to_le_bytes()
    );
    assert_eq!(
        got[1].to_le_bytes(),
        roots.to_literal().unwrap().to_le_bytes()
    );
    let traced = kiln::lower::trace_ir(sorted_roots, &x).unwrap();
    kiln::reference::accuracy::check_outputs(&traced, &args, &got).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(dir.with_extension("io")).unwrap();
}

/// The message of running the artifact in `dir` on random inputs, which must fail with
/// `code` (never a panic).
fn run_error(dir: &std::path::Path, code: i32) -> String {
    let argv = [
        dir.display().to_string(),
        "--random-inputs".into(),
        "1".into(),
    ];
    let r = std::panic::catch_unwind(|| kiln_run::cli::run(&argv));
    let e = r.expect("no panic").expect_err("refused");
    assert_eq!(e.exit_code(), code, "{e}");
    e.to_string()
}

fn edit_manifest(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    edit(&mut m);
    std::fs::write(&p, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

#[test]
fn a_damaged_library_a_missing_kernel_and_a_missing_cpu_feature_are_clear_errors() {
    let x = mlp_inputs();
    let a = compile(mlp, &x, Target::host()).unwrap();

    // A library whose bytes changed.
    let dir = scratch("cpu-damaged");
    a.save(&dir).unwrap();
    let lib = dir.join("kernels/000.so");
    let mut bytes = std::fs::read(&lib).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&lib, &bytes).unwrap();
    let e = run_error(&dir, 3);
    assert!(e.contains("kernels/000.so is damaged"), "{e}");

    // Another function's library (its checksum recorded): it lacks the MLP's kernels.
    let dir = scratch("cpu-missing-kernel");
    a.save(&dir).unwrap();
    let v = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]).unwrap();
    let other = compile(|v: &Tensor| v.exp(), &v, Target::host()).unwrap();
    let other_lib = other.programs[0].library.clone().unwrap();
    std::fs::write(dir.join("kernels/000.so"), &other_lib).unwrap();
    let sum = kiln_runtime::library::checksum(&other_lib);
    edit_manifest(&dir, |m| {
        m["files"]["programs"][0]["checksum"] = sum.into();
    });
    let e = run_error(&dir, 3);
    assert!(e.contains("the library has no kernel function `k"), "{e}");

    // A CPU feature this machine lacks.
    let lacking = [
        "sse4a",
        "avx512fp16",
        "avx512bf16",
        "avx512vbmi2",
        "avxvnni",
        "avx512ifma",
    ]
    .into_iter()
    .find(|f| kiln_run::cpu::has_feature(f) == Some(false))
    .expect("an x86-64 CPU lacks one of these");
    let dir = scratch("cpu-feature");
    a.save(&dir).unwrap();
    edit_manifest(&dir, |m| {
        let f = format!("{},+{lacking}", m["target"]["features"].as_str().unwrap());
        m["target"]["features"] = f.into();
    });
    let e = run_error(&dir, 5);
    assert!(e.contains("this CPU lacks a feature"), "{e}");
    assert!(e.contains(lacking), "{e}");
    for d in ["cpu-damaged", "cpu-missing-kernel", "cpu-feature"] {
        std::fs::remove_dir_all(scratch(d)).ok();
    }
}

#[test]
fn a_cpu_target_is_named_with_its_features_and_the_host_target_is_recorded() {
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]).unwrap();
    let e = compile(
        |x: &Tensor| x.exp(),
        &x,
        Target::cpu("no such cpu", "+avx2"),
    )
    .unwrap_err();
    assert!(e.message.contains("`no such cpu` is not a CPU name"), "{e}");
    let e = compile(|x: &Tensor| x.exp(), &x, Target::cpu("x86-64-v3", "")).unwrap_err();
    assert!(e.message.contains("needs its features"), "{e}");
    let e = compile(|x: &Tensor| x.exp(), &x, Target::cpu("x86-64-v3", "avx2")).unwrap_err();
    assert!(e.message.contains("`avx2` is not a +feature"), "{e}");
    let a = compile(|x: &Tensor| x.exp(), &x, Target::host()).unwrap();
    let dir = scratch("cpu-manifest");
    a.save(&dir).unwrap();
    let back = Artifact::load(&dir).unwrap();
    assert_eq!(back.target, a.target);
    assert_eq!(back.programs.len(), a.programs.len());
    for (b, p) in back.programs.iter().zip(&a.programs) {
        assert_eq!(b.program.to_string(), p.program.to_string());
        assert!(b.library == p.library && b.checksum == p.checksum);
        assert_eq!((&b.kernels, &b.memory), (&p.kernels, &p.memory));
        assert_eq!((&b.donated, &b.regions), (&p.donated, &p.regions));
    }
    let e = back.device_plan().unwrap_err();
    assert!(e.to_string().contains("runs on the CPU"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Baseline x86-64 with SSE4.2: every x86-64 machine kiln runs on has it.
const X86_64_V2: &str = "+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16";

#[test]
fn an_artifact_compiled_for_another_cpu_runs_where_its_features_are() {
    let x = mlp_inputs();
    let a = compile(mlp, &x, Target::cpu("x86-64-v2", X86_64_V2)).unwrap();
    assert_eq!(a.manifest()["target"]["cpu"], "x86-64-v2");
    assert_eq!(a.manifest()["target"]["features"], X86_64_V2);
    // The kernel layer decided for its 16-byte vectors.
    assert_eq!(a.target.info.vector_bytes, 16);
    let dir = scratch("cpu-v2");
    a.save(&dir).unwrap();
    let args = literals(&[x.0.clone(), x.1.clone(), x.2.clone(), x.3.clone()]);
    let got = kiln_run(&dir, &args);
    let traced = kiln::lower::trace_ir(mlp, &x).unwrap();
    kiln::reference::accuracy::check_outputs(&traced, &args, &got).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(dir.with_extension("io")).unwrap();
}

//! `cargo xtask gpu-pack --quick`'s pack, end to end on the GPU emulator: its `check.sh`
//! passes with `KILN_RUN_DEVICE=emulator`, and fails, naming the program, once one reference
//! result is changed. The pack ships the debug `kiln-run` here (the xtask ships the release
//! one).

use kiln_ir::{DType, Literal};
use kiln_run::npy;
use kiln_tests::pack::{PackOptions, pack};
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../crates/kiln-codegen-llvm/tests/ptxas/mod.rs"]
mod ptxas;

use ptxas::ptxas;

/// `kiln-run`, built into this test's target folder.
fn kiln_run() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let target = profile.parent().unwrap();
    let st = Command::new(env!("CARGO"))
        .args([
            "build",
            "--quiet",
            "-p",
            "kiln-run",
            "--bin",
            "kiln-run",
            "--target-dir",
        ])
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(st.success(), "building kiln-run failed");
    target.join("debug").join("kiln-run")
}

fn check(dir: &Path) -> (bool, String) {
    let o = Command::new("sh")
        .arg(dir.join("check.sh"))
        .env("KILN_RUN_DEVICE", "emulator")
        .env("KILN_CHECK_JOBS", "2")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

/// `l` with its first element moved far from its value (flipped for a `pred`).
fn changed(l: &Literal) -> Literal {
    if l.dtype() == DType::Pred || !l.dtype().is_float() {
        let mut v = l.to_i64s();
        v[0] = if l.dtype() == DType::Pred {
            1 - v[0]
        } else {
            v[0] + 1
        };
        return Literal::from_i64s(l.ty().clone(), &v).unwrap();
    }
    let mut v = l.to_f64s();
    v[0] = if v[0].is_finite() {
        v[0] + v[0].abs().max(1.0)
    } else {
        0.0
    };
    Literal::from_f64s(l.ty().clone(), &v).unwrap()
}

/// The launches of `f` lowered and planned for `target` under `opts`, in the plan's order.
fn launches(
    f: &kiln_ir::Func,
    opts: &kiln_kernel::Options,
    target: &kiln_kernel::target::TargetInfo,
) -> Vec<kiln_kernel::gpu::ir::GpuKernel> {
    let l = kiln_kernel::pipeline::lower_program(f, &[], opts, target, None, &mut |_| {}).unwrap();
    let plan = kiln_kernel::gpu::plan::device_plan(&l, target).unwrap();
    plan.kernel_steps()
        .flat_map(|k| k.program.launches.iter().cloned())
        .collect()
}

#[test]
fn a_quick_pack_passes_its_check_on_the_emulator_and_fails_on_a_changed_result() {
    let dir = std::env::temp_dir().join(format!("kiln-gpu-pack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = pack(&PackOptions {
        dir: dir.clone(),
        quick: true,
        kiln_run: kiln_run(),
    })
    .unwrap();
    // The quick pack's six workloads (softmax, the bf16 and TF32 products, causal attention in
    // f32 and in bf16, linear+bias+gelu).
    assert!(s.programs >= 8 && s.workloads == 6, "{s:?}");
    let (ok, text) = check(&dir);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("{} of {} programs pass", s.programs, s.programs)),
        "{text}"
    );
    assert!(text.contains("tiny size on the emulator"), "{text}");
    let json = std::fs::read_to_string(dir.join("check-results.json")).unwrap();
    assert!(json.contains("\"failed\": 0"), "{json}");
    // On cuda:0 without a driver, the check says so once and fails.
    if !kiln_runtime::cuda::driver_present() {
        let o = Command::new("sh")
            .arg(dir.join("check.sh"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(3), "{text}");
        assert!(
            text.contains("no device") && text.contains("libcuda"),
            "{text}"
        );
    }
    // One reference result changed: the check fails and names that program.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("pack.json")).unwrap()).unwrap();
    let p = manifest["programs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            let r = npy::read(&dir.join(p["dir"].as_str().unwrap()).join("ref0.npy")).unwrap();
            r.numel() > 0
        })
        .unwrap();
    let name = p["name"].as_str().unwrap();
    let file = dir.join(p["dir"].as_str().unwrap()).join("ref0.npy");
    npy::write(&file, &changed(&npy::read(&file).unwrap())).unwrap();
    let (ok, text) = check(&dir);
    assert!(!ok, "{text}");
    assert!(text.contains(&format!("FAIL {name}")), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The workloads the GPU kernels of issue 25 speed up map as those kernels (at the tiny size,
/// as at the GPU size): causal attention as one launch by register tiles, the product with its bias
/// and gelu as one product launch with the epilogue inside, the bf16 product as one launch on
/// the tensor cores with the conversion to bf16 inside.
#[test]
fn fused_workloads_map_to_one_launch() {
    use kiln_kernel::gpu::ir::MapKind;
    let target = kiln_kernel::target::TargetInfo::h200();
    let opts = kiln_kernel::Options::default();
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    for (kind, want) in [
        ("attention_causal", MapKind::AttentionTiled),
        ("attention_causal_bf16", MapKind::AttentionMma),
        ("attention_bf16", MapKind::AttentionMma),
        ("linear_bias_gelu", MapKind::GemmTiled),
        ("matmul", MapKind::GemmMma),
        ("sort", MapKind::Sort),
    ] {
        let w = ws.iter().find(|w| w.kind == kind).unwrap();
        for f in [&w.tiny, &w.full] {
            let l = kiln_kernel::pipeline::lower_program(f, &[], &opts, &target, None, &mut |_| {})
                .unwrap();
            let plan = kiln_kernel::gpu::plan::device_plan(&l, &target).unwrap();
            let launches: Vec<MapKind> = plan
                .kernel_steps()
                .flat_map(|k| k.program.launches.iter().map(|l| l.kind))
                .collect();
            assert!(launches.contains(&want), "{kind}: {launches:?}");
            let steps: Vec<usize> = plan
                .kernel_steps()
                .filter(|k| k.program.launches.iter().any(|l| l.kind == want))
                .map(|k| k.program.launches.len())
                .collect();
            assert_eq!(steps, vec![1], "{kind}: {launches:?}");
        }
    }
}

/// The f32 product workloads: the exact one on the CUDA cores, the one compiled with TF32
/// allowed on the tensor cores as TF32 `mma`s, at both sizes, in one launch each; the pack
/// lists the latter's precision for `check.py`.
#[test]
fn the_tf32_workload_runs_on_tf32_tensor_cores() {
    use kiln_kernel::gpu::ir::{MapKind, MmaOperand, Stmt};
    fn tf32_mmas(body: &[Stmt]) -> usize {
        body.iter()
            .map(|s| match s {
                Stmt::Mma { operand, .. } => usize::from(*operand == MmaOperand::Tf32),
                Stmt::For { body, .. } | Stmt::If { body, .. } => tf32_mmas(body),
                _ => 0,
            })
            .sum()
    }
    let target = kiln::aot::Target::h200().info;
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    for (name, want, tf32) in [
        ("matmul_f32_8192", MapKind::GemmTiled, false),
        ("matmul_tf32_8192", MapKind::GemmMma, true),
    ] {
        let w = ws.iter().find(|w| w.name == name).unwrap();
        let opts = kiln_kernel::Options {
            matmul_precision: w.precision,
            ..kiln_kernel::Options::default()
        };
        for f in [&w.tiny, &w.full] {
            let launches = launches(f, &opts, &target);
            assert_eq!(launches.len(), 1, "{name}");
            assert_eq!(launches[0].kind, want, "{name}");
            assert_eq!(tf32_mmas(&launches[0].body) > 0, tf32, "{name}");
        }
    }
}

/// `sort_16M` sorts on the GPU at both sizes, with no host step: its one slice is past two tiles
/// of what a block sorts (16·2²⁰ keys, and 9,000 at the tiny size, against tiles of 4,096), so
/// it runs as the radix sort, a count, a scan and a scatter per 6-bit digit of the f32 keys'
/// 32 bits: 18 launches at both sizes.
#[test]
fn the_long_sort_workload_runs_on_the_gpu_as_a_radix_sort() {
    use kiln_kernel::gpu::ir::MapKind;
    use kiln_kernel::gpu::plan::DeviceStep;
    let target = kiln_kernel::target::TargetInfo::h200();
    let opts = kiln_kernel::Options::default();
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    let w = ws.iter().find(|w| w.name == "sort_16M").unwrap();
    for f in [&w.full, &w.tiny] {
        let l = kiln_kernel::pipeline::lower_program(f, &[], &opts, &target, None, &mut |_| {})
            .unwrap();
        let plan = kiln_kernel::gpu::plan::device_plan(&l, &target).unwrap();
        assert!(
            plan.steps
                .iter()
                .all(|s| matches!(s, DeviceStep::Kernel(_))),
            "{}: a step on the host",
            w.name
        );
        let kinds: Vec<MapKind> = plan
            .kernel_steps()
            .flat_map(|k| k.program.launches.iter().map(|l| l.kind))
            .collect();
        assert_eq!(kinds, vec![MapKind::Sort; 18]);
    }
}

/// The sweep's variants of the tensor-core pipeline run what their labels name on the pack's
/// target (48 KiB of static shared memory per block; the `mma_dynamic_` and
/// `wgmma_dynamic_` variants' rings in dynamic shared memory, the others' not; the `wgmma_`
/// ones on sm_90a's warpgroups, the others on `mma.sync`; the `_tma_` ones loaded by TMA): `stages` stages of `k` (shared A holding
/// `stages x m x k` elements, the loop waiting for all but `stages - 2` copy groups), none cut
/// back to fit, and no two variants of the bf16 product map to the same launch as each other
/// or as the default, so each measures something of its own. Each renders as PTX.
#[test]
fn sweep_variants_of_the_tensor_core_product_run_as_labelled() {
    use kiln_kernel::gpu::ir::{MapKind, Stmt};
    let opts = kiln_kernel::Options::default();
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    let w = ws.iter().find(|w| w.name == "matmul_bf16_8192").unwrap();
    let launch = |target: &kiln_kernel::target::TargetInfo| {
        launches(&w.full, &opts, target)
            .into_iter()
            .find(|l| l.kind == MapKind::GemmMma)
            .expect("a tensor-core launch")
    };
    fn waits(body: &[Stmt], out: &mut Vec<usize>) {
        for s in body {
            match s {
                Stmt::CopyWait { pending } => out.push(*pending),
                Stmt::For { body, .. } | Stmt::If { body, .. } => waits(body, out),
                _ => {}
            }
        }
    }
    let base = kiln::aot::Target::h200().info;
    let mut seen = vec![kiln_kernel::gpu::print::kernel_text(&launch(&base))];
    for v in kiln_tests::pack::sweep::variants() {
        if v.workload != w.name {
            continue;
        }
        let mut target = kiln::aot::Target::ptx(v.sm, base.gpu.as_ref().unwrap().sms).info;
        (v.change)(&mut target);
        let l = launch(&target);
        let p = kiln_kernel::gpu::ir::GpuProgram {
            scratch: Vec::new(),
            zeroed: Vec::new(),
            launches: vec![l.clone()],
        };
        let sm = kiln_codegen_llvm::ptx::PtxTarget {
            sm: v.sm.into(),
            features: "+ptx80".into(),
        };
        if let Err(e) = kiln_codegen_llvm::ptx::program_ptx(&p, &sm) {
            panic!("{}: does not render: {e}", v.label);
        }
        // The `wgmma_` variants (for sm_90a) run on warpgroups, the others on `mma.sync`.
        assert_eq!(l.uses_wgmma(), v.label.starts_with("wgmma_"), "{}", v.label);
        // The `_tma_` ones load by TMA, in a block with a producer warpgroup.
        assert_eq!(l.uses_tma(), v.label.contains("_tma_"), "{}", v.label);
        let text = kiln_kernel::gpu::print::kernel_text(&l);
        assert!(
            !seen.contains(&text),
            "{}: maps as another variant",
            v.label
        );
        seen.push(text);
        // Only the `dynamic_` variants take dynamic shared memory (more than 48 KiB).
        let dynamic = v.label.contains("mma_dynamic_");
        assert_eq!(l.dynamic_shared > 0, dynamic, "{}", v.label);
        let Some((tile, pipeline)) = v.label.split_once("_stages_") else {
            continue;
        };
        let num = |s: &str| s.parse::<usize>().unwrap();
        let tile = tile
            .trim_start_matches("wg")
            .trim_start_matches("mma_")
            .trim_start_matches("dynamic_");
        let m = num(tile.split('x').next().unwrap());
        let (stages, k) = pipeline.split_once("_k_").unwrap();
        let (stages, k) = (num(stages), num(k));
        assert_eq!(l.shared[0].len, stages * m * k, "{}", v.label);
        let mut w = Vec::new();
        waits(&l.body, &mut w);
        // A warpgroup ring of 3 stages or more keeps one `wgmma` group in flight, and stages
        // one step less ahead.
        let lag = usize::from(v.label.starts_with("wgmma_") && stages >= 3);
        assert_eq!(w, vec![stages - 2 - lag], "{}", v.label);
    }
}

/// The sweep's variants of attention run what their labels name on the pack's target: a
/// `tile_` variant by register tiles with its block of query rows (none cut back to fit the
/// 48 KiB of shared memory; a `tile_dynamic_` one's arrays in dynamic shared memory), a `warp_rows_` one a warp per query row, and no two variants of
/// a workload map to the same launch as each other or as the default. Each renders as PTX.
#[test]
fn sweep_variants_of_attention_run_as_labelled() {
    use kiln_kernel::gpu::ir::MapKind;
    let opts = kiln_kernel::Options::default();
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    for name in ["attention_16x16x1024x64", "attention_causal_16x16x1024x64"] {
        let w = ws.iter().find(|w| w.name == name).unwrap();
        let launch = |target: &kiln_kernel::target::TargetInfo| {
            launches(&w.full, &opts, target)
                .into_iter()
                .find(|l| matches!(l.kind, MapKind::Attention | MapKind::AttentionTiled))
                .expect("an attention launch")
        };
        let base = kiln::aot::Target::h200().info;
        let default = launch(&base);
        assert_eq!(default.kind, MapKind::AttentionTiled, "{name}");
        let mut seen = vec![kiln_kernel::gpu::print::kernel_text(&default)];
        let mut count = 0;
        for v in kiln_tests::pack::sweep::variants() {
            if v.workload != name {
                continue;
            }
            count += 1;
            let mut target = base.clone();
            (v.change)(&mut target);
            let l = launch(&target);
            // Only the `tile_dynamic_` variants take dynamic shared memory.
            assert_eq!(
                l.dynamic_shared > 0,
                v.label.starts_with("tile_dynamic_"),
                "{}",
                v.label
            );
            if let Some(tile) = v.label.strip_prefix("tile_") {
                let tile = tile.trim_start_matches("dynamic_");
                let rows: usize = tile.split('x').next().unwrap().parse().unwrap();
                let text = kiln_kernel::gpu::print::kernel_text(&l);
                assert_eq!(l.kind, MapKind::AttentionTiled, "{}", v.label);
                assert!(
                    text.contains(&format!("a block of {rows} query rows")),
                    "{}: {text}",
                    v.label
                );
            } else {
                assert!(v.label.starts_with("warp_rows_"), "{}", v.label);
                assert_eq!(l.kind, MapKind::Attention, "{}", v.label);
            }
            let p = kiln_kernel::gpu::ir::GpuProgram {
                scratch: Vec::new(),
                zeroed: Vec::new(),
                launches: vec![l.clone()],
            };
            let sm90 = kiln_codegen_llvm::ptx::PtxTarget::sm90();
            if let Err(e) = kiln_codegen_llvm::ptx::program_ptx(&p, &sm90) {
                panic!("{}: does not render: {e}", v.label);
            }
            let text = kiln_kernel::gpu::print::kernel_text(&l);
            assert!(
                !seen.contains(&text),
                "{}: maps as another variant",
                v.label
            );
            seen.push(text);
        }
        assert!(count >= 8, "{name}: {count} variants");
    }
}

/// The sweep's warpgroup variants compile, as the pack compiles them, to artifacts for
/// sm_90a whose PTX runs the product on `wgmma` (B, stored by rows, MN-major: `imm-trans-b`
/// 1) and which ptxas assembles for sm_90a.
#[test]
fn warpgroup_sweep_variants_compile_to_sm_90a_artifacts() {
    use kiln::aot::{Target, compile_func_with_options};
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    let mut n = 0;
    for v in kiln_tests::pack::sweep::variants() {
        if v.sm != "sm_90a" {
            continue;
        }
        let w = ws.iter().find(|w| w.name == v.workload).unwrap();
        let mut target = Target::ptx(v.sm, 132);
        (v.change)(&mut target.info);
        let a = compile_func_with_options(&w.full, &kiln::Options::default(), target)
            .unwrap_or_else(|e| panic!("{}: {}", v.label, e.message));
        assert_eq!(a.target.sm, "sm_90a", "{}", v.label);
        let text = a.ptx.join("\n");
        assert!(text.contains(".target sm_90a"), "{}", v.label);
        assert!(
            text.contains("wgmma.mma_async.sync.aligned") && text.contains("p, 1, 1, 0, 1;"),
            "{}: no wgmma with B MN-major",
            v.label
        );
        if let Some(ptxas) = ptxas() {
            let dir = std::env::temp_dir().join(format!("kiln-wgmma-sweep-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            for (i, m) in a.ptx.iter().enumerate() {
                let (ok, msg) = ptxas::assemble(&ptxas, &dir, &i.to_string(), "sm_90a", &[], m);
                assert!(ok, "{}: ptxas: {msg}", v.label);
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        n += 1;
    }
    assert!(n >= 6, "{n} warpgroup variants");
}

/// The bf16 attention workloads run on the tensor cores, and each `mma_` variant of the sweep
/// as labelled (its keys a step, warps and stages in the kernel's note; a `dynamic_` one in
/// dynamic shared memory), no two alike; each renders as PTX.
#[test]
fn sweep_variants_of_tensor_core_attention_run_as_labelled() {
    use kiln_kernel::gpu::ir::MapKind;
    let opts = kiln_kernel::Options::default();
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    for name in [
        "attention_bf16_16x16x1024x64",
        "attention_causal_bf16_16x16x1024x64",
    ] {
        let w = ws.iter().find(|w| w.name == name).unwrap();
        let launch = |target: &kiln_kernel::target::TargetInfo| {
            let ls = launches(&w.full, &opts, target);
            let kinds: Vec<MapKind> = ls.iter().map(|l| l.kind).collect();
            assert_eq!(ls.len(), 1, "{name}: {kinds:?}");
            ls.into_iter().next().unwrap()
        };
        let base = kiln::aot::Target::h200().info;
        let default = launch(&base);
        assert_eq!(
            (default.kind, default.dynamic_shared),
            (MapKind::AttentionMma, 0),
            "{name}"
        );
        let mut seen = vec![kiln_kernel::gpu::print::kernel_text(&default)];
        let mut count = 0;
        for v in kiln_tests::pack::sweep::variants() {
            if v.workload != name {
                continue;
            }
            count += 1;
            let mut target = base.clone();
            (v.change)(&mut target);
            let l = launch(&target);
            let text = kiln_kernel::gpu::print::kernel_text(&l);
            assert_eq!(l.kind, MapKind::AttentionMma, "{}", v.label);
            assert_eq!(
                l.dynamic_shared > 0,
                v.label.contains("dynamic_"),
                "{}",
                v.label
            );
            let n = |key: &str| -> usize {
                let at = v.label.find(key).unwrap() + key.len();
                v.label[at..].split('_').next().unwrap().parse().unwrap()
            };
            let (keys, warps, stages) = (n("keys_"), n("warps_"), n("stages_"));
            let want = format!(
                "a block of {} query rows ({warps} warps of 16), keys {keys} a step in a ring of {stages}",
                16 * warps
            );
            assert!(text.contains(&want), "{}: {text}", v.label);
            let p = kiln_kernel::gpu::ir::GpuProgram {
                scratch: Vec::new(),
                zeroed: Vec::new(),
                launches: vec![l.clone()],
            };
            let sm90 = kiln_codegen_llvm::ptx::PtxTarget::sm90();
            if let Err(e) = kiln_codegen_llvm::ptx::program_ptx(&p, &sm90) {
                panic!("{}: does not render: {e}", v.label);
            }
            assert!(
                !seen.contains(&text),
                "{}: maps as another variant",
                v.label
            );
            seen.push(text);
        }
        assert!(count >= 5, "{name}: {count} variants");
    }
}

/// The transformer's training step and the two convolutions are packed: at both sizes every
/// step of their device plans is a kernel (none on the host), the convolutions run as a
/// product's launch (an implicit GEMM over the image patches, not a thread per output over
/// the window), ptxas assembles their PTX for sm_90, and the tiny size's artifact, run by
/// `kiln-run` on the emulator, agrees with the reference interpreter (`--expect`), as the
/// pack's check on the emulator runs it.
#[test]
fn the_transformer_step_and_the_convolutions_run_on_the_gpu() {
    use kiln::aot::{Target, compile_func_with_options};
    use kiln_kernel::gpu::ir::MapKind;
    let dir = std::env::temp_dir().join(format!("kiln-gpu-pack-models-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (ws, skipped) = kiln_tests::pack::workloads::workloads();
    assert!(
        !skipped
            .iter()
            .any(|s| s.starts_with("conv") || s.starts_with("transformer")),
        "{skipped:?}"
    );
    let bin = kiln_run();
    let target = kiln_kernel::target::TargetInfo::h200();
    let opts = kiln_kernel::Options::default();
    for name in [
        "conv_3x3_64x64x56",
        "conv_7x7s2_32x3x224",
        "transformer_train_step",
    ] {
        let w = ws.iter().find(|w| w.name == name).unwrap();
        // The GPU size's artifact (refused with a host step) and the tiny size's arguments and
        // reference results.
        let v = kiln_tests::pack::pack_workload(&dir, w, 7).unwrap();
        for (size, f) in [("full", &w.full), ("tiny", &w.tiny)] {
            let a =
                compile_func_with_options(f, &kiln::Options::default(), Target::h200()).unwrap();
            let host: Vec<&str> = a.plan.lines().filter(|l| l.contains(": host ")).collect();
            assert!(host.is_empty(), "{name} {size}: {host:?}");
            if name.starts_with("conv") {
                let l =
                    kiln_kernel::pipeline::lower_program(f, &[], &opts, &target, None, &mut |_| {})
                        .unwrap();
                let plan = kiln_kernel::gpu::plan::device_plan(&l, &target).unwrap();
                let kinds: Vec<MapKind> = plan
                    .kernel_steps()
                    .flat_map(|k| k.program.launches.iter().map(|l| l.kind))
                    .collect();
                let products = |tiled: bool| {
                    kinds
                        .iter()
                        .filter(|k| match k {
                            MapKind::GemmTiled | MapKind::GemmMma => true,
                            MapKind::Gemm => !tiled,
                            _ => false,
                        })
                        .count()
                };
                // Winograd's 36 products of the transformed tiles for the 3 x 3 convolution,
                // the implicit GEMM over the image patches for the 7 x 7; block tiles at the
                // GPU size.
                let want = if name == "conv_3x3_64x64x56" { 36 } else { 1 };
                assert_eq!(products(size == "full"), want, "{name} {size}: {kinds:?}");
            }
            if name == "transformer_train_step" && size == "full" {
                // The causal mask's work left out (`gpu/map/skip.rs`, `zero_steps.rs`): each
                // layer's scores leave their unread tiles out, and its products of `P` and
                // `dS` the steps zero by the mask, where checked at run time.
                let notes = |what: &str| a.plan.lines().filter(|l| l.contains(what)).count();
                let unread = notes("product unread where col - row > 0: 1 of 4 tiles");
                let zero = notes("up to 8 of 32 stages a matrix left out where checked");
                assert_eq!((unread, zero), (4, 16), "{name}: the mask's work left out");
            }
            if name == "transformer_train_step" {
                // The embeddings' gradient: a thread per column of the table, not one thread.
                let width = f.param_types()[0].shape[1];
                let scatters: Vec<usize> = a
                    .plan
                    .lines()
                    .filter_map(|l| l.split_once("(scatter): grid ")?.1.split_once(" (warp"))
                    .map(|(g, _)| {
                        let (grid, block) = g.split_once(" x block ").unwrap();
                        grid.parse::<usize>().unwrap() * block.parse::<usize>().unwrap()
                    })
                    .collect();
                assert!(
                    !scatters.is_empty() && scatters.iter().all(|&t| t >= width),
                    "{name} {size}: scatters on {scatters:?} threads"
                );
            }
            if let Some(ptxas) = ptxas() {
                for (i, text) in a.ptx.iter().enumerate() {
                    let stem = format!("{name}-{size}-{i}");
                    let (ok, msg) = ptxas::assemble(&ptxas, &dir, &stem, "sm_90", &[], text);
                    assert!(ok, "{name} {size}: ptxas: {msg}");
                }
            }
        }
        let t = dir.join(v["dir"].as_str().unwrap()).join("tiny");
        let files = |prefix: &str, n: usize| -> Vec<PathBuf> {
            (0..n).map(|i| t.join(format!("{prefix}{i}.npy"))).collect()
        };
        let o = Command::new(&bin)
            .arg(t.join("artifact"))
            .args(["--device", "emulator", "--inputs"])
            .args(files("arg", w.tiny.params.len()))
            .arg("--expect")
            .args(files("ref", w.tiny.outputs.len()))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Within the pack's 60 MiB beside its programs, other workloads and sweep (about 25 MiB):
    // 11.5 MiB when written, mostly the step's PTX.
    fn bytes(p: &Path) -> u64 {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    bytes(&e.path())
                } else {
                    m.len()
                }
            })
            .sum()
    }
    let workloads = bytes(&dir.join("workloads"));
    eprintln!("the three workloads weigh {workloads} bytes");
    assert!(
        workloads < 12 << 20,
        "the three workloads weigh {workloads} bytes"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The transformer's step on the H200 reads its heads in place and stores products merged
/// back through strides (`FusionLimits::strided_operands`): its device plan loses the layout
/// copies it keeps without them, and still runs every step on the device.
#[test]
fn the_transformer_step_reads_its_heads_in_place_on_the_gpu() {
    use kiln_kernel::gpu::plan::DeviceStep;
    let (ws, _) = kiln_tests::pack::workloads::workloads();
    let w = ws
        .iter()
        .find(|w| w.name == "transformer_train_step")
        .unwrap();
    let opts = kiln_kernel::Options::default();
    // (kernel steps, launches, host steps) of the step's plan for `target`.
    let plan = |on: bool| {
        let mut target = kiln_kernel::target::TargetInfo::h200();
        target.fusion.strided_operands = on;
        let l =
            kiln_kernel::pipeline::lower_program(&w.full, &[], &opts, &target, None, &mut |_| {})
                .unwrap();
        let plan = kiln_kernel::gpu::plan::device_plan(&l, &target).unwrap();
        let kernels: Vec<usize> = plan
            .kernel_steps()
            .map(|k| k.program.launches.len())
            .collect();
        let host = plan
            .steps
            .iter()
            .filter(|s| matches!(s, DeviceStep::Host(_)))
            .count();
        (kernels.len(), kernels.iter().sum::<usize>(), host)
    };
    let (before, after) = (plan(false), plan(true));
    // 232 kernel steps (265 launches) -> 196 (229): the 32 transposes of the heads (queries,
    // keys and values split out, the backward's gradients and the scores' gradient
    // transposed) and the 4 merges of the heads' output, as on the CPU (docs/performance.md).
    // Since a softmax's VJP reads its result (`kiln-autodiff/src/softmax.rs`), the scores'
    // product runs the softmax as its epilogue, one step of two launches; without strided
    // operands that step reads a copy of the queries too (4 more transposes than the 28 of
    // 232 (261) -> 200 (229) before). Before multi-output fusion asked for related siblings
    // (`fuse/merge.rs`), 4 of the transposes ran merged with unrelated kernels.
    assert_eq!(before.0 - after.0, 36, "{before:?} -> {after:?}");
    assert_eq!(before.1 - after.1, 36, "{before:?} -> {after:?}");
    assert_eq!((before.2, after.2), (0, 0), "host steps");
}

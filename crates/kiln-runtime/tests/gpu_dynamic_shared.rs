//! Dynamic shared memory on the emulator: a tensor-core product whose ring and an attention
//! whose register tile take more than the 48 KiB a kernel declares statically, mapped where
//! the target lets them (`Gpu::tile_dynamic_bytes`), run from their device plans against the
//! reference; the plan's text; and a kernel too large for a block's shared memory, an error
//! naming it and the sizes.

mod products;

use kiln_ir::random::{Rng, random_literal_with_specials};
use kiln_ir::{Func, Literal};
use kiln_kernel::gpu::ir::{GpuKernel, MapKind};
use kiln_kernel::gpu::plan::{DevicePlan, device_plan};
use kiln_kernel::gpu::plan_print::plan_text;
use kiln_kernel::target::{Gpu, TargetInfo};
use kiln_runtime::gpu_emu::run_plan;
use products::product_text;

/// An H200 whose rings and attention tiles may take all the shared memory a block may opt
/// into, its products in 4 stages of 64.
fn dynamic_target() -> TargetInfo {
    let mut t = TargetInfo::h200();
    let g = t.gpu.as_mut().expect("a GPU");
    g.tile_dynamic_bytes = g.dynamic_shared_bytes;
    g.mma_stages = 4;
    t
}

/// `src`'s device plan for `target`, and random arguments (no special values).
fn plan_of(src: &str, target: &TargetInfo) -> (Func, DevicePlan, Vec<Literal>) {
    let f = kiln_ir::parse_func_text(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let opts = kiln_kernel::Options::default();
    let l = kiln_kernel::pipeline::lower_program(&f, &[], &opts, target, None, &mut |_| {})
        .expect("lowers");
    let plan = device_plan(&l, target).expect("a device plan");
    let mut rng = Rng::new(7);
    let args = f
        .param_types()
        .iter()
        .map(|t| random_literal_with_specials(&mut rng, t, 0.0))
        .collect();
    (f, plan, args)
}

/// The launches of `plan`'s kernel steps.
fn launches(plan: &DevicePlan) -> Vec<&GpuKernel> {
    plan.kernel_steps()
        .flat_map(|s| s.program.launches.iter())
        .collect()
}

fn run(plan: &DevicePlan, args: &[Literal]) -> Result<Vec<Literal>, String> {
    let refs: Vec<&Literal> = args.iter().collect();
    run_plan(plan, &refs).map_err(|e| e.to_string())
}

fn bf16_product() -> String {
    product_text((1, 64, 256, 32), ("bf16", "f32"), false, false, false)
}

#[test]
fn a_ring_beyond_static_shared_memory_runs_from_dynamic_shared_memory() {
    let target = dynamic_target();
    let (f, plan, args) = plan_of(&bf16_product(), &target);
    let ls = launches(&plan);
    assert_eq!(ls.len(), 1);
    let k = ls[0];
    assert_eq!(k.kind, MapKind::GemmMma);
    // Blocks of 128 x 64 in 4 stages of 64 bf16 contraction indices: 96 KiB.
    assert_eq!(k.shared_bytes(), 4 * (128 + 64) * 64 * 2);
    assert_eq!(k.dynamic_shared, k.shared_bytes());
    assert!(k.dynamic_shared > 48 << 10);
    let got = run(&plan, &args).unwrap();
    kiln_reference::accuracy::check_outputs(&f, &args, &got).unwrap();
    // The plan's text says where the arrays lie and how much the launch asks for.
    let text = plan_text(&plan);
    assert!(
        text.contains("dynamic shared memory: 98304 bytes"),
        "{text}"
    );
    assert!(text.contains("at dynamic +0"), "{text}");
    // Without the allowance, the default: 2 stages of 64 (48 KiB), declared statically.
    let (_, plain, _) = plan_of(&bf16_product(), &TargetInfo::h200());
    let k = launches(&plain)[0];
    assert_eq!((k.shared_bytes(), k.dynamic_shared), (48 << 10, 0));
    assert!(!plan_text(&plain).contains("dynamic"));
}

/// Attention with heads of 128 on the H200's first tile (64 query rows, steps of 32 keys):
/// 66 KiB of shared memory, which only dynamic shared memory holds.
#[test]
fn an_attention_tile_beyond_static_shared_memory_agrees_with_the_reference() {
    let (b, m, keys, k, n2) = (1, 64, 70, 128, 64);
    let src = format!(
        "func @main(%0: f32[{b},{m},{k}], %1: f32[{b},{keys},{k}], %2: f32[{b},{keys},{n2}]) -> f32[{b},{m},{n2}] {{
  %3 = dot_general %0, %1 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]}} : f32[{b},{m},{keys}]
  %4 = constant {{value = 0.125}} : f32[]
  %5 = broadcast_in_dim %4 {{broadcast_dimensions = []}} : f32[{b},{m},{keys}]
  %6 = multiply %3, %5 : f32[{b},{m},{keys}]
  %7 = constant {{value = -inf}} : f32[]
  %8 = reduce %6, %7 {{dimensions = [2], kind = max}} : f32[{b},{m}]
  %9 = broadcast_in_dim %8 {{broadcast_dimensions = [0, 1]}} : f32[{b},{m},{keys}]
  %10 = subtract %6, %9 : f32[{b},{m},{keys}]
  %11 = exponential %10 : f32[{b},{m},{keys}]
  %12 = constant {{value = 0.0}} : f32[]
  %13 = reduce %11, %12 {{dimensions = [2], kind = add}} : f32[{b},{m}]
  %14 = broadcast_in_dim %13 {{broadcast_dimensions = [0, 1]}} : f32[{b},{m},{keys}]
  %15 = divide %11, %14 : f32[{b},{m},{keys}]
  %16 = dot_general %15, %2 {{lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]}} : f32[{b},{m},{n2}]
  return %16
}}
"
    );
    let (f, plan, args) = plan_of(&src, &dynamic_target());
    let ls = launches(&plan);
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].kind, MapKind::AttentionTiled);
    assert_eq!(ls[0].block, 128, "the 64-row tile");
    assert!(ls[0].dynamic_shared > 48 << 10, "{}", ls[0].dynamic_shared);
    let got = run(&plan, &args).unwrap();
    let want = kiln_reference::eval(&f, &args).unwrap();
    let v_max = args[2].to_f64s().iter().fold(0.0f64, |a, x| a.max(x.abs()));
    for (e, (x, y)) in got[0].to_f64s().iter().zip(want[0].to_f64s()).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * v_max.max(1.0),
            "element {e}: {x}, the reference {y}"
        );
    }
    // Within 48 KiB the attention takes a smaller tile, declared statically.
    let (_, plain, _) = plan_of(&src, &TargetInfo::h200());
    let l = launches(&plain)[0];
    assert_eq!((l.kind, l.dynamic_shared), (MapKind::AttentionTiled, 0));
    assert!(l.shared_bytes() <= 48 << 10 && l.shared_bytes() < ls[0].shared_bytes());
}

/// A kernel too large for shared memory is an error naming it and the sizes, on the emulator
/// as on a GPU: arrays declared statically beyond the static limit, a dynamic array beyond
/// what a block may opt into, and a dynamic array smaller than the arrays it holds.
#[test]
fn a_kernel_too_large_for_shared_memory_is_an_error_on_the_emulator() {
    let target = dynamic_target();
    let (_, plan, args) = plan_of(&bf16_product(), &target);
    let name = launches(&plan)[0].name.clone();
    let edit = |f: &dyn Fn(&mut GpuKernel)| {
        let mut p = plan.clone();
        for s in &mut p.steps {
            if let kiln_kernel::gpu::plan::DeviceStep::Kernel(k) = s {
                f(&mut k.program.launches[0]);
            }
        }
        run(&p, &args).unwrap_err()
    };
    let e = edit(&|k| k.dynamic_shared = 0);
    assert!(
        e.contains(&name)
            && e.contains("a kernel too large for shared memory")
            && e.contains("98304 bytes of static shared memory per block, more than the 49152"),
        "{e}"
    );
    let e = edit(&|k| {
        k.shared[0].len *= 4;
        k.dynamic_shared = k.shared_offsets().1;
    });
    assert!(
        e.contains(&name)
            && e.contains("bytes of dynamic shared memory per block, more than the 232448"),
        "{e}"
    );
    let e = edit(&|k| k.dynamic_shared = 64 << 10);
    assert!(
        e.contains(&name) && e.contains("take 98304 bytes, more than the 65536"),
        "{e}"
    );
    // The compiler refuses it first where the target's opt-in limit is smaller.
    let k = launches(&plan)[0];
    let mut small = Gpu::h200();
    small.dynamic_shared_bytes = 64 << 10;
    let e = kiln_kernel::gpu::print::verify(k, &small).unwrap_err();
    assert!(
        e.contains(&name)
            && e.contains(
                "98304 bytes of dynamic shared memory per block, more than the target's 65536"
            ),
        "{e}"
    );
    kiln_kernel::gpu::print::verify(k, &Gpu::h200()).unwrap();
}

/// A device's own opt-in limit (as its driver reports it) becomes the target's, and a plan
/// whose dynamic shared memory exceeds it does not load: an error naming the kernel.
#[cfg(feature = "cuda")]
#[test]
fn a_device_gives_its_opt_in_limit_and_plans_must_fit_it() {
    use kiln_runtime::cuda::DeviceInfo;
    use kiln_runtime::cuda_exec::check_fits;
    let a100 = DeviceInfo {
        index: 0,
        name: "NVIDIA A100".into(),
        compute_capability: (8, 0),
        multiprocessors: 108,
        warp_size: 32,
        max_threads_per_block: 1024,
        shared_memory_per_block: 48 << 10,
        shared_memory_per_block_optin: 163 << 10,
        l2_cache_bytes: 40 << 20,
        total_memory: 80 << 30,
    };
    let g = a100.target_info().gpu.expect("a GPU");
    assert_eq!(
        (g.static_shared_bytes, g.dynamic_shared_bytes),
        (49152, 166912)
    );
    let (_, plan, _) = plan_of(&bf16_product(), &dynamic_target());
    check_fits(&plan, &a100).unwrap();
    let small = DeviceInfo {
        shared_memory_per_block_optin: 64 << 10,
        ..a100
    };
    let e = check_fits(&plan, &small).unwrap_err().to_string();
    assert!(
        e.contains("k0_dot_general")
            && e.contains("98304 bytes of dynamic shared memory per block, more than the 65536"),
        "{e}"
    );
}

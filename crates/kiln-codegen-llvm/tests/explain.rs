//! What `KILN_EXPLAIN=1` prints for a compile: the fusion, blocks, loop schedules and thread
//! splits decided for this machine (`describe_lowered`), not the dumps' machine-independent
//! ones (`describe_fusion`, which the snapshots hold).

use kiln_codegen_llvm::cpu::{cpu_target_info, describe_fusion, describe_lowered};
use kiln_kernel::gemm_schedule::gemm_schedule;
use kiln_kernel::{Options, TargetInfo};

/// `[m, k] x [k, n]` in f32.
fn product(m: usize, k: usize, n: usize) -> kiln_ir::Func {
    kiln_ir::parse_func_text(&format!(
        "func @main(%0: f32[{m},{k}], %1: f32[{k},{n}]) -> f32[{m},{n}] {{\n  %2 = dot_general %0, %1 {{lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]}} : f32[{m},{n}]\n  return %2\n}}\n"
    ))
    .unwrap()
}

/// The product's blocking and thread split as `target` decides them, as the text prints them.
fn blocking_on(f: &kiln_ir::Func, opts: &Options, target: &TargetInfo) -> String {
    let l = kiln_kernel::pipeline::lower_program(f, &[], opts, target, None, &mut |_| {}).unwrap();
    let k = l.fused.kernels.iter().flatten().next().expect("one kernel");
    gemm_schedule(k, target).expect("a GEMM").to_string()
}

/// The host's lowering is described with the host's blocks: the tile, contraction and cache
/// blocks `gemm_schedule` gives on this machine's `TargetInfo`, and its vector width in the
/// header; the reference lowering (the dumps') with the reference CPU's. On an Intel host with
/// AVX-512 the two differ (14 x 32 tiles with 512-step blocks against 6 x 16 with 256-step
/// ones), which is what `KILN_EXPLAIN` used to get wrong: it described the reference lowering.
#[test]
fn explain_describes_what_this_machine_runs() {
    let f = product(512, 512, 512);
    let opts = Options::default();
    let host = cpu_target_info(&opts);
    let l = kiln_kernel::pipeline::lower_program(&f, &[], &opts, &host, None, &mut |_| {}).unwrap();
    let text = describe_lowered(&l, &opts);
    let ours = blocking_on(&f, &opts, &host);
    let header = kiln_kernel::print::target_header(&host, "this machine");
    assert!(text.starts_with(&header), "{text}");
    assert!(
        text.contains(&format!("  loops: {ours}")),
        "no `{ours}` in:\n{text}"
    );
    let reference = blocking_on(&f, &opts, &TargetInfo::reference());
    let dumped = describe_fusion(&f, &opts).unwrap();
    assert!(
        dumped.contains(&format!("  loops: {reference}")),
        "{dumped}"
    );
    if ours != reference {
        assert!(
            !text.contains(&reference),
            "the reference blocking in:\n{text}"
        );
    }
}

/// With 256-bit vectors asked for on the host (`KILN_VECTOR_BITS=256`), the description says
/// so and shows the blocking of 256-bit vectors, as the compile uses them.
#[test]
fn explain_follows_the_vector_width_asked_for() {
    let f = product(256, 384, 640);
    let mut opts = Options::default();
    opts.cpu.narrow_vectors = true;
    let narrow = cpu_target_info(&opts);
    assert!(narrow.vector_bytes <= 32, "{narrow:?}");
    let l =
        kiln_kernel::pipeline::lower_program(&f, &[], &opts, &narrow, None, &mut |_| {}).unwrap();
    let text = describe_lowered(&l, &opts);
    let bits = narrow.vector_bytes * 8;
    assert!(
        text.starts_with(&format!("// for this machine: {bits}-bit vectors")),
        "{text}"
    );
    let ours = blocking_on(&f, &opts, &narrow);
    assert!(
        text.contains(&format!("  loops: {ours}")),
        "no `{ours}` in:\n{text}"
    );
}

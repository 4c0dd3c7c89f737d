//! The kernels float atomics make (`Options::float_atomics`): f32 sums over whole tensors and
//! columns in one launch, f32 and f16 scatter-adds by atomics, rendered for sm_80 and sm_90
//! with `red.global.add` and assembled by ptxas (as `ptx.rs` does every other kernel); with
//! the switch off, the same programs render no atomic.

use kiln_codegen_llvm::ptx::{PtxTarget, mapped_kernels, program_ptx};
use kiln_ir::parse_func_text;
use kiln_kernel::gpu::ir::MapKind;
use kiln_kernel::target::TargetInfo;

mod ptxas;

/// A reduction by `add` of `dt[shape]` over `dims` to `dt[kept]`.
fn sum(dt: &str, shape: &str, dims: &str, kept: &str) -> String {
    format!(
        "func @main(%0: {dt}[{shape}]) -> {dt}[{kept}] {{\n  %1 = constant {{value = 0.0}} : {dt}[]\n  %2 = reduce %0, %1 {{dimensions = [{dims}], kind = add}} : {dt}[{kept}]\n  return %2\n}}\n"
    )
}

/// A scatter-add of `n` single elements of `dt` into `dt[len]` (too many for a scan).
fn scatter(dt: &str, len: usize, n: usize) -> String {
    format!(
        "func @main(%0: {dt}[{len}], %1: i32[{n},1], %2: {dt}[{n}]) -> {dt}[{len}] {{\n  %3 = scatter %0, %1, %2 {{update_window_dims = [], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1, kind = add}} : {dt}[{len}]\n  return %3\n}}\n"
    )
}

/// The programs, each with the mapping its atomic launch has and the instruction it renders.
fn programs() -> Vec<(String, MapKind, &'static str)> {
    use MapKind::{ColumnAtomic, ScatterAtomic, SplitAtomic};
    let (f32, f16) = ("red.global.add.f32", "red.global.add.noftz.f16");
    vec![
        (sum("f32", "100003", "0", ""), SplitAtomic, f32),
        (sum("f32", "3,50000", "1", "3"), SplitAtomic, f32),
        (sum("f32", "4200,20", "0", "20"), ColumnAtomic, f32),
        (sum("f32", "4,129,40", "0,1", "40"), ColumnAtomic, f32),
        (
            // A fused producer and two sums of it (two outputs, one reduction each).
            "func @main(%0: f32[90000], %1: f32[90000]) -> (f32[], f32[]) {\n  %2 = multiply %0, %1 : f32[90000]\n  %3 = constant {value = 0.0} : f32[]\n  %4 = reduce %2, %3 {dimensions = [0], kind = add} : f32[]\n  %5 = constant {value = 1.5} : f32[]\n  %6 = reduce %0, %5 {dimensions = [0], kind = add} : f32[]\n  return %4, %6\n}\n".to_string(),
            SplitAtomic,
            f32,
        ),
        (scatter("f32", 37, 2000), ScatterAtomic, f32),
        (scatter("f32", 1000, 20000), ScatterAtomic, f32),
        (scatter("f16", 300, 3000), ScatterAtomic, f16),
        (
            // Rows of 3 at (row, column) pairs: no dimension of its own.
            "func @main(%0: f32[40,8], %1: i32[900,2], %2: f32[900,3]) -> f32[40,8] {\n  %3 = scatter %0, %1, %2 {update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 1, kind = add} : f32[40,8]\n  return %3\n}\n".to_string(),
            ScatterAtomic,
            f32,
        ),
    ]
}

#[test]
fn atomic_kernels_render_red_and_assemble_for_sm_80_and_sm_90() {
    let atomics = kiln_kernel::Options {
        float_atomics: true,
        ..kiln_kernel::Options::default()
    };
    let gpu = TargetInfo::h200();
    let dir = std::env::temp_dir().join(format!("kiln-ptx-atomics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ptxas = ptxas::ptxas();
    let mut failures = Vec::new();
    let mut assembled = 0;
    for (i, (src, kind, red)) in programs().iter().enumerate() {
        let f = parse_func_text(src).unwrap_or_else(|e| panic!("program {i}: {e}\n{src}"));
        let ks = mapped_kernels(&f, &atomics, &gpu).unwrap();
        let Some(p) = ks.into_iter().find_map(|(_, p)| p.ok()) else {
            panic!("program {i}: no kernel mapped");
        };
        let kinds: Vec<MapKind> = p.launches.iter().map(|l| l.kind).collect();
        // One launch for a sum; the copy and the additions for a scatter; no sort.
        let want = if *kind == MapKind::ScatterAtomic {
            2
        } else {
            1
        };
        if kinds != vec![*kind; want] {
            failures.push(format!("program {i}: launches {kinds:?}"));
            continue;
        }
        for target in [PtxTarget::sm80(), PtxTarget::sm90()] {
            let text = match program_ptx(&p, &target) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!("program {i} ({}): {e}", target.sm));
                    continue;
                }
            };
            if !text.contains(red) {
                failures.push(format!("program {i} ({}): no {red}\n{text}", target.sm));
            }
            let Some(ptxas) = &ptxas else { continue };
            let stem = format!("{i}-{}", target.sm);
            match ptxas::assemble(ptxas, &dir, &stem, &target.sm, &[], &text) {
                (true, _) => assembled += 1,
                (false, msg) => failures.push(format!(
                    "program {i} ({}): ptxas rejected it: {msg}\n{text}",
                    target.sm
                )),
            }
        }
        // Off by default: the deterministic forms, no atomic anywhere.
        let ks = mapped_kernels(&f, &kiln_kernel::Options::default(), &gpu).unwrap();
        for (name, p) in ks {
            let text = program_ptx(&p.unwrap(), &PtxTarget::sm90()).unwrap();
            if text.contains("red.global") || text.contains("atom.global") {
                failures.push(format!("program {i} {name}: an atomic with the switch off"));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("ptxas assembled {assembled} atomic programs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
